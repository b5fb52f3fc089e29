//! The interleaving test: generated sequences of events drive [`PoolState`] the way the
//! actor does — lease requests, deliveries and hang-ups, releases with and without reuse,
//! renewals, expiry, rebuilds and source changes, client-built templates (initialize,
//! finalize, discard, unlock and recreate by test id, native leases of them too, reset),
//! postgres lost and back, a byte budget — while the
//! jobs the state starts (builds, clones, recycles, drops, connection limits, opens,
//! finalizes) report back in any order, succeeding or failing, or never (their server was
//! lost). After every step the state's own invariants and the harness's promises are
//! checked (among them: a test id a client holds — it never gave it back, though its
//! database may be gone — is never handed out for another database); at the end every job is completed and time runs out, and then every request
//! must have been answered and every database made must be dropped or still in use.
//!
//! `PGLEASE_INTERLEAVINGS=N` runs N cases instead of the default.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{Action, Built, Finalize, Grant, PoolState, WaiterId};
use crate::config::{PoolLimits, TemplateConfig, TemplateSource};
use crate::error::LeaseOpError;
use crate::names::{DbName, LeaseId, TemplateName};
use crate::sql_error::SqlError;
use crate::template::SourceStamp;
use crate::types::LeaseRequest;

/// Cases when `PGLEASE_INTERLEAVINGS` is not set (a few seconds in a debug build).
const DEFAULT_CASES: u32 = 3000;

/// Configured templates, then client-built ones (IntegreSQL hashes).
const NAMES: [&str; 5] = ["default", "app", "big", "c0ffee", "beef"];
const CONFIGURED: usize = 3;
/// Bytes of each template's versions (the budget, when set, holds a few of them).
const SIZES: [u64; 5] = [1_000_000, 3_000_000, 8_000_000, 2_000_000, 2_000_000];
const LEASE_CONNECTIONS: u32 = 10;
/// `--lease-max-bytes`: what a `Measured` event finds a lease's database past, or at.
const LEASE_MAX_BYTES: u64 = 50_000_000;

