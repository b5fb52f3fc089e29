//! Leasing: the lifecycle of one lease, parallel leases, waiting, expiry, reuse, renewal,
//! and clients that give up while waiting.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{connect, id_of, poll_until, wait_until_dropped, TestDaemon};

#[tokio::test]
async fn lease_connect_write_release_drops_and_replaces_the_clone() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "2"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    for field in [
        "id",
        "template",
        "fingerprint",
        "database",
        "host",
        "port",
        "user",
        "password",
        "url",
        "expires_at",
    ] {
        assert!(!lease[field].is_null(), "lease lacks {field}: {lease}");
    }
    assert_eq!(lease["template"], "default");
    let client = connect(&lease).await.expect("connect with the lease's URL");
    client
        .batch_execute("CREATE TABLE marker (id text); INSERT INTO marker VALUES ('mine');")
        .await
        .expect("write");
    let row = client
        .query_one("SELECT current_database(), count(*) FROM marker", &[])
        .await
        .expect("read");
    assert_eq!(
        row.get::<_, String>(0),
        lease["database"].as_str().expect("database")
    );
    assert_eq!(row.get::<_, i64>(1), 1);

    let (status, _) = daemon.release(&id_of(&lease), false).await;
    assert_eq!(status, 204);
    // The session we still hold is terminated by DROP … WITH (FORCE).
    wait_until_dropped(&lease, "the released database to be dropped").await;
    poll_until(
        Duration::from_secs(10),
        "the pool to be refilled",
        || async {
            let status = daemon.template_status("default").await;
            (status["ready"] == 2 && status["leased"] == 0).then_some(())
        },
    )
    .await;
    let (status, body) = daemon.release(&id_of(&lease), false).await;
    assert_eq!(status, 404, "a released lease is gone: {body}");
    assert_eq!(body["error"]["code"], "lease_not_found");
}

#[tokio::test]
async fn thirty_two_parallel_leases_are_all_distinct_and_isolated() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "4", "--max-total", "40"])
        .start()
        .await;
    let mut tasks = Vec::new();
    for worker in 0..32 {
        let http = daemon.http.clone();
        let base = daemon.base.clone();
        tasks.push(tokio::spawn(async move {
            let response = http
                .post(format!("{base}/lease"))
                .json(&json!({}))
                .send()
                .await
                .expect("lease");
            assert_eq!(response.status().as_u16(), 201);
            let lease: serde_json::Value = response.json().await.expect("json");
            let client = connect(&lease).await.expect("connect");
            // Each worker marks its database and checks nobody else did.
            client
                .batch_execute(&format!(
                    "CREATE TABLE marker (worker int); INSERT INTO marker VALUES ({worker});"
                ))
                .await
                .expect("mark");
            let rows = client
                .query("SELECT worker FROM marker", &[])
                .await
                .expect("read");
            assert_eq!(rows.len(), 1, "another worker wrote into this database");
            lease
        }));
    }
    let mut databases = HashSet::new();
    let mut ids = HashSet::new();
    for task in tasks {
        let lease = task.await.expect("worker");
        databases.insert(lease["database"].as_str().expect("db").to_owned());
        ids.insert(id_of(&lease));
    }
    assert_eq!(databases.len(), 32, "every lease got its own database");
    assert_eq!(ids.len(), 32);
    let status = daemon.template_status("default").await;
    assert_eq!(status["leased"], 32);
}

#[tokio::test]
async fn an_exhausted_pool_makes_requests_wait_then_time_out_with_504() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "1", "--max-total", "1"])
        .start()
        .await;
    let first = daemon.lease_ok("default").await;

    let (status, body) = daemon.lease(json!({ "wait_ms": 300 })).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["code"], "timeout");

    // A waiting request gets the database as soon as the holder releases it.
    let waiter = daemon.lease_in_background(json!({ "wait_ms": 20000 }));
    daemon.wait_for_waiting("default", 1).await;
    assert!(!waiter.is_finished());
    let (status, _) = daemon.release(&id_of(&first), false).await;
    assert_eq!(status, 204);
    let answer = waiter.await.expect("waiter");
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_ne!(answer.body["id"], first["id"]);
}

