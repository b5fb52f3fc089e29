//! Keeping the pool filled: which clones and drops to start (within the concurrency limit,
//! waiting templates first, ahead of demand, within `max_total` and the byte budget), and
//! what a clone or drop that ended means.

use std::time::Duration;

use tokio::time::Instant;

use super::dbs::Phase;
use super::grants::new_clone;
use super::{Action, Made, PoolState, Server};
use crate::error::LeaseError;
use crate::names::{DbName, TemplateName};
use crate::sql_error::SqlError;

/// After a clone fails, wait this long before trying that template's clones again.
pub(super) const CLONE_RETRY_DELAY: Duration = Duration::from_secs(1);

impl PoolState {
    /// Starts drops and clones up to the concurrency limit. Templates with waiters go first;
    /// then clones are spread one per template per round. Under a byte budget a clone that
    /// does not fit is made only for a waiting request, after evicting what nobody waits
    /// for; if it still does not fit, that template's waiters are told so.
    pub(super) fn dispatch(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if self.server != Server::Up {
            return;
        }
        self.reclaim_for_waiters(actions);
        self.reclaim_for_connections(now, actions);
        self.dispatch_drops(actions);
        let limit = self.limits.clone_concurrency.max(1);
        let mut order: Vec<TemplateName> = self.templates.keys().cloned().collect();
        order.sort_by_key(|name| {
            self.templates
                .get(name)
                .map_or(0, |e| e.waiters.is_empty() as u8)
        });
        let (min_ready, max_total) = (self.limits.min_ready, self.limits.max_total);
        let mut counts = self.dbs.all_counts();
        let mut running = self.dbs.making();
        'rounds: loop {
            let mut started = false;
            for name in &order {
                if running >= limit {
                    break 'rounds;
                }
                let Some(entry) = self.templates.get(name) else {
                    continue;
                };
                let Some(version) = entry.current() else {
                    continue;
                };
                if !entry.wanted || entry.clones_paused_until.is_some_and(|t| t > now) {
                    continue;
                }
                let count = counts.get(name).copied().unwrap_or_default();
                let have = count.ready + count.making;
                // Refill ahead of the rate clones are used up at, never below min_ready.
                let floor = min_ready.max(entry.demand.ahead(now));
                let want = floor + entry.waiters.len();
                if have >= want || count.total() >= max_total {
                    continue;
                }
                let (template_db, size) = (version.db.clone(), entry.version_size());
                // Only a clone that will serve a waiting request may evict; keeping clones
                // warm (min_ready) never does.
                let for_a_waiter = entry.waiters.len() > have;
                if !self.fits(size) {
                    if !for_a_waiter {
                        continue;
                    }
                    self.make_room(name, size);
                    counts = self.dbs.all_counts();
                    if !self.fits(size) {
                        self.fail_for_space(name, size, actions);
                        continue;
                    }
                }
                let clone = self.next_clone_name(name);
                self.dbs
                    .insert(clone.clone(), new_clone(name, &template_db, size, now));
                counts.entry(name.clone()).or_default().making += 1;
                running += 1;
                started = true;
                actions.push(Action::Clone {
                    template: name.clone(),
                    template_db,
                    clone,
                    stamp: self.limits.reuse_unchanged
                        && self
                            .templates
                            .get_mut(name)
                            .is_some_and(|e| e.proofs.stamp_next()),
                });
            }
            if !started {
                break;
            }
        }
        self.dispatch_drops(actions);
    }

    fn dispatch_drops(&mut self, actions: &mut Vec<Action>) {
        let limit = self.limits.clone_concurrency.max(1);
        let mut running = self.dbs.drops_running();
        while running < limit {
            let Some(db) = self.dbs.start_next_drop() else {
                break;
            };
            running += 1;
            actions.push(Action::Drop { db });
        }
    }

    /// A clone (or a recycle) ended. On success it joins the ready queue (or goes straight
    /// to a waiter) if it is of its template's current version; otherwise it is dropped. When
    /// a clone fails the template's waiters get the error and its clones pause briefly, so a
    /// full disk does not turn into a busy loop; a failed recycle only replaces its database.
    pub fn clone_finished(
        &mut self,
        template: &TemplateName,
        template_db: &DbName,
        clone: DbName,
        outcome: Result<Made, SqlError>,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let started = match self.dbs.get(&clone).map(|db| &db.phase) {
            Some(Phase::Making { started }) => *started,
            // No job of ours was making it (a report of a record that is gone).
            _ => {
                self.dispatch(now, &mut actions);
                return actions;
            }
        };
        let Some(entry) = self.templates.get_mut(template) else {
            self.dbs.queue_drop(clone, template, 0);
            self.dispatch(now, &mut actions);
            return actions;
        };
        let current = entry.current().is_some_and(|v| v.db == *template_db);
        if let (Some(started), true, true) = (started, current, outcome.is_ok()) {
            entry.demand.cloned(now.saturating_duration_since(started));
        }
        match outcome {
            // Made (or not: its template may be gone already) from a version replaced
            // meanwhile: nobody may lease it, and its fate is no news for today's waiters.
            _ if !current => self.dbs.queue_drop(clone, template, 0),
            Ok(made) => {
                entry.last_error = None;
                // An IntegreSQL test database given back unchanged is the next one out.
                let carries_id = self.dbs.get(&clone).is_some_and(|db| db.test_id.is_some());
                let phase = if carries_id {
                    self.dbs.ready_at_front()
                } else {
                    self.dbs.ready_at_back()
                };
                if let Some(db) = self.dbs.get_mut(&clone) {
                    db.phase = phase;
                    db.made = Some(made);
                }
                self.serve_waiters(template, now, &mut actions);
            }
            // A recycle (of a reused or adopted clone; they are not timed) that failed: the
            // database is replaced like any dropped one. Nothing says the template cannot be
            // cloned, so its waiters keep waiting for the replacement.
            Err(_) if started.is_none() => self.dbs.queue_drop(clone, template, 0),
            Err(error) => {
                entry.clones_paused_until = Some(now + CLONE_RETRY_DELAY);
                for waiter in entry.waiters.drain(..) {
                    actions.push(Action::Fail {
                        waiter: waiter.id,
                        error: LeaseError::CloneFailed {
                            template: template.clone(),
                            message: error.message.clone(),
                            cause: error.kind,
                        },
                    });
                }
                entry.last_error = Some(error.message.clone());
                // The failed CREATE may have left files behind; dropping is harmless if not.
                self.drop_after_failed_create(clone, template, &error);
            }
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// A drop ended. A failed one is tried again with back-off; until it succeeds its
    /// database still counts (and shows in `/status`).
    pub fn drop_finished(
        &mut self,
        db: &DbName,
        outcome: Result<(), SqlError>,
        now: Instant,
    ) -> Vec<Action> {
        self.dbs.drop_ended(db, outcome, now);
        let mut actions = Vec::new();
        self.dispatch(now, &mut actions);
        actions
    }
}
