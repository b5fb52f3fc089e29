//! Scenario 6's raw servers, which pglease does not manage: the hand-tuned postgres on
//! tmpfs with pglease's own settings, and the stock one on disk, restarted with the
//! fsync-delay shim at each delay.

use std::path::{Path, PathBuf};

use super::workloads::{run_targets, Venue};
use super::{RawSetup, TargetResult, RAW_ROLE};
use crate::cluster::{self, Cluster};
use crate::error::{BenchError, Result};
use crate::scenarios::Ctx;
use crate::shim::{self, ProbeResult};

/// Calls of each kind the shim probe times.
const PROBE_CALLS: u32 = 10;

/// The settings pglease sizes for each daemon (from its options and the instance
/// directory) rather than fixing them, with the values of a daemon started as the
/// benchmark starts it; the values the daemon reports in `/status` replace these.
const SIZED_SETTINGS: &[(&str, &str)] = &[
    ("max_wal_size", "8GB"),
    ("shared_buffers", "128MB"),
    ("max_connections", "100"),
];

/// pglease's own server settings for the hand-tuned postgres, so that the lease is
/// compared with the same server minus pglease: those every embedded server runs with,
/// those of one in memory (the tuned cluster is in /dev/shm, as pglease's instance is),
/// and the sized ones; any the daemon reports take the value it reported.
pub(super) fn tuned_settings(
    reported: &serde_json::Map<String, serde_json::Value>,
) -> Vec<(String, String)> {
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
pub(super) async fn tuned(
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
pub(super) async fn stock(
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
pub(super) fn stock_name(delay_us: u64) -> String {
    format!("stock+{}ms", ms_text(delay_us))
}

/// Microseconds as milliseconds, without needless decimals.
pub(super) fn ms_text(us: u64) -> String {
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
