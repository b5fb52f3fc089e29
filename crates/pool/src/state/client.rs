//! The rules for templates that clients build (the IntegreSQL-compatible API): initialize
//! hands out an empty template database, finalize makes it a template, discard ends it;
//! their test databases are ordinary leases with a number, handed out by the same queue
//! as every other lease (`request_lease`, `serve_waiters`).

use tokio::time::Instant;

use super::{Action, Build, Built, PoolState, Server, TemplateEntry};
use crate::config::TemplateSource;
use crate::error::{LeaseError, TemplateOpError};
use crate::names::{DbName, LeaseId, TemplateName};

/// What `finalize` found.
#[derive(Debug)]
pub(crate) enum Finalize {
    /// Finalized already (or a configured template, which is always final once built).
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

    /// A client wants to build `template` itself. Only the first gets it; everyone else
    /// is told it is initialized already (and asks for test databases, which wait).
    pub fn initialize(&mut self, template: &TemplateName) -> Result<Action, TemplateOpError> {
        self.check_server()?;
        if let Some(entry) = self.templates.get(template) {
            if !matches!(entry.build, Build::Discarded) {
                return Err(TemplateOpError::AlreadyInitialized(template.clone()));
            }
        }
        // A name of its own for every initialization: a discarded version's database may
        // still be waiting in the drop queue.
        let db = DbName::template(
            template,
            &format!("{}{:010x}", self.instance, self.next_seq),
        );
        self.next_seq += 1;
        let mut entry = TemplateEntry::new(TemplateSource::Client, true);
        entry.build = Build::Opening { db: db.clone() };
        // A discarded one's leases and clones may still be out; their numbers are not
        // handed out again, and they still count against the template's limits.
        if let Some(old) = self.templates.get(template) {
            entry.next_number = old.next_number;
            entry.leased = old.leased;
            entry.creating = old.creating;
        }
        self.templates.insert(template.clone(), entry);
        Ok(Action::OpenTemplate {
            template: template.clone(),
            db,
        })
    }

    /// The empty database `db` of a client-built template exists (or could not be made).
    /// If the template was discarded meanwhile, the database goes and the client is told.
    pub fn template_opened(
        &mut self,
        template: &TemplateName,
        db: DbName,
        outcome: Result<(), String>,
        now: Instant,
    ) -> (Result<(), TemplateOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let opening = self
            .templates
            .get(template)
            .is_some_and(|e| matches!(&e.build, Build::Opening { db: d } if *d == db));
        let result = match (opening, outcome) {
            (true, Ok(())) => {
                if let Some(entry) = self.templates.get_mut(template) {
                    entry.build = Build::Open { db, since: now };
                }
                Ok(())
            }
            (true, Err(message)) => {
                self.drop_queue.push_back(db);
                // Free for the client (or another) to initialize again. While leases or
                // clones of an earlier version are out it stays, discarded, so that their
                // numbers are not handed out twice; otherwise it goes.
                let waiters = match self.templates.get_mut(template) {
                    Some(entry) if entry.leased > 0 || entry.creating > 0 => {
                        entry.build = Build::Discarded;
                        std::mem::take(&mut entry.waiters)
                    }
                    Some(_) => self
                        .templates
                        .remove(template)
                        .map(|entry| entry.waiters)
                        .unwrap_or_default(),
                    None => Default::default(),
                };
                for waiter in waiters {
                    actions.push(Action::Fail {
                        waiter: waiter.id,
                        error: LeaseError::BuildFailed {
                            template: template.clone(),
                            message: message.clone(),
                        },
                    });
                }
                Err(TemplateOpError::Failed {
                    template: template.clone(),
                    message,
                })
            }
            (false, _) => {
                // Whatever the job left of it.
                self.drop_queue.push_back(db);
                Err(TemplateOpError::Discarded(template.clone()))
            }
        };
        self.dispatch(now, &mut actions);
        (result, actions)
    }

    /// The client is done migrating `template`.
    pub fn finalize(&mut self, template: &TemplateName) -> Result<Finalize, TemplateOpError> {
        self.check_server()?;
        let Some(entry) = self.templates.get_mut(template) else {
            return Err(TemplateOpError::UnknownTemplate(template.clone()));
        };
        match &entry.build {
            Build::Ready { .. } => Ok(Finalize::Done),
            Build::Finalizing { db } => Ok(Finalize::Pending(db.clone())),
            Build::Open { db, since } => {
                let action = Action::FinalizeTemplate {
                    template: template.clone(),
                    db: db.clone(),
                    since: *since,
                };
                entry.build = Build::Finalizing { db: db.clone() };
                Ok(Finalize::Start(action))
            }
            Build::Discarded => Err(TemplateOpError::UnknownTemplate(template.clone())),
            // Still being created (nobody has its credentials yet), a configured template
            // being built, or one that failed.
            Build::Idle | Build::Building { .. } | Build::Opening { .. } | Build::Failed => {
                if entry.source.is_client_built() {
                    Err(TemplateOpError::UnknownTemplate(template.clone()))
                } else {
                    Err(TemplateOpError::NotClientBuilt(template.clone()))
                }
            }
        }
    }

