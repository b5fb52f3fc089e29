//! The pool actor: the one task that owns the pool's state, the postgres child and the
//! session with the server. Commands arrive from [`PoolHandle`](crate::PoolHandle)s; slow
//! SQL (builds, clones, drops) and (re)starts of postgres run in worker tasks that report
//! back as [`JobResult`]s, so the loop never awaits SQL and answers leases while the pool
//! refills.
//!
//! Rules live in [`PoolState`], which holds every fact about the pool; the actor holds only
//! I/O handles (the server, its session, the job channel) and the reply senders of callers
//! waiting for an answer, keyed by ids. This file is the loop and the carrying out of the
//! state's actions; the rest is split by concern: [`start`](mod@start) (bringing a server up),
//! [`server`] (watching it, taking it back), [`jobs`] (the worker jobs and what they
//! report), [`reports`] (applying those reports), [`leases`] (requests, grants, status),
//! [`client`] (templates IntegreSQL clients build), [`space`] (the databases' tmpfs),
//! [`shutdown`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::error::LeaseError;
use crate::handle::Command;
use crate::names::DbName;
use crate::postgres::RunningPostgres;
use crate::sql_error::{SqlError, SqlErrorKind};
use crate::state::{Action, PoolState, WaiterId};
use crate::types::{ConnectInfo, Lease};

mod backend;
mod client;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod interleavings;
mod jobs;
mod leases;
mod reports;
mod server;
mod shutdown;
mod space;
mod start;

use backend::{Backend, Monitor};
use jobs::{JobResult, Report};
pub use start::start;
use start::{Target, UpInputs};

/// How often the actor checks that postgres is alive ("notices within a second").
const LIVENESS_INTERVAL: Duration = Duration::from_millis(250);
/// Pause between failed attempts to bring postgres back.
const RESTART_BACKOFF: Duration = Duration::from_secs(2);
/// Fast shutdown of postgres gets this long before SIGKILL.
const POSTGRES_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the answer to a lease request goes.
type LeaseReply = oneshot::Sender<Result<Lease, LeaseError>>;

/// What a job reports when it finds no server to work on.
const NOT_RUNNING: &str = "postgres is not running";

/// A job that found no server: its connection is lost, no fault of what it was to run.
fn not_running() -> SqlError {
    SqlError {
        kind: SqlErrorKind::ConnectionLost,
        sqlstate: None,
        message: NOT_RUNNING.into(),
    }
}

/// Capacity of the command channel; senders wait when it is full.
const COMMAND_CAPACITY: usize = 1024;

/// The actor: the state, and what carries out its actions. See the module docs.
struct Actor {
    state: PoolState,
    /// Callers of `initialize`, by the database being made for them.
    initializers: HashMap<DbName, client::Reply<ConnectInfo>>,
    /// Callers of `finalize`, by the database being finalized.
    finalizers: HashMap<DbName, Vec<client::Reply<()>>>,
    /// IntegreSQL unlocks, answered when their database's recycle ends.
    unlocks: HashMap<DbName, client::Reply<()>>,
    inputs: UpInputs,
    external: bool,
    /// An external server, or a kept data directory: what we leave is found next time.
    server_outlives_us: bool,
    /// None while a (re)start task holds it.
    target: Option<Target>,
    running: Option<RunningPostgres>,
    /// The server's I/O while it is up (a `Session`; a fake server in tests).
    backend: Option<std::sync::Arc<dyn Backend>>,
    monitor: Option<Box<dyn Monitor>>,
    waiters: HashMap<WaiterId, LeaseReply>,
    next_waiter: WaiterId,
    /// The first byte of the lease ids this pool mints: it names its server among several.
    server: u8,
    /// When the sources of failed templates are looked at next (a pace for file I/O).
    failed_sources_at: Instant,
    /// When the server is next checked for a shutdown someone else asked for, and whether
    /// a check is under way (`server.rs`): our postmaster's status line (`postmaster.pid`),
    /// or whether an external server takes a new connection.
    shutdown_check_at: Instant,
    shutdown_check_pending: bool,
    /// The copy-on-write store whose usage the byte budget is judged by, while the server
    /// runs with `file_copy_method = clone` there (`measure_store`), and what its file
    /// system held before the cluster was put there (its own metadata, and on an
    /// operator's `--data-dir` whatever else lives there), which does not count.
    store: Option<(std::path::PathBuf, u64)>,
    /// The pace of the leased databases' measures (`actor/space.rs`): when the one under
    /// way started, and when the next may start.
    lease_sizes_started: Option<Instant>,
    lease_sizes_after: Instant,
    jobs_tx: mpsc::UnboundedSender<Report>,
    tracker: TaskTracker,
}

