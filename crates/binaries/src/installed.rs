//! Server binaries already on the machine: a configured directory, `pg_config --bindir`,
//! Debian's `/usr/lib/postgresql/<major>/bin`, and `postgres` on PATH.
//!
//! It runs nothing but `pg_config` and `postgres --version`, and never installs anything.
//! Every place looked at is noted for the error message when nothing fits.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::BinariesError;
use crate::version::{parse_server_version, VersionSpec};

/// Where Debian and Ubuntu install one directory per major version.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The places searched for installed binaries; tests point them at fakes.
#[derive(Debug, Clone)]
pub(crate) struct Places {
    /// The `pg_config` program to run (a name looked up on PATH, or a path).
    pub pg_config: OsString,
    /// Debian's root of per-major directories.
    pub debian_root: PathBuf,
    /// The PATH searched for `postgres`; None: not searched.
    pub path: Option<OsString>,
}

impl Places {
    /// This machine's: `pg_config` and `postgres` on PATH, and [`DEBIAN_ROOT`].
    pub fn system() -> Places {
        Places {
            pg_config: "pg_config".into(),
            debian_root: PathBuf::from(DEBIAN_ROOT),
            path: std::env::var_os("PATH"),
        }
    }
}

/// A directory holding a server, with what `postgres --version` printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    /// The directory holding `postgres` and `initdb`.
    pub bin_dir: PathBuf,
    /// What `postgres --version` printed.
    pub version: String,
    /// The major in it.
    pub major: u32,
    /// The minor in it; None for a beta.
    pub minor: Option<u32>,
}

impl Server {
    /// Reads the version of the server in `bin_dir` (which must hold one).
    pub fn read(bin_dir: &Path) -> Result<Server, BinariesError> {
        let postgres = bin_dir.join("postgres");
        let version = read_version(&postgres)?;
        let (major, minor) =
            parse_server_version(&version).ok_or_else(|| BinariesError::Version {
                postgres,
                detail: format!("no version number in {version:?}"),
            })?;
        Ok(Server {
            bin_dir: bin_dir.to_path_buf(),
            version,
            major,
            minor,
        })
    }

    /// "15.18", or "18" for a beta.
    pub fn short_version(&self) -> String {
        match self.minor {
            Some(minor) => format!("{}.{minor}", self.major),
            None => self.major.to_string(),
        }
    }
}

/// The explicitly configured directory: it must hold a server, of `wanted` if given. A
/// wrong explicit choice is an error, not a reason to look elsewhere.
pub(crate) fn configured(
    bin_dir: &Path,
    wanted: Option<VersionSpec>,
) -> Result<Server, BinariesError> {
    if !has_server(bin_dir) {
        return Err(BinariesError::BinDirWithoutPostgres {
            bin_dir: bin_dir.to_path_buf(),
        });
    }
    let server = Server::read(bin_dir)?;
    match wanted {
        Some(wanted) if !wanted.matches(server.major, server.minor) => {
            Err(BinariesError::BinDirVersionMismatch {
                bin_dir: bin_dir.to_path_buf(),
                found: server.version,
                wanted,
            })
        }
        _ => Ok(server),
    }
}

/// An installed server of `wanted`, looked for in order: `pg_config --bindir`, Debian's
/// directory of that major, `postgres` on PATH. Without `wanted`, the newest of all
/// installed servers (the first found among equals). Each place looked at goes to `tried`.
pub(crate) fn find(
    places: &Places,
    wanted: Option<VersionSpec>,
    tried: &mut Vec<String>,
) -> Option<Server> {
    let mut candidates: Vec<(String, PathBuf)> = Vec::new();
    match pg_config_bindir(&places.pg_config) {
        Ok(dir) => candidates.push(("`pg_config --bindir`".into(), dir)),
        Err(what) => tried.push(what),
    }
    match wanted {
        Some(wanted) => {
            let dir = places
                .debian_root
                .join(wanted.major().to_string())
                .join("bin");
            candidates.push((String::new(), dir));
        }
        None => {
            let dirs = debian_bin_dirs(&places.debian_root);
            if dirs.is_empty() {
                tried.push(format!(
                    "{} has no */bin with a server",
                    places.debian_root.display()
                ));
            }
            candidates.extend(dirs.into_iter().map(|dir| (String::new(), dir)));
        }
    }
    match postgres_on_path(places.path.as_deref()) {
        Ok(dir) => candidates.push(("`postgres` on PATH".into(), dir)),
        Err(what) => tried.push(what),
    }

    let mut best: Option<Server> = None;
    let mut seen: Vec<PathBuf> = Vec::new();
    for (label, dir) in candidates {
        // pg_config and PATH usually name one of Debian's directories: look once.
        if seen.contains(&dir) {
            continue;
        }
        seen.push(dir.clone());
        let place = if label.is_empty() {
            dir.display().to_string()
        } else {
            format!("{label} ({})", dir.display())
        };
        if !has_server(&dir) {
            tried.push(format!("{place}: no postgres and initdb"));
            continue;
        }
        let server = match Server::read(&dir) {
            Ok(server) => server,
            Err(e) => {
                tried.push(format!("{place}: {e}"));
                continue;
            }
        };
        match wanted {
            Some(wanted) if wanted.matches(server.major, server.minor) => return Some(server),
            Some(_) => tried.push(format!("{place}: PostgreSQL {}", server.short_version())),
            None => {
                let newer = best
                    .as_ref()
                    .is_none_or(|best| (server.major, server.minor) > (best.major, best.minor));
                if newer {
                    best = Some(server);
                }
            }
        }
    }
    best
}

