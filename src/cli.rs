//! The command line (clap) and the optional TOML config file, and their conversion into
//! validated `pglease_pool::PoolConfig` / `pglease_api::ApiConfig` values. No clap or TOML
//! type leaves this file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use pglease_api::{ApiConfig, Token};
use pglease_pool::config::{
    one_source_kind, or_list, CommandSource, DumpSource, DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_SCRAM_ITERATIONS, SOURCE_KINDS,
};
use pglease_pool::{
    CloneStrategy, EmbeddedConfig, ExternalConfig, IntegresqlRole, LeaseAuth, PoolConfig,
    PoolLimits, ServerConfig, Storage, TemplateConfig, TemplateName, TemplateSource,
};
use serde::Deserialize;

/// Default address of the HTTP API.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5480";
/// Default server URL for client commands.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:5480";
/// The config file `serve` reads from its working directory when none is named.
pub const DEFAULT_CONFIG_FILE: &str = "pglease.toml";

/// pglease: a pool of pre-warmed, throw-away PostgreSQL databases for parallel tests.
///
/// `pglease serve` runs the daemon: its own postgres tuned for tests (fsync off, on tmpfs),
/// template databases built from your migrations, and ready clones leased over HTTP.
/// The other commands are clients of a running daemon.
#[derive(Debug, Parser)]
#[command(name = "pglease", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (embedded postgres on tmpfs, or --postgres-url).
    Serve(Box<ServeArgs>),
    /// Lease a database and print its URL: DATABASE_URL=$(pglease lease).
    Lease(LeaseArgs),
    /// Release a lease by id (its database is dropped and replaced).
    Release(ReleaseArgs),
    /// Extend a lease's time to live.
    Renew(RenewArgs),
    /// Show the daemon's servers, templates and leases: a table on a terminal (an error by
    /// its first line), JSON when piped or with --json (errors whole).
    Status(StatusArgs),
    /// List the databases kept after failed tests (release --keep, run --keep-on-failure),
    /// with the URL that opens each; --drop ID drops one now.
    Kept(KeptArgs),
    /// Wait until the daemon can lease (GET /readyz): `pglease serve & pglease ready`. Fails
    /// at once, with the daemon's reason, when a configured template cannot be built.
    Ready(ReadyArgs),
    /// Server binaries: download a version into the cache, list what is there.
    #[command(subcommand)]
    Postgres(PostgresCommand),
    /// Snapshots for cold CI runners: build the templates and write one now, or show what
    /// snapshot files hold (docs/snapshots.md).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Lease a database, run a command with DATABASE_URL and PG* set, release it.
    ///
    /// Exits with the command's exit status, or with 128+N when signal N killed it (as
    /// shells report it: 143 for SIGTERM, 137 for SIGKILL). SIGTERM and SIGINT sent to
    /// `pglease run` are passed on to the command (a Ctrl-C typed in the terminal reaches it
    /// directly and is not sent twice); a command still running 10 s after such a signal is
    /// killed with SIGKILL. The lease is released in every case.
    Run(RunArgs),
}