#[derive(Debug, Clone)]
enum Event {
    Lease {
        template: usize,
        own_limit: bool,
        wait_ms: u64,
        /// For a client-built template: through the native API, not IntegreSQL's.
        native: bool,
    },
    /// The actor hands a grant to its caller, who may have gone away.
    Deliver {
        index: usize,
        hung_up: bool,
    },
    Release {
        index: usize,
        reuse: bool,
    },
    Renew {
        index: usize,
    },
    /// A lease is released with `keep` (a failed test's database, kept for a look).
    Keep {
        index: usize,
        secs: u64,
    },
    /// Someone drops a kept database before its time.
    DropKept {
        index: usize,
    },
    /// A waiting caller goes away.
    Cancel {
        index: usize,
    },
    /// A running job reports.
    Complete {
        index: usize,
        ok: bool,
    },
    Advance {
        ms: u64,
    },
    /// A template's sources change: a new version.
    SourcesChanged {
        template: usize,
    },
    /// A rebuild over the API (same sources, same fingerprint).
    Rebuild {
        template: usize,
    },
    /// A lease request makes the actor look at a template's sources (its waiters wait).
    CheckBegins {
        template: usize,
    },
    /// A look ends: the sources changed (a new version), or not.
    CheckEnds {
        index: usize,
        changed: bool,
    },
    /// The actor's periodic look at failed templates' sources begins.
    FailedLookBegins,
    /// One such look ends (whatever server generation it began in).
    FailedLookEnds {
        index: usize,
        changed: bool,
    },
    /// The actor's measure of the leased databases comes back: the lease picked by `index`
    /// (one its caller holds, perhaps ended since) measured past `--lease-max-bytes`, or
    /// not.
    Measured {
        index: usize,
        over: bool,
    },
    /// The actor's look for sessions on the test databases comes back: bit `i % 8` of
    /// `busy` says whether the `i`th it looked at had one.
    SessionsSeen {
        busy: u8,
    },
    ServerLost,
    /// The server is back, with `leftovers` ready clones an earlier run left for each
    /// configured template (half of them of the version its build will make).
    ServerUp {
        leftovers: usize,
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
    /// An IntegreSQL client gives a test database back by its id (unlock, or recreate):
    /// one a client holds, picked by `index`, or an id nobody holds if none is.
    GiveBack {
        index: usize,
        recreate: bool,
    },
    Reset,
}

fn event() -> impl Strategy<Value = Event> {
    let index = 0usize..64;
    prop_oneof![
        6 => (0usize..NAMES.len(), any::<bool>(), 0u64..3000, prop::bool::weighted(0.2)).prop_map(|(template, own_limit, wait_ms, native)| {
            Event::Lease { template, own_limit, wait_ms, native }
        }),
        4 => (index.clone(), prop::bool::weighted(0.2)).prop_map(|(index, hung_up)| Event::Deliver { index, hung_up }),
        3 => (index.clone(), any::<bool>()).prop_map(|(index, reuse)| Event::Release { index, reuse }),
        1 => index.clone().prop_map(|index| Event::Renew { index }),
        2 => (index.clone(), 1u64..60).prop_map(|(index, secs)| Event::Keep { index, secs }),
        1 => index.clone().prop_map(|index| Event::DropKept { index }),
        1 => index.clone().prop_map(|index| Event::Cancel { index }),
        12 => (index.clone(), prop::bool::weighted(0.85)).prop_map(|(index, ok)| Event::Complete { index, ok }),
        3 => (1u64..40_000).prop_map(|ms| Event::Advance { ms }),
        1 => (0usize..CONFIGURED).prop_map(|template| Event::SourcesChanged { template }),
        1 => (0usize..CONFIGURED).prop_map(|template| Event::Rebuild { template }),
        2 => (0usize..CONFIGURED).prop_map(|template| Event::CheckBegins { template }),
        2 => (index.clone(), prop::bool::weighted(0.3)).prop_map(|(index, changed)| Event::CheckEnds { index, changed }),
        1 => Just(Event::FailedLookBegins),
        1 => (index.clone(), prop::bool::weighted(0.5)).prop_map(|(index, changed)| Event::FailedLookEnds { index, changed }),
        2 => (index.clone(), any::<bool>()).prop_map(|(index, over)| Event::Measured { index, over }),
        1 => any::<u8>().prop_map(|busy| Event::SessionsSeen { busy }),
        1 => Just(Event::ServerLost),
        2 => (0usize..4).prop_map(|leftovers| Event::ServerUp { leftovers }),
        2 => (0usize..2).prop_map(|client| Event::Initialize { client }),
        2 => (0usize..2).prop_map(|client| Event::Finalize { client }),
        1 => (0usize..2).prop_map(|client| Event::Discard { client }),
        2 => (index, any::<bool>()).prop_map(|(index, recreate)| Event::GiveBack { index, recreate }),
        1 => Just(Event::Reset),
    ]
}

/// Events of client-built templates only (the IntegreSQL API, with the native API's view
/// of them and the server's loss): the long chains their ids need — initialize, finalize,
/// get, lose or reset, initialize again, get — come up far more often than among all events.
fn client_event() -> impl Strategy<Value = Event> {
    let index = 0usize..64;
    prop_oneof![
        6 => (CONFIGURED..NAMES.len(), 0u64..3000, prop::bool::weighted(0.2)).prop_map(|(template, wait_ms, native)| {
            Event::Lease { template, own_limit: false, wait_ms, native }
        }),
        4 => (index.clone(), prop::bool::weighted(0.1)).prop_map(|(index, hung_up)| Event::Deliver { index, hung_up }),
        1 => (index.clone(), any::<bool>()).prop_map(|(index, reuse)| Event::Release { index, reuse }),
        12 => (index.clone(), prop::bool::weighted(0.9)).prop_map(|(index, ok)| Event::Complete { index, ok }),
        1 => (1u64..40_000).prop_map(|ms| Event::Advance { ms }),
        2 => any::<u8>().prop_map(|busy| Event::SessionsSeen { busy }),
        1 => Just(Event::ServerLost),
        2 => Just(Event::ServerUp { leftovers: 0 }),
        3 => (0usize..2).prop_map(|client| Event::Initialize { client }),
        3 => (0usize..2).prop_map(|client| Event::Finalize { client }),
        1 => (0usize..2).prop_map(|client| Event::Discard { client }),
        2 => (index, any::<bool>()).prop_map(|(index, recreate)| Event::GiveBack { index, recreate }),
        2 => Just(Event::Reset),
    ]
}

/// The actor's part, played by the test: runs no SQL, keeps the jobs and replies.
struct World {
    state: PoolState,
    now: Instant,
    up: bool,
    /// Jobs started and not reported, of the current server.
    jobs: Vec<Action>,
    /// Grants on their way to their callers.
    deliveries: Vec<(WaiterId, Grant)>,
    /// Looks at configured templates' sources under way (indexes into `NAMES`).
    checks: Vec<usize>,
    /// Looks at failed templates' sources under way.
    failed_looks: Vec<TemplateName>,
    /// Requests not answered yet.
    open: BTreeSet<WaiterId>,
    /// Requests whose callers went away before an answer (answered at most once later).
    cancelled: HashSet<WaiterId>,
    /// Every caller that went away: a grant for one is not delivered.
    gone: HashSet<WaiterId>,
    /// Leases their callers hold.
    leases: Vec<Grant>,
    /// Requests made through the IntegreSQL API.
    integresql: HashSet<WaiterId>,
    /// Test ids IntegreSQL clients hold, with the database each names for its client: from
    /// delivery until the client gives it back (its database may be gone meanwhile —
    /// expired, reclaimed, lost with the server — without the client knowing).
    held: BTreeMap<(TemplateName, u32), DbName>,
    next_waiter: WaiterId,
    /// Each configured template's source version (its fingerprint follows it).
    versions: [u32; CONFIGURED],
    /// Databases jobs made on the current server, and those dropped.
    created: BTreeSet<DbName>,
    dropped: BTreeSet<DbName>,
    /// The password the server last gave each clone's role (each clone or recycle job
    /// sets a new one): a grant or a kept database must hand out exactly that.
    passwords: BTreeMap<DbName, String>,
    next_password: u64,
}

impl World {
    fn new(max_bytes: Option<u64>, min_ready: usize, reuse_unchanged: bool) -> Self {
        let limits = PoolLimits {
            min_ready,
            max_total: 3,
            clone_concurrency: 2,
            default_ttl: Duration::from_secs(30),
            max_ttl: Duration::from_secs(60),
            lease_connections: LEASE_CONNECTIONS,
            max_waiting: 16,
            build_timeout: Duration::from_secs(300),
            initialize_timeout: Duration::from_secs(90),
            max_bytes,
            max_kept: 2,
            max_keep: Duration::from_secs(20),
            reuse_unchanged,
            lease_max_bytes: crate::config::LeaseMaxBytes::Bytes(LEASE_MAX_BYTES),
        };
        let templates: Vec<TemplateConfig> = NAMES[..CONFIGURED]
            .iter()
            .map(|name| TemplateConfig {
                name: template(name),
                source: TemplateSource::SqlFile(format!("/{name}.sql").into()),
                postgres_version: None,
            })
            .collect();
        let mut world = World {
            state: PoolState::new(limits, "t0".into(), &templates, false),
            now: Instant::now(),
            up: false,
            jobs: Vec::new(),
            deliveries: Vec::new(),
            checks: Vec::new(),
            failed_looks: Vec::new(),
            open: BTreeSet::new(),
            cancelled: HashSet::new(),
            gone: HashSet::new(),
            leases: Vec::new(),
            integresql: HashSet::new(),
            held: BTreeMap::new(),
            next_waiter: 1,
            versions: [0; CONFIGURED],
            created: BTreeSet::new(),
            dropped: BTreeSet::new(),
            passwords: BTreeMap::new(),
            next_password: 0,
        };
        world.server_up(0);
        world
    }

