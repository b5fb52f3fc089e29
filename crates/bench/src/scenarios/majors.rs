//! Scenario 9, PostgreSQL majors side by side: for each major of the plan a daemon of its
//! own (`--postgres-version N`: binaries installed, cached or fetched from Maven Central,
//! in the daemon's default cache so later runs do not download again), and on it
//! - the raw clone and drop of the fixture template on one superuser connection
//!   (scenario 3's loop; `STRATEGY FILE_COPY` from 15, older majors always copy files);
//! - the end-to-end test loop (scenario 2's: lease, connect, the transaction, release).
//!
//! Ratios are over the baseline major's figures from the same run (the first major of the
//! plan that ran), so the machine's drift cancels out. A major that fails to start is
//! recorded with its error; the others still run.

use std::time::Instant;

use serde::Serialize;

use super::ceiling::{self, CeilingLevel};
use super::throughput::{self, ThroughputLevel};
use super::{strings, Ctx, FIXTURE, IDLE_LIMIT};
use crate::admin;
use crate::error::{BenchError, Result};
use crate::outcome::{not_done, Outcome};
use crate::stats::round3;
use crate::table::{num, Table};

/// Workers of the end-to-end loop: one per core of the 2-core machines this runs on.
const END_TO_END_WORKERS: usize = 2;

/// Scenario 9's figures.
#[derive(Debug, Serialize)]
pub struct MajorsResult {
    /// The major the ratios are over.
    pub baseline: Option<u32>,
    /// One entry per major of the plan, in its order.
    pub majors: Vec<MajorRun>,
}

/// One major.
#[derive(Debug, Serialize)]
pub struct MajorRun {
    /// The major asked for.
    pub major: u32,
    /// What it ran (`server_version`), or why it did not.
    pub outcome: std::result::Result<MajorFigures, String>,
}

/// The figures of a major that ran.
#[derive(Debug, Serialize)]
pub struct MajorFigures {
    /// `server_version`.
    pub version: String,
    /// From `pglease serve` to the fixture built and its ready queue full, seconds (a
    /// machine's first run includes the download).
    pub start_secs: f64,
    /// The raw clone+drop loop, one connection.
    pub clone_drop: CeilingLevel,
    /// The end-to-end test loop.
    pub end_to_end: ThroughputLevel,
    /// p50 clone time over the baseline's.
    pub clone_ratio: Option<f64>,
    /// p50 drop time over the baseline's.
    pub drop_ratio: Option<f64>,
    /// End-to-end tests per second over the baseline's.
    pub tests_per_sec_ratio: Option<f64>,
}

/// Runs scenario 9.
pub async fn run(ctx: &Ctx) -> Result<MajorsResult> {
    let mut majors = Vec::new();
    for &major in &ctx.plan.majors {
        eprintln!("[bench] 9 PostgreSQL {major}");
        let outcome = one_major(ctx, major).await.map_err(|error| {
            eprintln!("[bench] 9 PostgreSQL {major} failed: {error}");
            error.to_string()
        });
        majors.push(MajorRun { major, outcome });
    }
    let baseline = majors.iter().find_map(|run| {
        run.outcome
            .as_ref()
            .ok()
            .map(|f| (run.major, ratios_base(f)))
    });
    if let Some((_, base)) = &baseline {
        for run in &mut majors {
            if let Ok(figures) = &mut run.outcome {
                let own = ratios_base(figures);
                figures.clone_ratio = ratio(own.clone_ms, base.clone_ms);
                figures.drop_ratio = ratio(own.drop_ms, base.drop_ms);
                figures.tests_per_sec_ratio = ratio(own.tests_per_sec, base.tests_per_sec);
            }
        }
    }
    Ok(MajorsResult {
        baseline: baseline.map(|(major, _)| major),
        majors,
    })
}

