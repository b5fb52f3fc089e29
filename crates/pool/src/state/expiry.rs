//! Time passing: `tick` expires leases, times out waiting requests (saying what blocked
//! them), resumes paused clones and retries failed drops; `next_deadline` says when it next
//! has something to do. Reclaiming is here too: when the connection budget alone keeps a
//! request waiting, the longest-held IntegreSQL test database is ended for its connections
//! (of those seen without a session at the actor's last look, if any: `lease_sessions`).

use std::time::Duration;

use tokio::time::Instant;

use super::dbs::{Db, LeaseRecord, Phase};
use super::lifecycle::Waiter;
use super::{Action, PoolState};
use crate::error::{Blocked, LeaseError};
use crate::names::{DbName, LeaseId, TemplateName};

impl PoolState {
    /// Time passes: expire leases, time out waiters, resume paused clones, retry failed
    /// drops.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let expired: Vec<(DbName, TemplateName, LeaseId)> = self
            .dbs
            .leases()
            .filter(|(_, _, record)| record.expires_at <= now && record.pending.is_none())
            .map(|(name, db, record)| (name.clone(), db.template.clone(), record.id.clone()))
            .collect();
        for (database, template, id) in expired {
            tracing::info!(lease_id = %id, database = %database, "lease expired; dropping its database");
            self.expired += 1;
            self.dbs.queue_drop(database, &template, 0);
        }
        self.drop_expired_kept(now);
        self.dbs.retry_failed_drops(now);
        self.discard_abandoned(now, &mut actions);
        self.serve_all_waiters(now, &mut actions);
        let counts = self.dbs.all_counts();
        let in_use = self.connections_in_use();
        let names: Vec<TemplateName> = self.templates.keys().cloned().collect();
        for name in names {
            let count = counts.get(&name).copied().unwrap_or_default();
            let Some(blocked_by) = self.blocked_by(&name, in_use, count) else {
                continue;
            };
            let Some(entry) = self.templates.get_mut(&name) else {
                continue;
            };
            let (timed_out, waiting): (Vec<Waiter>, Vec<Waiter>) =
                entry.waiters.drain(..).partition(|w| w.deadline <= now);
            entry.waiters = waiting.into();
            for waiter in timed_out {
                let waited_ms = now.duration_since(waiter.enqueued).as_millis() as u64;
                tracing::warn!(template = %name, waited_ms, blocked_by = blocked_by.name(), "a lease request timed out: {blocked_by}");
                match blocked_by {
                    Blocked::ConnectionBudget { .. } => self.refused.connection_budget += 1,
                    Blocked::MaxTotal { .. } => self.refused.max_total += 1,
                    Blocked::Making => self.refused.making += 1,
                }
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::TimedOut {
                        template: name.clone(),
                        waited_ms,
                        blocked_by: blocked_by.clone(),
                    },
                });
            }
        }
        for entry in self.templates.values_mut() {
            if entry.clones_paused_until.is_some_and(|t| t <= now) {
                entry.clones_paused_until = None;
            }
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// What keeps `template`'s first waiting request from a database, if one waits: the
    /// connection budget, the template's `max_total`, or clones still being made.
    pub(super) fn blocked_by(
        &self,
        template: &TemplateName,
        in_use: u32,
        counts: super::dbs::Counts,
    ) -> Option<Blocked> {
        let first = self.templates.get(template)?.waiters.front()?;
        Some(if in_use + first.connections > self.connection_budget {
            Blocked::ConnectionBudget {
                requested: first.connections,
                in_use,
                budget: self.connection_budget,
                leases: self.dbs.leases().count(),
            }
        } else if counts.total() >= self.limits.max_total {
            Blocked::MaxTotal {
                leased: counts.leased,
                max_total: self.limits.max_total,
            }
        } else {
            Blocked::Making
        })
    }

    /// The earliest instant at which [`PoolState::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let leases = self
            .dbs
            .leases()
            .filter(|(_, _, r)| r.pending.is_none())
            .map(|(_, _, r)| r.expires_at);
        let abandon_after = self.limits.initialize_timeout;
        let templates = self.templates.values().flat_map(|e| {
            e.waiters
                .iter()
                .map(|w| w.deadline)
                .chain(e.clones_paused_until)
                .chain(e.migrating_since().map(|since| since + abandon_after))
        });
        leases
            .chain(templates)
            .chain(self.dbs.next_drop_retry())
            .chain(self.next_kept_expiry())
            .min()
    }

    /// Ends the oldest reclaimable leases — IntegreSQL test databases, which their clients
    /// never give back — of any template, while a waiting request is kept from its ready
    /// clone by the connection budget alone (IntegreSQL's clients expect their server to
    /// recycle test databases when it is full).
    pub(super) fn reclaim_for_connections(&mut self, now: Instant, actions: &mut Vec<Action>) {
        loop {
            let in_use = self.connections_in_use();
            let blocked = self.templates.iter().any(|(name, entry)| {
                entry
                    .waiters
                    .front()
                    .is_some_and(|w| in_use + w.connections > self.connection_budget)
                    && self.dbs.ready_front(name).is_some()
            });
            if !blocked || !self.reclaim_oldest(now, actions) {
                return;
            }
        }
    }

    /// Connections the leases [`PoolState::reclaim_oldest`] may take back hold.
    pub(super) fn reclaimable_connections(&self) -> u32 {
        self.reclaimable_leases()
            .map(|(_, _, r)| r.connections)
            .sum()
    }

    /// Ends the longest-held IntegreSQL test database nobody gave back (its client never
    /// does), for the connections it holds; false when there is none.
    pub(super) fn reclaim_oldest(&mut self, now: Instant, actions: &mut Vec<Action>) -> bool {
        let Some(Reclaim {
            database,
            template,
            id,
            seen_idle,
        }) = self.reclaim_candidate(None)
        else {
            return false;
        };
        tracing::info!(template = %template, lease_id = %id, database = %database, seen_idle, "connection budget full: recreating the longest-held IntegreSQL test database, one without a session at the last look if there is one");
        self.reclaimed += 1;
        self.end_lease(database, || LeaseError::Discarded(template), actions);
        self.serve_all_waiters(now, actions);
        true
    }

    /// The IntegreSQL test database to recreate to make room (of `template`, or of any):
    /// the longest-held of those seen without a session at the last look, else the
    /// longest-held of all (a test may still be on it: IntegreSQL's clients never say when
    /// they are done). A lease being handed over is never taken back.
    pub(super) fn reclaim_candidate(&self, template: Option<&TemplateName>) -> Option<Reclaim> {
        self.reclaimable_leases()
            .filter(|(_, db, _)| template.is_none_or(|t| db.template == *t))
            .min_by_key(|(_, _, r)| (!r.seen_idle, r.granted_at))
            .map(|(database, db, r)| Reclaim {
                database: database.clone(),
                template: db.template.clone(),
                id: r.id.clone(),
                seen_idle: r.seen_idle,
            })
    }

    /// A look at the sessions on the reclaimable leases' databases, begun at `since`: each
    /// lease still held under the id it was looked at for is marked seen idle when its
    /// database had no session and it had been held [`STARTING_GRACE`] by then (its
    /// client may not have connected before), else not.
    pub fn lease_sessions(&mut self, seen: &[(LeaseId, DbName, bool)], since: Instant) {
        for (id, database, has_sessions) in seen {
            let Some(db) = self.dbs.get_mut(database) else {
                continue;
            };
            let Phase::Leased(record) = &mut db.phase else {
                continue;
            };
            if record.id == *id {
                record.seen_idle = !has_sessions && since >= record.granted_at + STARTING_GRACE;
            }
        }
    }

    /// The reclaimable leases handed over, each with its database: those whose sessions
    /// the actor looks at (`actor/space.rs`).
    pub fn leases_to_look_at(&self) -> Vec<(LeaseId, DbName)> {
        self.reclaimable_leases()
            .map(|(database, _, r)| (r.id.clone(), database.clone()))
            .collect()
    }

    /// The leases the pool may take back to make room: IntegreSQL test databases handed
    /// over (one being handed over is never taken back).
    fn reclaimable_leases(&self) -> impl Iterator<Item = (&DbName, &Db, &LeaseRecord)> {
        self.dbs
            .leases()
            .filter(|(_, _, r)| r.reclaimable && r.pending.is_none())
    }
}

/// How long a test database is held before a look that finds no session on it counts:
/// an IntegreSQL client connects right after it gets one.
pub(super) const STARTING_GRACE: Duration = Duration::from_secs(2);

/// The test database [`PoolState::reclaim_candidate`] chose.
pub(super) struct Reclaim {
    pub database: DbName,
    pub template: TemplateName,
    pub id: LeaseId,
    /// It had no session at the last look.
    pub seen_idle: bool,
}
