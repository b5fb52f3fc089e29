//! Proof that a released clone is exactly what it was when it was last made ready
//! (`--reuse-unchanged`), so that it can go back to the ready queue without a DROP and a
//! CREATE. Only a server pglease runs itself: the proof reads the database's files.
//!
//! A clone is stamped when it is made ready: the files of its directory (name, size, inode,
//! modification time in nanoseconds; tmpfs keeps them exactly), and the rows of the shared
//! catalogs that concern it (database-level and role-level settings, comments, grants on
//! the database, role memberships), which live outside its directory. At release, once
//! every session of the holder has ended (the recycle does that), it is unchanged when:
//!
//! 0. (a shortcut to "changed") the statistics count no more rows written than at the
//!    stamp;
//! 1. no prepared transaction is left in it;
//! 2. the shared catalogs' rows are the same;
//! 3. no change of it is left only in memory: a `CHECKPOINT` writes every dirty buffer of
//!    a permanent relation to its file, so the files show it. Where that cannot be relied
//!    on — the clone has unlogged relations, whose buffers a plain checkpoint skips, or
//!    its newest file is too recent for a write's modification time to differ — the
//!    shared buffers are scanned for a dirty one of it instead (`pg_buffercache`, which
//!    costs about ten times the checkpoint: it walks every buffer of the server);
//! 4. its files are the same — read after 3, so that a buffer written meanwhile shows in
//!    the files. The kernel tells it without a listing where it watches the directory since
//!    the stamp (`session/watch.rs`: no write, new, removed or renamed file); otherwise the
//!    files are listed again and compared.
//!
//! Anything else — a failed query, a missing stamp — is "changed". A read that sets hint
//! bits dirties a buffer: templates are frozen after their build (`template/seal.rs`) so
//! that reads leave nothing to hint. `pg_internal.init`, the relation cache's file that the
//! first connection writes, is not data and is left out.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use deadpool_postgres::Object;
use tokio::time::Instant;

use super::bounded::query_one_prepared;
use super::stamp_error::StampError;
use super::Session;
use crate::names::DbName;
use crate::sql_error::SqlError;

/// The relation cache's init file: rebuilt from the catalogs, not data.
const RELCACHE_INIT: &str = "pg_internal.init";

/// The shared catalogs' rows about a clone (`$1`, its name, which is also its role's):
/// its OID and those rows as text.
macro_rules! catalog_sql {
    () => {
        "\
    WITH d AS (SELECT oid, datacl, datconnlimit, datallowconn, datistemplate \
               FROM pg_database WHERE datname = $1), \
         r AS (SELECT oid FROM pg_roles WHERE rolname = $1) \
    SELECT (SELECT oid FROM d)::bigint, concat_ws(' | ', \
      (SELECT concat_ws(',', datacl::text, datconnlimit, datallowconn, datistemplate) FROM d), \
      (SELECT string_agg(concat(setdatabase, '/', setrole, '=', array_to_string(setconfig, ',')), ';' \
                         ORDER BY setdatabase, setrole) \
         FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM d) OR setrole = (SELECT oid FROM r)), \
      (SELECT string_agg(concat(objoid, ':', description), ';' ORDER BY objoid) \
         FROM pg_shdescription WHERE objoid IN ((SELECT oid FROM d), (SELECT oid FROM r))), \
      (SELECT string_agg(concat(roleid, '>', member, ':', admin_option), ';' ORDER BY roleid, member) \
         FROM pg_auth_members WHERE member = (SELECT oid FROM r) OR roleid = (SELECT oid FROM r)))"
    };
}

/// The rows written in a clone so far, by the statistics (`$1`, its name).
macro_rules! rows_written_sql {
    () => {
        "(SELECT coalesce(sum(tup_inserted + tup_updated + tup_deleted), 0)::bigint \
           FROM pg_stat_database WHERE datname = $1)"
    };
}

/// The clone's OID and shared catalogs' rows ([`catalog_sql`]), and the rows written in it
/// so far: a stamp's one round trip.
const STAMP_SQL: &str = concat!(
    "SELECT c.*, ",
    rows_written_sql!(),
    " FROM (",
    catalog_sql!(),
    ") c"
);

