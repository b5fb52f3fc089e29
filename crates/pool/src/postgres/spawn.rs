//! The one thread that forks initdb and postgres, so that their parent-death signal is
//! tied to the daemon's lifetime, and the command description it receives.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not when the
//! process does. A child forked from a tokio blocking-pool thread would be killed whenever
//! tokio retires that idle thread, so every child that carries the signal is forked here,
//! by a thread that is started on first use and never returns. This module does not wait
//! for children; the caller owns the returned [`Child`].
//!
//! Every child starts with a clean environment holding only [`passed_on_env`]: the daemon
//! often runs as root with an API token and a CI job's secrets in its environment, and
//! `/proc/<pid>/environ` of postgres and its backends is readable by any process of the
//! server's OS user (a `COPY ... TO PROGRAM` of a superuser, an untrusted extension).

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;

use nix::sys::signal::Signal;

/// Environment variables that must never reach a server: libpq and server defaults that
/// would change what initdb or postgres do. pglease's own children get none of them, as
/// they get nothing outside `passed_on_env`; the list is public so that the benchmark,
/// which starts its baseline servers with the caller's environment otherwise intact,
/// removes the same ones.
pub const SCRUBBED_ENV: &[&str] = &[
    "PGDATA",
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "PGOPTIONS",
    "PGPASSWORD",
    "PGSERVICE",
    "PGSYSCONFDIR",
    "PGTZ",
    // systemd's: postgres built with systemd support would tell systemd it is "ready"
    // itself, before pglease is.
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// The variables a child keeps from the daemon's environment, by exact name: the locale
/// (initdb's defaults and the server's messages) and the time zone. Any `LC_*` variable is
/// kept as well (see [`passed_on_env`]).
const PASSED_ON: &[&str] = &["LANG", "LANGUAGE", "TZ"];

/// `PATH` for a child when the daemon has none (postgres runs helpers such as
/// `archive_command` through the shell).
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The whole environment of initdb and postgres: `PATH` (the daemon's, else
/// [`DEFAULT_PATH`]) and the daemon's locale and time zone variables ([`PASSED_ON`], `LC_*`).
/// Nothing else: no token, no secret of the caller's, no libpq default.
pub(crate) fn passed_on_env() -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(name, _)| {
            name.to_str().is_some_and(|name| {
                PASSED_ON.contains(&name) || (name.starts_with("LC_") && name.len() > 3)
            })
        })
        .collect();
    env.push((
        "PATH".into(),
        std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
    ));
    env
}

/// Where a child's stdout or stderr goes.
#[derive(Debug)]
pub(crate) enum Output {
    /// A pipe the caller reads (initdb's output, collected for errors).
    Piped,
    /// The write end of the server log's pipe (`server_log.rs`), shared by stdout and
    /// stderr.
    Log(OwnedFd),
}

/// Everything needed to build one child's command: recorded as data so the exact command
/// line can be logged before spawning, and so it can cross to the spawner thread.
#[derive(Debug)]
pub(crate) struct CommandSpec {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments, in order.
    pub args: Vec<OsString>,
    /// The child's working directory (one the target user can enter).
    pub cwd: PathBuf,
    /// `(uid, gid)` to switch to, when the daemon runs as root.
    pub user: Option<(u32, u32)>,
    /// Signal the kernel sends the child when the spawner thread (the daemon) dies.
    pub death_signal: Signal,
    /// Where stdout and stderr go.
    pub output: Output,
}

impl CommandSpec {
    /// Builds the `std::process::Command`; runs on the spawner thread.
    fn build(self) -> io::Result<Command> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .current_dir(&self.cwd)
            .stdin(Stdio::null());
        command.env_clear().envs(passed_on_env());
        match self.output {
            Output::Piped => {
                command.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            Output::Log(pipe) => {
                let err = pipe.try_clone()?;
                command.stdout(Stdio::from(pipe)).stderr(Stdio::from(err));
            }
        }
        if let Some((uid, gid)) = self.user {
            // std drops supplementary groups, then calls setgid and setuid, all before
            // the pre_exec hook below: the death signal must be set after the switch,
            // because the kernel clears it whenever the effective uid or gid changes.
            command.uid(uid).gid(gid);
        }
        // A process group of its own keeps a terminal's Ctrl-C (sent to the foreground
        // group) away from postgres: the daemon decides when and how postgres stops.
        command.process_group(0);
        set_parent_death_signal(&mut command, self.death_signal);
        Ok(command)
    }
}

impl fmt::Display for CommandSpec {
    /// The command line, shell-quoted where needed, for logs and error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", shell_quote(&self.program.to_string_lossy()))?;
        for arg in &self.args {
            write!(f, " {}", shell_quote(&arg.to_string_lossy()))?;
        }
        Ok(())
    }
}

/// Quotes `word` for a POSIX shell when it holds anything but plain characters.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Asks the child to receive `signal` when the forking thread dies.
#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut Command, signal: Signal) {
    // SAFETY: the hook runs in the forked child before exec, where only async-signal-safe
    // calls are allowed. It calls prctl(2) through nix, which is a plain system call, and
    // on failure builds an io::Error from the raw errno, which does not allocate. It
    // touches no lock and no state shared with the parent.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(signal)
                .map_err(|errno| io::Error::from_raw_os_error(errno as i32))
        });
    }
}

/// One spawn request and where to send its answer.
struct Request {
    spec: CommandSpec,
    reply: mpsc::SyncSender<io::Result<Child>>,
}

/// The request channel of the process-wide spawner thread. A process-wide value is the
/// point here: the thread must outlive every instance, including ones made concurrently
/// by tests, and there is nothing else in it to share.
static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();

/// The spawner's request channel, starting the thread on first use.
fn spawner() -> io::Result<&'static mpsc::Sender<Request>> {
    if let Some(sender) = SPAWNER.get() {
        return Ok(sender);
    }
    let (sender, receiver) = mpsc::channel::<Request>();
    // Two callers may race here; the loser's thread sees its channel closed and ends.
    // It has forked nothing, so its exit kills no child.
    std::thread::Builder::new()
        .name("pglease-spawner".into())
        .spawn(move || {
            // Ends only if every sender is gone, which for the stored one is never.
            for request in receiver {
                let result = request.spec.build().and_then(|mut command| command.spawn());
                // The requester may have given up; its child is then dropped unreaped,
                // which can only happen if the requesting thread panicked.
                let _ = request.reply.send(result);
            }
        })?;
    Ok(SPAWNER.get_or_init(|| sender))
}

/// Spawns `spec` on the spawner thread and returns the running child. Blocks for the
/// fork and exec only; call it from a blocking context.
pub(crate) fn spawn(spec: CommandSpec) -> io::Result<Child> {
    let (reply, answer) = mpsc::sync_channel(1);
    spawner()?
        .send(Request { spec, reply })
        .map_err(|_| io::Error::other("the pglease spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the pglease spawner thread dropped the request"))?
}
