//! Scenario 14, the PostgreSQL front (`pglease serve --front-listen`, issue 30), each part
//! side by side with the same work done the HTTP way, in one run and on one daemon, so the
//! same template and the same postgres serve both paths:
//! - (a) relayed round trips: one connection, many small queries (`SELECT 1` in the simple
//!   protocol, a primary-key lookup in the extended one, as pgbench's select-only does),
//!   through the front and on a direct connection to a database leased over HTTP; blocks
//!   of queries alternate between the two, so the machine's drift falls on both alike;
//! - (b) connect: a connection to the front (the lease is made inside it) + a first query +
//!   close, against `POST /lease` + a direct connect + the same query + close + `DELETE
//!   /leases/{id}`, alternating, the pool idle before each;
//! - (c) the fixture's end-to-end test at 1 and 8 workers both ways (`suite.rs`);
//! - (d) many idle connections through the front, on a daemon of their own (`idle.rs`).
//!
//! The front releases without `reuse`, as `DELETE /leases/{id}?reuse=false` does: the
//! HTTP side releases that way too. Every part is an outcome of its own, so a part that
//! fails leaves the others' figures.

mod idle;
mod libpq;
mod render;
mod suite;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::{Client, Config, Statement};

use super::{strings, Ctx, FIXTURE, IDLE_LIMIT, WAIT_MS};
use crate::admin::{self, Conn};
use crate::api::Api;
use crate::error::{BenchError, Result};
use crate::outcome::Outcome;
use crate::stats::{round3, Summary};

pub(crate) use render::render;

/// The daemon's `--min-ready` (the pool's default, named so that the waits for an idle
/// pool know what "refilled" means).
const MIN_READY: usize = 4;
/// Queries in a row on one path before the other path's turn.
const BLOCK: usize = 100;
/// Part (a)'s target: front ÷ direct per query.
pub const ROUND_TRIP_TARGET: f64 = 1.10;
/// Part (b)'s target: front connect ÷ (`POST /lease` + direct connect).
pub const CONNECT_TARGET: f64 = 1.5;
/// Part (c)'s target: front tests/s ÷ HTTP tests/s.
pub const SUITE_TARGET: f64 = 1.0;
/// A part's connection attempts give up after this many failures.
const MAX_ERRORS: usize = 10;

/// Scenario 14's figures.
#[derive(Debug, Serialize)]
pub struct FrontResult {
    /// Flags of the daemon of parts (a) to (c).
    pub daemon_args: Vec<String>,
    /// (a) Relayed round trips.
    pub round_trips: Outcome<RoundTripsResult>,
    /// (b) Connect through the front against lease + direct connect.
    pub connect: Outcome<ConnectCost>,
    /// (c) The fixture's end-to-end test both ways.
    pub suite: Outcome<suite::SuiteResult>,
    /// (d) Idle connections through the front.
    pub idle: Outcome<idle::IdleResult>,
}

impl FrontResult {
    /// A part failed: the harness, not a figure.
    pub fn harness_failed(&self) -> bool {
        [
            matches!(self.round_trips, Outcome::Failed { .. }),
            matches!(self.connect, Outcome::Failed { .. }),
            matches!(self.suite, Outcome::Failed { .. }),
            matches!(self.idle, Outcome::Failed { .. }),
        ]
        .into_iter()
        .any(|f| f)
    }

    /// Tests of part (c) that found another test's database, or lost theirs.
    pub fn isolation_failures(&self) -> usize {
        self.suite
            .done()
            .map_or(0, |s| s.double_leases + s.missing_databases)
    }
}

/// (a) Relayed round trips (a struct: an outcome's figures are an object in the JSON).
#[derive(Debug, Serialize)]
pub struct RoundTripsResult {
    /// One entry per kind of query, through tokio-postgres.
    pub kinds: Vec<RoundTrips>,
    /// The lookup through libpq (pgbench), when pgbench was found.
    pub libpq: Option<libpq::LibpqRoundTrips>,
}

