//! Scenario 6, the seeds' workloads, on five targets:
//! - **stock postgres on disk**, three times: one cluster (initdb without `--nosync`, all
//!   settings default but port, listen address and socket directory) on an ordinary file
//!   system, restarted with the fsync-delay shim (`crate::shim`) preloaded at each
//!   `FSYNC_DELAY_US` of the plan (0 = loaded, no delay), to stand for slower disks;
//! - **hand-tuned postgres on tmpfs**: initdb `--nosync` in `/dev/shm`, started with
//!   pglease's own server settings and no pglease;
//! - **a pglease lease** of the `default` (empty) template, with the lease's credentials.
//!
//! Each workload runs in a fresh database: a new lease (released with `reuse=false`), or
//! on the raw servers a new database owned by an ordinary role `seeds`. Every connection
//! is TCP to 127.0.0.1. The workloads:
//! - (a) one connection: `CREATE TABLE test (id serial primary key, data text)`, then N
//!   autocommit `INSERT INTO test (data) VALUES ('hello!')` in a row (timed);
//! - (b) `pgbench -i -s S` (timed), then `pgbench -T D -c N -j N` for each N (tps).
//!
//! The lease and the tuned server, the pair the target compares, run side by side: each
//! step runs on one, then on the other (which goes first alternates from step to step),
//! so a shared machine's drift hits both alike.
//! Before every timed step the daemon's pool must be quiet (no clone or drop under way):
//! the refill a lease starts and the drop a release starts are the pool's background
//! work, and would otherwise land on whichever measurement runs next. The stock server
//! runs afterwards, once per delay.
//!
//! It also checks that the shim works: its probe times each sync call through the shim
//! and straight to libc, each stock postmaster's memory map must hold the library, and
//! the stock inserts' extra time over the undelayed run is set against the WAL syncs
//! `pg_stat_wal` counted. A target that fails records its error and the others still
//! run. It judges no figure.
//!
//! Submodules: `servers` (the raw servers: the hand-tuned one and the stock one with the
//! shim), `workloads` (where each workload gets its database, and the steps run target
//! by target), `pgbench` (running pgbench and reading its figures, shared with scenario
//! 5), `compare` (the ratios and the shim check).

mod compare;
mod pgbench;
mod servers;
#[cfg(test)]
mod tests;
mod workloads;

use std::path::Path;

use serde::Serialize;

use super::Ctx;
use crate::admin;
use crate::error::{BenchError, Result};
use crate::shim::ProbeResult;
use compare::{comparisons, shim_checks};
pub use pgbench::parse_pgbench;
pub(in crate::scenarios) use pgbench::{run_pgbench, Db};
use servers::{ms_text, stock, tuned, tuned_settings};
use workloads::{run_targets, Venue};

/// The ordinary role that owns the raw servers' databases (trust over TCP).
const RAW_ROLE: &str = "seeds";

/// Scenario 6's figures.
#[derive(Debug, Serialize)]
pub struct SeedsResult {
    /// What this mode ran, against the full parameters.
    pub mode_note: String,
    /// Workload (a): INSERTs.
    pub insert_rows: usize,
    /// Workload (b): `pgbench -i -s`.
    pub pgbench_scale: u32,
    /// Workload (b): `pgbench -T`, seconds.
    pub pgbench_duration_secs: f64,
    /// Workload (b): `-c N -j N` runs.
    pub pgbench_clients: Vec<usize>,
    /// The stock server's `FSYNC_DELAY_US` values.
    pub fsync_delays_us: Vec<u64>,
    /// How the stock server was set up.
    pub stock: RawSetup,
    /// How the hand-tuned server was set up.
    pub tuned: RawSetup,
    /// How the lease's daemon was started.
    pub lease_daemon_args: Vec<String>,
    /// One entry per target, in the order run: lease, tuned, stock by delay.
    pub targets: Vec<TargetResult>,
    /// One row per workload: every target's figure and the ratios.
    pub comparisons: Vec<Comparison>,
    /// The shim's probe: each sync call with and without it.
    pub shim_probe: Option<ProbeResult>,
    /// Why the probe did not run, if it did not.
    pub shim_probe_error: Option<String>,
    /// The stock inserts' extra time per WAL sync, one entry per delay above 0.
    pub shim_in_postgres: Vec<ShimCheck>,
}

