//! Requests, grants and their end: a request is granted from its template's ready queue
//! (first come, first served, while its connections fit the server's budget) or parked;
//! a grant whose lease asked for its own connection limit is held back until that limit
//! is set; a lease ends by release (dropped, or recycled with `reuse`), by expiry, or with
//! its server.

use std::time::Duration;

use tokio::time::Instant;

use super::dbs::{Db, LeaseRecord, Phase};
use super::lifecycle::{Build, ClientBuild, Lifecycle, Waiter};
use super::{Action, Grant, PoolState, Server, WaiterId};
use crate::error::{Blocked, LeaseError, LeaseOpError};
use crate::names::{DbName, LeaseId, TemplateName};
use crate::sql_error::{SqlError, SqlErrorKind};
use crate::types::LeaseRequest;

impl PoolState {
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
        if let Err(error) = self.admit(request) {
            match &error {
                LeaseError::TooManyWaiting { .. } => self.refused.max_waiting += 1,
                LeaseError::TooManyConnections { .. } => self.refused.connection_budget += 1,
                _ => {}
            }
            actions.push(Action::Fail { waiter, error });
            return actions;
        }
        let ttl = request
            .ttl
            .unwrap_or(self.limits.default_ttl)
            .min(self.limits.max_ttl);
        let connections = request.connections.unwrap_or(self.limits.lease_connections);
        let Some(entry) = self.templates.get_mut(&request.template) else {
            return actions;
        };
        entry.wanted = true;
        if let Lifecycle::Configured(configured) = &mut entry.lifecycle {
            if matches!(configured.build, Build::Idle | Build::Failed) {
                // A failed build is retried by the next request: the sources may have been
                // fixed.
                actions.push(configured.start_build(
                    &request.template,
                    None,
                    self.verify_templates,
                ));
            }
        }
        entry.waiters.push_back(Waiter {
            id: waiter,
            lease_id,
            ttl,
            connections,
            reclaimable: request.reclaimable,
            label: request.label.clone(),
            enqueued: now,
            deadline: now + request.wait,
        });
        let template = request.template.clone();
        self.serve_waiters(&template, now, &mut actions);
        self.dispatch(now, &mut actions);
        actions
    }

    /// Why a request cannot even wait, if it cannot.
    fn admit(&self, request: &LeaseRequest) -> Result<(), LeaseError> {
        match &self.server {
            Server::Up => {}
            Server::Stopping => return Err(LeaseError::ShuttingDown),
            Server::Down(reason) => return Err(LeaseError::PostgresDown(reason.clone())),
        }
        let waiting: usize = self.templates.values().map(|e| e.waiters.len()).sum();
        if waiting >= self.limits.max_waiting {
            return Err(LeaseError::TooManyWaiting { waiting });
        }
        let connections = request.connections.unwrap_or(self.limits.lease_connections);
        if connections > self.connection_budget {
            return Err(LeaseError::TooManyConnections {
                requested: connections,
                budget: self.connection_budget,
            });
        }
        let template = &request.template;
        match self.templates.get(template).map(|e| &e.lifecycle) {
            // The IntegreSQL API (whose port needs no token) serves the templates its
            // clients build, not the configured ones the native API guards.
            Some(Lifecycle::Configured(_)) if request.reclaimable => {
                Err(LeaseError::unknown_template(template.clone()))
            }
            _ => self.may_wait_for(template),
        }
    }

    /// Whether a request may wait for a clone of `template`: a configured one is built (or
    /// rebuilt) for it; a client's waits for its finalize, unless it was discarded or failed.
    fn may_wait_for(&self, template: &TemplateName) -> Result<(), LeaseError> {
        let entry = self
            .templates
            .get(template)
            .ok_or_else(|| self.unknown_template(template.clone()))?;
        match &entry.lifecycle {
            Lifecycle::Configured(_) => Ok(()),
            // Nothing to build: requests wait for the client to finalize, or fail.
            Lifecycle::Client(ClientBuild::Discarded) => {
                Err(LeaseError::Discarded(template.clone()))
            }
            Lifecycle::Client(ClientBuild::Failed) => Err(LeaseError::BuildFailed {
                template: template.clone(),
                message: entry
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "the client did not finalize it".into()),
                cause: SqlErrorKind::Other,
            }),
            Lifecycle::Client(_) => Ok(()),
        }
    }

    /// A parked request's caller went away: forget it, so it does not hold up others or
    /// make the pool grow for nobody.
    pub fn cancel_waiter(&mut self, waiter: WaiterId) {
        for entry in self.templates.values_mut() {
            entry.waiters.retain(|w| w.id != waiter);
        }
    }

    /// Pairs ready clones with waiters of one template, first come first served.
    pub(super) fn serve_waiters(
        &mut self,
        template: &TemplateName,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let mut in_use = self.connections_in_use();
        self.serve_waiters_within(template, now, &mut in_use, actions);
    }

    /// Serves every template's waiters: a freed lease frees connections for all of them.
    pub(super) fn serve_all_waiters(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let mut in_use = self.connections_in_use();
        let names: Vec<TemplateName> = self.templates.keys().cloned().collect();
        for name in names {
            self.serve_waiters_within(&name, now, &mut in_use, actions);
        }
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
        // Its sources may have changed: nobody gets a clone of a version about to be replaced.
        if entry.checking_sources {
            return;
        }
        let Some(fingerprint) = entry.current().map(|v| v.fingerprint.clone()) else {
            return;
        };
        while let Some(first) = entry.waiters.front() {
            // The first in line waits for connections to free up; nobody overtakes it.
            if *in_use + first.connections > self.connection_budget {
                break;
            }
            let Some(database) = self.dbs.ready_front(template) else {
                break;
            };
            let Some(waiter) = entry.waiters.pop_front() else {
                break;
            };
            *in_use += waiter.connections;
            entry.last_used = Some(now);
            entry.demand.taken(now);
            // An IntegreSQL test database given back unchanged keeps its id for the next
            // IntegreSQL client; another one gets a vacant id (or a fresh one), a native
            // lease a fresh number, and the id it found on the database is vacant.
            let carried = self.dbs.get(&database).and_then(|db| db.test_id);
            let password = self.dbs.password(&database);
            let number = match (carried, waiter.reclaimable) {
                (Some(id), true) => id,
                (None, true) => self.dbs.test_ids.take(template),
                (carried, false) => {
                    if let Some(id) = carried {
                        self.dbs.test_ids.vacate(template, id);
                    }
                    self.dbs.test_ids.fresh(template)
                }
            };
            // A lease of its own connection limit goes out once the limit is set.
            let custom_limit = waiter.connections != self.limits.lease_connections;
            let grant = Grant {
                lease_id: waiter.lease_id.clone(),
                template: template.clone(),
                fingerprint: fingerprint.clone(),
                database: database.clone(),
                ttl: waiter.ttl,
                connections: waiter.connections,
                number,
                label: waiter.label.clone(),
                password,
            };
            if custom_limit {
                actions.push(Action::SetLimit {
                    lease_id: grant.lease_id,
                    database: database.clone(),
                    connections: grant.connections,
                });
            } else {
                actions.push(Action::Grant {
                    waiter: waiter.id,
                    grant,
                });
            }
            if let Some(db) = self.dbs.get_mut(&database) {
                db.test_id = waiter.reclaimable.then_some(number);
                db.phase = Phase::Leased(Box::new(LeaseRecord {
                    id: waiter.lease_id.clone(),
                    fingerprint: fingerprint.clone(),
                    expires_at: now + waiter.ttl,
                    connections: waiter.connections,
                    number,
                    reclaimable: waiter.reclaimable,
                    label: waiter.label.clone(),
                    granted_at: now,
                    pending: custom_limit.then_some(waiter),
                }));
            }
        }
    }

    /// A lease's own connection limit was set (or could not be): the grant goes out, or its
    /// request fails and the database, whose role may have been changed, is dropped. If its
    /// template got a new version meanwhile, the database is dropped and the request waits
    /// again, first in line: no grant of an old version goes out.
    pub fn limit_set(
        &mut self,
        lease_id: &LeaseId,
        outcome: Result<(), SqlError>,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(database) = self.dbs.leased_db(lease_id) else {
            return actions;
        };
        let Some(db) = self.dbs.get_mut(&database) else {
            return actions;
        };
        let Phase::Leased(record) = &mut db.phase else {
            return actions;
        };
        let Some(waiter) = record.pending.take() else {
            return actions;
        };
        let template = db.template.clone();
        let current = self
            .templates
            .get(&template)
            .and_then(|e| e.current())
            .is_some_and(|v| Some(&v.db) == db.made_from.as_ref());
        // A look at the template's sources began meanwhile: the version may be replaced,
        // so the request waits for the look like the others (first in line).
        let checking = self
            .templates
            .get(&template)
            .is_some_and(|e| e.checking_sources);
        match outcome {
            Ok(()) if !current || checking => {
                self.dbs.queue_drop(database, &template, 0);
                match self.may_wait_for(&template) {
                    Ok(()) => {
                        if let Some(entry) = self.templates.get_mut(&template) {
                            entry.waiters.push_front(waiter);
                        }
                    }
                    Err(error) => actions.push(Action::Fail {
                        waiter: waiter.id,
                        error,
                    }),
                }
                self.serve_all_waiters(now, &mut actions);
                self.dispatch(now, &mut actions);
            }
            Ok(()) => {
                // Its time to live starts when it is handed over, not when it was set aside.
                record.expires_at = now + waiter.ttl;
                let grant = Grant {
                    lease_id: record.id.clone(),
                    template: template.clone(),
                    fingerprint: record.fingerprint.clone(),
                    database: database.clone(),
                    ttl: waiter.ttl,
                    connections: record.connections,
                    number: record.number,
                    label: record.label.clone(),
                    password: db
                        .made
                        .as_ref()
                        .map(|m| m.password.clone())
                        .unwrap_or_default(),
                };
                actions.push(Action::Grant {
                    waiter: waiter.id,
                    grant,
                });
            }
            // A full disk is still a full disk (507), a lost connection a server away (503).
            Err(error) => {
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::CloneFailed {
                        template: template.clone(),
                        message: error.message,
                        cause: error.kind,
                    },
                });
                self.dbs.queue_drop(database, &template, 0);
                self.serve_all_waiters(now, &mut actions);
                self.dispatch(now, &mut actions);
            }
        }
        actions
    }

    /// The reply carrying a grant could not be delivered (the client went away). The
    /// database was never seen by anyone: it goes back to the front of the ready queue if
    /// it is of the current version and its role has the default connection limit;
    /// otherwise it is dropped.
    pub fn grant_undelivered(&mut self, lease_id: &LeaseId, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some((database, db, record)) = self.dbs.lease(lease_id) else {
            return actions;
        };
        let database = database.clone();
        let template = db.template.clone();
        let pristine = record.connections == self.limits.lease_connections;
        let current = self
            .templates
            .get(&template)
            .and_then(|e| e.current())
            .is_some_and(|v| Some(&v.db) == db.made_from.as_ref());
        if pristine && current {
            let phase = self.dbs.ready_at_front();
            if let Some(db) = self.dbs.get_mut(&database) {
                db.phase = phase;
            }
            if let Some(entry) = self.templates.get_mut(&template) {
                entry.demand.returned(now);
            }
        } else {
            self.dbs.queue_drop(database, &template, 0);
        }
        self.serve_all_waiters(now, &mut actions);
        self.dispatch(now, &mut actions);
        actions
    }

    /// A caller is done with a lease. With `reuse` the caller vouches the database is
    /// unchanged: it is recycled (its holder locked out) and goes back to the ready queue,
    /// if its version is still current; otherwise it is dropped and replaced.
    pub fn release(
        &mut self,
        id: &LeaseId,
        reuse: bool,
        now: Instant,
    ) -> (Result<(), LeaseOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let Some((database, db, record)) = self.dbs.lease(id) else {
            return (Err(self.missing_lease(id)), actions);
        };
        if record.pending.is_some() {
            // Not handed over yet: nobody can hold its id.
            return (Err(self.missing_lease(id)), actions);
        }
        let database = database.clone();
        let template = db.template.clone();
        let made_from = db.made_from.clone();
        let entry = self.templates.get_mut(&template);
        // The very version it was cloned from (a client-built template initialized again
        // has the same fingerprint, but another database).
        let current = entry
            .as_ref()
            .and_then(|e| e.current())
            .filter(|v| v.fingerprint == record.fingerprint && Some(&v.db) == made_from.as_ref())
            .map(|v| v.db.clone());
        // Released without `reuse`: the server may still prove it unchanged (never an
        // IntegreSQL test database, whose client says itself what it did).
        let verify = !reuse && self.limits.reuse_unchanged && !record.reclaimable;
        match (reuse || verify, current) {
            (true, Some(template_db)) => {
                if let Some(entry) = entry {
                    entry.demand.returned(now);
                }
                // Back in the ready queue only once the old holder is locked out; until
                // then it is being made. An IntegreSQL test database keeps its id (and goes
                // to the front of the queue: it is the next one handed out, caches warm).
                let test_id = record.reclaimable.then_some(record.number);
                // Its holder's password goes; what it was when made ready is the proof.
                let proof = self.dbs.get_mut(&database).and_then(|db| {
                    db.test_id = test_id;
                    db.phase = Phase::Making { started: None };
                    db.made.take().and_then(|made| made.stamp)
                });
                actions.push(Action::Recycle {
                    template,
                    template_db,
                    clone: database,
                    verify,
                    proof: proof.filter(|_| verify),
                });
            }
            _ => {
                // Given back by its client (recreate, or an unlock of a replaced version):
                // nobody holds its id, which goes to the next getter, as IntegreSQL
                // recreates a test database under the same id.
                if record.reclaimable {
                    self.dbs.give_back_id(&database);
                }
                self.dbs.queue_drop(database, &template, 0);
            }
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
        let Some(database) = self.dbs.leased_db(id) else {
            return Err(self.missing_lease(id));
        };
        match self.dbs.get_mut(&database).map(|db| &mut db.phase) {
            Some(Phase::Leased(record)) if record.pending.is_none() => {
                record.expires_at = now + ttl;
                Ok(ttl)
            }
            _ => Err(self.missing_lease(id)),
        }
    }

    /// Time passes: expire leases, time out waiters, resume paused clones, retry failed
    /// drops.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let expired: Vec<(DbName, TemplateName, LeaseId)> = self
            .dbs
            .leases()
            .filter(|(_, _, record)| record.expires_at <= now && record.pending.is_none())
            .map(|(name, db, record)| (name.clone(), db.template.clone(), record.id.clone()))
            .collect();
        for (database, template, id) in expired {
            tracing::info!(lease_id = %id, database = %database, "lease expired; dropping its database");
            self.expired += 1;
            self.dbs.queue_drop(database, &template, 0);
        }
        self.drop_expired_kept(now);
        self.dbs.retry_failed_drops(now);
        self.discard_abandoned(now, &mut actions);
        self.serve_all_waiters(now, &mut actions);
        let counts = self.dbs.all_counts();
        let in_use = self.connections_in_use();
        let names: Vec<TemplateName> = self.templates.keys().cloned().collect();
        for name in names {
            let count = counts.get(&name).copied().unwrap_or_default();
            let Some(blocked_by) = self.blocked_by(&name, in_use, count) else {
                continue;
            };
            let Some(entry) = self.templates.get_mut(&name) else {
                continue;
            };
            let (timed_out, waiting): (Vec<Waiter>, Vec<Waiter>) =
                entry.waiters.drain(..).partition(|w| w.deadline <= now);
            entry.waiters = waiting.into();
            for waiter in timed_out {
                let waited_ms = now.duration_since(waiter.enqueued).as_millis() as u64;
                tracing::warn!(template = %name, waited_ms, blocked_by = blocked_by.name(), "a lease request timed out: {blocked_by}");
                match blocked_by {
                    Blocked::ConnectionBudget { .. } => self.refused.connection_budget += 1,
                    Blocked::MaxTotal { .. } => self.refused.max_total += 1,
                    Blocked::Making => self.refused.making += 1,
                }
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::TimedOut {
                        template: name.clone(),
                        waited_ms,
                        blocked_by: blocked_by.clone(),
                    },
                });
            }
        }
        for entry in self.templates.values_mut() {
            if entry.clones_paused_until.is_some_and(|t| t <= now) {
                entry.clones_paused_until = None;
            }
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// What keeps `template`'s first waiting request from a database, if one waits: the
    /// connection budget, the template's `max_total`, or clones still being made.
    pub(super) fn blocked_by(
        &self,
        template: &TemplateName,
        in_use: u32,
        counts: super::dbs::Counts,
    ) -> Option<Blocked> {
        let first = self.templates.get(template)?.waiters.front()?;
        Some(if in_use + first.connections > self.connection_budget {
            Blocked::ConnectionBudget {
                requested: first.connections,
                in_use,
                budget: self.connection_budget,
                leases: self.dbs.leases().count(),
            }
        } else if counts.total() >= self.limits.max_total {
            Blocked::MaxTotal {
                leased: counts.leased,
                max_total: self.limits.max_total,
            }
        } else {
            Blocked::Making
        })
    }

    /// Ends the oldest reclaimable leases — IntegreSQL test databases, which their clients
    /// never give back — of any template, while a waiting request is kept from its ready
    /// clone by the connection budget alone (IntegreSQL's clients expect their server to
    /// recycle test databases when it is full).
    pub(super) fn reclaim_for_connections(&mut self, now: Instant, actions: &mut Vec<Action>) {
        loop {
            let in_use = self.connections_in_use();
            let blocked = self.templates.iter().any(|(name, entry)| {
                entry
                    .waiters
                    .front()
                    .is_some_and(|w| in_use + w.connections > self.connection_budget)
                    && self.dbs.ready_front(name).is_some()
            });
            if !blocked || !self.reclaim_oldest(now, actions) {
                return;
            }
        }
    }

    /// Connections the leases [`PoolState::reclaim_oldest`] may take back hold.
    pub(super) fn reclaimable_connections(&self) -> u32 {
        self.dbs
            .leases()
            .filter(|(_, _, r)| r.reclaimable && r.pending.is_none())
            .map(|(_, _, r)| r.connections)
            .sum()
    }

    /// Ends the longest-held IntegreSQL test database nobody gave back (its client never
    /// does), for the connections it holds; false when there is none.
    pub(super) fn reclaim_oldest(&mut self, now: Instant, actions: &mut Vec<Action>) -> bool {
        let oldest = self
            .dbs
            .leases()
            .filter(|(_, _, r)| r.reclaimable && r.pending.is_none())
            .min_by_key(|(_, _, r)| r.granted_at)
            .map(|(database, db, r)| (database.clone(), db.template.clone(), r.id.clone()));
        let Some((database, template, id)) = oldest else {
            return false;
        };
        tracing::info!(template = %template, lease_id = %id, database = %database, "connection budget full: recreating the longest-held IntegreSQL test database");
        self.reclaimed += 1;
        self.end_lease(database, || LeaseError::Discarded(template), actions);
        self.serve_all_waiters(now, actions);
        true
    }

    /// The earliest instant at which [`PoolState::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let leases = self
            .dbs
            .leases()
            .filter(|(_, _, r)| r.pending.is_none())
            .map(|(_, _, r)| r.expires_at);
        let abandon_after = self.limits.initialize_timeout;
        let templates = self.templates.values().flat_map(|e| {
            e.waiters
                .iter()
                .map(|w| w.deadline)
                .chain(e.clones_paused_until)
                .chain(e.migrating_since().map(|since| since + abandon_after))
        });
        leases
            .chain(templates)
            .chain(self.dbs.next_drop_retry())
            .chain(self.next_kept_expiry())
            .min()
    }

    pub(super) fn missing_lease(&self, id: &LeaseId) -> LeaseOpError {
        if self.lost.contains(id) {
            LeaseOpError::Lost(id.to_string())
        } else if self.server == Server::Stopping {
            LeaseOpError::ShuttingDown
        } else {
            LeaseOpError::NotFound(id.to_string())
        }
    }

    /// Ends a lease at once (its database is dropped); later calls on its id answer "lost".
    /// A grant not handed over yet fails its request with `error`.
    pub(super) fn end_lease(
        &mut self,
        database: DbName,
        error: impl FnOnce() -> LeaseError,
        actions: &mut Vec<Action>,
    ) {
        let Some(db) = self.dbs.get_mut(&database) else {
            return;
        };
        let Phase::Leased(record) = &mut db.phase else {
            return;
        };
        let (id, pending, template) = (
            record.id.clone(),
            record.pending.take(),
            db.template.clone(),
        );
        if let Some(waiter) = pending {
            actions.push(Action::Fail {
                waiter: waiter.id,
                error: error(),
            });
        }
        self.dbs.queue_drop(database, &template, 0);
        self.remember_lost(id);
    }
}

/// A new clone's record.
pub(super) fn new_clone(
    template: &TemplateName,
    made_from: &DbName,
    bytes: u64,
    now: Instant,
) -> Db {
    Db {
        template: template.clone(),
        made_from: Some(made_from.clone()),
        bytes,
        test_id: None,
        made: None,
        phase: Phase::Making { started: Some(now) },
    }
}
