//! Configured templates: registering one at run time (the operator's are changed only by
//! whom their owner lets, `owner.rs`), rebuilding a version when its sources change, a
//! build that ended; and what both lifecycles do when a version is ready (adopting ready
//! clones an earlier run left of it).

use std::collections::HashMap;

use tokio::time::Instant;

use super::dbs::{Db, Phase};
use super::lifecycle::{Build, Configured, Lifecycle, TemplateEntry, Version};
use super::owner::{Changer, Owner};
use super::{Action, Built, PoolState, Server};
use crate::config::{TemplateConfig, TemplateSource};
use crate::error::LeaseError;
use crate::names::{DbName, TemplateName};
use crate::sql_error::{SqlError, SqlErrorKind};
use crate::template::SourceStamp;

/// What registering a template at run time did (`PoolHandle::register`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// A new template.
    Created,
    /// An existing template got a new source (a new version follows).
    Replaced,
    /// The template already had this source.
    Unchanged,
}

impl PoolState {
    /// Adds a template at run time, or gives an existing one a new source: its current
    /// version is then replaced as if its sources had changed. Built on first lease.
    /// `default` and templates clients build have no source to replace; the operator's
    /// templates change only for the configuration and token holders ([`Owner::lets`]),
    /// even to the same source, so that a caller learns nothing of them by trying.
    pub fn register(
        &mut self,
        name: TemplateName,
        source: TemplateSource,
        changer: Changer,
        now: Instant,
    ) -> Result<(Registered, Vec<Action>), LeaseError> {
        if name == TemplateName::default_name() {
            return Err(LeaseError::Internal(
                "the default template cannot be replaced".into(),
            ));
        }
        let Some(entry) = self.templates.get_mut(&name) else {
            let owner = Owner::of_new(changer);
            self.templates
                .insert(name, TemplateEntry::configured(source, false, owner));
            return Ok((Registered::Created, Vec::new()));
        };
        let Lifecycle::Configured(configured) = &mut entry.lifecycle else {
            return Err(LeaseError::ClientBuilt(name));
        };
        if !configured.owner.lets(changer) {
            return Err(LeaseError::ConfiguredTemplate(name));
        }
        if changer == Changer::Configuration {
            // The configuration names a template registered over HTTP before: it is the
            // operator's from now on.
            configured.owner = Owner::Operator;
        }
        if configured.source == source {
            return Ok((Registered::Unchanged, Vec::new()));
        }
        configured.source = source;
        let actions = if matches!(configured.build, Build::Ready(_)) {
            self.rebuild(&name, now)
        } else {
            // Idle or failed: the next lease builds the new source. A build in flight uses
            // the old one; the next lease sees the change and rebuilds.
            Vec::new()
        };
        Ok((Registered::Replaced, actions))
    }

    /// A rebuild asked for over the API (or by the configuration at start): unknown and
    /// client-built templates are refused (a client's template has no sources here), and
    /// so are the operator's unless `changer` may change them (a new version drops every
    /// ready clone, which is the operator's call); see [`PoolState::rebuild`].
    pub fn request_rebuild(
        &mut self,
        template: &TemplateName,
        changer: Changer,
        now: Instant,
    ) -> Result<Vec<Action>, LeaseError> {
        match self.templates.get(template).map(|entry| &entry.lifecycle) {
            None => Err(self.unknown_template(template.clone())),
            Some(Lifecycle::Client(_)) => Err(LeaseError::ClientBuilt(template.clone())),
            Some(Lifecycle::Configured(configured)) if !configured.owner.lets(changer) => {
                Err(LeaseError::ConfiguredTemplate(template.clone()))
            }
            Some(Lifecycle::Configured(_)) => Ok(self.rebuild(template, now)),
        }
    }

    /// Every template's name and current source.
    pub fn templates(&self) -> Vec<TemplateConfig> {
        self.templates
            .iter()
            .map(|(name, entry)| TemplateConfig {
                name: name.clone(),
                source: entry.source(),
                postgres_version: None,
            })
            .collect()
    }

    /// The current source of a template.
    pub fn source_of(&self, name: &TemplateName) -> Option<TemplateSource> {
        self.templates.get(name).map(TemplateEntry::source)
    }

