//! Plain domain values the pool hands to its callers: leases, connection details, requests
//! and status reports. They are not `Serialize`: `pglease-api` owns the wire format.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::names::{DbName, LeaseId, TemplateName};

/// What a caller asks for.
#[derive(Debug, Clone)]
pub struct LeaseRequest {
    /// The template to clone.
    pub template: TemplateName,
    /// Time to live; the pool's default when None. Capped at the pool's maximum.
    pub ttl: Option<Duration>,
    /// How long to wait for a ready clone.
    pub wait: Duration,
    /// The lease's connection limit; the pool's default when None.
    pub connections: Option<u32>,
    /// The holder may never release it (IntegreSQL clients need not): when the template
    /// has no room for a waiting request, the oldest such lease is ended and its database
    /// dropped to make room. Such requests are served from client-built templates only.
    pub reclaimable: bool,
    /// The PostgreSQL version the caller needs; a daemon serving another refuses the
    /// request at once.
    pub postgres_version: Option<pglease_binaries::VersionSpec>,
    /// What the holder calls it (a test's name), for `/status` and the log.
    pub label: Option<String>,
}

/// A database handed to one caller until released or expired.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The lease's id.
    pub id: LeaseId,
    /// The template it was cloned from.
    pub template: TemplateName,
    /// The template's fingerprint (SHA-256 hex of its sources and the postgres major).
    pub fingerprint: String,
    /// How to connect.
    pub connect: ConnectInfo,
    /// When the lease expires unless renewed.
    pub expires_at: SystemTime,
    /// A small number counting this template's leases from 0 (the IntegreSQL API's test
    /// database id); never reused while the template exists.
    pub number: u32,
    /// The server's private socket directory, where the daemon itself logs in as the lease's
    /// role without its password (`pg_hba.conf`'s `local … trust`, on a socket only the
    /// daemon can reach): what the PostgreSQL front connects to. None for an external server.
    /// Never shown to a client.
    pub local_socket: Option<std::path::PathBuf>,
}

/// How to reach a leased database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectInfo {
    /// Host name, IP address, or unix socket directory.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Role to log in as.
    pub user: String,
    /// Its password.
    pub password: String,
    /// The database.
    pub database: DbName,
    /// The server accepts SSL (`ssl = on`). Without it the URLs say `sslmode=disable`:
    /// some drivers (Go's lib/pq, and so dbmate and golang-migrate) require SSL unless told.
    pub ssl: bool,
}

impl ConnectInfo {
    /// A `postgresql://` URL (the scheme every driver takes; SQLAlchemy refuses
    /// `postgres://`), with `sslmode=disable` where the server has no SSL.
    pub fn url(&self) -> String {
        let (user, password, db) = (&self.user, &self.password, self.database.as_str());
        let mut query: Vec<String> = Vec::new();
        let address = if self.host.starts_with('/') {
            // A unix socket directory travels as a query parameter.
            query.push(format!("host={}", self.host));
            query.push(format!("port={}", self.port));
            String::new()
        } else {
            format!("{}:{}", self.bracketed_host(), self.port)
        };
        if !self.ssl {
            query.push("sslmode=disable".into());
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        format!("postgresql://{user}:{password}@{address}/{db}{query}")
    }

    /// The URL pgjdbc takes (`DriverManager.getConnection(url)`): JDBC's own form, with the
    /// credentials as parameters. `None` for a unix socket, which pgjdbc cannot reach
    /// without an extra socket factory.
    pub fn jdbc_url(&self) -> Option<String> {
        if self.host.starts_with('/') {
            return None;
        }
        let ssl = if self.ssl { "" } else { "&sslmode=disable" };
        Some(format!(
            "jdbc:postgresql://{}:{}/{}?user={}&password={}{ssl}",
            self.bracketed_host(),
            self.port,
            self.database.as_str(),
            self.user,
            self.password
        ))
    }

    /// The host as a URL authority wants it: an IPv6 address in brackets.
    fn bracketed_host(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }
}

/// A snapshot of the pool for `/status`.
#[derive(Debug, Clone)]
pub struct StatusReport {
    /// The server.
    pub postgres: PostgresStatus,
    /// Every template, by name.
    pub templates: Vec<TemplateStatus>,
    /// Open leases.
    pub leases: Vec<LeaseSummary>,
    /// Databases on their way out.
    pub drops: DropStatus,
    /// The limits requests meet.
    pub limits: LimitStatus,
    /// Every PostgreSQL server of the daemon, the primary first (filled by [`crate::Servers`];
    /// a single pool's report leaves it empty). `postgres`, `drops` and `limits` above are
    /// the primary's.
    pub servers: Vec<ServerStatus>,
}

/// One PostgreSQL server of the daemon, in a status report.
#[derive(Debug, Clone)]
pub struct ServerStatus {
    /// Its major version.
    pub major: u32,
    /// The server.
    pub postgres: PostgresStatus,
    /// The templates that live on it.
    pub templates: Vec<TemplateName>,
    /// Its databases on their way out.
    pub drops: DropStatus,
    /// The limits its requests meet.
    pub limits: LimitStatus,
}

/// What an embedded server's clusters live on, and why (`--storage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageStatus {
    /// `tmpfs` (clones copy), `disk` (a data directory on a disk, `--allow-unsafe-on-disk`,
    /// that cannot clone: clones copy), `cow` (a copy-on-write store pglease made) or `data_dir`
    /// (the user's data directory, whose file system clones).
    pub kind: &'static str,
    /// Why: what was asked, or what `auto` weighed.
    pub reason: String,
}

