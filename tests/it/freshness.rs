//! Templates kept current: a changed migration reaches the next lease without a restart,
//! a rebuild can be forced over HTTP, and `/templates` shows each version.

use std::fs;
use std::time::Duration;

use crate::support::{
    connect, daemon_hashing_a_huge_source, daemon_hashing_a_huge_source_with, id_of,
    reading_sources, scratch_dir, wait_until_dropped, TestDaemon,
};

async fn tables(lease: &serde_json::Value) -> Vec<String> {
    let client = connect(lease).await.expect("connect");
    client
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .await
        .expect("list tables")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn a_changed_migration_reaches_the_next_lease_without_a_restart() {
    let dir = scratch_dir("fresh-change");
    fs::write(dir.join("001_a.sql"), "CREATE TABLE a (id int);").expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--min-ready",
            "2",
            "--template",
            &format!("app=migrations:{}", dir.display()),
        ])
        .start()
        .await;
    let old = daemon.lease_ok("app").await;
    assert_eq!(tables(&old).await, ["a"]);
    let first = daemon.template_status("app").await;
    assert_eq!(first["version"], 1);

    // A new migration file, and an edit of the existing one.
    fs::write(dir.join("002_b.sql"), "CREATE TABLE b (id int);").expect("write");
    let new = daemon.lease_ok("app").await;
    assert_eq!(
        tables(&new).await,
        ["a", "b"],
        "the new lease has the new schema"
    );
    assert_ne!(new["fingerprint"], old["fingerprint"]);
    let second = daemon.template_status("app").await;
    assert_eq!(second["version"], 2);
    fs::write(dir.join("001_a.sql"), "CREATE TABLE a2 (id int);").expect("write");
    let newer = daemon.lease_ok("app").await;
    assert_eq!(tables(&newer).await, ["a2", "b"]);

    // The lease of the old version keeps working until released, then its database goes.
    assert_eq!(tables(&old).await, ["a"]);
    let (status, _) = daemon.release(&id_of(&old), true).await;
    assert_eq!(status, 204);
    wait_until_dropped(&old, "the old version's clone to be dropped").await;

    // Touching a file without changing it keeps the version. The rewrite gets an mtime
    // set a minute on, so that its stamp moves for sure (the daemon then hashes the
    // sources again) whatever the file system's timestamp granularity.
    let touched = dir.join("002_b.sql");
    let content = fs::read(&touched).expect("read");
    let mtime = fs::metadata(&touched)
        .and_then(|m| m.modified())
        .expect("mtime");
    fs::write(&touched, content).expect("rewrite");
    fs::File::options()
        .write(true)
        .open(&touched)
        .and_then(|f| f.set_modified(mtime + Duration::from_secs(60)))
        .expect("set the mtime");
    let same = daemon.lease_ok("app").await;
    assert_eq!(same["fingerprint"], newer["fingerprint"]);
    assert_eq!(daemon.template_status("app").await["version"], 3);
}

#[tokio::test]
async fn templates_are_listed_and_a_rebuild_can_be_forced() {
    let dir = scratch_dir("fresh-rebuild");
    let file = dir.join("schema.sql");
    fs::write(&file, "CREATE TABLE t (id int);").expect("write");
    // A rebuild of a template the operator defined is a token holder's (issue 41).
    let daemon = TestDaemon::builder()
        .token("rebuild-token")
        .args([
            "--prebuild",
            "--template",
            &format!("app=sql:{}", file.display()),
        ])
        .start()
        .await;
    let held = daemon.lease_ok("app").await;
    let (status, list) = daemon.get("/templates").await;
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["app", "default"]);
    let (status, app) = daemon.get("/templates/app").await;
    assert_eq!(status, 200, "{app}");
    assert_eq!(app["state"], "ready");
    assert_eq!(app["version"], 1);
    assert_eq!(app["fingerprint"], held["fingerprint"]);
    assert!(
        app["size_bytes"]
            .as_i64()
            .is_some_and(|size| size > 1_000_000),
        "{app}"
    );
    assert!(app["build_ms"].as_u64().is_some(), "{app}");
    assert!(app["built_at"].as_str().is_some(), "{app}");

    let (status, answer) = daemon
        .send(
            daemon
                .http
                .post(format!("{}/templates/app/rebuild", daemon.base)),
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let rebuilt = crate::support::poll_until(Duration::from_secs(10), "the rebuild", || async {
        let (_, app) = daemon.get("/templates/app").await;
        (app["version"] == 2 && app["state"] == "ready").then_some(app)
    })
    .await;
    assert_eq!(
        rebuilt["fingerprint"], held["fingerprint"],
        "same sources, same fingerprint"
    );
    let fresh = daemon.lease_ok("app").await;
    assert_ne!(fresh["database"], held["database"]);

    for (method, path, expected, code) in [
        ("GET", "/templates/nope", 404, "unknown_template"),
        ("POST", "/templates/nope/rebuild", 404, "unknown_template"),
        ("GET", "/templates/Not%20Valid", 422, "invalid_value"),
    ] {
        let request = daemon.http.request(
            method.parse().expect("method"),
            format!("{}{path}", daemon.base),
        );
        let (status, body) = daemon.send(request).await;
        assert_eq!(status, expected, "{method} {path}: {body}");
        assert_eq!(body["error"]["code"], code);
    }
}

/// Checking a template's sources is file I/O, and file I/O can stall (a network mount, a
/// FIFO). It runs beside the pool, never in it: while one template's check hangs, leases of
/// other templates are answered.
#[tokio::test]
async fn a_stalled_source_check_holds_up_no_other_lease() {
    // The check hashes a 64 GiB source for minutes. (A FIFO, which once stalled it for
    // good, is now refused before it is read.)
    let (daemon, stalled, schema) = daemon_hashing_a_huge_source("fresh-stall").await;
    let other = tokio::time::timeout(Duration::from_secs(10), daemon.lease_ok("default")).await;
    assert!(
        other.is_ok(),
        "a lease of another template waited on the check"
    );
    assert!(
        reading_sources(daemon.pid()),
        "the check ended before the other lease was tried"
    );
    stalled.abort();
    // The hash would go on for minutes: no graceful stop to wait for.
    daemon.kill();
    let _ = fs::remove_file(&schema);
}

/// Issue 27: a request that waits for its template's sources to be checked is a waiter of
/// the pool like any other: `/status` shows it, and it counts against `--max-waiting`. (It
/// was parked in a table of the actor's, beside the state, where neither saw it.)
#[tokio::test]
async fn a_request_waiting_for_a_source_check_shows_and_counts() {
    let (daemon, hashing, schema) =
        daemon_hashing_a_huge_source_with("fresh-counted", &["--max-waiting", "1"]).await;
    let app = daemon.template_status("app").await;
    assert_eq!(app["waiting"], 1, "{app}");
    let (status, body) = daemon
        .lease(serde_json::json!({ "template": "default", "wait_ms": 1000 }))
        .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_waiting", "{body}");
    assert!(
        reading_sources(daemon.pid()),
        "the check ended before the second request was sent"
    );
    hashing.abort();
    // The hash would go on for minutes: no graceful stop to wait for.
    daemon.kill();
    let _ = fs::remove_file(&schema);
}
