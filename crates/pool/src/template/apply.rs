//! Applying a configured template's source to its database: SQL files and migration
//! directories, each file in a transaction of its own on one connection of the temporary
//! build role; a command or a dump is handed to `command.rs`. Here too the build role
//! itself: created before the source runs, and retired after it, what it made handed on.

use std::path::PathBuf;

use tokio_postgres::NoTls;

use super::command::{run_command, run_command_with, Progress};
use super::{describe_sql_error, dump, migration_files, run_in, sources};
use crate::child_user::ChildUser;
use crate::config::TemplateSource;
use crate::names::{quote_ident, quote_literal, DbName, TemplateName, MARKER};
use crate::session::{Session, OWNER_ROLE};
use crate::sql_error::pg_message;
use crate::sql_error::SqlError;

/// Applies the source to the template database as a temporary LOGIN role named like the
/// database, which is not a superuser: its sessions act as the owner role, and no
/// statement of the source (`RESET ROLE` included) reaches more than the owner role can.
/// A [`TemplateSource::Superuser`] source, which only the operator can configure, runs as
/// a temporary superuser role instead. Either way what the role made is handed to the owner
/// role afterwards, so the lease roles (its members) can alter, truncate and drop it.
pub(super) async fn apply_source(
    session: &Session,
    name: &TemplateName,
    source: &TemplateSource,
    db: &DbName,
) -> Result<(), SqlError> {
    let (inner, superuser) = match source {
        TemplateSource::Superuser(inner) => {
            tracing::warn!(database = %db, "applying a template source as the superuser (superuser = true in the configuration)");
            (&**inner, true)
        }
        other => (other, false),
    };
    let files = match inner {
        TemplateSource::Empty => return Ok(()),
        TemplateSource::SqlFile(path) => vec![path.clone()],
        TemplateSource::Migrations(dir) => {
            let dir = dir.clone();
            let user = &session.child_user;
            user.read(move || migration_files(&dir))
                .await
                .map_err(SqlError::other)?
                .map_err(|e| SqlError::other(user.explain(e)))?
        }
        TemplateSource::Command(command) => {
            run_command(session, command, db, superuser).await?;
            return retire_build_role(session, db, superuser).await;
        }
        TemplateSource::Dump(dump) => {
            let restore = dump::restore_command(dump, &session.child_user)
                .await
                .map_err(SqlError::other)?;
            let (format, tool) = (restore.format, restore.tool.clone());
            tracing::info!(database = %db, dump = %dump.path.display(), ?format, %tool, entries = ?restore.entries, command = %restore.command.command, "restoring a dump into the template");
            let progress = Progress {
                template: name.clone(),
                what: format!("restoring {}", dump.path.display()),
                total: restore.entries,
                counts: restore.counts,
            };
            let restored =
                run_command_with(session, &restore.command, db, superuser, Some(progress))
                    .await
                    .map_err(|e| {
                        e.context(format!("restoring {} with {tool}", dump.path.display()))
                    });
            let retired = retire_build_role(session, db, superuser).await;
            return restored.and(retired);
        }
        // Built by its client, never here; a superuser source wraps one plain source.
        TemplateSource::Client | TemplateSource::Superuser(_) => return Ok(()),
    };
    let password = create_build_role(session, db, superuser).await?;
    let mut config = session.admin_config.clone();
    // The same way in as the daemon (the private socket of the embedded server, or the
    // external server's host), as the build role.
    config
        .user(db.as_str())
        .password(password.as_str())
        .dbname(db.as_str());
    let applied = apply_files(config, &files, db, &session.child_user).await;
    let retired = retire_build_role(session, db, superuser).await;
    applied.and(retired)
}

