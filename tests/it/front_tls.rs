//! TLS at the PostgreSQL front (`--front-tls self-signed`, `--front-tls-cert` with
//! `--front-tls-key`): a client that asks for TLS gets it and the rest of its connection
//! (start-up, lease, relay, cancel) runs over it, while one that does not is served in plain
//! text; without TLS, `sslmode=require` is refused as postgres refuses it and `prefer` goes
//! on in plain text; the operator's files are served, or stop the start naming the file;
//! broken handshakes end their own connection only. Postgres' side stays plain, so the proof
//! of encryption is the client's: its handshakes, psql's `\conninfo`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::Client;

use crate::front::{
    cancels_a_sleep, connect, exchange, front_config, is_error, packet, wait_until_no_lease,
};
use crate::support::tls::TestTls;
use crate::support::{
    current_database, daemon_with_front, poll_until, scratch_dir, tool_available, TestDaemon,
};

/// An SSLRequest.
const SSL_REQUEST_CODE: u32 = (1234 << 16) | 5679;

/// Connects through the front with `tls`; the connection runs in a task of its own.
pub(crate) async fn connect_tls(
    config: &str,
    tls: &TestTls,
) -> Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(config, tls.clone()).await?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// Runs psql on `conninfo` with `commands` (each a -c); returns whether it succeeded and
/// what it printed.
async fn psql(conninfo: String, commands: &[&str]) -> (bool, String) {
    let commands: Vec<String> = commands.iter().map(|c| (*c).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let mut psql = std::process::Command::new("psql");
        psql.args(["-X", "-A", "-t", &conninfo]);
        for command in &commands {
            psql.args(["-c", command]);
        }
        psql.env_remove("PGPASSWORD")
            .env_remove("PGSSLMODE")
            .env_remove("PGUSER")
            .output()
            .expect("run psql")
    })
    .await
    .expect("join");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The `/status` rows of the front's open connections.
