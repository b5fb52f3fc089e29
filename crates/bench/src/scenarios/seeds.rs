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

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use pglease_api::wire::LeaseResponse;
use serde::Serialize;

use super::{Ctx, IDLE_LIMIT, WAIT_MS};
use crate::admin;
use crate::api::Api;
use crate::cluster::{self, Cluster};
use crate::error::{BenchError, Result};
use crate::shim::{self, ProbeResult};
use crate::stats::round3;

/// The statement of workload (a), as the seed script runs it.
const INSERT: &str = "INSERT INTO test (data) VALUES ('hello!')";
/// The table of workload (a).
const CREATE_TABLE: &str = "CREATE TABLE test (id serial primary key, data text)";
/// The ordinary role that owns the raw servers' databases (trust over TCP).
const RAW_ROLE: &str = "seeds";
/// The lease's template.
const TEMPLATE: &str = "default";
/// The target "lease within 5% of hand-tuned": time ratio at most this…
const TIME_TARGET: f64 = 1.05;
/// …and tps ratio at least this.
const TPS_TARGET: f64 = 0.95;
/// Calls of each kind the shim probe times.
const PROBE_CALLS: u32 = 10;
/// Ceiling on `pgbench -i` (scale 10 takes seconds; a slow disk makes it longer).
const INIT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Margin on top of `-T` before a pgbench run is killed.
const RUN_MARGIN: Duration = Duration::from_secs(180);
/// How long a finished backend may take to leave `pg_stat_activity`.
const BACKEND_EXIT_LIMIT: Duration = Duration::from_secs(10);

/// The settings pglease sizes for each daemon (from its options and the instance
/// directory) rather than fixing them, with the values of a daemon started as the
/// benchmark starts it; the values the daemon reports in `/status` replace these.
const SIZED_SETTINGS: &[(&str, &str)] = &[
    ("max_wal_size", "8GB"),
    ("shared_buffers", "128MB"),
    ("max_connections", "100"),
];

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

/// pglease's own server settings for the hand-tuned postgres, so that the lease is
/// compared with the same server minus pglease: those every embedded server runs with,
/// those of one in memory (the tuned cluster is in /dev/shm, as pglease's instance is),
/// and the sized ones; any the daemon reports take the value it reported.
fn tuned_settings(reported: &serde_json::Map<String, serde_json::Value>) -> Vec<(String, String)> {
    use pglease_pool::postgres::{IN_MEMORY_SETTINGS, TUNED_SETTINGS};
    TUNED_SETTINGS
        .iter()
        .chain(IN_MEMORY_SETTINGS)
        .chain(SIZED_SETTINGS)
        .map(|(key, value)| {
            let value = reported.get(*key).and_then(|v| v.as_str()).unwrap_or(value);
            (key.to_string(), value.to_string())
        })
        .collect()
}

/// The hand-tuned server, started: initdb --nosync in /dev/shm, pglease's settings.
async fn tuned(
    ctx: &Ctx,
    bin_dir: &Path,
    settings: Vec<(String, String)>,
) -> (Result<Cluster>, RawSetup) {
    let mut setup = RawSetup {
        initdb: "--nosync --auth=trust --encoding=UTF8 --locale=C".into(),
        settings: settings.clone(),
        ..RawSetup::default()
    };
    let base_dir = PathBuf::from(format!(
        "/dev/shm/pglease-bench-seeds-tuned-{}",
        std::process::id()
    ));
    let cluster = async {
        let mut cluster = Cluster::init(
            "tuned",
            bin_dir,
            base_dir,
            ctx.launcher.log_dir.join("seeds-tuned-postgres.log"),
            ctx.launcher.pid_file.clone(),
            true,
        )
        .await?;
        setup.data_dir = cluster.data_dir.display().to_string();
        setup.filesystem = cluster::filesystem(&cluster.base_dir)?.0;
        setup.os_user = cluster.os_user().to_string();
        cluster.start(&settings, &[]).await?;
        create_raw_role(&cluster).await?;
        Ok::<Cluster, BenchError>(cluster)
    }
    .await;
    (cluster, setup)
}