/// Runs each file in its own transaction on one connection made with `config`.
async fn apply_files(
    config: tokio_postgres::Config,
    files: &[PathBuf],
    db: &DbName,
    child_user: &ChildUser,
) -> Result<(), SqlError> {
    let (mut client, connection) = config.connect(NoTls).await.map_err(|e| {
        let message = format!(
            "cannot connect to template database {db}: {}",
            pg_message(&e)
        );
        SqlError::described(&e, message)
    })?;
    let connection = tokio::spawn(connection);
    let result = async {
        for path in files {
            let file = path.clone();
            let sql = child_user
                .read(move || sources::read_sql(&file))
                .await
                .map_err(SqlError::other)?
                .map_err(|e| SqlError::other(child_user.explain(e)))?;
            // Postgres' words, naming the file (and line), with the kind of the error.
            let transaction = client.transaction().await.map_err(|e| {
                SqlError::described(&e, format!("{}: {}", path.display(), pg_message(&e)))
            })?;
            if let Err(error) = transaction.batch_execute(&sql).await {
                return Err(SqlError::described(
                    &error,
                    describe_sql_error(path, &sql, &error),
                ));
            }
            transaction
                .commit()
                .await
                .map_err(|e| SqlError::described(&e, describe_sql_error(path, &sql, &e)))?;
            tracing::debug!(database = %db, file = %path.display(), "migration applied");
        }
        Ok(())
    }
    .await;
    drop(client);
    // The connection task ends once the client is gone; its result carries nothing new.
    let _ = connection.await;
    result
}

/// Creates the temporary login role of a build: named like the template database `db`
/// (so the `sameuser` rule admits it there only), its sessions acting as the owner role.
/// Returns its password.
pub(super) async fn create_build_role(
    session: &Session,
    db: &DbName,
    superuser: bool,
) -> Result<String, SqlError> {
    let role = quote_ident(db.as_str());
    let password = crate::scram::random_password();
    // Either way its sessions start acting as the owner role (`RESET ROLE` returns to that
    // default); a superuser one regains its rights only with an explicit `SET ROLE NONE`
    // (see `retire_build_role` for what it then makes).
    let attribute = if superuser {
        "SUPERUSER"
    } else {
        "NOSUPERUSER"
    };
    session
        .execute(&format!(
            "CREATE ROLE {role} LOGIN {attribute} NOCREATEDB NOCREATEROLE NOREPLICATION \
               PASSWORD {verifier} IN ROLE {owner}; \
             ALTER ROLE {role} SET role = {owner_literal}; \
             COMMENT ON ROLE {role} IS {marker};",
            // Postgres' standard count, not the lease roles' low one: some drivers (Go's
            // lib/pq, used by dbmate and others) refuse fewer than 4096 iterations, and a
            // build connects only a few times.
            verifier = quote_literal(&crate::scram::verifier(
                &password,
                crate::scram::STANDARD_ITERATIONS
            )),
            owner = quote_ident(OWNER_ROLE),
            owner_literal = quote_literal(OWNER_ROLE),
            marker = quote_literal(MARKER),
        ))
        .await?;
    Ok(password)
}

/// Hands whatever the temporary login role `db` made as itself (a tool may reset its role)
/// to the owner role, and drops the login role.
///
/// A superuser build's own objects — what its SQL made after `SET ROLE NONE`: an untrusted
/// extension's functions, a foreign-data wrapper — go to the daemon's superuser instead.
/// Handed to the owner role, they would make every lease role their owner, with rights the
/// extension withholds from everyone (adminpack's `pg_file_write`, for one).
pub(super) async fn retire_build_role(
    session: &Session,
    db: &DbName,
    superuser: bool,
) -> Result<(), SqlError> {
    let role = quote_ident(db.as_str());
    let (heir, whose) = if superuser {
        ("CURRENT_USER".to_owned(), "the superuser")
    } else {
        (quote_ident(OWNER_ROLE), OWNER_ROLE)
    };
    run_in(
        session,
        db,
        &format!("REASSIGN OWNED BY {role} TO {heir}; DROP OWNED BY {role};"),
    )
    .await
    .map_err(|e| e.context(format!("handing the objects of {db} to {whose}")))?;
    session
        .execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await?;
    Ok(())
}
