//! Finding the server binaries (`postgres`, `initdb`) and reading their version.
//!
//! The search order is: the configured directory, then `pg_config --bindir` on PATH, then
//! the highest-versioned `/usr/lib/postgresql/*/bin`. It runs nothing but `pg_config` and
//! `postgres --version`, and never installs anything.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::StartError;

/// Where Debian and Ubuntu install one directory per major version.
pub(crate) const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The server binaries pglease runs, and their version.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    /// The directory holding `postgres` and `initdb`.
    pub bin_dir: PathBuf,
    /// What `postgres --version` printed, e.g. "postgres (PostgreSQL) 15.18 (Debian ...)".
    pub version: String,
}

impl Binaries {
    /// Finds the binaries (see the module docs for the order) and reads their version.
    pub fn find(configured: Option<&Path>) -> Result<Binaries, StartError> {
        let bin_dir = find_bin_dir(configured, Path::new(DEBIAN_ROOT))?;
        let version = read_version(&bin_dir.join("postgres"))?;
        Ok(Binaries { bin_dir, version })
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

/// The bin directory: `configured` if given (and valid), else `pg_config --bindir`, else
/// the highest version under `debian_root`.
pub(crate) fn find_bin_dir(
    configured: Option<&Path>,
    debian_root: &Path,
) -> Result<PathBuf, StartError> {
    if let Some(dir) = configured {
        // An explicit choice that is wrong is an error, not a reason to look elsewhere.
        return if has_server(dir) {
            Ok(dir.to_path_buf())
        } else {
            Err(StartError::BinDirWithoutPostgres {
                bin_dir: dir.to_path_buf(),
            })
        };
    }
    let pg_config = match pg_config_bindir() {
        Ok(dir) if has_server(&dir) => return Ok(dir),
        // Debian's libpq-dev ships a pg_config pointing at /usr/bin, which has no server.
        Ok(dir) => format!(
            "`pg_config --bindir` printed {}, which has no postgres and initdb",
            dir.display()
        ),
        Err(what) => what,
    };
    highest_versioned_bin_dir(debian_root).ok_or(StartError::BinariesNotFound { pg_config })
}

/// Whether `dir` holds executable `postgres` and `initdb` files.
pub(crate) fn has_server(dir: &Path) -> bool {
    ["postgres", "initdb"].iter().all(|name| {
        std::fs::metadata(dir.join(name))
            .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Runs `pg_config --bindir` from PATH; the error says what happened, for the message
/// of [`StartError::BinariesNotFound`].
fn pg_config_bindir() -> Result<PathBuf, String> {
    let output = match Command::new("pg_config").arg("--bindir").output() {
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

/// The `bin` directory of the highest version under `root` (e.g. /usr/lib/postgresql/15/bin)
/// that holds a server, comparing versions numerically so that 9.6 < 10 < 15.
pub(crate) fn highest_versioned_bin_dir(root: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(root).ok()?;
    entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version = parse_version(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bin)| bin)
}

/// `"15"` → `[15]`, `"9.6"` → `[9, 6]`; anything else is not a version directory.
fn parse_version(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

/// Runs `postgres --version` (allowed as root: it exits before the root check).
fn read_version(postgres: &Path) -> Result<String, StartError> {
    let fail = |detail: String| StartError::Version {
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