/// [`STAMP_SQL`]'s columns and the prepared transactions left in the clone: what a proof
/// asks before it looks at memory and files, in one round trip.
const CHECK_SQL: &str = concat!(
    "SELECT c.*, ",
    rows_written_sql!(),
    ", (SELECT count(*) FROM pg_prepared_xacts WHERE database = $1) FROM (",
    catalog_sql!(),
    ") c"
);

/// The clone's dirty shared buffers: a scan of every buffer of the server.
const DIRTY_SQL: &str = "SELECT count(*) FROM pglease.pg_buffercache \
     WHERE reldatabase = (SELECT oid FROM pg_database WHERE datname = $1) AND isdirty";

/// One file of a clone's directory: name, size, inode, mtime (seconds, nanoseconds).
pub(super) type FileStamp = (String, u64, u64, i64, i64);

/// What a clone was when made ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// Its OID (and so its directory, `base/<oid>`).
    oid: u32,
    /// The shared catalogs' rows about it, as text.
    catalog: String,
    /// Its files: name, size, inode, mtime (s, ns); sorted.
    files: Vec<FileStamp>,
    /// Rows inserted, updated and deleted in it, by the statistics: more at release is a
    /// change, found without scanning the buffers (not a proof of the reverse: sequences,
    /// hint bits and some DDL write without counting rows, and the counts of a backend
    /// reach the statistics when it exits).
    rows_written: i64,
    /// The kernel's watch on its directory, when the session could add one: a proof asks
    /// it instead of listing the files again.
    watch: Option<super::watch::Watch>,
}

impl Stamp {
    /// A stamp of nothing, for tests of the state, which only carries stamps.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Stamp {
        Stamp {
            oid: 0,
            catalog: String::new(),
            files: Vec::new(),
            rows_written: 0,
            watch: None,
        }
    }
}

impl Session {
    /// Whether this session can prove a clone unchanged.
    pub fn proves_unchanged(&self) -> bool {
        self.proof_dir.is_some()
    }

    /// Stamps `clone` as it is now (made ready, nobody connected).
    pub async fn stamp(&self, clone: &DbName) -> Result<Stamp, StampError> {
        let Some(data_dir) = self.proof_dir.clone() else {
            return Err(StampError::NotOurFiles);
        };
        let (oid, catalog, rows_written) = self.stamp_row(clone).await?;
        // Watched before the listing: a change between the two is not missed.
        let watch = self
            .watches
            .as_ref()
            .and_then(|watches| watches.watch(&clone_dir(&data_dir, oid), oid));
        let files = files_of(data_dir, oid).await?;
        Ok(Stamp {
            oid,
            catalog,
            files,
            rows_written,
            watch,
        })
    }

    /// Stamps `clone` again after a recycle that proved nothing (a `reuse` release, whose
    /// holder vouches for it), starting from `previous`, its stamp when last made ready:
    /// where the kernel has watched its directory since then and seen no change, the files
    /// are what `previous` lists, and the watch goes on from there, so only the catalog rows
    /// and the statistics are read again; the files are not listed (a listing stats each of
    /// a clone's few hundred files: most of a stamp's cost). Otherwise a fresh stamp.
    ///
    /// The new stamp is as sound as a fresh one: a write since `previous` would have shown
    /// in the watch, and one from now on will, as it would in a fresh watch.
    pub async fn restamp(&self, clone: &DbName, previous: Stamp) -> Result<Stamp, StampError> {
        let unchanged = previous.watch.filter(|watch| {
            self.watches
                .as_ref()
                .is_some_and(|watches| watches.changed(watch).is_none())
        });
        if unchanged.is_none() {
            return self.stamp(clone).await;
        }
        let (oid, catalog, rows_written) = self.stamp_row(clone).await?;
        if oid != previous.oid {
            return self.stamp(clone).await;
        }
        Ok(Stamp {
            oid,
            catalog,
            rows_written,
            ..previous
        })
    }

