//! A session with one running server: what opening one needs ([`SessionParams`]), the
//! [`Session`] itself (the admin connection pool, the lease role's settings, the server's
//! version and settings read back for `/status`) and the one-statement `execute`
//! (postgres' own words for an error, `pg_message`, are `sql_error.rs`'s). Its work is
//! split by concern, each an `impl Session` of its own: `open` connects and takes the
//! server, `sweep` clears what an earlier run left, `clone` makes a clone and its lease
//! role, `drop` drops a database and its role,
//! `facts` reads sizes and sessions. Beside them: `recycle` readies a clone for its next
//! holder, `proof` proves a released one unchanged (`stamp_error` says why a clone could
//! not be stamped), `reset` says
//! when truncating what a holder wrote is proven to give the template back, `settings` re-applies a template's
//! database-level settings, `lock` keeps a second pglease off the server, `bounded` puts a
//! time bound on each admin operation, `integresql` makes the IntegreSQL clients' role,
//! `snapshot` readies the cluster for a snapshot, `watch` hears which stamped clones' files
//! were written.
//!
//! A new `Session` is opened every time postgres (re)starts or is reconnected; it does not
//! decide what to clone or drop, it only carries it out.

use crate::child_user::ChildUser;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use crate::config::{CloneStrategy, IntegresqlRole, LeaseAuth};
use crate::names::{DbName, TemplateName};
use crate::sql_error::SqlError;

mod bounded;
mod clone;
mod drop;
mod facts;
mod integresql;
pub(crate) use bounded::{add_options, PINNED_SEARCH_PATH};
mod lock;
mod open;
mod proof;
mod recycle;
// The proof of a reset (issue 44): designed and measured, not wired into a release yet.
#[cfg_attr(not(test), allow(dead_code, unused_imports))]
mod reset;
mod settings;
mod snapshot;
mod stamp_error;
mod sweep;
mod watch;

pub use proof::Stamp;
pub use recycle::NotReused;
pub use stamp_error::StampError;
pub(crate) use sweep::{client_template_marker, mark_ready, Sweep};

pub use bounded::DEFAULT_ADMIN_TIMEOUT;

/// The NOLOGIN role that owns what migrations create. Every lease role is a member, so a
/// test may alter, truncate and drop the template's objects in its own clone; it owns no
/// database, so membership gives nothing outside that clone.
pub const OWNER_ROLE: &str = "pglease_owner";

/// How long an operation waits for a free admin connection before it fails.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// What opening a session needs to know.
#[derive(Debug, Clone)]
pub struct SessionParams {
    /// Superuser connection settings.
    pub admin_config: tokio_postgres::Config,
    /// Host lease holders connect to.
    pub lease_host: String,
    /// Port lease holders connect to.
    pub lease_port: u16,
    /// The server's private socket directory, for the daemon's own logins as a lease's
    /// role; None for an external server.
    pub local_socket: Option<std::path::PathBuf>,
    /// Connections the workers may hold at once.
    pub pool_size: usize,
    /// `CREATE DATABASE … STRATEGY`.
    pub clone_strategy: CloneStrategy,
    /// True for an external server (warn when it runs with fsync on).
    pub external: bool,
    /// How lease roles authenticate.
    pub lease_auth: LeaseAuth,
    /// Lease roles are superusers.
    pub lease_superuser: bool,
    /// A lease's connection limit unless its request names one.
    pub lease_connections: u32,
    /// How long SQL migrations may take to build a template.
    pub build_timeout: Duration,
    /// How long one admin operation of the workers (clone, recycle, drop, connection
    /// limit, counting sessions) may take; [`DEFAULT_ADMIN_TIMEOUT`] unless a test needs
    /// a short one.
    pub admin_timeout: Duration,
    /// The data directory of a server pglease runs, when released clones are to be proven
    /// unchanged (`--reuse-unchanged`); None otherwise.
    pub proof_dir: Option<PathBuf>,
    /// Who runs the builds' programs and reads their sources.
    pub child_user: ChildUser,
    /// The IntegreSQL clients' role, made (or brought up to date) at the start.
    pub integresql_role: Option<IntegresqlRole>,
}

