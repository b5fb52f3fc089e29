//! Opening a session: connecting, the superuser check, the server lock, the owner role
//! (and the IntegreSQL clients' role), the settings read back for `/status` and the
//! connection budget left to lease holders. The sweep of an earlier run's leftovers comes
//! next, once the caller knows the templates' current versions (`actor/start.rs`,
//! `open_session`); what it keeps and drops is `sweep.rs`'s business.

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::{
    bounded, describe_target, integresql, lock, Session, SessionParams, OWNER_ROLE, POOL_WAIT,
};
use crate::config::IntegresqlRole;
use crate::error::StartError;
use crate::names::{quote_ident, quote_literal, MARKER};
use crate::sql_error::pg_message;

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

impl Session {
    /// Connects, checks privileges, takes the server lock (or fails with
    /// [`StartError::ServerInUse`]), creates the owner role and reads the settings back.
    /// It sweeps nothing: the caller runs [`Session::sweep`] next (with [`Sweep::Start`]
    /// and the templates' current versions), under the lock taken here.
    ///
    /// [`Sweep::Start`]: super::Sweep::Start
    pub async fn open(params: SessionParams) -> Result<Session, StartError> {
        let target = describe_target(&params.admin_config);
        let admin_config = bounded::with_connect_timeout(&params.admin_config);
        let pool = admin_pool(&params, &admin_config, &target)?;
        let client = first_connection(&pool, &target).await?;
        let (version_num, version) = superuser_server_version(&client, &target).await?;
        // Before anything is created or swept: the sweep would drop another daemon's clones.
        let lock = lock::ServerLock::acquire(&admin_config).await?;
        create_owner_role(&client).await?;
        if let Some(role) = params.integresql_role.as_ref().filter(|r| r.server_login) {
            tracing::warn!(
                role = %role.name,
                "the IntegreSQL answers carry the credentials pglease connects with (--integresql-pg-user names the --postgres-url's user), for every test database: whoever reaches the IntegreSQL API gets that login, as under IntegreSQL"
            );
        } else if let Some(role) = &params.integresql_role {
            integresql::ensure_role(&client, role, params.lease_connections).await?;
            warn_of_external_hba(role, params.external);
        }
        let settings = shown_settings(&client, &target, params.external).await?;
        // The IntegreSQL clients' role holds up to a lease's connections of its own.
        let connection_budget = budget(&client, params.pool_size).await?.saturating_sub(
            if params.integresql_role.is_some() {
                params.lease_connections
            } else {
                0
            },
        );
        let proof_dir = match params.proof_dir {
            Some(dir) => install_buffercache(&client).await.then_some(dir),
            None => None,
        };
        drop(client);
        Ok(Session {
            pool,
            admin_config,
            pg_major: (version_num / 10000) as u32,
            version,
            lease_host: params.lease_host,
            local_socket: params.local_socket,
            lease_port: params.lease_port,
            connection_budget,
            settings,
            external: params.external,
            build_timeout: params.build_timeout,
            adoptable: Vec::new(),
            client_templates: Vec::new(),
            others_integresql_names: Vec::new(),
            clone_strategy: params.clone_strategy,
            lease_auth: params.lease_auth,
            lease_superuser: params.lease_superuser,
            lease_connections: params.lease_connections,
            integresql_role: params.integresql_role,
            admin_timeout: params.admin_timeout,
            admin_timeouts: Arc::default(),
            _lock: Arc::new(lock),
            template_settings: Arc::default(),
            build_progress: crate::progress::Board::default(),
            child_user: params.child_user,
            // The kernel's word on which stamped clones were written, for the proofs.
            watches: proof_dir
                .is_some()
                .then(super::watch::Watches::new)
                .flatten()
                .map(Arc::new),
            proof_dir,
        })
    }
}

