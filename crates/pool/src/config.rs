//! Validated configuration of the pool: where postgres comes from, which templates exist,
//! and how many clones to keep.
//!
//! These are plain values built by the binary from its CLI and config file; nothing here
//! parses flags or files, and nothing here touches the system.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pglease_binaries::VersionSpec;

use crate::names::TemplateName;

/// The whole configuration of a pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Where the postgres server comes from.
    pub server: ServerConfig,
    /// Templates known at start. The `default` template is always added if absent.
    pub templates: Vec<TemplateConfig>,
    /// Limits applied to every template's clones.
    pub limits: PoolLimits,
    /// How `CREATE DATABASE` copies a template.
    pub clone_strategy: CloneStrategy,
    /// Build every template at start instead of on first lease.
    pub prebuild: bool,
    /// How lease roles authenticate.
    pub lease_auth: LeaseAuth,
    /// Lease roles are superusers (for suites that need it; they can then reach everything).
    pub lease_superuser: bool,
    /// Build each template from scratch once per run even if a template database with the
    /// same fingerprint exists (a drift guard for CI).
    pub verify_templates: bool,
    /// A request may start a server of a major no configured template names (and download
    /// its binaries). The binary sets it where a token guards the API: an anonymous caller
    /// on loopback gets the majors the operator chose, no more (`docs/security.md`).
    pub majors_on_request: bool,
    /// The OS user that migration commands, `psql` and `pg_restore` run as and whose rights
    /// template sources are read with, when pglease runs as root (default `nobody`;
    /// `crate::child_user`).
    pub child_user: Option<String>,
    /// The login role IntegreSQL clients' suites name in their PG* variables
    /// (`--integresql-pg-user`): it reaches the templates being initialized, nothing else.
    pub integresql_role: Option<IntegresqlRole>,
}

#[cfg(test)]
impl PoolConfig {
    /// An embedded server's configuration with default limits and no templates: what the
    /// router's tests start further servers from (none of them starts one).
    pub(crate) fn embedded_for_tests() -> PoolConfig {
        let limits = PoolLimits::default();
        PoolConfig {
            server: ServerConfig::Embedded(Box::new(EmbeddedConfig::for_limits(&limits, 1))),
            templates: Vec::new(),
            limits,
            clone_strategy: CloneStrategy::default(),
            prebuild: false,
            lease_auth: LeaseAuth::default(),
            lease_superuser: false,
            verify_templates: false,
            majors_on_request: false,
            child_user: None,
            integresql_role: None,
        }
    }
}

/// The one login role of IntegreSQL's model, for suites that load a dump into the template
/// being initialized with `psql` and the PG* variables of their run (IntegreSQL gives every
/// database one shared user). Between an initialize and its finalize the role is a member of
/// that template's own role, which the server's `samerole` rule turns into a way in to that
/// database alone; it is not a superuser and has a lease's connection limit.
///
/// On an external server it may instead be the login pglease connects with
/// (`server_login`), as in a compose file where IntegreSQL and the app share the server's
/// user: pglease then neither makes nor changes it, and the IntegreSQL answers carry its
/// credentials, for test databases too, as IntegreSQL's do.
#[derive(Clone, PartialEq, Eq)]
pub struct IntegresqlRole {
    /// The role's name (checked by [`crate::names::check_role_name`] unless it is the
    /// server's own login).
    pub name: String,
    /// Its password, as the suites' `PGPASSWORD` gives it.
    pub password: String,
    /// It is the `--postgres-url`'s own login, which reaches every database already: no
    /// role to make, no membership to grant, nothing to hand over at a finalize.
    pub server_login: bool,
}

impl std::fmt::Debug for IntegresqlRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntegresqlRole")
            .field("name", &self.name)
            .field("server_login", &self.server_login)
            .finish_non_exhaustive()
    }
}

/// Where the embedded server's clusters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    /// The instance directory itself, on tmpfs: every clone copies its template's bytes.
    Tmpfs,
    /// A copy-on-write file system pglease makes in RAM (`postgres/cow.rs`): on PostgreSQL
    /// 18 and later a clone shares its template's blocks (`file_copy_method = clone`).
    Cow,
    /// The store where it pays: on PostgreSQL 18+, a data directory that clones, or a store
    /// made in RAM when a template known at start is big and one can be made; otherwise
    /// tmpfs (`postgres/storage.rs`).
    #[default]
    Auto,
}