/// Options of `pglease serve`. Flags override the config file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (see docs/configuration.md) [default: ./pglease.toml if it exists].
    /// Flags override it; an on/off option it turns on is turned off by --no-NAME (see
    /// --help). The log says which file was read.
    #[arg(long, short = 'c', env = "PGLEASE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the HTTP API [default: 127.0.0.1:5480]. Any address but loopback needs --token.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Bearer token every API request must carry (health checks excepted); required when
    /// --listen is not a loopback address. Only with one do /status and /kept show lease ids
    /// and passwords, and may a request start a server of a major the configuration does not
    /// name (docs/security.md).
    #[arg(
        long,
        env = "PGLEASE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// A file whose content is the bearer token (surrounding white space ignored), so that
    /// the token shows neither in `ps` nor in the environment: systemd's LoadCredential=,
    /// a container secret. Instead of --token.
    #[arg(long, env = "PGLEASE_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Also serve the IntegreSQL v1 API (its client libraries work unchanged) on this
    /// address, e.g. 127.0.0.1:5000, IntegreSQL's port. The main port serves it too, under
    /// /api/v1. Its clients send no token: a non-loopback address needs
    /// --integresql-allow-remote.
    #[arg(long, env = "PGLEASE_INTEGRESQL_LISTEN", value_name = "ADDR")]
    pub integresql_listen: Option<SocketAddr>,
    /// Serve --integresql-listen on a non-loopback address although anyone who reaches it
    /// can lease databases (IntegreSQL clients cannot send a token).
    #[arg(long)]
    pub integresql_allow_remote: bool,
    /// A login role for suites that name one user in the PG* variables of their run, as
    /// IntegreSQL's shared user (e.g. dbuser), and load a dump into the template they are
    /// initializing with `psql`: from initialize to finalize it reaches that template's
    /// database, with a lease's connection limit; nothing else, and it is no superuser.
    /// Needs --integresql-pg-password; PGHOST and PGPORT are postgres' own (--pg-port fixes
    /// the port). See docs/integresql.md.
    #[arg(long, env = "PGLEASE_INTEGRESQL_PG_USER", value_name = "NAME")]
    pub integresql_pg_user: Option<String>,
    /// The password of --integresql-pg-user (the suites' PGPASSWORD).
    #[arg(
        long,
        env = "PGLEASE_INTEGRESQL_PG_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub integresql_pg_password: Option<String>,
    /// Lease requests that may wait at once; more get 429 [default: 1024].
    #[arg(long, value_name = "N")]
    pub max_waiting: Option<usize>,
    /// Seconds SQL migrations may take to build a template; a command template has its own
    /// timeout_secs [default: 300].
    #[arg(long, value_name = "SECS")]
    pub build_timeout: Option<u64>,
    /// Seconds an IntegreSQL client may take from initializing a template to finalizing it;
    /// past that the template is discarded as abandoned [default: 900].
    #[arg(long, value_name = "SECS")]
    pub initialize_timeout: Option<u64>,
    /// Databases kept at once after failed tests (`DELETE /leases/{id}?keep=SECS`); keeping
    /// one more drops the oldest [default: 8].
    #[arg(long, value_name = "N")]
    pub max_kept: Option<usize>,
    /// The longest a database is kept; a longer keep is shortened to this [default: 3600].
    #[arg(long, value_name = "SECS")]
    pub max_keep: Option<u64>,
    /// A template: NAME=migrations:DIR, NAME=sql:FILE, NAME=dump:FILE (a pg_dump output), NAME=command:CMD (give it --watch NAME=PATH) or NAME=empty; NAME@16=… puts it on a PostgreSQL 16 server (started when first needed). Repeatable.
    #[arg(long = "template", short = 't', value_name = "NAME=SOURCE")]
    pub templates: Vec<String>,
    /// A file or directory whose contents enter the fingerprint of the command template
    /// NAME (with its command string), e.g. --watch app=db/migrations: an edit there builds
    /// a new version at the next lease. Without one, a command template is fingerprinted by
    /// its command alone and edits of its migrations go unseen. Relative to the current
    /// directory; adds to the config file's watch list. Repeatable.
    #[arg(long = "watch", value_name = "NAME=PATH")]
    pub watches: Vec<String>,
    /// Ready clones kept warm per template [default: 4].
    #[arg(long)]
    pub min_ready: Option<usize>,
    /// Clones per template at once: ready + leased + being made [default: 32].
    #[arg(long)]
    pub max_total: Option<usize>,
    /// Clones and drops running at once [default: 2].
    #[arg(long)]
    pub clone_concurrency: Option<usize>,
    /// How CREATE DATABASE copies a template [default: file-copy].
    #[arg(long, value_enum)]
    pub clone_strategy: Option<StrategyArg>,
    /// Connection limit of a lease when the request names none [default: 10]. Postgres'
    /// max_connections is sized from it; leases wait while their connections do not fit.
    #[arg(long, value_name = "N")]
    pub lease_connections: Option<u32>,
    /// Time to live of a lease when the request names none, in seconds [default: 1800].
    #[arg(long, value_name = "SECS")]
    pub default_ttl: Option<u64>,
    /// Build every template at start instead of on first lease; /readyz (and `pglease
    /// ready`) then waits for them, and fails with the reason when one fails.
    #[arg(long, overrides_with = "no_prebuild")]
    pub prebuild: bool,
    /// Overrides prebuild = true in the config file.
    #[arg(long, overrides_with = "prebuild", hide_short_help = true)]
    pub no_prebuild: bool,
    /// How lease roles log in: scram (SCRAM-SHA-256, --scram-iterations) or trust [default: scram].
    #[arg(long, value_enum)]
    pub lease_auth: Option<LeaseAuthArg>,
    /// PBKDF2 iterations of lease roles' SCRAM verifiers [default: 4096, postgres' own, which
    /// every common driver accepts]. 16 saves 1-7 ms of CPU a connection where every client takes
    /// it (not pg8000, nor Go's lib/pq under 1000).
    #[arg(long, value_name = "N")]
    pub scram_iterations: Option<u32>,
    /// Make lease roles superusers (for suites that need it; they can then reach every database).
    #[arg(long, overrides_with = "no_lease_superuser")]
    pub lease_superuser: bool,
    /// Overrides lease_superuser = true in the config file.
    #[arg(long, overrides_with = "lease_superuser", hide_short_help = true)]
    pub no_lease_superuser: bool,
    /// Let `PUT /templates/{name}` register `command` sources, superuser templates and
    /// plain-SQL dumps (psql scripts, which can run programs). They run as --child-user,
    /// never as root: only for a daemon whose every API client you trust.
    #[arg(long)]
    pub allow_http_commands: bool,
    /// OS user that migration commands, psql and pg_restore run as, and whose rights
    /// template sources are read with, when pglease runs as root [default: nobody].
    #[arg(long, value_name = "USER")]
    pub child_user: Option<String>,
    /// Build every template from scratch once per run, even when a template with the same
    /// fingerprint exists (for CI: a stale template cannot hide a broken migration).
    #[arg(long, overrides_with = "no_verify_templates")]
    pub verify_templates: bool,
    /// Overrides verify_templates = true in the config file.
    #[arg(long, overrides_with = "verify_templates", hide_short_help = true)]
    pub no_verify_templates: bool,
    /// Put a released database back in the ready queue, without dropping and cloning it
    /// again, when the server proves it unchanged since it was handed out (no dirty page,
    /// no file written, no setting, grant or comment changed; docs/reuse-unchanged.md).
    /// On by default with the postgres pglease starts itself; off on an external server.
    #[arg(long, overrides_with = "no_reuse_unchanged", hide_short_help = true)]
    pub reuse_unchanged: bool,
    /// Drop and clone again every released database, changed or not.
    #[arg(long, overrides_with = "reuse_unchanged")]
    pub no_reuse_unchanged: bool,
    /// Attach to this existing server (a superuser URL) instead of starting postgres.
    #[arg(
        long,
        value_name = "URL",
        env = "PGLEASE_POSTGRES_URL",
        hide_env_values = true
    )]
    pub postgres_url: Option<String>,
    /// Directory of the postgres binaries (postgres, initdb); used alone, and it must hold
    /// the --postgres-version if that is given too [default: see --postgres-version].
    #[arg(long, value_name = "DIR")]
    pub pg_bin_dir: Option<PathBuf>,
    /// PostgreSQL version to run: a major (17) or a major.minor (17.6), 13 to 18.
    ///
    /// Taken from, in this order: --pg-bin-dir; a server of that version installed here
    /// (pg_config --bindir, /usr/lib/postgresql/MAJOR/bin, postgres on PATH); one
    /// downloaded earlier into the cache (--cache-dir, under binaries/); else a download
    /// of the newest such release (about 15 MB) from --postgres-repository into that
    /// cache, which later starts use offline. Without a version: the newest installed
    /// server, else the newest cached, else PostgreSQL 18 is downloaded.
    #[arg(long, env = "PGLEASE_POSTGRES_VERSION", value_name = "VERSION")]
    pub postgres_version: Option<String>,
    /// Maven repository that server binaries are downloaded from (zonky's
    /// embedded-postgres-binaries), e.g. a mirror [default: Maven Central, repo1.maven.org/maven2].
    #[arg(long, env = "PGLEASE_POSTGRES_REPOSITORY", value_name = "URL")]
    pub postgres_repository: Option<String>,
    /// Instance directory for postgres' data [default: a fresh directory under /dev/shm].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Bytes templates and clones may take in all (e.g. 4G) [default: 3/4 of the
    /// databases' tmpfs, else of the data directory's; no limit on an external server].
    /// Past it, what nobody waits for is evicted, then requests get 507.
    #[arg(long, value_name = "SIZE")]
    pub max_bytes: Option<String>,
    /// Mount a dedicated tmpfs of this size (e.g. 2G) for the data (needs root). As root
    /// on tmpfs, the databases get a tmpfs of their own, 3/4 of it, so that a lease that
    /// fills it gets "No space left on device" and postgres stays up (docs/security.md).
    #[arg(long, value_name = "SIZE")]
    pub tmpfs_size: Option<String>,
    /// Allow fsync=off on a data directory that is not tmpfs/ramfs.
    #[arg(long, overrides_with = "no_allow_unsafe_on_disk")]
    pub allow_unsafe_on_disk: bool,
    /// Overrides allow_unsafe_on_disk = true in the config file's postgres table.
    #[arg(long, overrides_with = "allow_unsafe_on_disk", hide_short_help = true)]
    pub no_allow_unsafe_on_disk: bool,
    /// OS user that runs postgres when pglease runs as root [default: postgres, else nobody].
    #[arg(long, value_name = "USER")]
    pub pg_user: Option<String>,
    /// Where initdb results and downloaded server binaries are cached [default: as root
    /// /var/cache/pglease, else $XDG_CACHE_HOME/pglease or ~/.cache/pglease].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Address postgres listens on [default: 127.0.0.1].
    #[arg(long, value_name = "HOST")]
    pub pg_listen: Option<String>,
    /// Port postgres listens on [default: a free port].
    #[arg(long, value_name = "PORT")]
    pub pg_port: Option<u16>,
    /// Extra postgres setting KEY=VALUE (applied last). Repeatable.
    #[arg(long = "pg-setting", value_name = "KEY=VALUE")]
    pub pg_settings: Vec<String>,
    /// initdb --locale [default: C].
    #[arg(long)]
    pub locale: Option<String>,
    /// initdb --encoding [default: UTF8].
    #[arg(long)]
    pub encoding: Option<String>,
    /// Host put in lease answers instead of postgres' listen address (e.g. a compose service name).
    #[arg(long, env = "PGLEASE_ADVERTISE_HOST", value_name = "HOST")]
    pub advertise_host: Option<String>,
    /// Keep the data directory at exit.
    #[arg(long, overrides_with = "no_keep_data")]
    pub keep_data: bool,
    /// Overrides keep_data = true in the config file's postgres table.
    #[arg(long, overrides_with = "keep_data", hide_short_help = true)]
    pub no_keep_data: bool,
    /// Snapshots for cold CI runners: start from this directory's snapshot of the
    /// server's major (its templates whose sources are unchanged are used without a
    /// build; the others are built), and write one at a clean stop when templates were
    /// built. Keep the directory in the CI cache (docs/snapshots.md).
    #[arg(long, env = "PGLEASE_SNAPSHOT_DIR", value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// Where the clusters live [default: auto]. `tmpfs`: the instance directory, every
    /// clone copies its template. `cow`: a copy-on-write XFS that pglease makes in RAM and
    /// loop-mounts (needs root, mkfs.xfs from xfsprogs, util-linux' mount), or with
    /// --data-dir that directory if its file system clones (XFS with reflink, btrfs); on
    /// PostgreSQL 18 and later a clone then shares its template's blocks instead of copying
    /// them. `auto`: on PostgreSQL 18+, a --data-dir that clones, or the store in RAM when a
    /// template known at start is 128 MB or more (its sources, or its database in the
    /// snapshot) and one can be made; otherwise tmpfs, which clones small templates faster.
    /// `/status` says what was chosen and why (docs/cow-storage.md).
    #[arg(long, env = "PGLEASE_STORAGE", value_name = "STORAGE")]
    pub storage: Option<StorageArg>,
}

