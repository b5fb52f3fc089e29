//! The actor's side of templates that clients build (the IntegreSQL-compatible API):
//! it asks [`PoolState`](crate::state::PoolState) what to do, runs the SQL in workers
//! (`template::open_client_template`, `template::finalize_client_template`) and answers
//! the callers once the work is reported. Their test databases are ordinary leases.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{not_running, Actor, JobResult, NOT_RUNNING};
use crate::error::TemplateOpError;
use crate::names::{DbName, LeaseId, TemplateName};
use crate::sql_error::SqlError;
use crate::state::{Action, Built, Finalize};
use crate::types::ConnectInfo;

/// How long an unlock or recreate waits for the sessions of a test that has just
/// disconnected to end before answering 423 (their backends exit a few ms after the client).
const CLOSING_SESSIONS_GRACE: Duration = Duration::from_secs(1);

/// Where the answer to a client-template operation goes.
pub(super) type Reply<T> = oneshot::Sender<Result<T, TemplateOpError>>;

impl Actor {
    pub(super) fn initialize(&mut self, template: TemplateName, reply: Reply<ConnectInfo>) {
        match self.state.initialize(&template, Instant::now()) {
            Ok(actions) => {
                if let Some(Action::OpenTemplate { db, .. }) = actions.last() {
                    self.initializers.insert(db.clone(), reply);
                }
                tracing::info!(template = %template, "template initialized by a client");
                self.apply(actions);
            }
            Err(error) => {
                let _ = reply.send(Err(error));
            }
        }
    }

    pub(super) fn finalize(&mut self, template: TemplateName, reply: Reply<()>) {
        match self.state.finalize(&template) {
            Ok(Finalize::Done) => {
                let _ = reply.send(Ok(()));
            }
            Ok(Finalize::Pending(db)) => self.finalizers.entry(db).or_default().push(reply),
            Ok(Finalize::Start(action)) => {
                if let Action::FinalizeTemplate { db, .. } = &action {
                    self.finalizers.entry(db.clone()).or_default().push(reply);
                }
                self.apply(vec![action]);
            }
            Err(error) => {
                let _ = reply.send(Err(error));
            }
        }
    }

    pub(super) fn discard(&mut self, template: TemplateName, reply: Reply<()>) {
        match self.state.discard(&template, Instant::now()) {
            Ok(actions) => {
                let _ = reply.send(Ok(()));
                self.apply(actions);
            }
            Err(error) => {
                let _ = reply.send(Err(error));
            }
        }
    }

    pub(super) fn discard_all_client_built(&mut self, reply: Reply<()>) {
        match self.state.discard_all_client_built(Instant::now()) {
            Ok(actions) => {
                tracing::info!("every client-built template discarded");
                let _ = reply.send(Ok(()));
                self.apply(actions);
            }
            Err(error) => {
                let _ = reply.send(Err(error));
            }
        }
    }

