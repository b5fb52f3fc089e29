//! A session with one running server: the admin connection pool, the lease role, the sweep
//! of databases an earlier run left behind, the settings read back for `/status`, and the
//! SQL the pool's workers run (clone, drop). Beside it: `recycle` readies a clone for its
//! next holder, `settings` re-applies a template's database-level settings, `lock` keeps
//! a second pglease off the server, `bounded` puts a time bound on each admin operation.
//!
//! A new `Session` is opened every time postgres (re)starts or is reconnected; it does not
//! decide what to clone or drop, it only carries it out.

use crate::child_user::ChildUser;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use crate::config::{CloneStrategy, IntegresqlRole, LeaseAuth, TemplateConfig};
use crate::error::StartError;
use crate::names::{quote_ident, quote_literal, DbName, TemplateName, MARKER, PREFIX};
use crate::sql_error::SqlError;
use crate::{scram, template};

mod bounded;
mod integresql;
pub(crate) use bounded::{add_options, PINNED_SEARCH_PATH};
mod lock;
mod proof;
mod recycle;
mod settings;
mod snapshot;

pub use proof::Stamp;
pub use recycle::NotReused;

pub use bounded::DEFAULT_ADMIN_TIMEOUT;

/// The NOLOGIN role that owns what migrations create. Every lease role is a member, so a
/// test may alter, truncate and drop the template's objects in its own clone; it owns no
/// database, so membership gives nothing outside that clone.
pub const OWNER_ROLE: &str = "pglease_owner";

/// Settings shown in `/status`, read back from the server.
const SHOWN_SETTINGS: &[&str] = &[
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "jit",
    "shared_buffers",
    "max_connections",
    "checkpoint_timeout",
    "max_wal_size",
    "file_copy_method",
    "ssl",
];

/// How many times a clone is retried while stray sessions leave its template.
const CLONE_BUSY_RETRIES: u32 = 40;
/// How long an operation waits for a free admin connection before it fails.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// What opening a session needs to know.
#[derive(Debug, Clone)]
pub struct SessionParams {
    /// Superuser connection settings.
    pub admin_config: tokio_postgres::Config,
    /// Host lease holders connect to.
    pub lease_host: String,
    /// Port lease holders connect to.
    pub lease_port: u16,
    /// Connections the workers may hold at once.
    pub pool_size: usize,
    /// `CREATE DATABASE … STRATEGY`.
    pub clone_strategy: CloneStrategy,
    /// Templates whose complete template databases survive the sweep.
    pub templates: Vec<TemplateConfig>,
    /// True for an external server (warn when it runs with fsync on).
    pub external: bool,
    /// How lease roles authenticate.
    pub lease_auth: LeaseAuth,
    /// Lease roles are superusers.
    pub lease_superuser: bool,
    /// A lease's connection limit unless its request names one.
    pub lease_connections: u32,
    /// How long SQL migrations may take to build a template.
    pub build_timeout: Duration,
    /// How long one admin operation of the workers (clone, recycle, drop, connection
    /// limit, counting sessions) may take; [`DEFAULT_ADMIN_TIMEOUT`] unless a test needs
    /// a short one.
    pub admin_timeout: Duration,
    /// The data directory of a server pglease runs, when released clones are to be proven
    /// unchanged (`--reuse-unchanged`); None otherwise.
    pub proof_dir: Option<PathBuf>,
    /// Who runs the builds' programs and reads their sources.
    pub child_user: ChildUser,
    /// The IntegreSQL clients' role, made (or brought up to date) at the start.
    pub integresql_role: Option<IntegresqlRole>,
}

/// What a sweep keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// At start: complete current templates, complete client-built templates, ready clones
    /// marked at a clean stop.
    Start,
    /// Before a snapshot: complete current templates only.
    Snapshot,
}

