//! Templates: the fingerprint of a source, and the build of its template database
//! (create, apply the source as the lease role, mark `IS_TEMPLATE`, forbid connections).
//!
//! A build either finishes with a template database marked complete or leaves nothing
//! behind; errors are plain messages naming the file, postgres' message and, where postgres
//! reports a position in the file (syntax errors, unresolved names), the line, because they
//! travel to every waiting client.
//!
//! This file holds the build's outline (`build`: create, apply, settle, seal) and the
//! superuser's own connections to a template database (`run_in`). The steps live beside
//! it: `apply` applies SQL files, `build_role` creates and retires the temporary role a
//! source runs as, `command` runs a migration command or a dump's restore, `seal` settles
//! and seals a template and writes its relation cache init file, `client` opens and
//! finalizes client-built templates; `sources` reads and fingerprints the sources, `dump`
//! tells a dump's format, `open` is the one way either opens a source file. How far a
//! long build is shows on the session's board (`crate::progress`).

use std::path::Path;

use tokio_postgres::error::ErrorPosition;
use tokio_postgres::NoTls;

use crate::config::TemplateSource;
use crate::names::{quote_ident, quote_literal, DbName, TemplateName, MARKER};
use crate::session::{Session, OWNER_ROLE};
use crate::sql_error::pg_message;
use crate::sql_error::{SqlError, SqlErrorKind};

mod apply;
mod build_role;
mod client;
mod command;
mod dump;
mod open;
mod seal;
mod source_error;
mod sources;

use apply::apply_source;
pub use client::{finalize_client_template, open_client_template};
pub(crate) use seal::write_relcache_init;
use seal::{seal_template, settle};
pub use sources::{
    check as check_source, current_versions, fingerprint, migration_files, stamp, SourceStamp,
};

/// A finished build (of a configured template, or a client-built one finalized): what the
/// build job reports and the state keeps of the template version. It lives here, not in
/// `state`, so that the builds need nothing of the state.
#[derive(Debug, Clone)]
pub(crate) struct Built {
    pub fingerprint: String,
    pub db: DbName,
    pub elapsed: std::time::Duration,
    pub size_bytes: i64,
    pub built_at: std::time::SystemTime,
}

/// Builds (or, with `reuse_existing`, finds already built) the template database of `name`.
/// On failure nothing is left behind.
pub async fn build(
    session: &Session,
    name: &TemplateName,
    source: &TemplateSource,
    reuse_existing: bool,
) -> Result<Built, SqlError> {
    let source_for_hash = source.clone();
    let major = session.pg_major;
    // Blocking I/O on paths a caller may have named: with the child user's rights.
    let user = &session.child_user;
    // What the sources' files say is no SQL's: no SQLSTATE to keep.
    let fingerprint = user
        .read(move || fingerprint(&source_for_hash, major))
        .await
        .map_err(|e| SqlError::other(e.to_string()))?
        .map_err(|e| SqlError::other(user.explain(e)))?;
    let db = DbName::template(name, &fingerprint);
    let started = std::time::Instant::now();
    let finished = |fingerprint: String, db: DbName, size_bytes: i64| Built {
        fingerprint,
        db,
        elapsed: started.elapsed(),
        size_bytes,
        built_at: std::time::SystemTime::now(),
    };
    if reuse_existing && session.is_complete_template(&db).await? {
        tracing::info!(template = %name, %fingerprint, database = %db, "template already built");
        // Postgres removes every relation cache init file when it starts.
        write_relcache_init(session, &db).await;
        let size = session.database_size(&db).await?;
        return Ok(finished(fingerprint, db, size));
    }
    match build_fresh(session, name, source, &db).await {
        Ok(()) => {
            let size = session.database_size(&db).await?;
            tracing::info!(
                template = %name, %fingerprint, database = %db,
                elapsed_ms = started.elapsed().as_millis() as u64,
                size_bytes = size,
                "template built"
            );
            Ok(finished(fingerprint, db, size))
        }
        Err(error) => {
            let error = blame_a_lost_server(session, error).await;
            if let Err(drop_error) = session.drop_database(&db).await {
                tracing::warn!(database = %db, error = %drop_error, "could not drop a half-built template");
            }
            Err(error)
        }
    }
}

