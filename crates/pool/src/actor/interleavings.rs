//! The actor itself driven in process: generated sequences of events reach two real actors —
//! their loops, their job reports and server generations, their reply maps — through the
//! real router over several servers ([`Servers`]: a lease id names its server), each on a
//! fake server (`actor/fake.rs`) whose every operation waits until the test ends it,
//! successfully or with a failure of a chosen kind; either server is lost and comes back,
//! or its monitor connection closes under a server that runs on; time is tokio's, paused,
//! moved on by the test.
//!
//! Each actor checks the state's invariants after every event itself (and panics when one
//! breaks); after every step the test checks what callers and the servers see:
//! - both actors still run (no invariant broke, nothing panicked);
//! - no database is held by two live leases, and a live lease's database exists on its
//!   server with exactly the password it was handed out with;
//! - `/status` answers and shows every request still waiting.
//!
//! At the end the servers come back, client-built templates are discarded, every operation
//! succeeds, time runs out on leases and kept databases: then every request has been
//! answered, and each server holds exactly its pool's current templates and the clones its
//! `/status` counts — nothing leaked, nothing lost.
//!
//! `PGLEASE_ACTOR_INTERLEAVINGS=N` runs N cases instead of the default.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::fake::{Ending, FakeServer, Op};
use super::start::{launch, Parts, Target, UpInputs};
use crate::child_user::ChildUser;
use crate::config::{
    CloneStrategy, LeaseAuth, PoolConfig, PoolLimits, TemplateConfig, TemplateSource,
};
use crate::error::LeaseError;
use crate::handle::PoolHandle;
use crate::names::{DbName, LeaseId, TemplateName};
use crate::sql_error::SqlErrorKind;
use crate::types::{Lease, LeaseRequest};
use crate::Servers;

/// Cases when `PGLEASE_ACTOR_INTERLEAVINGS` is not set (~20 s in a debug build).
const DEFAULT_CASES: u32 = 1000;

/// The primary's major, and the further server's (its lease ids begin with its byte).
const PRIMARY_MAJOR: u32 = 18;
const FURTHER_MAJOR: u32 = 16;

