//! Scenario 14 (c): the fixture's end-to-end test through the front against scenario 2's
//! test over HTTP, same work (the marker check, 10 inserts, a select), at each level of
//! workers, the two paths alternating which runs first. Over HTTP a test is lease →
//! connect → work → close → release (`reuse=false`); through the front it is connect →
//! work → close, the lease made and released by the front.
//!
//! Isolation is checked as scenario 2 checks it: a test that finds another's marker, or
//! whose marker insert hits a unique violation, was given a database someone else has; one
//! whose database does not exist or is dropped under it lost its database. Through the
//! front a test knows no lease id, so its marker is a name of its own.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::{Client, Config};

use super::{front_config, ratio, MIN_READY};
use crate::admin::{self, sqlstate};
use crate::cpu::{ByProcess, CpuClock, CpuUse};
use crate::daemon::Daemon;
use crate::error::{BenchError, Result};
use crate::scenarios::throughput::{self, work, ThroughputLevel};
use crate::scenarios::{Ctx, FIXTURE, IDLE_LIMIT};
use crate::stats::{per_second, round3, Summary};

/// Part (c)'s figures.
#[derive(Debug, Serialize)]
pub struct SuiteResult {
    /// What one test does through the front.
    pub test: &'static str,
    /// Double leases, both paths, all levels (must be 0).
    pub double_leases: usize,
    /// Missing databases, both paths, all levels (must be 0).
    pub missing_databases: usize,
    /// One entry per level of workers.
    pub levels: Vec<SuiteLevel>,
}

/// One level, both paths.
#[derive(Debug, Serialize)]
pub struct SuiteLevel {
    /// Workers.
    pub workers: usize,
    /// Over HTTP: scenario 2's loop, with its figures.
    pub http: ThroughputLevel,
    /// Through the front.
    pub front: FrontLevel,
    /// Front tests/s ÷ HTTP tests/s (target ≥ 1).
    pub front_over_http: Option<f64>,
    /// Front CPU ms per test ÷ HTTP's.
    pub cpu_front_over_http: Option<f64>,
}

/// The front's loop at one level.
#[derive(Debug, Serialize)]
pub struct FrontLevel {
    /// Tests completed.
    pub tests: usize,
    /// From the first test's start to the last one's end, seconds.
    pub elapsed_secs: f64,
    /// `tests / elapsed_secs`.
    pub tests_per_sec: f64,
    /// After the last test, until the pool was idle again, seconds.
    pub settle_secs: f64,
    /// `tests / (elapsed_secs + settle_secs)`.
    pub tests_per_sec_settled: f64,
    /// Tests that found another test's marker.
    pub double_leases: usize,
    /// Tests whose database was missing or dropped under them.
    pub missing_databases: usize,
    /// Other failures.
    pub errors: usize,
    /// The first failure of any kind.
    pub first_error: Option<String>,
    /// Connect through the front (the lease included), ms.
    pub connect: Summary,
    /// The transaction and the close, ms.
    pub work: Summary,
    /// The whole test, ms.
    pub total: Summary,
    /// Machine CPU over the tests and the settling after them.
    pub cpu: Option<CpuUse>,
    /// Busy CPU per test, ms.
    pub cpu_ms_per_test: Option<f64>,
    /// The same by party.
    pub cpu_by_process_per_test: Option<ByProcess>,
}

/// Runs part (c) on the scenario's daemon, which must be idle.
pub(super) async fn run(
    ctx: &Ctx,
    daemon: &Daemon,
    front: SocketAddr,
    admin_conn: &Client,
) -> Result<SuiteResult> {
    let api = daemon.api()?.clone();
    let duration = ctx.plan.front_suite_duration;
    let mut levels = Vec::new();
    for (index, &workers) in ctx.plan.front_suite_workers.iter().enumerate() {
        let front_first = index % 2 == 1;
        let (mut http, mut through) = (None, None);
        for through_front in [front_first, !front_first] {
            admin::wait_idle(&api, admin_conn, FIXTURE, MIN_READY, IDLE_LIMIT).await?;
            let path = if through_front { "front" } else { "HTTP" };
            eprintln!("[bench] 14 front: the fixture's suite, {workers} workers, {path}");
            let cpu = CpuClock::watching(daemon.pid());
            if through_front {
                let mut level = level(front, workers, duration).await;
                let settle =
                    admin::wait_idle(&api, admin_conn, FIXTURE, MIN_READY, IDLE_LIMIT).await?;
                level.cpu = cpu.since();
                level.cpu_ms_per_test = level.cpu.and_then(|c| c.ms_per(level.tests));
                level.cpu_by_process_per_test =
                    level.cpu.and_then(|c| c.by_process_per(level.tests));
                level.settle_secs = round3(settle.as_secs_f64());
                level.tests_per_sec_settled = per_second(
                    level.tests,
                    Duration::from_secs_f64(level.elapsed_secs) + settle,
                );
                through = Some(level);
            } else {
                let mut level = throughput::level(&api, workers, duration).await;
                let settle =
                    admin::wait_idle(&api, admin_conn, FIXTURE, MIN_READY, IDLE_LIMIT).await?;
                level.cpu = cpu.since();
                level.cpu_ms_per_test = level.cpu.and_then(|c| c.ms_per(level.tests));
                level.cpu_by_process_per_test =
                    level.cpu.and_then(|c| c.by_process_per(level.tests));
                level.settle_secs = round3(settle.as_secs_f64());
                level.tests_per_sec_settled = per_second(
                    level.tests,
                    Duration::from_secs_f64(level.elapsed_secs) + settle,
                );
                http = Some(level);
            }
        }
        let (Some(http), Some(front)) = (http, through) else {
            return Err(BenchError::Other("a path of the suite did not run".into()));
        };
        levels.push(SuiteLevel {
            workers,
            front_over_http: ratio(front.tests_per_sec, http.tests_per_sec),
            cpu_front_over_http: match (front.cpu_ms_per_test, http.cpu_ms_per_test) {
                (Some(f), Some(h)) => ratio(f, h),
                _ => None,
            },
            http,
            front,
        });
    }
    let sum = |f: fn(&SuiteLevel) -> usize| levels.iter().map(f).sum();
    Ok(SuiteResult {
        test: "connect to the front (database fixture) → BEGIN; marker check; 10 INSERT; SELECT; COMMIT → close",
        double_leases: sum(|l| l.http.double_leases + l.front.double_leases),
        missing_databases: sum(|l| l.http.missing_databases + l.front.missing_databases),
        levels,
    })
}