impl Actor {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut jobs: mpsc::UnboundedReceiver<Report>,
    ) {
        let mut liveness = tokio::time::interval(LIVENESS_INTERVAL);
        liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let deadline = self.state.next_deadline();
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Shutdown { reply }) => {
                        self.shutdown(&mut jobs).await;
                        let _ = reply.send(());
                        return;
                    }
                    Some(command) => {
                        self.handle_command(command);
                        self.check_invariants();
                    }
                    None => {
                        self.shutdown(&mut jobs).await;
                        return;
                    }
                },
                Some(result) = jobs.recv() => {
                    self.measure_store();
                    self.handle_job(result);
                }
                _ = liveness.tick() => {
                    self.measure_store();
                    self.watch_space();
                    self.measure_leases();
                    self.check_server();
                    self.drop_cancelled_waiters();
                    self.look_at_failed_sources();
                    let actions = self.state.tick(Instant::now());
                    self.apply(actions);
                    self.check_invariants();
                }
                _ = sleep_until(deadline) => {
                    let actions = self.state.tick(Instant::now());
                    self.apply(actions);
                    self.check_invariants();
                }
            }
        }
    }

    /// Carries out one command of a handle. Long on purpose: one match arm per
    /// `Command` variant, each handing its work to the state or a worker.
    fn handle_command(&mut self, command: Command) {
        let now = Instant::now();
        match command {
            Command::Lease { request, reply } => self.lease(request, reply),
            Command::Release { id, reuse, reply } => {
                let (result, actions) = self.state.release(&id, reuse, now);
                if result.is_ok() {
                    tracing::info!(lease_id = %id, reuse, "lease released");
                }
                let _ = reply.send(result);
                self.apply(actions);
            }
            Command::Renew { id, ttl, reply } => {
                let result = self
                    .state
                    .renew(&id, ttl, now)
                    .map(|ttl| SystemTime::now() + ttl);
                let _ = reply.send(result);
            }
            Command::Keep { id, keep, reply } => {
                let (result, actions) = self.state.keep(&id, keep, now);
                let _ = reply.send(result.map(|kept_for| SystemTime::now() + kept_for));
                self.apply(actions);
            }
            Command::Kept { reply } => {
                let _ = reply.send(self.kept());
            }
            Command::DropKept { id, reply } => {
                let (result, actions) = self.state.drop_kept(&id, now);
                if result.is_ok() {
                    tracing::info!(lease_id = %id, "kept database dropped on request");
                }
                let _ = reply.send(result);
                self.apply(actions);
            }
            Command::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Command::Register {
                name,
                source,
                changer,
                reply,
            } => {
                let answer = match self.state.register(name.clone(), source, changer, now) {
                    Ok((registered, actions)) => {
                        tracing::info!(template = %name, ?registered, "template registered over the API");
                        self.apply(actions);
                        self.state
                            .status_of(&name)
                            .map(|status| (registered, status))
                            .ok_or_else(|| self.state.unknown_template(name))
                    }
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Command::Rebuild {
                template,
                changer,
                reply,
            } => {
                let answer = match self.state.request_rebuild(&template, changer, now) {
                    Ok(actions) => {
                        tracing::info!(template = %template, "rebuild requested");
                        self.apply(actions);
                        self.state
                            .status_of(&template)
                            .ok_or_else(|| self.state.unknown_template(template))
                    }
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Command::Readiness { reply } => {
                let _ = reply.send(self.state.readiness());
            }
            Command::Initialize { template, reply } => self.initialize(template, reply),
            Command::Finalize { template, reply } => self.finalize(template, reply),
            Command::Discard { template, reply } => self.discard(template, reply),
            Command::DiscardAllClientBuilt { reply } => self.discard_all_client_built(reply),
            Command::GiveBack {
                template,
                number,
                recreate,
                reply,
            } => self.give_back(template, number, recreate, reply),
            Command::Shutdown { reply } => {
                // Handled in `run`, which can await; unreachable here but harmless.
                let _ = reply.send(());
            }
        }
    }

    /// In debug builds (and so in every test run), the state's promises are checked after
    /// every event; a broken one stops the daemon loudly rather than lease a database twice.
    fn check_invariants(&self) {
        if cfg!(debug_assertions) {
            if let Err(broken) = self.state.check_invariants() {
                tracing::error!(%broken, "pool invariant broken");
                panic!("pool invariant broken: {broken}");
            }
        }
    }

    /// Carries out the state's actions; answering a waiter can yield more (a grant nobody
    /// received goes back to the pool).
    fn apply(&mut self, actions: Vec<Action>) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Build {
                    template,
                    source,
                    reuse_existing,
                } => self.spawn_build(template, source, reuse_existing),
                Action::Clone {
                    template,
                    template_db,
                    clone,
                    stamp,
                } => self.spawn_clone(template, template_db, clone, stamp),
                Action::Recycle {
                    template,
                    template_db,
                    clone,
                    verify,
                    stamp,
                } => self.spawn_recycle(template, template_db, clone, verify, stamp),
                Action::Drop { db } => self.spawn_drop(db),
                Action::OpenTemplate { template, db } => self.spawn_open(template, db),
                Action::FinalizeTemplate {
                    template,
                    db,
                    since,
                } => self.spawn_finalize(template, db, since),
                Action::SetLimit {
                    lease_id,
                    database,
                    connections,
                } => self.spawn_set_limit(lease_id, database, connections),
                Action::Grant { waiter, grant } => {
                    if let Some(more) = self.send_lease(waiter, grant) {
                        queue.extend(more);
                    }
                }
                Action::Fail { waiter, error } => {
                    if let Some(reply) = self.waiters.remove(&waiter) {
                        let _ = reply.send(Err(error));
                    }
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
