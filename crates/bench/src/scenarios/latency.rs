//! Scenario 1, warm lease latency: a pool kept ahead of demand (`--min-ready` above the
//! highest concurrency, `reuse=true` releases so nothing is ever dropped), and 1, 8, 32
//! workers looping lease → release. The figure is the HTTP lease call as a client sees it.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{strings, Ctx, FIXTURE, IDLE_LIMIT, WAIT_MS};
use crate::admin;
use crate::api::Api;
use crate::error::Result;
use crate::stats::{per_second, Summary};

/// Ready clones kept: more than the 32 workers can hold at once.
const MIN_READY: usize = 40;
/// Room for them all.
const MAX_TOTAL: usize = 80;

/// Scenario 1's figures.
#[derive(Debug, Serialize)]
pub struct LatencyResult {
    /// Flags the daemon ran with (besides `--listen` and the cache).
    pub daemon_args: Vec<String>,
    /// The template leased.
    pub template: &'static str,
    /// One entry per concurrency.
    pub levels: Vec<LatencyLevel>,
}

/// One concurrency level.
#[derive(Debug, Serialize)]
pub struct LatencyLevel {
    /// Concurrent workers.
    pub workers: usize,
    /// Wall time of the level, seconds.
    pub elapsed_secs: f64,
    /// Leases granted.
    pub leases: usize,
    /// Leases per second over all workers.
    pub leases_per_sec: f64,
    /// Failed calls.
    pub errors: usize,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// `POST /lease`, ms.
    pub lease: Summary,
    /// `DELETE /leases/{id}?reuse=true`, ms.
    pub release: Summary,
}

/// Runs scenario 1 on its own daemon.
pub async fn run(ctx: &Ctx) -> Result<LatencyResult> {
    let mut daemon_args = ctx.fixture_args();
    daemon_args.extend(strings(&["--prebuild", "--min-ready"]));
    daemon_args.push(MIN_READY.to_string());
    daemon_args.push("--max-total".into());
    daemon_args.push(MAX_TOTAL.to_string());
    let mut args = daemon_args.clone();
    args.extend(ctx.cache_args());
    let daemon = ctx.launcher.start("latency", &args).await?;
    let server = daemon.server_info().await?;
    let admin_conn = admin::superuser(&server, "postgres").await?;
    let api = daemon.api()?.clone();
    let mut levels = Vec::new();
    for &workers in &ctx.plan.latency_workers {
        admin::wait_idle(&api, &admin_conn.client, FIXTURE, MIN_READY, IDLE_LIMIT).await?;
        eprintln!("[bench] 1 warm lease latency: {workers} workers");
        levels.push(level(&api, workers, ctx.plan.latency_duration).await);
    }
    admin_conn.close().await;
    daemon.stop().await?;
    Ok(LatencyResult {
        daemon_args,
        template: FIXTURE,
        levels,
    })
}

/// Samples of one worker.
#[derive(Default)]
struct Samples {
    lease: Vec<Duration>,
    release: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

async fn level(api: &Api, workers: usize, duration: Duration) -> LatencyLevel {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let api = api.clone();
        tasks.spawn(async move { worker(api, deadline).await });
    }
    let mut all = Samples::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(samples) => {
                all.lease.extend(samples.lease);
                all.release.extend(samples.release);
                all.errors += samples.errors;
                all.first_error = all.first_error.or(samples.first_error);
            }
            Err(error) => {
                all.errors += 1;
                all.first_error
                    .get_or_insert(format!("worker panicked: {error}"));
            }
        }
    }
    let elapsed = started.elapsed();
    LatencyLevel {
        workers,
        elapsed_secs: elapsed.as_secs_f64(),
        leases: all.lease.len(),
        leases_per_sec: per_second(all.lease.len(), elapsed),
        errors: all.errors,
        first_error: all.first_error,
        lease: Summary::of(&all.lease),
        release: Summary::of(&all.release),
    }
}

async fn worker(api: Api, deadline: Instant) -> Samples {
    let mut samples = Samples::default();
    while Instant::now() < deadline && samples.errors < 50 {
        let t0 = Instant::now();
        let lease = match api.lease(FIXTURE, WAIT_MS).await {
            Ok(lease) => lease,
            Err(error) => {
                samples.errors += 1;
                samples.first_error.get_or_insert(error.to_string());
                continue;
            }
        };
        samples.lease.push(t0.elapsed());
        let t1 = Instant::now();
        match api.release(&lease.id, true).await {
            Ok(()) => samples.release.push(t1.elapsed()),
            Err(error) => {
                samples.errors += 1;
                samples.first_error.get_or_insert(error.to_string());
            }
        }
    }
    samples
}