/// The timings of one test that passed.
struct Timings {
    connect: Duration,
    work: Duration,
    total: Duration,
}

/// How a test ended.
enum Ended {
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

impl Tally {
    fn record(&mut self, ended: Ended) {
        match ended {
            Ended::Passed(timings) => self.timings.push(timings),
            Ended::DoubleLease(message) => {
                eprintln!("[bench] !!! ISOLATION FAILURE (front): DOUBLE LEASE: {message}");
                self.double_leases += 1;
                self.first_error.get_or_insert(message);
            }
            Ended::MissingDatabase(message) => {
                eprintln!("[bench] !!! ISOLATION FAILURE (front): MISSING DATABASE: {message}");
                self.missing_databases += 1;
                self.first_error.get_or_insert(message);
            }
            Ended::Failed(message) => {
                self.errors += 1;
                self.first_error.get_or_insert(message);
            }
        }
    }

    fn merge(&mut self, other: Tally) {
        self.timings.extend(other.timings);
        self.double_leases += other.double_leases;
        self.missing_databases += other.missing_databases;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// `workers` workers running tests through the front for `duration`.
async fn level(front: SocketAddr, workers: usize, duration: Duration) -> FrontLevel {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let config = front_config(front, FIXTURE, &format!("pglease-bench-suite-{worker}"));
        tasks.spawn(async move {
            let mut tally = Tally::default();
            let mut n = 0usize;
            while Instant::now() < deadline && tally.errors < 50 {
                n += 1;
                let customer = i32::try_from((worker * 7919 + n) % 600 + 1).unwrap_or(1);
                let marker = format!("front-{workers}w-{worker}-{n}");
                tally.record(one_test(&config, &marker, customer).await);
            }
            tally
        });
    }
    let mut all = Tally::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(tally) => all.merge(tally),
            Err(error) => all.record(Ended::Failed(format!("worker panicked: {error}"))),
        }
    }
    let elapsed = started.elapsed();
    let pick = |f: fn(&Timings) -> Duration| -> Summary {
        Summary::of(&all.timings.iter().map(f).collect::<Vec<_>>())
    };
    FrontLevel {
        tests: all.timings.len(),
        elapsed_secs: round3(elapsed.as_secs_f64()),
        tests_per_sec: per_second(all.timings.len(), elapsed),
        settle_secs: 0.0,
        tests_per_sec_settled: 0.0,
        double_leases: all.double_leases,
        missing_databases: all.missing_databases,
        errors: all.errors,
        connect: pick(|t| t.connect),
        work: pick(|t| t.work),
        total: pick(|t| t.total),
        first_error: all.first_error,
        cpu: None,
        cpu_ms_per_test: None,
        cpu_by_process_per_test: None,
    }
}

/// One test: connect through the front, the transaction, close.
async fn one_test(config: &Config, marker: &str, customer: i32) -> Ended {
    let started = Instant::now();
    let conn = match admin::connect_config(config, "the front").await {
        Ok(conn) => conn,
        Err(error) => return classify(marker, error),
    };
    let connect = started.elapsed();
    let working = Instant::now();
    let worked = work(&conn.client, marker, customer).await;
    conn.close().await;
    let work_time = working.elapsed();
    match worked {
        Ok(None) => Ended::Passed(Timings {
            connect,
            work: work_time,
            total: started.elapsed(),
        }),
        Ok(Some(other)) => {
            Ended::DoubleLease(format!("test {marker} found the marker of test {other}"))
        }
        Err(error) => classify(marker, error),
    }
}

/// Sorts a failure as scenario 2 does: a unique violation on the marker is a double lease;
/// a database that does not exist, or a session ended by a DROP, a missing database.
fn classify(marker: &str, error: BenchError) -> Ended {
    let code = match &error {
        BenchError::Postgres { source, .. } => sqlstate(source).map(str::to_string),
        _ => None,
    };
    let what = format!("test {marker}: {error}");
    match code.as_deref() {
        Some("23505") => Ended::DoubleLease(what),
        Some("3D000") | Some("57P01") => Ended::MissingDatabase(what),
        _ => Ended::Failed(what),
    }
}
