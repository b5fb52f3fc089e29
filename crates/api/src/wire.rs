//! The JSON bodies of the API: requests as clients send them, responses as they receive
//! them. Pool types are converted here; they are never serialized directly. The bodies
//! `pglease`'s own client commands and the benchmark send and read derive both
//! directions, so that clients and the daemon share one declaration of each; an absent
//! optional field of a request is left out, not sent as null.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /lease` body; every field is optional.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseBody {
    /// Template name; `default` when absent.
    #[schema(pattern = "^[a-z0-9_-]{1,64}$")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Time to live in seconds.
    #[schema(minimum = 1, maximum = 86400)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// How long to wait for a ready database, in milliseconds.
    #[schema(maximum = 600000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The lease's connection limit (`CONNECTION LIMIT` of its role).
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// The PostgreSQL version the caller needs: a major ("17") or a minor ("17.6"); a
    /// daemon serving another answers 422 at once.
    #[schema(pattern = "^[0-9]{1,2}(\\.[0-9]{1,3})?$")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<String>,
    /// What the holder calls the lease (e.g. the test's name), shown in `/status` and the
    /// log: at most 256 characters, no control characters.
    #[schema(max_length = 256)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// `PUT /templates/{name}` body: one of `migrations`, `sql` or `command` (none: empty).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateBody {
    /// An absolute directory of `*.sql` files.
    pub migrations: Option<String>,
    /// An absolute path of one SQL file.
    pub sql: Option<String>,
    /// A migration command (needs `--allow-http-commands`).
    pub command: Option<String>,
    /// An absolute path of a pg_dump output: custom, directory or tar format (restored with
    /// pg_restore), or plain SQL (psql), optionally .gz/.zst.
    pub dump: Option<String>,
    /// For `dump`: pg_restore's parallel jobs (default: the number of cores).
    #[schema(minimum = 1, maximum = 64)]
    pub jobs: Option<usize>,
    /// The command's absolute working directory.
    pub workdir: Option<String>,
    /// Absolute paths whose contents enter the fingerprint.
    #[serde(default)]
    pub watch: Vec<String>,
    /// The command's timeout.
    #[schema(minimum = 1, maximum = 86400)]
    pub timeout_secs: Option<u64>,
    /// Apply the source as postgres' superuser (needs `--allow-http-commands`: a superuser
    /// can run programs as the server's OS user).
    #[serde(default)]
    pub superuser: bool,
    /// The PostgreSQL version the template needs ("16" or "16.4"): it lives on a server of
    /// that major, started when first needed. Default: where it lives now, else the primary.
    #[schema(value_type = Option<String>, example = "16")]
    pub postgres_version: Option<String>,
}

/// `POST /leases/{id}/renew` body.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// New time to live from now, in seconds.
    #[schema(minimum = 1, maximum = 86400)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
}

/// `DELETE /leases/{id}` query.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseQuery {
    /// The database was left unchanged: recycle it as is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reuse: Option<bool>,
    /// Keep the database as it is for this many seconds (a failed test's, to look at),
    /// shortened to the daemon's `--max-keep`; listed by `GET /kept`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep: Option<u64>,
}

/// `GET /kept`: the databases kept after failed tests.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeptResponse {
    /// Oldest first.
    pub kept: Vec<KeptJson>,
}

/// A kept database and what opens it (the lease's own credentials).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeptJson {
    /// The id of the lease it was kept from — only where a token guards the API (it drops
    /// the database; its holder has it from the lease).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its template.
    pub template: Option<String>,
    /// The database.
    pub database: String,
    /// The lease's label (the test's name).
    pub label: Option<String>,
    /// Host.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Role.
    pub user: String,
    /// Its password — only where a token guards the API; its holder has it from the lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// `postgresql://user:password@host:port/database` — with the password, likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// When it was kept (RFC 3339, UTC).
    pub kept_at: String,
    /// When it is dropped (RFC 3339, UTC).
    pub expires_at: String,
    /// What it counts in the byte budget.
    pub size_bytes: u64,
}