    /// A configured template's sources were found missing or unreadable before any build
    /// (the check at start, `template::check_source`): it is failed with that reason, as
    /// a build would have been, so that `/status` and readiness say so at once. A template
    /// being built or built is left alone: that build's outcome says more.
    pub fn sources_unusable(
        &mut self,
        template: &TemplateName,
        message: String,
        sources: SourceStamp,
    ) {
        let Some(entry) = self.templates.get_mut(template) else {
            return;
        };
        let Lifecycle::Configured(configured) = &mut entry.lifecycle else {
            return;
        };
        if matches!(configured.build, Build::Idle | Build::Failed) {
            configured.build = Build::Failed;
            configured.sources = Some(sources);
            entry.last_error = Some(message);
        }
    }

    /// The sources and fingerprint of `template`'s current version, when it is a built
    /// configured template: a lease request looks whether they changed.
    pub fn watch(&self, template: &TemplateName) -> Option<(SourceStamp, String)> {
        match &self.templates.get(template)?.lifecycle {
            Lifecycle::Configured(configured) => configured.watch(),
            Lifecycle::Client(_) => None,
        }
    }

    /// [`PoolState::watch`] of every template that has one.
    pub fn watches(&self) -> HashMap<TemplateName, (SourceStamp, String)> {
        self.templates
            .iter()
            .filter_map(|(name, entry)| match &entry.lifecycle {
                Lifecycle::Configured(configured) => {
                    configured.watch().map(|watch| (name.clone(), watch))
                }
                Lifecycle::Client(_) => None,
            })
            .collect()
    }

    /// The failed configured templates whose sources nobody is looking at, with the
    /// stamp they failed with; each is marked looked at until
    /// [`PoolState::failed_sources_looked`].
    pub fn look_at_failed_sources(&mut self) -> Vec<(TemplateName, TemplateSource, SourceStamp)> {
        let mut due = Vec::new();
        for (name, entry) in &mut self.templates {
            let Lifecycle::Configured(configured) = &mut entry.lifecycle else {
                continue;
            };
            if let (Build::Failed, Some(stamp), false) = (
                &configured.build,
                &configured.sources,
                configured.looking_at_failed,
            ) {
                configured.looking_at_failed = true;
                due.push((name.clone(), configured.source.clone(), stamp.clone()));
            }
        }
        due
    }

    /// A look at a failed template's sources ended: when they `changed`, it is built again
    /// (the fix, or the next mistake, shows without waiting for a lease).
    pub fn failed_sources_looked(
        &mut self,
        template: &TemplateName,
        changed: bool,
        now: Instant,
    ) -> Vec<Action> {
        let Some(Lifecycle::Configured(configured)) =
            self.templates.get_mut(template).map(|e| &mut e.lifecycle)
        else {
            return Vec::new();
        };
        configured.looking_at_failed = false;
        if !changed || !matches!(configured.build, Build::Failed) {
            return Vec::new();
        }
        tracing::info!(template = %template, "the sources of a failed template changed; building it again");
        self.rebuild(template, now)
    }

    /// Whether a look at `template`'s sources is under way.
    pub fn is_checking_sources(&self, template: &TemplateName) -> bool {
        self.templates
            .get(template)
            .is_some_and(|entry| entry.checking_sources)
    }

    /// A lease request of `template` wants its sources looked at: its waiters wait for the
    /// look. True when this starts one (the caller runs it and reports `sources_checked`),
    /// false when one is under way already or the template is unknown.
    pub fn begin_sources_check(&mut self, template: &TemplateName) -> bool {
        match self.templates.get_mut(template) {
            Some(entry) if !entry.checking_sources => {
                entry.checking_sources = true;
                true
            }
            _ => false,
        }
    }