/// The admin connection pool: the superuser's settings with the workers' time bounds
/// (`bounded.rs`), at least two connections so that a long operation leaves one free.
fn admin_pool(
    params: &SessionParams,
    admin_config: &tokio_postgres::Config,
    target: &str,
) -> Result<Pool, StartError> {
    let manager = Manager::from_config(
        bounded::pool_config(admin_config, params.admin_timeout),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(params.pool_size.max(2))
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(bounded::create_bound(admin_config)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StartError::Unreachable {
            target: target.to_owned(),
            reason: format!("the admin connection pool: {e}"),
        })
}

/// The pool's first connection, which the rest of the opening uses: postgres' refusal
/// keeps its words ([`StartError::Connect`]), anything else says why there was none.
async fn first_connection(pool: &Pool, target: &str) -> Result<Object, StartError> {
    pool.get().await.map_err(|e| match e {
        deadpool_postgres::PoolError::Backend(source) => StartError::Connect {
            target: target.to_owned(),
            source,
        },
        other => StartError::Unreachable {
            target: target.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// `StartError::Sql` with `context`, for `map_err`.
fn sql_error(context: &str) -> impl FnOnce(tokio_postgres::Error) -> StartError {
    let context = context.to_owned();
    move |source| StartError::Sql { context, source }
}

/// The server's `server_version_num` and `server_version`, once it is known that pglease
/// connects as a superuser ([`StartError::NotSuperuser`] otherwise): it creates databases
/// and roles.
async fn superuser_server_version(
    client: &Object,
    target: &str,
) -> Result<(i32, String), StartError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
             (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
            &[],
        )
        .await
        .map_err(sql_error("reading the server version"))?;
    let superuser: Option<bool> = row.get(2);
    if superuser != Some(true) {
        return Err(StartError::NotSuperuser {
            target: target.to_owned(),
        });
    }
    Ok((row.get(0), row.get(1)))
}

/// Creates the owner role ([`OWNER_ROLE`]) unless it exists, marked as pglease's.
async fn create_owner_role(client: &Object) -> Result<(), StartError> {
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
        .map_err(sql_error("creating the owner role"))
}

/// On an external server pglease does not write `pg_hba.conf`: the operator is told the
/// line the IntegreSQL clients' role needs.
fn warn_of_external_hba(role: &IntegresqlRole, external: bool) {
    if external {
        tracing::warn!(
            role = %role.name,
            "on an external server pglease does not write pg_hba.conf: for the IntegreSQL clients' role to reach the templates being initialized, it needs the line `host samerole {} all scram-sha-256` before any rule that matches it",
            role.name
        );
    }
}

/// The settings `/status` shows ([`SHOWN_SETTINGS`]), with the server's values; an
/// external server running with fsync on is warned about.
async fn shown_settings(
    client: &Object,
    target: &str,
    external: bool,
) -> Result<Vec<(String, String)>, StartError> {
    let rows = client
        .query(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY($1) ORDER BY name",
            &[&SHOWN_SETTINGS],
        )
        .await
        .map_err(sql_error("reading settings"))?;
    let settings: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    if external && settings.iter().any(|(k, v)| k == "fsync" && v == "on") {
        tracing::warn!(
            server = %target,
            "the external postgres runs with fsync=on: clones and drops will be much slower than on a tuned server"
        );
    }
    Ok(settings)
}

/// Installs `pg_buffercache`, which proves released clones unchanged (`proof.rs`): false,
/// with a warning, where postgres' contrib is missing (released clones are then dropped and
/// made again).
async fn install_buffercache(client: &Object) -> bool {
    // In a schema of its own in the `postgres` database (the daemon's connections pin
    // search_path to pg_catalog, where nothing may be created; and no lease role can
    // connect here).
    match client
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS pglease; \
             CREATE EXTENSION IF NOT EXISTS pg_buffercache SCHEMA pglease",
        )
        .await
    {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(
                error = %pg_message(&error),
                "cannot install pg_buffercache (postgres' contrib): released clones \
                 are dropped and made again instead of proven unchanged"
            );
            false
        }
    }
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
