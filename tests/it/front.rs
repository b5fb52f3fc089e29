//! The PostgreSQL front (issue 30, `--front-listen`): a client that connects to database
//! `<template>` gets a fresh clone of it, leased as `POST /lease` would and released when the
//! client disconnects; errors are ErrorResponses with fitting SQLSTATEs; cancel works; the
//! front survives hostile start-up packets. Real daemon, real postgres, real drivers.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls, Socket};

use crate::support::{
    binary, current_database, daemon_with_front, poll_until, tool_available, TestDaemon,
};

/// The connection string of database `database` at the front.
pub(crate) fn front_config(front: SocketAddr, database: &str, extra: &str) -> String {
    format!(
        "host={} port={} user=tester dbname={database} {extra}",
        front.ip(),
        front.port()
    )
}

/// Connects through the front; the connection runs in a task the caller may abort (which
/// closes the socket, as a killed client's does).
pub(crate) async fn connect(
    config: &str,
) -> Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(config, NoTls).await?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// Runs `pg_sleep(30)` on `client` and sends cancels with `tls` until it returns (a cancel
/// that arrives before the query is ignored, as postgres ignores one for an idle backend);
/// the query must end cancelled, within 3 s.
pub(crate) async fn cancels_a_sleep<T>(client: Client, tls: T)
where
    T: MakeTlsConnect<Socket> + Clone,
{
    let cancel = client.cancel_token();
    let started = std::time::Instant::now();
    let sleeping = tokio::spawn(async move {
        let outcome = client.batch_execute("SELECT pg_sleep(30)").await;
        (outcome, client)
    });
    poll_until(
        Duration::from_secs(10),
        "the query to be cancelled",
        || async {
            if sleeping.is_finished() {
                return Some(());
            }
            cancel.cancel_query(tls.clone()).await.expect("cancel sent");
            None
        },
    )
    .await;
    let elapsed = started.elapsed();
    let (outcome, _client) = sleeping.await.expect("join");
    let error = outcome.expect_err("cancelled");
    assert_eq!(error.code(), Some(&SqlState::QUERY_CANCELED), "{error}");
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
}

