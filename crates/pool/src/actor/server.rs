//! Watching the server: noticing a dead postmaster, one that is shutting down (a SIGTERM
//! or `pg_ctl stop` that did not come from us; for an external server, one that refuses
//! new connections as it shuts down), or a lost connection (with a second look before
//! declaring it lost), bringing it back, and taking it in when it is up.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::backend::Monitor;
use super::jobs::{JobResult, Report};
use super::start::{bring_up, Up};
use super::{not_running, Actor, POSTGRES_STOP_TIMEOUT};
use crate::sql_error::SqlError;
use crate::state::Built;

/// How often the postmaster's status line is read. A server in smart shutdown keeps its
/// sessions (the monitor's too) and refuses every new connection, so leases granted on it
/// fail: half a second bounds how many, for the price of reading 100 bytes from tmpfs.
const POSTMASTER_STATUS_INTERVAL: Duration = Duration::from_millis(500);
/// How often an external server is asked for a new connection. It has no status line we
/// can read, and in smart shutdown it keeps our sessions: only a new connection tells, with
/// 57P03. A login a second is cheap for a server tests use, and bounds how many leases are
/// granted that nobody can use.
const EXTERNAL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

impl Actor {
    /// Reads how much the copy-on-write store holds, for the byte budget (a `statvfs` of a
    /// file system in RAM: no I/O waits on it).
    pub(super) fn measure_store(&mut self) {
        let Some((store, base)) = &self.store else {
            return;
        };
        match crate::postgres::used_bytes(store) {
            Ok(used) => self.state.store_usage(Some(used.saturating_sub(*base))),
            Err(error) => {
                tracing::debug!(store = %store.display(), %error, "cannot measure the copy-on-write store");
            }
        }
    }

    pub(super) fn server_came_up(&mut self, up: Up) {
        let clones_share = up
            .backend
            .settings()
            .iter()
            .any(|(name, value)| name == "file_copy_method" && value == "clone");
        // The base is what the store held before the cluster was put there, so that the
        // templates of a snapshot (or a kept cluster) count. Without one (its statvfs
        // failed) the budget stays by logical sizes, which only overcounts.
        self.store = up
            .running
            .as_ref()
            .filter(|_| clones_share && !self.external)
            .and_then(|running| {
                Some((
                    running.data_dir.parent()?.to_path_buf(),
                    running.store_base?,
                ))
            });
        if let Some((store, _)) = &self.store {
            tracing::info!(store = %store.display(), "clones share their template's blocks: the byte budget counts what the store holds");
        }
        self.measure_store();
        self.state.space_at(
            up.running
                .as_ref()
                .and_then(|running| running.databases_space.clone()),
        );
        self.watch_space();
        let (adoptable, client_templates) = (up.adoptable, up.client_templates);
        self.backend = Some(up.backend);
        self.running = up.running;
        self.monitor = Some(up.monitor);
        let budget = self.backend.as_ref().map_or(0, |s| s.connection_budget());
        tracing::info!(
            connection_budget = budget,
            "connections available to lease holders"
        );
        self.state.names_taken(up.others_integresql_names);
        let mut actions = self.state.server_up(budget);
        // Client-built templates the server kept come back as built, after their ready
        // clones are queued for adoption.
        let restored: Vec<_> = client_templates
            .into_iter()
            .filter(|(template, db, _)| self.state.restore_client_built(template, db))
            .collect();
        for (template, fingerprint, clone) in adoptable {
            self.state.adopt(&template, fingerprint, clone);
        }
        let now = Instant::now();
        for (template, db, size_bytes) in restored {
            let built = Built {
                fingerprint: template.to_string(),
                db,
                elapsed: Duration::ZERO,
                size_bytes,
                built_at: SystemTime::now(),
            };
            let db = built.db.clone();
            actions.extend(
                self.state
                    .template_finalized(&template, db, Ok(built), now)
                    .1,
            );
        }
        self.apply(actions);
    }

    /// Notices a dead postmaster or a lost connection, and retries a failed restart.
    pub(super) fn check_server(&mut self) {
        if self.state.is_stopping() {
            return;
        }
        let exited = self
            .running
            .as_mut()
            .and_then(|running| running.poll_exit());
        if let Some(status) = exited {
            let tail = self
                .running
                .as_ref()
                .map(|r| r.log_tail(10))
                .unwrap_or_default();
            tracing::error!(%status, log_tail = %tail, "postgres exited unexpectedly; restarting it");
            self.server_lost(format!("postgres exited unexpectedly ({status})"));
        } else if let Some(error) = self.state.probe_failure() {
            let reason = format!("the connection to postgres was lost ({error})");
            tracing::error!(%error, "lost the connection to postgres; reconnecting");
            self.server_lost(reason);
        } else if self.monitor.as_ref().is_some_and(|m| m.is_closed()) && self.state.begin_probe() {
            // A closed connection alone proves little: an external server's
            // idle_session_timeout or a proxy may end it while postgres runs on. Losing the
            // server drops every lease, so look once more before declaring it.
            tracing::warn!("the monitor connection to postgres closed; checking the server");
            self.spawn_job(move |session| async move {
                let outcome = match session {
                    Some(session) => session.probe().await,
                    None => Err(not_running()),
                };
                JobResult::Probed { outcome }
            });
        } else if self.state.restart_due(Instant::now()) {
            self.spawn_bring_up();
        } else if self.external {
            self.look_at_external_server();
        } else {
            self.look_at_postmaster_status();
        }
    }

