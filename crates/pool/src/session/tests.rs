//! `Session` against a real embedded postgres: what the workers' SQL leaves behind when
//! others race it. Each test starts its own server (the initdb result is cached in the
//! system temp dir); the bin dir comes from `PGLEASE_PG_BIN_DIR`, else the usual discovery.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::NoTls;

use super::*;
use crate::config::PoolLimits;
use crate::error::StartError;
use crate::postgres::{Embedded, RunningPostgres};
use crate::sql_error::SqlErrorKind;
use crate::EmbeddedConfig;

/// A private embedded server for one test, stopped by [`Server::stop`] (or, after a
/// failed assertion, killed by `RunningPostgres`'s drop and swept by a later start).
struct Server {
    embedded: Embedded,
    running: RunningPostgres,
}

impl Server {
    async fn start() -> Server {
        let mut config = EmbeddedConfig::for_limits(&PoolLimits::default(), 1);
        config.bin_dir = std::env::var_os("PGLEASE_PG_BIN_DIR").map(PathBuf::from);
        config.cache_dir = Some(std::env::temp_dir().join("pglease-session-tests-cache"));
        config.shared_buffers = "16MB".into();
        config.max_connections = 100;
        let mut embedded = Embedded::prepare(&config, &[]).await.unwrap_or_else(|e| {
            panic!("prepare failed: {e} (set PGLEASE_PG_BIN_DIR if postgres was not found)")
        });
        let running = embedded
            .start()
            .await
            .unwrap_or_else(|e| panic!("start failed: {e}"));
        Server { embedded, running }
    }

    /// What the actor passes for an embedded server.
    fn params(&self) -> SessionParams {
        SessionParams {
            admin_config: self.running.admin_config(),
            lease_host: self.running.host.clone(),
            lease_port: self.running.port,
            local_socket: Some(self.running.socket_dir.clone()),
            pool_size: 4,
            clone_strategy: CloneStrategy::FileCopy,
            external: false,
            lease_auth: LeaseAuth::default(),
            lease_superuser: false,
            lease_connections: 80,
            build_timeout: Duration::from_secs(60),
            admin_timeout: DEFAULT_ADMIN_TIMEOUT,
            proof_dir: None,
            child_user: crate::child_user::ChildUser::resolve(None).expect("child user"),
            integresql_role: None,
        }
    }

    async fn open(&self) -> Session {
        Session::open(self.params())
            .await
            .unwrap_or_else(|e| panic!("open a session: {e}"))
    }

    /// A superuser connection of the test's own.
    async fn superuser(&self) -> tokio_postgres::Client {
        connect(&self.running.admin_config())
            .await
            .expect("superuser connection")
    }

    /// How a lease holder reaches `clone` (over TCP, with the role's password).
    fn lease_config(&self, clone: &DbName, password: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.running.host)
            .port(self.running.port)
            .user(clone.as_str())
            .dbname(clone.as_str())
            .password(password)
            .connect_timeout(Duration::from_secs(10));
        config
    }

    async fn stop(self) {
        self.running.shutdown(Duration::from_secs(10)).await;
        self.embedded.cleanup();
    }
}

/// Connects and spawns the connection's task.
async fn connect(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A template database with a table in it, as a build would leave it.
async fn make_template(session: &Session, name: &str) -> DbName {
    let template = DbName::from_server(format!("pglease_tpl_{name}"));
    session
        .execute(&format!("CREATE DATABASE {}", template.quoted()))
        .await
        .expect("create the template");
    template
}

/// Sessions of `role` the server still lists.
async fn sessions_of(admin: &tokio_postgres::Client, role: &DbName) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
            &[&role.as_str()],
        )
        .await
        .expect("count sessions")
        .get(0)
}

/// A recycle must leave the previous holder nothing: while it runs, tasks keep logging in
/// with the old password and hold every session they get. A login that read the old
/// verifier just before the password changed used to finish after the single
/// `pg_terminate_backend` and stay connected; each round checks that no session opened
/// with the old password is alive afterwards and that the old password is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recycle_leaves_no_session_of_the_old_holder() {
    hammered_recycles(false).await;
}

