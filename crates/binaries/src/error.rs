//! The crate's one error enum: every way of not getting server binaries, each variant with
//! the path or version a user needs to act on it.

use std::path::PathBuf;

use crate::version::VersionSpec;

/// Finding the server binaries failed.
#[derive(Debug, thiserror::Error)]
pub enum BinariesError {
    /// The explicitly configured directory holds no server.
    #[error(
        "--pg-bin-dir {} has no executable `postgres` and `initdb`; point it at the server's \
         bin directory (e.g. /usr/lib/postgresql/17/bin)",
        bin_dir.display()
    )]
    BinDirWithoutPostgres {
        /// The directory given.
        bin_dir: PathBuf,
    },
    /// The configured directory holds another version than the one asked for.
    #[error(
        "--pg-bin-dir {} holds {found}, but --postgres-version {wanted} was asked for; drop \
         one of the two or make them agree",
        bin_dir.display()
    )]
    BinDirVersionMismatch {
        /// The directory given.
        bin_dir: PathBuf,
        /// What its `postgres --version` printed.
        found: String,
        /// The version asked for.
        wanted: VersionSpec,
    },
    /// `postgres --version` could not be run or printed nothing useful.
    #[error("cannot read the server version with `{} --version`: {detail}", postgres.display())]
    Version {
        /// The postgres binary.
        postgres: PathBuf,
        /// What went wrong (spawn error, exit status, output).
        detail: String,
    },
    /// No binaries anywhere: every place looked at.
    #[error(
        "no PostgreSQL {wanted} server binaries: {}; install the server (e.g. `apt-get install \
         postgresql`) or pass --pg-bin-dir",
        tried.join("; ")
    )]
    NotFound {
        /// "17", "17.6", or "server" when no version was asked for.
        wanted: String,
        /// Each place looked at, with what was (not) there.
        tried: Vec<String>,
    },
    /// A file system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. "cannot create".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A [`BinariesError::Io`] with its action and path.
pub(crate) fn io_error(
    action: &'static str,
    path: impl Into<PathBuf>,
    source: std::io::Error,
) -> BinariesError {
    BinariesError::Io {
        action,
        path: path.into(),
        source,
    }
}
