//! The client commands against a real daemon: `lease` prints a URL, `run` sets the
//! environment, passes the exit status through and passes SIGTERM/SIGINT on to its command,
//! `ready` waits for a daemon still starting, and a missing daemon is explained.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{binary, connect, poll_until, scratch_dir, TestDaemon};

fn output(args: &[&str], server: &str) -> std::process::Output {
    binary()
        .args(args)
        .env("PGLEASE_URL", server)
        .stdin(Stdio::null())
        .output()
        .expect("run pglease")
}

/// [`output`] against `daemon`, off the async runtime.
/// The daemon's token, if it has one, goes in `PGLEASE_TOKEN`.
pub(crate) async fn output_of(daemon: &TestDaemon, args: &[&str]) -> std::process::Output {
    output_with_env(daemon, &[], args).await
}

/// [`output_of`] with more environment variables.
async fn output_with_env(
    daemon: &TestDaemon,
    envs: &[(&str, &str)],
    args: &[&str],
) -> std::process::Output {
    let base = daemon.base.clone();
    let token = daemon.token.clone();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let mut command = binary();
        command
            .args(&args)
            .envs(envs)
            .env("PGLEASE_URL", &base)
            .stdin(Stdio::null());
        if let Some(token) = token {
            command.env("PGLEASE_TOKEN", token);
        }
        command.output().expect("run pglease")
    })
    .await
    .expect("join")
}

#[tokio::test]
async fn lease_prints_a_url_and_release_ends_it() {
    let daemon = TestDaemon::start().await;
    let base = daemon.base.clone();
    let out = tokio::task::spawn_blocking(move || output(&["lease", "--json"], &base))
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lease: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json lease");
    connect(&lease).await.expect("the printed lease connects");
    let id = lease["id"].as_str().expect("id").to_owned();
    let base = daemon.base.clone();
    let out = tokio::task::spawn_blocking(move || output(&["release", &id], &base))
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let base = daemon.base.clone();
    let out = tokio::task::spawn_blocking(move || output(&["lease"], &base))
        .await
        .expect("join");
    let url = String::from_utf8(out.stdout).expect("utf8");
    assert!(url.trim().starts_with("postgresql://"), "{url}");
    assert_eq!(
        url.trim().lines().count(),
        1,
        "only the URL on stdout: {url}"
    );
}

#[tokio::test]
async fn run_sets_the_environment_releases_and_passes_the_exit_status() {
    let daemon = TestDaemon::start().await;
    let base = daemon.base.clone();
    let script = "test -n \"$DATABASE_URL\" && test -n \"$PGHOST\" && test -n \"$PGPORT\" && \
                  test -n \"$PGUSER\" && test -n \"$PGPASSWORD\" && test -n \"$PGDATABASE\" && \
                  echo \"$PGDATABASE\" && exit 7";
    let out =
        tokio::task::spawn_blocking(move || output(&["run", "--", "sh", "-c", script], &base))
            .await
            .expect("join");
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let database = String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_owned();
    assert!(database.starts_with("pglease_"), "{database}");
    poll_until(
        std::time::Duration::from_secs(10),
        "the run's lease to be released",
        || async {
            daemon.status().await["leases"]
                .as_array()
                .is_some_and(Vec::is_empty)
                .then_some(())
        },
    )
    .await;
}

/// Starts `pglease run -- sh -c SCRIPT` against `daemon` and waits until the script has
/// written `ready` (its signal traps are set by then). The script then loops while its
/// parent lives: a `pglease run` that died without stopping it must not leave it running
/// (holding the test harness' output open) after a failed test.
async fn run_until_ready(daemon: &TestDaemon, dir: &Path, script: &str) -> tokio::process::Child {
    let ready = dir.join("ready");
    let script = format!("{script}; echo ready > '{}'", ready.display());
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_pglease"))
        .args(["run", "--", "sh", "-c"])
        .arg(format!(
            "{script}; while kill -0 $PPID 2>/dev/null; do sleep 0.1; done"
        ))
        .env("PGLEASE_URL", &daemon.base)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run pglease run");
    poll_until(Duration::from_secs(30), "the command to start", || async {
        ready.exists().then_some(())
    })
    .await;
    run
}

