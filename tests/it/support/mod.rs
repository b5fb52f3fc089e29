//! Test support: `TestDaemon` runs the daemon — in this process by default (the library's
//! `pglease::Daemon`, with a real postgres; `in_process.rs`), or as the real `pglease`
//! binary when a test needs a process (`.process()`, or an environment, working directory
//! or wrapper of its own) — and offers small HTTP and SQL helpers; `poll_until` waits for a
//! condition without bare sleeps.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub mod disk_full;
mod in_process;
pub mod notify_queue;
mod plain_postgres;
pub use plain_postgres::PlainPostgres;
pub mod tls;

/// The environment variable naming the postgres bin directory (else the daemon's discovery).
pub const PG_BIN_ENV: &str = "PGLEASE_PG_BIN_DIR";

/// Set (to anything): every test runs the binary, none the daemon in process; to compare
/// the two, or to rule the in-process start out when a test fails.
pub const ALL_PROCESSES_ENV: &str = "PGLEASE_TEST_PROCESSES";

/// How long a daemon may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A shared initdb cache for all tests, so only the first start pays for initdb.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pglease-initdb-cache")
}

/// A fresh scratch directory for one test, as its real path: the daemon and the commands it
/// starts see the directory as it is (their `$PWD`, their paths in messages), and `target/`
/// may be a link (CI's shared target directory, `.ci/run`).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("scratch")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    std::fs::canonicalize(&dir).expect("the scratch dir's real path")
}

/// The `pglease` binary under test, without the variables that pick a template or a
/// config file: the tester's own must not change what a test runs.
pub fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pglease"));
    for name in testers_own_env() {
        command.env_remove(name);
    }
    command
}

/// The variables the CLI reads in place of a flag (`PGLEASE_TOKEN`, `PGLEASE_CONFIG`, …),
/// from its clap definition: the tester's own must not change what a test runs. A test
/// gives a daemon its own with [`DaemonBuilder::env`].
fn testers_own_env() -> Vec<String> {
    fn collect(command: &clap::Command, names: &mut Vec<String>) {
        for arg in command.get_arguments() {
            if let Some(name) = arg.get_env() {
                names.push(name.to_string_lossy().into_owned());
            }
        }
        for sub in command.get_subcommands() {
            collect(sub, names);
        }
    }
    let mut names = Vec::new();
    collect(
        &<pglease::cli::Cli as clap::CommandFactory>::command(),
        &mut names,
    );
    names.sort();
    names.dedup();
    names
}

/// Builds and starts a daemon.
pub struct DaemonBuilder {
    args: Vec<String>,
    /// Leave out `--cache-dir`: the daemon uses its default cache root.
    default_cache: bool,
    /// Leave out `--pg-bin-dir` even when [`PG_BIN_ENV`] is set.
    no_pg_bin_dir: bool,
    /// A program (and its arguments) that runs `pglease serve ...` (appended to it).
    wrapper: Vec<String>,
    /// Environment variables for the daemon.
    envs: Vec<(String, String)>,
    /// The API token (`--token`), which [`TestDaemon::http`] then sends with every request.
    token: Option<String>,
    /// The daemon's working directory [default: the test's].
    current_dir: Option<PathBuf>,
    /// Run the binary even where the daemon could run in this process.
    process: bool,
}

/// The IntegreSQL clients' role of the tests that use one: `dbuser`/`dbpass`, the names
/// IntegreSQL's own setups use.
pub const INTEGRESQL_ROLE_ARGS: [&str; 4] = [
    "--integresql-pg-user",
    "dbuser",
    "--integresql-pg-password",
    "dbpass",
];

impl DaemonBuilder {
    /// Adds command-line arguments after `serve`.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Uses the daemon's default cache root (initdb results, downloaded binaries) instead
    /// of the tests' own: downloads then survive across runs, as CI expects.
    pub fn default_cache(mut self) -> Self {
        self.default_cache = true;
        self
    }

    /// Passes no `--pg-bin-dir`, so that the daemon resolves the binaries itself.
    pub fn no_pg_bin_dir(mut self) -> Self {
        self.no_pg_bin_dir = true;
        self
    }

