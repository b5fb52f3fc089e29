//! Scenario 2, end-to-end test throughput: 1, 2, 8, 32 workers each running "tests" back
//! to back for a fixed time. A test is what a real test does: lease the fixture, connect
//! with the lease's URL, one transaction (10 inserts and a select), disconnect, release
//! with `reuse=false` (the daemon drops the database and makes a new one).
//!
//! Each test also checks isolation. First thing in its transaction it reads the one-row
//! `bench_marker` table and inserts its lease id there; a row already present, or a unique
//! violation on the insert (another open transaction holds the row), means the database
//! was handed to two tests: a double lease. A database that does not exist at connect
//! time, or is dropped under the test, is a missing database. Both are printed at once,
//! loudly, and counted; the only acceptable count is 0.

use std::time::{Duration, Instant};

use pglease_api::wire::LeaseResponse;
use serde::Serialize;

use super::{Ctx, FIXTURE, IDLE_LIMIT, WAIT_MS};
use crate::admin::{self, sqlstate};
use crate::api::Api;
use crate::cpu::{ByProcess, CpuClock, CpuUse};
use crate::daemon::Daemon;
use crate::error::{BenchError, Result};
use crate::stats::{per_second, round3, Summary};

/// SQLSTATE invalid_catalog_name: "database … does not exist".
const NO_SUCH_DATABASE: &str = "3D000";
/// SQLSTATE admin_shutdown: the session was terminated (DROP DATABASE … WITH (FORCE)).
const TERMINATED: &str = "57P01";
/// SQLSTATE unique_violation.
const UNIQUE_VIOLATION: &str = "23505";

/// Scenario 2's figures.
#[derive(Debug, Serialize)]
pub struct ThroughputResult {
    /// The template leased.
    pub template: &'static str,
    /// What one test does.
    pub test: &'static str,
    /// Double leases over all levels (must be 0).
    pub double_leases: usize,
    /// Missing databases over all levels (must be 0).
    pub missing_databases: usize,
    /// One entry per concurrency.
    pub levels: Vec<ThroughputLevel>,
}

/// One concurrency level.
#[derive(Debug, Serialize)]
pub struct ThroughputLevel {
    /// Concurrent workers.
    pub workers: usize,
    /// Tests completed.
    pub tests: usize,
    /// From the first test's start to the last one's end, seconds.
    pub elapsed_secs: f64,
    /// `tests / elapsed_secs`.
    pub tests_per_sec: f64,
    /// After the last test, until the pool was idle again (drops done, ready queue
    /// refilled), seconds.
    pub settle_secs: f64,
    /// `tests / (elapsed_secs + settle_secs)`: throughput with the recycle debt paid,
    /// comparable to scenario 3's create+drop ceiling.
    pub tests_per_sec_settled: f64,
    /// Tests that found another test's marker.
    pub double_leases: usize,
    /// Tests whose database was missing or dropped under them.
    pub missing_databases: usize,
    /// Other failures (HTTP errors, timeouts).
    pub errors: usize,
    /// The first failure of any kind, if any.
    pub first_error: Option<String>,
    /// Per-test overhead: lease + release HTTP calls, ms.
    pub overhead: Summary,
    /// `POST /lease`, ms (includes waiting for a clone when the pool runs dry).
    pub lease: Summary,
    /// Connect with the lease URL (TCP, the lease's authentication), ms.
    pub connect: Summary,
    /// The transaction (marker, 10 inserts, select, commit) and the disconnect, ms.
    pub work: Summary,
    /// `DELETE /leases/{id}?reuse=false`, ms.
    pub release: Summary,
    /// The whole test, ms.
    pub total: Summary,
    /// Machine CPU use over the tests and the settling after them (the recycle debt).
    pub cpu: Option<CpuUse>,
    /// Busy CPU per test over the same stretch, ms: everything a test costs the machine
    /// (its backend, the daemon, the clone and drop, this driver).
    pub cpu_ms_per_test: Option<f64>,
    /// The same by party (postgres, the daemon, this driver, the rest).
    pub cpu_by_process_per_test: Option<ByProcess>,
}

