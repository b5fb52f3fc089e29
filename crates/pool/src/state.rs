//! `PoolState`: the rules of the pool, with no I/O. It takes events (a lease requested, a
//! build or clone finished, a lease released or expired, postgres lost or back), each with
//! the current instant, and returns the [`Action`]s the actor must carry out.
//!
//! It never awaits, spawns or talks SQL; the actor owns it and is its only caller, which is
//! what makes "no database is leased twice" a property of this file alone: a database name
//! sits in exactly one place — a template's ready queue, a lease record, or the drop queue.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{PoolLimits, TemplateConfig, TemplateSource};
use crate::error::{LeaseError, LeaseOpError};
use crate::names::{DbName, LeaseId, TemplateName};
use crate::types::{LeaseRequest, TemplateStatus};

/// Identifies a parked lease request; the actor maps it to the reply channel.
pub(crate) type WaiterId = u64;

/// How many lost lease ids are remembered to answer "lost" rather than "not found".
const LOST_MEMORY: usize = 4096;

/// After a clone fails, wait this long before trying that template's clones again.
const CLONE_RETRY_DELAY: Duration = Duration::from_secs(1);

/// What the actor must do next.
#[derive(Debug)]
pub(crate) enum Action {
    /// Compute the template's fingerprint and build its template database.
    Build {
        template: TemplateName,
        source: TemplateSource,
    },
    /// `CREATE DATABASE clone TEMPLATE template_db`.
    Clone {
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
    },
    /// Rotate a reused clone's password and end its sessions; reported like a clone.
    Recycle {
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
    },
    /// `DROP DATABASE db WITH (FORCE)`.
    Drop { db: DbName },
    /// Create the empty database of a client-built template and its login role; reported
    /// with [`PoolState::template_opened`].
    OpenTemplate { template: TemplateName, db: DbName },
    /// End the client's sessions on a client-built template, drop its login role and mark
    /// the database a template; reported with [`PoolState::template_finalized`].
    FinalizeTemplate {
        template: TemplateName,
        db: DbName,
        since: Instant,
    },
    /// Hand a lease to a parked request.
    Grant { waiter: WaiterId, grant: Grant },
    /// Answer a parked request with an error.
    Fail { waiter: WaiterId, error: LeaseError },
}

/// A lease decided by the state, to be completed with connection details by the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub lease_id: LeaseId,
    pub template: TemplateName,
    pub fingerprint: String,
    pub database: DbName,
    pub ttl: Duration,
    /// The lease's connection limit.
    pub connections: u32,
    /// Its number among the template's leases.
    pub number: u32,
}

/// An open lease as `/status` shows it.
#[derive(Debug, Clone)]
pub(crate) struct OpenLease {
    pub id: LeaseId,
    pub template: TemplateName,
    pub database: DbName,
    pub expires_at: Instant,
}

/// A finished build, as the actor reports it.
#[derive(Debug, Clone)]
pub(crate) struct Built {
    pub fingerprint: String,
    pub db: DbName,
    pub elapsed: Duration,
    pub size_bytes: i64,
    pub built_at: std::time::SystemTime,
}

#[derive(Debug)]
enum Build {
    Idle,
    /// `previous` is the template database of the version being replaced, dropped once
    /// the build ends.
    Building {
        previous: Option<DbName>,
    },
    Ready {
        fingerprint: String,
        db: DbName,
    },
    Failed,
    /// A client-built template whose empty database `db` is being created.
    Opening {
        db: DbName,
    },
    /// A client-built template whose empty database a client is migrating (since `since`).
    Open {
        db: DbName,
        since: Instant,
    },
    /// A client-built template being finalized.
    Finalizing {
        db: DbName,
    },
    /// A client-built template its client discarded: requests for it fail until it is
    /// initialized again.
    Discarded,
}

#[derive(Debug)]
struct Waiter {
    id: WaiterId,
    lease_id: LeaseId,
    ttl: Duration,
    connections: u32,
    reclaimable: bool,
    enqueued: Instant,
    deadline: Instant,
}

#[derive(Debug)]
struct TemplateEntry {
    source: TemplateSource,
    build: Build,
    /// Clones are kept warm only for templates someone asked for (or prebuilt).
    wanted: bool,
    ready: VecDeque<DbName>,
    creating: usize,
    leased: usize,
    waiters: VecDeque<Waiter>,
    last_error: Option<String>,
    clones_paused_until: Option<Instant>,
    /// Builds finished in this run; the current version's number.
    version: u32,
    last_build: Option<Built>,
    /// When a lease of it was last granted (for evicting the least recently used).
    last_used: Option<Instant>,
    /// Ready clones of an earlier run, by fingerprint, waiting for this run's build.
    adoptable: Vec<(String, DbName)>,
    /// The number the next lease of this template gets.
    next_number: u32,
    /// How fast its ready clones are used up, to refill ahead of that.
    demand: demand::Demand,
}

