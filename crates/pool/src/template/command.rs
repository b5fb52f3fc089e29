//! Running a migration command (or a dump's restore) against a template database: as the
//! user `command/runner.rs` chooses (the owner of an operator's checkout, else the child
//! user), in a process group of its own that a timeout or a shutdown kills whole,
//! with the build role's credentials in its environment, its output's tail kept for the
//! error message and, for a restore, its progress counted for the log and `/status`.

use std::time::Duration;

use super::build_role::create_build_role;
use crate::config::CommandSource;
use crate::names::{DbName, TemplateName};
use crate::progress;
use crate::session::Session;
use crate::sql_error::SqlError;
use crate::types::ConnectInfo;

/// Lines of a command's output kept for its error message.
const OUTPUT_TAIL_LINES: usize = 40;

/// Runs a migration command against the template database `db` as a temporary login role
/// named like the database (so the `sameuser` rule admits it) whose sessions act as the
/// owner role. Fails with the exit status (or the timeout) and the tail of its output.
pub(super) async fn run_command(
    session: &Session,
    source: &CommandSource,
    db: &DbName,
    superuser: bool,
) -> Result<(), SqlError> {
    run_command_with(session, source, db, superuser, None).await
}

/// What a long command reports while it runs: lines of its output that `counts` picks,
/// against an expected `total`, logged every [`PROGRESS_EVERY`].
pub(super) struct Progress {
    pub(super) template: TemplateName,
    pub(super) what: String,
    pub(super) total: Option<u64>,
    pub(super) counts: fn(&str) -> bool,
}

/// How often a long build logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// [`run_command`], logging `progress` while it runs. The story: make the build role,
/// choose who runs the command, start it in a group of its own, keep its output's tail
/// (and show its progress), wait for it within its timeout, and say how it ended.
pub(super) async fn run_command_with(
    session: &Session,
    source: &CommandSource,
    db: &DbName,
    superuser: bool,
    progress: Option<Progress>,
) -> Result<(), SqlError> {
    let password = create_build_role(session, db, superuser).await?;
    let login = build_role_login(session, db, password);
    // As the child user, or as the owner who controls an operator's checkout alone; with
    // none of the daemon's environment but PATH and the locale either way.
    let runner = runner::choose(&session.child_user, source)
        .await
        .map_err(|e| SqlError::other(e.to_string()))?;
    tracing::info!(database = %db, command = %source.command, workdir = %source.workdir.display(), user = %runner.user.name, "running the migration command");
    let started = std::time::Instant::now();
    let mut child = spawn(source, &runner, &login)?;
    let mut output = Output::read(&mut child, progress.as_ref().map(|p| p.counts));
    let shown = progress.map(|progress| show_progress(session, db, progress, &output, started));
    let ended = wait(&mut child, source, &runner).await;
    drop(shown);
    output.drained().await;
    match ended {
        Ok(()) => {
            tracing::info!(database = %db, elapsed_ms = started.elapsed().as_millis() as u64, "the migration command succeeded");
            Ok(())
        }
        Err(failure) => Err(failure.with_output(&output, &runner)),
    }
}

/// How the command reaches the template database: the URLs a lease answer carries, built
/// the same way — `postgresql://` (SQLAlchemy, and so Alembic, refuses `postgres://`) and
/// JDBC's for Flyway and Liquibase. The embedded server has no TLS, which some drivers
/// (lib/pq) insist on unless told.
fn build_role_login(session: &Session, db: &DbName, password: String) -> ConnectInfo {
    ConnectInfo {
        host: session.lease_host.clone(),
        port: session.lease_port,
        user: db.as_str().to_owned(),
        password,
        database: db.clone(),
        ssl: session.external,
    }
}

/// Starts `sh -c COMMAND` as the runner's user in the runner's working directory, with the
/// build role's credentials in its environment, in a process group of its own so that a
/// timeout or a shutdown kills the tool and everything it started ([`CommandGroup`]).
fn spawn(
    source: &CommandSource,
    runner: &runner::Runner,
    login: &ConnectInfo,
) -> Result<CommandGroup, SqlError> {
    let user = &runner.user;
    let (db, password) = (login.database.as_str(), login.password.as_str());
    let mut command = user.command("sh");
    command
        .arg("-c")
        .arg(&source.command)
        .current_dir(&runner.workdir)
        .env("DATABASE_URL", login.url())
        .env("JDBC_DATABASE_URL", login.jdbc_url().unwrap_or_default())
        .env("JDBC_DATABASE_USERNAME", db)
        .env("JDBC_DATABASE_PASSWORD", password)
        .env("PGHOST", &login.host)
        .env("PGPORT", login.port.to_string())
        .env("PGUSER", db)
        .env("PGPASSWORD", password)
        .env("PGDATABASE", db)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = command.spawn().map_err(|e| {
        let message = format!(
            "cannot run `{}` in {} as {}: {e}",
            source.command,
            source.workdir.display(),
            user.describe()
        );
        SqlError::other(match runner.recipe(None, std::slice::from_ref(&message)) {
            Some(recipe) => format!("{message}; {recipe}"),
            None => message,
        })
    })?;
    Ok(CommandGroup(child))
}