    /// [`STAMP_SQL`]'s answer: the clone's OID, its shared catalogs' rows, the rows written.
    async fn stamp_row(&self, clone: &DbName) -> Result<(u32, String, i64), StampError> {
        let row = self
            .bounded(
                || format!("stamping {clone}"),
                async |client| {
                    let row = query_one_prepared(client, STAMP_SQL, &[&clone.as_str()]).await?;
                    let (oid, catalog) = oid_and_catalog(&row, clone)?;
                    Ok::<_, SqlError>((oid, catalog, row.get::<_, i64>(2)))
                },
            )
            .await?;
        Ok(row)
    }

    /// Why `clone` is not what `stamp` says, or `None` when it is exactly that. Its holder's
    /// sessions must be over (the recycle ended them).
    pub(super) async fn changed_since(
        &self,
        client: &Object,
        clone: &DbName,
        stamp: &Stamp,
    ) -> Result<Option<String>, SqlError> {
        let Some(data_dir) = self.proof_dir.clone() else {
            return Ok(Some("this server's files are not pglease's".into()));
        };
        let row = query_one_prepared(client, CHECK_SQL, &[&clone.as_str()]).await?;
        let (oid, catalog) = oid_and_catalog(&row, clone)?;
        let (written, prepared): (i64, i64) = (row.get(2), row.get(3));
        // The cheap way to tell most writers: the row counts went up.
        let written = written - stamp.rows_written;
        if written > 0 {
            return Ok(Some(format!("{written} row(s) written")));
        }
        if prepared > 0 {
            return Ok(Some(format!(
                "{prepared} prepared transaction(s) left in it"
            )));
        }
        if oid != stamp.oid || catalog != stamp.catalog {
            return Ok(Some(format!(
                "its settings, comments, grants or roles changed ({} → {catalog})",
                stamp.catalog
            )));
        }
        let watched = stamp.watch.filter(|watch| {
            self.watches
                .as_ref()
                .is_some_and(|watches| watches.tells(watch))
        });
        if checkpoint_shows_changes(stamp, watched.is_some()) {
            client
                .batch_execute("CHECKPOINT")
                .await
                .map_err(|e| SqlError::from_pg(&e))?;
        } else {
            let dirty: i64 = query_one_prepared(client, DIRTY_SQL, &[&clone.as_str()])
                .await?
                .get(0);
            if dirty > 0 {
                return Ok(Some(format!("{dirty} page(s) changed in memory")));
            }
        }
        if let (Some(watch), Some(watches)) = (watched, &self.watches) {
            return Ok(watches.changed(&watch));
        }
        let files = files_of(data_dir, oid)
            .await
            .map_err(|error| SqlError::other(error.to_string()))?;
        if files != stamp.files {
            return Ok(Some(describe_file_change(&stamp.files, &files)));
        }
        Ok(None)
    }
}

/// Whether a `CHECKPOINT` now would make every change of the clone stamped `stamp` that is
/// only in memory show in its files: none of them belongs to an unlogged relation (an
/// `_init` fork marks one; a plain checkpoint leaves their buffers alone, and one created
/// since is a new file anyway), and the write is seen: the kernel reports it (`watched`),
/// or the clock it stamps file writes with has moved past the newest modification time
/// stamped, so a write from now on changes the time of the file it goes to.
fn checkpoint_shows_changes(stamp: &Stamp, watched: bool) -> bool {
    if stamp.files.iter().any(|file| file.0.ends_with("_init")) {
        return false;
    }
    if watched {
        return true;
    }
    let Some(newest) = stamp.files.iter().map(|file| (file.3, file.4)).max() else {
        return true;
    };
    // File times come from the coarse clock (or a finer one, never behind it).
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE) {
        Ok(now) => (now.tv_sec(), now.tv_nsec()) > newest,
        Err(_) => false,
    }
}

/// How long a release waits for its holder's sessions to end on their own before the
/// statistics are read: a test's backend exits within a millisecond or two of its client's
/// goodbye, and its counts arrive as it exits. Kept short: a holder whose pool keeps its
/// connections open makes every release wait this long, holding a clone slot, before the
/// lock-out ends them.
const LEAVING_WAIT: Duration = Duration::from_millis(25);
/// How often the holder's sessions are looked for meanwhile.
const LEAVING_POLL: Duration = Duration::from_millis(1);

