//! The pool's error enums, one per family of operations, each variant carrying the context
//! a user needs (paths, pids, exit status, log tails). They become HTTP only in `pglease-api`.

use std::path::PathBuf;

use crate::names::TemplateName;

/// Why `--databases-dir` cannot be used; the daemon refuses to start (exit 64).
#[derive(Debug, thiserror::Error)]
pub enum DatabasesDirError {
    /// It cannot be looked at (missing, or a parent not searchable).
    #[error("--databases-dir {}: {source}; mount a file system of its own there (a second tmpfs)", path.display())]
    Unreadable {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is a file, not a directory.
    #[error("--databases-dir {}: not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The daemon cannot make its room in it.
    #[error("--databases-dir {}: not writable by pglease ({source})", path.display())]
    NotWritable {
        /// The directory.
        path: PathBuf,
        /// What `access(2)` said.
        source: nix::Error,
    },
    /// On the instance directory's file system it gives the databases no room of their own.
    #[error(
        "--databases-dir {} is on the same file system as the instance directory {}: it would \
         give the databases no room of their own; mount a second tmpfs there (or run with \
         --no-databases-dir, and a lease that fills the room makes postgres restart)",
        path.display(),
        instance.display()
    )]
    SameFileSystem {
        /// The directory.
        path: PathBuf,
        /// The instance directory (or the nearest existing directory above it).
        instance: PathBuf,
    },
    /// A kept cluster's databases would be left in the room, which the next run cannot
    /// tell from a stale one.
    #[error("--databases-dir and --keep-data: a kept cluster needs its databases in the data directory; give one of them")]
    WithKeepData,
}