    /// Runs the daemon through `program args... <pglease> serve ...` (which must exec it,
    /// so that the child's pid is the daemon's).
    pub fn wrapped_in<I, S>(mut self, program: &str, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.wrapper = std::iter::once(program.to_owned())
            .chain(args.into_iter().map(Into::into))
            .collect();
        self
    }

    /// Sets an environment variable of the daemon.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Guards the API with `token` given in the daemon's environment (`PGLEASE_TOKEN`),
    /// not on its command line; the daemon's [`TestDaemon::http`] sends it.
    pub fn token_in_env(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self.env("PGLEASE_TOKEN", token)
    }

    /// Runs the daemon in `dir` (where it looks for `pglease.toml`).
    pub fn current_dir(mut self, dir: &Path) -> Self {
        self.current_dir = Some(dir.to_path_buf());
        self
    }

    /// Guards the API with `token` (`--token`); the daemon's [`TestDaemon::http`] sends it.
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self.args(["--token", token])
    }

    /// Runs the real binary rather than the daemon in this process: for tests of what only
    /// a process has (its pid, signals, kill -9, its exit code and output, systemd).
    pub fn process(mut self) -> Self {
        self.process = true;
        self
    }

    /// Whether this daemon must be a process: asked for, or given what only a process can
    /// have (environment variables, a working directory, a wrapper program). Also when the
    /// tester's environment picks a template or a config file: an in-process daemon's clap
    /// would read those, while [`binary`] takes them out of a process's environment.
    fn needs_process(&self) -> bool {
        std::env::var_os(ALL_PROCESSES_ENV).is_some()
            || testers_own_env()
                .iter()
                .any(|name| std::env::var_os(name).is_some())
            || self.process
            || !self.wrapper.is_empty()
            || !self.envs.is_empty()
            || self.current_dir.is_some()
    }

    /// Starts the daemon and waits until it listens.
    pub async fn start(self) -> TestDaemon {
        if self.needs_process() {
            return self.spawn().listening().await;
        }
        let log = in_process::Log::default();
        let mut args = vec!["pglease".to_owned(), "serve".to_owned()];
        args.extend(self.serve_args());
        let (daemon, addr) =
            match in_process::InProcess::start(args, Arc::clone(&log), START_TIMEOUT).await {
                Ok(started) => started,
                Err(message) => panic!(
                    "pglease did not start listening ({message}); set {PG_BIN_ENV} if postgres \
                     is not found. Log:\n{}",
                    log.lock().expect("log lock").join("\n")
                ),
            };
        TestDaemon {
            base: format!("http://{addr}"),
            runner: Some(Runner::InProcess(daemon)),
            log,
            http: http_client(self.token.as_deref()),
            token: self.token,
        }
    }

    /// Starts the daemon and returns at once, for tests that watch what it logs while it
    /// starts ([`StartingDaemon::wait_for_log`]).
    pub fn spawn(self) -> StartingDaemon {
        let mut child = self.command().spawn().expect("spawn pglease");
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("stderr piped");
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening") {
                    if let Some(addr) = line.split("addr=").nth(1) {
                        let _ =
                            addr_tx.send(addr.split_whitespace().next().unwrap_or("").to_owned());
                    }
                }
                sink.lock().expect("log lock").push(line);
            }
        });
        StartingDaemon {
            child: Some(child),
            log,
            addr_rx: Some(addr_rx),
            token: self.token,
        }
    }

    /// Runs the daemon to completion (for start-up failures); returns status and log. A
    /// daemon that is still running after [`START_TIMEOUT`] twice over did not fail to
    /// start: it is killed, and the test fails saying so.
    pub fn run_to_exit(self) -> (ExitStatus, String) {
        let mut child = self
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run pglease");
        let mut stderr = child.stderr.take().expect("stderr piped");
        let reader = std::thread::spawn(move || {
            let mut log = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
            log
        });
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for pglease") {
                break status;
            }
            if started.elapsed() > START_TIMEOUT * 2 {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "pglease was expected to exit and was still running after {:?}; log:\n{}",
                    START_TIMEOUT * 2,
                    reader.join().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status, reader.join().unwrap_or_default())
    }

    /// The arguments after `serve`, the same for the binary and the daemon in process.
    fn serve_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if !self.args.iter().any(|a| a == "--listen") {
            args.extend(["--listen".to_owned(), "127.0.0.1:0".to_owned()]);
        }
        if !self.default_cache {
            args.push("--cache-dir".to_owned());
            args.push(cache_dir().display().to_string());
        }
        // A test that picks its binaries itself keeps its choice.
        let picks_binaries = self.no_pg_bin_dir
            || self
                .args
                .iter()
                .any(|a| a == "--pg-bin-dir" || a == "--postgres-version");
        if let (Ok(bin_dir), false) = (std::env::var(PG_BIN_ENV), picks_binaries) {
            args.extend(["--pg-bin-dir".to_owned(), bin_dir]);
        }
        args.extend(self.args.iter().cloned());
        args
    }

    fn command(&self) -> Command {
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(env!("CARGO_BIN_EXE_pglease"));
                command
            }
            None => binary(),
        };
        command.arg("serve").args(self.serve_args());
        if let Some(dir) = &self.current_dir {
            command.current_dir(dir);
        }
        // The tester's own variables must not change what a test runs (the wrapper's
        // command did not come from `binary`).
        for name in testers_own_env() {
            command.env_remove(name);
        }
        command
            .envs(self.envs.iter().map(|(key, value)| (key, value)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }
}