/// An open session with the server. Cheap to clone: the pool is shared.
#[derive(Clone)]
pub struct Session {
    pool: Pool,
    /// Superuser connection settings (to reach template databases during builds).
    pub admin_config: tokio_postgres::Config,
    /// `server_version_num / 10000`.
    pub pg_major: u32,
    /// `server_version`.
    pub version: String,
    /// Host lease holders connect to.
    pub lease_host: String,
    /// Port lease holders connect to.
    pub lease_port: u16,
    /// Settings read back with the server's values.
    pub settings: Vec<(String, String)>,
    /// True for a server pglease did not start.
    pub external: bool,
    /// How long SQL migrations may take to build a template.
    pub build_timeout: Duration,
    /// Ready clones of an earlier run to adopt: (template, fingerprint, clone).
    pub adoptable: Vec<(TemplateName, String, DbName)>,
    /// Complete client-built templates an earlier run left: (template, its database, its
    /// size in bytes).
    pub client_templates: Vec<(TemplateName, DbName, i64)>,
    /// Connections lease holders can have in all: `max_connections` less what is reserved
    /// for superusers, the daemon's own connections and a small margin.
    pub connection_budget: u32,
    clone_strategy: CloneStrategy,
    lease_auth: LeaseAuth,
    lease_superuser: bool,
    lease_connections: u32,
    /// The IntegreSQL clients' role's name: a member of each template being initialized.
    integresql_role: Option<String>,
    /// The bound on each admin operation.
    admin_timeout: Duration,
    /// Admin operations that timed out (shown in `/status`).
    admin_timeouts: Arc<AtomicU64>,
    /// The connection holding the server lock, shared by every clone of this session.
    _lock: Arc<lock::ServerLock>,
    /// How each template version's database-level settings are re-applied (a cache of
    /// server facts shared by the workers, not pool state).
    template_settings: Arc<std::sync::Mutex<HashMap<DbName, settings::Clauses>>>,
    /// Builds that report progress (a dump's restore), while they run.
    pub(crate) build_progress: template::progress::Board,
    /// The data directory, when released clones are proven unchanged (`session/proof.rs`).
    proof_dir: Option<PathBuf>,
    /// Who runs the builds' programs (`psql`, `pg_restore`, migration commands) and reads
    /// template sources.
    pub(crate) child_user: ChildUser,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The lease password stays out of debug output and logs.
        f.debug_struct("Session")
            .field("version", &self.version)
            .field("lease_host", &self.lease_host)
            .field("lease_port", &self.lease_port)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Connects, checks privileges, takes the server lock (or fails with
    /// [`StartError::ServerInUse`]), creates the owner role, reads the settings back and
    /// sweeps what earlier runs left.
    pub async fn open(params: SessionParams) -> Result<Session, StartError> {
        let target = describe_target(&params.admin_config);
        let admin_config = bounded::with_connect_timeout(&params.admin_config);
        let manager = Manager::from_config(
            bounded::pool_config(&admin_config, params.admin_timeout),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(params.pool_size.max(2))
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(bounded::create_bound(&admin_config)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StartError::Unreachable {
                target: target.clone(),
                reason: format!("the admin connection pool: {e}"),
            })?;
        let client = pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(source) => StartError::Connect {
                target: target.clone(),
                source,
            },
            other => StartError::Unreachable {
                target: target.clone(),
                reason: other.to_string(),
            },
        })?;
        let sql_error = |context: &str| {
            let context = context.to_owned();
            move |source| StartError::Sql { context, source }
        };
        let row = client
            .query_one(
                "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
                 (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
                &[],
            )
            .await
            .map_err(sql_error("reading the server version"))?;
        let version_num: i32 = row.get(0);
        let version: String = row.get(1);
        let superuser: Option<bool> = row.get(2);
        if superuser != Some(true) {
            return Err(StartError::NotSuperuser { target });
        }
        // Before anything is created or swept: the sweep would drop another daemon's clones.
        let lock = lock::ServerLock::acquire(&admin_config).await?;
        let role = quote_ident(OWNER_ROLE);
        client
            .batch_execute(&format!(
                "DO $$ BEGIN \
                   IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN \
                     CREATE ROLE {role} NOLOGIN; \
                   END IF; \
                 END $$; \
                 COMMENT ON ROLE {role} IS {marker};",
                name = quote_literal(OWNER_ROLE),
                marker = quote_literal(MARKER),
            ))
            .await
            .map_err(sql_error("creating the owner role"))?;
        if let Some(role) = &params.integresql_role {
            integresql::ensure_role(&client, role, params.lease_connections).await?;
            if params.external {
                tracing::warn!(
                    role = %role.name,
                    "on an external server pglease does not write pg_hba.conf: for the IntegreSQL clients' role to reach the templates being initialized, it needs the line `host samerole {} all scram-sha-256` before any rule that matches it",
                    role.name
                );
            }
        }
        let rows = client
            .query(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1) ORDER BY name",
                &[&SHOWN_SETTINGS],
            )
            .await
            .map_err(sql_error("reading settings"))?;
        let settings: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if params.external && settings.iter().any(|(k, v)| k == "fsync" && v == "on") {
            tracing::warn!(
                server = %target,
                "the external postgres runs with fsync=on: clones and drops will be much slower than on a tuned server"
            );
        }
        let session = Session {
            pool,
            admin_config,
            pg_major: (version_num / 10000) as u32,
            version,
            lease_host: params.lease_host,
            lease_port: params.lease_port,
            // The IntegreSQL clients' role holds up to a lease's connections of its own.
            connection_budget: budget(&client, params.pool_size).await?.saturating_sub(
                if params.integresql_role.is_some() {
                    params.lease_connections
                } else {
                    0
                },
            ),
            settings,
            external: params.external,
            build_timeout: params.build_timeout,
            adoptable: Vec::new(),
            client_templates: Vec::new(),
            clone_strategy: params.clone_strategy,
            lease_auth: params.lease_auth,
            lease_superuser: params.lease_superuser,
            lease_connections: params.lease_connections,
            integresql_role: params
                .integresql_role
                .as_ref()
                .map(|role| role.name.clone()),
            admin_timeout: params.admin_timeout,
            admin_timeouts: Arc::default(),
            _lock: Arc::new(lock),
            template_settings: Arc::default(),
            build_progress: template::progress::Board::default(),
            child_user: params.child_user,
            proof_dir: match params.proof_dir {
                Some(dir) => match client
                    // In a schema of its own in the `postgres` database (the daemon's
                    // connections pin search_path to pg_catalog, where nothing may be
                    // created; and no lease role can connect here).
                    .batch_execute(
                        "CREATE SCHEMA IF NOT EXISTS pglease; \
                         CREATE EXTENSION IF NOT EXISTS pg_buffercache SCHEMA pglease",
                    )
                    .await
                {
                    Ok(()) => Some(dir),
                    Err(error) => {
                        tracing::warn!(
                            error = %pg_message(&error),
                            "cannot install pg_buffercache (postgres' contrib): released clones \
                             are dropped and made again instead of proven unchanged"
                        );
                        None
                    }
                },
                None => None,
            },
        };
        drop(client);
        // Leftovers cost space, not correctness: failing to remove them must not stop us.
        let mut session = session;
        // Hashing sources (a dump may be tens of GB) blocks: not on a runtime thread, and
        // with the child user's rights.
        let (templates, pg_major) = (params.templates.clone(), session.pg_major);
        let current = session
            .child_user
            .read(move || template::current_versions(&templates, pg_major, &HashMap::new()))
            .await;
        // Without the current versions every template would look stale: no sweep then.
        let swept = match current {
            Ok(current) => session.sweep(current, Sweep::Start).await,
            Err(message) => Err(message),
        };
        if let Err(message) = swept {
            tracing::warn!(error = %message, "could not clean up after an earlier run");
        }
        Ok(session)
    }

