//! The role catalog of a cluster adopted from a snapshot, checked before any TCP client can
//! log in (defence in depth behind the snapshot's MAC, issue 41 row 3): the cluster starts
//! with a `pg_hba.conf` that admits only the superuser over the private socket
//! ([`superuser_only_hba`]); [`check`] reads `pg_authid`, `pg_auth_members` and
//! `pg_db_role_setting`, and only then [`open_up`] writes the usual rules and reloads them.
//!
//! A clean stop drops every role pglease made but its owner role (`session/snapshot.rs`), so
//! an honest snapshot holds the bootstrap superuser, the predefined `pg_*` roles,
//! `pglease_owner` (no login) and the roles its templates made. Refused: any other role that
//! can log in (but the IntegreSQL clients' role) or has superuser, replication, bypass-RLS
//! or create-role rights; a membership in a predefined role; a per-role or per-database
//! setting only a superuser could make. It does not look at functions or other objects.

use std::time::{Duration, Instant};

use super::initdb::ADMIN_USER;
use super::running::RunningPostgres;

/// The first OID initdb leaves to users: predefined roles are below it.
const FIRST_NORMAL_OID: u32 = 16384;
/// How long [`open_up`] waits for the postmaster to load the new rules.
const RELOAD_LIMIT: Duration = Duration::from_secs(10);

/// Why an adopted cluster is not opened up: its catalog holds what pglease does not make,
/// or the check could not be carried out (postgres' own error kept as the source).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CatalogError {
    /// Its catalog holds roles, grants or settings pglease does not make.
    #[error("its catalog {0}")]
    Refused(String),
    /// Connecting over the socket, or one of the check's statements, failed.
    #[error("{action}: {}", crate::sql_error::pg_message(.source))]
    Sql {
        /// What was being done.
        action: &'static str,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// The postmaster did not load the usual `pg_hba.conf` in time.
    #[error("postgres did not reload its configuration within {0:?}")]
    NotReloaded(Duration),
}

/// The `pg_hba.conf` of an adopted cluster until its catalog is checked.
pub(super) fn superuser_only_hba() -> String {
    format!(
        "# Written by pglease: the cluster is from a snapshot, whose roles are checked before\n\
         # anyone else may connect.\nlocal   all        {ADMIN_USER}   trust\n"
    )
}

/// Why the catalog of `running` is refused, if it is; `integresql_role` may log in.
pub(super) async fn check(
    running: &RunningPostgres,
    integresql_role: Option<&str>,
) -> Result<(), CatalogError> {
    let client = connect(running).await?;
    let query = |source| CatalogError::Sql {
        action: "cannot read the role catalog",
        source,
    };
    let roles = client
        .query(
            "SELECT rolname::text FROM pg_authid \
             WHERE rolname <> $1 AND oid >= $2 \
               AND (rolsuper OR rolreplication OR rolbypassrls OR rolcreaterole \
                    OR (rolcanlogin AND rolname IS DISTINCT FROM $3)) \
             ORDER BY 1",
            &[&ADMIN_USER, &FIRST_NORMAL_OID, &integresql_role],
        )
        .await
        .map_err(query)?;
    if !roles.is_empty() {
        let names: Vec<String> = roles.iter().map(|r| r.get(0)).collect();
        return Err(CatalogError::Refused(format!(
            "has roles pglease does not make that can log in or hold \
             superuser, replication, bypass-RLS or create-role rights: {names:?}"
        )));
    }
    let members = client
        .query(
            "SELECT g.rolname::text || ' to ' || m.rolname::text FROM pg_auth_members a \
             JOIN pg_authid g ON g.oid = a.roleid JOIN pg_authid m ON m.oid = a.member \
             WHERE a.roleid < $1::oid AND a.member >= $1::oid ORDER BY 1",
            &[&FIRST_NORMAL_OID],
        )
        .await
        .map_err(query)?;
    if !members.is_empty() {
        let grants: Vec<String> = members.iter().map(|r| r.get(0)).collect();
        return Err(CatalogError::Refused(format!(
            "grants predefined roles: {grants:?}"
        )));
    }
    let settings = client
        .query(
            "SELECT DISTINCT split_part(s, '=', 1) FROM pg_db_role_setting, \
             unnest(setconfig) AS s \
             WHERE split_part(s, '=', 1) NOT IN \
               (SELECT name FROM pg_settings WHERE context = 'user') ORDER BY 1",
            &[],
        )
        .await
        .map_err(query)?;
    if !settings.is_empty() {
        let names: Vec<String> = settings.iter().map(|r| r.get(0)).collect();
        return Err(CatalogError::Refused(format!(
            "sets, per role or database, settings only a superuser may: {names:?}"
        )));
    }
    Ok(())
}

/// Reloads the configuration once `pg_hba.conf` holds the usual rules again, and waits
/// until a new connection sees it loaded (the postmaster reloads asynchronously; a backend
/// inherits its load time).
pub(super) async fn open_up(running: &RunningPostgres) -> Result<(), CatalogError> {
    let reload = |source| CatalogError::Sql {
        action: "cannot reload the configuration",
        source,
    };
    let client = connect(running).await?;
    let before: std::time::SystemTime = client
        .query_one("SELECT pg_conf_load_time()", &[])
        .await
        .map_err(reload)?
        .get(0);
    client
        .execute("SELECT pg_reload_conf()", &[])
        .await
        .map_err(reload)?;
    let started = Instant::now();
    loop {
        let client = connect(running).await?;
        let now: std::time::SystemTime = client
            .query_one("SELECT pg_conf_load_time()", &[])
            .await
            .map_err(reload)?
            .get(0);
        if now > before {
            return Ok(());
        }
        if started.elapsed() > RELOAD_LIMIT {
            return Err(CatalogError::NotReloaded(RELOAD_LIMIT));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn connect(running: &RunningPostgres) -> Result<tokio_postgres::Client, CatalogError> {
    let (client, connection) = running
        .admin_config()
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|source| CatalogError::Sql {
            action: "cannot connect over the socket",
            source,
        })?;
    tokio::spawn(connection);
    Ok(client)
}