/// Waits until `/status` shows no open lease.
pub(crate) async fn wait_until_no_lease(daemon: &TestDaemon, what: &str) {
    poll_until(Duration::from_secs(10), what, || async {
        daemon.open_leases().await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn connecting_to_a_template_name_leases_a_clone_and_closing_releases_it() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let config = front_config(front, "default", "application_name=front-test");
    let (first, first_task) = connect(&config).await.expect("connect through the front");
    let first_db = current_database(&first).await;
    assert_ne!(first_db, "default", "a clone, not the template's name");
    // Relayed over the server's private socket (no TCP stack, no SCRAM at login), as the
    // lease's own role.
    let row = first
        .query_one("SELECT inet_server_addr() IS NULL, current_user", &[])
        .await
        .expect("query");
    assert!(row.get::<_, bool>(0), "a unix socket connection");
    assert_eq!(row.get::<_, String>(1), first_db, "the lease's role");
    first
        .batch_execute("CREATE TABLE t (id int); INSERT INTO t VALUES (1)")
        .await
        .expect("the holder owns its clone");
    let (second, second_task) = connect(&config).await.expect("a second connection");
    let second_db = current_database(&second).await;
    assert_ne!(first_db, second_db, "each connection is a lease of its own");
    let leases = daemon.open_leases().await;
    assert_eq!(leases.len(), 2, "{leases:?}");
    assert!(
        leases
            .iter()
            .all(|lease| lease["label"] == "front-test" && lease["template"] == "default"),
        "application_name is the label: {leases:?}"
    );
    drop((first, second));
    let _ = tokio::join!(first_task, second_task);
    wait_until_no_lease(
        &daemon,
        "both leases released after their connections closed",
    )
    .await;
    assert!(daemon.log().contains("leased at the PostgreSQL front"));
    // The close is logged after the release, so it may come a moment after the leases go.
    poll_until(Duration::from_secs(10), "the close's log line", || async {
        daemon.log().contains("bytes_to_server=").then_some(())
    })
    .await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn an_unknown_template_is_3d000_naming_the_templates_there_are() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let error = connect(&front_config(front, "nope", ""))
        .await
        .expect_err("no such template");
    assert_eq!(
        error.code(),
        Some(&SqlState::INVALID_CATALOG_NAME),
        "{error}"
    );
    let message = error.as_db_error().expect("a server error").message();
    assert!(
        message.contains("\"nope\"") && message.contains("default"),
        "{message}"
    );
    // A database name that no template can have is refused the same way.
    let error = connect(&front_config(front, "Not-A-Template", ""))
        .await
        .expect_err("an invalid name");
    assert_eq!(
        error.code(),
        Some(&SqlState::INVALID_CATALOG_NAME),
        "{error}"
    );
    assert!(daemon.open_leases().await.is_empty());
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn with_a_token_the_password_is_the_token() {
    let daemon = TestDaemon::builder()
        .token("s3cret-front")
        .args(["--front-listen", "127.0.0.1:0"])
        .start()
        .await;
    let front = daemon.front_address().await;
    let error = connect(&front_config(front, "default", "password=wrong"))
        .await
        .expect_err("a wrong password");
    assert_eq!(error.code(), Some(&SqlState::INVALID_PASSWORD), "{error}");
    let (client, _task) = connect(&front_config(front, "default", "password=s3cret-front"))
        .await
        .expect("the token is the password");
    assert_ne!(current_database(&client).await, "default");
    assert!(
        !daemon.log().contains("s3cret-front"),
        "the token never shows in the log"
    );
    drop(client);
    wait_until_no_lease(&daemon, "the lease released").await;
    assert!(daemon.stop().await.success());
}

#[test]
fn a_front_beyond_loopback_needs_a_token() {
    let out = binary()
        .args(["serve", "--front-listen", "0.0.0.0:0"])
        .env_remove("PGLEASE_TOKEN")
        .env_remove("PGLEASE_TOKEN_FILE")
        .output()
        .expect("run");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{log}");
    assert!(
        log.contains("--front-listen") && log.contains("--token"),
        "{log}"
    );
}

#[tokio::test]
async fn a_cancel_through_the_front_reaches_the_backend() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let (client, _task) = connect(&front_config(front, "default", ""))
        .await
        .expect("connect");
    cancels_a_sleep(client, NoTls).await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_client_killed_mid_query_releases_its_lease() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let (client, connection) = connect(&front_config(front, "default", ""))
        .await
        .expect("connect");
    let query = tokio::spawn(async move {
        let _ = client.batch_execute("SELECT pg_sleep(30)").await;
    });
    poll_until(Duration::from_secs(10), "the lease to show", || async {
        (daemon.open_leases().await.len() == 1).then_some(())
    })
    .await;
    // Time for the query to reach the server (a query not yet sent would make the same
    // test of a client that leaves, only less of one).
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The socket closes with the task, mid-query, as a killed client's does.
    connection.abort();
    query.abort();
    let started = std::time::Instant::now();
    wait_until_no_lease(&daemon, "the killed client's lease released").await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "released only after {:?}, not while its query still ran",
        started.elapsed()
    );
    assert!(daemon.stop().await.success());
}

/// Sends `bytes` on a new connection, closes the sending side, and returns everything the
/// front answered before it closed.
pub(crate) async fn exchange(front: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(front)
        .await
        .expect("connect");
    // The front may close before it has read everything: that is an answer too.
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut answer))
        .await
        .expect("the front closes the connection");
    // A reset (the front closed with our bytes unread) ends the answer as well.
    let _ = read;
    answer
}

/// Whether `answer` is a FATAL ErrorResponse with SQLSTATE `code`.
pub(crate) fn is_error(answer: &[u8], code: &str) -> bool {
    answer.first() == Some(&b'E')
        && answer
            .windows(code.len() + 1)
            .any(|window| window[0] == b'C' && &window[1..] == code.as_bytes())
}

