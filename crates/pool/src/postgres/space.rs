//! The databases' space: on tmpfs, each cluster's `base/` — every database's files,
//! templates and clones and their temporary files — is a tmpfs of its own, and the rest of
//! the cluster (WAL, the shared catalogs, `pg_xact`, `pg_logical`, …) keeps the instance
//! directory's.
//!
//! Why: postgres PANICs, and so restarts and loses every lease, when it cannot write WAL
//! or a checkpoint file (measured: `pg_wal/xlogtemp…`, and with WAL apart still
//! `pg_logical/replorigin_checkpoint.tmp`), while a database file it cannot extend is an
//! ERROR for the one writer (`could not extend file "base/…": No space left on device`,
//! SQLSTATE 53100). With the databases on space of their own, a lease that fills it gets
//! that error and every other lease goes on; `max_wal_size` keeps WAL well inside the rest
//! ([`max_wal_size`]).
//!
//! `LISTEN`/`NOTIFY`'s queue (`pg_notify/`) gets a small tmpfs of its own too, taken from
//! the rest's share ([`mount_notify_queue`]): a holder that listens and never reads (idle
//! in a transaction) while it notifies grows the queue up to 8 GB before PostgreSQL 17,
//! and in the rest it would fill WAL's room. On its own tmpfs a full queue is an ERROR for
//! the notifier (`could not access status of transaction 0`, `No space left on device`);
//! from PostgreSQL 17 `max_notify_queue_pages` ([`notify_queue_pages`]) refuses it before.
//!
//! The mounts need root. Each cluster directory gets its own ([`mount`],
//! [`mount_notify_queue`]), made before the cluster is filled; [`unmount_inside`] takes
//! them down before a directory holding them is removed.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use tracing::{info, warn};

use super::run_as::{make_private_dir, RunAs};
use super::util::io_error;
use crate::error::StartError;

/// The cluster's directory of per-database files, the mount point.
pub(crate) const DIR: &str = "base";
/// What the rest of the cluster keeps at least: a WAL segment and `max_wal_size` of
/// recycled ones, the shared catalogs, an uncached initdb's output on its way, the log.
const REST_MIN: u64 = 96 << 20;
/// What the rest of the cluster keeps at most: WAL is bounded by `max_wal_size`.
pub(crate) const REST_MAX: u64 = 1 << 30;
/// Below this the databases cannot be given space of their own: initdb's three databases
/// take 23 MB, a template and a clone of it as much again.
const DATABASES_MIN: u64 = 64 << 20;
/// postgres' smallest `max_wal_size`: two 16 MB segments.
const WAL_MIN_MB: u64 = 32;
/// The cluster's directory of `LISTEN`/`NOTIFY`'s queue, a mount point of its own.
pub(crate) const NOTIFY_QUEUE_DIR: &str = "pg_notify";
/// The notification queue's tmpfs at least. In normal use (listeners that read) the queue
/// holds a segment or two of 256 kB: postgres truncates it by whole segments once every
/// listener has read past one. Measured on PostgreSQL 15 with a listener reading as they
/// come: at most 360 kB for 100,000 notifications of 100 bytes (1,000 a transaction), and
/// 1 MB for transactions of 100 notifications of 7 kB.
const NOTIFY_QUEUE_MIN: u64 = 4 << 20;
/// The notification queue's tmpfs at most, and its bound without one (PostgreSQL 17+):
/// room for 8,000 notifications of the largest size (8,000 bytes) nobody reads.
pub(crate) const NOTIFY_QUEUE_MAX: u64 = 64 << 20;
/// The queue's page, postgres' block size.
const NOTIFY_QUEUE_PAGE: u64 = 8192;

/// How the instance's room is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    /// The databases' space, the size of each cluster's `base/` tmpfs.
    pub databases: u64,
    /// What the rest of the cluster has.
    pub rest: u64,
    /// The size of each cluster's `pg_notify/` tmpfs, taken from the rest's share; `None`
    /// where none is mounted (an operator's `--databases-dir`: the queue goes in that
    /// room, with the databases, `room.rs`).
    pub notify_queue: Option<u64>,
}

