//! The crate's one error enum: every way of not getting server binaries, each variant with
//! the path, URL or version a user needs to act on it.

use std::path::PathBuf;

use crate::version::VersionSpec;

/// Finding, downloading or unpacking the server binaries failed.
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
    /// No binaries anywhere: every place looked at, and why the download failed.
    #[error(
        "no PostgreSQL {wanted} server binaries: {}; and the download failed: {download}",
        tried.join("; ")
    )]
    NotFound {
        /// "17", "17.6", or "server" when no version was asked for.
        wanted: String,
        /// Each place looked at, with what was (not) there.
        tried: Vec<String>,
        /// Why the download failed.
        #[source]
        download: Box<BinariesError>,
    },
    /// There are no published binaries for this operating system and architecture.
    #[error(
        "no PostgreSQL binaries are published for {os}/{arch} (only linux x86_64 and aarch64): \
         install the server and pass --pg-bin-dir"
    )]
    UnsupportedPlatform {
        /// `std::env::consts::OS`.
        os: &'static str,
        /// `std::env::consts::ARCH`.
        arch: &'static str,
    },
    /// A request failed: no connection, a timeout, a broken transfer.
    #[error("cannot fetch {url}: {}", error_chain(source))]
    Http {
        /// The URL.
        url: String,
        /// What reqwest reported.
        source: reqwest::Error,
    },
    /// The repository answered with an error status.
    #[error("{url} answered {status}")]
    HttpStatus {
        /// The URL.
        url: String,
        /// The status, e.g. "404 Not Found".
        status: String,
    },
    /// The repository lists no release of the requested version.
    #[error(
        "{url} lists no PostgreSQL {wanted} release{}",
        if available.is_empty() { String::new() } else { format!(" (it has {})", available.join(", ")) }
    )]
    NoSuchRelease {
        /// The version asked for.
        wanted: VersionSpec,
        /// The metadata URL.
        url: String,
        /// The versions of that major it does list.
        available: Vec<String>,
    },
    /// The downloaded archive is not what the repository says it published.
    #[error(
        "checksum mismatch for {url}: the repository says SHA-256 {expected}, the download has \
         {actual}; nothing was kept"
    )]
    ChecksumMismatch {
        /// The archive's URL.
        url: String,
        /// The published SHA-256.
        expected: String,
        /// The SHA-256 of what arrived.
        actual: String,
    },
    /// The archive is damaged or holds something it must not (a path outside its directory,
    /// a device file).
    #[error("cannot unpack {}: {detail}", archive.display())]
    BadArchive {
        /// The archive.
        archive: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The unpacked server is not the version the release named.
    #[error("{} is {found}, expected PostgreSQL {expected}", postgres.display())]
    UnexpectedVersion {
        /// The unpacked postgres binary.
        postgres: PathBuf,
        /// What it printed.
        found: String,
        /// The release's version.
        expected: String,
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

/// `error` and its sources on one line: reqwest's own message ("error sending request")
/// says nothing of the cause (DNS, refused, TLS) without them.
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
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
