//! `PoolHandle`: the cloneable front of the pool actor. Each method sends one command with a
//! oneshot reply channel and awaits the answer; no pool state lives here.

use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::config::TemplateSource;
use crate::error::{LeaseError, LeaseOpError, TemplateOpError};
use crate::names::{LeaseId, TemplateName};
use crate::state::{Changer, Registered};
use crate::types::{
    ConnectInfo, KeptDatabase, Lease, LeaseRequest, Readiness, StatusReport, TemplateStatus,
};

/// How long past a request's own wait the handle gives the actor before giving up on it.
const ACTOR_MARGIN: Duration = Duration::from_secs(10);

/// Commands the actor serves: one per [`PoolHandle`] method, with the reply sender its
/// caller waits on. Public only so that the `testing` feature's fake actor can hand them
/// to tests as they are (`testing::FakeCommand`); nothing outside the crate sends them.
///
/// A `send` on `reply` fails (and hands the value back) when the caller has gone, e.g.
/// because an HTTP client disconnected and its handler was dropped; the actor relies on
/// that to take a granted database back. `reply.is_closed()` shows it without sending.
#[derive(Debug)]
pub enum Command {
    /// [`PoolHandle::lease`].
    Lease {
        /// The request as the caller built it.
        request: LeaseRequest,
        /// Where the lease or the error goes.
        reply: oneshot::Sender<Result<Lease, LeaseError>>,
    },
    /// [`PoolHandle::release`].
    Release {
        /// The lease to end.
        id: LeaseId,
        /// The caller vouches the database is unchanged.
        reuse: bool,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(), LeaseOpError>>,
    },
    /// [`PoolHandle::renew`].
    Renew {
        /// The lease to extend.
        id: LeaseId,
        /// The new time to live, or None for the pool's default.
        ttl: Option<Duration>,
        /// Where the new expiry or the error goes.
        reply: oneshot::Sender<Result<SystemTime, LeaseOpError>>,
    },
    /// [`PoolHandle::keep`].
    Keep {
        /// The lease to end.
        id: LeaseId,
        /// How long to keep its database.
        keep: Duration,
        /// Where the drop time or the error goes.
        reply: oneshot::Sender<Result<SystemTime, LeaseOpError>>,
    },
    /// [`PoolHandle::kept`].
    Kept {
        /// Where the list goes.
        reply: oneshot::Sender<Vec<KeptDatabase>>,
    },
    /// [`PoolHandle::drop_kept`].
    DropKept {
        /// The kept database's id.
        id: LeaseId,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(), LeaseOpError>>,
    },
    /// [`PoolHandle::status`].
    Status {
        /// Where the report goes; dropping it makes `status()` return None.
        reply: oneshot::Sender<StatusReport>,
    },
    /// [`PoolHandle::rebuild`].
    Rebuild {
        /// The template to rebuild.
        template: TemplateName,
        /// Who asks: the operator's templates are rebuilt only for some.
        changer: Changer,
        /// Where its status or the error goes.
        reply: oneshot::Sender<Result<TemplateStatus, LeaseError>>,
    },
    /// [`PoolHandle::register`].
    Register {
        /// The template's name.
        name: TemplateName,
        /// Its new source.
        source: TemplateSource,
        /// Who asks: the operator's templates change only for some.
        changer: Changer,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(Registered, TemplateStatus), LeaseError>>,
    },
    /// [`PoolHandle::readiness`].
    Readiness {
        /// Where the answer goes; dropping it reads as "not ready".
        reply: oneshot::Sender<Readiness>,
    },
    /// [`PoolHandle::initialize`].
    Initialize {
        /// The template (the client's hash).
        template: TemplateName,
        /// Where the template database's connection details or the error go.
        reply: oneshot::Sender<Result<ConnectInfo, TemplateOpError>>,
    },
    /// [`PoolHandle::finalize`].
    Finalize {
        /// The template.
        template: TemplateName,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(), TemplateOpError>>,
    },
    /// [`PoolHandle::discard`].
    Discard {
        /// The template.
        template: TemplateName,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(), TemplateOpError>>,
    },
    /// [`PoolHandle::discard_all_client_built`].
    DiscardAllClientBuilt {
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(), TemplateOpError>>,
    },
    /// [`PoolHandle::give_back`].
    GiveBack {
        /// The template.
        template: TemplateName,
        /// The lease's number.
        number: u32,
        /// Drop and replace it rather than put it back as it is.
        recreate: bool,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(), TemplateOpError>>,
    },
    /// [`PoolHandle::shutdown`].
    Shutdown {
        /// Send (or drop) to let `shutdown()` resolve.
        reply: oneshot::Sender<()>,
    },
}

/// A cloneable handle to the pool. When every handle is dropped the pool shuts down.
#[derive(Debug, Clone)]
pub struct PoolHandle {
    commands: mpsc::Sender<Command>,
}

impl PoolHandle {
    pub(crate) fn new(commands: mpsc::Sender<Command>) -> Self {
        PoolHandle { commands }
    }

    /// Leases a database of `request.template`, waiting up to `request.wait` for one.
    /// If this future is dropped before it resolves, a granted database goes back to the pool.
    pub async fn lease(&self, request: LeaseRequest) -> Result<Lease, LeaseError> {
        let wait = request.wait;
        let asked = self.ask(|reply| Command::Lease { request, reply });
        match tokio::time::timeout(wait + ACTOR_MARGIN, asked).await {
            Ok(Some(result)) => result,
            Ok(None) => Err(LeaseError::ShuttingDown),
            Err(_) => Err(LeaseError::Internal(
                "the pool did not answer in time".into(),
            )),
        }
    }