/// Shares `total` bytes: a quarter for the rest of the cluster (at least 96 MB, at most
/// 1 GB), of which a sixteenth (4 to 64 MB) goes to the notification queue, the remainder
/// for the databases; `None` when that leaves them under 64 MB.
pub(crate) fn split(total: u64) -> Option<Split> {
    let share = (total / 4).clamp(REST_MIN, REST_MAX);
    let databases = total.checked_sub(share)?;
    let notify_queue = (share / 16).clamp(NOTIFY_QUEUE_MIN, NOTIFY_QUEUE_MAX);
    (databases >= DATABASES_MIN).then_some(Split {
        databases,
        rest: share - notify_queue,
        notify_queue: Some(notify_queue),
    })
}

/// `max_notify_queue_pages` (PostgreSQL 17+) for a queue with `bytes` of room: half of it,
/// because postgres removes the queue's files by whole segments (32 pages) some time after
/// its readers passed them, so the files can hold more than the pages counted.
pub(crate) fn notify_queue_pages(bytes: u64) -> u64 {
    // postgres' smallest allowed value.
    (bytes / 2 / NOTIFY_QUEUE_PAGE).max(64)
}

/// `max_wal_size` (and `min_wal_size`, the recycled segments kept) for a rest of `rest`
/// bytes: a quarter of it, at least two segments. Checkpoints then come as WAL grows, at
/// RAM speed (fsync is off), and recycle it before it can fill the rest.
pub(crate) fn max_wal_size(rest: u64) -> String {
    format!("{}MB", ((rest / 4) >> 20).max(WAL_MIN_MB))
}

/// Makes `data_dir` (private to the server's user) with its `base/` a tmpfs of `bytes`,
/// before the cluster is put there (by a copy or an unpack, which fill the existing
/// directories). The tmpfs' root gets its mode and owner from the mount options.
pub(crate) fn mount(data_dir: &Path, bytes: u64, run_as: &RunAs) -> Result<(), StartError> {
    std::fs::create_dir(data_dir).map_err(|e| io_error("cannot create", data_dir, e))?;
    make_private_dir(data_dir, run_as)?;
    let base = data_dir.join(DIR);
    std::fs::create_dir(&base).map_err(|e| io_error("cannot create", &base, e))?;
    mount_tmpfs(&base, &format!("size={bytes}"), run_as.owner()).map_err(|source| {
        StartError::Sys {
            action: "cannot mount the databases' tmpfs on",
            path: base.clone(),
            source,
        }
    })?;
    info!(path = %base.display(), bytes, "the databases have a tmpfs of their own");
    Ok(())
}

/// Gives `data_dir`'s `pg_notify/` (made here, `data_dir` already made by [`mount`]) a
/// tmpfs of `bytes`, owned by the server's user, before the cluster is put there: a copy
/// or an unpack fills the existing directory, and postgres empties it at its start.
pub(crate) fn mount_notify_queue(
    data_dir: &Path,
    bytes: u64,
    run_as: &RunAs,
) -> Result<(), StartError> {
    let queue = data_dir.join(NOTIFY_QUEUE_DIR);
    std::fs::create_dir(&queue).map_err(|e| io_error("cannot create", &queue, e))?;
    mount_tmpfs(&queue, &format!("size={bytes}"), run_as.owner()).map_err(|source| {
        StartError::Sys {
            action: "cannot mount the notification queue's tmpfs on",
            path: queue.clone(),
            source,
        }
    })?;
    info!(path = %queue.display(), bytes, "LISTEN/NOTIFY's queue has a tmpfs of its own");
    Ok(())
}