    /// The look at `template`'s sources ended: if they `changed`, a new version is built
    /// first (its waiters then wait for it); then its waiters are served.
    /// The look saw `sources` (of the version of `fingerprint`): touched but unchanged
    /// sources are remembered, so the next look pays no hash.
    pub fn sources_checked(
        &mut self,
        template: &TemplateName,
        changed: bool,
        sources: SourceStamp,
        fingerprint: &str,
        now: Instant,
    ) -> Vec<Action> {
        let Some(entry) = self.templates.get_mut(template) else {
            return Vec::new();
        };
        if !entry.checking_sources {
            // Not this server's look (it was lost meanwhile): nothing waits for it.
            return Vec::new();
        }
        entry.checking_sources = false;
        if let Lifecycle::Configured(configured) = &mut entry.lifecycle {
            let same_version = configured
                .watch()
                .is_some_and(|(_, current)| current == fingerprint);
            if !changed && same_version {
                configured.sources = Some(sources);
            }
        }
        if changed {
            tracing::info!(template = %template, "template sources changed; building a new version");
        }
        let mut actions = if changed {
            self.rebuild(template, now)
        } else {
            Vec::new()
        };
        self.serve_waiters(template, now, &mut actions);
        self.dispatch(now, &mut actions);
        actions
    }

    /// Whether a configured template's last build failed (or its sources were unusable at
    /// start): the actor then watches its sources' stamp and rebuilds when they move.
    #[cfg(test)]
    pub fn has_failed(&self, template: &TemplateName) -> bool {
        matches!(
            self.templates.get(template).map(|e| &e.lifecycle),
            Some(Lifecycle::Configured(Configured {
                build: Build::Failed,
                ..
            }))
        )
    }

