//! The databases' room an operator gives (`--databases-dir`): a directory on a file system
//! of its own (a second tmpfs: docker's `--tmpfs`, compose's `tmpfs:`, a Kubernetes
//! `emptyDir` of medium `Memory`), where each cluster's `base/` — every database's files and
//! their temporary files — and `pg_notify/` — `LISTEN`/`NOTIFY`'s queue — live, while WAL,
//! the shared catalogs and the log keep the instance directory's file system. It is what
//! `space.rs` does by mounting, for a daemon that cannot mount (not root, or a container's
//! root without CAP_SYS_ADMIN): a lease that fills the room gets "could not extend file"
//! (SQLSTATE 53100), a notifier whose queue nobody reads "could not access status of
//! transaction 0" (53100), and the server stays up. The queue goes there because before
//! PostgreSQL 17 nothing bounds it short of 8 GB: beside WAL it would fill WAL's file system
//! and postgres would PANIC.
//!
//! Layout: `<databases dir>/pglease-<pid>-<hex>/` is this instance's room root (private to
//! the server's user, with the marker of `marker.rs`, so that the sweep removes it once its
//! daemon is gone); each cluster gets `<room root>/pgdata-<generation>/` (its cluster room)
//! holding `base/` and `pg_notify/`, and the cluster's `base` and `pg_notify` are symbolic
//! links to them ([`IN_THE_ROOM`]), made before the cluster is filled (a copy or an unpack
//! goes into the room, `initdb.rs`, `snapshot/unpack.rs`; a snapshot packs what `base`
//! points at and `pg_notify` as an empty directory, `snapshot.rs`). One directory per
//! cluster, named as the cluster, so that removing a cluster's room, and the sweep of the
//! rooms of earlier generations (`instance::remove_stale_clusters`), take both parts at
//! once. A link rather than a tablespace: postgres opens `base/…` and `pg_notify/…`
//! relative to its data directory and follows the link like any path, so no SQL changes
//! (every `CREATE DATABASE` would otherwise name the tablespace, and temporary files theirs;
//! the queue has no tablespace at all).
//!
//! It checks the directory (a directory, writable, on a file system other than the
//! instance's: on the same one it would split nothing) and makes and removes the rooms;
//! sizing WAL from what the rest has is `space.rs`'s [`super::space::max_wal_size`].

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::unistd::AccessFlags;
use tracing::warn;

use super::marker::write_marker;
use super::run_as::{make_private_dir, RunAs};
use super::util::io_error;
use crate::error::{DatabasesDirError, StartError};

/// Checks that `dir` is a writable directory on another file system than `instance` (when
/// given).
pub(crate) fn check(dir: &Path, instance: Option<&Path>) -> Result<(), DatabasesDirError> {
    let meta = std::fs::metadata(dir).map_err(|source| DatabasesDirError::Unreadable {
        path: dir.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(DatabasesDirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    nix::unistd::access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|source| {
        DatabasesDirError::NotWritable {
            path: dir.to_path_buf(),
            source,
        }
    })?;
    if let Some(instance) = instance {
        let same = std::fs::metadata(instance).is_ok_and(|other| other.dev() == meta.dev());
        if same {
            return Err(DatabasesDirError::SameFileSystem {
                path: dir.to_path_buf(),
                instance: instance.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// The parts of a cluster that live in its room, by their name in the data directory
/// (`space::DIR`, `space::NOTIFY_QUEUE_DIR`) and in the cluster room: each is a link from
/// the one to the other.
pub(crate) const IN_THE_ROOM: [&str; 2] = [super::space::DIR, super::space::NOTIFY_QUEUE_DIR];

/// This instance's room in the databases' directory.
#[derive(Debug)]
pub(crate) struct Room {
    /// `<databases dir>/pglease-<pid>-<hex>`, the server user's.
    pub root: PathBuf,
}

impl Room {
    /// Makes this instance's room root `name` in `databases_dir` (private to the server's
    /// user), marked as this daemon's so that a later sweep removes it once the daemon is
    /// gone.
    pub fn create(databases_dir: &Path, name: &str, run_as: &RunAs) -> Result<Room, StartError> {
        let root = databases_dir.join(name);
        std::fs::create_dir(&root).map_err(|e| io_error("cannot create", &root, e))?;
        let room = Room { root };
        // The marker first (as in the instance directory): a crash from here on leaves a
        // sweepable directory.
        write_marker(&room.root, false)
            .and_then(|()| make_private_dir(&room.root, run_as))
            .inspect_err(|_| room.remove())?;
        Ok(room)
    }

    /// Removes the room root and everything in it (tolerant of it being gone).
    pub fn remove(&self) {
        match std::fs::remove_dir_all(&self.root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(path = %self.root.display(), error = %e, "cannot remove the databases' room")
            }
        }
    }
}

/// The room of the cluster at `data_dir`: `<room root>/<its directory name>`, which holds
/// the parts [`IN_THE_ROOM`] under their own names.
pub(crate) fn cluster_room(room_root: &Path, data_dir: &Path) -> PathBuf {
    room_root.join(data_dir.file_name().unwrap_or_default())
}

/// Makes `data_dir` (private to the server's user) with its `base` and `pg_notify` links to
/// fresh, empty, private directories in the cluster's room, before the cluster is put there
/// (by a copy or an unpack, which fill the existing directories). A room left by an earlier
/// attempt at the same generation is removed first.
pub(crate) fn make_cluster_dir(
    data_dir: &Path,
    room_root: &Path,
    run_as: &RunAs,
) -> Result<(), StartError> {
    std::fs::create_dir(data_dir).map_err(|e| io_error("cannot create", data_dir, e))?;
    make_private_dir(data_dir, run_as)?;
    let room = cluster_room(room_root, data_dir);
    remove_cluster_room(room_root, data_dir)?;
    std::fs::create_dir(&room).map_err(|e| io_error("cannot create", &room, e))?;
    make_private_dir(&room, run_as)?;
    for part in IN_THE_ROOM {
        let target = room.join(part);
        std::fs::create_dir(&target).map_err(|e| io_error("cannot create", &target, e))?;
        make_private_dir(&target, run_as)?;
        let link = data_dir.join(part);
        std::os::unix::fs::symlink(&target, &link)
            .map_err(|e| io_error("cannot create", &link, e))?;
        if let Some((uid, gid)) = run_as.owner() {
            std::os::unix::fs::lchown(&link, Some(uid), Some(gid))
                .map_err(|e| io_error("cannot chown", &link, e))?;
        }
    }
    Ok(())
}

/// Removes the room of the cluster at `data_dir`, if there is one.
pub(crate) fn remove_cluster_room(room_root: &Path, data_dir: &Path) -> Result<(), StartError> {
    let room = cluster_room(room_root, data_dir);
    match std::fs::remove_dir_all(&room) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io_error("cannot remove", &room, e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::util::random_hex;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pglease-room-{name}-{}-{}",
            std::process::id(),
            random_hex(4)
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[test]
    fn a_directory_on_the_instances_file_system_is_refused() {
        let dir = scratch("same");
        let error = check(&dir, Some(&dir)).expect_err("same file system");
        assert!(
            matches!(error, DatabasesDirError::SameFileSystem { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("same file system"), "{error}");
        check(&dir, None).expect("no instance to compare with");
        let file = dir.join("file");
        std::fs::write(&file, b"x").expect("write");
        assert!(matches!(
            check(&file, None),
            Err(DatabasesDirError::NotADirectory { .. })
        ));
        assert!(matches!(
            check(&dir.join("missing"), None),
            Err(DatabasesDirError::Unreadable { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
