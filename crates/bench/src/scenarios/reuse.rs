//! Scenario 12, past the clone ceiling: the same fixture suite as scenario 2, but half of
//! the tests only read (the marker check and a select), at 1, 8 and 32 workers, on a daemon
//! with `--reuse-unchanged` (a released database the server proves unchanged goes back
//! without a new clone) and on one without, side by side in one run. CPU per test (the
//! machine's, `cpu.rs`) shows what the proof costs against the DROP + CREATE it saves. A
//! last level, 8 workers where every test writes (scenario 2's suite), shows what the proof
//! costs a suite it cannot help.
//!
//! Isolation is checked as in scenario 2, and harder: a read-only test fails loudly if it
//! finds another test's marker (a written database handed out again), and so does a
//! writing test. The daemon's counts of reused and replaced databases are reported.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::throughput::work;
use super::{strings, Ctx, FIXTURE, IDLE_LIMIT, WAIT_MS};
use crate::admin;
use crate::api::Api;
use crate::cpu::{CpuClock, CpuUse};
use crate::error::{BenchError, Result};
use crate::outcome::{not_done, Outcome};
use crate::stats::{per_second, round3, Summary};
use crate::table::{num, Table};

/// Each level: workers, and the share of tests that only read.
const LEVELS: [(usize, f64); 4] = [(1, 0.5), (8, 0.5), (32, 0.5), (8, 0.0)];

/// Scenario 12's figures.
#[derive(Debug, Serialize)]
pub struct ReuseResult {
    /// Databases handed out with another test's marker in them (must be 0).
    pub dirty_handouts: usize,
    /// One entry per worker count: proof off, then on.
    pub levels: Vec<ReuseLevel>,
}

/// One worker count, both modes.
#[derive(Debug, Serialize)]
pub struct ReuseLevel {
    /// Workers.
    pub workers: usize,
    /// Share of the tests that only read (every other one, or none).
    pub read_only_share: f64,
    /// Without the proof (every release dropped and cloned again).
    pub off: ReuseRun,
    /// With `--reuse-unchanged`.
    pub on: ReuseRun,
    /// on ÷ off, tests/s (the target at 8 workers: ≥ 1.5).
    pub speedup: f64,
}

/// One mode at one worker count.
#[derive(Debug, Serialize)]
pub struct ReuseRun {
    /// Tests completed.
    pub tests: usize,
    /// Tests per second over the run.
    pub tests_per_sec: f64,
    /// `POST /lease` of read-only tests, ms.
    pub lease_read_only: Summary,
    /// `POST /lease` of writing tests, ms.
    pub lease_writing: Summary,
    /// The daemon's count of releases proven unchanged during the run.
    pub reused: u64,
    /// … and found changed.
    pub replaced: u64,
    /// Errors (HTTP, SQL), and the first one.
    pub errors: usize,
    /// The first error.
    pub first_error: Option<String>,
    /// The machine's CPU during the run.
    pub cpu: Option<CpuUse>,
    /// CPU ms per test.
    pub cpu_ms_per_test: Option<f64>,
}