/// A granted lease.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LeaseResponse {
    /// Lease id, for release and renew.
    pub id: String,
    /// Template name.
    pub template: String,
    /// Template fingerprint.
    pub fingerprint: String,
    /// Database name.
    pub database: String,
    /// Host to connect to.
    pub host: String,
    /// Port to connect to.
    pub port: u16,
    /// Role to log in as.
    pub user: String,
    /// Its password.
    pub password: String,
    /// A ready `postgresql://` URL, with `sslmode=disable` where the server has no SSL
    /// (Go's lib/pq requires SSL unless told).
    pub url: String,
    /// The same for pgjdbc: `jdbc:postgresql://host:port/db?user=…&password=…`
    /// (`DriverManager.getConnection(jdbc_url)`); absent for a unix socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jdbc_url: Option<String>,
    /// RFC 3339 expiry time.
    pub expires_at: String,
}

/// Answer to a renew.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RenewResponse {
    /// Lease id.
    pub id: String,
    /// RFC 3339 new expiry time.
    pub expires_at: String,
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// A machine-readable code and a sentence for people.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// e.g. `unknown_template`, `timeout`.
    // Like every `Cow` here: borrowed where the daemon answers, owned where a client reads.
    pub code: Cow<'static, str>,
    /// What went wrong.
    pub message: String,
}

/// `GET /status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StatusResponse {
    /// The server.
    pub postgres: PostgresJson,
    /// Each template.
    pub templates: Vec<TemplateJson>,
    /// Open leases.
    pub leases: Vec<LeaseJson>,
    /// Databases on their way out.
    pub drops: DropsJson,
    /// The limits requests meet.
    pub limits: LimitsJson,
    /// Every PostgreSQL server of the daemon, the primary first. `postgres`, `drops` and
    /// `limits` above are the primary's; `templates` and `leases` above are every server's.
    pub servers: Vec<ServerJson>,
    /// The PostgreSQL front (`--front-listen`); absent when it is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front: Option<FrontJson>,
}

/// The PostgreSQL front, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FrontJson {
    /// Connections accepted since the start.
    pub accepted: u64,
    /// Its open connections, oldest first.
    pub connections: Vec<FrontConnectionJson>,
    /// The leases shared by key (database `<template>.<key>`).
    pub keys: Vec<FrontKeyJson>,
    /// Its TLS (`--front-tls`); `off` from a daemon that predates it.
    #[serde(default)]
    pub tls: FrontTlsJson,
}

/// The PostgreSQL front's TLS, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FrontTlsJson {
    /// `off` (an SSLRequest is answered `N`), `self-signed` (a certificate made at start)
    /// or `certificate` (the operator's, `--front-tls-cert`).
    pub mode: String,
    /// With `certificate`: its file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Whether clients that do not ask for TLS are refused (`--front-require-tls`).
    #[serde(default)]
    pub required: bool,
}

impl Default for FrontTlsJson {
    fn default() -> Self {
        FrontTlsJson {
            mode: "off".to_owned(),
            cert_file: None,
            required: false,
        }
    }
}

/// One connection at the PostgreSQL front, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FrontConnectionJson {
    /// The client's address.
    pub peer: String,
    /// `starting` (start-up, password), `leasing` (waiting for a database) or `relaying`.
    pub stage: String,
    /// When it was accepted (RFC 3339).
    pub since: String,
    /// The template it asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The key it shares a lease by, `<template>.<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Its lease's id (only where a token guards the API, as in `leases`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// Its lease's database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// Whether it speaks TLS.
    #[serde(default)]
    pub tls: bool,
}

/// A lease shared by key at the PostgreSQL front, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FrontKeyJson {
    /// `<template>.<key>`.
    pub name: String,
    /// Its lease's id (only where a token guards the API); absent while it is being made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// Its lease's database; absent while it is being made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// The connections that use it now.
    pub connections: usize,
    /// When no connection uses it: when it is released unless one comes (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_at: Option<String>,
}

/// The answer to `DELETE /front/keys/{name}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyReleasedResponse {
    /// The key, `<template>.<key>`.
    pub key: String,
    /// The lease that was released (only where a token guards the API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
}

/// One PostgreSQL server of the daemon, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ServerJson {
    /// Its major version.
    pub major: u32,
    /// The server.
    pub postgres: PostgresJson,
    /// The names of the templates that live on it.
    pub templates: Vec<String>,
    /// Its databases on their way out.
    pub drops: DropsJson,
    /// The limits its requests meet.
    pub limits: LimitsJson,
}