    /// Drops every database with our prefix and marker except complete templates of the
    /// current configuration, then our lease roles; nothing without the marker is touched.
    /// A template is marked by its comment; a clone by its owner, a role with our prefix
    /// that is a member of the owner role (or carries our comment), created before the
    /// database, so a daemon killed at any point leaves nothing unrecognisable. Failures to
    /// drop one leftover are logged and the sweep goes on.
    ///
    /// [`Sweep::Snapshot`] keeps only the configured templates: client-built templates and
    /// every clone go too.
    /// `current` is the fingerprint of every configured template, by name.
    pub(crate) async fn sweep(
        &mut self,
        current: Vec<(TemplateName, String)>,
        mode: Sweep,
    ) -> Result<(), String> {
        let keep: HashSet<String> = current
            .iter()
            .map(|(name, fingerprint)| DbName::template(name, fingerprint).as_str().to_owned())
            .collect();
        let client = self.client().await?;
        let pattern = format!("{}%", PREFIX.replace('_', "\\_"));
        let rows = client
            .query(
                "SELECT datname, datistemplate AND NOT datallowconn, \
                        coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database \
                 WHERE datname LIKE $1 AND (shobj_description(oid, 'pg_database') LIKE $2 \
                   OR datdba IN (SELECT r.oid FROM pg_roles r WHERE r.rolname LIKE $1 AND r.rolname <> $3 \
                                 AND (shobj_description(r.oid, 'pg_authid') LIKE $2 \
                                      OR r.oid IN (SELECT m.member FROM pg_auth_members m \
                                                   JOIN pg_roles o ON o.oid = m.roleid WHERE o.rolname = $3))))",
                &[&pattern, &format!("{MARKER}%"), &OWNER_ROLE],
            )
            .await
            .map_err(|e| pg_message(&e))?;
        drop(client);
        // Complete client-built templates stay; their names count as current versions
        // (a client template's fingerprint is its name), so their ready clones are adopted.
        let mut keep = keep;
        let mut current = current;
        for row in &rows {
            let (name, complete, comment): (String, bool, String) =
                (row.get(0), row.get(1), row.get(2));
            let client_template = template::parse_client_template_marker(&comment)
                .filter(|_| complete && mode == Sweep::Start);
            if let Some(template) = client_template {
                let db = DbName::from_server(name.clone());
                let size = match self.database_size(&db).await {
                    Ok(size) => size,
                    Err(error) => {
                        // Not kept, then: it is dropped below like any leftover.
                        tracing::warn!(database = %name, %error, "could not size a kept client-built template");
                        continue;
                    }
                };
                tracing::info!(database = %name, template = %template, "keeping a client-built template of an earlier run");
                template::write_relcache_init(self, &db).await;
                current.push((template.clone(), template.to_string()));
                self.client_templates.push((template, db, size));
                keep.insert(name);
            }
        }
        let mut adopted: HashSet<String> = HashSet::new();
        for row in rows {
            let name: String = row.get(0);
            let complete: bool = row.get(1);
            let comment: String = row.get(2);
            if complete && keep.contains(&name) {
                continue;
            }
            // A ready clone a clean shutdown left, of a template version still current.
            let ready = parse_ready_marker(&comment).filter(|_| mode == Sweep::Start);
            if let Some((template, fingerprint)) = ready {
                let current_version = current
                    .iter()
                    .any(|(n, f)| *n == template && *f == fingerprint);
                let template_db_kept = keep
                    .contains(DbName::template(&template, &fingerprint).as_str())
                    || self.client_templates.iter().any(|(t, _, _)| *t == template);
                if current_version && template_db_kept {
                    tracing::info!(database = %name, template = %template, "adopting a ready clone of an earlier run");
                    self.adoptable
                        .push((template, fingerprint, DbName::from_server(name.clone())));
                    adopted.insert(name);
                    continue;
                }
            }
            match comment.strip_prefix(&format!("{MARKER}; template ")) {
                // A template built from other sources than the current ones (a snapshot's,
                // a kept data directory's, an external server's): never used.
                Some(template) if complete => tracing::info!(
                    database = %name,
                    template,
                    "dropping a template database built from other sources than the \
                     template's current ones (or of a template no longer configured)"
                ),
                _ if mode == Sweep::Snapshot => {
                    tracing::debug!(database = %name, "dropping before the snapshot");
                }
                _ => tracing::info!(database = %name, "dropping a database left by an earlier run"),
            }
            if let Err(message) = self.drop_database(&DbName::from_server(name.clone())).await {
                tracing::warn!(database = %name, error = %message, "could not drop a leftover database");
            }
        }
        // Lease roles of earlier runs; their databases are gone by now.
        let client = self.client().await?;
        let roles = client
            .query(
                "SELECT rolname FROM pg_roles r WHERE rolname LIKE $1 AND rolname <> $2 \
                 AND (shobj_description(oid, 'pg_authid') LIKE $3 \
                      OR oid IN (SELECT m.member FROM pg_auth_members m \
                                 JOIN pg_roles o ON o.oid = m.roleid WHERE o.rolname = $2))",
                &[&pattern, &OWNER_ROLE, &format!("{MARKER}%")],
            )
            .await
            .map_err(|e| pg_message(&e))?;
        for row in roles {
            let name: String = row.get(0);
            if adopted.contains(&name) {
                continue;
            }
            if mode == Sweep::Start {
                tracing::info!(role = %name, "dropping a role left by an earlier run");
            }
            let dropped = client
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&name)))
                .await;
            if let Err(error) = dropped {
                tracing::warn!(role = %name, error = %pg_message(&error), "could not drop a leftover role");
            }
        }
        Ok(())
    }

    /// Runs one statement outside a transaction (CREATE/DROP DATABASE need that).
    pub async fn execute(&self, sql: &str) -> Result<(), SqlError> {
        self.bounded(
            || format!("`{sql}`"),
            async |client| {
                client
                    .batch_execute(sql)
                    .await
                    .map_err(|e| SqlError::from_pg(&e))
            },
        )
        .await
    }

    /// The server accepts SSL (`ssl = on`).
    pub fn ssl(&self) -> bool {
        self.settings
            .iter()
            .any(|(name, value)| name == "ssl" && value == "on")
    }

    /// `pg_database_size(db)` in bytes.
    pub async fn database_size(&self, db: &DbName) -> Result<i64, SqlError> {
        self.bounded(
            || format!("sizing {db}"),
            async |client| {
                let row = client
                    .query_one("SELECT pg_database_size($1::text::name)", &[&db.as_str()])
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(row.get(0))
            },
        )
        .await
    }

    /// Every database's name and `pg_database_size`, in bytes.
    pub async fn database_sizes(&self) -> Result<Vec<(String, i64)>, String> {
        self.bounded(
            || "sizing the databases".to_string(),
            async |client| {
                let rows = client
                    .query(
                        "SELECT datname::text, pg_database_size(oid) FROM pg_database",
                        &[],
                    )
                    .await
                    .map_err(|e| pg_message(&e))?;
                Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
            },
        )
        .await
    }

    /// True when `db` exists, is marked a template and refuses connections: a finished build.
    pub async fn is_complete_template(&self, db: &DbName) -> Result<bool, SqlError> {
        self.bounded(
            || format!("looking up {db}"),
            async |client| {
                let row = client
                    .query_opt(
                        "SELECT datistemplate AND NOT datallowconn FROM pg_database WHERE datname = $1",
                        &[&db.as_str()],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
            },
        )
        .await
    }

    /// Waits until no session is connected to `db` (a build's connection may take a moment
    /// to go), terminating stragglers after half the time.
    pub async fn wait_until_unused(&self, db: &DbName, limit: Duration) -> Result<(), String> {
        let started = tokio::time::Instant::now();
        loop {
            if self.sessions_on(db).await? == 0 {
                return Ok(());
            }
            if started.elapsed() > limit / 2 {
                self.terminate_sessions(db).await?;
            }
            if started.elapsed() > limit {
                return Err(format!("sessions still connected to {db} after {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sessions still connected to `db` after up to `grace`: a client that has just closed
    /// its connection leaves a backend that takes a few milliseconds to exit, so an
    /// immediate count would call a finished test "in use".
    pub async fn sessions_after(&self, db: &DbName, grace: Duration) -> Result<i64, String> {
        let started = tokio::time::Instant::now();
        loop {
            let sessions = self.sessions_on(db).await?;
            if sessions == 0 || started.elapsed() >= grace {
                return Ok(sessions);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sessions connected to `db` (other than this one).
    pub async fn sessions_on(&self, db: &DbName) -> Result<i64, String> {
        self.bounded(
            || format!("counting the sessions on {db}"),
            async |client| {
                let row = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                        &[&db.as_str()],
                    )
                    .await
                    .map_err(|e| pg_message(&e))?;
                Ok(row.get(0))
            },
        )
        .await
    }

    /// Ends every session connected to `db`.
    pub async fn terminate_sessions(&self, db: &DbName) -> Result<(), SqlError> {
        self.bounded(
            || format!("ending the sessions on {db}"),
            async |client| {
                client
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                        &[&db.as_str()],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(())
            },
        )
        .await
    }

    /// Makes a clone ready to lease: its own LOGIN role (named like the database, a member
    /// of the owner role, with a fresh password), `CREATE DATABASE clone TEMPLATE
    /// template_db` owned by that role, CONNECT and TEMPORARY revoked from PUBLIC, the
    /// template's database-level settings re-applied, and our marker on both.
    /// Returns the role's password.
    /// With `standard_scram` its verifier has postgres' standard iteration count (for
    /// clients of the IntegreSQL API, whose Go drivers refuse fewer).
    pub async fn clone_database(
        &self,
        template_db: &DbName,
        clone: &DbName,
        standard_scram: bool,
    ) -> Result<String, SqlError> {
        self.bounded(
            || format!("cloning {template_db} into {clone}"),
            async |client| {
                self.clone_with(client, template_db, clone, standard_scram)
                    .await
            },
        )
        .await
    }

    async fn clone_with(
        &self,
        client: &tokio_postgres::Client,
        template_db: &DbName,
        clone: &DbName,
        standard_scram: bool,
    ) -> Result<String, SqlError> {
        let role = quote_ident(clone.as_str());
        let password = scram::random_password();
        let superuser = if self.lease_superuser {
            "SUPERUSER"
        } else {
            "NOSUPERUSER"
        };
        // Membership in the owner role (and the prefix) marks the role, and through it the
        // database it owns, as ours: no comment to write on the hot path.
        client
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN {superuser} CONNECTION LIMIT {limit} PASSWORD {verifier} \
                   IN ROLE {owner}",
                limit = self.lease_connections,
                verifier = quote_literal(&self.verifier(&password, standard_scram)),
                owner = quote_ident(OWNER_ROLE),
            ))
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        // STRATEGY exists from postgres 15; older servers always copy files.
        let strategy = if self.pg_major >= 15 {
            format!(" STRATEGY {}", self.clone_strategy.as_sql())
        } else {
            String::new()
        };
        let create = format!(
            "CREATE DATABASE {} TEMPLATE {}{strategy} OWNER {role}",
            clone.quoted(),
            template_db.quoted(),
        );
        let mut attempt = 0;
        loop {
            match client.batch_execute(&create).await {
                Ok(()) => break,
                // "source database is being accessed by other users": a session is leaving.
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                        && attempt < CLONE_BUSY_RETRIES =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Err(e) => return Err(SqlError::from_pg(&e)),
            }
        }
        // CREATE DATABASE does not copy database-level grants or settings.
        let settings = self
            .template_settings(client, template_db)
            .await
            .map_err(SqlError::other)?;
        let sql = format!(
            "REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC;{}",
            clone.quoted(),
            settings.sql_for(clone)
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        settings
            .verify(self, client, template_db, clone)
            .await
            .map_err(SqlError::other)?;
        Ok(password)
    }

    /// Whether the server still answers a query on an admin connection.
    pub(crate) async fn answers(&self) -> bool {
        self.bounded(
            || "asking whether the server answers".to_owned(),
            async |client| {
                client
                    .batch_execute("SELECT 1")
                    .await
                    .map_err(|e| SqlError::from_pg(&e))
            },
        )
        .await
        .is_ok()
    }

    /// A lease's connection limit unless its request names one (`--lease-connections`).
    pub(crate) fn lease_connections(&self) -> u32 {
        self.lease_connections
    }

    /// The IntegreSQL clients' role's name, when the daemon has one.
    pub(crate) fn integresql_role(&self) -> Option<&str> {
        self.integresql_role.as_deref()
    }

    /// Sets the connection limit of a clone's role (for a lease that asked for its own).
    pub async fn set_connection_limit(&self, clone: &DbName, limit: u32) -> Result<(), SqlError> {
        let sql = format!(
            "ALTER ROLE {} CONNECTION LIMIT {limit}",
            quote_ident(clone.as_str())
        );
        self.bounded(
            || format!("setting the connection limit of {clone}"),
            async |client| {
                client
                    .batch_execute(&sql)
                    .await
                    .map_err(|e| SqlError::from_pg(&e))
            },
        )
        .await
    }

    /// The SCRAM verifier stored for `password` under the configured iteration count (at
    /// least postgres' standard count with `standard`).
    pub(crate) fn verifier(&self, password: &str, standard: bool) -> String {
        let iterations = match self.lease_auth {
            LeaseAuth::Scram { iterations } if standard => {
                iterations.max(crate::template::STANDARD_SCRAM_ITERATIONS)
            }
            LeaseAuth::Scram { iterations } => iterations,
            // Trust ignores it; a valid verifier keeps the role usable if the rule changes.
            LeaseAuth::Trust => crate::config::DEFAULT_SCRAM_ITERATIONS,
        };
        scram::verifier(password, iterations)
    }

    /// Drops `db` if it exists, ending its sessions, and the role named like it; a template
    /// is unmarked first. A clone takes two statements and no look-ups (the hot path).
    pub async fn drop_database(&self, db: &DbName) -> Result<(), SqlError> {
        self.bounded(
            || format!("dropping {db}"),
            async |client| Self::drop_with(client, db).await,
        )
        .await
    }

    async fn drop_with(client: &tokio_postgres::Client, db: &DbName) -> Result<(), SqlError> {
        if !db.is_template() {
            let dropped = client
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    db.quoted()
                ))
                .await;
            if let Err(error) = dropped {
                return Self::drop_held_clone(client, db, &error).await;
            }
            return client
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(db.as_str())))
                .await
                .map_err(|e| SqlError::from_pg(&e));
        }
        let row = client
            .query_opt(
                "SELECT datistemplate FROM pg_database WHERE datname = $1",
                &[&db.as_str()],
            )
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        let Some(row) = row else {
            // A clone whose CREATE DATABASE failed may still have its role.
            return Self::drop_role(client, db).await;
        };
        if row.get::<_, bool>(0) {
            client
                .batch_execute(&format!(
                    "ALTER DATABASE {} WITH IS_TEMPLATE false",
                    db.quoted()
                ))
                .await
                .map_err(|e| SqlError::from_pg(&e))?;
        }
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                db.quoted()
            ))
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        Self::drop_role(client, db).await
    }

    /// The drop of a clone whose plain drop failed: its holder may have made it undroppable
    /// (`ALTER DATABASE … IS_TEMPLATE true` — it owns the database). First its role is
    /// locked out — no login, no password, no settings — so that whatever happens next the
    /// former holder's credentials never work again; then its sessions are ended, the
    /// attributes an owner can set are undone, and the drop is tried again. An error names
    /// what still failed and the first failure.
    async fn drop_held_clone(
        client: &tokio_postgres::Client,
        db: &DbName,
        first: &tokio_postgres::Error,
    ) -> Result<(), SqlError> {
        let first = pg_message(first);
        tracing::warn!(database = %db, error = %first, "a released database did not drop; undoing what its holder may have done to it");
        let role = quote_ident(db.as_str());
        let careful = async {
            let role_exists = client
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&db.as_str()])
                .await?
                .is_some();
            if role_exists {
                client
                    .batch_execute(&format!(
                        "ALTER ROLE {role} NOLOGIN PASSWORD NULL; ALTER ROLE {role} RESET ALL"
                    ))
                    .await?;
            }
            client
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 OR usename = $1",
                    &[&db.as_str()],
                )
                .await?;
            let db_exists = client
                .query_opt(
                    "SELECT 1 FROM pg_database WHERE datname = $1",
                    &[&db.as_str()],
                )
                .await?
                .is_some();
            if db_exists {
                client
                    .batch_execute(&format!(
                        "ALTER DATABASE {db} WITH IS_TEMPLATE false ALLOW_CONNECTIONS true \
                         CONNECTION LIMIT -1",
                        db = db.quoted()
                    ))
                    .await?;
                client
                    .batch_execute(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        db.quoted()
                    ))
                    .await?;
            }
            client
                .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
                .await
        };
        careful.await.map_err(|e: tokio_postgres::Error| {
            SqlError::described(
                &e,
                format!("{} (the first attempt: {first})", pg_message(&e)),
            )
        })
    }

    /// Drops the lease role named like `db`, if there is one (templates have none).
    async fn drop_role(client: &tokio_postgres::Client, db: &DbName) -> Result<(), SqlError> {
        let exists = client
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&db.as_str()])
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        if exists.is_some() {
            client
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(db.as_str())))
                .await
                .map_err(|e| SqlError::from_pg(&e))?;
        }
        Ok(())
    }
}

