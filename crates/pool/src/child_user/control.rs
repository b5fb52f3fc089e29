//! Who controls an operator's command (issue 42): whether one user alone — the owner of the
//! command's working directory, with root — can change what the command runs. If so the
//! command may run as that user, who could change its scripts anyway; if another user could
//! change a directory, a parent or a file the command names, nobody has that control and it
//! runs as the child user, as every caller's command does.
//!
//! The rule ([`decide`]) is pure over a [`Tree`] of `lstat` results, so that it gets plain
//! unit tests; [`Disk`] is the real file system. Nothing here follows a link: the working
//! directory is resolved to its canonical path first ([`who_controls`]), and links met in
//! the walk are neither followed nor checked (nobody can change a link but through the
//! directory that holds it, which is checked). This module runs nothing and switches to
//! nobody; `template/command/runner.rs` does.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Entries of a working directory's tree checked at most: past this the check gives up and
/// the command runs as the child user (a checkout with a vendored dependency tree of this
/// size takes about a second of `lstat` calls).
pub(crate) const WALK_LIMIT: usize = 250_000;

/// The user an operator's command runs as, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommandUser {
    /// The owner of the working directory controls it alone (root, or one user with root).
    Owner {
        /// The working directory's canonical path, which was checked: the command runs
        /// there, never through the path it was configured with, whose links another
        /// user might change after the check.
        workdir: PathBuf,
        /// Its uid.
        uid: u32,
        /// The working directory's group, for an owner the user database does not know.
        gid: u32,
        /// Why this user, for logs and errors.
        why: String,
    },
    /// Nobody controls it alone: the child user runs it.
    ChildUser {
        /// The path another user could change (or why the check could not be made).
        reason: String,
    },
}

/// What [`decide`] needs of one file-system entry (its `lstat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// `st_mode`: the permission bits (with the sticky bit) and the type bits.
    pub mode: u32,
    /// What it is.
    pub kind: Kind,
}

/// The type of an [`Entry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A directory: walked.
    Dir,
    /// A symbolic link: neither followed nor checked.
    Link,
    /// A regular file or anything else: checked.
    Other,
}

/// The file system as [`decide`] sees it.
pub(crate) trait Tree {
    /// `lstat(path)`: the entry itself, never what a link points to.
    fn lstat(&self, path: &Path) -> io::Result<Entry>;
    /// The paths of a directory's entries.
    fn children(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
}

/// The real file system, read with the daemon's rights (the operator's paths).
pub(crate) struct Disk;

impl Tree for Disk {
    fn lstat(&self, path: &Path) -> io::Result<Entry> {
        let meta = std::fs::symlink_metadata(path)?;
        let kind = if meta.file_type().is_symlink() {
            Kind::Link
        } else if meta.is_dir() {
            Kind::Dir
        } else {
            Kind::Other
        };
        Ok(Entry {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode(),
            kind,
        })
    }

