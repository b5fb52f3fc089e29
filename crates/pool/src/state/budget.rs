//! The byte budget: what templates and clones hold, and making room for a clone a request
//! waits for by evicting what nobody waits for (kept databases, then ready clones of the
//! least recently leased templates, then idle configured template versions, never `default`).

use tokio::time::Instant;

use super::dbs::Phase;
use super::lifecycle::{Build, Lifecycle};
use super::{Action, PoolState};
use crate::error::LeaseError;
use crate::names::TemplateName;

impl PoolState {
    /// Bytes of template databases and clones this pool holds as postgres counts them (a
    /// clone counts as large as the version it was made from; databases queued for dropping
    /// no longer count, those whose drop failed still do).
    pub(super) fn logical_bytes(&self) -> u64 {
        let templates: u64 = self
            .templates
            .values()
            .map(|e| e.version_size() * e.template_dbs().len() as u64)
            .sum();
        templates + self.dbs.bytes()
    }

    /// What the byte budget is judged by: on a store where clones share their template's
    /// blocks, the store's own usage as last measured (templates, and what tests wrote);
    /// elsewhere [`Self::logical_bytes`].
    pub(super) fn bytes_in_use(&self) -> u64 {
        self.store_used.unwrap_or_else(|| self.logical_bytes())
    }

    /// Whether `more` bytes (a clone's or a version's size) fit the budget. A new clone on
    /// a store that shares blocks takes next to nothing: only the measured usage counts.
    pub(super) fn fits(&self, more: u64) -> bool {
        let more = if self.store_used.is_some() { 0 } else { more };
        self.limits
            .max_bytes
            .is_none_or(|budget| self.bytes_in_use() + more <= budget)
    }

    /// The copy-on-write store's usage, measured by the actor after each job (`None`: the
    /// server's clones copy their template).
    pub fn store_usage(&mut self, used: Option<u64>) {
        self.store_used = used;
    }

    /// The store's usage as last measured, for `/status`.
    pub(super) fn store_used(&self) -> Option<u64> {
        self.store_used
    }

    /// Frees room for `needed` more bytes for `template`: first ready clones of other
    /// templates nobody waits for, least recently leased template first; then whole
    /// versions of idle templates (never `default`, which `/readyz` reports on).
    pub(super) fn make_room(&mut self, template: &TemplateName, needed: u64) {
        if self.store_used.is_some() {
            // Dropping a clone that shares its blocks frees what its tests wrote, which
            // nothing tells until the next measurement: evicting by the stale figure would
            // empty every other template's queue. Requests wait or get 507 instead.
            return;
        }
        // Databases kept for a look are the least needed: they go first, oldest first.
        self.evict_kept(needed);
        for name in self.eviction_order(template, false) {
            while !self.fits(needed) {
                let Some(db) = self.dbs.ready_back(&name) else {
                    break;
                };
                tracing::info!(template = %name, database = %db, "evicting a ready clone to make room");
                self.dbs.queue_drop(db, &name, 0);
            }
        }
        for name in self.eviction_order(template, true) {
            if self.fits(needed) {
                return;
            }
            let Some(entry) = self.templates.get_mut(&name) else {
                continue;
            };
            let size = entry.version_size();
            let Lifecycle::Configured(configured) = &mut entry.lifecycle else {
                continue;
            };
            if let Build::Ready(version) = std::mem::replace(&mut configured.build, Build::Idle) {
                tracing::info!(template = %name, database = %version.db, "evicting an idle template version to make room");
                entry.wanted = false;
                for db in self.dbs.of(&name, |p| matches!(p, Phase::Ready { .. })) {
                    self.dbs.queue_drop(db, &name, 0);
                }
                self.dbs.queue_drop(version.db, &name, size);
            }
        }
    }

    /// Templates other than `template` that nobody waits for, least recently leased first;
    /// with `only_idle`, only built configured ones with nothing leased or being made,
    /// never `default`.
    fn eviction_order(&self, template: &TemplateName, only_idle: bool) -> Vec<TemplateName> {
        let counts = self.dbs.all_counts();
        let mut names: Vec<(Option<Instant>, TemplateName)> = self
            .templates
            .iter()
            .filter(|(name, e)| *name != template && e.waiters.is_empty())
            .filter(|(name, e)| {
                let count = counts.get(*name).copied().unwrap_or_default();
                !only_idle
                    || (**name != TemplateName::default_name()
                        // Nothing could rebuild a client's template.
                        && matches!(
                            &e.lifecycle,
                            Lifecycle::Configured(c) if matches!(c.build, Build::Ready(_))
                        )
                        && count.leased == 0
                        && count.making == 0)
            })
            .map(|(name, e)| (e.last_used, name.clone()))
            .collect();
        names.sort();
        names.into_iter().map(|(_, name)| name).collect()
    }

    /// Tells `template`'s waiters that their clone cannot fit in the byte budget.
    pub(super) fn fail_for_space(
        &mut self,
        template: &TemplateName,
        needed: u64,
        actions: &mut Vec<Action>,
    ) {
        let (in_use, budget) = (
            self.bytes_in_use(),
            self.limits.max_bytes.unwrap_or(u64::MAX),
        );
        let Some(entry) = self.templates.get_mut(template) else {
            return;
        };
        for waiter in entry.waiters.drain(..) {
            self.refused.byte_budget += 1;
            actions.push(Action::Fail {
                waiter: waiter.id,
                error: LeaseError::OutOfSpace {
                    template: template.clone(),
                    needed,
                    in_use,
                    budget,
                },
            });
        }
    }
}