#[derive(Debug)]
struct LeaseRecord {
    template: TemplateName,
    fingerprint: String,
    /// The template database it was cloned from (names a version).
    template_db: DbName,
    database: DbName,
    expires_at: Instant,
    connections: u32,
    /// Bytes its database was made with (its template version's size).
    bytes: u64,
    /// Its number among the template's leases.
    number: u32,
    /// May be ended to make room (see [`LeaseRequest::reclaimable`]).
    reclaimable: bool,
    granted_at: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Server {
    Down(String),
    Up,
    Stopping,
}

/// The pool's bookkeeping. See the module docs.
#[derive(Debug)]
pub(crate) struct PoolState {
    limits: PoolLimits,
    instance: String,
    next_seq: u64,
    server: Server,
    templates: BTreeMap<TemplateName, TemplateEntry>,
    leases: HashMap<LeaseId, LeaseRecord>,
    lost: HashSet<LeaseId>,
    lost_order: VecDeque<LeaseId>,
    drop_queue: VecDeque<DbName>,
    clones_running: usize,
    drops_running: usize,
    /// Connections the server can give lease holders; leases are granted only while the
    /// sum of their connection limits fits.
    connection_budget: u32,
    /// When each clone being made was started (recycles are not timed).
    clone_started: HashMap<DbName, Instant>,
}

impl TemplateEntry {
    /// Bytes of the current (or last built) version: what each of its clones costs.
    fn version_size(&self) -> u64 {
        self.last_build
            .as_ref()
            .map_or(0, |b| u64::try_from(b.size_bytes).unwrap_or(0))
    }

    fn new(source: TemplateSource, wanted: bool) -> Self {
        TemplateEntry {
            source,
            build: Build::Idle,
            wanted,
            ready: VecDeque::new(),
            creating: 0,
            leased: 0,
            waiters: VecDeque::new(),
            last_error: None,
            clones_paused_until: None,
            version: 0,
            last_build: None,
            last_used: None,
            adoptable: Vec::new(),
            next_number: 0,
            demand: demand::Demand::default(),
        }
    }
}

/// What registering a template at run time did (`PoolHandle::register`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// A new template.
    Created,
    /// An existing template got a new source (a new version follows).
    Replaced,
    /// The template already had this source.
    Unchanged,
}

impl PoolState {
    /// A pool whose server is not up yet. `default` is wanted from the start so `/readyz`
    /// and the first lease do not wait for a build; others only with `prebuild`.
    pub fn new(
        limits: PoolLimits,
        instance: String,
        templates: &[TemplateConfig],
        prebuild: bool,
    ) -> Self {
        let mut entries = BTreeMap::new();
        for template in templates {
            let wanted = prebuild || template.name == TemplateName::default_name();
            entries.insert(
                template.name.clone(),
                TemplateEntry::new(template.source.clone(), wanted),
            );
        }
        PoolState {
            limits,
            instance,
            next_seq: 1,
            server: Server::Down("starting".into()),
            templates: entries,
            leases: HashMap::new(),
            lost: HashSet::new(),
            lost_order: VecDeque::new(),
            drop_queue: VecDeque::new(),
            clones_running: 0,
            drops_running: 0,
            connection_budget: 0,
            clone_started: HashMap::new(),
        }
    }

    /// Postgres accepts connections (first start, restart or reconnect), with room for
    /// `connection_budget` lease connections: build what is wanted.
    pub fn server_up(&mut self, connection_budget: u32) -> Vec<Action> {
        if self.server == Server::Stopping {
            return Vec::new();
        }
        self.server = Server::Up;
        self.connection_budget = connection_budget;
        let mut actions = Vec::new();
        for (name, entry) in &mut self.templates {
            if entry.wanted && matches!(entry.build, Build::Idle) {
                entry.build = Build::Building { previous: None };
                actions.push(Action::Build {
                    template: name.clone(),
                    source: entry.source.clone(),
                });
            }
        }
        actions
    }

