//! What can go wrong with a snapshot: opening one and reading its manifest
//! ([`OpenError`]), unpacking it into a data directory ([`UnpackError`]), writing one
//! ([`WriteError`]). The MAC's own failures are `seal.rs`'s, the key's `key.rs`'s.
//!
//! Each variant keeps what a caller decides by (the entry, the path inside the archive, the
//! `io::Error` with its kind: a full disk stays `StorageFull`). None quotes a file's bytes:
//! names from an archive are shown quoted and escaped (`{:?}`), as they end up in the log;
//! only a manifest's parse error may quote a value of it, and a manifest is read only from
//! an authenticated file (ours). This file decides nothing; `unpack.rs` and `snapshot.rs`
//! raise these.

use std::fmt;
use std::io;
use std::path::PathBuf;

use tar::EntryType;

use super::seal::SealError;

/// Why a snapshot's archive was not unpacked: refused (an entry that is no part of a
/// cluster, or leads out of it) or failed (the archive or the disk). Either way nothing of
/// it is used; the caller removes what was made.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The stream is not zstd.
    #[error("not a snapshot: {source}")]
    NotZstd {
        /// The decoder's error.
        source: io::Error,
    },
    /// The tar stream (a header, a name, or the entries' list) cannot be read.
    #[error("cannot read the archive: {source}")]
    Archive {
        /// The reader's error.
        source: io::Error,
    },
    /// An entry that is neither a regular file nor a directory (a link, a device, a FIFO).
    #[error(
        "the archive holds {entry:?} as {}: a snapshot holds only files and directories",
        describe(*kind)
    )]
    NotFileOrDirectory {
        /// The entry's path inside the archive.
        entry: PathBuf,
        /// Its type.
        kind: EntryType,
    },
    /// An entry named by an absolute path.
    #[error("the archive names {entry:?} by an absolute path")]
    Absolute {
        /// The entry's path inside the archive.
        entry: PathBuf,
    },
    /// An entry whose path climbs out with `..`.
    #[error("the archive names {entry:?}, which leads out of the cluster")]
    OutOfCluster {
        /// The entry's path inside the archive.
        entry: PathBuf,
    },
    /// An entry whose path has no name in it (`.`, or empty).
    #[error("the archive holds an entry named {entry:?}")]
    Unnamed {
        /// The entry's path inside the archive.
        entry: PathBuf,
    },
    /// An entry that is no part of postgres' data-directory layout (`unpack.rs`'s
    /// `TOP_LEVEL`), or would make postgres do more than start.
    #[error("the archive holds {entry:?}: {reason}")]
    NotPostgres {
        /// The entry's path inside the archive.
        entry: PathBuf,
        /// Why it cannot be part of a cluster.
        reason: Refusal,
    },
    /// An entry under something that is not a directory (a file, or a link).
    #[error("the archive puts {entry:?} under {under:?}, which is not a directory")]
    UnderNonDirectory {
        /// The entry's path inside the archive.
        entry: PathBuf,
        /// The parent on disk that is not a directory.
        under: PathBuf,
    },
    /// An entry under a directory the archive has not made (yet).
    #[error("the archive puts {entry:?} under {under:?}, which it does not hold")]
    UnderMissing {
        /// The entry's path inside the archive.
        entry: PathBuf,
        /// The parent on disk that does not exist.
        under: PathBuf,
    },
    /// An entry's parent directory cannot be opened for another reason.
    #[error("cannot open {under:?}: {source}")]
    Parent {
        /// The entry's path inside the archive.
        entry: PathBuf,
        /// The parent on disk.
        under: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// A step of writing an entry failed (on a full disk, `source` is `StorageFull`).
    #[error("cannot {step} {entry:?}: {source}")]
    Entry {
        /// The entry's path inside the archive.
        entry: PathBuf,
        /// What was being done.
        step: Step,
        /// The system's error.
        source: io::Error,
    },
    /// A directory pglease names (the data directory, a part of its room) cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    OpenDirectory {
        /// The directory.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// The data directory cannot be made.
    #[error("cannot create {}: {source}", path.display())]
    CreateDataDir {
        /// The data directory.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// The data directory's own mode or owner cannot be set.
    #[error("cannot {step} {}: {source}", path.display())]
    DataDir {
        /// The data directory.
        path: PathBuf,
        /// What was being done.
        step: Step,
        /// The system's error.
        source: io::Error,
    },
    /// The rest of the file after the archive, or its MAC, did not read as checked: the
    /// file changed after its MAC was checked, or cannot be read.
    #[error(transparent)]
    Trailer(SealError),
    /// The archive unpacked, but holds no cluster postgres could start.
    #[error("the archive holds no complete cluster (PG_VERSION, global/pg_control)")]
    Incomplete,
}

/// Why an entry is no part of a cluster (see [`UnpackError::NotPostgres`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `*.signal`: recovery would start, which runs `restore_command`.
    SignalFile,
    /// `postmaster.*`: a running server's.
    PostmasterFile,
    /// `backup_label`, `tablespace_map`: recovery from a backup would start.
    BackupFile,
    /// A known name of the wrong kind (a directory `PG_VERSION`, a file `pg_wal`).
    WrongKind,
    /// A name postgres never makes at the top of its data directory.
    Foreign,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::SignalFile => {
                "a signal file would start recovery (which runs restore_command)"
            }
            Refusal::PostmasterFile => "a postmaster file belongs to a running server",
            Refusal::BackupFile => "a backup's file would start recovery from a backup",
            Refusal::WrongKind => "it is not of the kind postgres makes there",
            Refusal::Foreign => "it is no part of a postgres data directory",
        })
    }
}

