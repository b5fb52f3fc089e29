//! Which store a server's clusters live on (`--storage tmpfs|cow|auto`), decided once when
//! its instance directory is made: the rules ([`decide`], no I/O) over facts gathered
//! beforehand ([`Facts`]; the templates' sizes by [`largest_template`]). Making the store
//! is `cow.rs`'s; carrying the decision out is `instance.rs`'s.
//!
//! `auto`, the default, follows the measurements of bench scenario 13 (docs/cow-storage.md):
//! the copy-on-write store clones a big template in a fraction of the time and shares its
//! blocks, but a small template's clone is ~350 small files whose creation and removal XFS
//! journals, so a suite on a small template runs at about half speed there. Only a template
//! known at start to be big tips it: the sizes of its sources (a dump, SQL files, a
//! command's watched files) or of its database in a snapshot. PostgreSQL before 18 copies on
//! any store, so `auto` never makes one for it.

use std::path::Path;

use super::snapshot;
use crate::config::{Storage, TemplateConfig};

/// From this size of a template known at start, `auto` makes a copy-on-write store.
///
/// Bench scenario 13's lease loop on a warm pool (one worker; each test leases, creates a
/// table, reads a row, releases) ran on the store at 0.85× of tmpfs for a one-table
/// template of 18 MB, 1.25× at 60 MB, 2.0× at 111 MB, 3.9× at 267 MB and 10× at 1 GB; but
/// the bench fixture, 18 MB in many small tables and indexes, runs at 0.6×, since the
/// store's cost grows with a clone's files and tmpfs' with its bytes. The line sits past
/// both crossovers, and sources are a lower bound of the database they make (a dump is
/// compressed, its indexes are rebuilt).
pub(crate) const AUTO_MIN_TEMPLATE_BYTES: u64 = 128 * 1024 * 1024;

/// What the clusters live on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// The instance directory itself: a clone copies its template.
    Copy,
    /// The instance directory itself, whose file system clones (a `--data-dir` on XFS with
    /// reflinks or btrfs): a clone shares its template's blocks.
    DirClones,
    /// A copy-on-write store made in the instance directory (`cow.rs`), or a kept one
    /// adopted. `fallback`: if it cannot be made, [`Layout::Copy`] with a warning instead
    /// of refusing to start (`auto` chose it, the user did not ask for it).
    Store {
        /// Copy instead when the store cannot be made.
        fallback: bool,
    },
}

/// What `auto` weighs besides the directory, known before it is made.
#[derive(Debug, Clone, Default)]
pub(crate) struct StorageHints {
    /// The server's major version.
    pub major: u32,
    /// The biggest template known at start: its name and bytes (its sources', or its
    /// database's in the snapshot the first start unpacks).
    pub largest_template: Option<(String, u64)>,
}

/// What the decision rests on, gathered by the caller.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    /// `--storage`.
    pub requested: Storage,
    /// The server's major version.
    pub major: u32,
    /// The instance directory is on tmpfs or ramfs.
    pub in_memory: bool,
    /// Whether a copy in the instance directory shares its blocks (`Err`: why not);
    /// `None` where it was not checked (no `--data-dir`: a fresh directory on tmpfs).
    // A message by design: the reason is only said (in the log and `/status`'s storage
    // line); the decision reads whether it is `Ok`.
    pub dir_clones: Option<Result<(), String>>,
    /// The instance directory is a kept one whose copy-on-write store is still mounted.
    pub kept_store: bool,
    /// The instance directory is a kept one with clusters outside a store.
    pub kept_clusters: bool,
    /// Why a store cannot be made here, if that is known beforehand (not root, no
    /// `mkfs.xfs`).
    pub cannot_make: Option<String>,
    /// The biggest template known at start: its name and bytes.
    pub largest_template: Option<(String, u64)>,
}