/// The same on a server the session takes for an external one, whose backends' exits only
/// its lock table tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recycle_leaves_no_session_of_the_old_holder_on_an_external_server() {
    hammered_recycles(true).await;
}

async fn hammered_recycles(external: bool) {
    const ROUNDS: usize = 25;
    const HAMMERS: usize = 4;
    let server = Server::start().await;
    let session = Session::open(SessionParams {
        external,
        ..server.params()
    })
    .await
    .unwrap_or_else(|e| panic!("open a session: {e}"));
    let admin = server.superuser().await;
    let template = make_template(&session, "recycle").await;
    let clone = DbName::from_server("pglease_recycle_1".into());
    let mut password = session
        .clone_database(&template, &clone, false)
        .await
        .expect("clone");
    for round in 0..ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        let hammers: Vec<_> = (0..HAMMERS)
            .map(|_| {
                let config = server.lease_config(&clone, &password);
                let (stop, held) = (Arc::clone(&stop), Arc::clone(&held));
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        // Refusals (new password, NOLOGIN) are expected; keep trying.
                        if let Ok(client) = connect(&config).await {
                            held.lock().expect("held").push(client);
                        }
                    }
                })
            })
            .collect();
        // Let the hammers get going, so some login is always in flight.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let new_password = session
            .recycle(&clone, false, None)
            .await
            .unwrap_or_else(|e| panic!("round {round}: recycle failed: {e}"));
        stop.store(true, Ordering::Relaxed);
        for hammer in hammers {
            hammer.await.expect("hammer task");
        }
        let held = std::mem::take(&mut *held.lock().expect("held"));
        let mut survivors = 0;
        for client in &held {
            if client.simple_query("SELECT 1").await.is_ok() {
                survivors += 1;
            }
        }
        assert_eq!(
            survivors,
            0,
            "round {round}: {survivors} of {} sessions opened with the old password outlived the recycle",
            held.len()
        );
        drop(held);
        assert_eq!(
            sessions_of(&admin, &clone).await,
            0,
            "round {round}: the role still has sessions"
        );
        assert!(
            connect(&server.lease_config(&clone, &password))
                .await
                .is_err(),
            "round {round}: the old password still works"
        );
        let fresh = connect(&server.lease_config(&clone, &new_password))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the new password fails: {e}"));
        drop(fresh);
        password = new_password;
    }
    drop(session);
    server.stop().await;
}

/// The clone's database-level settings, as postgres stores them.
async fn stored_settings(admin: &tokio_postgres::Client, db: &DbName) -> Vec<String> {
    admin
        .query_opt(
            "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase \
             WHERE d.datname = $1 AND s.setrole = 0",
            &[&db.as_str()],
        )
        .await
        .expect("read pg_db_role_setting")
        .map(|row| row.get(0))
        .unwrap_or_default()
}

/// `current_setting` of each name, in a session opened with `config`.
async fn current_settings(config: &tokio_postgres::Config, names: &[&str]) -> Vec<String> {
    let client = connect(config).await.expect("connect");
    let mut values = Vec::new();
    for name in names {
        let row = client
            .query_one("SELECT current_setting($1)", &[name])
            .await
            .expect("current_setting");
        values.push(row.get(0));
    }
    values
}