/// Starting (or restarting) postgres failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No usable server binaries: not in the configured directory, not installed, not
    /// cached, and not downloadable (the error names every place tried).
    #[error(transparent)]
    Binaries(#[from] pglease_binaries::BinariesError),
    /// The instance directory belongs to a running pglease.
    #[error(
        "{} is in use by another running pglease (pid {pid}); choose another --data-dir",
        path.display()
    )]
    InstanceDirInUse {
        /// The instance directory.
        path: PathBuf,
        /// The pid its marker names.
        pid: u32,
    },
    /// The configured instance directory holds files pglease did not create.
    #[error(
        "{} exists, is not empty and has no pglease marker: refusing to use it, since \
         pglease deletes its instance directory at exit; choose an empty or new directory",
        path.display()
    )]
    InstanceDirNotOurs {
        /// The directory.
        path: PathBuf,
    },
    /// The unix socket path would exceed the kernel's limit.
    #[error(
        "the unix socket path {} is {len} bytes, over the limit of {max}; choose a shorter --data-dir",
        path.display()
    )]
    SocketPathTooLong {
        /// The socket's path (with the longest possible port).
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The longest path the kernel accepts.
        max: usize,
    },
    /// The data directory is on persistent storage and fsync would be off.
    #[error(
        "{path} is on {fs_type}, not tmpfs/ramfs: running postgres with fsync=off there can \
         corrupt data on a crash; use a directory on tmpfs (the default is under /dev/shm), \
         --tmpfs-size, or pass --allow-unsafe-on-disk"
    )]
    NotTmpfs {
        /// The directory checked.
        path: PathBuf,
        /// The filesystem it is on.
        fs_type: String,
    },
    /// The snapshot key (`--snapshot-key-file`, or the one made in the cache root) cannot
    /// be read or made.
    #[error(transparent)]
    SnapshotKey(#[from] KeyError),
    /// The role catalog of a cluster adopted from a snapshot is refused (the start then
    /// builds a fresh cluster).
    #[error("the snapshot's cluster is refused: {reason}")]
    SnapshotCatalog {
        /// What its catalog holds that pglease does not make.
        reason: String,
    },
    /// The OS user to run postgres as does not exist.
    #[error("OS user {user:?} not found: postgres refuses to run as root, so pglease runs it as --pg-user (default `postgres`, else `nobody`)")]
    UserNotFound {
        /// The user name.
        user: String,
    },
    /// The OS user for children (`--child-user`) cannot be used.
    #[error("--child-user {user:?}: {reason}; as root pglease runs every program it starts (migration commands, psql, pg_restore) as this unprivileged user (default `nobody`)")]
    ChildUser {
        /// The user name.
        user: String,
        /// Why not.
        reason: String,
    },
    /// The copy-on-write store (`--storage cow`) could not be made.
    #[error("--storage cow: cannot make the copy-on-write store ({step}): {message}")]
    CowStore {
        /// What was being done.
        step: &'static str,
        /// Why it failed.
        message: String,
    },
    /// `--databases-dir` cannot be used (`postgres/room.rs`).
    #[error(transparent)]
    DatabasesDir(#[from] DatabasesDirError),
    /// A dedicated tmpfs was requested without the privilege to mount it.
    #[error("--tmpfs-size needs root (or CAP_SYS_ADMIN) to mount a tmpfs on {path}")]
    MountNeedsRoot {
        /// The mount point.
        path: PathBuf,
    },
    /// A file system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "cannot create".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A system call (mount, chown, kill, ...) failed.
    #[error("{action} {path}: {source}")]
    Sys {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The errno.
        source: nix::Error,
    },
    /// initdb failed.
    #[error("initdb failed ({status}); its output:\n{output}")]
    Initdb {
        /// Exit status.
        status: String,
        /// stdout and stderr.
        output: String,
    },
    /// postgres exited before accepting connections.
    #[error("postgres exited during start-up ({status}); last lines of {}:\n{tail}", log_path.display())]
    EarlyExit {
        /// Exit status.
        status: String,
        /// The server log.
        log_path: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// postgres did not accept connections in time.
    #[error("postgres (pid {pid}) did not accept connections within {timeout_secs} s; last lines of {}:\n{tail}", log_path.display())]
    NotReady {
        /// The postmaster pid.
        pid: u32,
        /// How long we waited.
        timeout_secs: u64,
        /// The server log.
        log_path: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// The external server's URL does not parse.
    #[error("invalid --postgres-url: {0}")]
    BadUrl(String),
    /// The role pglease connects as is not a superuser (an external server's URL names it).
    #[error("the role pglease connects as on {target} is not a superuser; pglease creates databases and roles, so --postgres-url must name a superuser")]
    NotSuperuser {
        /// Host/port or socket.
        target: String,
    },
    /// No admin connection could be had, for a reason other than postgres' answer (a
    /// timeout, the connection pool's own error).
    #[error("cannot connect to postgres at {target}: {reason}")]
    Unreachable {
        /// Host/port or socket.
        target: String,
        /// Why.
        reason: String,
    },
    /// Connecting to postgres failed.
    #[error("cannot connect to postgres at {target}: {}", crate::sql_error::pg_message(.source))]
    Connect {
        /// Host/port or socket.
        target: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// Another pglease holds the server lock: two daemons on one server would each sweep
    /// the other's databases as leftovers.
    #[error(
        "another pglease already manages the postgres server at {target}: {holder} holds its \
         lock; two daemons on one server would drop each other's databases, so stop that one \
         or give this one a server of its own"
    )]
    ServerInUse {
        /// Host/port or socket.
        target: String,
        /// Who holds the lock: its application_name, backend pid and client address.
        holder: String,
    },
    /// `--integresql-pg-user` names a role that exists on the server and is not pglease's.
    #[error(
        "--integresql-pg-user {name}: a role of that name exists on the server and pglease did not make it; \
         pglease makes the IntegreSQL clients' role itself and takes over none of the server's: choose another name"
    )]
    IntegresqlRoleNotOurs {
        /// The role's name.
        name: String,
    },
    /// SQL run while setting up the server failed.
    #[error("{context}: {}", crate::sql_error::pg_message(.source))]
    Sql {
        /// What the SQL was for.
        context: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// A configured template names a major other than the external server's.
    #[error(
        "template \"{template}\" asks for PostgreSQL {asked}, and the external server runs \
         {serving}: pglease starts servers of other majors only for its own embedded server; \
         remove the template's postgres_version or attach to a {asked} server"
    )]
    OtherMajorOnExternal {
        /// The template.
        template: String,
        /// The version it names.
        asked: String,
        /// The external server's `server_version`.
        serving: String,
    },
    /// The primary pool stopped before it told its server's version.
    #[error("the pool stopped during start-up")]
    StoppedDuringStart,
    /// A configured template could not be added to the server of its major.
    #[error("cannot add template \"{template}\": {message}")]
    Template {
        /// The template.
        template: String,
        /// Why.
        message: String,
    },
}

