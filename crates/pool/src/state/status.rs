//! What the pool reports about itself: per-template counts for `/status`, the open
//! leases, readiness, and what a server that outlives us keeps at shutdown. All of it is
//! derived from the records on each call.

use tokio::time::Instant;

use super::dbs::Phase;
use super::lifecycle::{Build, Lifecycle};
use super::owner::Owner;
use super::{PoolState, Server};
use crate::error::LeaseError;
use crate::names::{DbName, LeaseId, TemplateName};
use crate::types::{DropStatus, LimitStatus, Readiness, TemplateStatus};

/// An open lease as `/status` shows it.
#[derive(Debug, Clone)]
pub(crate) struct OpenLease {
    pub id: LeaseId,
    pub template: TemplateName,
    pub database: DbName,
    pub expires_at: Instant,
    pub label: Option<String>,
}

impl PoolState {
    /// The error for a request naming a template that does not exist, listing the
    /// templates pglease builds (client-built ones are named by a hash nobody types).
    pub fn unknown_template(&self, template: TemplateName) -> LeaseError {
        LeaseError::UnknownTemplate {
            template,
            known: self
                .templates
                .iter()
                .filter(|(_, entry)| !entry.is_client_built())
                .map(|(name, _)| name.clone())
                .collect(),
        }
    }

    /// One template's counts, if it exists.
    pub fn status_of(&self, template: &TemplateName) -> Option<TemplateStatus> {
        let entry = self.templates.get(template)?;
        let in_use = self.connections_in_use();
        Some(self.status_entry(template, entry, self.dbs.counts(template), in_use))
    }

    /// Per-template counts for `/status`.
    pub fn template_status(&self) -> Vec<TemplateStatus> {
        let counts = self.dbs.all_counts();
        let in_use = self.connections_in_use();
        self.templates
            .iter()
            .map(|(name, entry)| {
                let count = counts.get(name).copied().unwrap_or_default();
                self.status_entry(name, entry, count, in_use)
            })
            .collect()
    }

    /// The limits requests meet: the connection budget and its use, and what was refused
    /// by which limit since the start.
    pub fn limit_status(&self) -> LimitStatus {
        LimitStatus {
            connection_budget: self.connection_budget,
            connections_in_use: self.connections_in_use(),
            refused: self.refused.clone(),
            reclaimed: self.reclaimed,
            abandoned: self.abandoned,
            expired: self.expired,
            kept: self.dbs.kept().len(),
            reused_unchanged: self.proven.unchanged,
            replaced_changed: self.proven.changed,
            replaced_unstamped: self.proven.unstamped,
            byte_budget: self.limits.max_bytes,
            logical_bytes: self.logical_bytes(),
            store_bytes: self.store_used(),
            lease_max_bytes: self.lease_max_bytes(),
            exceeded_max_bytes: self.exceeded_max_bytes,
            last_exceeded_max_bytes: self.last_exceeded_max_bytes.clone(),
        }
    }

    /// A released clone of `template` was put to the proof (`--reuse-unchanged`): it held,
    /// or not.
    pub fn count_proof(&mut self, template: &TemplateName, unchanged: bool) {
        if let Some(entry) = self.templates.get_mut(template) {
            entry.proofs.record(unchanged);
        }
        if unchanged {
            self.proven.unchanged += 1;
        } else {
            self.proven.changed += 1;
        }
    }

    fn status_entry(
        &self,
        name: &TemplateName,
        entry: &super::lifecycle::TemplateEntry,
        counts: super::dbs::Counts,
        in_use: u32,
    ) -> TemplateStatus {
        TemplateStatus {
            name: name.clone(),
            fingerprint: entry.current().map(|v| v.fingerprint.clone()),
            version: entry.version,
            build_ms: entry
                .last_build
                .as_ref()
                .map(|b| b.elapsed.as_millis() as u64),
            size_bytes: entry.last_build.as_ref().map(|b| b.size_bytes),
            built_at: entry.last_build.as_ref().map(|b| b.built_at),
            state: entry.state_name(),
            ready: counts.ready,
            leased: counts.leased,
            in_progress: counts.making,
            // A grant whose own connection limit is being set still keeps its caller
            // waiting (it is no lease yet in `lease_list`).
            waiting: entry.waiters.len()
                + self
                    .dbs
                    .leases()
                    .filter(|(_, db, record)| db.template == *name && record.pending.is_some())
                    .count(),
            blocked_by: self.blocked_by(name, in_use, counts).map(|b| b.name()),
            last_error: entry.last_error.clone(),
            unwatched: entry.source().watches_nothing(),
            postgres_version: None,
            progress: None,
        }
    }

