//! The server binaries (`postgres`, `initdb`) the embedded server runs, as
//! `pglease-binaries` resolves them: the configured directory, an installed server, the
//! cache, or a download into the cache.
//!
//! This module only turns the configuration into a request, logs where the binaries came
//! from, and warns when the server's OS user could not reach them. Searching, downloading
//! and unpacking are the other crate's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use pglease_binaries::{Origin, Request};
use tracing::{info, warn};

use crate::config::EmbeddedConfig;
use crate::error::StartError;

/// The server binaries pglease runs, and their version.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    /// The directory holding `postgres` and `initdb`.
    pub bin_dir: PathBuf,
    /// What `postgres --version` printed, e.g. "postgres (PostgreSQL) 15.18 (Debian ...)".
    pub version: String,
}

impl Binaries {
    /// Resolves the binaries for `config`, downloading into `cache_root` if need be.
    /// `switch_user`: postgres will run as another OS user (the daemon is root).
    pub async fn resolve(
        config: &EmbeddedConfig,
        cache_root: &Path,
        switch_user: bool,
    ) -> Result<Binaries, StartError> {
        let request = Request {
            bin_dir: config.bin_dir.clone(),
            version: config.postgres_version,
            cache_root: cache_root.to_path_buf(),
            repository: config.binaries_repository.clone(),
            progress: config.download_progress.clone(),
        };
        let resolved = pglease_binaries::resolve(&request).await?;
        info!(
            origin = %resolved.origin,
            bin_dir = %resolved.bin_dir.display(),
            version = %resolved.version,
            requested = %config
                .postgres_version
                .map_or_else(|| "any".to_owned(), |version| version.to_string()),
            "using PostgreSQL server binaries"
        );
        let downloaded = matches!(resolved.origin, Origin::Cached | Origin::Downloaded);
        if switch_user && downloaded {
            if let Some(closed) = closed_to_others(&resolved.bin_dir) {
                warn!(
                    dir = %closed.display(),
                    bin_dir = %resolved.bin_dir.display(),
                    "the server's OS user may not get through this directory (no search \
                     permission for others), so initdb or postgres may fail with 'permission \
                     denied'; use a --cache-dir every user can read, e.g. /var/cache/pglease"
                );
            }
        }
        Ok(Binaries {
            bin_dir: resolved.bin_dir,
            version: resolved.version,
        })
    }

    /// The `postgres` executable.
    pub fn postgres(&self) -> PathBuf {
        self.bin_dir.join("postgres")
    }

    /// The `initdb` executable.
    pub fn initdb(&self) -> PathBuf {
        self.bin_dir.join("initdb")
    }
}

/// The first directory from `/` down to `dir` that other users cannot pass through (a
/// cache under /root, say), if any. Group permissions are not considered: this is a hint.
fn closed_to_others(dir: &Path) -> Option<PathBuf> {
    let mut ancestors: Vec<&Path> = dir.ancestors().collect();
    ancestors.reverse();
    ancestors.into_iter().find_map(|path| {
        let mode = std::fs::metadata(path).ok()?.permissions().mode();
        (mode & 0o001 == 0).then(|| path.to_path_buf())
    })
}