/// How lease roles authenticate to the embedded server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAuth {
    /// SCRAM-SHA-256 with a verifier of this many PBKDF2 iterations (postgres' default is 4096).
    Scram {
        /// PBKDF2 iterations in the stored verifier.
        iterations: u32,
    },
    /// No password check (the `sameuser` rule still limits each role to its own database).
    Trust,
}

impl Default for LeaseAuth {
    fn default() -> Self {
        LeaseAuth::Scram {
            iterations: DEFAULT_SCRAM_ITERATIONS,
        }
    }
}

/// The verifier's iteration count: postgres' own, the fewest that every common driver accepts
/// (pg8000 refuses fewer than 4096, Go's lib/pq fewer than 1000). With random passwords the
/// count protects nothing, and it costs CPU on both ends of every login: against 16, 1.3 ms
/// a connection with tokio-postgres and about 7 with libpq, about 15% of the lease path's
/// throughput on 2 cores (bench scenarios 2 and 5, docs/credentials.md), which
/// `--scram-iterations 16` saves for clients known to accept it.
pub const DEFAULT_SCRAM_ITERATIONS: u32 = 4096;

/// Per-template pool sizes and timings.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Ready clones kept warm per template.
    pub min_ready: usize,
    /// Clones at once per template: ready + leased + being made.
    pub max_total: usize,
    /// Clones (and drops) running at once, over all templates.
    pub clone_concurrency: usize,
    /// Time to live of a lease when the request names none.
    pub default_ttl: Duration,
    /// Upper bound on any lease's time to live.
    pub max_ttl: Duration,
    /// A lease's connection limit when the request names none.
    pub lease_connections: u32,
    /// Lease requests waiting at once, over all templates; more get an error at once.
    pub max_waiting: usize,
    /// How long SQL migrations (a migrations directory or a SQL file) may take to build a
    /// template; a command source has its own `timeout`.
    pub build_timeout: Duration,
    /// How long a client (IntegreSQL API) may take between initializing a template and
    /// finalizing it; past that the template counts as abandoned and is discarded.
    pub initialize_timeout: Duration,
    /// Databases kept after failed tests at once; keeping one more drops the oldest.
    pub max_kept: usize,
    /// The longest a database is kept (a longer `keep` is shortened to this).
    pub max_keep: Duration,
    /// Bytes templates and clones may take in all; None: no limit. (The embedded server
    /// defaults to three quarters of its tmpfs when this is None; see `actor::start`.)
    pub max_bytes: Option<u64>,
    /// A clone released without `reuse` goes back to the ready queue when the server proves
    /// it unchanged (`session/proof.rs`), instead of being dropped and made again. Only on a
    /// server pglease runs itself (turned off on an external one). On by default.
    pub reuse_unchanged: bool,
    /// The most one leased database may grow to before its lease is ended
    /// (`--lease-max-bytes`; `state/lease_bytes.rs`).
    pub lease_max_bytes: LeaseMaxBytes,
}

/// `--lease-max-bytes`: how big one leased database may grow before its lease is ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseMaxBytes {
    /// Derived from the databases' own tmpfs when the server has one
    /// ([`LeaseMaxBytes::derived`]); no limit otherwise (the room is not known).
    #[default]
    Auto,
    /// No limit (`0` or `off`).
    Off,
    /// This many bytes.
    Bytes(u64),
}

/// The least the derived limit is (unless that is more than half the room): a test's
/// database far past its template's size, yet nothing an ordinary suite writes.
pub const LEASE_MAX_BYTES_FLOOR: u64 = 256 << 20;

impl LeaseMaxBytes {
    /// The limit for the databases' tmpfs of `room` bytes: a quarter of it, so that one
    /// holder filling its database leaves at least three quarters to the others, but never
    /// under [`LEASE_MAX_BYTES_FLOOR`] or half the room, whichever is less (a small tmpfs
    /// is still bounded at half). `room` 0 (not measured yet) derives nothing.
    pub fn derived(room: u64) -> Option<u64> {
        (room > 0).then(|| (room / 4).max(LEASE_MAX_BYTES_FLOOR.min(room / 2)))
    }

    /// The limit in force, given the databases' room when it is known.
    pub fn resolve(self, room: Option<u64>) -> Option<u64> {
        match self {
            LeaseMaxBytes::Auto => room.and_then(Self::derived),
            LeaseMaxBytes::Off => None,
            LeaseMaxBytes::Bytes(bytes) => Some(bytes),
        }
    }
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            min_ready: 4,
            max_total: 32,
            clone_concurrency: 2,
            default_ttl: Duration::from_secs(30 * 60),
            max_ttl: Duration::from_secs(24 * 60 * 60),
            lease_connections: 10,
            max_bytes: None,
            max_kept: DEFAULT_MAX_KEPT,
            max_keep: DEFAULT_MAX_KEEP,
            max_waiting: 1024,
            build_timeout: DEFAULT_COMMAND_TIMEOUT,
            initialize_timeout: DEFAULT_INITIALIZE_TIMEOUT,
            reuse_unchanged: true,
            lease_max_bytes: LeaseMaxBytes::Auto,
        }
    }
}