/// The limits requests meet, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LimitsJson {
    /// Connections postgres has for lease holders in all.
    pub connection_budget: u32,
    /// Connections open leases hold (their limits, summed).
    pub connections_in_use: u32,
    /// Requests refused or timed out since the start, by the limit that stopped them.
    pub refused: RefusedJson,
    /// Databases kept after failed tests now.
    pub kept: usize,
    /// IntegreSQL test databases (never given back) ended to make room.
    pub reclaimed: u64,
    /// Client-built templates discarded because no finalize came in time.
    pub abandoned: u64,
    /// Leases ended by their time to live since the start.
    pub expired: u64,
    /// Released databases proven unchanged and put back without a new clone
    /// (`--reuse-unchanged`), since the start.
    pub reused_unchanged: u64,
    /// Released databases the proof found changed, dropped and made again, since the start.
    pub replaced_changed: u64,
    /// Released databases made without a stamp for the proof (their template's tests all
    /// wrote lately), dropped and made again unproven, since the start.
    pub replaced_unstamped: u64,
    /// The byte budget (`--max-bytes` or its default), if any.
    pub byte_budget: Option<u64>,
    /// Bytes of templates and clones as postgres counts them (each clone as large as its
    /// template).
    pub logical_bytes: u64,
    /// Bytes the copy-on-write store took beyond what its file system held before the
    /// cluster (the cluster, its templates, clones' own writes), when clones share their
    /// template's blocks; the byte budget is judged by it then.
    pub store_bytes: Option<u64>,
    /// The most one leased database may grow to before its lease is ended
    /// (`--lease-max-bytes`, or derived from the databases' tmpfs), if any.
    pub lease_max_bytes: Option<u64>,
    /// Leases ended because their database grew past it, since the start.
    pub exceeded_max_bytes: u64,
    /// The last of them.
    pub last_exceeded_max_bytes: Option<ExceededMaxBytesJson>,
}

/// A lease ended because its database grew past `--lease-max-bytes`, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ExceededMaxBytesJson {
    /// The lease.
    pub lease_id: String,
    /// Its template.
    pub template: String,
    /// Its database (dropped).
    pub database: String,
    /// The size measured, in bytes.
    pub bytes: u64,
    /// The limit then, in bytes.
    pub limit: u64,
    /// When (RFC 3339).
    pub at: String,
}

/// Requests refused or timed out, by limit.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RefusedJson {
    /// The connections of open leases filled the budget.
    pub connection_budget: u64,
    /// The template had max_total databases.
    pub max_total: u64,
    /// A clone did not fit the byte budget.
    pub byte_budget: u64,
    /// Too many requests were waiting already.
    pub max_waiting: u64,
    /// Timed out while the template was built or its databases made.
    pub making: u64,
}

/// Databases being dropped, in `/status`. A failed drop is retried with back-off and
/// still counts in the byte budget until it succeeds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DropsJson {
    /// Queued or being dropped.
    pub pending: usize,
    /// Of those, failed at least once.
    pub failed: usize,
    /// The last error of a drop that waits to be retried.
    pub last_error: Option<String>,
}

/// The server in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PostgresJson {
    /// running, restarting, stopping.
    pub state: Cow<'static, str>,
    /// Attached to an external server.
    pub external: bool,
    /// server_version.
    pub version: Option<String>,
    /// Postmaster pid.
    pub pid: Option<u32>,
    /// Data directory.
    pub data_dir: Option<String>,
    /// What the clusters live on (embedded only): `--storage`, or what `auto` chose.
    pub storage: Option<StorageJson>,
    /// Host for lease holders.
    pub host: Option<String>,
    /// Port for lease holders.
    pub port: Option<u16>,
    /// Settings as the server reports them.
    #[schema(value_type = std::collections::HashMap<String, String>)]
    pub settings: serde_json::Map<String, serde_json::Value>,
    /// Restarts since start.
    pub restarts: u32,
    /// The last restart's reason or start error.
    pub last_error: Option<String>,
    /// Admin operations (clone, recycle, drop, ...) that timed out since the server was
    /// last (re)connected; each one's error says "timed out after …".
    pub admin_timeouts: u64,
    /// The databases' own tmpfs (embedded, on tmpfs, as root): filling it fails the
    /// writer with "No space left on device", never the server.
    pub databases_space: Option<DatabasesSpaceJson>,
}

/// The databases' own tmpfs, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DatabasesSpaceJson {
    /// Its mount point, the cluster's `base/`.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Free bytes at the last look (every 250 ms).
    pub free_bytes: u64,
    /// Under 2% free (until 5% is free again).
    pub full: bool,
    /// While it is full, the database that held the most when it filled: of the leased
    /// ones the biggest, else the biggest of all.
    pub filled_by: Option<FilledByJson>,
    /// The database that held the most when it last filled, kept after room came back.
    pub last_filled_by: Option<FilledByJson>,
}