/// (a) One kind of query, both paths.
#[derive(Debug, Serialize)]
pub struct RoundTrips {
    /// What was sent.
    pub kind: &'static str,
    /// On a direct connection to a database leased over HTTP, ms per query.
    pub direct: Summary,
    /// Through the front, ms per query.
    pub front: Summary,
    /// p50 front ÷ p50 direct (target ≤ [`ROUND_TRIP_TARGET`]).
    pub p50_ratio: Option<f64>,
    /// p99 front ÷ p99 direct.
    pub p99_ratio: Option<f64>,
    /// What the front adds to a query at p50, µs.
    pub p50_added_us: f64,
}

/// (b) Connecting both ways, ms.
#[derive(Debug, Serialize)]
pub struct ConnectCost {
    /// Connections per path.
    pub iterations: usize,
    /// Front: the connect itself (start-up, the lease, the login at postgres, the greeting).
    pub front_connect: Summary,
    /// Front: connect + `SELECT 1` + close (the release happens after, in the daemon).
    pub front_cycle: Summary,
    /// HTTP: `POST /lease`.
    pub http_lease: Summary,
    /// HTTP: `POST /lease` + the direct connect.
    pub http_lease_connect: Summary,
    /// HTTP: `DELETE /leases/{id}?reuse=false`.
    pub http_release: Summary,
    /// HTTP: lease + connect + `SELECT 1` + close + release.
    pub http_cycle: Summary,
    /// p50 front connect ÷ p50 lease + connect (target ≤ [`CONNECT_TARGET`]).
    pub connect_ratio: Option<f64>,
    /// The same at p99.
    pub connect_ratio_p99: Option<f64>,
    /// p50 front cycle ÷ p50 HTTP cycle.
    pub cycle_ratio: Option<f64>,
    /// Failed connections, either path.
    pub errors: usize,
    /// The first failure.
    pub first_error: Option<String>,
}

/// Runs scenario 14: parts (a) to (c) on one daemon with the fixture, then (d) on its own.
pub async fn run(ctx: &Ctx) -> Result<FrontResult> {
    let daemon_args = strings(&[
        "--prebuild",
        "--max-total",
        "64",
        "--min-ready",
        "4",
        "--front-listen",
        "127.0.0.1:0",
    ]);
    let mut args = ctx.fixture_args();
    args.extend(daemon_args.iter().cloned());
    args.extend(ctx.cache_args());
    let daemon = ctx.launcher.start("front", &args).await?;
    let front = daemon.front_addr().await?;
    let server = daemon.server_info().await?;
    let admin_conn = admin::superuser(&server, "postgres").await?;
    let api = daemon.api()?;
    admin::wait_idle(api, &admin_conn.client, FIXTURE, MIN_READY, IDLE_LIMIT).await?;
    eprintln!("[bench] 14 front: relayed round trips ({front})");
    let round_trips = outcome(
        "14 (a)",
        round_trips(ctx, api, &admin_conn.client, front).await,
    );
    eprintln!("[bench] 14 front: connect, front vs POST /lease + direct");
    let connect = outcome(
        "14 (b)",
        connect_cost(api, &admin_conn.client, front, ctx.plan.front_connects).await,
    );
    let suite = outcome(
        "14 (c)",
        suite::run(ctx, &daemon, front, &admin_conn.client).await,
    );
    admin_conn.close().await;
    daemon.stop().await?;
    let idle = outcome("14 (d)", idle::run(ctx).await);
    Ok(FrontResult {
        daemon_args,
        round_trips,
        connect,
        suite,
        idle,
    })
}

/// A part's result as an outcome, its failure logged.
fn outcome<T>(part: &str, result: Result<T>) -> Outcome<T> {
    match result {
        Ok(value) => Outcome::Done(value),
        Err(error) => {
            eprintln!("[bench] scenario {part} failed: {error}");
            Outcome::Failed {
                error: error.to_string(),
            }
        }
    }
}

