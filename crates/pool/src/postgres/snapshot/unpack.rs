//! Unpacking a snapshot's entries into a fresh data directory, as root, from a file that a
//! CI cache — which other jobs may write — handed us. Each entry is checked before it
//! touches the disk: only regular files and directories (a cluster holds nothing else:
//! pglease's own snapshots never contain links, devices or FIFOs), relative paths of plain
//! names (no `..`, no root).
//!
//! Everything is done relative to a handle on the data directory, never by path: each
//! parent is opened component by component with `O_DIRECTORY|O_NOFOLLOW` (so a link, or a
//! file, anywhere on the way fails instead of leading elsewhere, even one that appeared
//! after a check), directories are made with `mkdirat`, files are created new with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` (never through something already there), and both get their
//! mode and owner through their own open handle (`fchmod`, `fchown`). So a hostile entry can
//! neither write nor chown anything outside the data directory, and the first one found
//! fails the whole unpacking (the caller removes what was made and starts a fresh cluster).
//!
//! Only postgres' own data-directory layout is unpacked, even from a snapshot whose MAC is
//! valid (defence in depth: a leaked key, or a runner sharing it that was taken over): the
//! top-level names of a cluster of PostgreSQL 13 to 18 ([`TOP_LEVEL`]), nothing else. A
//! `*.signal` file (recovery, which runs `restore_command`), `postmaster.*`, `backup_label`
//! or `tablespace_map`, or any other name fails the unpacking. The configuration files
//! postgres would read (`postgresql.conf`, `postgresql.auto.conf`, `pg_hba.conf`,
//! `pg_ident.conf`) are skipped: the start writes its own (`launch.rs`). So is anything
//! under `pg_notify/` (`LISTEN`/`NOTIFY`'s queue, which postgres empties at its start; an
//! older pglease packed what it held): only the directory is made, or with the databases'
//! room only its mode and owner set, as the data directory's `pg_notify` is then a link
//! into the room.
//!
//! Entry names are shown quoted and escaped (`{:?}`) in errors (`error.rs`'s
//! [`UnpackError`], which names the entry, the path on the way, and the system's error):
//! they come from the archive and end up in the log. This file does not read the manifest
//! or decide whether a snapshot is used.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};
use tar::EntryType;

use super::error::{Refusal, Step, UnpackError};

/// The modes postgres requires of a cluster it did not make with group access (`initdb -g`
/// is not used): files owner-only, directories owner-only.
const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;

/// The top-level entries of a data directory in PostgreSQL 13 to 18, as initdb makes them
/// and a cleanly stopped server leaves them (seen in real clusters of 15 and in initdb's
/// `subdirs` list of each major), and whether each is a directory. `pg_wal/summaries`
/// (17+) and `base/pgsql_tmp` are below these.
const TOP_LEVEL: &[(&str, bool)] = &[
    ("PG_VERSION", false),
    ("base", true),
    ("global", true),
    ("pg_commit_ts", true),
    ("pg_dynshmem", true),
    ("pg_logical", true),
    ("pg_multixact", true),
    ("pg_notify", true),
    ("pg_replslot", true),
    ("pg_serial", true),
    ("pg_snapshots", true),
    ("pg_stat", true),
    ("pg_stat_tmp", true),
    ("pg_subtrans", true),
    ("pg_tblspc", true),
    ("pg_twophase", true),
    ("pg_wal", true),
    ("pg_xact", true),
];

/// The data directory's databases, which may be a link to their room (`Into::base`).
const BASE: &str = "base";
/// LISTEN/NOTIFY's queue, which may be a link to its room (`Into::notify_queue`).
const NOTIFY_QUEUE: &str = "pg_notify";

/// The configuration files postgres reads from its data directory: never taken from a
/// snapshot, the start writes them.
pub(super) const CONFIG_FILES: &[&str] = &[
    "postgresql.conf",
    "postgresql.auto.conf",
    "pg_hba.conf",
    "pg_ident.conf",
];

