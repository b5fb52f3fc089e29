//! Readying a server's cluster to be saved as a snapshot (`--snapshot-dir`): which
//! configured templates are built, and dropping everything else of ours. The file itself
//! is written by `postgres/snapshot.rs` once the server has stopped.

use super::{Session, Sweep};
use crate::names::{DbName, TemplateName};
use crate::sql_error::SqlError;

impl Session {
    /// The complete template databases of the `current` versions, with their sizes in
    /// bytes: what a snapshot of this server would hold.
    pub async fn snapshot_templates(
        &self,
        current: &[(TemplateName, String)],
    ) -> Result<Vec<(TemplateName, String, i64)>, SqlError> {
        let mut kept = Vec::new();
        for (name, fingerprint) in current {
            let db = DbName::template(name, fingerprint);
            if self.is_complete_template(&db).await? {
                let size_bytes = self.database_size(&db).await?;
                kept.push((name.clone(), fingerprint.clone(), size_bytes));
            }
        }
        Ok(kept)
    }

    /// Drops every database and role of ours except the `current` versions' templates, so
    /// that the snapshot holds nothing else (no clone, no client-built template, no lease
    /// role).
    pub async fn clear_for_snapshot(
        &mut self,
        current: Vec<(TemplateName, String)>,
    ) -> Result<(), SqlError> {
        self.sweep(current, Sweep::Snapshot).await
    }
}