    /// Postgres died or the connection to it was lost: everything on it is gone. Open leases
    /// become "lost", waiting requests fail, builds must be redone.
    pub fn server_lost(&mut self, reason: &str) -> Vec<Action> {
        if self.server != Server::Stopping {
            self.server = Server::Down(reason.to_owned());
        }
        let lost_ids: Vec<LeaseId> = self.leases.drain().map(|(id, _)| id).collect();
        for id in lost_ids {
            self.remember_lost(id);
        }
        let mut actions = Vec::new();
        for (name, entry) in &mut self.templates {
            if entry.source.is_client_built() {
                // Nothing here can rebuild it: its requests fail, and the entry goes (the
                // next session's sweep brings it back if the server kept it).
                for waiter in entry.waiters.drain(..) {
                    actions.push(Action::Fail {
                        waiter: waiter.id,
                        error: LeaseError::UnknownTemplate(name.clone()),
                    });
                }
            }
        }
        self.templates.retain(|_, e| !e.source.is_client_built());
        for entry in self.templates.values_mut() {
            entry.ready.clear();
            // Found again by the sweep of the next session, if still there.
            entry.adoptable.clear();
            entry.creating = 0;
            entry.leased = 0;
            entry.clones_paused_until = None;
            entry.build = Build::Idle;
            for waiter in entry.waiters.drain(..) {
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::PostgresDown(reason.to_owned()),
                });
            }
        }
        self.drop_queue.clear();
        self.clone_started.clear();
        self.clones_running = 0;
        self.drops_running = 0;
        actions
    }

    /// The daemon is stopping: refuse new work and answer everyone waiting.
    pub fn stopping(&mut self) -> Vec<Action> {
        self.server = Server::Stopping;
        let mut actions = Vec::new();
        for entry in self.templates.values_mut() {
            for waiter in entry.waiters.drain(..) {
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::ShuttingDown,
                });
            }
        }
        actions
    }

    /// A caller wants a lease. It is granted at once from the ready queue when nobody is
    /// ahead of it, otherwise parked until a clone is ready or `request.wait` runs out.
    pub fn request_lease(
        &mut self,
        waiter: WaiterId,
        lease_id: LeaseId,
        request: &LeaseRequest,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        match &self.server {
            Server::Up => {}
            Server::Stopping => {
                actions.push(Action::Fail {
                    waiter,
                    error: LeaseError::ShuttingDown,
                });
                return actions;
            }
            Server::Down(reason) => {
                actions.push(Action::Fail {
                    waiter,
                    error: LeaseError::PostgresDown(reason.clone()),
                });
                return actions;
            }
        }
        let ttl = request
            .ttl
            .unwrap_or(self.limits.default_ttl)
            .min(self.limits.max_ttl);
        let waiting: usize = self.templates.values().map(|e| e.waiters.len()).sum();
        if waiting >= self.limits.max_waiting {
            actions.push(Action::Fail {
                waiter,
                error: LeaseError::TooManyWaiting { waiting },
            });
            return actions;
        }
        let connections = request.connections.unwrap_or(self.limits.lease_connections);
        if connections > self.connection_budget {
            actions.push(Action::Fail {
                waiter,
                error: LeaseError::TooManyConnections {
                    requested: connections,
                    budget: self.connection_budget,
                },
            });
            return actions;
        }
        let Some(entry) = self.templates.get_mut(&request.template) else {
            actions.push(Action::Fail {
                waiter,
                error: LeaseError::UnknownTemplate(request.template.clone()),
            });
            return actions;
        };
        if request.reclaimable && !entry.source.is_client_built() {
            // The IntegreSQL API (whose port needs no token) serves the templates its
            // clients build, not the configured ones the native API guards.
            actions.push(Action::Fail {
                waiter,
                error: LeaseError::UnknownTemplate(request.template.clone()),
            });
            return actions;
        }
        if entry.source.is_client_built() {
            // Nothing to build: requests wait for the client to finalize, or fail.
            let error = match &entry.build {
                Build::Discarded => Some(LeaseError::Discarded(request.template.clone())),
                Build::Failed | Build::Idle => Some(LeaseError::BuildFailed {
                    template: request.template.clone(),
                    message: entry
                        .last_error
                        .clone()
                        .unwrap_or_else(|| "the client did not finalize it".into()),
                }),
                Build::Building { .. }
                | Build::Opening { .. }
                | Build::Open { .. }
                | Build::Finalizing { .. }
                | Build::Ready { .. } => None,
            };
            if let Some(error) = error {
                actions.push(Action::Fail { waiter, error });
                return actions;
            }
        }
        entry.wanted = true;
        if matches!(entry.build, Build::Idle | Build::Failed) {
            // A failed build is retried by the next request: the sources may have been fixed.
            entry.build = Build::Building { previous: None };
            actions.push(Action::Build {
                template: request.template.clone(),
                source: entry.source.clone(),
            });
        }
        entry.waiters.push_back(Waiter {
            id: waiter,
            lease_id,
            ttl,
            connections,
            reclaimable: request.reclaimable,
            enqueued: now,
            deadline: now + request.wait,
        });
        let template = request.template.clone();
        self.serve_waiters(&template, now, &mut actions);
        self.dispatch(now, &mut actions);
        actions
    }

    /// A parked request's caller went away: forget it, so it does not hold up others or
    /// make the pool grow for nobody.
    pub fn cancel_waiter(&mut self, waiter: WaiterId) {
        for entry in self.templates.values_mut() {
            entry.waiters.retain(|w| w.id != waiter);
        }
    }

    /// Adds a template at run time, or gives an existing one a new source: its current
    /// version is then replaced as if its sources had changed. Built on first lease.
    /// `default` and templates clients build have no source to replace.
    pub fn register(
        &mut self,
        name: TemplateName,
        source: TemplateSource,
        now: Instant,
    ) -> Result<(Registered, Vec<Action>), LeaseError> {
        if name == TemplateName::default_name() {
            return Err(LeaseError::Internal(
                "the default template cannot be replaced".into(),
            ));
        }
        Ok(match self.templates.get_mut(&name) {
            Some(entry) if entry.source.is_client_built() => {
                return Err(LeaseError::ClientBuilt(name))
            }
            None => {
                self.templates
                    .insert(name, TemplateEntry::new(source, false));
                (Registered::Created, Vec::new())
            }
            Some(entry) if entry.source == source => (Registered::Unchanged, Vec::new()),
            Some(entry) => {
                entry.source = source;
                let actions = if matches!(entry.build, Build::Ready { .. }) {
                    self.rebuild(&name, now)
                } else {
                    // Idle or failed: the next lease builds the new source. A build in
                    // flight uses the old one; the next lease sees the change and rebuilds.
                    Vec::new()
                };
                (Registered::Replaced, actions)
            }
        })
    }

    /// A rebuild asked for over the API: unknown and client-built templates are refused
    /// (a client's template has no sources here); see [`PoolState::rebuild`].
    pub fn request_rebuild(
        &mut self,
        template: &TemplateName,
        now: Instant,
    ) -> Result<Vec<Action>, LeaseError> {
        match self.templates.get(template) {
            None => Err(LeaseError::UnknownTemplate(template.clone())),
            Some(entry) if entry.source.is_client_built() => {
                Err(LeaseError::ClientBuilt(template.clone()))
            }
            Some(_) => Ok(self.rebuild(template, now)),
        }
    }

    /// Every template's name and current source.
    pub fn templates(&self) -> Vec<TemplateConfig> {
        self.templates
            .iter()
            .map(|(name, entry)| TemplateConfig {
                name: name.clone(),
                source: entry.source.clone(),
            })
            .collect()
    }

    /// The current source of a template.
    pub fn source_of(&self, name: &TemplateName) -> Option<&TemplateSource> {
        self.templates.get(name).map(|entry| &entry.source)
    }

    /// The template's sources changed (or a rebuild was asked for): build a new version.
    /// The old version's ready clones are dropped now, its leased ones when released, and
    /// its template database once the new build ends. Unknown templates are ignored.
    pub fn rebuild(&mut self, template: &TemplateName, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.server != Server::Up {
            return actions;
        }
        let Some(entry) = self.templates.get_mut(template) else {
            return actions;
        };
        if matches!(entry.build, Build::Building { .. }) || entry.source.is_client_built() {
            return actions;
        }
        let previous = match std::mem::replace(&mut entry.build, Build::Building { previous: None })
        {
            Build::Ready { db, .. } => Some(db),
            Build::Idle
            | Build::Building { .. }
            | Build::Failed
            | Build::Opening { .. }
            | Build::Open { .. }
            | Build::Finalizing { .. }
            | Build::Discarded => None,
        };
        entry.build = Build::Building { previous };
        entry.wanted = true;
        self.drop_queue.extend(entry.ready.drain(..));
        actions.push(Action::Build {
            template: template.clone(),
            source: entry.source.clone(),
        });
        self.dispatch(now, &mut actions);
        actions
    }

    /// A build ended: with the new version, or an error message.
    pub fn build_finished(
        &mut self,
        template: &TemplateName,
        outcome: Result<Built, String>,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(entry) = self.templates.get_mut(template) else {
            return actions;
        };
        let previous = match &mut entry.build {
            Build::Building { previous } => previous.take(),
            Build::Idle
            | Build::Ready { .. }
            | Build::Failed
            | Build::Opening { .. }
            | Build::Open { .. }
            | Build::Finalizing { .. }
            | Build::Discarded => None,
        };
        match outcome {
            Ok(built) => {
                if let Some(old) = previous.filter(|old| *old != built.db) {
                    self.drop_queue.push_back(old);
                }
                entry.version += 1;
                entry.build = Build::Ready {
                    fingerprint: built.fingerprint.clone(),
                    db: built.db.clone(),
                };
                // Ready clones an earlier run left of this very version rejoin the pool;
                // they are recycled (new password) first, like a reused lease.
                for (fingerprint, clone) in std::mem::take(&mut entry.adoptable) {
                    if fingerprint == built.fingerprint {
                        entry.creating += 1;
                        self.clones_running += 1;
                        actions.push(Action::Recycle {
                            template: template.clone(),
                            template_db: built.db.clone(),
                            clone,
                        });
                    } else {
                        self.drop_queue.push_back(clone);
                    }
                }
                entry.last_build = Some(built);
                entry.last_error = None;
                if !self.fits(0) {
                    self.make_room(template, 0);
                }
            }
            Err(message) => {
                // A stale version must not hide a broken migration: it goes too.
                self.drop_queue.extend(previous);
                self.drop_queue
                    .extend(entry.adoptable.drain(..).map(|(_, clone)| clone));
                for waiter in entry.waiters.drain(..) {
                    actions.push(Action::Fail {
                        waiter: waiter.id,
                        error: LeaseError::BuildFailed {
                            template: template.clone(),
                            message: message.clone(),
                        },
                    });
                }
                entry.last_error = Some(message);
                entry.build = Build::Failed;
            }
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// A clone (or a recycle) ended. On success it joins the ready queue (or goes straight to a waiter);
    /// on failure the template's waiters get the error and its clones pause briefly, so a
    /// full disk does not turn into a busy loop.
    pub fn clone_finished(
        &mut self,
        template: &TemplateName,
        template_db: &DbName,
        clone: DbName,
        outcome: Result<(), String>,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        self.clones_running = self.clones_running.saturating_sub(1);
        let started = self.clone_started.remove(&clone);
        let Some(entry) = self.templates.get_mut(template) else {
            self.drop_queue.push_back(clone);
            self.dispatch(now, &mut actions);
            return actions;
        };
        entry.creating = entry.creating.saturating_sub(1);
        let current = matches!(&entry.build, Build::Ready { db, .. } if db == template_db);
        if let (Some(started), true, true) = (started, current, outcome.is_ok()) {
            entry.demand.cloned(now.saturating_duration_since(started));
        }
        match outcome {
            // Made (or not: its template may be gone already) from a version replaced
            // meanwhile: nobody may lease it, and its fate is no news for today's waiters.
            _ if !current => self.drop_queue.push_back(clone),
            Ok(()) => {
                entry.ready.push_back(clone);
                entry.last_error = None;
                self.serve_waiters(template, now, &mut actions);
            }
            Err(message) => {
                entry.clones_paused_until = Some(now + CLONE_RETRY_DELAY);
                for waiter in entry.waiters.drain(..) {
                    actions.push(Action::Fail {
                        waiter: waiter.id,
                        error: LeaseError::CloneFailed {
                            template: template.clone(),
                            message: message.clone(),
                        },
                    });
                }
                entry.last_error = Some(message);
                // The failed CREATE may have left files behind; dropping is harmless if not.
                self.drop_queue.push_back(clone);
            }
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// A drop ended (successfully or not; failures are logged by the actor).
    pub fn drop_finished(&mut self, now: Instant) -> Vec<Action> {
        self.drops_running = self.drops_running.saturating_sub(1);
        let mut actions = Vec::new();
        self.dispatch(now, &mut actions);
        actions
    }

    /// The reply carrying a grant could not be delivered (the client went away): the
    /// database was never seen by anyone, so it goes back to the front of the ready queue.
    pub fn grant_undelivered(&mut self, lease_id: &LeaseId, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(record) = self.leases.remove(lease_id) {
            if let Some(entry) = self.templates.get_mut(&record.template) {
                entry.leased = entry.leased.saturating_sub(1);
                entry.ready.push_front(record.database);
                entry.demand.returned(now);
            } else {
                self.drop_queue.push_back(record.database);
            }
            let template = record.template;
            self.serve_waiters(&template, now, &mut actions);
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// A caller is done with a lease. With `reuse` the caller vouches the database is
    /// unchanged and it goes back to the ready queue; otherwise it is dropped and replaced.
    pub fn release(
        &mut self,
        id: &LeaseId,
        reuse: bool,
        now: Instant,
    ) -> (Result<(), LeaseOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let Some(record) = self.leases.remove(id) else {
            return (Err(self.missing_lease(id)), actions);
        };
        let mut to_drop = Some(record.database);
        if let Some(entry) = self.templates.get_mut(&record.template) {
            entry.leased = entry.leased.saturating_sub(1);
            let current_db = match &entry.build {
                // The very version it was cloned from (a client-built template initialized
                // again has the same fingerprint, but another database).
                Build::Ready { fingerprint, db }
                    if *fingerprint == record.fingerprint && *db == record.template_db =>
                {
                    Some(db.clone())
                }
                _ => None,
            };
            if let (true, Some(template_db)) = (reuse, current_db) {
                if let Some(clone) = to_drop.take() {
                    // Back in the ready queue only once the old holder is locked out;
                    // until then it counts as being made.
                    entry.demand.returned(now);
                    entry.creating += 1;
                    self.clones_running += 1;
                    actions.push(Action::Recycle {
                        template: record.template.clone(),
                        template_db,
                        clone,
                    });
                }
            }
        }
        if let Some(db) = to_drop {
            self.drop_queue.push_back(db);
        }
        self.serve_all_waiters(now, &mut actions);
        self.dispatch(now, &mut actions);
        (Ok(()), actions)
    }

    /// Extends a lease to `ttl` from now.
    pub fn renew(
        &mut self,
        id: &LeaseId,
        ttl: Option<Duration>,
        now: Instant,
    ) -> Result<Duration, LeaseOpError> {
        let ttl = ttl
            .unwrap_or(self.limits.default_ttl)
            .min(self.limits.max_ttl);
        match self.leases.get_mut(id) {
            Some(record) => {
                record.expires_at = now + ttl;
                Ok(ttl)
            }
            None => Err(self.missing_lease(id)),
        }
    }

    /// Time passes: expire leases, time out waiters, resume paused clones.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let expired: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, record)| record.expires_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(record) = self.leases.remove(&id) {
                tracing::info!(lease_id = %id, database = %record.database, "lease expired; dropping its database");
                if let Some(entry) = self.templates.get_mut(&record.template) {
                    entry.leased = entry.leased.saturating_sub(1);
                }
                self.drop_queue.push_back(record.database);
            }
        }
        self.serve_all_waiters(now, &mut actions);
        let max_total = self.limits.max_total;
        for (name, entry) in &mut self.templates {
            let leased = entry.leased;
            let (timed_out, waiting): (Vec<Waiter>, Vec<Waiter>) =
                entry.waiters.drain(..).partition(|w| w.deadline <= now);
            entry.waiters = waiting.into();
            for waiter in timed_out {
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::TimedOut {
                        template: name.clone(),
                        waited_ms: now.duration_since(waiter.enqueued).as_millis() as u64,
                        leased,
                        max_total,
                    },
                });
            }
            if entry.clones_paused_until.is_some_and(|t| t <= now) {
                entry.clones_paused_until = None;
            }
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// The earliest instant at which [`PoolState::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let leases = self.leases.values().map(|r| r.expires_at);
        let templates = self.templates.values().flat_map(|e| {
            e.waiters
                .iter()
                .map(|w| w.deadline)
                .chain(e.clones_paused_until)
        });
        leases.chain(templates).min()
    }

    /// One template's counts, if it exists.
    pub fn status_of(&self, template: &TemplateName) -> Option<TemplateStatus> {
        self.template_status()
            .into_iter()
            .find(|t| t.name == *template)
    }

    /// Per-template counts for `/status`.
    pub fn template_status(&self) -> Vec<TemplateStatus> {
        self.templates
            .iter()
            .map(|(name, entry)| {
                let (state, fingerprint) = match &entry.build {
                    Build::Idle => ("idle", None),
                    Build::Building { .. } => ("building", None),
                    Build::Ready { fingerprint, .. } => ("ready", Some(fingerprint.clone())),
                    Build::Failed => ("failed", None),
                    Build::Opening { .. } => ("initializing", None),
                    Build::Open { .. } => ("migrating", None),
                    Build::Finalizing { .. } => ("building", None),
                    Build::Discarded => ("discarded", None),
                };
                TemplateStatus {
                    name: name.clone(),
                    fingerprint,
                    version: entry.version,
                    build_ms: entry
                        .last_build
                        .as_ref()
                        .map(|b| b.elapsed.as_millis() as u64),
                    size_bytes: entry.last_build.as_ref().map(|b| b.size_bytes),
                    built_at: entry.last_build.as_ref().map(|b| b.built_at),
                    state,
                    ready: entry.ready.len(),
                    leased: entry.leased,
                    in_progress: entry.creating,
                    waiting: entry.waiters.len(),
                    last_error: entry.last_error.clone(),
                }
            })
            .collect()
    }

    /// Open leases, soonest expiry first.
    pub fn lease_list(&self) -> Vec<OpenLease> {
        let mut list: Vec<OpenLease> = self
            .leases
            .iter()
            .map(|(id, record)| OpenLease {
                id: id.clone(),
                template: record.template.clone(),
                database: record.database.clone(),
                expires_at: record.expires_at,
            })
            .collect();
        list.sort_by_key(|lease| lease.expires_at);
        list
    }

    /// Postgres is up and the `default` template is built.
    pub fn ready_for_default(&self) -> bool {
        self.server == Server::Up
            && self
                .templates
                .get(&TemplateName::default_name())
                .is_some_and(|e| matches!(e.build, Build::Ready { .. }))
    }

    /// Whether `template_db` is the current version of `template`.
    pub fn is_current(&self, template: &TemplateName, template_db: &DbName) -> bool {
        self.templates
            .get(template)
            .is_some_and(|e| matches!(&e.build, Build::Ready { db, .. } if db == template_db))
    }

    /// True while postgres is up.
    pub fn server_is_up(&self) -> bool {
        self.server == Server::Up
    }

    /// What a server that outlives us keeps and loses at shutdown: ready clones of built
    /// versions (template, fingerprint, clone) to adopt next time, and the clones that must
    /// go (leased ones, whose holders may still use them, and those queued for dropping).
    pub fn clones_at_shutdown(&self) -> (Vec<(TemplateName, String, DbName)>, Vec<DbName>) {
        let mut keep = Vec::new();
        for (name, entry) in &self.templates {
            if let Build::Ready { fingerprint, .. } = &entry.build {
                keep.extend(
                    entry
                        .ready
                        .iter()
                        .map(|db| (name.clone(), fingerprint.clone(), db.clone())),
                );
            }
        }
        let mut lose: Vec<DbName> = self.leases.values().map(|r| r.database.clone()).collect();
        lose.extend(self.drop_queue.iter().cloned());
        for entry in self.templates.values() {
            if !matches!(entry.build, Build::Ready { .. }) {
                lose.extend(entry.ready.iter().cloned());
            }
        }
        (keep, lose)
    }

    /// A ready clone an earlier run left on the server: it rejoins the pool (with a new
    /// password) once its template's current version is built with the same fingerprint,
    /// and is dropped otherwise.
    pub fn adopt(&mut self, template: &TemplateName, fingerprint: String, clone: DbName) {
        match self.templates.get_mut(template) {
            Some(entry) => entry.adoptable.push((fingerprint, clone)),
            None => self.drop_queue.push_back(clone),
        }
    }

    fn missing_lease(&self, id: &LeaseId) -> LeaseOpError {
        if self.lost.contains(id) {
            LeaseOpError::Lost(id.to_string())
        } else if self.server == Server::Stopping {
            LeaseOpError::ShuttingDown
        } else {
            LeaseOpError::NotFound(id.to_string())
        }
    }

    fn remember_lost(&mut self, id: LeaseId) {
        if self.lost_order.len() >= LOST_MEMORY {
            if let Some(old) = self.lost_order.pop_front() {
                self.lost.remove(&old);
            }
        }
        self.lost.insert(id.clone());
        self.lost_order.push_back(id);
    }

    /// Pairs ready clones with waiters of one template, first come first served.
    fn serve_waiters(&mut self, template: &TemplateName, now: Instant, actions: &mut Vec<Action>) {
        let mut in_use = self.connections_in_use();
        self.serve_waiters_within(template, now, &mut in_use, actions);
    }

    /// Connections held by open leases (their limits, summed).
    fn connections_in_use(&self) -> u32 {
        self.leases.values().map(|r| r.connections).sum()
    }

    /// [`Self::serve_waiters`] with the connections in use already counted (and updated as
    /// leases are granted), so serving every template counts them once.
    fn serve_waiters_within(
        &mut self,
        template: &TemplateName,
        now: Instant,
        in_use: &mut u32,
        actions: &mut Vec<Action>,
    ) {
        let Some(entry) = self.templates.get_mut(template) else {
            return;
        };
        let Build::Ready {
            fingerprint,
            db: template_db,
        } = &entry.build
        else {
            return;
        };
        let bytes = entry.version_size();
        while !entry.ready.is_empty() && !entry.waiters.is_empty() {
            // The first in line waits for connections to free up; nobody overtakes it.
            if entry
                .waiters
                .front()
                .is_some_and(|w| *in_use + w.connections > self.connection_budget)
            {
                break;
            }
            let (Some(database), Some(waiter)) =
                (entry.ready.pop_front(), entry.waiters.pop_front())
            else {
                break;
            };
            *in_use += waiter.connections;
            entry.leased += 1;
            entry.last_used = Some(now);
            entry.demand.taken(now);
            let number = entry.next_number;
            entry.next_number = entry.next_number.wrapping_add(1);
            self.leases.insert(
                waiter.lease_id.clone(),
                LeaseRecord {
                    template: template.clone(),
                    fingerprint: fingerprint.clone(),
                    template_db: template_db.clone(),
                    database: database.clone(),
                    expires_at: now + waiter.ttl,
                    connections: waiter.connections,
                    bytes,
                    number,
                    reclaimable: waiter.reclaimable,
                    granted_at: now,
                },
            );
            actions.push(Action::Grant {
                waiter: waiter.id,
                grant: Grant {
                    lease_id: waiter.lease_id,
                    template: template.clone(),
                    fingerprint: fingerprint.clone(),
                    database,
                    ttl: waiter.ttl,
                    connections: waiter.connections,
                    number,
                },
            });
        }
    }

    /// Serves every template's waiters: a freed lease frees connections for all of them.
    fn serve_all_waiters(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let mut in_use = self.connections_in_use();
        let names: Vec<TemplateName> = self.templates.keys().cloned().collect();
        for name in names {
            self.serve_waiters_within(&name, now, &mut in_use, actions);
        }
    }

    /// Starts drops and clones up to the concurrency limit. Templates with waiters go first;
    /// then clones are spread one per template per round. Under a byte budget a clone that
    /// does not fit is made only for a waiting request, after evicting what nobody waits
    /// for; if it still does not fit, that template's waiters are told so.
    fn dispatch(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if self.server != Server::Up {
            return;
        }
        self.reclaim_for_waiters();
        self.dispatch_drops(actions);
        let limit = self.limits.clone_concurrency.max(1);
        let mut order: Vec<TemplateName> = self.templates.keys().cloned().collect();
        order.sort_by_key(|name| {
            self.templates
                .get(name)
                .map_or(0, |e| e.waiters.is_empty() as u8)
        });
        let (min_ready, max_total) = (self.limits.min_ready, self.limits.max_total);
        'rounds: loop {
            let mut started = false;
            for name in &order {
                if self.clones_running >= limit {
                    break 'rounds;
                }
                let Some(entry) = self.templates.get(name) else {
                    continue;
                };
                let Build::Ready {
                    db: template_db, ..
                } = &entry.build
                else {
                    continue;
                };
                if !entry.wanted || entry.clones_paused_until.is_some_and(|t| t > now) {
                    continue;
                }
                let have = entry.ready.len() + entry.creating;
                // Refill ahead of the rate clones are used up at, never below min_ready.
                let floor = min_ready.max(entry.demand.ahead(now));
                let want = floor + entry.waiters.len();
                let total = entry.ready.len() + entry.leased + entry.creating;
                if have >= want || total >= max_total {
                    continue;
                }
                let (template_db, size) = (template_db.clone(), entry.version_size());
                // Only a clone that will serve a waiting request may evict; keeping clones
                // warm (min_ready) never does.
                let for_a_waiter = entry.waiters.len() > have;
                if !self.fits(size) {
                    if !for_a_waiter {
                        continue;
                    }
                    self.make_room(name, size);
                    if !self.fits(size) {
                        self.fail_for_space(name, size, actions);
                        continue;
                    }
                }
                let Some(entry) = self.templates.get_mut(name) else {
                    continue;
                };
                let clone = DbName::clone_db(&self.instance, self.next_seq);
                self.next_seq += 1;
                self.clone_started.insert(clone.clone(), now);
                entry.creating += 1;
                self.clones_running += 1;
                started = true;
                actions.push(Action::Clone {
                    template: name.clone(),
                    template_db,
                    clone,
                });
            }
            if !started {
                break;
            }
        }
        self.dispatch_drops(actions);
    }

    fn dispatch_drops(&mut self, actions: &mut Vec<Action>) {
        let limit = self.limits.clone_concurrency.max(1);
        while self.drops_running < limit {
            let Some(db) = self.drop_queue.pop_front() else {
                break;
            };
            self.drops_running += 1;
            actions.push(Action::Drop { db });
        }
    }

    /// Bytes of template databases and clones this pool holds (a clone counts as large as
    /// its template; databases queued for dropping no longer count).
    fn bytes_in_use(&self) -> u64 {
        let templates: u64 = self
            .templates
            .values()
            .map(|e| {
                let template_dbs = match &e.build {
                    Build::Ready { .. }
                    | Build::Building { previous: Some(_) }
                    | Build::Opening { .. }
                    | Build::Open { .. }
                    | Build::Finalizing { .. } => 1,
                    Build::Idle
                    | Build::Building { previous: None }
                    | Build::Failed
                    | Build::Discarded => 0,
                };
                e.version_size() * (template_dbs + e.ready.len() as u64 + e.creating as u64)
            })
            .sum();
        templates + self.leases.values().map(|r| r.bytes).sum::<u64>()
    }

    fn fits(&self, more: u64) -> bool {
        self.limits
            .max_bytes
            .is_none_or(|budget| self.bytes_in_use() + more <= budget)
    }

    /// Frees room for `needed` more bytes for `template`: first ready clones of other
    /// templates nobody waits for, least recently leased template first; then whole
    /// versions of idle templates (never `default`, which `/readyz` reports on).
    fn make_room(&mut self, template: &TemplateName, needed: u64) {
        for name in self.eviction_order(template, false) {
            while !self.fits(needed) {
                let Some(db) = self
                    .templates
                    .get_mut(&name)
                    .and_then(|e| e.ready.pop_back())
                else {
                    break;
                };
                tracing::info!(template = %name, database = %db, "evicting a ready clone to make room");
                self.drop_queue.push_back(db);
            }
        }
        for name in self.eviction_order(template, true) {
            if self.fits(needed) {
                return;
            }
            let Some(entry) = self.templates.get_mut(&name) else {
                continue;
            };
            if let Build::Ready { db, .. } = std::mem::replace(&mut entry.build, Build::Idle) {
                tracing::info!(template = %name, database = %db, "evicting an idle template version to make room");
                entry.wanted = false;
                self.drop_queue.extend(entry.ready.drain(..));
                self.drop_queue.push_back(db);
            }
        }
    }

    /// Templates other than `template` that nobody waits for, least recently leased first;
    /// with `only_idle`, only built ones with nothing leased or being made, never `default`.
    fn eviction_order(&self, template: &TemplateName, only_idle: bool) -> Vec<TemplateName> {
        let mut names: Vec<(Option<Instant>, TemplateName)> = self
            .templates
            .iter()
            .filter(|(name, e)| *name != template && e.waiters.is_empty())
            .filter(|(name, e)| {
                !only_idle
                    || (**name != TemplateName::default_name()
                        // Nothing could rebuild a client's template.
                        && !e.source.is_client_built()
                        && matches!(e.build, Build::Ready { .. })
                        && e.leased == 0
                        && e.creating == 0)
            })
            .map(|(name, e)| (e.last_used, name.clone()))
            .collect();
        names.sort();
        names.into_iter().map(|(_, name)| name).collect()
    }

    /// Tells `template`'s waiters that their clone cannot fit in the byte budget.
    fn fail_for_space(&mut self, template: &TemplateName, needed: u64, actions: &mut Vec<Action>) {
        let (in_use, budget) = (
            self.bytes_in_use(),
            self.limits.max_bytes.unwrap_or(u64::MAX),
        );
        let Some(entry) = self.templates.get_mut(template) else {
            return;
        };
        for waiter in entry.waiters.drain(..) {
            actions.push(Action::Fail {
                waiter: waiter.id,
                error: LeaseError::OutOfSpace {
                    template: template.clone(),
                    needed,
                    in_use,
                    budget,
                },
            });
        }
    }
}

mod client;
mod demand;
pub(crate) use client::Finalize;

#[cfg(test)]
mod tests;