/// Templates callers lease, with the server each lives on: the primary's configured ones,
/// the further server's, then client-built ones (IntegreSQL hashes, on the primary).
const NAMES: [(&str, usize); 5] = [
    ("default", 0),
    ("app", 0),
    ("other", 1),
    ("c0ffee", 0),
    ("beef", 0),
];
/// Where the client-built templates begin in `NAMES`.
const CLIENT: usize = 3;
/// Configured templates of each server.
const CONFIGURED: [&[&str]; 2] = [&["default", "app"], &["default", "other"]];
const DEFAULT_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
enum Event {
    Lease {
        template: usize,
        wait_ms: u64,
        own_limit: bool,
    },
    /// A waiting caller goes away.
    Cancel {
        index: usize,
    },
    Release {
        index: usize,
        reuse: bool,
    },
    Renew {
        index: usize,
    },
    Keep {
        index: usize,
        secs: u64,
    },
    DropKept {
        index: usize,
    },
    /// The test ends a pending operation on a server.
    End {
        server: usize,
        index: usize,
        ending: Ending,
    },
    Advance {
        ms: u64,
    },
    Rebuild {
        template: usize,
    },
    ServerLost {
        server: usize,
    },
    ServerBack {
        server: usize,
    },
    /// A server's monitor connection closes; the server runs on.
    MonitorClosed {
        server: usize,
    },
    Initialize {
        client: usize,
    },
    Finalize {
        client: usize,
    },
    Discard {
        client: usize,
    },
    /// An IntegreSQL client gives a test database back by its number.
    GiveBack {
        index: usize,
        recreate: bool,
    },
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        16 => Just(Ending::Ok),
        1 => Just(Ending::Fail(SqlErrorKind::Other)),
        1 => Just(Ending::Fail(SqlErrorKind::DiskFull)),
        1 => Just(Ending::Fail(SqlErrorKind::ConnectionLost)),
        1 => Just(Ending::Fail(SqlErrorKind::Timeout)),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    let index = 0usize..64;
    let server = 0usize..2;
    prop_oneof![
        6 => (0usize..NAMES.len(), 0u64..3000, prop::bool::weighted(0.2))
            .prop_map(|(template, wait_ms, own_limit)| Event::Lease { template, wait_ms, own_limit }),
        1 => index.clone().prop_map(|index| Event::Cancel { index }),
        3 => (index.clone(), any::<bool>()).prop_map(|(index, reuse)| Event::Release { index, reuse }),
        1 => index.clone().prop_map(|index| Event::Renew { index }),
        1 => (index.clone(), 1u64..60).prop_map(|(index, secs)| Event::Keep { index, secs }),
        1 => index.clone().prop_map(|index| Event::DropKept { index }),
        20 => (server.clone(), index.clone(), ending())
            .prop_map(|(server, index, ending)| Event::End { server, index, ending }),
        2 => (1u64..1_000).prop_map(|ms| Event::Advance { ms }),
        1 => (1_000u64..40_000).prop_map(|ms| Event::Advance { ms }),
        1 => (0usize..CLIENT).prop_map(|template| Event::Rebuild { template }),
        1 => server.clone().prop_map(|server| Event::ServerLost { server }),
        2 => server.clone().prop_map(|server| Event::ServerBack { server }),
        1 => server.prop_map(|server| Event::MonitorClosed { server }),
        2 => (0usize..2).prop_map(|client| Event::Initialize { client }),
        2 => (0usize..2).prop_map(|client| Event::Finalize { client }),
        1 => (0usize..2).prop_map(|client| Event::Discard { client }),
        1 => (index, any::<bool>()).prop_map(|(index, recreate)| Event::GiveBack { index, recreate }),
    ]
}

fn name(text: &str) -> TemplateName {
    TemplateName::new(text).expect("test template names are valid")
}

fn template(position: usize) -> TemplateName {
    name(NAMES[position].0)
}

/// One server and its pool.
struct Pool {
    server: FakeServer,
    handle: PoolHandle,
    actor: JoinHandle<()>,
    /// The first byte of the lease ids its pool mints.
    stamp: u8,
}

/// A lease request not answered yet.
struct Request {
    task: JoinHandle<Result<Lease, LeaseError>>,
    asked_at: Instant,
    /// The server it goes to, and that server's life when it was asked.
    pool: usize,
    life: u64,
    reclaimable: bool,
}

/// A lease a caller holds.
struct Held {
    lease: Lease,
    pool: usize,
    /// Until when it certainly lives (a lower bound on its expiry).
    live_until: Instant,
    /// The server's life it was granted in (0: unknown): a lost server takes its database.
    life: u64,
    /// An IntegreSQL client's: the pool may end it to make room (and never releases it).
    reclaimable: bool,
}

/// The callers and what they hold.
struct Harness {
    pools: Vec<Pool>,
    router: Servers,
    /// Lease requests not answered yet.
    requests: Vec<Request>,
    held: Vec<Held>,
    kept: Vec<LeaseId>,
    /// Calls of the IntegreSQL API under way (initialize, finalize, give back).
    calls: Vec<JoinHandle<()>>,
    /// Requests whose callers went away before an answer.
    cancelled: usize,
}

/// Lets every task run until none can (time is paused: it moves by a millisecond).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn limits(min_ready: usize) -> PoolLimits {
    PoolLimits {
        min_ready,
        max_total: 3,
        clone_concurrency: 2,
        default_ttl: DEFAULT_TTL,
        max_ttl: Duration::from_secs(60),
        lease_connections: 10,
        max_waiting: 16,
        build_timeout: Duration::from_secs(300),
        initialize_timeout: Duration::from_secs(90),
        max_bytes: None,
        max_kept: 2,
        max_keep: Duration::from_secs(20),
        reuse_unchanged: false,
        lease_max_bytes: crate::config::LeaseMaxBytes::Auto,
    }
}