/// The layout and, for the log and `/status`, why.
pub(crate) fn decide(facts: &Facts) -> (Layout, String) {
    if facts.kept_store {
        return (
            Layout::Store { fallback: false },
            "the kept instance directory's copy-on-write store".into(),
        );
    }
    match facts.requested {
        Storage::Tmpfs => (Layout::Copy, "--storage tmpfs".into()),
        Storage::Cow => match &facts.dir_clones {
            Some(Ok(())) => (
                Layout::DirClones,
                "--storage cow: the data directory's file system clones".into(),
            ),
            Some(Err(why)) if !facts.in_memory => (
                Layout::Copy,
                format!("--storage cow, but the data directory on disk cannot clone ({why})"),
            ),
            _ => (
                Layout::Store { fallback: false },
                "--storage cow: a store made in RAM".into(),
            ),
        },
        Storage::Auto => decide_auto(facts),
    }
}

/// `--storage auto`.
fn decide_auto(facts: &Facts) -> (Layout, String) {
    let copy = |why: String| (Layout::Copy, format!("auto: {why}"));
    if facts.major < 18 {
        return copy(format!(
            "PostgreSQL {} has no file_copy_method = clone, so clones copy on any store",
            facts.major
        ));
    }
    if let Some(Ok(())) = facts.dir_clones {
        return (
            Layout::DirClones,
            "auto: the data directory's file system clones".into(),
        );
    }
    if facts.kept_clusters {
        return copy("the kept instance directory's clusters stay where they are".into());
    }
    if !facts.in_memory {
        return copy("the data directory is on disk and cannot clone".into());
    }
    let big = facts
        .largest_template
        .as_ref()
        .filter(|(_, bytes)| *bytes >= AUTO_MIN_TEMPLATE_BYTES);
    let Some((name, bytes)) = big else {
        return copy(match &facts.largest_template {
            Some((name, bytes)) if *bytes > 0 => format!(
                "no template known at start reaches {} MB (the largest, {name}, is {} MB), \
                 and on tmpfs small templates clone faster",
                AUTO_MIN_TEMPLATE_BYTES >> 20,
                bytes >> 20
            ),
            _ => format!(
                "no template known at start reaches {} MB, and on tmpfs small templates \
                 clone faster",
                AUTO_MIN_TEMPLATE_BYTES >> 20
            ),
        });
    };
    if let Some(why) = &facts.cannot_make {
        return copy(format!(
            "template {name} is {} MB, but a copy-on-write store cannot be made here: {why}",
            bytes >> 20
        ));
    }
    (
        Layout::Store { fallback: true },
        format!(
            "auto: template {name} is {} MB (at least {} MB): a copy-on-write store, where \
             clones share its blocks",
            bytes >> 20,
            AUTO_MIN_TEMPLATE_BYTES >> 20
        ),
    )
}

/// The biggest of `templates` by what is known before the server starts: its sources' bytes
/// (a dump, SQL files, a command's watched files; a lower bound of the database), or its
/// database's size in `snapshot`, the manifest of the snapshot the first start unpacks (for
/// templates still configured).
pub(crate) fn largest_template(
    templates: &[TemplateConfig],
    snapshot: Option<&snapshot::Manifest>,
) -> Option<(String, u64)> {
    let sources = templates.iter().map(|t| {
        (
            t.name.to_string(),
            crate::template::stamp(&t.source).bytes(),
        )
    });
    // Only templates still configured: the snapshot may hold one that no longer is.
    let configured = |name: &str| templates.iter().any(|t| t.name.as_str() == name);
    let saved = snapshot.into_iter().flat_map(|manifest| {
        manifest
            .templates
            .iter()
            .filter(|t| configured(&t.name))
            .map(|t| (t.name.clone(), u64::try_from(t.size_bytes).unwrap_or(0)))
    });
    sources.chain(saved).max_by_key(|(_, bytes)| *bytes)
}

/// Why a store cannot be made by this process, if a cheap look tells: it needs root for
/// the mount and `mkfs.xfs` on the PATH.
pub(crate) fn cannot_make_store() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("the mount needs root (or CAP_SYS_ADMIN)".into());
    }
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| is_executable(&dir.join("mkfs.xfs")))
    });
    (!found).then(|| "mkfs.xfs is not installed (Debian: apt-get install xfsprogs)".into())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests;
