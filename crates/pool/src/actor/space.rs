//! The actor's watch on the databases' tmpfs (`postgres/space.rs`): when it fills, the
//! writer that hit the end got "could not extend file … No space left on device" and the
//! server stays up; this says in the log and `/status` which database holds the most,
//! the lease that filled it, and when there is room again.

use std::path::PathBuf;
use std::time::SystemTime;

use super::{Actor, JobResult, NOT_RUNNING};
use crate::names::DbName;
use crate::types::{DatabasesSpace, FilledBy};

/// Full below this share of the space free (a writer's failed extension leaves less).
const FULL_BELOW_PERCENT: u64 = 2;
/// Room again from this share free.
const ROOM_FROM_PERCENT: u64 = 5;

/// The space's last measure, and what filled it.
#[derive(Debug)]
pub(super) struct SpaceWatch {
    path: PathBuf,
    bytes: u64,
    free_bytes: u64,
    full: bool,
    filled_by: Option<FilledBy>,
}

impl SpaceWatch {
    pub(super) fn new(path: PathBuf) -> SpaceWatch {
        SpaceWatch {
            path,
            bytes: 0,
            free_bytes: 0,
            full: false,
            filled_by: None,
        }
    }

    pub(super) fn status(&self) -> DatabasesSpace {
        DatabasesSpace {
            path: self.path.clone(),
            bytes: self.bytes,
            free_bytes: self.free_bytes,
            full: self.full,
            filled_by: self.filled_by.clone(),
        }
    }
}

impl Actor {
    /// Measures the databases' tmpfs (a `statvfs` in RAM); on the step to full, asks
    /// postgres which database holds the most.
    pub(super) fn watch_space(&mut self) {
        let Some(watch) = self.space.as_mut() else {
            return;
        };
        let Ok(stats) = nix::sys::statvfs::statvfs(&watch.path) else {
            return;
        };
        watch.bytes = stats.blocks() * stats.fragment_size();
        watch.free_bytes = stats.blocks_available() * stats.fragment_size();
        let percent_free = watch.free_bytes * 100 / watch.bytes.max(1);
        if !watch.full && percent_free < FULL_BELOW_PERCENT {
            watch.full = true;
            self.spawn_job(|session| async move {
                JobResult::SpaceFilled {
                    sizes: match session {
                        Some(session) => session.database_sizes().await,
                        None => Err(NOT_RUNNING.into()),
                    },
                }
            });
        } else if watch.full && percent_free >= ROOM_FROM_PERCENT {
            watch.full = false;
            tracing::info!(
                path = %watch.path.display(),
                free_bytes = watch.free_bytes,
                "the databases' tmpfs has room again"
            );
        }
    }

    /// Names what filled the databases' tmpfs: of the leased databases the biggest, else
    /// the biggest of all.
    pub(super) fn space_filled(&mut self, sizes: Result<Vec<(String, i64)>, String>) {
        let Some(watch) = self.space.as_mut() else {
            return;
        };
        let sizes = match sizes {
            Ok(sizes) => sizes,
            Err(error) => {
                tracing::warn!(path = %watch.path.display(), %error, "the databases' tmpfs is full; cannot tell which database filled it");
                return;
            }
        };
        let leases = self.state.lease_list();
        let leased = |name: &str| leases.iter().find(|lease| lease.database.as_str() == name);
        let biggest = sizes
            .iter()
            .filter(|(name, _)| leased(name).is_some())
            .max_by_key(|(_, bytes)| *bytes)
            .or_else(|| sizes.iter().max_by_key(|(_, bytes)| *bytes));
        let Some((name, bytes)) = biggest else {
            return;
        };
        let lease = leased(name);
        tracing::warn!(
            path = %watch.path.display(),
            database = %name,
            bytes,
            lease_id = lease.map(|l| l.id.to_string()),
            template = lease.map(|l| l.template.to_string()),
            "the databases' tmpfs is full: its writers get \"No space left on device\", the server stays up; this database holds the most"
        );
        watch.filled_by = Some(FilledBy {
            database: DbName::from_server(name.clone()),
            template: lease.map(|l| l.template.clone()),
            bytes: u64::try_from(*bytes).unwrap_or(0),
            at: SystemTime::now(),
        });
    }
}