/// A raw (non-pglease) server's set-up.
#[derive(Debug, Default, Serialize)]
pub struct RawSetup {
    /// The data directory.
    pub data_dir: String,
    /// Its file system.
    pub filesystem: String,
    /// The OS user postgres ran as.
    pub os_user: String,
    /// initdb's flags.
    pub initdb: String,
    /// Settings beyond port, listen_addresses and unix_socket_directories.
    pub settings: Vec<(String, String)>,
    /// The preloaded shim, if any.
    pub preload: Option<String>,
}

/// One target's figures.
#[derive(Debug, Serialize)]
pub struct TargetResult {
    /// Column name: `stock+1ms`, `tuned`, `lease`.
    pub name: String,
    /// `stock`, `tuned` or `lease`.
    pub kind: &'static str,
    /// The shim's delay (stock only), µs.
    pub fsync_delay_us: Option<u64>,
    /// Whether the shim was in the postmaster's memory map (stock only).
    pub shim_mapped: Option<bool>,
    /// Workload (a).
    pub inserts: Option<InsertFigures>,
    /// Workload (b), `pgbench -i`.
    pub pgbench_init: Option<InitFigures>,
    /// Workload (b), one run per client count.
    pub pgbench_runs: Vec<PgbenchRun>,
    /// What failed, if anything (the rest still ran).
    pub errors: Vec<String>,
}

impl TargetResult {
    fn new(name: String, kind: &'static str, fsync_delay_us: Option<u64>) -> TargetResult {
        TargetResult {
            name,
            kind,
            fsync_delay_us,
            shim_mapped: None,
            inserts: None,
            pgbench_init: None,
            pgbench_runs: Vec::new(),
            errors: Vec::new(),
        }
    }
}

/// Workload (a)'s figures.
#[derive(Debug, Clone, Serialize)]
pub struct InsertFigures {
    /// INSERTs run (and counted back).
    pub rows: usize,
    /// Wall time of the INSERTs alone, seconds.
    pub secs: f64,
    /// Per INSERT, ms.
    pub per_insert_ms: f64,
    /// WAL syncs (`pg_stat_wal.wal_sync`) during the workload (raw servers only).
    pub wal_syncs: Option<i64>,
}

/// `pgbench -i`.
#[derive(Debug, Clone, Serialize)]
pub struct InitFigures {
    /// Wall time of the whole command, seconds.
    pub secs: f64,
    /// pgbench's own `done in …` line.
    pub summary: Option<String>,
}

/// One `pgbench -T` run.
#[derive(Debug, Clone, Serialize)]
pub struct PgbenchRun {
    /// `-c` and `-j`.
    pub clients: usize,
    /// `-T`, seconds.
    pub duration_secs: f64,
    /// Parsed from pgbench's output.
    #[serde(flatten)]
    pub figures: PgbenchFigures,
}

/// What pgbench prints at the end of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PgbenchFigures {
    /// Transactions per second (without the initial connection time).
    pub tps: f64,
    /// `latency average`, ms.
    pub latency_avg_ms: Option<f64>,
    /// `number of transactions actually processed`.
    pub transactions: Option<u64>,
    /// `number of failed transactions` (PG15+).
    pub failed_transactions: Option<u64>,
}

/// One workload across the targets.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// What ran.
    pub workload: String,
    /// `s` (lower is better) or `tps` (higher is better).
    pub unit: &'static str,
    /// Each target's figure, in target order.
    pub values: Vec<NamedValue>,
    /// Lease over tuned (a time ratio for `s`, a tps ratio for `tps`).
    pub lease_vs_tuned: Option<f64>,
    /// The target for that ratio.
    pub target: String,
    /// Whether the ratio meets it.
    pub met: Option<bool>,
    /// How many times faster the lease is than each stock target.
    pub lease_speedup_over_stock: Vec<NamedValue>,
}

/// A figure of a named target.
#[derive(Debug, Clone, Serialize)]
pub struct NamedValue {
    /// Target name.
    pub target: String,
    /// The figure, if it was measured.
    pub value: Option<f64>,
}

/// The shim seen through postgres: the stock inserts at a delay.
#[derive(Debug, Serialize)]
pub struct ShimCheck {
    /// `FSYNC_DELAY_US`.
    pub delay_us: u64,
    /// The INSERTs' time at this delay, seconds.
    pub secs: f64,
    /// WAL syncs postgres counted during the inserts at this delay.
    pub wal_syncs: i64,
    /// Time per INSERT, ms.
    pub per_insert_ms: f64,
    /// Whether each INSERT took at least the delay times its share of WAL syncs: the
    /// check that needs no other run (every autocommit INSERT waits for its sync).
    pub per_insert_covers_delay: bool,
    /// The INSERTs' time at delay 0, seconds, if that run has figures.
    pub baseline_secs: Option<f64>,
    /// Extra time per WAL sync over delay 0, ms: about the delay, give or take how far
    /// the disk's own sync time drifted between the two runs.
    pub extra_ms_per_sync: Option<f64>,
}