/// What to do with an entry, by its top-level name.
enum Place {
    /// Part of the cluster: unpack it.
    Cluster,
    /// A configuration file, or content of the notification queue: skip it.
    Skip,
}

/// Where the entry `name` (of `kind`, its first component `top`) belongs, or why it cannot
/// be unpacked.
fn place(name: &Path, top: &OsStr, kind: EntryType) -> Result<Place, UnpackError> {
    let top_text = top.to_string_lossy();
    let is_top = name
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
        == 1;
    if is_top && kind == EntryType::Regular && CONFIG_FILES.contains(&top_text.as_ref()) {
        return Ok(Place::Skip);
    }
    // postgres removes the queue's files at its start: nothing of them is worth writing.
    if !is_top && top_text == NOTIFY_QUEUE {
        return Ok(Place::Skip);
    }
    let reason = if top_text.ends_with(".signal") {
        Refusal::SignalFile
    } else if top_text.starts_with("postmaster.") {
        Refusal::PostmasterFile
    } else if top_text == "backup_label" || top_text == "tablespace_map" {
        Refusal::BackupFile
    } else {
        match TOP_LEVEL.iter().find(|(known, _)| *known == top_text) {
            // A known directory holds anything, and is a directory itself; a known file
            // is only itself.
            Some((_, true)) if !is_top || kind == EntryType::Directory => {
                return Ok(Place::Cluster)
            }
            Some((_, false)) if is_top && kind == EntryType::Regular => return Ok(Place::Cluster),
            Some(_) => Refusal::WrongKind,
            None => Refusal::Foreign,
        }
    };
    Err(UnpackError::NotPostgres {
        entry: name.to_path_buf(),
        reason,
    })
}

/// Opens the directory `path` for `*at` calls, refusing a link at its last component.
pub(super) fn open_directory(path: &Path) -> Result<OwnedFd, UnpackError> {
    nix::fcntl::open(path, directory_flags(), Mode::empty()).map_err(|e| {
        UnpackError::OpenDirectory {
            path: path.to_path_buf(),
            source: io_error(e),
        }
    })
}

/// Gives the data directory behind `dir` (named `path` in errors) mode 0700 and `owner`,
/// through the handle.
pub(super) fn make_private(
    dir: &OwnedFd,
    path: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(), UnpackError> {
    set_mode_and_owner(dir.as_fd(), DIR_MODE, owner).map_err(|(step, source)| {
        UnpackError::DataDir {
            path: path.to_path_buf(),
            step,
            source,
        }
    })
}

/// Where a snapshot is unpacked: handles opened by the caller.
pub(super) struct Into<'a> {
    /// The empty data directory.
    pub root: &'a OwnedFd,
    /// The databases' room in `--databases-dir` that the data directory's `base` links to
    /// (`room.rs`): the archive's `base/` goes there, through this handle, instead of
    /// through the link (which [`open_parent`] refuses like any other).
    pub base: Option<&'a OwnedFd>,
    /// The notification queue's directory in that room, which the data directory's
    /// `pg_notify` links to: the archive's `pg_notify` sets its mode and owner, nothing
    /// goes into it.
    pub notify_queue: Option<&'a OwnedFd>,
    /// The data directory's path, for errors.
    pub data_dir: &'a Path,
}

impl Into<'_> {
    /// The part of the cluster's room that the top-level directory entry `last` is, when
    /// it is one (`base`, `pg_notify` with a room): made already, empty.
    fn room_of(&self, last: &OsStr) -> Option<&OwnedFd> {
        match last.to_str() {
            Some(BASE) => self.base,
            Some(NOTIFY_QUEUE) => self.notify_queue,
            _ => None,
        }
    }
}

/// An entry that passed every check: its path inside the archive, its kind (a regular file
/// or a directory), and that path split into its parent (plain components, empty for the
/// top level) and its last component.
struct Checked {
    name: PathBuf,
    kind: EntryType,
    parent: PathBuf,
    last: OsString,
}

