//! Scenario 5, connection cost: connect + `SELECT 1` + disconnect, N times in a row, ms
//! per connection. Kinds measured:
//! - a lease's URL under each `--lease-auth` mode (`scram`, `trust`) when the binary has
//!   that flag, each on its own small daemon, both running at once with their connections
//!   alternating; otherwise the lease URL as the daemon issues it today, with a TODO in
//!   the report;
//! - a lease's URL on the shared daemon (whatever its default authentication is);
//! - stock SCRAM for reference: a role created with a plain `PASSWORD` (the server's own
//!   4096-iteration verifier) connecting over the same TCP port to an empty database of
//!   its own name (pglease's `pg_hba.conf` admits TCP roles to `sameuser` databases only),
//!   on the `--lease-auth scram` daemon when there is one;
//! - the superuser over the unix socket (trust), for scale only: another transport.

use std::path::Path;
use std::time::{Duration, Instant};

use pglease_api::wire::LeaseResponse;
use serde::Serialize;

use super::seeds::{parse_pgbench, run_pgbench, Db};
use super::{Ctx, FIXTURE, IDLE_LIMIT, WAIT_MS};
use crate::admin::{self, Conn};
use crate::daemon::{Daemon, ServerInfo};
use crate::error::{BenchError, Result};
use crate::stats::{median, round3, Summary};

/// The daemons of the connection cost, each with its flags: `scram` has the default
/// verifier (4096 iterations, which every common driver accepts), `scram-16` the fast
/// opt-in (the default before).
const AUTH_MODES: [(&str, &[&str]); 3] = [
    ("scram", &["--lease-auth", "scram"]),
    ("trust", &["--lease-auth", "trust"]),
    (
        "scram-16",
        &["--lease-auth", "scram", "--scram-iterations", "16"],
    ),
];

/// The reference role's name and password.
const STOCK_ROLE: &str = "bench_stock_scram";
const STOCK_PASSWORD: &str = "bench-stock-password";

/// Scenario 5's figures.
#[derive(Debug, Serialize)]
pub struct ConnectResult {
    /// Connections per kind.
    pub iterations: usize,
    /// Whether `pglease serve --help` lists `--lease-auth`.
    pub lease_auth_flag: bool,
    /// Set when part of the scenario could not be measured yet.
    pub todo: Option<String>,
    /// One entry per kind of connection.
    pub kinds: Vec<ConnectKind>,
    /// p50 of lease-scram over p50 of lease-trust (target ≤ 1.2), when both ran.
    pub scram_over_trust: Option<f64>,
    /// The same two lease URLs through libpq (`pgbench -C`), when pgbench was found.
    pub libpq: Option<LibpqCost>,
}

/// Connection cost through libpq, the library most test suites' drivers use: `pgbench -n
/// -C -c 1 -T secs -f (SELECT 1)`, a new connection per transaction, runs alternating
/// between the `--lease-auth scram` and `trust` leases. A run's figure is pgbench's
/// `latency average`, which with `-C` is connect + `SELECT 1` + disconnect.
#[derive(Debug, Serialize)]
pub struct LibpqCost {
    /// What ran.
    pub method: String,
    /// Each scram run's ms per connection.
    pub scram_runs_ms: Vec<f64>,
    /// Each trust run's ms per connection.
    pub trust_runs_ms: Vec<f64>,
    /// Median of the scram runs.
    pub scram_median_ms: Option<f64>,
    /// Median of the trust runs.
    pub trust_median_ms: Option<f64>,
    /// `scram_median_ms / trust_median_ms`.
    pub scram_over_trust: Option<f64>,
    /// The first failure, if a run failed.
    pub error: Option<String>,
}

/// One kind of connection.
#[derive(Debug, Serialize)]
pub struct ConnectKind {
    /// Short name.
    pub name: String,
    /// What exactly was measured.
    pub description: String,
    /// Connect + SELECT 1 + disconnect, ms.
    pub per_connection: Summary,
    /// Failed connections.
    pub errors: usize,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// The role's stored verifier, `SCRAM-SHA-256$<iterations>` (or what it is), read
    /// back from `pg_authid`; under `trust` it is stored but not used.
    pub verifier: Option<String>,
}

