//! The actor itself driven in process: generated sequences of events reach a real actor —
//! its loop, its job reports and their server generations, its reply maps — through a real
//! [`PoolHandle`], on a fake server (`actor/fake.rs`) whose every operation waits until the
//! test ends it, successfully or with a failure of a chosen kind; the server is lost and
//! comes back, its monitor connection closes under a server that runs on; time is tokio's,
//! paused, moved on by the test.
//!
//! The actor checks the state's invariants after every event itself (and panics when one
//! breaks); after every step the test checks what a caller and the server see:
//! - the actor still runs (no invariant broke, nothing panicked);
//! - no database is held by two live leases, and a live lease's database exists on the
//!   server with exactly the password it was handed out with;
//! - `/status` answers, shows every request still waiting, and no more leases than callers hold.
//!
//! At the end the server comes back, client-built templates are discarded, every operation
//! succeeds, time runs out on leases and kept databases: then every request has been answered, and the server holds exactly the
//! current templates and the ready clones `/status` counts — nothing leaked, nothing lost.
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
use crate::config::{CloneStrategy, LeaseAuth, PoolLimits, TemplateConfig, TemplateSource};
use crate::error::LeaseError;
use crate::handle::PoolHandle;
use crate::names::{DbName, TemplateName};
use crate::sql_error::SqlErrorKind;
use crate::types::{Lease, LeaseRequest};

/// Cases when `PGLEASE_ACTOR_INTERLEAVINGS` is not set.
const DEFAULT_CASES: u32 = 1000;

/// Configured templates, then client-built ones (IntegreSQL hashes).
const NAMES: [&str; 4] = ["default", "app", "c0ffee", "beef"];
const CONFIGURED: usize = 2;
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
    /// The test ends a pending operation on the server.
    End {
        index: usize,
        ending: Ending,
    },
    Advance {
        ms: u64,
    },
    Rebuild {
        template: usize,
    },
    ServerLost,
    ServerBack,
    /// The monitor connection closes; the server runs on.
    MonitorClosed,
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
        8 => Just(Ending::Ok),
        1 => Just(Ending::Fail(SqlErrorKind::Other)),
        1 => Just(Ending::Fail(SqlErrorKind::DiskFull)),
        1 => Just(Ending::Fail(SqlErrorKind::ConnectionLost)),
        1 => Just(Ending::Fail(SqlErrorKind::Timeout)),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    let index = 0usize..64;
    prop_oneof![
        6 => (0usize..NAMES.len(), 0u64..3000, prop::bool::weighted(0.2))
            .prop_map(|(template, wait_ms, own_limit)| Event::Lease { template, wait_ms, own_limit }),
        1 => index.clone().prop_map(|index| Event::Cancel { index }),
        3 => (index.clone(), any::<bool>()).prop_map(|(index, reuse)| Event::Release { index, reuse }),
        1 => index.clone().prop_map(|index| Event::Renew { index }),
        1 => (index.clone(), 1u64..60).prop_map(|(index, secs)| Event::Keep { index, secs }),
        1 => index.clone().prop_map(|index| Event::DropKept { index }),
        14 => (index.clone(), ending()).prop_map(|(index, ending)| Event::End { index, ending }),
        3 => (1u64..40_000).prop_map(|ms| Event::Advance { ms }),
        1 => (0usize..CONFIGURED).prop_map(|template| Event::Rebuild { template }),
        1 => Just(Event::ServerLost),
        2 => Just(Event::ServerBack),
        1 => Just(Event::MonitorClosed),
        2 => (0usize..2).prop_map(|client| Event::Initialize { client }),
        2 => (0usize..2).prop_map(|client| Event::Finalize { client }),
        1 => (0usize..2).prop_map(|client| Event::Discard { client }),
        1 => (index, any::<bool>()).prop_map(|(index, recreate)| Event::GiveBack { index, recreate }),
    ]
}

fn template(position: usize) -> TemplateName {
    TemplateName::new(NAMES[position]).expect("test template names are valid")
}

