//! A server in memory for the actor's in-process tests: it keeps the set of databases that
//! exist, and every operation a worker starts on it waits, as a [`Pending`] entry, until the
//! test ends it — successfully (the database is made, recycled, dropped) or with a failure
//! of a chosen kind — so a test decides the order in which jobs finish. The server can be
//! lost (its databases go, as with a restarted embedded cluster; operations under way stay
//! pending, and end as the test says — a success acting on what the lost server held, as a
//! report already in flight — after the actor may have noticed) and brought back; a
//! restart while it is down fails; new operations on a lost life fail as a lost connection.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;

use super::backend::{Backend, Monitor, Work};
use super::start::Up;
use crate::config::TemplateSource;
use crate::error::StartError;
use crate::names::{DbName, TemplateName};
use crate::postgres::snapshot::SnapshotTemplate;
use crate::session::{NotReused, Stamp, StampError};
use crate::sql_error::{SqlError, SqlErrorKind};
use crate::state::Built;
use crate::types::BuildProgress;

/// The size a fake template database reports.
pub(super) const TEMPLATE_BYTES: i64 = 1_000_000;

/// What a pending operation is about to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Op {
    Build { db: DbName },
    Clone { from: DbName, to: DbName },
    Recycle { db: DbName },
    Drop { db: DbName },
    Limit { db: DbName },
    Open { db: DbName },
    Finalize { db: DbName },
    Sessions { db: DbName },
}

/// How the test ends a pending operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    Ok,
    Fail(SqlErrorKind),
}

/// An operation a worker waits on.
pub(super) struct Pending {
    pub(super) op: Op,
    reply: oneshot::Sender<Ending>,
}

/// The fake server's world, shared by its handle in the test and its backends.
#[derive(Default)]
pub(super) struct World {
    /// Whether the server runs (answers, and can be brought up).
    pub(super) up: bool,
    /// Which life of the server a backend belongs to: a backend of an earlier one fails.
    /// A new life begins when the server is lost, and again when it is brought up.
    pub(super) life: u64,
    /// Whether the current life was brought up (the actor works on it), not just lost.
    pub(super) serving: bool,
    /// What the current life holds.
    pub(super) cluster: Cluster,
    pub(super) pending: Vec<Pending>,
    /// What the life that ended last held: operations that were under way when it went may
    /// still end (a report in flight), with their effect on it.
    remains: Option<(u64, Cluster)>,
    /// The current life's monitor connection: closed when the server goes.
    monitor: Option<Arc<AtomicBool>>,
}

/// The databases of one life of the server, and their roles' passwords.
#[derive(Default)]
pub(super) struct Cluster {
    pub(super) databases: BTreeSet<DbName>,
    /// The password each database's role has now (each clone, recycle or open sets one).
    pub(super) passwords: std::collections::BTreeMap<DbName, String>,
    next_password: u64,
}

/// The test's handle on the fake server (also the actor's `Target`).
#[derive(Clone, Default)]
pub(super) struct FakeServer {
    world: Arc<Mutex<World>>,
}

impl FakeServer {
    pub(super) fn new() -> FakeServer {
        let server = FakeServer::default();
        server.world().up = true;
        server
    }

    pub(super) fn world(&self) -> MutexGuard<'_, World> {
        // A test that panicked while holding it has failed already.
        self.world
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The server as a start finds it: up (a new life, with a backend and a monitor), or
    /// down (the start fails, and the actor tries again later).
    pub(super) async fn bring_up(&self) -> Result<Up, StartError> {
        let mut world = self.world();
        if !world.up {
            return Err(StartError::Unreachable {
                target: "the fake server".into(),
                reason: "it is down".into(),
            });
        }
        world.life += 1;
        world.serving = true;
        let closed = Arc::new(AtomicBool::new(false));
        world.monitor = Some(closed.clone());
        Ok(Up {
            running: None,
            backend: Arc::new(FakeBackend {
                server: self.clone(),
                life: world.life,
                settings: Vec::new(),
            }),
            monitor: Box::new(FakeMonitor(closed)),
            adoptable: Vec::new(),
            client_templates: Vec::new(),
            others_integresql_names: Vec::new(),
        })
    }

    /// The server goes: its databases with it (a new cluster when it comes back), and its
    /// monitor connection closes. Operations under way stay pending (see the module docs).
    pub(super) fn lose(&self) {
        let mut world = self.world();
        world.up = false;
        // Its backends and monitor belong to the life that ended.
        world.life += 1;
        world.serving = false;
        let ended = std::mem::take(&mut world.cluster);
        world.remains = Some((world.life - 1, ended));
        if let Some(monitor) = world.monitor.take() {
            monitor.store(true, Ordering::SeqCst);
        }
    }

    /// The server can be started again.
    pub(super) fn come_back(&self) {
        self.world().up = true;
    }

    /// The monitor connection closes while the server runs on (a proxy's idle timeout).
    pub(super) fn close_monitor(&self) {
        if let Some(monitor) = &self.world().monitor {
            monitor.store(true, Ordering::SeqCst);
        }
    }