/// The comment a clean shutdown leaves on a ready clone of a server that outlives us.
pub fn ready_marker(template: &TemplateName, fingerprint: &str) -> String {
    format!("{MARKER}; ready; template={template}; fingerprint={fingerprint}")
}

/// Template and fingerprint of a [`ready_marker`] comment.
fn parse_ready_marker(comment: &str) -> Option<(TemplateName, String)> {
    let rest = comment
        .strip_prefix(MARKER)?
        .strip_prefix("; ready; template=")?;
    let (template, fingerprint) = rest.split_once("; fingerprint=")?;
    // Our SHA-256 fingerprints, or a client-built template's own hash (its fingerprint
    // is its name, whatever digest the client uses).
    let fingerprint_ok = fingerprint == template
        || (fingerprint.len() == 64 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()));
    Some((TemplateName::new(template).ok()?, fingerprint.to_owned())).filter(|_| fingerprint_ok)
}

#[cfg(test)]
mod marker_tests {
    use super::*;

    #[test]
    fn ready_markers_round_trip_for_configured_and_client_built_templates() {
        let configured = TemplateName::new("app").expect("name");
        let fingerprint = "ab".repeat(32);
        let marker = ready_marker(&configured, &fingerprint);
        assert_eq!(
            parse_ready_marker(&marker),
            Some((configured.clone(), fingerprint))
        );
        // A client's md5-sized hash is its own fingerprint.
        let client = TemplateName::new("0123456789abcdef0123456789abcdef").expect("name");
        let marker = ready_marker(&client, client.as_str());
        assert_eq!(
            parse_ready_marker(&marker),
            Some((client.clone(), client.to_string()))
        );
        assert_eq!(
            parse_ready_marker(&ready_marker(&configured, "short")),
            None
        );
        assert_eq!(parse_ready_marker("someone else's comment"), None);
    }
}

