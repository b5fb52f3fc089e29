//! Handing a clone to its next holder (after a `reuse` release, or adopted from an earlier
//! run): the previous holder is locked out and every session of theirs ended before the
//! role may log in again. It does not decide which clones are recycled.
//!
//! Rotating the password alone is not enough: a login that read the old verifier just
//! before the change finishes after it, and a single `pg_terminate_backend` sent at once
//! misses it. Postgres checks `rolcanlogin` after authentication, so the role is made
//! NOLOGIN first, and LOGIN comes back only once no backend that could have passed that
//! check before it is left.
//!
//! Which backends could have: a backend opens a transaction (and so holds a `virtualxid`
//! lock, shown in `pg_locks`) before it authenticates and checks its role, and appears in
//! `pg_stat_activity` before it closes that transaction. So once NOLOGIN is committed, every
//! backend that may still become the previous holder's is either in `pg_stat_activity`
//! already, or holds a `virtualxid` lock without being there yet ("starting"). The recycle
//! terminates the first kind and waits for the starting ones of that moment to show up (and
//! be terminated if they are the holder's) or go — milliseconds, with no fixed pause. The
//! two lists cannot be read at one instant, and a login can move from the second kind to
//! the first between the reads; so the recycle ends with a last look at the sessions, after
//! every read of the locks, and ends what of the holder's it finds there. One
//! still starting after [`STARTING_GRACE`] is stuck in authentication: it may be the holder,
//! holding the old verifier, or anyone else's login to any database of the server, and
//! nothing tells which. It is left alone (ending it could break another tenant's connect)
//! and the recycle fails instead: the caller drops the clone and its role, which no login
//! can pass a role check for afterwards, and makes a new one.

use std::time::Duration;

use deadpool_postgres::Object;
use tokio::time::Instant;

use super::bounded::query_one_prepared;
use super::Session;
use crate::names::{quote_ident, quote_literal, DbName};
use crate::scram;
use crate::sql_error::SqlError;

/// How often sessions are looked for (and terminated) while waiting.
const POLL: Duration = Duration::from_millis(2);
/// How long a backend that was starting at NOLOGIN's commit may take to show up before the
/// recycle gives up. One past its role check shows within milliseconds (it waits for
/// nothing after that); one still starting after this is stuck in authentication, waiting
/// for its client — possibly the old holder, with a verifier read before the change, who
/// would pass the role check once LOGIN is back.
const STARTING_GRACE: Duration = Duration::from_millis(500);
/// How long the previous holder's sessions may take to end. Terminated backends exit in
/// milliseconds; one that does not within this is stuck, and the clone is better dropped.
const END_LIMIT: Duration = Duration::from_secs(10);

/// The backends of the previous holder: in the clone or logged in as its role (`$1`), or
/// starting up in the clone (holding the lock a new backend takes on its database before it
/// appears in `pg_stat_activity`).
macro_rules! holders {
    () => {
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 OR usename = $1 \
         UNION \
         SELECT pid FROM pg_locks WHERE locktype = 'object' AND classid = 'pg_database'::regclass \
           AND objid = (SELECT oid FROM pg_database WHERE datname = $1)"
    };
}

/// Backends that hold a transaction's `virtualxid` lock but do not show in
/// `pg_stat_activity` as a client backend with its user yet: starting up, before or past
/// their role check (PostgreSQL 17 and later list them early, without a user).
macro_rules! starting {
    () => {
        "SELECT pid FROM pg_locks WHERE locktype = 'virtualxid' AND pid IS NOT NULL \
         EXCEPT SELECT pid FROM pg_stat_activity \
           WHERE usename IS NOT NULL OR backend_type <> 'client backend'"
    };
}

/// Terminates the previous holder's backends and counts them.
const TERMINATE_SQL: &str = concat!(
    "SELECT count(pg_terminate_backend(pid)) FROM (",
    holders!(),
    ") holder WHERE pid <> pg_backend_pid()"
);