    /// The template's sources changed (or a rebuild was asked for): build a new version.
    /// The old version's ready clones are dropped now, its leased ones when released, and
    /// its template database once the new build ends. Unknown and client-built templates
    /// are ignored.
    pub fn rebuild(&mut self, template: &TemplateName, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.server != Server::Up {
            return actions;
        }
        let Some(entry) = self.templates.get_mut(template) else {
            return actions;
        };
        let Lifecycle::Configured(configured) = &mut entry.lifecycle else {
            return actions;
        };
        let previous = match std::mem::replace(&mut configured.build, Build::Idle) {
            Build::Building { previous } => {
                // A build runs already; it stays.
                configured.build = Build::Building { previous };
                return actions;
            }
            Build::Ready(version) => Some(version.db),
            Build::Idle | Build::Failed => None,
        };
        actions.push(configured.start_build(template, previous, self.verify_templates));
        entry.wanted = true;
        for db in self.dbs.of(template, |p| matches!(p, Phase::Ready { .. })) {
            self.dbs.queue_drop(db, template, 0);
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// A build of a configured template ended: with the new version, or an error message.
    /// `sources` is their stamp, taken before the build hashed them.
    pub fn build_finished(
        &mut self,
        template: &TemplateName,
        sources: SourceStamp,
        outcome: Result<Built, SqlError>,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(entry) = self.templates.get_mut(template) else {
            return actions;
        };
        let size = entry.version_size();
        let previous = match &mut entry.lifecycle {
            Lifecycle::Configured(Configured {
                build: Build::Building { previous },
                ..
            }) => previous.take(),
            // No build of it was running: a report nobody asked for changes nothing.
            Lifecycle::Configured(_) | Lifecycle::Client(_) => return actions,
        };
        // The build found a complete template database that is on its way out (an evicted
        // version built again before its drop ran): a queued drop is called off; a running
        // one cannot be, so the build starts over and builds afresh once it is gone.
        if let Ok(built) = &outcome {
            match self.dbs.get(&built.db).map(|db| &db.phase) {
                Some(Phase::Dropping(super::dbs::Dropping::Running { .. })) => {
                    if let Some(Lifecycle::Configured(configured)) =
                        self.templates.get_mut(template).map(|e| &mut e.lifecycle)
                    {
                        actions.push(configured.start_build(
                            template,
                            previous,
                            self.verify_templates,
                        ));
                    }
                    return actions;
                }
                Some(_) => {
                    self.dbs.remove(&built.db);
                }
                None => {}
            }
        }
        if !self.templates.contains_key(template) {
            return actions;
        }
        match outcome {
            Ok(built) => self.version_built(template, built, sources, previous, size, &mut actions),
            // The connection went away mid-build (the server stopped, or someone ended the
            // session), or postgres had no connection slot for it (53300): no fault of the
            // sources.
            Err(error)
                if matches!(
                    error.kind,
                    SqlErrorKind::ConnectionLost | SqlErrorKind::TooManyConnections
                ) =>
            {
                self.build_not_to_blame(template, error, previous, size, &mut actions)
            }
            Err(error) => self.build_broke(template, error, sources, previous, size, &mut actions),
        }
        self.dispatch(now, &mut actions);
        actions
    }

    /// A build made `built`: the previous version (of `size` bytes) goes when it is another
    /// database, and the new one is the template's, stamped with the `sources` it was built
    /// from.
    fn version_built(
        &mut self,
        template: &TemplateName,
        built: Built,
        sources: SourceStamp,
        previous: Option<DbName>,
        size: u64,
        actions: &mut Vec<Action>,
    ) {
        if let Some(old) = previous.filter(|old| *old != built.db) {
            self.dbs.queue_drop(old, template, size);
        }
        if let Some(Lifecycle::Configured(configured)) =
            self.templates.get_mut(template).map(|e| &mut e.lifecycle)
        {
            configured.build = Build::Ready(Version {
                fingerprint: built.fingerprint.clone(),
                db: built.db.clone(),
            });
            configured.sources = Some(sources);
        }
        let size = built.size_bytes;
        self.version_ready(template, built, actions);
        self.warn_if_clones_cannot_fit(template, size);
    }

    /// A build failed through no fault of its sources (`error` is a lost connection or no
    /// connection slot): its waiters hear the server's trouble or the connection budget's
    /// (503, retry), and the template is not marked failed: the next request builds it
    /// again.
    fn build_not_to_blame(
        &mut self,
        template: &TemplateName,
        error: SqlError,
        previous: Option<DbName>,
        size: u64,
        actions: &mut Vec<Action>,
    ) {
        if let Some(old) = previous {
            self.dbs.queue_drop(old, template, size);
        }
        let Some(entry) = self.templates.get_mut(template) else {
            return;
        };
        for waiter in entry.waiters.drain(..) {
            actions.push(Action::Fail {
                waiter: waiter.id,
                error: not_the_sources(template, &error),
            });
        }
        entry.last_error = Some(error.message);
        if let Lifecycle::Configured(configured) = &mut entry.lifecycle {
            configured.build = Build::Idle;
        }
    }

    /// A build failed (its sources, or a full disk): its waiters hear why, and the
    /// template is failed until its `sources` change or a request asks again.
    fn build_broke(
        &mut self,
        template: &TemplateName,
        error: SqlError,
        sources: SourceStamp,
        previous: Option<DbName>,
        size: u64,
        actions: &mut Vec<Action>,
    ) {
        // A stale version must not hide a broken migration: it goes too.
        if let Some(old) = previous {
            self.dbs.queue_drop(old, template, size);
        }
        for db in self
            .dbs
            .of(template, |p| matches!(p, Phase::Adoptable { .. }))
        {
            self.dbs.queue_drop(db, template, 0);
        }
        self.build_failed(template, error.message, error.kind, actions);
        if let Some(Lifecycle::Configured(configured)) =
            self.templates.get_mut(template).map(|e| &mut e.lifecycle)
        {
            // As the failed build saw them: a fix moves their stamp.
            configured.build = Build::Failed;
            configured.sources = Some(sources);
        }
    }

    /// Fails `template`'s waiters with the build error, and remembers it.
    pub(super) fn build_failed(
        &mut self,
        template: &TemplateName,
        message: String,
        cause: SqlErrorKind,
        actions: &mut Vec<Action>,
    ) {
        let Some(entry) = self.templates.get_mut(template) else {
            return;
        };
        for waiter in entry.waiters.drain(..) {
            actions.push(Action::Fail {
                waiter: waiter.id,
                error: LeaseError::BuildFailed {
                    template: template.clone(),
                    message: message.clone(),
                    cause,
                },
            });
        }
        entry.last_error = Some(message);
    }

    /// A version of `template` is ready (its lifecycle already says so): count it, and
    /// recycle the ready clones an earlier run left of this very version (new password),
    /// as far as `max_total` and the byte budget allow; the others go.
    pub(super) fn version_ready(
        &mut self,
        template: &TemplateName,
        built: Built,
        actions: &mut Vec<Action>,
    ) {
        let Some(entry) = self.templates.get_mut(template) else {
            return;
        };
        entry.version += 1;
        entry.last_error = None;
        entry.last_build = Some(built.clone());
        let size = entry.version_size();
        for clone in self
            .dbs
            .of(template, |p| matches!(p, Phase::Adoptable { .. }))
        {
            let same_version = matches!(
                self.dbs.get(&clone).map(|db| &db.phase),
                Some(Phase::Adoptable { fingerprint }) if *fingerprint == built.fingerprint
            );
            let room = self.dbs.counts(template).total() < self.limits.max_total;
            if same_version && room && self.fits(size) {
                if let Some(db) = self.dbs.get_mut(&clone) {
                    db.made_from = Some(built.db.clone());
                    db.bytes = size;
                    db.phase = Phase::Making { started: None };
                }
                actions.push(Action::Recycle {
                    template: template.clone(),
                    template_db: built.db.clone(),
                    clone,
                    verify: false,
                    stamp: None,
                });
            } else {
                self.dbs.queue_drop(clone, template, 0);
            }
        }
        if !self.fits(0) {
            self.make_room(template, 0);
        }
    }

    /// A ready clone an earlier run left on the server: it rejoins the pool (with a new
    /// password) once its template's current version is built with the same fingerprint,
    /// and is dropped otherwise.
    pub fn adopt(&mut self, template: &TemplateName, fingerprint: String, clone: DbName) {
        let waiting_for_build = self
            .templates
            .get(template)
            .is_some_and(|e| e.current().is_none());
        if waiting_for_build {
            self.dbs.insert(
                clone,
                Db {
                    template: template.clone(),
                    made_from: None,
                    bytes: 0,
                    test_id: None,
                    made: None,
                    phase: Phase::Adoptable { fingerprint },
                },
            );
        } else {
            self.dbs.queue_drop(clone, template, 0);
        }
    }

    /// Says at build time, before the clone storm, when a template's `min_ready` clones
    /// cannot fit in the byte budget beside what is held now (a big dump, a small tmpfs):
    /// requests would otherwise meet it one 507 at a time.
    fn warn_if_clones_cannot_fit(&self, template: &TemplateName, size: i64) {
        let (Some(budget), Ok(size)) = (self.limits.max_bytes, u64::try_from(size)) else {
            return;
        };
        let in_use = self.bytes_in_use();
        let wanted = size.saturating_mul(self.limits.min_ready.max(1) as u64);
        if in_use.saturating_add(wanted) > budget {
            let fit = budget.saturating_sub(in_use) / size.max(1);
            tracing::warn!(
                template = %template,
                size_bytes = size,
                in_use_bytes = in_use,
                budget_bytes = budget,
                min_ready = self.limits.min_ready,
                clones_that_fit = fit,
                "template {template} is {} MB: {} clones of it do not fit in the byte budget \
                 ({} of {} MB in use); only {fit} will — raise --max-bytes (or the tmpfs) or \
                 lower --min-ready",
                size / 1_000_000,
                self.limits.min_ready.max(1),
                in_use / 1_000_000,
                budget / 1_000_000,
            );
        }
    }
}

/// What the waiters of a build that failed through no fault of its sources hear: the
/// server's trouble when the connection was lost (`postgres_unavailable`), the connection
/// budget's when postgres had no slot for the build's connection (`too_many_connections`).
fn not_the_sources(template: &TemplateName, error: &SqlError) -> LeaseError {
    if error.kind == SqlErrorKind::TooManyConnections {
        LeaseError::BuildFailed {
            template: template.clone(),
            message: format!(
                "postgres has no connection slot for the build: {}",
                error.message
            ),
            cause: SqlErrorKind::TooManyConnections,
        }
    } else {
        LeaseError::PostgresDown(format!(
            "the connection was lost while template \"{template}\" was being built: {}",
            error.message
        ))
    }
}