/// The limits requests meet, in a status report.
#[derive(Debug, Clone, Default)]
pub struct LimitStatus {
    /// Connections postgres has for lease holders in all.
    pub connection_budget: u32,
    /// Connections open leases hold (their limits, summed).
    pub connections_in_use: u32,
    /// Requests refused or timed out since the start, by the limit that stopped them.
    pub refused: Refusals,
    /// IntegreSQL test databases (never given back) ended to make room for a waiting request.
    pub reclaimed: u64,
    /// Client-built templates discarded because no finalize came in time.
    pub abandoned: u64,
    /// Leases ended by their time to live.
    pub expired: u64,
    /// Databases kept after failed tests now.
    pub kept: usize,
    /// Released databases the server proved unchanged, put back without a new clone
    /// (`--reuse-unchanged`).
    pub reused_unchanged: u64,
    /// Released databases the proof found changed (or could not clear), dropped and made
    /// again.
    pub replaced_changed: u64,
    /// Released databases made without a stamp (their template's tests all wrote lately),
    /// dropped and made again with no proof run.
    pub replaced_unstamped: u64,
    /// The byte budget, if any.
    pub byte_budget: Option<u64>,
    /// Bytes of templates and clones as postgres counts them (each clone as large as its
    /// template).
    pub logical_bytes: u64,
    /// Bytes the copy-on-write store took beyond what its file system held before the
    /// cluster (the cluster, its templates, clones' own writes), when clones share blocks;
    /// the budget is judged by it then.
    pub store_bytes: Option<u64>,
    /// The most one leased database may grow to before its lease is ended
    /// (`--lease-max-bytes`, or derived from the databases' tmpfs), if any.
    pub lease_max_bytes: Option<u64>,
    /// Leases ended because their database grew past it, since the start.
    pub exceeded_max_bytes: u64,
    /// The last of them.
    pub last_exceeded_max_bytes: Option<ExceededMaxBytes>,
}

/// A lease ended because its database grew past `--lease-max-bytes`.
#[derive(Debug, Clone)]
pub struct ExceededMaxBytes {
    /// The lease.
    pub lease_id: LeaseId,
    /// Its template.
    pub template: TemplateName,
    /// Its database (dropped).
    pub database: DbName,
    /// The size measured.
    pub bytes: u64,
    /// The limit then.
    pub limit: u64,
    /// When.
    pub at: std::time::SystemTime,
}

/// Requests refused or timed out, by the limit that stopped them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals {
    /// The connections of open leases filled the budget.
    pub connection_budget: u64,
    /// The template had `max_total` databases.
    pub max_total: u64,
    /// A clone did not fit the byte budget.
    pub byte_budget: u64,
    /// Too many requests were waiting already.
    pub max_waiting: u64,
    /// Timed out while the template was built or its databases made.
    pub making: u64,
}

/// Databases being dropped, in a status report. A drop that fails is retried with
/// back-off; until it succeeds its database still counts in the byte budget.
#[derive(Debug, Clone, Default)]
pub struct DropStatus {
    /// Databases queued for dropping or being dropped.
    pub pending: usize,
    /// Of those, how many failed to drop at least once.
    pub failed: usize,
    /// The error of the last failed attempt, if any is still pending.
    pub last_error: Option<String>,
}