/// Which of the backends in `$1` are still starting.
const STARTING_SQL: &str = concat!(
    "SELECT coalesce(array_agg(pid), '{}') FROM (",
    starting!(),
    ") starting WHERE pid = ANY($1)"
);

/// Terminates the previous holder's backends and lists them (those signalled), and every
/// backend starting now, in one round trip, with one listing of the locks and one of the
/// sessions: each walks every backend slot of the server.
const FIRST_PASS_SQL: &str = concat!(
    "WITH pg_locks AS MATERIALIZED (SELECT locktype, classid, objid, pid FROM pg_catalog.pg_locks), \
          pg_stat_activity AS MATERIALIZED \
            (SELECT pid, datname, usename, backend_type FROM pg_catalog.pg_stat_activity) \
     SELECT (SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}') FROM (",
    holders!(),
    ") holder WHERE pid <> pg_backend_pid()), (SELECT coalesce(array_agg(pid), '{}') FROM (",
    starting!(),
    ") starting WHERE pid <> pg_backend_pid())"
);

/// Of the backends in `$2` that were starting, those that have shown up in
/// `pg_stat_activity` as a client with its user (or as another kind of process), and of
/// them those of the previous holder (in the clone or logged in as its role, `$1`),
/// terminated. Reads the sessions only, not the lock table.
const SHOWN_SQL: &str = "SELECT coalesce(array_agg(pid), '{}'), \
       coalesce(array_agg(pid) FILTER (WHERE CASE WHEN datname = $1 OR usename = $1 \
                                                  THEN pg_terminate_backend(pid) ELSE false END), '{}') \
     FROM pg_catalog.pg_stat_activity \
     WHERE pid = ANY($2) AND (usename IS NOT NULL OR backend_type <> 'client backend')";

/// Terminates the previous holder's sessions (in the clone or logged in as its role, `$1`)
/// and lists those signalled: the sessions only, not the lock table.
const LAST_LOOK_SQL: &str =
    "SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}') \
     FROM pg_catalog.pg_stat_activity \
     WHERE (datname = $1 OR usename = $1) AND pid <> pg_backend_pid()";

/// Why a clone is not ready to lease again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReused {
    /// Its stamp does not hold: it was changed (or nothing proves it was not).
    Changed(String),
    /// The recycle failed, with postgres' words and the kind of failure (a lost server is
    /// not a clone's fault).
    Failed(SqlError),
}

impl std::fmt::Display for NotReused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReused::Changed(why) => write!(f, "changed: {why}"),
            NotReused::Failed(error) => write!(f, "{error}"),
        }
    }
}

impl Session {
    /// Gets a clone ready to lease again and returns the new password: the role is made
    /// NOLOGIN with a new password (and the database loses a "ready" marker), every
    /// session of the previous holder is ended and waited for, then — with `proof`, only if
    /// the clone is exactly what that stamp says (`session/proof.rs`) — the role gets the
    /// default connection limit and LOGIN back.
    ///
    /// On error the role is left NOLOGIN or with the old password unusable; the caller
    /// drops a clone that is not reused.
    pub async fn recycle(
        &self,
        clone: &DbName,
        standard_scram: bool,
        proof: Option<&super::Stamp>,
    ) -> Result<String, NotReused> {
        let outcome = self
            .bounded(
                || format!("recycling {clone}"),
                async |client| {
                    self.recycle_with(client, clone, standard_scram, proof)
                        .await
                },
            )
            .await;
        match outcome {
            Ok((password, None)) => Ok(password),
            Ok((_, Some(why))) => Err(NotReused::Changed(why)),
            Err(error) => Err(NotReused::Failed(error)),
        }
    }

    /// How this session's recycles tell that a backend has exited.
    fn exits(&self) -> Exits {
        if self.external {
            Exits::Asked
        } else {
            Exits::Seen
        }
    }

