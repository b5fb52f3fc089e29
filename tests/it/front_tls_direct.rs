//! TLS at the PostgreSQL front beyond the SSLRequest: without one (libpq 17's
//! `sslnegotiation=direct`), the client's handshake is its first byte, served where the front
//! has TLS when the client names the protocol in ALPN (`postgresql`), as postgres requires,
//! and refused otherwise; and TLS required (`--front-require-tls`), a plain-text client
//! refused before its password is asked for. The front goes on serving everyone else.

use crate::front::{connect, exchange, front_config, is_error, packet, wait_until_no_lease};
use crate::front_tls::connect_tls;
use crate::support::tls::TestTls;
use crate::support::{current_database, daemon_with_front, poll_until, TestDaemon};

/// What libpq 17 sends with `sslnegotiation=direct`.
const DIRECT: &str = "sslmode=require sslnegotiation=direct";

/// After refusals, the front serves the next client as before, and no lease is left.
async fn serves_a_plain_client(daemon: &TestDaemon, front: std::net::SocketAddr) {
    let (client, task) = connect(&front_config(front, "default", ""))
        .await
        .expect("a plain connection after the refusals");
    current_database(&client).await;
    drop(client);
    let _ = task.await;
    wait_until_no_lease(daemon, "no lease left behind").await;
}

#[tokio::test]
async fn a_direct_handshake_naming_postgresql_gets_tls_and_a_clone() {
    let (daemon, front) = daemon_with_front(&["--front-tls", "self-signed"]).await;
    let tls = TestTls::trusting_any().offering_alpn(b"postgresql");
    let (client, task) = connect_tls(&front_config(front, "default", DIRECT), &tls)
        .await
        .expect("a direct TLS connection through the front");
    assert_eq!(tls.handshakes(), 1);
    let database = current_database(&client).await;
    assert_ne!(database, "default", "a clone");
    let row = client.query_one("SELECT 41 + 1", &[]).await.expect("query");
    assert_eq!(row.get::<_, i32>(0), 42);
    drop(client);
    let _ = task.await;
    wait_until_no_lease(&daemon, "the direct connection's lease released").await;

    // Without ALPN the handshake is not taken for a PostgreSQL one: refused over TLS.
    let bare = TestTls::trusting_any();
    let error = connect_tls(&front_config(front, "default", DIRECT), &bare)
        .await
        .expect_err("a direct handshake without ALPN");
    let refusal = error.as_db_error().expect("an ErrorResponse, over TLS");
    assert_eq!(refusal.code().code(), "08P01");
    assert!(
        refusal.message().contains("ALPN"),
        "the refusal says why: {refusal:?}"
    );
    // Another protocol in ALPN: the handshake itself fails.
    let other = TestTls::trusting_any().offering_alpn(b"http/1.1");
    connect_tls(&front_config(front, "default", DIRECT), &other)
        .await
        .expect_err("a direct handshake for another protocol");
    serves_a_plain_client(&daemon, front).await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_direct_handshake_at_a_front_without_tls_is_closed_and_logged() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let tls = TestTls::trusting_any().offering_alpn(b"postgresql");
    let error = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        connect_tls(&front_config(front, "default", DIRECT), &tls),
    )
    .await
    .expect("refused at once, not left waiting")
    .expect_err("no TLS at this front");
    assert_eq!(tls.handshakes(), 0, "{error}");
    // The only trace of a client that cannot connect: the daemon's log says why.
    poll_until(
        std::time::Duration::from_secs(10),
        "the refusal's log line",
        || async {
            daemon
                .log()
                .contains("a TLS handshake without an SSLRequest, and the front serves no TLS")
                .then_some(())
        },
    )
    .await;
    serves_a_plain_client(&daemon, front).await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn with_tls_required_a_plain_client_is_refused_before_its_password() {
    let daemon = TestDaemon::builder()
        .token("front-secret")
        .args(["--front-listen", "127.0.0.1:0"])
        .args(["--front-tls", "self-signed", "--front-require-tls"])
        .start()
        .await;
    let front = daemon.front_address().await;
    assert_eq!(daemon.status().await["front"]["tls"]["required"], true);
    assert!(
        daemon
            .log()
            .contains(", required); try: PGPASSWORD=\"$PGLEASE_TOKEN\" PGSSLMODE=require psql"),
        "{}",
        daemon.log()
    );
    // The StartupMessage in plain text gets 28000 at once: no AuthenticationCleartextPassword
    // ('R') first, so the token is never sent in the clear.
    let startup = packet(3 << 16, b"user\0u\0database\0default\0\0");
    let answer = exchange(front, &startup).await;
    assert!(is_error(&answer, "28000"), "{answer:?}");
    assert!(
        String::from_utf8_lossy(&answer).contains("sslmode=require"),
        "the refusal says what to do: {answer:?}"
    );
    let plain = front_config(front, "default", "password=front-secret sslmode=disable");
    let error = connect(&plain).await.expect_err("plain text refused");
    let refusal = error.as_db_error().expect("an ErrorResponse");
    assert_eq!(refusal.code().code(), "28000");
    // Over TLS, with the token, the same client gets its clone.
    let tls = TestTls::trusting_any();
    let config = front_config(front, "default", "password=front-secret sslmode=require");
    let (client, task) = connect_tls(&config, &tls).await.expect("over TLS");
    current_database(&client).await;
    drop(client);
    let _ = task.await;
    wait_until_no_lease(&daemon, "the TLS connection's lease released").await;
    assert!(daemon.stop().await.success());
}
