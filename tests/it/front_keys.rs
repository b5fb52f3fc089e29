//! Sharing a lease by key at the PostgreSQL front (issue 30): every connection to database
//! `<template>.<key>` gets the same lease while any of them is open; it is released a grace
//! after the last closes, or at once by `DELETE /front/keys/{name}`. `/status` and
//! `/metrics` show the front's connections and keys. Real daemon, real postgres.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio_postgres::{Client, NoTls};

use crate::support::{current_database, poll_until, TestDaemon};

/// The API token (and front password) of the tests that need lease ids.
const TOKEN: &str = "key-token";

/// The grace the tests give a key's lease: short, so that they need not wait long for it.
const GRACE_MS: u64 = 500;

async fn daemon_with_front(token: Option<&str>) -> (TestDaemon, SocketAddr) {
    let mut builder = TestDaemon::builder();
    if let Some(token) = token {
        builder = builder.token(token);
    }
    let daemon = builder
        .args(["--front-listen", "127.0.0.1:0"])
        .args(["--front-key-grace-ms", &GRACE_MS.to_string()])
        .start()
        .await;
    let front = daemon.front_address().await;
    (daemon, front)
}

/// A connection to `database` at the front (with `password`, if not empty); dropping the
/// client closes it.
async fn connect(
    front: SocketAddr,
    database: &'static str,
    password: &'static str,
) -> Result<Client, tokio_postgres::Error> {
    let mut config = format!(
        "host={} port={} user=tester dbname={database}",
        front.ip(),
        front.port()
    );
    if !password.is_empty() {
        config.push_str(&format!(" password={password}"));
    }
    let (client, connection) = tokio_postgres::connect(&config, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

async fn front_status(daemon: &TestDaemon) -> Value {
    daemon.status().await["front"].clone()
}

#[tokio::test]
async fn a_pool_of_five_connections_with_one_key_sees_one_database() {
    let (daemon, front) = daemon_with_front(None).await;
    // Five at once, as a pool opens them: they wait for the first one's lease.
    let connecting: Vec<_> = (0..5)
        .map(|_| tokio::spawn(connect(front, "default.test_one", "")))
        .collect();
    let mut pool: Vec<Client> = Vec::new();
    for connected in connecting {
        pool.push(
            connected
                .await
                .expect("task")
                .expect("a connection to the key"),
        );
    }
    let mut databases = Vec::new();
    for client in &pool {
        databases.push(current_database(client).await);
    }
    databases.dedup();
    assert_eq!(
        databases.len(),
        1,
        "one database for the key: {databases:?}"
    );
    assert_ne!(databases[0], "default", "a clone, not the template");
    // What one connection writes, the others see: it is one database.
    pool[0]
        .batch_execute("CREATE TABLE shared (id int); INSERT INTO shared VALUES (7)")
        .await
        .expect("write");
    let seen: i32 = pool[4]
        .query_one("SELECT id FROM shared", &[])
        .await
        .expect("read")
        .get(0);
    assert_eq!(seen, 7);
    // Another key, and no key, are other databases.
    let other = connect(front, "default.test_two", "")
        .await
        .expect("connect");
    assert_ne!(current_database(&other).await, databases[0]);
    let alone = connect(front, "default", "").await.expect("connect");
    assert_ne!(current_database(&alone).await, databases[0]);
    assert_eq!(
        daemon.open_leases().await.len(),
        3,
        "one lease per key, one alone"
    );

    let status = front_status(&daemon).await;
    let relaying = status["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| c["stage"] == "relaying" && c["key"] == "default.test_one")
        .count();
    assert_eq!(relaying, 5, "{status}");
    let key = status["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["name"] == "default.test_one")
        .cloned()
        .unwrap_or_else(|| panic!("the key in {status}"));
    assert_eq!(key["connections"], 5, "{key}");
    assert_eq!(key["database"], databases[0].as_str(), "{key}");
    let (_, metrics) = daemon.get("/metrics").await;
    let metrics = metrics.as_str().expect("text").to_owned();
    assert!(
        metrics.contains("pglease_front_connections{stage=\"relaying\"} 7"),
        "{metrics}"
    );
    assert!(metrics.contains("pglease_front_keys 2"), "{metrics}");

    // A connection that closes and comes back within the grace finds its database.
    drop(pool);
    let back = connect(front, "default.test_one", "")
        .await
        .expect("reconnect");
    assert_eq!(
        current_database(&back).await,
        databases[0],
        "kept within the grace"
    );
    let count: i64 = back
        .query_one("SELECT count(*) FROM shared", &[])
        .await
        .expect("the table is there")
        .get(0);
    assert_eq!(count, 1);
    // After the last one closes, the grace passes and the lease is released.
    drop((back, other, alone));
    poll_until(Duration::from_secs(10), "every lease released", || async {
        daemon.open_leases().await.is_empty().then_some(())
    })
    .await;
    let status = front_status(&daemon).await;
    assert_eq!(status["keys"], serde_json::json!([]), "{status}");
    assert_eq!(status["connections"], serde_json::json!([]), "{status}");
    assert!(status["accepted"].as_u64() >= Some(8), "{status}");
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_key_released_over_http_ends_its_connections_and_the_next_gets_a_new_database() {
    // With a token, so that /status shows lease ids (and the token is the front's password).
    let (daemon, front) = daemon_with_front(Some(TOKEN)).await;
    let first = connect(front, "default.k", TOKEN).await.expect("connect");
    let first_db = current_database(&first).await;

    let delete = |name: &str| {
        daemon
            .http
            .delete(format!("{}/front/keys/{name}", daemon.base))
    };
    let (code, body) = daemon.send(delete("default.k")).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["key"], "default.k", "{body}");
    assert!(body["lease_id"].is_string(), "{body}");
    // Its connection was ended with the lease.
    poll_until(
        Duration::from_secs(10),
        "the key's connection ended",
        || async { first.simple_query("SELECT 1").await.is_err().then_some(()) },
    )
    .await;
    let next = connect(front, "default.k", TOKEN)
        .await
        .expect("connect again");
    let next_db = current_database(&next).await;
    assert_ne!(next_db, first_db, "a new database after the release");

    // Released by its lease id instead (DELETE /leases/{id}), while a connection is open:
    // the key's next connection finds the lease gone and gets a new one.
    let key = front_status(&daemon).await["keys"][0].clone();
    let id = key["lease_id"]
        .as_str()
        .expect("a lease id with a token")
        .to_owned();
    let (code, body) = daemon.release(&id, false).await;
    assert_eq!(code, 204, "{body}");
    let after = connect(front, "default.k", TOKEN)
        .await
        .expect("connect after");
    let after_db = current_database(&after).await;
    assert_ne!(after_db, next_db, "not the released database");

    let (code, body) = daemon.send(delete("default.nobody")).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "key_not_found", "{body}");
    let (code, body) = daemon.send(delete("default")).await;
    assert_eq!(code, 422, "a template without a key: {body}");
    drop((first, next, after));
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn without_the_front_the_key_route_says_it_is_off_and_status_has_no_front() {
    let daemon = TestDaemon::builder()
        .args(["--front-listen", "off"])
        .start()
        .await;
    let (code, body) = daemon
        .send(
            daemon
                .http
                .delete(format!("{}/front/keys/default.k", daemon.base)),
        )
        .await;
    assert_eq!(code, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--front-listen off")),
        "{body}"
    );
    assert!(daemon.status().await.get("front").is_none());
    assert!(daemon.stop().await.success());
}

/// A real driver's connection pool, as a suite would use it: five connections checked out
/// at once from SQLAlchemy's pool and from node-postgres' `Pool`, with a key in the URL, see
/// one database; without a key, five.
#[tokio::test]
async fn a_drivers_own_pool_with_a_key_in_its_url_sees_one_database() {
    let (daemon, front) = daemon_with_front(None).await;
    let python = r#"
import sys, sqlalchemy
engine = sqlalchemy.create_engine(sys.argv[1], pool_size=5, max_overflow=0)
conns = [engine.connect() for _ in range(5)]
print(len({c.execute(sqlalchemy.text("SELECT current_database()")).scalar() for c in conns}))
"#;
    let node = r#"
const pg = require(process.argv[2] + '/pg')
const pool = new pg.Pool({ connectionString: process.argv[1], max: 5 })
Promise.all([0, 1, 2, 3, 4].map(() => pool.connect())).then(async (clients) => {
  const names = new Set()
  for (const c of clients) names.add((await c.query('SELECT current_database() AS d')).rows[0].d)
  console.log(names.size)
  clients.forEach((c) => c.release())
  await pool.end()
})
"#;
    let modules = crate::drivers::drivers_dir().join("node/node_modules");
    let mut runs: Vec<(&str, Vec<String>)> = Vec::new();
    if crate::support::tool_available(
        "python3",
        "key pools (SQLAlchemy)",
        "pip install sqlalchemy psycopg",
    ) {
        runs.push(("python3", vec!["-c".into(), python.into()]));
    }
    if crate::drivers::node_drivers_available("key pools (node-postgres)") {
        runs.push(("node", vec!["-e".into(), node.into()]));
    }
    for (program, args) in runs {
        for (database, expected) in [("default.pooled", "1"), ("default", "5")] {
            let url = format!("postgresql://tester@{front}/{database}");
            let output = std::process::Command::new(program)
                .args(&args)
                .arg(&url)
                .arg(&modules)
                .output()
                .expect("run the pool");
            let out = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && out.trim() == expected,
                "{program} with {url}: {out} {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    poll_until(Duration::from_secs(10), "every lease released", || async {
        daemon.open_leases().await.is_empty().then_some(())
    })
    .await;
    assert!(daemon.stop().await.success());
}
