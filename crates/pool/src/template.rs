//! Templates: the fingerprint of a source, and the build of its template database
//! (create, apply the source as the lease role, mark `IS_TEMPLATE`, forbid connections).
//!
//! A build either finishes with a template database marked complete or leaves nothing
//! behind; errors are plain messages naming the file, postgres' message and, where postgres
//! reports a position in the file (syntax errors, unresolved names), the line, because they
//! travel to every waiting client.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_postgres::error::ErrorPosition;
use tokio_postgres::NoTls;

use crate::child_user::ChildUser;
use crate::config::{CommandSource, TemplateSource};
use crate::names::{quote_ident, quote_literal, DbName, TemplateName, MARKER};
use crate::session::{pg_message, Session, OWNER_ROLE};
use crate::sql_error::{SqlError, SqlErrorKind};
use crate::state::Built;

mod dump;
pub mod progress;
mod sources;

pub use sources::{
    check as check_source, current_versions, fingerprint, migration_files, stamp, SourceStamp,
};

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
    let fingerprint = user
        .read(move || fingerprint(&source_for_hash, major))
        .await?
        .map_err(|e| user.explain(e))?;
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
        Err(mut error) => {
            // A command's failure, or a step that reports in words, has no kind of its own:
            // if the server no longer answers, that is why, not the template's sources.
            if error.kind == SqlErrorKind::Other && !session.answers().await {
                error.kind = SqlErrorKind::ConnectionLost;
            }
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
async fn create_template_database(
    session: &Session,
    db: &DbName,
    comment: &str,
) -> Result<(), String> {
    session.drop_database(db).await?;
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
    .map_err(|e| format!("preparing the template database: {e}"))
}

/// Marks a migrated database a template nobody may connect to, once its sessions are gone.
async fn seal_template(session: &Session, db: &DbName) -> Result<(), String> {
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

/// Gives the sealed template `db` a relation cache init file (`pg_internal.init`) by opening
/// one connection to it: the first backend of a database without one builds the cache from
/// the catalogs and writes it. `CREATE DATABASE … STRATEGY FILE_COPY` copies the file into
/// every clone (postgres recomputes the relations' file addresses when it loads one, for
/// that very case), so a lease holder's first connection loads it instead of building it.
/// Without it, every clone's first connection paid that: measured on PostgreSQL 15 with the
/// bench fixture, an idle server, libpq, p50 of 15, 8.3 ms against 4.4 ms with the file.
///
/// Settling the template (its `VACUUM` changes `pg_class`) and every postgres start remove
/// the file, so this runs after each build and for each template a start finds built. The
/// connection needs `ALLOW_CONNECTIONS` for a moment: nobody else can log in to a template
/// (no role bears its name, and the superuser connects only over the private socket). Only
/// an optimization: a failure is logged, and clones then build their cache themselves.
pub(crate) async fn write_relcache_init(session: &Session, db: &DbName) {
    let allow = async |allowed: bool| {
        let sql = format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS {allowed}",
            db.quoted()
        );
        session.execute(&sql).await.map_err(String::from)
    };
    let written = match allow(true).await {
        Ok(()) => {
            let connected = run_in(session, db, "SELECT 1").await;
            // Sealed again whatever happened; until then the build is not complete.
            let sealed = allow(false).await;
            let unused = session.wait_until_unused(db, Duration::from_secs(5)).await;
            connected.and(sealed).and(unused)
        }
        Err(error) => Err(error),
    };
    match written {
        Ok(()) => tracing::debug!(database = %db, "wrote the template's relation cache init file"),
        Err(error) => tracing::warn!(
            database = %db, %error,
            "could not write the template's relation cache init file; each clone's first \
             connection builds the cache itself"
        ),
    }
}

/// Runs `sql` in database `db` as the superuser, on a connection of its own, with
/// `search_path` pinned to `pg_catalog`: a build role may have created anything in `public`.
async fn run_in(session: &Session, db: &DbName, sql: &str) -> Result<(), String> {
    run_each_in(session, db, &[sql]).await
}

/// Runs each of `statements` in `db` as the superuser, one after the other on one
/// connection, each in a transaction of its own (VACUUM cannot run inside one).
async fn run_each_in(session: &Session, db: &DbName, statements: &[&str]) -> Result<(), String> {
    let mut config = session.admin_config.clone();
    crate::session::add_options(&mut config, crate::session::PINNED_SEARCH_PATH);
    config.dbname(db.as_str());
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| format!("cannot connect to {db}: {}", pg_message(&e)))?;
    let connection = tokio::spawn(connection);
    let mut result = Ok(());
    for sql in statements {
        result = client.batch_execute(sql).await.map_err(|e| pg_message(&e));
        if result.is_err() {
            break;
        }
    }
    drop(client);
    // The connection task ends once the client is gone; its result carries nothing new.
    let _ = connection.await;
    result
}

