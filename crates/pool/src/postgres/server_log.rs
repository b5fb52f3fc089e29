//! The server log, bounded: postgres' stdout and stderr go to a pipe that a thread of the
//! daemon reads ([`ServerLog::pipe`]), writing `postgres.log` and rotating it to
//! `postgres.log.1` once it passes its cap, so that the log never takes more than twice the
//! cap ([`cap_for`]) whatever a lease holder makes postgres log (`RAISE WARNING` in a loop).
//!
//! Before, postgres wrote the file itself: a holder could fill the file system WAL lives on
//! and make postgres PANIC, restart, and lose every lease, again and again.
//!
//! Why a thread and a pipe rather than postgres' own `logging_collector`: postgres rotates
//! by size only into new file names and never removes old ones, so its collector bounds
//! nothing. The thread is a plain OS thread (not a tokio worker), because it blocks on the
//! pipe and on the file. It only reads the pipe and appends to a file on tmpfs; a write that
//! fails (a full file system) drops that chunk and counts it, rather than waiting, so
//! postgres waits on a full pipe no longer than a write to memory takes. When the daemon
//! dies the read end closes with it: postgres ignores SIGPIPE, so its writes then fail with
//! `EPIPE` instead of blocking. The read end is close-on-exec, so no other child can keep it
//! open without reading it.
//!
//! This file does not decide what postgres logs (`settings.rs`) nor who reads the log
//! (`running.rs` quotes its tail).

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

/// The smallest cap: room for the start-up messages and a few screens of errors.
const CAP_MIN: u64 = 1 << 20;
/// The largest cap: plenty of history for anyone reading the log by hand.
const CAP_MAX: u64 = 16 << 20;
/// The pipe's buffer: a burst of messages fits without postgres waiting for the thread.
const PIPE_BYTES: nix::libc::c_int = 1 << 20;
/// How much the thread reads at once.
const CHUNK_BYTES: usize = 64 * 1024;

/// The cap for a log on a file system of `room` bytes: a thirty-second of it, between
/// 1 MiB and 16 MiB. The log then takes at most a sixteenth of the room (the file and its
/// rotated predecessor), next to WAL's quarter (`space::max_wal_size`): on the smallest
/// rest the split leaves (96 MiB), 3 MiB a file.
pub(crate) fn cap_for(room: u64) -> u64 {
    (room / 32).clamp(CAP_MIN, CAP_MAX)
}

/// What rotation and failed writes have cost, for the log and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LogLosses {
    /// Lines removed with an old `postgres.log.1`.
    pub rotated_away_lines: u64,
    /// Lines that could not be written (the file system was full, or the file could not be
    /// opened anew).
    pub dropped_lines: u64,
}

/// The server log of one instance, shared by the readers of every generation's pipe (a
/// killed postmaster's backends may still write while the next one starts).
#[derive(Debug, Clone)]
pub(crate) struct ServerLog {
    writer: Arc<Mutex<Writer>>,
}

/// The file being written and its accounting.
#[derive(Debug)]
struct Writer {
    path: PathBuf,
    rotated_path: PathBuf,
    /// `None` after a failed reopen; the next rotation tries again.
    file: Option<File>,
    cap: u64,
    /// Bytes in the current file.
    size: u64,
    /// Lines in the current file and in the rotated one.
    lines: u64,
    rotated_lines: u64,
    losses: LogLosses,
}

/// Tells whether a generation's pipe has been read to its end (every process holding its
/// write end has exited), so that an exit's last words are in the file before its tail is
/// quoted.
#[derive(Debug, Clone)]
pub struct Drain {
    done: Arc<AtomicBool>,
}

impl Drain {
    /// Waits until the pipe is read to its end, at most `timeout`.
    pub(crate) async fn wait(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.done.load(Ordering::Acquire) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl ServerLog {
    /// Opens the log at `path` for appending, capped at `cap` bytes. A log already past its
    /// cap (a kept instance directory's) is rotated at once, so that a server that stopped
    /// for lack of room starts with room.
    pub(crate) fn open(path: &Path, cap: u64) -> io::Result<ServerLog> {
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        let mut writer = Writer {
            rotated_path: rotated_path(path),
            path: path.to_path_buf(),
            file: Some(file),
            cap,
            size,
            lines: 0,
            rotated_lines: 0,
            losses: LogLosses::default(),
        };
        if size > cap {
            writer.rotate();
        }
        Ok(ServerLog {
            writer: Arc::new(Mutex::new(writer)),
        })
    }

    /// Appends one line of pglease's own (a generation's header).
    pub(crate) fn note(&self, line: &str) {
        self.lock().write(format!("{line}\n").as_bytes());
    }

    /// What rotation and failed writes have cost so far.
    #[cfg(test)]
    pub(crate) fn losses(&self) -> LogLosses {
        self.lock().losses
    }

    /// Makes a pipe for one postmaster, starting the thread that reads it into the log.
    /// Returns the write end (to give the postmaster as stdout and stderr; close-on-exec,
    /// std clears that on the copies it installs as 1 and 2) and the drain of the read end.
    pub(crate) fn pipe(&self) -> io::Result<(OwnedFd, Drain)> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // A bigger buffer only saves postgres a wait on a burst; the default one works.
        let _ = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
        let drain = Drain {
            done: Arc::new(AtomicBool::new(false)),
        };
        let log = self.clone();
        let done = Arc::clone(&drain.done);
        std::thread::Builder::new()
            .name("pglease-server-log".into())
            .spawn(move || {
                log.read_until_closed(File::from(read));
                done.store(true, Ordering::Release);
            })?;
        Ok((write, drain))
    }

    /// Copies `pipe` into the log until every writer has closed it.
    fn read_until_closed(&self, mut pipe: File) {
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            match pipe.read(&mut buffer) {
                Ok(0) => return,
                Ok(read) => self.lock().write(&buffer[..read]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    warn!(%error, "cannot read postgres' output; the server log ends here");
                    return;
                }
            }
        }
    }

