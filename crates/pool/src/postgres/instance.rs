//! The instance directory and the OS user: creating the directory (optionally a dedicated
//! tmpfs mounted on it), checking that it lives in memory, the marker file that identifies
//! it, removing it at exit, and sweeping the instances a killed daemon left behind.
//!
//! Layout of an instance directory:
//! - `pglease-instance`: the marker, written by the daemon (owned by its euid), holding
//!   `pid=<daemon pid>` and `start_time=<its start time in clock ticks since boot>`, or
//!   `kept=1` once a `keep_data` run has ended (the sweep leaves those alone);
//! - `pgdata-<generation>/`: one cluster per start, see [`super::Embedded::start`];
//! - `socket/`: the private unix socket directory (mode 0700, owned by the server's user);
//! - `postgres.log`: the server's stdout and stderr, appended to by every generation;
//! - with a copy-on-write store (`--storage cow`, or `auto` for a big template; chosen by
//!   `storage.rs`): `cow.xfs`, the store's file, mounted on `cow/`, where the
//!   `pgdata-<generation>/` directories are instead (`cow.rs`).
//!
//! It starts no server; the only processes it signals are postmasters of stale instances.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};
use nix::sys::signal::Signal;
use nix::unistd::{geteuid, Pid, User};
use tracing::{info, warn};

use super::space;
use super::storage::{self, Layout, StorageHints};
use crate::config::{EmbeddedConfig, Storage};
use crate::error::StartError;
use crate::types::StorageStatus;

/// Name of the marker file that makes a directory a pglease instance.
pub(crate) const MARKER_FILE: &str = "pglease-instance";
/// Prefix of the default instance directories under [`SHM_ROOT`], and of cluster dirs.
pub(crate) const INSTANCE_PREFIX: &str = "pglease-";
/// Where default instance directories live: tmpfs on every Linux system.
pub(crate) const SHM_ROOT: &str = "/dev/shm";
/// Prefix of the per-generation cluster directories inside an instance.
pub(crate) const CLUSTER_PREFIX: &str = "pgdata-";
/// Prefix of the temporary initdb output directories inside an instance.
pub(crate) const INITDB_TMP_PREFIX: &str = "initdb-tmp-";

/// The kernel's limit on a unix socket path, `sizeof(sun_path)` minus the final NUL.
const MAX_SOCKET_PATH: usize = 107;
/// `statfs` magic of ramfs (not among nix's constants).
const RAMFS_MAGIC: u32 = 0x8584_58f6;
/// `statfs` magic of tmpfs.
const TMPFS_MAGIC: u32 = 0x0102_1994;

/// The OS user that runs initdb and postgres.
#[derive(Debug, Clone)]
pub(crate) struct RunAs {
    /// User name, for logs.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Whether the children switch to this user (the daemon is root) and files we create
    /// are chowned to it.
    pub switch: bool,
}

impl RunAs {
    /// When root: `configured`, else `postgres` if that user exists, else `nobody`.
    /// Otherwise the current user, since only root can switch.
    pub fn resolve(configured: Option<&str>) -> Result<RunAs, StartError> {
        let euid = geteuid();
        if !euid.is_root() {
            let name = User::from_uid(euid)
                .ok()
                .flatten()
                .map(|user| user.name)
                .unwrap_or_else(|| euid.to_string());
            if let Some(wanted) = configured.filter(|wanted| *wanted != name) {
                warn!(
                    pg_user = wanted,
                    running_as = %name,
                    "pg_user is ignored: only root can run postgres as another user"
                );
            }
            return Ok(RunAs {
                name,
                uid: euid.as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                switch: false,
            });
        }
        let lookup = |name: &str| User::from_name(name).ok().flatten();
        let user = match configured {
            Some(name) => lookup(name).ok_or_else(|| StartError::UserNotFound {
                user: name.to_owned(),
            })?,
            None => lookup("postgres")
                .or_else(|| lookup("nobody"))
                .ok_or_else(|| StartError::UserNotFound {
                    user: "postgres".to_owned(),
                })?,
        };
        if user.uid.is_root() {
            // postgres would refuse to start; say so now rather than in the server log.
            return Err(StartError::UserNotFound {
                user: format!("{} (uid 0 cannot run postgres)", user.name),
            });
        }
        Ok(RunAs {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            switch: true,
        })
    }

