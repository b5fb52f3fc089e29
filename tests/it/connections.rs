//! The connection budget: each lease's role has a CONNECTION LIMIT, and leases whose
//! connections do not fit in postgres' max_connections wait in line instead of tests
//! failing with "too many clients". And a clone's first connection finds the relation
//! cache ready.

use serde_json::{json, Value};
use tokio_postgres::error::SqlState;

use crate::support::{connect, id_of, scratch_dir, TestDaemon};

#[tokio::test]
async fn each_lease_gets_a_connection_limit() {
    let daemon = TestDaemon::builder()
        .args(["--lease-connections", "3"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(connect(&lease).await.expect("within the limit"));
    }
    let Err(refused) = connect(&lease).await else {
        panic!("a fourth connection must be refused");
    };
    assert_eq!(
        refused.code(),
        Some(&SqlState::TOO_MANY_CONNECTIONS),
        "{refused}"
    );

    // A request can name its own limit.
    let (status, small) = daemon.lease(json!({ "max_connections": 1 })).await;
    assert_eq!(status, 201, "{small}");
    let _only = connect(&small).await.expect("one connection");
    assert!(connect(&small).await.is_err(), "a second one is refused");
    // Released with reuse, the database comes back with the default limit.
    drop(_only);
    let (status, _) = daemon.release(&id_of(&small), true).await;
    assert_eq!(status, 204);
}

#[tokio::test]
async fn leases_queue_for_connections_instead_of_failing() {
    // A tiny server: max_connections 30 leaves 30 - 3 (superuser) - 6 (daemon pool) - 4
    // = 17 connections for lease holders.
    let daemon = TestDaemon::builder()
        .args([
            "--pg-setting",
            "max_connections=30",
            "--lease-connections",
            "5",
            "--min-ready",
            "4",
        ])
        .start()
        .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(daemon.lease_ok("default").await);
    }
    // Three leases hold 15; a fourth of 5 does not fit and waits, then times out.
    let (status, body) = daemon.lease(json!({ "wait_ms": 300 })).await;
    assert_eq!(status, 504, "{body}");
    // One that fits in what is left (2) is served at once... but only behind nobody.
    let (status, two) = daemon
        .lease(json!({ "max_connections": 2, "wait_ms": 2000 }))
        .await;
    assert_eq!(status, 201, "{two}");
    // A waiting lease is served when a release frees connections.
    let waiter = daemon.lease_in_background(json!({ "wait_ms": 20000 }));
    daemon.wait_for_waiting("default", 1).await;
    let (status, _) = daemon.release(&id_of(&held[0]), false).await;
    assert_eq!(status, 204);
    let answer = waiter.await.expect("waiter");
    assert_eq!(answer.status, 201, "{answer:?}");
    // Asking for more than the server could ever give is refused outright.
    let (status, body) = daemon.lease(json!({ "max_connections": 500 })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "too_many_connections");
    // Every held lease can really open all its connections at once: no "too many clients".
    let mut sessions = Vec::new();
    for lease in held.iter().skip(1).chain([&two, &answer.body]) {
        let limit = if lease["id"] == two["id"] { 2 } else { 5 };
        for _ in 0..limit {
            sessions.push(connect(lease).await.expect("within the budget"));
        }
    }
    assert_eq!(sessions.len(), 5 + 5 + 2 + 5);
}

/// Whether the clone `lease` names has a relation cache init file, looked up from
/// `other`'s connection before anyone connected to it.
async fn has_relcache_init(daemon: &TestDaemon, lease: &Value, other: &Value) -> bool {
    let data_dir = daemon.status().await["postgres"]["data_dir"]
        .as_str()
        .expect("data_dir")
        .to_owned();
    let client = connect(other).await.expect("connect");
    let oid: u32 = client
        .query_one(
            "SELECT oid FROM pg_database WHERE datname = $1",
            &[&lease["database"].as_str().expect("database")],
        )
        .await
        .expect("oid")
        .get(0);
    std::path::Path::new(&data_dir)
        .join(format!("base/{oid}/pg_internal.init"))
        .exists()
}

/// A clone comes with its template's relation cache init file, so its first connection
/// loads the cache instead of building it (~4 ms). Postgres removes those files when it
/// starts: templates a start finds built (here, in a snapshot) get theirs again.
#[tokio::test]
async fn clones_start_with_their_templates_relation_cache() {
    let snapshots = scratch_dir("relcache-snapshots");
    let start = || {
        TestDaemon::builder()
            .args(["--min-ready", "2", "--snapshot-dir"])
            .args([snapshots.display().to_string()])
            .start()
    };
    for (run, found) in [(1, "built"), (2, "found in the snapshot")] {
        let daemon = start().await;
        let first = daemon.lease_ok("default").await;
        let second = daemon.lease_ok("default").await;
        assert!(
            has_relcache_init(&daemon, &first, &second).await,
            "run {run}: a clone of a template {found} has no pg_internal.init"
        );
        if run == 2 {
            assert!(
                daemon.log().contains("template already built"),
                "{}",
                daemon.log()
            );
        }
        assert!(daemon.stop().await.success());
    }
}