/// Runs scenario 12: a daemon per mode, both running, the modes alternating at each level
/// (off, then on) so that drift in the machine's load falls on both alike.
pub async fn run(ctx: &Ctx) -> Result<ReuseResult> {
    let duration = ctx.plan.throughput_duration;
    let mut offs = Vec::new();
    let mut ons = Vec::new();
    let mut dirty = 0;
    let mut daemons = Vec::new();
    for proof in [false, true] {
        let mut args = ctx.fixture_args();
        args.extend(strings(&["--prebuild", "--max-total", "64"]));
        args.extend(ctx.cache_args());
        args.push(
            if proof {
                "--reuse-unchanged"
            } else {
                "--no-reuse-unchanged"
            }
            .into(),
        );
        let label = if proof { "reuse-on" } else { "reuse-off" };
        let daemon = ctx.launcher.start(label, &args).await?;
        let server = daemon.server_info().await?;
        let admin_conn = admin::superuser(&server, "postgres").await?;
        daemons.push((proof, daemon, admin_conn));
    }
    for &(workers, read_only_share) in &LEVELS {
        for (proof, daemon, _) in &daemons {
            let api = daemon.api()?.clone();
            // Both pools idle: the other one's refill is done before this one runs.
            for (_, other, other_conn) in &daemons {
                admin::wait_idle(other.api()?, &other_conn.client, FIXTURE, 1, IDLE_LIMIT).await?;
            }
            eprintln!(
                "[bench] 12 reuse by proof {}: {workers} workers, {}% read only",
                if *proof { "on" } else { "off" },
                read_only_share * 100.0
            );
            let before = counts(&api).await?;
            let cpu = CpuClock::start();
            let (mut run, dirty_here) = level(&api, workers, read_only_share > 0.0, duration).await;
            run.cpu = cpu.since();
            run.cpu_ms_per_test = run.cpu.and_then(|c| c.ms_per(run.tests));
            let after = counts(&api).await?;
            run.reused = after.0 - before.0;
            run.replaced = after.1 - before.1;
            dirty += dirty_here;
            if *proof {
                ons.push(run)
            } else {
                offs.push(run)
            }
        }
    }
    for (_, daemon, admin_conn) in daemons {
        admin_conn.close().await;
        daemon.stop().await?;
    }
    let levels = LEVELS
        .iter()
        .zip(offs.into_iter().zip(ons))
        .map(|(&(workers, read_only_share), (off, on))| ReuseLevel {
            workers,
            read_only_share,
            speedup: if off.tests_per_sec > 0.0 {
                round3(on.tests_per_sec / off.tests_per_sec)
            } else {
                0.0
            },
            off,
            on,
        })
        .collect();
    Ok(ReuseResult {
        dirty_handouts: dirty,
        levels,
    })
}

async fn counts(api: &Api) -> Result<(u64, u64)> {
    let limits = api.status().await?.limits;
    Ok((limits.reused_unchanged, limits.replaced_changed))
}

/// One test's lease time and whether it only read, or why it failed (`Err(true, …)`: a
/// dirty database was handed out).
type TestOutcome = std::result::Result<(Duration, bool), (bool, String)>;

/// `workers` workers for `duration`, each test reading only or writing by turns (`reads`),
/// or every test writing.
async fn level(api: &Api, workers: usize, reads: bool, duration: Duration) -> (ReuseRun, usize) {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let api = api.clone();
        tasks.spawn(async move {
            let mut outcomes = Vec::new();
            let (mut n, mut failures) = (0usize, 0usize);
            while Instant::now() < deadline && failures < 50 {
                n += 1;
                // Alternating, offset per worker: half the tests read only.
                let read_only = reads && (n + worker).is_multiple_of(2);
                let customer = i32::try_from((worker * 7919 + n) % 600 + 1).unwrap_or(1);
                let outcome = one_test(&api, read_only, customer).await;
                failures += usize::from(outcome.is_err());
                outcomes.push(outcome);
            }
            outcomes
        });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(more) => outcomes.extend(more),
            Err(error) => outcomes.push(Err((false, format!("worker panicked: {error}")))),
        }
    }
    let elapsed = started.elapsed();
    let done: Vec<(Duration, bool)> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok().copied())
        .collect();
    let lease_of = |read_only: bool| -> Vec<Duration> {
        done.iter()
            .filter(|d| d.1 == read_only)
            .map(|d| d.0)
            .collect()
    };
    let failures: Vec<&(bool, String)> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    let dirty = failures.iter().filter(|f| f.0).count();
    for failure in failures.iter().filter(|f| f.0) {
        eprintln!("[bench] !!! ISOLATION FAILURE: {}", failure.1);
    }
    (
        ReuseRun {
            tests: done.len(),
            tests_per_sec: per_second(done.len(), elapsed),
            lease_read_only: Summary::of(&lease_of(true)),
            lease_writing: Summary::of(&lease_of(false)),
            reused: 0,
            replaced: 0,
            errors: failures.len(),
            first_error: failures.first().map(|f| f.1.clone()),
            cpu: None,
            cpu_ms_per_test: None,
        },
        dirty,
    )
}

