//! A running postmaster, child of this daemon (`RunningPostgres`): the superuser's
//! connection settings, waiting until it accepts connections, noticing its exit, the tail
//! of its log, fast shutdown escalating to SIGKILL, and killing it on drop as a last
//! resort; and how its start obtained its cluster (`ClusterOrigin`).
//!
//! Apart from `launch.rs`, which spawns it, so that a start's steps and the life of what
//! it started read separately. It uses only `initdb.rs` (the superuser's name) and
//! `server_log.rs` (to wait for an exit's last words).

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tracing::{error, info, warn};

use super::initdb::ADMIN_USER;
use super::server_log::Drain;
use crate::error::StartError;
use crate::types::StorageStatus;

/// Ceiling on start-up: generous, since a loaded CI machine can be slow, and an early
/// exit is noticed at once anyway.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often readiness is polled: a start takes ~150 ms, so this adds little latency.
const READY_POLL: Duration = Duration::from_millis(20);
/// How often shutdown checks whether the postmaster has exited.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// How long an early exit waits for its output to reach the log before quoting it.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Log lines quoted in start-up errors.
const ERROR_TAIL_LINES: usize = 20;

/// How a start obtained its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterOrigin {
    /// Copied from the initdb cache; initdb did not run.
    CopiedFromCache,
    /// initdb ran and its result was stored in the cache for later starts.
    InitdbCached,
    /// initdb ran; the cache could not be used.
    InitdbUncached,
    /// The cluster a clean stop left in a kept data directory (`keep_data` with `data_dir`),
    /// with its templates and ready clones.
    Kept,
    /// Unpacked from a snapshot (`snapshot_dir`), with its templates.
    Snapshot,
}

impl ClusterOrigin {
    /// Whether initdb ran for this start.
    pub fn ran_initdb(self) -> bool {
        matches!(
            self,
            ClusterOrigin::InitdbCached | ClusterOrigin::InitdbUncached
        )
    }
}

/// A running postmaster, child of this daemon.
#[derive(Debug)]
pub struct RunningPostgres {
    /// The postmaster's pid.
    pub pid: u32,
    /// TCP port for lease holders.
    pub port: u16,
    /// Host lease holders use (advertise_host or listen_host).
    pub host: String,
    /// The cluster's data directory.
    pub data_dir: PathBuf,
    /// Directory of the unix socket the daemon connects through.
    pub socket_dir: PathBuf,
    /// The server log.
    pub log_path: PathBuf,
    /// What `postgres --version` printed, e.g. "postgres (PostgreSQL) 15.18 (Debian ...)".
    pub version: String,
    /// Which start of the instance this is (1 for the first); names `pgdata-<generation>`.
    pub generation: u32,
    /// Whether initdb ran or the cluster came from the cache.
    pub cluster_origin: ClusterOrigin,
    /// What the cluster lives on (`--storage`), and why.
    pub storage: StorageStatus,
    /// Where clones share blocks: what the store held before any cluster was put there.
    pub store_base: Option<u64>,
    /// The databases' tmpfs (`<data_dir>/base`), when they have one of their own.
    pub databases_space: Option<PathBuf>,
    /// The postmaster; `None` once reaped by shutdown.
    pub(super) child: Option<Child>,
    /// Whether its output has been read into the log (`server_log.rs`).
    pub(super) log_drain: Drain,
}

