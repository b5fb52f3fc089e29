//! The server binaries (`postgres`, `initdb`) the embedded server runs, as
//! `pglease-binaries` resolves them: the configured directory or an installed server.
//!
//! This module only turns the configuration into a request and logs where the binaries
//! came from; the search is the other crate's.

use std::path::PathBuf;

use pglease_binaries::Request;
use tracing::info;

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
    /// Resolves the binaries for `config`.
    pub async fn resolve(config: &EmbeddedConfig) -> Result<Binaries, StartError> {
        let request = Request {
            bin_dir: config.bin_dir.clone(),
            version: None,
        };
        let resolved = pglease_binaries::resolve(&request).await?;
        info!(
            origin = %resolved.origin,
            bin_dir = %resolved.bin_dir.display(),
            version = %resolved.version,
            "using PostgreSQL server binaries"
        );
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
