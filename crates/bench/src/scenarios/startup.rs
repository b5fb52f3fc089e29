//! Scenario 4, start-up: from spawning `pglease serve` to the first successful lease, for
//! the `default` template and the fixture, with the initdb cache cold (`--cache-dir`
//! pointing at a fresh empty directory: initdb runs) and warm (the same directory again:
//! the cached cluster is copied). The fixture's time includes building its template on
//! the first lease (no `--prebuild`). Each run starts and stops its own daemon.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::{Ctx, FIXTURE, WAIT_MS};
use crate::api::LeaseAnswer;
use crate::daemon::Daemon;
use crate::error::{BenchError, Result};
use crate::stats::{round3, Summary};

/// How long a start may take to its first lease before the run counts as failed.
const FIRST_LEASE_LIMIT: Duration = Duration::from_secs(120);
/// Pause between lease attempts answered 503 (postgres not up yet).
const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// Scenario 4's figures.
#[derive(Debug, Serialize)]
pub struct StartupResult {
    /// One entry per template and cache state.
    pub cases: Vec<StartupCase>,
}

/// One template, one cache state.
#[derive(Debug, Serialize)]
pub struct StartupCase {
    /// `default` or `fixture`.
    pub template: &'static str,
    /// `cold` (empty cache dir) or `warm`.
    pub cache: &'static str,
    /// Spawn → first 201, ms, per run.
    pub first_lease_ms: Vec<f64>,
    /// Spawn → the `listening` log line, ms, per run.
    pub listening_ms: Vec<f64>,
    /// Summary of `first_lease_ms`.
    pub first_lease: Summary,
    /// The target for this case, seconds (none for the fixture when warm).
    pub target_secs: Option<f64>,
}

/// Runs scenario 4.
pub async fn run(ctx: &Ctx) -> Result<StartupResult> {
    let mut cases = Vec::new();
    for template in ["default", FIXTURE] {
        let cold_dir = ctx.scratch_dir.join(format!("cold-cache-{template}"));
        let mut cold = Vec::new();
        for run in 0..ctx.plan.startup_cold_runs.max(1) {
            // Empty every time: a cold start is one with no cached initdb.
            let _ = std::fs::remove_dir_all(&cold_dir);
            create_dir(&cold_dir)?;
            eprintln!(
                "[bench] 4 start-up: {template}, cold cache, run {}",
                run + 1
            );
            cold.push(one_start(ctx, template, &cold_dir, "cold").await?);
        }
        let mut warm = Vec::new();
        for run in 0..ctx.plan.startup_warm_runs {
            eprintln!(
                "[bench] 4 start-up: {template}, warm cache, run {}",
                run + 1
            );
            warm.push(one_start(ctx, template, &cold_dir, "warm").await?);
        }
        let _ = std::fs::remove_dir_all(&cold_dir);
        cases.push(case(template, "cold", cold, Some(2.0)));
        let warm_target = (template == "default").then_some(0.3);
        cases.push(case(template, "warm", warm, warm_target));
    }
    Ok(StartupResult { cases })
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::io(format!("cannot create {}", dir.display()), e))
}

fn case(
    template: &'static str,
    cache: &'static str,
    runs: Vec<(Duration, Duration)>,
    target_secs: Option<f64>,
) -> StartupCase {
    let first: Vec<Duration> = runs.iter().map(|r| r.0).collect();
    StartupCase {
        template,
        cache,
        first_lease_ms: first
            .iter()
            .map(|d| round3(d.as_secs_f64() * 1e3))
            .collect(),
        listening_ms: runs
            .iter()
            .map(|r| round3(r.1.as_secs_f64() * 1e3))
            .collect(),
        first_lease: Summary::of(&first),
        target_secs,
    }
}

/// One daemon start: (spawn → first lease, spawn → listening).
async fn one_start(
    ctx: &Ctx,
    template: &'static str,
    cache_dir: &Path,
    cache: &str,
) -> Result<(Duration, Duration)> {
    let mut args = vec!["--cache-dir".to_string(), cache_dir.display().to_string()];
    if template == FIXTURE {
        args.extend(ctx.fixture_args());
    }
    let daemon = ctx
        .launcher
        .start(&format!("startup-{template}-{cache}"), &args)
        .await?;
    let first_lease = first_lease(&daemon, template).await?;
    let listening = daemon.listening_after;
    // Recorded after the clock stopped: the exit trap's list of instance directories.
    let _ = daemon.server_info().await;
    daemon.stop().await?;
    Ok((first_lease, listening))
}

/// Leases until the first 201 (503 while postgres starts is retried); the time is
/// measured from the spawn.
pub(crate) async fn first_lease(daemon: &Daemon, template: &str) -> Result<Duration> {
    let api = daemon.api()?;
    loop {
        match api.try_lease(template, WAIT_MS).await? {
            LeaseAnswer::Granted(lease) => {
                let elapsed = daemon.spawned_at.elapsed();
                api.release(&lease.id, false).await?;
                return Ok(elapsed);
            }
            LeaseAnswer::Refused { status: 503, .. }
                if daemon.spawned_at.elapsed() < FIRST_LEASE_LIMIT =>
            {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            LeaseAnswer::Refused { status, body } => {
                return Err(BenchError::Status {
                    context: format!("first lease of {template}"),
                    status,
                    body,
                })
            }
        }
    }
}
