//! Per-lease credentials: each lease logs in as its own role with its own password, which
//! opens its own database and nothing else; a reused database gets a new password.

use serde_json::{json, Value};

use crate::support::{connect, id_of, wait_until_dropped, TestDaemon};

/// The lease's URL with the database swapped for another one.
fn url_for(lease: &Value, database: &str) -> String {
    format!(
        "postgres://{}:{}@{}:{}/{database}",
        lease["user"].as_str().expect("user"),
        lease["password"].as_str().expect("password"),
        lease["host"].as_str().expect("host"),
        lease["port"],
    )
}

async fn try_connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The fence held for the reason that proves it: postgres refused with `state`, not for some
/// other failure (a typo in the URL, a server not up) that would let the test pass vacuously.
#[track_caller]
fn refused_with<T>(
    outcome: Result<T, tokio_postgres::Error>,
    state: tokio_postgres::error::SqlState,
    what: &str,
) {
    match outcome {
        Ok(_) => panic!("{what}: it was let through"),
        Err(error) => assert_eq!(error.code(), Some(&state), "{what}: {error:?}"),
    }
}

#[tokio::test]
async fn a_lease_opens_its_own_database_and_nothing_else() {
    let daemon = TestDaemon::start().await;
    let a = daemon.lease_ok("default").await;
    let b = daemon.lease_ok("default").await;
    assert_ne!(a["user"], b["user"], "each lease has its own role");
    assert_ne!(a["password"], b["password"]);
    assert_eq!(
        a["user"], a["database"],
        "the role is named like its database"
    );

    let client = connect(&a).await.expect("A opens A");
    let row = client
        .query_one("SELECT current_user, current_database()", &[])
        .await
        .expect("query");
    assert_eq!(row.get::<_, String>(0), a["user"].as_str().expect("user"));

    // A's credentials open neither B's database, nor a template, nor postgres' own.
    let template: String = client
        .query_one(
            "SELECT datname FROM pg_database WHERE datname LIKE 'pglease\\_tpl\\_%' LIMIT 1",
            &[],
        )
        .await
        .expect("template name")
        .get(0);
    for other in [
        b["database"].as_str().expect("db"),
        template.as_str(),
        "postgres",
        "template1",
    ] {
        // pg_hba.conf's `sameuser` rule: "no pg_hba.conf entry" (28000).
        refused_with(
            try_connect(&url_for(&a, other)).await,
            tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            &format!("A's credentials opening {other}"),
        );
    }
    // B's password does not log A's role in (28P01).
    let mut swapped = a.clone();
    swapped["password"] = b["password"].clone();
    refused_with(
        try_connect(&url_for(&swapped, a["database"].as_str().expect("db"))).await,
        tokio_postgres::error::SqlState::INVALID_PASSWORD,
        "B's password for A's role",
    );

    // A role cannot read anyone's secret (42501).
    refused_with(
        client.query("SELECT rolpassword FROM pg_authid", &[]).await,
        tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE,
        "reading pg_authid",
    );
    let shown: Vec<Option<String>> = client
        .query("SELECT rolpassword FROM pg_roles WHERE rolpassword IS NOT NULL AND rolpassword <> '********'", &[])
        .await
        .expect("pg_roles")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(shown.is_empty(), "pg_roles exposes {shown:?}");
    let not_super: bool = client
        .query_one(
            "SELECT NOT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .expect("rolsuper")
        .get(0);
    assert!(not_super);
}

#[tokio::test]
async fn reuse_rotates_the_password_and_ends_the_old_sessions() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "1", "--max-total", "1"])
        .start()
        .await;
    let first = daemon.lease_ok("default").await;
    let old_session = connect(&first).await.expect("connect");
    let (status, _) = daemon.release(&id_of(&first), true).await;
    assert_eq!(status, 204);
    let second = daemon.lease_ok("default").await;
    assert_eq!(
        second["database"], first["database"],
        "the same database came back"
    );
    assert_ne!(second["password"], first["password"], "with a new password");
    assert!(
        old_session.batch_execute("SELECT 1").await.is_err(),
        "the old holder's session was ended"
    );
    refused_with(
        connect(&first).await,
        tokio_postgres::error::SqlState::INVALID_PASSWORD,
        "the old password after a reuse",
    );
    connect(&second).await.expect("the new one does");
}

