//! The actor's worker jobs: each runs slow SQL (a build, a clone, a recycle, a drop) on a
//! task of its own with the session of the current server generation, and reports back as
//! a [`JobResult`], which the loop applies to the state (`reports.rs`).

use super::backend::{Backend, Monitor};
use super::client;
use super::start::{Target, Up};
use super::{not_running, Actor};
use crate::config::TemplateSource;
use crate::error::{StartError, TemplateOpError};
use crate::names::{DbName, LeaseId, TemplateName};
use crate::session::{NotReused, Stamp};
use crate::sql_error::SqlError;
use crate::state::{Built, Made};
use crate::template::{self, SourceStamp};

/// A worker's report: what it did, and the server generation it did it against. Reports
/// of an earlier generation describe a server that is gone, and are not applied.
pub(super) struct Report {
    pub(super) generation: u64,
    pub(super) result: JobResult,
}

/// Results of worker tasks.
pub(super) enum JobResult {
    /// The databases' tmpfs filled: every database's size, to name the biggest.
    SpaceFilled {
        sizes: Result<Vec<(String, i64)>, SqlError>,
    },
    /// The leased databases were measured for `--lease-max-bytes`: each lease, the
    /// database it held and its size (a database gone meanwhile is left out); and the
    /// reclaimable leases' databases looked at for sessions: each lease, its database and
    /// whether it had one, in a look begun at `since`.
    LeaseSizes {
        sizes: Result<Vec<(LeaseId, DbName, u64)>, SqlError>,
        sessions: Result<Vec<(LeaseId, DbName, bool)>, SqlError>,
        since: tokio::time::Instant,
    },
    Built {
        template: TemplateName,
        /// The sources' stamp, taken before they were hashed.
        stamp: SourceStamp,
        outcome: Result<Built, SqlError>,
    },
    /// A clone made, or a reused one recycled: `Ok` carries its role's new password and
    /// what it is now (when released clones are proven unchanged).
    Cloned {
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        outcome: Result<Made, SqlError>,
        /// For a released clone put to the proof: whether it held.
        proven: Option<bool>,
    },
    Dropped {
        db: DbName,
        outcome: Result<(), SqlError>,
    },
    /// A lease's own connection limit was set (or not); the lease can go out.
    LimitSet {
        lease_id: LeaseId,
        outcome: Result<(), SqlError>,
    },
    ServerUp {
        target: Box<Target>,
        outcome: Box<Result<Up, StartError>>,
    },
    /// A client-built template's empty database made: `Ok` carries its role's password.
    Opened {
        template: TemplateName,
        db: DbName,
        outcome: Result<String, SqlError>,
    },
    /// A client-built template finalized.
    Finalized {
        template: TemplateName,
        db: DbName,
        outcome: Result<Built, SqlError>,
    },
    /// Sessions counted on a test database a client gives back.
    SessionsCounted {
        give_back: Box<client::GiveBack>,
        outcome: Result<i64, TemplateOpError>,
    },
    /// A second look at a server whose monitor connection closed: `Ok` is a new monitor.
    Probed {
        outcome: Result<Box<dyn Monitor>, SqlError>,
    },
    /// The sources of `template` were checked (off the actor: it is file I/O) for lease
    /// requests that wait on the answer.
    SourcesChecked {
        template: TemplateName,
        changed: bool,
        /// The stamp seen, to remember when the sources were touched but not changed.
        stamp: SourceStamp,
        /// The fingerprint of the version the check compared against.
        fingerprint: String,
    },
    /// The status line of the running postmaster's `postmaster.pid` was read (off the
    /// actor: it is file I/O): `None` when there is none to read.
    PostmasterStatus { status: Option<String> },
    /// A new connection to the external server was tried: `Some` is postgres' refusal as
    /// it shuts down (SQLSTATE 57P03).
    ExternalRefuses { refusal: Option<String> },
    /// The sources of a failed template were looked at (`PoolState::look_at_failed_sources`).
    FailedSourcesChecked {
        template: TemplateName,
        /// Their stamp moved since the failure.
        changed: bool,
    },
}

/// `clone`'s stamp, when the session proves released clones unchanged; a clone that cannot
/// be stamped is simply never proven (its release drops it).
pub(super) async fn stamp_of(
    session: &dyn Backend,
    clone: &DbName,
    previous: Option<Stamp>,
) -> Option<Stamp> {
    if !session.proves_unchanged() {
        return None;
    }
    // After a recycle that proved nothing, from what it was when last made ready, where
    // the session can carry that forward (`Session::restamp`).
    let stamped = match previous {
        Some(previous) => session.restamp(clone, previous).await,
        None => session.stamp(clone).await,
    };
    match stamped {
        Ok(stamp) => Some(stamp),
        // Whatever failed (`StampError`: a query, with its SQLSTATE, or the listing), only
        // this clone goes unproven: a lost server or a full disk is met, and decided on, by
        // the jobs that need the server, not by a stamp.
        Err(error) => {
            tracing::debug!(database = %clone, %error, "cannot stamp a clone; its release will drop it");
            None
        }
    }
}

impl Actor {
    /// Sets a granted lease's own connection limit in a worker; the grant goes out when it
    /// is reported ([`PoolState::limit_set`](crate::state::PoolState::limit_set)).
    pub(super) fn spawn_set_limit(
        &mut self,
        lease_id: LeaseId,
        database: DbName,
        connections: u32,
    ) {
        self.spawn_job(move |session| async move {
            let outcome = match session {
                Some(session) => session.set_connection_limit(&database, connections).await,
                None => Err(not_running()),
            };
            JobResult::LimitSet { lease_id, outcome }
        });
    }