/// Marks a ready clone for the next run to adopt.
pub(crate) async fn mark_ready(
    session: &Session,
    template: &TemplateName,
    fingerprint: &str,
    clone: &DbName,
) -> Result<(), String> {
    session
        .execute(&format!(
            "COMMENT ON DATABASE {} IS {}",
            clone.quoted(),
            quote_literal(&ready_marker(template, fingerprint))
        ))
        .await?;
    Ok(())
}

/// Connections left for lease holders: `max_connections` less `superuser_reserved_connections`,
/// the daemon's worker pool, its monitor connection and a margin of 3.
async fn budget(client: &tokio_postgres::Client, pool_size: usize) -> Result<u32, StartError> {
    let row = client
        .query_one(
            "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int",
            &[],
        )
        .await
        .map_err(|source| StartError::Sql {
            context: "reading max_connections".into(),
            source,
        })?;
    let (max, reserved): (i32, i32) = (row.get(0), row.get(1));
    let ours = pool_size as i64 + 1 + 3;
    Ok((i64::from(max) - i64::from(reserved) - ours).max(0) as u32)
}

/// Postgres' own words for an error: severity, message, detail and hint when the server
/// sent them, else the driver's description with its causes.
pub fn pg_message(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!("{}: {}", db.severity(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" DETAIL: {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!(" HINT: {hint}"));
        }
        return text;
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Host(s) and port of a config, for messages (never the password).
pub fn describe_target(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

#[cfg(test)]
mod tests;