/// How many templates an "unknown template" message names: enough for every setup seen
/// so far, few enough for one line of a test's output.
pub const LISTED_TEMPLATES: usize = 20;

/// The rest of an "unknown template" message: the templates there are, and the three ways to
/// define one (a newcomer's `pglease run --template app` meets this first).
fn describe_unknown(template: &TemplateName, known: &[TemplateName]) -> String {
    let mut text = String::new();
    if let Some(near) = closest_name(template, known) {
        text.push_str(&format!("; did you mean \"{near}\"?"));
    }
    if !known.is_empty() {
        let names: Vec<&str> = known
            .iter()
            .take(LISTED_TEMPLATES)
            .map(TemplateName::as_str)
            .collect();
        text.push_str(&format!("; templates here: {}", names.join(", ")));
        if known.len() > LISTED_TEMPLATES {
            text.push_str(&format!(" and {} more", known.len() - LISTED_TEMPLATES));
        }
    }
    text.push_str(&format!(
        ". Define it when starting pglease with --template {template}=migrations:DIR \
         (or sql:FILE, dump:FILE, command:CMD), in the config file's [templates.{template}] \
         table, or at run time with PUT /templates/{template}"
    ));
    text
}

/// The known name a misspelt `template` most likely meant: the nearest by edit distance
/// (a swapped pair of letters counts once), when it is at most a third of the name's length
/// (at least 1) away, so that `app` suggests `apps` but not `users`.
fn closest_name<'a>(
    template: &TemplateName,
    known: &'a [TemplateName],
) -> Option<&'a TemplateName> {
    let asked = template.as_str();
    let within = (asked.chars().count() / 3).max(1);
    known
        .iter()
        .map(|name| (strsim::damerau_levenshtein(asked, name.as_str()), name))
        .filter(|(distance, _)| *distance <= within)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

impl LeaseError {
    /// An unknown template, without the list of those there are (for answers that do not
    /// come from the pool's state).
    pub fn unknown_template(template: TemplateName) -> Self {
        LeaseError::UnknownTemplate {
            template,
            known: Vec::new(),
        }
    }
}