/// `CREATE DATABASE` copies no `ALTER DATABASE … SET`, so a clone gets its template's
/// again. They used to be re-applied as one quoted literal each, which turns a list such
/// as `search_path = app, public` into the single schema `"app, public"`.
#[tokio::test]
async fn a_clone_gets_its_template_database_settings_exactly() {
    let server = Server::start().await;
    let session = server.open().await;
    let admin = server.superuser().await;
    let template = make_template(&session, "settings").await;
    session
        .execute(&format!(
            "ALTER DATABASE {db} SET search_path = app, \"My Schema\", \"it's\", \"we\"\"ird, one\", public; \
             ALTER DATABASE {db} SET work_mem = '64MB'; \
             ALTER DATABASE {db} SET datestyle = 'ISO, DMY'; \
             ALTER DATABASE {db} SET app.greeting = 'it''s \"quoted\", here'; \
             ALTER DATABASE {db} SET statement_timeout = 65000;",
            db = template.quoted()
        ))
        .await
        .expect("set the template's settings");
    let expected = stored_settings(&admin, &template).await;
    assert_eq!(expected.len(), 5, "{expected:?}");

    let clone = DbName::from_server("pglease_settings_1".into());
    let password = session
        .clone_database(&template, &clone, false)
        .await
        .expect("clone");
    assert_eq!(stored_settings(&admin, &clone).await, expected);

    // A session in the clone sees what a session in the template sees.
    let names = [
        "search_path",
        "work_mem",
        "DateStyle",
        "app.greeting",
        "statement_timeout",
    ];
    let mut in_template = server.running.admin_config();
    in_template.dbname(template.as_str());
    let template_values = current_settings(&in_template, &names).await;
    assert_eq!(
        template_values[0],
        "app, \"My Schema\", \"it's\", \"we\"\"ird, one\", public"
    );
    let clone_values = current_settings(&server.lease_config(&clone, &password), &names).await;
    assert_eq!(clone_values, template_values);

    // A second clone of the same version takes the cached statements.
    let second = DbName::from_server("pglease_settings_2".into());
    session
        .clone_database(&template, &second, false)
        .await
        .expect("second clone");
    assert_eq!(stored_settings(&admin, &second).await, expected);
    drop(session);
    server.stop().await;
}

/// A clone whose name someone else's database took since the start (a real IntegreSQL's,
/// on a shared server) fails with 42P04, which the pool reads as "leave it, and never use
/// the name again"; the login role made for the clone does not outlive the failure.
#[tokio::test]
async fn a_clone_whose_name_is_taken_leaves_no_role_behind() {
    let server = Server::start().await;
    let session = server.open().await;
    let admin = server.superuser().await;
    let template = make_template(&session, "taken").await;
    admin
        .batch_execute("CREATE DATABASE integresql_test_abc123_1")
        .await
        .expect("someone else's database");
    let clone = DbName::from_server("integresql_test_abc123_1".into());
    let error = session
        .clone_database(&template, &clone, true)
        .await
        .expect_err("the name is taken");
    assert_eq!(error.sqlstate.as_deref(), Some("42P04"), "{error}");
    let count = |sql: &'static str| {
        let admin = &admin;
        let name = clone.as_str().to_owned();
        async move {
            admin
                .query_one(sql, &[&name])
                .await
                .expect("count")
                .get::<_, i64>(0)
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM pg_roles WHERE rolname = $1").await,
        0,
        "the clone's role is gone"
    );
    assert_eq!(
        count("SELECT count(*) FROM pg_database WHERE datname = $1").await,
        1,
        "someone else's database stays"
    );
    drop(session);
    server.stop().await;
}

