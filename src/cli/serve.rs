//! The options of `pglease serve` (and `pglease snapshot save`), as clap parses them.
//! What they mean once merged with the config file is `config.rs`'s business.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Deserialize;

/// Options of `pglease serve`. Flags override the config file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (docs/configuration.md; a release installs docs/ under
    /// share/doc/pglease) [default: ./pglease.toml if it exists].
    /// Flags override it; an on/off option it turns on is turned off by --no-NAME (see
    /// --help). The log says which file was read.
    #[arg(
        help_heading = "Configuration and the HTTP API",
        long,
        short = 'c',
        env = "PGLEASE_CONFIG",
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,
    /// Address of the HTTP API [default: 127.0.0.1:5480]. Any address but loopback needs --token.
    #[arg(
        help_heading = "Configuration and the HTTP API",
        long,
        value_name = "ADDR"
    )]
    pub listen: Option<SocketAddr>,
    /// Bearer token every API request must carry (health checks excepted); required when
    /// --listen is not a loopback address. Only with one do /status and /kept show lease ids
    /// and passwords, and may a request start a server of a major the configuration does not
    /// name (docs/security.md).
    #[arg(
        help_heading = "Configuration and the HTTP API",
        long,
        env = "PGLEASE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// A file whose content is the bearer token (surrounding white space ignored), so that
    /// the token shows neither in `ps` nor in the environment: systemd's LoadCredential=,
    /// a container secret. Instead of --token.
    #[arg(
        help_heading = "Configuration and the HTTP API",
        long,
        env = "PGLEASE_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<PathBuf>,
    /// Seconds SQL migrations may take to build a template; a command template has its own
    /// timeout_secs [default: 300].
    #[arg(help_heading = "Templates", long, value_name = "SECS")]
    pub build_timeout: Option<u64>,
    /// A template: NAME=migrations:DIR, NAME=sql:FILE, NAME=dump:FILE (a pg_dump output), NAME=command:CMD (give it --watch NAME=PATH) or NAME=empty; NAME@16=… puts it on a PostgreSQL 16 server (started when first needed). Repeatable.
    #[arg(
        help_heading = "Templates",
        long = "template",
        short = 't',
        value_name = "NAME=SOURCE"
    )]
    pub templates: Vec<String>,
    /// A file or directory whose contents enter the fingerprint of the command template
    /// NAME (with its command string), e.g. --watch app=db/migrations: an edit there builds
    /// a new version at the next lease. Without one, a command template is fingerprinted by
    /// its command alone and edits of its migrations go unseen. Relative to the current
    /// directory; adds to the config file's watch list. Repeatable.
    #[arg(help_heading = "Templates", long = "watch", value_name = "NAME=PATH")]
    pub watches: Vec<String>,
    /// Build every template at start instead of on first lease; /readyz (and `pglease
    /// ready`) then waits for them, and fails with the reason when one fails.
    #[arg(help_heading = "Templates", long, overrides_with = "no_prebuild")]
    pub prebuild: bool,
    /// Overrides prebuild = true in the config file.
    #[arg(
        help_heading = "Templates",
        long,
        overrides_with = "prebuild",
        hide_short_help = true
    )]
    pub no_prebuild: bool,
    /// Let `PUT /templates/{name}` register `command` sources, superuser templates and
    /// plain-SQL dumps (psql scripts, which can run programs). They run as --child-user,
    /// never as root: only for a daemon whose every API client you trust.
    #[arg(help_heading = "Templates", long)]
    pub allow_http_commands: bool,
    /// OS user that migration commands, psql and pg_restore run as, and whose rights
    /// template sources are read with, when pglease runs as root [default: nobody].
    #[arg(help_heading = "Templates", long, value_name = "USER")]
    pub child_user: Option<String>,
    /// Build every template from scratch once per run, even when a template with the same
    /// fingerprint exists (for CI: a stale template cannot hide a broken migration).
    #[arg(
        help_heading = "Templates",
        long,
        overrides_with = "no_verify_templates"
    )]
    pub verify_templates: bool,
    /// Overrides verify_templates = true in the config file.
    #[arg(
        help_heading = "Templates",
        long,
        overrides_with = "verify_templates",
        hide_short_help = true
    )]
    pub no_verify_templates: bool,
    /// Lease requests that may wait at once; more get 429 [default: 1024].
    #[arg(help_heading = "The pool", long, value_name = "N")]
    pub max_waiting: Option<usize>,
    /// Databases kept at once after failed tests (`DELETE /leases/{id}?keep=SECS`); keeping
    /// one more drops the oldest [default: 8].
    #[arg(help_heading = "The pool", long, value_name = "N")]
    pub max_kept: Option<usize>,
    /// The longest a database is kept; a longer keep is shortened to this [default: 3600].
    #[arg(help_heading = "The pool", long, value_name = "SECS")]
    pub max_keep: Option<u64>,
    /// Ready clones kept warm per template [default: 4].
    #[arg(help_heading = "The pool", long)]
    pub min_ready: Option<usize>,
    /// Clones per template at once: ready + leased + being made [default: 32].
    #[arg(help_heading = "The pool", long)]
    pub max_total: Option<usize>,
    /// Clones and drops running at once [default: 2].
    #[arg(help_heading = "The pool", long)]
    pub clone_concurrency: Option<usize>,
    /// How CREATE DATABASE copies a template [default: file-copy].
    #[arg(help_heading = "The pool", long, value_enum)]
    pub clone_strategy: Option<StrategyArg>,
    /// Time to live of a lease when the request names none, in seconds [default: 1800].
    #[arg(help_heading = "The pool", long, value_name = "SECS")]
    pub default_ttl: Option<u64>,
    /// Put a released database back in the ready queue, without dropping and cloning it
    /// again, when the server proves it unchanged since it was handed out (no dirty page,
    /// no file written, no setting, grant or comment changed; docs/reuse-unchanged.md).
    /// On by default with the postgres pglease starts itself; off on an external server.
    #[arg(
        help_heading = "The pool",
        long,
        overrides_with = "no_reuse_unchanged",
        hide_short_help = true
    )]
    pub reuse_unchanged: bool,
    /// Drop and clone again every released database, changed or not.
    #[arg(help_heading = "The pool", long, overrides_with = "reuse_unchanged")]
    pub no_reuse_unchanged: bool,
    /// Bytes templates and clones may take in all (e.g. 4G) [default: 3/4 of the
    /// databases' tmpfs, else of the data directory's; no limit on an external server].
    /// Past it, what nobody waits for is evicted, then requests get 507.
    #[arg(help_heading = "The pool", long, value_name = "SIZE")]
    pub max_bytes: Option<String>,
    /// The most one leased database may grow to (e.g. 512M); past it the lease is ended,
    /// its sessions end with its database, and the holder's next call on it gets 410
    /// `lease_exceeded_max_bytes`. Measured up to 4 times a second while leases are open. `0` or
    /// `off`: no limit [default: as root on tmpfs, a quarter of the databases' own tmpfs,
    /// but at least 256M or half of it, whichever is less; else no limit].
    #[arg(help_heading = "Leases", long, value_name = "SIZE")]
    pub lease_max_bytes: Option<String>,
    /// Connection limit of a lease when the request names none [default: 10]. Postgres'
    /// max_connections is sized from it; leases wait while their connections do not fit.
    #[arg(help_heading = "Leases", long, value_name = "N")]
    pub lease_connections: Option<u32>,
    /// How lease roles log in: scram (SCRAM-SHA-256, --scram-iterations) or trust [default: scram].
    #[arg(help_heading = "Leases", long, value_enum)]
    pub lease_auth: Option<LeaseAuthArg>,
    /// PBKDF2 iterations of lease roles' SCRAM verifiers [default: 4096, postgres' own, which
    /// every common driver accepts]. 16 saves 1-7 ms of CPU a connection where every client takes
    /// it (not pg8000, nor Go's lib/pq under 1000).
    #[arg(help_heading = "Leases", long, value_name = "N")]
    pub scram_iterations: Option<u32>,
    /// Make lease roles superusers (for suites that need it; they can then reach every database).
    #[arg(help_heading = "Leases", long, overrides_with = "no_lease_superuser")]
    pub lease_superuser: bool,
    /// Overrides lease_superuser = true in the config file.
    #[arg(
        help_heading = "Leases",
        long,
        overrides_with = "lease_superuser",
        hide_short_help = true
    )]
    pub no_lease_superuser: bool,
    /// Host put in lease answers instead of postgres' listen address (e.g. a compose service name).
    #[arg(
        help_heading = "Leases",
        long,
        env = "PGLEASE_ADVERTISE_HOST",
        value_name = "HOST"
    )]
    pub advertise_host: Option<String>,
    /// Attach to this existing server (a superuser URL) instead of starting postgres.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        value_name = "URL",
        env = "PGLEASE_POSTGRES_URL",
        hide_env_values = true
    )]
    pub postgres_url: Option<String>,
    /// Directory of the postgres binaries (postgres, initdb); used alone, and it must hold
    /// the --postgres-version if that is given too [default: see --postgres-version].
    #[arg(help_heading = "The PostgreSQL server", long, value_name = "DIR")]
    pub pg_bin_dir: Option<PathBuf>,
    /// PostgreSQL version to run: a major (17) or a major.minor (17.6), 13 to 18.
    ///
    /// Taken from, in this order: --pg-bin-dir; a server of that version installed here
    /// (pg_config --bindir, /usr/lib/postgresql/MAJOR/bin, postgres on PATH); one
    /// downloaded earlier into the cache (--cache-dir, under binaries/); else a download
    /// of the newest such release (about 15 MB) from --postgres-repository into that
    /// cache, which later starts use offline. Without a version: the newest installed
    /// server, else the newest cached, else PostgreSQL 18 is downloaded.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        env = "PGLEASE_POSTGRES_VERSION",
        value_name = "VERSION"
    )]
    pub postgres_version: Option<String>,
    /// Maven repository that server binaries are downloaded from (zonky's
    /// embedded-postgres-binaries), e.g. a mirror [default: Maven Central, repo1.maven.org/maven2].
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        env = "PGLEASE_POSTGRES_REPOSITORY",
        value_name = "URL"
    )]
    pub postgres_repository: Option<String>,
    /// Instance directory for postgres' data [default: a fresh directory under /dev/shm].
    #[arg(help_heading = "The PostgreSQL server", long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Mount a dedicated tmpfs of this size (e.g. 2G) for the data (needs root). As root
    /// on tmpfs, the databases get a tmpfs of their own, 3/4 of it, so that a lease that
    /// fills it gets "No space left on device" and postgres stays up (docs/security.md).
    #[arg(help_heading = "The PostgreSQL server", long, value_name = "SIZE")]
    pub tmpfs_size: Option<String>,
    /// The databases' room: a directory on a file system of its own (a second tmpfs) where
    /// every database's files go, apart from WAL and the shared catalogs in --data-dir, so
    /// that a lease that fills it gets "No space left on device" and postgres stays up
    /// (docs/security.md). What a daemon that cannot mount (not root, a container) needs
    /// for that; as root it is used instead of the tmpfs pglease would mount. Refused on
    /// the data directory's file system.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        value_name = "DIR",
        overrides_with = "no_databases_dir"
    )]
    pub databases_dir: Option<PathBuf>,
    /// Overrides databases_dir in the config file's postgres table: the databases share
    /// the data directory's file system.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        overrides_with = "databases_dir",
        hide_short_help = true
    )]
    pub no_databases_dir: bool,
    /// Allow fsync=off on a data directory that is not tmpfs/ramfs.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        overrides_with = "no_allow_unsafe_on_disk"
    )]
    pub allow_unsafe_on_disk: bool,
    /// Overrides allow_unsafe_on_disk = true in the config file's postgres table.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        overrides_with = "allow_unsafe_on_disk",
        hide_short_help = true
    )]
    pub no_allow_unsafe_on_disk: bool,
    /// OS user that runs postgres when pglease runs as root [default: postgres, else nobody].
    #[arg(help_heading = "The PostgreSQL server", long, value_name = "USER")]
    pub pg_user: Option<String>,
    /// Where initdb results and downloaded server binaries are cached [default: as root
    /// /var/cache/pglease, else $XDG_CACHE_HOME/pglease or ~/.cache/pglease].
    #[arg(help_heading = "The PostgreSQL server", long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Address postgres listens on [default: 127.0.0.1].
    #[arg(help_heading = "The PostgreSQL server", long, value_name = "HOST")]
    pub pg_listen: Option<String>,
    /// Port postgres listens on [default: a free port].
    #[arg(help_heading = "The PostgreSQL server", long, value_name = "PORT")]
    pub pg_port: Option<u16>,
    /// Extra postgres setting KEY=VALUE (applied last). Repeatable. Not the ones pglease
    /// makes itself: port (--pg-port), listen_addresses (--pg-listen),
    /// unix_socket_directories, data_directory, config_file, hba_file, ident_file.
    #[arg(
        help_heading = "The PostgreSQL server",
        long = "pg-setting",
        value_name = "KEY=VALUE"
    )]
    pub pg_settings: Vec<String>,
    /// initdb --locale [default: C].
    #[arg(help_heading = "The PostgreSQL server", long)]
    pub locale: Option<String>,
    /// initdb --encoding [default: UTF8].
    #[arg(help_heading = "The PostgreSQL server", long)]
    pub encoding: Option<String>,
    /// Keep the data directory at exit.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        overrides_with = "no_keep_data"
    )]
    pub keep_data: bool,
    /// Overrides keep_data = true in the config file's postgres table.
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        overrides_with = "keep_data",
        hide_short_help = true
    )]
    pub no_keep_data: bool,
    /// Snapshots for cold CI runners: start from this directory's snapshot of the
    /// server's major (its templates whose sources are unchanged are used without a
    /// build; the others are built), and write one at a clean stop when templates were
    /// built. Keep the directory in the CI cache (docs/snapshots.md).
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        env = "PGLEASE_SNAPSHOT_DIR",
        value_name = "DIR"
    )]
    pub snapshot_dir: Option<PathBuf>,
    /// The key that proves a snapshot was written by this daemon (or a runner sharing the
    /// key): snapshots carry an HMAC-SHA256 under it, and one without a valid MAC is not
    /// used. At least 32 bytes, mode 0600; never inside --snapshot-dir. Give all runners of
    /// one CI cache the same file [default: snapshot.key in the cache root, made at the
    /// first start].
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        env = "PGLEASE_SNAPSHOT_KEY_FILE",
        value_name = "PATH"
    )]
    pub snapshot_key_file: Option<PathBuf>,
    /// Where the clusters live [default: auto]. `tmpfs`: the instance directory, every
    /// clone copies its template. `cow`: a copy-on-write XFS that pglease makes in RAM and
    /// loop-mounts (needs root, mkfs.xfs from xfsprogs, util-linux' mount), or with
    /// --data-dir that directory if its file system clones (XFS with reflink, btrfs); on
    /// PostgreSQL 18 and later a clone then shares its template's blocks instead of copying
    /// them. `auto`: on PostgreSQL 18+, a --data-dir that clones, or the store in RAM when a
    /// template known at start is 128 MB or more (its sources, or its database in the
    /// snapshot) and one can be made; otherwise tmpfs, which clones small templates faster.
    /// `/status` says what was chosen and why (docs/cow-storage.md).
    #[arg(
        help_heading = "The PostgreSQL server",
        long,
        env = "PGLEASE_STORAGE",
        value_name = "STORAGE"
    )]
    pub storage: Option<StorageArg>,
    /// Also serve the IntegreSQL v1 API (its client libraries work unchanged) on this
    /// address, e.g. 127.0.0.1:5000, IntegreSQL's port. The main port serves it too, under
    /// /api/v1. Its clients send no token: a non-loopback address needs
    /// --integresql-allow-remote.
    #[arg(
        help_heading = "IntegreSQL API",
        long,
        env = "PGLEASE_INTEGRESQL_LISTEN",
        value_name = "ADDR"
    )]
    pub integresql_listen: Option<SocketAddr>,
    /// Serve --integresql-listen on a non-loopback address although anyone who reaches it
    /// can lease databases (IntegreSQL clients cannot send a token).
    #[arg(help_heading = "IntegreSQL API", long)]
    pub integresql_allow_remote: bool,
    /// A login role for suites that name one user in the PG* variables of their run, as
    /// IntegreSQL's shared user (e.g. dbuser), and load a dump with `psql` into the template
    /// they are initializing or a test database: it reaches a client-built template from
    /// initialize to finalize and the test databases of client-built templates, with a
    /// lease's connection limit in all, and the initialize answer carries its credentials;
    /// nothing else, and it is no superuser.
    /// Needs --integresql-pg-password; PGHOST and PGPORT are postgres' own (--pg-port fixes
    /// the port). With --postgres-url, naming that URL's own user instead (compose's layout:
    /// IntegreSQL and the app share the server's user) leaves the role as it is and puts its
    /// credentials in every IntegreSQL answer, as IntegreSQL does; the password is then the
    /// URL's. See docs/integresql.md.
    #[arg(
        help_heading = "IntegreSQL API",
        long,
        env = "PGLEASE_INTEGRESQL_PG_USER",
        value_name = "NAME"
    )]
    pub integresql_pg_user: Option<String>,
    /// The password of --integresql-pg-user (the suites' PGPASSWORD).
    #[arg(
        help_heading = "IntegreSQL API",
        long,
        env = "PGLEASE_INTEGRESQL_PG_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub integresql_pg_password: Option<String>,
    /// Seconds an IntegreSQL client may take from initializing a template to finalizing it;
    /// past that the template is discarded as abandoned [default: 900].
    #[arg(help_heading = "IntegreSQL API", long, value_name = "SECS")]
    pub initialize_timeout: Option<u64>,
    /// Where to serve the PostgreSQL protocol, or `off`: a client that connects to database
    /// NAME gets a fresh clone of template NAME, leased as POST /lease would (the label from
    /// application_name) and released when it disconnects, e.g. `psql -h 127.0.0.1 -p 5481
    /// default` or DATABASE_URL=postgresql://127.0.0.1:5481/app. Without a token any user and
    /// password are let in, so a non-loopback address needs --token, which is then the
    /// password (docs/front.md) [default: loopback, the HTTP port + 1 (127.0.0.1:5481);
    /// skipped with a warning if that port is taken].
    #[arg(
        help_heading = "PostgreSQL front",
        long,
        env = "PGLEASE_FRONT_LISTEN",
        value_name = "ADDR|off"
    )]
    pub front_listen: Option<FrontAddress>,
    /// How long the lease of database NAME.KEY outlives the last connection to it: every
    /// connection to the same NAME.KEY shares one lease while any of them is open, so a
    /// test's connection pool sees one database [default: 2000].
    #[arg(help_heading = "PostgreSQL front", long, value_name = "MS")]
    pub front_key_grace_ms: Option<u64>,
    /// The most connections the PostgreSQL front holds at once, in any stage (each relayed
    /// one takes two file descriptors); more are refused with SQLSTATE 53300 [default: 2048].
    #[arg(help_heading = "PostgreSQL front", long, value_name = "N")]
    pub front_max_connections: Option<usize>,
    /// TLS at the PostgreSQL front for clients that ask for it: `off`, or `self-signed`, a
    /// certificate made in memory at each start for localhost, 127.0.0.1, ::1 and the
    /// --front-listen address (it encrypts; a client cannot verify it). Clients that do not
    /// ask are served in plain text either way. With TLS, Go's lib/pq (sslmode=require by
    /// default) needs no sslmode=disable; libpq's default sslmode=prefer then pays a TLS
    /// handshake on every connection, hence off by default (docs/front.md) [default: off].
    #[arg(
        help_heading = "PostgreSQL front",
        long,
        value_name = "off|self-signed",
        conflicts_with = "front_tls_cert"
    )]
    pub front_tls: Option<FrontTlsArg>,
    /// TLS at the PostgreSQL front with this certificate chain (PEM, the server's own
    /// certificate first), read once at start; needs --front-tls-key. A file that cannot be
    /// read or used stops the start.
    #[arg(
        help_heading = "PostgreSQL front",
        long,
        value_name = "FILE",
        requires = "front_tls_key"
    )]
    pub front_tls_cert: Option<PathBuf>,
    /// The private key of --front-tls-cert (PEM: PKCS#8, PKCS#1 or SEC1; RSA, ECDSA or
    /// Ed25519), read once at start with the daemon's rights; keep it readable by the
    /// daemon only.
    #[arg(
        help_heading = "PostgreSQL front",
        long,
        value_name = "FILE",
        requires = "front_tls_cert"
    )]
    pub front_tls_key: Option<PathBuf>,
    /// Refuse clients at the PostgreSQL front that do not ask for TLS (SQLSTATE 28000, before
    /// any password is sent), as a `hostssl`-only pg_hba.conf does: for a front beyond
    /// loopback, where the token must not cross the network in plain text. Needs
    /// --front-tls self-signed or --front-tls-cert [default: off].
    #[arg(help_heading = "PostgreSQL front", long)]
    pub front_require_tls: bool,
}

/// `--front-tls` and `front_tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FrontTlsArg {
    /// No TLS: an SSLRequest is answered `N`.
    Off,
    /// A self-signed certificate made at start.
    SelfSigned,
}

/// `--front-listen` and `front_listen`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontAddress {
    /// No PostgreSQL front.
    Off,
    /// The front on this address.
    At(SocketAddr),
}

impl std::str::FromStr for FrontAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(FrontAddress::Off);
        }
        text.parse()
            .map(FrontAddress::At)
            .map_err(|_| format!("{text:?} is neither an address such as 127.0.0.1:5481 nor off"))
    }
}

impl<'de> Deserialize<'de> for FrontAddress {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
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