/// Runs scenario 2 on the shared daemon, which must be idle.
pub async fn run(
    ctx: &Ctx,
    daemon: &Daemon,
    admin_conn: &tokio_postgres::Client,
) -> Result<ThroughputResult> {
    let api = daemon.api()?.clone();
    let mut levels = Vec::new();
    for &workers in &ctx.plan.throughput_workers {
        admin::wait_idle(&api, admin_conn, FIXTURE, 1, IDLE_LIMIT).await?;
        eprintln!("[bench] 2 end-to-end throughput: {workers} workers");
        let cpu = CpuClock::watching(daemon.pid());
        let mut result = level(&api, workers, ctx.plan.throughput_duration).await;
        let settle = admin::wait_idle(&api, admin_conn, FIXTURE, 1, IDLE_LIMIT).await?;
        result.cpu = cpu.since();
        result.cpu_ms_per_test = result.cpu.and_then(|c| c.ms_per(result.tests));
        result.cpu_by_process_per_test = result.cpu.and_then(|c| c.by_process_per(result.tests));
        result.settle_secs = round3(settle.as_secs_f64());
        result.tests_per_sec_settled = per_second(
            result.tests,
            Duration::from_secs_f64(result.elapsed_secs) + settle,
        );
        levels.push(result);
    }
    Ok(ThroughputResult {
        template: FIXTURE,
        test: "lease → connect → BEGIN; marker check; 10 INSERT; SELECT; COMMIT → disconnect → release(reuse=false)",
        double_leases: levels.iter().map(|l| l.double_leases).sum(),
        missing_databases: levels.iter().map(|l| l.missing_databases).sum(),
        levels,
    })
}

/// The timings of one successful test.
struct Timings {
    lease: Duration,
    connect: Duration,
    work: Duration,
    release: Duration,
    total: Duration,
}

/// How a test ended.
enum Outcome {
    Passed(Timings),
    DoubleLease(String),
    MissingDatabase(String),
    Failed(String),
}

#[derive(Default)]
struct Tally {
    timings: Vec<Timings>,
    double_leases: usize,
    missing_databases: usize,
    errors: usize,
    first_error: Option<String>,
}

/// `workers` workers running tests for `duration`, then the settling after them.
pub(crate) async fn level(api: &Api, workers: usize, duration: Duration) -> ThroughputLevel {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for worker_index in 0..workers {
        let api = api.clone();
        tasks.spawn(async move {
            let mut tally = Tally::default();
            let mut test_index = 0usize;
            while Instant::now() < deadline && tally.errors < 50 {
                test_index += 1;
                let customer =
                    i32::try_from((worker_index * 7919 + test_index) % 600 + 1).unwrap_or(1);
                match one_test(&api, customer).await {
                    Outcome::Passed(timings) => tally.timings.push(timings),
                    Outcome::DoubleLease(message) => {
                        eprintln!("[bench] !!! ISOLATION FAILURE: DOUBLE LEASE: {message}");
                        tally.double_leases += 1;
                        tally.first_error.get_or_insert(message);
                    }
                    Outcome::MissingDatabase(message) => {
                        eprintln!("[bench] !!! ISOLATION FAILURE: MISSING DATABASE: {message}");
                        tally.missing_databases += 1;
                        tally.first_error.get_or_insert(message);
                    }
                    Outcome::Failed(message) => {
                        tally.errors += 1;
                        tally.first_error.get_or_insert(message);
                    }
                }
            }
            tally
        });
    }
    let mut all = Tally::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(tally) => {
                all.timings.extend(tally.timings);
                all.double_leases += tally.double_leases;
                all.missing_databases += tally.missing_databases;
                all.errors += tally.errors;
                all.first_error = all.first_error.or(tally.first_error);
            }
            Err(error) => {
                all.errors += 1;
                all.first_error
                    .get_or_insert(format!("worker panicked: {error}"));
            }
        }
    }
    let elapsed = started.elapsed();
    let pick =
        |f: fn(&Timings) -> Duration| -> Vec<Duration> { all.timings.iter().map(f).collect() };
    ThroughputLevel {
        workers,
        tests: all.timings.len(),
        elapsed_secs: round3(elapsed.as_secs_f64()),
        tests_per_sec: per_second(all.timings.len(), elapsed),
        settle_secs: 0.0,
        tests_per_sec_settled: 0.0,
        double_leases: all.double_leases,
        missing_databases: all.missing_databases,
        errors: all.errors,
        first_error: all.first_error,
        overhead: Summary::of(&pick(|t| t.lease + t.release)),
        lease: Summary::of(&pick(|t| t.lease)),
        connect: Summary::of(&pick(|t| t.connect)),
        work: Summary::of(&pick(|t| t.work)),
        release: Summary::of(&pick(|t| t.release)),
        total: Summary::of(&pick(|t| t.total)),
        cpu: None,
        cpu_ms_per_test: None,
        cpu_by_process_per_test: None,
    }
}

