//! Every supported major, as users pick it: `--postgres-version N` with binaries fetched
//! from Maven Central (or found installed, or in the cache that CI keeps between runs on
//! the same machine). The same flow on each: a SQL-file template and the default, a write,
//! a release with reuse (the recycle), a release without (drop and replace), and the
//! privilege a lease must not have.

use std::fs;

use serde_json::{json, Value};

use crate::support::{connect, id_of, poll_until, scratch_dir, wait_until_dropped, TestDaemon};

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
    // `again` may be the other warm clone while the released one is still being recycled:
    // the old password stops working when that recycle is done.
    poll_until(
        std::time::Duration::from_secs(10),
        "the previous holder's password to stop working",
        || async { connect(&lease).await.is_err().then_some(()) },
    )
    .await;
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
async fn a_template_asked_for_with_another_version_is_refused_at_once() {
    let dir = scratch_dir("major-refused");
    let file = dir.join("schema.sql");
    fs::write(&file, "CREATE TABLE things (id int);").expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--postgres-version",
            "16",
            "--template",
            &format!("app=sql:{}", file.display()),
        ])
        .default_cache()
        .start()
        .await;
    let (status, body) = daemon
        .lease(json!({"template": "app", "postgres_version": "16"}))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(server_major(&body).await, 16);
    // `app` lives on the 16 server: asking for it on 17 cannot be served by waiting.
    let started = std::time::Instant::now();
    let (status, body) = daemon
        .lease(json!({"template": "app", "postgres_version": "17", "wait_ms": 30000}))
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
        message.contains("lives on a PostgreSQL 16.") && message.contains("asks for 17"),
        "{message}"
    );
    // A minor is checked too: 16.0 was never released as a server version.
    for template in ["app", "default"] {
        let (status, body) = daemon
            .lease(json!({"template": template, "postgres_version": "16.0"}))
            .await;
        assert_eq!(status, 422, "{template}: {body}");
    }
    for bad in ["12", "seventeen", "17.x"] {
        let (status, body) = daemon.lease(json!({"postgres_version": bad})).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(body.to_string().contains("postgres_version"), "{body}");
    }
    // The daemon still serves everyone else, on one server.
    daemon.lease_ok("default").await;
    assert_eq!(
        daemon.status().await["servers"].as_array().map(Vec::len),
        Some(1)
    );
    assert!(daemon.stop().await.success());
}

/// The version of the server a template lives on, from `GET /templates`.
async fn template_server(daemon: &TestDaemon, name: &str) -> String {
    let (status, body) = daemon.get(&format!("/templates/{name}")).await;
    assert_eq!(status, 200, "{body}");
    body["postgres_version"]
        .as_str()
        .unwrap_or_else(|| panic!("no postgres_version in {body}"))
        .to_owned()
}