/// Runs scenario 5: the shared daemon for the reference kinds, small daemons per
/// `--lease-auth` mode when the flag exists.
pub async fn run(
    ctx: &Ctx,
    daemon: &Daemon,
    server: &ServerInfo,
    admin_conn: &tokio_postgres::Client,
) -> Result<ConnectResult> {
    let iterations = ctx.plan.connect_iterations;
    let mut kinds = Vec::new();
    let mut todo = None;
    let mut stock = None;
    let mut libpq = None;
    if ctx.has_lease_auth {
        // All modes run at once and their connections alternate, so drift in the
        // machine's load falls on all alike (the ratios are of ~3-8 ms figures).
        eprintln!(
            "[bench] 5 connection cost: lease, --lease-auth scram (default and 16 iterations) and trust, interleaved"
        );
        let mut daemons = Vec::new();
        for (mode, flags) in AUTH_MODES {
            let mut args = super::strings(flags);
            args.extend(ctx.cache_args());
            let auth_daemon = ctx
                .launcher
                .start(&format!("connect-{mode}"), &args)
                .await?;
            let auth_server = auth_daemon.server_info().await?;
            let auth_admin = admin::superuser(&auth_server, "postgres").await?;
            let lease = auth_daemon.api()?.lease("default", WAIT_MS).await?;
            daemons.push((mode, auth_daemon, auth_server, auth_admin, lease));
        }
        // Each lease started a refill clone; neither may overlap the measurement.
        for (_, auth_daemon, _, auth_admin, _) in &daemons {
            admin::wait_quiet(auth_daemon.api()?, &auth_admin.client, IDLE_LIMIT).await?;
        }
        let targets: Vec<(String, String, String)> = daemons
            .iter()
            .zip(AUTH_MODES)
            .map(|((mode, _, _, _, lease), (_, flags))| {
                (
                    format!("lease-{mode}"),
                    format!("lease URL (TCP) with {}, template default", flags.join(" ")),
                    lease.url.clone(),
                )
            })
            .collect();
        let mut measured = measure_interleaved(&targets, iterations).await;
        if let Some(pgbench) = &ctx.pgbench {
            eprintln!(
                "[bench] 5 connection cost: lease, scram and trust, through libpq (pgbench -C)"
            );
            // libpq compares the first two, scram (the default) and trust.
            let leases: Vec<&LeaseResponse> = daemons.iter().take(2).map(|d| &d.4).collect();
            libpq = Some(libpq_cost(ctx, pgbench, &leases).await);
        }
        for ((_, _, _, auth_admin, lease), kind) in daemons.iter().zip(measured.iter_mut()) {
            kind.verifier = verifier(&auth_admin.client, &lease.user).await;
        }
        for (mode, auth_daemon, auth_server, auth_admin, lease) in daemons {
            // The reference runs where lease roles use SCRAM, so pg_hba asks it for SCRAM.
            if mode == "scram" {
                eprintln!("[bench] 5 connection cost: stock SCRAM role");
                stock = Some(stock_scram(&auth_server, &auth_admin.client, iterations).await);
            }
            auth_daemon.api()?.release(&lease.id, true).await?;
            auth_admin.close().await;
            auth_daemon.stop().await?;
        }
        kinds.extend(measured);
    } else {
        todo = Some(
            "TODO: this pglease has no --lease-auth flag; only the daemon's current lease \
             authentication was measured. Re-run once `pglease serve --help` lists --lease-auth."
                .into(),
        );
    }
    eprintln!("[bench] 5 connection cost: lease on the shared daemon, superuser");
    kinds.push(
        lease_kind(
            daemon,
            admin_conn,
            FIXTURE,
            "lease-default-auth",
            "lease URL (TCP) with the daemon's default authentication, fixture template",
            iterations,
        )
        .await?,
    );
    let stock = match stock {
        Some(stock) => stock,
        None => {
            eprintln!("[bench] 5 connection cost: stock SCRAM role");
            stock_scram(server, admin_conn, iterations).await
        }
    };
    kinds.push(stock?);
    let socket_config = admin::superuser_config(server, "postgres");
    kinds.push(
        measure(
            "superuser-socket-trust",
            "superuser over the unix socket (trust): another transport, for scale only",
            iterations,
            || admin::connect_config(&socket_config, "superuser socket"),
        )
        .await,
    );
    let p50 = |name: &str| {
        kinds
            .iter()
            .find(|k| k.name == name && k.per_connection.count > 0)
            .map(|k| k.per_connection.p50_ms)
    };
    let scram_over_trust = match (p50("lease-scram"), p50("lease-trust")) {
        (Some(scram), Some(trust)) if trust > 0.0 => Some(round3(scram / trust)),
        _ => None,
    };
    Ok(ConnectResult {
        iterations,
        lease_auth_flag: ctx.has_lease_auth,
        todo,
        kinds,
        scram_over_trust,
        libpq,
    })
}

