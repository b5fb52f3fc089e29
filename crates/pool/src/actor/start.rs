//! Bringing the server up: the actor's start (the embedded server prepared, or the
//! external one's URL checked), each (re)start of postgres and the session opened on it,
//! and the monitor connection (opened by `backend.rs`) that tells when it goes away.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::backend::{connect_monitor, Backend, Monitor};
use super::{Actor, COMMAND_CAPACITY, POSTGRES_STOP_TIMEOUT};
use crate::child_user::ChildUser;
use crate::config::{
    CloneStrategy, ExternalConfig, IntegresqlRole, LeaseAuth, PoolConfig, PoolLimits, ServerConfig,
    TemplateConfig, TemplateSource,
};
use crate::error::StartError;
use crate::handle::PoolHandle;
use crate::names::{DbName, TemplateName};
use crate::postgres::{Embedded, RunningPostgres};
use crate::session::{describe_target, Session, SessionParams, Sweep};
use crate::sql_error::pg_message;
use crate::state::PoolState;
use crate::template::{self, SourceStamp};

/// Where the server comes from, held by the actor between (re)starts. One per pool: the
/// variants' difference in size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub(super) enum Target {
    Embedded(Embedded),
    External(ExternalTarget),
    /// A server in memory, for the actor's in-process tests (`actor/fake.rs`).
    #[cfg(test)]
    Fake(super::fake::FakeServer),
}

#[derive(Clone)]
pub(super) struct ExternalTarget {
    pub(super) admin_config: tokio_postgres::Config,
    pub(super) lease_host: String,
    pub(super) lease_port: u16,
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

/// What a successful (re)start hands the actor.
pub(super) struct Up {
    pub(super) running: Option<RunningPostgres>,
    pub(super) backend: Arc<dyn Backend>,
    /// A connection kept open only to notice when the server goes away.
    pub(super) monitor: Box<dyn Monitor>,
    /// Ready clones of an earlier run to adopt: (template, fingerprint, clone).
    pub(super) adoptable: Vec<(TemplateName, String, DbName)>,
    /// Complete client-built templates an earlier run left: (template, database, bytes).
    pub(super) client_templates: Vec<(TemplateName, DbName, i64)>,
    /// Someone else's databases under IntegreSQL's names (`Session::others_integresql_names`).
    pub(super) others_integresql_names: Vec<DbName>,
}

impl Up {
    fn new(
        running: Option<RunningPostgres>,
        mut session: Session,
        monitor: tokio_postgres::Client,
    ) -> Up {
        Up {
            running,
            adoptable: std::mem::take(&mut session.adoptable),
            client_templates: std::mem::take(&mut session.client_templates),
            others_integresql_names: std::mem::take(&mut session.others_integresql_names),
            backend: Arc::new(session),
            monitor: Box::new(monitor),
        }
    }
}

/// What bringing a server up needs besides the target.
#[derive(Clone)]
pub(super) struct UpInputs {
    pub(super) templates: Vec<TemplateConfig>,
    pub(super) pool_size: usize,
    pub(super) clone_strategy: CloneStrategy,
    pub(super) lease_auth: LeaseAuth,
    pub(super) lease_superuser: bool,
    pub(super) lease_connections: u32,
    pub(super) build_timeout: Duration,
    /// Released clones are proven unchanged (the embedded server's session reads its files).
    pub(super) reuse_unchanged: bool,
    /// Who runs the builds' programs and reads template sources.
    pub(super) child_user: ChildUser,
    /// The IntegreSQL clients' role, made at each start.
    pub(super) integresql_role: Option<IntegresqlRole>,
}

/// Starts postgres (or attaches to the external server), opens a session, and spawns the
/// actor. Returns once the server accepts connections; templates build in the background.
///
/// `server` is the first byte of every lease id the pool mints, which names its server
/// among several (`crate::Servers`; 0 for the primary).
pub async fn start(
    config: PoolConfig,
    server: u8,
) -> Result<(PoolHandle, tokio::task::JoinHandle<()>), StartError> {
    let templates = with_default_template(&config.templates);
    let inputs = up_inputs(&config, &templates)?;
    let mut limits = config.limits;
    let target = prepare_target(&config, &templates, &mut limits).await?;
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
    let parts = Parts {
        inputs,
        limits,
        templates,
        prebuild: config.prebuild,
        verify_templates: config.verify_templates,
        external: matches!(config.server, ServerConfig::External(_)),
        server_outlives_us: match &config.server {
            ServerConfig::External(_) => true,
            ServerConfig::Embedded(embedded) => embedded.keep_data && embedded.data_dir.is_some(),
        },
        server,
    };
    Ok(launch(parts, target, up).await)
}

/// The configured templates, with the `default` one (empty) first unless configured.
fn with_default_template(configured: &[TemplateConfig]) -> Vec<TemplateConfig> {
    let mut templates = configured.to_vec();
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
    templates
}

/// What bringing the server up needs from `config`, for `templates`.
fn up_inputs(config: &PoolConfig, templates: &[TemplateConfig]) -> Result<UpInputs, StartError> {
    Ok(UpInputs {
        templates: templates.to_vec(),
        pool_size: config.limits.clone_concurrency.max(1) * 2 + 2,
        clone_strategy: config.clone_strategy,
        lease_auth: config.lease_auth,
        lease_superuser: config.lease_superuser,
        lease_connections: config.limits.lease_connections,
        build_timeout: config.limits.build_timeout,
        reuse_unchanged: config.limits.reuse_unchanged,
        child_user: ChildUser::resolve(config.child_user.as_deref())?,
        integresql_role: config.integresql_role.clone(),
    })
}

/// The server to bring up: the embedded one prepared (binaries found, its directory made),
/// or the external one's URL parsed. Adjusts `limits` to it: the byte budget of an
/// embedded server defaults to its room, and an external one reuses no released database.
async fn prepare_target(
    config: &PoolConfig,
    templates: &[TemplateConfig],
    limits: &mut PoolLimits,
) -> Result<Target, StartError> {
    match &config.server {
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
            let prepared = Embedded::prepare(&embedded, templates).await?;
            if limits.max_bytes.is_none() {
                limits.max_bytes = match prepared.databases_space() {
                    Some(bytes) => Some(bytes / 4 * 3),
                    None => default_byte_budget(prepared.instance_dir()),
                };
            }
            Ok(Target::Embedded(prepared))
        }
        ServerConfig::External(external) => {
            if limits.reuse_unchanged {
                // The proof reads the database's files, which are not ours to read there.
                tracing::info!("reuse of unchanged databases is off on an external server: released databases are dropped and made again");
                limits.reuse_unchanged = false;
            }
            Ok(Target::External(ExternalTarget::parse(external)?))
        }
    }
}