    /// Ends the pending operation at `index` (modulo their number); false if none is.
    pub(super) fn end(&self, index: usize, ending: Ending) -> bool {
        let mut world = self.world();
        if world.pending.is_empty() {
            return false;
        }
        let index = index % world.pending.len();
        let pending = world.pending.swap_remove(index);
        let _ = pending.reply.send(ending);
        true
    }

    pub(super) fn pending_len(&self) -> usize {
        self.world().pending.len()
    }
}

struct FakeMonitor(Arc<AtomicBool>);

impl Monitor for FakeMonitor {
    fn is_closed(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// One life of the fake server, as the actor's workers see it.
struct FakeBackend {
    server: FakeServer,
    life: u64,
    settings: Vec<(String, String)>,
}

fn lost() -> SqlError {
    SqlError {
        kind: SqlErrorKind::ConnectionLost,
        sqlstate: Some("57P01".into()),
        message: "terminating connection due to administrator command".into(),
    }
}

fn refused(sqlstate: &str, message: String) -> SqlError {
    SqlError {
        kind: SqlErrorKind::Other,
        sqlstate: Some(sqlstate.into()),
        message,
    }
}

fn failure(kind: SqlErrorKind) -> SqlError {
    let sqlstate = match kind {
        SqlErrorKind::DiskFull => "53100",
        SqlErrorKind::TooManyConnections => "53300",
        SqlErrorKind::ConnectionLost => "57P01",
        SqlErrorKind::Timeout => "57014",
        SqlErrorKind::Other => "42601",
    };
    SqlError {
        kind,
        sqlstate: Some(sqlstate.into()),
        message: format!("the fake server fails this with {sqlstate}"),
    }
}

impl FakeBackend {
    /// Waits for the test to end `op`, then carries it out with `effect` on the cluster of
    /// the backend's life (the current one, or the one that ended last).
    async fn run<T>(
        &self,
        op: Op,
        effect: impl FnOnce(&mut Cluster) -> Result<T, SqlError>,
    ) -> Result<T, SqlError> {
        let (reply, ending) = oneshot::channel();
        {
            let mut world = self.server.world();
            if !world.up || world.life != self.life {
                return Err(lost());
            }
            world.pending.push(Pending { op, reply });
        }
        let ending = ending.await.map_err(|_| lost())?;
        let mut world = self.server.world();
        let World {
            life,
            cluster,
            remains,
            ..
        } = &mut *world;
        // The server may have gone while this ran: it ends as the test says all the same, as
        // if its report were already on its way, acting on what that server held.
        let cluster = if *life == self.life {
            Some(cluster)
        } else {
            remains
                .as_mut()
                .filter(|(ended, _)| *ended == self.life)
                .map(|(_, cluster)| cluster)
        };
        match (ending, cluster) {
            (Ending::Ok, Some(cluster)) => effect(cluster),
            (Ending::Ok, None) => Err(lost()),
            (Ending::Fail(kind), _) => Err(failure(kind)),
        }
    }
}

impl Cluster {
    /// A new password for `db`'s role.
    fn new_password(&mut self, db: &DbName) -> String {
        self.next_password += 1;
        let password = format!("secret{}", self.next_password);
        self.passwords.insert(db.clone(), password.clone());
        password
    }
}

fn exists(world: &Cluster, db: &DbName) -> Result<(), SqlError> {
    if world.databases.contains(db) {
        Ok(())
    } else {
        Err(refused(
            "3D000",
            format!("database \"{db}\" does not exist"),
        ))
    }
}

fn built(template: &TemplateName, db: DbName) -> Built {
    Built {
        fingerprint: fingerprint(template),
        db,
        elapsed: Duration::ZERO,
        size_bytes: TEMPLATE_BYTES,
        built_at: SystemTime::now(),
    }
}

/// A template's one version on the fake server (its sources never change there).
pub(super) fn fingerprint(template: &TemplateName) -> String {
    format!("fake{}", template.as_str().len())
}

impl Backend for FakeBackend {
    fn version(&self) -> &str {
        "18.1"
    }
    fn pg_major(&self) -> u32 {
        18
    }
    fn lease_host(&self) -> &str {
        "fake.invalid"
    }
    fn lease_port(&self) -> u16 {
        5432
    }
    fn local_socket(&self) -> Option<&std::path::Path> {
        None
    }
    fn ssl(&self) -> bool {
        false
    }
    fn settings(&self) -> &[(String, String)] {
        &self.settings
    }
    fn connection_budget(&self) -> u32 {
        1000
    }
    fn admin_timeouts(&self) -> u64 {
        0
    }
    fn build_progress(&self, _template: &TemplateName) -> Option<BuildProgress> {
        None
    }
    fn proves_unchanged(&self) -> bool {
        false
    }
    fn build<'a>(
        &'a self,
        template: &'a TemplateName,
        _source: &'a TemplateSource,
        _reuse_existing: bool,
    ) -> Work<'a, Result<Built, SqlError>> {
        let db = DbName::template(template, &fingerprint(template));
        Box::pin(self.run(Op::Build { db: db.clone() }, move |world| {
            // A build over an existing template database makes it afresh.
            world.databases.insert(db.clone());
            Ok(built(template, db))
        }))
    }
    fn clone_database<'a>(
        &'a self,
        template_db: &'a DbName,
        clone: &'a DbName,
        _standard_scram: bool,
    ) -> Work<'a, Result<String, SqlError>> {
        let op = Op::Clone {
            from: template_db.clone(),
            to: clone.clone(),
        };
        Box::pin(self.run(op, move |world| {
            exists(world, template_db)?;
            if !world.databases.insert(clone.clone()) {
                return Err(refused(
                    "42P04",
                    format!("database \"{clone}\" already exists"),
                ));
            }
            Ok(world.new_password(clone))
        }))
    }
    fn stamp<'a>(&'a self, _clone: &'a DbName) -> Work<'a, Result<Stamp, StampError>> {
        // It has no files to stamp (and says so: `proves_unchanged` is false).
        Box::pin(async { Err(StampError::NotOurFiles) })
    }
    fn recycle<'a>(
        &'a self,
        clone: &'a DbName,
        _standard_scram: bool,
        _proof: Option<&'a Stamp>,
    ) -> Work<'a, Result<String, NotReused>> {
        Box::pin(async move {
            self.run(Op::Recycle { db: clone.clone() }, move |world| {
                exists(world, clone)?;
                Ok(world.new_password(clone))
            })
            .await
            .map_err(NotReused::Failed)
        })
    }
    fn drop_database<'a>(&'a self, db: &'a DbName) -> Work<'a, Result<(), SqlError>> {
        Box::pin(self.run(Op::Drop { db: db.clone() }, move |world| {
            world.databases.remove(db);
            world.passwords.remove(db);
            Ok(())
        }))
    }
    fn set_connection_limit<'a>(
        &'a self,
        db: &'a DbName,
        _limit: u32,
    ) -> Work<'a, Result<(), SqlError>> {
        Box::pin(self.run(Op::Limit { db: db.clone() }, move |world| exists(world, db)))
    }
    fn open_client_template<'a>(
        &'a self,
        _template: &'a TemplateName,
        db: &'a DbName,
    ) -> Work<'a, Result<String, SqlError>> {
        Box::pin(self.run(Op::Open { db: db.clone() }, move |world| {
            world.databases.insert(db.clone());
            Ok(world.new_password(db))
        }))
    }
    fn finalize_client_template<'a>(
        &'a self,
        template: &'a TemplateName,
        db: &'a DbName,
        _since: std::time::Instant,
    ) -> Work<'a, Result<Built, SqlError>> {
        Box::pin(self.run(Op::Finalize { db: db.clone() }, move |world| {
            exists(world, db)?;
            Ok(Built {
                fingerprint: template.to_string(),
                ..built(template, db.clone())
            })
        }))
    }
    fn sessions_after<'a>(
        &'a self,
        db: &'a DbName,
        _grace: Duration,
    ) -> Work<'a, Result<i64, SqlError>> {
        Box::pin(self.run(Op::Sessions { db: db.clone() }, |_| Ok(0)))
    }
    fn sizes_of<'a>(
        &'a self,
        _dbs: &'a [DbName],
    ) -> Work<'a, Result<Vec<(String, i64)>, SqlError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn database_sizes(&self) -> Work<'_, Result<Vec<(String, i64)>, SqlError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn with_sessions<'a>(&'a self, _dbs: &'a [DbName]) -> Work<'a, Result<Vec<String>, SqlError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn probe(&self) -> Work<'_, Result<Box<dyn Monitor>, SqlError>> {
        Box::pin(async move {
            let mut world = self.server.world();
            if !world.up || world.life != self.life {
                return Err(SqlError {
                    kind: SqlErrorKind::ConnectionLost,
                    sqlstate: None,
                    message: "connection refused".into(),
                });
            }
            let closed = Arc::new(AtomicBool::new(false));
            world.monitor = Some(closed.clone());
            Ok(Box::new(FakeMonitor(closed)) as Box<dyn Monitor>)
        })
    }
    fn refuses_new_connections(&self) -> Work<'_, Option<String>> {
        // The fake server is up or gone, never shutting down in between.
        Box::pin(async { None })
    }
    fn mark_ready<'a>(
        &'a self,
        _template: &'a TemplateName,
        _fingerprint: &'a str,
        _clone: &'a DbName,
    ) -> Work<'a, Result<(), SqlError>> {
        Box::pin(async { Ok(()) })
    }
    fn snapshot_templates<'a>(
        &'a self,
        _current: &'a [(TemplateName, String)],
    ) -> Work<'a, Result<Vec<SnapshotTemplate>, SqlError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn clear_for_snapshot(
        &self,
        _current: Vec<(TemplateName, String)>,
    ) -> Work<'_, Result<(), SqlError>> {
        Box::pin(async { Ok(()) })
    }
}