/// A daemon spawned by [`DaemonBuilder::spawn`] that may not listen yet.
pub struct StartingDaemon {
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    /// The address from the "listening" line, once the daemon logs it.
    addr_rx: Option<std::sync::mpsc::Receiver<String>>,
    token: Option<String>,
}

impl StartingDaemon {
    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        self.log.lock().expect("log lock").join("\n")
    }

    /// Waits until a line of the log satisfies `found`. Fails the test, with the log, if
    /// the daemon exits first or nothing matches within [`START_TIMEOUT`].
    pub async fn wait_for_log(&mut self, what: &str, found: impl Fn(&str) -> bool) {
        let started = Instant::now();
        loop {
            if self
                .log
                .lock()
                .expect("log lock")
                .iter()
                .any(|line| found(line))
            {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "pglease exited ({status}) before logging {what}. Log:\n{}",
                    self.log()
                );
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "pglease did not log {what} within {START_TIMEOUT:?}. Log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the daemon listens.
    pub async fn listening(mut self) -> TestDaemon {
        let addr_rx = self.addr_rx.take().expect("not waited for yet");
        let addr = tokio::task::spawn_blocking(move || addr_rx.recv_timeout(START_TIMEOUT))
            .await
            .expect("join");
        let mut child = self.child.take().expect("running");
        let addr = match addr {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "pglease did not start listening; set {PG_BIN_ENV} if postgres is not found. Log:\n{}",
                    self.log()
                );
            }
        };
        TestDaemon {
            base: format!("http://{addr}"),
            runner: Some(Runner::Process(child)),
            log: Arc::clone(&self.log),
            http: http_client(self.token.as_deref()),
            token: self.token.take(),
        }
    }
}

/// An HTTP client that sends `token`, when there is one, with every request.
fn http_client(token: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        let bearer = format!("Bearer {token}").parse().expect("a header value");
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("an HTTP client")
}

/// How a [`TestDaemon`] runs.
enum Runner {
    /// The `pglease` binary.
    Process(Child),
    /// `pglease::Daemon` on a runtime of its own in this process.
    InProcess(in_process::InProcess),
}

impl Drop for StartingDaemon {
    fn drop(&mut self) {
        // A test that failed before the daemon listened stops it as `TestDaemon` does.
        if let Some(child) = self.child.take() {
            stop_child(child);
        }
    }
}

/// The answer to a request sent in the background.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Whether a Retry-After header came with it.
    pub retry_after: bool,
    /// The JSON body.
    pub body: Value,
}

/// A running `pglease serve`, in this process or as a process of its own.
pub struct TestDaemon {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    runner: Option<Runner>,
    log: Arc<Mutex<Vec<String>>>,
    /// An HTTP client (sending the token, when the daemon has one).
    pub http: reqwest::Client,
    /// The API token, if the daemon was started with one.
    pub token: Option<String>,
}