/// Databases kept at once by default: enough for the failures of one run to look at, few
/// enough that forgotten ones cannot fill a tmpfs.
pub const DEFAULT_MAX_KEPT: usize = 8;

/// The longest a database is kept by default: an hour to look at a failure.
pub const DEFAULT_MAX_KEEP: Duration = Duration::from_secs(60 * 60);

/// `CREATE DATABASE … STRATEGY`: FILE_COPY is ~4x faster on a tuned tmpfs cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloneStrategy {
    /// Copy the files, checkpointing around the copy (fast with fsync off).
    #[default]
    FileCopy,
    /// Copy block by block through the WAL (postgres 15's default).
    WalLog,
}

impl CloneStrategy {
    /// The SQL keyword.
    pub fn as_sql(self) -> &'static str {
        match self {
            CloneStrategy::FileCopy => "FILE_COPY",
            CloneStrategy::WalLog => "WAL_LOG",
        }
    }
}

/// A template as configured: a name and where its schema comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateConfig {
    /// The template's name, as clients ask for it.
    pub name: TemplateName,
    /// What builds it.
    pub source: TemplateSource,
    /// The PostgreSQL version it needs, when not the primary server's: it then lives on a
    /// server of that major, started when first needed (see [`crate::Servers`]).
    pub postgres_version: Option<VersionSpec>,
}

/// The kinds of source a template names, each with what it takes, in the order messages
/// list them: the keys of the config file's `[templates.NAME]` table and of
/// `PUT /templates/{name}`, and `--template NAME=KIND:VALUE`. A template that names none of
/// them is an empty database (`--template NAME=empty`).
pub const SOURCE_KINDS: [(&str, &str); 4] = [
    ("migrations", "DIR"),
    ("sql", "FILE"),
    ("dump", "FILE"),
    ("command", "CMD"),
];

/// What to tell someone who named more than one source: every kind, the empty one too
/// (`give one of migrations, sql, dump or command, or none of them for an empty database`).
pub fn one_source_kind() -> String {
    let kinds: Vec<&str> = SOURCE_KINDS.iter().map(|(kind, _)| *kind).collect();
    format!(
        "give one of {}, or none of them for an empty database",
        or_list(&kinds)
    )
}

/// `a, b, c or d`.
pub fn or_list(items: &[&str]) -> String {
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// What a template database is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSource {
    /// An empty database.
    Empty,
    /// Every `*.sql` file of a directory, in lexical order, each in one transaction.
    Migrations(PathBuf),
    /// One SQL file, in one transaction.
    SqlFile(PathBuf),
    /// Any migration tool, run against the template being built.
    Command(CommandSource),
    /// A `pg_dump` output restored into the template: custom, directory or tar format with
    /// `pg_restore` (custom and directory in parallel), plain SQL (optionally `.gz`/`.zst`)
    /// with `psql`.
    Dump(DumpSource),
    /// Built by a client through the IntegreSQL-compatible API: it gets an empty template
    /// database with a login role, migrates it itself and finalizes it. The template's name
    /// is the client's hash, which is also its fingerprint; pglease cannot rebuild it.
    Client,
    /// Another source applied as postgres' superuser instead of a non-superuser role: for
    /// templates that truly need it (an untrusted extension). Only the operator can ask for
    /// it: `superuser = true` in the configuration file, or over HTTP when the daemon runs
    /// with `--allow-http-commands`.
    Superuser(Box<TemplateSource>),
}

impl TemplateSource {
    /// True for a template a client builds (see [`TemplateSource::Client`]).
    pub fn is_client_built(&self) -> bool {
        matches!(self, TemplateSource::Client)
    }

    /// Whether its stamp reads files (with the child user's rights, on a thread of its
    /// own); an empty or client-built template's stamp is a constant.
    pub fn names_files(&self) -> bool {
        match self {
            TemplateSource::Empty | TemplateSource::Client => false,
            TemplateSource::Superuser(inner) => inner.names_files(),
            TemplateSource::Migrations(_)
            | TemplateSource::SqlFile(_)
            | TemplateSource::Command(_)
            | TemplateSource::Dump(_) => true,
        }
    }