/// `--storage`.
#[derive(Debug, Clone, Copy, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageArg {
    /// The instance directory on tmpfs: every clone copies its template.
    Tmpfs,
    /// A copy-on-write store made in RAM: on PostgreSQL 18+ clones share blocks.
    Cow,
    /// The store where measurements say it pays (big templates, PostgreSQL 18+), else tmpfs.
    Auto,
}

/// `--clone-strategy`.
#[derive(Debug, Clone, Copy, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyArg {
    /// CREATE DATABASE … STRATEGY FILE_COPY (fast on tmpfs).
    FileCopy,
    /// CREATE DATABASE … STRATEGY WAL_LOG (postgres 15's default).
    WalLog,
}

/// `--lease-auth`.
#[derive(Debug, Clone, Copy, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseAuthArg {
    /// SCRAM-SHA-256 with a verifier computed by pglease.
    Scram,
    /// No password check; each role still reaches only its own database.
    Trust,
}

/// Options shared by client commands.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// URL of the pglease daemon.
    #[arg(long, env = "PGLEASE_URL", default_value = DEFAULT_SERVER, value_name = "URL")]
    pub server: String,
    /// The daemon's bearer token, if it has one.
    #[arg(
        long,
        env = "PGLEASE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

/// `pglease lease`.
#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// Template to lease from (PGLEASE_TEMPLATE, as the Go and Python helpers read it).
    #[arg(long, short = 't', env = "PGLEASE_TEMPLATE", default_value = "default")]
    pub template: String,
    /// Time to live in seconds [default: the daemon's].
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u64>,
    /// How long to wait for a database, in milliseconds [default: the daemon's].
    #[arg(long, value_name = "MS")]
    pub wait_ms: Option<u64>,
    /// The PostgreSQL version the database must be (e.g. 17 or 17.6); a daemon serving
    /// another refuses at once.
    #[arg(long, value_name = "VERSION", env = "PGLEASE_LEASE_POSTGRES_VERSION")]
    pub postgres_version: Option<pglease_binaries::VersionSpec>,
    /// What to call the lease in `/status` and the daemon's log (e.g. the test's name).
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// Print the whole lease as JSON (id, url, credentials, expiry) instead of the URL.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `pglease release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The lease id.
    pub id: String,
    /// The database was left unchanged: recycle it as is instead of dropping it.
    #[arg(long, conflicts_with = "keep")]
    pub reuse: bool,
    /// Keep the database as it is for SECS (a failed test's, to look at; `pglease kept` lists
    /// it with its URL), up to the daemon's --max-keep.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub keep: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `pglease status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the JSON of GET /status even on a terminal.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `pglease kept`.
