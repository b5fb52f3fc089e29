//! `serve`'s flags merged over its config file, one function per section (`limits`,
//! `templates` in `templates.rs`, `server` in `server.rs`, `clone_strategy`, `lease_auth`,
//! `http`, `integresql`, `front_listen`, `front_tls`): each takes the flags and the file's
//! table, applies the flags over the file and the file over the defaults, and checks the
//! result; `into_config` only calls them in turn and assembles the validated `ServeConfig`.
//! How a flag and the file's value combine, shared with `server.rs`, is `merge.rs`'s.
//!
//! The sections read `ServeArgs` whole rather than a struct of their own flags: clap lists
//! the options in `--help` in the order `ServeArgs` declares them, which is not by section.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pglease_api::ApiConfig;
use pglease_front::{FrontConfig, FrontTls};
use pglease_pool::config::DEFAULT_SCRAM_ITERATIONS;
use pglease_pool::{
    CloneStrategy, IntegresqlRole, LeaseAuth, LeaseMaxBytes, PoolConfig, PoolLimits,
};

use super::file::{self, ConfigFile, ConfigFrom, Loaded};
use super::merge::{flag_or_file, parse_size, switch};
use super::serve::{FrontAddress, FrontTlsArg, LeaseAuthArg, ServeArgs, StrategyArg};
use super::server::server;
use super::templates::{command_timeout, templates};
use super::DEFAULT_LISTEN;

/// Where the PostgreSQL front listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontListen {
    /// The address.
    pub address: SocketAddr,
    /// Whether the operator chose it: a chosen address that cannot be bound stops the start;
    /// the default one is skipped with a warning (another daemon, or a postgres, has it).
    pub chosen: bool,
}

/// Everything `serve` needs, validated.
#[derive(Debug)]
pub struct ServeConfig {
    /// The config file read, if any.
    pub config_from: ConfigFrom,
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// Where the IntegreSQL API is served alone, if anywhere.
    pub integresql_listen: Option<SocketAddr>,
    /// Where the PostgreSQL front listens, if anywhere.
    pub front_listen: Option<FrontListen>,
    /// The PostgreSQL front.
    pub front: FrontConfig,
    /// The pool.
    pub pool: PoolConfig,
    /// The API.
    pub api: ApiConfig,
}

impl ServeArgs {
    /// Reads the config file (if any), applies the flags over it, and validates the result.
    /// Errors are one line for the user. The sections are resolved in a fixed order, so
    /// that of several mistakes the same one is reported first each time.
    pub fn into_config(self) -> Result<ServeConfig, String> {
        let Loaded {
            from: config_from,
            file,
            dir: file_dir,
        } = file::load(self.config.clone())?;
        let limits = limits(&self, &file)?;
        let templates = templates(&self, &file.templates, &file_dir)?;
        let server = server(&self, &file.postgres, &limits, templates.len())?;
        let clone_strategy = clone_strategy(&self, &file);
        let lease_auth = lease_auth(&self, &file)?;
        let http = http(&self, &file)?;
        let integresql = integresql(&self, &file)?;
        let front_listen = front_listen(&self, &file, &http)?;
        let front_tls = front_tls(&self, &file, &file_dir, front_listen.as_ref())?;
        let require_tls = self.front_require_tls || file.front_require_tls.unwrap_or(false);
        if require_tls && front_tls.is_none() && front_listen.is_some() {
            return Err(
                "--front-require-tls (front_require_tls) needs TLS at the front: \
                 --front-tls self-signed, or --front-tls-cert with --front-tls-key"
                    .into(),
            );
        }
        // Only a token holder may make the daemon download and start another major.
        let majors_on_request = http.token.is_some();
        let api = ApiConfig {
            max_ttl: limits.max_ttl,
            allow_http_commands: self.allow_http_commands,
            token: http.token.map(pglease_pool::Token::new),
            integresql_server_login: integresql.role.clone().filter(|role| role.server_login),
            ..ApiConfig::default()
        };
        // The front leases as POST /lease does, and asks for the same token.
        let front = FrontConfig {
            default_wait: api.default_wait,
            token: api.token.clone(),
            key_grace: self
                .front_key_grace_ms
                .or(file.front_key_grace_ms)
                .map_or(pglease_front::DEFAULT_KEY_GRACE, Duration::from_millis),
            max_connections: match self.front_max_connections.or(file.front_max_connections) {
                Some(0) => return Err("--front-max-connections must be at least 1".into()),
                Some(max) => max,
                None => pglease_front::DEFAULT_MAX_CONNECTIONS,
            },
            tls: front_tls,
            require_tls,
        };
        Ok(ServeConfig {
            config_from,
            listen: http.listen,
            integresql_listen: integresql.listen,
            front_listen,
            front,
            api,
            pool: PoolConfig {
                server,
                templates,
                limits,
                clone_strategy,
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
                integresql_role: integresql.role,
            },
        })
    }
}

