//! pglease-binaries: the PostgreSQL server binaries pglease runs — a configured directory,
//! an installed server, or a release of zonky's embedded-postgres binaries downloaded from
//! Maven Central into a cache and reused offline from then on.
//!
//! [`resolve`] looks, in order: the configured `bin_dir` (an invalid one is an error, not a
//! reason to look elsewhere); installed servers (`pg_config --bindir`,
//! `/usr/lib/postgresql/<major>/bin`, `postgres` on PATH); the cache; a download. With a
//! [`VersionSpec`] only that version fits; without one the newest installed server wins,
//! else the newest cached, else the newest release of [`DEFAULT_MAJOR`] is downloaded.
//!
//! It knows nothing of data directories, users or initdb: it returns a directory holding
//! `postgres` and `initdb`, and the version they report.
//!
//! Modules: `version` (what is asked for, what servers and releases say), `installed`
//! (servers on the machine), `cache` (layout, atomic placement), `download` (Maven,
//! checksum), `progress` (what a download reports to; nothing is drawn here), `unpack`
//! (zip → xz → tar).

mod cache;
mod download;
mod error;
mod installed;
mod progress;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
mod unpack;
mod version;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::BinariesError;
pub use progress::{NoProgress, Progress, Transfer};
pub use version::{
    parse_server_version, parse_version_number, VersionSpec, VersionSpecError, DEFAULT_MAJOR,
    SUPPORTED_MAJORS,
};

use cache::Platform;
use installed::{Places, Server};

/// Maven Central, where zonky publishes its binaries.
pub const DEFAULT_REPOSITORY: &str = "https://repo1.maven.org/maven2";

/// What [`resolve`] is asked for.
#[derive(Debug, Clone)]
pub struct Request {
    /// An explicit directory of `postgres` and `initdb` (`--pg-bin-dir`); it alone is used.
    pub bin_dir: Option<PathBuf>,
    /// The version wanted; None: the newest installed or cached, else [`DEFAULT_MAJOR`].
    pub version: Option<VersionSpec>,
    /// The cache root (downloads go to its `binaries/`), e.g. [`default_cache_root`].
    pub cache_root: PathBuf,
    /// The Maven repository's base URL, e.g. [`DEFAULT_REPOSITORY`] or a mirror.
    pub repository: String,
    /// What a download reports its progress to ([`NoProgress`]: nothing). The `pglease`
    /// binary draws a bar on a terminal with it.
    pub progress: Arc<dyn Progress>,
}

/// Where the binaries came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The configured `bin_dir`.
    Configured,
    /// A server installed on the machine.
    Installed,
    /// A release downloaded earlier into the cache.
    Cached,
    /// A release downloaded now into the cache.
    Downloaded,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Configured => "configured",
            Origin::Installed => "installed",
            Origin::Cached => "cached",
            Origin::Downloaded => "downloaded",
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

/// Finds the server binaries, downloading them into the cache when nothing on the machine
/// fits (see the crate docs for the order).
pub async fn resolve(request: &Request) -> Result<Resolved, BinariesError> {
    resolve_in(request, Places::system()).await
}

/// The cache, else a download: never an installed server or `bin_dir` (which is ignored).
/// For `pglease postgres fetch`.
pub async fn fetch(request: &Request) -> Result<Resolved, BinariesError> {
    let wanted = request.version;
    let cache_root = request.cache_root.clone();
    let (cached, tried) = blocking(cache_root.clone(), move || {
        let mut tried = Vec::new();
        let cached = Platform::current()
            .ok()
            .and_then(|platform| cache::find(&cache_root, &platform, wanted, &mut tried));
        Ok((cached, tried))
    })
    .await?;
    match cached {
        Some(server) => Ok(Resolved::new(server, Origin::Cached)),
        None => download_or_explain(request, tried).await,
    }
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
    let cache_root = request.cache_root.clone();
    let (found, tried) = blocking(cache_root.clone(), move || {
        let mut tried = Vec::new();
        if let Some(server) = installed::find(&places, wanted, &mut tried) {
            return Ok((Some((server, Origin::Installed)), tried));
        }
        // On a platform without published binaries the cache cannot hold any either; the
        // download attempt below says why.
        if let Ok(platform) = Platform::current() {
            if let Some(server) = cache::find(&cache_root, &platform, wanted, &mut tried) {
                return Ok((Some((server, Origin::Cached)), tried));
            }
        }
        Ok((None, tried))
    })
    .await?;
    match found {
        Some((server, origin)) => Ok(Resolved::new(server, origin)),
        None => download_or_explain(request, tried).await,
    }
}

/// Downloads the newest release of the requested version ([`DEFAULT_MAJOR`] when none);
/// on failure, one error naming every place `tried` before and why the download failed.
async fn download_or_explain(
    request: &Request,
    tried: Vec<String>,
) -> Result<Resolved, BinariesError> {
    let wanted = request.version.unwrap_or(VersionSpec::Major(DEFAULT_MAJOR));
    let attempt = match Platform::current() {
        Ok(platform) => {
            download::install(
                &request.repository,
                &request.cache_root,
                &platform,
                wanted,
                request.progress.as_ref(),
            )
            .await
        }
        Err(e) => Err(e),
    };
    attempt
        .map(|(server, origin)| Resolved::new(server, origin))
        .map_err(|download| BinariesError::NotFound {
            wanted: match request.version {
                Some(version) => version.to_string(),
                None => "server".to_owned(),
            },
            tried,
            download: Box::new(download),
        })
}

/// A server found by [`list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// What `postgres --version` printed.
    pub version: String,
    /// "17.6" ("18" for a beta).
    pub short_version: String,
    /// The major version.
    pub major: u32,
    /// The directory holding `postgres` and `initdb`.
    pub bin_dir: PathBuf,
}

impl From<Server> for Available {
    fn from(server: Server) -> Available {
        Available {
            short_version: server.short_version(),
            version: server.version,
            major: server.major,
            bin_dir: server.bin_dir,
        }
    }
}

/// The servers [`list`] finds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Installed on the machine (`pg_config --bindir`, Debian's directories, PATH).
    pub installed: Vec<Available>,
    /// Downloaded into the cache.
    pub cached: Vec<Available>,
}

/// The installed servers and the cached releases under `cache_root`, newest first.
/// Runs processes: call it from a thread that may block.
pub fn list(cache_root: &Path) -> Listing {
    let installed = installed::all(&Places::system())
        .into_iter()
        .map(Available::from)
        .collect();
    let cached = match Platform::current() {
        Ok(platform) => cache::entries(cache_root, &platform)
            .into_iter()
            .filter_map(|(_, dir)| Server::read(&dir.join("bin")).ok())
            .map(Available::from)
            .collect(),
        Err(_) => Vec::new(),
    };
    Listing { installed, cached }
}

/// The default cache root (downloaded binaries, initdb results): as root
/// `/var/cache/pglease` (postgres then runs as another OS user, who must get through every
/// directory above the binaries, and `/root` lets nobody through); for an ordinary user
/// `$XDG_CACHE_HOME/pglease`, else `~/.cache/pglease`, else `/var/cache/pglease`.
pub fn default_cache_root() -> PathBuf {
    let system = PathBuf::from("/var/cache/pglease");
    if nix::unistd::geteuid().is_root() {
        return system;
    }
    let from_env = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    from_env("XDG_CACHE_HOME")
        .map(|xdg| xdg.join("pglease"))
        .or_else(|| from_env("HOME").map(|home| home.join(".cache").join("pglease")))
        .unwrap_or(system)
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
