//! The pool actor: the one task that owns the pool's state, the postgres child and the
//! session with the server. Commands arrive from [`PoolHandle`](crate::PoolHandle)s; slow
//! SQL (builds, clones, drops) and (re)starts of postgres run in worker tasks that report
//! back as [`JobResult`]s, so the loop never awaits SQL and answers leases while the pool
//! refills.
//!
//! Rules live in [`PoolState`]; this file only carries out its actions and watches postgres.

use crate::child_user::ChildUser;
use std::collections::{HashMap, VecDeque};
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_postgres::NoTls;
use tokio_util::task::TaskTracker;

use crate::config::{
    CloneStrategy, ExternalConfig, IntegresqlRole, LeaseAuth, PoolConfig, ServerConfig,
    TemplateConfig, TemplateSource,
};
use crate::error::{LeaseError, StartError, TemplateOpError};
use crate::handle::{Command, PoolHandle};
use crate::names::{DbName, LeaseId, TemplateName};
use crate::postgres::snapshot::Manifest;
use crate::postgres::{Embedded, RunningPostgres};
use crate::session::{
    describe_target, mark_ready, pg_message, NotReused, Session, SessionParams, Stamp,
};
use crate::sql_error::{SqlError, SqlErrorKind};
use crate::state::{Action, Built, Grant, Made, PoolState, WaiterId};
use crate::template::{self, SourceStamp};
use crate::types::{
    ConnectInfo, KeptDatabase, Lease, LeaseRequest, LeaseSummary, PostgresStatus, StatusReport,
};

mod client;
mod space;

/// How often the actor checks that postgres is alive ("notices within a second").
const LIVENESS_INTERVAL: Duration = Duration::from_millis(250);
/// Pause between failed attempts to bring postgres back.
const RESTART_BACKOFF: Duration = Duration::from_secs(2);
/// Fast shutdown of postgres gets this long before SIGKILL.
const POSTGRES_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the answer to a lease request goes.
type LeaseReply = oneshot::Sender<Result<Lease, LeaseError>>;

/// How long a second look at a server whose monitor connection closed may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Where the server comes from, held by the actor between (re)starts. One per pool: the
/// variants' difference in size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Target {
    Embedded(Embedded),
    External(ExternalTarget),
}

#[derive(Clone)]
struct ExternalTarget {
    admin_config: tokio_postgres::Config,
    lease_host: String,
    lease_port: u16,
}

impl ExternalTarget {
    fn parse(config: &ExternalConfig) -> Result<Self, StartError> {
        let admin_config = tokio_postgres::Config::from_str(&config.url)
            .map_err(|e| StartError::BadUrl(e.to_string()))?;
        let host = admin_config.get_hosts().first().map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        });
        Ok(ExternalTarget {
            lease_host: config
                .advertise_host
                .clone()
                .or(host)
                .unwrap_or_else(|| "localhost".into()),
            lease_port: admin_config.get_ports().first().copied().unwrap_or(5432),
            admin_config,
        })
    }
}

/// How often the sources of failed templates are looked at (`PoolState::look_at_failed_sources`):
/// a stat per file, a second after the fix at most.
const FAILED_SOURCES_EVERY: Duration = Duration::from_secs(1);

/// What a successful (re)start hands the actor.
struct Up {
    running: Option<RunningPostgres>,
    session: Session,
    /// A connection kept open only to notice when the server goes away.
    monitor: tokio_postgres::Client,
}

/// What bringing a server up needs besides the target.
#[derive(Clone)]
struct UpInputs {
    templates: Vec<TemplateConfig>,
    pool_size: usize,
    clone_strategy: CloneStrategy,
    lease_auth: LeaseAuth,
    lease_superuser: bool,
    lease_connections: u32,
    build_timeout: Duration,
    /// Released clones are proven unchanged (the embedded server's session reads its files).
    reuse_unchanged: bool,
    /// Who runs the builds' programs and reads template sources.
    child_user: ChildUser,
    /// The IntegreSQL clients' role, made at each start.
    integresql_role: Option<IntegresqlRole>,
}

/// A worker's report: what it did, and the server generation it did it against. Reports
/// of an earlier generation describe a server that is gone, and are not applied.
struct Report {
    generation: u64,
    result: JobResult,
}

/// Results of worker tasks.
enum JobResult {
    /// The databases' tmpfs filled: every database's size, to name the biggest.
    SpaceFilled {
        sizes: Result<Vec<(String, i64)>, String>,
    },
    Built {
        template: TemplateName,
        /// The sources' stamp, taken before they were hashed.
        stamp: SourceStamp,
        outcome: Result<Built, SqlError>,
    },
    /// A clone made, or a reused one recycled: `Ok` carries its role's new password and
    /// what it is now (when released clones are proven unchanged).
    Cloned {
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        outcome: Result<Made, SqlError>,
        /// For a released clone put to the proof: whether it held.
        proven: Option<bool>,
    },
    Dropped {
        db: DbName,
        outcome: Result<(), String>,
    },
    /// A lease's own connection limit was set (or not); the lease can go out.
    LimitSet {
        lease_id: LeaseId,
        outcome: Result<(), String>,
    },
    ServerUp {
        target: Box<Target>,
        outcome: Box<Result<Up, StartError>>,
    },
    /// A client-built template's empty database made: `Ok` carries its role's password.
    Opened {
        template: TemplateName,
        db: DbName,
        outcome: Result<String, String>,
    },
    /// A client-built template finalized.
    Finalized {
        template: TemplateName,
        db: DbName,
        outcome: Result<Built, String>,
    },
    /// Sessions counted on a test database a client gives back.
    SessionsCounted {
        give_back: Box<client::GiveBack>,
        outcome: Result<i64, TemplateOpError>,
    },
    /// A second look at a server whose monitor connection closed: `Ok` is a new monitor.
    Probed {
        outcome: Result<tokio_postgres::Client, String>,
    },
    /// The sources of `template` were checked (off the actor: it is file I/O) for lease
    /// requests that wait on the answer.
    SourcesChecked {
        template: TemplateName,
        changed: bool,
        /// The stamp seen, to remember when the sources were touched but not changed.
        stamp: SourceStamp,
        /// The fingerprint of the version the check compared against.
        fingerprint: String,
    },
    /// The sources of a failed template were looked at ([`FailedSources`]).
    FailedSourcesChecked {
        template: TemplateName,
        /// Their stamp moved since the failure.
        changed: bool,
    },
}

