//! The keys in process, with tokio's paused time: `Keys` over a pool whose actor the test
//! plays (`pglease_pool::testing`), so that every renewal and release the keys send is seen
//! and answered by the test, in order. The connections are `Member`s, as sessions hold them;
//! their lease comes from the future a session would pass (here a lease made up by the test,
//! since making one is the pool's, tested there and by `tests/it/front_keys.rs` with a real
//! daemon and postgres). Each test takes the keys through a race a session meets: a key
//! reconnected within its grace and after it, a release over HTTP while a connection is
//! joined or making the lease, a join while the key's release is on its way, one renewal for
//! many connections, and a session dropped mid-way (its membership is the key's guard).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pglease_pool::testing::{fake_pool, FakeActor, FakeCommand};
use pglease_pool::{ConnectInfo, DbName, Lease, LeaseId, LeaseOpError, Servers};
use tokio::sync::oneshot;

use super::{KeyError, KeyName, Keys};
use crate::error::SessionError;

/// The grace the tests give a key.
const GRACE: Duration = Duration::from_secs(2);
/// How long a test waits for what must come, before failing instead of hanging (paused
/// time: reached at once when nothing else can happen).
const STEP_TIMEOUT: Duration = Duration::from_secs(3600 * 24);

fn keys() -> (Arc<Keys>, FakeActor) {
    let (handle, actor) = fake_pool();
    let keys = Keys::new(Servers::single(handle, 16, "16.4"), GRACE);
    (Arc::new(keys), actor)
}

fn name(text: &str) -> KeyName {
    match KeyName::parse(text) {
        Ok((_, Some(key))) => key,
        other => panic!("{text} is a key: {other:?}"),
    }
}

/// A lease of template `app` living `ttl` from now on the wall clock (which paused time
/// does not move).
fn lease(number: u32, ttl: Duration) -> Lease {
    Lease {
        id: LeaseId::random(0),
        template: name("app.k").template,
        fingerprint: "f00d".repeat(16),
        connect: ConnectInfo {
            host: "127.0.0.1".into(),
            port: 5432,
            user: "pglease_lease".into(),
            password: "s3cret".into(),
            database: DbName::from_server(format!("pglease_app_{number}")),
            ssl: false,
        },
        expires_at: SystemTime::now() + ttl,
        number,
        local_socket: None,
    }
}

/// A lease whose renewal is far off (half an hour of paused time).
fn long_lease(number: u32) -> Lease {
    lease(number, Duration::from_secs(3600))
}

/// Awaits what must come, failing instead of hanging if it never does.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(STEP_TIMEOUT, future).await {
        Ok(done) => done,
        Err(_) => panic!("{what} never came"),
    }
}

async fn next(actor: &mut FakeActor) -> FakeCommand {
    within("a command from the keys", actor.recv())
        .await
        .expect("the keys hold a handle")
}

/// Expects a renewal of `id` and answers it: renewed for `ttl`, or gone.
async fn expect_renew(actor: &mut FakeActor, id: &LeaseId, ttl: Option<Duration>) {
    match next(actor).await {
        FakeCommand::Renew {
            id: renewed, reply, ..
        } => {
            assert_eq!(&renewed, id, "the key's lease is renewed");
            let answer = match ttl {
                Some(ttl) => Ok(SystemTime::now() + ttl),
                None => Err(LeaseOpError::NotFound(id.to_string())),
            };
            let _ = reply.send(answer);
        }
        other => panic!("expected the renewal of {id}, got {other:?}"),
    }
}

/// Expects the release of `id` as an HTTP release without `reuse`; returns its reply.
async fn expect_release(
    actor: &mut FakeActor,
    id: &LeaseId,
) -> oneshot::Sender<Result<(), LeaseOpError>> {
    match next(actor).await {
        FakeCommand::Release {
            id: released,
            reuse,
            reply,
        } => {
            assert_eq!(&released, id, "the key's lease is released");
            assert!(!reuse, "released as without reuse");
            reply
        }
        other => panic!("expected the release of {id}, got {other:?}"),
    }
}

/// Nothing more reaches the pool, however long the test waits.
async fn expect_quiet(actor: &mut FakeActor, wait: Duration) {
    match tokio::time::timeout(wait, actor.recv()).await {
        Err(_) => {}
        Ok(command) => panic!("nothing more should reach the pool, got {command:?}"),
    }
}

/// A lease future that must not be awaited.
async fn never_made() -> Result<Lease, SessionError> {
    panic!("a member of a released key leases nothing")
}