/// A start-up packet: its length, `code` (a protocol version or a request's), `body`.
pub(crate) fn packet(code: u32, body: &[u8]) -> Vec<u8> {
    let mut packet = ((8 + body.len()) as u32).to_be_bytes().to_vec();
    packet.extend_from_slice(&code.to_be_bytes());
    packet.extend_from_slice(body);
    packet
}

#[tokio::test]
async fn hostile_startup_packets_are_refused_and_the_front_keeps_serving() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let ssl_request = packet((1234 << 16) | 5679, &[]);
    let startup = packet(3 << 16, b"user\0u\0database\0default\0\0");
    // Refused with a protocol violation, and closed.
    for (what, bytes) in [
        ("length 0", 0u32.to_be_bytes().to_vec()),
        ("length 7", 7u32.to_be_bytes().to_vec()),
        ("a huge length", 0x7fff_ffffu32.to_be_bytes().to_vec()),
        ("protocol 2.0", packet(2 << 16, b"user\0u\0\0")),
        ("no terminator", packet(3 << 16, b"user\0u\0")),
        ("a 3.2 cancel key", packet((1234 << 16) | 5678, &[0; 40])),
    ] {
        let answer = exchange(front, &bytes).await;
        assert!(is_error(&answer, "08P01"), "{what}: {answer:?}");
    }
    // Cut off: closed without a word, as postgres does.
    let mut truncated = startup.clone();
    truncated.truncate(startup.len() - 5);
    assert_eq!(exchange(front, &truncated).await, b"", "a truncated packet");
    // SSLRequest twice: refused once with N, then a protocol violation.
    let twice = [ssl_request.clone(), ssl_request.clone()].concat();
    let answer = exchange(front, &twice).await;
    assert_eq!(answer.first(), Some(&b'N'), "{answer:?}");
    assert!(is_error(&answer[1..], "08P01"), "{answer:?}");
    // Random bytes: refused or closed, never a lease.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..20 {
        let bytes: Vec<u8> = (0..64)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let answer = exchange(front, &bytes).await;
        assert!(
            answer.is_empty() || is_error(&answer, "08P01"),
            "{bytes:?}: {answer:?}"
        );
    }
    // A client that sends nothing is cut off after the start-up's 10 s.
    let started = std::time::Instant::now();
    let mut silent = tokio::net::TcpStream::connect(front)
        .await
        .expect("connect");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), silent.read_to_end(&mut answer))
        .await
        .expect("closed")
        .expect("read");
    assert!(is_error(&answer, "08P01"), "{answer:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );

    assert!(daemon.open_leases().await.is_empty());
    let (client, _task) = connect(&front_config(front, "default", ""))
        .await
        .expect("a normal connection still works");
    assert_ne!(current_database(&client).await, "default");
    drop(client);
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn protocol_3_2_and_its_options_are_negotiated_down_to_3_0() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let mut stream = tokio::net::TcpStream::connect(front)
        .await
        .expect("connect");
    let startup = packet(
        (3 << 16) | 2,
        b"user\0u\0database\0default\0_pq_.future\0on\0\0",
    );
    stream.write_all(&startup).await.expect("write");
    // NegotiateProtocolVersion (3.0, the option listed), then AuthenticationOk.
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).await.expect("read");
    assert_eq!(head[0], b'v');
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0u8; length - 4];
    stream.read_exact(&mut body).await.expect("read");
    assert_eq!(&body[..8], &[0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(&body[8..], b"_pq_.future\0");
    let mut ok = [0u8; 9];
    stream.read_exact(&mut ok).await.expect("read");
    assert_eq!(ok, [b'R', 0, 0, 0, 8, 0, 0, 0, 0]);
    drop(stream);
    wait_until_no_lease(&daemon, "the lease of a client that left released").await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn psql_gets_a_scratch_database_from_the_front() {
    let test = "psql_gets_a_scratch_database_from_the_front";
    if !tool_available("psql", test, "install postgresql-client") {
        return;
    }
    let (daemon, front) = daemon_with_front(&[]).await;
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("psql")
            .args(["-X", "-A", "-t", "-h", &front.ip().to_string()])
            .args(["-p", &front.port().to_string(), "default"])
            .args(["-c", "SELECT 1 + 1, current_database() <> 'default'"])
            .env_remove("PGPASSWORD")
            .env_remove("PGSSLMODE")
            .env_remove("PGUSER")
            .output()
            .expect("run psql")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "2|t");
    wait_until_no_lease(&daemon, "psql's lease released").await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_connection_keeps_its_lease_past_the_time_to_live_while_it_is_open() {
    let daemon = TestDaemon::builder()
        .args(["--front-listen", "127.0.0.1:0", "--default-ttl", "2"])
        .start()
        .await;
    let front = daemon.front_address().await;
    let (client, task) = connect(&front_config(front, "default", ""))
        .await
        .expect("connect");
    let database = current_database(&client).await;
    // Three times the time to live: renewed meanwhile, not expired under the connection.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(current_database(&client).await, database);
    let leases = daemon.open_leases().await;
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(daemon.status().await["limits"]["expired"], 0);
    drop(client);
    let _ = task.await;
    wait_until_no_lease(&daemon, "released when the connection closed").await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn the_front_is_on_by_default_and_a_taken_default_port_is_skipped() {
    // No --front-listen: the front is on, on loopback (here on a port of its own, as the
    // API's --listen has port 0).
    let daemon = TestDaemon::start().await;
    let front = daemon.front_address().await;
    assert!(front.ip().is_loopback(), "{front}");
    let (client, _task) = connect(&front_config(front, "default", ""))
        .await
        .expect("a clone through the default front");
    assert_ne!(current_database(&client).await, "default");
    drop(client);
    assert!(daemon.stop().await.success());

    // The default port, the API's + 1, taken: the daemon serves without its front.
    let (taken, api_port) = loop {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        if port > 1024 && std::net::TcpListener::bind(("127.0.0.1", port - 1)).is_ok() {
            break (taken, port - 1);
        }
    };
    let daemon = TestDaemon::builder()
        .args(["--listen", &format!("127.0.0.1:{api_port}")])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    assert!(lease["url"].is_string(), "the API serves: {lease}");
    let log = daemon.log();
    assert!(
        log.contains("default address is not free") && log.contains("--front-listen off"),
        "{log}"
    );
    assert!(daemon.status().await.get("front").is_none());
    assert!(daemon.stop().await.success());
    drop(taken);

    // A chosen address that is taken stops the start, saying which.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let (status, log) = TestDaemon::builder()
        .args(["--front-listen", &format!("127.0.0.1:{port}")])
        .run_to_exit();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("cannot listen for the PostgreSQL front"),
        "{log}"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_are_refused_and_the_front_keeps_serving() {
    let daemon = TestDaemon::builder()
        .args([
            "--front-listen",
            "127.0.0.1:0",
            "--front-max-connections",
            "2",
        ])
        .start()
        .await;
    let front = daemon.front_address().await;
    // Two connections that say nothing hold the two places (until the start-up timeout).
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(
            tokio::net::TcpStream::connect(front)
                .await
                .expect("connect"),
        );
    }
    poll_until(
        Duration::from_secs(10),
        "two connections at the front",
        || async {
            let open = daemon.status().await["front"]["connections"]
                .as_array()
                .map_or(0, Vec::len);
            (open == 2).then_some(())
        },
    )
    .await;
    let answer = exchange(front, b"").await;
    assert!(is_error(&answer, "53300"), "{answer:?}");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("--front-max-connections"), "{text}");
    // A place freed is a place for the next, which gets its database.
    drop(silent.pop());
    let client = poll_until(
        Duration::from_secs(10),
        "a connection in the freed place",
        || async { connect(&front_config(front, "default", "")).await.ok() },
    )
    .await;
    assert_ne!(current_database(&client.0).await, "default");
    assert!(daemon.log().contains("the PostgreSQL front is full"));
    drop(client);
    assert!(daemon.stop().await.success());
}