/// Starts postgres (or attaches to the external server), opens a session, and spawns the
/// actor. Returns once the server accepts connections; templates build in the background.
pub async fn start(
    config: PoolConfig,
) -> Result<(PoolHandle, tokio::task::JoinHandle<()>), StartError> {
    let mut templates = config.templates.clone();
    if !templates
        .iter()
        .any(|t| t.name == TemplateName::default_name())
    {
        templates.insert(
            0,
            TemplateConfig {
                name: TemplateName::default_name(),
                source: TemplateSource::Empty,
                postgres_version: None,
            },
        );
    }
    let inputs = UpInputs {
        templates: templates.clone(),
        pool_size: config.limits.clone_concurrency.max(1) * 2 + 2,
        clone_strategy: config.clone_strategy,
        lease_auth: config.lease_auth,
        lease_superuser: config.lease_superuser,
        lease_connections: config.limits.lease_connections,
        build_timeout: config.limits.build_timeout,
        reuse_unchanged: config.limits.reuse_unchanged,
        child_user: ChildUser::resolve(config.child_user.as_deref())?,
        integresql_role: config.integresql_role.clone(),
    };
    let mut limits = config.limits;
    let target = match &config.server {
        ServerConfig::Embedded(embedded) => {
            // The embedded server's pg_hba rule for lease roles follows the pool's choice.
            let mut embedded = (**embedded).clone();
            embedded.lease_auth = config.lease_auth;
            if let Some(role) = &config.integresql_role {
                // Its own rule, and room for its connections (the session's budget for
                // lease holders leaves them out).
                embedded.integresql_role = Some(role.name.clone());
                embedded.max_connections = embedded
                    .max_connections
                    .saturating_add(config.limits.lease_connections);
            }
            let prepared = Embedded::prepare(&embedded, &templates).await?;
            if limits.max_bytes.is_none() {
                limits.max_bytes = match prepared.databases_space() {
                    Some(bytes) => Some(bytes / 4 * 3),
                    None => default_byte_budget(prepared.instance_dir()),
                };
            }
            Target::Embedded(prepared)
        }
        ServerConfig::External(external) => {
            if limits.reuse_unchanged {
                // The proof reads the database's files, which are not ours to read there.
                tracing::info!("reuse of unchanged databases is off on an external server: released databases are dropped and made again");
                limits.reuse_unchanged = false;
            }
            Target::External(ExternalTarget::parse(external)?)
        }
    };
    let (target, outcome) = bring_up(target, inputs.clone()).await;
    let up = match outcome {
        Ok(up) => up,
        Err(error) => {
            if let Target::Embedded(embedded) = target {
                tracing::error!(instance_dir = %embedded.instance_dir().display(), "start-up failed; instance directory kept for inspection");
            }
            return Err(error);
        }
    };
    let instance = hex::encode(rand::random::<[u8; 3]>());
    tracing::info!(max_bytes = ?limits.max_bytes, "byte budget for templates and clones");
    let state = PoolState::new(limits, instance.clone(), &templates, config.prebuild)
        .with_verified_builds(config.verify_templates);
    let (commands_tx, commands) = mpsc::channel(COMMAND_CAPACITY);
    let (jobs_tx, jobs) = mpsc::unbounded_channel();
    let mut actor = Actor {
        state,
        initializers: HashMap::new(),
        finalizers: HashMap::new(),
        unlocks: HashMap::new(),
        inputs,
        external: matches!(config.server, ServerConfig::External(_)),
        server_outlives_us: match &config.server {
            ServerConfig::External(_) => true,
            ServerConfig::Embedded(embedded) => embedded.keep_data && embedded.data_dir.is_some(),
        },
        target: Some(target),
        running: None,
        session: None,
        monitor: None,
        waiters: HashMap::new(),
        next_waiter: 1,
        store: None,
        failed_sources_at: Instant::now(),
        jobs_tx,
        tracker: TaskTracker::new(),
    };
    tracing::info!(instance = %instance, "pool started");
    // Before the first builds: a template whose sources are not there fails now, with the
    // reason, instead of at its first lease (and `/readyz` says so).
    for (template, message, stamp) in unusable_sources(&actor.inputs.child_user, &templates).await {
        tracing::warn!(template = %template, error = %message, "template sources are missing or unreadable; it cannot be built until they are fixed");
        actor.state.sources_unusable(&template, message, stamp);
    }
    actor.server_came_up(up);
    let join = tokio::spawn(actor.run(commands, jobs));
    Ok((PoolHandle::new(commands_tx), join))
}

/// The configured templates whose sources fail the check a registered source passes
/// (`template::check_source`, with the child user's rights), with why and their stamp.
async fn unusable_sources(
    user: &ChildUser,
    templates: &[TemplateConfig],
) -> Vec<(TemplateName, String, SourceStamp)> {
    let mut unusable = Vec::new();
    for config in templates {
        if matches!(
            config.source,
            TemplateSource::Empty | TemplateSource::Client
        ) {
            continue;
        }
        let source = config.source.clone();
        let checked = user
            .read(move || (template::check_source(&source), template::stamp(&source)))
            .await;
        match checked {
            Ok((Ok(()), _)) => {}
            Ok((Err(message), stamp)) => {
                unusable.push((config.name.clone(), user.explain(message), stamp));
            }
            // The check could not run at all: the build will say what is wrong.
            Err(message) => {
                tracing::warn!(template = %config.name, error = %message, "could not check the template's sources");
            }
        }
    }
    unusable
}

/// Three quarters of the filesystem holding the instance directory: the rest is for the
/// cluster itself (~40 MB), its WAL and what tests write into leased databases.
fn default_byte_budget(instance_dir: &std::path::Path) -> Option<u64> {
    let stats = nix::sys::statvfs::statvfs(instance_dir).ok()?;
    let total = stats.blocks().saturating_mul(stats.fragment_size());
    Some(total / 4 * 3)
}

