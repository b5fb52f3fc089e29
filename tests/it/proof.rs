//! `--reuse-unchanged`: a released database goes back to the ready queue only when the
//! server proves it unchanged. An adversarial table of changes — each must be caught (the
//! next lease gets a new database) — and reads, which must not (the next lease gets the
//! same database, with the same contents).

use std::fs;

use rand::RngExt;
use serde_json::{json, Value};

use std::time::Duration;

use crate::support::{connect, id_of, poll_until, scratch_dir, TestDaemon};

const SCHEMA: &str = "\
    CREATE TABLE t (id serial PRIMARY KEY, note text NOT NULL);\n\
    INSERT INTO t (note) SELECT 'row ' || i FROM generate_series(1, 200) i;\n\
    CREATE UNLOGGED TABLE u (id int PRIMARY KEY, note text);\n\
    INSERT INTO u SELECT i, 'u' || i FROM generate_series(1, 50) i;\n\
    CREATE SEQUENCE s;\n\
    CREATE VIEW v AS SELECT id, upper(note) AS loud FROM t;\n";

/// [`SCHEMA`] with `u` logged: no unlogged relation, so the proof makes changes left in
/// memory show in the files with a checkpoint instead of scanning the buffers for them.
fn logged_schema() -> String {
    SCHEMA.replace("CREATE UNLOGGED TABLE", "CREATE TABLE")
}

/// Statements that change something, each run in a lease of its own (one string: one
/// batch, several statements in one transaction unless it says otherwise).
const CHANGES: &[(&str, &str)] = &[
    ("insert", "INSERT INTO t (note) VALUES ('new')"),
    ("insert rolled back", "BEGIN; INSERT INTO t (note) VALUES ('new'); ROLLBACK"),
    ("update", "UPDATE t SET note = note || '!' WHERE id = 7"),
    ("update rolled back", "BEGIN; UPDATE t SET note = 'x'; ROLLBACK"),
    ("delete", "DELETE FROM t WHERE id = 3"),
    ("truncate", "TRUNCATE t CASCADE"),
    ("select for update", "BEGIN; SELECT * FROM t WHERE id = 5 FOR UPDATE; COMMIT"),
    ("nextval", "SELECT nextval('s')"),
    ("nextval of a serial, rolled back", "BEGIN; SELECT nextval('t_id_seq'); ROLLBACK"),
    ("setval", "SELECT setval('s', 1, false)"),
    ("large object", "SELECT lo_create(0)"),
    ("temp table", "CREATE TEMP TABLE tmp AS SELECT * FROM t"),
    ("analyze", "ANALYZE t"),
    ("vacuum", "VACUUM t"),
    ("alter table set", "ALTER TABLE t SET (fillfactor = 50)"),
    ("comment", "COMMENT ON TABLE t IS 'hello'"),
    ("grant", "GRANT SELECT ON t TO PUBLIC"),
    ("unlogged insert", "INSERT INTO u VALUES (1000, 'x')"),
    ("another schema", "CREATE SCHEMA other; CREATE TABLE other.x (i int)"),
    ("function", "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'"),
    ("index", "CREATE INDEX ON t (note)"),
    ("database setting", "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET work_mem = ''7MB''', current_database()); END $$"),
    ("role setting", "ALTER ROLE CURRENT_USER SET work_mem = '7MB'"),
    ("database grant", "DO $$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %I TO PUBLIC', current_database()); END $$"),
];

/// Statements that only read — or change only what the recycle resets anyway (the
/// database's comment, which it clears) —: the database is reused, as the template made it.
const READS: &[(&str, &str)] = &[
    ("database comment (cleared by the recycle)", "DO $$ BEGIN EXECUTE format('COMMENT ON DATABASE %I IS ''mine''', current_database()); END $$"),
    ("select", "SELECT count(*) FROM t"),
    ("join and view", "SELECT * FROM v JOIN t USING (id) WHERE id < 20"),
    ("unlogged read", "SELECT * FROM u"),
    ("explain", "EXPLAIN ANALYZE SELECT * FROM t WHERE note LIKE 'row 1%'"),
    ("session settings", "SET work_mem = '9MB'; SELECT current_setting('work_mem')"),
    ("read-only transaction", "BEGIN READ ONLY; SELECT * FROM t; COMMIT"),
    ("catalog reads", "SELECT * FROM pg_class; SELECT * FROM pg_stats WHERE tablename = 't'"),
];

