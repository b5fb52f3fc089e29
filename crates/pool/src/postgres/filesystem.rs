//! What the file system under a directory is: in memory (tmpfs or ramfs) or not, how much
//! it has free, whether the directory is a mount point.
//!
//! The instance directory, the copy-on-write store and the sweep all ask these questions;
//! kept apart so that those files need not ask each other. It uses no other file of the
//! module.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tracing::warn;

use crate::error::StartError;

/// `statfs` magic of ramfs (not among nix's constants).
const RAMFS_MAGIC: u32 = 0x8584_58f6;
/// `statfs` magic of tmpfs.
const TMPFS_MAGIC: u32 = 0x0102_1994;

/// What the file system of `dir` has free for an unprivileged writer.
pub(super) fn free_bytes(dir: &Path) -> Result<u64, StartError> {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .map_err(|source| StartError::Sys {
            action: "cannot statvfs",
            path: dir.to_path_buf(),
            source,
        })
}

/// The size of the file system `dir` is on, in bytes.
pub(super) fn total_bytes(dir: &Path) -> Result<u64, StartError> {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks() * s.fragment_size())
        .map_err(|source| StartError::Sys {
            action: "cannot statvfs",
            path: dir.to_path_buf(),
            source,
        })
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
