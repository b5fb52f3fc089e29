//! The client commands against a real daemon: `lease` prints a URL, `run` sets the
//! environment and passes the exit status through, `ready` waits for a daemon still starting,
//! and a missing daemon is explained.

use std::process::Stdio;

use crate::support::{binary, connect, poll_until, TestDaemon};

fn output(args: &[&str], server: &str) -> std::process::Output {
    binary()
        .args(args)
        .env("PGLEASE_URL", server)
        .stdin(Stdio::null())
        .output()
        .expect("run pglease")
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
    assert!(url.trim().starts_with("postgres://"), "{url}");
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
}

#[tokio::test]
async fn ready_waits_for_a_daemon_started_after_it() {
    // A port nothing listens on yet; the daemon takes it once `ready` is asking.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let server = format!("http://127.0.0.1:{port}");
    let mut waiting = tokio::process::Command::new(env!("CARGO_BIN_EXE_pglease"))
        .args(["ready", "--timeout", "60", "--server", &server])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pglease ready");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        waiting.try_wait().expect("poll").is_none(),
        "ready must keep asking while no daemon listens"
    );
    let daemon = TestDaemon::builder()
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .start()
        .await;
    let status = tokio::time::timeout(std::time::Duration::from_secs(60), waiting.wait())
        .await
        .expect("ready returns once the daemon is ready")
        .expect("wait");
    assert!(status.success(), "{status:?}");
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
