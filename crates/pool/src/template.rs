//! Templates: the fingerprint of a source, and the build of its template database
//! (create, apply the source as the lease role, mark `IS_TEMPLATE`, forbid connections).
//!
//! A build either finishes with a template database marked complete or leaves nothing
//! behind; errors are plain messages naming the file, postgres' message and the line,
//! because they travel to every waiting client.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tokio_postgres::error::ErrorPosition;
use tokio_postgres::NoTls;

use crate::config::TemplateSource;
use crate::names::{quote_ident, quote_literal, DbName, TemplateName, MARKER};
use crate::session::{pg_message, Session, OWNER_ROLE};
use crate::state::Built;

/// Sizes and modification times of a source's files: cheap to take, and compared before
/// paying for a hash when checking whether sources changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SourceStamp(Vec<(PathBuf, u64, Option<SystemTime>)>);

/// Takes the stamp of a source. Unreadable paths enter as such, so their repair shows.
pub fn stamp(source: &TemplateSource) -> SourceStamp {
    let mut entries = Vec::new();
    let mut add = |path: &Path| {
        let meta = std::fs::metadata(path).ok();
        entries.push((
            path.to_path_buf(),
            meta.as_ref().map_or(0, |m| m.len()),
            meta.and_then(|m| m.modified().ok()),
        ));
    };
    match source {
        TemplateSource::Empty => {}
        TemplateSource::SqlFile(path) => add(path),
        TemplateSource::Migrations(dir) => {
            // The directory's own mtime moves when a file is added, removed or renamed.
            add(dir);
            for file in migration_files(dir).unwrap_or_default() {
                add(&file);
            }
        }
    }
    SourceStamp(entries)
}

/// SHA-256 (hex) of a source and the postgres major version. File names and contents count;
/// for a migrations directory, only its `*.sql` files, in the order they are applied.
pub fn fingerprint(source: &TemplateSource, pg_major: u32) -> Result<String, String> {
    let mut hasher = Sha256::new();
    hasher.update(format!("pglease-template-v1\0postgres-{pg_major}\0").as_bytes());
    match source {
        TemplateSource::Empty => hasher.update(b"empty\0"),
        TemplateSource::SqlFile(path) => {
            hasher.update(b"sql\0");
            hash_file(&mut hasher, path)?;
        }
        TemplateSource::Migrations(dir) => {
            hasher.update(b"migrations\0");
            for path in migration_files(dir)? {
                hash_file(&mut hasher, &path)?;
            }
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

fn hash_file(hasher: &mut Sha256, path: &Path) -> Result<(), String> {
    let contents =
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    hasher.update(format!("{name}\0{}\0", contents.len()).as_bytes());
    hasher.update(&contents);
    Ok(())
}

/// The `*.sql` files of a directory in lexical (byte) order of their names.
pub fn migration_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read migrations directory {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry
            .map_err(|e| format!("cannot read migrations directory {}: {e}", dir.display()))?;
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "sql") && path.is_file() {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Builds (or, with `reuse_existing`, finds already built) the template database of `name`.
/// On failure nothing is left behind.
pub async fn build(
    session: &Session,
    name: &TemplateName,
    source: &TemplateSource,
    reuse_existing: bool,
) -> Result<Built, String> {
    let source_for_hash = source.clone();
    let major = session.pg_major;
    // Sources are small files, but reading them is still blocking I/O.
    let fingerprint = tokio::task::spawn_blocking(move || fingerprint(&source_for_hash, major))
        .await
        .map_err(|e| format!("fingerprint task failed: {e}"))??;
    let db = DbName::template(name, &fingerprint);
    let started = std::time::Instant::now();
    let finished = |fingerprint: String, db: DbName, size_bytes: i64| Built {
        fingerprint,
        db,
        elapsed: started.elapsed(),
        size_bytes,
        built_at: SystemTime::now(),
    };
    if reuse_existing && session.is_complete_template(&db).await? {
        tracing::info!(template = %name, %fingerprint, database = %db, "template already built");
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
        Err(message) => {
            if let Err(drop_error) = session.drop_database(&db).await {
                tracing::warn!(database = %db, error = %drop_error, "could not drop a half-built template");
            }
            Err(message)
        }
    }
}

async fn build_fresh(
    session: &Session,
    name: &TemplateName,
    source: &TemplateSource,
    db: &DbName,
) -> Result<(), String> {
    session.drop_database(db).await?;
    // Owned by the superuser: lease roles are members of the owner role and must not
    // gain power over template databases through it.
    session
        .execute(&format!(
            "CREATE DATABASE {} TEMPLATE template0",
            db.quoted()
        ))
        .await?;
    session
        .execute(&format!(
            "COMMENT ON DATABASE {} IS {}",
            db.quoted(),
            quote_literal(&format!("{MARKER}; template {name}"))
        ))
        .await?;
    apply_source(session, source, db).await?;
    session
        .wait_until_unused(db, Duration::from_secs(5))
        .await?;
    session
        .execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false IS_TEMPLATE true",
            db.quoted()
        ))
        .await?;
    Ok(())
}

/// Runs the source's SQL in the template database as the owner role, so that role owns
/// every object and the lease roles (its members) can alter, truncate and drop them.
async fn apply_source(
    session: &Session,
    source: &TemplateSource,
    db: &DbName,
) -> Result<(), String> {
    let files = match source {
        TemplateSource::Empty => return Ok(()),
        TemplateSource::SqlFile(path) => vec![path.clone()],
        TemplateSource::Migrations(dir) => {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || migration_files(&dir))
                .await
                .map_err(|e| format!("listing migrations failed: {e}"))??
        }
    };
    let mut config = session.admin_config.clone();
    config.dbname(db.as_str());
    let (mut client, connection) = config.connect(NoTls).await.map_err(|e| {
        format!(
            "cannot connect to template database {db}: {}",
            pg_message(&e)
        )
    })?;
    let connection = tokio::spawn(connection);
    let result = async {
        let owner = quote_ident(OWNER_ROLE);
        client
            .batch_execute(&format!(
                "GRANT ALL ON SCHEMA public TO {owner}; GRANT CREATE ON DATABASE {} TO {owner}; SET ROLE {owner};",
                db.quoted()
            ))
            .await
            .map_err(|e| format!("preparing the template database: {}", pg_message(&e)))?;
        for path in files {
            let sql = tokio::fs::read_to_string(&path)
                .await
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let transaction = client
                .transaction()
                .await
                .map_err(|e| format!("{}: {}", path.display(), pg_message(&e)))?;
            if let Err(error) = transaction.batch_execute(&sql).await {
                return Err(describe_sql_error(&path, &sql, &error));
            }
            transaction
                .commit()
                .await
                .map_err(|e| describe_sql_error(&path, &sql, &e))?;
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

/// `FILE: ERROR: message (line N)`, plus postgres' detail and hint when present.
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
