//! What the embedded server runs with: the `pg_hba.conf` written at every start, postgres'
//! command-line settings (tuned for throw-away data in memory), the port it listens on and
//! the host lease holders are told.
//!
//! Decisions from the configuration alone (choosing the port binds a socket, nothing more),
//! kept apart from the start that applies them so that they read, and are tested, on their
//! own. It uses only `space.rs` (the WAL's size) and `util.rs`.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::Path;

use tracing::warn;

use super::space;
use super::util::io_error;
use crate::config::{EmbeddedConfig, LeaseAuth};
use crate::error::StartError;

/// The `pg_hba.conf` written at every start (first match wins). Lease roles are named like
/// their databases, so `sameuser` lets each one open its own database and nothing else.
/// The IntegreSQL clients' role, if any, reaches a database only while it is a member of
/// the role named like it: a client-built template being initialized, or a clone of a
/// client-built one (`samerole`; its name needs no quoting, `names::check_role_name`).
pub(super) fn pg_hba(lease_auth: LeaseAuth, integresql_role: Option<&str>) -> String {
    let method = match lease_auth {
        LeaseAuth::Scram { .. } => "scram-sha-256",
        LeaseAuth::Trust => "trust",
    };
    let integresql = match integresql_role {
        Some(role) => format!(
            "# The IntegreSQL clients' role (--integresql-pg-user): client-built templates being\n\
             # initialized and their test databases.\n\
             host    samerole   {role:<10} all       scram-sha-256\n"
        ),
        None => String::new(),
    };
    format!(
        "\
# Written by pglease at every start; edits are lost.
# The socket directory is private (mode 0700, owned by the server's OS user), so only the
# daemon (root or that user) can use the trusted local connections.
local   all        all                  trust
# The superuser never over TCP.
host    all        postgres   all       reject
{integresql}\
# A lease role (named like its database) reaches its own database only.
host    sameuser   all        all       {method}
"
    )
}

/// What the cluster lives on, as far as postgres' settings care.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    /// On tmpfs or ramfs.
    pub(super) in_memory: bool,
    /// The file system clones files.
    pub(super) clones: bool,
    /// The server's major version.
    pub(super) major: u32,
    /// With the databases on a tmpfs of their own: the bytes the rest of the cluster has.
    pub(super) rest: Option<u64>,
    /// With the notification queue on a tmpfs of its own: its bytes.
    pub(super) notify_queue: Option<u64>,
}

/// postgres' command line after the binary: tuned for throw-away data on tmpfs.
/// The settings every embedded server runs with, first on its command line (sizes, the
/// address and what depends on the file system follow; the user's settings come last and
/// override them): unsafe on purpose, tuned for throw-away data. Public so that the
/// benchmark's hand-tuned baseline runs exactly these.
pub const TUNED_SETTINGS: &[(&str, &str)] = &[
    // The data is thrown away: crash safety buys nothing.
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("wal_level", "minimal"),
    // Required by wal_level=minimal.
    ("max_wal_senders", "0"),
    // JIT compilation slows the short queries tests run.
    ("jit", "off"),
    ("checkpoint_timeout", "1d"),
    ("password_encryption", "scram-sha-256"),
    // stderr goes to our log file; a collector would write elsewhere.
    ("logging_collector", "off"),
];

/// Added to [`TUNED_SETTINGS`] when the cluster is in memory (tmpfs or ramfs).
pub const IN_MEMORY_SETTINGS: &[(&str, &str)] = &[
    // Dynamic shared memory as files in the data directory's pg_dynshmem instead of
    // /dev/shm/PostgreSQL.*: just as fast on tmpfs, counted against a dedicated tmpfs'
    // size, and removed with the instance even when postgres was killed (a killed
    // postmaster leaves its /dev/shm segments behind for good).
    ("dynamic_shared_memory_type", "mmap"),
];