/// Starts a pool on `server`, its lease ids beginning with `stamp`.
async fn pool(server: FakeServer, names: &[&str], stamp: u8, min_ready: usize) -> Pool {
    let templates: Vec<TemplateConfig> = names
        .iter()
        .map(|template| TemplateConfig {
            name: name(template),
            source: TemplateSource::Empty,
            postgres_version: None,
        })
        .collect();
    let inputs = UpInputs {
        templates: templates.clone(),
        pool_size: 6,
        clone_strategy: CloneStrategy::FileCopy,
        lease_auth: LeaseAuth::Scram { iterations: 4096 },
        lease_superuser: false,
        lease_connections: 10,
        build_timeout: Duration::from_secs(300),
        reuse_unchanged: false,
        child_user: ChildUser::resolve(None).expect("a child user"),
        integresql_role: None,
    };
    let parts = Parts {
        inputs,
        limits: limits(min_ready),
        templates,
        prebuild: false,
        verify_templates: false,
        external: true,
        server_outlives_us: false,
        server: stamp,
    };
    let up = server.bring_up().await.expect("the fake server is up");
    let (handle, actor) = launch(parts, Target::Fake(server.clone()), up).await;
    Pool {
        server,
        handle,
        actor,
        stamp,
    }
}

impl Harness {
    async fn start(min_ready: usize) -> Harness {
        let primary = pool(FakeServer::new(), CONFIGURED[0], 0, min_ready).await;
        let further_stamp = u8::try_from(FURTHER_MAJOR).expect("a major fits a byte");
        let further = pool(FakeServer::new(), CONFIGURED[1], further_stamp, min_ready).await;
        let router = Servers::over(
            PoolConfig::embedded_for_tests(),
            primary.handle.clone(),
            PRIMARY_MAJOR,
            vec![(FURTHER_MAJOR, further.handle.clone())],
            vec![(name("other"), FURTHER_MAJOR)],
        );
        Harness {
            pools: vec![primary, further],
            router,
            requests: Vec::new(),
            held: Vec::new(),
            kept: Vec::new(),
            calls: Vec::new(),
            cancelled: 0,
        }
    }

    /// The life of `pool`'s server the actor works on, or 0 while it was lost (the actor
    /// may not have noticed yet, and serves from the life that ended).
    fn life(&self, pool: usize) -> u64 {
        let world = self.pools[pool].server.world();
        if world.serving {
            world.life
        } else {
            0
        }
    }

    fn server(&self, server: usize) -> &FakeServer {
        &self.pools[server % self.pools.len()].server
    }

