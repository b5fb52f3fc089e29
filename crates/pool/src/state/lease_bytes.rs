//! One lease's bytes are bounded (`--lease-max-bytes`): a lease whose database grows past
//! the limit is ended at once, as an expired one is (its database dropped, which ends its
//! sessions), and its id is remembered so that the holder's next call on it hears why
//! (`LeaseOpError::ExceededMaxBytes`, 410). Without it one holder could fill the databases'
//! tmpfs and fail every other lease's writes and sorts for as long as it lived.
//!
//! The state decides; it does not measure. The actor asks for the leases to measure
//! ([`PoolState::leases_to_measure`]) a few times a second while a limit is in force, a
//! worker asks postgres for their sizes, and the answer comes back here
//! ([`PoolState::lease_sizes`]); the databases' tmpfs filling up brings every database's
//! size at once (`state/space.rs`), which is judged the same way.

use std::time::SystemTime;

use tokio::time::Instant;

use super::dbs::Phase;
use super::{Action, Ended, PoolState};
use crate::error::LeaseError;
use crate::names::{DbName, LeaseId};
use crate::types::ExceededMaxBytes;

impl PoolState {
    /// The limit in force: `--lease-max-bytes`, or by default one derived from the
    /// databases' tmpfs once it is measured (none when the server has none).
    pub fn lease_max_bytes(&self) -> Option<u64> {
        self.limits.lease_max_bytes.resolve(self.space_room())
    }

    /// The leases whose databases are to be measured, each with the database it holds:
    /// every lease handed over, while a limit is in force (none otherwise).
    pub fn leases_to_measure(&self) -> Vec<(LeaseId, DbName)> {
        if self.lease_max_bytes().is_none() {
            return Vec::new();
        }
        self.dbs
            .leases()
            .filter(|(_, _, record)| record.pending.is_none())
            .map(|(database, _, record)| (record.id.clone(), database.clone()))
            .collect()
    }

    /// Sizes measured of leased databases, each with the lease it was measured for: every
    /// lease still holding that database whose size is past the limit is ended. A size
    /// measured for a lease that has ended since (its database perhaps reused by another)
    /// is ignored.
    pub fn lease_sizes(
        &mut self,
        sizes: &[(LeaseId, DbName, u64)],
        at: SystemTime,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(limit) = self.lease_max_bytes() else {
            return actions;
        };
        let mut ended = false;
        for (id, database, bytes) in sizes {
            if *bytes <= limit {
                continue;
            }
            let Some(db) = self.dbs.get(database) else {
                continue;
            };
            let Phase::Leased(record) = &db.phase else {
                continue;
            };
            if record.id != *id || record.pending.is_some() {
                continue;
            }
            let template = db.template.clone();
            tracing::warn!(
                lease_id = %id,
                database = %database,
                template = %template,
                bytes,
                limit,
                "a lease's database grew past --lease-max-bytes; ending the lease and dropping its database"
            );
            ended = true;
            self.exceeded_max_bytes += 1;
            self.last_exceeded_max_bytes = Some(ExceededMaxBytes {
                lease_id: id.clone(),
                template: template.clone(),
                database: database.clone(),
                bytes: *bytes,
                limit,
                at,
            });
            // Handed over (checked above), so no request waits on it: the error is unused.
            self.end_lease(
                database.clone(),
                || LeaseError::Discarded(template),
                &mut actions,
            );
            self.remember_ended(
                id.clone(),
                Ended::ExceededMaxBytes {
                    database: database.clone(),
                    bytes: *bytes,
                    limit,
                },
            );
        }
        if ended {
            // Its place under max_total and its connections are free again.
            self.serve_all_waiters(now, &mut actions);
            self.dispatch(now, &mut actions);
        }
        actions
    }
}