#[derive(Debug, Args)]
pub struct KeptArgs {
    /// Print the JSON of GET /kept.
    #[arg(long)]
    pub json: bool,
    /// Drop the database kept under this id now.
    #[arg(long, value_name = "ID")]
    pub drop: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `pglease renew`.
#[derive(Debug, Args)]
pub struct RenewArgs {
    /// The lease id.
    pub id: String,
    /// New time to live from now, in seconds [default: the daemon's].
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `pglease ready`.
#[derive(Debug, Args)]
pub struct ReadyArgs {
    /// Seconds to keep asking while the daemon is not up or not ready yet (0: ask once).
    /// Exits 0 once it is ready, 1 when the time is up or, at once, when a configured
    /// template cannot be built (its sources missing, or with --prebuild its build failed).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub timeout: u64,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `pglease run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Template to lease from (PGLEASE_TEMPLATE, as the Go and Python helpers read it).
    #[arg(long, short = 't', env = "PGLEASE_TEMPLATE", default_value = "default")]
    pub template: String,
    /// The PostgreSQL version the database must be (e.g. 17 or 17.6); a daemon serving
    /// another refuses at once.
    #[arg(long, value_name = "VERSION", env = "PGLEASE_LEASE_POSTGRES_VERSION")]
    pub postgres_version: Option<pglease_binaries::VersionSpec>,
    /// What to call the lease in `/status` and the daemon's log (e.g. the test's name).
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// When the command fails, keep its database as it is for SECS [default: 3600] instead
    /// of dropping it, and print its URL (`pglease kept` lists it).
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "3600", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub keep_on_failure: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `pglease postgres`: the server binaries, without a daemon.
#[derive(Debug, Subcommand)]
pub enum PostgresCommand {
    /// Download a version into the cache (unless it is there already) and print its bin
    /// directory: for a machine image or a CI cache, so that `serve` starts offline.
    Fetch(FetchArgs),
    /// List the installed servers and those in the cache.
    List(ListArgs),
}

/// `pglease snapshot …`.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Start the server as `serve` would (same options, no HTTP), build every template it
    /// holds, stop, and write the snapshot into --snapshot-dir; prints the file's path.
    /// `serve --snapshot-dir` writes one at each clean stop as well: this is for a step that
    /// only prepares (a Docker image, a CI cache warm-up).
    Save(Box<ServeArgs>),
    /// Print what snapshot files hold: postgres version, initdb settings, when it was
    /// written (UTC), each template's name, fingerprint and size.
    Show(ShowArgs),
}

/// `pglease snapshot show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A snapshot file, or a directory of them (--snapshot-dir).
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
}

/// `pglease postgres fetch`.
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// A major (17) or a major.minor (17.6), 13 to 18 [default: 18].
    // Not named `version`: that is the --version flag every subcommand has.
    #[arg(value_name = "VERSION")]
    pub postgres_version: Option<pglease_binaries::VersionSpec>,
    /// The cache root, as for `serve` [default: as root /var/cache/pglease, else
    /// $XDG_CACHE_HOME/pglease or ~/.cache/pglease].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Maven repository to download from [default: Maven Central, repo1.maven.org/maven2].
    #[arg(long, env = "PGLEASE_POSTGRES_REPOSITORY", value_name = "URL")]
    pub postgres_repository: Option<String>,
}

