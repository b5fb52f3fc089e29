//! A session in process: a real front over a fake pool (`pglease_pool::testing`), a client
//! and a stand-in for postgres on loopback sockets, which speaks just enough of the protocol
//! to let the lease log in (trust: AuthenticationOk, BackendKeyData, ReadyForQuery) and then
//! passes on what it receives. The tests end a session while it relays, however a session
//! can end, and check that the pool receives the release of its lease; and they relay
//! several connections to one key, whose lease the key alone renews.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{BufMut, BytesMut};
use pglease_pool::testing::{fake_pool, FakeActor, FakeCommand};
use pglease_pool::{ConnectInfo, DbName, Lease, LeaseId, Servers, TemplateName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::run;
use crate::{FrontConfig, FrontHandle, DEFAULT_KEY_GRACE, DEFAULT_MAX_CONNECTIONS};

/// How long a test waits for what must come at once, before failing instead of hanging.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

fn config() -> FrontConfig {
    FrontConfig {
        default_wait: Duration::from_secs(5),
        token: None,
        key_grace: DEFAULT_KEY_GRACE,
        max_connections: DEFAULT_MAX_CONNECTIONS,
        tls: None,
        require_tls: false,
    }
}

/// A front over a fake pool, and the fake; `panics` makes its sessions panic as their relay
/// begins.
fn front(panics: bool) -> (FrontHandle, FakeActor) {
    let (handle, actor) = fake_pool();
    let mut front = FrontHandle::new(Servers::single(handle, 16, "16.4"), config());
    Arc::get_mut(&mut front.front)
        .expect("nothing else holds the new front")
        .panic_when_relaying = panics;
    (front, actor)
}

/// A stand-in for postgres that lets every login in without a password and sends every
/// byte it receives afterwards to the returned channel.
async fn fake_postgres() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("an address");
    let (sent, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let sent = sent.clone();
            tokio::spawn(async move {
                // The StartupMessage: its length (itself included), then the rest.
                let length = stream.read_i32().await.expect("a startup length");
                let mut rest = vec![0; usize::try_from(length - 4).expect("a length")];
                stream.read_exact(&mut rest).await.expect("a startup");
                let mut out = BytesMut::new();
                message(&mut out, b'R', &0_i32.to_be_bytes());
                message(&mut out, b'K', &[0, 0, 0, 42, 0, 0, 0, 7]);
                message(&mut out, b'Z', b"I");
                stream.write_all(&out).await.expect("the greeting");
                let mut buf = vec![0; 4096];
                while let Ok(n @ 1..) = stream.read(&mut buf).await {
                    let _ = sent.send(buf[..n].to_vec());
                }
            });
        }
    });
    (address, received)
}

/// Appends one protocol message: its type, its length, its body.
fn message(out: &mut BytesMut, kind: u8, body: &[u8]) {
    out.put_u8(kind);
    out.put_i32(i32::try_from(body.len() + 4).expect("a small message"));
    out.put_slice(body);
}

/// A lease of `app` whose database is the stand-in at `address`, renewed far off: no
/// renewal reaches the pool during a test.
fn lease_at(address: SocketAddr) -> Lease {
    lease_living(address, Duration::from_secs(3600))
}

/// A lease of `app` at `address` that expires `ttl` from now on the wall clock.
fn lease_living(address: SocketAddr, ttl: Duration) -> Lease {
    Lease {
        id: LeaseId::random(0),
        template: TemplateName::new("app").expect("a valid name"),
        fingerprint: "f00d".repeat(16),
        connect: ConnectInfo {
            host: address.ip().to_string(),
            port: address.port(),
            user: "pglease_lease".into(),
            password: "s3cret".into(),
            database: DbName::from_server("pglease_app_1".into()),
            ssl: false,
        },
        expires_at: SystemTime::now() + ttl,
        number: 0,
        local_socket: None,
    }
}

