//! Starting and stopping `pglease serve` processes. A [`Launcher`] spawns the release
//! binary with `--listen 127.0.0.1:0`, copies its stderr to a log file and reads the HTTP
//! address from the `listening … addr=127.0.0.1:PORT` line (and, when it was started with
//! `--front-listen`, the PostgreSQL front's from `PostgreSQL front listening … address=…`).
//! A [`Daemon`] is stopped with
//! SIGTERM (the daemon then stops postgres and removes its instance directory); if it is
//! dropped without [`Daemon::stop`] (an error, an interrupted run), `Drop` does the same,
//! blocking, so nothing the benchmark started outlives it.
//!
//! Every pid, and every instance directory once known, is appended to the pid file that
//! `bench/run.sh` reads in its exit trap, in case this process itself is killed.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::api::Api;
use crate::error::{BenchError, Result};

/// How long a daemon may take to log its address: generous, a cold start runs initdb.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a daemon may take to stop after SIGTERM (its own grace period is 30 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(40);
/// How often a stopping daemon is checked for exit.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// How long after the HTTP address the front's may still be logged (they are logged
/// moments apart, in either order).
const FRONT_TIMEOUT: Duration = Duration::from_secs(30);

/// Spawns daemons with the same binary, log directory and pid file.
#[derive(Debug)]
pub struct Launcher {
    /// The `pglease` binary.
    pub binary: PathBuf,
    /// Where each daemon's stderr goes (`<n>-<label>.log`).
    pub log_dir: PathBuf,
    /// Where pids and instance directories are recorded for the shell's exit trap.
    pub pid_file: Option<PathBuf>,
    /// Arguments appended to every daemon's command line (`--daemon-arg`), to measure a
    /// configuration other than the defaults.
    pub extra_args: Vec<String>,
    started: AtomicUsize,
    /// The last `server_version` a daemon reported, for the machine section.
    postgres_version: Arc<Mutex<String>>,
}

impl Launcher {
    /// A launcher; the log directory is created if missing.
    pub fn new(binary: PathBuf, log_dir: PathBuf, pid_file: Option<PathBuf>) -> Result<Self> {
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| BenchError::io(format!("cannot create {}", log_dir.display()), e))?;
        Ok(Launcher {
            binary,
            log_dir,
            pid_file,
            extra_args: Vec::new(),
            started: AtomicUsize::new(0),
            postgres_version: Arc::default(),
        })
    }

    /// The `server_version` of the daemons' postgres, once one reported it.
    pub fn postgres_version(&self) -> String {
        self.postgres_version
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Spawns `pglease serve --listen 127.0.0.1:0 ARGS…` and waits for its address.
    /// `label` names the log file.
    pub async fn start(&self, label: &str, args: &[String]) -> Result<Daemon> {
        let number = self.started.fetch_add(1, Ordering::Relaxed) + 1;
        let log_path = self.log_dir.join(format!("{number:02}-{label}.log"));
        let mut log = tokio::fs::File::create(&log_path)
            .await
            .map_err(|e| BenchError::io(format!("cannot create {}", log_path.display()), e))?;
        let mut command = Command::new(&self.binary);
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Plain log lines whatever the caller's environment says.
            // PGLEASE_BENCH_LOG sets the daemons' log filter (e.g. pglease_pool=debug to
            // see each clone's and drop's duration); info by default.
            .env(
                "RUST_LOG",
                std::env::var("PGLEASE_BENCH_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("NO_COLOR")
            .kill_on_drop(false);
        let spawned_at = Instant::now();
        let mut child = command
            .spawn()
            .map_err(|e| BenchError::io(format!("cannot start {}", self.binary.display()), e))?;
        let pid = child
            .id()
            .ok_or_else(|| BenchError::Daemon("the daemon exited at once".into()))?;
        self.record(&format!("pid {pid}"));
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| BenchError::Daemon("no stderr pipe".into()))?;
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel::<SocketAddr>();
        let (front_tx, front_rx) = tokio::sync::watch::channel(None);
        // Copies every line to the log file; hands over the addresses when they appear.
        // Ends at EOF, i.e. when the daemon exits (which drops `front_tx`: a daemon that
        // never logged its front is then known not to have one).
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut addr_tx = Some(addr_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if addr_tx.is_some() {
                    if let Some(addr) = listening_addr(&line) {
                        if let Some(tx) = addr_tx.take() {
                            let _ = tx.send(addr);
                        }
                    }
                }
                if front_tx.borrow().is_none() {
                    if let Some(addr) = front_addr(&line) {
                        front_tx.send_replace(Some(addr));
                    }
                }
                let _ = log.write_all(line.as_bytes()).await;
                let _ = log.write_all(b"\n").await;
            }
            let _ = log.flush().await;
        });
        let mut daemon = Daemon {
            child: Some(child),
            pid,
            label: label.to_string(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            front: front_rx,
            api: None,
            spawned_at,
            listening_after: Duration::ZERO,
            log_path: log_path.clone(),
            pid_file: self.pid_file.clone(),
            postgres_version: Arc::clone(&self.postgres_version),
        };
        // Dropping `daemon` on an error below stops the process.
        let addr = match tokio::time::timeout(LISTEN_TIMEOUT, addr_rx).await {
            Ok(Ok(addr)) => addr,
            Ok(Err(_)) => {
                let status = daemon.wait_exit(Duration::from_secs(5)).await;
                return Err(BenchError::Daemon(format!(
                    "daemon {label} exited before listening ({status}); log: {}\n{}",
                    log_path.display(),
                    tail(&log_path, 12)
                )));
            }
            Err(_) => {
                return Err(BenchError::Daemon(format!(
                    "daemon {label} did not log its address within {}s; log: {}",
                    LISTEN_TIMEOUT.as_secs(),
                    log_path.display()
                )))
            }
        };
        daemon.listening_after = spawned_at.elapsed();
        daemon.addr = addr;
        daemon.api = Some(Api::new(addr)?);
        Ok(daemon)
    }

    /// Appends a line to the pid file; failures only warn (the file is a safety net).
    fn record(&self, line: &str) {
        record(self.pid_file.as_deref(), line);
    }
}