#[tokio::test]
async fn one_daemon_serves_a_15_template_and_an_18_template_at_once() {
    let dir = scratch_dir("two-majors");
    let file = dir.join("schema.sql");
    fs::write(
        &file,
        "CREATE TABLE things (id int); INSERT INTO things VALUES (42);",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--postgres-version",
            "15",
            "--template",
            &format!("old=sql:{}", file.display()),
            "--template",
            &format!("new@18=sql:{}", file.display()),
            "--min-ready",
            "1",
            "--max-total",
            "3",
        ])
        .default_cache()
        .start()
        .await;
    // The 18 server starts when first needed, not before.
    let status = daemon.status().await;
    assert_eq!(
        status["servers"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );

    let old = daemon.lease_ok("old").await;
    let new = daemon.lease_ok("new").await;
    assert_eq!(server_major(&old).await, 15);
    assert_eq!(server_major(&new).await, 18, "{}", daemon.log());
    assert_ne!(old["port"], new["port"], "two servers, two ports");
    for lease in [&old, &new] {
        let client = connect(lease).await.expect("connect");
        let row = client
            .query_one("SELECT id FROM things", &[])
            .await
            .expect("the template's table");
        assert_eq!(row.get::<_, i32>(0), 42);
    }
    // The default template of each major.
    let (status, default_18) = daemon.lease(json!({"postgres_version": "18"})).await;
    assert_eq!(status, 201, "{default_18}");
    assert_eq!(server_major(&default_18).await, 18);
    assert_eq!(default_18["port"], new["port"]);
    let default_15 = daemon.lease_ok("default").await;
    assert_eq!(server_major(&default_15).await, 15);

    // Where each template lives, in /templates and /status.
    assert!(template_server(&daemon, "old").await.starts_with("15."));
    assert!(template_server(&daemon, "new").await.starts_with("18."));
    let status = daemon.status().await;
    let servers = status["servers"].as_array().expect("servers");
    let majors: Vec<_> = servers.iter().map(|s| s["major"].clone()).collect();
    assert_eq!(majors, [json!(15), json!(18)], "{status}");
    assert!(servers[1]["templates"]
        .as_array()
        .is_some_and(|t| t.contains(&json!("new")) && t.contains(&json!("default"))));
    assert_eq!(
        status["leases"].as_array().map(Vec::len),
        Some(4),
        "{status}"
    );
    let data_dirs: Vec<String> = servers
        .iter()
        .filter_map(|s| s["postgres"]["data_dir"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(data_dirs.len(), 2);

    // A template asked for on the wrong major, and one that would move: refused.
    let (status, body) = daemon
        .lease(json!({"template": "new", "postgres_version": "15"}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "postgres_version_not_served");
    // Registered over HTTP on the 18 server, and not movable to 15.
    let (status, body) = daemon
        .put_template(
            "extra",
            json!({"sql": file.display().to_string(), "postgres_version": "18"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(body["postgres_version"]
        .as_str()
        .is_some_and(|v| v.starts_with("18.")));
    let extra = daemon.lease_ok("extra").await;
    assert_eq!(server_major(&extra).await, 18);
    let (status, body) = daemon
        .put_template(
            "extra",
            json!({"sql": file.display().to_string(), "postgres_version": "15"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "template_on_other_server");
    let (status, body) = daemon
        .put_template(
            "old",
            json!({"sql": file.display().to_string(), "postgres_version": "18"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");

    // Release and renew find the lease on whichever server holds it.
    let http = reqwest::Client::new();
    let (status, body) = daemon
        .send(
            http.post(format!("{}/leases/{}/renew", daemon.base, id_of(&new)))
                .json(&json!({"ttl_secs": 600})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for lease in [&new, &extra, &default_18, &old, &default_15] {
        let (status, body) = daemon.release(&id_of(lease), false).await;
        assert_eq!(status, 204, "{body}");
    }
    let (status, _) = daemon.release(&id_of(&new), false).await;
    assert_eq!(status, 404);

    // Both servers stop with the daemon, and their data directories go.
    assert!(daemon.stop().await.success());
    for dir in data_dirs {
        assert!(!std::path::Path::new(&dir).exists(), "{dir} left behind");
    }
}

#[tokio::test]
async fn a_server_that_cannot_start_fails_its_requests_and_not_the_daemon() {
    // The tests' own cache, which holds no PostgreSQL 14 binaries. A token: only its
    // holders may make the daemon start a major its configuration does not name.
    let daemon = TestDaemon::builder()
        .args([
            // Nothing listens there: PostgreSQL 14 can be neither found nor downloaded.
            "--postgres-repository",
            "http://127.0.0.1:9/maven2",
        ])
        .token("majors-token")
        .start()
        .await;
    let (status, body) = daemon.lease(json!({"postgres_version": "14"})).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "postgres_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("PostgreSQL 14 server cannot start") && message.contains("127.0.0.1:9"),
        "{message}"
    );
    // Asked again at once: the same answer, without a second attempt.
    let started = std::time::Instant::now();
    let (status, again) = daemon.lease(json!({"postgres_version": "14"})).await;
    assert_eq!(status, 503, "{again}");
    assert_eq!(again["error"]["message"], body["error"]["message"]);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    // The daemon's stderr is read on its own task: its line may land a moment after the
    // answer.
    let attempts = || {
        daemon
            .log()
            .matches("cannot start the PostgreSQL 14 server")
            .count()
    };
    poll_until(
        std::time::Duration::from_secs(5),
        "the failed start in the log",
        || async { (attempts() > 0).then_some(()) },
    )
    .await;
    assert_eq!(attempts(), 1, "{}", daemon.log());
    // Everyone else is served as before.
    let lease = daemon.lease_ok("default").await;
    connect(&lease).await.expect("connect");
    assert!(daemon.stop().await.success());
}
