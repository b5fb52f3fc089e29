//! The instance directory: creating it (optionally a dedicated tmpfs mounted on it),
//! checking that it lives in memory, deciding and making what the clusters live on, giving
//! the databases a tmpfs of their own (or their room in `--databases-dir`), the paths of the clusters in it, and removing it at
//! exit. The OS user is `run_as.rs`, the marker `marker.rs`, the sweep of the instances a
//! killed daemon left behind `sweep.rs`.
//!
//! Layout of an instance directory:
//! - `pglease-instance`: the marker (`marker.rs`), written by the daemon (owned by its
//!   euid), holding `pid=<daemon pid>` and `start_time=<its start time in clock ticks since
//!   boot>`, or `kept=1` once a `keep_data` run has ended (the sweep leaves those alone);
//! - `pgdata-<generation>/`: one cluster per start, see [`super::Embedded::start`];
//! - `socket/`: the private unix socket directory (mode 0700, owned by the server's user);
//! - `postgres.log`: the server's stdout and stderr, appended to by every generation;
//! - with a copy-on-write store (`--storage cow`, or `auto` for a big template; chosen by
//!   `storage.rs`): `cow.xfs`, the store's file, mounted on `cow/`, where the
//!   `pgdata-<generation>/` directories are instead (`cow.rs`).
//!
//! It starts no server and signals no process.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::unistd::geteuid;
use tracing::{info, warn};

use super::filesystem::{check_in_memory, free_bytes, is_mount_point, total_bytes};
use super::marker::{read_marker, write_marker, Marker};
use super::room::{self, Room};
use super::run_as::{make_private_dir, RunAs};
use super::space;
use super::storage::{self, Layout, StorageHints};
use super::util::{io_error, random_hex};
use crate::config::{EmbeddedConfig, Storage};
use crate::error::{DatabasesDirError, StartError};
use crate::types::StorageStatus;

/// Prefix of the default instance directories under [`SHM_ROOT`], and of cluster dirs.
pub(crate) const INSTANCE_PREFIX: &str = "pglease-";
/// Where default instance directories live: tmpfs on every Linux system.
pub(crate) const SHM_ROOT: &str = "/dev/shm";
/// Prefix of the per-generation cluster directories inside an instance.
pub(crate) const CLUSTER_PREFIX: &str = "pgdata-";
/// Prefix of the temporary initdb output directories inside an instance.
pub(crate) const INITDB_TMP_PREFIX: &str = "initdb-tmp-";

/// The instance tmpfs pglease mounts: no devices, no setuid, no programs. Nothing runs from
/// it (postgres and initdb come from their binary directory, the initdb cache and the
/// downloaded binaries live in the cache root, the copy-on-write store is a file mounted
/// with its own flags), while a file a lease holder makes postgres write there (`COPY … TO`
/// as a superuser lease, an extension's files) must not become a program anyone can run.
const INSTANCE_MOUNT_FLAGS: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// The kernel's limit on a unix socket path, `sizeof(sun_path)` minus the final NUL.
const MAX_SOCKET_PATH: usize = 107;

/// A prepared instance directory.
#[derive(Debug)]
pub(crate) struct Instance {
    /// The directory.
    pub dir: PathBuf,
    /// The unix socket directory inside it.
    pub socket_dir: PathBuf,
    /// What the clusters live on, as carried out (`Copy` too after `auto`'s fall-back); the
    /// rest is derived from it: [`Instance::clones`], [`Instance::clusters`],
    /// [`Instance::storage`].
    layout: Layout,
    /// Why that layout (`--storage`, or what `auto` weighed), for the log and `/status`.
    layout_reason: String,
    /// Where clones share blocks: the bytes the clusters' file system held before any
    /// cluster was put there, the base of the byte budget's measured usage.
    pub store_base: Option<u64>,
    /// The server log inside it.
    pub log_path: PathBuf,
    /// It is on tmpfs or ramfs (false only with `allow_unsafe_on_disk`).
    pub in_memory: bool,
    /// We created the directory (so cleanup removes it, not only its contents).
    created: bool,
    /// We mounted a tmpfs on it (so cleanup unmounts it).
    mounted: bool,
    /// Each cluster's databases get a tmpfs of their own (`space.rs`): on tmpfs, as root;
    /// or room of their own in `--databases-dir` (then `databases_room` is set too).
    pub databases_space: Option<space::Split>,
    /// This instance's room in `--databases-dir` (`room.rs`).
    databases_room: Option<Room>,
}