/// Every row of `t` and `u`, the sequence and the objects, as one string.
async fn contents(client: &tokio_postgres::Client) -> String {
    client
        .query_one(
            "SELECT concat_ws(' | ', \
               (SELECT md5(string_agg(t::text, ',' ORDER BY id)) FROM t), \
               (SELECT md5(string_agg(u::text, ',' ORDER BY id)) FROM u), \
               (SELECT last_value || ',' || is_called FROM s), \
               (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace), \
               (SELECT count(*) FROM pg_largeobject_metadata), \
               (SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace), \
               current_setting('work_mem'), \
               (SELECT shobj_description(oid, 'pg_database') FROM pg_database \
                 WHERE datname = current_database()), \
               (SELECT replace(datacl::text, current_database(), 'me') FROM pg_database \
                 WHERE datname = current_database()), \
               (SELECT md5(string_agg(concat_ws(':', relname, relkind, relpages, reltuples, \
                                                reloptions::text, relacl::text), ',' ORDER BY relname)) \
                  FROM pg_class WHERE relnamespace NOT IN ('pg_catalog'::regnamespace, \
                                                           'pg_toast'::regnamespace)), \
               (SELECT count(*) FROM pg_stats), \
               (SELECT count(*) FROM pg_description), \
               (SELECT count(*) FROM pg_proc))",
            &[],
        )
        .await
        .expect("contents")
        .get(0)
}

async fn lease(daemon: &TestDaemon) -> Value {
    let (status, lease) = daemon
        .lease(json!({"template": "app", "wait_ms": 60000}))
        .await;
    assert_eq!(status, 201, "{lease}");
    lease
}

/// With an unlogged table the proof scans the buffers for changes left in memory.
#[tokio::test]
async fn a_released_database_is_reused_only_when_the_server_proves_it_unchanged() {
    every_change_caught_and_every_read_reused("proof", SCHEMA).await;
}

/// Without one it checkpoints, and the files show them.
#[tokio::test]
async fn without_unlogged_tables_the_proof_catches_the_same_changes() {
    every_change_caught_and_every_read_reused("proof-logged", &logged_schema()).await;
}

async fn every_change_caught_and_every_read_reused(name: &str, schema: &str) {
    let dir = scratch_dir(name);
    let migrations = dir.join("migrations");
    fs::create_dir_all(&migrations).expect("mkdir");
    fs::write(migrations.join("001.sql"), schema).expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--reuse-unchanged",
            "--template",
            &format!("app=migrations:{}", migrations.display()),
            // One database: the next lease is the released one, or its replacement.
            "--min-ready",
            "1",
            "--max-total",
            "1",
        ])
        .start()
        .await;
    let first = lease(&daemon).await;
    let limit_of = async |lease: &Value| -> i32 {
        connect(lease)
            .await
            .expect("connect")
            .query_one(
                "SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user",
                &[],
            )
            .await
            .expect("the role's limit")
            .get(0)
    };
    let pristine = contents(&connect(&first).await.expect("connect")).await;
    let default_limit = limit_of(&first).await;
    assert_eq!(daemon.release(&id_of(&first), false).await.0, 204);
    let mut current = first["database"].as_str().expect("database").to_owned();

    let mut missed = Vec::new();
    for (what, sql) in CHANGES {
        let lease = lease(&daemon).await;
        assert_eq!(lease["database"], current.as_str());
        let client = connect(&lease).await.expect("connect");
        if let Err(error) = client.batch_execute(sql).await {
            panic!("{what}: {sql}: {error}");
        }
        drop(client);
        assert_eq!(daemon.release(&id_of(&lease), false).await.0, 204);
        let next = self::lease(&daemon).await;
        let next_db = next["database"].as_str().expect("database").to_owned();
        if next_db == current {
            missed.push(*what);
        }
        // Whatever it is, it must be the template's contents.
        let seen = contents(&connect(&next).await.expect("connect")).await;
        assert_eq!(seen, pristine, "after {what}, a lease saw other contents");
        assert_eq!(daemon.release(&id_of(&next), false).await.0, 204);
        current = next_db;
    }
    assert!(missed.is_empty(), "changes taken for unchanged: {missed:?}");

    let mut replaced = Vec::new();
    for (what, sql) in READS {
        let lease = lease(&daemon).await;
        let before = lease["database"].as_str().expect("database").to_owned();
        let client = connect(&lease).await.expect("connect");
        client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        drop(client);
        assert_eq!(daemon.release(&id_of(&lease), false).await.0, 204);
        let next = self::lease(&daemon).await;
        if next["database"] != before.as_str() {
            replaced.push(*what);
        }
        assert_eq!(
            contents(&connect(&next).await.expect("connect")).await,
            pristine
        );
        assert_eq!(daemon.release(&id_of(&next), false).await.0, 204);
    }
    assert!(
        replaced.is_empty(),
        "reads taken for changes: {replaced:?}\n{}",
        daemon.log()
    );

    // A lease with a connection limit of its own reads only: its database comes back with
    // the default limit (the proof says nothing of the role's limit; the recycle resets it).
    let (status, limited) = daemon
        .lease(json!({"template": "app", "wait_ms": 60000, "max_connections": 3}))
        .await;
    assert_eq!(status, 201, "{limited}");
    assert_eq!(limit_of(&limited).await, 3);
    assert_eq!(daemon.release(&id_of(&limited), false).await.0, 204);
    let next = self::lease(&daemon).await;
    assert_eq!(next["database"], limited["database"], "a read was replaced");
    assert_eq!(limit_of(&next).await, default_limit);
    assert_eq!(daemon.release(&id_of(&next), false).await.0, 204);

    // A holder that disappears mid-transaction (its socket closed with a write pending).
    let lease = lease(&daemon).await;
    let before = lease["database"].as_str().expect("database").to_owned();
    let client = connect(&lease).await.expect("connect");
    client
        .batch_execute("BEGIN; INSERT INTO t (note) VALUES ('half')")
        .await
        .expect("begin");
    drop(client);
    assert_eq!(daemon.release(&id_of(&lease), false).await.0, 204);
    let next = self::lease(&daemon).await;
    assert_ne!(
        next["database"],
        before.as_str(),
        "an abandoned write was reused"
    );

    let status = daemon.status().await;
    let limits = &status["limits"];
    assert!(
        limits["reused_unchanged"].as_u64() >= Some(READS.len() as u64 * 2),
        "{limits}"
    );
    assert!(
        limits["replaced_changed"].as_u64() >= Some(CHANGES.len() as u64 + 1),
        "{limits}"
    );
    assert!(daemon.stop().await.success());
    let _ = fs::remove_dir_all(&dir);
}