    fn server_up(&mut self, leftovers: usize) {
        if self.up {
            return;
        }
        self.up = true;
        // 40 connections: four default leases, or two of their own limit (20).
        let actions = self.state.server_up(40);
        self.apply(actions);
        for (position, name) in NAMES[..CONFIGURED].iter().enumerate() {
            for n in 0..leftovers {
                let version = self.versions[position] + (n % 2) as u32;
                let clone =
                    DbName::from_server(format!("pglease_old{}_{position}_{n}", self.next_waiter));
                self.created.insert(clone.clone());
                self.state
                    .adopt(&template(name), fingerprint(position, version), clone);
            }
        }
    }

    /// Carries out actions: jobs wait to be completed, answers go to their callers.
    fn apply(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Grant { waiter, grant } => {
                    self.answered(waiter);
                    assert!(
                        !self.state.is_checking_sources(&grant.template),
                        "granted {} while its template's sources were being looked at",
                        grant.database
                    );
                    let current = self
                        .state
                        .status_of(&grant.template)
                        .and_then(|s| s.fingerprint);
                    assert_eq!(
                        current.as_ref(),
                        Some(&grant.fingerprint),
                        "granted {} of a version that is not current",
                        grant.database
                    );
                    assert_eq!(
                        Some(&grant.password),
                        self.passwords.get(&grant.database),
                        "granted {} with a password its role does not have",
                        grant.database
                    );
                    self.deliveries.push((waiter, grant));
                }
                Action::Fail { waiter, .. } => self.answered(waiter),
                job => self.jobs.push(job),
            }
        }
    }

    /// A request is answered: exactly once, whether its caller still waits or went away (a
    /// grant whose connection limit was being set is answered after its caller left).
    fn answered(&mut self, waiter: WaiterId) {
        assert!(
            self.open.remove(&waiter) || self.cancelled.remove(&waiter),
            "request {waiter} answered twice or never made"
        );
    }

    fn deliver(&mut self, index: usize, hung_up: bool) {
        if self.deliveries.is_empty() {
            return;
        }
        let (waiter, grant) = self.deliveries.remove(index % self.deliveries.len());
        if hung_up || self.gone.contains(&waiter) {
            let actions = self.state.grant_undelivered(&grant.lease_id, self.now);
            self.apply(actions);
            return;
        }
        // Nobody else may hold this database while the pool says their lease is open.
        let open: HashSet<LeaseId> = self
            .state
            .lease_list()
            .into_iter()
            .map(|lease| lease.id)
            .collect();
        for held in &self.leases {
            assert!(
                held.database != grant.database || !open.contains(&held.lease_id),
                "{} leased twice: to {} and {}",
                grant.database,
                held.lease_id,
                grant.lease_id
            );
        }
        self.leases.retain(|held| open.contains(&held.lease_id));
        if self.integresql.contains(&waiter) {
            // An id names one database for as long as a client may hold it.
            let key = (grant.template.clone(), grant.number);
            if let Some(old) = self.held.get(&key) {
                panic!(
                    "test id {} of {} handed out for {} while a client still holds it for {old}",
                    grant.number, grant.template, grant.database
                );
            }
            self.held.insert(key, grant.database.clone());
        }
        self.leases.push(grant);
    }

    /// The holder of `lease` (if an IntegreSQL client) gives its id back.
    fn forget_held(&mut self, lease: &Grant) {
        let key = (lease.template.clone(), lease.number);
        if self.held.get(&key) == Some(&lease.database) {
            self.held.remove(&key);
        }
    }

    fn complete(&mut self, index: usize, ok: bool) {
        if self.jobs.is_empty() {
            return;
        }
        let job = self.jobs.remove(index % self.jobs.len());
        let now = self.now;
        let outcome = || {
            if ok {
                Ok(())
            } else {
                Err("it failed".to_owned())
            }
        };
        let actions = match job {
            Action::Build { template, .. } => {
                let position = NAMES.iter().position(|n| *n == template.as_str());
                let version = position.map_or(0, |p| self.versions[p]);
                let fingerprint = fingerprint(position.unwrap_or(9), version);
                let db = DbName::template(&template, &fingerprint);
                let built = Built {
                    fingerprint,
                    db: db.clone(),
                    elapsed: Duration::from_millis(5),
                    size_bytes: position.map_or(0, |p| SIZES[p]) as i64,
                    built_at: std::time::SystemTime::UNIX_EPOCH,
                };
                if ok {
                    self.created.insert(db.clone());
                    self.dropped.remove(&db);
                }
                // A failed build is the sources' fault, or (every other version) a lost
                // connection's, which leaves the template unbuilt rather than failed.
                let outcome = if ok {
                    Ok(built)
                } else if version % 2 == 0 {
                    Err(SqlError {
                        kind: crate::sql_error::SqlErrorKind::ConnectionLost,
                        sqlstate: None,
                        message: "connection lost".into(),
                    })
                } else {
                    Err(SqlError::other("it failed"))
                };
                self.state
                    .build_finished(&template, SourceStamp::default(), outcome, now)
            }
            Action::Clone {
                template,
                template_db,
                clone,
                ..
            } => {
                // Even a failed CREATE may leave files: the pool must drop it.
                self.created.insert(clone.clone());
                let outcome = self.made(&clone, ok);
                self.state
                    .clone_finished(&template, &template_db, clone, outcome, now)
            }
            Action::Recycle {
                template,
                template_db,
                clone,
                ..
            } => {
                let outcome = self.made(&clone, ok);
                self.state
                    .clone_finished(&template, &template_db, clone, outcome, now)
            }
            Action::Drop { db } => {
                if ok {
                    assert!(
                        !self.state.live_databases().contains(&db),
                        "{db} dropped while the pool still uses it"
                    );
                    self.dropped.insert(db.clone());
                }
                self.state
                    .drop_finished(&db, outcome().map_err(SqlError::other), now)
            }
            Action::SetLimit { lease_id, .. } => {
                // A full disk, for a change: its kind must reach the caller.
                let outcome = outcome().map_err(|message| SqlError {
                    kind: crate::sql_error::SqlErrorKind::DiskFull,
                    sqlstate: Some("53100".into()),
                    message,
                });
                self.state.limit_set(&lease_id, outcome, now)
            }
            Action::OpenTemplate { template, db } => {
                self.created.insert(db.clone());
                // A lost connection: the client hears 503, and may initialize again.
                let outcome = outcome().map_err(|message| SqlError {
                    kind: crate::sql_error::SqlErrorKind::ConnectionLost,
                    sqlstate: None,
                    message,
                });
                self.state.template_opened(&template, db, outcome, now).1
            }
            Action::FinalizeTemplate { template, db, .. } => {
                let built = Built {
                    fingerprint: template.to_string(),
                    db: db.clone(),
                    elapsed: Duration::from_millis(5),
                    size_bytes: 2_000_000,
                    built_at: std::time::SystemTime::UNIX_EPOCH,
                };
                let outcome = if ok {
                    Ok(built)
                } else {
                    Err("it failed".into())
                };
                self.state.template_finalized(&template, db, outcome, now).1
            }
            Action::Grant { .. } | Action::Fail { .. } => Vec::new(),
        };
        self.apply(actions);
    }

    fn step(&mut self, event: &Event) {
        let now = self.now;
        match *event {
            Event::Lease {
                template: index,
                own_limit,
                wait_ms,
                native,
            } => {
                let waiter = self.next_waiter;
                self.next_waiter += 1;
                self.open.insert(waiter);
                // The IntegreSQL API asks for client-built templates; the native API may
                // lease them too.
                let reclaimable = index >= CONFIGURED && !native;
                if reclaimable {
                    self.integresql.insert(waiter);
                }
                let request = LeaseRequest {
                    template: template(NAMES[index]),
                    ttl: None,
                    wait: Duration::from_millis(wait_ms),
                    // IntegreSQL's getters never ask for a limit of their own.
                    connections: (own_limit && !reclaimable).then_some(2 * LEASE_CONNECTIONS),
                    reclaimable,
                    postgres_version: None,
                    label: None,
                };
                let actions = self
                    .state
                    .request_lease(waiter, LeaseId::random(0), &request, now);
                self.apply(actions);
            }
            Event::Deliver { index, hung_up } => self.deliver(index, hung_up),
            Event::Release { index, reuse } => {
                if self.leases.is_empty() {
                    return;
                }
                let lease = self.leases.remove(index % self.leases.len());
                self.forget_held(&lease);
                let (_, actions) = self.state.release(&lease.lease_id, reuse, now);
                self.apply(actions);
            }
            Event::Keep { index, secs } => {
                if self.leases.is_empty() {
                    return;
                }
                let lease = self.leases.remove(index % self.leases.len());
                self.forget_held(&lease);
                let (outcome, actions) =
                    self.state
                        .keep(&lease.lease_id, Duration::from_secs(secs), now);
                if let Ok(kept_for) = outcome {
                    assert!(kept_for <= Duration::from_secs(secs.min(20)));
                    let (again, _) = self.state.release(&lease.lease_id, false, now);
                    assert!(again.is_err(), "a kept database's lease is over");
                }
                self.apply(actions);
            }
            Event::DropKept { index } => {
                let kept = self.state.kept_list();
                if let Some(entry) = kept.get(index % kept.len().max(1)) {
                    let (outcome, actions) = self.state.drop_kept(&entry.id, now);
                    assert!(outcome.is_ok(), "{outcome:?}");
                    self.apply(actions);
                }
            }
            Event::Renew { index } => {
                if let Some(lease) = self.leases.get(index % self.leases.len().max(1)) {
                    let _ = self.state.renew(&lease.lease_id, None, now);
                }
            }
            Event::Measured { index, over } => {
                let Some(lease) = self.leases.get(index % self.leases.len().max(1)).cloned() else {
                    return;
                };
                let measured = self.state.leases_to_measure();
                let open = measured.contains(&(lease.lease_id.clone(), lease.database.clone()));
                let bytes = if over {
                    LEASE_MAX_BYTES + 1
                } else {
                    LEASE_MAX_BYTES
                };
                let actions = self.state.lease_sizes(
                    &[(lease.lease_id.clone(), lease.database.clone(), bytes)],
                    std::time::SystemTime::UNIX_EPOCH,
                    now,
                );
                self.apply(actions);
                // An open lease measured past the limit is ended and its holder told why;
                // under it, or ended already, nothing changes for it.
                let renewed = self.state.renew(&lease.lease_id, None, now);
                if open && over {
                    assert!(
                        matches!(renewed, Err(LeaseOpError::ExceededMaxBytes { .. })),
                        "{renewed:?}"
                    );
                } else if open {
                    assert!(renewed.is_ok(), "{renewed:?}");
                }
            }
            Event::SessionsSeen { busy } => {
                let seen: Vec<(LeaseId, DbName, bool)> = self
                    .state
                    .leases_to_look_at()
                    .into_iter()
                    .enumerate()
                    .map(|(i, (id, db))| (id, db, busy & (1 << (i % 8)) != 0))
                    .collect();
                self.state.lease_sessions(&seen, now);
            }
            Event::Cancel { index } => {
                let waiting: Vec<WaiterId> = self.open.iter().copied().collect();
                if let Some(&waiter) = waiting.get(index % waiting.len().max(1)) {
                    // The actor forgets the caller; an answer that still comes finds nobody.
                    self.open.remove(&waiter);
                    self.cancelled.insert(waiter);
                    self.gone.insert(waiter);
                    self.state.cancel_waiter(waiter);
                }
            }
            Event::Complete { index, ok } => self.complete(index, ok),
            Event::Advance { ms } => {
                self.now += Duration::from_millis(ms);
                let actions = self.state.tick(self.now);
                self.apply(actions);
            }
            Event::SourcesChanged { template: index } => {
                self.versions[index] += 1;
                let actions = self.state.rebuild(&template(NAMES[index]), now);
                self.apply(actions);
            }
            Event::Rebuild { template: index } => {
                // A token holder's rebuild: the templates here are configured ones.
                let changer = super::Changer::TokenHolder;
                let rebuilt = self
                    .state
                    .request_rebuild(&template(NAMES[index]), changer, now);
                if let Ok(actions) = rebuilt {
                    self.apply(actions);
                }
            }
            Event::CheckBegins { template: index } => {
                if self.state.begin_sources_check(&template(NAMES[index])) {
                    self.checks.push(index);
                }
            }
            Event::CheckEnds { index, changed } => {
                if self.checks.is_empty() {
                    return;
                }
                let name = self.checks.remove(index % self.checks.len());
                if changed {
                    self.versions[name] += 1;
                }
                let name = template(NAMES[name]);
                // The look compared against the version current when it began.
                let seen = self.state.watch(&name).map(|(_, f)| f).unwrap_or_default();
                let actions =
                    self.state
                        .sources_checked(&name, changed, SourceStamp::default(), &seen, now);
                self.apply(actions);
            }
            Event::FailedLookBegins => {
                for (name, _, _) in self.state.look_at_failed_sources() {
                    assert!(
                        self.state.has_failed(&name),
                        "looked at the sources of {name}, which has not failed"
                    );
                    assert!(
                        !self.failed_looks.contains(&name),
                        "two looks at once at the sources of {name}"
                    );
                    self.failed_looks.push(name);
                }
            }
            Event::FailedLookEnds { index, changed } => {
                if self.failed_looks.is_empty() {
                    return;
                }
                let name = self.failed_looks.remove(index % self.failed_looks.len());
                let was_failed = self.state.has_failed(&name);
                let actions = self.state.failed_sources_looked(&name, changed, now);
                let builds = actions
                    .iter()
                    .any(|a| matches!(a, Action::Build { template, .. } if *template == name));
                assert!(
                    !builds || (changed && was_failed),
                    "a look at {name}'s sources built it (changed: {changed}, failed: {was_failed})"
                );
                self.apply(actions);
            }
            Event::ServerLost => {
                if !self.up {
                    return;
                }
                // The looks under way report against a lost server: not applied.
                self.checks.clear();
                // The actor answers synchronously: no grant is still on its way.
                while !self.deliveries.is_empty() {
                    self.deliver(0, false);
                }
                let actions = self.state.server_lost("postgres exited");
                self.apply(actions);
                // Reports of the lost server's jobs are ignored (its generation is over),
                // and what it held is swept by the next session.
                self.jobs.clear();
                self.created.clear();
                self.dropped.clear();
                self.passwords.clear();
                self.up = false;
            }
            Event::ServerUp { leftovers } => self.server_up(leftovers),
            Event::Initialize { client } => {
                let name = template(NAMES[CONFIGURED + client]);
                if let Ok(actions) = self.state.initialize(&name, self.now) {
                    self.apply(actions);
                }
            }
            Event::Finalize { client } => {
                if let Ok(Finalize::Start(action)) =
                    self.state.finalize(&template(NAMES[CONFIGURED + client]))
                {
                    self.jobs.push(action);
                }
            }
            Event::Discard { client } => {
                if let Ok(actions) = self
                    .state
                    .discard(&template(NAMES[CONFIGURED + client]), now)
                {
                    self.apply(actions);
                }
            }
            Event::GiveBack { index, recreate } => {
                let held: Vec<(TemplateName, u32)> = self.held.keys().cloned().collect();
                let (name, number) = match held.get(index % held.len().max(1)) {
                    Some(key) => key.clone(),
                    None => (template(NAMES[CONFIGURED + index % 2]), (index % 4) as u32),
                };
                // Given back, or answered 404 (its database is gone): the client lets go.
                let holds = self.held.remove(&(name.clone(), number));
                let found = self.state.lease_by_number(&name, number);
                // An id nobody holds is asked for only to be refused: one found is a grant
                // still on its way to its client.
                if let (Ok((id, database)), Some(holds)) = (found, holds) {
                    assert_eq!(
                        holds, database,
                        "test id {number} of {name} names another database than its client's"
                    );
                    let (_, actions) = self.state.release(&id, !recreate, now);
                    self.apply(actions);
                }
            }
            Event::Reset => {
                if let Ok(actions) = self.state.discard_all_client_built(now) {
                    self.apply(actions);
                }
            }
        }
    }

    /// Completes every job, delivers every grant and lets time run out until nothing is
    /// left to do; then every promise about the end must hold.
    fn settle(&mut self) {
        self.server_up(0);
        for _ in 0..100 {
            while !self.deliveries.is_empty() {
                self.deliver(0, false);
            }
            while !self.jobs.is_empty() {
                self.complete(0, true);
                self.check();
            }
            if self.deliveries.is_empty() {
                // Past every lease's ttl, every wait and every drop's back-off.
                self.now += Duration::from_secs(120);
                let actions = self.state.tick(self.now);
                self.apply(actions);
                self.check();
                if self.jobs.is_empty() && self.deliveries.is_empty() {
                    break;
                }
            }
        }
        assert!(self.jobs.is_empty(), "jobs never ended: {:?}", self.jobs);
        assert!(
            self.open.is_empty(),
            "requests never answered: {:?}",
            self.open
        );
        let drops = self.state.drop_status();
        assert_eq!(drops.pending, 0, "drops never done: {drops:?}");
        assert!(self.state.lease_list().is_empty(), "leases never ended");
        assert!(
            self.state.kept_list().is_empty(),
            "kept databases never dropped"
        );
        let live = self.state.live_databases();
        let lost: Vec<&DbName> = self
            .created
            .iter()
            .filter(|db| !self.dropped.contains(*db) && !live.contains(*db))
            .collect();
        assert!(
            lost.is_empty(),
            "databases neither dropped nor in use: {lost:?}"
        );
    }

    fn check(&self) {
        if let Err(broken) = self.state.check_invariants() {
            panic!("invariant broken: {broken}");
        }
        for kept in self.state.kept_list() {
            assert_eq!(
                Some(&kept.password),
                self.passwords.get(&kept.database),
                "kept {} listed with a password its role does not have",
                kept.database
            );
        }
    }

    /// A clone or recycle job's report: a successful one gave the role a new password.
    fn made(&mut self, clone: &DbName, ok: bool) -> Result<super::Made, SqlError> {
        if !ok {
            return Err(SqlError::other("it failed"));
        }
        self.next_password += 1;
        let password = format!("password-{}", self.next_password);
        self.passwords.insert(clone.clone(), password.clone());
        Ok(super::Made {
            password,
            stamp: None,
        })
    }
}