    /// Ends a lease. With `reuse` the caller vouches the database is unchanged.
    pub async fn release(&self, id: LeaseId, reuse: bool) -> Result<(), LeaseOpError> {
        self.ask(|reply| Command::Release { id, reuse, reply })
            .await
            .unwrap_or(Err(LeaseOpError::ShuttingDown))
    }

    /// Extends a lease to `ttl` (the default when None) from now; returns the new expiry.
    pub async fn renew(
        &self,
        id: LeaseId,
        ttl: Option<Duration>,
    ) -> Result<SystemTime, LeaseOpError> {
        self.ask(|reply| Command::Renew { id, ttl, reply })
            .await
            .unwrap_or(Err(LeaseOpError::ShuttingDown))
    }

    /// Ends a lease but keeps its database as it is for `keep` (shortened to the pool's
    /// longest keep), openable with the lease's credentials; returns when it is dropped.
    pub async fn keep(&self, id: LeaseId, keep: Duration) -> Result<SystemTime, LeaseOpError> {
        self.ask(|reply| Command::Keep { id, keep, reply })
            .await
            .unwrap_or(Err(LeaseOpError::ShuttingDown))
    }

    /// Every kept database, oldest first; empty once the pool has stopped.
    pub async fn kept(&self) -> Vec<KeptDatabase> {
        self.ask(|reply| Command::Kept { reply })
            .await
            .unwrap_or_default()
    }

    /// Drops the database kept under `id` now.
    pub async fn drop_kept(&self, id: LeaseId) -> Result<(), LeaseOpError> {
        self.ask(|reply| Command::DropKept { id, reply })
            .await
            .unwrap_or(Err(LeaseOpError::ShuttingDown))
    }

    /// Builds a new version of a template now (its ready clones are replaced; leased ones
    /// are dropped when released). Answers the template's status after the request;
    /// `ConfiguredTemplate` when the template is the operator's and `changer` may not
    /// change it.
    pub async fn rebuild(
        &self,
        template: TemplateName,
        changer: Changer,
    ) -> Result<TemplateStatus, LeaseError> {
        self.ask(|reply| Command::Rebuild {
            template,
            changer,
            reply,
        })
        .await
        .unwrap_or(Err(LeaseError::ShuttingDown))
    }

    /// Adds a template, or gives an existing one (not `default`) a new source; the
    /// operator's templates only when `changer` may change them (else `ConfiguredTemplate`).
    pub async fn register(
        &self,
        name: TemplateName,
        source: TemplateSource,
        changer: Changer,
    ) -> Result<(Registered, TemplateStatus), LeaseError> {
        self.ask(|reply| Command::Register {
            name,
            source,
            changer,
            reply,
        })
        .await
        .unwrap_or(Err(LeaseError::ShuttingDown))
    }

    /// A client builds `template` itself: answers the connection details of its empty
    /// template database (a login role that may migrate it), or `AlreadyInitialized` to
    /// every caller but the first.
    pub async fn initialize(&self, template: TemplateName) -> Result<ConnectInfo, TemplateOpError> {
        self.ask(|reply| Command::Initialize { template, reply })
            .await
            .unwrap_or(Err(TemplateOpError::ShuttingDown))
    }

    /// The client is done migrating `template`: it becomes a template, and requests
    /// waiting for it are served. Resolves once it is (also if it was already).
    pub async fn finalize(&self, template: TemplateName) -> Result<(), TemplateOpError> {
        self.ask(|reply| Command::Finalize { template, reply })
            .await
            .unwrap_or(Err(TemplateOpError::ShuttingDown))
    }

    /// Ends a client-built template: requests for it fail until it is initialized again.
    pub async fn discard(&self, template: TemplateName) -> Result<(), TemplateOpError> {
        self.ask(|reply| Command::Discard { template, reply })
            .await
            .unwrap_or(Err(TemplateOpError::ShuttingDown))
    }

    /// Forgets every client-built template and ends their leases.
    pub async fn discard_all_client_built(&self) -> Result<(), TemplateOpError> {
        self.ask(|reply| Command::DiscardAllClientBuilt { reply })
            .await
            .unwrap_or(Err(TemplateOpError::ShuttingDown))
    }

    /// Ends the lease numbered `number` of `template` unless sessions are still connected
    /// to its database: back to the pool as it is, or with `recreate` dropped and replaced.
    pub async fn give_back(
        &self,
        template: TemplateName,
        number: u32,
        recreate: bool,
    ) -> Result<(), TemplateOpError> {
        self.ask(|reply| Command::GiveBack {
            template,
            number,
            recreate,
            reply,
        })
        .await
        .unwrap_or(Err(TemplateOpError::ShuttingDown))
    }

    /// A snapshot for `/status`; None once the pool has stopped.
    pub async fn status(&self) -> Option<StatusReport> {
        self.ask(|reply| Command::Status { reply }).await
    }

    /// Whether postgres is up and the default template built; all false once stopped.
    pub async fn readiness(&self) -> Readiness {
        self.ask(|reply| Command::Readiness { reply })
            .await
            .unwrap_or_default()
    }

    /// Asks the pool to stop: waiting requests fail, postgres is stopped, the data
    /// directory removed. Resolves once the actor has answered (or is already gone).
    pub async fn shutdown(&self) {
        let _ = self.ask(|reply| Command::Shutdown { reply }).await;
    }

    /// Sends the command `command` makes around a reply channel and waits for the answer;
    /// None when the actor is gone (or went before answering). Every method is this call.
    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).await.ok()?;
        answer.await.ok()
    }
}