/// Starts postgres (embedded) or connects (external), then opens a session.
async fn bring_up(target: Target, inputs: UpInputs) -> (Target, Result<Up, StartError>) {
    match target {
        Target::Embedded(mut embedded) => {
            let outcome = async {
                let running = embedded.start().await?;
                let params = SessionParams {
                    admin_config: running.admin_config(),
                    lease_host: running.host.clone(),
                    lease_port: running.port,
                    pool_size: inputs.pool_size,
                    clone_strategy: inputs.clone_strategy,
                    templates: inputs.templates.clone(),
                    external: false,
                    lease_auth: inputs.lease_auth,
                    lease_superuser: inputs.lease_superuser,
                    lease_connections: inputs.lease_connections,
                    build_timeout: inputs.build_timeout,
                    admin_timeout: crate::session::DEFAULT_ADMIN_TIMEOUT,
                    proof_dir: inputs.reuse_unchanged.then(|| running.data_dir.clone()),
                    child_user: inputs.child_user.clone(),
                    integresql_role: inputs.integresql_role.clone(),
                };
                match open_session(params).await {
                    Ok((session, monitor)) => Ok(Up {
                        running: Some(running),
                        session,
                        monitor,
                    }),
                    Err(error) => {
                        running.shutdown(POSTGRES_STOP_TIMEOUT).await;
                        Err(error)
                    }
                }
            }
            .await;
            (Target::Embedded(embedded), outcome)
        }
        Target::External(external) => {
            let params = SessionParams {
                admin_config: external.admin_config.clone(),
                lease_host: external.lease_host.clone(),
                lease_port: external.lease_port,
                pool_size: inputs.pool_size,
                clone_strategy: inputs.clone_strategy,
                templates: inputs.templates.clone(),
                external: true,
                lease_auth: inputs.lease_auth,
                lease_superuser: inputs.lease_superuser,
                lease_connections: inputs.lease_connections,
                build_timeout: inputs.build_timeout,
                admin_timeout: crate::session::DEFAULT_ADMIN_TIMEOUT,
                proof_dir: None,
                child_user: inputs.child_user.clone(),
                integresql_role: inputs.integresql_role.clone(),
            };
            let outcome = open_session(params).await.map(|(session, monitor)| Up {
                running: None,
                session,
                monitor,
            });
            (Target::External(external), outcome)
        }
    }
}

async fn open_session(
    params: SessionParams,
) -> Result<(Session, tokio_postgres::Client), StartError> {
    let target = describe_target(&params.admin_config);
    let started = Instant::now();
    let monitor = loop {
        match connect_monitor(&params.admin_config).await {
            Ok(monitor) => break monitor,
            // A server starting up, shutting down or recovering from a crash, or one whose
            // connection slots are taken for a moment, is waited for; anything else fails.
            Err(error) if is_transient(&error) && started.elapsed() < TRANSIENT_CONNECT_WAIT => {
                tracing::warn!(target = %target, error = %pg_message(&error), "postgres does not take connections yet; retrying");
                tokio::time::sleep(TRANSIENT_CONNECT_RETRY).await;
            }
            Err(source) => return Err(StartError::Connect { target, source }),
        }
    };
    let session = Session::open(params).await?;
    Ok((session, monitor))
}

/// How long a server that refuses connections for a moment ([`is_transient`]) is waited for.
const TRANSIENT_CONNECT_WAIT: Duration = Duration::from_secs(30);
/// Pause between those attempts.
const TRANSIENT_CONNECT_RETRY: Duration = Duration::from_millis(500);

/// Errors that say "not now" rather than "never": the server is starting, stopping or in
/// crash recovery (57P03), or all its connection slots are taken (53300).
fn is_transient(error: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        error.code(),
        Some(&SqlState::CANNOT_CONNECT_NOW | &SqlState::TOO_MANY_CONNECTIONS)
    )
}