/// A session holds the server lock while any clone of it lives: another daemon (here a
/// connection named like one) makes `open` fail naming it, and this process's own earlier
/// session (a reconnect whose last jobs still run) is waited for.
#[tokio::test]
async fn the_server_lock_keeps_a_second_session_out() {
    let server = Server::start().await;
    let mut foreign_config = server.running.admin_config();
    foreign_config.application_name("pglease (pid 1 on elsewhere)");
    let foreign = connect(&foreign_config).await.expect("connect");
    foreign
        .batch_execute("SELECT pg_advisory_lock(x'70676c6561736500'::bigint)")
        .await
        .expect("take the lock");
    match Session::open(server.params()).await {
        Err(StartError::ServerInUse { holder, .. }) => {
            assert!(
                holder.contains("\"pglease (pid 1 on elsewhere)\""),
                "{holder}"
            );
            assert!(holder.contains("local socket"), "{holder}");
        }
        Err(other) => panic!("expected ServerInUse, got {other}"),
        Ok(_) => panic!("a second session opened while another holds the lock"),
    }
    drop(foreign);

    let first = server.open().await;
    let still_running_job = first.clone();
    drop(first);
    // Our lock connections are named after this process; those there already (the first
    // session's, perhaps the refused one's on its way out) are not the second's.
    let admin = server.superuser().await;
    let ours = format!("pglease (pid {} on %", std::process::id());
    let earlier: Vec<i32> = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1",
            &[&ours],
        )
        .await
        .expect("list our lock connections")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let second = tokio::spawn(Session::open(server.params()));
    // The second session's lock connection has found the lock taken and looked up who
    // holds it (its last query reads pg_locks): it has reached its wait for the lock.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let looked: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 \
                 AND NOT pid = ANY($2) AND query LIKE '%FROM pg_locks%'",
                &[&ours, &earlier],
            )
            .await
            .expect("count")
            .get(0);
        if looked > 0 {
            break;
        }
        assert!(
            !second.is_finished(),
            "the second session ended without waiting for the first"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the second session never found the lock taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What sets our own holder apart from another daemon's is only how long it is waited
    // for: past the 2 s a foreign holder gets (`FOREIGN_WAIT` in session/lock.rs), the
    // second session still waits.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !second.is_finished(),
        "the second session did not wait for the first"
    );
    drop(still_running_job);
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second session opens once the first is gone")
        .expect("join");
    let second = second.unwrap_or_else(|e| panic!("open: {e}"));
    drop(second);
    server.stop().await;
}

/// A CREATE DATABASE that waits on a lock forever (here another superuser holds
/// `pg_database` in SHARE mode) used to hold its clone slot and pooled connection for
/// good. Under a short bound `clone_database` fails in time with "timed out after", the
/// counter says so, the statement is cancelled on the server, and the session goes on.
#[tokio::test]
async fn a_hung_clone_times_out_and_is_counted() {
    const BOUND: Duration = Duration::from_secs(2);
    let server = Server::start().await;
    let mut params = server.params();
    params.admin_timeout = BOUND;
    let session = Session::open(params)
        .await
        .unwrap_or_else(|e| panic!("open: {e}"));
    let template = make_template(&session, "hang").await;
    let blocker = server.superuser().await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE pg_database IN SHARE MODE")
        .await
        .expect("lock pg_database");

    let clone = DbName::from_server("pglease_hang_1".into());
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(
        BOUND + Duration::from_secs(10),
        session.clone_database(&template, &clone, false),
    )
    .await
    .expect("clone_database hung past its bound");
    let elapsed = started.elapsed();
    let error = match outcome {
        Err(error) => error,
        Ok(_) => panic!("the clone succeeded while pg_database was locked"),
    };
    assert_eq!(error.kind, SqlErrorKind::Timeout, "{error}");
    assert!(
        error.message.contains(&format!(
            "cloning {template} into {clone} timed out after 2s"
        )),
        "{error}"
    );
    assert!(elapsed < BOUND + Duration::from_secs(1), "{elapsed:?}");
    assert_eq!(session.admin_timeouts(), 1);

    // The server was told to cancel the CREATE DATABASE: it no longer waits on the lock.
    let admin = server.superuser().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        if waiting == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the CREATE DATABASE still waits for its lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    blocker.batch_execute("ROLLBACK").await.expect("unlock");

    // The session works on: the failed clone is dropped (its role was made) and a new
    // clone succeeds, with no other timeout counted.
    session
        .drop_database(&clone)
        .await
        .expect("drop the failed clone");
    let exists = admin
        .query_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1",
            &[&clone.as_str()],
        )
        .await
        .expect("look up");
    assert!(
        exists.is_none(),
        "the cancelled CREATE DATABASE made the clone after all"
    );
    let again = DbName::from_server("pglease_hang_2".into());
    session
        .clone_database(&template, &again, false)
        .await
        .expect("clone after the timeout");
    assert_eq!(session.admin_timeouts(), 1);
    drop(session);
    server.stop().await;
}

