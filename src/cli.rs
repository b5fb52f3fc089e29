//! The command line (clap): the subcommands and their options. `serve`'s options are in
//! `serve.rs`; the config file is found and read in `file.rs` and merged with the flags in
//! `config.rs`, one function per section (`templates.rs` and `server.rs` hold the two
//! biggest; `merge.rs` the rules they share), into validated `pglease_pool::PoolConfig` /
//! `pglease_api::ApiConfig` values.
//! No clap or TOML type leaves this module.

mod config;
mod file;
mod merge;
mod paths;
mod serve;
mod server;
mod templates;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub use config::ServeConfig;
pub use serve::ServeArgs;

/// Default address of the HTTP API.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:5480";
/// Default server URL for client commands.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:5480";
/// The config file `serve` reads from its working directory when none is named.
pub const DEFAULT_CONFIG_FILE: &str = "pglease.toml";

/// A pool of pre-warmed, throw-away PostgreSQL databases for parallel tests.
///
/// `pglease serve` runs the daemon: its own postgres tuned for tests (fsync off, on tmpfs),
/// template databases built from your migrations, and ready clones leased over HTTP.
/// The other commands are clients of a running daemon.
#[derive(Debug, Parser)]
#[command(
    name = "pglease",
    version,
    long_version = long_version(),
    propagate_version = true
)]
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
    /// Print a shell completion script: `pglease completions bash > /etc/bash_completion.d/pglease`.
    Completions(CompletionsArgs),
    /// Print the man page (roff), or write one page per command into --out-dir.
    Man(ManArgs),
}

/// `pglease completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `pglease man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write pglease.1 and a page per subcommand (pglease-serve.1, …) into this directory
    /// instead of printing pglease.1.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// What `--version` says beyond the version: the commit it was built from (`build.rs`) and
/// the PostgreSQL majors it can serve.
fn long_version() -> &'static str {
    static LONG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LONG.get_or_init(|| {
        let majors = pglease_binaries::SUPPORTED_MAJORS;
        format!(
            "{} (commit {})\nserves PostgreSQL {}–{} (default {})",
            env!("CARGO_PKG_VERSION"),
            // Set by build.rs; a build without it (an odd packaging) still says something.
            option_env!("PGLEASE_COMMIT").unwrap_or("unknown"),
            majors.start(),
            majors.end(),
            pglease_binaries::DEFAULT_MAJOR,
        )
    })
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
    /// written (UTC), each template's name, fingerprint and size. Only a snapshot whose MAC
    /// the key proves is read; another is shown as not usable, with the reason.
    Show(ShowArgs),
}

/// `pglease snapshot show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A snapshot file, or a directory of them (--snapshot-dir).
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    /// The key that authenticates the snapshots, as for `serve` [default: snapshot.key in
    /// the cache root].
    #[arg(long, env = "PGLEASE_SNAPSHOT_KEY_FILE", value_name = "PATH")]
    pub snapshot_key_file: Option<PathBuf>,
    /// The cache root, as for `serve`, where the default key is [default: as for `serve`].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
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

#[cfg(test)]
mod doc_flags;
#[cfg(test)]
mod tests;
