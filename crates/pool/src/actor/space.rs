//! The actor's watch on the databases' tmpfs (`postgres/space.rs`): it measures the space
//! and, when the state says it just filled, asks postgres which database holds the most
//! (`state/space.rs` keeps what was found). It also measures the open leases' databases
//! for `--lease-max-bytes` (`state/lease_bytes.rs` decides what to end).

use std::time::SystemTime;

use tokio::time::Instant;

use super::backend::Backend;
use super::{not_running, Actor, JobResult};
use crate::names::{DbName, LeaseId};
use crate::sql_error::SqlError;

impl Actor {
    /// Measures the databases' tmpfs (a `statvfs` in RAM); on the step to full, asks
    /// postgres for every database's size.
    pub(super) fn watch_space(&mut self) {
        let Some(path) = self.state.space_path() else {
            return;
        };
        let Ok(stats) = nix::sys::statvfs::statvfs(path) else {
            return;
        };
        let bytes = stats.blocks() * stats.fragment_size();
        let free_bytes = stats.blocks_available() * stats.fragment_size();
        if self.state.space_measured(bytes, free_bytes) {
            self.spawn_job(|session| async move {
                JobResult::SpaceFilled {
                    sizes: match session {
                        Some(session) => session.database_sizes().await,
                        None => Err(not_running()),
                    },
                }
            });
        }
    }
}

impl Actor {
    /// Measures every open lease's database for `--lease-max-bytes`, and looks for sessions
    /// on the IntegreSQL test databases (which of them the pool may recreate to make room
    /// without ending a running test: `state/expiry.rs`), in a worker, at each liveness
    /// tick (250 ms) while there is anything to look at and no look is under way: a holder
    /// on tmpfs writes about 1 GB/s, so a quarter second past the limit is what it gets. One
    /// query sizes them all (`Session::sizes_of`), about 3 ms a database on a busy 2-core
    /// machine (about 120 ms for 50 leases), and one finds the sessions
    /// (`Session::with_sessions`), so after a look the next waits three times as long as it
    /// took: at most a quarter of one backend's time goes to looking, however many leases
    /// are open.
    pub(super) fn measure_leases(&mut self) {
        let now = Instant::now();
        if self.lease_sizes_started.is_some()
            || now < self.lease_sizes_after
            || self.backend.is_none()
        {
            return;
        }
        let leases = self.state.leases_to_measure();
        let reclaimable = self.state.leases_to_look_at();
        if leases.is_empty() && reclaimable.is_empty() {
            return;
        }
        self.lease_sizes_started = Some(now);
        self.spawn_job(move |session| async move {
            let Some(session) = session else {
                return JobResult::LeaseSizes {
                    sizes: Err(not_running()),
                    sessions: Err(not_running()),
                    since: now,
                };
            };
            JobResult::LeaseSizes {
                sizes: sizes_of(session.as_ref(), leases).await,
                sessions: sessions_on(session.as_ref(), reclaimable).await,
                since: now,
            }
        });
    }

    /// A measure ended (or its report was of an earlier server): the next may start after
    /// three times its length.
    pub(super) fn lease_sizes_ended(&mut self, now: Instant) {
        if let Some(started) = self.lease_sizes_started.take() {
            self.lease_sizes_after = now + now.saturating_duration_since(started) * 3;
        }
    }

    /// The leased databases' sizes came back: the state ends the leases past the limit;
    /// and which test databases had sessions, which the state keeps.
    pub(super) fn lease_sizes_measured(
        &mut self,
        sizes: Result<Vec<(LeaseId, DbName, u64)>, SqlError>,
        sessions: Result<Vec<(LeaseId, DbName, bool)>, SqlError>,
        since: Instant,
        now: Instant,
    ) {
        match sessions {
            Ok(seen) => self.state.lease_sessions(&seen, since),
            Err(error) => tracing::debug!(%error, "cannot look for sessions on the test databases"),
        }
        match sizes {
            Ok(sizes) => {
                let actions = self.state.lease_sizes(&sizes, SystemTime::now(), now);
                self.apply(actions);
            }
            // The next tick measures again; a server in trouble is the liveness check's.
            Err(error) => tracing::debug!(%error, "cannot measure the leased databases"),
        }
    }
}

/// Each of `leases` whose database exists, with its size in bytes (none to size: none).
async fn sizes_of(
    session: &dyn Backend,
    leases: Vec<(LeaseId, DbName)>,
) -> Result<Vec<(LeaseId, DbName, u64)>, SqlError> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let databases: Vec<DbName> = leases.iter().map(|(_, db)| db.clone()).collect();
    let sizes = session.sizes_of(&databases).await?;
    Ok(leases
        .into_iter()
        .filter_map(|(id, database)| {
            let (_, bytes) = sizes.iter().find(|(name, _)| name == database.as_str())?;
            Some((id, database, u64::try_from(*bytes).unwrap_or(0)))
        })
        .collect())
}

/// Each of `leases`, with whether its database has a session.
async fn sessions_on(
    session: &dyn Backend,
    leases: Vec<(LeaseId, DbName)>,
) -> Result<Vec<(LeaseId, DbName, bool)>, SqlError> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let databases: Vec<DbName> = leases.iter().map(|(_, db)| db.clone()).collect();
    let with = session.with_sessions(&databases).await?;
    Ok(leases
        .into_iter()
        .map(|(id, database)| {
            let busy = with.iter().any(|name| name == database.as_str());
            (id, database, busy)
        })
        .collect())
}