/// The pool's limits (`--min-ready`, `--max-total`, the timeouts, the byte budget, what is
/// kept, `--reuse-unchanged`…) over the config file's top-level keys of the same names (the
/// durations with `_secs`), over `PoolLimits::default()`; then checked against each other.
fn limits(flags: &ServeArgs, file: &ConfigFile) -> Result<PoolLimits, String> {
    let defaults = PoolLimits::default();
    let limits = PoolLimits {
        min_ready: flags
            .min_ready
            .or(file.min_ready)
            .unwrap_or(defaults.min_ready),
        max_total: flags
            .max_total
            .or(file.max_total)
            .unwrap_or(defaults.max_total),
        clone_concurrency: flags
            .clone_concurrency
            .or(file.clone_concurrency)
            .unwrap_or(defaults.clone_concurrency),
        default_ttl: flags
            .default_ttl
            .or(file.default_ttl_secs)
            .map(Duration::from_secs)
            .unwrap_or(defaults.default_ttl),
        max_ttl: defaults.max_ttl,
        lease_connections: flags
            .lease_connections
            .or(file.lease_connections)
            .unwrap_or(defaults.lease_connections),
        max_waiting: flags
            .max_waiting
            .or(file.max_waiting)
            .unwrap_or(defaults.max_waiting),
        build_timeout: match flags.build_timeout.or(file.build_timeout_secs) {
            None => defaults.build_timeout,
            Some(secs) => {
                command_timeout(Some(secs)).map_err(|e| format!("--build-timeout: {e}"))?
            }
        },
        initialize_timeout: match flags.initialize_timeout.or(file.initialize_timeout_secs) {
            None => defaults.initialize_timeout,
            Some(secs @ 1..=86_400) => Duration::from_secs(secs),
            Some(secs) => {
                return Err(format!(
                    "--initialize-timeout must be between 1 and 86400 seconds, got {secs}"
                ))
            }
        },
        max_bytes: flag_or_file(&flags.max_bytes, &file.max_bytes)
            .map(|size| parse_size(&size))
            .transpose()?,
        lease_max_bytes: match flag_or_file(&flags.lease_max_bytes, &file.lease_max_bytes) {
            None => defaults.lease_max_bytes,
            Some(size) => lease_max_bytes(&size).map_err(|e| format!("--lease-max-bytes: {e}"))?,
        },
        max_kept: match flags.max_kept.or(file.max_kept) {
            None => defaults.max_kept,
            Some(n @ 0..=1000) => n,
            Some(n) => return Err(format!("--max-kept must be at most 1000, got {n}")),
        },
        max_keep: match flags.max_keep.or(file.max_keep_secs) {
            None => defaults.max_keep,
            Some(secs @ 1..=86_400) => Duration::from_secs(secs),
            Some(secs) => {
                return Err(format!(
                    "--max-keep must be between 1 and 86400 seconds, got {secs}"
                ))
            }
        },
        // On unless turned off (the flag, or `reuse_unchanged = false` in the file).
        reuse_unchanged: if flags.reuse_unchanged || flags.no_reuse_unchanged {
            flags.reuse_unchanged
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
            "--clone-concurrency must be at least 1 and --default-ttl between 1 and 86400".into(),
        );
    }
    Ok(limits)
}

/// `--clone-strategy` over the config file's `clone_strategy`, else FILE_COPY.
fn clone_strategy(flags: &ServeArgs, file: &ConfigFile) -> CloneStrategy {
    match flags.clone_strategy.or(file.clone_strategy) {
        Some(StrategyArg::WalLog) => CloneStrategy::WalLog,
        Some(StrategyArg::FileCopy) | None => CloneStrategy::FileCopy,
    }
}

/// How lease roles log in: `--lease-auth` and `--scram-iterations` over the config file's
/// `lease_auth` and `scram_iterations`, else SCRAM with postgres' own iteration count.
fn lease_auth(flags: &ServeArgs, file: &ConfigFile) -> Result<LeaseAuth, String> {
    let iterations = flags
        .scram_iterations
        .or(file.scram_iterations)
        .unwrap_or(DEFAULT_SCRAM_ITERATIONS);
    if iterations == 0 {
        return Err("--scram-iterations must be at least 1".into());
    }
    Ok(match flags.lease_auth.or(file.lease_auth) {
        Some(LeaseAuthArg::Trust) => LeaseAuth::Trust,
        Some(LeaseAuthArg::Scram) | None => LeaseAuth::Scram { iterations },
    })
}

