//! Scenario 14 (d): many idle connections through the front (the 1,000), each its
//! own lease of the `default` template (an empty database), on a daemon of their own whose
//! budgets leave room for them all: `--max-total N --min-ready N` (the clones are made
//! before the connections, so the time to open them is the front's, not the clones'),
//! `--lease-connections 1` (one connection a lease, so postgres' `max_connections`, sized
//! from the pool, has room: N × 3 + 30 for N up to 1,656), and `--no-reuse-unchanged` (the
//! closes at the end drop the databases rather than prove each one unchanged).
//!
//! What is read: the daemon's VmRSS before and after (per connection: its relay buffers,
//! its task, its lease), its open files, and the postgres servers' memory apart (the sum of
//! `Pss` in `/proc/<pid>/smaps_rollup` over the postmaster and its children): a backend
//! costs the same whether its client is the front or a direct connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::Client;

use super::front_config;
use crate::admin::{self, Conn};
use crate::cpu::postgres_pids;
use crate::daemon::{Daemon, Memory};
use crate::error::Result;
use crate::scenarios::{strings, Ctx};
use crate::stats::{per_second, round3};

/// The template every connection leases.
const TEMPLATE: &str = "default";
/// Concurrent openers, as scenario 7 opens its leases.
const OPENERS: usize = 16;
/// How long N clones of an empty template may take to be made (about 20/s here).
const CLONES_LIMIT: Duration = Duration::from_secs(600);
/// How long the connections are held before the memory is read again.
const HOLD: Duration = Duration::from_secs(2);

/// Part (d)'s figures.
#[derive(Debug, Serialize)]
pub struct IdleResult {
    /// The daemon's flags.
    pub daemon_args: Vec<String>,
    /// Connections asked for.
    pub wanted: usize,
    /// Connections opened (and held).
    pub opened: usize,
    /// Why an opener stopped early, if one did: a limit reached.
    pub first_error: Option<String>,
    /// From the first connect to the last one's greeting, seconds.
    pub open_secs: f64,
    /// Connections opened per second.
    pub connects_per_sec: f64,
    /// Leases of `default` the daemon's `/status` counted while they were held.
    pub leased_while_held: usize,
    /// The postgres server's `max_connections`.
    pub max_connections: Option<String>,
    /// The daemon's memory with the clones made and no connection open.
    pub daemon_before: Memory,
    /// … and with the connections held.
    pub daemon_after: Memory,
    /// (after − before) ÷ opened, KiB.
    pub daemon_kib_per_connection: Option<f64>,
    /// The daemon's open files with the connections held.
    pub daemon_open_files: Option<usize>,
    /// `Max open files` (soft) of the daemon and of this driver, from `/proc/<pid>/limits`.
    pub open_files_limits: Option<(String, String)>,
    /// The postgres servers' memory before the connections.
    pub postgres_before: Option<Pss>,
    /// … and with the connections held.
    pub postgres_after: Option<Pss>,
    /// (after − before) ÷ opened, KiB: a backend's memory, as for a direct connection.
    pub postgres_kib_per_connection: Option<f64>,
    /// From closing the connections until the daemon held no lease, seconds.
    pub released_secs: Option<f64>,
}

/// The summed proportional set size of a set of processes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pss {
    /// Processes read.
    pub processes: usize,
    /// Their `Pss`, KiB.
    pub pss_kib: u64,
}

/// Runs part (d) on a daemon of its own.
pub(super) async fn run(ctx: &Ctx) -> Result<IdleResult> {
    let wanted = ctx.plan.front_idle_connections;
    let count = wanted.to_string();
    let daemon_args = strings(&[
        "--max-total",
        &count,
        "--min-ready",
        &count,
        "--clone-concurrency",
        "2",
        "--lease-connections",
        "1",
        "--no-reuse-unchanged",
        "--prebuild",
        "--front-listen",
        "127.0.0.1:0",
    ]);
    let mut args = daemon_args.clone();
    args.extend(ctx.cache_args());
    let daemon = ctx.launcher.start("front-idle", &args).await?;
    let front = daemon.front_addr().await?;
    let server = daemon.server_info().await?;
    let admin_conn = admin::superuser(&server, "postgres").await?;
    let held = hold(&daemon, front, &admin_conn.client, wanted, daemon_args).await;
    admin_conn.close().await;
    daemon.stop().await?;
    held
}