    /// `(uid, gid)` for children and chown, when switching.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.switch.then_some((self.uid, self.gid))
    }

    /// Hands `path` to the server's user (a no-op when not root).
    pub fn chown(&self, path: &Path) -> Result<(), StartError> {
        match self.owner() {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|source| io_error("cannot chown", path, source)),
            None => Ok(()),
        }
    }
}

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
    /// Each cluster's databases get a tmpfs of their own (`space.rs`): on tmpfs, as root.
    pub databases_space: Option<space::Split>,
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
        self.choose_storage(config, hints, run_as)?;
        self.share_space(config)?;
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

    /// On tmpfs, as root, where clones copy: gives the databases a tmpfs of their own
    /// (`space.rs`), sized from the dedicated tmpfs (which shrinks to the rest) or from
    /// what the shared one has free.
    fn share_space(&mut self, config: &EmbeddedConfig) -> Result<(), StartError> {
        if self.layout != Layout::Copy || !self.in_memory {
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
                MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
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
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
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

/// What the file system of `dir` has free for an unprivileged writer.
fn free_bytes(dir: &Path) -> Result<u64, StartError> {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .map_err(|source| StartError::Sys {
            action: "cannot statvfs",
            path: dir.to_path_buf(),
            source,
        })
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

/// Refuses a directory that is not on tmpfs or ramfs, unless `allow_unsafe`; returns
/// whether it is in memory.
pub(crate) fn check_in_memory(dir: &Path, allow_unsafe: bool) -> Result<bool, StartError> {
    let stat = nix::sys::statfs::statfs(dir).map_err(|source| StartError::Sys {
        action: "cannot statfs",
        path: dir.to_path_buf(),
        source,
    })?;
    // The magic numbers are 32-bit; the field's width varies by platform.
    let magic = stat.filesystem_type().0 as u32;
    if magic == TMPFS_MAGIC || magic == RAMFS_MAGIC {
        return Ok(true);
    }
    let fs_type = fs_type_name(magic);
    if allow_unsafe {
        warn!(
            path = %dir.display(),
            fs_type = %fs_type,
            "UNSAFE: running postgres with fsync=off on persistent storage (allow_unsafe_on_disk); \
             a crash of the machine can corrupt this cluster"
        );
        return Ok(false);
    }
    Err(StartError::NotTmpfs {
        path: dir.to_path_buf(),
        fs_type,
    })
}

/// A readable name for a file system magic number.
fn fs_type_name(magic: u32) -> String {
    let name = match magic {
        0xef53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0x794c_7630 => "overlayfs",
        0x2fc1_2fc1 => "zfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p",
        0xff53_4d42 => "cifs",
        _ => return format!("file system type {magic:#x}"),
    };
    name.to_owned()
}

/// What a marker file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Marker {
    /// The daemon that owns the instance.
    pub pid: Option<u32>,
    /// Its start time, which tells it apart from a later process with the same pid.
    pub start_time: Option<u64>,
    /// Left behind on purpose (`keep_data`).
    pub kept: bool,
}

/// Gives the directory `path` mode 0700 and the server's user, through a handle opened
/// without following a link at its last component: `path` lies in the instance directory,
/// which that user owns, so a link there (left in a kept directory) must not lead root's
/// chmod and chown elsewhere.
pub(super) fn make_private_dir(path: &Path, run_as: &RunAs) -> Result<(), StartError> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::File::options()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            // O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR (or ELOOP).
            Some(nix::libc::ENOTDIR | nix::libc::ELOOP) => {
                io_error("refusing a link or a non-directory at", path, source)
            }
            _ => io_error("cannot open", path, source),
        })?;
    dir.set_permissions(std::fs::Permissions::from_mode(0o700))
        .map_err(|source| io_error("cannot chmod", path, source))?;
    match run_as.owner() {
        Some((uid, gid)) => std::os::unix::fs::fchown(&dir, Some(uid), Some(gid))
            .map_err(|source| io_error("cannot chown", path, source)),
        None => Ok(()),
    }
}

/// Writes the marker naming this process.
pub(crate) fn write_marker(dir: &Path, kept: bool) -> Result<(), StartError> {
    let pid = std::process::id();
    let mut text = format!("pid={pid}\n");
    if let Some(stat) = proc_stat(pid) {
        text.push_str(&format!("start_time={}\n", stat.start_time));
    }
    if kept {
        text.push_str("kept=1\n");
    }
    // Anew, never through a link: the directory is the server user's, and a kept one
    // outlives this run.
    super::write_anew(&dir.join(MARKER_FILE), text.as_bytes(), None)
}

/// Reads the marker of `dir`; `None` unless it is a regular file owned by our euid: a
/// marker anyone else could have written (e.g. in world-writable /dev/shm) is ignored,
/// since the sweep kills processes on its word.
pub(crate) fn read_marker(dir: &Path) -> Option<Marker> {
    let path = dir.join(MARKER_FILE);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() || meta.uid() != geteuid().as_raw() {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let mut marker = Marker {
        pid: None,
        start_time: None,
        kept: false,
    };
    for line in text.lines() {
        match line.split_once('=') {
            Some(("pid", value)) => marker.pid = value.trim().parse().ok(),
            Some(("start_time", value)) => marker.start_time = value.trim().parse().ok(),
            Some(("kept", value)) => marker.kept = value.trim() == "1",
            _ => {}
        }
    }
    Some(marker)
}

/// Whether the daemon a marker names is still running.
pub(crate) fn owner_alive(marker: &Marker) -> bool {
    let Some(pid) = marker.pid else {
        // Not a marker we wrote: not ours to judge.
        return true;
    };
    if pid == std::process::id() {
        return true;
    }
    let Some(stat) = proc_stat(pid).filter(|stat| stat.state != 'Z') else {
        return false;
    };
    match marker.start_time {
        // The same pid and start time can only be the same process.
        Some(start_time) => stat.start_time == start_time,
        // Without a start time, a live pid counts only if it looks like pglease.
        None => ["comm", "cmdline"].iter().any(|file| {
            std::fs::read(format!("/proc/{pid}/{file}"))
                .map(|bytes| String::from_utf8_lossy(&bytes).contains("pglease"))
                .unwrap_or(false)
        }),
    }
}

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcStat {
    /// R, S, D, Z, ...
    pub state: char,
    /// Clock ticks since boot.
    pub start_time: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when there is no such process.
pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; field 22 (starttime) is fields[19].
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Whether `pid` is running (a zombie has finished running).
pub(crate) fn process_alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|stat| stat.state != 'Z')
}

