//! Running initdb, and the on-disk cache of its result that makes every start after the
//! first a ~40 MB copy instead of a ~1.2 s initdb.
//!
//! Cache layout: `<cache root>/initdb-<key>/` is a complete, never-modified cluster, where
//! `key` is a short sha256 of the server version and the initdb arguments. An entry is
//! filled by copying into `initdb-<key>.tmp-<random>` and renaming that into place, so
//! readers see a whole entry or none, and of two daemons racing to fill it one rename
//! wins and the other's copy is thrown away. The cache is an optimisation only: when it
//! cannot be created or written, pglease warns and runs initdb at every start.
//!
//! This module does not decide where a cluster lives or how it is configured afterwards.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::sys::signal::Signal;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::binaries::Binaries;
use super::room::IN_THE_ROOM;
use super::run_as::RunAs;
use super::spawn::{self, CommandSpec, Output};
use super::util::{io_error, random_hex};
use crate::error::StartError;

/// The superuser role initdb creates; it connects only over the private unix socket.
pub const ADMIN_USER: &str = "postgres";

/// Bumped when the layout or content of cache entries changes, to orphan old entries.
const CACHE_FORMAT: &str = "pglease-initdb-cache-v1";
/// Hex digits of the key kept in directory names: 64 bits are plenty for a local cache.
const KEY_HEX_LEN: usize = 16;

/// initdb's arguments apart from the target directory; they are part of the cache key.
pub(crate) fn initdb_args(encoding: &str, locale: &str) -> Vec<String> {
    vec![
        // The cluster lives in memory and is thrown away: syncing is wasted time.
        "--nosync".into(),
        format!("--encoding={encoding}"),
        format!("--locale={locale}"),
        format!("--username={ADMIN_USER}"),
        // Only the pg_hba.conf pglease writes at each start matters; see settings::pg_hba.
        "--auth=trust".into(),
    ]
}

/// The cache entry for one server version and set of initdb arguments.
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    /// `<root>/initdb-<key>`.
    pub entry: PathBuf,
}

