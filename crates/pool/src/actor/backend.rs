//! The actor's one door to a running server: [`Backend`] is every piece of I/O its workers
//! do there (builds, clones, recycles, drops, limits, client-built templates, a second
//! look at the server) and the facts it reports about it. The real one is a
//! [`Session`]; the in-process tests put a fake server behind it (`actor/fake.rs`), so
//! that generated event sequences drive the actor itself.
//!
//! The [`Monitor`] connection that tells when the server goes away is opened here too
//! (`connect_monitor`), since a second look at the server (`probe`) opens one; `start.rs`
//! opens the first with it. This file uses neither `start.rs` nor `server.rs`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_postgres::NoTls;

use crate::config::{IntegresqlRole, TemplateSource};
use crate::names::{DbName, TemplateName};
use crate::postgres::snapshot::SnapshotTemplate;
use crate::session::{mark_ready, NotReused, Session, Stamp, StampError};
use crate::sql_error::SqlError;
use crate::state::Built;
use crate::template;
use crate::types::BuildProgress;

/// A worker's piece of work on the server, boxed so that [`Backend`] is a trait object.
pub(crate) type Work<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The server as the actor's workers use it. Cheap to clone behind an `Arc`.
pub(crate) trait Backend: Send + Sync + 'static {
    /// `server_version`.
    fn version(&self) -> &str;
    /// `server_version_num / 10000`.
    fn pg_major(&self) -> u32;
    /// Where lease holders connect.
    fn lease_host(&self) -> &str;
    fn lease_port(&self) -> u16;
    /// The private socket directory the daemon's own logins as a lease's role use.
    fn local_socket(&self) -> Option<&std::path::Path>;
    /// Whether lease holders may use TLS.
    fn ssl(&self) -> bool;
    /// The IntegreSQL clients' role (`--integresql-pg-user`), when there is one: an
    /// initialize answers with its name and password instead of the template role's.
    fn shared_login(&self) -> Option<&IntegresqlRole> {
        None
    }
    /// Settings read back with the server's values.
    fn settings(&self) -> &[(String, String)];
    /// Connections lease holders can have in all.
    fn connection_budget(&self) -> u32;
    /// Admin operations that timed out.
    fn admin_timeouts(&self) -> u64;
    /// A running build's progress, when it reports one.
    fn build_progress(&self, template: &TemplateName) -> Option<BuildProgress>;
    /// Whether released clones are proven unchanged by their files.
    fn proves_unchanged(&self) -> bool;

    fn build<'a>(
        &'a self,
        template: &'a TemplateName,
        source: &'a TemplateSource,
        reuse_existing: bool,
    ) -> Work<'a, Result<Built, SqlError>>;
    /// Makes `clone` from `template_db`; `Ok` is its role's password.
    fn clone_database<'a>(
        &'a self,
        template_db: &'a DbName,
        clone: &'a DbName,
        standard_scram: bool,
    ) -> Work<'a, Result<String, SqlError>>;
    fn stamp<'a>(&'a self, clone: &'a DbName) -> Work<'a, Result<Stamp, StampError>>;
    /// Stamps `clone` again after a recycle, from `previous` (what it was when last made
    /// ready) where nothing shows its files changed since; a fresh stamp otherwise.
    fn restamp<'a>(
        &'a self,
        clone: &'a DbName,
        previous: Stamp,
    ) -> Work<'a, Result<Stamp, StampError>> {
        let _ = previous;
        self.stamp(clone)
    }
    /// Readies a released clone for its next holder; `Ok` is its role's new password.
    fn recycle<'a>(
        &'a self,
        clone: &'a DbName,
        standard_scram: bool,
        proof: Option<&'a Stamp>,
    ) -> Work<'a, Result<String, NotReused>>;
    fn drop_database<'a>(&'a self, db: &'a DbName) -> Work<'a, Result<(), SqlError>>;
    fn set_connection_limit<'a>(
        &'a self,
        db: &'a DbName,
        limit: u32,
    ) -> Work<'a, Result<(), SqlError>>;
    /// A client-built template's empty database; `Ok` is its role's password.
    fn open_client_template<'a>(
        &'a self,
        template: &'a TemplateName,
        db: &'a DbName,
    ) -> Work<'a, Result<String, SqlError>>;
    fn finalize_client_template<'a>(
        &'a self,
        template: &'a TemplateName,
        db: &'a DbName,
        since: std::time::Instant,
    ) -> Work<'a, Result<Built, SqlError>>;
    /// Sessions on `db` still open after `grace`.
    fn sessions_after<'a>(
        &'a self,
        db: &'a DbName,
        grace: Duration,
    ) -> Work<'a, Result<i64, SqlError>>;
    /// The sizes in bytes of those of `dbs` that exist.
    fn sizes_of<'a>(&'a self, dbs: &'a [DbName]) -> Work<'a, Result<Vec<(String, i64)>, SqlError>>;
    /// Every database's size in bytes.
    fn database_sizes(&self) -> Work<'_, Result<Vec<(String, i64)>, SqlError>>;
    /// Those of `dbs` that have a session.
    fn with_sessions<'a>(&'a self, dbs: &'a [DbName]) -> Work<'a, Result<Vec<String>, SqlError>>;
    /// A second look at the server: `Ok` is a new watch on it; `Err` is why none could be
    /// opened, as postgres or the driver said it (its SQLSTATE and kind kept).
    fn probe(&self) -> Work<'_, Result<Box<dyn Monitor>, SqlError>>;
    /// Whether the server refuses a new connection as it shuts down (SQLSTATE 57P03, as a
    /// server in smart shutdown does while it keeps the sessions it has): `Some` is
    /// postgres' words. Anything else (a connection, no slot free, no answer) is `None`: a
    /// server that went away is the monitor's to notice.
    fn refuses_new_connections(&self) -> Work<'_, Option<String>>;
    /// Marks a ready clone for the next run to adopt.
    fn mark_ready<'a>(
        &'a self,
        template: &'a TemplateName,
        fingerprint: &'a str,
        clone: &'a DbName,
    ) -> Work<'a, Result<(), SqlError>>;
    /// The complete templates of the `current` versions: what a snapshot would hold.
    fn snapshot_templates<'a>(
        &'a self,
        current: &'a [(TemplateName, String)],
    ) -> Work<'a, Result<Vec<SnapshotTemplate>, SqlError>>;
    /// Drops everything but the `current` versions' templates, for a snapshot.
    fn clear_for_snapshot(
        &self,
        current: Vec<(TemplateName, String)>,
    ) -> Work<'_, Result<(), SqlError>>;
}

