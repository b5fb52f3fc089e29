//! Scenario 14 (a) through libpq: pgbench on one connection, a select-only-like script
//! (pgbench's `-S` looks up `pgbench_accounts`; the fixture's is a customer by primary key),
//! prepared (`-M prepared`), against the front and against the direct lease, runs
//! alternating. A run's figure is pgbench's `latency average`: one query's round trip
//! through libpq, the client most test suites' drivers are built on.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use pglease_api::wire::LeaseResponse;
use serde::Serialize;

use tokio_postgres::Client;

use super::ratio;
use crate::admin;
use crate::api::Api;
use crate::error::{BenchError, Result};
use crate::scenarios::seeds::{parse_pgbench, run_pgbench, Db};
use crate::scenarios::{Ctx, FIXTURE, IDLE_LIMIT};
use crate::stats::{median, round3};

/// The script: a random customer by primary key.
const SCRIPT: &str = "\\set id random(1, 600)\nSELECT email FROM customers WHERE id = :id;\n";

/// pgbench's round trips both ways.
#[derive(Debug, Serialize)]
pub struct LibpqRoundTrips {
    /// What ran.
    pub method: String,
    /// Each direct run's latency average, ms.
    pub direct_runs_ms: Vec<f64>,
    /// Each front run's latency average, ms.
    pub front_runs_ms: Vec<f64>,
    /// Median of the direct runs, ms.
    pub direct_median_ms: Option<f64>,
    /// Median of the front runs, ms.
    pub front_median_ms: Option<f64>,
    /// Front ÷ direct, medians.
    pub front_over_direct: Option<f64>,
    /// The first failure, if a run failed.
    pub error: Option<String>,
}

/// Where the runs go: the direct lease (held by the caller) and the front, and the daemon
/// whose pool must be quiet before each run.
pub(super) struct Paths<'a> {
    pub(super) lease: &'a LeaseResponse,
    pub(super) front: SocketAddr,
    pub(super) api: &'a Api,
    pub(super) admin_conn: &'a Client,
}

/// Runs pgbench against the direct lease and the front, alternating.
pub(super) async fn run(ctx: &Ctx, pgbench: &Path, paths: &Paths<'_>) -> LibpqRoundTrips {
    let (runs, secs) = (ctx.plan.front_pgbench_runs, ctx.plan.front_pgbench_secs);
    let mut result = LibpqRoundTrips {
        method: format!(
            "pgbench -n -M prepared -c 1 -T {secs} -f (a customer by primary key), {runs} runs a path, alternating; latency average"
        ),
        direct_runs_ms: Vec::new(),
        front_runs_ms: Vec::new(),
        direct_median_ms: None,
        front_median_ms: None,
        front_over_direct: None,
        error: None,
    };
    if let Err(error) = alternate(ctx, pgbench, paths, &mut result).await {
        result.error = Some(error.to_string());
    }
    result.direct_median_ms = median(&result.direct_runs_ms);
    result.front_median_ms = median(&result.front_runs_ms);
    result.front_over_direct = match (result.front_median_ms, result.direct_median_ms) {
        (Some(front), Some(direct)) => ratio(front, direct),
        _ => None,
    };
    result
}

async fn alternate(
    ctx: &Ctx,
    pgbench: &Path,
    paths: &Paths<'_>,
    result: &mut LibpqRoundTrips,
) -> Result<()> {
    let front = paths.front;
    let (runs, secs) = (ctx.plan.front_pgbench_runs, ctx.plan.front_pgbench_secs);
    let script = ctx.work_dir.join("front-select-only.sql");
    std::fs::write(&script, SCRIPT)
        .map_err(|e| BenchError::io(format!("cannot write {}", script.display()), e))?;
    let script = script.display().to_string();
    let secs_arg = secs.to_string();
    let args = [
        "-n", "-M", "prepared", "-c", "1", "-T", &secs_arg, "-f", &script,
    ];
    let limit = Duration::from_secs(secs + 30);
    let direct: Db = paths.lease.clone().into();
    // Through the front: a lease of its own for each run, made by the connection.
    let through = Db {
        host: front.ip().to_string(),
        port: front.port(),
        user: "bench".into(),
        password: None,
        dbname: FIXTURE.into(),
        lease_id: None,
    };
    for round in 0..runs {
        let order = if round % 2 == 0 {
            [(false, &direct), (true, &through)]
        } else {
            [(true, &through), (false, &direct)]
        };
        for (is_front, db) in order {
            settle(paths).await?;
            let output = run_pgbench(pgbench, db, &args, limit).await?;
            let ms = parse_pgbench(&output)?
                .latency_avg_ms
                .ok_or_else(|| BenchError::Other("pgbench printed no latency average".into()))?;
            if is_front {
                result.front_runs_ms.push(round3(ms));
            } else {
                result.direct_runs_ms.push(round3(ms));
            }
        }
    }
    Ok(())
}

/// Waits until the front's lease of the last run is released (only the direct lease left)
/// and its drop and refill are done: that work is the front's connect, not its round trips.
async fn settle(paths: &Paths<'_>) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        let status = paths.api.status().await?;
        if status.templates.iter().map(|t| t.leased).sum::<usize>() <= 1 {
            break;
        }
        if started.elapsed() > IDLE_LIMIT {
            return Err(BenchError::Other(
                "the front's lease of a pgbench run was not released".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin::wait_quiet(paths.api, paths.admin_conn, IDLE_LIMIT).await
}