/// Appends `line` to the pid file `bench/run.sh` reads in its exit trap; failures only warn.
pub fn record(pid_file: Option<&Path>, line: &str) {
    let Some(path) = pid_file else { return };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| writeln!(file, "{line}"));
    if let Err(error) = written {
        eprintln!("[bench] warning: cannot write {}: {error}", path.display());
    }
}

/// The address in a `listening` log line: the token after `addr=`.
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("listening") {
        return None;
    }
    let start = line.find("addr=")? + "addr=".len();
    let token = line[start..].split_whitespace().next()?;
    token.trim_matches('"').parse().ok()
}

/// The PostgreSQL front's address in its `PostgreSQL front listening on …` log line: the
/// token after `address=` (the line says `address=`, not `addr=`, so that
/// [`listening_addr`] never takes it for the HTTP API's).
pub fn front_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("PostgreSQL front listening") {
        return None;
    }
    let start = line.find("address=")? + "address=".len();
    let token = line[start..].split_whitespace().next()?;
    token.trim_matches('"').parse().ok()
}

/// The last `lines` lines of a log file, for error messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Where a daemon's postgres is, read from `/status`.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// The private unix socket directory, `<instance_dir>/socket`.
    pub socket_dir: PathBuf,
    /// The port (TCP and the socket's file name).
    pub port: u16,
    /// `server_version`.
    pub version: String,
    /// The unsafe settings the daemon read back from the server.
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// The daemon's pid, whose postgres is this server (for CPU by process).
    pub daemon_pid: u32,
}

/// Memory of the daemon process (not postgres), from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Memory {
    /// Resident set size now, KiB.
    pub rss_kib: u64,
    /// Peak resident set size, KiB.
    pub hwm_kib: u64,
}

/// A running `pglease serve`.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pid: u32,
    /// The label it was started with.
    pub label: String,
    /// Its HTTP address.
    pub addr: SocketAddr,
    /// Its PostgreSQL front's address, once logged (`--front-listen`).
    front: tokio::sync::watch::Receiver<Option<SocketAddr>>,
    api: Option<Api>,
    /// When the process was spawned.
    pub spawned_at: Instant,
    /// From spawn to the `listening` log line.
    pub listening_after: Duration,
    /// Its stderr.
    pub log_path: PathBuf,
    pid_file: Option<PathBuf>,
    postgres_version: Arc<Mutex<String>>,
}

impl Daemon {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A client of its API.
    pub fn api(&self) -> Result<&Api> {
        self.api
            .as_ref()
            .ok_or_else(|| BenchError::Daemon(format!("daemon {} is not listening", self.label)))
    }

    /// The address of its PostgreSQL front: an error when it was not started with
    /// `--front-listen`, or did not log the front's address.
    pub async fn front_addr(&self) -> Result<SocketAddr> {
        let mut front = self.front.clone();
        let logged = tokio::time::timeout(FRONT_TIMEOUT, front.wait_for(Option::is_some)).await;
        match logged {
            Ok(Ok(addr)) => (*addr).ok_or_else(|| BenchError::Daemon("no front address".into())),
            _ => Err(BenchError::Daemon(format!(
                "daemon {} logged no PostgreSQL front address (`PostgreSQL front listening`); log: {}",
                self.label,
                self.log_path.display()
            ))),
        }
    }