/// Runs scenario 6. `pgbench` gives the bin directory of every server binary used.
pub async fn run(ctx: &Ctx, pgbench: &Path) -> Result<SeedsResult> {
    let plan = &ctx.plan;
    let bin_dir = pgbench
        .parent()
        .ok_or_else(|| BenchError::Other(format!("{} has no directory", pgbench.display())))?;

    // The lease and the tuned server run side by side, each step on one then the other,
    // so that a machine whose speed drifts (a shared one) treats both alike. The daemon
    // also reports the settings the tuned server copies.
    let lease_daemon_args = ctx.cache_args();
    eprintln!("[bench] 6 seeds: a pglease daemon, and hand-tuned postgres on tmpfs");
    let daemon = ctx.launcher.start("seeds", &lease_daemon_args).await?;
    let server = daemon.server_info().await?;
    let admin_conn = admin::superuser(&server, "postgres").await?;
    let settings = tuned_settings(&server.settings);
    let mut tuned_target = TargetResult::new("tuned".into(), "tuned", None);
    let (tuned_cluster, tuned) = tuned(ctx, bin_dir, settings).await;
    let lease_target = TargetResult::new("lease".into(), "lease", None);
    let lease_venue = Venue::Lease {
        api: daemon.api()?,
        admin: &admin_conn.client,
    };
    let mut targets = match &tuned_cluster {
        Ok(cluster) => {
            run_targets(
                ctx,
                pgbench,
                vec![
                    (lease_target, lease_venue),
                    (tuned_target, Venue::Raw(cluster)),
                ],
            )
            .await
        }
        Err(error) => {
            tuned_target.errors.push(error.to_string());
            let mut lease = run_targets(ctx, pgbench, vec![(lease_target, lease_venue)]).await;
            lease.push(tuned_target);
            lease
        }
    };
    if let Ok(cluster) = tuned_cluster {
        if let Err(error) = cluster.destroy().await {
            if let Some(tuned) = targets.iter_mut().find(|t| t.kind == "tuned") {
                tuned.errors.push(error.to_string());
            }
        }
    }
    admin_conn.close().await;
    daemon.stop().await?;

    let (stock_targets, stock, shim_probe) = stock(ctx, pgbench, bin_dir).await;
    targets.extend(stock_targets);
    let (shim_probe, shim_probe_error) = match shim_probe {
        Ok(probe) => (Some(probe), None),
        Err(error) => (None, Some(error)),
    };

    let comparisons = comparisons(&targets, plan.seeds_pgbench_scale);
    let shim_in_postgres = shim_checks(&targets);
    Ok(SeedsResult {
        mode_note: mode_note(ctx),
        insert_rows: plan.seeds_insert_rows,
        pgbench_scale: plan.seeds_pgbench_scale,
        pgbench_duration_secs: plan.seeds_pgbench_duration.as_secs_f64(),
        pgbench_clients: plan.seeds_pgbench_clients.clone(),
        fsync_delays_us: plan.seeds_fsync_delays_us.clone(),
        stock,
        tuned,
        lease_daemon_args,
        targets,
        comparisons,
        shim_probe,
        shim_probe_error,
        shim_in_postgres,
    })
}

/// What quick mode leaves out, or that full mode runs the parameters.
fn mode_note(ctx: &Ctx) -> String {
    let plan = &ctx.plan;
    let clients: Vec<String> = plan
        .seeds_pgbench_clients
        .iter()
        .map(ToString::to_string)
        .collect();
    let delays: Vec<String> = plan
        .seeds_fsync_delays_us
        .iter()
        .map(|us| ms_text(*us))
        .collect();
    let ran = format!(
        "{} inserts; pgbench -i -s {}, then -T {} with {} clients; stock fsync delays {} ms",
        plan.seeds_insert_rows,
        plan.seeds_pgbench_scale,
        plan.seeds_pgbench_duration.as_secs(),
        clients.join(", "),
        delays.join(", ")
    );
    if plan.mode == "full" {
        format!("full mode, the issue's parameters: {ran}")
    } else {
        format!(
            "{} mode ran {ran} (full mode: 10000 inserts; -s 10, -T 30 with 1, 2, 3 clients; delays 0, 1, 5 ms)",
            plan.mode
        )
    }
}