/// `pglease postgres list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The cache root, as for `serve` [default: as for `serve`].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// The `[postgres]` table of the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostgresFile {
    url: Option<String>,
    bin_dir: Option<PathBuf>,
    /// A major (an integer or a string) or a major.minor (a string: 17.6 unquoted is a
    /// TOML float).
    postgres_version: Option<toml::Value>,
    postgres_repository: Option<String>,
    data_dir: Option<PathBuf>,
    tmpfs_size: Option<String>,
    allow_unsafe_on_disk: Option<bool>,
    user: Option<String>,
    cache_dir: Option<PathBuf>,
    listen: Option<String>,
    port: Option<u16>,
    advertise_host: Option<String>,
    locale: Option<String>,
    encoding: Option<String>,
    keep_data: Option<bool>,
    snapshot_dir: Option<PathBuf>,
    storage: Option<StorageArg>,
    #[serde(default)]
    settings: BTreeMap<String, toml::Value>,
}

/// A `[templates.NAME]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateFile {
    migrations: Option<PathBuf>,
    sql: Option<PathBuf>,
    command: Option<String>,
    /// A pg_dump output (custom, directory, tar or plain SQL, .gz/.zst).
    dump: Option<PathBuf>,
    /// For `dump`: pg_restore's parallel jobs (default: the number of cores).
    jobs: Option<usize>,
    /// For `command`: its working directory (default: the config file's directory).
    workdir: Option<PathBuf>,
    /// For `command`: files and directories whose contents enter the fingerprint.
    #[serde(default)]
    watch: Vec<PathBuf>,
    /// For `command`: seconds before it is killed.
    timeout_secs: Option<u64>,
    /// Apply the source as postgres' superuser (an untrusted extension needs it); without
    /// it, a template runs as a role that can do what its objects' owner can, no more.
    #[serde(default)]
    superuser: bool,
    /// The PostgreSQL version it needs when not the daemon's own (`16` or `"16.4"`): it
    /// then lives on a server of that major, started when first needed.
    postgres_version: Option<toml::Value>,
}