/// The fingerprint of a configured template's version.
fn fingerprint(position: usize, version: u32) -> String {
    format!("{position:08x}{version:08x}")
}

fn template(name: &str) -> TemplateName {
    TemplateName::new(name).expect("a valid template name")
}

proptest! {
    #![proptest_config(crate::testing::proptest_config(
        "PGLEASE_INTERLEAVINGS",
        DEFAULT_CASES,
        20_000,
    ))]

    #[test]
    fn every_interleaving_keeps_the_promises(
        events in prop::collection::vec(event(), 1..120),
        budget in prop::option::of(6_000_000u64..30_000_000),
        min_ready in 0usize..3,
        reuse_unchanged in any::<bool>(),
    ) {
        // With reuse_unchanged, releases go through the proof: a recycle whose outcome
        // (unchanged, changed, failed) the generated job reports decide.
        let mut world = World::new(budget, min_ready, reuse_unchanged);
        world.check();
        for event in &events {
            world.step(event);
            world.check();
        }
        world.settle();
    }

    #[test]
    fn every_interleaving_of_client_templates_keeps_their_ids(
        events in prop::collection::vec(client_event(), 1..120),
        min_ready in 0usize..3,
    ) {
        let mut world = World::new(None, min_ready, false);
        world.check();
        for event in &events {
            world.step(event);
            world.check();
        }
        world.settle();
    }
}