/// What was being done to an entry (or the data directory) when the system refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `mkdirat`.
    MakeDirectory,
    /// `openat` of a directory just made (or there already).
    OpenDirectory,
    /// `openat(O_CREAT|O_EXCL)` of a file.
    CreateFile,
    /// Copying a file's bytes from the archive.
    WriteFile,
    /// Duplicating the handle an entry's parents are walked from (`EMFILE`).
    OpenParent,
    /// `fchmod`.
    Chmod,
    /// `fchown`.
    Chown,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::MakeDirectory => "make the directory",
            Step::OpenDirectory => "open the directory",
            Step::CreateFile => "create",
            Step::WriteFile => "write",
            Step::OpenParent => "open the parent of",
            Step::Chmod => "chmod",
            Step::Chown => "chown",
        })
    }
}

/// "a symbolic link", for errors.
fn describe(kind: EntryType) -> String {
    match kind {
        EntryType::Symlink => "a symbolic link".into(),
        EntryType::Link => "a hard link".into(),
        EntryType::Char => "a character device".into(),
        EntryType::Block => "a block device".into(),
        EntryType::Fifo => "a FIFO".into(),
        EntryType::Continuous => "a contiguous file".into(),
        EntryType::GNUSparse => "a sparse file".into(),
        other => format!("an entry of type {other:?}"),
    }
}

/// Why [`open`](super::open) found no usable snapshot: not authenticated (nothing in it was
/// read), or authenticated but not readable as a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Its MAC is missing, another key's or wrong: nothing in it was read.
    #[error("not authenticated: {0}")]
    Unauthenticated(SealError),
    /// The file is a symbolic link: pglease renames a regular file into place, so someone
    /// else put it there.
    #[error("refusing {}: it is a symbolic link, not a snapshot file", path.display())]
    Link {
        /// The snapshot file.
        path: PathBuf,
    },
    /// The file is not a regular file (a FIFO would hang the start).
    #[error("refusing {}: it is not a regular file", path.display())]
    NotAFile {
        /// The snapshot file.
        path: PathBuf,
    },
    /// The file cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The snapshot file.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// The open file cannot be stat'ed.
    #[error("cannot stat {}: {source}", path.display())]
    Stat {
        /// The snapshot file.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// Reading the file to check its MAC failed.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The snapshot file.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// Its stream is not zstd.
    #[error("not a snapshot: {source}")]
    NotZstd {
        /// The decoder's error.
        source: io::Error,
    },
    /// Its stream is not a tar archive.
    #[error("not a snapshot (tar): {source}")]
    NotTar {
        /// The reader's error.
        source: io::Error,
    },
    /// The archive holds no entry at all.
    #[error("an empty archive, not a snapshot")]
    Empty,
    /// The archive's first entry is not the manifest.
    #[error(
        "not a pglease snapshot: its first entry is {first:?}, not {}",
        super::MANIFEST_ENTRY
    )]
    NoManifest {
        /// The first entry's path inside the archive.
        first: PathBuf,
    },
    /// The manifest's bytes cannot be read.
    #[error("cannot read its manifest: {source}")]
    ManifestUnreadable {
        /// The reader's error.
        source: io::Error,
    },
    /// The manifest is not the JSON this code reads.
    #[error("its manifest is not valid: {source}")]
    ManifestInvalid {
        /// The parser's error (a line and column; the file is authenticated, ours).
        source: serde_json::Error,
    },
}

/// Why [`write`](super::write) wrote no snapshot. Its temporary file is removed; the
/// snapshot in place, if any, stays. On a full disk the `io::Error` is `StorageFull`.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The snapshot directory cannot be made.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        /// The snapshot directory.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// The temporary file cannot be made.
    #[error("cannot create {}: {source}", path.display())]
    CreateFile {
        /// The temporary file.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// The compressor cannot be set up.
    #[error("zstd: {source}")]
    Compressor {
        /// The compressor's error.
        source: io::Error,
    },
    /// The manifest cannot be serialized.
    #[error("manifest: {source}")]
    Manifest {
        /// The serializer's error.
        source: serde_json::Error,
    },
    /// The stopped cluster's directory cannot be listed.
    #[error("cannot read {}: {source}", path.display())]
    ReadCluster {
        /// The cluster's directory.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// One of the cluster's top-level entries cannot be stat'ed.
    #[error("cannot stat {}: {source}", path.display())]
    Stat {
        /// The entry on disk.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// One of the cluster's top-level entries cannot be read into the archive.
    #[error("cannot archive {}: {source}", path.display())]
    Archive {
        /// The entry on disk.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// The temporary file cannot be written, sealed or synced.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The temporary file.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// The finished temporary file cannot be renamed into place.
    #[error("cannot rename {} into place: {source}", path.display())]
    Rename {
        /// The temporary file.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
}