/// The config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    listen: Option<SocketAddr>,
    min_ready: Option<usize>,
    max_total: Option<usize>,
    clone_concurrency: Option<usize>,
    clone_strategy: Option<StrategyArg>,
    default_ttl_secs: Option<u64>,
    lease_connections: Option<u32>,
    max_bytes: Option<String>,
    max_waiting: Option<usize>,
    build_timeout_secs: Option<u64>,
    initialize_timeout_secs: Option<u64>,
    max_kept: Option<usize>,
    max_keep_secs: Option<u64>,
    prebuild: Option<bool>,
    lease_auth: Option<LeaseAuthArg>,
    scram_iterations: Option<u32>,
    lease_superuser: Option<bool>,
    verify_templates: Option<bool>,
    reuse_unchanged: Option<bool>,
    child_user: Option<String>,
    integresql_pg_user: Option<String>,
    integresql_pg_password: Option<String>,
    #[serde(default)]
    postgres: PostgresFile,
    #[serde(default)]
    templates: BTreeMap<String, TemplateFile>,
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

/// A config file found in the working directory (not named) is read only if the user
/// pglease runs as owns it and nobody else may write it, as git treats a repository it finds:
/// a daemon started in a shared directory (/tmp, a CI workspace) must not take its command
/// templates, data directory or superuser sources from a file someone else put there.
/// Named with --config or PGLEASE_CONFIG, a file is the operator's choice.
fn found_file_is_ours(path: &Path) -> Result<(), String> {
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

fn push_template(
    templates: &mut Vec<TemplateConfig>,
    name: &str,
    source: TemplateSource,
    postgres_version: Option<pglease_binaries::VersionSpec>,
) -> Result<(), String> {
    let name = TemplateName::new(name).map_err(|e| e.to_string())?;
    if name == TemplateName::default_name() && source != TemplateSource::Empty {
        // Clients rely on `default` being an empty database.
        return Err("the template name \"default\" is reserved for the empty template".into());
    }
    if name == TemplateName::default_name() && postgres_version.is_some() {
        return Err(
            "the template \"default\" exists on every server; lease it with \
                    {\"postgres_version\": …} instead of naming a version for it"
                .into(),
        );
    }
    templates.push(TemplateConfig {
        name,
        source,
        postgres_version,
    });
    Ok(())
}

/// `--watch NAME=PATH`: one more watched path for the command template NAME.
fn add_watch(templates: &mut [TemplateConfig], spec: &str) -> Result<(), String> {
    let (name, path) = spec
        .split_once('=')
        .filter(|(name, path)| !name.is_empty() && !path.is_empty())
        .ok_or_else(|| format!("--watch {spec:?}: expected NAME=PATH"))?;
    let template = templates
        .iter_mut()
        .find(|t| t.name.as_str() == name)
        .ok_or_else(|| {
            format!("--watch {spec:?}: no template {name:?} (define it with --template {name}=command:CMD)")
        })?;
    let mut source = &mut template.source;
    if let TemplateSource::Superuser(inner) = source {
        source = inner;
    }
    let TemplateSource::Command(command) = source else {
        return Err(format!(
            "--watch {spec:?}: template {name:?} is not a command template (its other sources are fingerprinted whole already)"
        ));
    };
    command.watch.push(absolute(Path::new(path))?);
    Ok(())
}

/// A command's timeout: 1 s to a day.
fn command_timeout(secs: Option<u64>) -> Result<Duration, String> {
    match secs {
        None => Ok(DEFAULT_COMMAND_TIMEOUT),
        Some(secs @ 1..=86_400) => Ok(Duration::from_secs(secs)),
        Some(secs) => Err(format!("{secs} s: must be between 1 and 86400")),
    }
}

/// `NAME=migrations:DIR`, `NAME=sql:FILE`, `NAME=command:CMD`, `NAME=empty`; `NAME@16=…`
/// puts the template on a PostgreSQL 16 server.
fn parse_template_flag(
    spec: &str,
) -> Result<(&str, Option<pglease_binaries::VersionSpec>, TemplateSource), String> {
    let usage = || {
        let forms: Vec<String> = SOURCE_KINDS
            .iter()
            .map(|(kind, value)| format!("NAME={kind}:{value}"))
            .chain(["NAME=empty".to_owned()])
            .collect();
        let forms: Vec<&str> = forms.iter().map(String::as_str).collect();
        format!(
            "--template {spec:?}: expected {} (NAME@16=… for a PostgreSQL 16 server)",
            or_list(&forms)
        )
    };
    let (name, source) = spec.split_once('=').ok_or_else(usage)?;
    let (name, version) = match name.split_once('@') {
        Some((name, version)) => {
            let version = version
                .parse()
                .map_err(|e| format!("--template {spec:?}: {e}"))?;
            (name, Some(version))
        }
        None => (name, None),
    };
    let source = match source.split_once(':') {
        Some(("migrations", dir)) if !dir.is_empty() => {
            TemplateSource::Migrations(absolute(Path::new(dir))?)
        }
        Some(("sql", file)) if !file.is_empty() => {
            TemplateSource::SqlFile(absolute(Path::new(file))?)
        }
        Some(("dump", file)) if !file.is_empty() => TemplateSource::Dump(DumpSource {
            path: absolute(Path::new(file))?,
            jobs: None,
            timeout: pglease_pool::config::DEFAULT_DUMP_TIMEOUT,
            allow_script: true,
        }),
        // Run in the current directory; only the command string enters the fingerprint
        // (`--watch NAME=PATH` or a config file's `watch` add files).
        Some(("command", command)) if !command.trim().is_empty() => {
            TemplateSource::Command(CommandSource {
                command: command.to_owned(),
                workdir: absolute(Path::new("."))?,
                watch: Vec::new(),
                timeout: DEFAULT_COMMAND_TIMEOUT,
            })
        }
        None if source == "empty" => TemplateSource::Empty,
        _ => return Err(usage()),
    };
    Ok((name, version, source))
}

/// Sources are resolved against the current directory now, so the daemon's own working
/// directory never matters.
fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// `postgres_version` in the config file: `17`, `"17"` or `"17.6"`.
fn file_version(value: &toml::Value) -> Result<pglease_binaries::VersionSpec, String> {
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
pub fn parse_size(text: &str) -> Result<u64, String> {
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

#[cfg(test)]
mod tests;