impl Cache {
    /// Opens (creating) the cache root; `None`, with a warning, when that fails.
    pub fn open(root: PathBuf, version: &str, args: &[String]) -> Option<Cache> {
        if let Err(e) = std::fs::create_dir_all(&root) {
            warn!(
                cache_dir = %root.display(),
                error = %e,
                "cannot create the initdb cache directory; initdb will run at every start"
            );
            return None;
        }
        let mut hasher = Sha256::new();
        for part in std::iter::once(CACHE_FORMAT)
            .chain(std::iter::once(version))
            .chain(args.iter().map(String::as_str))
        {
            // NUL-separated so that no two different lists hash alike.
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        let key = &hex::encode(hasher.finalize())[..KEY_HEX_LEN];
        let entry = root.join(format!("initdb-{key}"));
        Some(Cache { entry })
    }

    /// The entry, if it holds a complete cluster.
    pub fn lookup(&self) -> Option<&Path> {
        let complete = self.entry.join("PG_VERSION").is_file()
            && self.entry.join("global").join("pg_control").is_file();
        complete.then_some(self.entry.as_path())
    }

    /// Stores a fresh initdb output as the entry (atomically; losing a race is fine).
    pub fn store(&self, cluster: &Path) -> Result<(), StartError> {
        if self.entry.exists() && self.lookup().is_none() {
            // Damaged (someone deleted files in it): move it aside, then replace it.
            let aside = with_suffix(&self.entry, &format!(".broken-{}", random_hex(4)));
            if std::fs::rename(&self.entry, &aside).is_ok() {
                warn!(entry = %self.entry.display(), "replacing a damaged initdb cache entry");
                let _ = std::fs::remove_dir_all(&aside);
            }
        }
        let tmp = with_suffix(&self.entry, &format!(".tmp-{}", random_hex(6)));
        // The cache belongs to the daemon's user: copy without changing owners.
        let result = copy_tree(cluster, &tmp, None, None).and_then(|()| {
            match std::fs::rename(&tmp, &self.entry) {
                Ok(()) => Ok(()),
                // Another process filled the entry first: theirs is as good as ours.
                Err(_) if self.lookup().is_some() => Ok(()),
                Err(e) => Err(io_error("cannot rename into", &self.entry, e)),
            }
        });
        if tmp.exists() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }
}

/// Runs initdb as `run_as` into `data_dir` (which must not exist; its parent must be
/// writable by that user), with `cwd` as its working directory.
pub(crate) fn run_initdb(
    binaries: &Binaries,
    run_as: &RunAs,
    args: &[String],
    data_dir: &Path,
    cwd: &Path,
) -> Result<(), StartError> {
    let mut argv: Vec<OsString> = vec!["-D".into(), data_dir.into()];
    argv.extend(args.iter().map(OsString::from));
    let spec = CommandSpec {
        program: binaries.initdb(),
        args: argv,
        cwd: cwd.to_path_buf(),
        user: run_as.owner(),
        // Nothing to clean up in a half-made cluster on tmpfs: stop it outright.
        death_signal: Signal::SIGKILL,
        output: Output::Piped,
    };
    info!(command = %spec, user = %run_as.name, "running initdb");
    let started = Instant::now();
    let program = spec.program.clone();
    let child = spawn::spawn(spec).map_err(|source| io_error("cannot run", &program, source))?;
    let output = child
        .wait_with_output()
        .map_err(|source| io_error("cannot wait for", &program, source))?;
    if !output.status.success() {
        return Err(StartError::Initdb {
            status: output.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        });
    }
    info!(
        data_dir = %data_dir.display(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "initdb finished"
    );
    Ok(())
}

/// Copies the tree at `src` to `dst` (which must not exist), keeping permission bits and
/// symlinks, and giving everything to `owner` when set. `room`: the cluster's room in
/// `--databases-dir` whose `base/` and `pg_notify/` `dst/base` and `dst/pg_notify` link to
/// (`room.rs`), which the copy fills.
pub(crate) fn copy_tree(
    src: &Path,
    dst: &Path,
    owner: Option<(u32, u32)>,
    room: Option<&Path>,
) -> Result<(), StartError> {
    let meta = std::fs::symlink_metadata(src).map_err(|e| io_error("cannot stat", src, e))?;
    match std::fs::create_dir(dst) {
        // Made already, empty: a cluster directory whose databases have a tmpfs of their
        // own (`space.rs`) and that tmpfs' mount point, or a link to a fresh part of the
        // cluster's room in `--databases-dir` (`room.rs`): the only links a copy goes
        // through.
        Err(e)
            if e.kind() == std::io::ErrorKind::AlreadyExists
                && (is_real_dir(dst) || room.is_some_and(|room| links_into(dst, room))) => {}
        result => result.map_err(|e| io_error("cannot create", dst, e))?,
    }
    let entries = std::fs::read_dir(src).map_err(|e| io_error("cannot read", src, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error("cannot read", src, e))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let kind = entry
            .file_type()
            .map_err(|e| io_error("cannot stat", &from, e))?;
        if kind.is_dir() {
            copy_tree(&from, &to, owner, room)?;
        } else if kind.is_symlink() {
            let target =
                std::fs::read_link(&from).map_err(|e| io_error("cannot read", &from, e))?;
            std::os::unix::fs::symlink(&target, &to)
                .map_err(|e| io_error("cannot create", &to, e))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::lchown(&to, Some(uid), Some(gid))
                    .map_err(|e| io_error("cannot chown", &to, e))?;
            }
        } else if kind.is_file() {
            // std::fs::copy keeps the permission bits and uses copy_file_range.
            std::fs::copy(&from, &to).map_err(|e| io_error("cannot copy", &from, e))?;
            chown(&to, owner)?;
        }
        // Sockets and fifos have no place in a stopped cluster: skip them.
    }
    // Permissions last, so that a read-only directory could still be filled.
    std::fs::set_permissions(
        dst,
        std::fs::Permissions::from_mode(meta.permissions().mode()),
    )
    .map_err(|e| io_error("cannot chmod", dst, e))?;
    chown(dst, owner)
}

/// `path` with `suffix` appended to its last component.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// chown when `owner` is set — of `path` itself, never of what a link there points at.
pub(crate) fn chown(path: &Path, owner: Option<(u32, u32)>) -> Result<(), StartError> {
    match owner {
        Some((uid, gid)) => std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(|e| io_error("cannot chown", path, e)),
        None => Ok(()),
    }
}

/// `path` is a link to one of the parts of the cluster room `room` (`room::IN_THE_ROOM`).
fn links_into(path: &Path, room: &Path) -> bool {
    std::fs::read_link(path)
        .is_ok_and(|link| IN_THE_ROOM.iter().any(|part| link == room.join(part)))
}

/// `path` is a directory, not a link to one.
fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir())
}
