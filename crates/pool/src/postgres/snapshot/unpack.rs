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
//! Entry names are shown quoted and escaped (`{:?}`) in errors: they come from the archive
//! and end up in the log. This file does not read the manifest or decide whether a
//! snapshot is used.

use std::ffi::OsStr;
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
fn place(name: &Path, top: &OsStr, kind: EntryType) -> Result<Place, String> {
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
    let why = if top_text.ends_with(".signal") {
        "a signal file would start recovery (which runs restore_command)"
    } else if top_text.starts_with("postmaster.") {
        "a postmaster file belongs to a running server"
    } else if top_text == "backup_label" || top_text == "tablespace_map" {
        "a backup's file would start recovery from a backup"
    } else {
        match TOP_LEVEL.iter().find(|(known, _)| *known == top_text) {
            // A known directory holds anything, and is a directory itself; a known file
            // is only itself.
            Some((_, true)) if !is_top || kind == EntryType::Directory => {
                return Ok(Place::Cluster)
            }
            Some((_, false)) if is_top && kind == EntryType::Regular => return Ok(Place::Cluster),
            Some(_) => "it is not of the kind postgres makes there",
            None => "it is no part of a postgres data directory",
        }
    };
    Err(format!("the archive holds {name:?}: {why}"))
}

/// Opens the directory `path` for `*at` calls, refusing a link at its last component.
pub(super) fn open_directory(path: &Path) -> Result<OwnedFd, String> {
    nix::fcntl::open(path, directory_flags(), Mode::empty()).map_err(|e| {
        format!(
            "cannot open {}: {}",
            path.display(),
            std::io::Error::from(e)
        )
    })
}

/// Gives the directory behind `dir` mode 0700 and `owner`, through the handle.
pub(super) fn make_private(dir: &OwnedFd, owner: Option<(u32, u32)>) -> Result<(), String> {
    set_mode_and_owner(dir.as_fd(), DIR_MODE, owner)
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

/// Unpacks every entry of `entries` but the manifest (`skip`) into the empty directory
/// `into.root` (the data directory, named `into.data_dir` in errors), owned by `owner` when
/// set. Returns the bytes unpacked.
pub(super) fn unpack<R: Read>(
    entries: tar::Entries<'_, R>,
    into: &Into<'_>,
    skip: &Path,
    owner: Option<(u32, u32)>,
) -> Result<u64, String> {
    let mut bytes = 0u64;
    // The parent of the last entry, open: a cluster's files come directory by directory,
    // so most entries reuse it instead of walking their parents again.
    let mut last_parent: Option<(PathBuf, OwnedFd)> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("cannot read the archive: {e}"))?;
        let name = entry
            .path()
            .map_err(|e| format!("cannot read the archive: {e}"))?
            .into_owned();
        if name == skip {
            continue;
        }
        // Every check comes before anything is made.
        let kind = entry.header().entry_type();
        if !matches!(kind, EntryType::Regular | EntryType::Directory) {
            return Err(format!(
                "the archive holds {name:?} as {}: a snapshot holds only files and directories",
                describe(kind)
            ));
        }
        let (parent, last) = plain_path(&name)?;
        let top = parent.components().next().map_or(last, |c| c.as_os_str());
        if let Place::Skip = place(&name, top, kind)? {
            continue;
        }
        if kind == EntryType::Directory && parent.as_os_str().is_empty() {
            let room = match last.to_str() {
                Some(BASE) => into.base,
                Some(NOTIFY_QUEUE) => into.notify_queue,
                _ => None,
            };
            if let Some(room) = room {
                // A part of the cluster's room: made already, empty; only its mode and
                // owner are set.
                set_mode_and_owner(room.as_fd(), DIR_MODE, owner)
                    .map_err(|e| format!("cannot unpack {name:?}: {e}"))?;
                continue;
            }
        }
        let parent_dir = match last_parent.take() {
            Some((path, fd)) if path == parent => fd,
            _ => open_parent(into, &parent, &name)?,
        };
        let failed = |action: &str, e: Errno| {
            format!("cannot {action} {name:?}: {}", std::io::Error::from(e))
        };
        if kind == EntryType::Directory {
            // mkdirat makes the directory or fails: it never follows a link at `last`. One
            // there already (`base/`, the databases' tmpfs) is opened below, never a link.
            match nix::sys::stat::mkdirat(&parent_dir, last, Mode::from_bits_truncate(DIR_MODE)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(failed("unpack", e)),
            }
            let dir = nix::fcntl::openat(&parent_dir, last, directory_flags(), Mode::empty())
                .map_err(|e| failed("open", e))?;
            set_mode_and_owner(dir.as_fd(), DIR_MODE, owner)
                .map_err(|e| format!("cannot unpack {name:?}: {e}"))?;
        } else {
            let flags = OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC;
            let fd = nix::fcntl::openat(
                &parent_dir,
                last,
                flags,
                Mode::from_bits_truncate(FILE_MODE),
            )
            .map_err(|e| failed("unpack", e))?;
            let mut file = File::from(fd);
            bytes += std::io::copy(&mut entry, &mut file)
                .map_err(|e| format!("cannot unpack {name:?}: {e}"))?;
            if let Ok(mtime) = entry.header().mtime() {
                // As the cluster had it; nothing depends on it, but a copy is faithful.
                let _ = file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime));
            }
            set_mode_and_owner(file.as_fd(), FILE_MODE, owner)
                .map_err(|e| format!("cannot unpack {name:?}: {e}"))?;
        }
        last_parent = Some((parent, parent_dir));
    }
    Ok(bytes)
}

