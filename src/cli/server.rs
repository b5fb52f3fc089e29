//! The server section of `serve`'s configuration: `--postgres-url` and the config file's
//! `[postgres]` table pick an external server or the one pglease starts itself, and for
//! the latter the flags over that table give its binaries, directories, storage, listen
//! address, initdb options and settings.

use pglease_pool::{EmbeddedConfig, ExternalConfig, PoolLimits, ServerConfig, Storage};

use super::file::{file_version, PostgresFile};
use super::merge::{flag_or_file, parse_size, switch};
use super::serve::{ServeArgs, StorageArg};

/// The server: external with `--postgres-url` (or `url` in `[postgres]`), which refuses
/// the options only a server pglease starts can have; else the embedded one, sized for
/// `limits` and `template_count` templates (the `default` template besides).
pub(super) fn server(
    flags: &ServeArgs,
    postgres: &PostgresFile,
    limits: &PoolLimits,
    template_count: usize,
) -> Result<ServerConfig, String> {
    match flag_or_file(&flags.postgres_url, &postgres.url) {
        Some(_) if flags.postgres_version.is_some() || postgres.postgres_version.is_some() => Err(
            "--postgres-version picks the server pglease starts itself; with \
                        --postgres-url it uses that server as it is: give one or the other"
                .into(),
        ),
        Some(_) if flags.snapshot_dir.is_some() || postgres.snapshot_dir.is_some() => Err(
            "--snapshot-dir saves and restores the cluster pglease starts itself; an \
                 external server (--postgres-url) keeps its templates across runs by itself"
                .into(),
        ),
        Some(_) if matches!(flags.storage.or(postgres.storage), Some(StorageArg::Cow)) => Err(
            "--storage cow is the store of the cluster pglease starts itself; an \
                 external server (--postgres-url) keeps its own"
                .into(),
        ),
        Some(url) => Ok(ServerConfig::External(ExternalConfig {
            url,
            advertise_host: flag_or_file(&flags.advertise_host, &postgres.advertise_host),
        })),
        None => Ok(ServerConfig::Embedded(Box::new(embedded(
            flags,
            postgres,
            limits,
            template_count,
        )?))),
    }
}

/// With a snapshot directory, the key file that authenticates its snapshots: the one given,
/// else `snapshot.key` in the cache root. Refused inside the snapshot directory, whose
/// writers (other jobs of a CI cache) could then read it and forge a snapshot.
fn snapshot_key_file(
    flags: &ServeArgs,
    postgres: &PostgresFile,
    embedded: &EmbeddedConfig,
) -> Result<Option<std::path::PathBuf>, String> {
    let given = flag_or_file(&flags.snapshot_key_file, &postgres.snapshot_key_file);
    let Some(dir) = &embedded.snapshot_dir else {
        return match given {
            Some(_) => Err(
                "--snapshot-key-file authenticates the snapshots of --snapshot-dir: give \
                 --snapshot-dir too, or leave the key out"
                    .into(),
            ),
            None => Ok(None),
        };
    };
    let key = given.unwrap_or_else(|| {
        pglease_pool::postgres::snapshot::default_key_path(
            &embedded
                .cache_dir
                .clone()
                .unwrap_or_else(pglease_binaries::default_cache_root),
        )
    });
    if super::paths::resolved(&key).starts_with(super::paths::resolved(dir)) {
        return Err(format!(
            "the snapshot key {} is inside --snapshot-dir {}: whoever can write the \
             snapshots could read it and forge one; keep it elsewhere (--snapshot-key-file, \
             or --cache-dir for the default one)",
            key.display(),
            dir.display()
        ));
    }
    Ok(Some(key))
}

