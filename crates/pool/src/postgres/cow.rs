//! The copy-on-write store (`--storage cow`): an XFS file system with reflinks, made in a
//! sparse file inside the instance directory (so in RAM, on tmpfs) and loop-mounted on its
//! `cow/` directory, where the clusters live. On it PostgreSQL 18's
//! `file_copy_method = clone` makes `CREATE DATABASE … STRATEGY FILE_COPY` share the
//! template's blocks instead of copying them: a clone costs what an empty database costs,
//! whatever the template's size.
//!
//! Tools (none is fetched at run time): `mkfs.xfs` (Debian's `xfsprogs`), `mount` and
//! `umount` (util-linux), and root or CAP_SYS_ADMIN for the mount. `mount -o loop` takes a
//! free loop device and marks it autoclear, so unmounting frees it: at a clean stop
//! ([`unmount`]), and after a crash at the next start's stale sweep (`instance.rs`), which
//! unmounts the store before it removes the directory and the file.

use std::path::{Path, PathBuf};
use std::process::Command;

use tracing::info;

use crate::error::StartError;

/// The store's directory (the mount point) inside an instance directory.
pub(crate) const MOUNT_DIR: &str = "cow";
/// The sparse file holding the store's file system, inside an instance directory.
pub(crate) const IMAGE_FILE: &str = "cow.xfs";
/// The smallest file system mkfs.xfs 6 makes.
const MIN_BYTES: u64 = 512 * 1024 * 1024;

/// Makes the store in `instance_dir`: a sparse file of `bytes` (at least 512 MB), an XFS
/// with reflinks in it, mounted on `instance_dir/cow`. Checks that a file copied there
/// really shares its blocks. Returns the mount point; on error nothing of it is left.
pub(crate) fn make(instance_dir: &Path, bytes: u64) -> Result<PathBuf, StartError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(failed(
            "mounting it",
            "it needs root (or CAP_SYS_ADMIN) to loop-mount a file system".into(),
        ));
    }
    let image = instance_dir.join(IMAGE_FILE);
    let mount_point = instance_dir.join(MOUNT_DIR);
    if bytes < MIN_BYTES {
        // Larger than the tmpfs under it, the store would fail in the middle of a write.
        return Err(failed(
            "sizing it",
            format!(
                "{} MB would be free for it, and mkfs.xfs makes no file system under {} MB \
                 (a bigger --tmpfs-size, or more room in /dev/shm)",
                bytes >> 20,
                MIN_BYTES >> 20
            ),
        ));
    }
    if let Err(error) = make_at(&image, &mount_point, bytes) {
        // Nothing half-made stays behind: `auto` goes on without a store.
        unmount(&mount_point);
        let _ = std::fs::remove_file(&image);
        let _ = std::fs::remove_dir(&mount_point);
        return Err(error);
    }
    info!(
        mount_point = %mount_point.display(),
        image = %image.display(),
        bytes,
        "made a copy-on-write store (XFS with reflinks, loop-mounted from a sparse file in RAM); a file copied there shares its blocks"
    );
    Ok(mount_point)
}

/// [`make`]'s steps: the file, the file system, the mount, the check.
fn make_at(image: &Path, mount_point: &Path, bytes: u64) -> Result<(), StartError> {
    let file = std::fs::File::create(image)
        .map_err(|e| failed("creating its file", format!("{}: {e}", image.display())))?;
    // Sparse: RAM is taken only as the file system is written.
    file.set_len(bytes)
        .map_err(|e| failed("sizing its file", format!("{}: {e}", image.display())))?;
    drop(file);
    run(
        "mkfs.xfs",
        "xfsprogs",
        Command::new("mkfs.xfs")
            .args(["-q", "-f", "-m", "reflink=1"])
            .arg(image),
    )?;
    std::fs::create_dir_all(mount_point).map_err(|e| {
        failed(
            "creating its mount point",
            format!("{}: {e}", mount_point.display()),
        )
    })?;
    run(
        "mount",
        "util-linux",
        Command::new("mount")
            .args(["-t", "xfs", "-o", "loop,nosuid,nodev"])
            .arg(image)
            .arg(mount_point),
    )?;
    check_clones(mount_point)
}

/// Bytes in use on the file system holding `path` (the store's usage, which the byte
/// budget is judged by where clones share blocks).
pub(crate) fn used_bytes(path: &Path) -> nix::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)?;
    Ok(stat.blocks().saturating_sub(stat.blocks_free()) * stat.fragment_size())
}

/// Whether a copy in `dir` shares its blocks: `cp --reflink=always` fails where the file
/// system cannot clone.
pub(crate) fn check_clones(dir: &Path) -> Result<(), StartError> {
    let original = dir.join(".pglease-clone-check");
    let copy = dir.join(".pglease-clone-check.copy");
    std::fs::write(&original, b"pglease").map_err(|e| {
        failed(
            "checking that it clones",
            format!("{}: {e}", original.display()),
        )
    })?;
    let result = run(
        "cp --reflink=always",
        "coreutils",
        Command::new("cp")
            .arg("--reflink=always")
            .arg(&original)
            .arg(&copy),
    );
    let _ = std::fs::remove_file(&original);
    let _ = std::fs::remove_file(&copy);
    result.map_err(|_| {
        failed(
            "checking that it clones",
            format!(
                "{} cannot clone a file (cp --reflink=always failed)",
                dir.display()
            ),
        )
    })
}

/// Unmounts the store at `mount_point` (its loop device is freed with it), lazily if it
/// is busy. Tolerant of a store already gone.
pub(crate) fn unmount(mount_point: &Path) {
    if !super::filesystem::is_mount_point(mount_point) {
        return;
    }
    let plain = nix::mount::umount2(mount_point, nix::mount::MntFlags::empty());
    if let Err(error) = plain {
        tracing::warn!(path = %mount_point.display(), %error, "cannot unmount the copy-on-write store; detaching it");
        if let Err(error) = nix::mount::umount2(mount_point, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %mount_point.display(), %error, "cannot detach the copy-on-write store");
        }
    }
}

/// Runs one step's tool; a missing tool says which package has it.
fn run(tool: &'static str, package: &'static str, command: &mut Command) -> Result<(), StartError> {
    match command.output() {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(failed(
            "running a tool",
            format!(
                "{tool} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(failed(
            "running a tool",
            format!("{tool} is not installed (Debian: apt-get install {package})"),
        )),
        Err(e) => Err(failed("running a tool", format!("{tool}: {e}"))),
    }
}

fn failed(step: &'static str, message: String) -> StartError {
    StartError::CowStore { step, message }
}