/// The stock server: one cluster on disk, restarted with the shim at each delay.
async fn stock(
    ctx: &Ctx,
    pgbench: &Path,
    bin_dir: &Path,
) -> (
    Vec<TargetResult>,
    RawSetup,
    std::result::Result<ProbeResult, String>,
) {
    let delays = &ctx.plan.seeds_fsync_delays_us;
    let mut targets: Vec<TargetResult> = delays
        .iter()
        .map(|&us| TargetResult::new(stock_name(us), "stock", Some(us)))
        .collect();
    let mut setup = RawSetup {
        initdb: "--auth=trust --encoding=UTF8 --locale=C (syncs its files)".into(),
        ..RawSetup::default()
    };
    let mut probe = Err("not run".to_string());
    eprintln!("[bench] 6 seeds: building the fsync-delay shim, initdb of the stock postgres");
    let prepared = async {
        let shim = shim::build(&ctx.work_dir.join("shim"))?;
        let base_dir = on_disk_dir(ctx)?;
        let cluster = Cluster::init(
            "stock",
            bin_dir,
            base_dir,
            ctx.launcher.log_dir.join("seeds-stock-postgres.log"),
            ctx.launcher.pid_file.clone(),
            false,
        )
        .await?;
        Ok::<(shim::Shim, Cluster), BenchError>((shim, cluster))
    }
    .await;
    let (shim, mut cluster) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            for target in &mut targets {
                target.errors.push(error.to_string());
            }
            return (targets, setup, probe);
        }
    };
    setup.data_dir = cluster.data_dir.display().to_string();
    setup.filesystem = match cluster::filesystem(&cluster.base_dir) {
        Ok((name, _)) => name,
        Err(error) => error.to_string(),
    };
    setup.os_user = cluster.os_user().to_string();
    setup.preload = Some(format!(
        "{} ({}) preloaded in every stock run with {}=<delay> (0: loaded, no delay)",
        shim.library.display(),
        if shim.compiled {
            "built by this run"
        } else {
            "cached build"
        },
        shim::DELAY_VAR
    ));
    let probe_delay = delays
        .iter()
        .copied()
        .max()
        .filter(|&d| d > 0)
        .unwrap_or(1_000);
    probe = shim::probe(&shim, &cluster.base_dir, probe_delay, PROBE_CALLS)
        .await
        .map_err(|e| e.to_string());
    let mut done = Vec::new();
    for mut target in targets {
        let delay = target.fsync_delay_us.unwrap_or(0);
        eprintln!(
            "[bench] 6 seeds: stock postgres on {}, fsync delay {} ms",
            setup.filesystem,
            ms_text(delay)
        );
        let env = vec![
            ("LD_PRELOAD".to_string(), shim.library.display().to_string()),
            (shim::DELAY_VAR.to_string(), delay.to_string()),
        ];
        let started = async {
            cluster.start(&[], &env).await?;
            create_raw_role(&cluster).await
        }
        .await;
        if let Err(error) = started {
            target.errors.push(error.to_string());
            let _ = cluster.stop().await;
            done.push(target);
            continue;
        }
        target.shim_mapped = cluster
            .postmaster_pid()
            .and_then(|pid| cluster::has_mapped(pid, &shim.library).ok());
        let mut ran = run_targets(ctx, pgbench, vec![(target, Venue::Raw(&cluster))]).await;
        if let Err(error) = cluster.stop().await {
            if let Some(last) = ran.last_mut() {
                last.errors.push(error.to_string());
            }
        }
        done.append(&mut ran);
    }
    if let Err(error) = cluster.destroy().await {
        if let Some(last) = done.last_mut() {
            last.errors.push(error.to_string());
        }
    }
    (done, setup, probe)
}

/// A directory for the stock cluster on an ordinary (not in-memory) file system: the
/// driver's scratch directory, else /var/tmp.
fn on_disk_dir(ctx: &Ctx) -> Result<PathBuf> {
    let name = format!("pglease-bench-seeds-stock-{}", std::process::id());
    let candidates = [ctx.scratch_dir.clone(), PathBuf::from("/var/tmp")];
    for dir in &candidates {
        if let Ok((_, false)) = cluster::filesystem(dir) {
            return Ok(dir.join(&name));
        }
    }
    Err(BenchError::Other(format!(
        "no on-disk directory for the stock postgres: {} and /var/tmp are both in memory",
        ctx.scratch_dir.display()
    )))
}

/// `stock+1ms` and the like.
fn stock_name(delay_us: u64) -> String {
    format!("stock+{}ms", ms_text(delay_us))
}

/// Microseconds as milliseconds, without needless decimals.
fn ms_text(us: u64) -> String {
    if us.is_multiple_of(1_000) {
        (us / 1_000).to_string()
    } else {
        format!("{}", us as f64 / 1e3)
    }
}