/// Unpacks every entry of `entries` but the manifest (`skip`) into the empty directory
/// `into.root` (the data directory, named `into.data_dir` in errors), owned by `owner` when
/// set. Returns the bytes unpacked. Entries are read one at a time: each is checked
/// ([`check`]) before anything of it is made, then made ([`make_directory`],
/// [`write_file`]) under its parent.
pub(super) fn unpack<R: Read>(
    entries: tar::Entries<'_, R>,
    into: &Into<'_>,
    skip: &Path,
    owner: Option<(u32, u32)>,
) -> Result<u64, UnpackError> {
    let mut bytes = 0u64;
    // The parent of the last entry, open: a cluster's files come directory by directory,
    // so most entries reuse it instead of walking their parents again.
    let mut last_parent: Option<(PathBuf, OwnedFd)> = None;
    for entry in entries {
        let mut entry = entry.map_err(|source| UnpackError::Archive { source })?;
        let name = entry
            .path()
            .map_err(|source| UnpackError::Archive { source })?
            .into_owned();
        if name == skip {
            continue;
        }
        // Every check comes before anything is made.
        let Some(checked) = check(name, entry.header().entry_type())? else {
            continue;
        };
        let is_directory = checked.kind == EntryType::Directory;
        if is_directory && checked.parent.as_os_str().is_empty() {
            if let Some(room) = into.room_of(&checked.last) {
                // A part of the cluster's room: made already, empty; only its mode and
                // owner are set.
                set_mode_and_owner(room.as_fd(), DIR_MODE, owner)
                    .map_err(|(step, source)| checked.failed(step, source))?;
                continue;
            }
        }
        let parent_dir = match last_parent.take() {
            Some((path, fd)) if path == checked.parent => fd,
            _ => open_parent(into, &checked.parent, &checked.name)?,
        };
        if is_directory {
            make_directory(&parent_dir, &checked, owner)?;
        } else {
            bytes += write_file(&mut entry, &parent_dir, &checked, owner)?;
        }
        last_parent = Some((checked.parent, parent_dir));
    }
    Ok(bytes)
}

/// The entry `name` of `kind` checked: `None` when it is skipped (a configuration file,
/// the queue's content), else where it goes; an error when it is not a plain file or
/// directory of a cluster, inside it.
fn check(name: PathBuf, kind: EntryType) -> Result<Option<Checked>, UnpackError> {
    if !matches!(kind, EntryType::Regular | EntryType::Directory) {
        return Err(UnpackError::NotFileOrDirectory { entry: name, kind });
    }
    let (parent, last) = plain_path(&name)?;
    let top = parent.components().next().map_or(last, |c| c.as_os_str());
    if let Place::Skip = place(&name, top, kind)? {
        return Ok(None);
    }
    let last = last.to_os_string();
    Ok(Some(Checked {
        name,
        kind,
        parent,
        last,
    }))
}

impl Checked {
    /// `step` of making this entry failed with `source`.
    fn failed(&self, step: Step, source: std::io::Error) -> UnpackError {
        UnpackError::Entry {
            entry: self.name.clone(),
            step,
            source,
        }
    }
}

/// Makes the directory entry `checked` in `parent_dir`, mode 0700, owned by `owner`.
fn make_directory(
    parent_dir: &OwnedFd,
    checked: &Checked,
    owner: Option<(u32, u32)>,
) -> Result<(), UnpackError> {
    let last = checked.last.as_os_str();
    let failed = |step, e: Errno| checked.failed(step, io_error(e));
    // mkdirat makes the directory or fails: it never follows a link at `last`. One
    // there already (`base/`, the databases' tmpfs) is opened below, never a link.
    match nix::sys::stat::mkdirat(parent_dir, last, Mode::from_bits_truncate(DIR_MODE)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(failed(Step::MakeDirectory, e)),
    }
    let dir = nix::fcntl::openat(parent_dir, last, directory_flags(), Mode::empty())
        .map_err(|e| failed(Step::OpenDirectory, e))?;
    set_mode_and_owner(dir.as_fd(), DIR_MODE, owner)
        .map_err(|(step, source)| checked.failed(step, source))
}