    /// Databases on their way out, and how many of them failed to drop at least once
    /// (retried with back-off until they go).
    pub fn drop_status(&self) -> DropStatus {
        let (pending, failed, last_error) = self.dbs.dropping();
        DropStatus {
            pending,
            failed,
            last_error,
        }
    }

    /// Open leases, soonest expiry first.
    pub fn lease_list(&self) -> Vec<OpenLease> {
        let mut list: Vec<OpenLease> = self
            .dbs
            .leases()
            .filter(|(_, _, record)| record.pending.is_none())
            .map(|(database, db, record)| OpenLease {
                id: record.id.clone(),
                template: db.template.clone(),
                database: database.clone(),
                expires_at: record.expires_at,
                label: record.label.clone(),
            })
            .collect();
        list.sort_by_key(|lease| lease.expires_at);
        list
    }

    /// Whether the pool can serve what it was configured with: postgres up, `default`
    /// built, no template configured at start failed (its sources missing or unreadable,
    /// or its last build failed) or being built again after a failure, and with
    /// `prebuild` each of them built once.
    pub fn readiness(&self) -> Readiness {
        let mut failed_templates = Vec::new();
        let mut building_templates = Vec::new();
        for (name, entry) in &self.templates {
            let Lifecycle::Configured(configured) = &entry.lifecycle else {
                continue;
            };
            if configured.owner != Owner::Operator {
                continue;
            }
            match configured.build {
                Build::Failed => failed_templates.push((
                    name.clone(),
                    entry
                        .last_error
                        .clone()
                        .unwrap_or_else(|| "its build failed".into()),
                )),
                // Built again after a failure (its sources changed, or a lease asked): not
                // ready until that build succeeds.
                Build::Building { .. } if entry.last_error.is_some() => {
                    building_templates.push(name.clone())
                }
                // Built once in this run is enough: an evicted or rebuilding template
                // serves again at the next lease.
                Build::Idle | Build::Building { .. } if self.prebuild && entry.version == 0 => {
                    building_templates.push(name.clone())
                }
                Build::Idle | Build::Building { .. } | Build::Ready(_) => {}
            }
        }
        Readiness {
            postgres_up: self.server_is_up(),
            default_template_ready: self.ready_for_default(),
            failed_templates,
            building_templates,
        }
    }

    /// Postgres is up and the `default` template is built.
    pub fn ready_for_default(&self) -> bool {
        self.server == Server::Up
            && self
                .templates
                .get(&TemplateName::default_name())
                .is_some_and(|e| e.current().is_some())
    }

    /// Whether `db` is being made (cloned or recycled) now.
    pub fn is_being_made(&self, db: &DbName) -> bool {
        self.dbs
            .get(db)
            .is_some_and(|d| matches!(d.phase, Phase::Making { .. }))
    }

    /// Whether `template_db` is the current version of `template`.
    pub fn is_current(&self, template: &TemplateName, template_db: &DbName) -> bool {
        self.templates
            .get(template)
            .and_then(|e| e.current())
            .is_some_and(|v| v.db == *template_db)
    }

    /// What a server that outlives us keeps and loses at shutdown: ready clones of built
    /// versions (template, fingerprint, clone) to adopt next time, and the clones that must
    /// go (leased ones, whose holders may still use them, and those on their way out).
    pub fn clones_at_shutdown(&self) -> (Vec<(TemplateName, String, DbName)>, Vec<DbName>) {
        let mut keep = Vec::new();
        let mut lose = Vec::new();
        for (name, db) in self.dbs.iter() {
            match &db.phase {
                Phase::Ready { .. } => {
                    let version = self
                        .templates
                        .get(&db.template)
                        .and_then(|e| e.current())
                        .filter(|v| Some(&v.db) == db.made_from.as_ref());
                    match version {
                        Some(version) => keep.push((
                            db.template.clone(),
                            version.fingerprint.clone(),
                            name.clone(),
                        )),
                        None => lose.push(name.clone()),
                    }
                }
                Phase::Leased(_) | Phase::Kept(_) | Phase::Dropping(_) => lose.push(name.clone()),
                // Still marked from the run that left them; a clone being made is swept
                // by the next start.
                Phase::Adoptable { .. } | Phase::Making { .. } => {}
            }
        }
        (keep, lose)
    }
}