async fn front_connections(daemon: &TestDaemon) -> Vec<serde_json::Value> {
    daemon.status().await["front"]["connections"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Whether the daemon logged a lease of `database` at the front with `tls=<tls>`.
fn leased_with_tls(log: &str, database: &str, tls: bool) -> bool {
    let (database, tls) = (format!("database={database}"), format!("tls={tls}"));
    log.lines().any(|line| {
        line.contains("leased at the PostgreSQL front")
            && line.split_whitespace().any(|word| word == database)
            && line.split_whitespace().any(|word| word == tls)
    })
}

#[tokio::test]
async fn with_a_self_signed_certificate_clients_that_ask_get_tls_and_others_plain_text() {
    let (daemon, front) = daemon_with_front(&["--front-tls", "self-signed"]).await;
    let log = daemon.log();
    assert!(
        log.contains("PostgreSQL front listening on 127.0.0.1:")
            && log.contains("(TLS with a self-signed certificate)"),
        "{log}"
    );
    assert_eq!(daemon.status().await["front"]["tls"]["mode"], "self-signed");

    let tls = TestTls::trusting_any();
    let (client, task) = connect_tls(&front_config(front, "default", "sslmode=require"), &tls)
        .await
        .expect("TLS through the front");
    assert_eq!(tls.handshakes(), 1, "the connection is encrypted");
    let database = current_database(&client).await;
    assert_ne!(database, "default", "a clone");
    // A megabyte each way: many TLS records through the relay, in order.
    let big = "x".repeat(1 << 20);
    let row = client
        .query_one("SELECT $1::text || 'y'", &[&big])
        .await
        .expect("a big round trip");
    let echoed: String = row.get(0);
    assert_eq!(
        (echoed.len(), echoed.ends_with("xy")),
        (big.len() + 1, true)
    );
    // Whoever does not ask is served in plain text, beside it.
    let (plain, plain_task) = connect(&front_config(front, "default", "sslmode=disable"))
        .await
        .expect("plain text through the same front");
    let plain_database = current_database(&plain).await;
    let rows = front_connections(&daemon).await;
    let tls_of = |database: &str| {
        rows.iter()
            .find(|row| row["database"] == database)
            .map(|row| row["tls"].clone())
    };
    assert_eq!(tls_of(&database), Some(true.into()), "{rows:?}");
    assert_eq!(tls_of(&plain_database), Some(false.into()), "{rows:?}");
    let log = daemon.log();
    assert!(leased_with_tls(&log, &database, true), "{log}");
    assert!(leased_with_tls(&log, &plain_database, false), "{log}");
    drop((client, plain));
    let _ = tokio::join!(task, plain_task);
    wait_until_no_lease(&daemon, "both leases released").await;

    // psql says so itself: sslmode=require gets an SSL connection, disable a plain one.
    if tool_available(
        "psql",
        "with_a_self_signed_certificate_clients_that_ask_get_tls_and_others_plain_text",
        "install postgresql-client",
    ) {
        let conninfo = |sslmode: &str| {
            format!(
                "host={} port={} user=tester dbname=default sslmode={sslmode}",
                front.ip(),
                front.port()
            )
        };
        let (ok, text) = psql(
            conninfo("require"),
            &["\\conninfo", "SELECT current_database() <> 'default'"],
        )
        .await;
        assert!(ok, "{text}");
        assert!(text.contains("SSL connection (protocol: TLS"), "{text}");
        assert!(text.lines().any(|line| line == "t"), "{text}");
        let (ok, text) = psql(conninfo("disable"), &["\\conninfo"]).await;
        assert!(ok && !text.contains("SSL connection"), "{text}");
        wait_until_no_lease(&daemon, "psql's leases released").await;
    }
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn without_tls_sslmode_require_is_refused_and_prefer_goes_on_in_plain_text() {
    let (daemon, front) = daemon_with_front(&[]).await;
    assert!(daemon.log().contains("(TLS off)"), "{}", daemon.log());
    assert_eq!(daemon.status().await["front"]["tls"]["mode"], "off");
    let tls = TestTls::trusting_any();
    let error = connect_tls(&front_config(front, "default", "sslmode=require"), &tls)
        .await
        .expect_err("no TLS at the front");
    let error = pglease_pool::pg_message(&error);
    assert!(error.contains("server does not support TLS"), "{error}");
    let (client, _task) = connect_tls(&front_config(front, "default", "sslmode=prefer"), &tls)
        .await
        .expect("prefer goes on in plain text");
    assert_ne!(current_database(&client).await, "default");
    assert_eq!(tls.handshakes(), 0);
    drop(client);
    if tool_available(
        "psql",
        "without_tls_sslmode_require_is_refused_and_prefer_goes_on_in_plain_text",
        "install postgresql-client",
    ) {
        let conninfo = format!(
            "host={} port={} user=tester dbname=default sslmode=require",
            front.ip(),
            front.port()
        );
        let (ok, text) = psql(conninfo, &["SELECT 1"]).await;
        assert!(!ok, "{text}");
        assert!(
            text.contains("server does not support SSL, but SSL was required"),
            "{text}"
        );
    }
    wait_until_no_lease(&daemon, "the lease released").await;
    assert!(daemon.stop().await.success());
}

/// Writes a certificate for `names` and its key into `dir`, PEM; returns the certificate
/// (DER) and both files.
fn write_certificate(
    dir: &Path,
    names: &[&str],
) -> (
    rustls::pki_types::CertificateDer<'static>,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let names = names
        .iter()
        .map(|name| (*name).to_owned())
        .collect::<Vec<_>>();
    let cert = rcgen::CertificateParams::new(names)
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let (cert_file, key_file) = (dir.join("front.crt"), dir.join("front.key"));
    std::fs::write(&cert_file, cert.pem()).expect("write the certificate");
    std::fs::write(&key_file, key.serialize_pem()).expect("write the key");
    (cert.der().clone(), cert_file, key_file)
}

#[tokio::test]
async fn the_operators_certificate_is_served_and_verifies() {
    let dir = scratch_dir("front-tls-files");
    let (cert, cert_file, key_file) = write_certificate(&dir, &["localhost", "127.0.0.1"]);
    let (cert_arg, key_arg) = (
        cert_file.display().to_string(),
        key_file.display().to_string(),
    );
    let (daemon, front) =
        daemon_with_front(&["--front-tls-cert", &cert_arg, "--front-tls-key", &key_arg]).await;
    assert!(
        daemon
            .log()
            .contains(&format!("(TLS with the certificate {cert_arg})")),
        "{}",
        daemon.log()
    );
    let tls = daemon.status().await["front"]["tls"].clone();
    assert_eq!(tls["mode"], "certificate");
    assert_eq!(tls["cert_file"], cert_arg.as_str());
    // Verified as verify-full would: this certificate, for the address connected to.
    let verifying = TestTls::trusting(cert);
    let (client, _task) = connect_tls(
        &front_config(front, "default", "sslmode=require"),
        &verifying,
    )
    .await
    .expect("the operator's certificate verifies");
    assert_eq!(verifying.handshakes(), 1);
    assert_ne!(current_database(&client).await, "default");
    // A client that trusts another certificate refuses this one.
    let other_dir = dir.join("other");
    std::fs::create_dir_all(&other_dir).expect("dir");
    let (other, _, _) = write_certificate(&other_dir, &["localhost", "127.0.0.1"]);
    let error = connect_tls(
        &front_config(front, "default", "sslmode=require"),
        &TestTls::trusting(other),
    )
    .await
    .expect_err("not the certificate it trusts");
    let error = pglease_pool::pg_message(&error);
    assert!(error.contains("invalid peer certificate"), "{error}");
    drop(client);
    wait_until_no_lease(&daemon, "the lease released").await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_missing_or_garbage_certificate_file_stops_the_start_naming_it() {
    let dir = scratch_dir("front-tls-bad-files");
    let (_, cert_file, _) = write_certificate(&dir, &["localhost"]);
    let missing = dir.join("no-such.key");
    let garbage = dir.join("garbage.crt");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n",
    )
    .expect("write");
    for (cert, key, expected) in [
        (&cert_file, &missing, "cannot read it"),
        (&garbage, &missing, "-----END"),
        (&garbage, &cert_file, "-----END"),
    ] {
        let (cert_arg, key_arg) = (cert.display().to_string(), key.display().to_string());
        let (status, log) = TestDaemon::builder()
            .args(["--front-listen", "127.0.0.1:0"])
            .args(["--front-tls-cert", &cert_arg, "--front-tls-key", &key_arg])
            .run_to_exit();
        assert_eq!(status.code(), Some(64), "{log}");
        let named = if expected == "cannot read it" {
            &key_arg
        } else {
            &cert_arg
        };
        assert!(
            log.contains(named.as_str()) && log.contains(expected),
            "{cert_arg} {key_arg}: {log}"
        );
        assert!(
            !log.contains("not base64"),
            "no file content in the error: {log}"
        );
    }
}

#[tokio::test]
async fn a_cancel_over_tls_reaches_the_backend() {
    let (daemon, front) = daemon_with_front(&["--front-tls", "self-signed"]).await;
    let tls = TestTls::trusting_any();
    let (client, _task) = connect_tls(&front_config(front, "default", "sslmode=require"), &tls)
        .await
        .expect("connect");
    // Each cancel request asks for TLS too, and is sent inside it.
    cancels_a_sleep(client, tls.clone()).await;
    assert!(tls.handshakes() >= 2, "the cancel went over TLS too");
    assert!(daemon.stop().await.success());
}

/// Sends an SSLRequest on a new connection, expects `S`, then sends `then` and closes the
/// sending side; returns what the front answered after `S` before it closed.
async fn after_yes_to_tls(front: SocketAddr, then: &[u8]) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(front)
        .await
        .expect("connect");
    stream
        .write_all(&packet(SSL_REQUEST_CODE, &[]))
        .await
        .expect("write");
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await.expect("an answer");
    assert_eq!(&answer, b"S");
    let _ = stream.write_all(then).await;
    let _ = stream.shutdown().await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut rest))
        .await
        .expect("the front closes the connection");
    // A reset ends the answer as well.
    let _ = read;
    rest
}

