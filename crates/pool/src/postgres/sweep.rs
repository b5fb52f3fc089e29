//! The sweep of stale instances, run once at preparation: the directories a killed daemon
//! left under `/dev/shm` (or the configured one) have their postmasters stopped, their
//! mounts undone and their files removed.
//!
//! The only processes it signals are postmasters of instances whose marker (`marker.rs`)
//! names a daemon no longer running. It uses `instance.rs` (the directories' names) and
//! the files below it, never the other way round.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::MntFlags;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tracing::{info, warn};

use super::filesystem::is_mount_point;
use super::instance::INSTANCE_PREFIX;
use super::marker::{owner_alive, process_alive, read_marker};
use super::space;

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
