//! The rules for templates that clients build (the IntegreSQL-compatible API): initialize
//! hands out an empty template database, finalize makes it a template, discard ends it;
//! their test databases are ordinary leases with a number, handed out by the same queue
//! as every other lease (`request_lease`, `serve_waiters`).

use tokio::time::Instant;

use super::dbs::Phase;
use super::expiry::Reclaim;
use super::lifecycle::{ClientBuild, Lifecycle, TemplateEntry, Version};
use super::{Action, Built, PoolState, Server};
use crate::error::{LeaseError, TemplateOpError};
use crate::names::{DbName, LeaseId, TemplateName};
use crate::sql_error::SqlError;

/// What `finalize` found.
#[derive(Debug)]
pub(crate) enum Finalize {
    /// Finalized already.
    Done,
    /// The actor must run this action and answer once it is reported.
    Start(Action),
    /// Another finalize of its database is running: answer with that one.
    Pending(DbName),
}

impl PoolState {
    fn check_server(&self) -> Result<(), TemplateOpError> {
        match &self.server {
            Server::Up => Ok(()),
            Server::Stopping => Err(TemplateOpError::ShuttingDown),
            Server::Down(reason) => Err(TemplateOpError::PostgresDown(reason.clone())),
        }
    }

    /// The client lifecycle of `template`, or why there is none.
    fn client_build(
        &mut self,
        template: &TemplateName,
    ) -> Result<&mut ClientBuild, TemplateOpError> {
        match self.templates.get_mut(template).map(|e| &mut e.lifecycle) {
            None => Err(TemplateOpError::UnknownTemplate(template.clone())),
            Some(Lifecycle::Configured(_)) => {
                Err(TemplateOpError::NotClientBuilt(template.clone()))
            }
            Some(Lifecycle::Client(build)) => Ok(build),
        }
    }

    /// A client wants to build `template` itself. Only the first gets it; everyone else
    /// is told it is initialized already (and asks for test databases, which wait). A
    /// discarded or failed one may be initialized again.
    /// Its role may hold a lease's connections until it is finalized: where the budget has
    /// no room for them, the longest-held IntegreSQL test databases nobody gave back are
    /// recreated first (as for a waiting request); only if that is not enough is it refused.
    /// Returns those recreations' actions, then the open.
    pub fn initialize(
        &mut self,
        template: &TemplateName,
        now: Instant,
    ) -> Result<Vec<Action>, TemplateOpError> {
        self.check_server()?;
        let old = self.templates.get(template);
        if let Some(entry) = old {
            if !matches!(
                entry.lifecycle,
                Lifecycle::Client(ClientBuild::Discarded | ClientBuild::Failed)
            ) {
                return Err(TemplateOpError::AlreadyInitialized(template.clone()));
            }
        }
        let (needed, in_use) = (self.limits.lease_connections, self.connections_in_use());
        if in_use.saturating_sub(self.reclaimable_connections()) + needed > self.connection_budget {
            return Err(TemplateOpError::TooManyConnections {
                needed,
                in_use,
                budget: self.connection_budget,
            });
        }
        let mut actions = Vec::new();
        while self.connections_in_use() + needed > self.connection_budget
            && self.reclaim_oldest(now, &mut actions)
        {}
        // A name of its own for every initialization: a discarded version's database may
        // still be waiting to be dropped (then IntegreSQL's name is not free, and this
        // initialization gets one of ours).
        let db = self
            .integresql_names
            .then(|| DbName::integresql_template(template))
            .flatten()
            .filter(|name| self.name_is_free(name))
            .unwrap_or_else(|| {
                DbName::template(
                    template,
                    &format!("{}{:010x}", self.instance, self.next_seq),
                )
            });
        self.next_seq += 1;
        let mut entry = TemplateEntry::client(ClientBuild::Opening { db: db.clone() });
        // A discarded one's leases may still be out (their records count against the
        // template's limits); their ids outlive the entry (`TestIds`), so they are not
        // handed out again.
        if let Some(old) = self.templates.remove(template) {
            // Nothing waits on a discarded or failed one; if anything did, it now waits
            // for this initialization.
            entry.waiters = old.waiters;
        }
        self.templates.insert(template.clone(), entry);
        actions.push(Action::OpenTemplate {
            template: template.clone(),
            db,
        });
        Ok(actions)
    }