/// What an actor is made of besides its server.
pub(super) struct Parts {
    pub(super) inputs: UpInputs,
    pub(super) limits: PoolLimits,
    /// The configured templates, the default one included.
    pub(super) templates: Vec<TemplateConfig>,
    pub(super) prebuild: bool,
    pub(super) verify_templates: bool,
    pub(super) external: bool,
    /// An external server, or a kept data directory: what we leave is found next time.
    pub(super) server_outlives_us: bool,
    /// The first byte of the lease ids the pool mints.
    pub(super) server: u8,
}

/// Spawns the actor on a server that is up.
pub(super) async fn launch(
    parts: Parts,
    target: Target,
    up: Up,
) -> (PoolHandle, tokio::task::JoinHandle<()>) {
    let Parts {
        inputs,
        limits,
        templates,
        prebuild,
        verify_templates,
        external,
        server_outlives_us,
        server,
    } = parts;
    let instance = hex::encode(rand::random::<[u8; 3]>());
    tracing::info!(max_bytes = ?limits.max_bytes, "byte budget for templates and clones");
    let state = PoolState::new(limits, instance.clone(), &templates, prebuild)
        .with_verified_builds(verify_templates)
        // IntegreSQL's names, save those someone else's databases have on an external
        // server (`PoolState::names_taken`).
        .with_integresql_names(true);
    let (commands_tx, commands) = mpsc::channel(COMMAND_CAPACITY);
    let (jobs_tx, jobs) = mpsc::unbounded_channel();
    let mut actor = Actor {
        state,
        initializers: HashMap::new(),
        finalizers: HashMap::new(),
        unlocks: HashMap::new(),
        inputs,
        external,
        server_outlives_us,
        target: Some(target),
        running: None,
        backend: None,
        monitor: None,
        waiters: HashMap::new(),
        next_waiter: 1,
        server,
        store: None,
        lease_sizes_started: None,
        lease_sizes_after: tokio::time::Instant::now(),
        failed_sources_at: Instant::now(),
        shutdown_check_at: Instant::now(),
        shutdown_check_pending: false,
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
    (PoolHandle::new(commands_tx), join)
}

/// The configured templates whose sources fail the check a registered source passes
/// (`template::check_source`, with the child user's rights), with why and their stamp.
pub(super) async fn unusable_sources(
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
pub(super) fn default_byte_budget(instance_dir: &std::path::Path) -> Option<u64> {
    let stats = nix::sys::statvfs::statvfs(instance_dir).ok()?;
    let total = stats.blocks().saturating_mul(stats.fragment_size());
    Some(total / 4 * 3)
}

/// Starts postgres (embedded) or connects (external), then opens a session.
pub(super) async fn bring_up(target: Target, inputs: UpInputs) -> (Target, Result<Up, StartError>) {
    match target {
        Target::Embedded(mut embedded) => {
            let outcome = async {
                let running = embedded.start().await?;
                let params = SessionParams {
                    admin_config: running.admin_config(),
                    lease_host: running.host.clone(),
                    lease_port: running.port,
                    local_socket: Some(running.socket_dir.clone()),
                    pool_size: inputs.pool_size,
                    clone_strategy: inputs.clone_strategy,
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
                match open_session(params, &inputs.templates).await {
                    Ok((session, monitor)) => Ok(Up::new(Some(running), session, monitor)),
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
                local_socket: None,
                pool_size: inputs.pool_size,
                clone_strategy: inputs.clone_strategy,
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
            let outcome = open_session(params, &inputs.templates)
                .await
                .map(|(session, monitor)| Up::new(None, session, monitor));
            (Target::External(external), outcome)
        }
        #[cfg(test)]
        Target::Fake(fake) => {
            let outcome = fake.bring_up().await;
            (Target::Fake(fake), outcome)
        }
    }
}

/// Opens a session on a server that is up, with the monitor connection that tells when it
/// goes away, and sweeps what earlier runs left on it (keeping `templates`' current
/// versions).
pub(super) async fn open_session(
    params: SessionParams,
    templates: &[TemplateConfig],
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
    let mut session = Session::open(params).await?;
    sweep_earlier_runs(&mut session, templates).await;
    Ok((session, monitor))
}

/// Clears what earlier runs left on the server ([`Session::sweep`]), keeping the complete
/// template databases of `templates`' current versions and the client-built ones, then
/// gives each client-built template kept its relation cache init file, which postgres
/// removed at its start (a configured one gets its own when the state adopts it, in
/// `template::build`). The session knows no template sources, hence this step here, where
/// both are known. Leftovers cost space, not correctness: a failure is logged and the start
/// goes on.
async fn sweep_earlier_runs(session: &mut Session, templates: &[TemplateConfig]) {
    // Hashing sources (a dump may be tens of GB) blocks: not on a runtime thread, and
    // with the child user's rights.
    let (templates, pg_major) = (templates.to_vec(), session.pg_major);
    let current = session
        .child_user
        .read(move || template::current_versions(&templates, pg_major, &HashMap::new()))
        .await;
    // Without the current versions every template would look stale: no sweep then.
    let swept = match current {
        // Only logged: nothing decides by the kind of a failure here.
        Ok(current) => session
            .sweep(current, Sweep::Start)
            .await
            .map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    if let Err(message) = swept {
        tracing::warn!(error = %message, "could not clean up after an earlier run");
    }
    for (_, db, _) in &session.client_templates {
        template::write_relcache_init(session, db).await;
    }
}

/// How long a server that refuses connections for a moment ([`is_transient`]) is waited for.
pub(super) const TRANSIENT_CONNECT_WAIT: Duration = Duration::from_secs(30);

/// Pause between those attempts.
pub(super) const TRANSIENT_CONNECT_RETRY: Duration = Duration::from_millis(500);

/// Errors that say "not now" rather than "never": the server is starting, stopping or in
/// crash recovery (57P03), or all its connection slots are taken (53300).
pub(super) fn is_transient(error: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        error.code(),
        Some(&SqlState::CANNOT_CONNECT_NOW | &SqlState::TOO_MANY_CONNECTIONS)
    )
}