/// A connection to `template` through the front at `addr`, labelled `label`. Without a
/// token the front takes any user and password.
pub(crate) fn front_config(addr: SocketAddr, template: &str, label: &str) -> Config {
    let mut config = Config::new();
    config
        .host(addr.ip().to_string())
        .port(addr.port())
        .user("bench")
        .password("bench")
        .dbname(template)
        .application_name(label);
    config
}

/// `a ÷ b`, when both were measured.
pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (a > 0.0 && b > 0.0).then(|| round3(a / b))
}

/// (a): a lease over HTTP and a connection through the front, both to the fixture, then
/// each kind of query on both.
async fn round_trips(
    ctx: &Ctx,
    api: &Api,
    admin_conn: &Client,
    front: SocketAddr,
) -> Result<RoundTripsResult> {
    let queries = ctx.plan.front_queries;
    let lease = api.lease(FIXTURE, WAIT_MS).await?;
    let measured = async {
        let direct = admin::connect_url(&lease.url).await?;
        let through = admin::connect_config(
            &front_config(front, FIXTURE, "pglease-bench-round-trips"),
            "the front",
        )
        .await?;
        // Both leases started a refill clone: done before anything is timed.
        admin::wait_quiet(api, admin_conn, IDLE_LIMIT).await?;
        let mut kinds = Vec::new();
        for extended in [false, true] {
            kinds.push(one_kind(extended, &direct, &through, queries).await?);
        }
        direct.close().await;
        through.close().await;
        let libpq = match &ctx.pgbench {
            Some(pgbench) => {
                eprintln!("[bench] 14 front: relayed round trips through libpq (pgbench)");
                let paths = libpq::Paths {
                    lease: &lease,
                    front,
                    api,
                    admin_conn,
                };
                Some(libpq::run(ctx, pgbench, &paths).await)
            }
            None => None,
        };
        Ok(RoundTripsResult { kinds, libpq })
    }
    .await;
    api.release(&lease.id, false).await?;
    measured
}

/// `queries` of one kind on each path, in alternating blocks (a first block each, not
/// counted, warms both connections).
async fn one_kind(
    extended: bool,
    direct: &Conn,
    front: &Conn,
    queries: usize,
) -> Result<RoundTrips> {
    let statements = if extended {
        Some((
            prepare(&direct.client).await?,
            prepare(&front.client).await?,
        ))
    } else {
        None
    };
    let paths = [
        (&direct.client, statements.as_ref().map(|s| &s.0)),
        (&front.client, statements.as_ref().map(|s| &s.1)),
    ];
    let mut samples: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for block in 0..=queries.div_ceil(BLOCK) {
        let order = if block % 2 == 0 { [0, 1] } else { [1, 0] };
        for path in order {
            let (client, statement) = paths[path];
            for i in 0..BLOCK {
                let id = i32::try_from((block * BLOCK + i) % 600 + 1).unwrap_or(1);
                let started = Instant::now();
                query(client, statement, id).await?;
                if block > 0 {
                    samples[path].push(started.elapsed());
                }
            }
        }
    }
    let [direct, front] = samples.map(|s| Summary::of(&s));
    Ok(RoundTrips {
        kind: if extended {
            "extended: SELECT email FROM customers WHERE id = $1 (prepared)"
        } else {
            "simple: SELECT 1"
        },
        p50_ratio: ratio(front.p50_ms, direct.p50_ms),
        p99_ratio: ratio(front.p99_ms, direct.p99_ms),
        p50_added_us: round3((front.p50_ms - direct.p50_ms) * 1000.0),
        direct,
        front,
    })
}

/// The lookup of part (a)'s extended kind, prepared on `client`.
async fn prepare(client: &Client) -> Result<Statement> {
    client
        .prepare("SELECT email FROM customers WHERE id = $1")
        .await
        .map_err(|e| BenchError::postgres("preparing the lookup", e))
}

/// One query: the prepared lookup of `id` (extended protocol), else `SELECT 1` (simple).
async fn query(client: &Client, lookup: Option<&Statement>, id: i32) -> Result<()> {
    match lookup {
        Some(statement) => client
            .query_one(statement, &[&id])
            .await
            .map(drop)
            .map_err(|e| BenchError::postgres("the lookup", e)),
        None => client
            .simple_query("SELECT 1")
            .await
            .map(drop)
            .map_err(|e| BenchError::postgres("SELECT 1", e)),
    }
}