/// Makes the clones, opens and holds the connections, reads the memory, closes them.
async fn hold(
    daemon: &Daemon,
    front: SocketAddr,
    admin_conn: &Client,
    wanted: usize,
    daemon_args: Vec<String>,
) -> Result<IdleResult> {
    let api = daemon.api()?;
    let max_connections = admin_conn
        .query_one("SHOW max_connections", &[])
        .await
        .ok()
        .map(|row| row.get::<_, String>(0));
    eprintln!("[bench] 14 front: {wanted} clones of {TEMPLATE} for the idle connections");
    admin::wait_idle(api, admin_conn, TEMPLATE, wanted, CLONES_LIMIT).await?;
    let daemon_before = daemon.memory()?;
    let postgres_before = pss(daemon.pid());
    eprintln!("[bench] 14 front: opening {wanted} idle connections through the front");
    let started = Instant::now();
    let (conns, first_error) = open(front, wanted).await;
    let open_time = started.elapsed();
    let opened = conns.len();
    tokio::time::sleep(HOLD).await;
    let leased_while_held =
        crate::api::template(&api.status().await?, TEMPLATE).map_or(0, |t| t.leased);
    let daemon_after = daemon.memory()?;
    let postgres_after = pss(daemon.pid());
    let daemon_open_files = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .ok()
        .map(Iterator::count);
    let open_files_limits =
        open_files_limit(daemon.pid()).zip(open_files_limit(std::process::id()));
    eprintln!("[bench] 14 front: closing them");
    let closing = Instant::now();
    for conn in conns {
        conn.close().await;
    }
    let released_secs = released(daemon)
        .await
        .then(|| round3(closing.elapsed().as_secs_f64()));
    let per = |before: u64, after: u64| {
        (opened > 0).then(|| round3((after as f64 - before as f64) / opened as f64))
    };
    Ok(IdleResult {
        daemon_args,
        wanted,
        opened,
        first_error,
        open_secs: round3(open_time.as_secs_f64()),
        connects_per_sec: per_second(opened, open_time),
        leased_while_held,
        max_connections,
        daemon_kib_per_connection: per(daemon_before.rss_kib, daemon_after.rss_kib),
        daemon_before,
        daemon_after,
        daemon_open_files,
        open_files_limits,
        postgres_kib_per_connection: postgres_before
            .zip(postgres_after)
            .and_then(|(b, a)| per(b.pss_kib, a.pss_kib)),
        postgres_before,
        postgres_after,
        released_secs,
    })
}

/// Opens `wanted` connections from [`OPENERS`] tasks; an opener stops at its first
/// failure (a limit reached), and what was opened is kept.
async fn open(front: SocketAddr, wanted: usize) -> (Vec<Conn>, Option<String>) {
    let config = front_config(front, TEMPLATE, "pglease-bench-idle");
    let mut tasks = tokio::task::JoinSet::new();
    for opener in 0..OPENERS {
        let config = config.clone();
        let count = wanted / OPENERS + usize::from(opener < wanted % OPENERS);
        tasks.spawn(async move {
            let mut conns = Vec::with_capacity(count);
            for _ in 0..count {
                match admin::connect_config(&config, "the front").await {
                    Ok(conn) => conns.push(conn),
                    Err(error) => return (conns, Some(error.to_string())),
                }
            }
            (conns, None)
        });
    }
    let (mut all, mut first_error) = (Vec::with_capacity(wanted), None);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((conns, error)) => {
                all.extend(conns);
                first_error = first_error.or(error);
            }
            Err(error) => {
                first_error.get_or_insert(format!("opener panicked: {error}"));
            }
        }
    }
    (all, first_error)
}

/// Waits until the daemon holds no lease and makes no clone; false after a minute.
async fn released(daemon: &Daemon) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Ok(status) = daemon.api().map(|api| api.status()) else {
            return false;
        };
        if let Ok(status) = status.await {
            if status.templates.iter().all(|t| t.leased == 0) {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The summed `Pss` of the daemon's postgres servers (postmasters and their children).
fn pss(daemon: u32) -> Option<Pss> {
    let pids = postgres_pids(daemon);
    let mut pss = Pss {
        processes: 0,
        pss_kib: 0,
    };
    for pid in pids {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        let kib = text
            .lines()
            .find(|line| line.starts_with("Pss:"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok());
        if let Some(kib) = kib {
            pss.processes += 1;
            pss.pss_kib += kib;
        }
    }
    (pss.processes > 0).then_some(pss)
}

/// The soft `Max open files` of a process.
fn open_files_limit(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3).map(str::to_string)
}