    async fn step(&mut self, event: &Event) {
        let now = Instant::now();
        match *event {
            Event::Lease {
                template: position,
                wait_ms,
                own_limit,
            } => {
                let reclaimable = position >= CLIENT;
                let request = LeaseRequest {
                    template: template(position),
                    ttl: None,
                    wait: Duration::from_millis(wait_ms),
                    connections: own_limit.then_some(20),
                    reclaimable,
                    postgres_version: None,
                    label: None,
                };
                let router = self.router.clone();
                let task = tokio::spawn(async move { router.lease(request).await });
                let pool = NAMES[position].1;
                self.requests.push(Request {
                    task,
                    asked_at: now,
                    pool,
                    life: self.life(pool),
                    reclaimable,
                });
            }
            Event::Cancel { index } => {
                if !self.requests.is_empty() {
                    let request = self.requests.swap_remove(index % self.requests.len());
                    request.task.abort();
                    self.cancelled += 1;
                }
            }
            Event::Release { index, reuse } => {
                if let Some(held) = self.take_held(index) {
                    let _ = self.router.release(held.lease.id, reuse).await;
                }
            }
            Event::Renew { index } => {
                if !self.held.is_empty() {
                    let position = index % self.held.len();
                    let id = self.held[position].lease.id.clone();
                    if let Ok(expires_at) = self.router.renew(id, None).await {
                        let left = expires_at
                            .duration_since(SystemTime::now())
                            .unwrap_or_default();
                        let held = &mut self.held[position];
                        held.live_until = held
                            .live_until
                            .max(now + left.saturating_sub(Duration::from_secs(1)));
                    }
                }
            }
            Event::Keep { index, secs } => {
                if let Some(held) = self.take_held(index) {
                    let id = held.lease.id.clone();
                    let keep = Duration::from_secs(secs);
                    if self.router.keep(id.clone(), keep).await.is_ok() {
                        self.kept.push(id);
                    }
                }
            }
            Event::DropKept { index } => {
                if !self.kept.is_empty() {
                    let id = self.kept.swap_remove(index % self.kept.len());
                    let _ = self.router.drop_kept(id).await;
                }
            }
            Event::End {
                server,
                index,
                ending,
            } => {
                // The other server's, when this one has nothing under way.
                if !self.server(server).end(index, ending) {
                    self.server(server + 1).end(index, ending);
                }
            }
            Event::Advance { ms } => tokio::time::advance(Duration::from_millis(ms)).await,
            Event::Rebuild { template: position } => {
                // A token holder's: the templates here are configured, which nobody
                // else may rebuild.
                let _ = self
                    .router
                    .rebuild(template(position), crate::Changer::TokenHolder)
                    .await;
            }
            Event::ServerLost { server } => self.server(server).lose(),
            Event::ServerBack { server } => self.server(server).come_back(),
            Event::MonitorClosed { server } => self.server(server).close_monitor(),
            Event::Initialize { client } => {
                let handle = self.router.primary().clone();
                self.calls.push(tokio::spawn(async move {
                    let _ = handle.initialize(template(CLIENT + client)).await;
                }));
            }
            Event::Finalize { client } => {
                let handle = self.router.primary().clone();
                self.calls.push(tokio::spawn(async move {
                    let _ = handle.finalize(template(CLIENT + client)).await;
                }));
            }
            Event::Discard { client } => {
                let _ = self
                    .router
                    .primary()
                    .discard(template(CLIENT + client))
                    .await;
            }
            Event::GiveBack { index, recreate } => {
                let given = self
                    .held
                    .iter()
                    .filter(|held| held.reclaimable)
                    .nth(index % self.held.len().max(1))
                    .map(|held| (held.lease.template.clone(), held.lease.number));
                if let Some((template, number)) = given {
                    let handle = self.router.primary().clone();
                    self.calls.push(tokio::spawn(async move {
                        let _ = handle.give_back(template, number, recreate).await;
                    }));
                }
            }
        }
        settle().await;
        self.collect().await;
    }

    /// A lease its caller may release or keep (an IntegreSQL client's never is).
    fn take_held(&mut self, index: usize) -> Option<Held> {
        let releasable: Vec<usize> = (0..self.held.len())
            .filter(|&i| !self.held[i].reclaimable)
            .collect();
        let position = *releasable.get(index % releasable.len().max(1))?;
        Some(self.held.swap_remove(position))
    }

    /// Takes in the answers that arrived.
    async fn collect(&mut self) {
        let mut waiting = Vec::new();
        for request in std::mem::take(&mut self.requests) {
            if !request.task.is_finished() {
                waiting.push(request);
                continue;
            }
            let life = self.life(request.pool);
            match request.task.await {
                Ok(Ok(lease)) => {
                    let pool = self
                        .pools
                        .iter()
                        .position(|pool| pool.stamp == lease.id.first_byte())
                        .expect("a lease id names a server");
                    assert_eq!(
                        pool, request.pool,
                        "lease {} of {} came from another server",
                        lease.id, lease.template
                    );
                    self.held.push(Held {
                        lease,
                        pool,
                        // Granted after it was asked for, with the default time to live.
                        live_until: request.asked_at + DEFAULT_TTL,
                        // A server lost meanwhile may have gone after the grant (or
                        // before the actor noticed): then which life it was is not known.
                        life: if request.life == life { life } else { 0 },
                        reclaimable: request.reclaimable,
                    });
                }
                // The handle gave up on an actor that had not answered: the request may
                // still wait there (its grant's connection limit being set), like one
                // whose caller went away.
                Ok(Err(LeaseError::Internal(_))) => self.cancelled += 1,
                Ok(Err(_)) => {}
                Err(error) => panic!("a lease request's task failed: {error}"),
            }
        }
        self.requests = waiting;
        self.calls.retain(|call| !call.is_finished());
    }