async fn leases(daemon: &TestDaemon) -> usize {
    daemon.status().await["leases"]
        .as_array()
        .map_or(0, Vec::len)
}

fn signal(run: &tokio::process::Child, signal: Signal) {
    let pid = nix::unistd::Pid::from_raw(run.id().expect("running") as i32);
    nix::sys::signal::kill(pid, signal).expect("signal pglease run");
}

#[tokio::test]
async fn run_passes_sigterm_and_sigint_on_to_its_command_and_releases_the_lease() {
    let daemon = TestDaemon::start().await;
    for (sent, code) in [(Signal::SIGTERM, 3), (Signal::SIGINT, 4)] {
        let dir = scratch_dir(&format!("run-{}", sent.as_str()));
        let got = dir.join("got");
        let script = format!(
            "trap 'echo got > \"{}\"; exit {code}' {}",
            got.display(),
            &sent.as_str()[3..]
        );
        let mut run = run_until_ready(&daemon, &dir, &script).await;
        assert_eq!(leases(&daemon).await, 1, "the lease is open while it runs");
        signal(&run, sent);
        let status = tokio::time::timeout(Duration::from_secs(20), run.wait())
            .await
            .expect("pglease run exits after the command")
            .expect("wait");
        assert!(got.exists(), "the command got {sent}");
        assert_eq!(
            status.code(),
            Some(code),
            "the command's status: {status:?}"
        );
        released(&daemon).await;
    }
}

/// Waits until the daemon has no open lease (`pglease run` released its own).
async fn released(daemon: &TestDaemon) {
    poll_until(
        Duration::from_secs(10),
        "the run's lease to be released",
        || async { (leases(daemon).await == 0).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn run_kills_a_command_that_ignores_sigterm_after_its_grace_period() {
    let daemon = TestDaemon::start().await;
    let dir = scratch_dir("run-ignores-sigterm");
    let mut run = run_until_ready(&daemon, &dir, "trap '' TERM").await;
    let signalled = Instant::now();
    signal(&run, Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(30), run.wait())
        .await
        .expect("pglease run exits once the grace period is over")
        .expect("wait");
    assert_eq!(status.code(), Some(128 + 9), "killed: {status:?}");
    assert!(
        signalled.elapsed() >= Duration::from_secs(10),
        "it had its grace period"
    );
    released(&daemon).await;
}

#[tokio::test]
async fn run_leaves_a_ctrl_c_typed_in_the_terminal_to_its_command() {
    if !crate::support::tool_available(
        "script",
        "run_leaves_a_ctrl_c_typed_in_the_terminal_to_its_command",
        "apt-get install bsdutils",
    ) {
        return;
    }
    let daemon = TestDaemon::start().await;
    let dir = scratch_dir("run-ctrl-c");
    let (ints, ready) = (dir.join("ints"), dir.join("ready"));
    // The command notes each SIGINT and goes on; it exits 5 on SIGTERM and says who its
    // parent is.
    let inner = format!(
        "trap 'echo int >> \"{}\"' INT; trap 'exit 5' TERM; echo $PPID > \"{}\"; \
         while kill -0 $PPID 2>/dev/null; do sleep 0.1; done",
        ints.display(),
        ready.display()
    );
    // `script` runs `pglease run` on a new pseudo-terminal, in its foreground process group,
    // and copies our input to it: a ^C there is the terminal's own SIGINT to that group.
    let mut terminal = tokio::process::Command::new("script")
        .args([
            "-q",
            "-e",
            "-c",
            "exec \"$PGLEASE\" run -- sh -c \"$INNER\"",
            "/dev/null",
        ])
        .env("PGLEASE", env!("CARGO_BIN_EXE_pglease"))
        .env("INNER", &inner)
        .env("SHELL", "/bin/sh")
        .env("PGLEASE_URL", &daemon.base)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run script");
    let run_pid: i32 = poll_until(Duration::from_secs(30), "the command to start", || async {
        std::fs::read_to_string(&ready)
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
    })
    .await;
    let count = || {
        std::fs::read_to_string(&ints)
            .map(|text| text.lines().count())
            .unwrap_or(0)
    };
    let mut keyboard = terminal.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut keyboard, b"\x03")
        .await
        .expect("type ^C");
    poll_until(
        Duration::from_secs(10),
        "the command to get SIGINT",
        || async { (count() > 0).then_some(()) },
    )
    .await;
    // A SIGINT passed on by `pglease run` would mostly merge with the terminal's (signals do
    // not queue), but it would also start the grace period: the command must outlive it.
    let outlived = tokio::time::timeout(Duration::from_secs(12), terminal.wait()).await;
    assert!(
        outlived.is_err(),
        "a Ctrl-C is the command's business, yet pglease run ended: {outlived:?}"
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(run_pid), Signal::SIGTERM)
        .expect("signal pglease run");
    let status = tokio::time::timeout(Duration::from_secs(20), terminal.wait())
        .await
        .expect("pglease run exits after the command")
        .expect("wait");
    assert_eq!(status.code(), Some(5), "{status:?}");
    assert_eq!(count(), 1, "the command got the Ctrl-C once");
    released(&daemon).await;
    drop(keyboard);
}

#[tokio::test]
async fn client_commands_explain_a_missing_daemon() {
    // Port 9 (discard) on loopback: nothing of ours listens there.
    let out = tokio::task::spawn_blocking(|| output(&["lease"], "http://127.0.0.1:9"))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(1));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("pglease serve"), "{message}");
    assert!(message.contains("PGLEASE_URL"), "{message}");
}