/// After a template's sources are applied, once: `ANALYZE`, `CHECKPOINT`, `VACUUM (FREEZE)`.
/// Without it a clone has no statistics (pg_restore before 18 restores none, and a
/// clone's autovacuum never analyzes tables nobody changes), so the planner guesses in every
/// clone; rows whose hint bits nothing set yet (a table without indexes, or indexed before
/// the load's commit was flushed) are hinted by each clone's first read, which dirties and
/// later writes every page it reads; and no page is all-visible, so no index-only scan.
/// Measured on PostgreSQL 15 (300 MB of pgbench tables): `VACUUM (FREEZE, ANALYZE)` costs
/// what `ANALYZE` alone does (~0.2 s), and a clone's first full scan took 83 to 88 ms after it
/// against 100 to 153 ms without it when the rows were unhinted; after a parallel restore
/// whose index builds had hinted the rows, the same 106 ms either way (bench scenario 10,
/// where the step takes 1.35 s of a 6 s build of 1 GB).
///
/// The order is ANALYZE, CHECKPOINT, VACUUM (FREEZE). The CHECKPOINT before the VACUUM
/// because the server commits asynchronously (`synchronous_commit=off`): until a commit
/// record is flushed, VACUUM may neither hint nor freeze that transaction's rows, and a
/// VACUUM right after a restore left every page unfrozen (measured: a tar dump, 0 of 6 pages
/// all-visible; after a CHECKPOINT, 6 of 6). ANALYZE before both, because the statistics it
/// writes are rows too: analyzed last (`VACUUM (FREEZE, ANALYZE)`), `pg_statistic` was left
/// unhinted, and a clone's first planned query dirtied its page; in this order a clone's
/// reads dirty no buffer at all (measured with pg_buffercache), which is what lets the
/// server prove a released read-only clone unchanged (`session/proof.rs`). For a template of
/// migrations it costs tens of milliseconds.
async fn settle(session: &Session, db: &DbName) -> Result<(), String> {
    let started = std::time::Instant::now();
    run_each_in(session, db, &["ANALYZE", "CHECKPOINT", "VACUUM (FREEZE)"])
        .await
        .map_err(|e| {
            format!("settling the template (ANALYZE, CHECKPOINT, VACUUM (FREEZE)): {e}")
        })?;
    tracing::info!(
        database = %db,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "froze and analyzed the template: its clones read it without setting hint bits, and \
         plan with its statistics"
    );
    Ok(())
}

/// Hands whatever the temporary login role `db` made as itself (a tool may reset its role)
/// to the owner role, and drops the login role.
///
/// A superuser build's own objects — what its SQL made after `SET ROLE NONE`: an untrusted
/// extension's functions, a foreign-data wrapper — go to the daemon's superuser instead.
/// Handed to the owner role, they would make every lease role their owner, with rights the
/// extension withholds from everyone (adminpack's `pg_file_write`, for one).
async fn retire_build_role(session: &Session, db: &DbName, superuser: bool) -> Result<(), String> {
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
    .map_err(|e| format!("handing the objects of {db} to {whose}: {e}"))?;
    session
        .execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await?;
    Ok(())
}

/// Creates the empty database `db` of the client-built template `name` and a login role
/// named like it (the `sameuser` rule admits it there only) whose sessions act as the
/// owner role. Returns the role's password. What a failure leaves behind the pool
/// drops (`PoolState::template_opened` queues `db`, role included).
pub async fn open_client_template(
    session: &Session,
    name: &TemplateName,
    db: &DbName,
) -> Result<String, SqlError> {
    let opened = open_client_template_steps(session, name, db).await;
    blame_a_lost_server(session, opened).await
}