impl Instance {
    /// Creates (or adopts) the instance directory, mounts its tmpfs if asked, writes the
    /// marker, checks the file system and makes the socket directory. On error, whatever
    /// was created is removed again.
    pub fn create(
        config: &EmbeddedConfig,
        hints: &StorageHints,
        run_as: &RunAs,
    ) -> Result<Instance, StartError> {
        let (dir, created) = match &config.data_dir {
            Some(dir) => adopt_configured(dir)?,
            None => {
                let dir = Path::new(SHM_ROOT).join(format!(
                    "{INSTANCE_PREFIX}{}-{}",
                    std::process::id(),
                    random_hex(8)
                ));
                std::fs::create_dir(&dir)
                    .map_err(|source| io_error("cannot create", &dir, source))?;
                (dir, true)
            }
        };
        let mut instance = Instance {
            socket_dir: dir.join("socket"),
            layout: Layout::Copy,
            layout_reason: String::new(),
            store_base: None,
            log_path: dir.join("postgres.log"),
            dir,
            in_memory: false,
            created,
            mounted: false,
            databases_space: None,
            databases_room: None,
        };
        match instance.set_up(config, hints, run_as) {
            Ok(()) => Ok(instance),
            Err(e) => {
                instance.remove();
                Err(e)
            }
        }
    }

