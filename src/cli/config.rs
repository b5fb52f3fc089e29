//! `serve`'s flags merged over its config file: the validated `ServeConfig`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pglease_api::{ApiConfig, Token};
use pglease_pool::config::{one_source_kind, CommandSource, DumpSource, DEFAULT_SCRAM_ITERATIONS};
use pglease_pool::{
    CloneStrategy, EmbeddedConfig, ExternalConfig, IntegresqlRole, LeaseAuth, PoolConfig,
    PoolLimits, ServerConfig, Storage, TemplateConfig, TemplateSource,
};

use super::file::{file_version, found_file_is_ours, ConfigFile, ConfigFrom};
use super::serve::{LeaseAuthArg, ServeArgs, StorageArg, StrategyArg};
use super::templates::{absolute, add_watch, command_timeout, parse_template_flag, push_template};
use super::DEFAULT_LISTEN;

/// Everything `serve` needs, validated.
#[derive(Debug)]
pub struct ServeConfig {
    /// The config file read, if any.
    pub config_from: ConfigFrom,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// Where the IntegreSQL API is served alone, if anywhere.
    pub integresql_listen: Option<SocketAddr>,
    /// The pool.
    pub pool: PoolConfig,
    /// The API.
    pub api: ApiConfig,
}

impl ServeArgs {
    /// Reads the config file (if any), applies the flags over it, and validates the result.
    /// Errors are one line for the user.
    pub fn into_config(self) -> Result<ServeConfig, String> {
        let working_dir = std::env::current_dir().ok();
        let config_from = ConfigFrom::resolve(self.config.clone(), working_dir.as_deref());
        if let ConfigFrom::Found(path) = &config_from {
            found_file_is_ours(path)?;
        }
        let (file, file_dir) = match config_from.path() {
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
        let defaults = PoolLimits::default();
        let limits = PoolLimits {
            min_ready: self
                .min_ready
                .or(file.min_ready)
                .unwrap_or(defaults.min_ready),
            max_total: self
                .max_total
                .or(file.max_total)
                .unwrap_or(defaults.max_total),
            clone_concurrency: self
                .clone_concurrency
                .or(file.clone_concurrency)
                .unwrap_or(defaults.clone_concurrency),
            default_ttl: self
                .default_ttl
                .or(file.default_ttl_secs)
                .map(Duration::from_secs)
                .unwrap_or(defaults.default_ttl),
            max_ttl: defaults.max_ttl,
            lease_connections: self
                .lease_connections
                .or(file.lease_connections)
                .unwrap_or(defaults.lease_connections),
            max_waiting: self
                .max_waiting
                .or(file.max_waiting)
                .unwrap_or(defaults.max_waiting),
            build_timeout: match self.build_timeout.or(file.build_timeout_secs) {
                None => defaults.build_timeout,
                Some(secs) => {
                    command_timeout(Some(secs)).map_err(|e| format!("--build-timeout: {e}"))?
                }
            },
            initialize_timeout: match self.initialize_timeout.or(file.initialize_timeout_secs) {
                None => defaults.initialize_timeout,
                Some(secs @ 1..=86_400) => Duration::from_secs(secs),
                Some(secs) => {
                    return Err(format!(
                        "--initialize-timeout must be between 1 and 86400 seconds, got {secs}"
                    ))
                }
            },
            max_bytes: self
                .max_bytes
                .or(file.max_bytes)
                .map(|size| parse_size(&size))
                .transpose()?,
            max_kept: match self.max_kept.or(file.max_kept) {
                None => defaults.max_kept,
                Some(n @ 0..=1000) => n,
                Some(n) => return Err(format!("--max-kept must be at most 1000, got {n}")),
            },
            max_keep: match self.max_keep.or(file.max_keep_secs) {
                None => defaults.max_keep,
                Some(secs @ 1..=86_400) => Duration::from_secs(secs),
                Some(secs) => {
                    return Err(format!(
                        "--max-keep must be between 1 and 86400 seconds, got {secs}"
                    ))
                }
            },
            // On unless turned off (the flag, or `reuse_unchanged = false` in the file).
            reuse_unchanged: if self.reuse_unchanged || self.no_reuse_unchanged {
                self.reuse_unchanged
            } else {
                file.reuse_unchanged.unwrap_or(defaults.reuse_unchanged)
            },
        };
        if !(1..=10_000).contains(&limits.lease_connections) {
            return Err("--lease-connections must be between 1 and 10000".into());
        }
        if limits.max_total == 0 || limits.min_ready > limits.max_total {
            return Err(format!(
                "--max-total must be at least 1 and at least --min-ready (got min_ready {}, max_total {})",
                limits.min_ready, limits.max_total
            ));
        }
        if limits.clone_concurrency == 0
            || limits.default_ttl.is_zero()
            || limits.default_ttl > limits.max_ttl
        {
            return Err(
                "--clone-concurrency must be at least 1 and --default-ttl between 1 and 86400"
                    .into(),
            );
        }
        let mut templates = Vec::new();
        for (name, source) in &file.templates {
            let version = source
                .postgres_version
                .as_ref()
                .map(file_version)
                .transpose()
                .map_err(|e| format!("template {name:?}: {e}"))?;
            if source.command.is_none() && (source.workdir.is_some() || !source.watch.is_empty()) {
                return Err(format!(
                    "template {name:?}: workdir and watch go with command"
                ));
            }
            if source.command.is_none() && source.dump.is_none() && source.timeout_secs.is_some() {
                return Err(format!(
                    "template {name:?}: timeout_secs goes with command or dump"
                ));
            }
            if source.dump.is_none() && source.jobs.is_some() {
                return Err(format!("template {name:?}: jobs goes with dump"));
            }
            if let Some(dump) = &source.dump {
                if source.migrations.is_some() || source.sql.is_some() || source.command.is_some() {
                    return Err(format!("template {name:?}: {}", one_source_kind()));
                }
                let timeout = match source.timeout_secs {
                    None => pglease_pool::config::DEFAULT_DUMP_TIMEOUT,
                    Some(secs) => {
                        command_timeout(Some(secs)).map_err(|e| format!("timeout_secs: {e}"))?
                    }
                };
                let plain = TemplateSource::Dump(DumpSource {
                    path: absolute(&file_dir.join(dump))?,
                    jobs: match source.jobs {
                        Some(0) => {
                            return Err(format!("template {name:?}: jobs must be at least 1"))
                        }
                        jobs => jobs,
                    },
                    timeout,
                    // The operator's own dump: a script is as trusted as a command.
                    allow_script: true,
                });
                let source = if source.superuser {
                    TemplateSource::Superuser(Box::new(plain))
                } else {
                    plain
                };
                push_template(&mut templates, name, source, version)?;
                continue;
            }
            let plain = match (&source.migrations, &source.sql, &source.command) {
                (Some(dir), None, None) => {
                    TemplateSource::Migrations(absolute(&file_dir.join(dir))?)
                }
                (None, Some(path), None) => {
                    TemplateSource::SqlFile(absolute(&file_dir.join(path))?)
                }
                (None, None, Some(command)) => {
                    let workdir = absolute(
                        &file_dir.join(source.workdir.as_deref().unwrap_or(Path::new("."))),
                    )?;
                    TemplateSource::Command(CommandSource {
                        command: command.clone(),
                        watch: source
                            .watch
                            .iter()
                            .map(|path| absolute(&workdir.join(path)))
                            .collect::<Result<_, _>>()?,
                        workdir,
                        timeout: command_timeout(source.timeout_secs)
                            .map_err(|e| format!("timeout_secs: {e}"))?,
                    })
                }
                (None, None, None) => TemplateSource::Empty,
                _ => return Err(format!("template {name:?}: {}", one_source_kind())),
            };
            let source = if source.superuser {
                TemplateSource::Superuser(Box::new(plain))
            } else {
                plain
            };
            push_template(&mut templates, name, source, version)?;
        }
        for spec in &self.templates {
            let (name, version, source) = parse_template_flag(spec)?;
            templates.retain(|t: &TemplateConfig| t.name.as_str() != name);
            push_template(&mut templates, name, source, version)?;
        }
        for spec in &self.watches {
            add_watch(&mut templates, spec)?;
        }
        let postgres = file.postgres;
        let server = match self.postgres_url.or(postgres.url) {
            Some(_) if self.postgres_version.is_some() || postgres.postgres_version.is_some() => {
                return Err(
                    "--postgres-version picks the server pglease starts itself; with \
                            --postgres-url it uses that server as it is: give one or the other"
                        .into(),
                )
            }
            Some(_) if self.snapshot_dir.is_some() || postgres.snapshot_dir.is_some() => {
                return Err(
                    "--snapshot-dir saves and restores the cluster pglease starts itself; an \
                     external server (--postgres-url) keeps its templates across runs by itself"
                        .into(),
                )
            }
            Some(_) if matches!(self.storage.or(postgres.storage), Some(StorageArg::Cow)) => {
                return Err(
                    "--storage cow is the store of the cluster pglease starts itself; an \
                     external server (--postgres-url) keeps its own"
                        .into(),
                )
            }
            Some(url) => ServerConfig::External(ExternalConfig {
                url,
                advertise_host: self.advertise_host.or(postgres.advertise_host),
            }),
            None => {
                let mut embedded = EmbeddedConfig::for_limits(&limits, templates.len() + 1);
                embedded.bin_dir = self.pg_bin_dir.or(postgres.bin_dir);
                embedded.postgres_version = match self.postgres_version {
                    Some(text) => Some(
                        text.parse()
                            .map_err(|e| format!("--postgres-version: {e}"))?,
                    ),
                    None => postgres
                        .postgres_version
                        .map(|value| file_version(&value))
                        .transpose()?,
                };
                if let Some(url) = self.postgres_repository.or(postgres.postgres_repository) {
                    if !url.starts_with("https://") && !url.starts_with("http://") {
                        return Err(format!(
                            "--postgres-repository {url:?}: expected an http(s) URL"
                        ));
                    }
                    embedded.binaries_repository = url;
                }
                embedded.data_dir = self.data_dir.or(postgres.data_dir);
                embedded.tmpfs_size = self
                    .tmpfs_size
                    .or(postgres.tmpfs_size)
                    .map(|s| parse_size(&s))
                    .transpose()?;
                embedded.allow_unsafe_on_disk = switch(
                    self.allow_unsafe_on_disk,
                    self.no_allow_unsafe_on_disk,
                    postgres.allow_unsafe_on_disk,
                );
                embedded.pg_user = self.pg_user.or(postgres.user);
                embedded.cache_dir = self.cache_dir.or(postgres.cache_dir);
                embedded.listen_host = self
                    .pg_listen
                    .or(postgres.listen)
                    .unwrap_or(embedded.listen_host);
                embedded.port = self.pg_port.or(postgres.port).filter(|&p| p != 0);
                embedded.advertise_host = self.advertise_host.or(postgres.advertise_host);
                embedded.locale = self.locale.or(postgres.locale).unwrap_or(embedded.locale);
                embedded.encoding = self
                    .encoding
                    .or(postgres.encoding)
                    .unwrap_or(embedded.encoding);
                embedded.keep_data = switch(self.keep_data, self.no_keep_data, postgres.keep_data);
                embedded.snapshot_dir = self.snapshot_dir.or(postgres.snapshot_dir);
                embedded.storage = match self.storage.or(postgres.storage) {
                    Some(StorageArg::Cow) => Storage::Cow,
                    Some(StorageArg::Tmpfs) => Storage::Tmpfs,
                    Some(StorageArg::Auto) | None => Storage::Auto,
                };
                if embedded.keep_data && embedded.snapshot_dir.is_some() {
                    return Err(
                        "--snapshot-dir and --keep-data both carry templates to the next \
                                run: give one (a snapshot is one file a CI cache can keep)"
                            .into(),
                    );
                }
                for (key, value) in postgres.settings {
                    let value = match value {
                        toml::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    embedded.settings.push(checked_setting(&key, &value)?);
                }
                for setting in &self.pg_settings {
                    let (key, value) = setting
                        .split_once('=')
                        .ok_or_else(|| format!("--pg-setting {setting:?}: expected KEY=VALUE"))?;
                    embedded.settings.push(checked_setting(key, value)?);
                }
                ServerConfig::Embedded(Box::new(embedded))
            }
        };
        let strategy = match self.clone_strategy.or(file.clone_strategy) {
            Some(StrategyArg::WalLog) => CloneStrategy::WalLog,
            Some(StrategyArg::FileCopy) | None => CloneStrategy::FileCopy,
        };
        let iterations = self
            .scram_iterations
            .or(file.scram_iterations)
            .unwrap_or(DEFAULT_SCRAM_ITERATIONS);
        if iterations == 0 {
            return Err("--scram-iterations must be at least 1".into());
        }
        let lease_auth = match self.lease_auth.or(file.lease_auth) {
            Some(LeaseAuthArg::Trust) => LeaseAuth::Trust,
            Some(LeaseAuthArg::Scram) | None => LeaseAuth::Scram { iterations },
        };
        let listen = match self.listen.or(file.listen) {
            Some(listen) => listen,
            None => DEFAULT_LISTEN
                .parse()
                .map_err(|e| format!("default listen address: {e}"))?,
        };
        let token = match (self.token, &self.token_file) {
            (Some(_), Some(_)) => {
                return Err("give the token with --token (PGLEASE_TOKEN) or --token-file (PGLEASE_TOKEN_FILE), not both".into())
            }
            (None, Some(path)) => Some(read_token_file(path)?),
            (token, None) => token,
        };
        let token = match token {
            Some(token) if token.trim().is_empty() => return Err("--token is empty".into()),
            Some(token) => Some(Token::new(token)),
            None if !listen.ip().is_loopback() => {
                return Err(format!(
                    "--listen {listen} is not a loopback address: give a --token or --token-file (or PGLEASE_TOKEN / PGLEASE_TOKEN_FILE) that clients must send"
                ))
            }
            None => None,
        };
        if let Some(address) = self.integresql_listen {
            if !address.ip().is_loopback() && !self.integresql_allow_remote {
                return Err(format!(
                    "--integresql-listen {address} is not a loopback address, and IntegreSQL clients send no token: anyone reaching it could lease databases; pass --integresql-allow-remote if that is intended"
                ));
            }
        }
        let integresql_role = integresql_role(
            self.integresql_pg_user.or(file.integresql_pg_user),
            self.integresql_pg_password.or(file.integresql_pg_password),
        )?;
        // Only a token holder may make the daemon download and start another major.
        let majors_on_request = token.is_some();
        Ok(ServeConfig {
            config_from,
            listen,
            integresql_listen: self.integresql_listen,
            api: ApiConfig {
                max_ttl: limits.max_ttl,
                allow_http_commands: self.allow_http_commands,
                token,
                ..ApiConfig::default()
            },
            pool: PoolConfig {
                server,
                templates,
                limits,
                clone_strategy: strategy,
                prebuild: switch(self.prebuild, self.no_prebuild, file.prebuild),
                lease_auth,
                lease_superuser: switch(
                    self.lease_superuser,
                    self.no_lease_superuser,
                    file.lease_superuser,
                ),
                verify_templates: switch(
                    self.verify_templates,
                    self.no_verify_templates,
                    file.verify_templates,
                ),
                child_user: self.child_user.or(file.child_user),
                majors_on_request,
                integresql_role,
            },
        })
    }
}
/// `--integresql-pg-user` with its password: both or neither.
fn integresql_role(
    user: Option<String>,
    password: Option<String>,
) -> Result<Option<IntegresqlRole>, String> {
    match (user, password) {
        (None, None) => Ok(None),
        (Some(name), Some(password)) => {
            pglease_pool::names::check_role_name(&name)
                .map_err(|e| format!("--integresql-pg-user: {e}"))?;
            if password.is_empty() {
                return Err("--integresql-pg-password is empty".into());
            }
            Ok(Some(IntegresqlRole { name, password }))
        }
        (Some(_), None) => Err(
            "--integresql-pg-user needs --integresql-pg-password (or PGLEASE_INTEGRESQL_PG_PASSWORD): the suites' PGPASSWORD"
                .into(),
        ),
        (None, Some(_)) => {
            Err("--integresql-pg-password without --integresql-pg-user: give the role's name too".into())
        }
    }
}

/// An on/off option: `--x` or `--no-x` if given (clap keeps only the last of the two, so
/// `on` and `off` are never both set), else the config file's value, else off.
fn switch(on: bool, off: bool, file: Option<bool>) -> bool {
    if on || off {
        on
    } else {
        file.unwrap_or(false)
    }
}
/// A postgres setting name is an identifier; values go as one argv element.
fn checked_setting(key: &str, value: &str) -> Result<(String, String), String> {
    let valid = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    if !valid {
        return Err(format!("postgres setting name {key:?} is not valid"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// `512M`, `2G`, `64MB`, `1GiB`, or bytes.
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("size {text:?}: expected e.g. 512M or 2G"))?;
    let multiplier: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => {
            return Err(format!(
                "size {text:?}: unknown unit {unit:?} (use K, M or G)"
            ))
        }
    };
    number
        .checked_mul(multiplier)
        .filter(|&bytes| bytes >= 16 << 20)
        .ok_or_else(|| format!("size {text:?}: must be at least 16M"))
}

/// The token in `path`: its content without surrounding white space (a trailing newline,
/// as `echo` writes). An unreadable or empty file is a configuration error.
fn read_token_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("--token-file {} is empty", path.display()));
    }
    Ok(token.to_owned())
}