/// The ordinary role that owns the raw servers' databases.
async fn create_raw_role(cluster: &Cluster) -> Result<()> {
    let conn = cluster.superuser("postgres").await?;
    let created = conn
        .client
        .batch_execute(&format!(
            "DO $$ BEGIN \
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{RAW_ROLE}') THEN \
                 CREATE ROLE {RAW_ROLE} LOGIN; \
               END IF; \
             END $$"
        ))
        .await
        .map_err(|e| BenchError::postgres("creating the role seeds", e));
    conn.close().await;
    created
}

/// Where a workload gets its database.
enum Venue<'a> {
    /// A lease of pglease's `default` template; `admin` is the daemon's superuser, to
    /// see that the pool has settled.
    Lease {
        api: &'a Api,
        admin: &'a tokio_postgres::Client,
    },
    /// A new database on a raw server.
    Raw(&'a Cluster),
}

/// A fresh database and how to reach it over TCP.
pub(super) struct Db {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) user: String,
    pub(super) password: Option<String>,
    pub(super) dbname: String,
    pub(super) lease_id: Option<String>,
}

impl From<LeaseResponse> for Db {
    fn from(lease: LeaseResponse) -> Self {
        Db {
            host: lease.host,
            port: lease.port,
            user: lease.user,
            password: Some(lease.password),
            dbname: lease.database,
            lease_id: Some(lease.id),
        }
    }
}

impl Venue<'_> {
    /// A fresh database for `workload`.
    async fn fresh(&self, workload: &str) -> Result<Db> {
        match self {
            Venue::Lease { api, .. } => Ok(api.lease(TEMPLATE, WAIT_MS).await?.into()),
            Venue::Raw(cluster) => {
                let dbname = format!("seeds_{workload}");
                let conn = cluster.superuser("postgres").await?;
                let created = admin::execute_each(
                    &conn.client,
                    &[
                        format!("DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"),
                        format!("CREATE DATABASE {dbname} OWNER {RAW_ROLE}"),
                    ],
                    &format!("creating {dbname}"),
                )
                .await;
                conn.close().await;
                created?;
                Ok(Db {
                    host: "127.0.0.1".into(),
                    port: cluster.port(),
                    user: RAW_ROLE.into(),
                    password: None,
                    dbname,
                    lease_id: None,
                })
            }
        }
    }

    /// Releases the lease (drop) or drops the database.
    async fn discard(&self, db: Db) -> Result<()> {
        match self {
            Venue::Lease { api, .. } => match &db.lease_id {
                Some(id) => api.release(id, false).await,
                None => Ok(()),
            },
            Venue::Raw(cluster) => {
                let conn = cluster.superuser("postgres").await?;
                let dropped = conn
                    .client
                    .batch_execute(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        db.dbname
                    ))
                    .await
                    .map_err(|e| BenchError::postgres(format!("dropping {}", db.dbname), e));
                conn.close().await;
                dropped
            }
        }
    }

    /// Waits until the daemon's background work is done ([`admin::wait_quiet`]); raw
    /// servers have nothing to wait for.
    async fn settle(&self) -> Result<()> {
        match self {
            Venue::Lease { api, admin } => admin::wait_quiet(api, admin, IDLE_LIMIT).await,
            Venue::Raw(_) => Ok(()),
        }
    }

    /// `pg_stat_wal.wal_sync` (raw servers only: tmpfs syncs nothing anyway). None where
    /// the server has no such column (before 14, and 18 moved it): the figure is a check
    /// on the shim, not the workload, so its absence fails nothing.
    async fn wal_syncs(&self) -> Result<Option<i64>> {
        let Venue::Raw(cluster) = self else {
            return Ok(None);
        };
        let conn = cluster.superuser("postgres").await?;
        let row = conn
            .client
            .query_one("SELECT wal_sync FROM pg_stat_wal", &[])
            .await;
        conn.close().await;
        Ok(row.ok().map(|row| row.get(0)))
    }

    /// Waits until backend `pid` has left `pg_stat_activity`: by then it has flushed its
    /// statistics (that happens before it leaves the process array).
    async fn wait_backend_gone(&self, pid: i32) -> Result<()> {
        let Venue::Raw(cluster) = self else {
            return Ok(());
        };
        let conn = cluster.superuser("postgres").await?;
        let started = Instant::now();
        let gone = loop {
            let row = conn
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .map_err(|e| BenchError::postgres("reading pg_stat_activity", e));
            match row {
                Ok(row) if row.get::<_, i64>(0) == 0 => break Ok(()),
                Ok(_) if started.elapsed() > BACKEND_EXIT_LIMIT => {
                    break Err(BenchError::Other(format!(
                        "backend {pid} did not exit within {}s",
                        BACKEND_EXIT_LIMIT.as_secs()
                    )))
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(error) => break Err(error),
            }
        };
        conn.close().await;
        gone
    }
}

