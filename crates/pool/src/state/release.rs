//! The end of a lease by its holder or at once: a release (dropped, or recycled with
//! `reuse` or when the server may prove it unchanged), a renewal of its time to live, and
//! `end_lease`, which drops a lease's database and remembers its id as lost. Which error a
//! call on an unknown lease id gets (`missing_lease`) is here too.

use std::time::Duration;

use tokio::time::Instant;

use super::dbs::Phase;
use super::{Action, Ended, PoolState, Server};
use crate::error::{LeaseError, LeaseOpError};
use crate::names::{DbName, LeaseId};

impl PoolState {
    /// A caller is done with a lease. With `reuse` the caller vouches the database is
    /// unchanged: it is recycled (its holder locked out) and goes back to the ready queue,
    /// if its version is still current; otherwise it is dropped and replaced.
    pub fn release(
        &mut self,
        id: &LeaseId,
        reuse: bool,
        now: Instant,
    ) -> (Result<(), LeaseOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let Some((database, db, record)) = self.dbs.lease(id) else {
            return (Err(self.missing_lease(id)), actions);
        };
        if record.pending.is_some() {
            // Not handed over yet: nobody can hold its id.
            return (Err(self.missing_lease(id)), actions);
        }
        let database = database.clone();
        let template = db.template.clone();
        let made_from = db.made_from.clone();
        let entry = self.templates.get_mut(&template);
        // The very version it was cloned from (a client-built template initialized again
        // has the same fingerprint, but another database).
        let current = entry
            .as_ref()
            .and_then(|e| e.current())
            .filter(|v| v.fingerprint == record.fingerprint && Some(&v.db) == made_from.as_ref())
            .map(|v| v.db.clone());
        // Released without `reuse`: the server may still prove it unchanged (never an
        // IntegreSQL test database, whose client says itself what it did).
        let verify = !reuse && self.limits.reuse_unchanged && !record.reclaimable;
        // A clone made without a stamp (`state/proofs.rs`) has nothing to prove against: it
        // is dropped, as without `--reuse-unchanged`, and no proof is counted.
        let stamped = db.made.as_ref().is_some_and(|made| made.stamp.is_some());
        if verify && !stamped {
            self.proven.unstamped += 1;
        }
        match (reuse || (verify && stamped), current) {
            (true, Some(template_db)) => {
                if let Some(entry) = entry {
                    entry.demand.returned(now);
                }
                // Back in the ready queue only once the old holder is locked out; until
                // then it is being made. An IntegreSQL test database keeps its id (and goes
                // to the front of the queue: it is the next one handed out, caches warm).
                let test_id = record.reclaimable.then_some(record.number);
                // Its holder's password goes; what it was when made ready is the proof (or,
                // after a `reuse` release, where its next stamp starts from).
                let stamp = self.dbs.get_mut(&database).and_then(|db| {
                    db.test_id = test_id;
                    db.phase = Phase::Making { started: None };
                    db.made.take().and_then(|made| made.stamp)
                });
                actions.push(Action::Recycle {
                    template,
                    template_db,
                    clone: database,
                    verify,
                    stamp,
                });
            }
            _ => {
                // Given back by its client (recreate, or an unlock of a replaced version):
                // nobody holds its id, which goes to the next getter, as IntegreSQL
                // recreates a test database under the same id.
                if record.reclaimable {
                    self.dbs.give_back_id(&database);
                }
                self.dbs.queue_drop(database, &template, 0);
            }
        }
        self.serve_all_waiters(now, &mut actions);
        self.dispatch(now, &mut actions);
        (Ok(()), actions)
    }

    /// Extends a lease to `ttl` from now.
    pub fn renew(
        &mut self,
        id: &LeaseId,
        ttl: Option<Duration>,
        now: Instant,
    ) -> Result<Duration, LeaseOpError> {
        let ttl = ttl
            .unwrap_or(self.limits.default_ttl)
            .min(self.limits.max_ttl);
        let Some(database) = self.dbs.leased_db(id) else {
            return Err(self.missing_lease(id));
        };
        match self.dbs.get_mut(&database).map(|db| &mut db.phase) {
            Some(Phase::Leased(record)) if record.pending.is_none() => {
                record.expires_at = now + ttl;
                Ok(ttl)
            }
            _ => Err(self.missing_lease(id)),
        }
    }

    pub(super) fn missing_lease(&self, id: &LeaseId) -> LeaseOpError {
        if let Some(why) = self.lost.get(id) {
            match why {
                Ended::Lost => LeaseOpError::Lost(id.to_string()),
                Ended::ExceededMaxBytes {
                    database,
                    bytes,
                    limit,
                } => LeaseOpError::ExceededMaxBytes {
                    id: id.to_string(),
                    database: database.to_string(),
                    bytes: *bytes,
                    limit: *limit,
                },
            }
        } else if self.server == Server::Stopping {
            LeaseOpError::ShuttingDown
        } else {
            LeaseOpError::NotFound(id.to_string())
        }
    }

    /// Ends a lease at once (its database is dropped); later calls on its id answer "lost".
    /// A grant not handed over yet fails its request with `error`.
    pub(super) fn end_lease(
        &mut self,
        database: DbName,
        error: impl FnOnce() -> LeaseError,
        actions: &mut Vec<Action>,
    ) {
        let Some(db) = self.dbs.get_mut(&database) else {
            return;
        };
        let Phase::Leased(record) = &mut db.phase else {
            return;
        };
        let (id, pending, template) = (
            record.id.clone(),
            record.pending.take(),
            db.template.clone(),
        );
        if let Some(waiter) = pending {
            actions.push(Action::Fail {
                waiter: waiter.id,
                error: error(),
            });
        }
        self.dbs.queue_drop(database, &template, 0);
        self.remember_lost(id);
    }
}
