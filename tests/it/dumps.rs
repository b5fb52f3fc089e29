//! Templates from a `pg_dump` output (`NAME=dump:PATH`): every format restores (custom and
//! directory with pg_restore -j, tar, plain SQL and gzipped plain SQL with psql), the
//! restored objects belong to the owner role (a lease may alter them), and a corrupt dump
//! fails its requests with 422 and pg_restore's words while the daemon serves the rest.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support::{connect, poll_until, scratch_dir, tool_available, TestDaemon};

const ROWS: i64 = 1000;

/// Runs a shell command; panics with its output unless it succeeds.
fn sh(script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pg_dump -Fc` of a lease's database into `path`, then the source daemon stops.
async fn dump_lease(
    source: TestDaemon,
    lease: &serde_json::Value,
    path: &Path,
) -> std::path::PathBuf {
    let url = lease["url"].as_str().expect("url").to_owned();
    let script = format!("pg_dump -Fc -f {} '{url}'", path.display());
    tokio::task::spawn_blocking(move || sh(&script))
        .await
        .expect("join");
    assert!(source.stop().await.success());
    path.to_path_buf()
}

/// Dumps of a small schema with data, made by pg_dump from a lease, in every format.
async fn dumps(dir: &Path) -> Vec<(&'static str, String)> {
    let schema = dir.join("schema.sql");
    fs::write(
        &schema,
        format!(
            "CREATE TABLE orders (id int PRIMARY KEY, note text NOT NULL);\n\
             CREATE INDEX orders_note ON orders (note);\n\
             CREATE VIEW big_orders AS SELECT * FROM orders WHERE id > 500;\n\
             INSERT INTO orders SELECT i, 'order ' || i FROM generate_series(1, {ROWS}) i;\n"
        ),
    )
    .expect("write");
    let source = TestDaemon::builder()
        .args(["--template", &format!("src=sql:{}", schema.display())])
        .start()
        .await;
    let lease = source.lease_ok("src").await;
    let url = lease["url"].as_str().expect("url").to_owned();
    let d = dir.display();
    let made = vec![
        (
            "custom",
            format!("{d}/db.dump"),
            format!("pg_dump -Fc -f {d}/db.dump '{url}'"),
        ),
        (
            "directory",
            format!("{d}/db.dir"),
            // pg_dump makes the directory 0700; the daemon reads dumps as its child user
            // (nobody, when the tests run as root), like any file a caller names.
            format!("pg_dump -Fd -f {d}/db.dir '{url}' && chmod -R a+rX {d}/db.dir"),
        ),
        (
            "tar",
            format!("{d}/db.tar"),
            format!("pg_dump -Ft -f {d}/db.tar '{url}'"),
        ),
        (
            "plain",
            format!("{d}/db.sql"),
            format!("pg_dump -Fp -f {d}/db.sql '{url}'"),
        ),
        (
            "plaingz",
            format!("{d}/db.sql.gz"),
            format!("pg_dump -Fp '{url}' | gzip > {d}/db.sql.gz"),
        ),
    ];
    let out: Vec<(&'static str, String)> = tokio::task::spawn_blocking(move || {
        made.into_iter()
            .map(|(name, path, script)| {
                sh(&script);
                (name, path)
            })
            .collect()
    })
    .await
    .expect("join");
    assert!(source.stop().await.success());
    out
}

#[tokio::test]
async fn every_dump_format_restores_into_a_template_leases_can_alter() {
    let test = "every_dump_format_restores_into_a_template_leases_can_alter";
    if !tool_available("pg_dump", test, "install postgresql-client") {
        return;
    }
    let dir = scratch_dir("dumps");
    let dumps = dumps(&dir).await;
    let corrupt = dir.join("corrupt.dump");
    fs::write(&corrupt, b"PGDMP\x01\x0e\x00 this is not a dump").expect("write");
    let mut args: Vec<String> = dumps
        .iter()
        .flat_map(|(name, path)| ["--template".to_owned(), format!("{name}=dump:{path}")])
        .collect();
    args.extend([
        "--template".to_owned(),
        format!("corrupt=dump:{}", corrupt.display()),
        "--min-ready".to_owned(),
        "1".to_owned(),
    ]);
    let daemon = TestDaemon::builder().args(args).start().await;
    for (name, _) in &dumps {
        let (status, lease) = daemon
            .lease(json!({"template": name, "wait_ms": 120000}))
            .await;
        assert_eq!(status, 201, "{name}: {lease}\n{}", daemon.log());
        let client = connect(&lease).await.expect("connect");
        let count: i64 = client
            .query_one("SELECT count(*) FROM big_orders", &[])
            .await
            .expect("the view")
            .get(0);
        assert_eq!(count, ROWS - 500, "{name}");
        // The template was vacuumed (frozen: every page all-visible) and analyzed after the
        // restore, so the clone reads without setting hint bits and plans with statistics.
        let settled = client
            .query_one(
                "SELECT relpages > 0 AND relallvisible = relpages, \
                        EXISTS (SELECT FROM pg_stats WHERE tablename = 'orders') \
                 FROM pg_class WHERE relname = 'orders'",
                &[],
            )
            .await
            .expect("pg_class");
        assert_eq!(
            (settled.get::<_, bool>(0), settled.get::<_, bool>(1)),
            (true, true),
            "{name}: not vacuumed and analyzed"
        );
        client
            .batch_execute("ALTER TABLE orders ADD COLUMN paid bool; TRUNCATE orders")
            .await
            .unwrap_or_else(|e| panic!("{name}: a lease owns the restored table: {e}"));
    }
    let log = daemon.log();
    assert!(
        log.contains("format=Custom") && log.contains("pg_restore (PostgreSQL)"),
        "{log}"
    );
    // Custom and directory dumps in parallel (on one core, one job is all there is).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 1 {
        assert!(log.contains(&format!("--jobs {cores}")), "{log}");
    }

    // A corrupt dump: 422 with pg_restore's words, and the others are still served.
    let (status, body) = daemon.lease(json!({"template": "corrupt"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "template_build_failed");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("corrupt.dump") && message.contains("pg_restore"),
        "{message}"
    );
    daemon.lease_ok("plain").await;

    // Over HTTP too; bad bodies are refused with a reason.
    let (status, body) = daemon
        .put_template("restored", json!({"dump": dumps[0].1, "jobs": 2}))
        .await;
    assert_eq!(status, 201, "{body}");
    let lease = daemon.lease_ok("restored").await;
    connect(&lease).await.expect("connect");
    for (bad, why) in [
        (json!({"dump": "db.dump"}), "absolute"),
        (json!({"dump": dumps[0].1, "sql": dumps[3].1}), "one of"),
        (json!({"dump": dumps[0].1, "jobs": 0}), "jobs"),
        (json!({"sql": dumps[3].1, "jobs": 2}), "jobs goes with dump"),
    ] {
        let (status, body) = daemon.put_template("bad", bad.clone()).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(body.to_string().contains(why), "{bad}: {body}");
    }
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_long_restore_logs_its_progress() {
    let test = "a_long_restore_logs_its_progress";
    if !tool_available("pg_dump", test, "install postgresql-client") {
        return;
    }
    let dir = scratch_dir("dump-progress");
    // An index whose every entry costs 10 ms: building it takes 7 s, in the restore too.
    let schema = dir.join("schema.sql");
    fs::write(
        &schema,
        "CREATE FUNCTION slow(i int) RETURNS int LANGUAGE sql IMMUTABLE \
           AS $$ SELECT i FROM pg_sleep(0.01) $$;\n\
         CREATE TABLE t (id int);\n\
         INSERT INTO t SELECT generate_series(1, 700);\n\
         CREATE INDEX t_slow ON t (slow(id));\n",
    )
    .expect("write");
    let source = TestDaemon::builder()
        .args(["--template", &format!("src=sql:{}", schema.display())])
        .start()
        .await;
    let (status, lease) = source
        .lease(json!({"template": "src", "wait_ms": 120000}))
        .await;
    assert_eq!(status, 201, "{lease}");
    let dump = dump_lease(source, &lease, &dir.join("slow.dump")).await;

    let daemon = TestDaemon::builder()
        .args(["--template", &format!("slow=dump:{}", dump.display())])
        .start()
        .await;
    let lease = daemon.lease_in_background(json!({"template": "slow", "wait_ms": 120000}));
    // While it restores, GET /templates/{name} says where it is.
    let progress = poll_until(
        Duration::from_secs(60),
        "progress in GET /templates/slow",
        || async {
            let template = daemon.template_status("slow").await;
            let progress = template["progress"].clone();
            (template["state"] == "building" && progress["total"].as_u64().is_some_and(|t| t > 0))
                .then_some(progress)
        },
    )
    .await;
    assert!(
        progress["step"]
            .as_str()
            .is_some_and(|s| s.contains("slow.dump")),
        "{progress}"
    );
    assert!(
        progress["percent"].as_u64().is_some_and(|p| p < 100),
        "{progress}"
    );
    let answer = lease.await.expect("join");
    assert_eq!(answer.status, 201, "{}", answer.body);
    // ... and nothing once it is built.
    let template = daemon.template_status("slow").await;
    assert_eq!(template["state"], "ready", "{template}");
    assert!(template.get("progress").is_none(), "{template}");
    let log = daemon.log();
    let progress = log
        .lines()
        .find(|l| l.contains("restoring") && l.contains("entries") && l.contains("percent="))
        .unwrap_or_else(|| panic!("no progress line while the restore ran:\n{log}"));
    assert!(progress.contains("eta_s="), "{progress}");
    eprintln!("{progress}");
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_dump_naming_missing_roles_restores_and_a_template_too_big_for_its_clones_is_told() {
    let test = "a_dump_naming_missing_roles_restores_and_a_template_too_big_for_its_clones_is_told";
    if !tool_available("pg_dump", test, "install postgresql-client") {
        return;
    }
    let dir = scratch_dir("dump-roles");
    // A dump whose objects name a role this server will not have: owner and grantee.
    let source = TestDaemon::builder()
        .args(["--lease-superuser"])
        .start()
        .await;
    let lease = source.lease_ok("default").await;
    connect(&lease)
        .await
        .expect("connect")
        .batch_execute(
            "CREATE ROLE reporting_ro; \
             CREATE TABLE orders (id int PRIMARY KEY); \
             INSERT INTO orders SELECT generate_series(1, 100); \
             ALTER TABLE orders OWNER TO reporting_ro; \
             GRANT SELECT ON orders TO PUBLIC;",
        )
        .await
        .expect("the source's objects");
    let dump = dump_lease(source, &lease, &dir.join("roles.dump")).await;

    // A budget that holds the default template and its two warm clones, and this template,
    // but not two clones of it beside them: said when it is built.
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            &format!("roles=dump:{}", dump.display()),
            "--min-ready",
            "2",
            "--max-bytes",
            "40M",
        ])
        .start()
        .await;
    let (status, lease) = daemon
        .lease(json!({"template": "roles", "wait_ms": 60000}))
        .await;
    assert_eq!(status, 201, "{lease}\n{}", daemon.log());
    let client = connect(&lease).await.expect("connect");
    let count: i64 = client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .expect("restored without its owner role")
        .get(0);
    assert_eq!(count, 100);
    client
        .batch_execute("ALTER TABLE orders ADD COLUMN paid bool")
        .await
        .expect("owned by the owner role, so a lease may alter it");
    let log = daemon.log();
    assert!(
        log.contains("do not fit in the byte budget") && log.contains("template roles"),
        "{log}"
    );
    assert!(daemon.stop().await.success());
}