/// The server pglease starts itself: the flags over `[postgres]`, over
/// `EmbeddedConfig::for_limits`.
fn embedded(
    flags: &ServeArgs,
    postgres: &PostgresFile,
    limits: &PoolLimits,
    template_count: usize,
) -> Result<EmbeddedConfig, String> {
    let mut embedded = EmbeddedConfig::for_limits(limits, template_count + 1);
    embedded.bin_dir = flag_or_file(&flags.pg_bin_dir, &postgres.bin_dir);
    embedded.postgres_version = match &flags.postgres_version {
        Some(text) => Some(
            text.parse()
                .map_err(|e| format!("--postgres-version: {e}"))?,
        ),
        None => postgres
            .postgres_version
            .as_ref()
            .map(file_version)
            .transpose()?,
    };
    if let Some(url) = flag_or_file(&flags.postgres_repository, &postgres.postgres_repository) {
        if !url.starts_with("https://") && !url.starts_with("http://") {
            return Err(format!(
                "--postgres-repository {url:?}: expected an http(s) URL"
            ));
        }
        embedded.binaries_repository = url;
    }
    embedded.data_dir = flag_or_file(&flags.data_dir, &postgres.data_dir);
    embedded.tmpfs_size = flag_or_file(&flags.tmpfs_size, &postgres.tmpfs_size)
        .map(|s| parse_size(&s))
        .transpose()?;
    embedded.databases_dir = match flags.no_databases_dir {
        true => None,
        false => flag_or_file(&flags.databases_dir, &postgres.databases_dir),
    };
    embedded.allow_unsafe_on_disk = switch(
        flags.allow_unsafe_on_disk,
        flags.no_allow_unsafe_on_disk,
        postgres.allow_unsafe_on_disk,
    );
    embedded.pg_user = flag_or_file(&flags.pg_user, &postgres.user);
    embedded.cache_dir = flag_or_file(&flags.cache_dir, &postgres.cache_dir);
    if let Some(host) = flag_or_file(&flags.pg_listen, &postgres.listen) {
        embedded.listen_host = host;
    }
    embedded.port = flags.pg_port.or(postgres.port).filter(|&p| p != 0);
    embedded.advertise_host = flag_or_file(&flags.advertise_host, &postgres.advertise_host);
    if let Some(locale) = flag_or_file(&flags.locale, &postgres.locale) {
        embedded.locale = locale;
    }
    if let Some(encoding) = flag_or_file(&flags.encoding, &postgres.encoding) {
        embedded.encoding = encoding;
    }
    embedded.keep_data = switch(flags.keep_data, flags.no_keep_data, postgres.keep_data);
    embedded.snapshot_dir = flag_or_file(&flags.snapshot_dir, &postgres.snapshot_dir);
    embedded.snapshot_key_file = snapshot_key_file(flags, postgres, &embedded)?;
    embedded.storage = match flags.storage.or(postgres.storage) {
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
    // A directory that gives no room of its own is refused here, before anything starts
    // (exit 64), rather than by the pool (exit 1).
    pglease_pool::postgres::check_databases_dir(&embedded).map_err(|e| e.to_string())?;
    // The config file's settings first, so that a --pg-setting of the same name, applied
    // after them, wins.
    for (key, value) in &postgres.settings {
        let value = match value {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        embedded.settings.push(checked_setting(key, &value)?);
    }
    for setting in &flags.pg_settings {
        let (key, value) = setting
            .split_once('=')
            .ok_or_else(|| format!("--pg-setting {setting:?}: expected KEY=VALUE"))?;
        embedded.settings.push(checked_setting(key, value)?);
    }
    Ok(embedded)
}

/// Settings pglease gives the server itself, each with what to use instead. A user's
/// value would win (it comes last) and break the daemon or what it promises: postgres on a
/// port pglease does not wait on (a 30 s wait for nothing), the superuser's socket out of
/// its private directory, or a `pg_hba.conf` other than the one that keeps each lease role
/// to its own database.
const OWN_SETTINGS: &[(&str, &str)] = &[
    ("port", "use --pg-port (`port` under [postgres])"),
    ("listen_addresses", "use --pg-listen (`listen` under [postgres])"),
    ("unix_socket_directories", "its superuser's socket lives in a private directory it makes"),
    ("data_directory", "use --data-dir"),
    ("config_file", "it reads no configuration file: use --pg-setting KEY=VALUE for each setting"),
    ("hba_file", "it writes pg_hba.conf itself, keeping each lease role to its own database (docs/security.md)"),
    ("ident_file", "it writes pg_hba.conf itself, which uses no ident map"),
];

/// A postgres setting name is an identifier, and not one of [`OWN_SETTINGS`]; values go as
/// one argv element.
fn checked_setting(key: &str, value: &str) -> Result<(String, String), String> {
    let valid = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    if !valid {
        return Err(format!("postgres setting name {key:?} is not valid"));
    }
    // Postgres reads setting names case-insensitively.
    if let Some((name, instead)) = OWN_SETTINGS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(key))
    {
        return Err(format!(
            "postgres setting {name} is pglease's own: {instead}"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}