    /// Connections the roles of client-built templates may hold: a lease's limit
    /// (`--lease-connections`, which their roles get) for each one being made, migrated
    /// by its client or finalized.
    pub(super) fn client_connections(&self) -> u32 {
        let open = self
            .templates
            .values()
            .filter(|entry| {
                matches!(
                    entry.lifecycle,
                    Lifecycle::Client(
                        ClientBuild::Opening { .. }
                            | ClientBuild::Open { .. }
                            | ClientBuild::Finalizing { .. }
                    )
                )
            })
            .count();
        u32::try_from(open)
            .unwrap_or(u32::MAX)
            .saturating_mul(self.limits.lease_connections)
    }

    /// The empty database `db` of a client-built template exists (or could not be made).
    /// If the template was discarded meanwhile, the database goes and the client is told.
    pub fn template_opened(
        &mut self,
        template: &TemplateName,
        db: DbName,
        outcome: Result<(), SqlError>,
        now: Instant,
    ) -> (Result<(), TemplateOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let opening = matches!(
            self.client_build(template),
            Ok(ClientBuild::Opening { db: d }) if *d == db
        );
        let result = match (opening, outcome) {
            (true, Ok(())) => {
                if let Ok(build) = self.client_build(template) {
                    *build = ClientBuild::Open { db, since: now };
                }
                Ok(())
            }
            (true, Err(error)) => {
                self.drop_after_failed_create(db, template, &error);
                // Free for the client (or another) to initialize again.
                if let Ok(build) = self.client_build(template) {
                    *build = ClientBuild::Failed;
                }
                let answer = TemplateOpError::of_sql(template, &error);
                self.build_failed(template, error.message, error.kind, &mut actions);
                self.forget_if_unused(template);
                Err(answer)
            }
            (false, _) => {
                // Whatever the job left of it.
                self.discarded_in_flight.remove(&db);
                self.dbs.queue_drop(db, template, 0);
                Err(TemplateOpError::Discarded(template.clone()))
            }
        };
        self.dispatch(now, &mut actions);
        (result, actions)
    }

    /// Forgets a failed or discarded client-built template nothing refers to any more (one
    /// whose test databases are still out stays: every record belongs to a template). Its
    /// test ids are not forgotten with it: a client may hold one whose database was
    /// reclaimed, and the next initialization must not hand that id to another database.
    fn forget_if_unused(&mut self, template: &TemplateName) {
        // Kept databases hold no place in the counts, but belong to the template too.
        let unused = self.dbs.counts(template).total() == 0
            && self
                .dbs
                .of(template, |p| matches!(p, Phase::Kept(_)))
                .is_empty();
        let ended = matches!(
            self.templates.get(template).map(|e| &e.lifecycle),
            Some(Lifecycle::Client(ClientBuild::Failed))
        );
        if unused && ended {
            self.templates.remove(template);
        }
    }

    /// The client is done migrating `template`.
    pub fn finalize(&mut self, template: &TemplateName) -> Result<Finalize, TemplateOpError> {
        self.check_server()?;
        let build = self.client_build(template)?;
        match build {
            ClientBuild::Ready(_) => Ok(Finalize::Done),
            ClientBuild::Finalizing { db } => Ok(Finalize::Pending(db.clone())),
            ClientBuild::Open { db, since } => {
                let action = Action::FinalizeTemplate {
                    template: template.clone(),
                    db: db.clone(),
                    since: *since,
                };
                *build = ClientBuild::Finalizing { db: db.clone() };
                Ok(Finalize::Start(action))
            }
            // Still being created (nobody has its credentials yet), failed or discarded.
            ClientBuild::Opening { .. } | ClientBuild::Failed | ClientBuild::Discarded => {
                Err(TemplateOpError::UnknownTemplate(template.clone()))
            }
        }
    }