/// A lease future as a session passes it, answered at once.
async fn made(lease: Lease) -> Result<Lease, SessionError> {
    Ok(lease)
}

#[tokio::test(start_paused = true)]
async fn a_key_reconnected_within_its_grace_keeps_its_lease_and_after_it_gets_a_new_one() {
    let (keys, mut actor) = keys();
    let first = long_lease(1);
    let member = keys.join(name("app.k"));
    let got = member.lease(made(first.clone())).await.expect("a lease");
    assert_eq!(got.id, first.id);
    drop(member);
    let report = keys.report();
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].connections, 0);
    assert!(report[0].release_at.is_some(), "its grace runs: {report:?}");

    // Back just before the grace ends: the same lease, checked with the pool first.
    tokio::time::advance(GRACE - Duration::from_millis(1)).await;
    let member = keys.join(name("app.k"));
    let again = async { member.lease(made(long_lease(2))).await };
    let (again, ()) = tokio::join!(
        again,
        expect_renew(&mut actor, &first.id, Some(GRACE * 100))
    );
    assert_eq!(
        again.expect("the key's lease").id,
        first.id,
        "kept within the grace"
    );
    assert!(
        keys.report()[0].release_at.is_none(),
        "the grace is cancelled"
    );
    // The first grace's timer goes off now and finds a member: nothing is released.
    expect_quiet(&mut actor, GRACE).await;

    // Gone for the whole grace: released once, and the key is forgotten.
    drop(member);
    let reply = expect_release(&mut actor, &first.id).await;
    let _ = reply.send(Ok(()));
    tokio::task::yield_now().await;
    assert!(keys.report().is_empty(), "{:?}", keys.report());
    let member = keys.join(name("app.k"));
    let second = long_lease(3);
    let got = member.lease(made(second.clone())).await.expect("a lease");
    assert_eq!(got.id, second.id, "a new lease after the grace");
    expect_quiet(&mut actor, Duration::from_secs(60)).await;
}

#[tokio::test(start_paused = true)]
async fn a_key_renews_its_lease_once_however_many_connections_use_it() {
    let (keys, mut actor) = keys();
    // Renewed when half its time to live is left: every 10 s of paused time.
    let ttl = Duration::from_secs(20);
    let shared = lease(1, ttl);
    let members: Vec<_> = (0..3).map(|_| keys.join(name("app.k"))).collect();
    members[0]
        .lease(made(shared.clone()))
        .await
        .expect("the first makes it");
    for member in &members[1..] {
        // Each joining connection checks the lease once, with a renewal.
        let joining = async { member.lease(made(long_lease(9))).await };
        let (got, ()) = tokio::join!(joining, expect_renew(&mut actor, &shared.id, Some(ttl)));
        assert_eq!(got.expect("the key's lease").id, shared.id);
    }
    // Then one renewal per period for the three of them, not three.
    for _ in 0..3 {
        tokio::time::advance(ttl / 2).await;
        expect_renew(&mut actor, &shared.id, Some(ttl)).await;
        assert!(actor.try_recv().is_none(), "one renewal per period");
    }
    // A renewal that finds the lease gone (released by its id, expired) stops renewing,
    // and the key's next connection leases anew.
    tokio::time::advance(ttl / 2).await;
    expect_renew(&mut actor, &shared.id, None).await;
    tokio::task::yield_now().await;
    assert!(keys.report()[0].lease_id.is_none(), "{:?}", keys.report());
    let next_lease = long_lease(2);
    let late = keys.join(name("app.k"));
    let got = late
        .lease(made(next_lease.clone()))
        .await
        .expect("a new lease");
    assert_eq!(got.id, next_lease.id);
    drop(members);
    drop(late);
    let reply = expect_release(&mut actor, &next_lease.id).await;
    let _ = reply.send(Ok(()));
    expect_quiet(&mut actor, Duration::from_secs(3600)).await;
}