    fn children(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        std::fs::read_dir(dir)?
            .map(|entry| entry.map(|entry| entry.path()))
            .collect()
    }
}

/// Decides who runs a command of the operator's in `workdir` (absolute, without links),
/// naming the files in `named` (absolute, without links) besides. Some user X controls
/// it when `workdir` is X's, and `workdir`, every parent up to `/`, every entry below
/// `workdir` (up to `limit` of them) and every named file with its parents are each
/// owned by root or X and writable by neither group nor others. A sticky world-writable
/// directory (`/tmp`) is writable by others: whoever may create entries there may put
/// one in the path's place.
pub(crate) fn decide(
    tree: &impl Tree,
    workdir: &Path,
    named: &[PathBuf],
    limit: usize,
) -> CommandUser {
    match control(tree, workdir, named, limit) {
        Ok((uid, gid)) => CommandUser::Owner {
            workdir: workdir.to_path_buf(),
            uid,
            gid,
            why: format!(
                "uid {uid} owns {} and no other user can change it, its parents or its files",
                workdir.display()
            ),
        },
        Err(reason) => CommandUser::ChildUser {
            reason: reason.to_string(),
        },
    }
}

/// Why no one user controls a command's files alone (the clause after "no one user
/// controls its files alone: ").
#[derive(Debug, thiserror::Error)]
enum NotControlled {
    /// The working directory is given by a relative path.
    #[error("{} is not an absolute path", path.display())]
    NotAbsolute {
        /// The path.
        path: PathBuf,
    },
    /// The working directory is not a directory.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// An entry cannot be looked at.
    #[error("cannot check {}: {source}", path.display())]
    Unchecked {
        /// The entry.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A directory cannot be listed.
    #[error("cannot list {}: {source}", dir.display())]
    Unlisted {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The tree is bigger than pglease walks.
    #[error("{} holds more than {limit} entries, more than pglease checks for other users' write access", workdir.display())]
    TooManyEntries {
        /// The working directory.
        workdir: PathBuf,
        /// The most entries walked.
        limit: usize,
    },
    /// An entry belongs to a third user.
    #[error("{} belongs to uid {uid}, neither root nor the owner of the working directory (uid {owner})", path.display())]
    ThirdUser {
        /// The entry.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The working directory's owner.
        owner: u32,
    },
    /// An entry others (or its group) may write.
    #[error("{} is writable by {who} (mode {mode:04o})", path.display())]
    Writable {
        /// The entry.
        path: PathBuf,
        /// "others" or "its group".
        who: &'static str,
        /// Its permission bits.
        mode: u32,
    },
}

/// [`decide`]'s walk: the owner's uid and the directory's gid, or why nobody controls it.
fn control(
    tree: &impl Tree,
    workdir: &Path,
    named: &[PathBuf],
    limit: usize,
) -> Result<(u32, u32), NotControlled> {
    if !workdir.is_absolute() {
        return Err(NotControlled::NotAbsolute {
            path: workdir.to_owned(),
        });
    }
    let top = stat(tree, workdir)?;
    if top.kind != Kind::Dir {
        return Err(NotControlled::NotADirectory {
            path: workdir.to_owned(),
        });
    }
    let owner = top.uid;
    for dir in workdir.ancestors() {
        check(dir, &stat(tree, dir)?, owner)?;
    }
    for path in named {
        // A named file below the working directory is met in the walk.
        if path.starts_with(workdir) {
            continue;
        }
        for part in path.ancestors() {
            let entry = stat(tree, part)?;
            if entry.kind != Kind::Link {
                check(part, &entry, owner)?;
            }
        }
    }
    let mut pending = vec![workdir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = pending.pop() {
        let children = tree
            .children(&dir)
            .map_err(|source| NotControlled::Unlisted {
                dir: dir.clone(),
                source,
            })?;
        for child in children {
            seen += 1;
            if seen > limit {
                return Err(NotControlled::TooManyEntries {
                    workdir: workdir.to_owned(),
                    limit,
                });
            }
            let entry = stat(tree, &child)?;
            match entry.kind {
                // Only the directory holding a link can change it, and that is checked.
                Kind::Link => {}
                Kind::Dir => {
                    check(&child, &entry, owner)?;
                    pending.push(child);
                }
                Kind::Other => check(&child, &entry, owner)?,
            }
        }
    }
    Ok((owner, top.gid))
}

fn stat(tree: &impl Tree, path: &Path) -> Result<Entry, NotControlled> {
    tree.lstat(path).map_err(|source| NotControlled::Unchecked {
        path: path.to_owned(),
        source,
    })
}

/// One entry's part of the rule: root's or the owner's, and closed to group and others.
fn check(path: &Path, entry: &Entry, owner: u32) -> Result<(), NotControlled> {
    if entry.uid != 0 && entry.uid != owner {
        return Err(NotControlled::ThirdUser {
            path: path.to_owned(),
            uid: entry.uid,
            owner,
        });
    }
    let who = match (entry.mode & 0o020 != 0, entry.mode & 0o002 != 0) {
        (_, true) => "others",
        (true, false) => "its group",
        (false, false) => return Ok(()),
    };
    Err(NotControlled::Writable {
        path: path.to_owned(),
        who,
        mode: entry.mode & 0o7777,
    })
}

/// The files a shell command names that exist: each word with a `/` or naming an entry
/// of `workdir`, resolved against it, if it is a regular file or a directory (`/dev/null`
/// is no script). Each is given twice: as written (the directories that hold a link on the
/// way must be checked, or another user could point the link elsewhere after the check)
/// and at its canonical path (what the command reaches through the links). Words of the
/// command's programs found through `PATH` are not among them: `PATH` is the daemon's, the
/// operator's own.
pub(crate) fn named_files(workdir: &Path, command: &str) -> Vec<PathBuf> {
    let separators = |c: char| c.is_whitespace() || ";|&()<>'\"`=".contains(c);
    let mut named: Vec<PathBuf> = command
        .split(separators)
        .filter(|word| !word.is_empty() && !word.starts_with('-') && !word.starts_with('$'))
        .filter_map(|word| {
            // `components` drops the `.` of `./bin/migrate`.
            let written: PathBuf = workdir.join(word).components().collect();
            let canonical = std::fs::canonicalize(&written).ok()?;
            let meta = std::fs::metadata(&canonical).ok()?;
            (meta.is_file() || meta.is_dir()).then_some([written, canonical])
        })
        .flatten()
        .collect();
    named.sort();
    named.dedup();
    named
}

/// [`decide`] on the real file system for an operator's command: `workdir` resolved to its
/// canonical path first (a link among its parents is judged where it leads).
pub(crate) fn who_controls(workdir: &Path, command: &str) -> CommandUser {
    let canonical = match std::fs::canonicalize(workdir) {
        Ok(path) => path,
        Err(e) => {
            return CommandUser::ChildUser {
                reason: format!("cannot resolve {}: {e}", workdir.display()),
            }
        }
    };
    decide(
        &Disk,
        &canonical,
        &named_files(&canonical, command),
        WALK_LIMIT,
    )
}

#[cfg(test)]
mod tests;