    /// Runs `work` on a worker task with the session of the current server generation
    /// (None while postgres is down) and reports the result it builds back to the actor,
    /// tagged with that generation.
    pub(super) fn spawn_job<F, Fut>(&mut self, work: F)
    where
        F: FnOnce(Option<std::sync::Arc<dyn Backend>>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = JobResult> + Send + 'static,
    {
        let (generation, jobs, session) = (
            self.state.generation(),
            self.jobs_tx.clone(),
            self.backend.clone(),
        );
        self.tracker.spawn(async move {
            let result = work(session).await;
            let _ = jobs.send(Report { generation, result });
        });
    }

    pub(super) fn spawn_build(
        &mut self,
        template: TemplateName,
        source: TemplateSource,
        reuse_existing: bool,
    ) {
        tracing::info!(template = %template, ?source, "building template");
        let user = self.inputs.child_user.clone();
        self.spawn_job(move |session| async move {
            let stamp = if source.names_files() {
                let stamp_source = source.clone();
                user.read(move || template::stamp(&stamp_source))
                    .await
                    .unwrap_or_default()
            } else {
                template::stamp(&source)
            };
            let outcome = match session {
                Some(session) => session.build(&template, &source, reuse_existing).await,
                None => Err(not_running()),
            };
            JobResult::Built {
                template,
                stamp,
                outcome,
            }
        });
    }

    /// Says so when a big template was built where every clone copies it: the store of
    /// `--storage cow` would share its blocks, and `auto` takes it at a start that knows
    /// the template's size (from its sources or a snapshot).
    pub(super) fn suggest_store(&self, template: &TemplateName, size_bytes: i64) {
        let big = u64::try_from(size_bytes)
            .is_ok_and(|bytes| bytes >= crate::postgres::AUTO_MIN_TEMPLATE_BYTES);
        if big && self.store.is_none() && !self.external {
            tracing::info!(
                template = %template,
                size_mb = size_bytes >> 20,
                "every clone of this template copies it; on PostgreSQL 18, --storage cow \
                 would share its blocks (--storage auto does at a start that knows its size: \
                 from its sources or a snapshot; docs/cow-storage.md)"
            );
        }
    }

    /// Whether a client built `template` (IntegreSQL API). Their clones get postgres'
    /// standard SCRAM iteration count: those clients' Go drivers refuse fewer.
    pub(super) fn is_client_built(&self, template: &TemplateName) -> bool {
        self.state
            .source_of(template)
            .is_some_and(|source| source.is_client_built())
    }

    pub(super) fn spawn_clone(
        &mut self,
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        stamp: bool,
    ) {
        let standard_scram = self.is_client_built(&template);
        self.spawn_job(move |session| async move {
            let started = std::time::Instant::now();
            let Some(session) = session else {
                return JobResult::Cloned {
                    template,
                    template_db,
                    clone,
                    outcome: Err(not_running()),
                    proven: None,
                };
            };
            let outcome = match session
                .clone_database(&template_db, &clone, standard_scram)
                .await
            {
                Ok(password) => Ok(Made {
                    password,
                    stamp: match stamp {
                        true => stamp_of(&*session, &clone, None).await,
                        false => None,
                    },
                }),
                Err(error) => Err(error),
            };
            tracing::debug!(database = %clone, elapsed_ms = started.elapsed().as_millis() as u64, ok = outcome.is_ok(), "clone finished");
            JobResult::Cloned {
                template,
                template_db,
                clone,
                outcome,
                proven: None,
            }
        });
    }

    /// Readies a clone for its next holder: after a `reuse` release or an adoption, or —
    /// `verify` — after a release the server must prove changed nothing, with the stamp
    /// taken when it was made ready (none: unsure, so changed). Without `verify`, that
    /// stamp is where the next one starts from.
    pub(super) fn spawn_recycle(
        &mut self,
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        verify: bool,
        stamp: Option<Stamp>,
    ) {
        let standard_scram = self.is_client_built(&template);
        self.spawn_job(move |session| async move {
            let proof = stamp.as_ref().filter(|_| verify);
            let outcome = match (session.as_ref(), verify, proof) {
                (None, _, _) => Err(NotReused::Failed(not_running())),
                (Some(_), true, None) => Err(NotReused::Changed(
                    "nothing recorded what it was when handed out".into(),
                )),
                (Some(session), _, proof) => session.recycle(&clone, standard_scram, proof).await,
            };
            let stamp = match (&outcome, session.as_ref()) {
                // Proven unchanged: what it was is what it is.
                (Ok(_), Some(_)) if verify => stamp,
                (Ok(_), Some(session)) => stamp_of(&**session, &clone, stamp).await,
                _ => None,
            };
            let (outcome, proven) = match outcome {
                Ok(password) => (Ok(Made { password, stamp }), verify.then_some(true)),
                Err(NotReused::Changed(why)) => (Err(SqlError::other(why)), Some(false)),
                // The recycle's own failure keeps its kind: a server lost meanwhile is
                // not the clone's fault.
                Err(NotReused::Failed(error)) => (Err(error), None),
            };
            JobResult::Cloned {
                template,
                template_db,
                clone,
                outcome,
                proven,
            }
        });
    }

    pub(super) fn spawn_drop(&mut self, db: DbName) {
        self.spawn_job(move |session| async move {
            let started = std::time::Instant::now();
            let outcome = match session {
                Some(session) => session.drop_database(&db).await,
                None => Err(not_running()),
            };
            tracing::debug!(database = %db, elapsed_ms = started.elapsed().as_millis() as u64, "drop finished");
            JobResult::Dropped {
                db,
                outcome,
            }
        });
    }
}