impl TestDaemon {
    /// A builder for a server of a PostgreSQL major that pglease fetches
    /// (`--postgres-version`), from the default cache, where downloads survive across runs.
    pub fn of_major(version: &str) -> DaemonBuilder {
        TestDaemon::builder()
            .args(["--postgres-version", version])
            .default_cache()
    }

    /// A builder with no extra arguments.
    pub fn builder() -> DaemonBuilder {
        DaemonBuilder {
            args: Vec::new(),
            default_cache: false,
            no_pg_bin_dir: false,
            wrapper: Vec::new(),
            envs: Vec::new(),
            token: None,
            current_dir: None,
            process: false,
        }
    }

    /// A daemon with default settings.
    pub async fn start() -> TestDaemon {
        Self::builder().start().await
    }

    /// The daemon's pid; only a daemon started with [`DaemonBuilder::process`] has one.
    pub fn pid(&self) -> u32 {
        match &self.runner {
            Some(Runner::Process(child)) => child.id(),
            Some(Runner::InProcess(_)) => {
                panic!("this daemon runs in the test process: start it with .process() for a pid")
            }
            None => panic!("the daemon has stopped"),
        }
    }

    /// The address of `--integresql-listen` (with port 0, the one it got), from the log.
    pub async fn integresql_address(&self) -> String {
        poll_until(
            Duration::from_secs(10),
            "the IntegreSQL address in the log",
            || async {
                self.log()
                    .lines()
                    .find(|l| l.contains("serving the IntegreSQL API"))
                    .and_then(|l| l.split("addr=").nth(1))
                    .map(|a| a.trim().to_owned())
            },
        )
        .await
    }

    /// The address of `--front-listen` (with port 0, the one it got), from the log line
    /// `PostgreSQL front listening on …` (`address=`).
    pub async fn front_address(&self) -> std::net::SocketAddr {
        poll_until(
            Duration::from_secs(10),
            "the PostgreSQL front's address in the log",
            || async {
                self.log()
                    .lines()
                    .find(|l| l.contains("PostgreSQL front listening"))
                    .and_then(|l| l.split("address=").nth(1))
                    .and_then(|a| a.trim().parse().ok())
            },
        )
        .await
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        self.log.lock().expect("log lock").join("\n")
    }

    /// `POST /lease` with a JSON body; returns status and body.
    pub async fn lease(&self, body: Value) -> (u16, Value) {
        self.send(self.http.post(format!("{}/lease", self.base)).json(&body))
            .await
    }

    /// `POST /lease` that must succeed.
    pub async fn lease_ok(&self, template: &str) -> Value {
        let (status, body) = self.lease(json!({ "template": template })).await;
        assert_eq!(status, 201, "lease failed: {body}");
        body
    }

    /// Sends `POST /lease` from a background task, for requests that are meant to wait.
    pub fn lease_in_background(&self, body: Value) -> tokio::task::JoinHandle<Answer> {
        let request = self.http.post(format!("{}/lease", self.base)).json(&body);
        tokio::spawn(async move {
            let response = request.send().await.expect("lease request");
            let status = response.status().as_u16();
            let retry_after = response.headers().contains_key("retry-after");
            let body = response.json().await.expect("json body");
            Answer {
                status,
                retry_after,
                body,
            }
        })
    }

    /// Waits until `count` requests wait for a database of `template`.
    pub async fn wait_for_waiting(&self, template: &str, count: u64) {
        poll_until(Duration::from_secs(10), "requests to wait", || async {
            (self.template_status(template).await["waiting"] == count).then_some(())
        })
        .await;
    }

    /// `PUT /templates/{name}` with a JSON body.
    pub async fn put_template(&self, name: &str, body: Value) -> (u16, Value) {
        self.send(
            self.http
                .put(format!("{}/templates/{name}", self.base))
                .json(&body),
        )
        .await
    }

    /// `DELETE /leases/{id}`.
    pub async fn release(&self, id: &str, reuse: bool) -> (u16, Value) {
        let url = format!("{}/leases/{id}?reuse={reuse}", self.base);
        self.send(self.http.delete(url)).await
    }

