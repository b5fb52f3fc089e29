//! Applying the workers' reports: [`handle_job`](Actor::handle_job) drops those of a server
//! generation that is gone (`stale_report` hands back what they hold) and gives each other
//! one to the state, with the log lines that explain it. Spawning the jobs is `jobs.rs`'s.

use std::time::SystemTime;

use tokio::time::Instant;

use super::jobs::{JobResult, Report};
use super::start::Up;
use super::{Actor, NOT_RUNNING, RESTART_BACKOFF};
use crate::error::{StartError, TemplateOpError};
use crate::names::{DbName, LeaseId, TemplateName};
use crate::sql_error::SqlError;
use crate::state::{Built, Made};
use crate::template::SourceStamp;

impl Actor {
    /// Applies a worker's report: to the state if it is of the current server generation
    /// (a few are applied whatever their generation), else as a stale one.
    pub(super) fn handle_job(&mut self, report: Report) {
        let now = Instant::now();
        let Report { generation, result } = report;
        if matches!(result, JobResult::LeaseSizes { .. }) {
            // Whatever its generation: the next measure may start (`measure_leases`).
            self.lease_sizes_ended(now);
        }
        if let JobResult::FailedSourcesChecked { template, changed } = result {
            self.failed_sources_checked(template, changed);
            self.check_invariants();
            return;
        }
        if generation != self.state.generation() {
            self.stale_report(result);
            return;
        }
        match result {
            JobResult::ServerUp { target, outcome } => {
                self.target = Some(*target);
                if self.state.is_stopping() {
                    return;
                }
                self.server_up_reported(*outcome, now);
            }
            JobResult::Built {
                template,
                stamp,
                outcome,
            } => self.build_reported(template, stamp, outcome, now),
            JobResult::Cloned {
                template,
                template_db,
                clone,
                outcome,
                proven,
            } => self.clone_reported(template, template_db, clone, outcome, proven, now),
            JobResult::Dropped { db, outcome } => self.drop_reported(db, outcome, now),
            JobResult::LimitSet { lease_id, outcome } => {
                self.limit_set_reported(lease_id, outcome, now)
            }
            JobResult::Opened {
                template,
                db,
                outcome,
            } => self.opened(template, db, outcome),
            JobResult::Finalized {
                template,
                db,
                outcome,
            } => self.finalized(template, db, outcome),
            JobResult::SessionsCounted { give_back, outcome } => {
                self.sessions_counted(*give_back, outcome);
            }
            JobResult::Probed { outcome } => self.probed(outcome),
            JobResult::PostmasterStatus { status } => self.postmaster_status_read(status),
            JobResult::ExternalRefuses { refusal } => self.external_checked(refusal),
            JobResult::SpaceFilled { sizes } => {
                let actions = self.state.space_filled(sizes, SystemTime::now(), now);
                self.apply(actions);
            }
            JobResult::LeaseSizes {
                sizes,
                sessions,
                since,
            } => self.lease_sizes_measured(sizes, sessions, since, now),
            // A look of the lost server's time is not applied: the state ended it then
            // (its waiters were failed), and a new look may be under way.
            JobResult::SourcesChecked {
                template,
                changed,
                stamp,
                fingerprint,
            } => self.sources_checked(template, changed, stamp, fingerprint),
            // Handled above, whatever its generation.
            JobResult::FailedSourcesChecked { .. } => {}
        }
        self.check_invariants();
    }

    /// A (re)start of postgres ended, the actor not stopping: the server is taken in, or
    /// the next attempt waits for the backoff.
    fn server_up_reported(&mut self, outcome: Result<Up, StartError>, now: Instant) {
        match outcome {
            Ok(up) => {
                tracing::info!(
                    restarts = self.state.server_history().0,
                    "postgres is back; rebuilding templates and pool"
                );
                self.server_came_up(up);
            }
            Err(error) => {
                tracing::error!(error = %error, retry_in_secs = RESTART_BACKOFF.as_secs(), "could not bring postgres back");
                self.state
                    .server_start_failed(error.to_string(), now + RESTART_BACKOFF);
            }
        }
    }