/// An open session with the server. Cheap to clone: the pool is shared.
#[derive(Clone)]
pub struct Session {
    pool: Pool,
    /// Superuser connection settings (to reach template databases during builds).
    pub admin_config: tokio_postgres::Config,
    /// `server_version_num / 10000`.
    pub pg_major: u32,
    /// `server_version`.
    pub version: String,
    /// Host lease holders connect to.
    pub lease_host: String,
    /// Port lease holders connect to.
    pub lease_port: u16,
    /// The server's private socket directory, if pglease runs the server.
    pub local_socket: Option<std::path::PathBuf>,
    /// Settings read back with the server's values.
    pub settings: Vec<(String, String)>,
    /// True for a server pglease did not start.
    pub external: bool,
    /// How long SQL migrations may take to build a template.
    pub build_timeout: Duration,
    /// Ready clones of an earlier run to adopt: (template, fingerprint, clone).
    pub adoptable: Vec<(TemplateName, String, DbName)>,
    /// Complete client-built templates an earlier run left: (template, its database, its
    /// size in bytes).
    pub client_templates: Vec<(TemplateName, DbName, i64)>,
    /// Databases named like IntegreSQL's that are someone else's (a real IntegreSQL's, on an
    /// external server), found by the start's sweep: those names are not free for ours.
    pub others_integresql_names: Vec<DbName>,
    /// Connections lease holders can have in all: `max_connections` less what is reserved
    /// for superusers, the daemon's own connections and a small margin.
    pub connection_budget: u32,
    clone_strategy: CloneStrategy,
    lease_auth: LeaseAuth,
    lease_superuser: bool,
    lease_connections: u32,
    /// The IntegreSQL clients' role: a member of each template being initialized and of
    /// each clone of a client-built template; the initialize answer carries its
    /// credentials.
    integresql_role: Option<IntegresqlRole>,
    /// The bound on each admin operation.
    admin_timeout: Duration,
    /// Admin operations that timed out (shown in `/status`).
    admin_timeouts: Arc<AtomicU64>,
    /// The connection holding the server lock, shared by every clone of this session.
    _lock: Arc<lock::ServerLock>,
    /// How each template version's database-level settings are re-applied (a cache of
    /// server facts shared by the workers, not pool state).
    template_settings: Arc<std::sync::Mutex<HashMap<DbName, settings::Clauses>>>,
    /// Builds that report progress (a dump's restore), while they run.
    pub(crate) build_progress: crate::progress::Board,
    /// The data directory, when released clones are proven unchanged (`session/proof.rs`).
    proof_dir: Option<PathBuf>,
    /// What the kernel says was written in stamped clones' directories, when proofs are on
    /// and it has an inotify instance to give (`session/watch.rs`).
    watches: Option<Arc<watch::Watches>>,
    /// Who runs the builds' programs (`psql`, `pg_restore`, migration commands) and reads
    /// template sources.
    pub(crate) child_user: ChildUser,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The lease password stays out of debug output and logs.
        f.debug_struct("Session")
            .field("version", &self.version)
            .field("lease_host", &self.lease_host)
            .field("lease_port", &self.lease_port)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Runs one statement outside a transaction (CREATE/DROP DATABASE need that).
    pub async fn execute(&self, sql: &str) -> Result<(), SqlError> {
        self.bounded(
            || format!("`{sql}`"),
            async |client| {
                client
                    .batch_execute(sql)
                    .await
                    .map_err(|e| SqlError::from_pg(&e))
            },
        )
        .await
    }

    /// A lease's connection limit unless its request names one (`--lease-connections`).
    pub(crate) fn lease_connections(&self) -> u32 {
        self.lease_connections
    }

    /// The IntegreSQL clients' role's name, when the daemon made one: the role that is
    /// granted each client-built database's role. The server's own login
    /// ([`IntegresqlRole::server_login`]) reaches them all already and is left alone.
    pub(crate) fn integresql_role(&self) -> Option<&str> {
        self.integresql_role
            .as_ref()
            .filter(|role| !role.server_login)
            .map(|role| role.name.as_str())
    }

    /// The IntegreSQL clients' role's name and password, when the daemon has one: what an
    /// initialize answers with (see `template/client.rs`).
    pub fn integresql_credentials(&self) -> Option<&IntegresqlRole> {
        self.integresql_role.as_ref()
    }
}

/// Host(s) and port of a config, for messages (never the password).
pub fn describe_target(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

#[cfg(test)]
mod tests;