async fn one_major(ctx: &Ctx, major: u32) -> Result<MajorFigures> {
    let mut args = ctx.fixture_args();
    args.extend(strings(&[
        "--prebuild",
        "--min-ready",
        "4",
        "--max-total",
        "16",
    ]));
    args.extend(["--postgres-version".to_owned(), major.to_string()]);
    let started = Instant::now();
    let daemon = ctx.launcher.start(&format!("major-{major}"), &args).await?;
    let figures = async {
        let server = daemon.server_info().await?;
        let api = daemon.api()?.clone();
        let admin_conn = admin::superuser(&server, "postgres").await?;
        // Built and warm before anything is timed.
        admin::wait_idle(&api, &admin_conn.client, FIXTURE, 4, IDLE_LIMIT).await?;
        let start_secs = round3(started.elapsed().as_secs_f64());
        let fingerprint = crate::api::template(&api.status().await?, FIXTURE)
            .and_then(|t| t.fingerprint.clone())
            .ok_or_else(|| BenchError::Other("the fixture has no fingerprint".into()))?;
        let template = admin::template_database(&admin_conn.client, &fingerprint).await?;
        let strategy = if major >= 15 {
            " STRATEGY FILE_COPY"
        } else {
            ""
        };
        let clone_drop = ceiling::level(
            &server,
            &template,
            1,
            ctx.plan.majors_duration,
            false,
            strategy,
        )
        .await?;
        admin::wait_idle(&api, &admin_conn.client, FIXTURE, 4, IDLE_LIMIT).await?;
        let end_to_end =
            throughput::level(&api, END_TO_END_WORKERS, ctx.plan.majors_duration).await;
        admin_conn.close().await;
        Ok(MajorFigures {
            version: server.version,
            start_secs,
            clone_drop,
            end_to_end,
            clone_ratio: None,
            drop_ratio: None,
            tests_per_sec_ratio: None,
        })
    }
    .await;
    daemon.stop().await?;
    figures
}

/// The figures ratios are taken of.
struct Base {
    clone_ms: f64,
    drop_ms: f64,
    tests_per_sec: f64,
}

fn ratios_base(figures: &MajorFigures) -> Base {
    Base {
        clone_ms: figures.clone_drop.create.p50_ms,
        drop_ms: figures.clone_drop.drop.p50_ms,
        tests_per_sec: figures.end_to_end.tests_per_sec,
    }
}

fn ratio(own: f64, base: f64) -> Option<f64> {
    (base > 0.0 && own > 0.0).then(|| round3(own / base))
}

/// Scenario 9's table.
pub(crate) fn render(outcome: &Outcome<MajorsResult>, out: &mut String) {
    out.push_str("\n9. PostgreSQL majors side by side: raw clone and drop of the fixture (1 connection), end-to-end tests (2 workers)\n");
    if not_done(outcome, out) {
        return;
    }
    let Some(r) = outcome.done() else { return };
    let mut t = Table::new(&[
        "major",
        "version",
        "start s",
        "clone p50 ms",
        "drop p50 ms",
        "tests/s",
        "clone ×",
        "drop ×",
        "tests/s ×",
    ]);
    let ratio = |value: Option<f64>| value.map_or("-".into(), num);
    for run in &r.majors {
        match &run.outcome {
            Ok(f) => t.row(vec![
                run.major.to_string(),
                f.version.clone(),
                num(f.start_secs),
                num(f.clone_drop.create.p50_ms),
                num(f.clone_drop.drop.p50_ms),
                num(f.end_to_end.tests_per_sec),
                ratio(f.clone_ratio),
                ratio(f.drop_ratio),
                ratio(f.tests_per_sec_ratio),
            ]),
            Err(error) => t.row(vec![
                run.major.to_string(),
                format!("failed: {error}"),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]),
        }
    }
    t.render(out);
    if let Some(baseline) = r.baseline {
        out.push_str(&format!(
            "  ratios are over PostgreSQL {baseline}, measured in the same run\n"
        ));
    }
    let errors = r.majors.iter().filter_map(|m| m.outcome.as_ref().ok());
    let firsts: Vec<&Option<String>> = errors
        .flat_map(|f| [&f.clone_drop.first_error, &f.end_to_end.first_error])
        .collect();
    for error in firsts.into_iter().flatten() {
        out.push_str(&format!("  first error: {error}\n"));
    }
}