    /// The steps of [`Instance::create`] after the directory exists.
    fn set_up(
        &mut self,
        config: &EmbeddedConfig,
        hints: &StorageHints,
        run_as: &RunAs,
    ) -> Result<(), StartError> {
        if let Some(bytes) = config.tmpfs_size {
            self.mount_tmpfs(bytes, run_as)?;
        }
        // The marker goes first, so that a crash from here on leaves a sweepable directory.
        write_marker(&self.dir, false)?;
        self.in_memory = check_in_memory(&self.dir, config.allow_unsafe_on_disk)?;
        log_exec(&self.dir);
        self.choose_storage(config, hints, run_as)?;
        self.share_space(config, run_as)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|source| io_error("cannot chmod", &self.dir, source))?;
        run_as.chown(&self.dir)?;
        match std::fs::create_dir(&self.socket_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(io_error("cannot create", &self.socket_dir, e))
            }
            _ => {}
        }
        // Private: the socket accepts the superuser without a password.
        make_private_dir(&self.socket_dir, run_as)?;
        let longest = self.socket_dir.join(".s.PGSQL.65535");
        let len = longest.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(StartError::SocketPathTooLong {
                path: longest,
                len,
                max: MAX_SOCKET_PATH,
            });
        }
        Ok(())
    }

    /// Decides what the clusters live on (`storage.rs`) and makes it: nothing, or a
    /// copy-on-write store in the directory (adopting a kept one).
    fn choose_storage(
        &mut self,
        config: &EmbeddedConfig,
        hints: &StorageHints,
        run_as: &RunAs,
    ) -> Result<(), StartError> {
        let store = self.dir.join(super::cow::MOUNT_DIR);
        let kept_store = is_mount_point(&store);
        let facts = storage::Facts {
            requested: config.storage,
            major: hints.major,
            in_memory: self.in_memory,
            // Only a directory of the user's may clone: ours is on tmpfs. `auto` has no use
            // for the answer before PostgreSQL 18, which copies on any store.
            dir_clones: (config.data_dir.is_some()
                && !kept_store
                && (config.storage == Storage::Cow
                    || config.storage == Storage::Auto && hints.major >= 18))
                .then(|| super::cow::check_clones(&self.dir).map_err(|e| e.to_string())),
            kept_store,
            kept_clusters: self.last_generation() > 0,
            cannot_make: (config.storage == Storage::Auto)
                .then(storage::cannot_make_store)
                .flatten(),
            largest_template: hints.largest_template.clone(),
        };
        let (layout, reason) = storage::decide(&facts);
        (self.layout, self.layout_reason) = match layout {
            Layout::Copy if config.storage == Storage::Cow => {
                warn!(path = %self.dir.display(), %reason, "--storage cow: the data directory's file system cannot clone files; clones copy their template (use XFS made with reflink=1 or btrfs, a tmpfs, or leave out --data-dir and pglease makes a store in RAM)");
                (layout, reason)
            }
            Layout::Copy | Layout::DirClones => (layout, reason),
            Layout::Store { fallback } => match self.make_store(kept_store, run_as) {
                Ok(()) => (layout, reason),
                Err(error) if fallback => {
                    warn!(%error, "auto: the copy-on-write store cannot be made; clones copy their template on tmpfs");
                    (
                        Layout::Copy,
                        format!("auto: a copy-on-write store could not be made ({error})"),
                    )
                }
                Err(error) => return Err(error),
            },
        };
        let status = self.storage();
        info!(path = %self.clusters().display(), storage = status.kind, reason = %status.reason, "storage chosen");
        if self.clones() {
            // Before initdb or a snapshot puts anything there: what a snapshot's templates
            // take counts in the budget, as a build's would.
            self.store_base = super::cow::used_bytes(&self.clusters()).ok();
        }
        Ok(())
    }

    /// Where clones copy: gives the databases their room in `--databases-dir` when one is
    /// given (`room.rs`); else, on tmpfs, as root, a tmpfs of their own (`space.rs`), sized
    /// from the dedicated tmpfs (which shrinks to the rest) or from what the shared one has
    /// free.
    fn share_space(&mut self, config: &EmbeddedConfig, run_as: &RunAs) -> Result<(), StartError> {
        if self.layout != Layout::Copy {
            if let Some(dir) = &config.databases_dir {
                info!(path = %dir.display(), "the databases live in the copy-on-write store, which WAL shares: --databases-dir is not used");
            }
            return Ok(());
        }
        if let Some(dir) = &config.databases_dir {
            if config.keep_data {
                return Err(DatabasesDirError::WithKeepData.into());
            }
            return self.use_databases_dir(dir, run_as);
        }
        if !self.in_memory {
            return Ok(());
        }
        if config.keep_data {
            // A mount would outlive the run with the directory, and make `rm -r` of a
            // kept directory fail on its mount point.
            info!("--keep-data: the databases share the data directory's tmpfs; a lease that fills it makes postgres restart, ending every lease");
            return Ok(());
        }
        if !geteuid().is_root() {
            info!("the databases share the server's tmpfs (giving them one of their own needs root): a lease that fills it makes postgres restart, ending every lease");
            return Ok(());
        }
        let total = match config.tmpfs_size {
            Some(bytes) => bytes,
            None => free_bytes(&self.dir)?,
        };
        let Some(split) = space::split(total) else {
            warn!(path = %self.dir.display(), total, "too little room to give the databases a tmpfs of their own: a lease that fills it makes postgres restart, ending every lease");
            return Ok(());
        };
        // Root without CAP_SYS_ADMIN (a container's root, by default) cannot mount: tried
        // here once, so that every start does not fail on it.
        if let Err(error) = space::can_mount(&self.dir) {
            warn!(path = %self.dir.display(), %error, "cannot mount a tmpfs for the databases: they share the server's, and a lease that fills it makes postgres restart, ending every lease");
            return Ok(());
        }
        if self.mounted {
            nix::mount::mount(
                None::<&str>,
                &self.dir,
                None::<&str>,
                // The flags are set anew by a remount: the same as at the mount.
                MsFlags::MS_REMOUNT | INSTANCE_MOUNT_FLAGS,
                Some(format!("size={}", split.rest).as_str()),
            )
            .map_err(|source| StartError::Sys {
                action: "cannot resize the tmpfs on",
                path: self.dir.clone(),
                source,
            })?;
        }
        info!(
            databases = split.databases,
            rest = split.rest,
            "the databases get a tmpfs of their own, WAL and the shared catalogs the rest: a lease that fills its database gets an error, the server stays up"
        );
        self.databases_space = Some(split);
        Ok(())
    }

    /// Gives the databases their room in `dir` (`room.rs`), as root too: the operator's
    /// file system is used instead of a tmpfs pglease would mount. WAL is sized from what
    /// the instance's file system has free (at most what the root split leaves it).
    fn use_databases_dir(&mut self, dir: &Path, run_as: &RunAs) -> Result<(), StartError> {
        room::check(dir, Some(&self.dir))?;
        let split = space::Split {
            databases: total_bytes(dir)?,
            rest: free_bytes(&self.dir)?.min(space::REST_MAX),
            // Not mounted: the queue stays with WAL (and 17+ bounds it by its setting).
            notify_queue: None,
        };
        let name = format!("{INSTANCE_PREFIX}{}-{}", std::process::id(), random_hex(8));
        let room = Room::create(dir, &name, run_as)?;
        info!(
            path = %room.root.display(),
            databases = split.databases,
            rest = split.rest,
            "the databases have room of their own in --databases-dir, WAL and the shared catalogs the instance directory's file system: a lease that fills its database gets an error, the server stays up"
        );
        self.databases_space = Some(split);
        self.databases_room = Some(room);
        Ok(())
    }

    /// The room root in `--databases-dir` each cluster's `base/` goes to, when there is one.
    pub fn databases_room(&self) -> Option<PathBuf> {
        self.databases_room.as_ref().map(|room| room.root.clone())
    }

    /// The clusters' file system clones files (our store, or a `--data-dir` that does):
    /// PostgreSQL 18+ then gets `file_copy_method = clone`.
    pub fn clones(&self) -> bool {
        self.layout != Layout::Copy
    }

    /// What the clusters live on and why, for `/status`.
    pub fn storage(&self) -> StorageStatus {
        let kind = match self.layout {
            // A data directory on a disk that cannot clone copies too, not on tmpfs.
            Layout::Copy if !self.in_memory => "disk",
            Layout::Copy => "tmpfs",
            Layout::DirClones => "data_dir",
            Layout::Store { .. } => "cow",
        };
        StorageStatus {
            kind,
            reason: self.layout_reason.clone(),
        }
    }

    /// Makes the copy-on-write store in the directory, or adopts a kept one still mounted.
    fn make_store(&mut self, kept: bool, run_as: &RunAs) -> Result<(), StartError> {
        let store = if kept {
            let store = self.dir.join(super::cow::MOUNT_DIR);
            super::cow::check_clones(&store)?;
            store
        } else {
            // Sparse, so it takes RAM only as written; sized below what the tmpfs under it
            // has free. A full store is a clean "No space left on device" from XFS to the
            // writer; a full tmpfs under it would fail the loop device's writes, and XFS
            // shuts the whole store down on a failed metadata write.
            super::cow::make(&self.dir, free_bytes(&self.dir)? / 10 * 9)?
        };
        make_private_dir(&store, run_as)
    }

    /// Mounts a tmpfs of `bytes` on the directory.
    fn mount_tmpfs(&mut self, bytes: u64, run_as: &RunAs) -> Result<(), StartError> {
        if !geteuid().is_root() {
            return Err(StartError::MountNeedsRoot {
                path: self.dir.clone(),
            });
        }
        let mut options = format!("size={bytes},mode=0700");
        if let Some((uid, gid)) = run_as.owner() {
            options.push_str(&format!(",uid={uid},gid={gid}"));
        }
        nix::mount::mount(
            Some("pglease"),
            &self.dir,
            Some("tmpfs"),
            INSTANCE_MOUNT_FLAGS,
            Some(options.as_str()),
        )
        .map_err(|source| match source {
            nix::Error::EPERM => StartError::MountNeedsRoot {
                path: self.dir.clone(),
            },
            source => StartError::Sys {
                action: "cannot mount a tmpfs on",
                path: self.dir.clone(),
                source,
            },
        })?;
        self.mounted = true;
        info!(path = %self.dir.display(), bytes, "mounted a dedicated tmpfs");
        Ok(())
    }

    /// Where the clusters go: the directory itself, or the copy-on-write store in it.
    pub fn clusters(&self) -> PathBuf {
        if matches!(self.layout, Layout::Store { .. }) {
            self.dir.join(super::cow::MOUNT_DIR)
        } else {
            self.dir.clone()
        }
    }

    /// The cluster directory of `generation`.
    pub fn cluster_dir(&self, generation: u32) -> PathBuf {
        self.clusters()
            .join(format!("{CLUSTER_PREFIX}{generation}"))
    }

    /// The highest generation already present (a reused directory), or 0.
    pub fn last_generation(&self) -> u32 {
        std::fs::read_dir(self.clusters())
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                entry
                    .file_name()
                    .to_str()?
                    .strip_prefix(CLUSTER_PREFIX)?
                    .parse()
                    .ok()
            })
            .max()
            .unwrap_or(0)
    }

    /// Removes the directory (and unmounts its tmpfs), or with `keep` leaves it in place
    /// marked as kept so that later sweeps ignore it.
    pub fn cleanup(self, keep: bool) {
        if keep {
            if let Err(e) = write_marker(&self.dir, true) {
                warn!(error = %e, "cannot mark the kept instance directory; a later pglease may sweep it");
            }
            info!(
                path = %self.dir.display(),
                mounted = self.mounted,
                "keeping the instance directory (keep_data); its tmpfs, if any, stays mounted"
            );
            return;
        }
        self.remove();
    }

    /// Unmounts and removes what we made; tolerant of a directory already gone.
    fn remove(&self) {
        if matches!(self.layout, Layout::Store { .. }) {
            super::cow::unmount(&self.clusters());
        }
        // The databases' tmpfs of each cluster (the instance's own tmpfs goes below).
        space::unmount_inside(&self.dir);
        if let Some(room) = &self.databases_room {
            room.remove();
        }
        if self.mounted {
            // Detach: a straggling backend with a file open must not make this fail.
            if let Err(e) = nix::mount::umount2(&self.dir, MntFlags::MNT_DETACH) {
                warn!(path = %self.dir.display(), error = %e, "cannot unmount the instance tmpfs");
            }
        }
        let result = if self.created {
            std::fs::remove_dir_all(&self.dir)
        } else {
            // A directory the user gave us existed before: empty it, keep it.
            remove_contents(&self.dir)
        };
        match result {
            Ok(()) => info!(path = %self.dir.display(), "removed the instance directory"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(path = %self.dir.display(), error = %e, "cannot remove the instance directory")
            }
        }
    }
}

