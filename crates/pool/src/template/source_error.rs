//! Why a template's sources cannot be read, checked or hashed: each error names the path and
//! the reason, never a byte of the file (a caller may have named a file it must not read).
//! `open.rs`, `sources.rs` and `dump.rs` return it; whoever turns it into a build's or a
//! registration's answer adds who read it (`ChildUser::explain`).

use std::path::PathBuf;

/// The largest SQL file (`sql`, or one of `migrations`) that is read: it is held in memory
/// and sent to postgres whole. A bigger schema is a dump (`pg_dump`), which streams. It
/// lives beside the error that names it, which `sources.rs` returns.
pub const MAX_SQL_FILE_BYTES: u64 = 256 << 20;

/// A template source that cannot be used as it is.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Opening, reading or statting a file failed.
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A SQL file is not UTF-8 text (its bytes are not shown).
    #[error("cannot read {}: it is not UTF-8 text", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
    },
    /// A source file is a directory, a device, a FIFO or a socket.
    #[error("{} is not a regular file ({kind}): a template source must be one", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// A `*.sql` entry of a migrations directory is neither a file nor a directory.
    #[error("{} is not a regular file ({kind}): a migration must be one", path.display())]
    MigrationNotRegular {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// A migrations directory cannot be listed.
    #[error("cannot read migrations directory {}: {source}", dir.display())]
    MigrationsDir {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A SQL file is bigger than [`MAX_SQL_FILE_BYTES`].
    #[error(
        "{} is {len} bytes, more than the {} MiB a SQL source may be: restore a big schema from a dump (pg_dump) instead",
        path.display(),
        MAX_SQL_FILE_BYTES >> 20
    )]
    TooBig {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
    /// A SQL file grew past [`MAX_SQL_FILE_BYTES`] after its size was checked.
    #[error("{} grew past {} MiB while it was read", path.display(), MAX_SQL_FILE_BYTES >> 20)]
    Grew {
        /// The file.
        path: PathBuf,
    },
    /// A file hashed for the fingerprint changed size while it was read.
    #[error("{} changed while it was read ({len} bytes, then {copied})", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// Its size when opened.
        len: u64,
        /// The bytes read.
        copied: u64,
    },
    /// A path a source names (a `dump`, a `watched path`, a command's `workdir`) cannot be
    /// looked at or listed.
    #[error("{role} {}: {source}", path.display())]
    Named {
        /// What the source calls it: "dump", "watched path", "workdir".
        role: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A dump's file cannot be opened as a regular file.
    #[error("dump {0}")]
    DumpFile(Box<SourceError>),
    /// A directory dump without its table of contents.
    #[error("dump {} is a directory without toc.dat: not a pg_dump -Fd output", path.display())]
    NotADirectoryDump {
        /// The directory.
        path: PathBuf,
    },
    /// A plain-SQL dump where no script may run.
    #[error(
        "{} is a plain-SQL dump, a psql script whose meta-commands (\\!, \\copy … program) run programs; \
         over HTTP this daemon restores only pg_restore formats (pg_dump -Fc, -Fd, -Ft) unless started with \
         --allow-http-commands (or name the dump in its configuration file)",
        path.display()
    )]
    ScriptRefused {
        /// The dump.
        path: PathBuf,
    },
    /// A command's working directory is not a directory.
    #[error("workdir {} is not a directory", path.display())]
    WorkdirNotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// A client-built template has no sources to hash.
    #[error("a client-built template's fingerprint is its client's hash")]
    ClientBuilt,
}