/// `name` split into its parent (plain components, `.` dropped; empty for the top level)
/// and its last component, or why it cannot be unpacked.
fn plain_path(name: &Path) -> Result<(PathBuf, &OsStr), String> {
    let mut parts = Vec::new();
    for component in name.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("the archive names {name:?} by an absolute path"))
            }
            Component::ParentDir => {
                return Err(format!(
                    "the archive names {name:?}, which leads out of the cluster"
                ))
            }
        }
    }
    let Some(last) = parts.pop() else {
        return Err(format!("the archive holds an entry named {name:?}"));
    };
    Ok((parts.iter().collect(), last))
}

/// The directory `parent` below `root`, opened one component at a time without following
/// links: each component must be a directory this unpacking made.
fn open_parent(into: &Into<'_>, parent: &Path, name: &Path) -> Result<OwnedFd, String> {
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
    let mut dir = start
        .try_clone()
        .map_err(|e| format!("cannot unpack {name:?}: {e}"))?;
    for component in components {
        walked.push(component);
        dir = match nix::fcntl::openat(
            &dir,
            component.as_os_str(),
            directory_flags(),
            Mode::empty(),
        ) {
            Ok(next) => next,
            // ENOTDIR: a file, or a link (Linux checks O_DIRECTORY first); ELOOP: a link.
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(format!(
                    "the archive puts {name:?} under {walked:?}, which is not a directory"
                ))
            }
            Err(Errno::ENOENT) => {
                return Err(format!(
                    "the archive puts {name:?} under {walked:?}, which it does not hold"
                ))
            }
            Err(e) => {
                return Err(format!(
                    "cannot open {walked:?}: {}",
                    std::io::Error::from(e)
                ))
            }
        };
    }
    Ok(dir)
}

/// A directory, for `*at` calls: never through a link at the last component.
fn directory_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// `fchmod` to `mode` (whatever the umask left at creation), then `fchown` to `owner`:
/// both through the handle, so they act on what was made, whatever its name is now.
fn set_mode_and_owner(
    fd: BorrowedFd<'_>,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), String> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode))
        .map_err(|e| format!("cannot chmod: {}", std::io::Error::from(e)))?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(|e| format!("cannot chown: {}", std::io::Error::from(e)))?;
    }
    Ok(())
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