impl RunningPostgres {
    /// Connection settings for the superuser over the unix socket, database `postgres`.
    pub fn admin_config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&self.socket_dir)
            .port(self.port)
            .user(ADMIN_USER)
            .dbname("postgres")
            .application_name("pglease")
            // A local socket answers at once unless the server is overloaded.
            .connect_timeout(Duration::from_secs(5));
        config
    }

    /// `Some(status)` once the postmaster has exited (reaping it); never blocks.
    pub fn poll_exit(&mut self) -> Option<String> {
        let Some(child) = self.child.as_mut() else {
            return Some("already stopped".to_owned());
        };
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            // ECHILD: it was reaped elsewhere, so it is gone.
            Err(e) => Some(format!("cannot wait for it ({e})")),
        }
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_lines(&self.log_path, lines)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log_path.display()))
    }

    /// Fast shutdown (SIGINT), then SIGKILL after `timeout`; always reaps.
    pub async fn shutdown(mut self, timeout: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let started = Instant::now();
        if let Ok(Some(status)) = child.try_wait() {
            info!(pid = self.pid, %status, "postgres had already exited");
            return;
        }
        // SIGINT is postgres' fast shutdown: sessions are ended, a checkpoint is written.
        if let Err(e) = signal(self.pid, Signal::SIGINT) {
            warn!(pid = self.pid, error = %e, "cannot send SIGINT to postgres");
        }
        if let Some(status) = wait_exit(&mut child, timeout).await {
            info!(
                pid = self.pid,
                %status,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "postgres stopped"
            );
            return;
        }
        warn!(
            pid = self.pid,
            timeout_ms = timeout.as_millis() as u64,
            "postgres did not stop in time; sending SIGKILL"
        );
        let _ = signal(self.pid, Signal::SIGKILL);
        // SIGKILL completes unless the process is stuck in the kernel.
        match wait_exit(&mut child, Duration::from_secs(10)).await {
            Some(status) => info!(pid = self.pid, %status, "postgres killed"),
            None => error!(
                pid = self.pid,
                "postgres survived SIGKILL for 10 s; leaving it"
            ),
        }
    }

    /// Polls until a connection succeeds, the postmaster exits, or [`READY_TIMEOUT`].
    pub(super) async fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut config = self.admin_config();
        config.connect_timeout(Duration::from_secs(2));
        loop {
            if let Some(status) = self.poll_exit() {
                // Its last words pass through the log's pipe: wait until they are written
                // (its children end with it), so that the tail quoted holds them.
                self.log_drain.wait(LOG_DRAIN_TIMEOUT).await;
                return Err(StartError::EarlyExit {
                    status,
                    log_path: self.log_path.clone(),
                    tail: self.log_tail(ERROR_TAIL_LINES),
                });
            }
            // postmaster.pid says when it accepts connections (PG 10+); probing before
            // that would only fill the log with "the database system is starting up".
            let status = postmaster_status(&self.data_dir);
            if !matches!(status.as_deref(), Some("starting" | "stopping")) {
                let attempt = tokio::time::timeout(
                    Duration::from_secs(3),
                    config.connect(tokio_postgres::NoTls),
                );
                if let Ok(Ok((client, connection))) = attempt.await {
                    // The handshake succeeding is the readiness signal; close at once.
                    drop(client);
                    drop(connection);
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                self.kill_and_reap();
                return Err(StartError::NotReady {
                    pid: self.pid,
                    timeout_secs: READY_TIMEOUT.as_secs(),
                    log_path: self.log_path.clone(),
                    tail: self.log_tail(ERROR_TAIL_LINES),
                });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// SIGKILL and reap, without the warning of `Drop`.
    fn kill_and_reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = signal(self.pid, Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl Drop for RunningPostgres {
    /// A last resort: the actor shuts postgres down explicitly. Blocks briefly to reap.
    fn drop(&mut self) {
        let still_running = self
            .child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)));
        if still_running {
            warn!(pid = self.pid, "postgres dropped while running; killing it");
            self.kill_and_reap();
        }
    }
}

/// Waits up to `timeout` for `child` to exit, polling without blocking the runtime.
async fn wait_exit(child: &mut Child, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status.to_string()),
            Ok(None) => {}
            Err(e) => return Some(format!("cannot wait for it ({e})")),
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// Sends `signal` to `pid`.
fn signal(pid: u32, signal: Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::Error::EINVAL)?;
    nix::sys::signal::kill(Pid::from_raw(pid), signal)
}

/// Line 8 of `postmaster.pid` in `data_dir`: "starting", "ready", "stopping" or "standby"
/// (PG 10+); `None` when there is no such file or line. Reads a file: call it off the actor.
pub fn postmaster_status(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    Some(text.lines().nth(7)?.trim().to_owned())
}

/// The last `lines` lines of the file at `path`, reading at most its last 64 KiB.
fn tail_lines(path: &Path, lines: usize) -> std::io::Result<String> {
    const WINDOW: u64 = 64 * 1024;
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}