/// One test: lease, connect, read (the marker must be absent) or write (scenario 2's
/// transaction), disconnect, release without `reuse`.
async fn one_test(api: &Api, read_only: bool, customer: i32) -> TestOutcome {
    let t0 = Instant::now();
    let lease = api
        .lease(FIXTURE, WAIT_MS)
        .await
        .map_err(|e| (false, e.to_string()))?;
    let lease_time = t0.elapsed();
    let outcome = async {
        let conn = admin::connect_url(&lease.url).await?;
        let result = if read_only {
            read(&conn.client, customer).await
        } else {
            work(&conn.client, &lease.id, customer).await
        };
        conn.close().await;
        result
    }
    .await;
    let released = api.release(&lease.id, false).await;
    match (outcome, released) {
        (Ok(None), Ok(())) => Ok((lease_time, read_only)),
        (Ok(Some(other)), _) => Err((
            true,
            format!(
                "lease {} (database {}) found the marker of lease {other}",
                lease.id, lease.database
            ),
        )),
        (Err(error), _) => Err((false, format!("lease {}: {error}", lease.id))),
        (Ok(None), Err(error)) => Err((false, error.to_string())),
    }
}

/// A read-only test: the marker must be absent; a customer's orders and addresses joined.
async fn read(client: &tokio_postgres::Client, customer: i32) -> Result<Option<String>> {
    let pg = |what: &'static str| move |e| BenchError::postgres(what, e);
    let markers = client
        .query("SELECT lease_id FROM bench_marker", &[])
        .await
        .map_err(pg("reading bench_marker"))?;
    if let Some(row) = markers.first() {
        return Ok(Some(row.get(0)));
    }
    client
        .query(
            "SELECT o.id, o.total, a.city FROM orders o JOIN addresses a ON a.id = o.address_id \
             WHERE o.customer_id = $1 ORDER BY o.id",
            &[&customer],
        )
        .await
        .map_err(pg("reading orders"))?;
    Ok(None)
}

pub(crate) fn render(outcome: &Outcome<ReuseResult>, out: &mut String) {
    out.push_str("\n12. Half the tests read only (and a suite where all write): --reuse-unchanged off vs on (tests/s, lease p50, CPU per test)\n");
    if not_done(outcome, out) {
        return;
    }
    let Some(r) = outcome.done() else { return };
    let mut t = Table::new(&[
        "workers",
        "read only",
        "off tests/s",
        "on tests/s",
        "on ÷ off",
        "off lease p50 read / write ms",
        "on lease p50 read / write ms",
        "off CPU ms/test",
        "on CPU ms/test",
        "reused / replaced (on)",
    ]);
    for l in &r.levels {
        t.row(vec![
            l.workers.to_string(),
            format!("{:.0}%", l.read_only_share * 100.0),
            num(l.off.tests_per_sec),
            num(l.on.tests_per_sec),
            num(l.speedup),
            format!(
                "{} / {}",
                p50_or_dash(&l.off.lease_read_only),
                p50_or_dash(&l.off.lease_writing)
            ),
            format!(
                "{} / {}",
                p50_or_dash(&l.on.lease_read_only),
                p50_or_dash(&l.on.lease_writing)
            ),
            l.off.cpu_ms_per_test.map(num).unwrap_or_default(),
            l.on.cpu_ms_per_test.map(num).unwrap_or_default(),
            format!("{} / {}", l.on.reused, l.on.replaced),
        ]);
    }
    t.render(out);
    out.push_str(&format!(
        "  dirty databases handed out: {} (must be 0); target: ≥ 1.5× at 8 workers\n",
        r.dirty_handouts
    ));
}

/// A summary's p50, or "-" when it has no samples (no read-only tests at that level).
fn p50_or_dash(summary: &Summary) -> String {
    if summary.count == 0 {
        "-".into()
    } else {
        num(summary.p50_ms)
    }
}