/// Says whether the file system of `dir` lets programs run (docker's `--tmpfs` and the
/// tmpfs pglease mounts are `noexec`; a Kubernetes `emptyDir` and `/dev/shm` usually are
/// not): a file written there could then be run by whoever can reach it.
fn log_exec(dir: &Path) {
    use nix::sys::statvfs::FsFlags;
    match nix::sys::statvfs::statvfs(dir) {
        Ok(stats) if stats.flags().contains(FsFlags::ST_NOEXEC) => {
            info!(path = %dir.display(), "the instance directory's file system is noexec: nothing written there can be run")
        }
        Ok(_) => {
            info!(path = %dir.display(), "the instance directory's file system allows running programs (not mounted noexec); mount it noexec where you can (docs/security.md)")
        }
        Err(error) => warn!(path = %dir.display(), %error, "cannot statvfs the instance directory"),
    }
}

/// Removes every cluster directory of `instance_dir` but `keep`, and leftover initdb
/// output (best effort: a failure costs memory, not correctness).
pub(crate) fn remove_stale_clusters(instance_dir: &Path, keep: &Path) {
    for entry in std::fs::read_dir(instance_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = name.starts_with(CLUSTER_PREFIX) || name.starts_with(INITDB_TMP_PREFIX);
        if ours && path != keep {
            space::unmount_inside(&path);
            match std::fs::remove_dir_all(&path) {
                Ok(()) => info!(path = %path.display(), "removed a previous cluster directory"),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "cannot remove a previous cluster directory")
                }
            }
        }
    }
}

