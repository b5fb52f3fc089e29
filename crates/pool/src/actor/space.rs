//! The actor's watch on the databases' tmpfs (`postgres/space.rs`): it measures the space
//! and, when the state says it just filled, asks postgres which database holds the most
//! (`state/space.rs` keeps what was found).

use super::{Actor, JobResult, NOT_RUNNING};

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
                        None => Err(NOT_RUNNING.into()),
                    },
                }
            });
        }
    }
}