/// The holder's sessions (in `$1` or logged in as its role, `$1` too) and the rows written
/// in it so far, by the statistics.
const LEAVING_SQL: &str = concat!(
    "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = $1 OR usename = $1), ",
    rows_written_sql!()
);

/// "Changed" when the statistics count more rows written in `clone` than at `stamp`, read
/// once the holder's sessions have ended on their own (or [`LEAVING_WAIT`] has passed):
/// a backend sends its counts before it leaves `pg_stat_activity`, so a writer that has
/// gone shows. It only reads `pg_stat_activity` and the statistics: a clone dropped anyway
/// needs nobody locked out and no new password. `None` proves nothing.
pub(super) async fn written_once_left(
    client: &Object,
    clone: &DbName,
    stamp: &Stamp,
) -> Result<Option<String>, SqlError> {
    let started = Instant::now();
    loop {
        let row = query_one_prepared(client, LEAVING_SQL, &[&clone.as_str()]).await?;
        let (sessions, written): (i64, i64) = (row.get(0), row.get(1));
        let written = written - stamp.rows_written;
        if written > 0 {
            return Ok(Some(format!("{written} row(s) written")));
        }
        if sessions == 0 || started.elapsed() >= LEAVING_WAIT {
            return Ok(None);
        }
        tokio::time::sleep(LEAVING_POLL).await;
    }
}

/// The first two columns of [`STAMP_SQL`] and [`CHECK_SQL`]: the clone's OID and its
/// catalog rows.
fn oid_and_catalog(row: &tokio_postgres::Row, clone: &DbName) -> Result<(u32, String), SqlError> {
    let oid: Option<i64> = row.get(0);
    let oid = oid
        .and_then(|oid| u32::try_from(oid).ok())
        .ok_or_else(|| SqlError::other(format!("{clone} does not exist")))?;
    Ok((oid, row.get(1)))
}

/// A clone's directory: `base/<oid>` under `data_dir`.
fn clone_dir(data_dir: &Path, oid: u32) -> PathBuf {
    data_dir.join("base").join(oid.to_string())
}

/// The files of [`clone_dir`], on a thread that may block.
async fn files_of(data_dir: PathBuf, oid: u32) -> Result<Vec<FileStamp>, StampError> {
    tokio::task::spawn_blocking(move || list_files(&clone_dir(&data_dir, oid)))
        .await
        .map_err(StampError::Listing)?
}

/// The files of the clone directory `dir` but the relation cache's, sorted by name.
pub(super) fn list_files(dir: &Path) -> Result<Vec<FileStamp>, StampError> {
    let unreadable = |source| StampError::ListDirectory {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == RELCACHE_INIT {
            continue;
        }
        // A file that goes between the listing and its stat is a change too.
        let meta = entry.metadata().map_err(|source| StampError::Stat {
            path: entry.path(),
            source,
        })?;
        files.push((
            name,
            meta.len(),
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec(),
        ));
    }
    files.sort();
    Ok(files)
}

/// One line saying which file changed first.
fn describe_file_change(before: &[FileStamp], after: &[FileStamp]) -> String {
    let names = |list: &[FileStamp]| {
        list.iter()
            .map(|f| f.0.clone())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let (was, is) = (names(before), names(after));
    if let Some(added) = is.difference(&was).next() {
        return format!("file {added} was added");
    }
    if let Some(removed) = was.difference(&is).next() {
        return format!("file {removed} was removed");
    }
    let changed = before
        .iter()
        .zip(after)
        .find(|(a, b)| a != b)
        .map_or_else(String::new, |(a, _)| a.0.clone());
    format!("file {changed} was written")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_change_is_named() {
        let before = vec![("1259".to_owned(), 8192, 7, 100, 5)];
        let mut after = before.clone();
        after[0].4 = 6;
        assert_eq!(
            describe_file_change(&before, &after),
            "file 1259 was written"
        );
        after.push(("16390".into(), 0, 9, 101, 0));
        assert_eq!(
            describe_file_change(&before, &after),
            "file 16390 was added"
        );
        assert_eq!(
            describe_file_change(&after, &before),
            "file 16390 was removed"
        );
    }
}