/// Runs [`LibpqCost`]'s measurement on `[scram lease, trust lease]`.
async fn libpq_cost(ctx: &Ctx, pgbench: &Path, leases: &[&LeaseResponse]) -> LibpqCost {
    let secs = ctx.plan.connect_libpq_secs;
    let runs = ctx.plan.connect_libpq_runs;
    let mut cost = LibpqCost {
        method: format!(
            "pgbench -n -C -c 1 -T {secs} -f (SELECT 1), {runs} runs per mode, alternating; ms per connection"
        ),
        scram_runs_ms: Vec::new(),
        trust_runs_ms: Vec::new(),
        scram_median_ms: None,
        trust_median_ms: None,
        scram_over_trust: None,
        error: None,
    };
    let script = ctx.work_dir.join("connect-select1.sql");
    if let Err(error) = std::fs::write(&script, "SELECT 1;\n") {
        cost.error = Some(format!("cannot write {}: {error}", script.display()));
        return cost;
    }
    let script = script.display().to_string();
    let secs_arg = secs.to_string();
    let args = ["-n", "-C", "-c", "1", "-T", &secs_arg, "-f", &script];
    let limit = Duration::from_secs(secs + 30);
    let [scram, trust] = leases else {
        cost.error = Some("needs the scram and the trust lease".into());
        return cost;
    };
    let (scram, trust): (Db, Db) = ((*scram).clone().into(), (*trust).clone().into());
    'runs: for round in 0..runs {
        // Alternate which mode goes first, so neither always follows the other.
        let order = if round % 2 == 0 {
            [(true, &scram), (false, &trust)]
        } else {
            [(false, &trust), (true, &scram)]
        };
        for (is_scram, db) in order {
            let figure = run_pgbench(pgbench, db, &args, limit)
                .await
                .and_then(|output| parse_pgbench(&output))
                .and_then(|figures| {
                    figures.latency_avg_ms.ok_or_else(|| {
                        BenchError::Other("pgbench printed no latency average".into())
                    })
                });
            match figure {
                Ok(ms) if is_scram => cost.scram_runs_ms.push(round3(ms)),
                Ok(ms) => cost.trust_runs_ms.push(round3(ms)),
                Err(error) => {
                    cost.error = Some(error.to_string());
                    break 'runs;
                }
            }
        }
    }
    cost.scram_median_ms = median(&cost.scram_runs_ms);
    cost.trust_median_ms = median(&cost.trust_runs_ms);
    cost.scram_over_trust = match (cost.scram_median_ms, cost.trust_median_ms) {
        (Some(scram), Some(trust)) if trust > 0.0 => Some(round3(scram / trust)),
        _ => None,
    };
    cost
}

/// Leases from `daemon`, measures its URL, releases.
async fn lease_kind(
    daemon: &Daemon,
    admin_conn: &tokio_postgres::Client,
    template: &str,
    name: &str,
    description: &str,
    iterations: usize,
) -> Result<ConnectKind> {
    let api = daemon.api()?;
    let lease = api.lease(template, WAIT_MS).await?;
    let url = lease.url.clone();
    let mut kind = measure(name, description, iterations, || admin::connect_url(&url)).await;
    kind.verifier = verifier(admin_conn, &lease.user).await;
    api.release(&lease.id, true).await?;
    Ok(kind)
}