#[tokio::test]
async fn broken_tls_handshakes_end_their_own_connection_only() {
    let (daemon, front) = daemon_with_front(&["--front-tls", "self-signed"]).await;
    let tls = TestTls::trusting_any();
    let (client, _task) = connect_tls(&front_config(front, "default", "sslmode=require"), &tls)
        .await
        .expect("connect");
    let database = current_database(&client).await;

    // After S: garbage, half a ClientHello, nothing at all. Each connection is closed with
    // at most a TLS alert (record type 21), never a plain-text word.
    let half_hello = [
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    for (what, then) in [
        ("garbage", &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]),
        ("half a ClientHello", &half_hello[..]),
        ("nothing", &b""[..]),
    ] {
        let answer = after_yes_to_tls(front, then).await;
        assert!(answer.is_empty() || answer[0] == 21, "{what}: {answer:?}");
    }
    // Bytes sent with the SSLRequest, before the answer, would be read as if encrypted:
    // refused in plain text, and no S.
    let startup = packet(3 << 16, b"user\0u\0database\0default\0\0");
    let answer = exchange(front, &[packet(SSL_REQUEST_CODE, &[]), startup].concat()).await;
    assert!(is_error(&answer, "08P01"), "{answer:?}");
    assert!(
        String::from_utf8_lossy(&answer).contains("unencrypted data after SSL request"),
        "{answer:?}"
    );
    poll_until(
        Duration::from_secs(10),
        "the failed handshakes in the log",
        || async {
            daemon
                .log()
                .contains("the TLS handshake failed")
                .then_some(())
        },
    )
    .await;

    // The other connection did not notice; the front serves the next ones.
    assert_eq!(current_database(&client).await, database);
    let (next, _next_task) = connect_tls(&front_config(front, "default", "sslmode=require"), &tls)
        .await
        .expect("the next TLS connection");
    assert_ne!(current_database(&next).await, "default");
    assert_eq!(
        daemon.open_leases().await.len(),
        2,
        "none for the broken ones"
    );
    drop((client, next));
    wait_until_no_lease(&daemon, "the leases released").await;
    assert!(daemon.stop().await.success());
}
