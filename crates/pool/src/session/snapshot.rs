//! Readying a server's cluster to be saved as a snapshot (`--snapshot-dir`): which
//! configured templates are built, and dropping everything else of ours. The file itself
//! is written by `postgres/snapshot.rs` once the server has stopped.

use super::{Session, Sweep};
use crate::config::TemplateConfig;
use crate::names::DbName;
use crate::postgres::snapshot::SnapshotTemplate;
use crate::template;

impl Session {
    /// The complete template databases of `templates`' current sources (name, fingerprint,
    /// size): what a snapshot of this server would hold.
    pub async fn snapshot_templates(
        &self,
        templates: &[TemplateConfig],
    ) -> Result<Vec<SnapshotTemplate>, String> {
        let mut kept = Vec::new();
        for config in templates {
            let Ok(fingerprint) = template::fingerprint(&config.source, self.pg_major) else {
                continue;
            };
            let db = DbName::template(&config.name, &fingerprint);
            if self.is_complete_template(&db).await? {
                kept.push(SnapshotTemplate {
                    name: config.name.to_string(),
                    size_bytes: self.database_size(&db).await?,
                    fingerprint,
                });
            }
        }
        Ok(kept)
    }

    /// Drops every database and role of ours except those templates, so that the snapshot
    /// holds nothing else (no clone, no client-built template, no lease role).
    pub async fn clear_for_snapshot(&mut self, templates: &[TemplateConfig]) -> Result<(), String> {
        self.sweep(templates, Sweep::Snapshot).await
    }
}