/// The server's side of a status report.
#[derive(Debug, Clone)]
pub struct PostgresStatus {
    /// What the clusters live on (embedded only): `--storage`, or what `auto` chose.
    pub storage: Option<StorageStatus>,
    /// "starting", "running", "restarting" or "stopping".
    pub state: &'static str,
    /// True when pglease attached to an external server.
    pub external: bool,
    /// `server_version`.
    pub version: Option<String>,
    /// The postmaster pid (embedded only).
    pub pid: Option<u32>,
    /// The data directory (embedded only).
    pub data_dir: Option<PathBuf>,
    /// Host and port lease holders connect to.
    pub host: Option<String>,
    /// The port.
    pub port: Option<u16>,
    /// Settings read back with SHOW (fsync, synchronous_commit, ...).
    pub settings: Vec<(String, String)>,
    /// Times postgres died and was restarted (or reconnected).
    pub restarts: u32,
    /// Why the last restart happened, or the last start error.
    pub last_error: Option<String>,
    /// Admin operations (clone, recycle, drop, ...) that hit their time bound since the
    /// server was last (re)connected.
    pub admin_timeouts: u64,
    /// The databases' own tmpfs (embedded, on tmpfs, as root), or their room in
    /// `--databases-dir`.
    pub databases_space: Option<DatabasesSpace>,
}

/// The tmpfs every database of the embedded server lives on, apart from WAL and the
/// shared catalogs: filling it fails the writer, not the server.
#[derive(Debug, Clone)]
pub struct DatabasesSpace {
    /// Its mount point, the cluster's `base/` (a link to the room in `--databases-dir`).
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// What is free, at the last look (every 250 ms).
    pub free_bytes: u64,
    /// Under 2% free (until 5% is free again).
    pub full: bool,
    /// What held the most when it filled, while it is full.
    pub filled_by: Option<FilledBy>,
    /// What held the most when it last filled, kept after room came back (and across
    /// restarts of the server).
    pub last_filled_by: Option<FilledBy>,
}

/// The database that held the most when the databases' tmpfs filled: of the leased ones
/// the biggest, else the biggest of all.
#[derive(Debug, Clone)]
pub struct FilledBy {
    /// Its name.
    pub database: DbName,
    /// The template of its lease, when it was leased.
    pub template: Option<TemplateName>,
    /// Its size then.
    pub bytes: u64,
    /// When.
    pub at: std::time::SystemTime,
}

/// A template's side of a status report.
#[derive(Debug, Clone)]
pub struct TemplateStatus {
    /// The name.
    pub name: TemplateName,
    /// The fingerprint of the built version, if built.
    pub fingerprint: Option<String>,
    /// Versions built in this run (the current one's number; 0 before the first build).
    pub version: u32,
    /// How long the last successful build took.
    pub build_ms: Option<u64>,
    /// `pg_database_size` of the current template database.
    pub size_bytes: Option<i64>,
    /// When the last successful build finished.
    pub built_at: Option<std::time::SystemTime>,
    /// "idle" (not built yet), "building", "ready" or "failed".
    pub state: &'static str,
    /// Clones ready to lease.
    pub ready: usize,
    /// Clones leased.
    pub leased: usize,
    /// Clones being made.
    pub in_progress: usize,
    /// Requests waiting.
    pub waiting: usize,
    /// What the first waiting request waits for: "connection_budget", "max_total" or
    /// "making"; None when nobody waits.
    pub blocked_by: Option<&'static str>,
    /// The last build or clone error.
    pub last_error: Option<String>,
    /// A migration command that watches no file ([`TemplateSource::watches_nothing`]): an
    /// edit of its migrations goes unseen.
    ///
    /// [`TemplateSource::watches_nothing`]: crate::config::TemplateSource::watches_nothing
    pub unwatched: bool,
    /// The `server_version` of the server it lives on (filled by [`crate::Servers`]).
    pub postgres_version: Option<String>,
    /// Where its build is, while one that reports progress runs (a dump's restore).
    pub progress: Option<BuildProgress>,
}

/// Where a long build is, while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildProgress {
    /// What runs, e.g. `restoring /data/prod.dump`.
    pub step: String,
    /// Entries done (of pg_restore's table of contents).
    pub done: u64,
    /// Entries in all, when known (not for plain SQL).
    pub total: Option<u64>,
    /// done ÷ total, in percent.
    pub percent: Option<u64>,
    /// Seconds since the step started.
    pub elapsed_secs: u64,
    /// Seconds left, estimated by entries.
    pub eta_secs: Option<u64>,
}