    /// What callers and the servers see must hold after every step.
    async fn check(&mut self) {
        for (position, pool) in self.pools.iter().enumerate() {
            assert!(
                !pool.actor.is_finished(),
                "pool {position}'s actor stopped (an invariant broke: see the panic above)"
            );
        }
        self.check_held();
        let asked = self.requests.len();
        let status = self
            .router
            .status()
            .await
            .expect("the actors answer /status");
        // Answers sent before /status was taken reach their callers now.
        settle().await;
        self.collect().await;
        let waiting: usize = status.templates.iter().map(|t| t.waiting).sum();
        assert!(
            waiting >= self.requests.len(),
            "{} requests wait, /status shows {waiting} waiting",
            self.requests.len()
        );
        assert!(
            waiting <= asked + self.cancelled,
            "/status shows {waiting} waiting, only {asked} requests were made and not answered"
        );
    }

    /// No database is held by two live leases; a live lease's database exists on its
    /// server, with the password it was handed out with.
    fn check_held(&self) {
        let now = Instant::now();
        let mut seen = BTreeSet::new();
        for held in &self.held {
            let world = self.pools[held.pool].server.world();
            let lease = &held.lease;
            let database = &lease.connect.database;
            let live = now < held.live_until && held.life == world.life && world.serving;
            if !live || held.reclaimable {
                continue;
            }
            assert!(
                seen.insert((held.pool, database.clone())),
                "{database} is held by two live leases"
            );
            assert!(
                world.cluster.databases.contains(database),
                "lease {} holds {database}, which its server does not have",
                lease.id
            );
            assert_eq!(
                world.cluster.passwords.get(database),
                Some(&lease.connect.password),
                "lease {} was handed {database} with a password its role does not have",
                lease.id
            );
        }
    }

    /// Releases every lease a caller may release.
    async fn release_all(&mut self) {
        for held in std::mem::take(&mut self.held) {
            if !held.reclaimable {
                let _ = self.router.release(held.lease.id, false).await;
            }
        }
    }

    /// The servers come back, every operation succeeds and time runs out: every request
    /// is answered, and each server holds exactly what its pool says it has.
    async fn finish(mut self) {
        for pool in &self.pools {
            pool.server.come_back();
        }
        // A template a client is still migrating holds a database nothing counts as ready.
        let primary = self.router.primary().clone();
        self.calls.push(tokio::spawn(async move {
            let _ = primary.discard_all_client_built().await;
        }));
        self.release_all().await;
        for _ in 0..200 {
            for pool in &self.pools {
                while pool.server.end(0, Ending::Ok) {
                    settle().await;
                }
            }
            tokio::time::advance(Duration::from_secs(5)).await;
            settle().await;
            self.collect().await;
            self.release_all().await;
            if self.requests.is_empty() && self.calls.is_empty() && self.settled().await {
                break;
            }
        }
        assert!(
            self.requests.is_empty(),
            "{} lease requests never answered",
            self.requests.len()
        );
        assert!(self.calls.is_empty(), "IntegreSQL calls never answered");
        for (position, pool) in self.pools.iter().enumerate() {
            let status = pool.handle.status().await.expect("the actor answers");
            let ready: usize = status.templates.iter().map(|t| t.ready).sum();
            let leased: usize = status.templates.iter().map(|t| t.leased).sum();
            let templates: BTreeSet<DbName> = status
                .templates
                .iter()
                .filter_map(|t| {
                    let fingerprint = t.fingerprint.as_ref()?;
                    (t.state == "ready").then(|| DbName::template(&t.name, fingerprint))
                })
                .collect();
            let clones: Vec<DbName> = pool
                .server
                .world()
                .cluster
                .databases
                .iter()
                .filter(|db| !templates.contains(*db))
                .cloned()
                .collect();
            assert_eq!(
                clones.len(),
                ready + leased,
                "server {position} holds {clones:?} besides the templates {templates:?}; its \
                 pool counts {ready} ready and {leased} leased (status: {:?})",
                status.templates
            );
        }
        self.router.shutdown().await;
        for pool in self.pools {
            pool.actor.await.expect("the actor stops cleanly");
        }
    }