#[test]
fn help_explains_serve() {
    let out = binary().args(["serve", "--help"]).output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--template",
        "--min-ready",
        "--max-total",
        "--postgres-url",
        "--tmpfs-size",
        "--pg-user",
    ] {
        assert!(text.contains(flag), "serve --help lacks {flag}");
    }
    // Grouped by topic, in this order, each flag under its own.
    let headings = [
        "Configuration and the HTTP API:",
        "Templates:",
        "The pool:",
        "Leases:",
        "The PostgreSQL server:",
        "IntegreSQL API:",
        "PostgreSQL front:",
    ];
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("serve --help lacks {needle}"))
    };
    let positions: Vec<usize> = headings.iter().map(|h| at(h)).collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] < pair[1]),
        "headings out of order: {positions:?}"
    );
    for (flag, heading) in [
        ("--template", 1),
        ("--min-ready", 2),
        ("--lease-auth", 3),
        ("--postgres-url", 4),
        ("--integresql-listen", 5),
        ("--front-listen", 6),
    ] {
        // Where it is listed (the about line mentions --postgres-url too).
        let position = at(&format!("{flag} <"));
        assert!(
            position > positions[heading]
                && positions
                    .get(heading + 1)
                    .is_none_or(|next| position < *next),
            "{flag} is not under {}",
            headings[heading]
        );
    }
}

#[tokio::test]
async fn ready_waits_for_a_daemon_started_after_it() {
    // The test holds the port until `ready` has asked once, and closes that connection
    // unanswered: `ready` is then known to run, and to have met no daemon. The port is
    // left free (later attempts are refused, the case
    // `ready_gives_up_after_its_timeout_and_says_why` covers alone) until the daemon
    // takes it; `ready` succeeding then proves it kept asking.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let port = listener.local_addr().expect("its address").port();
    let server = format!("http://127.0.0.1:{port}");
    let waiting = tokio::process::Command::new(env!("CARGO_BIN_EXE_pglease"))
        .args(["ready", "--timeout", "60", "--server", &server])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pglease ready");
    let (asked, _) = tokio::time::timeout(std::time::Duration::from_secs(60), listener.accept())
        .await
        .expect("ready asks")
        .expect("accept");
    drop(listener);
    drop(asked);
    let daemon = TestDaemon::builder()
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .start()
        .await;
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        waiting.wait_with_output(),
    )
    .await
    .expect("ready returns once the daemon is ready")
    .expect("wait");
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, body) = daemon.get("/readyz").await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn ready_gives_up_after_its_timeout_and_says_why() {
    let started = std::time::Instant::now();
    let out =
        tokio::task::spawn_blocking(|| output(&["ready", "--timeout", "1"], "http://127.0.0.1:9"))
            .await
            .expect("join");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "it kept asking"
    );
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("not ready after 1 s"), "{message}");
    assert!(message.contains("no pglease daemon answers"), "{message}");
}