/// A lease a caller holds.
struct Held {
    lease: Lease,
    /// Until when it certainly lives (a lower bound on its expiry).
    live_until: Instant,
    /// The server's life it was granted in: a lost server takes its database.
    life: u64,
    /// An IntegreSQL client's: the pool may end it to make room (and never releases it).
    reclaimable: bool,
}

/// A lease request not answered yet.
struct Request {
    task: JoinHandle<Result<Lease, LeaseError>>,
    asked_at: Instant,
    /// The server's life when it was asked.
    life: u64,
    reclaimable: bool,
}

/// The callers and what they hold.
struct Harness {
    server: FakeServer,
    handle: PoolHandle,
    actor: JoinHandle<()>,
    /// Lease requests not answered yet.
    requests: Vec<Request>,
    held: Vec<Held>,
    kept: Vec<crate::names::LeaseId>,
    /// Calls of the IntegreSQL API under way (initialize, finalize, give back).
    calls: Vec<JoinHandle<()>>,
    /// Requests whose callers went away before an answer.
    cancelled: usize,
    grants: u64,
}

/// Lets every task run until none can (time is paused: it moves by a millisecond).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

impl Harness {
    async fn start(server: FakeServer, min_ready: usize) -> Harness {
        let limits = PoolLimits {
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
        };
        let templates: Vec<TemplateConfig> = NAMES[..CONFIGURED]
            .iter()
            .map(|name| TemplateConfig {
                name: TemplateName::new(name).expect("valid"),
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
            limits,
            templates,
            prebuild: false,
            verify_templates: false,
            external: true,
            server_outlives_us: false,
            server: 0,
        };
        let up = server.bring_up().await.expect("the fake server is up");
        let (handle, actor) = launch(parts, Target::Fake(server.clone()), up).await;
        Harness {
            server,
            handle,
            actor,
            requests: Vec::new(),
            held: Vec::new(),
            kept: Vec::new(),
            calls: Vec::new(),
            cancelled: 0,
            grants: 0,
        }
    }

    /// The server's life the actor works on, or 0 while it was lost (the actor may not
    /// have noticed yet, and serves from the life that ended).
    fn life(&self) -> u64 {
        let world = self.server.world();
        if world.serving {
            world.life
        } else {
            0
        }
    }

    async fn step(&mut self, event: &Event) {
        let now = Instant::now();
        match *event {
            Event::Lease {
                template: position,
                wait_ms,
                own_limit,
            } => {
                let reclaimable = position >= CONFIGURED;
                let request = LeaseRequest {
                    template: template(position),
                    ttl: None,
                    wait: Duration::from_millis(wait_ms),
                    connections: own_limit.then_some(20),
                    reclaimable,
                    postgres_version: None,
                    label: None,
                };
                let handle = self.handle.clone();
                let task = tokio::spawn(async move { handle.lease(request).await });
                let life = self.life();
                self.requests.push(Request {
                    task,
                    asked_at: now,
                    life,
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
                    let _ = self.handle.release(held.lease.id, reuse).await;
                }
            }
            Event::Renew { index } => {
                if !self.held.is_empty() {
                    let position = index % self.held.len();
                    let id = self.held[position].lease.id.clone();
                    if let Ok(expires_at) = self.handle.renew(id, None).await {
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
                    if self
                        .handle
                        .keep(id.clone(), Duration::from_secs(secs))
                        .await
                        .is_ok()
                    {
                        self.kept.push(id);
                    }
                }
            }
            Event::DropKept { index } => {
                if !self.kept.is_empty() {
                    let id = self.kept.swap_remove(index % self.kept.len());
                    let _ = self.handle.drop_kept(id).await;
                }
            }
            Event::End { index, ending } => {
                self.server.end(index, ending);
            }
            Event::Advance { ms } => tokio::time::advance(Duration::from_millis(ms)).await,
            Event::Rebuild { template: position } => {
                let _ = self.handle.rebuild(template(position)).await;
            }
            Event::ServerLost => self.server.lose(),
            Event::ServerBack => self.server.come_back(),
            Event::MonitorClosed => self.server.close_monitor(),
            Event::Initialize { client } => {
                let handle = self.handle.clone();
                self.calls.push(tokio::spawn(async move {
                    let _ = handle.initialize(template(CONFIGURED + client)).await;
                }));
            }
            Event::Finalize { client } => {
                let handle = self.handle.clone();
                self.calls.push(tokio::spawn(async move {
                    let _ = handle.finalize(template(CONFIGURED + client)).await;
                }));
            }
            Event::Discard { client } => {
                let _ = self.handle.discard(template(CONFIGURED + client)).await;
            }
            Event::GiveBack { index, recreate } => {
                let given = self
                    .held
                    .iter()
                    .filter(|held| held.reclaimable)
                    .nth(index % self.held.len().max(1))
                    .map(|held| (held.lease.template.clone(), held.lease.number));
                if let Some((template, number)) = given {
                    let handle = self.handle.clone();
                    self.calls.push(tokio::spawn(async move {
                        let _ = handle.give_back(template, number, recreate).await;
                    }));
                }
            }
        }
        settle().await;
        self.collect().await;
    }

    fn take_held(&mut self, index: usize) -> Option<Held> {
        let unreclaimable: Vec<usize> = (0..self.held.len())
            .filter(|&i| !self.held[i].reclaimable)
            .collect();
        let position = *unreclaimable.get(index % unreclaimable.len().max(1))?;
        Some(self.held.swap_remove(position))
    }

    /// Takes in the answers that arrived.
    async fn collect(&mut self) {
        let life = self.life();
        let mut waiting = Vec::new();
        for request in std::mem::take(&mut self.requests) {
            if !request.task.is_finished() {
                waiting.push(request);
                continue;
            }
            match request.task.await {
                Ok(Ok(lease)) => {
                    self.grants += 1;
                    self.held.push(Held {
                        lease,
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

    /// What callers and the server see must hold after every step.
    async fn check(&mut self) {
        assert!(
            !self.actor.is_finished(),
            "the actor stopped (an invariant broke: see the panic above)"
        );
        self.check_held();
        let asked = self.requests.len();
        let status = self
            .handle
            .status()
            .await
            .expect("the actor answers /status");
        // Answers sent before /status was taken reach their callers now.
        settle().await;
        self.collect().await;
        let waiting: usize = status.templates.iter().map(|t| t.waiting).sum();
        // A grant whose connection limit is being set shows as a lease nobody holds yet.
        let held: BTreeSet<_> = self.held.iter().map(|held| &held.lease.id).collect();
        let granting = status
            .leases
            .iter()
            .filter(|lease| !held.contains(&lease.id))
            .count();
        assert!(
            waiting + granting >= self.requests.len(),
            "{} requests wait, /status shows {waiting} waiting and {granting} being granted",
            self.requests.len()
        );
        assert!(
            waiting <= asked + self.cancelled,
            "/status shows {waiting} waiting, only {asked} requests were made and not answered"
        );
    }

    /// No database is held by two live leases; a live lease's database exists, with the
    /// password it was handed out with.
    fn check_held(&self) {
        let now = Instant::now();
        let world = self.server.world();
        let mut seen = BTreeSet::new();
        for held in &self.held {
            let lease = &held.lease;
            let database = &lease.connect.database;
            let live = now < held.live_until && held.life == world.life && world.serving;
            if !live || held.reclaimable {
                continue;
            }
            assert!(
                seen.insert(database.clone()),
                "{database} is held by two live leases"
            );
            assert!(
                world.databases.contains(database),
                "lease {} holds {database}, which the server does not have",
                lease.id
            );
            assert_eq!(
                world.passwords.get(database),
                Some(&lease.connect.password),
                "lease {} was handed {database} with a password its role does not have",
                lease.id
            );
        }
    }

    /// The server comes back, every operation succeeds and time runs out: every request
    /// is answered, and the server holds exactly what the pool says it has.
    async fn finish(mut self) {
        self.server.come_back();
        // A template a client is still migrating holds a database nothing counts as ready.
        let discard_all = {
            let handle = self.handle.clone();
            tokio::spawn(async move {
                let _ = handle.discard_all_client_built().await;
            })
        };
        self.calls.push(discard_all);
        for held in std::mem::take(&mut self.held) {
            if !held.reclaimable {
                let _ = self.handle.release(held.lease.id, false).await;
            }
        }
        for _ in 0..200 {
            while self.server.end(0, Ending::Ok) {
                settle().await;
            }
            tokio::time::advance(Duration::from_secs(5)).await;
            settle().await;
            self.collect().await;
            for held in std::mem::take(&mut self.held) {
                if !held.reclaimable {
                    let _ = self.handle.release(held.lease.id, false).await;
                }
            }
            if self.requests.is_empty()
                && self.calls.is_empty()
                && self.server.pending_len() == 0
                && self.settled_pool().await
            {
                break;
            }
        }
        assert!(
            self.requests.is_empty(),
            "{} lease requests never answered",
            self.requests.len()
        );
        assert!(self.calls.is_empty(), "IntegreSQL calls never answered");
        let status = self.handle.status().await.expect("the actor answers");
        let ready: usize = status.templates.iter().map(|t| t.ready).sum();
        let templates: BTreeSet<DbName> = status
            .templates
            .iter()
            .filter_map(|t| {
                let fingerprint = t.fingerprint.as_ref()?;
                (t.state == "ready").then(|| DbName::template(&t.name, fingerprint))
            })
            .collect();
        let clones: Vec<DbName> = self
            .server
            .world()
            .databases
            .iter()
            .filter(|db| !templates.contains(*db))
            .cloned()
            .collect();
        let leased: usize = status.templates.iter().map(|t| t.leased).sum();
        assert_eq!(
            clones.len(),
            ready + leased,
            "the server holds {clones:?} besides the templates {templates:?}; the pool counts {ready} ready and {leased} leased (status: {:?})",
            status.templates
        );
        self.handle.shutdown().await;
        self.actor.await.expect("the actor stops cleanly");
    }

    /// Whether nothing is under way in the pool: no clone being made, no drop queued, no
    /// lease or kept database left.
    async fn settled_pool(&self) -> bool {
        let Some(status) = self.handle.status().await else {
            return false;
        };
        status.drops.pending == 0
            && status.leases.is_empty()
            && self.handle.kept().await.is_empty()
            && status.templates.iter().all(|t| t.in_progress == 0)
            && status.postgres.state == "running"
    }
}

fn run_case(events: &[Event], min_ready: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut harness = Harness::start(FakeServer::new(), min_ready).await;
        settle().await;
        for event in events {
            harness.step(event).await;
            harness.check().await;
        }
        harness.finish().await;
    });
}

fn cases() -> u32 {
    std::env::var("PGLEASE_ACTOR_INTERLEAVINGS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 5_000,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_interleaving_keeps_the_actors_promises(
        events in prop::collection::vec(event(), 1..80),
        min_ready in 0usize..3,
    ) {
        run_case(&events, min_ready);
    }
}

/// The fake server's operations are what the actor asked for: a smoke test of the harness
/// (a lease is granted once the template is built and a clone made).
#[test]
fn a_lease_waits_for_its_build_and_clone() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let server = FakeServer::new();
        let mut harness = Harness::start(server.clone(), 0).await;
        harness
            .step(&Event::Lease {
                template: 0,
                wait_ms: 2000,
                own_limit: false,
            })
            .await;
        let ops: Vec<Op> = server
            .world()
            .pending
            .iter()
            .map(|p| p.op.clone())
            .collect();
        assert!(
            matches!(ops.as_slice(), [Op::Build { .. }]),
            "a build first: {ops:?}"
        );
        harness
            .step(&Event::End {
                index: 0,
                ending: Ending::Ok,
            })
            .await;
        let ops: Vec<Op> = server
            .world()
            .pending
            .iter()
            .map(|p| p.op.clone())
            .collect();
        assert!(
            ops.iter().any(|op| matches!(op, Op::Clone { .. })),
            "then a clone: {ops:?}"
        );
        while server.end(0, Ending::Ok) {
            settle().await;
        }
        harness.collect().await;
        assert_eq!(harness.held.len(), 1, "the lease was granted");
        harness.check().await;
        harness.finish().await;
    });
}