/// How long a second look at a server whose monitor connection closed may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection kept open only to notice when the server goes away.
pub(crate) trait Monitor: Send + Sync {
    fn is_closed(&self) -> bool;
}

impl Monitor for tokio_postgres::Client {
    fn is_closed(&self) -> bool {
        tokio_postgres::Client::is_closed(self)
    }
}

impl Backend for Session {
    fn version(&self) -> &str {
        &self.version
    }
    fn pg_major(&self) -> u32 {
        self.pg_major
    }
    fn lease_host(&self) -> &str {
        &self.lease_host
    }
    fn lease_port(&self) -> u16 {
        self.lease_port
    }
    fn local_socket(&self) -> Option<&std::path::Path> {
        self.local_socket.as_deref()
    }
    fn ssl(&self) -> bool {
        Session::ssl(self)
    }
    fn shared_login(&self) -> Option<&IntegresqlRole> {
        self.integresql_credentials()
    }
    fn settings(&self) -> &[(String, String)] {
        &self.settings
    }
    fn connection_budget(&self) -> u32 {
        self.connection_budget
    }
    fn admin_timeouts(&self) -> u64 {
        Session::admin_timeouts(self)
    }
    fn build_progress(&self, template: &TemplateName) -> Option<BuildProgress> {
        self.build_progress.get(template)
    }
    fn proves_unchanged(&self) -> bool {
        Session::proves_unchanged(self)
    }
    fn build<'a>(
        &'a self,
        template: &'a TemplateName,
        source: &'a TemplateSource,
        reuse_existing: bool,
    ) -> Work<'a, Result<Built, SqlError>> {
        Box::pin(template::build(self, template, source, reuse_existing))
    }
    fn clone_database<'a>(
        &'a self,
        template_db: &'a DbName,
        clone: &'a DbName,
        standard_scram: bool,
    ) -> Work<'a, Result<String, SqlError>> {
        Box::pin(Session::clone_database(
            self,
            template_db,
            clone,
            standard_scram,
        ))
    }
    fn stamp<'a>(&'a self, clone: &'a DbName) -> Work<'a, Result<Stamp, StampError>> {
        Box::pin(Session::stamp(self, clone))
    }
    fn restamp<'a>(
        &'a self,
        clone: &'a DbName,
        previous: Stamp,
    ) -> Work<'a, Result<Stamp, StampError>> {
        Box::pin(Session::restamp(self, clone, previous))
    }
    fn recycle<'a>(
        &'a self,
        clone: &'a DbName,
        standard_scram: bool,
        proof: Option<&'a Stamp>,
    ) -> Work<'a, Result<String, NotReused>> {
        Box::pin(Session::recycle(self, clone, standard_scram, proof))
    }
    fn drop_database<'a>(&'a self, db: &'a DbName) -> Work<'a, Result<(), SqlError>> {
        Box::pin(Session::drop_database(self, db))
    }
    fn set_connection_limit<'a>(
        &'a self,
        db: &'a DbName,
        limit: u32,
    ) -> Work<'a, Result<(), SqlError>> {
        Box::pin(Session::set_connection_limit(self, db, limit))
    }
    fn open_client_template<'a>(
        &'a self,
        template: &'a TemplateName,
        db: &'a DbName,
    ) -> Work<'a, Result<String, SqlError>> {
        Box::pin(template::open_client_template(self, template, db))
    }
    fn finalize_client_template<'a>(
        &'a self,
        template: &'a TemplateName,
        db: &'a DbName,
        since: std::time::Instant,
    ) -> Work<'a, Result<Built, SqlError>> {
        Box::pin(template::finalize_client_template(
            self, template, db, since,
        ))
    }
    fn sessions_after<'a>(
        &'a self,
        db: &'a DbName,
        grace: Duration,
    ) -> Work<'a, Result<i64, SqlError>> {
        Box::pin(Session::sessions_after(self, db, grace))
    }
    fn sizes_of<'a>(&'a self, dbs: &'a [DbName]) -> Work<'a, Result<Vec<(String, i64)>, SqlError>> {
        Box::pin(Session::sizes_of(self, dbs))
    }
    fn database_sizes(&self) -> Work<'_, Result<Vec<(String, i64)>, SqlError>> {
        Box::pin(Session::database_sizes(self))
    }
    fn with_sessions<'a>(&'a self, dbs: &'a [DbName]) -> Work<'a, Result<Vec<String>, SqlError>> {
        Box::pin(Session::with_sessions(self, dbs))
    }
    fn probe(&self) -> Work<'_, Result<Box<dyn Monitor>, SqlError>> {
        Box::pin(async move {
            match tokio::time::timeout(PROBE_TIMEOUT, connect_monitor(&self.admin_config)).await {
                Ok(Ok(monitor)) => Ok(Box::new(monitor) as Box<dyn Monitor>),
                Ok(Err(error)) => Err(SqlError::from_pg(&error)),
                Err(_) => Err(SqlError::timeout("the server did not answer")),
            }
        })
    }
    fn refuses_new_connections(&self) -> Work<'_, Option<String>> {
        Box::pin(async move {
            let mut config = self.admin_config.clone();
            config.application_name("pglease shutdown check");
            let connected =
                tokio::time::timeout(PROBE_TIMEOUT, config.connect(tokio_postgres::NoTls)).await;
            match connected {
                Ok(Ok((client, connection))) => {
                    // Dropping the client makes the connection say goodbye and end.
                    drop(client);
                    tokio::spawn(connection);
                    None
                }
                Ok(Err(error))
                    if error.code()
                        == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW) =>
                {
                    Some(crate::sql_error::pg_message(&error))
                }
                Ok(Err(_)) | Err(_) => None,
            }
        })
    }
    fn mark_ready<'a>(
        &'a self,
        template: &'a TemplateName,
        fingerprint: &'a str,
        clone: &'a DbName,
    ) -> Work<'a, Result<(), SqlError>> {
        Box::pin(mark_ready(self, template, fingerprint, clone))
    }
    fn snapshot_templates<'a>(
        &'a self,
        current: &'a [(TemplateName, String)],
    ) -> Work<'a, Result<Vec<SnapshotTemplate>, SqlError>> {
        Box::pin(async move {
            let templates = Session::snapshot_templates(self, current).await?;
            Ok(templates
                .into_iter()
                .map(|(name, fingerprint, size_bytes)| SnapshotTemplate {
                    name: name.to_string(),
                    fingerprint,
                    size_bytes,
                })
                .collect())
        })
    }
    fn clear_for_snapshot(
        &self,
        current: Vec<(TemplateName, String)>,
    ) -> Work<'_, Result<(), SqlError>> {
        // The sweep notes what it finds in the session it runs on; this one is done with.
        let mut session = self.clone();
        Box::pin(async move { Session::clear_for_snapshot(&mut session, current).await })
    }
}

/// A connection kept open only to notice when the server goes away (the actor polls
/// `is_closed`). It opts out of idle timeouts the server may set for everyone.
pub(super) async fn connect_monitor(
    admin_config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = admin_config.clone();
    config.application_name("pglease monitor");
    let (monitor, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        // Ends when the server goes; the actor sees `is_closed`.
        let _ = connection.await;
    });
    // Set after connecting, not as startup options, which servers before 14 (without
    // idle_session_timeout) would refuse.
    monitor
        .batch_execute(
            "SELECT pg_catalog.set_config(name, '0', false) FROM pg_catalog.pg_settings \
             WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')",
        )
        .await?;
    Ok(monitor)
}