/// A database kept after its lease ended (`release` with `keep`), with what opens it.
#[derive(Debug, Clone)]
pub struct KeptDatabase {
    /// The id of the lease it was kept from.
    pub id: LeaseId,
    /// Its template (perhaps discarded since: the database stays until its keep ends).
    pub template: TemplateName,
    /// Where it is and the lease's credentials, which still open it.
    pub connect: ConnectInfo,
    /// The lease's label.
    pub label: Option<String>,
    /// When it was kept.
    pub kept_at: SystemTime,
    /// When it is dropped.
    pub expires_at: SystemTime,
    /// What it counts in the byte budget.
    pub size_bytes: u64,
}

/// One open lease in a status report.
#[derive(Debug, Clone)]
pub struct LeaseSummary {
    /// The id.
    pub id: LeaseId,
    /// Its template.
    pub template: TemplateName,
    /// Its database.
    pub database: DbName,
    /// When it expires.
    pub expires_at: SystemTime,
    /// The holder's label, if the request gave one.
    pub label: Option<String>,
}

/// Answers `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Readiness {
    /// Postgres accepts connections.
    pub postgres_up: bool,
    /// The `default` template is built.
    pub default_template_ready: bool,
    /// Templates configured at start that cannot be built, and why: their sources were
    /// missing or unreadable at start, or their last build failed. Each holds readiness
    /// back until a build of it succeeds (the next lease's, or the one that follows an
    /// edit of its sources).
    pub failed_templates: Vec<(TemplateName, String)>,
    /// Templates configured at start being built again after a failure, and with
    /// `prebuild` those not built yet in this run.
    pub building_templates: Vec<TemplateName>,
}

impl Readiness {
    /// Ready to lease: postgres up, the `default` template built, no configured template
    /// failed, and with `prebuild` every one built.
    pub fn is_ready(&self) -> bool {
        self.postgres_up
            && self.default_template_ready
            && self.failed_templates.is_empty()
            && self.building_templates.is_empty()
    }

    /// Serving leases at all: postgres up and the `default` template built, whatever the
    /// configured templates do (what systemd's READY=1 waits for: a broken migration must
    /// not keep the unit from starting, where it could never be fixed).
    pub fn is_serving(&self) -> bool {
        self.postgres_up && self.default_template_ready
    }

    /// Why it is not ready, in a sentence; None when it is.
    pub fn reason(&self) -> Option<String> {
        if !self.postgres_up {
            return Some("postgres is not up (yet)".into());
        }
        if !self.failed_templates.is_empty() {
            let failures: Vec<String> = self
                .failed_templates
                .iter()
                .map(|(name, error)| format!("template {name} cannot be built: {error}"))
                .collect();
            return Some(failures.join("; "));
        }
        if !self.default_template_ready {
            return Some("the default template is being built".into());
        }
        if !self.building_templates.is_empty() {
            let names: Vec<&str> = self
                .building_templates
                .iter()
                .map(TemplateName::as_str)
                .collect();
            return Some(format!("building {}", names.join(", ")));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: &str, ssl: bool) -> ConnectInfo {
        ConnectInfo {
            host: host.into(),
            port: 5432,
            user: "pglease_ab_1".into(),
            password: "f00d".into(),
            database: DbName::from_server("pglease_ab_1".into()),
            ssl,
        }
    }

    #[test]
    fn urls_name_the_scheme_every_driver_takes_and_sslmode_where_there_is_no_ssl() {
        assert_eq!(
            info("127.0.0.1", false).url(),
            "postgresql://pglease_ab_1:f00d@127.0.0.1:5432/pglease_ab_1?sslmode=disable"
        );
        assert_eq!(
            info("::1", true).url(),
            "postgresql://pglease_ab_1:f00d@[::1]:5432/pglease_ab_1"
        );
        assert_eq!(
            info("/run/pg", false).url(),
            "postgresql://pglease_ab_1:f00d@/pglease_ab_1?host=/run/pg&port=5432&sslmode=disable"
        );
    }

    #[test]
    fn jdbc_urls_carry_the_credentials_as_parameters() {
        assert_eq!(
            info("127.0.0.1", false).jdbc_url().as_deref(),
            Some("jdbc:postgresql://127.0.0.1:5432/pglease_ab_1?user=pglease_ab_1&password=f00d&sslmode=disable")
        );
        assert_eq!(
            info("::1", true).jdbc_url().as_deref(),
            Some("jdbc:postgresql://[::1]:5432/pglease_ab_1?user=pglease_ab_1&password=f00d")
        );
        assert_eq!(info("/run/pg", false).jdbc_url(), None);
    }
}
