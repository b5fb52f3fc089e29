//! Which clones' directories were written since they were stamped, told by the kernel
//! (inotify) as it happens, so that a proof need not list and stat every file of the clone
//! again: for the bench fixture's 350 files that listing was a third of the daemon's CPU
//! per read-only test (perf, 2026-11-27). A write, a truncation, a new, removed or renamed
//! file in a watched directory is queued by the kernel within the system call that made
//! it; once a `CHECKPOINT` has returned, every change it wrote out is in the queue.
//!
//! One inotify instance per session, read whenever a clone is stamped or proven; a watch
//! keeps its directory's first change, and goes when the directory does (the clone's drop).
//! The kernel merges a change with the one queued just before it when they are alike, so a
//! checkpoint's writes to one file queue as one event. When the queue overflows nothing is
//! known, and every watch counts as changed. A stamp whose watch this session did not make
//! (none could be added, or the session is newer) is proven by the listing instead
//! (`proof.rs`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// The relation cache's init file and its temporary name while it is written
/// (`pg_internal.init.<pid>`): rebuilt from the catalogs, not data.
const RELCACHE_INIT_PREFIX: &str = "pg_internal.init";

/// Sessions' watchers, told apart: a stamp names the one that watches it.
static WATCHERS: AtomicU64 = AtomicU64::new(1);

/// The events that mean the directory's contents changed (reads and closes do not: postgres
/// opens relation files for writing even to read them).
fn changes() -> AddWatchFlags {
    AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
}

/// A clone directory's watch, kept in its stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Watch {
    /// The watcher that made it.
    watcher: u64,
    wd: WatchDescriptor,
    /// The clone's OID: a watch descriptor the kernel gave again to another directory
    /// after this one's was removed does not pass for it.
    oid: u32,
}

/// One session's inotify instance and what it has seen.
pub(super) struct Watches {
    id: u64,
    seen: Mutex<Seen>,
}

/// The instance and, per live watch, its clone's OID and its first change.
struct Seen {
    inotify: Inotify,
    watches: HashMap<WatchDescriptor, (u32, Option<String>)>,
}

impl Watches {
    /// A new inotify instance, or `None` when the kernel has none to give (the per-user
    /// limit, `fs.inotify.max_user_instances`): proofs then list the files.
    pub(super) fn new() -> Option<Watches> {
        match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(inotify) => Some(Watches {
                id: WATCHERS.fetch_add(1, Ordering::Relaxed),
                seen: Mutex::new(Seen {
                    inotify,
                    watches: HashMap::new(),
                }),
            }),
            Err(error) => {
                tracing::info!(%error, "no inotify instance: proofs list each clone's files");
                None
            }
        }
    }

    /// Starts watching `dir`, the directory of the clone `oid`, from now on: a change before
    /// this call does not count. `None` when the kernel refuses (the per-user watch limit).
    pub(super) fn watch(&self, dir: &Path, oid: u32) -> Option<Watch> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Earlier changes go to the earlier stamp of this directory, if any.
        seen.drain();
        match seen.inotify.add_watch(dir, changes()) {
            Ok(wd) => {
                seen.watches.insert(wd, (oid, None));
                Some(Watch {
                    watcher: self.id,
                    wd,
                    oid,
                })
            }
            Err(error) => {
                tracing::debug!(%error, dir = %dir.display(), "cannot watch a clone's directory; its proof lists the files");
                None
            }
        }
    }

    /// Whether `watch` is this watcher's (not an earlier session's).
    pub(super) fn tells(&self, watch: &Watch) -> bool {
        watch.watcher == self.id
    }

    /// What changed in the directory of `watch`, one of [`Watches::tells`]', since it was
    /// made, as one line; `None` when nothing did.
    pub(super) fn changed(&self, watch: &Watch) -> Option<String> {
        if !self.tells(watch) {
            return Some("its directory is watched by an earlier session".into());
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.drain();
        match seen.watches.get(&watch.wd) {
            Some((oid, change)) if *oid == watch.oid => change.clone(),
            // Removed after a change, or its directory is gone.
            _ => Some("its directory changed".into()),
        }
    }
}