    /// The password, and why the clone is not reused when its proof failed (then LOGIN is
    /// not given back).
    async fn recycle_with(
        &self,
        client: &Object,
        clone: &DbName,
        standard_scram: bool,
        proof: Option<&super::Stamp>,
    ) -> Result<(String, Option<String>), SqlError> {
        let role = quote_ident(clone.as_str());
        let password = scram::random_password();
        if let Some(stamp) = proof {
            // Most writers show once their sessions are gone (a backend sends its counts
            // as it exits): a clone that is dropped anyway needs nobody locked out and no
            // new verifier. A failed read is no verdict; the full check after the lock-out
            // decides.
            if let Ok(Some(why)) = super::proof::written_once_left(client, clone, stamp).await {
                return Ok((password, Some(why)));
            }
        }
        // One transaction. The password changes here, not at the end: a login that reads
        // the verifier while we wait must not get the old one, or it could pass the
        // LOGIN check after LOGIN is back. The plain marker again: an adopted clone must
        // not stay "ready" for a later run while someone holds it.
        // NOLOGIN and the password in one new row of `pg_authid`: what `ALTER ROLE …
        // NOLOGIN` and the password's UPDATE (`Session::set_password_sql`) would each write.
        client
            .batch_execute(&format!(
                "UPDATE pg_catalog.pg_authid SET rolcanlogin = false, rolpassword = {stored} \
                   WHERE rolname = {name}; \
                 COMMENT ON DATABASE {db} IS NULL;",
                stored = self.password_sql(&password, standard_scram),
                name = quote_literal(clone.as_str()),
                db = clone.quoted(),
            ))
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        end_sessions(client, clone, self.exits()).await?;
        let login = format!(
            "UPDATE pg_catalog.pg_authid SET rolcanlogin = true, rolconnlimit = {} \
               WHERE rolname = {}",
            self.lease_connections,
            quote_literal(clone.as_str()),
        );
        let sql = if let Some(stamp) = proof {
            // Unsure is changed: a failed check says so too.
            let changed = match self.changed_since(client, clone, stamp).await {
                Ok(changed) => changed,
                Err(error) => Some(format!("the check failed: {error}")),
            };
            if changed.is_some() {
                return Ok((password, changed));
            }
            // Its role settings and database attributes are the stamp's: LOGIN is all.
            login
        } else {
            // What the holder may have done to its own role and database is undone for
            // the next one, with LOGIN in one transaction: role settings (a `search_path`
            // or `role` of its choosing) and the attributes an owner can set that would
            // break the pool (IS_TEMPLATE makes the drop fail; ALLOW_CONNECTIONS and
            // CONNECTION LIMIT lock the next holder out). A proof counts them as changes.
            format!(
                "ALTER ROLE {role} RESET ALL; \
                 ALTER DATABASE {db} WITH IS_TEMPLATE false ALLOW_CONNECTIONS true CONNECTION LIMIT -1; \
                 {login}",
                db = clone.quoted(),
            )
        };
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        Ok((password, None))
    }
}

/// How the recycle tells that a backend has exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exits {
    /// The server is pglease's: its backends are processes of this machine and of the
    /// daemon's PID namespace, and signal 0 tells whether one is still there, with no query.
    Seen,
    /// An external server: only its lock table says whether a backend that has not shown
    /// up in `pg_stat_activity` is still starting, and `pg_locks` walks every lock slot of
    /// the server (about 0.2 ms at 1,310 connections, against 0.07 for the sessions).
    Asked,
}