#[tokio::test]
async fn roles_are_dropped_with_their_databases() {
    // A release that drops: without --no-reuse-unchanged an untouched database goes back,
    // role and all (tests/it/proof.rs).
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "1", "--no-reuse-unchanged"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let watcher = daemon.lease_ok("default").await;
    let (status, _) = daemon.release(&id_of(&lease), false).await;
    assert_eq!(status, 204);
    let client = connect(&watcher).await.expect("connect");
    let role = lease["user"].as_str().expect("user").to_owned();
    crate::support::poll_until(
        std::time::Duration::from_secs(10),
        "the role to be dropped",
        || async {
            let rows = client
                .query("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
                .await
                .expect("query");
            rows.is_empty().then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn trust_auth_needs_no_password_but_still_only_opens_its_own_database() {
    let daemon = TestDaemon::builder()
        .args(["--lease-auth", "trust"])
        .start()
        .await;
    let a = daemon.lease_ok("default").await;
    let b = daemon.lease_ok("default").await;
    let mut no_password = a.clone();
    no_password["password"] = json!("wrong");
    try_connect(&url_for(&no_password, a["database"].as_str().expect("db")))
        .await
        .expect("trust ignores the password");
    refused_with(
        try_connect(&url_for(&a, b["database"].as_str().expect("db"))).await,
        tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
        "A's role opening B's database under trust",
    );
}

#[tokio::test]
async fn lease_superuser_gives_superuser_roles() {
    let daemon = TestDaemon::builder()
        .args(["--lease-superuser"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let client = connect(&lease).await.expect("connect");
    let is_super: bool = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .expect("rolsuper")
        .get(0);
    assert!(is_super);
}

/// A login of the previous holder that stalls in authentication (it read the old verifier
/// and waits) would pass the role check once the recycled role may log in again. Such a
/// backend shows neither its role nor its database, so the recycle cannot tell it from
/// another tenant's slow login and must not end it: after a short grace it gives up, and
/// the database and its role are dropped and replaced.
#[tokio::test]
async fn a_login_stalled_in_authentication_makes_the_recycle_replace_the_database() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "1", "--max-total", "1"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let (user, database) = (
        lease["user"].as_str().expect("user"),
        lease["database"].as_str().expect("database"),
    );
    let address = format!(
        "{}:{}",
        lease["host"].as_str().expect("host"),
        lease["port"]
    );
    // A startup packet (protocol 3.0), then silence once the server asks for SCRAM.
    let mut body = 196_608_i32.to_be_bytes().to_vec();
    for (key, value) in [("user", user), ("database", database)] {
        for text in [key, value] {
            body.extend_from_slice(text.as_bytes());
            body.push(0);
        }
    }
    body.push(0);
    let mut packet = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    packet.extend_from_slice(&body);
    let mut stalled = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect to postgres");
    stalled.write_all(&packet).await.expect("startup packet");
    let mut reply = [0u8; 64];
    let read = stalled.read(&mut reply).await.expect("the server answers");
    assert!(read > 0 && reply[0] == b'R', "an authentication request");

    let (status, _) = daemon.release(&id_of(&lease), true).await;
    assert_eq!(status, 204);
    // Nothing tells whose login it is, so it is left alone: it could be another tenant's.
    // The recycle gives up instead, and the database is replaced: the next lease gets
    // another one, and the old credentials (which the stalled login may hold) open nothing.
    let again = daemon.lease_ok("default").await;
    assert_ne!(
        again["database"],
        lease["database"],
        "replaced, not reused: {}",
        daemon.log()
    );
    wait_until_dropped(&lease, "the recycled database to be dropped").await;
    assert!(
        daemon.log().contains("stuck in authentication"),
        "the log says why: {}",
        daemon.log()
    );
    let still_open = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        stalled.read(&mut reply),
    )
    .await;
    assert!(
        still_open.is_err(),
        "the stalled login was ended: {still_open:?}"
    );
    assert!(daemon.stop().await.success());
}