/// A step that reports in words has no kind of its own: if the server no longer answers,
/// that is why it failed, not the client's template.
async fn blame_a_lost_server<T>(
    session: &Session,
    outcome: Result<T, SqlError>,
) -> Result<T, SqlError> {
    match outcome {
        Err(mut error) if error.kind == SqlErrorKind::Other && !session.answers().await => {
            error.kind = SqlErrorKind::ConnectionLost;
            Err(error)
        }
        outcome => outcome,
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
    let finalized = finalize_client_template_steps(session, name, db, migrating_since).await;
    blame_a_lost_server(session, finalized).await
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
            format!("handing what the IntegreSQL clients' role made in {db} to {OWNER_ROLE}: {e}")
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

/// The comment on a client-built template's database; the sweep at start keeps complete
/// ones (see [`parse_client_template_marker`]).
pub fn client_template_marker(name: &TemplateName) -> String {
    format!("{MARKER}; client template {name}")
}

/// The template name in a [`client_template_marker`].
pub fn parse_client_template_marker(comment: &str) -> Option<TemplateName> {
    let name = comment.strip_prefix(&format!("{MARKER}; client template "))?;
    TemplateName::new(name).ok()
}

/// Applies the source to the template database as a temporary LOGIN role named like the
/// database, which is not a superuser: its sessions act as the owner role, and no
/// statement of the source (`RESET ROLE` included) reaches more than the owner role can.
/// A [`TemplateSource::Superuser`] source, which only the operator can configure, runs as
/// a temporary superuser role instead. Either way what the role made is handed to the owner
/// role afterwards, so the lease roles (its members) can alter, truncate and drop it.
async fn apply_source(
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
                .await?
                .map_err(|e| user.explain(e))?
        }
        TemplateSource::Command(command) => {
            run_command(session, command, db, superuser).await?;
            return Ok(retire_build_role(session, db, superuser).await?);
        }
        TemplateSource::Dump(dump) => {
            let restore = dump::restore_command(dump, &session.child_user).await?;
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
                    .map_err(|e| format!("restoring {} with {tool}: {e}", dump.path.display()));
            let retired = retire_build_role(session, db, superuser).await;
            return Ok(restored.and(retired)?);
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
    applied.and(retired.map_err(SqlError::from))
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
                .await?
                .map_err(|e| child_user.explain(e))?;
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

/// PBKDF2 iterations postgres itself uses for SCRAM verifiers (and the minimum some
/// drivers accept).
pub(crate) const STANDARD_SCRAM_ITERATIONS: u32 = 4096;

/// Lines of a command's output kept for its error message.
const OUTPUT_TAIL_LINES: usize = 40;

/// Creates the temporary login role of a build: named like the template database `db`
/// (so the `sameuser` rule admits it there only), its sessions acting as the owner role.
/// Returns its password.
async fn create_build_role(
    session: &Session,
    db: &DbName,
    superuser: bool,
) -> Result<String, String> {
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
                STANDARD_SCRAM_ITERATIONS
            )),
            owner = quote_ident(OWNER_ROLE),
            owner_literal = quote_literal(OWNER_ROLE),
            marker = quote_literal(MARKER),
        ))
        .await?;
    Ok(password)
}

/// Runs a migration command against the template database `db` as a temporary login role
/// named like the database (so the `sameuser` rule admits it) whose sessions act as the
/// owner role. Fails with the exit status (or the timeout) and the tail of its output.
async fn run_command(
    session: &Session,
    source: &CommandSource,
    db: &DbName,
    superuser: bool,
) -> Result<(), String> {
    run_command_with(session, source, db, superuser, None).await
}

/// What a long command reports while it runs: lines of its output that `counts` picks,
/// against an expected `total`, logged every [`PROGRESS_EVERY`].
struct Progress {
    template: TemplateName,
    what: String,
    total: Option<u64>,
    counts: fn(&str) -> bool,
}