/// A lease could not be handed out.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// No template has this name. The message lists the templates there are (`known`, the
    /// first [`LISTED_TEMPLATES`] of them) and says how to define one.
    #[error("unknown template \"{template}\"{}", describe_unknown(.template, .known))]
    UnknownTemplate {
        /// The name asked for.
        template: TemplateName,
        /// The templates pglease builds that exist (client-built ones, named by a hash, are
        /// left out), by name; empty when whoever answered did not list them.
        known: Vec<TemplateName>,
    },
    /// A request named a major the operator did not make available, and this daemon starts
    /// no others on request (without a token, see `PoolConfig::majors_on_request`).
    #[error("PostgreSQL {asked} is not offered here: this daemon runs {offered}; a request can start a server of another major only where a token guards the API (--token), or name the major in a template of the configuration")]
    VersionNotOffered {
        /// The version asked for.
        asked: String,
        /// The majors there are (the primary's and the configured ones).
        offered: String,
    },
    /// A source sent over HTTP cannot be used as it is (a file that is not a regular file,
    /// too big, unreadable by the child user, or a script where none may run); nothing was
    /// registered.
    #[error("template \"{template}\": {message}")]
    InvalidSource {
        /// The template.
        template: TemplateName,
        /// Why, naming the path (never the file's contents).
        message: String,
    },
    /// The template's build failed; the message names the file and postgres' message, and
    /// the line where postgres reports a position.
    #[error("template \"{template}\" failed to build: {message}")]
    BuildFailed {
        /// The template.
        template: TemplateName,
        /// What went wrong.
        message: String,
        /// What kind of failure: the template's own SQL (or command), or a full disk (507).
        cause: crate::sql_error::SqlErrorKind,
    },
    /// No clone became ready within the request's wait.
    #[error(
        "no database of template \"{template}\" became ready within {waited_ms} ms: {blocked_by}"
    )]
    TimedOut {
        /// The template.
        template: TemplateName,
        /// How long the request waited.
        waited_ms: u64,
        /// What kept it waiting.
        blocked_by: Blocked,
    },
    /// The pool is stopping.
    #[error("pglease is shutting down")]
    ShuttingDown,
    /// Postgres is down or restarting.
    #[error("postgres is unavailable: {0}")]
    PostgresDown(String),
    /// The server of another major could not start (`crate::Servers`); it is not tried
    /// again for a few seconds, and its requests get this answer meanwhile.
    #[error("postgres is unavailable: the PostgreSQL {major} server cannot start: {source}")]
    ServerStart {
        /// The major of the server.
        major: u32,
        /// Why its start failed; shared by every request that asked for it.
        source: std::sync::Arc<StartError>,
    },
    /// The lease asks for more connections than the server can ever give lease holders.
    #[error("a lease of {requested} connections can never fit: the server has room for {budget} lease connections in all")]
    TooManyConnections {
        /// The request's connection limit.
        requested: u32,
        /// The whole budget.
        budget: u32,
    },
    /// A clone of the template cannot fit in the byte budget, even after evicting what
    /// nobody waits for.
    #[error("no room for a database of template \"{template}\": it needs {needed} bytes, {in_use} of the {budget}-byte budget are in use (leased databases free theirs when released)")]
    OutOfSpace {
        /// The template.
        template: TemplateName,
        /// Bytes one clone needs.
        needed: u64,
        /// Bytes in use.
        in_use: u64,
        /// The budget.
        budget: u64,
    },
    /// Too many requests are already waiting for a lease.
    #[error("{waiting} lease requests are already waiting (the most this pglease queues); try again shortly")]
    TooManyWaiting {
        /// Requests waiting.
        waiting: usize,
    },
    /// Something inside the pool failed (the actor did not answer).
    #[error("internal error: {0}")]
    Internal(String),
    /// A clone failed to be made (disk full, postgres error).
    #[error("could not create a database from template \"{template}\": {message}")]
    CloneFailed {
        /// The template.
        template: TemplateName,
        /// Postgres' message.
        message: String,
        /// What kind of failure: a full disk is the server's room running out (507).
        cause: crate::sql_error::SqlErrorKind,
    },
    /// The template was discarded by a client (IntegreSQL API); initialize it again.
    #[error("template \"{0}\" was discarded")]
    Discarded(TemplateName),
    /// The template lives on the server of another PostgreSQL version; templates do not move.
    #[error("template \"{template}\" lives on the PostgreSQL {serving} server; register it under another name for another version")]
    OnOtherServer {
        /// The template.
        template: TemplateName,
        /// That server's version.
        serving: String,
    },
    /// The template is built by a client: pglease has no sources to rebuild or replace.
    #[error("template \"{0}\" is built by a client through the IntegreSQL API; pglease cannot rebuild or replace it (discard it and initialize it again)")]
    ClientBuilt(TemplateName),
    /// The template is the operator's (`--template` or the configuration file defined it),
    /// and the caller showed no token: only the configuration and a holder of the API's
    /// token may give it a new source or build a new version of it.
    #[error("template \"{0}\" is defined by the operator in the daemon's configuration (--template or the configuration file); without a token the API cannot tell its callers apart, so nobody may change it over HTTP: a holder of the API's token (--token or --token-file) may")]
    ConfiguredTemplate(TemplateName),
    /// The request names a PostgreSQL version the template's server is not.
    #[error(
        "template \"{template}\" lives on a PostgreSQL {serving} server, and the request asks \
         for {asked}; ask for the `default` template of {asked}, register the template with \
         \"postgres_version\": \"{asked}\", or give it `postgres_version` in the configuration \
         (an external server serves only its own version)"
    )]
    VersionNotServed {
        /// The template asked for.
        template: TemplateName,
        /// The version asked for.
        asked: String,
        /// The server's `server_version`.
        serving: String,
    },
}