    /// True for a migration command that watches no file: its fingerprint is the command
    /// string alone, so an edit of its migrations builds no new version (nothing tells the
    /// daemon; `--watch`, `watch` in the configuration file or `--verify-templates` do).
    pub fn watches_nothing(&self) -> bool {
        match self {
            TemplateSource::Command(command) => command.watch.is_empty(),
            TemplateSource::Superuser(inner) => inner.watches_nothing(),
            TemplateSource::Empty
            | TemplateSource::Migrations(_)
            | TemplateSource::SqlFile(_)
            | TemplateSource::Dump(_)
            | TemplateSource::Client => false,
        }
    }
}

/// A dump to restore (see [`TemplateSource::Dump`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpSource {
    /// The dump: a file, or a directory-format dump's directory.
    pub path: PathBuf,
    /// `pg_restore -j`: parallel jobs for custom and directory dumps; None: the number of
    /// cores.
    pub jobs: Option<usize>,
    /// Killed (with its process group) after this long.
    pub timeout: Duration,
    /// A plain-SQL dump may be restored: it is a `psql` script, whose meta-commands (`\!`,
    /// `\copy … program`) run programs. True where the operator vouches for the dump (the
    /// configuration file, or HTTP with `--allow-http-commands`); otherwise only
    /// `pg_restore` formats are restored.
    pub allow_script: bool,
}

/// A migration command: run with `sh -c` in `workdir`, with `DATABASE_URL` and
/// `PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE` pointing at the template being built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSource {
    /// The shell command, e.g. `dbmate migrate` or `alembic upgrade head`.
    pub command: String,
    /// Its working directory.
    pub workdir: PathBuf,
    /// Files and directories whose contents enter the fingerprint (with the command string).
    pub watch: Vec<PathBuf>,
    /// Killed (with its process group) after this long.
    pub timeout: Duration,
    /// Who wrote it down, which decides who may run it (see [`CommandOrigin`]).
    pub origin: CommandOrigin,
}

/// Where a command comes from, which decides the user it runs as when the daemon is root.
/// Set where the command is made (the command line and configuration file, the API, a
/// dump's restore), so that no build can mistake a caller's command for the operator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandOrigin {
    /// The operator's configuration (`--template`, the configuration file): it runs as the
    /// owner of its working directory when that user alone controls the directory, its
    /// parents and the files the command names (root included); otherwise as the child
    /// user. Whoever controls those files could change what runs anyway.
    Operator,
    /// A caller of the API (`PUT /templates/{name}` with `--allow-http-commands`) or a
    /// dump's restore: always the child user.
    Caller,
}

/// Time a client gets from initialize to finalize by default: a dump of a few GB restores
/// well within it, and a client that died is noticed the same quarter hour.
pub const DEFAULT_INITIALIZE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Time a dump's restore gets by default: tens of GB restore within it.
pub const DEFAULT_DUMP_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// Time a migration command gets by default.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// Where the postgres server comes from.
#[derive(Debug, Clone)]
pub enum ServerConfig {
    /// pglease starts and supervises its own unsafe-tuned postgres.
    Embedded(Box<EmbeddedConfig>),
    /// An existing server reached with a superuser URL; pglease touches only what it created.
    External(ExternalConfig),
}

/// An existing server to attach to.
#[derive(Debug, Clone)]
pub struct ExternalConfig {
    /// A superuser connection URL.
    pub url: String,
    /// Host given to lease holders instead of the URL's host.
    pub advertise_host: Option<String>,
}

impl ExternalConfig {
    /// The user and password a server URL logs in with, when it names a user (`None` for a
    /// URL that does not parse: connecting reports that).
    pub fn login_of(url: &str) -> Option<(String, Option<String>)> {
        let config: tokio_postgres::Config = url.parse().ok()?;
        let user = config.get_user()?.to_owned();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        Some((user, password))
    }
}

