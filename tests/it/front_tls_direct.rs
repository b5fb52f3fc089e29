//! TLS without an SSLRequest at the PostgreSQL front (libpq 17's `sslnegotiation=direct`):
//! the client's handshake is its first byte. Served where the front has TLS, when the client
//! names the protocol in ALPN (`postgresql`), as postgres requires; refused otherwise, and the
//! front goes on serving everyone else.

use crate::front::{connect, front_config, wait_until_no_lease};
use crate::front_tls::connect_tls;
use crate::support::tls::TestTls;
use crate::support::{current_database, daemon_with_front, poll_until};

/// What libpq 17 sends with `sslnegotiation=direct`.
const DIRECT: &str = "sslmode=require sslnegotiation=direct";

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
    // The front serves the next client as before.
    let (client, task) = connect(&front_config(front, "default", ""))
        .await
        .expect("a plain connection after the refusals");
    current_database(&client).await;
    drop(client);
    let _ = task.await;
    wait_until_no_lease(&daemon, "no lease left behind").await;
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
    let (client, task) = connect(&front_config(front, "default", ""))
        .await
        .expect("a plain connection after the refusal");
    current_database(&client).await;
    drop(client);
    let _ = task.await;
    assert!(daemon.open_leases().await.len() <= 1);
    assert!(daemon.stop().await.success());
}