/// Checks `config.databases_dir`, if set, before anything is made: the instance directory
/// it is compared with is `data_dir` (or the nearest directory above it that exists), else
/// `/dev/shm`; with `tmpfs_size` the instance gets a file system of its own, so any other
/// is apart from it. The command line calls this to exit 64 on a bad directory.
pub fn check_databases_dir(config: &EmbeddedConfig) -> Result<(), DatabasesDirError> {
    let Some(dir) = config.databases_dir.as_deref() else {
        return Ok(());
    };
    if config.keep_data {
        return Err(DatabasesDirError::WithKeepData);
    }
    let instance = match (&config.data_dir, config.tmpfs_size) {
        (_, Some(_)) => None,
        (Some(data_dir), None) => Some(existing_ancestor(data_dir)),
        (None, None) => Some(PathBuf::from(SHM_ROOT)),
    };
    room::check(dir, instance.as_deref())
}

/// `path`, or the nearest directory above it that exists (a data directory is made at
/// start when missing).
fn existing_ancestor(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    absolute
        .ancestors()
        .find(|dir| dir.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

/// Decides whether a configured directory may be used: `(dir, created)`.
fn adopt_configured(dir: &Path) -> Result<(PathBuf, bool), StartError> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)
                .map_err(|source| io_error("cannot create", dir, source))?;
            Ok((dir.to_path_buf(), true))
        }
        Err(e) => Err(io_error("cannot read", dir, e)),
        Ok(mut entries) => match read_marker(dir) {
            // A live owner: the sweep ran before this and left it, so it is not stale.
            Some(Marker {
                pid: Some(pid),
                kept: false,
                ..
            }) => Err(StartError::InstanceDirInUse {
                path: dir.to_path_buf(),
                pid,
            }),
            // Kept by an earlier run of ours: reuse it.
            Some(_) => Ok((dir.to_path_buf(), false)),
            None if entries.next().is_none() => Ok((dir.to_path_buf(), false)),
            None => Err(StartError::InstanceDirNotOurs {
                path: dir.to_path_buf(),
            }),
        },
    }
}

/// Removes everything inside `dir`, keeping `dir`.
fn remove_contents(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}