#[tokio::test(start_paused = true)]
async fn a_key_released_over_http_ends_its_joined_connections_and_a_join_meanwhile_gets_a_new_lease(
) {
    let (keys, mut actor) = keys();
    let first = long_lease(1);
    let relaying = keys.join(name("app.k"));
    relaying.lease(made(first.clone())).await.expect("a lease");
    // Joined but not leasing yet (still authenticating, say).
    let joined = keys.join(name("app.k"));

    // DELETE /front/keys/app.k: the release reaches the pool while a connection relays.
    let releasing = tokio::spawn({
        let keys = Arc::clone(&keys);
        async move { keys.release("app.k").await }
    });
    let reply = expect_release(&mut actor, &first.id).await;
    // A connection that joins while the release is on its way gets a new lease, never
    // the one being released: the key's slot went with it.
    let newcomer = keys.join(name("app.k"));
    let second = long_lease(2);
    let got = newcomer
        .lease(made(second.clone()))
        .await
        .expect("a new lease");
    assert_eq!(got.id, second.id, "not the lease being released");
    let _ = reply.send(Ok(()));
    let released = within("the release", releasing)
        .await
        .expect("join")
        .expect("released");
    assert_eq!(released, first.id);

    // The connection joined to the released slot is told, and never leases.
    let refused = joined
        .lease(never_made())
        .await
        .expect_err("the key was released");
    match refused {
        SessionError::Refused(refusal) => {
            assert_eq!(refusal.code, "57P01", "{refusal:?}");
            assert!(refusal.message.contains("app.k"), "{refusal:?}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The old slot's connections leaving touch nothing of the new one's.
    drop((relaying, joined));
    let report = keys.report();
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0].connections, 1, "{report:?}");
    assert_eq!(report[0].lease_id.as_ref(), Some(&second.id), "{report:?}");
    assert!(report[0].release_at.is_none(), "{report:?}");
    expect_quiet(&mut actor, GRACE * 10).await;

    // A release while a connection makes the key's lease waits for that lease, then
    // releases it; then no lease is left under the key.
    drop(newcomer);
    let reply = expect_release(&mut actor, &second.id).await;
    let _ = reply.send(Ok(()));
    let maker = keys.join(name("app.k"));
    let (give, take) = oneshot::channel::<Lease>();
    let making = tokio::spawn(async move {
        maker
            .lease(async { Ok(take.await.expect("the test gives a lease")) })
            .await
            .map(|lease| (lease, maker))
    });
    tokio::task::yield_now().await;
    let releasing = tokio::spawn({
        let keys = Arc::clone(&keys);
        async move { keys.release("app.k").await }
    });
    tokio::task::yield_now().await;
    assert!(
        !releasing.is_finished(),
        "the release waits for the lease being made"
    );
    let third = long_lease(3);
    give.send(third.clone()).expect("the maker waits");
    let reply = expect_release(&mut actor, &third.id).await;
    let _ = reply.send(Ok(()));
    let released = within("the release", releasing).await.expect("join");
    assert_eq!(released.expect("released"), third.id);
    let made = within("the maker's lease", making).await.expect("join");
    let (_, maker) = made.expect("the maker got it");
    drop(maker);
    assert!(matches!(
        keys.release("app.k").await,
        Err(KeyError::NotFound(_))
    ));
    assert!(matches!(
        keys.release("app").await,
        Err(KeyError::Invalid { .. })
    ));
    expect_quiet(&mut actor, GRACE * 10).await;
}

#[tokio::test(start_paused = true)]
async fn a_session_dropped_while_making_or_using_a_keys_lease_leaves_it_to_the_key() {
    let (keys, mut actor) = keys();
    // The maker's session is aborted while its lease is being made (its client left):
    // the connection waiting with it makes the lease instead of waiting for ever.
    let maker = keys.join(name("app.k"));
    let aborted = tokio::spawn(async move { maker.lease(std::future::pending()).await });
    tokio::task::yield_now().await;
    let waiter = keys.join(name("app.k"));
    let shared = long_lease(1);
    let waiting = tokio::spawn({
        let shared = shared.clone();
        async move {
            waiter
                .lease(made(shared))
                .await
                .map(|lease| (lease, waiter))
        }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "it waits for the maker");
    aborted.abort();
    let waited = within("the waiter's lease", waiting).await.expect("join");
    let (got, waiter) = waited.expect("a lease");
    assert_eq!(got.id, shared.id, "the waiter made it");

    // Its session is aborted while it relays: its membership, dropped with the task, is
    // the key's guard; the key's lease is released a grace later, once.
    let relaying = tokio::spawn(async move {
        let _waiter = waiter;
        std::future::pending::<()>().await
    });
    tokio::task::yield_now().await;
    relaying.abort();
    let _ = relaying.await;
    assert_eq!(keys.report()[0].connections, 0);
    let reply = expect_release(&mut actor, &shared.id).await;
    let _ = reply.send(Ok(()));
    expect_quiet(&mut actor, Duration::from_secs(3600)).await;
    assert!(keys.report().is_empty());
}
