//! Lease requests and what answers them: the look at a template's sources before a
//! request is served, grants handed to their callers, and the views of the pool for
//! `/status` and `/kept`.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::jobs::JobResult;
use super::{Actor, LeaseReply};
use crate::config::TemplateSource;
use crate::error::LeaseError;
use crate::names::{LeaseId, TemplateName};
use crate::state::{Action, Grant, WaiterId};
use crate::template::{self, SourceStamp};
use crate::types::{
    ConnectInfo, KeptDatabase, Lease, LeaseRequest, LeaseSummary, PostgresStatus, StatusReport,
};

/// How often the sources of failed templates are looked at (`PoolState::look_at_failed_sources`):
/// a stat per file, a second after the fix at most.
pub(super) const FAILED_SOURCES_EVERY: Duration = Duration::from_secs(1);

impl Actor {
    pub(super) fn drop_cancelled_waiters(&mut self) {
        let cancelled: Vec<WaiterId> = self
            .waiters
            .iter()
            .filter(|(_, reply)| reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for waiter in cancelled {
            self.waiters.remove(&waiter);
            self.state.cancel_waiter(waiter);
        }
    }

    /// Sends a granted lease to its waiter; if nobody is listening any more, returns the
    /// actions that put the database back.
    pub(super) fn send_lease(&mut self, waiter: WaiterId, grant: Grant) -> Option<Vec<Action>> {
        let lease_id = grant.lease_id.clone();
        let (Some(reply), Some(session)) = (self.waiters.remove(&waiter), self.backend.as_ref())
        else {
            return Some(self.state.grant_undelivered(&lease_id, Instant::now()));
        };
        let span =
            tracing::info_span!("lease", lease_id = %lease_id, fingerprint = %grant.fingerprint);
        let _entered = span.enter();
        let lease = Lease {
            id: grant.lease_id,
            template: grant.template,
            fingerprint: grant.fingerprint,
            connect: ConnectInfo {
                host: session.lease_host().to_owned(),
                port: session.lease_port(),
                // Each clone's role is named like its database.
                user: grant.database.as_str().to_owned(),
                password: grant.password,
                database: grant.database,
                ssl: session.ssl(),
            },
            expires_at: SystemTime::now() + grant.ttl,
            number: grant.number,
            local_socket: session.local_socket().map(ToOwned::to_owned),
        };
        let (template, database) = (lease.template.clone(), lease.connect.database.clone());
        match reply.send(Ok(lease)) {
            Ok(()) => {
                tracing::info!(template = %template, database = %database, ttl_secs = grant.ttl.as_secs(), label = grant.label.as_deref().unwrap_or(""), "lease granted");
                None
            }
            Err(_) => {
                tracing::info!(database = %database, "client went away before its lease was delivered; database returned to the pool");
                Some(self.state.grant_undelivered(&lease_id, Instant::now()))
            }
        }
    }

    /// A lease request. A template built from files has its sources checked first — a
    /// stat call per file, the hash only when a stamp moved — so that an edit followed at
    /// once by a lease is seen. The check is file I/O and runs in a worker, not on the
    /// actor (which would stall every other lease and release); requests for the same
    /// template that arrive meanwhile wait for the same check.
    pub(super) fn lease(&mut self, request: LeaseRequest, reply: LeaseReply) {
        if let (Some(asked), Some(session)) = (request.postgres_version, &self.backend) {
            let minor = pglease_binaries::parse_version_number(session.version())
                .and_then(|(_, minor)| minor);
            if !asked.matches(session.pg_major(), minor) {
                let _ = reply.send(Err(LeaseError::VersionNotServed {
                    template: request.template.clone(),
                    asked: asked.to_string(),
                    serving: session.version().to_owned(),
                }));
                return;
            }
        }
        let template = request.template.clone();
        if self.state.is_checking_sources(&template) {
            // A look is under way: the request waits for it in the state, as a waiter.
            self.request_lease(request, reply);
            return;
        }
        let watched = self.state.watch(&template);
        let source = self
            .state
            .source_of(&template)
            .filter(|s| !matches!(s, TemplateSource::Empty | TemplateSource::Client));
        let major = self.backend.as_ref().map(|s| s.pg_major());
        let (Some((stamp, fingerprint)), Some(source), Some(major)) = (watched, source, major)
        else {
            self.request_lease(request, reply);
            return;
        };
        // The state holds the request (it counts against --max-waiting and shows in
        // /status) and serves it once the look has ended.
        let started = self.state.begin_sources_check(&template);
        self.request_lease(request, reply);
        if !started {
            return;
        }
        let user = self.inputs.child_user.clone();
        self.spawn_job(move |_| async move {
            let seen = fingerprint.clone();
            // With the child user's rights: the sources may be a caller's.
            let checked = user
                .read(move || {
                    let now = template::stamp(&source);
                    if now == stamp {
                        return (false, now);
                    }
                    // Touched but unchanged keeps the version (and the new stamp).
                    let changed = template::fingerprint(&source, major).map_or(true, |f| f != seen);
                    (changed, now)
                })
                .await;
            // A check that could not run says nothing changed; the next lease checks again.
            let (changed, stamp) = checked.unwrap_or_default();
            JobResult::SourcesChecked {
                template,
                changed,
                stamp,
                fingerprint,
            }
        });
    }

    /// The sources of `template` were checked: a change builds a new version, then the
    /// requests that waited for the check are handled.
    pub(super) fn sources_checked(
        &mut self,
        template: TemplateName,
        changed: bool,
        stamp: SourceStamp,
        fingerprint: String,
    ) {
        let actions =
            self.state
                .sources_checked(&template, changed, stamp, &fingerprint, Instant::now());
        self.apply(actions);
    }

    /// Looks (off the actor, at most every [`FAILED_SOURCES_EVERY`]) whether the sources
    /// of failed configured templates changed since they failed.
    pub(super) fn look_at_failed_sources(&mut self) {
        let now = Instant::now();
        if now < self.failed_sources_at {
            return;
        }
        self.failed_sources_at = now + FAILED_SOURCES_EVERY;
        for (template, source, stamp) in self.state.look_at_failed_sources() {
            let user = self.inputs.child_user.clone();
            self.spawn_job(move |_| async move {
                // With the child user's rights: the sources may be a caller's.
                let changed = user
                    .read(move || template::stamp(&source) != stamp)
                    .await
                    .unwrap_or(false);
                JobResult::FailedSourcesChecked { template, changed }
            });
        }
    }

    /// The sources of a failed template were looked at: when they changed, it is built
    /// again (the fix, or the next mistake, shows without waiting for a lease).
    pub(super) fn failed_sources_checked(&mut self, template: TemplateName, changed: bool) {
        let actions = self
            .state
            .failed_sources_looked(&template, changed, Instant::now());
        self.apply(actions);
    }

    /// Parks the reply and asks the state for a lease.
    pub(super) fn request_lease(&mut self, request: LeaseRequest, reply: LeaseReply) {
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.insert(waiter, reply);
        let actions = self.state.request_lease(
            waiter,
            LeaseId::random(self.server),
            &request,
            Instant::now(),
        );
        self.apply(actions);
    }

    pub(super) fn status(&self) -> StatusReport {
        let session = self.backend.as_ref();
        let state = if self.state.is_stopping() {
            "stopping"
        } else if self.state.server_is_up() {
            "running"
        } else {
            "restarting"
        };
        let now = Instant::now();
        let wall_now = SystemTime::now();
        StatusReport {
            postgres: PostgresStatus {
                storage: self.running.as_ref().map(|r| r.storage.clone()),
                state,
                external: self.external,
                version: session.map(|s| s.version().to_owned()),
                pid: self.running.as_ref().map(|r| r.pid),
                data_dir: self.running.as_ref().map(|r| r.data_dir.clone()),
                host: session.map(|s| s.lease_host().to_owned()),
                port: session.map(|s| s.lease_port()),
                settings: session.map(|s| s.settings().to_vec()).unwrap_or_default(),
                restarts: self.state.server_history().0,
                last_error: self.state.server_history().1.map(str::to_owned),
                admin_timeouts: session.map_or(0, |s| s.admin_timeouts()),
                databases_space: self.state.space_status(),
            },
            templates: self
                .state
                .template_status()
                .into_iter()
                .map(|mut template| {
                    template.progress = session.and_then(|s| s.build_progress(&template.name));
                    template
                })
                .collect(),
            leases: self
                .state
                .lease_list()
                .into_iter()
                .map(|lease| LeaseSummary {
                    id: lease.id,
                    template: lease.template,
                    database: lease.database,
                    expires_at: wall_now + lease.expires_at.saturating_duration_since(now),
                    label: lease.label,
                })
                .collect(),
            drops: self.state.drop_status(),
            limits: self.state.limit_status(),
            servers: Vec::new(),
        }
    }

    /// The kept databases with what opens them (none while postgres is down: they went
    /// with it).
    pub(super) fn kept(&self) -> Vec<KeptDatabase> {
        let Some(session) = self.backend.as_ref() else {
            return Vec::new();
        };
        let (now, wall_now) = (Instant::now(), SystemTime::now());
        let wall = |at: Instant| {
            if at >= now {
                wall_now + (at - now)
            } else {
                wall_now - (now - at)
            }
        };
        self.state
            .kept_list()
            .into_iter()
            .map(|kept| KeptDatabase {
                id: kept.id,
                template: kept.template,
                connect: ConnectInfo {
                    host: session.lease_host().to_owned(),
                    port: session.lease_port(),
                    user: kept.database.as_str().to_owned(),
                    password: kept.password,
                    database: kept.database,
                    ssl: session.ssl(),
                },
                label: kept.label,
                kept_at: wall(kept.kept_at),
                expires_at: wall(kept.until),
                size_bytes: kept.bytes,
            })
            .collect()
    }
}