    /// A template build ended.
    fn build_reported(
        &mut self,
        template: TemplateName,
        stamp: SourceStamp,
        outcome: Result<Built, SqlError>,
        now: Instant,
    ) {
        match &outcome {
            Ok(built) => self.suggest_store(&template, built.size_bytes),
            Err(message) => {
                tracing::warn!(template = %template, error = %message, "template build failed");
            }
        }
        let actions = self.state.build_finished(&template, stamp, outcome, now);
        self.apply(actions);
    }

    /// A clone was made, or a released one put to the proof (`proven`): counted, logged as
    /// what it means (a changed clone is no failure), and given to the state.
    fn clone_reported(
        &mut self,
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        outcome: Result<Made, SqlError>,
        proven: Option<bool>,
        now: Instant,
    ) {
        if let Some(unchanged) = proven {
            match &outcome {
                Err(why) => {
                    tracing::debug!(database = %clone, %why, "released changed: dropped and made again")
                }
                Ok(_) => {
                    tracing::debug!(database = %clone, "released unchanged: back in the ready queue without a new clone")
                }
            }
            self.state.count_proof(&template, unchanged);
        }
        let outcome = match outcome {
            Ok(made) => Ok(made),
            // Changed: no failure, and nothing to warn about.
            Err(message) if proven == Some(false) => Err(message),
            Err(message) => {
                if self.state.is_current(&template, &template_db) {
                    tracing::warn!(template = %template, database = %clone, error = %message, "clone failed");
                } else {
                    // Its template version was replaced or discarded meanwhile (and
                    // perhaps dropped under it): expected, and dropped anyway.
                    tracing::debug!(template = %template, database = %clone, error = %message, "clone of a replaced version failed");
                }
                Err(message)
            }
        };
        self.recycled(&clone);
        let actions = self
            .state
            .clone_finished(&template, &template_db, clone, outcome, now);
        self.apply(actions);
    }

    /// A drop ended; a failed one is retried (the state's business).
    fn drop_reported(&mut self, db: DbName, outcome: Result<(), SqlError>, now: Instant) {
        if let Err(message) = &outcome {
            tracing::warn!(database = %db, error = %message, "drop failed; it is retried");
        }
        let actions = self.state.drop_finished(&db, outcome, now);
        self.apply(actions);
    }

    /// A lease's own connection limit was set, or could not be.
    fn limit_set_reported(
        &mut self,
        lease_id: LeaseId,
        outcome: Result<(), SqlError>,
        now: Instant,
    ) {
        if let Err(message) = &outcome {
            tracing::warn!(lease_id = %lease_id, error = %message, "could not set a lease's connection limit");
        }
        let actions = self.state.limit_set(&lease_id, outcome, now);
        self.apply(actions);
    }

    /// A report of a server generation that is gone: its work went with the server, but
    /// what it holds (the target, callers waiting for an answer) is handed back.
    pub(super) fn stale_report(&mut self, result: JobResult) {
        match result {
            JobResult::ServerUp { target, .. } => self.target = Some(*target),
            JobResult::SessionsCounted { give_back, .. } => self.sessions_counted(
                *give_back,
                Err(TemplateOpError::PostgresDown(NOT_RUNNING.into())),
            ),
            // Callers waiting on client-built templates and grants were told when the
            // server went (`PoolState::server_lost`, `fail_client_work`), which also set
            // the probe back to idle for the new generation.
            JobResult::PostmasterStatus { .. } | JobResult::ExternalRefuses { .. } => {
                self.shutdown_check_pending = false;
            }
            JobResult::Probed { .. }
            | JobResult::SpaceFilled { .. }
            | JobResult::LeaseSizes { .. }
            | JobResult::Built { .. }
            | JobResult::Cloned { .. }
            | JobResult::Dropped { .. }
            | JobResult::LimitSet { .. }
            | JobResult::Opened { .. }
            | JobResult::Finalized { .. }
            | JobResult::SourcesChecked { .. }
            | JobResult::FailedSourcesChecked { .. } => {}
        }
    }
}