    /// The writer; a panic while holding the lock cannot leave it inconsistent in a way
    /// that matters (the worst is a miscounted size), so a poisoned lock is used anyway.
    fn lock(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Writer {
    /// Appends `bytes`, rotating first when they would take the file past its cap.
    fn write(&mut self, bytes: &[u8]) {
        if self.size > 0 && self.size + bytes.len() as u64 > self.cap {
            self.rotate();
        }
        let lines = newlines(bytes);
        let written = match self.file.as_mut() {
            Some(file) => file.write_all(bytes),
            None => Err(io::Error::other("the log is not open")),
        };
        match written {
            Ok(()) => {
                self.size += bytes.len() as u64;
                self.lines += lines;
            }
            // Dropped, not retried: waiting for room would make postgres wait on the pipe.
            // A partial write is counted as dropped too; the size is read again at the
            // next rotation.
            Err(_) => self.losses.dropped_lines += lines.max(1),
        }
    }

    /// Moves the log to `postgres.log.1` (replacing the previous one) and starts it anew.
    fn rotate(&mut self) {
        self.file = None;
        if let Err(error) = std::fs::rename(&self.path, &self.rotated_path) {
            warn!(log = %self.path.display(), %error, "cannot rotate the server log; emptying it");
            let _ = std::fs::remove_file(&self.path);
        }
        self.losses.rotated_away_lines += self.rotated_lines;
        self.rotated_lines = self.lines;
        self.lines = 0;
        self.size = 0;
        match open_new(&self.path) {
            Ok(file) => self.file = Some(file),
            Err(error) => {
                warn!(log = %self.path.display(), %error, "cannot open the server log anew; its lines are dropped until the next rotation");
                return;
            }
        }
        let losses = self.losses;
        let header = format!(
            "---- pglease: the log passed {} bytes and went on in {}; so far {} lines were \
             rotated away and {} dropped\n",
            self.cap,
            self.rotated_path.display(),
            losses.rotated_away_lines,
            losses.dropped_lines,
        );
        self.write(header.as_bytes());
        if losses.rotated_away_lines > 0 || losses.dropped_lines > 0 {
            warn!(
                log = %self.path.display(),
                cap = self.cap,
                rotated_away_lines = losses.rotated_away_lines,
                dropped_lines = losses.dropped_lines,
                "the server log is at its cap: old lines are rotated away"
            );
        }
    }
}

/// `postgres.log.1` beside `postgres.log`.
fn rotated_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".1");
    path.with_file_name(name)
}

/// Opens `path` for appending, creating it; never through a link (the instance directory
/// is the server user's).
fn open_append(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// Creates `path` anew after a rotation: whatever appeared there since the rename (put
/// there by a process of the server's user) is removed, not written through.
fn open_new(path: &Path) -> io::Result<File> {
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// The number of line ends in `bytes`.
fn newlines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pglease-server-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn the_cap_is_a_thirty_second_of_the_room_within_bounds() {
        assert_eq!(cap_for(96 << 20), 3 << 20);
        assert_eq!(cap_for(1 << 20), CAP_MIN);
        assert_eq!(cap_for(24 << 30), CAP_MAX);
    }

    #[test]
    fn the_log_never_takes_more_than_twice_its_cap_and_counts_what_it_lost() {
        let dir = scratch("cap");
        let path = dir.join("postgres.log");
        let log = ServerLog::open(&path, 10_000).expect("open");
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..1_000 {
            log.lock().write(line.as_bytes());
        }
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let rotated = rotated_path(&path);
        assert!(size(&path) <= 10_000, "{}", size(&path));
        assert!(size(&rotated) <= 10_000, "{}", size(&rotated));
        assert!(size(&path) + size(&rotated) > 10_000);
        // 100 000 bytes written, at most 20 000 kept: most lines went with a rotation.
        let losses = log.losses();
        assert!(losses.rotated_away_lines >= 750, "{losses:?}");
        assert_eq!(losses.dropped_lines, 0);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(
            text.starts_with("---- pglease: the log passed 10000 bytes"),
            "{text}"
        );
    }

    #[test]
    fn a_log_past_its_cap_is_rotated_when_opened() {
        let dir = scratch("reopen");
        let path = dir.join("postgres.log");
        std::fs::write(&path, vec![b'x'; 5_000]).expect("write");
        let log = ServerLog::open(&path, 1_000).expect("open");
        log.note("after");
        assert_eq!(
            std::fs::metadata(rotated_path(&path))
                .expect("rotated")
                .len(),
            5_000
        );
        assert!(std::fs::metadata(&path).expect("log").len() < 1_000);
    }

    #[test]
    fn the_pipe_is_read_into_the_log_until_every_writer_closes_it() {
        let dir = scratch("pipe");
        let path = dir.join("postgres.log");
        let log = ServerLog::open(&path, 1 << 20).expect("open");
        let (write, drain) = log.pipe().expect("pipe");
        let mut writer = File::from(write);
        writer.write_all(b"hello from postgres\n").expect("write");
        drop(writer);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(drain.wait(Duration::from_secs(5)));
        assert!(drain.done.load(Ordering::Acquire));
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "hello from postgres\n"
        );
    }
}