/// Sweeps stale instances: every `pglease-*` directory of `shm_root`, and `configured`.
/// Returns the directories removed.
pub(crate) fn sweep_stale(shm_root: &Path, configured: Option<&Path>) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(shm_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(INSTANCE_PREFIX)
        })
        // Not a symlink: file_type does not follow them.
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| entry.path())
        .collect();
    if let Some(dir) = configured {
        if !candidates.iter().any(|candidate| candidate == dir) {
            candidates.push(dir.to_path_buf());
        }
    }
    candidates
        .into_iter()
        .filter(|dir| sweep_one(dir))
        .collect()
}

/// Sweeps `dir` if it is a stale instance; returns whether it did.
fn sweep_one(dir: &Path) -> bool {
    // Never touch a directory without our marker.
    let Some(marker) = read_marker(dir) else {
        return false;
    };
    if marker.kept || owner_alive(&marker) {
        return false;
    }
    info!(path = %dir.display(), daemon_pid = ?marker.pid, "sweeping a stale pglease instance");
    let store = dir.join(super::cow::MOUNT_DIR);
    let entries = [dir, store.as_path()]
        .into_iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten());
    for cluster in entries {
        let cluster = cluster.path();
        let Some(pid) = postmaster_pid(&cluster) else {
            continue;
        };
        if process_alive(pid) && is_postmaster_of(pid, &cluster) {
            let stopped = stop_process(pid);
            info!(pid, data_dir = %cluster.display(), stopped, "stopped a stale postmaster");
        }
    }
    // A copy-on-write store (its loop device goes with it), before the tmpfs it lives in.
    if is_mount_point(&store) {
        super::cow::unmount(&store);
        info!(path = %store.display(), "unmounted a stale copy-on-write store");
    }
    // The databases' tmpfs of its clusters.
    space::unmount_inside(dir);
    if is_mount_point(dir) {
        match nix::mount::umount2(dir, MntFlags::MNT_DETACH) {
            Ok(()) => info!(path = %dir.display(), "unmounted a stale instance tmpfs"),
            Err(e) => {
                warn!(path = %dir.display(), error = %e, "cannot unmount a stale instance tmpfs")
            }
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {
            info!(path = %dir.display(), "removed a stale instance directory");
            true
        }
        Err(e) => {
            warn!(path = %dir.display(), error = %e, "cannot remove a stale instance directory");
            false
        }
    }
}

/// The pid on the first line of `<data_dir>/postmaster.pid`.
pub(crate) fn postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether `pid` is the postmaster of `data_dir`: it works in that directory or names it
/// on its command line. A stale pid file may name an unrelated process by now.
fn is_postmaster_of(pid: u32, data_dir: &Path) -> bool {
    if std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == data_dir) {
        return true;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            cmdline
                .split(|byte| *byte == 0)
                .any(|arg| arg == data_dir.as_os_str().as_encoded_bytes())
        })
        .unwrap_or(false)
}

/// SIGQUIT (immediate shutdown: the postmaster stops its backends and frees its shared
/// memory), then SIGKILL if it is still there; returns whether it ended.
fn stop_process(pid: u32) -> bool {
    let target = Pid::from_raw(pid as i32);
    for (signal, grace) in [
        (Signal::SIGQUIT, Duration::from_secs(3)),
        (Signal::SIGKILL, Duration::from_secs(2)),
    ] {
        if nix::sys::signal::kill(target, signal).is_err() {
            // ESRCH: gone already.
            return !process_alive(pid);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !process_alive(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    !process_alive(pid)
}

/// Whether `dir` is the root of a mount (its device differs from its parent's).
pub(crate) fn is_mount_point(dir: &Path) -> bool {
    let Some(parent) = dir.parent() else {
        return false;
    };
    match (std::fs::metadata(dir), std::fs::metadata(parent)) {
        (Ok(own), Ok(parent)) => own.dev() != parent.dev(),
        _ => false,
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

/// `bytes` random bytes as lowercase hex.
pub(crate) fn random_hex(bytes: usize) -> String {
    let raw: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
    hex::encode(raw)
}

/// A [`StartError::Io`].
pub(crate) fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> StartError {
    StartError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