    /// Counts the sessions on the lease's database first (in a worker): a test database
    /// someone is still connected to is not taken back.
    pub(super) fn give_back(
        &mut self,
        template: TemplateName,
        number: u32,
        recreate: bool,
        reply: Reply<()>,
    ) {
        let (id, db) = match self.state.lease_by_number(&template, number) {
            Ok(found) => found,
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        self.spawn_job(move |session| async move {
            let outcome = match session {
                Some(session) => session
                    .sessions_after(&db, CLOSING_SESSIONS_GRACE)
                    .await
                    // A server lost meanwhile is postgres' trouble, not the test's.
                    .map_err(|error| TemplateOpError::of_sql(&template, &error)),
                None => Err(TemplateOpError::PostgresDown(NOT_RUNNING.into())),
            };
            JobResult::SessionsCounted {
                give_back: Box::new(GiveBack {
                    template,
                    number,
                    id,
                    db,
                    recreate,
                    reply,
                }),
                outcome,
            }
        });
    }

    pub(super) fn sessions_counted(
        &mut self,
        give_back: GiveBack,
        outcome: Result<i64, TemplateOpError>,
    ) {
        let GiveBack {
            template,
            number,
            id,
            db,
            recreate,
            reply,
        } = give_back;
        let answer = match outcome {
            Err(error) => Err(error),
            Ok(sessions) if sessions > 0 => Err(TemplateOpError::InUse {
                template: template.clone(),
                number,
                sessions,
            }),
            Ok(_) => {
                let (result, actions) = self.state.release(&id, !recreate, Instant::now());
                if result.is_ok() {
                    tracing::info!(template = %template, number, recreate, "test database given back");
                    if !recreate && self.state.is_being_made(&db) {
                        // Answered once it is back in the queue (see `recycled`): a get right
                        // after the unlock then finds it there, under its id. (Not recycled —
                        // its version was replaced — it is dropped: answered now.)
                        self.unlocks.insert(db, reply);
                        self.apply(actions);
                        return;
                    }
                }
                self.apply(actions);
                // Ended meanwhile (expired, or recreated for a waiting request).
                result.map_err(|_| TemplateOpError::UnknownTest {
                    template: template.clone(),
                    number,
                })
            }
        };
        let _ = reply.send(answer);
    }

    /// A clone job ended for `db`: an unlock waiting for its recycle is answered (also if
    /// the recycle failed — the database was given back; its replacement has a new id).
    pub(super) fn recycled(&mut self, db: &DbName) {
        if let Some(reply) = self.unlocks.remove(db) {
            let _ = reply.send(Ok(()));
        }
    }

    pub(super) fn spawn_open(&mut self, template: TemplateName, db: DbName) {
        self.spawn_job(move |session| async move {
            let outcome = match session {
                Some(session) => session.open_client_template(&template, &db).await,
                None => Err(not_running()),
            };
            JobResult::Opened {
                template,
                db,
                outcome,
            }
        });
    }

    pub(super) fn opened(
        &mut self,
        template: TemplateName,
        db: DbName,
        outcome: Result<String, SqlError>,
    ) {
        let password = outcome.as_ref().ok().cloned();
        if let Err(message) = &outcome {
            tracing::warn!(template = %template, error = %message, "could not create a client-built template");
        }
        let (result, actions) =
            self.state
                .template_opened(&template, db.clone(), outcome.map(|_| ()), Instant::now());
        if let Some(reply) = self.initializers.remove(&db) {
            let answer = result.and_then(|()| {
                let session = self
                    .backend
                    .as_ref()
                    .ok_or_else(|| TemplateOpError::PostgresDown(NOT_RUNNING.into()))?;
                // With `--integresql-pg-user` the client migrates as the shared role that
                // its run's PG* variables name, as under IntegreSQL: what a dump loaded with
                // psql made, the migrations change (and vice versa), one owner for both.
                // Otherwise as the build role, named like its database (`sameuser`).
                let (user, password) = match session.shared_login() {
                    Some(shared) => (shared.name.clone(), shared.password.clone()),
                    None => (db.as_str().to_owned(), password.unwrap_or_default()),
                };
                Ok(ConnectInfo {
                    host: session.lease_host().to_owned(),
                    port: session.lease_port(),
                    user,
                    password,
                    database: db.clone(),
                    ssl: session.ssl(),
                })
            });
            let delivered = answer.is_ok();
            if reply.send(answer).is_err() && delivered {
                // The initializer hung up: nobody has the credentials to migrate it, and
                // everyone else is told it is initialized. Discard it so it can start over.
                tracing::warn!(template = %template, "the initializer left before its answer; discarding the template");
                self.apply(actions);
                match self.state.discard(&template, Instant::now()) {
                    Ok(more) => self.apply(more),
                    Err(error) => {
                        tracing::warn!(template = %template, %error, "could not discard it")
                    }
                }
                return;
            }
        }
        self.apply(actions);
    }

    pub(super) fn spawn_finalize(&mut self, template: TemplateName, db: DbName, since: Instant) {
        self.spawn_job(move |session| async move {
            let outcome = match session {
                Some(session) => {
                    session
                        .finalize_client_template(&template, &db, since.into_std())
                        .await
                }
                None => Err(not_running()),
            };
            JobResult::Finalized {
                template,
                db,
                outcome,
            }
        });
    }

    pub(super) fn finalized(
        &mut self,
        template: TemplateName,
        db: DbName,
        outcome: Result<Built, SqlError>,
    ) {
        if let Err(message) = &outcome {
            tracing::warn!(template = %template, error = %message, "could not finalize a client-built template");
        }
        let (result, actions) =
            self.state
                .template_finalized(&template, db.clone(), outcome, Instant::now());
        for reply in self.finalizers.remove(&db).unwrap_or_default() {
            let _ = reply.send(result.clone());
        }
        self.apply(actions);
    }

    /// Callers waiting on client-template work of a lost server are told so.
    pub(super) fn fail_client_work(&mut self, reason: &str) {
        // Their databases went with the server; they were given back all the same.
        for (_, reply) in self.unlocks.drain() {
            let _ = reply.send(Ok(()));
        }
        for (_, reply) in self.initializers.drain() {
            let _ = reply.send(Err(TemplateOpError::PostgresDown(reason.to_owned())));
        }
        for (_, replies) in self.finalizers.drain() {
            for reply in replies {
                let _ = reply.send(Err(TemplateOpError::PostgresDown(reason.to_owned())));
            }
        }
    }
}

/// A `give_back` waiting for its session count.
#[derive(Debug)]
pub(super) struct GiveBack {
    template: TemplateName,
    number: u32,
    id: LeaseId,
    db: DbName,
    recreate: bool,
    reply: Reply<()>,
}