/// Creates the stock-SCRAM role, measures it, drops it.
async fn stock_scram(
    server: &ServerInfo,
    admin_conn: &tokio_postgres::Client,
    iterations: usize,
) -> Result<ConnectKind> {
    // pg_hba admits a TCP role only to the database of its own name (`sameuser`).
    admin::execute_each(
        admin_conn,
        &[
            "SET password_encryption = 'scram-sha-256'".to_string(),
            format!("DROP DATABASE IF EXISTS {STOCK_ROLE} WITH (FORCE)"),
            format!("DROP ROLE IF EXISTS {STOCK_ROLE}"),
            format!("CREATE ROLE {STOCK_ROLE} LOGIN PASSWORD '{STOCK_PASSWORD}'"),
            format!(
                "CREATE DATABASE {STOCK_ROLE} OWNER {STOCK_ROLE} TEMPLATE template0 STRATEGY FILE_COPY"
            ),
        ],
        "creating the stock-SCRAM role and its database",
    )
    .await?;
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(server.port)
        .user(STOCK_ROLE)
        .password(STOCK_PASSWORD)
        .dbname(STOCK_ROLE);
    let mut kind = measure(
        "stock-scram",
        "a role with a plain PASSWORD (server-made SCRAM verifier, 4096 iterations), TCP, an empty database of its name",
        iterations,
        || admin::connect_config(&config, "stock SCRAM role"),
    )
    .await;
    kind.verifier = verifier(admin_conn, STOCK_ROLE).await;
    admin::execute_each(
        admin_conn,
        &[
            format!("DROP DATABASE IF EXISTS {STOCK_ROLE} WITH (FORCE)"),
            format!("DROP ROLE IF EXISTS {STOCK_ROLE}"),
        ],
        "dropping the stock-SCRAM role",
    )
    .await?;
    Ok(kind)
}

/// The kind and iteration count of `role`'s stored password, e.g. `SCRAM-SHA-256$16`.
async fn verifier(admin_conn: &tokio_postgres::Client, role: &str) -> Option<String> {
    let row = admin_conn
        .query_opt(
            "SELECT split_part(rolpassword, ':', 1) FROM pg_authid WHERE rolname = $1",
            &[&role],
        )
        .await
        .ok()??;
    row.get::<_, Option<String>>(0)
}

/// Like [`measure`] for several lease URLs at once, one connection to each in turn per
/// round (the order rotating each round), so they share the machine's conditions.
async fn measure_interleaved(
    targets: &[(String, String, String)],
    iterations: usize,
) -> Vec<ConnectKind> {
    let mut tallies: Vec<Tally> = targets.iter().map(|_| Tally::default()).collect();
    for round in 0..iterations {
        for offset in 0..targets.len() {
            let index = (round + offset) % targets.len();
            let tally = &mut tallies[index];
            if tally.errors < 10 {
                tally.record(one_connection(|| admin::connect_url(&targets[index].2)).await);
            }
        }
    }
    targets
        .iter()
        .zip(tallies)
        .map(|((name, description, _), tally)| tally.into_kind(name, description))
        .collect()
}

/// Samples and failures of one kind.
#[derive(Default)]
struct Tally {
    samples: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

impl Tally {
    fn record(&mut self, outcome: Result<Duration>) {
        match outcome {
            Ok(took) => self.samples.push(took),
            Err(error) => {
                self.errors += 1;
                self.first_error.get_or_insert(error.to_string());
            }
        }
    }

    fn into_kind(self, name: &str, description: &str) -> ConnectKind {
        ConnectKind {
            name: name.to_string(),
            description: description.to_string(),
            per_connection: Summary::of(&self.samples),
            errors: self.errors,
            first_error: self.first_error,
            verifier: None,
        }
    }
}

/// Connect, `SELECT 1`, disconnect: how long it took.
async fn one_connection<F, Fut>(connect: F) -> Result<Duration>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Conn>>,
{
    let t0 = Instant::now();
    let conn = connect().await?;
    let selected = conn
        .client
        .simple_query("SELECT 1")
        .await
        .map_err(|e| BenchError::postgres("SELECT 1", e));
    conn.close().await;
    selected.map(|_| t0.elapsed())
}

/// Connects, runs `SELECT 1`, disconnects, `iterations` times; times each.
async fn measure<F, Fut>(
    name: &str,
    description: &str,
    iterations: usize,
    connect: F,
) -> ConnectKind
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Conn>>,
{
    let mut tally = Tally::default();
    while tally.samples.len() + tally.errors < iterations && tally.errors < 10 {
        tally.record(one_connection(&connect).await);
    }
    tally.into_kind(name, description)
}