/// Starts a session of `front` for a client that asks for database `app`, answers its lease
/// with one of a stand-in postgres, and waits until the client has its ReadyForQuery.
/// Returns the session's task, the client, the lease's id and what the stand-in receives.
async fn relaying_session(
    front: &FrontHandle,
    actor: &mut FakeActor,
) -> (
    JoinHandle<()>,
    TcpStream,
    LeaseId,
    mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let (session, mut client) = start_session(front, "app").await;
    let (postgres, received) = fake_postgres().await;
    let lease = lease_at(postgres);
    let id = lease.id.clone();
    match tokio::time::timeout(STEP_TIMEOUT, actor.recv()).await {
        Ok(Some(FakeCommand::Lease { request, reply })) => {
            assert_eq!(request.template.as_str(), "app");
            reply
                .send(Ok(lease))
                .expect("the session waits for its lease");
        }
        other => panic!("expected the session's lease request, got {other:?}"),
    }
    read_greeting(&mut client).await;
    (session, client, id, received)
}

/// Starts a session of `front` for a client that asks for `database`, up to its
/// StartupMessage sent.
async fn start_session(front: &FrontHandle, database: &str) -> (JoinHandle<()>, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let mut client = TcpStream::connect(listener.local_addr().expect("an address"))
        .await
        .expect("connect");
    let (stream, peer) = listener.accept().await.expect("accept");
    let session = tokio::spawn(run(Arc::clone(&front.front), stream, peer));

    let mut body = BytesMut::new();
    body.put_i32(196_608); // protocol 3.0
    for text in ["user", "tester", "database", database, ""] {
        body.put_slice(text.as_bytes());
        body.put_u8(0);
    }
    let mut startup = BytesMut::new();
    startup.put_i32(i32::try_from(body.len() + 4).expect("a small message"));
    startup.put_slice(&body);
    client.write_all(&startup).await.expect("the startup");
    (session, client)
}

/// Reads what the front sends a client whose lease it logged in: AuthenticationOk, then
/// the server's greeting with the front's BackendKeyData, up to ReadyForQuery. From there
/// on the session relays.
async fn read_greeting(client: &mut TcpStream) {
    let mut seen = Vec::new();
    loop {
        let kind = tokio::time::timeout(STEP_TIMEOUT, client.read_u8())
            .await
            .expect("the greeting in time")
            .expect("a message from the front");
        let length = client.read_i32().await.expect("a length");
        let mut rest = vec![0; usize::try_from(length - 4).expect("a length")];
        client.read_exact(&mut rest).await.expect("a message");
        seen.push(char::from(kind));
        if kind == b'Z' {
            break;
        }
    }
    assert_eq!(seen, ['R', 'K', 'Z'], "what the client was sent");
}

/// Waits for the pool to receive the release of `id`, as an HTTP release without `reuse`.
async fn expect_release(actor: &mut FakeActor, id: &LeaseId) {
    match tokio::time::timeout(STEP_TIMEOUT, actor.recv()).await {
        Ok(Some(FakeCommand::Release {
            id: released,
            reuse,
            reply,
        })) => {
            assert_eq!(&released, id, "the session's own lease is released");
            assert!(
                !reuse,
                "released as without reuse: dropped, not reused as it is"
            );
            let _ = reply.send(Ok(()));
        }
        other => panic!("expected the release of lease {id}, got {other:?}"),
    }
}

/// A session whose task is aborted while it relays (the daemon's task ended under it, say)
/// never reaches its normal close; its lease is released all the same.
#[tokio::test]
async fn a_session_aborted_while_relaying_releases_its_lease() {
    let (front, mut actor) = front(false);
    let (session, mut client, id, mut received) = relaying_session(&front, &mut actor).await;
    // A query crosses the relay: the session is relaying now.
    let mut query = BytesMut::new();
    message(&mut query, b'Q', b"SELECT 1\0");
    client.write_all(&query).await.expect("a query");
    let passed = tokio::time::timeout(STEP_TIMEOUT, received.recv())
        .await
        .expect("the query in time")
        .expect("the stand-in runs");
    assert_eq!(passed, query.to_vec(), "the relay passed the query on");

    session.abort();
    let ended = session.await.expect_err("the session was aborted");
    assert!(ended.is_cancelled(), "{ended}");
    expect_release(&mut actor, &id).await;
}