    /// Reads `/status` and works out where postgres is; records the instance directory
    /// in the pid file.
    pub async fn server_info(&self) -> Result<ServerInfo> {
        let status = self.api()?.status().await?;
        let data_dir = status
            .postgres
            .data_dir
            .ok_or_else(|| BenchError::Daemon("/status has no postgres.data_dir".into()))?;
        // The cluster is in the instance directory, or in its copy-on-write store `cow/`.
        let instance_dir = Path::new(&data_dir)
            .parent()
            .map(|dir| match dir.file_name() {
                Some(name) if name == "cow" => dir.parent().unwrap_or(dir),
                _ => dir,
            })
            .map(Path::to_path_buf)
            .ok_or_else(|| BenchError::Daemon(format!("data_dir {data_dir} has no parent")))?;
        record(
            self.pid_file.as_deref(),
            &format!("dir {}", instance_dir.display()),
        );
        let version = status.postgres.version.clone().unwrap_or_default();
        if let Ok(mut shared) = self.postgres_version.lock() {
            shared.clone_from(&version);
        }
        Ok(ServerInfo {
            daemon_pid: self.pid,
            socket_dir: instance_dir.join("socket"),
            port: status
                .postgres
                .port
                .ok_or_else(|| BenchError::Daemon("/status has no postgres.port".into()))?,
            version,
            settings: status.postgres.settings,
        })
    }

    /// VmRSS and VmHWM of the daemon process.
    pub fn memory(&self) -> Result<Memory> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| BenchError::io(format!("cannot read {path}"), e))?;
        let field = |name: &str| -> Option<u64> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        match (field("VmRSS:"), field("VmHWM:")) {
            (Some(rss_kib), Some(hwm_kib)) => Ok(Memory { rss_kib, hwm_kib }),
            _ => Err(BenchError::Other(format!("no VmRSS/VmHWM in {path}"))),
        }
    }

    /// Stops it: SIGTERM, then waits for the exit (SIGKILL after [`STOP_TIMEOUT`]).
    /// Returns how long it took to exit.
    pub async fn stop(mut self) -> Result<Duration> {
        let started = Instant::now();
        self.signal(Signal::SIGTERM);
        let status = self.wait_exit(STOP_TIMEOUT).await;
        if self.child.is_some() {
            self.signal(Signal::SIGKILL);
            let _ = self.wait_exit(Duration::from_secs(5)).await;
            return Err(BenchError::Daemon(format!(
                "daemon {} did not stop within {}s of SIGTERM; killed; log: {}",
                self.label,
                STOP_TIMEOUT.as_secs(),
                self.log_path.display()
            )));
        }
        if !status.contains("exit status: 0") {
            eprintln!(
                "[bench] warning: daemon {} stopped with {status}; log: {}",
                self.label,
                self.log_path.display()
            );
        }
        Ok(started.elapsed())
    }

    fn signal(&self, signal: Signal) {
        if self.child.is_some() {
            if let Ok(pid) = i32::try_from(self.pid) {
                let _ = kill(Pid::from_raw(pid), signal);
            }
        }
    }

    /// Waits up to `limit` for the process to exit; on exit the child is reaped and
    /// forgotten. Returns the exit status as text.
    async fn wait_exit(&mut self, limit: Duration) -> String {
        let Some(child) = self.child.as_mut() else {
            return "already reaped".into();
        };
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(Ok(status)) => {
                self.child = None;
                status.to_string()
            }
            Ok(Err(error)) => format!("wait failed: {error}"),
            Err(_) => "still running".into(),
        }
    }
}

impl Drop for Daemon {
    /// The error path: SIGTERM and a blocking wait, SIGKILL as the last resort.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        eprintln!("[bench] stopping daemon {} (pid {})", self.label, self.pid);
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(EXIT_POLL),
            }
        }
        eprintln!("[bench] daemon {} ignored SIGTERM; killing it", self.label);
        let _ = child.start_kill();
        let _ = child.try_wait();
    }
}

#[cfg(test)]
mod tests {
    use super::{front_addr, listening_addr};

    #[test]
    fn reads_the_address_of_the_listening_line() {
        let line = "2026-11-21T20:26:20.535477Z  INFO pglease: listening; lease with: \
                    curl -X POST http://127.0.0.1:35003/lease addr=127.0.0.1:35003";
        assert_eq!(
            listening_addr(line).map(|a| a.port()),
            Some(35003),
            "address of {line}"
        );
        assert_eq!(listening_addr("INFO pool started addr=127.0.0.1:1"), None);
        assert_eq!(listening_addr("listening without an address"), None);
    }

    #[test]
    fn reads_the_front_address_and_never_takes_it_for_the_api() {
        let line = "2026-11-26T20:00:00.000000Z  INFO pglease::listen: PostgreSQL front listening \
                    on 127.0.0.1:41234; try: psql -h 127.0.0.1 -p 41234 default address=127.0.0.1:41234";
        assert_eq!(front_addr(line).map(|a| a.port()), Some(41234), "{line}");
        assert_eq!(listening_addr(line), None, "{line}");
        let api = "INFO pglease: listening; lease with: curl … addr=127.0.0.1:35003";
        assert_eq!(front_addr(api), None);
    }
}
