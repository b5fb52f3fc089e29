//! The connection budget: each lease's role has a CONNECTION LIMIT, and leases whose
//! connections do not fit in postgres' max_connections wait in line instead of tests
//! failing with "too many clients".

use serde_json::json;
use tokio_postgres::error::SqlState;

use crate::support::{connect, id_of, TestDaemon};

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
