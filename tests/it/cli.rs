//! The client commands against a real daemon: `lease` prints a URL, `run` sets the
//! environment and passes the exit status through, and a missing daemon is explained.

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