/// The proof's last check, the files: a change that has already reached them (flushed by a
/// checkpoint, so no buffer is dirty any more) and counts no row (a sequence's nextval) is
/// still caught; and a clone nobody touched passes.
#[tokio::test]
async fn a_change_already_written_to_the_files_is_caught_by_the_proof() {
    let server = Server::start().await;
    let mut params = server.params();
    params.proof_dir = Some(server.running.data_dir.clone());
    let session = Session::open(params).await.expect("open a session");
    assert!(session.proves_unchanged());
    let template = make_template(&session, "proof").await;
    let admin = server.superuser().await;
    // A sequence: nextval writes its page without counting a row in the statistics, so
    // only the buffers (and once written out, the files) show it.
    let mut in_template = server.running.admin_config();
    in_template.dbname(template.as_str());
    connect(&in_template)
        .await
        .expect("connect to the template")
        .batch_execute("CREATE SEQUENCE s; GRANT USAGE ON SEQUENCE s TO PUBLIC")
        .await
        .expect("sequence");
    let clone = DbName::from_server("pglease_proof_1".into());
    session
        .clone_database(&template, &clone, false)
        .await
        .expect("clone");

    // Untouched: the proof holds, and it is handed out again.
    let stamp = session.stamp(&clone).await.expect("stamp");
    let password = session
        .recycle(&clone, false, Some(&stamp))
        .await
        .expect("an untouched clone is reused");

    // The holder advances the sequence; a checkpoint writes it out.
    nextval_as_holder(&server, &clone, &password).await;
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
    let dirty: i64 = admin
        .query_one(
            "SELECT count(*) FROM pglease.pg_buffercache WHERE isdirty AND reldatabase = \
             (SELECT oid FROM pg_database WHERE datname = $1)",
            &[&clone.as_str()],
        )
        .await
        .expect("dirty buffers")
        .get(0);
    assert_eq!(
        dirty, 0,
        "the checkpoint left dirty buffers: the test would prove nothing"
    );
    match session.recycle(&clone, false, Some(&stamp)).await {
        Err(NotReused::Changed(why)) => assert!(why.starts_with("file "), "{why}"),
        other => panic!("a written change was not caught: {other:?}"),
    }
    drop(admin);
    server.stop().await;
}

/// The holder of `clone` advances its sequence `s` (a write that counts no row) and leaves.
async fn nextval_as_holder(server: &Server, clone: &DbName, password: &str) {
    connect(&server.lease_config(clone, password))
        .await
        .expect("holder")
        .batch_execute("SELECT nextval('s')")
        .await
        .expect("nextval");
}

/// A clone `pglease_<name>_1` of `template`, its stamp and its role's password.
async fn stamped_clone(
    session: &Session,
    template: &DbName,
    name: &str,
) -> (DbName, Stamp, String) {
    let clone = DbName::from_server(format!("pglease_{name}_1"));
    let password = session
        .clone_database(template, &clone, false)
        .await
        .expect("clone");
    let stamp = session.stamp(&clone).await.expect("stamp");
    (clone, stamp, password)
}

/// The proof's verdict on a clone of a template with a sequence (and `extra` SQL) whose
/// holder ran `nextval` — a change that counts no row and stays in memory — and left.
async fn proof_after_a_nextval(name: &str, extra: &str) -> Result<String, NotReused> {
    let server = Server::start().await;
    let mut params = server.params();
    params.proof_dir = Some(server.running.data_dir.clone());
    let session = Session::open(params).await.expect("open a session");
    let template = make_template(&session, name).await;
    let mut in_template = server.running.admin_config();
    in_template.dbname(template.as_str());
    connect(&in_template)
        .await
        .expect("connect to the template")
        .batch_execute(&format!(
            "CREATE SEQUENCE s; GRANT USAGE ON SEQUENCE s TO PUBLIC; {extra}"
        ))
        .await
        .expect("sequence");
    let (clone, stamp, password) = stamped_clone(&session, &template, name).await;
    nextval_as_holder(&server, &clone, &password).await;
    // Past the file clock's tick: a write from now on changes a file's time.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let verdict = session.recycle(&clone, false, Some(&stamp)).await;
    drop(session);
    server.stop().await;
    verdict
}