/// What kept a lease request from a database: the limit that blocks, named in the
/// timeout's message, the log and `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// The template has `max_total` clones (ready, leased or being made).
    MaxTotal {
        /// Its leases.
        leased: usize,
        /// The cap.
        max_total: usize,
    },
    /// The connections of open leases fill the server's budget for lease holders.
    ConnectionBudget {
        /// The request's connection limit.
        requested: u32,
        /// Connections open leases hold.
        in_use: u32,
        /// The budget.
        budget: u32,
        /// Open leases.
        leases: usize,
    },
    /// Its template was being built, or its databases made.
    Making,
}

impl Blocked {
    /// A short name for `/status` and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Blocked::MaxTotal { .. } => "max_total",
            Blocked::ConnectionBudget { .. } => "connection_budget",
            Blocked::Making => "making",
        }
    }
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::MaxTotal { leased, max_total } => write!(
                f,
                "the template is at max_total ({leased} of its {max_total} databases are leased; \
                 release leases or raise --max-total)"
            ),
            Blocked::ConnectionBudget {
                requested,
                in_use,
                budget,
                leases,
            } => write!(
                f,
                "the connection budget is used up ({leases} open leases hold {in_use} of the \
                 {budget} connections postgres has for lease holders, and this request needs \
                 {requested}; release leases, ask for fewer connections per lease, or give \
                 postgres a larger max_connections)"
            ),
            Blocked::Making => write!(f, "its databases were still being made"),
        }
    }
}

/// A lease could not be released or renewed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseOpError {
    /// No open lease has this id (never existed, released, or expired).
    #[error("no open lease with id {0}")]
    NotFound(String),
    /// The lease's database was lost when postgres died and was restarted.
    #[error("lease {0} was lost: postgres stopped unexpectedly and was restarted, so its database is gone")]
    Lost(String),
    /// The lease was ended because its database grew past `--lease-max-bytes`.
    #[error("lease {id} was ended: its database {database} grew to {bytes} bytes, past the limit of {limit} bytes one lease's database may take (--lease-max-bytes); it was dropped")]
    ExceededMaxBytes {
        /// The lease id.
        id: String,
        /// Its database.
        database: String,
        /// The size measured.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// No database is kept under this id (never kept, dropped, or its keep ran out).
    #[error("no kept database with id {0}")]
    NotKept(String),
    /// The pool is stopping.
    #[error("pglease is shutting down")]
    ShuttingDown,
}