async fn build_fresh(
    session: &Session,
    name: &TemplateName,
    source: &TemplateSource,
    db: &DbName,
) -> Result<(), SqlError> {
    create_template_database(session, db, &format!("{MARKER}; template {name}")).await?;
    match source {
        // A command is killed at its own timeout (with its process group).
        TemplateSource::Command(_) => apply_source(session, name, source, db).await?,
        // A migration that sleeps or waits on a lock would otherwise build forever. When
        // this gives up, the caller's DROP DATABASE … WITH (FORCE) ends its backend.
        _ => tokio::time::timeout(
            session.build_timeout,
            apply_source(session, name, source, db),
        )
        .await
        .map_err(|_| {
            SqlError::timeout(format!(
                "the migrations did not finish within {} s (--build-timeout)",
                session.build_timeout.as_secs()
            ))
        })??,
    }
    settle(session, db).await?;
    seal_template(session, db).await?;
    write_relcache_init(session, db).await;
    Ok(())
}

/// Creates the empty database `db` (after dropping a leftover of that name) with our
/// marker `comment`. Owned by the superuser: lease roles are members of the owner role and
/// must not gain power over template databases through it.
pub(super) async fn create_template_database(
    session: &Session,
    db: &DbName,
    comment: &str,
) -> Result<(), SqlError> {
    session.drop_database(db).await?;
    // A full storage fails here first (copying template0): its SQLSTATE must reach the
    // API, which answers 507 for the room and not 422 for the user's sources.
    session
        .execute(&format!(
            "CREATE DATABASE {} TEMPLATE template0",
            db.quoted()
        ))
        .await
        .map_err(|e| e.context(format!("creating the template database {db}")))?;
    session
        .execute(&format!(
            "COMMENT ON DATABASE {} IS {}",
            db.quoted(),
            quote_literal(comment)
        ))
        .await?;
    run_in(
        session,
        db,
        &format!(
            "GRANT ALL ON SCHEMA public TO {owner}; GRANT CREATE ON DATABASE {} TO {owner};",
            db.quoted(),
            owner = quote_ident(OWNER_ROLE)
        ),
    )
    .await
    .map_err(|e| e.context("preparing the template database"))
}

/// Runs `sql` in database `db` as the superuser, on a connection of its own, with
/// `search_path` pinned to `pg_catalog`: a build role may have created anything in `public`.
pub(super) async fn run_in(session: &Session, db: &DbName, sql: &str) -> Result<(), SqlError> {
    run_each_in(session, db, &[sql]).await
}

/// Runs each of `statements` in `db` as the superuser, one after the other on one
/// connection, each in a transaction of its own (VACUUM cannot run inside one).
pub(super) async fn run_each_in(
    session: &Session,
    db: &DbName,
    statements: &[&str],
) -> Result<(), SqlError> {
    let mut config = session.admin_config.clone();
    crate::session::add_options(&mut config, crate::session::PINNED_SEARCH_PATH);
    config.dbname(db.as_str());
    let (client, connection) = config.connect(NoTls).await.map_err(|e| {
        SqlError::described(&e, format!("cannot connect to {db}: {}", pg_message(&e)))
    })?;
    let connection = tokio::spawn(connection);
    let mut result = Ok(());
    for sql in statements {
        // Each statement's SQLSTATE travels: a VACUUM (FREEZE) that meets a full disk is
        // the room's failure, not the template's.
        result = client
            .batch_execute(sql)
            .await
            .map_err(|e| SqlError::from_pg(&e));
        if result.is_err() {
            break;
        }
    }
    drop(client);
    // The connection task ends once the client is gone; its result carries nothing new.
    let _ = connection.await;
    result
}

/// `FILE: ERROR: message`, plus postgres' detail and hint when present, and ` (line N)`
/// when postgres reports the error's position in the file's text (a syntax error, a name a
/// statement cannot resolve); an error raised while a statement runs has none.
pub fn describe_sql_error(path: &Path, sql: &str, error: &tokio_postgres::Error) -> String {
    let mut text = format!("{}: {}", path.display(), pg_message(error));
    if let Some(ErrorPosition::Original(position)) = error.as_db_error().and_then(|e| e.position())
    {
        text.push_str(&format!(" (line {})", line_of(sql, *position as usize)));
    }
    text
}

/// The 1-based line of a 1-based character position.
fn line_of(sql: &str, position: usize) -> usize {
    sql.chars()
        .take(position.saturating_sub(1))
        .filter(|&c| c == '\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests;

/// A command's failure, or a step that reports in words, has no kind of its own: if the
/// server no longer answers, that is why it failed, not the template's sources or the
/// client's template.
pub(super) async fn blame_a_lost_server(session: &Session, mut error: SqlError) -> SqlError {
    if error.kind == SqlErrorKind::Other && !session.answers().await {
        error.kind = SqlErrorKind::ConnectionLost;
    }
    error
}