/// Terminates the sessions of `clone` and its role until none is left and every backend
/// that was starting when NOLOGIN committed has shown up (and was terminated if it is the
/// holder's) or gone, giving up after [`END_LIMIT`], or after [`STARTING_GRACE`] while one
/// is still starting.
async fn end_sessions(client: &Object, clone: &DbName, exits: Exits) -> Result<(), SqlError> {
    let started = Instant::now();
    // Taken after NOLOGIN committed (any later backend fails its role check), in the same
    // round trip as the first pass: the usual recycle takes no other.
    let first = query_one_prepared(client, FIRST_PASS_SQL, &[&clone.as_str()]).await?;
    let (mut ending, mut starting): (Vec<i32>, Vec<i32>) = (first.get(0), first.get(1));
    loop {
        match exits {
            Exits::Seen => wait_seen(client, clone, started, ending, starting).await?,
            Exits::Asked => {
                wait_asked(client, clone, started, !ending.is_empty(), starting).await?
            }
        }
        // The first pass reads the sessions and the locks one after the other: a login
        // that finished its start-up between the two reads (past its role check before
        // NOLOGIN, its start-up transaction closed) can be in neither. It is in the
        // sessions now; so is any holder's backend the passes since could have missed. A
        // last look at them, after every read of the locks, ends the holder's that are
        // left; then wait for those, within the same limits.
        check_limits(clone, started, &[])?;
        ending = query_one_prepared(client, LAST_LOOK_SQL, &[&clone.as_str()])
            .await?
            .get(0);
        if ending.is_empty() {
            return Ok(());
        }
        starting = Vec::new();
    }
}

/// [`end_sessions`] on a server of pglease's: the backends it ended are watched until they
/// exit, and those that were starting until they show up (the holder's among them are
/// ended too) or exit.
async fn wait_seen(
    client: &Object,
    clone: &DbName,
    started: Instant,
    mut ending: Vec<i32>,
    mut starting: Vec<i32>,
) -> Result<(), SqlError> {
    loop {
        ending.retain(|pid| still_there(*pid));
        if ending.is_empty() && starting.is_empty() {
            return Ok(());
        }
        check_limits(clone, started, &starting)?;
        tokio::time::sleep(POLL).await;
        if !starting.is_empty() {
            let row = query_one_prepared(client, SHOWN_SQL, &[&clone.as_str(), &starting]).await?;
            let (shown, ended): (Vec<i32>, Vec<i32>) = (row.get(0), row.get(1));
            // One that has not shown up and is gone never will.
            starting.retain(|pid| !shown.contains(pid) && still_there(*pid));
            ending.extend(ended);
        }
    }
}

/// [`end_sessions`] on an external server: the holder's sessions and the starting
/// backends are asked for again at each pass.
async fn wait_asked(
    client: &Object,
    clone: &DbName,
    started: Instant,
    mut found: bool,
    mut waiting_for: Vec<i32>,
) -> Result<(), SqlError> {
    loop {
        if !found && waiting_for.is_empty() {
            return Ok(());
        }
        check_limits(clone, started, &waiting_for)?;
        tokio::time::sleep(POLL).await;
        if !waiting_for.is_empty() {
            // Those that showed up are in pg_stat_activity now: the next pass sees them.
            waiting_for = query_one_prepared(client, STARTING_SQL, &[&waiting_for])
                .await?
                .get(0);
        }
        found = query_one_prepared(client, TERMINATE_SQL, &[&clone.as_str()])
            .await?
            .get::<_, i64>(0)
            > 0;
    }
}

/// The recycle's bounds: [`END_LIMIT`] in all, [`STARTING_GRACE`] while a backend that was
/// starting at NOLOGIN's commit (`starting`) has not shown up.
fn check_limits(clone: &DbName, started: Instant, starting: &[i32]) -> Result<(), SqlError> {
    let elapsed = started.elapsed();
    if elapsed > END_LIMIT {
        return Err(SqlError::other(format!(
            "sessions of the previous holder of {clone} were still running {END_LIMIT:?} after they were terminated"
        )));
    }
    if let Some(pid) = starting.first().filter(|_| elapsed > STARTING_GRACE) {
        return Err(SqlError::other(format!(
            "a login to the server (backend pid {pid}) has been stuck in authentication \
             for over {STARTING_GRACE:?}; it may be the previous holder's, so {clone} \
             is replaced instead of reused"
        )));
    }
    Ok(())
}

/// Whether the process `pid` of this machine is still there (a zombie too, until its
/// postmaster reaps it): signal 0 checks without sending anything. Only "no such process"
/// says gone; a process we may not signal is there.
fn still_there(pid: i32) -> bool {
    // 0 and below name process groups, never a backend.
    pid > 0
        && !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        )
}