impl Seen {
    /// Reads every event queued so far: a watch's first change is kept; an overflow marks
    /// every watch changed.
    fn drain(&mut self) {
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) if !events.is_empty() => events,
                // EAGAIN: the queue is empty. Another error leaves events unread: every
                // watch counts as changed, which is never wrong.
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => return,
                Err(error) => {
                    self.all_changed(&format!("reading the kernel's file events failed: {error}"));
                    return;
                }
            };
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    self.all_changed("the kernel's file event queue overflowed");
                    continue;
                }
                if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The watch is gone (removed, or its directory): no entry, "changed".
                    self.watches.remove(&event.wd);
                    continue;
                }
                let name = event.name.as_deref().unwrap_or(OsStr::new(""));
                if name.to_string_lossy().starts_with(RELCACHE_INIT_PREFIX) {
                    continue;
                }
                let Some((_, change)) = self.watches.get_mut(&event.wd) else {
                    continue;
                };
                change.get_or_insert_with(|| describe(event.mask, &name.to_string_lossy()));
            }
        }
    }

    fn all_changed(&mut self, why: &str) {
        for (_, change) in self.watches.values_mut() {
            change.get_or_insert_with(|| why.to_owned());
        }
    }
}

/// One line for a change.
fn describe(mask: AddWatchFlags, name: &str) -> String {
    let what = if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
        "was added"
    } else if mask.intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM) {
        "was removed"
    } else if mask.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF) {
        return "its directory was removed".into();
    } else {
        "was written"
    };
    format!("file {name} {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary one, removed when dropped.
    struct TestDir(std::path::PathBuf);

    impl TestDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir() -> TestDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "pglease-watch-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("a temporary directory");
        TestDir(path)
    }

    #[test]
    fn a_write_a_new_file_and_a_removal_are_each_seen() {
        let watches = Watches::new().expect("an inotify instance");
        let (a, b, c) = (dir(), dir(), dir());
        for d in [&a, &b, &c] {
            std::fs::write(d.path().join("1259"), b"page").expect("write");
        }
        let (wa, wb, wc) = (
            watches.watch(a.path(), 1).expect("watch"),
            watches.watch(b.path(), 2).expect("watch"),
            watches.watch(c.path(), 3).expect("watch"),
        );
        assert_eq!(watches.changed(&wa), None, "nothing yet");
        std::fs::write(a.path().join("1259"), b"other").expect("write");
        std::fs::write(b.path().join("16390"), b"new").expect("write");
        std::fs::remove_file(c.path().join("1259")).expect("remove");
        assert_eq!(watches.changed(&wa), Some("file 1259 was written".into()));
        assert_eq!(watches.changed(&wb), Some("file 16390 was added".into()));
        assert_eq!(watches.changed(&wc), Some("file 1259 was removed".into()));
        // Still changed on a second look.
        assert!(watches.changed(&wa).is_some());
    }

    #[test]
    fn reads_and_the_relation_cache_file_are_not_changes() {
        let watches = Watches::new().expect("an inotify instance");
        let d = dir();
        std::fs::write(d.path().join("1259"), b"page").expect("write");
        let watch = watches.watch(d.path(), 1).expect("watch");
        std::fs::read(d.path().join("1259")).expect("read");
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(d.path().join("1259"))
            .expect("open for writing, as postgres does, and close");
        std::fs::write(d.path().join("pg_internal.init.42"), b"cache").expect("write");
        std::fs::rename(
            d.path().join("pg_internal.init.42"),
            d.path().join("pg_internal.init"),
        )
        .expect("rename");
        assert_eq!(watches.changed(&watch), None);
    }

    #[test]
    fn another_watchers_stamp_and_a_removed_directory_are_not_taken_for_unchanged() {
        let (first, second) = (
            Watches::new().expect("an inotify instance"),
            Watches::new().expect("an inotify instance"),
        );
        let d = dir();
        let watch = first.watch(d.path(), 1).expect("watch");
        assert!(!second.tells(&watch), "not the second's to tell");
        assert!(second.changed(&watch).is_some());
        let path = d.path().to_owned();
        drop(d);
        assert!(!path.exists());
        assert!(first.changed(&watch).is_some());
    }
}
