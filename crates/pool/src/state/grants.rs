//! Requests and grants: a request is granted from its template's ready queue (first come,
//! first served, while its connections fit the server's budget) or parked; a grant whose
//! lease asked for its own connection limit is held back until that limit is set; a grant
//! whose reply could not be delivered goes back. How a lease ends is `release.rs` (release,
//! renewal, a lease ended at once) and `expiry.rs` (expiry, timed-out requests, reclaiming).

use tokio::time::Instant;

use super::dbs::{Db, LeaseRecord, Phase};
use super::lifecycle::{Build, ClientBuild, Lifecycle, Waiter};
use super::{Action, Grant, PoolState, Server, WaiterId};
use crate::error::LeaseError;
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
        let Some(fingerprint) = self.servable_version(template) else {
            return;
        };
        while let Some((waiter, database)) = self.next_pair(template, *in_use, now) {
            *in_use += waiter.connections;
            self.hand_out(template, &fingerprint, database, waiter, now, actions);
        }
    }

    /// The fingerprint of the version of `template` that waiters may be given, if any.
    fn servable_version(&self, template: &TemplateName) -> Option<String> {
        let entry = self.templates.get(template)?;
        // Its sources may have changed: nobody gets a clone of a version about to be replaced.
        if entry.checking_sources {
            return None;
        }
        entry.current().map(|v| v.fingerprint.clone())
    }

    /// The first waiter of `template` and the ready clone it gets, taken off their queues,
    /// when there is a clone and its connections fit beside the `in_use` ones.
    fn next_pair(
        &mut self,
        template: &TemplateName,
        in_use: u32,
        now: Instant,
    ) -> Option<(Waiter, DbName)> {
        let entry = self.templates.get_mut(template)?;
        let first = entry.waiters.front()?;
        // The first in line waits for connections to free up; nobody overtakes it.
        if in_use + first.connections > self.connection_budget {
            return None;
        }
        let database = self.dbs.ready_front(template)?;
        let waiter = entry.waiters.pop_front()?;
        entry.last_used = Some(now);
        entry.demand.taken(now);
        Some((waiter, database))
    }

    /// Leases `database` to `waiter`: the grant goes out, or, for a lease of its own
    /// connection limit, the limit is set first (the grant waits in the lease's record).
    fn hand_out(
        &mut self,
        template: &TemplateName,
        fingerprint: &str,
        database: DbName,
        waiter: Waiter,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let password = self.dbs.password(&database);
        let number = self.lease_number(template, &database, waiter.reclaimable);
        // A lease of its own connection limit goes out once the limit is set.
        let custom_limit = waiter.connections != self.limits.lease_connections;
        let grant = Grant {
            lease_id: waiter.lease_id.clone(),
            template: template.clone(),
            fingerprint: fingerprint.to_owned(),
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
                fingerprint: fingerprint.to_owned(),
                expires_at: now + waiter.ttl,
                connections: waiter.connections,
                number,
                reclaimable: waiter.reclaimable,
                label: waiter.label.clone(),
                granted_at: now,
                pending: custom_limit.then_some(waiter),
                seen_idle: false,
            }));
        }
    }

    /// The number a lease of `database` gets. An IntegreSQL test database given back
    /// unchanged keeps its id for the next IntegreSQL client; another one gets a vacant id
    /// (or a fresh one), a native lease a fresh number, and the id it found on the database
    /// is vacant.
    fn lease_number(
        &mut self,
        template: &TemplateName,
        database: &DbName,
        reclaimable: bool,
    ) -> u32 {
        let carried = self.dbs.get(database).and_then(|db| db.test_id);
        match (carried, reclaimable) {
            (Some(id), true) => id,
            (None, true) => self.dbs.test_ids.take(template),
            (carried, false) => {
                if let Some(id) = carried {
                    self.dbs.test_ids.vacate(template, id);
                }
                self.dbs.test_ids.fresh(template)
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
        let Some((database, template, waiter)) = self.take_held_back(lease_id) else {
            return actions;
        };
        match outcome {
            Ok(()) if !self.may_still_grant(&database, &template) => {
                self.dbs.queue_drop(database, &template, 0);
                self.wait_again(&template, waiter, &mut actions);
                self.serve_all_waiters(now, &mut actions);
                self.dispatch(now, &mut actions);
            }
            Ok(()) => self.grant_held_back(&database, &template, waiter, now, &mut actions),
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

    /// The request held back while its lease's connection limit is set, taken out of the
    /// lease's record, with the database and its template.
    fn take_held_back(&mut self, lease_id: &LeaseId) -> Option<(DbName, TemplateName, Waiter)> {
        let database = self.dbs.leased_db(lease_id)?;
        let db = self.dbs.get_mut(&database)?;
        let Phase::Leased(record) = &mut db.phase else {
            return None;
        };
        let waiter = record.pending.take()?;
        let template = db.template.clone();
        Some((database, template, waiter))
    }

    /// Whether a held-back grant of `database` may still go out: it is of its template's
    /// current version, and no look at the template's sources began meanwhile (the version
    /// may be replaced, so the request waits for the look like the others).
    fn may_still_grant(&self, database: &DbName, template: &TemplateName) -> bool {
        let made_from = self.dbs.get(database).and_then(|db| db.made_from.as_ref());
        let entry = self.templates.get(template);
        let current = entry
            .and_then(|e| e.current())
            .is_some_and(|v| Some(&v.db) == made_from);
        let checking = entry.is_some_and(|e| e.checking_sources);
        current && !checking
    }

    /// A held-back request whose database went waits again, first in line, or fails when
    /// its template can no longer be waited for.
    fn wait_again(&mut self, template: &TemplateName, waiter: Waiter, actions: &mut Vec<Action>) {
        match self.may_wait_for(template) {
            Ok(()) => {
                if let Some(entry) = self.templates.get_mut(template) {
                    entry.waiters.push_front(waiter);
                }
            }
            Err(error) => actions.push(Action::Fail {
                waiter: waiter.id,
                error,
            }),
        }
    }

    /// Sends the grant held back while its lease's connection limit was set.
    fn grant_held_back(
        &mut self,
        database: &DbName,
        template: &TemplateName,
        waiter: Waiter,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let Some(db) = self.dbs.get_mut(database) else {
            return;
        };
        let Phase::Leased(record) = &mut db.phase else {
            return;
        };
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
