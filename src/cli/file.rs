//! The TOML config file: which one `serve` reads (`ConfigFrom`), whether a file found in
//! the working directory may be read at all, and its tables as serde reads them. Merging
//! them with the flags is `config.rs`'s business.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::serve::{LeaseAuthArg, StorageArg, StrategyArg};
use super::DEFAULT_CONFIG_FILE;

/// The `[postgres]` table of the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PostgresFile {
    pub(super) url: Option<String>,
    pub(super) bin_dir: Option<PathBuf>,
    /// A major (an integer or a string) or a major.minor (a string: 17.6 unquoted is a
    /// TOML float).
    pub(super) postgres_version: Option<toml::Value>,
    pub(super) postgres_repository: Option<String>,
    pub(super) data_dir: Option<PathBuf>,
    pub(super) tmpfs_size: Option<String>,
    pub(super) databases_dir: Option<PathBuf>,
    pub(super) allow_unsafe_on_disk: Option<bool>,
    pub(super) user: Option<String>,
    pub(super) cache_dir: Option<PathBuf>,
    pub(super) listen: Option<String>,
    pub(super) port: Option<u16>,
    pub(super) advertise_host: Option<String>,
    pub(super) locale: Option<String>,
    pub(super) encoding: Option<String>,
    pub(super) keep_data: Option<bool>,
    pub(super) snapshot_dir: Option<PathBuf>,
    pub(super) snapshot_key_file: Option<PathBuf>,
    pub(super) storage: Option<StorageArg>,
    #[serde(default)]
    pub(super) settings: BTreeMap<String, toml::Value>,
}

/// A `[templates.NAME]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TemplateFile {
    pub(super) migrations: Option<PathBuf>,
    pub(super) sql: Option<PathBuf>,
    pub(super) command: Option<String>,
    /// A pg_dump output (custom, directory, tar or plain SQL, .gz/.zst).
    pub(super) dump: Option<PathBuf>,
    /// For `dump`: pg_restore's parallel jobs (default: the number of cores).
    pub(super) jobs: Option<usize>,
    /// For `command`: its working directory (default: the config file's directory).
    pub(super) workdir: Option<PathBuf>,
    /// For `command`: files and directories whose contents enter the fingerprint.
    #[serde(default)]
    pub(super) watch: Vec<PathBuf>,
    /// For `command`: seconds before it is killed.
    pub(super) timeout_secs: Option<u64>,
    /// Apply the source as postgres' superuser (an untrusted extension needs it); without
    /// it, a template runs as a role that can do what its objects' owner can, no more.
    #[serde(default)]
    pub(super) superuser: bool,
    /// The PostgreSQL version it needs when not the daemon's own (`16` or `"16.4"`): it
    /// then lives on a server of that major, started when first needed.
    pub(super) postgres_version: Option<toml::Value>,
}

/// The config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConfigFile {
    pub(super) listen: Option<SocketAddr>,
    pub(super) front_listen: Option<super::serve::FrontAddress>,
    pub(super) front_key_grace_ms: Option<u64>,
    pub(super) front_max_connections: Option<usize>,
    pub(super) front_tls: Option<super::serve::FrontTlsArg>,
    pub(super) front_tls_cert: Option<PathBuf>,
    pub(super) front_tls_key: Option<PathBuf>,
    pub(super) front_require_tls: Option<bool>,
    pub(super) min_ready: Option<usize>,
    pub(super) max_total: Option<usize>,
    pub(super) clone_concurrency: Option<usize>,
    pub(super) clone_strategy: Option<StrategyArg>,
    pub(super) default_ttl_secs: Option<u64>,
    pub(super) lease_connections: Option<u32>,
    pub(super) max_bytes: Option<String>,
    pub(super) lease_max_bytes: Option<String>,
    pub(super) max_waiting: Option<usize>,
    pub(super) build_timeout_secs: Option<u64>,
    pub(super) initialize_timeout_secs: Option<u64>,
    pub(super) max_kept: Option<usize>,
    pub(super) max_keep_secs: Option<u64>,
    pub(super) prebuild: Option<bool>,
    pub(super) lease_auth: Option<LeaseAuthArg>,
    pub(super) scram_iterations: Option<u32>,
    pub(super) lease_superuser: Option<bool>,
    pub(super) verify_templates: Option<bool>,
    pub(super) reuse_unchanged: Option<bool>,
    pub(super) child_user: Option<String>,
    pub(super) integresql_pg_user: Option<String>,
    pub(super) integresql_pg_password: Option<String>,
    #[serde(default)]
    pub(super) postgres: PostgresFile,
    #[serde(default)]
    pub(super) templates: BTreeMap<String, TemplateFile>,
}