/// Without unlogged relations the proof's checkpoint writes the change out and the files
/// show it. (Without the checkpoint, and without the buffer scan it replaces, this clone
/// would be reused.)
#[tokio::test]
async fn a_change_left_in_memory_is_written_out_and_caught() {
    match proof_after_a_nextval("inmemory", "").await {
        Err(NotReused::Changed(why)) => assert!(why.starts_with("file "), "{why}"),
        other => panic!("a change in memory was not caught: {other:?}"),
    }
}

/// A clone with an unlogged relation, whose buffers a plain checkpoint does not write: the
/// proof scans the buffers instead, and the change is found there.
#[tokio::test]
async fn with_unlogged_relations_the_buffers_are_scanned() {
    match proof_after_a_nextval("unlogged", "CREATE UNLOGGED TABLE u (i int)").await {
        Err(NotReused::Changed(why)) => assert!(why.ends_with("changed in memory"), "{why}"),
        other => panic!("a change in memory was not caught: {other:?}"),
    }
}

/// A writer whose session is still ending when its clone is released is told changed by the
/// statistics once that session is gone, without being locked out: the role keeps LOGIN and
/// its password (no new verifier is computed for a clone that is dropped anyway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_writer_is_told_changed_without_a_lock_out() {
    let server = Server::start().await;
    let mut params = server.params();
    params.proof_dir = Some(server.running.data_dir.clone());
    let session = Session::open(params).await.expect("open a session");
    let template = make_template(&session, "leaving").await;
    let admin = server.superuser().await;
    let (clone, stamp, password) = stamped_clone(&session, &template, "leaving").await;
    let holder = connect(&server.lease_config(&clone, &password))
        .await
        .expect("holder");
    holder
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2)")
        .await
        .expect("write");
    // The holder leaves only after the release has begun: its counts arrive then.
    let leaving = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(holder);
    });
    match session.recycle(&clone, false, Some(&stamp)).await {
        Err(NotReused::Changed(why)) => assert!(why.ends_with("row(s) written"), "{why}"),
        other => panic!("a writer was not told by its statistics: {other:?}"),
    }
    leaving.await.expect("the holder left");
    let can_login: bool = admin
        .query_one(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = $1",
            &[&clone.as_str()],
        )
        .await
        .expect("the role")
        .get(0);
    assert!(
        can_login,
        "the writer was locked out before its statistics were read"
    );
    connect(&server.lease_config(&clone, &password))
        .await
        .expect("the holder's password was not replaced");
    drop(admin);
    server.stop().await;
}

/// Under trust no password is checked, so none is stored: a verifier would cost a PBKDF2
/// per clone and per recycle for nothing. (Under SCRAM every lease test logs in with one.)
#[tokio::test]
async fn under_trust_lease_roles_store_no_verifier() {
    let server = Server::start().await;
    let admin = server.superuser().await;
    let stored = async |role: &DbName| -> Option<String> {
        admin
            .query_one(
                "SELECT rolpassword FROM pg_authid WHERE rolname = $1",
                &[&role.as_str()],
            )
            .await
            .expect("the role")
            .get(0)
    };
    let mut params = server.params();
    params.lease_auth = LeaseAuth::Trust;
    let session = Session::open(params).await.expect("open a session");
    let template = make_template(&session, "trust").await;
    let clone = DbName::from_server("pglease_trust_1".into());
    session
        .clone_database(&template, &clone, false)
        .await
        .expect("clone under trust");
    assert_eq!(stored(&clone).await, None, "made under trust");
    session
        .recycle(&clone, false, None)
        .await
        .expect("recycle under trust");
    assert_eq!(stored(&clone).await, None, "recycled under trust");
    drop(admin);
    server.stop().await;
}