/// Every installed server: `pg_config --bindir`, Debian's directories, `postgres` on PATH;
/// newest first.
pub(crate) fn all(places: &Places) -> Vec<Server> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    dirs.extend(pg_config_bindir(&places.pg_config).ok());
    dirs.extend(debian_bin_dirs(&places.debian_root));
    dirs.extend(postgres_on_path(places.path.as_deref()).ok());
    let mut servers: Vec<Server> = Vec::new();
    for dir in dirs {
        if servers.iter().any(|server| server.bin_dir == dir) || !has_server(&dir) {
            continue;
        }
        servers.extend(Server::read(&dir).ok());
    }
    servers.sort_by_key(|server| std::cmp::Reverse((server.major, server.minor)));
    servers
}

/// Whether `dir` holds executable `postgres` and `initdb` files.
pub(crate) fn has_server(dir: &Path) -> bool {
    ["postgres", "initdb"].iter().all(|name| {
        std::fs::metadata(dir.join(name))
            .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Runs `pg_config --bindir`; the error says what happened, for the "tried" list.
pub(crate) fn pg_config_bindir(program: &std::ffi::OsStr) -> Result<PathBuf, String> {
    let output = match Command::new(program).arg("--bindir").output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("pg_config is not on PATH".into())
        }
        Err(e) => return Err(format!("`pg_config --bindir` could not run ({e})")),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || stdout.is_empty() {
        return Err(format!(
            "`pg_config --bindir` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(PathBuf::from(stdout))
}

/// The `bin` directories under `root` (e.g. /usr/lib/postgresql/15/bin) that hold a server,
/// newest first, comparing the directory names numerically so that 9.6 < 10 < 15.
pub(crate) fn debian_bin_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version = parse_dir_version(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    dirs.sort_by(|a, b| b.0.cmp(&a.0));
    dirs.into_iter().map(|(_, bin)| bin).collect()
}

/// `"15"` → `[15]`, `"9.6"` → `[9, 6]`; anything else is not a version directory.
fn parse_dir_version(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

/// The real directory of the first executable `postgres` on `path`: a symlink such as
/// /usr/local/bin/postgres → /usr/lib/postgresql/15/bin/postgres gives the directory that
/// also holds initdb.
fn postgres_on_path(path: Option<&std::ffi::OsStr>) -> Result<PathBuf, String> {
    let not_found = || "`postgres` is not on PATH".to_owned();
    let path = path.ok_or_else(not_found)?;
    let found = std::env::split_paths(path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("postgres"))
        .find(|file| {
            std::fs::metadata(file)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(not_found)?;
    let real = std::fs::canonicalize(&found)
        .map_err(|e| format!("`postgres` on PATH ({}): {e}", found.display()))?;
    real.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("`postgres` on PATH ({}) has no directory", real.display()))
}

/// Runs `postgres --version` (allowed as root: it exits before the root check).
pub(crate) fn read_version(postgres: &Path) -> Result<String, BinariesError> {
    let fail = |detail: String| BinariesError::Version {
        postgres: postgres.to_path_buf(),
        detail,
    };
    let output = Command::new(postgres)
        .arg("--version")
        .output()
        .map_err(|e| fail(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || !stdout.contains("PostgreSQL") {
        return Err(fail(format!(
            "{}: {stdout} {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests;