/// The HTTP API's section, resolved.
struct Http {
    /// Where it listens.
    listen: SocketAddr,
    /// The bearer token its clients must send, if any (the front's password too).
    token: Option<String>,
}

/// `--listen` over the config file's `listen`, else `DEFAULT_LISTEN`; the token from
/// `--token` or `--token-file` (never the config file, which others may read), required
/// when the address is not a loopback one.
fn http(flags: &ServeArgs, file: &ConfigFile) -> Result<Http, String> {
    let listen = match flags.listen.or(file.listen) {
        Some(listen) => listen,
        None => DEFAULT_LISTEN
            .parse()
            .map_err(|e| format!("default listen address: {e}"))?,
    };
    let token = match (&flags.token, &flags.token_file) {
        (Some(_), Some(_)) => {
            return Err("give the token with --token (PGLEASE_TOKEN) or --token-file (PGLEASE_TOKEN_FILE), not both".into())
        }
        (None, Some(path)) => Some(read_token_file(path)?),
        (token, None) => token.clone(),
    };
    let token = match token {
        Some(token) if token.trim().is_empty() => return Err("--token is empty".into()),
        Some(token) => Some(token),
        None if !listen.ip().is_loopback() => {
            return Err(format!(
                "--listen {listen} is not a loopback address: give a --token or --token-file (or PGLEASE_TOKEN / PGLEASE_TOKEN_FILE) that clients must send"
            ))
        }
        None => None,
    };
    Ok(Http { listen, token })
}

/// The IntegreSQL API's section, resolved.
struct Integresql {
    /// Where it is served alone (besides `/api/v1` on the main port), if anywhere.
    listen: Option<SocketAddr>,
    /// The login role its suites name in their PG* variables, if any.
    role: Option<IntegresqlRole>,
}

/// `--integresql-listen` (loopback unless `--integresql-allow-remote`: its clients send no
/// token) and the role of `--integresql-pg-user` / `--integresql-pg-password` over the
/// config file's `integresql_pg_user` / `integresql_pg_password`.
fn integresql(flags: &ServeArgs, file: &ConfigFile) -> Result<Integresql, String> {
    if let Some(address) = flags.integresql_listen {
        if !address.ip().is_loopback() && !flags.integresql_allow_remote {
            return Err(format!(
                "--integresql-listen {address} is not a loopback address, and IntegreSQL clients send no token: anyone reaching it could lease databases; pass --integresql-allow-remote if that is intended"
            ));
        }
    }
    let role = integresql_role(
        flag_or_file(&flags.integresql_pg_user, &file.integresql_pg_user),
        flag_or_file(&flags.integresql_pg_password, &file.integresql_pg_password),
        server_login(flag_or_file(&flags.postgres_url, &file.postgres.url).as_deref()),
    )?;
    Ok(Integresql {
        listen: flags.integresql_listen,
        role,
    })
}

/// `--front-listen` over the config file's `front_listen`, else the default: loopback, on
/// the HTTP port + 1 (a port of 0 stays 0). Without a token the front lets in any user and
/// password, as the HTTP API lets in any caller: loopback only, as for `--listen`.
fn front_listen(
    flags: &ServeArgs,
    file: &ConfigFile,
    http: &Http,
) -> Result<Option<FrontListen>, String> {
    let address = match flags.front_listen.or(file.front_listen) {
        Some(FrontAddress::Off) => return Ok(None),
        Some(FrontAddress::At(address)) => address,
        None => {
            let ip = match http.listen.ip() {
                ip if ip.is_loopback() => ip,
                _ => std::net::Ipv4Addr::LOCALHOST.into(),
            };
            let port = match http.listen.port() {
                0 | u16::MAX => 0,
                port => port + 1,
            };
            return Ok(Some(FrontListen {
                address: SocketAddr::new(ip, port),
                chosen: false,
            }));
        }
    };
    if !address.ip().is_loopback() && http.token.is_none() {
        return Err(format!(
            "--front-listen {address} is not a loopback address, and without a token the \
             PostgreSQL front lets in any user and password: give a --token or --token-file \
             (or PGLEASE_TOKEN / PGLEASE_TOKEN_FILE), which clients then send as the password"
        ));
    }
    Ok(Some(FrontListen {
        address,
        chosen: true,
    }))
}

/// The TLS the front may serve, as chosen.
enum TlsChoice {
    /// None.
    Off,
    /// A certificate made at start.
    SelfSigned,
    /// The operator's certificate and key files.
    Files { cert: PathBuf, key: PathBuf },
}