/// Errors of the operations on templates that clients build and on their test databases
/// (the IntegreSQL-compatible API).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TemplateOpError {
    /// No template of this name (hash).
    #[error("unknown template \"{0}\"")]
    UnknownTemplate(TemplateName),
    /// Initialized already: built, or being built by another client.
    #[error("template \"{0}\" is already initialized (built, or being built by another client)")]
    AlreadyInitialized(TemplateName),
    /// A template of pglease's configuration: clients cannot discard or finalize it.
    #[error("template \"{0}\" is configured in pglease, not built by a client")]
    NotClientBuilt(TemplateName),
    /// Discarded while the operation ran.
    #[error("template \"{0}\" was discarded")]
    Discarded(TemplateName),
    /// No open lease with this number.
    #[error("template \"{template}\" has no test database {number} in use")]
    UnknownTest {
        /// The template.
        template: TemplateName,
        /// The number asked for.
        number: u32,
    },
    /// Sessions are still connected to the test database.
    #[error("test database {number} of template \"{template}\" is in use: {sessions} session(s) still connected; close them first")]
    InUse {
        /// The template.
        template: TemplateName,
        /// The test database's number.
        number: u32,
        /// Sessions connected.
        sessions: i64,
    },
    /// Preparing or finalizing the template database failed.
    #[error("template \"{template}\": {message}")]
    Failed {
        /// The template.
        template: TemplateName,
        /// Postgres' words.
        message: String,
    },
    /// The daemon is stopping.
    #[error("pglease is shutting down")]
    ShuttingDown,
    /// Postgres is down or being restarted.
    #[error("postgres is unavailable: {0}")]
    PostgresDown(String),
    /// Postgres refused pglease a connection for the template's work (SQLSTATE 53300): its
    /// slots are taken, by lease holders or others; a release frees one.
    #[error(
        "template \"{template}\": postgres has no connection slot for pglease's work: {message}"
    )]
    NoConnectionSlot {
        /// The template.
        template: TemplateName,
        /// Postgres' words.
        message: String,
    },
    /// The template's role would hold connections the budget does not have.
    #[error("no connections left for a client to build a template: leases and open templates hold {in_use} of the {budget} the budget has, and its role may hold {needed} (--lease-connections); release leases or finalize another template first")]
    TooManyConnections {
        /// What its role may hold.
        needed: u32,
        /// What leases and open client templates hold.
        in_use: u32,
        /// The connection budget.
        budget: u32,
    },
}

impl TemplateOpError {
    /// What a client hears when SQL for its template (making, finalizing, counting a test
    /// database's sessions) failed: the server lost (503, try again), or no connection slot
    /// for the work (503, a release frees one), is not the template's failure.
    pub(crate) fn of_sql(template: &TemplateName, error: &crate::sql_error::SqlError) -> Self {
        use crate::sql_error::SqlErrorKind;
        match error.kind {
            SqlErrorKind::ConnectionLost => TemplateOpError::PostgresDown(error.message.clone()),
            SqlErrorKind::TooManyConnections => TemplateOpError::NoConnectionSlot {
                template: template.clone(),
                message: error.message.clone(),
            },
            SqlErrorKind::DiskFull | SqlErrorKind::Timeout | SqlErrorKind::Other => {
                TemplateOpError::Failed {
                    template: template.clone(),
                    message: error.message.clone(),
                }
            }
        }
    }
}

/// Why the snapshot key (`postgres/snapshot/key.rs`) cannot be used: each names the file,
/// none shows its content. Here, with the other errors, so that `StartError` names it
/// without this module depending on `postgres`.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading, creating or statting failed.
    #[error("snapshot key {}: cannot {action}: {source}", path.display())]
    Io {
        /// The key file (or its directory).
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The file is a symbolic link.
    #[error("snapshot key {}: it is a symbolic link; give the file itself", path.display())]
    Link {
        /// The key file.
        path: PathBuf,
    },
    /// The file is not a regular file.
    #[error("snapshot key {}: it is not a regular file", path.display())]
    NotRegular {
        /// The key file.
        path: PathBuf,
    },
    /// Other users could read or write it.
    #[error(
        "snapshot key {}: its mode is {mode:o}; a key others can read or write lets them \
         forge a snapshot: chmod 600 it",
        path.display()
    )]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Another user owns it.
    #[error(
        "snapshot key {}: it is owned by uid {owner}, not by this daemon's user (uid {me}) \
         or root",
        path.display()
    )]
    NotOurs {
        /// The key file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The daemon's user.
        me: u32,
    },
    /// Too short or too long to be a key.
    #[error(
        "snapshot key {}: it holds {length} bytes; a key is {min} to {max} \
         bytes (e.g. head -c 32 /dev/urandom)",
        path.display()
    )]
    BadLength {
        /// The key file.
        path: PathBuf,
        /// Its size.
        length: u64,
        /// The fewest bytes a key may have.
        min: usize,
        /// The most bytes a key file may have.
        max: u64,
    },
}

#[cfg(test)]
mod tests;