/// Settles every venue (see [`Venue::settle`]) before a timed step.
async fn settle_all(entries: &[(TargetResult, Venue<'_>)]) -> Result<()> {
    for (_, venue) in entries {
        venue.settle().await?;
    }
    Ok(())
}

/// The order of the targets in step `step`: as given in even steps, reversed in odd
/// ones, so that no target always goes first (on a shared machine the first run of a
/// pair was often the faster one).
fn step_order(step: usize, targets: usize) -> Vec<usize> {
    if step.is_multiple_of(2) {
        (0..targets).collect()
    } else {
        (0..targets).rev().collect()
    }
}

/// Both workloads on the given targets, step by step: each step runs on every target in
/// turn (see [`step_order`]) before the next step starts. Failures are recorded in the
/// target, not returned; a target whose pgbench database failed skips its remaining
/// pgbench steps.
async fn run_targets(
    ctx: &Ctx,
    pgbench: &Path,
    mut entries: Vec<(TargetResult, Venue<'_>)>,
) -> Vec<TargetResult> {
    let plan = &ctx.plan;
    let count = entries.len();
    for index in step_order(0, count) {
        eprintln!(
            "[bench] 6 seeds: {}: {} inserts",
            entries[index].0.name, plan.seeds_insert_rows
        );
        let measured = match settle_all(&entries).await {
            Ok(()) => inserts(&entries[index].1, plan.seeds_insert_rows).await,
            Err(error) => Err(error),
        };
        let target = &mut entries[index].0;
        match measured {
            Ok(figures) => target.inserts = Some(figures),
            Err(error) => target.errors.push(format!("inserts: {error}")),
        }
    }
    // Workload (b): one database per target for the init and every run.
    let mut dbs: Vec<Option<Db>> = (0..count).map(|_| None).collect();
    let mut usable = vec![false; count];
    for index in step_order(1, count) {
        eprintln!(
            "[bench] 6 seeds: {}: pgbench -i -s {}",
            entries[index].0.name, plan.seeds_pgbench_scale
        );
        let (db, figures) = pgbench_init(ctx, pgbench, &entries, index).await;
        let target = &mut entries[index].0;
        usable[index] = figures.is_ok();
        match figures {
            Ok(figures) => target.pgbench_init = Some(figures),
            Err(error) => target.errors.push(format!("pgbench -i: {error}")),
        }
        dbs[index] = db;
    }
    let duration = plan.seeds_pgbench_duration;
    for (run, &clients) in plan.seeds_pgbench_clients.iter().enumerate() {
        for index in step_order(2 + run, count) {
            let Some(db) = dbs[index].as_ref().filter(|_| usable[index]) else {
                continue;
            };
            eprintln!(
                "[bench] 6 seeds: {}: pgbench -T {} -c {clients} -j {clients}",
                entries[index].0.name,
                duration.as_secs()
            );
            let measured = match settle_all(&entries).await {
                Ok(()) => pgbench_run(pgbench, db, clients, duration).await,
                Err(error) => Err(error),
            };
            let target = &mut entries[index].0;
            match measured {
                Ok(run) => target.pgbench_runs.push(run),
                Err(error) => {
                    target.errors.push(format!("pgbench -c {clients}: {error}"));
                    usable[index] = false;
                }
            }
        }
    }
    let mut results = Vec::new();
    for ((mut target, venue), db) in entries.into_iter().zip(dbs) {
        if let Some(db) = db {
            if let Err(error) = venue.discard(db).await {
                target
                    .errors
                    .push(format!("discarding the pgbench database: {error}"));
            }
        }
        results.push(target);
    }
    results
}

/// Connects to a workload's database over TCP.
async fn connect(db: &Db) -> Result<admin::Conn> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&db.host)
        .port(db.port)
        .user(&db.user)
        .dbname(&db.dbname)
        .application_name("pglease-bench");
    if let Some(password) = &db.password {
        config.password(password);
    }
    admin::connect_config(&config, &format!("{} as {}", db.dbname, db.user)).await
}

/// Workload (a): one connection, the table, `rows` autocommit INSERTs (timed).
async fn inserts(venue: &Venue<'_>, rows: usize) -> Result<InsertFigures> {
    let db = venue.fresh("inserts").await?;
    let measured = async {
        venue.settle().await?;
        let before = venue.wal_syncs().await?;
        let conn = connect(&db).await?;
        let pg = |what: &'static str| move |e| BenchError::postgres(what, e);
        conn.client
            .batch_execute(CREATE_TABLE)
            .await
            .map_err(pg("CREATE TABLE test"))?;
        let backend: i32 = conn
            .client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(pg("pg_backend_pid()"))?
            .get(0);
        // The simple query protocol, one round trip per statement, as a script runs it.
        let started = Instant::now();
        for _ in 0..rows {
            conn.client
                .batch_execute(INSERT)
                .await
                .map_err(pg("INSERT"))?;
        }
        let elapsed = started.elapsed();
        let counted: i64 = conn
            .client
            .query_one("SELECT count(*) FROM test", &[])
            .await
            .map_err(pg("counting the rows"))?
            .get(0);
        conn.close().await;
        if usize::try_from(counted).ok() != Some(rows) {
            return Err(BenchError::Other(format!(
                "{rows} INSERTs left {counted} rows in test"
            )));
        }
        let wal_syncs = match before {
            Some(before) => {
                venue.wait_backend_gone(backend).await?;
                venue.wal_syncs().await?.map(|after| after - before)
            }
            None => None,
        };
        let secs = elapsed.as_secs_f64();
        Ok(InsertFigures {
            rows,
            secs: round3(secs),
            per_insert_ms: round3(secs * 1e3 / rows.max(1) as f64),
            wal_syncs,
        })
    }
    .await;
    let discarded = venue.discard(db).await;
    let figures = measured?;
    discarded?;
    Ok(figures)
}

/// Workload (b)'s start on target `index`: a fresh database and `pgbench -i -s S` in it
/// (timed). Returns the database whenever one was made, so it is always discarded.
async fn pgbench_init(
    ctx: &Ctx,
    pgbench: &Path,
    entries: &[(TargetResult, Venue<'_>)],
    index: usize,
) -> (Option<Db>, Result<InitFigures>) {
    let venue = &entries[index].1;
    let db = match venue.fresh("pgbench").await {
        Ok(db) => db,
        Err(error) => return (None, Err(error)),
    };
    let figures = async {
        settle_all(entries).await?;
        let scale = ctx.plan.seeds_pgbench_scale.to_string();
        let started = Instant::now();
        let output = run_pgbench(pgbench, &db, &["-i", "-s", &scale], INIT_TIMEOUT).await?;
        Ok(InitFigures {
            secs: round3(started.elapsed().as_secs_f64()),
            summary: output
                .lines()
                .find(|line| line.starts_with("done in"))
                .map(str::to_string),
        })
    }
    .await;
    (Some(db), figures)
}

/// One `pgbench -T D -c N -j N` run.
async fn pgbench_run(
    pgbench: &Path,
    db: &Db,
    clients: usize,
    duration: Duration,
) -> Result<PgbenchRun> {
    let n = clients.to_string();
    let output = run_pgbench(
        pgbench,
        db,
        &["-T", &duration.as_secs().to_string(), "-c", &n, "-j", &n],
        duration + RUN_MARGIN,
    )
    .await?;
    Ok(PgbenchRun {
        clients,
        duration_secs: duration.as_secs_f64(),
        figures: parse_pgbench(&output)?,
    })
}

/// Runs pgbench against `db` with `args`; returns stdout and stderr together.
pub(super) async fn run_pgbench(
    pgbench: &Path,
    db: &Db,
    args: &[&str],
    limit: Duration,
) -> Result<String> {
    let mut command = tokio::process::Command::new(pgbench);
    command
        .args(["-h", &db.host, "-p", &db.port.to_string(), "-U", &db.user])
        .args(args)
        .arg(&db.dbname)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // The caller's PG* variables must not redirect it (PGHOSTADDR beats -h, for one).
    cluster::scrub_env(&mut command);
    if let Some(password) = &db.password {
        // Through the environment, not the command line (ps would show it).
        command.env("PGPASSWORD", password);
    }
    let what = format!("pgbench {}", args.join(" "));
    let output = tokio::time::timeout(limit, command.output())
        .await
        .map_err(|_| BenchError::Other(format!("{what} took over {}s; killed", limit.as_secs())))?
        .map_err(|e| BenchError::io(format!("cannot run {}", pgbench.display()), e))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        return Err(BenchError::Other(format!(
            "{what} failed ({}): {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    }
    Ok(text)
}

/// The figures at the end of a `pgbench -T` run. PG14+ prints one `tps = X (without
/// initial connection time)` line; older versions print `including connections
/// establishing` and `excluding connections establishing`, and the latter is taken.
pub fn parse_pgbench(output: &str) -> Result<PgbenchFigures> {
    let after = |line: &str, prefix: &str| -> Option<String> {
        line.trim()
            .strip_prefix(prefix)
            .map(|rest| rest.trim().to_string())
    };
    let first_number = |text: &str| -> Option<f64> {
        text.split(|c: char| c.is_whitespace() || c == '/' || c == '(')
            .find(|part| !part.is_empty())
            .and_then(|part| part.parse().ok())
    };
    let mut tps_lines: Vec<(f64, bool)> = Vec::new();
    let mut figures = PgbenchFigures {
        tps: 0.0,
        latency_avg_ms: None,
        transactions: None,
        failed_transactions: None,
    };
    for line in output.lines() {
        if let Some(rest) = after(line, "tps =") {
            if let Some(tps) = first_number(&rest) {
                let preferred = rest.contains("without initial connection time")
                    || rest.contains("excluding connections establishing");
                tps_lines.push((tps, preferred));
            }
        } else if let Some(rest) = after(line, "latency average =") {
            figures.latency_avg_ms = first_number(&rest);
        } else if let Some(rest) = after(line, "number of transactions actually processed:") {
            figures.transactions = first_number(&rest).map(|n| n as u64);
        } else if let Some(rest) = after(line, "number of failed transactions:") {
            figures.failed_transactions = first_number(&rest).map(|n| n as u64);
        }
    }
    let tps = tps_lines
        .iter()
        .find(|(_, preferred)| *preferred)
        .or(tps_lines.last())
        .map(|(tps, _)| *tps)
        .ok_or_else(|| BenchError::Other("pgbench printed no `tps =` line".into()))?;
    figures.tps = round3(tps);
    Ok(figures)
}

/// One row per workload, every target's figure, and the ratios.
pub fn comparisons(targets: &[TargetResult], scale: u32) -> Vec<Comparison> {
    let mut rows: Vec<(String, &'static str, Vec<NamedValue>)> = Vec::new();
    let values = |figure: &dyn Fn(&TargetResult) -> Option<f64>| -> Vec<NamedValue> {
        targets
            .iter()
            .map(|t| NamedValue {
                target: t.name.clone(),
                value: figure(t),
            })
            .collect()
    };
    let rows_run = targets
        .iter()
        .find_map(|t| t.inserts.as_ref().map(|i| i.rows))
        .unwrap_or(0);
    rows.push((
        format!("{rows_run} inserts"),
        "s",
        values(&|t| t.inserts.as_ref().map(|i| i.secs)),
    ));
    rows.push((
        format!("pgbench -i -s {scale}"),
        "s",
        values(&|t| t.pgbench_init.as_ref().map(|i| i.secs)),
    ));
    let mut clients: Vec<usize> = targets
        .iter()
        .flat_map(|t| t.pgbench_runs.iter().map(|r| r.clients))
        .collect();
    clients.sort_unstable();
    clients.dedup();
    for n in clients {
        rows.push((
            format!("pgbench -c {n} -j {n}"),
            "tps",
            values(&|t| {
                t.pgbench_runs
                    .iter()
                    .find(|r| r.clients == n)
                    .map(|r| r.figures.tps)
            }),
        ));
    }
    rows.into_iter()
        .map(|(workload, unit, values)| compare(workload, unit, values, targets))
        .collect()
}

fn compare(
    workload: String,
    unit: &'static str,
    values: Vec<NamedValue>,
    targets: &[TargetResult],
) -> Comparison {
    let of_kind = |kind: &str| {
        targets
            .iter()
            .zip(&values)
            .find(|(t, _)| t.kind == kind)
            .and_then(|(_, v)| v.value)
            .filter(|v| *v > 0.0)
    };
    let (lease, tuned) = (of_kind("lease"), of_kind("tuned"));
    let higher_is_better = unit == "tps";
    let lease_vs_tuned = lease.zip(tuned).map(|(l, t)| round3(l / t));
    let (target, met) = if higher_is_better {
        (
            format!("≥ {TPS_TARGET:.2}"),
            lease_vs_tuned.map(|r| r >= TPS_TARGET),
        )
    } else {
        (
            format!("≤ {TIME_TARGET:.2}"),
            lease_vs_tuned.map(|r| r <= TIME_TARGET),
        )
    };
    let lease_speedup_over_stock = targets
        .iter()
        .zip(&values)
        .filter(|(t, _)| t.kind == "stock")
        .map(|(t, v)| NamedValue {
            target: t.name.clone(),
            value: lease.zip(v.value.filter(|s| *s > 0.0)).map(|(l, s)| {
                if higher_is_better {
                    round3(l / s)
                } else {
                    round3(s / l)
                }
            }),
        })
        .collect();
    Comparison {
        workload,
        unit,
        values,
        lease_vs_tuned,
        target,
        met,
        lease_speedup_over_stock,
    }
}

/// The stock inserts at each delay against those at delay 0.
pub fn shim_checks(targets: &[TargetResult]) -> Vec<ShimCheck> {
    let baseline = targets
        .iter()
        .filter(|t| t.kind == "stock" && t.fsync_delay_us == Some(0))
        .find_map(|t| t.inserts.as_ref().map(|i| i.secs));
    targets
        .iter()
        .filter(|t| t.kind == "stock")
        .filter_map(|t| Some((t.fsync_delay_us.filter(|&d| d > 0)?, t.inserts.clone()?)))
        .map(|(delay_us, figures)| {
            let wal_syncs = figures.wal_syncs.unwrap_or(0);
            let delay_ms = delay_us as f64 / 1e3;
            let syncs_per_insert = wal_syncs as f64 / figures.rows.max(1) as f64;
            ShimCheck {
                delay_us,
                secs: figures.secs,
                wal_syncs,
                per_insert_ms: figures.per_insert_ms,
                per_insert_covers_delay: wal_syncs > 0
                    && figures.per_insert_ms >= delay_ms * syncs_per_insert.min(1.0),
                baseline_secs: baseline,
                extra_ms_per_sync: baseline
                    .filter(|_| wal_syncs > 0)
                    .map(|baseline| round3((figures.secs - baseline) * 1e3 / wal_syncs as f64)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pgbench 15's output of a `-T` run.
    const PG15_RUN: &str = "\
pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: TPC-B (sort of)>
scaling factor: 1
query mode: simple
number of clients: 2
number of threads: 2
maximum number of tries: 1
duration: 2 s
number of transactions actually processed: 6641
number of failed transactions: 0 (0.000%)
latency average = 0.600 ms
initial connection time = 9.461 ms
tps = 3335.370750 (without initial connection time)
";

    /// pgbench 13's: two tps lines.
    const PG13_RUN: &str = "\
number of transactions actually processed: 1200
latency average = 2.500 ms
tps = 398.100000 (including connections establishing)
tps = 400.200000 (excluding connections establishing)
";

    #[test]
    fn parses_pgbench_15() {
        let figures = parse_pgbench(PG15_RUN).expect("figures");
        assert_eq!(
            figures,
            PgbenchFigures {
                tps: 3335.371,
                latency_avg_ms: Some(0.6),
                transactions: Some(6641),
                failed_transactions: Some(0),
            }
        );
    }

    #[test]
    fn parses_older_pgbench_and_takes_the_tps_without_connections() {
        let figures = parse_pgbench(PG13_RUN).expect("figures");
        assert_eq!(figures.tps, 400.2);
        assert_eq!(figures.transactions, Some(1200));
        assert_eq!(figures.failed_transactions, None);
    }

    #[test]
    fn a_run_without_tps_is_an_error() {
        assert!(parse_pgbench("pgbench: error: connection failed\n").is_err());
        assert!(parse_pgbench("tps = fast\n").is_err());
    }

    fn target(
        name: &str,
        kind: &'static str,
        delay: Option<u64>,
        secs: f64,
        syncs: Option<i64>,
        tps: f64,
    ) -> TargetResult {
        let mut t = TargetResult::new(name.into(), kind, delay);
        t.inserts = Some(InsertFigures {
            rows: 1000,
            secs,
            per_insert_ms: secs,
            wal_syncs: syncs,
        });
        t.pgbench_init = Some(InitFigures {
            secs: secs / 2.0,
            summary: None,
        });
        t.pgbench_runs.push(PgbenchRun {
            clients: 1,
            duration_secs: 2.0,
            figures: PgbenchFigures {
                tps,
                latency_avg_ms: None,
                transactions: None,
                failed_transactions: None,
            },
        });
        t
    }

    fn sample() -> Vec<TargetResult> {
        vec![
            target("lease", "lease", None, 1.04, None, 950.0),
            target("tuned", "tuned", None, 1.0, Some(0), 1000.0),
            target("stock+0ms", "stock", Some(0), 3.0, Some(1002), 400.0),
            target("stock+1ms", "stock", Some(1000), 4.1, Some(1002), 190.0),
        ]
    }

    #[test]
    fn compares_the_lease_with_tuned_and_stock() {
        let rows = comparisons(&sample(), 1);
        assert_eq!(rows.len(), 3, "inserts, init, one pgbench run");
        let inserts = &rows[0];
        assert_eq!(inserts.workload, "1000 inserts");
        assert_eq!(inserts.lease_vs_tuned, Some(1.04));
        assert_eq!(inserts.met, Some(true), "a time ratio of 1.04 is within 5%");
        assert_eq!(inserts.lease_speedup_over_stock[0].value, Some(2.885));
        let tps = &rows[2];
        assert_eq!(tps.unit, "tps");
        assert_eq!(tps.lease_vs_tuned, Some(0.95));
        assert_eq!(tps.met, Some(true), "a tps ratio of 0.95 is the limit");
        assert_eq!(tps.lease_speedup_over_stock[1].value, Some(5.0));
    }

    #[test]
    fn a_slow_lease_misses_the_target_and_a_missing_figure_judges_nothing() {
        let mut targets = sample();
        if let Some(inserts) = targets[0].inserts.as_mut() {
            inserts.secs = 1.2;
        }
        targets[1].pgbench_runs.clear();
        let rows = comparisons(&targets, 1);
        assert_eq!(rows[0].met, Some(false));
        assert_eq!(rows[2].lease_vs_tuned, None);
        assert_eq!(rows[2].met, None);
    }

    #[test]
    fn the_shim_check_divides_the_extra_time_by_the_syncs() {
        let checks = shim_checks(&sample());
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].delay_us, 1000);
        assert_eq!(checks[0].extra_ms_per_sync, Some(1.098));
        // 4.1 ms per INSERT (the sample's per_insert_ms) covers a 1 ms delay.
        assert!(checks[0].per_insert_covers_delay);
    }

    #[test]
    fn inserts_faster_than_the_delay_fail_the_shim_check() {
        let mut targets = sample();
        if let Some(inserts) = targets[3].inserts.as_mut() {
            inserts.per_insert_ms = 0.5;
        }
        targets.remove(2);
        let checks = shim_checks(&targets);
        assert!(!checks[0].per_insert_covers_delay);
        assert_eq!(checks[0].baseline_secs, None, "no stock+0ms run");
        assert_eq!(checks[0].extra_ms_per_sync, None);
    }

    #[test]
    fn the_first_target_alternates_between_steps() {
        assert_eq!(step_order(0, 2), vec![0, 1]);
        assert_eq!(step_order(1, 2), vec![1, 0]);
        assert_eq!(step_order(2, 2), vec![0, 1]);
        assert_eq!(step_order(3, 1), vec![0]);
    }

    #[test]
    fn names_the_delays() {
        assert_eq!(stock_name(0), "stock+0ms");
        assert_eq!(stock_name(5_000), "stock+5ms");
        assert_eq!(stock_name(500), "stock+0.5ms");
    }

    #[test]
    fn tuned_settings_follow_the_daemon() {
        let mut reported = serde_json::Map::new();
        reported.insert("max_connections".into(), "350".into());
        reported.insert("fsync".into(), "off".into());
        let settings = tuned_settings(&reported);
        let get = |key: &str| {
            settings
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("max_connections"), Some("350"));
        assert_eq!(get("wal_level"), Some("minimal"));
        assert_eq!(get("max_wal_senders"), Some("0"));
        assert_eq!(get("dynamic_shared_memory_type"), Some("mmap"));
        assert_eq!(get("shared_buffers"), Some("128MB"));
        let mut keys: Vec<&str> = settings.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), settings.len(), "a setting given twice");
    }
}
