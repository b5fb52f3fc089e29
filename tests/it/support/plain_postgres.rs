//! A stock postgres started by the test itself (not by pglease), for `--postgres-url`
//! tests: initdb with trust auth, run as the `postgres` OS user when we are root, from the
//! binaries the daemon would run (installed, cached or downloaded: `bin_dir`).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::PG_BIN_ENV;

/// A running stock postgres on 127.0.0.1, stopped and removed on drop.
pub struct PlainPostgres {
    child: Child,
    /// Its TCP port.
    pub port: u16,
    dir: PathBuf,
    /// The directory of the `postgres` and `initdb` it runs.
    pub bin_dir: PathBuf,
    /// Its extra `-c name=value` settings, for a restart.
    settings: Vec<String>,
}

/// The server binaries, found once per test process the way `pglease serve` finds its own
/// (pglease-binaries): [`PG_BIN_ENV`] if set, else an installed server (the newest), else
/// one in the daemon's default cache, else a download into that cache — so that the tests
/// run on a machine without PostgreSQL, like the daemon does.
fn bin_dir() -> PathBuf {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    BIN_DIR.get_or_init(resolve_bin_dir).clone()
}

fn resolve_bin_dir() -> PathBuf {
    let request = pglease_binaries::Request {
        bin_dir: std::env::var_os(PG_BIN_ENV).map(PathBuf::from),
        version: None,
        // The daemon's default, so that a download serves both and happens once a machine.
        cache_root: pglease_binaries::default_cache_root(),
        repository: pglease_binaries::DEFAULT_REPOSITORY.to_owned(),
        progress: std::sync::Arc::new(pglease_binaries::NoProgress),
    };
    // Tests call this from a tokio runtime, which refuses to block on another one: resolve
    // on a thread of its own.
    let resolved = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime to resolve the server binaries")
            .block_on(pglease_binaries::resolve(&request))
    })
    .join()
    .expect("resolving the server binaries panicked");
    match resolved {
        Ok(resolved) => resolved.bin_dir,
        Err(error) => panic!("no postgres for the plain server: {error}; set {PG_BIN_ENV}"),
    }
}

/// `(uid, gid)` of the user postgres must run as, when we are root.
fn run_as() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .or_else(|| nix::unistd::User::from_name("nobody").ok().flatten())
        .expect("a postgres or nobody user");
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

impl PlainPostgres {
    /// initdb and start; returns once it accepts TCP connections.
    pub fn start(name: &str) -> PlainPostgres {
        Self::start_with(name, &[])
    }

    /// initdb and start with extra `-c name=value` settings.
    pub fn start_with(name: &str, settings: &[&str]) -> PlainPostgres {
        let dir = PathBuf::from(format!(
            "/dev/shm/pglease-test-plain-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create dir");
        let user = run_as();
        if let Some((uid, gid)) = user {
            nix::unistd::chown(&dir, Some(uid.into()), Some(gid.into())).expect("chown");
        }
        let bin = bin_dir();
        let data = dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["--auth=trust", "--username=postgres", "--nosync"])
            .current_dir(&dir)
            .stdout(Stdio::null());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let status = initdb.status().expect("run initdb");
        assert!(status.success(), "initdb failed: {status}");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        let child = spawn_server(&bin, &dir, port, &settings);
        PlainPostgres {
            child,
            port,
            dir,
            bin_dir: bin,
            settings,
        }
    }

    /// Begins a smart shutdown, as `pg_ctl stop -m smart` does (a SIGTERM to the
    /// postmaster): the server keeps the sessions it has and refuses new ones (57P03) until
    /// they have all ended.
    pub fn begin_smart_shutdown(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .expect("SIGTERM to the plain postgres");
    }

    /// Whether the postmaster has exited (its shutdown finished).
    pub fn has_exited(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("wait for the plain postgres")
            .is_some()
    }

    /// Starts the server again on its data directory and port, once it has exited.
    pub fn restart(&mut self) {
        assert!(self.has_exited(), "restart: the plain postgres still runs");
        self.child = spawn_server(&self.bin_dir, &self.dir, self.port, &self.settings);
    }

    /// Superuser URL.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A superuser connection.
    pub async fn connect(&self) -> tokio_postgres::Client {
        // The postmaster accepts TCP a moment before it accepts logins.
        let started = Instant::now();
        loop {
            match tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    return client;
                }
                Err(error) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "cannot connect: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Starts postgres on `dir`'s data directory with `settings`; returns once it accepts TCP
/// connections on `port`.
fn spawn_server(
    bin: &std::path::Path,
    dir: &std::path::Path,
    port: u16,
    settings: &[String],
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .expect("log file");
    let mut postgres = Command::new(bin.join("postgres"));
    postgres
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
        .args(settings.iter().flat_map(|setting| ["-c", setting]))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log);
    if let Some((uid, gid)) = run_as() {
        postgres.uid(uid).gid(gid);
    }
    let child = postgres.spawn().expect("spawn postgres");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "plain postgres did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

impl Drop for PlainPostgres {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let _ = self.child.wait();
        if std::thread::panicking() {
            // The test failed: what the server said is often why.
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "last lines of the plain postgres' log:\n{}",
                tail.join("\n")
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