    /// A finalize ended (or a template kept by an earlier run was restored): the template
    /// is ready (its waiters are served as clones come) or failed (they fail). If it was
    /// discarded meanwhile, its database goes.
    pub fn template_finalized(
        &mut self,
        template: &TemplateName,
        db: DbName,
        outcome: Result<Built, SqlError>,
        now: Instant,
    ) -> (Result<(), TemplateOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let finalizing = matches!(
            self.client_build(template),
            Ok(ClientBuild::Finalizing { db: d }) if *d == db
        );
        if !finalizing {
            self.discarded_in_flight.remove(&db);
            self.dbs.queue_drop(db, template, 0);
            self.dispatch(now, &mut actions);
            return (Err(TemplateOpError::Discarded(template.clone())), actions);
        }
        let result = match outcome {
            Ok(built) => {
                if let Ok(build) = self.client_build(template) {
                    *build = ClientBuild::Ready(Version {
                        fingerprint: built.fingerprint.clone(),
                        db: built.db.clone(),
                    });
                }
                self.version_ready(template, built, &mut actions);
                Ok(())
            }
            Err(error) => {
                // The half-made template is of no use to anyone.
                self.dbs.queue_drop(db, template, 0);
                if let Ok(build) = self.client_build(template) {
                    *build = ClientBuild::Failed;
                }
                for clone in self
                    .dbs
                    .of(template, |p| matches!(p, Phase::Adoptable { .. }))
                {
                    self.dbs.queue_drop(clone, template, 0);
                }
                let answer = TemplateOpError::of_sql(template, &error);
                self.build_failed(template, error.message, error.kind, &mut actions);
                Err(answer)
            }
        };
        self.dispatch(now, &mut actions);
        (result, actions)
    }