/// A connection kept open only to notice when the server goes away (the actor polls
/// `is_closed`). It opts out of idle timeouts the server may set for everyone.
async fn connect_monitor(
    admin_config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = admin_config.clone();
    config.application_name("pglease monitor");
    let (monitor, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        // Ends when the server goes; the actor sees `is_closed`.
        let _ = connection.await;
    });
    // Set after connecting, not as startup options, which servers before 14 (without
    // idle_session_timeout) would refuse.
    monitor
        .batch_execute(
            "SELECT pg_catalog.set_config(name, '0', false) FROM pg_catalog.pg_settings \
             WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')",
        )
        .await?;
    Ok(monitor)
}

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
    session: Option<Session>,
    monitor: Option<tokio_postgres::Client>,
    waiters: HashMap<WaiterId, LeaseReply>,
    next_waiter: WaiterId,
    /// When the sources of failed templates are looked at next (a pace for file I/O).
    failed_sources_at: Instant,
    /// The copy-on-write store whose usage the byte budget is judged by, while the server
    /// runs with `file_copy_method = clone` there (`measure_store`), and what its file
    /// system held before the cluster was put there (its own metadata, and on an
    /// operator's `--data-dir` whatever else lives there), which does not count.
    store: Option<(std::path::PathBuf, u64)>,
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
                reply,
            } => {
                let answer = match self.state.register(name.clone(), source, now) {
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
            Command::Rebuild { template, reply } => {
                let answer = match self.state.request_rebuild(&template, now) {
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

    fn handle_job(&mut self, report: Report) {
        let now = Instant::now();
        let Report { generation, result } = report;
        if let JobResult::FailedSourcesChecked { template, changed } = result {
            self.failed_sources_checked(template, changed);
            self.check_invariants();
            return;
        }
        if generation != self.state.generation() {
            self.stale_report(result);
            return;
        }
        match result {
            JobResult::ServerUp { target, outcome } => {
                self.target = Some(*target);
                if self.state.is_stopping() {
                    return;
                }
                match *outcome {
                    Ok(up) => {
                        tracing::info!(
                            restarts = self.state.server_history().0,
                            "postgres is back; rebuilding templates and pool"
                        );
                        self.server_came_up(up);
                    }
                    Err(error) => {
                        tracing::error!(error = %error, retry_in_secs = RESTART_BACKOFF.as_secs(), "could not bring postgres back");
                        self.state
                            .server_start_failed(error.to_string(), now + RESTART_BACKOFF);
                    }
                }
            }
            JobResult::Built {
                template,
                stamp,
                outcome,
            } => {
                match &outcome {
                    Ok(built) => self.suggest_store(&template, built.size_bytes),
                    Err(message) => {
                        tracing::warn!(template = %template, error = %message, "template build failed");
                    }
                }
                let actions = self.state.build_finished(&template, stamp, outcome, now);
                self.apply(actions);
            }
            JobResult::Cloned {
                template,
                template_db,
                clone,
                outcome,
                proven,
            } => {
                if let Some(unchanged) = proven {
                    match &outcome {
                        Err(why) => {
                            tracing::debug!(database = %clone, %why, "released changed: dropped and made again")
                        }
                        Ok(_) => {
                            tracing::debug!(database = %clone, "released unchanged: back in the ready queue without a new clone")
                        }
                    }
                    self.state.count_proof(unchanged);
                }
                let outcome = match outcome {
                    Ok(made) => Ok(made),
                    // Changed: no failure, and nothing to warn about.
                    Err(message) if proven == Some(false) => Err(message),
                    Err(message) => {
                        if self.state.is_current(&template, &template_db) {
                            tracing::warn!(template = %template, database = %clone, error = %message, "clone failed");
                        } else {
                            // Its template version was replaced or discarded meanwhile (and
                            // perhaps dropped under it): expected, and dropped anyway.
                            tracing::debug!(template = %template, database = %clone, error = %message, "clone of a replaced version failed");
                        }
                        Err(message)
                    }
                };
                self.recycled(&clone);
                let actions =
                    self.state
                        .clone_finished(&template, &template_db, clone, outcome, now);
                self.apply(actions);
            }
            JobResult::Dropped { db, outcome } => {
                if let Err(message) = &outcome {
                    tracing::warn!(database = %db, error = %message, "drop failed; it is retried");
                }
                let actions = self.state.drop_finished(&db, outcome, now);
                self.apply(actions);
            }
            JobResult::LimitSet { lease_id, outcome } => {
                if let Err(message) = &outcome {
                    tracing::warn!(lease_id = %lease_id, error = %message, "could not set a lease's connection limit");
                }
                let actions = self.state.limit_set(&lease_id, outcome, now);
                self.apply(actions);
            }
            JobResult::Opened {
                template,
                db,
                outcome,
            } => self.opened(template, db, outcome),
            JobResult::Finalized {
                template,
                db,
                outcome,
            } => self.finalized(template, db, outcome),
            JobResult::SessionsCounted { give_back, outcome } => {
                self.sessions_counted(*give_back, outcome);
            }
            JobResult::Probed { outcome } => self.probed(outcome),
            JobResult::SpaceFilled { sizes } => self.state.space_filled(sizes, SystemTime::now()),
            // A look of the lost server's time is not applied: the state ended it then
            // (its waiters were failed), and a new look may be under way.
            JobResult::SourcesChecked {
                template,
                changed,
                stamp,
                fingerprint,
            } => self.sources_checked(template, changed, stamp, fingerprint),
            // Handled above, whatever its generation.
            JobResult::FailedSourcesChecked { .. } => {}
        }
        self.check_invariants();
    }

    /// A report of a server generation that is gone: its work went with the server, but
    /// what it holds (the target, callers waiting for an answer) is handed back.
    fn stale_report(&mut self, result: JobResult) {
        match result {
            JobResult::ServerUp { target, .. } => self.target = Some(*target),
            JobResult::SessionsCounted { give_back, .. } => self.sessions_counted(
                *give_back,
                Err(TemplateOpError::PostgresDown(NOT_RUNNING.into())),
            ),
            // Callers waiting on client-built templates and grants were told when the
            // server went (`PoolState::server_lost`, `fail_client_work`), which also set
            // the probe back to idle for the new generation.
            JobResult::Probed { .. }
            | JobResult::SpaceFilled { .. }
            | JobResult::Built { .. }
            | JobResult::Cloned { .. }
            | JobResult::Dropped { .. }
            | JobResult::LimitSet { .. }
            | JobResult::Opened { .. }
            | JobResult::Finalized { .. }
            | JobResult::SourcesChecked { .. }
            | JobResult::FailedSourcesChecked { .. } => {}
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

    /// Reads how much the copy-on-write store holds, for the byte budget (a `statvfs` of a
    /// file system in RAM: no I/O waits on it).
    fn measure_store(&mut self) {
        let Some((store, base)) = &self.store else {
            return;
        };
        match crate::postgres::used_bytes(store) {
            Ok(used) => self.state.store_usage(Some(used.saturating_sub(*base))),
            Err(error) => {
                tracing::debug!(store = %store.display(), %error, "cannot measure the copy-on-write store");
            }
        }
    }

    fn server_came_up(&mut self, mut up: Up) {
        let clones_share = up
            .session
            .settings
            .iter()
            .any(|(name, value)| name == "file_copy_method" && value == "clone");
        // The base is what the store held before the cluster was put there, so that the
        // templates of a snapshot (or a kept cluster) count. Without one (its statvfs
        // failed) the budget stays by logical sizes, which only overcounts.
        self.store = up
            .running
            .as_ref()
            .filter(|_| clones_share && !self.external)
            .and_then(|running| {
                Some((
                    running.data_dir.parent()?.to_path_buf(),
                    running.store_base?,
                ))
            });
        if let Some((store, _)) = &self.store {
            tracing::info!(store = %store.display(), "clones share their template's blocks: the byte budget counts what the store holds");
        }
        self.measure_store();
        self.state.space_at(
            up.running
                .as_ref()
                .and_then(|running| running.databases_space.clone()),
        );
        self.watch_space();
        let adoptable = std::mem::take(&mut up.session.adoptable);
        let client_templates = std::mem::take(&mut up.session.client_templates);
        self.session = Some(up.session);
        self.running = up.running;
        self.monitor = Some(up.monitor);
        let budget = self.session.as_ref().map_or(0, |s| s.connection_budget);
        tracing::info!(
            connection_budget = budget,
            "connections available to lease holders"
        );
        let mut actions = self.state.server_up(budget);
        // Client-built templates the server kept come back as built, after their ready
        // clones are queued for adoption.
        let restored: Vec<_> = client_templates
            .into_iter()
            .filter(|(template, db, _)| self.state.restore_client_built(template, db))
            .collect();
        for (template, fingerprint, clone) in adoptable {
            self.state.adopt(&template, fingerprint, clone);
        }
        let now = Instant::now();
        for (template, db, size_bytes) in restored {
            let built = Built {
                fingerprint: template.to_string(),
                db,
                elapsed: Duration::ZERO,
                size_bytes,
                built_at: SystemTime::now(),
            };
            let db = built.db.clone();
            actions.extend(
                self.state
                    .template_finalized(&template, db, Ok(built), now)
                    .1,
            );
        }
        self.apply(actions);
    }

    /// Notices a dead postmaster or a lost connection, and retries a failed restart.
    fn check_server(&mut self) {
        if self.state.is_stopping() {
            return;
        }
        let exited = self
            .running
            .as_mut()
            .and_then(|running| running.poll_exit());
        if let Some(status) = exited {
            let tail = self
                .running
                .as_ref()
                .map(|r| r.log_tail(10))
                .unwrap_or_default();
            tracing::error!(%status, log_tail = %tail, "postgres exited unexpectedly; restarting it");
            self.server_lost(format!("postgres exited unexpectedly ({status})"));
        } else if let Some(error) = self.state.probe_failure() {
            let reason = format!("the connection to postgres was lost ({error})");
            tracing::error!(%error, "lost the connection to postgres; reconnecting");
            self.server_lost(reason);
        } else if self.monitor.as_ref().is_some_and(|m| m.is_closed()) && self.state.begin_probe() {
            // A closed connection alone proves little: an external server's
            // idle_session_timeout or a proxy may end it while postgres runs on. Losing the
            // server drops every lease, so look once more before declaring it.
            tracing::warn!("the monitor connection to postgres closed; checking the server");
            self.spawn_job(move |session| async move {
                let outcome = match session {
                    Some(session) => {
                        match tokio::time::timeout(
                            PROBE_TIMEOUT,
                            connect_monitor(&session.admin_config),
                        )
                        .await
                        {
                            Ok(connected) => connected.map_err(|e| crate::session::pg_message(&e)),
                            Err(_) => Err("the server did not answer".into()),
                        }
                    }
                    None => Err(NOT_RUNNING.into()),
                };
                JobResult::Probed { outcome }
            });
        } else if self.state.restart_due(Instant::now()) {
            self.spawn_bring_up();
        }
    }

    /// The second look at the server ended: a new monitor connection, or the server is lost.
    fn probed(&mut self, outcome: Result<tokio_postgres::Client, String>) {
        match outcome {
            Ok(monitor) => {
                tracing::info!("postgres still answers; watching it on a new connection");
                self.state.probe_ended(Ok(()));
                self.monitor = Some(monitor);
            }
            Err(error) => {
                // A killed postmaster closes its sockets (so its sessions end and new
                // connections are refused) a moment before it can be reaped. The next look
                // tells that exit, the cause, from a postmaster that is there but does not
                // answer.
                self.state.probe_ended(Err(error));
                if self.running.is_none() {
                    self.check_server();
                }
            }
        }
    }

    fn server_lost(&mut self, reason: String) {
        self.store = None;
        let actions = self.state.server_lost(&reason);
        self.apply(actions);
        self.fail_client_work(&reason);
        self.session = None;
        self.monitor = None;
        if let Some(running) = self.running.take() {
            // Already exited in the usual case; if it lingers, stop it before restarting.
            self.tracker.spawn(running.shutdown(POSTGRES_STOP_TIMEOUT));
        }
        self.spawn_bring_up();
    }

    fn spawn_bring_up(&mut self) {
        let Some(target) = self.target.take() else {
            return;
        };
        // Templates registered at run time survive the sweep of a reconnected server too.
        self.inputs.templates = self.state.templates();
        let generation = self.state.generation();
        let inputs = self.inputs.clone();
        let jobs = self.jobs_tx.clone();
        self.tracker.spawn(async move {
            let (target, outcome) = bring_up(target, inputs).await;
            let result = JobResult::ServerUp {
                target: Box::new(target),
                outcome: Box::new(outcome),
            };
            let _ = jobs.send(Report { generation, result });
        });
    }

    fn drop_cancelled_waiters(&mut self) {
        let cancelled: Vec<WaiterId> = self
            .waiters
            .iter()
            .filter(|(_, reply)| reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for waiter in cancelled {
            self.waiters.remove(&waiter);
            self.state.cancel_waiter(waiter);
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
                } => self.spawn_clone(template, template_db, clone),
                Action::Recycle {
                    template,
                    template_db,
                    clone,
                    verify,
                    proof,
                } => self.spawn_recycle(template, template_db, clone, verify, proof),
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

    /// Sets a granted lease's own connection limit in a worker; the grant goes out when it
    /// is reported ([`PoolState::limit_set`]).
    fn spawn_set_limit(&mut self, lease_id: LeaseId, database: DbName, connections: u32) {
        self.spawn_job(move |session| async move {
            let outcome = match session {
                Some(session) => session.set_connection_limit(&database, connections).await,
                None => Err(NOT_RUNNING.into()),
            };
            JobResult::LimitSet { lease_id, outcome }
        });
    }

    /// Sends a granted lease to its waiter; if nobody is listening any more, returns the
    /// actions that put the database back.
    fn send_lease(&mut self, waiter: WaiterId, grant: Grant) -> Option<Vec<Action>> {
        let lease_id = grant.lease_id.clone();
        let (Some(reply), Some(session)) = (self.waiters.remove(&waiter), self.session.as_ref())
        else {
            return Some(self.state.grant_undelivered(&lease_id, Instant::now()));
        };
        let span =
            tracing::info_span!("lease", lease_id = %lease_id, fingerprint = %grant.fingerprint);
        let _entered = span.enter();
        let lease = Lease {
            id: grant.lease_id,
            template: grant.template,
            fingerprint: grant.fingerprint,
            connect: ConnectInfo {
                host: session.lease_host.clone(),
                port: session.lease_port,
                // Each clone's role is named like its database.
                user: grant.database.as_str().to_owned(),
                password: grant.password,
                database: grant.database,
                ssl: session.ssl(),
            },
            expires_at: SystemTime::now() + grant.ttl,
            number: grant.number,
        };
        let (template, database) = (lease.template.clone(), lease.connect.database.clone());
        match reply.send(Ok(lease)) {
            Ok(()) => {
                tracing::info!(template = %template, database = %database, ttl_secs = grant.ttl.as_secs(), label = grant.label.as_deref().unwrap_or(""), "lease granted");
                None
            }
            Err(_) => {
                tracing::info!(database = %database, "client went away before its lease was delivered; database returned to the pool");
                Some(self.state.grant_undelivered(&lease_id, Instant::now()))
            }
        }
    }

    /// Runs `work` on a worker task with the session of the current server generation
    /// (None while postgres is down) and reports the result it builds back to the actor,
    /// tagged with that generation.
    fn spawn_job<F, Fut>(&mut self, work: F)
    where
        F: FnOnce(Option<Session>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = JobResult> + Send + 'static,
    {
        let (generation, jobs, session) = (
            self.state.generation(),
            self.jobs_tx.clone(),
            self.session.clone(),
        );
        self.tracker.spawn(async move {
            let result = work(session).await;
            let _ = jobs.send(Report { generation, result });
        });
    }

    fn spawn_build(
        &mut self,
        template: TemplateName,
        source: TemplateSource,
        reuse_existing: bool,
    ) {
        tracing::info!(template = %template, ?source, "building template");
        let user = self.inputs.child_user.clone();
        self.spawn_job(move |session| async move {
            let stamp_source = source.clone();
            let stamp = user
                .read(move || template::stamp(&stamp_source))
                .await
                .unwrap_or_default();
            let outcome = match session {
                Some(session) => {
                    template::build(&session, &template, &source, reuse_existing).await
                }
                None => Err(not_running()),
            };
            JobResult::Built {
                template,
                stamp,
                outcome,
            }
        });
    }

    /// Says so when a big template was built where every clone copies it: the store of
    /// `--storage cow` would share its blocks, and `auto` takes it at a start that knows
    /// the template's size (from its sources or a snapshot).
    fn suggest_store(&self, template: &TemplateName, size_bytes: i64) {
        let big = u64::try_from(size_bytes)
            .is_ok_and(|bytes| bytes >= crate::postgres::AUTO_MIN_TEMPLATE_BYTES);
        if big && self.store.is_none() && !self.external {
            tracing::info!(
                template = %template,
                size_mb = size_bytes >> 20,
                "every clone of this template copies it; on PostgreSQL 18, --storage cow \
                 would share its blocks (--storage auto does at a start that knows its size: \
                 from its sources or a snapshot; docs/cow-storage.md)"
            );
        }
    }

    /// A lease request. A template built from files has its sources checked first — a
    /// stat call per file, the hash only when a stamp moved — so that an edit followed at
    /// once by a lease is seen. The check is file I/O and runs in a worker, not on the
    /// actor (which would stall every other lease and release); requests for the same
    /// template that arrive meanwhile wait for the same check.
    fn lease(&mut self, request: LeaseRequest, reply: LeaseReply) {
        if let (Some(asked), Some(session)) = (request.postgres_version, &self.session) {
            let minor = pglease_binaries::parse_version_number(&session.version)
                .and_then(|(_, minor)| minor);
            if !asked.matches(session.pg_major, minor) {
                let _ = reply.send(Err(LeaseError::VersionNotServed {
                    template: request.template.clone(),
                    asked: asked.to_string(),
                    serving: session.version.clone(),
                }));
                return;
            }
        }
        let template = request.template.clone();
        if self.state.is_checking_sources(&template) {
            // A look is under way: the request waits for it in the state, as a waiter.
            self.request_lease(request, reply);
            return;
        }
        let watched = self.state.watch(&template);
        let source = self
            .state
            .source_of(&template)
            .filter(|s| !matches!(s, TemplateSource::Empty | TemplateSource::Client));
        let major = self.session.as_ref().map(|s| s.pg_major);
        let (Some((stamp, fingerprint)), Some(source), Some(major)) = (watched, source, major)
        else {
            self.request_lease(request, reply);
            return;
        };
        // The state holds the request (it counts against --max-waiting and shows in
        // /status) and serves it once the look has ended.
        let started = self.state.begin_sources_check(&template);
        self.request_lease(request, reply);
        if !started {
            return;
        }
        let user = self.inputs.child_user.clone();
        self.spawn_job(move |_| async move {
            let seen = fingerprint.clone();
            // With the child user's rights: the sources may be a caller's.
            let checked = user
                .read(move || {
                    let now = template::stamp(&source);
                    if now == stamp {
                        return (false, now);
                    }
                    // Touched but unchanged keeps the version (and the new stamp).
                    let changed = template::fingerprint(&source, major).map_or(true, |f| f != seen);
                    (changed, now)
                })
                .await;
            // A check that could not run says nothing changed; the next lease checks again.
            let (changed, stamp) = checked.unwrap_or_default();
            JobResult::SourcesChecked {
                template,
                changed,
                stamp,
                fingerprint,
            }
        });
    }

    /// The sources of `template` were checked: a change builds a new version, then the
    /// requests that waited for the check are handled.
    fn sources_checked(
        &mut self,
        template: TemplateName,
        changed: bool,
        stamp: SourceStamp,
        fingerprint: String,
    ) {
        let actions =
            self.state
                .sources_checked(&template, changed, stamp, &fingerprint, Instant::now());
        self.apply(actions);
    }

    /// Looks (off the actor, at most every [`FAILED_SOURCES_EVERY`]) whether the sources
    /// of failed configured templates changed since they failed.
    fn look_at_failed_sources(&mut self) {
        let now = Instant::now();
        if now < self.failed_sources_at {
            return;
        }
        self.failed_sources_at = now + FAILED_SOURCES_EVERY;
        for (template, source, stamp) in self.state.look_at_failed_sources() {
            let user = self.inputs.child_user.clone();
            self.spawn_job(move |_| async move {
                // With the child user's rights: the sources may be a caller's.
                let changed = user
                    .read(move || template::stamp(&source) != stamp)
                    .await
                    .unwrap_or(false);
                JobResult::FailedSourcesChecked { template, changed }
            });
        }
    }

    /// The sources of a failed template were looked at: when they changed, it is built
    /// again (the fix, or the next mistake, shows without waiting for a lease).
    fn failed_sources_checked(&mut self, template: TemplateName, changed: bool) {
        let actions = self
            .state
            .failed_sources_looked(&template, changed, Instant::now());
        self.apply(actions);
    }

    /// Parks the reply and asks the state for a lease.
    fn request_lease(&mut self, request: LeaseRequest, reply: LeaseReply) {
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.insert(waiter, reply);
        let actions = self
            .state
            .request_lease(waiter, LeaseId::random(), &request, Instant::now());
        self.apply(actions);
    }

    /// Whether a client built `template` (IntegreSQL API). Their clones get postgres'
    /// standard SCRAM iteration count: those clients' Go drivers refuse fewer.
    fn is_client_built(&self, template: &TemplateName) -> bool {
        self.state
            .source_of(template)
            .is_some_and(|source| source.is_client_built())
    }

    fn spawn_clone(&mut self, template: TemplateName, template_db: DbName, clone: DbName) {
        let standard_scram = self.is_client_built(&template);
        self.spawn_job(move |session| async move {
            let started = std::time::Instant::now();
            let Some(session) = session else {
                return JobResult::Cloned {
                    template,
                    template_db,
                    clone,
                    outcome: Err(not_running()),
                    proven: None,
                };
            };
            let outcome = match session
                .clone_database(&template_db, &clone, standard_scram)
                .await
            {
                Ok(password) => Ok(Made {
                    password,
                    stamp: stamp_of(&session, &clone).await,
                }),
                Err(error) => Err(error),
            };
            tracing::debug!(database = %clone, elapsed_ms = started.elapsed().as_millis() as u64, ok = outcome.is_ok(), "clone finished");
            JobResult::Cloned {
                template,
                template_db,
                clone,
                outcome,
                proven: None,
            }
        });
    }

    /// Readies a clone for its next holder: after a `reuse` release or an adoption, or —
    /// `verify` — after a release the server must prove changed nothing, with the stamp
    /// taken when it was made ready (none: unsure, so changed).
    fn spawn_recycle(
        &mut self,
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        verify: bool,
        proof: Option<Stamp>,
    ) {
        let standard_scram = self.is_client_built(&template);
        self.spawn_job(move |session| async move {
            let outcome = match (session.as_ref(), verify, proof.as_ref()) {
                (None, _, _) => Err(NotReused::Failed(NOT_RUNNING.into())),
                (Some(_), true, None) => Err(NotReused::Changed(
                    "nothing recorded what it was when handed out".into(),
                )),
                (Some(session), _, proof) => session.recycle(&clone, standard_scram, proof).await,
            };
            let stamp = match (&outcome, session.as_ref()) {
                // Proven unchanged: what it was is what it is.
                (Ok(_), Some(_)) if verify => proof,
                (Ok(_), Some(session)) => stamp_of(session, &clone).await,
                _ => None,
            };
            let (outcome, proven) = match outcome {
                Ok(password) => (Ok(Made { password, stamp }), verify.then_some(true)),
                Err(NotReused::Changed(why)) => (Err(SqlError::other(why)), Some(false)),
                Err(NotReused::Failed(message)) => (Err(SqlError::other(message)), None),
            };
            JobResult::Cloned {
                template,
                template_db,
                clone,
                outcome,
                proven,
            }
        });
    }

    fn spawn_drop(&mut self, db: DbName) {
        self.spawn_job(move |session| async move {
            let started = std::time::Instant::now();
            let outcome = match session {
                Some(session) => session.drop_database(&db).await,
                None => Err(NOT_RUNNING.into()),
            };
            tracing::debug!(database = %db, elapsed_ms = started.elapsed().as_millis() as u64, "drop finished");
            JobResult::Dropped {
                db,
                outcome,
            }
        });
    }

    fn status(&self) -> StatusReport {
        let session = self.session.as_ref();
        let state = if self.state.is_stopping() {
            "stopping"
        } else if self.state.server_is_up() {
            "running"
        } else {
            "restarting"
        };
        let now = Instant::now();
        let wall_now = SystemTime::now();
        StatusReport {
            postgres: PostgresStatus {
                storage: self.running.as_ref().map(|r| r.storage.clone()),
                state,
                external: self.external,
                version: session.map(|s| s.version.clone()),
                pid: self.running.as_ref().map(|r| r.pid),
                data_dir: self.running.as_ref().map(|r| r.data_dir.clone()),
                host: session.map(|s| s.lease_host.clone()),
                port: session.map(|s| s.lease_port),
                settings: session.map(|s| s.settings.clone()).unwrap_or_default(),
                restarts: self.state.server_history().0,
                last_error: self.state.server_history().1.map(str::to_owned),
                admin_timeouts: session.map_or(0, Session::admin_timeouts),
                databases_space: self.state.space_status(),
            },
            templates: self
                .state
                .template_status()
                .into_iter()
                .map(|mut template| {
                    template.progress = session.and_then(|s| s.build_progress.get(&template.name));
                    template
                })
                .collect(),
            leases: self
                .state
                .lease_list()
                .into_iter()
                .map(|lease| LeaseSummary {
                    id: lease.id,
                    template: lease.template,
                    database: lease.database,
                    expires_at: wall_now + lease.expires_at.saturating_duration_since(now),
                    label: lease.label,
                })
                .collect(),
            drops: self.state.drop_status(),
            limits: self.state.limit_status(),
            servers: Vec::new(),
        }
    }

    /// The kept databases with what opens them (none while postgres is down: they went
    /// with it).
    fn kept(&self) -> Vec<KeptDatabase> {
        let Some(session) = self.session.as_ref() else {
            return Vec::new();
        };
        let (now, wall_now) = (Instant::now(), SystemTime::now());
        let wall = |at: Instant| {
            if at >= now {
                wall_now + (at - now)
            } else {
                wall_now - (now - at)
            }
        };
        self.state
            .kept_list()
            .into_iter()
            .map(|kept| KeptDatabase {
                id: kept.id,
                template: kept.template,
                connect: ConnectInfo {
                    host: session.lease_host.clone(),
                    port: session.lease_port,
                    user: kept.database.as_str().to_owned(),
                    password: kept.password,
                    database: kept.database,
                    ssl: session.ssl(),
                },
                label: kept.label,
                kept_at: wall(kept.kept_at),
                expires_at: wall(kept.until),
                size_bytes: kept.bytes,
            })
            .collect()
    }

    /// Waits (a bounded time) for the workers to finish, applying their reports, so that
    /// what they made is known before the server is left behind or saved.
    async fn drain_workers(&mut self, jobs: &mut mpsc::UnboundedReceiver<Report>) {
        let tracker = self.tracker.clone();
        let drain = async {
            loop {
                tokio::select! {
                    () = tracker.wait() => break,
                    Some(result) = jobs.recv() => self.handle_job(result),
                }
            }
        };
        if tokio::time::timeout(POSTGRES_STOP_TIMEOUT, drain)
            .await
            .is_err()
        {
            tracing::warn!("workers still busy at shutdown; the next start sweeps what they leave");
        }
        while let Ok(result) = jobs.try_recv() {
            self.handle_job(result);
        }
    }

    /// Each configured template's current fingerprint, a built one's taken from its watch
    /// while its sources' stamp has not moved (`template::current_versions`); in a worker,
    /// as file I/O never runs on the actor.
    async fn current_versions(&self, pg_major: u32) -> Result<Vec<(TemplateName, String)>, String> {
        let templates = self.inputs.templates.clone();
        let known = self.state.watches();
        self.inputs
            .child_user
            .read(move || template::current_versions(&templates, pg_major, &known))
            .await
    }

    /// The templates a snapshot written at this stop holds, with everything else dropped
    /// from the server; `None` when no snapshot is to be written (the one it started from
    /// is up to date, no template is built, or the server failed us).
    async fn ready_snapshot(&self, session: &mut Session) -> Option<Manifest> {
        let Some(Target::Embedded(embedded)) = &self.target else {
            return None;
        };
        let outcome = async {
            // Without them every template would look stale and be cleared.
            let current = self.current_versions(session.pg_major).await?;
            let templates = session.snapshot_templates(&current).await?;
            let Some(manifest) = embedded.snapshot_plan(templates) else {
                return Ok(None);
            };
            session.clear_for_snapshot(current).await?;
            Ok::<_, String>(Some(manifest))
        };
        outcome.await.unwrap_or_else(|message| {
            tracing::warn!(error = %message, "could not ready the cluster for a snapshot; none is written");
            None
        })
    }

    async fn shutdown(&mut self, jobs: &mut mpsc::UnboundedReceiver<Report>) {
        tracing::info!("pool stopping");
        let actions = self.state.stopping();
        self.apply(actions);
        self.tracker.close();
        // A server that outlives us (external, or a kept data directory): templates stay for
        // reuse, ready clones stay marked for adoption, the rest is dropped. Clones still
        // being made are waited for first, or they would outlive us unseen.
        if self.server_outlives_us {
            self.drain_workers(jobs).await;
            if let Some(session) = self.session.clone() {
                // Ready clones stay, marked, for the next run to adopt; the rest go.
                let (keep, lose) = self.state.clones_at_shutdown();
                for (template, fingerprint, db) in keep {
                    if let Err(message) = mark_ready(&session, &template, &fingerprint, &db).await {
                        tracing::warn!(database = %db, error = %message, "could not mark a ready clone; dropping it");
                        let _ = session.drop_database(&db).await;
                    }
                }
                for db in lose {
                    if let Err(message) = session.drop_database(&db).await {
                        tracing::warn!(database = %db, error = %message, "could not drop a clone at shutdown");
                    }
                }
            }
        }
        // --snapshot-dir: only the configured templates stay, for the snapshot written once
        // postgres has stopped.
        let mut snapshot = None;
        if let (Some(Target::Embedded(embedded)), Some(mut session)) =
            (&self.target, self.session.clone())
        {
            if embedded.saves_snapshots() {
                self.drain_workers(jobs).await;
                snapshot = self.ready_snapshot(&mut session).await;
            }
        }
        // A (re)start in flight holds the target; wait for it so its postgres is stopped too.
        while self.target.is_none() {
            match tokio::time::timeout(Duration::from_secs(60), jobs.recv()).await {
                Ok(Some(Report {
                    result: JobResult::ServerUp { target, outcome },
                    ..
                })) => {
                    self.target = Some(*target);
                    if let Ok(up) = *outcome {
                        self.running = up.running;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.session = None;
        self.monitor = None;
        let mut cluster = None;
        if let Some(running) = self.running.take() {
            cluster = Some(running.data_dir.clone());
            running.shutdown(POSTGRES_STOP_TIMEOUT).await;
        }
        // Workers fail fast once postgres is gone; give them a moment to finish.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.tracker.wait()).await;
        if let Some(Target::Embedded(embedded)) = self.target.take() {
            let _ = tokio::task::spawn_blocking(move || {
                // Only a cluster postgres stopped cleanly (no postmaster.pid left) is saved.
                let stopped = cluster.filter(|dir| !dir.join("postmaster.pid").exists());
                if let (Some(manifest), Some(cluster)) = (snapshot, stopped) {
                    embedded.save_snapshot(&cluster, &manifest);
                }
                embedded.cleanup();
            })
            .await;
        }
        tracing::info!("pool stopped");
    }
}

/// `clone`'s stamp, when the session proves released clones unchanged; a clone that cannot
/// be stamped is simply never proven (its release drops it).
async fn stamp_of(session: &Session, clone: &DbName) -> Option<Stamp> {
    if !session.proves_unchanged() {
        return None;
    }
    match session.stamp(clone).await {
        Ok(stamp) => Some(stamp),
        Err(error) => {
            tracing::debug!(database = %clone, %error, "cannot stamp a clone; its release will drop it");
            None
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