/// `--front-tls`, or `--front-tls-cert` with `--front-tls-key`, over the config file's
/// `front_tls`, or `front_tls_cert` with `front_tls_key` (relative to the file), else off;
/// then made, when the front is on: the certificate and key read now, once (a file that
/// cannot be read or used stops the start, naming it), or a self-signed certificate made
/// for loopback and the front's address.
fn front_tls(
    flags: &ServeArgs,
    file: &ConfigFile,
    file_dir: &Path,
    listen: Option<&FrontListen>,
) -> Result<Option<FrontTls>, String> {
    let mode = |mode| match mode {
        FrontTlsArg::Off => TlsChoice::Off,
        FrontTlsArg::SelfSigned => TlsChoice::SelfSigned,
    };
    let choice = match (flags.front_tls, &flags.front_tls_cert, &flags.front_tls_key) {
        (Some(tls), None, None) => mode(tls),
        (None, Some(cert), Some(key)) => TlsChoice::Files {
            cert: cert.clone(),
            key: key.clone(),
        },
        // clap lets no other combination through.
        (Some(_), _, _) | (None, Some(_), None) | (None, None, Some(_)) => {
            return Err(
                "give --front-tls, or --front-tls-cert with --front-tls-key, not both".into(),
            )
        }
        (None, None, None) => match (file.front_tls, &file.front_tls_cert, &file.front_tls_key) {
            (None, None, None) => TlsChoice::Off,
            (Some(tls), None, None) => mode(tls),
            (None, Some(cert), Some(key)) => TlsChoice::Files {
                cert: file_dir.join(cert),
                key: file_dir.join(key),
            },
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(
                    "front_tls_cert and front_tls_key go together in the config file: the \
                     certificate and its key"
                        .into(),
                )
            }
            (Some(_), _, _) => {
                return Err(
                    "the config file has front_tls and front_tls_cert / front_tls_key: give \
                     one (a certificate's files imply TLS)"
                        .into(),
                )
            }
        },
    };
    // No front, nothing to encrypt: the files are not read.
    let Some(listen) = listen else {
        return Ok(None);
    };
    let made = match choice {
        TlsChoice::Off => return Ok(None),
        TlsChoice::SelfSigned => FrontTls::self_signed(listen.address.ip()),
        TlsChoice::Files { cert, key } => {
            let absolute = |path: &Path| {
                std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
            };
            FrontTls::from_pem_files(&absolute(&cert)?, &absolute(&key)?)
        }
    };
    made.map(Some).map_err(|error| error.to_string())
}

/// `--integresql-pg-user` with its password: both or neither.
fn integresql_role(
    user: Option<String>,
    password: Option<String>,
    server: Option<(String, Option<String>)>,
) -> Result<Option<IntegresqlRole>, String> {
    // The external server's own login (compose's layout: IntegreSQL and the app share the
    // server's user): its password is the URL's unless given, and its name may be any.
    if let (Some(name), Some((server_user, server_password))) = (&user, server) {
        if *name == server_user {
            let password = match (password, server_password) {
                (Some(given), Some(url)) if given != url => {
                    return Err(format!(
                        "--integresql-pg-user {name} is the --postgres-url's user, whose password the URL gives: --integresql-pg-password differs from it"
                    ))
                }
                (Some(password), _) | (None, Some(password)) => password,
                (None, None) => {
                    return Err(format!(
                        "--integresql-pg-user {name} is the --postgres-url's user, and the URL has no password: give --integresql-pg-password, the suites' PGPASSWORD"
                    ))
                }
            };
            return Ok(Some(IntegresqlRole {
                name: name.clone(),
                password,
                server_login: true,
            }));
        }
    }
    match (user, password) {
        (None, None) => Ok(None),
        (Some(name), Some(password)) => {
            pglease_pool::names::check_role_name(&name)
                .map_err(|e| format!("--integresql-pg-user: {e}"))?;
            if password.is_empty() {
                return Err("--integresql-pg-password is empty".into());
            }
            Ok(Some(IntegresqlRole {
                name,
                password,
                server_login: false,
            }))
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

/// The user and password of an external server's URL, when it names a user. A URL that does
/// not parse is the server section's error to report, not this one's.
fn server_login(url: Option<&str>) -> Option<(String, Option<String>)> {
    pglease_pool::ExternalConfig::login_of(url?)
}

/// `--lease-max-bytes`: `0` or `off` for no limit, else a size as [`parse_size`] reads it.
fn lease_max_bytes(text: &str) -> Result<LeaseMaxBytes, String> {
    match text.trim() {
        "0" | "off" => Ok(LeaseMaxBytes::Off),
        size => parse_size(size).map(LeaseMaxBytes::Bytes),
    }
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