/// What filled the databases' tmpfs, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FilledByJson {
    /// The database.
    pub database: String,
    /// The template of its lease, when it was leased.
    pub template: Option<String>,
    /// Its size then, in bytes.
    pub bytes: u64,
    /// When (RFC 3339).
    pub at: String,
}

/// What an embedded server's clusters live on, in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StorageJson {
    /// `tmpfs` (clones copy), `disk` (a data directory on a disk, `--allow-unsafe-on-disk`,
    /// that cannot clone: clones copy), `cow` (a copy-on-write store pglease made) or `data_dir`
    /// (the data directory's file system clones).
    pub kind: Cow<'static, str>,
    /// Why: what was asked, or what `--storage auto` weighed.
    pub reason: String,
}

/// A template in `/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TemplateJson {
    /// Name.
    pub name: String,
    /// Fingerprint of the built version.
    pub fingerprint: Option<String>,
    /// Versions built in this run (the current one's number).
    pub version: u32,
    /// idle, building, ready, failed.
    pub state: Cow<'static, str>,
    /// How long the last build took.
    pub build_ms: Option<u64>,
    /// Size of the template database.
    pub size_bytes: Option<i64>,
    /// RFC 3339 time the last build finished.
    pub built_at: Option<String>,
    /// Ready clones.
    pub ready: usize,
    /// Leased clones.
    pub leased: usize,
    /// Clones being made.
    pub in_progress: usize,
    /// Requests waiting.
    pub waiting: usize,
    /// What the first waiting request waits for: `connection_budget`, `max_total` or
    /// `making`; null when nobody waits.
    pub blocked_by: Option<Cow<'static, str>>,
    /// Last build or clone error.
    pub last_error: Option<String>,
    /// True for a migration command that watches no file: its fingerprint is the command
    /// string alone, so an edit of its migrations builds no new version. Give it watch paths
    /// (`--watch NAME=PATH`, `watch` in the config file) or run with `--verify-templates`.
    pub unwatched: bool,
    /// The version of the PostgreSQL server it lives on (`server_version`).
    pub postgres_version: Option<String>,
    /// While a build that reports progress runs (a dump's restore): where it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressJson>,
}

/// Where a running build is.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProgressJson {
    /// What runs, e.g. `restoring /data/prod.dump`.
    pub step: String,
    /// Entries done (of pg_restore's table of contents).
    pub done: u64,
    /// Entries in all; null when unknown (plain SQL).
    pub total: Option<u64>,
    /// done ÷ total, in percent.
    pub percent: Option<u64>,
    /// Seconds since the step started.
    pub elapsed_secs: u64,
    /// Seconds left, estimated by entries (one big table skews it).
    pub eta_secs: Option<u64>,
}

/// A lease in `/status` (no credentials).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseJson {
    /// Lease id — only where a token guards the API: without one anybody on loopback reads
    /// `/status`, and a lease id releases its lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Template.
    pub template: String,
    /// Database.
    pub database: String,
    /// RFC 3339 expiry.
    pub expires_at: String,
    /// The label its request gave, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthResponse {
    /// Always "ok".
    pub status: &'static str,
}

/// `GET /readyz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReadyResponse {
    /// Postgres is up, the default template built, `failed_templates` and
    /// `building_templates` empty, and the daemon not stopping.
    pub ready: bool,
    /// Postgres accepts connections.
    pub postgres: bool,
    /// The default template is built.
    pub default_template: bool,
    /// Why it is not ready, in a sentence; null when it is.
    pub reason: Option<String>,
    /// Templates configured at start that cannot be built: their sources were missing or
    /// unreadable at start, or their last build failed. Each one holds readiness back
    /// until a build of it succeeds (the next lease's, or the one pglease starts when its
    /// sources change).
    pub failed_templates: Vec<FailedTemplateJson>,
    /// Templates configured at start being built again after a failure, and with
    /// `--prebuild` those not built yet in this run.
    pub building_templates: Vec<String>,
}

/// A template that cannot be built, in `/readyz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FailedTemplateJson {
    /// Its name.
    pub name: String,
    /// Why: the missing source, or the build's error.
    pub error: String,
}
