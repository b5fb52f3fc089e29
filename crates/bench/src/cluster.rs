//! Raw postgres clusters that pglease does not manage, for scenario 6's baselines: the
//! stock postgres on disk and the hand-tuned one on tmpfs. A [`Cluster`] owns one base
//! directory (`data/`, `socket/`), runs initdb in it, and starts and stops `postgres -D`
//! directly, as an unprivileged OS user when the benchmark runs as root (`postgres`, else
//! `nobody`, like pglease itself). The server's output goes to a log file in the run's
//! log directory.
//!
//! Nothing outlives the benchmark: [`Cluster::destroy`] stops the server (SIGINT, postgres'
//! fast shutdown; SIGQUIT and SIGKILL if it does not stop) and removes the base
//! directory; dropping a cluster without it (an error, an interrupted run) does the same,
//! blocking. Every base directory (`dir PATH`) and every postmaster (`server PID PATH`) is
//! written to the pid file, so `bench/run.sh`'s exit trap can clean up after a driver
//! that was killed. It does not tune anything: the caller passes every setting.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};
use tokio::process::{Child, Command};

use crate::admin::{self, Conn};
use crate::daemon::record;
use crate::error::{BenchError, Result};

/// How long a server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(50);
/// How long a fast shutdown may take: its checkpoint syncs every file it wrote, and on
/// a slow (shimmed) disk each sync costs milliseconds.
const STOP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long to wait after SIGQUIT before SIGKILL.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
/// `statfs` magic of ramfs (not among nix's constants).
const RAMFS_MAGIC: nix::sys::statfs::FsType = nix::sys::statfs::FsType(0x8584_58f6);

/// The OS user initdb and postgres run as.
#[derive(Debug, Clone)]
pub struct OsUser {
    /// Its name.
    pub name: String,
    /// `(uid, gid)` to switch to, when the benchmark is root.
    pub switch: Option<(u32, u32)>,
}

impl OsUser {
    /// As root: `postgres`, else `nobody` (postgres refuses to run as root). Otherwise the
    /// current user.
    pub fn resolve() -> Result<OsUser> {
        let euid = nix::unistd::geteuid();
        if !euid.is_root() {
            let name = User::from_uid(euid)
                .ok()
                .flatten()
                .map_or_else(|| euid.to_string(), |user| user.name);
            return Ok(OsUser { name, switch: None });
        }
        let lookup = |name: &str| User::from_name(name).ok().flatten();
        let user = lookup("postgres")
            .or_else(|| lookup("nobody"))
            .filter(|user| !user.uid.is_root())
            .ok_or_else(|| {
                BenchError::Other(
                    "running as root, but there is no `postgres` or `nobody` user to run postgres as"
                        .into(),
                )
            })?;
        Ok(OsUser {
            name: user.name,
            switch: Some((user.uid.as_raw(), user.gid.as_raw())),
        })
    }

    /// Hands `path` to this user (nothing to do when not switching).
    fn chown(&self, path: &Path) -> Result<()> {
        match self.switch {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| BenchError::io(format!("cannot chown {}", path.display()), e)),
            None => Ok(()),
        }
    }
}

/// Removes from `command`'s environment what must never reach a server
/// (`pglease_pool::postgres::SCRUBBED_ENV`: libpq's and the server's defaults, systemd's;
/// pglease's own server gets none of them, as it gets only `PATH` and the locale), so the
/// baselines start as pglease's server does, and pgbench goes where it is told. Also
/// `LD_PRELOAD`: a preload inherited from the caller would slow one baseline and not
/// another; the stock server gets the fsync shim only where the benchmark sets it.
pub(crate) fn scrub_env(command: &mut Command) {
    for name in pglease_pool::postgres::SCRUBBED_ENV
        .iter()
        .chain(&["LD_PRELOAD"])
    {
        command.env_remove(name);
    }
}

/// The file system a path is on: its name, and whether it lives in memory.
pub fn filesystem(path: &Path) -> Result<(String, bool)> {
    use nix::sys::statfs::{self, FsType};
    let stat = statfs::statfs(path)
        .map_err(|e| BenchError::io(format!("cannot statfs {}", path.display()), e.into()))?;
    let kind = stat.filesystem_type();
    let known: &[(FsType, &str)] = &[
        (statfs::TMPFS_MAGIC, "tmpfs"),
        (statfs::EXT4_SUPER_MAGIC, "ext4"),
        (statfs::XFS_SUPER_MAGIC, "xfs"),
        (statfs::BTRFS_SUPER_MAGIC, "btrfs"),
        (statfs::OVERLAYFS_SUPER_MAGIC, "overlay"),
        (statfs::NFS_SUPER_MAGIC, "nfs"),
        (statfs::FUSE_SUPER_MAGIC, "fuse"),
    ];
    let in_memory = kind == statfs::TMPFS_MAGIC || kind == RAMFS_MAGIC;
    let name = known
        .iter()
        .find(|(magic, _)| *magic == kind)
        .map(|(_, name)| name.to_string())
        .unwrap_or_else(|| {
            if in_memory {
                "ramfs".into()
            } else {
                format!("statfs type {:#x}", kind.0)
            }
        });
    Ok((name, in_memory))
}