/// Which config file `serve` read, for its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigFrom {
    /// None: no --config, no PGLEASE_CONFIG, and no ./pglease.toml.
    Nowhere,
    /// The file named by --config or PGLEASE_CONFIG.
    Named(PathBuf),
    /// ./pglease.toml, found in the working directory (its absolute path).
    Found(PathBuf),
}

impl ConfigFrom {
    /// The config file to read: the one named, else `DEFAULT_CONFIG_FILE` in `dir` if it is
    /// a file (a directory or a dangling link of that name is not a config file).
    pub fn resolve(named: Option<PathBuf>, dir: Option<&Path>) -> ConfigFrom {
        if let Some(path) = named {
            return ConfigFrom::Named(path);
        }
        match dir.map(|dir| dir.join(DEFAULT_CONFIG_FILE)) {
            Some(path) if path.is_file() => ConfigFrom::Found(path),
            _ => ConfigFrom::Nowhere,
        }
    }

    /// The file, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ConfigFrom::Nowhere => None,
            ConfigFrom::Named(path) | ConfigFrom::Found(path) => Some(path),
        }
    }

    /// Says in the log (INFO) which file was read, so that a file found by itself is never
    /// a surprise.
    pub fn log(&self) {
        match self {
            ConfigFrom::Nowhere => tracing::info!(
                "no config file (no --config, PGLEASE_CONFIG or ./{DEFAULT_CONFIG_FILE}): flags and defaults only"
            ),
            ConfigFrom::Named(path) => {
                tracing::info!(config = %path.display(), "read the config file")
            }
            ConfigFrom::Found(path) => tracing::info!(
                config = %path.display(),
                "read the config file found in the working directory (no --config or PGLEASE_CONFIG given)"
            ),
        }
    }
}
/// The config file as read: which one, its tables, and the directory its relative paths
/// start from.
pub(super) struct Loaded {
    /// Which file was read, if any.
    pub(super) from: ConfigFrom,
    /// Its content; all empty when no file was read.
    pub(super) file: ConfigFile,
    /// The file's directory (empty when no file was read): template sources are relative
    /// to it, wherever the daemon was started.
    pub(super) dir: PathBuf,
}

/// Reads the config file named by --config (or PGLEASE_CONFIG), else the one found in the
/// working directory if it may be read, else none.
pub(super) fn load(named: Option<PathBuf>) -> Result<Loaded, String> {
    let working_dir = std::env::current_dir().ok();
    let from = ConfigFrom::resolve(named, working_dir.as_deref());
    if let ConfigFrom::Found(path) = &from {
        found_file_is_ours(path)?;
    }
    let (file, dir) = match from.path() {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
            let file: ConfigFile = toml::from_str(&text)
                .map_err(|e| format!("config file {}: {}", path.display(), e.message()))?;
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            (file, dir)
        }
        None => (ConfigFile::default(), PathBuf::new()),
    };
    Ok(Loaded { from, file, dir })
}

/// A config file found in the working directory (not named) is read only if the user
/// pglease runs as owns it and nobody else may write it, as git treats a repository it finds:
/// a daemon started in a shared directory (/tmp, a CI workspace) must not take its command
/// templates, data directory or superuser sources from a file someone else put there.
/// Named with --config or PGLEASE_CONFIG, a file is the operator's choice.
pub(super) fn found_file_is_ours(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    let euid = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        Err(format!(
            "not reading {} found in the working directory: {why}; name it with --config (or \
             PGLEASE_CONFIG) to use it anyway",
            path.display()
        ))
    };
    if meta.uid() != euid {
        return refuse(format!(
            "it belongs to uid {}, and pglease runs as uid {euid}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(format!(
            "others may write it (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}
/// `postgres_version` in the config file: `17`, `"17"` or `"17.6"`.
pub(super) fn file_version(value: &toml::Value) -> Result<pglease_binaries::VersionSpec, String> {
    let text = match value {
        toml::Value::Integer(major) => major.to_string(),
        toml::Value::String(text) => text.clone(),
        toml::Value::Float(_) => {
            return Err(format!(
                "postgres_version = {value}: write a major.minor as a string, e.g. \"17.6\""
            ))
        }
        other => {
            return Err(format!(
                "postgres_version = {other}: expected e.g. 17 or \"17.6\""
            ))
        }
    };
    text.parse()
        .map_err(|e| format!("postgres_version in the config file: {e}"))
}