/// The command's output as it is read: the last lines of both pipes, and how many lines
/// the progress counts.
struct Output {
    tail: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Output {
    /// Starts reading the child's stdout and stderr, counting the lines `counts` picks.
    fn read(child: &mut CommandGroup, counts: Option<fn(&str) -> bool>) -> Output {
        let tail = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut readers = Vec::new();
        if let Some(out) = child.0.stdout.take() {
            readers.push(tokio::spawn(keep_tail(
                out,
                tail.clone(),
                counts,
                done.clone(),
            )));
        }
        if let Some(err) = child.0.stderr.take() {
            readers.push(tokio::spawn(keep_tail(
                err,
                tail.clone(),
                counts,
                done.clone(),
            )));
        }
        Output {
            tail,
            done,
            readers,
        }
    }

    /// Waits for the pipes to close, briefly: output of a killed group's orphans must not
    /// hold us (the pipes close with them).
    async fn drained(&mut self) {
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), reader).await;
        }
    }

    /// The last lines kept.
    fn lines(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }
}
/// A long command's progress while it runs: one live view, shown in `/status` until this
/// is dropped, and logged every [`PROGRESS_EVERY`].
struct ShownProgress {
    _shown: progress::Shown,
    reporter: tokio::task::JoinHandle<()>,
}

impl Drop for ShownProgress {
    fn drop(&mut self) {
        self.reporter.abort();
    }
}

/// Shows `progress` of the command whose output `output` reads, from `started` on.
fn show_progress(
    session: &Session,
    db: &DbName,
    progress: Progress,
    output: &Output,
    started: std::time::Instant,
) -> ShownProgress {
    let live = progress::Live {
        step: progress.what,
        total: progress.total,
        done: output.done.clone(),
        started,
    };
    let shown = session
        .build_progress
        .show(&progress.template, live.clone());
    let db = db.clone();
    let reporter = tokio::spawn(async move {
        let mut every = tokio::time::interval(PROGRESS_EVERY);
        every.tick().await;
        loop {
            every.tick().await;
            log_progress(&db, &live.report());
        }
    });
    ShownProgress {
        _shown: shown,
        reporter,
    }
}

/// How a command ended when it did not succeed: in words, with its exit code when it
/// exited (for the recipe a runner offers).
struct Failure {
    message: String,
    exit_code: Option<Option<i32>>,
}

/// Waits for the command within its timeout; one that overruns it is killed, group and all.
async fn wait(
    child: &mut CommandGroup,
    source: &CommandSource,
    runner: &runner::Runner,
) -> Result<(), Failure> {
    let failure = |message, exit_code| Err(Failure { message, exit_code });
    match tokio::time::timeout(source.timeout, child.0.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => failure(
            format!(
                "`{}` failed ({status}; it ran as {} in {})",
                source.command,
                runner.user.describe(),
                source.workdir.display()
            ),
            Some(status.code()),
        ),
        Ok(Err(error)) => failure(format!("waiting for `{}`: {error}", source.command), None),
        Err(_) => {
            child.kill();
            let _ = child.0.wait().await;
            failure(
                format!(
                    "`{}` did not finish within {} s and was killed",
                    source.command,
                    source.timeout.as_secs()
                ),
                None,
            )
        }
    }
}

impl Failure {
    /// The build's error: the failure, the last lines of the command's output and, for a
    /// command that exited with an error, what the runner suggests.
    fn with_output(self, output: &Output, runner: &runner::Runner) -> SqlError {
        let lines = output.lines();
        let recipe = self
            .exit_code
            .and_then(|code| runner.recipe(code, &lines))
            .map(|recipe| format!("\n{recipe}"))
            .unwrap_or_default();
        // The command's own failure: its words, of no SQL kind (its output may say the disk
        // is full, but only postgres' answers to the daemon carry a SQLSTATE).
        SqlError::other(format!(
            "{}; last lines of its output:\n{}{recipe}",
            self.message,
            lines.join("\n")
        ))
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

/// The most of one line that is kept: a command that prints megabytes without a newline
/// cannot make the daemon hold them.
const LINE_LIMIT: usize = 4096;

/// Reads one line of `reader` into `line`, keeping at most [`LINE_LIMIT`] bytes of it (the
/// rest is read and dropped). Returns the bytes read, 0 at the end.
async fn read_line_bounded(
    reader: &mut (impl tokio::io::AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    use tokio::io::AsyncBufReadExt;
    let mut read = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(read);
        }
        let (chunk, ends) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (&available[..=at], true),
            None => (available, false),
        };
        let room = LINE_LIMIT.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = chunk.len();
        reader.consume(used);
        read += used;
        if ends {
            return Ok(read);
        }
    }
}

/// A line of a command's output as an error shows it: valid UTF-8 (other bytes replaced),
/// without terminal colour and cursor codes, without its line end.
fn plain_line(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    anstream::adapter::strip_str(&text)
        .to_string()
        .trim_end()
        .to_owned()
}

/// Reads a pipe to its end, keeping the last lines (bytes that are not UTF-8 are replaced,
/// colour codes removed, each line bounded) and counting those `counts` picks into `done`.
async fn keep_tail(
    pipe: impl tokio::io::AsyncRead + Unpin,
    tail: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    counts: Option<fn(&str) -> bool>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut reader = tokio::io::BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_line_bounded(&mut reader, &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = plain_line(&line);
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

mod runner;

#[cfg(test)]
mod tests;