    /// A finalize ended: the template is ready (its waiters are served as clones come) or
    /// failed (they fail). If it was discarded meanwhile, its database goes.
    pub fn template_finalized(
        &mut self,
        template: &TemplateName,
        db: DbName,
        outcome: Result<Built, String>,
        now: Instant,
    ) -> (Result<(), TemplateOpError>, Vec<Action>) {
        let finalizing = self
            .templates
            .get(template)
            .is_some_and(|e| matches!(&e.build, Build::Finalizing { db: d } if *d == db));
        if !finalizing {
            self.drop_queue.push_back(db);
            let mut actions = Vec::new();
            self.dispatch(now, &mut actions);
            return (Err(TemplateOpError::Discarded(template.clone())), actions);
        }
        if let Some(entry) = self.templates.get_mut(template) {
            entry.build = Build::Building { previous: None };
        }
        let result = match &outcome {
            Ok(_) => Ok(()),
            Err(message) => {
                // The half-made template is of no use to anyone.
                self.drop_queue.push_back(db);
                Err(TemplateOpError::Failed {
                    template: template.clone(),
                    message: message.clone(),
                })
            }
        };
        (result, self.build_finished(template, outcome, now))
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
        let Some(entry) = self.templates.get_mut(template) else {
            return Err(TemplateOpError::UnknownTemplate(template.clone()));
        };
        if !entry.source.is_client_built() {
            return Err(TemplateOpError::NotClientBuilt(template.clone()));
        }
        if matches!(entry.build, Build::Discarded) {
            return Err(TemplateOpError::UnknownTemplate(template.clone()));
        }
        let mut actions = Vec::new();
        for waiter in entry.waiters.drain(..) {
            actions.push(Action::Fail {
                waiter: waiter.id,
                error: LeaseError::Discarded(template.clone()),
            });
        }
        match std::mem::replace(&mut entry.build, Build::Discarded) {
            Build::Open { db, .. } | Build::Ready { db, .. } => self.drop_queue.push_back(db),
            // A job holds it and finds the template discarded when it reports.
            Build::Building { .. } | Build::Opening { .. } | Build::Finalizing { .. } => {}
            Build::Idle | Build::Failed | Build::Discarded => {}
        }
        entry.wanted = false;
        self.drop_queue.extend(entry.ready.drain(..));
        self.drop_queue
            .extend(entry.adoptable.drain(..).map(|(_, clone)| clone));
        tracing::info!(template = %template, "template discarded by its client");
        self.dispatch(now, &mut actions);
        Ok(actions)
    }

    /// Forgets every client-built template: their databases go, their open leases end
    /// (later calls on them answer "lost"), their waiting requests fail.
    pub fn discard_all_client_built(
        &mut self,
        now: Instant,
    ) -> Result<Vec<Action>, TemplateOpError> {
        self.check_server()?;
        let names: Vec<TemplateName> = self
            .templates
            .iter()
            .filter(|(_, e)| e.source.is_client_built())
            .map(|(name, _)| name.clone())
            .collect();
        let mut actions = Vec::new();
        for name in &names {
            if let Ok(more) = self.discard(name, now) {
                actions.extend(more);
            }
            self.templates.remove(name);
        }
        let ended: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, r)| names.contains(&r.template))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            if let Some(record) = self.leases.remove(&id) {
                self.drop_queue.push_back(record.database);
                self.remember_lost(id);
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
        self.leases
            .iter()
            .find(|(_, r)| r.reclaimable && r.template == *template && r.number == number)
            .map(|(id, r)| (id.clone(), r.database.clone()))
            .ok_or(TemplateOpError::UnknownTest {
                template: template.clone(),
                number,
            })
    }

    /// A client-built template found complete on the server at start: it is added as
    /// being built, so that ready clones can be adopted for it, then reported built.
    /// False when a template of that name exists already (a configured one now has it):
    /// then its database `db` belongs to nobody and is queued for dropping.
    pub fn restore_client_built(&mut self, template: &TemplateName, db: &DbName) -> bool {
        if self.templates.contains_key(template) {
            self.drop_queue.push_back(db.clone());
            return false;
        }
        let mut entry = TemplateEntry::new(TemplateSource::Client, false);
        entry.build = Build::Building { previous: None };
        self.templates.insert(template.clone(), entry);
        true
    }

    /// Ends the oldest reclaimable lease of every template whose waiters cannot get a
    /// clone because the template is at `max_total` (IntegreSQL's clients never give
    /// test databases back; its server recreates the longest-held one when full).
    pub(super) fn reclaim_for_waiters(&mut self) {
        let max_total = self.limits.max_total;
        let full: Vec<TemplateName> = self
            .templates
            .iter()
            .filter(|(_, e)| {
                // Only IntegreSQL test databases are reclaimable, and only client-built
                // templates have them: a full configured template scans no leases.
                e.source.is_client_built()
                    && matches!(e.build, Build::Ready { .. })
                    && e.waiters.len() > e.ready.len() + e.creating
                    && e.ready.len() + e.leased + e.creating >= max_total
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in full {
            let oldest = self
                .leases
                .iter()
                .filter(|(_, r)| r.template == name && r.reclaimable)
                .min_by_key(|(_, r)| r.granted_at)
                .map(|(id, _)| id.clone());
            let Some(id) = oldest else {
                continue;
            };
            if let Some(record) = self.leases.remove(&id) {
                tracing::info!(template = %name, lease_id = %id, database = %record.database, "template full: recreating its longest-held test database");
                if let Some(entry) = self.templates.get_mut(&name) {
                    entry.leased = entry.leased.saturating_sub(1);
                }
                self.drop_queue.push_back(record.database);
                self.remember_lost(id);
            }
        }
    }
}
