//! Databases kept after a failed test: a lease released with `keep` leaves its database as
//! the test left it, under the lease's id and credentials, for someone to open — bounded in
//! number (`max_kept`, the oldest goes first), in age (`max_keep`, then it is dropped) and
//! in bytes (kept databases are the first thing evicted when a clone needs room).

use std::time::Duration;

use tokio::time::Instant;

use super::dbs::{KeptRecord, Phase};
use super::{Action, PoolState};
use crate::error::LeaseOpError;
use crate::names::{DbName, LeaseId, TemplateName};

/// A kept database, for `GET /kept`.
#[derive(Debug, Clone)]
pub struct KeptEntry {
    pub id: LeaseId,
    pub template: TemplateName,
    pub database: DbName,
    /// The lease's password, which still opens it.
    pub password: String,
    pub label: Option<String>,
    pub kept_at: Instant,
    pub until: Instant,
    pub bytes: u64,
}

impl PoolState {
    /// Ends lease `id` but keeps its database for `wanted` (at most `max_keep`); answers
    /// how long it is kept. With `max_kept` databases kept already, the oldest is dropped.
    pub fn keep(
        &mut self,
        id: &LeaseId,
        wanted: Duration,
        now: Instant,
    ) -> (Result<Duration, LeaseOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let (database, label) = match self.dbs.lease(id) {
            // Not handed over yet: nobody can hold its id.
            Some((_, _, record)) if record.pending.is_some() => {
                return (Err(self.missing_lease(id)), actions)
            }
            Some((database, _, record)) => (database.clone(), record.label.clone()),
            None => return (Err(self.missing_lease(id)), actions),
        };
        if self.limits.max_kept == 0 {
            // Keeping is off (--max-kept 0): an ordinary release.
            let (outcome, actions) = self.release(id, false, now);
            return (outcome.map(|()| Duration::ZERO), actions);
        }
        let kept_for = wanted.min(self.limits.max_keep);
        if let Some(db) = self.dbs.get_mut(&database) {
            db.phase = Phase::Kept(Box::new(KeptRecord {
                id: id.clone(),
                label,
                kept_at: now,
                until: now + kept_for,
            }));
        }
        tracing::info!(lease_id = %id, database = %database, keep_secs = kept_for.as_secs(), "lease ended; database kept for a look");
        let kept = self.dbs.kept();
        let excess = kept.len().saturating_sub(self.limits.max_kept);
        let oldest: Vec<(DbName, TemplateName)> = kept
            .into_iter()
            .take(excess)
            .map(|(name, db, _)| (name.clone(), db.template.clone()))
            .collect();
        for (name, template) in oldest {
            tracing::info!(database = %name, max_kept = self.limits.max_kept, "dropping the oldest kept database: too many kept");
            self.dbs.queue_drop(name, &template, 0);
        }
        // Its place under max_total and its connections are free again.
        self.serve_all_waiters(now, &mut actions);
        self.dispatch(now, &mut actions);
        (Ok(kept_for), actions)
    }

    /// Drops the database kept under `id` now.
    pub fn drop_kept(
        &mut self,
        id: &LeaseId,
        now: Instant,
    ) -> (Result<(), LeaseOpError>, Vec<Action>) {
        let mut actions = Vec::new();
        let Some(database) = self.dbs.kept_db(id) else {
            return (Err(LeaseOpError::NotKept(id.to_string())), actions);
        };
        if let Some(template) = self.dbs.get(&database).map(|db| db.template.clone()) {
            self.dbs.queue_drop(database, &template, 0);
        }
        self.dispatch(now, &mut actions);
        (Ok(()), actions)
    }

    /// Every kept database, oldest first.
    pub fn kept_list(&self) -> Vec<KeptEntry> {
        self.dbs
            .kept()
            .into_iter()
            .map(|(name, db, record)| KeptEntry {
                id: record.id.clone(),
                template: db.template.clone(),
                database: name.clone(),
                password: db
                    .made
                    .as_ref()
                    .map(|m| m.password.clone())
                    .unwrap_or_default(),
                label: record.label.clone(),
                kept_at: record.kept_at,
                until: record.until,
                bytes: db.bytes,
            })
            .collect()
    }

    /// Kept databases whose time is over go.
    pub(super) fn drop_expired_kept(&mut self, now: Instant) {
        let over: Vec<(DbName, TemplateName)> = self
            .dbs
            .kept()
            .into_iter()
            .filter(|(_, _, record)| record.until <= now)
            .map(|(name, db, _)| (name.clone(), db.template.clone()))
            .collect();
        for (name, template) in over {
            tracing::info!(database = %name, "keep over; dropping the kept database");
            self.dbs.queue_drop(name, &template, 0);
        }
    }

    /// When the next kept database is due to go.
    pub(super) fn next_kept_expiry(&self) -> Option<Instant> {
        self.dbs.kept().iter().map(|(_, _, r)| r.until).min()
    }

    /// Drops kept databases, oldest first, until `needed` more bytes fit.
    pub(super) fn evict_kept(&mut self, needed: u64) {
        for (name, template) in self
            .dbs
            .kept()
            .into_iter()
            .map(|(name, db, _)| (name.clone(), db.template.clone()))
            .collect::<Vec<_>>()
        {
            if self.fits(needed) {
                return;
            }
            tracing::info!(database = %name, "evicting a kept database to make room");
            self.dbs.queue_drop(name, &template, 0);
        }
    }
}