/// Whether a tmpfs can be mounted in `dir`: root without CAP_SYS_ADMIN (a container's,
/// by default) cannot. Tries a tiny one and takes it down again.
pub(crate) fn can_mount(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(".pglease-mount-probe");
    std::fs::create_dir(&probe)?;
    let mounted = mount_tmpfs(&probe, "size=4k", None);
    if mounted.is_ok() {
        let _ = nix::mount::umount2(&probe, MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir(&probe);
    mounted.map_err(std::io::Error::from)
}

/// Mounts a private tmpfs (mode 0700, no devices, setuid or programs) with `options` on
/// `point`, owned by `owner`.
fn mount_tmpfs(point: &Path, options: &str, owner: Option<(u32, u32)>) -> nix::Result<()> {
    let mut options = format!("{options},mode=0700");
    if let Some((uid, gid)) = owner {
        options.push_str(&format!(",uid={uid},gid={gid}"));
    }
    nix::mount::mount(
        Some("pglease-databases"),
        point,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(options.as_str()),
    )
}

/// Unmounts every mount below `dir` (not `dir` itself), deepest first, so that `dir` can be
/// removed (detached: a straggling backend with a file open must not make it fail).
/// Without this, removing a cluster would empty its databases' tmpfs and then fail on the
/// mount point.
pub(crate) fn unmount_inside(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for point in mount_points_inside(dir, &mountinfo) {
        if let Err(error) = nix::mount::umount2(&point, MntFlags::MNT_DETACH) {
            warn!(path = %point.display(), %error, "cannot unmount");
        }
    }
}

/// The mount points in `mountinfo` (the text of `/proc/self/mountinfo`) below `dir`,
/// deepest first.
fn mount_points_inside(dir: &Path, mountinfo: &str) -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        // Fields: id, parent id, major:minor, root, mount point, …
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
        .filter(|point| point.starts_with(dir) && point != dir)
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    points.dedup();
    points
}

/// A mountinfo field with its octal escapes (`\040` for a space, …) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_goes_to_the_rest_within_bounds() {
        let mb = 1 << 20;
        assert_eq!(
            split(200 * mb),
            Some(Split {
                databases: 104 * mb,
                rest: 90 * mb,
                notify_queue: Some(6 * mb),
            })
        );
        assert_eq!(
            split(800 * mb),
            Some(Split {
                databases: 600 * mb,
                rest: 200 * mb - 12800 * 1024,
                notify_queue: Some(12800 * 1024),
            })
        );
        let big = split(12 << 30).expect("split");
        assert_eq!(big.rest + big.notify_queue.unwrap_or(0), 1 << 30);
        assert_eq!(big.notify_queue, Some(64 * mb));
        assert_eq!(big.databases, 11 << 30);
        // Too small for both: the databases would not even hold initdb's.
        assert_eq!(split(150 * mb), None);
        assert_eq!(split(10 * mb), None);
    }

    #[test]
    fn wal_stays_a_quarter_of_the_rest_and_at_least_two_segments() {
        assert_eq!(max_wal_size(96 << 20), "32MB");
        assert_eq!(max_wal_size(1 << 30), "256MB");
    }

    #[test]
    fn the_notify_queue_is_bounded_at_half_its_room() {
        // 6 MB: 384 pages of 8 kB.
        assert_eq!(notify_queue_pages(6 << 20), 384);
        assert_eq!(notify_queue_pages(NOTIFY_QUEUE_MAX), 4096);
        assert_eq!(notify_queue_pages(0), 64);
    }

    #[test]
    fn mount_points_inside_a_directory_deepest_first() {
        let mountinfo = "\
22 1 0:21 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
40 22 0:40 / /dev/shm/pglease-1 rw - tmpfs pglease rw,size=1024k
41 40 0:41 / /dev/shm/pglease-1/pgdata-1/base rw - tmpfs pglease-databases rw
42 22 0:42 / /dev/shm/pglease-10/pgdata-1/base rw - tmpfs pglease-databases rw
43 40 0:43 / /dev/shm/pglease-1/with\\040space rw - tmpfs x rw
";
        assert_eq!(
            mount_points_inside(Path::new("/dev/shm/pglease-1"), mountinfo),
            vec![
                PathBuf::from("/dev/shm/pglease-1/pgdata-1/base"),
                PathBuf::from("/dev/shm/pglease-1/with space"),
            ]
        );
        assert!(mount_points_inside(Path::new("/srv"), mountinfo).is_empty());
    }
}
