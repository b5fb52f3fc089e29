//! The IntegreSQL clients' role (`--integresql-pg-user`): one login role, as IntegreSQL's
//! shared user, that suites name in the PG* variables of their run to load a dump with
//! `psql` into the template they are initializing or into a test database; an initialize
//! answers with its credentials. It is made at each start; `template/client.rs` makes it
//! a member of a client-built template's own role at initialize and takes that back at
//! finalize, `session/clone.rs` makes it a member of each clone's role of a client-built
//! template (gone with the clone), and `pg_hba.conf`'s `samerole` rule lets it into a
//! database only while it is a member of the role named like that database.

use crate::config::IntegresqlRole;
use crate::error::StartError;
use crate::names::{quote_ident, quote_literal};

/// The comment that marks the role as pglease's: a role of that name without it is
/// someone else's, which pglease does not take over.
pub(crate) const ROLE_MARKER: &str = "created by pglease: the IntegreSQL clients' role";

/// Makes the role, or brings the one an earlier run made up to date: LOGIN with the given
/// password, no superuser or other attribute, `connection_limit` connections, and no
/// membership (those an earlier run left are taken back).
pub(crate) async fn ensure_role(
    client: &tokio_postgres::Client,
    role: &IntegresqlRole,
    connection_limit: u32,
) -> Result<(), StartError> {
    let sql_error = |context: &'static str| {
        move |source| StartError::Sql {
            context: context.into(),
            source,
        }
    };
    let existing = client
        .query_opt(
            "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1",
            &[&role.name],
        )
        .await
        .map_err(sql_error("looking up the IntegreSQL clients' role"))?;
    let name = quote_ident(&role.name);
    match existing {
        Some(row) if row.get::<_, Option<String>>(0).as_deref() != Some(ROLE_MARKER) => {
            return Err(StartError::IntegresqlRoleNotOurs {
                name: role.name.clone(),
            });
        }
        Some(_) => {
            let memberships = client
                .query(
                    "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid \
                     JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = $1",
                    &[&role.name],
                )
                .await
                .map_err(sql_error(
                    "reading the IntegreSQL clients' role's memberships",
                ))?;
            for row in memberships {
                let group: String = row.get(0);
                client
                    .batch_execute(&format!("REVOKE {} FROM {name}", quote_ident(&group)))
                    .await
                    .map_err(sql_error("taking back an earlier run's membership"))?;
            }
        }
        None => client
            .batch_execute(&format!("CREATE ROLE {name}"))
            .await
            .map_err(sql_error("creating the IntegreSQL clients' role"))?,
    }
    client
        .batch_execute(&format!(
            "ALTER ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS \
               INHERIT CONNECTION LIMIT {connection_limit} PASSWORD {verifier}; \
             ALTER ROLE {name} RESET ALL; \
             COMMENT ON ROLE {name} IS {marker};",
            // Postgres' own count: drivers such as pg8000 and lib/pq refuse fewer.
            verifier = quote_literal(&crate::scram::verifier(
                &role.password,
                crate::scram::STANDARD_ITERATIONS
            )),
            marker = quote_literal(ROLE_MARKER),
        ))
        .await
        .map_err(sql_error("setting up the IntegreSQL clients' role"))?;
    tracing::info!(
        role = %role.name,
        connection_limit,
        "IntegreSQL clients' role ready: with PGUSER={} (and its password), psql reaches each template between initialize and finalize",
        role.name
    );
    Ok(())
}