/// One test, start to end. The lease is released whatever happens in between.
async fn one_test(api: &Api, customer: i32) -> Outcome {
    let t0 = Instant::now();
    let lease = match api.lease(FIXTURE, WAIT_MS).await {
        Ok(lease) => lease,
        Err(error) => return Outcome::Failed(error.to_string()),
    };
    let lease_time = t0.elapsed();
    let t1 = Instant::now();
    let conn = match admin::connect_url(&lease.url).await {
        Ok(conn) => conn,
        Err(error) => {
            let _ = api.release(&lease.id, false).await;
            return classify(&lease, error);
        }
    };
    let connect_time = t1.elapsed();
    let t2 = Instant::now();
    let worked = work(&conn.client, &lease.id, customer).await;
    conn.close().await;
    let work_time = t2.elapsed();
    let t3 = Instant::now();
    let released = api.release(&lease.id, false).await;
    let release_time = t3.elapsed();
    match (worked, released) {
        (Ok(None), Ok(())) => Outcome::Passed(Timings {
            lease: lease_time,
            connect: connect_time,
            work: work_time,
            release: release_time,
            total: t0.elapsed(),
        }),
        (Ok(Some(other)), _) => Outcome::DoubleLease(format!(
            "lease {} (database {}) found the marker of lease {other}",
            lease.id, lease.database
        )),
        (Err(error), _) => classify(&lease, error),
        (Ok(None), Err(error)) => Outcome::Failed(error.to_string()),
    }
}

/// Sorts a failure into double lease, missing database, or other.
fn classify(lease: &LeaseResponse, error: BenchError) -> Outcome {
    let code = match &error {
        BenchError::Postgres { source, .. } => sqlstate(source).map(str::to_string),
        _ => None,
    };
    let what = format!("lease {} (database {}): {error}", lease.id, lease.database);
    match code.as_deref() {
        Some(UNIQUE_VIOLATION) => Outcome::DoubleLease(what),
        Some(NO_SUCH_DATABASE) | Some(TERMINATED) => Outcome::MissingDatabase(what),
        _ => Outcome::Failed(what),
    }
}

/// The test's transaction. `Ok(Some(id))`: another lease's marker was there.
/// A test's transaction: the marker check (`Some(other marker)` when the database is
/// someone else's), 10 inserts of `customer`'s orders and a select. Scenario 3 runs it too.
pub(super) async fn work(
    client: &tokio_postgres::Client,
    marker: &str,
    customer: i32,
) -> Result<Option<String>> {
    let pg = |what: &'static str| move |e| BenchError::postgres(what, e);
    client.batch_execute("BEGIN").await.map_err(pg("BEGIN"))?;
    let markers = client
        .query("SELECT lease_id FROM bench_marker", &[])
        .await
        .map_err(pg("reading bench_marker"))?;
    if let Some(row) = markers.first() {
        let other: String = row.get(0);
        let _ = client.batch_execute("ROLLBACK").await;
        return Ok(Some(other));
    }
    client
        .execute(
            "INSERT INTO bench_marker (lease_id) VALUES ($1)",
            &[&marker],
        )
        .await
        .map_err(pg("inserting the marker"))?;
    let insert = client
        .prepare(
            "INSERT INTO orders (customer_id, address_id, status, total) \
             VALUES ($1, $2, 'paid', $3::float8)",
        )
        .await
        .map_err(pg("preparing the insert"))?;
    for i in 0..10i32 {
        let address = customer;
        let total = f64::from(i) * 10.5 + 1.0;
        client
            .execute(&insert, &[&customer, &address, &total])
            .await
            .map_err(pg("inserting an order"))?;
    }
    let row = client
        .query_one(
            "SELECT count(*), coalesce(sum(total), 0)::float8 FROM orders WHERE customer_id = $1",
            &[&customer],
        )
        .await
        .map_err(pg("selecting the orders"))?;
    let count: i64 = row.get(0);
    client.batch_execute("COMMIT").await.map_err(pg("COMMIT"))?;
    if count < 10 {
        return Err(BenchError::Other(format!(
            "{marker}: expected at least 10 orders of customer {customer}, found {count}"
        )));
    }
    Ok(None)
}