#[tokio::test]
async fn lease_and_run_pass_the_postgres_version_on() {
    let daemon = TestDaemon::builder()
        .args(["--template", "app=empty"])
        .start()
        .await;
    let major = daemon.status().await["postgres"]["version"]
        .as_str()
        .and_then(|v| v.split('.').next())
        .expect("version")
        .to_owned();
    let other = if major == "17" { "16" } else { "17" };
    let out = output_of(&daemon, &["lease", "--json", "--postgres-version", &major]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // `app` lives on the primary server: another version cannot have it.
    let out = output_of(
        &daemon,
        &[
            "run",
            "--template",
            "app",
            "--postgres-version",
            other,
            "--",
            "true",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("422") && stderr.contains(&format!("asks for {other}")),
        "{stderr}"
    );
}

#[tokio::test]
async fn lease_and_run_take_the_template_from_pglease_template() {
    let daemon = TestDaemon::builder()
        .args(["--template", "app=empty"])
        .start()
        .await;
    let out = output_with_env(
        &daemon,
        &[("PGLEASE_TEMPLATE", "app")],
        &["lease", "--json"],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lease: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json lease");
    assert_eq!(lease["template"], "app");
    // `run` asks for the variable's template: the daemon knows none called `nope`.
    let out = output_with_env(
        &daemon,
        &[("PGLEASE_TEMPLATE", "nope")],
        &["run", "--", "true"],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("unknown template \"nope\""), "{stderr}");
    // The flag wins over the variable.
    let out = output_with_env(
        &daemon,
        &[("PGLEASE_TEMPLATE", "nope")],
        &["lease", "--json", "--template", "app"],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn lease_label_shows_in_status() {
    let daemon = TestDaemon::start().await;
    let out = output_of(&daemon, &["lease", "--json", "--label", "suite/test_one"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lease: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json lease");
    let leases = daemon.status().await["leases"].clone();
    let listed = leases
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|l| l["database"] == lease["database"])
                .cloned()
        })
        .expect("listed");
    assert_eq!(listed["label"], "suite/test_one");
}

#[tokio::test]
async fn status_is_a_table_on_a_terminal_and_json_otherwise() {
    let test = "status_is_a_table_on_a_terminal_and_json_otherwise";
    if !crate::support::tool_available("script", test, "install util-linux") {
        return;
    }
    let daemon = TestDaemon::start().await;
    let lease = daemon.lease_ok("default").await;
    // Piped, or with --json: the JSON of GET /status.
    for args in [&["status"][..], &["status", "--json"][..]] {
        let out = output_of(&daemon, args).await;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(status["leases"][0]["database"], lease["database"]);
    }
    // On a terminal (script(1) gives it one): tables.
    let command = format!(
        "{} status --server {}",
        env!("CARGO_BIN_EXE_pglease"),
        daemon.base
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .stdin(Stdio::null())
            .output()
            .expect("run script")
    })
    .await
    .expect("join");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    for part in [
        "PostgreSQL servers",
        "Templates",
        "Leases (1)",
        "Connections ",
    ] {
        assert!(table.contains(part), "{part} in:\n{table}");
    }
    assert!(
        table.contains(lease["database"].as_str().expect("database")),
        "{table}"
    );
}