/// Issue 43: a build's own statements (its `CREATE DATABASE`, the settle's `VACUUM
/// (FREEZE)`, the grants) keep postgres' SQLSTATE through every step's context, so that the
/// API can answer a full disk 507 (`LeaseError::BuildFailed`'s cause, `ApiError`) instead of
/// blaming the template's sources. The statement fails as a full disk does, with SQLSTATE
/// 53100 from the server itself.
#[tokio::test]
async fn a_build_step_keeps_the_sqlstate_of_its_failing_statement() {
    let server = Server::start().await;
    let session = server.open().await;
    let db = DbName::from_server("pglease_tpl_sqlstate".into());
    crate::template::create_template_database(&session, &db, "a test's template")
        .await
        .expect("create the template database");
    let full = "DO $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' \
                USING ERRCODE = 'disk_full'; END $$";
    let error = crate::template::run_each_in(&session, &db, &["ANALYZE", full])
        .await
        .expect_err("the statement fails")
        .context("settling the template");
    assert_eq!(error.sqlstate.as_deref(), Some("53100"), "{error:?}");
    assert_eq!(error.kind, SqlErrorKind::DiskFull, "{error:?}");
    assert!(
        error
            .message
            .starts_with("settling the template: ERROR: could not extend file"),
        "{error:?}"
    );
    // Any other SQLSTATE travels as well, as the template's (or the server's) failure.
    let error = crate::template::run_in(&session, &db, "SELECT 1/0")
        .await
        .expect_err("division by zero");
    assert_eq!(error.sqlstate.as_deref(), Some("22012"), "{error:?}");
    assert_eq!(error.kind, SqlErrorKind::Other, "{error:?}");
    // The session's own statements keep it too.
    let error = session.execute(full).await.expect_err("fails");
    assert_eq!(error.kind, SqlErrorKind::DiskFull, "{error:?}");
    session.drop_database(&db).await.expect("drop");
    server.stop().await;
}

/// Issue 43: a connection postgres refuses for want of a slot (SQLSTATE 53300; here a
/// role's `CONNECTION LIMIT 0`, as the server's `max_connections` would) is the connection
/// budget's failure, `SqlErrorKind::TooManyConnections`, not "the SQL failed": the build
/// that meets it is not blamed on its sources and the API answers `too_many_connections`.
#[tokio::test]
async fn a_connection_refused_for_want_of_a_slot_is_too_many_connections() {
    let server = Server::start().await;
    let admin = server.superuser().await;
    admin
        .batch_execute("CREATE ROLE pglease_test_no_slot LOGIN CONNECTION LIMIT 0")
        .await
        .expect("a role with no slot");
    let mut config = server.running.admin_config();
    config.user("pglease_test_no_slot").dbname("postgres");
    let refused = connect(&config)
        .await
        .expect_err("postgres refuses the role");
    let error = SqlError::from_pg(&refused);
    assert_eq!(error.sqlstate.as_deref(), Some("53300"), "{error:?}");
    assert_eq!(error.kind, SqlErrorKind::TooManyConnections, "{error:?}");
    assert!(
        error.message.contains("too many connections for role"),
        "{error:?}"
    );
    // 53400 names limits other than connections, and stays the server's refusal.
    let error = server
        .open()
        .await
        .execute(
            "DO $$ BEGIN RAISE EXCEPTION 'too many replication slots' \
             USING ERRCODE = 'configuration_limit_exceeded'; END $$",
        )
        .await
        .expect_err("fails");
    assert_eq!(error.sqlstate.as_deref(), Some("53400"), "{error:?}");
    assert_eq!(error.kind, SqlErrorKind::Other, "{error:?}");
    drop(admin);
    server.stop().await;
}

