//! A fake pool for tests of code that holds a [`PoolHandle`] (the HTTP API, above all).
//! [`fake_pool`] returns a real handle whose commands arrive at a [`FakeActor`] instead of
//! the pool actor; the test receives each one as a [`FakeCommand`] and answers it through
//! its reply sender, exactly as the actor would.
//!
//! Only built with the `testing` feature, which crates enable for their dev-dependencies.
//! It starts no postgres, spawns no task and keeps no state: what the pool *would* answer is
//! entirely up to the test.

use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::config::TemplateSource;
use crate::error::{LeaseError, LeaseOpError, TemplateOpError};
use crate::handle::{Command, PoolHandle};
use crate::names::{LeaseId, TemplateName};
use crate::state::Registered;
use crate::types::{
    ConnectInfo, KeptDatabase, Lease, LeaseRequest, Readiness, StatusReport, TemplateStatus,
};

/// Commands a handle may queue before its `send` waits. Bounded like the real pool's
/// channel; tests queue at most a few.
const CHANNEL_CAPACITY: usize = 64;

/// A handle backed by a fake actor, and that actor.
/// Dropping the [`FakeActor`] makes the handle behave as if the pool had stopped.
pub fn fake_pool() -> (PoolHandle, FakeActor) {
    let (commands, receiver) = mpsc::channel(CHANNEL_CAPACITY);
    (PoolHandle::new(commands), FakeActor { receiver })
}

/// The receiving end of a [`fake_pool`]: plays the pool actor in a test.
#[derive(Debug)]
pub struct FakeActor {
    receiver: mpsc::Receiver<Command>,
}

impl FakeActor {
    /// Waits for the next command; `None` once every handle is dropped.
    pub async fn recv(&mut self) -> Option<FakeCommand> {
        self.receiver.recv().await.map(FakeCommand::from)
    }

    /// The next command if one is already queued; lets a test assert that a request
    /// was answered without reaching the pool.
    pub fn try_recv(&mut self) -> Option<FakeCommand> {
        self.receiver.try_recv().ok().map(FakeCommand::from)
    }
}

/// One call made on the [`PoolHandle`], with the reply sender the caller is waiting on.
///
/// A `send` on `reply` fails (and hands the value back) when the caller has gone, e.g.
/// because an HTTP client disconnected and its handler was dropped; the real actor relies
/// on that to take a granted database back. `reply.is_closed()` shows it without sending.
#[derive(Debug)]
pub enum FakeCommand {
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
        /// Where its status or the error goes.
        reply: oneshot::Sender<Result<TemplateStatus, LeaseError>>,
    },
    /// [`PoolHandle::register`].
    Register {
        /// The template's name.
        name: TemplateName,
        /// Its new source.
        source: TemplateSource,
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

impl From<Command> for FakeCommand {
    // Exhaustive on purpose: a new command must get a public mirror here.
    fn from(command: Command) -> Self {
        match command {
            Command::Lease { request, reply } => FakeCommand::Lease { request, reply },
            Command::Release { id, reuse, reply } => FakeCommand::Release { id, reuse, reply },
            Command::Renew { id, ttl, reply } => FakeCommand::Renew { id, ttl, reply },
            Command::Keep { id, keep, reply } => FakeCommand::Keep { id, keep, reply },
            Command::Kept { reply } => FakeCommand::Kept { reply },
            Command::DropKept { id, reply } => FakeCommand::DropKept { id, reply },
            Command::Status { reply } => FakeCommand::Status { reply },
            Command::Rebuild { template, reply } => FakeCommand::Rebuild { template, reply },
            Command::Register {
                name,
                source,
                reply,
            } => FakeCommand::Register {
                name,
                source,
                reply,
            },
            Command::Readiness { reply } => FakeCommand::Readiness { reply },
            Command::Initialize { template, reply } => FakeCommand::Initialize { template, reply },
            Command::Finalize { template, reply } => FakeCommand::Finalize { template, reply },
            Command::Discard { template, reply } => FakeCommand::Discard { template, reply },
            Command::DiscardAllClientBuilt { reply } => {
                FakeCommand::DiscardAllClientBuilt { reply }
            }
            Command::GiveBack {
                template,
                number,
                recreate,
                reply,
            } => FakeCommand::GiveBack {
                template,
                number,
                recreate,
                reply,
            },
            Command::Shutdown { reply } => FakeCommand::Shutdown { reply },
        }
    }
}