/// Writes the file entry `checked`, whose bytes `entry` reads, as a new file in
/// `parent_dir` (never through something already there), mode 0600, owned by `owner`.
/// Returns its size.
fn write_file<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    parent_dir: &OwnedFd,
    checked: &Checked,
    owner: Option<(u32, u32)>,
) -> Result<u64, UnpackError> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(
        parent_dir,
        checked.last.as_os_str(),
        flags,
        Mode::from_bits_truncate(FILE_MODE),
    )
    .map_err(|e| checked.failed(Step::CreateFile, io_error(e)))?;
    let mut file = File::from(fd);
    let bytes = std::io::copy(entry, &mut file)
        .map_err(|source| checked.failed(Step::WriteFile, source))?;
    if let Ok(mtime) = entry.header().mtime() {
        // As the cluster had it; nothing depends on it, but a copy is faithful.
        let _ = file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime));
    }
    set_mode_and_owner(file.as_fd(), FILE_MODE, owner)
        .map_err(|(step, source)| checked.failed(step, source))?;
    Ok(bytes)
}

/// `name` split into its parent (plain components, `.` dropped; empty for the top level)
/// and its last component, or why it cannot be unpacked.
fn plain_path(name: &Path) -> Result<(PathBuf, &OsStr), UnpackError> {
    let entry = || name.to_path_buf();
    let mut parts = Vec::new();
    for component in name.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(UnpackError::Absolute { entry: entry() })
            }
            Component::ParentDir => return Err(UnpackError::OutOfCluster { entry: entry() }),
        }
    }
    let Some(last) = parts.pop() else {
        return Err(UnpackError::Unnamed { entry: entry() });
    };
    Ok((parts.iter().collect(), last))
}

/// The directory `parent` below `root`, opened one component at a time without following
/// links: each component must be a directory this unpacking made.
fn open_parent(into: &Into<'_>, parent: &Path, name: &Path) -> Result<OwnedFd, UnpackError> {
    let mut components = parent.components().peekable();
    let mut walked = into.data_dir.to_path_buf();
    // Under `base/` with the databases' room: from the room's handle.
    let start = match into.base {
        Some(base) if components.peek().is_some_and(|c| c.as_os_str() == BASE) => {
            components.next();
            walked.push(BASE);
            base
        }
        _ => into.root,
    };
    let mut dir = start.try_clone().map_err(|source| UnpackError::Entry {
        entry: name.to_path_buf(),
        step: Step::OpenParent,
        source,
    })?;
    for component in components {
        walked.push(component);
        dir = nix::fcntl::openat(
            &dir,
            component.as_os_str(),
            directory_flags(),
            Mode::empty(),
        )
        .map_err(|e| {
            let (entry, under) = (name.to_path_buf(), walked.clone());
            match e {
                // ENOTDIR: a file, or a link (Linux checks O_DIRECTORY first); ELOOP: a
                // link.
                Errno::ELOOP | Errno::ENOTDIR => UnpackError::UnderNonDirectory { entry, under },
                Errno::ENOENT => UnpackError::UnderMissing { entry, under },
                e => UnpackError::Parent {
                    entry,
                    under,
                    source: io_error(e),
                },
            }
        })?;
    }
    Ok(dir)
}

/// A directory, for `*at` calls: never through a link at the last component.
fn directory_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// `fchmod` to `mode` (whatever the umask left at creation), then `fchown` to `owner`:
/// both through the handle, so they act on what was made, whatever its name is now.
/// A failure names the step; the caller names what it was done to.
fn set_mode_and_owner(
    fd: BorrowedFd<'_>,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), (Step, std::io::Error)> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode))
        .map_err(|e| (Step::Chmod, io_error(e)))?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(|e| (Step::Chown, io_error(e)))?;
    }
    Ok(())
}

/// `errno` as the `io::Error` errors carry (its kind tells a full disk, `StorageFull`).
fn io_error(errno: Errno) -> std::io::Error {
    std::io::Error::from(errno)
}