/// How often a long build logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// [`run_command`], logging `progress` while it runs.
async fn run_command_with(
    session: &Session,
    source: &CommandSource,
    db: &DbName,
    superuser: bool,
    progress: Option<Progress>,
) -> Result<(), String> {
    let password = create_build_role(session, db, superuser).await?;
    let host = session.lease_host.clone();
    let port = session.lease_port.to_string();
    // The embedded server has no TLS; some drivers (lib/pq) insist on it unless told.
    let options = if session.external {
        ""
    } else {
        "?sslmode=disable"
    };
    let url = format!(
        "postgres://{}:{password}@{host}:{port}/{}{options}",
        db.as_str(),
        db.as_str()
    );
    // As the child user, never as the daemon's (root's) own; with none of its environment.
    let user = &session.child_user;
    let mut command = user.command("sh");
    command
        .arg("-c")
        .arg(&source.command)
        .current_dir(&source.workdir)
        .env("DATABASE_URL", &url)
        .env("PGHOST", &host)
        .env("PGPORT", &port)
        .env("PGUSER", db.as_str())
        .env("PGPASSWORD", &password)
        .env("PGDATABASE", db.as_str())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Its own process group, so a timeout or a shutdown kills the tool and everything it
        // started (`CommandGroup`).
        .process_group(0)
        .kill_on_drop(true);
    tracing::info!(database = %db, command = %source.command, workdir = %source.workdir.display(), user = %user.name, "running the migration command");
    let started = std::time::Instant::now();
    let mut child = CommandGroup(command.spawn().map_err(|e| {
        format!(
            "cannot run `{}` in {} as {}: {e}",
            source.command,
            source.workdir.display(),
            user.describe()
        )
    })?);
    let tail = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counts = progress.as_ref().map(|p| p.counts);
    let readers = [
        child
            .0
            .stdout
            .take()
            .map(|out| tokio::spawn(keep_tail(out, tail.clone(), counts, done.clone()))),
        child
            .0
            .stderr
            .take()
            .map(|err| tokio::spawn(keep_tail(err, tail.clone(), counts, done.clone()))),
    ];
    // One live view of the progress: shown in /status while the command runs (the guard
    // takes it off), and logged every few seconds.
    let live = progress.map(|progress| {
        let live = progress::Live {
            step: progress.what,
            total: progress.total,
            done: done.clone(),
            started,
        };
        (
            session
                .build_progress
                .show(&progress.template, live.clone()),
            live,
        )
    });
    let reporter = live.as_ref().map(|(_, live)| {
        let (live, db) = (live.clone(), db.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(PROGRESS_EVERY);
            every.tick().await;
            loop {
                every.tick().await;
                log_progress(&db, &live.report());
            }
        })
    });
    let waited = tokio::time::timeout(source.timeout, child.0.wait()).await;
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    let outcome = match waited {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!(
            "`{}` failed ({status}; it ran as {} in {})",
            source.command,
            user.describe(),
            source.workdir.display()
        )),
        Ok(Err(error)) => Err(format!("waiting for `{}`: {error}", source.command)),
        Err(_) => {
            child.kill();
            let _ = child.0.wait().await;
            Err(format!(
                "`{}` did not finish within {} s and was killed",
                source.command,
                source.timeout.as_secs()
            ))
        }
    };
    for reader in readers.into_iter().flatten() {
        // Output of a killed group's orphans must not hold us: the pipes close with them.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), reader).await;
    }
    match outcome {
        Ok(()) => {
            tracing::info!(database = %db, elapsed_ms = started.elapsed().as_millis() as u64, "the migration command succeeded");
            Ok(())
        }
        Err(message) => {
            let lines: Vec<String> = tail
                .lock()
                .map(|t| t.iter().cloned().collect())
                .unwrap_or_default();
            Err(format!(
                "{message}; last lines of its output:\n{}",
                lines.join("\n")
            ))
        }
    }
}

/// A migration command leading its own process group (`process_group(0)`). Dropped while
/// the command runs — the build's future is dropped when the daemon shuts down — it
/// SIGKILLs the whole group, where `kill_on_drop` reaches only the `sh` running the command
/// and leaves the tools it started running.
struct CommandGroup(tokio::process::Child);

impl CommandGroup {
    /// SIGKILLs the group, if the command has not been reaped yet. Until it is, its pid, which
    /// is the group's id, cannot be reused: the signal cannot reach a stranger's group.
    fn kill(&mut self) {
        if let Some(pid) = self.0.id().and_then(|pid| i32::try_from(pid).ok()) {
            let group = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Drop for CommandGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One progress line: done of total (with a share and an estimate of the time left), or
/// that it still runs when the total is unknown.
fn log_progress(db: &DbName, p: &crate::types::BuildProgress) {
    match (p.total, p.percent) {
        (Some(total), Some(percent)) => tracing::info!(
            database = %db,
            done = p.done,
            total,
            percent,
            elapsed_s = p.elapsed_secs,
            eta_s = ?p.eta_secs,
            "{}: about {} of {total} entries",
            p.step,
            p.done
        ),
        _ => {
            tracing::info!(database = %db, elapsed_s = p.elapsed_secs, "{}: still running", p.step)
        }
    }
}

/// Reads a pipe to its end, keeping the last lines (bytes that are not UTF-8 are replaced)
/// and counting those `counts` picks into `done`.
async fn keep_tail(
    pipe: impl tokio::io::AsyncRead + Unpin,
    tail: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    counts: Option<fn(&str) -> bool>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut reader = tokio::io::BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line).trim_end().to_owned();
                if counts.is_some_and(|counts| counts(&text)) {
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                if let Ok(mut tail) = tail.lock() {
                    if tail.len() == OUTPUT_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(text);
                }
            }
        }
    }
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