/// A session that panics while it relays releases its lease as it unwinds.
#[tokio::test]
async fn a_session_that_panics_while_relaying_releases_its_lease() {
    let (front, mut actor) = front(true);
    let (session, _client, id, _received) = relaying_session(&front, &mut actor).await;
    let ended = tokio::time::timeout(STEP_TIMEOUT, session)
        .await
        .expect("the session ended in time")
        .expect_err("the session panicked");
    assert!(ended.is_panic(), "{ended}");
    expect_release(&mut actor, &id).await;
}

/// The normal close releases the lease once, through the same guard: the client leaves, the
/// pool gets one release, and nothing more comes.
#[tokio::test]
async fn a_session_the_client_closes_releases_its_lease_once() {
    let (front, mut actor) = front(false);
    let (session, client, id, _received) = relaying_session(&front, &mut actor).await;
    drop(client);
    expect_release(&mut actor, &id).await;
    tokio::time::timeout(STEP_TIMEOUT, session)
        .await
        .expect("the session ended in time")
        .expect("the session ended without a panic");
    assert!(
        actor.try_recv().is_none(),
        "the guard released the lease a second time"
    );
}

/// Connections to one key relay on the key's one lease, and the key renews it alone: however
/// many of them relay, one renewal per period reaches the pool (a session renews only a
/// lease of its own). Paused time: a period passes as soon as nothing else can run.
#[tokio::test(start_paused = true)]
async fn connections_to_one_key_renew_its_lease_once_per_period() {
    let (front, mut actor) = front(false);
    let (postgres, _received) = fake_postgres().await;
    // Renewed when half of its time to live is left: every 10 s.
    let ttl = Duration::from_secs(20);
    let lease = lease_living(postgres, ttl);
    let id = lease.id.clone();

    let (first, mut first_client) = start_session(&front, "app.k").await;
    match tokio::time::timeout(STEP_TIMEOUT, actor.recv()).await {
        Ok(Some(FakeCommand::Lease { request, reply })) => {
            assert_eq!(request.template.as_str(), "app");
            reply
                .send(Ok(lease))
                .expect("the session waits for its lease");
        }
        other => panic!("expected the key's lease request, got {other:?}"),
    }
    read_greeting(&mut first_client).await;
    let mut clients = vec![first_client];
    let mut sessions = vec![first];
    for _ in 0..2 {
        // Each joining connection checks the key's lease with the pool once.
        let (session, mut client) = start_session(&front, "app.k").await;
        expect_renew(&mut actor, &id, ttl).await;
        read_greeting(&mut client).await;
        clients.push(client);
        sessions.push(session);
    }
    for period in 0..3 {
        expect_renew(&mut actor, &id, ttl).await;
        // Nothing else within the period: no connection renews the key's lease itself.
        match tokio::time::timeout(Duration::from_secs(1), actor.recv()).await {
            Err(_) => {}
            Ok(command) => panic!("a second renewal in period {period}: {command:?}"),
        }
    }
    // The connections close; the key's lease goes a grace after the last.
    drop(clients);
    expect_release(&mut actor, &id).await;
    for session in sessions {
        tokio::time::timeout(STEP_TIMEOUT, session)
            .await
            .expect("the session ended in time")
            .expect("the session ended without a panic");
    }
}

/// Waits for a renewal of `id` and answers it: renewed for `ttl`.
async fn expect_renew(actor: &mut FakeActor, id: &LeaseId, ttl: Duration) {
    match tokio::time::timeout(STEP_TIMEOUT * 2, actor.recv()).await {
        Ok(Some(FakeCommand::Renew {
            id: renewed, reply, ..
        })) => {
            assert_eq!(&renewed, id, "the key's lease is renewed");
            let _ = reply.send(Ok(SystemTime::now() + ttl));
        }
        other => panic!("expected the renewal of {id}, got {other:?}"),
    }
}
