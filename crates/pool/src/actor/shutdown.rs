//! Stopping: answering everyone waiting, letting the workers finish, writing a snapshot
//! when one is due, and stopping postgres.

use std::time::Duration;

use tokio::sync::mpsc;

use super::backend::Backend;
use super::jobs::{JobResult, Report};
use super::start::Target;
use super::{Actor, POSTGRES_STOP_TIMEOUT};
use crate::child_user::ReadAsError;
use crate::names::TemplateName;
use crate::postgres::snapshot::Manifest;
use crate::template;

impl Actor {
    /// Waits (a bounded time) for the workers to finish, applying their reports, so that
    /// what they made is known before the server is left behind or saved.
    pub(super) async fn drain_workers(&mut self, jobs: &mut mpsc::UnboundedReceiver<Report>) {
        let tracker = self.tracker.clone();
        let drain = async {
            loop {
                tokio::select! {
                    () = tracker.wait() => break,
                    Some(result) = jobs.recv() => self.handle_job(result),
                }
            }
        };
        if tokio::time::timeout(POSTGRES_STOP_TIMEOUT, drain)
            .await
            .is_err()
        {
            tracing::warn!("workers still busy at shutdown; the next start sweeps what they leave");
        }
        while let Ok(result) = jobs.try_recv() {
            self.handle_job(result);
        }
    }

    /// Each configured template's current fingerprint, a built one's taken from its watch
    /// while its sources' stamp has not moved (`template::current_versions`); in a worker,
    /// as file I/O never runs on the actor.
    pub(super) async fn current_versions(
        &self,
        pg_major: u32,
    ) -> Result<Vec<(TemplateName, String)>, ReadAsError> {
        let templates = self.inputs.templates.clone();
        let known = self.state.watches();
        self.inputs
            .child_user
            .read(move || template::current_versions(&templates, pg_major, &known))
            .await
    }

    /// The templates a snapshot written at this stop holds, with everything else dropped
    /// from the server; `None` when no snapshot is to be written (the one it started from
    /// is up to date, no template is built, or the server failed us).
    pub(super) async fn ready_snapshot(&self, session: &dyn Backend) -> Option<Manifest> {
        let Some(Target::Embedded(embedded)) = &self.target else {
            return None;
        };
        let outcome = async {
            // Without them every template would look stale and be cleared.
            let current = self
                .current_versions(session.pg_major())
                .await
                .map_err(|e| e.to_string())?;
            // Only logged: nothing decides by the kind of a failure here.
            let templates = session
                .snapshot_templates(&current)
                .await
                .map_err(|e| e.to_string())?;
            let Some(manifest) = embedded.snapshot_plan(templates) else {
                return Ok(None);
            };
            session
                .clear_for_snapshot(current)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(Some(manifest))
        };
        outcome.await.unwrap_or_else(|message| {
            tracing::warn!(error = %message, "could not ready the cluster for a snapshot; none is written");
            None
        })
    }

    pub(super) async fn shutdown(&mut self, jobs: &mut mpsc::UnboundedReceiver<Report>) {
        tracing::info!("pool stopping");
        let actions = self.state.stopping();
        self.apply(actions);
        self.tracker.close();
        // A server that outlives us (external, or a kept data directory): templates stay for
        // reuse, ready clones stay marked for adoption, the rest is dropped. Clones still
        // being made are waited for first, or they would outlive us unseen.
        if self.server_outlives_us {
            self.drain_workers(jobs).await;
            if let Some(session) = self.backend.clone() {
                // Ready clones stay, marked, for the next run to adopt; the rest go.
                let (keep, lose) = self.state.clones_at_shutdown();
                for (template, fingerprint, db) in keep {
                    if let Err(message) = session.mark_ready(&template, &fingerprint, &db).await {
                        tracing::warn!(database = %db, error = %message, "could not mark a ready clone; dropping it");
                        let _ = session.drop_database(&db).await;
                    }
                }
                for db in lose {
                    if let Err(message) = session.drop_database(&db).await {
                        tracing::warn!(database = %db, error = %message, "could not drop a clone at shutdown");
                    }
                }
            }
        }
        // --snapshot-dir: only the configured templates stay, for the snapshot written once
        // postgres has stopped.
        let mut snapshot = None;
        if let (Some(Target::Embedded(embedded)), Some(session)) =
            (&self.target, self.backend.clone())
        {
            if embedded.saves_snapshots() {
                self.drain_workers(jobs).await;
                snapshot = self.ready_snapshot(&*session).await;
            }
        }
        // A (re)start in flight holds the target; wait for it so its postgres is stopped too.
        while self.target.is_none() {
            match tokio::time::timeout(Duration::from_secs(60), jobs.recv()).await {
                Ok(Some(Report {
                    result: JobResult::ServerUp { target, outcome },
                    ..
                })) => {
                    self.target = Some(*target);
                    if let Ok(up) = *outcome {
                        self.running = up.running;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.backend = None;
        self.monitor = None;
        let mut cluster = None;
        if let Some(running) = self.running.take() {
            cluster = Some(running.data_dir.clone());
            running.shutdown(POSTGRES_STOP_TIMEOUT).await;
        }
        // Workers fail fast once postgres is gone; give them a moment to finish.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.tracker.wait()).await;
        if let Some(Target::Embedded(embedded)) = self.target.take() {
            let _ = tokio::task::spawn_blocking(move || {
                // Only a cluster postgres stopped cleanly (no postmaster.pid left) is saved.
                let stopped = cluster.filter(|dir| !dir.join("postmaster.pid").exists());
                if let (Some(manifest), Some(cluster)) = (snapshot, stopped) {
                    embedded.save_snapshot(&cluster, &manifest);
                }
                embedded.cleanup();
            })
            .await;
        }
        tracing::info!("pool stopped");
    }
}