    /// A client discards `template`: waiting requests fail with "discarded", so do later
    /// ones until it is initialized again; its ready clones and its database go, leased
    /// clones when released.
    pub fn discard(
        &mut self,
        template: &TemplateName,
        now: Instant,
    ) -> Result<Vec<Action>, TemplateOpError> {
        self.check_server()?;
        let build = self.client_build(template)?;
        if matches!(build, ClientBuild::Discarded) {
            return Err(TemplateOpError::UnknownTemplate(template.clone()));
        }
        let mut actions = Vec::new();
        match std::mem::replace(build, ClientBuild::Discarded) {
            ClientBuild::Open { db, .. } | ClientBuild::Ready(Version { db, .. }) => {
                self.dbs.queue_drop(db, template, 0);
            }
            // A job holds it and finds the template discarded when it reports; until then
            // its name is not free for the next initialization.
            ClientBuild::Opening { db } | ClientBuild::Finalizing { db } => {
                self.discarded_in_flight.insert(db);
            }
            ClientBuild::Failed | ClientBuild::Discarded => {}
        }
        if let Some(entry) = self.templates.get_mut(template) {
            entry.wanted = false;
            for waiter in entry.waiters.drain(..) {
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::Discarded(template.clone()),
                });
            }
        }
        for db in self.dbs.of(template, |p| {
            matches!(p, Phase::Ready { .. } | Phase::Adoptable { .. })
        }) {
            self.dbs.queue_drop(db, template, 0);
        }
        tracing::info!(template = %template, "template discarded by its client");
        self.dispatch(now, &mut actions);
        Ok(actions)
    }

    /// Discards client-built templates whose client initialized them and did not finalize
    /// within `initialize_timeout` (it died, or forgot): nothing else would ever end them.
    pub(super) fn discard_abandoned(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let limit = self.limits.initialize_timeout;
        let abandoned: Vec<TemplateName> = self
            .templates
            .iter()
            .filter(|(_, e)| {
                e.migrating_since()
                    .is_some_and(|since| since + limit <= now)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in abandoned {
            tracing::warn!(template = %name, after_secs = limit.as_secs(), "no finalize came for a client-built template; discarding it as abandoned");
            self.abandoned += 1;
            if let Ok(more) = self.discard(&name, now) {
                actions.extend(more);
            }
        }
    }

    /// Forgets every client-built template: their databases go (kept ones too), their open
    /// leases end (later calls on them answer "lost"), their waiting requests fail.
    pub fn discard_all_client_built(
        &mut self,
        now: Instant,
    ) -> Result<Vec<Action>, TemplateOpError> {
        self.check_server()?;
        let names: Vec<TemplateName> = self
            .templates
            .iter()
            .filter(|(_, e)| e.is_client_built())
            .map(|(name, _)| name.clone())
            .collect();
        let mut actions = Vec::new();
        for name in &names {
            if let Ok(more) = self.discard(name, now) {
                actions.extend(more);
            }
            self.templates.remove(name);
            for database in self.dbs.of(name, |p| matches!(p, Phase::Leased(_))) {
                self.end_lease(
                    database,
                    || LeaseError::Discarded(name.clone()),
                    &mut actions,
                );
            }
            // Kept ones go too ("every test database dropped"): nothing may outlive its
            // template but a drop.
            for database in self.dbs.of(name, |p| matches!(p, Phase::Kept(_))) {
                self.dbs.queue_drop(database, name, 0);
            }
        }
        self.dispatch(now, &mut actions);
        Ok(actions)
    }

    /// The open test database numbered `number` of `template`, and its database. Only
    /// leases granted through the IntegreSQL API (`reclaimable`) are found: that API's port
    /// needs no token, and must not reach a lease granted through the native API.
    pub fn lease_by_number(
        &self,
        template: &TemplateName,
        number: u32,
    ) -> Result<(LeaseId, DbName), TemplateOpError> {
        self.check_server()?;
        if !self.templates.contains_key(template) {
            return Err(TemplateOpError::UnknownTemplate(template.clone()));
        }
        self.dbs
            .leases()
            .find(|(_, db, r)| {
                r.reclaimable
                    && r.pending.is_none()
                    && db.template == *template
                    && r.number == number
            })
            .map(|(name, _, r)| (r.id.clone(), name.clone()))
            .ok_or(TemplateOpError::UnknownTest {
                template: template.clone(),
                number,
            })
    }

    /// A client-built template found complete on the server at start: it is added as
    /// being finalized, so that ready clones can be adopted for it, then reported with
    /// [`PoolState::template_finalized`]. False when a template of that name exists
    /// already (a configured one now has it): then its database `db` belongs to nobody and
    /// is queued for dropping.
    pub fn restore_client_built(&mut self, template: &TemplateName, db: &DbName) -> bool {
        if self.templates.contains_key(template) {
            self.dbs.queue_drop(db.clone(), template, 0);
            return false;
        }
        let mut entry = TemplateEntry::client(ClientBuild::Finalizing { db: db.clone() });
        entry.wanted = false;
        self.templates.insert(template.clone(), entry);
        true
    }

    /// Ends the oldest reclaimable lease of every template whose waiters cannot get a
    /// clone because the template is at `max_total` (IntegreSQL's clients never give
    /// test databases back; its server recreates the longest-held one when full).
    pub(super) fn reclaim_for_waiters(&mut self, actions: &mut Vec<Action>) {
        let max_total = self.limits.max_total;
        let counts = self.dbs.all_counts();
        let full: Vec<TemplateName> = self
            .templates
            .iter()
            .filter(|(name, e)| {
                let count = counts.get(*name).copied().unwrap_or_default();
                // Only IntegreSQL test databases are reclaimable, and only client-built
                // templates have them: a full configured template scans no leases.
                e.is_client_built()
                    && e.current().is_some()
                    && e.waiters.len() > count.ready + count.making
                    && count.total() >= max_total
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in full {
            let Some(Reclaim {
                database,
                id,
                seen_idle,
                ..
            }) = self.reclaim_candidate(Some(&name))
            else {
                continue;
            };
            tracing::info!(template = %name, lease_id = %id, database = %database, seen_idle, "template full: recreating its longest-held test database, one without a session at the last look if there is one");
            // Only handed-over leases are reclaimed: no request to fail.
            self.end_lease(database, || LeaseError::Discarded(name.clone()), actions);
        }
    }
}
