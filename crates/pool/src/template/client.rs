//! Templates their clients build (the IntegreSQL API): `open_client_template` makes the
//! empty database and the login role the client migrates it with (or, with
//! `--integresql-pg-user`, lets that shared role in, whose credentials the client then
//! gets: `actor/client.rs`), and
//! `finalize_client_template` locks that role out, hands on what it made and seals the
//! database; the marker on such a database lets a later start keep it. What to open,
//! finalize or discard is the state's decision, not this file's.

use super::build_role::{create_build_role, retire_build_role};
use super::seal::{seal_template, write_relcache_init};
use super::{blame_a_lost_server, create_template_database, run_in, Built};
use crate::names::{quote_ident, DbName, TemplateName};
use crate::session::{client_template_marker, Session, OWNER_ROLE};
use crate::sql_error::SqlError;

/// Creates the empty database `db` of the client-built template `name` and a login role
/// named like it (the `sameuser` rule admits it there only) whose sessions act as the
/// owner role. Returns the role's password. What a failure leaves behind the pool
/// drops (`PoolState::template_opened` queues `db`, role included).
pub async fn open_client_template(
    session: &Session,
    name: &TemplateName,
    db: &DbName,
) -> Result<String, SqlError> {
    match open_client_template_steps(session, name, db).await {
        Err(error) => Err(blame_a_lost_server(session, error).await),
        opened => opened,
    }
}

async fn open_client_template_steps(
    session: &Session,
    name: &TemplateName,
    db: &DbName,
) -> Result<String, SqlError> {
    create_template_database(session, db, &client_template_marker(name)).await?;
    let password = create_build_role(session, db, false).await?;
    // Its client holds these credentials until it finalizes: without a limit it could take
    // every connection slot the lease holders need. It gets what a lease gets.
    session
        .execute(&format!(
            "ALTER ROLE {} CONNECTION LIMIT {}",
            quote_ident(db.as_str()),
            session.lease_connections()
        ))
        .await?;
    if let Some(shared) = session.integresql_role() {
        // Until the finalize, the PG* variables of the suite's run reach this database too
        // (`samerole`), with the rights of the role named like it.
        session
            .execute(&format!(
                "GRANT {} TO {}",
                quote_ident(db.as_str()),
                quote_ident(shared)
            ))
            .await?;
    }
    Ok(password)
}

/// Makes the database a client migrated a template: its login role is locked out and its
/// sessions ended (clients often finalize before closing their connection pool), what the
/// role owns goes to the owner role, the role goes, and the database is sealed.
pub async fn finalize_client_template(
    session: &Session,
    name: &TemplateName,
    db: &DbName,
    migrating_since: std::time::Instant,
) -> Result<Built, SqlError> {
    match finalize_client_template_steps(session, name, db, migrating_since).await {
        Err(error) => Err(blame_a_lost_server(session, error).await),
        finalized => finalized,
    }
}

async fn finalize_client_template_steps(
    session: &Session,
    name: &TemplateName,
    db: &DbName,
    migrating_since: std::time::Instant,
) -> Result<Built, SqlError> {
    let role = quote_ident(db.as_str());
    session
        .execute(&format!("ALTER ROLE {role} NOLOGIN"))
        .await?;
    let shared = session.integresql_role().map(quote_ident);
    if let Some(shared) = &shared {
        // The IntegreSQL clients' role loses its way in before the sessions end.
        session
            .execute(&format!("REVOKE {role} FROM {shared}"))
            .await?;
    }
    session.terminate_sessions(db).await?;
    if let Some(shared) = &shared {
        // What it made (a dump loaded with psql) goes to the owner role like the rest.
        run_in(
            session,
            db,
            &format!(
                "REASSIGN OWNED BY {shared} TO {owner}; DROP OWNED BY {shared};",
                owner = quote_ident(OWNER_ROLE)
            ),
        )
        .await
        .map_err(|e| {
            e.context(format!(
                "handing what the IntegreSQL clients' role made in {db} to {OWNER_ROLE}"
            ))
        })?;
    }
    retire_build_role(session, db, false).await?;
    seal_template(session, db).await?;
    write_relcache_init(session, db).await;
    let size_bytes = session.database_size(db).await?;
    tracing::info!(template = %name, database = %db, size_bytes, "client-built template finalized");
    Ok(Built {
        fingerprint: name.to_string(),
        db: db.clone(),
        elapsed: migrating_since.elapsed(),
        size_bytes,
        built_at: std::time::SystemTime::now(),
    })
}
