//! pglease-binaries: the PostgreSQL server binaries pglease runs — a configured directory
//! or an installed server, of the version asked for.
//!
//! [`resolve`] looks, in order: the configured `bin_dir` (an invalid one is an error, not a
//! reason to look elsewhere); installed servers (`pg_config --bindir`,
//! `/usr/lib/postgresql/<major>/bin`, `postgres` on PATH). With a [`VersionSpec`] only that
//! version fits; without one the newest installed server wins.
//!
//! It knows nothing of data directories, users or initdb: it returns a directory holding
//! `postgres` and `initdb`, and the version they report.
//!
//! Modules: `version` (what is asked for, what servers say), `installed` (servers on the
//! machine).

mod error;
mod installed;
#[cfg(test)]
mod testing;
mod version;

use std::fmt;
use std::path::PathBuf;

pub use error::BinariesError;
pub use version::{VersionSpec, VersionSpecError, SUPPORTED_MAJORS};

use installed::{Places, Server};

/// What [`resolve`] is asked for.
#[derive(Debug, Clone)]
pub struct Request {
    /// An explicit directory of `postgres` and `initdb` (`--pg-bin-dir`); it alone is used.
    pub bin_dir: Option<PathBuf>,
    /// The version wanted; None: the newest installed.
    pub version: Option<VersionSpec>,
}

/// Where the binaries came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The configured `bin_dir`.
    Configured,
    /// A server installed on the machine.
    Installed,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Configured => "configured",
            Origin::Installed => "installed",
        })
    }
}

/// The binaries found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The directory holding `postgres` and `initdb`.
    pub bin_dir: PathBuf,
    /// What `postgres --version` printed, e.g. "postgres (PostgreSQL) 17.6".
    pub version: String,
    /// The major version, e.g. 17.
    pub major: u32,
    /// Where they came from.
    pub origin: Origin,
}

impl Resolved {
    fn new(server: Server, origin: Origin) -> Resolved {
        Resolved {
            bin_dir: server.bin_dir,
            version: server.version,
            major: server.major,
            origin,
        }
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

/// Finds the server binaries (see the crate docs for the order).
pub async fn resolve(request: &Request) -> Result<Resolved, BinariesError> {
    resolve_in(request, Places::system()).await
}

/// [`resolve`] with the installed servers looked for in `places`.
async fn resolve_in(request: &Request, places: Places) -> Result<Resolved, BinariesError> {
    let wanted = request.version;
    if let Some(bin_dir) = request.bin_dir.clone() {
        let server = blocking(bin_dir.clone(), move || {
            installed::configured(&bin_dir, wanted)
        })
        .await?;
        return Ok(Resolved::new(server, Origin::Configured));
    }
    let (found, tried) = blocking(places.debian_root.clone(), move || {
        let mut tried = Vec::new();
        let found = installed::find(&places, wanted, &mut tried);
        Ok((found, tried))
    })
    .await?;
    match found {
        Some(server) => Ok(Resolved::new(server, Origin::Installed)),
        None => Err(BinariesError::NotFound {
            wanted: match wanted {
                Some(version) => version.to_string(),
                None => "server".to_owned(),
            },
            tried,
        }),
    }
}

/// Runs `work` on tokio's blocking pool (it runs processes and walks directories),
/// re-raising its panic; `path` names the place for the error if the runtime shuts down.
async fn blocking<T, F>(path: PathBuf, work: F) -> Result<T, BinariesError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, BinariesError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => Err(error::io_error(
                "interrupted while working in",
                path,
                std::io::Error::other(e),
            )),
        },
    }
}
