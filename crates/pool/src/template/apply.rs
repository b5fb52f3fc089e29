//! Applying a configured template's source to its database: SQL files and migration
//! directories, each file in a transaction of its own on one connection of the temporary
//! build role (`build_role.rs`); a command or a dump is handed to `command.rs`.

use std::path::PathBuf;

use tokio_postgres::NoTls;

use super::build_role::{create_build_role, retire_build_role};
use super::command::{run_command, run_command_with, Progress};
use super::{describe_sql_error, dump, migration_files, sources};
use crate::child_user::ChildUser;
use crate::config::TemplateSource;
use crate::names::{DbName, TemplateName};
use crate::session::Session;
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
                .map_err(|e| SqlError::other(e.to_string()))?
                .map_err(|e| SqlError::other(user.explain(e)))?
        }
        TemplateSource::Command(command) => {
            run_command(session, command, db, superuser).await?;
            return retire_build_role(session, db, superuser).await;
        }
        TemplateSource::Dump(dump) => {
            let restore = dump::restore_command(dump, &session.child_user)
                .await
                .map_err(|e| SqlError::other(e.to_string()))?;
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
                .map_err(|e| SqlError::other(e.to_string()))?
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