    /// Whether nothing is under way in any pool: no pending operation, no clone being
    /// made, no drop queued, no lease or kept database left, every server up.
    async fn settled(&self) -> bool {
        for pool in &self.pools {
            if pool.server.pending_len() > 0 || !pool.handle.kept().await.is_empty() {
                return false;
            }
            let Some(status) = pool.handle.status().await else {
                return false;
            };
            let busy = status.drops.pending > 0
                || !status.leases.is_empty()
                || status.templates.iter().any(|t| t.in_progress > 0)
                || status.postgres.state != "running";
            if busy {
                return false;
            }
        }
        true
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

fn run_case(events: &[Event], min_ready: usize) {
    runtime().block_on(async {
        let mut harness = Harness::start(min_ready).await;
        settle().await;
        for event in events {
            harness.step(event).await;
            harness.check().await;
        }
        harness.finish().await;
    });
}

proptest! {
    #![proptest_config(crate::testing::proptest_config(
        "PGLEASE_ACTOR_INTERLEAVINGS",
        DEFAULT_CASES,
        5_000,
    ))]

    #[test]
    fn every_interleaving_keeps_the_actors_promises(
        events in prop::collection::vec(event(), 1..150),
        min_ready in 0usize..3,
    ) {
        run_case(&events, min_ready);
    }
}

/// The pending operations of `server`.
fn pending(server: &FakeServer) -> Vec<Op> {
    server
        .world()
        .pending
        .iter()
        .map(|p| p.op.clone())
        .collect()
}

/// A smoke test of the harness: a lease of a further server's template waits for its build
/// and clone there, and its id names that server.
#[test]
fn a_lease_waits_for_its_build_and_clone_on_its_server() {
    runtime().block_on(async {
        let mut harness = Harness::start(0).await;
        let lease = Event::Lease {
            template: 2,
            wait_ms: 2000,
            own_limit: false,
        };
        harness.step(&lease).await;
        let further = harness.pools[1].server.clone();
        assert!(
            pending(&further)
                .iter()
                .all(|op| matches!(op, Op::Build { .. })),
            "builds first: {:?}",
            pending(&further)
        );
        // Its builds (`default`'s at start, and `other`'s), then a clone.
        while let Some(build) = pending(&further)
            .iter()
            .position(|op| matches!(op, Op::Build { .. }))
        {
            let end = Event::End {
                server: 1,
                index: build,
                ending: Ending::Ok,
            };
            harness.step(&end).await;
        }
        assert!(
            pending(&further)
                .iter()
                .any(|op| matches!(op, Op::Clone { .. })),
            "then a clone: {:?}",
            pending(&further)
        );
        while further.end(0, Ending::Ok) {
            settle().await;
        }
        harness.collect().await;
        assert_eq!(harness.held.len(), 1, "the lease was granted");
        assert_eq!(
            harness.held[0].lease.id.first_byte(),
            harness.pools[1].stamp,
            "its id names the further server"
        );
        harness.check().await;
        harness.finish().await;
    });
}
