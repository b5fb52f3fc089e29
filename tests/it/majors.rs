//! Every supported major, as users pick it: `--postgres-version N` with binaries fetched
//! from Maven Central (or found installed, or in the cache that CI keeps between runs on
//! the same machine). The same flow on each: a SQL-file template and the default, a write,
//! a release with reuse (the recycle), a release without (drop and replace), and the
//! privilege a lease must not have.

use std::fs;

use serde_json::Value;

use crate::support::{connect, id_of, scratch_dir, wait_until_dropped, TestDaemon};

async fn server_major(lease: &Value) -> i32 {
    let client = connect(lease).await.expect("connect");
    let row = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("version");
    row.get::<_, i32>(0) / 10_000
}

async fn flow(major: i32) {
    let dir = scratch_dir(&format!("major-{major}"));
    let file = dir.join("schema.sql");
    fs::write(
        &file,
        "CREATE TABLE things (id int); INSERT INTO things VALUES (42);",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--postgres-version",
            &major.to_string(),
            "--template",
            &format!("schema=sql:{}", file.display()),
            "--min-ready",
            "1",
            "--max-total",
            "2",
        ])
        .default_cache()
        .start()
        .await;
    let lease = daemon.lease_ok("schema").await;
    assert_eq!(server_major(&lease).await, major, "{}", daemon.log());
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one("SELECT id FROM things", &[])
        .await
        .expect("the template's table");
    assert_eq!(row.get::<_, i32>(0), 42);
    let denied = client
        .batch_execute("ALTER SYSTEM SET work_mem = '1GB'")
        .await
        .expect_err("a lease is no superuser");
    assert!(denied.as_db_error().is_some(), "{denied}");
    drop(client);

    // Released with reuse: recycled under a new password, the old one opens nothing.
    let (status, _) = daemon.release(&id_of(&lease), true).await;
    assert_eq!(status, 204);
    let again = daemon.lease_ok("schema").await;
    assert_ne!(again["password"], lease["password"]);
    connect(&lease)
        .await
        .expect_err("the previous holder's password no longer works");
    connect(&again)
        .await
        .expect("connect")
        .batch_execute("INSERT INTO things VALUES (7)")
        .await
        .expect("the lease owns its tables");

    // Released without reuse: the written database is dropped; every later lease gets an
    // unchanged copy.
    let (status, _) = daemon.release(&id_of(&again), false).await;
    assert_eq!(status, 204);
    wait_until_dropped(&again, "the released database to be dropped").await;
    let fresh = daemon.lease_ok("schema").await;
    let client = connect(&fresh).await.expect("connect");
    let count: i64 = client
        .query_one("SELECT count(*) FROM things", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(count, 1, "a fresh copy of the template");
    let empty = daemon.lease_ok("default").await;
    assert_eq!(server_major(&empty).await, major);
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn postgres_13_fetched_and_leased() {
    flow(13).await;
}

#[tokio::test]
async fn postgres_16_fetched_and_leased() {
    flow(16).await;
}

#[tokio::test]
async fn postgres_18_fetched_and_leased() {
    flow(18).await;
}

#[tokio::test]
async fn a_lease_asking_for_another_version_is_refused_at_once() {
    let daemon = TestDaemon::builder()
        .args(["--postgres-version", "16"])
        .default_cache()
        .start()
        .await;
    let (status, body) = daemon
        .lease(serde_json::json!({"postgres_version": "16"}))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(server_major(&body).await, 16);
    let started = std::time::Instant::now();
    let (status, body) = daemon
        .lease(serde_json::json!({"postgres_version": "17", "wait_ms": 30000}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "answered at once"
    );
    assert_eq!(
        body["error"]["code"], "postgres_version_not_served",
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("serves PostgreSQL 16.") && message.contains("--postgres-version 17"),
        "{message}"
    );
    // A minor is checked too: 16.0 was never released as a server version.
    let (status, body) = daemon
        .lease(serde_json::json!({"postgres_version": "16.0"}))
        .await;
    assert_eq!(status, 422, "{body}");
    for bad in ["12", "seventeen", "17.x"] {
        let (status, body) = daemon
            .lease(serde_json::json!({"postgres_version": bad}))
            .await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(body.to_string().contains("postgres_version"), "{body}");
    }
    // The daemon still serves everyone else.
    daemon.lease_ok("default").await;
    assert!(daemon.stop().await.success());
}