    /// Reads the running postmaster's status line in a worker, at most every
    /// [`POSTMASTER_STATUS_INTERVAL`] and one read at a time.
    fn look_at_postmaster_status(&mut self) {
        let now = Instant::now();
        if self.shutdown_check_pending || now < self.shutdown_check_at {
            return;
        }
        let Some(data_dir) = self.running.as_ref().map(|r| r.data_dir.clone()) else {
            return;
        };
        self.shutdown_check_pending = true;
        self.shutdown_check_at = now + POSTMASTER_STATUS_INTERVAL;
        self.spawn_job(move |_| async move {
            let status =
                tokio::task::spawn_blocking(move || crate::postgres::postmaster_status(&data_dir))
                    .await
                    .ok()
                    .flatten();
            JobResult::PostmasterStatus { status }
        });
    }

    /// The postmaster's status line was read: a server that is stopping without our asking
    /// (someone's SIGTERM or `pg_ctl stop`) is taken back as after a loss. Left alone, a
    /// smart shutdown waits for every session to end, refusing every new connection, so
    /// leases would be granted that nobody can use, for as long as any lease is held.
    pub(super) fn postmaster_status_read(&mut self, status: Option<String>) {
        self.shutdown_check_pending = false;
        if self.state.is_stopping() || self.running.is_none() {
            return;
        }
        if status.as_deref() == Some("stopping") {
            let reason = "postgres is shutting down, asked by something other than pglease \
                          (a SIGTERM or pg_ctl stop; postmaster.pid says \"stopping\"): it \
                          refuses new connections";
            tracing::error!(
                pid = self.running.as_ref().map(|r| r.pid),
                "{reason}; stopping it fast and starting it again"
            );
            self.server_lost(reason.to_owned());
        }
    }

    /// Asks the external server for a new connection in a worker, at most every
    /// [`EXTERNAL_CHECK_INTERVAL`] and one at a time, while it is up.
    fn look_at_external_server(&mut self) {
        let now = Instant::now();
        if self.shutdown_check_pending || now < self.shutdown_check_at || self.backend.is_none() {
            return;
        }
        self.shutdown_check_pending = true;
        self.shutdown_check_at = now + EXTERNAL_CHECK_INTERVAL;
        self.spawn_job(move |session| async move {
            let refusal = match session {
                Some(session) => session.refuses_new_connections().await,
                None => None,
            };
            JobResult::ExternalRefuses { refusal }
        });
    }

    /// The external server was asked for a new connection: one that refuses it as it shuts
    /// down (someone's `pg_ctl stop -m smart`) keeps the sessions it has, ours too, so
    /// nothing else shows it; leases granted on it could not connect. It is let go as a lost
    /// one: no leases are granted, `/status` says why, and it is connected to again (it is
    /// not ours to restart) once it takes connections, after its restart. Letting go of our
    /// own sessions also lets its shutdown finish.
    pub(super) fn external_checked(&mut self, refusal: Option<String>) {
        self.shutdown_check_pending = false;
        if self.state.is_stopping() || !self.state.server_is_up() {
            return;
        }
        if let Some(refusal) = refusal {
            let reason = format!(
                "the external postgres server is shutting down: it refuses new connections \
                 ({refusal}); pglease connects again once it is back"
            );
            tracing::error!(%refusal, "the external postgres server is shutting down; letting it go until it takes connections again");
            self.server_lost(reason);
        }
    }

    /// The second look at the server ended: a new monitor connection, or the server is lost.
    pub(super) fn probed(&mut self, outcome: Result<Box<dyn Monitor>, SqlError>) {
        match outcome {
            Ok(monitor) => {
                tracing::info!("postgres still answers; watching it on a new connection");
                self.state.probe_ended(Ok(()));
                self.monitor = Some(monitor);
            }
            Err(error) => {
                // A killed postmaster closes its sockets (so its sessions end and new
                // connections are refused) a moment before it can be reaped. The next look
                // tells that exit, the cause, from a postmaster that is there but does not
                // answer. The state keeps only the words: it reports them, and decides by
                // nothing else (`state/server.rs`).
                self.state.probe_ended(Err(error.to_string()));
                if self.running.is_none() {
                    self.check_server();
                }
            }
        }
    }

    pub(super) fn server_lost(&mut self, reason: String) {
        self.store = None;
        let actions = self.state.server_lost(&reason);
        self.apply(actions);
        self.fail_client_work(&reason);
        self.backend = None;
        self.monitor = None;
        if let Some(running) = self.running.take() {
            // Already exited in the usual case; if it lingers, stop it before restarting.
            self.tracker.spawn(running.shutdown(POSTGRES_STOP_TIMEOUT));
        }
        self.spawn_bring_up();
    }

    pub(super) fn spawn_bring_up(&mut self) {
        let Some(target) = self.target.take() else {
            return;
        };
        // Templates registered at run time survive the sweep of a reconnected server too.
        self.inputs.templates = self.state.templates();
        let generation = self.state.generation();
        let inputs = self.inputs.clone();
        let jobs = self.jobs_tx.clone();
        self.tracker.spawn(async move {
            let (target, outcome) = bring_up(target, inputs).await;
            let result = JobResult::ServerUp {
                target: Box::new(target),
                outcome: Box::new(outcome),
            };
            let _ = jobs.send(Report { generation, result });
        });
    }
}