pub(super) fn server_args(
    config: &EmbeddedConfig,
    data_dir: &Path,
    socket_dir: &Path,
    port: u16,
    place: &Place,
) -> Vec<OsString> {
    let mut settings: Vec<(String, String)> = TUNED_SETTINGS
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    settings.extend([
        ("shared_buffers".to_string(), config.shared_buffers.clone()),
        (
            "max_connections".to_string(),
            config.max_connections.to_string(),
        ),
        ("listen_addresses".to_string(), config.listen_host.clone()),
        ("port".to_string(), port.to_string()),
        (
            "unix_socket_directories".to_string(),
            guc_list_element(&socket_dir.to_string_lossy()),
        ),
    ]);
    settings.extend(match place.rest {
        // WAL shares the rest with the shared catalogs: checkpoints recycle it long
        // before it can fill that (`space.rs`), at RAM speed.
        Some(rest) => [
            ("max_wal_size".to_string(), space::max_wal_size(rest)),
            ("min_wal_size".to_string(), space::max_wal_size(rest)),
        ],
        // Checkpoints only when CREATE/DROP DATABASE force them.
        None => [
            ("max_wal_size".to_string(), "8GB".to_string()),
            ("min_wal_size".to_string(), "80MB".to_string()),
        ],
    });
    if place.major >= 17 {
        // A queue nobody reads grows up to 8 GB by default, in the room WAL needs: half
        // its own tmpfs (`space.rs`), or a bound that fits any test's use without one.
        let room = place.notify_queue.unwrap_or(space::NOTIFY_QUEUE_MAX);
        settings.push((
            "max_notify_queue_pages".to_string(),
            space::notify_queue_pages(room).to_string(),
        ));
    }
    if place.in_memory {
        settings.extend(
            IN_MEMORY_SETTINGS
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string())),
        );
    }
    if place.clones && place.major >= 18 {
        // On a file system that clones, a FILE_COPY clone shares its template's blocks.
        // Before 18 postgres only copies; those servers work there all the same.
        settings.push(("file_copy_method".to_string(), "clone".to_string()));
    }
    // Last, so that the user's settings override ours.
    settings.extend(config.settings.iter().cloned());

    let mut args: Vec<OsString> = vec!["-D".into(), data_dir.into()];
    for (key, value) in settings {
        args.push("-c".into());
        args.push(format!("{key}={value}").into());
    }
    args
}

/// Double-quotes one element of a list setting when it holds a separator.
fn guc_list_element(value: &str) -> String {
    if value.contains([',', ' ', '"']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

/// The host lease holders should use: `advertise_host`, else the first listen address,
/// with a wildcard replaced by the loopback address.
pub(super) fn advertised_host(config: &EmbeddedConfig) -> String {
    if let Some(host) = &config.advertise_host {
        return host.clone();
    }
    let first = config.listen_host.split(',').next().unwrap_or("").trim();
    match first {
        "" | "*" | "0.0.0.0" | "::" => "127.0.0.1".to_owned(),
        host => host.to_owned(),
    }
}

/// The port to use: the configured one, else the previous one if still free, else a
/// free one the kernel picks. (Another process may take it before postgres binds it;
/// postgres then fails at start-up with a clear log line.)
pub(super) fn choose_port(
    configured: Option<u16>,
    previous: Option<u16>,
    listen_host: &str,
) -> Result<u16, StartError> {
    if let Some(port) = configured {
        return Ok(port);
    }
    let host = match listen_host.split(',').next().unwrap_or("").trim() {
        "" | "*" => "0.0.0.0",
        host => host,
    };
    if let Some(port) = previous {
        if TcpListener::bind((host, port)).is_ok() {
            return Ok(port);
        }
        warn!(port, "the previous port is taken; postgres gets a new one");
    }
    TcpListener::bind((host, 0))
        .or_else(|_| TcpListener::bind(("127.0.0.1", 0)))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| io_error("cannot find a free port on", Path::new(listen_host), e))
}
