//! Handing a clone to its next holder (after a `reuse` release, or adopted from an earlier
//! run): the previous holder is locked out and every session of theirs ended before the
//! role may log in again. It does not decide which clones are recycled.
//!
//! Rotating the password alone is not enough: a login that read the old verifier just
//! before the change finishes after it, and a single `pg_terminate_backend` sent at once
//! misses it. Postgres checks `rolcanlogin` after authentication, so the role is made
//! NOLOGIN first, and LOGIN comes back only once no session has been seen for a while.

use std::time::Duration;

use tokio::time::Instant;

use super::{pg_message, Session};
use crate::names::{quote_ident, quote_literal, DbName};
use crate::scram;

/// How long no session of the role may be seen before it may log in again. A backend that
/// passed the login check just before NOLOGIN committed shows up in `pg_locks` (its lock on
/// the database) or `pg_stat_activity` a moment later; this covers that moment with a wide
/// margin on a loaded machine.
const QUIET: Duration = Duration::from_millis(50);
/// How often sessions are looked for (and terminated) while waiting.
const POLL: Duration = Duration::from_millis(10);
/// How long the previous holder's sessions may take to end. Terminated backends exit in
/// milliseconds; one that does not within this is stuck, and the clone is better dropped.
const END_LIMIT: Duration = Duration::from_secs(10);

/// Terminates every other backend in the clone or logged in as its role, or starting up
/// in the clone (holding the lock a new backend takes on its database before it appears
/// in `pg_stat_activity`), and counts them.
const TERMINATE_SQL: &str = "\
    SELECT count(pg_terminate_backend(pid)) FROM ( \
      SELECT pid FROM pg_stat_activity WHERE datname = $1 OR usename = $1 \
      UNION \
      SELECT pid FROM pg_locks WHERE locktype = 'object' AND classid = 'pg_database'::regclass \
        AND objid = (SELECT oid FROM pg_database WHERE datname = $1) \
    ) holder WHERE pid <> pg_backend_pid()";

impl Session {
    /// Gets a clone ready to lease again and returns the new password: the role is made
    /// NOLOGIN with a new password (and the database loses a "ready" marker), every
    /// session of the previous holder is ended and waited for, then the role gets the
    /// default connection limit and LOGIN back.
    ///
    /// On error the role is left NOLOGIN or with the old password unusable; the caller
    /// drops a clone whose recycle failed.
    pub async fn recycle(&self, clone: &DbName, standard_scram: bool) -> Result<String, String> {
        self.bounded(
            || format!("recycling {clone}"),
            async |client| self.recycle_with(client, clone, standard_scram).await,
        )
        .await
    }

    async fn recycle_with(
        &self,
        client: &tokio_postgres::Client,
        clone: &DbName,
        standard_scram: bool,
    ) -> Result<String, String> {
        let role = quote_ident(clone.as_str());
        let password = scram::random_password();
        // One transaction. The password changes here, not at the end: a login that reads
        // the verifier while we wait must not get the old one, or it could pass the
        // LOGIN check after LOGIN is back. The plain marker again: an adopted clone must
        // not stay "ready" for a later run while someone holds it.
        client
            .batch_execute(&format!(
                "ALTER ROLE {role} NOLOGIN PASSWORD {verifier}; COMMENT ON DATABASE {db} IS NULL;",
                verifier = quote_literal(&self.verifier(&password, standard_scram)),
                db = clone.quoted(),
            ))
            .await
            .map_err(|e| pg_message(&e))?;
        end_sessions(client, clone).await?;
        client
            .batch_execute(&format!(
                "ALTER ROLE {role} LOGIN CONNECTION LIMIT {}",
                self.lease_connections
            ))
            .await
            .map_err(|e| pg_message(&e))?;
        Ok(password)
    }
}

/// Terminates the sessions of `clone` and its role until none has been seen for
/// [`QUIET`], giving up after [`END_LIMIT`].
async fn end_sessions(client: &tokio_postgres::Client, clone: &DbName) -> Result<(), String> {
    let started = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    loop {
        let found: i64 = client
            .query_one(TERMINATE_SQL, &[&clone.as_str()])
            .await
            .map_err(|e| pg_message(&e))?
            .get(0);
        let now = Instant::now();
        if found > 0 {
            quiet_since = None;
        } else if now.duration_since(*quiet_since.get_or_insert(now)) >= QUIET {
            return Ok(());
        }
        if started.elapsed() > END_LIMIT {
            return Err(format!(
                "sessions of the previous holder of {clone} were still running {END_LIMIT:?} after they were terminated"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}