#[tokio::test]
async fn expired_leases_are_dropped_and_their_ids_become_void() {
    let daemon = TestDaemon::start().await;
    let (status, lease) = daemon.lease(json!({ "ttl_secs": 1 })).await;
    assert_eq!(status, 201, "{lease}");
    let client = connect(&lease).await.expect("connect");
    client.batch_execute("SELECT 1").await.expect("query");
    wait_until_dropped(&lease, "the expired lease's database to be dropped").await;
    assert!(
        client.batch_execute("SELECT 1").await.is_err(),
        "its session was terminated"
    );
    let (status, _) = daemon.release(&id_of(&lease), false).await;
    assert_eq!(status, 404);
    let (status, _) = daemon
        .send(
            daemon
                .http
                .post(format!("{}/leases/{}/renew", daemon.base, id_of(&lease)))
                .json(&json!({})),
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn renew_extends_a_lease() {
    let daemon = TestDaemon::start().await;
    let (_, lease) = daemon.lease(json!({ "ttl_secs": 2 })).await;
    // Leased with it and not renewed: its expiry shows the original time has passed.
    let (_, control) = daemon.lease(json!({ "ttl_secs": 2 })).await;
    let url = format!("{}/leases/{}/renew", daemon.base, id_of(&lease));
    let (status, renewed) = daemon
        .send(daemon.http.post(&url).json(&json!({ "ttl_secs": 3600 })))
        .await;
    assert_eq!(status, 200, "{renewed}");
    assert!(renewed["expires_at"].as_str() > lease["expires_at"].as_str());
    // Once the expiry has ended the lease taken with it, the renewed one is still there
    // (an event to wait for, not a sleep that guesses when the expiry ran).
    crate::support::wait_until_dropped(&control, "the unrenewed lease to expire").await;
    connect(&lease)
        .await
        .expect("still leased after the original ttl");
    let (status, _) = daemon.release(&id_of(&lease), false).await;
    assert_eq!(status, 204);
}

#[tokio::test]
async fn reuse_returns_the_database_to_the_pool_as_it_is() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "1", "--max-total", "1"])
        .start()
        .await;
    let first = daemon.lease_ok("default").await;
    let (status, _) = daemon.release(&id_of(&first), true).await;
    assert_eq!(status, 204);
    let second = daemon.lease_ok("default").await;
    assert_eq!(
        second["database"], first["database"],
        "the same database comes back"
    );
    assert_ne!(second["id"], first["id"], "under a new lease id");
    let (status, _) = daemon.release(&id_of(&first), false).await;
    assert_eq!(status, 404, "the old id is void");
}

#[tokio::test]
async fn a_client_that_gives_up_waiting_does_not_leak_a_database() {
    // Releases drop (an untouched database would otherwise go back to the ready queue).
    let daemon = TestDaemon::builder()
        .args([
            "--min-ready",
            "0",
            "--max-total",
            "1",
            "--no-reuse-unchanged",
        ])
        .start()
        .await;
    let holder = daemon.lease_ok("default").await;
    // This client hangs up after 300 ms while its request waits for up to 30 s.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let result = impatient
        .post(format!("{}/lease", daemon.base))
        .json(&json!({ "wait_ms": 30000 }))
        .send()
        .await;
    assert!(
        result.is_err(),
        "the request should time out on the client side"
    );
    poll_until(
        Duration::from_secs(5),
        "the abandoned request to be forgotten",
        || async { (daemon.template_status("default").await["waiting"] == 0).then_some(()) },
    )
    .await;
    let (status, _) = daemon.release(&id_of(&holder), false).await;
    assert_eq!(status, 204);
    // With min_ready 0 nothing is kept: the pool ends empty, nothing leased to nobody.
    poll_until(Duration::from_secs(10), "the pool to settle", || async {
        let status = daemon.template_status("default").await;
        (status["leased"] == 0 && status["in_progress"] == 0).then_some(status)
    })
    .await;
    let next = daemon.lease_ok("default").await;
    assert_ne!(next["database"], holder["database"]);
    assert_eq!(
        daemon.status().await["leases"].as_array().map(Vec::len),
        Some(1)
    );
}

#[tokio::test]
async fn a_label_names_the_lease_in_status_and_the_log() {
    let daemon = TestDaemon::start().await;
    let label = "tests/test_orders.py::test_refund[postgres-17] ✓";
    let (status, lease) = daemon.lease(json!({ "label": label })).await;
    assert_eq!(status, 201, "{lease}");
    let (status, unlabelled) = daemon.lease(json!({})).await;
    assert_eq!(status, 201, "{unlabelled}");
    let listed = daemon.status().await["leases"].clone();
    // By database: without a token /status shows no lease ids.
    let entry = |lease: &Value| {
        listed
            .as_array()
            .and_then(|leases| {
                leases
                    .iter()
                    .find(|l| l["database"] == lease["database"])
                    .cloned()
            })
            .expect("listed")
    };
    assert_eq!(entry(&lease)["label"], label);
    assert!(entry(&unlabelled).get("label").is_none());
    assert!(
        daemon
            .log()
            .lines()
            .any(|line| line.contains("lease granted") && line.contains("test_refund")),
        "{}",
        daemon.log()
    );
    let too_long = "x".repeat(257);
    for bad in [too_long.as_str(), "two\nlines", "bell\u{7}"] {
        let (status, body) = daemon.lease(json!({ "label": bad })).await;
        assert_eq!(status, 422, "{bad:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_value", "{body}");
    }
    // Nothing was leased for the refused ones; the daemon goes on serving.
    assert_eq!(
        daemon.status().await["leases"].as_array().map(Vec::len),
        Some(2)
    );
    daemon.lease_ok("default").await;
}