/// The embedded postgres: where it runs and how it is tuned.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// Directory of `postgres`, `initdb`, `pg_ctl`; when None, an installed server, the
    /// cache or a download (see `pglease_binaries::resolve`).
    pub bin_dir: Option<PathBuf>,
    /// The server version wanted; None: the newest installed or cached, else a download
    /// of `pglease_binaries::DEFAULT_MAJOR`.
    pub postgres_version: Option<VersionSpec>,
    /// The Maven repository downloads come from (Maven Central or a mirror).
    pub binaries_repository: String,
    /// What a download of the server binaries reports its progress to: nothing by default
    /// (`pglease_binaries::NoProgress`); the `pglease` binary draws a bar on a terminal.
    pub download_progress: Arc<dyn pglease_binaries::Progress>,
    /// The instance directory; a fresh directory under /dev/shm when None.
    pub data_dir: Option<PathBuf>,
    /// Mount a dedicated tmpfs of this many bytes on the instance directory (root only).
    pub tmpfs_size: Option<u64>,
    /// The databases' room (`--databases-dir`): a directory on a file system of its own
    /// where each cluster's `base/` lives, apart from WAL and the shared catalogs
    /// (`postgres/room.rs`); used instead of the databases' own tmpfs pglease mounts as root.
    pub databases_dir: Option<PathBuf>,
    /// Where the clusters live: the tmpfs itself or a copy-on-write store made in it.
    pub storage: Storage,
    /// Start even when the data directory is not on tmpfs/ramfs.
    pub allow_unsafe_on_disk: bool,
    /// OS user that runs initdb and postgres when the daemon is root.
    pub pg_user: Option<String>,
    /// Where initdb results and downloaded binaries are cached;
    /// `pglease_binaries::default_cache_root()` when None.
    pub cache_dir: Option<PathBuf>,
    /// initdb `--encoding`.
    pub encoding: String,
    /// initdb `--locale`.
    pub locale: String,
    /// Address postgres listens on for lease holders.
    pub listen_host: String,
    /// Port postgres listens on; a free one when None.
    pub port: Option<u16>,
    /// Host given to lease holders instead of `listen_host`.
    pub advertise_host: Option<String>,
    /// Extra `-c key=value` settings, applied last.
    pub settings: Vec<(String, String)>,
    /// Keep the instance directory at exit.
    pub keep_data: bool,
    /// Where snapshots live (`--snapshot-dir`): the first start adopts this major's one
    /// instead of a fresh cluster, and a clean stop writes one when its templates changed.
    pub snapshot_dir: Option<PathBuf>,
    /// The key that authenticates snapshots (`--snapshot-key-file`); `snapshot.key` in the
    /// cache root, made at the first start, when None. Never inside `snapshot_dir`.
    pub snapshot_key_file: Option<PathBuf>,
    /// `max_connections`, sized by the caller from the pool.
    pub max_connections: u32,
    /// `shared_buffers`, e.g. "128MB", sized by the caller from the pool.
    pub shared_buffers: String,
    /// How lease roles authenticate (the `pg_hba.conf` rule for them); set from
    /// [`PoolConfig::lease_auth`] when the pool starts.
    pub lease_auth: LeaseAuth,
    /// The IntegreSQL clients' role, whose `samerole` rule `pg_hba.conf` gets; set from
    /// [`PoolConfig::integresql_role`] when the pool starts.
    pub integresql_role: Option<String>,
}

/// Client-built templates the embedded server's `max_connections` has room for, besides the
/// configured ones.
pub const CLIENT_TEMPLATE_ALLOWANCE: usize = 2;

impl EmbeddedConfig {
    /// Defaults for a pool with the given limits.
    pub fn for_limits(limits: &PoolLimits, template_count: usize) -> Self {
        // Room for every clone's lease connections, plus the daemon's own; past the cap the
        // pool's connection budget makes leases wait instead. Templates that IntegreSQL
        // clients build at run time share the budget: room for a few of them too (beyond
        // that, their never-returned test databases are reclaimed oldest first).
        let templates = template_count.max(1) + CLIENT_TEMPLATE_ALLOWANCE;
        let clones = limits.max_total.saturating_mul(templates);
        let lease_connections = clones.saturating_mul(limits.lease_connections as usize);
        let max_connections = (lease_connections + 30).clamp(100, 5000) as u32;
        EmbeddedConfig {
            bin_dir: None,
            postgres_version: None,
            binaries_repository: pglease_binaries::DEFAULT_REPOSITORY.to_owned(),
            download_progress: Arc::new(pglease_binaries::NoProgress),
            data_dir: None,
            tmpfs_size: None,
            databases_dir: None,
            storage: Storage::Auto,
            allow_unsafe_on_disk: false,
            pg_user: None,
            cache_dir: None,
            encoding: "UTF8".into(),
            locale: "C".into(),
            listen_host: "127.0.0.1".into(),
            port: None,
            advertise_host: None,
            settings: Vec::new(),
            keep_data: false,
            snapshot_dir: None,
            snapshot_key_file: None,
            max_connections,
            // Small on purpose: every clone checkpoint flushes all dirty buffers.
            shared_buffers: "128MB".into(),
            lease_auth: LeaseAuth::default(),
            integresql_role: None,
        }
    }
}