/// Leases of the randomized test, unless `PGLEASE_PROOF_LEASES` says.
fn proof_leases() -> usize {
    std::env::var("PGLEASE_PROOF_LEASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

/// Four workers lease at once, each running a change or a read picked at random (half and
/// half), and every lease checks at grant that its database is the template's, whole: a
/// database taken for unchanged after a change would show. Counts of reuses and
/// replacements must add up to the releases. No unlogged table: the common case, where
/// the proof checkpoints while other releases and clones run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomized_reads_and_writes_never_reach_the_next_holder() {
    let dir = scratch_dir("proof-random");
    let migrations = dir.join("migrations");
    fs::create_dir_all(&migrations).expect("mkdir");
    fs::write(migrations.join("001.sql"), logged_schema()).expect("write");
    let daemon = std::sync::Arc::new(
        TestDaemon::builder()
            .args([
                "--reuse-unchanged",
                "--template",
                &format!("app=migrations:{}", migrations.display()),
                "--min-ready",
                "2",
                "--max-total",
                "5",
            ])
            .start()
            .await,
    );
    let first = lease(&daemon).await;
    let pristine = contents(&connect(&first).await.expect("connect")).await;
    assert_eq!(daemon.release(&id_of(&first), false).await.0, 204);
    let total = proof_leases();
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let daemon = std::sync::Arc::clone(&daemon);
            let pristine = pristine.clone();
            tokio::spawn(async move {
                let mut changes = 0;
                for n in 0..total / 4 {
                    let lease = lease(&daemon).await;
                    let client = connect(&lease).await.expect("connect");
                    let seen = contents(&client).await;
                    assert_eq!(
                        seen, pristine,
                        "worker {worker}, lease {n}: a changed database was handed out"
                    );
                    let (what, sql) = if rand::rng().random_bool(0.5) {
                        changes += 1;
                        CHANGES[rand::rng().random_range(0..CHANGES.len())]
                    } else {
                        READS[rand::rng().random_range(0..READS.len())]
                    };
                    client
                        .batch_execute(sql)
                        .await
                        .unwrap_or_else(|e| panic!("worker {worker}, lease {n}, {what}: {e}"));
                    drop(client);
                    assert_eq!(daemon.release(&id_of(&lease), false).await.0, 204);
                }
                changes
            })
        })
        .collect();
    let mut changes = 0;
    for worker in workers {
        changes += worker.await.expect("worker");
    }
    // The last releases' proofs may still run: wait until every release is counted.
    let releases = (total / 4 * 4 + 1) as u64;
    let limits = poll_until(Duration::from_secs(30), "every release proven", || async {
        let status = daemon.status().await;
        let limits = status["limits"].clone();
        let counted = limits["reused_unchanged"].as_u64().unwrap_or_default()
            + limits["replaced_changed"].as_u64().unwrap_or_default()
            + limits["replaced_unstamped"].as_u64().unwrap_or_default();
        (counted >= releases).then_some(limits)
    })
    .await;
    let (reused, replaced, unstamped) = (
        limits["reused_unchanged"].as_u64().unwrap_or_default(),
        limits["replaced_changed"].as_u64().unwrap_or_default(),
        limits["replaced_unstamped"].as_u64().unwrap_or_default(),
    );
    assert_eq!(reused + replaced + unstamped, releases, "{limits}");
    // Every change was replaced; a read may be too (a database setting read back is not
    // a change, but nothing else is counted as one), never the reverse.
    assert!(
        replaced + unstamped >= changes,
        "{changes} changes, {replaced} replaced: {limits}"
    );
    eprintln!(
        "{total} leases: {changes} changes, {replaced} replaced, {unstamped} unstamped, {reused} reused"
    );
    let _ = fs::remove_dir_all(&dir);
}