/// After a recycle that proves nothing (a `reuse` release), the next stamp carries the
/// files forward from the previous one while the kernel saw no change in the clone's
/// directory — it equals a fresh stamp — and is a fresh one once a write reached the files;
/// either proves the clone unchanged afterwards.
#[tokio::test]
async fn a_restamp_carries_the_files_forward_only_while_nothing_changed() {
    let server = Server::start().await;
    let mut params = server.params();
    params.proof_dir = Some(server.running.data_dir.clone());
    let session = Session::open(params).await.expect("open a session");
    let template = make_template(&session, "restamp").await;
    let admin = server.superuser().await;
    let mut in_template = server.running.admin_config();
    in_template.dbname(template.as_str());
    connect(&in_template)
        .await
        .expect("connect to the template")
        .batch_execute("CREATE SEQUENCE s; GRANT USAGE ON SEQUENCE s TO PUBLIC")
        .await
        .expect("sequence");
    let (clone, stamp, _) = stamped_clone(&session, &template, "restamp").await;

    // A `reuse` release of an untouched clone: the files are carried forward.
    let password = session.recycle(&clone, false, None).await.expect("recycle");
    let carried = session
        .restamp(&clone, stamp.clone())
        .await
        .expect("restamp");
    let fresh = session.stamp(&clone).await.expect("stamp");
    assert_eq!(
        carried, fresh,
        "a carried stamp is not what a fresh one says"
    );

    // The holder writes (a checkpoint puts it in the files) and vouches for it anyway.
    nextval_as_holder(&server, &clone, &password).await;
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
    session.recycle(&clone, false, None).await.expect("recycle");
    let after_write = session
        .restamp(&clone, fresh.clone())
        .await
        .expect("restamp");
    assert_ne!(
        after_write, fresh,
        "the files changed, yet the old stamp was carried forward"
    );
    session
        .recycle(&clone, false, Some(&after_write))
        .await
        .expect("unchanged since the new stamp");
    drop(admin);
    server.stop().await;
}

/// Issue 43: a stamp that fails keeps what failed. A query postgres refuses keeps its
/// SQLSTATE and kind (here 55P03, `lock_not_available`: the shared catalog the stamp reads is
/// locked by someone else and the session's connections give up after `lock_timeout`);
/// a listing that fails names the clone's directory and keeps the system's error.
#[tokio::test]
async fn a_failed_stamp_keeps_the_sqlstate_and_the_directory() {
    let server = Server::start().await;
    let admin = server.superuser().await;
    // Every connection the session opens from now on gives up on a lock after 100 ms.
    admin
        .batch_execute("ALTER ROLE CURRENT_USER SET lock_timeout = '100ms'")
        .await
        .expect("set lock_timeout");
    let mut params = server.params();
    // A directory that does not exist: the query succeeds, the listing cannot.
    let missing = server.running.data_dir.join("no-such-dir");
    params.proof_dir = Some(missing.clone());
    let session = Session::open(params).await.expect("open a session");
    let postgres = DbName::from_server("postgres".into());

    let oid: u32 = admin
        .query_one(
            "SELECT oid FROM pg_database WHERE datname = 'postgres'",
            &[],
        )
        .await
        .expect("oid")
        .get(0);
    match session.stamp(&postgres).await {
        Err(StampError::ListDirectory { path, source }) => {
            assert_eq!(path, missing.join("base").join(oid.to_string()));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{source}");
        }
        other => panic!("a listing of a missing directory: {other:?}"),
    }

    // The stamp's query reads pg_shdescription; someone else holds it locked.
    admin
        .batch_execute("BEGIN; LOCK TABLE pg_catalog.pg_shdescription IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock a shared catalog");
    match session.stamp(&postgres).await {
        Err(StampError::Sql(error)) => {
            assert_eq!(error.sqlstate.as_deref(), Some("55P03"), "{error}");
            assert_eq!(error.kind, SqlErrorKind::Other, "{error}");
        }
        other => panic!("a stamp behind a lock: {other:?}"),
    }
    admin.batch_execute("ROLLBACK").await.expect("unlock");
    drop(session);
    drop(admin);
    server.stop().await;
}