/// A running postmaster.
#[derive(Debug)]
struct Server {
    child: Child,
    pid: u32,
}

/// One initialised cluster in its own base directory, with at most one server running.
#[derive(Debug)]
pub struct Cluster {
    /// Name for messages and the log file.
    pub label: String,
    bin_dir: PathBuf,
    /// Holds `data/` and `socket/`; removed with the cluster.
    pub base_dir: PathBuf,
    /// The data directory.
    pub data_dir: PathBuf,
    socket_dir: PathBuf,
    /// The server's stdout and stderr (appended to by every start).
    pub log_path: PathBuf,
    user: OsUser,
    pid_file: Option<PathBuf>,
    port: u16,
    server: Option<Server>,
    removed: bool,
}

impl Cluster {
    /// Creates `base_dir` (which must not exist) and runs initdb in it:
    /// `--username=postgres --auth=trust --encoding=UTF8 --locale=C`, as pglease does,
    /// plus `--nosync` when `nosync`. The server log goes to `log_path`.
    pub async fn init(
        label: &str,
        bin_dir: &Path,
        base_dir: PathBuf,
        log_path: PathBuf,
        pid_file: Option<PathBuf>,
        nosync: bool,
    ) -> Result<Cluster> {
        let user = OsUser::resolve()?;
        std::fs::create_dir(&base_dir)
            .map_err(|e| BenchError::io(format!("cannot create {}", base_dir.display()), e))?;
        record(pid_file.as_deref(), &format!("dir {}", base_dir.display()));
        let cluster = Cluster {
            label: label.to_string(),
            bin_dir: bin_dir.to_path_buf(),
            data_dir: base_dir.join("data"),
            socket_dir: base_dir.join("socket"),
            base_dir,
            log_path,
            user,
            pid_file,
            port: 0,
            server: None,
            removed: false,
        };
        // From here on, dropping `cluster` on an error removes the base directory.
        cluster.user.chown(&cluster.base_dir)?;
        std::fs::create_dir(&cluster.socket_dir).map_err(|e| {
            BenchError::io(format!("cannot create {}", cluster.socket_dir.display()), e)
        })?;
        cluster.user.chown(&cluster.socket_dir)?;
        let mut command = cluster.command("initdb");
        command
            .arg("-D")
            .arg(&cluster.data_dir)
            .args([
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if nosync {
            command.arg("--nosync");
        }
        let output = command
            .output()
            .await
            .map_err(|e| BenchError::io("cannot run initdb", e))?;
        if !output.status.success() {
            return Err(BenchError::Other(format!(
                "initdb of the {label} cluster in {} failed ({}): {}",
                cluster.data_dir.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(cluster)
    }

    /// A command for one of the server binaries, as the cluster's user, in the base
    /// directory, without the caller's libpq variables or preloads.
    fn command(&self, binary: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(binary));
        command
            .current_dir(&self.base_dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        scrub_env(&mut command);
        if let Some((uid, gid)) = self.user.switch {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// The OS user the server runs as.
    pub fn os_user(&self) -> &str {
        &self.user.name
    }

    /// The server's TCP port (on 127.0.0.1) once started.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid while it runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        self.server.as_ref().map(|server| server.pid)
    }

    /// Starts `postgres -D data` on a free port of 127.0.0.1 and the cluster's socket
    /// directory, with `settings` as `-c key=value` and `env` added to its environment,
    /// and waits until it accepts connections.
    pub async fn start(
        &mut self,
        settings: &[(String, String)],
        env: &[(String, String)],
    ) -> Result<()> {
        if self.server.is_some() {
            return Err(BenchError::Other(format!(
                "the {} cluster is already running",
                self.label
            )));
        }
        self.port = free_port()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| BenchError::io(format!("cannot open {}", self.log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| BenchError::io("cannot duplicate the log file", e))?;
        let mut command = self.command("postgres");
        command.arg("-D").arg(&self.data_dir);
        let mut all: Vec<(String, String)> = vec![
            ("port".into(), self.port.to_string()),
            ("listen_addresses".into(), "127.0.0.1".into()),
            (
                "unix_socket_directories".into(),
                self.socket_dir.display().to_string(),
            ),
        ];
        all.extend(settings.iter().cloned());
        for (key, value) in &all {
            command.arg("-c").arg(format!("{key}={value}"));
        }
        for (key, value) in env {
            command.env(key, value);
        }
        // A process group of its own: a terminal's Ctrl-C reaches the driver, which
        // then stops this server in order, rather than postgres directly.
        command
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .process_group(0)
            // Stopped explicitly, with SIGINT; never killed just because a handle went.
            .kill_on_drop(false);
        let child = command
            .spawn()
            .map_err(|e| BenchError::io(format!("cannot start postgres ({})", self.label), e))?;
        let pid = child
            .id()
            .ok_or_else(|| BenchError::Other("postgres exited at once".into()))?;
        record(
            self.pid_file.as_deref(),
            &format!("server {pid} {}", self.base_dir.display()),
        );
        self.server = Some(Server { child, pid });
        self.wait_ready().await
    }

    /// Polls a superuser connection until one succeeds, checking that the server lives.
    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Ok(conn) = self.superuser("postgres").await {
                conn.close().await;
                return Ok(());
            }
            let exited = match self.server.as_mut() {
                Some(server) => server.child.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                self.server = None;
                return Err(BenchError::Other(format!(
                    "postgres ({}) exited while starting ({status}); log: {}",
                    self.label,
                    self.log_path.display()
                )));
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(BenchError::Other(format!(
                    "postgres ({}) did not accept connections within {}s; log: {}",
                    self.label,
                    READY_TIMEOUT.as_secs(),
                    self.log_path.display()
                )));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// The superuser over the unix socket (trust).
    pub async fn superuser(&self, dbname: &str) -> Result<Conn> {
        let config = admin::socket_config(&self.socket_dir, self.port, dbname);
        admin::connect_config(&config, &format!("superuser of the {} cluster", self.label)).await
    }

    /// Stops the server, if one runs: SIGINT (fast shutdown), then SIGQUIT and SIGKILL
    /// if it does not exit in time.
    pub async fn stop(&mut self) -> Result<()> {
        let Some(mut server) = self.server.take() else {
            return Ok(());
        };
        signal(server.pid, Signal::SIGINT);
        if let Ok(Ok(status)) = tokio::time::timeout(STOP_TIMEOUT, server.child.wait()).await {
            if !status.success() {
                eprintln!(
                    "[bench] warning: postgres ({}) stopped with {status}; log: {}",
                    self.label,
                    self.log_path.display()
                );
            }
            return Ok(());
        }
        signal(server.pid, Signal::SIGQUIT);
        if tokio::time::timeout(KILL_TIMEOUT, server.child.wait())
            .await
            .is_err()
        {
            let _ = server.child.start_kill();
            let _ = server.child.wait().await;
        }
        Err(BenchError::Other(format!(
            "postgres ({}) did not stop within {}s of SIGINT; stopped it harder; log: {}",
            self.label,
            STOP_TIMEOUT.as_secs(),
            self.log_path.display()
        )))
    }

    /// Stops the server and removes the base directory.
    pub async fn destroy(mut self) -> Result<()> {
        let stopped = self.stop().await;
        self.removed = true;
        let removed = std::fs::remove_dir_all(&self.base_dir)
            .map_err(|e| BenchError::io(format!("cannot remove {}", self.base_dir.display()), e));
        stopped.and(removed)
    }
}

impl Drop for Cluster {
    /// The error path: stops a running server, blocking, and removes the base directory.
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            eprintln!(
                "[bench] stopping postgres ({}, pid {})",
                self.label, server.pid
            );
            signal(server.pid, Signal::SIGINT);
            let mut exited = wait_blocking(&mut server.child, STOP_TIMEOUT);
            if !exited {
                signal(server.pid, Signal::SIGQUIT);
                exited = wait_blocking(&mut server.child, KILL_TIMEOUT);
            }
            if !exited {
                eprintln!(
                    "[bench] postgres ({}) ignored SIGQUIT; killing it",
                    self.label
                );
                let _ = server.child.start_kill();
                let _ = wait_blocking(&mut server.child, KILL_TIMEOUT);
            }
        }
        if !self.removed {
            let _ = std::fs::remove_dir_all(&self.base_dir);
        }
    }
}

/// Polls `child` for exit for up to `limit`; whether it exited.
fn wait_blocking(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn signal(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// A TCP port of 127.0.0.1 that is free now (the kernel's pick for port 0).
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::io("cannot find a free port", e))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| BenchError::io("cannot find a free port", e))
}

/// Whether the process `pid` has `library` mapped (read from `/proc/<pid>/maps`).
pub fn has_mapped(pid: u32, library: &Path) -> Result<bool> {
    let path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&path)
        .map_err(|e| BenchError::io(format!("cannot read {path}"), e))?;
    let wanted = library.display().to_string();
    Ok(maps.lines().any(|line| line.ends_with(&wanted)))
}