    /// The open leases `/status` shows.
    pub async fn open_leases(&self) -> Vec<Value> {
        self.status().await["leases"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `GET /status`.
    pub async fn status(&self) -> Value {
        let (status, body) = self.get("/status").await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// The status entry of one template.
    pub async fn template_status(&self, name: &str) -> Value {
        let status = self.status().await;
        status["templates"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == name).cloned())
            .unwrap_or_else(|| panic!("template {name} not in {status}"))
    }

    /// A GET of any path.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// Sends a request; returns status and body (JSON, or a string, or null).
    pub async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.send().await.expect("HTTP request");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, body)
    }

    /// Sends a signal to the daemon.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal daemon");
    }

    /// SIGTERM (or, in process, the same shutdown), then waits (up to 40 s) for the exit
    /// status: in process, the one the binary would exit with (0, else 1).
    pub async fn stop(mut self) -> ExitStatus {
        let timeout = Duration::from_secs(40);
        let status = match self.runner.take().expect("running") {
            Runner::Process(mut child) => {
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
                    .expect("signal daemon");
                tokio::task::spawn_blocking(move || wait_with_timeout(&mut child, timeout))
                    .await
                    .expect("join")
            }
            Runner::InProcess(mut daemon) => {
                tokio::task::spawn_blocking(move || daemon.stop_within(timeout))
                    .await
                    .expect("join")
            }
        };
        status.unwrap_or_else(|| panic!("pglease did not exit after SIGTERM. Log:\n{}", self.log()))
    }

    /// SIGTERM, then waits for the exit status; returns it with everything logged.
    pub async fn stop_with_log(self) -> (ExitStatus, String) {
        let log = Arc::clone(&self.log);
        let status = self.stop().await;
        // The reader thread may still hold the last lines for a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = log.lock().expect("log lock").join("\n");
        (status, log)
    }

    /// SIGKILL, and reap; only a daemon started with [`DaemonBuilder::process`] can be
    /// killed.
    pub fn kill(mut self) {
        match self.runner.take() {
            Some(Runner::Process(mut child)) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Some(Runner::InProcess(_)) => {
                panic!("this daemon runs in the test process: start it with .process() to kill it")
            }
            None => {}
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        // A failed test still stops its daemon cleanly, so no postgres or tmpfs dir is left
        // (an in-process daemon stops as its own value drops).
        if let Some(Runner::Process(child)) = self.runner.take() {
            stop_child(child);
        }
    }
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Polls `check` every 50 ms until it returns Some, or panics after `timeout` with `what`.
pub async fn poll_until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Connects with a lease's URL.
pub async fn connect(lease: &Value) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let url = lease["url"].as_str().expect("lease url");
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// True while a process with this pid exists (and is not a zombie we could not see reaped).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .split(") ")
            .nth(1)
            .is_some_and(|rest| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits until the lease's database no longer exists. pglease drops the database first
/// and then its role, and postgres checks the role before the database, so connecting
/// with the lease's credentials says either "database does not exist" or (once the role
/// is gone too) "password authentication failed".
pub async fn wait_until_dropped(lease: &Value, what: &str) {
    use tokio_postgres::error::SqlState;
    poll_until(Duration::from_secs(10), what, || async {
        match connect(lease).await {
            Err(e)
                if e.code() == Some(&SqlState::UNDEFINED_DATABASE)
                    || e.code() == Some(&SqlState::INVALID_PASSWORD) =>
            {
                Some(())
            }
            _ => None,
        }
    })
    .await;
}

/// Set by `.ci/run`: tools the tests use must be there, not skipped.
pub const REQUIRE_TOOLS: &str = "PGLEASE_REQUIRE_TOOLS";

/// The variable naming the Python the Python suites run with (the pytest plugin's, the Django
/// project's): one whose environment holds the plugin from this checkout, pytest, pytest-xdist,
/// psycopg, Django and pytest-django. `.ci/run` makes a venv for it (/opt/pglease-python);
/// without it, `python3`.
pub const TEST_PYTHON_ENV: &str = "PGLEASE_TEST_PYTHON";

/// What a machine needs for the Python suites (what `.ci/run` does).
pub const TEST_PYTHON_INSTALL: &str = "python3 -m venv /opt/pglease-python && \
     /opt/pglease-python/bin/pip install 'django>=5.2,<6' pytest-django 'pytest>=7' pytest-xdist \
     'psycopg[binary]' && /opt/pglease-python/bin/pip install --no-deps ./clients/python && \
     export PGLEASE_TEST_PYTHON=/opt/pglease-python/bin/python";

/// The Python named by [`TEST_PYTHON_ENV`], else `python3`.
pub fn test_python() -> String {
    std::env::var(TEST_PYTHON_ENV).unwrap_or_else(|_| "python3".to_owned())
}

/// Whether `program --version` runs. When it does not, the test is skipped with a loud
/// message — unless `REQUIRE_TOOLS` is set (CI), where a missing tool fails the test.
pub fn tool_available(program: &str, test: &str, install_hint: &str) -> bool {
    // `--version` for most tools, `version` for Go's.
    let found = ["--version", "version"].iter().any(|flag| {
        std::process::Command::new(program)
            .arg(flag)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found {
        assert!(
            std::env::var_os(REQUIRE_TOOLS).is_none(),
            "{program} is required here ({REQUIRE_TOOLS} is set): {install_hint}"
        );
        eprintln!(
            "SKIPPED {test}: {program} not installed ({install_hint}; bash .ci/run installs it)"
        );
    }
    found
}

/// A test's lease id, as a string.
pub fn id_of(lease: &Value) -> String {
    lease["id"].as_str().expect("lease id").to_owned()
}

/// Whether the daemon with process id `pid` is reading template sources: it runs a thread
/// of the name `child_user.rs` gives those.
pub fn reading_sources(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.trim() == "pglease-read-as")
        })
}

/// A daemon busy hashing a template's sources, for minutes: template `app`, an SQL file
/// grown to 64 GiB (sparse) after its first build, and a lease of it sent in the background,
/// whose check hashes the file again. Returns once the daemon reads it; remove the file
/// (the returned path) when done.
pub async fn daemon_hashing_a_huge_source(
    name: &str,
) -> (TestDaemon, tokio::task::JoinHandle<Answer>, PathBuf) {
    daemon_hashing_a_huge_source_with(name, &[]).await
}

/// [`daemon_hashing_a_huge_source`], the daemon started with `args` too.
pub async fn daemon_hashing_a_huge_source_with(
    name: &str,
    args: &[&str],
) -> (TestDaemon, tokio::task::JoinHandle<Answer>, PathBuf) {
    let dir = scratch_dir(name);
    let schema = dir.join("schema.sql");
    std::fs::write(&schema, "CREATE TABLE a (id int);").expect("write");
    // A process: whether it reads the sources shows in its own threads' names.
    let daemon = TestDaemon::builder()
        .args(["--template", &format!("app=sql:{}", schema.display())])
        .args(args.iter().copied())
        .process()
        .start()
        .await;
    daemon.lease_ok("app").await;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&schema)
        .and_then(|file| file.set_len(64 << 30))
        .expect("grow");
    let hashing = daemon.lease_in_background(json!({ "template": "app", "wait_ms": 60000 }));
    let pid = daemon.pid();
    poll_until(
        Duration::from_secs(10),
        "the daemon to start hashing the sources",
        || async move { reading_sources(pid).then_some(()) },
    )
    .await;
    (daemon, hashing, schema)
}

/// Stops a daemon a test leaves behind: SIGTERM, so it removes its postgres and tmpfs
/// directory, then SIGKILL if it has not exited within 20 s.
fn stop_child(mut child: std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    if wait_with_timeout(&mut child, Duration::from_secs(20)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The database a connection is in.
pub async fn current_database(client: &tokio_postgres::Client) -> String {
    client
        .query_one("SELECT current_database()", &[])
        .await
        .expect("SELECT current_database()")
        .get(0)
}

/// A daemon with the PostgreSQL front on a port of its own, started with `args` too, and
/// the front's address.
pub async fn daemon_with_front(args: &[&str]) -> (TestDaemon, std::net::SocketAddr) {
    let daemon = TestDaemon::builder()
        .args(["--front-listen", "127.0.0.1:0"])
        .args(args.iter().copied())
        .start()
        .await;
    let front = daemon.front_address().await;
    (daemon, front)
}