/// Samples of part (b).
#[derive(Default)]
struct ConnectSamples {
    front_connect: Vec<Duration>,
    front_cycle: Vec<Duration>,
    http_lease: Vec<Duration>,
    http_lease_connect: Vec<Duration>,
    http_release: Vec<Duration>,
    http_cycle: Vec<Duration>,
}

/// (b): `iterations` connections each way, alternating which goes first; the pool idle
/// (refilled, the last release's drop done) before each, so that the background work of
/// one connection never lands on the next.
async fn connect_cost(
    api: &Api,
    admin_conn: &Client,
    front: SocketAddr,
    iterations: usize,
) -> Result<ConnectCost> {
    let config = front_config(front, FIXTURE, "pglease-bench-connect");
    let mut samples = ConnectSamples::default();
    let (mut errors, mut first_error) = (0usize, None);
    for round in 0..iterations {
        let front_first = round % 2 == 0;
        for through_front in [front_first, !front_first] {
            admin::wait_idle(api, admin_conn, FIXTURE, MIN_READY, IDLE_LIMIT).await?;
            let measured = if through_front {
                front_once(&config, &mut samples).await
            } else {
                http_once(api, &mut samples).await
            };
            if let Err(error) = measured {
                errors += 1;
                first_error.get_or_insert(error.to_string());
            }
        }
        if errors >= MAX_ERRORS {
            break;
        }
    }
    let s = |samples: &[Duration]| Summary::of(samples);
    let (front_connect, http_lease_connect) =
        (s(&samples.front_connect), s(&samples.http_lease_connect));
    let (front_cycle, http_cycle) = (s(&samples.front_cycle), s(&samples.http_cycle));
    Ok(ConnectCost {
        iterations,
        connect_ratio: ratio(front_connect.p50_ms, http_lease_connect.p50_ms),
        connect_ratio_p99: ratio(front_connect.p99_ms, http_lease_connect.p99_ms),
        cycle_ratio: ratio(front_cycle.p50_ms, http_cycle.p50_ms),
        front_connect,
        front_cycle,
        http_lease: s(&samples.http_lease),
        http_lease_connect,
        http_release: s(&samples.http_release),
        http_cycle,
        errors,
        first_error,
    })
}

/// Connect through the front, `SELECT 1`, close.
async fn front_once(config: &Config, samples: &mut ConnectSamples) -> Result<()> {
    let started = Instant::now();
    let conn = admin::connect_config(config, "the front").await?;
    let connected = started.elapsed();
    let selected = select_one(&conn.client).await;
    conn.close().await;
    selected?;
    samples.front_connect.push(connected);
    samples.front_cycle.push(started.elapsed());
    Ok(())
}

/// `POST /lease`, connect with its URL, `SELECT 1`, close, `DELETE /leases/{id}`.
async fn http_once(api: &Api, samples: &mut ConnectSamples) -> Result<()> {
    let started = Instant::now();
    let lease = api.lease(FIXTURE, WAIT_MS).await?;
    let leased = started.elapsed();
    let worked = async {
        let conn = admin::connect_url(&lease.url).await?;
        let connected = started.elapsed();
        let selected = select_one(&conn.client).await;
        conn.close().await;
        selected.map(|()| connected)
    }
    .await;
    let releasing = Instant::now();
    let released = api.release(&lease.id, false).await;
    let release_time = releasing.elapsed();
    let connected = worked?;
    released?;
    samples.http_lease.push(leased);
    samples.http_lease_connect.push(connected);
    samples.http_release.push(release_time);
    samples.http_cycle.push(started.elapsed());
    Ok(())
}

async fn select_one(client: &Client) -> Result<()> {
    client
        .simple_query("SELECT 1")
        .await
        .map(drop)
        .map_err(|e| BenchError::postgres("SELECT 1", e))
}
