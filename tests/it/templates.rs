//! Templates: migrations directories and SQL files become template databases the lease role
//! owns; a broken migration fails clearly, leaves nothing behind, and harms no other template.

use std::fs;

use serde_json::json;

use crate::support::{connect, scratch_dir, TestDaemon};

#[tokio::test]
async fn a_migrations_directory_becomes_a_template_owned_by_the_lease_role() {
    let dir = scratch_dir("migrations-ok");
    fs::write(
        dir.join("001_users.sql"),
        "CREATE TABLE users (id serial PRIMARY KEY, name text NOT NULL);\n",
    )
    .expect("write");
    fs::write(
        dir.join("002_seed.sql"),
        "INSERT INTO users (name) VALUES ('ada'), ('grace');\nCREATE INDEX users_name ON users (name);\n",
    )
    .expect("write");
    fs::write(dir.join("README.md"), "not a migration").expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            &format!("app=migrations:{}", dir.display()),
            "--min-ready",
            "1",
        ])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    assert_eq!(lease["template"], "app");
    assert_eq!(lease["fingerprint"].as_str().map(str::len), Some(64));
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one("SELECT count(*) FROM users", &[])
        .await
        .expect("seeded");
    assert_eq!(row.get::<_, i64>(0), 2);
    // Tests can do what tests do: write, alter, truncate, create schemas.
    client
        .batch_execute(
            "INSERT INTO users (name) VALUES ('linus'); ALTER TABLE users ADD COLUMN email text; \
             TRUNCATE users; CREATE SCHEMA scratch; CREATE TABLE scratch.t (x int);",
        )
        .await
        .expect("DDL as the lease role");
    // The template itself refuses connections and is marked a template.
    let template = client
        .query_one(
            "SELECT datistemplate, datallowconn FROM pg_database WHERE datname LIKE 'pglease\\_tpl\\_%' \
             AND datname NOT IN (SELECT datname FROM pg_database WHERE datname = current_database()) \
             ORDER BY datname LIMIT 1",
            &[],
        )
        .await
        .expect("template row");
    assert!(template.get::<_, bool>(0));
    assert!(!template.get::<_, bool>(1));
    let status = daemon.template_status("app").await;
    assert_eq!(status["state"], "ready");
    assert_eq!(status["fingerprint"], lease["fingerprint"]);
}

#[tokio::test]
async fn a_sql_file_template_and_the_default_coexist() {
    let dir = scratch_dir("sql-file");
    let file = dir.join("schema.sql");
    fs::write(
        &file,
        "CREATE TABLE things (id int); INSERT INTO things VALUES (42);",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args(["--template", &format!("schema=sql:{}", file.display())])
        .start()
        .await;
    let lease = daemon.lease_ok("schema").await;
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one("SELECT id FROM things", &[])
        .await
        .expect("read");
    assert_eq!(row.get::<_, i32>(0), 42);
    let empty = daemon.lease_ok("default").await;
    let client = connect(&empty).await.expect("connect");
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .expect("read");
    assert_eq!(row.get::<_, i64>(0), 0, "default is an empty database");
    assert_ne!(lease["fingerprint"], empty["fingerprint"]);
}

#[tokio::test]
async fn a_broken_migration_fails_clearly_and_harms_nothing_else() {
    let dir = scratch_dir("migrations-bad");
    fs::write(dir.join("001_ok.sql"), "CREATE TABLE ok (id int);\n").expect("write");
    fs::write(
        dir.join("002_broken.sql"),
        "CREATE TABLE fine (id int);\n-- a typo follows\nCREAT TABLE broken (id int);\n",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            &format!("broken=migrations:{}", dir.display()),
        ])
        .start()
        .await;
    // Concurrent requests all get the one build's error.
    let (first, second) = tokio::join!(
        daemon.lease(json!({ "template": "broken" })),
        daemon.lease(json!({ "template": "broken" }))
    );
    for (status, body) in [first, second] {
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "template_build_failed");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("002_broken.sql"),
            "names the file: {message}"
        );
        assert!(
            message.contains("syntax error"),
            "has postgres' message: {message}"
        );
        assert!(message.contains("line 3"), "names the line: {message}");
    }
    let status = daemon.template_status("broken").await;
    assert_eq!(status["state"], "failed");
    assert!(status["last_error"]
        .as_str()
        .is_some_and(|e| e.contains("002_broken.sql")));
    // The default template is still served, and no half-built template database is left.
    let lease = daemon.lease_ok("default").await;
    let client = connect(&lease).await.expect("connect");
    let rows = client
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'pglease\\_tpl\\_%'",
            &[],
        )
        .await
        .expect("list");
    assert_eq!(rows.len(), 1, "only the default template exists");

    // Fixing the file lets the next request build it.
    fs::write(dir.join("002_broken.sql"), "CREATE TABLE fine (id int);\n").expect("write");
    let fixed = daemon.lease_ok("broken").await;
    let client = connect(&fixed).await.expect("connect");
    client
        .query_one("SELECT count(*) FROM fine", &[])
        .await
        .expect("built");
}

#[tokio::test]
async fn a_missing_migrations_directory_is_a_clear_error() {
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            "ghost=migrations:/nonexistent/pglease-migrations",
        ])
        .start()
        .await;
    let (status, body) = daemon.lease(json!({ "template": "ghost" })).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("/nonexistent/pglease-migrations")));
}

#[tokio::test]
async fn prebuild_builds_every_template_before_the_first_lease() {
    let dir = scratch_dir("prebuild");
    fs::write(dir.join("001.sql"), "CREATE TABLE pre (id int);").expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--prebuild",
            "--min-ready",
            "1",
            "--template",
            &format!("pre=migrations:{}", dir.display()),
        ])
        .start()
        .await;
    let status = crate::support::poll_until(
        std::time::Duration::from_secs(20),
        "the prebuilt template",
        || async {
            let status = daemon.template_status("pre").await;
            (status["state"] == "ready" && status["ready"] == 1).then_some(status)
        },
    )
    .await;
    assert_eq!(status["leased"], 0, "nobody leased it yet");
}

#[tokio::test]
async fn a_migration_that_hangs_is_stopped_at_the_build_timeout() {
    let dir = scratch_dir("migrations-hang");
    fs::write(
        dir.join("001_slow.sql"),
        "CREATE TABLE t (id int);\nSELECT pg_sleep(60);\n",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--build-timeout",
            "1",
            "--template",
            &format!("slow=migrations:{}", dir.display()),
        ])
        .start()
        .await;
    let started = std::time::Instant::now();
    let (status, body) = daemon.lease(json!({ "template": "slow" })).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("within 1 s")),
        "{body}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // The half-built template is gone, its sleeping backend with it; the default still serves.
    let lease = daemon.lease_ok("default").await;
    let client = connect(&lease).await.expect("connect");
    crate::support::poll_until(std::time::Duration::from_secs(10), "the template and its backend to go", || async {
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM pg_database WHERE datname LIKE 'pglease\\_tpl\\_%'), \
                        (SELECT count(*) FROM pg_stat_activity WHERE datname LIKE 'pglease\\_tpl\\_%')",
                &[],
            )
            .await
            .expect("query");
        (row.get::<_, i64>(0) == 1 && row.get::<_, i64>(1) == 0).then_some(())
    })
    .await;
    assert_eq!(daemon.template_status("slow").await["state"], "failed");
}

/// A newcomer's `pglease run --template app` on a daemon that never defined `app`: the 404
/// names the templates there are and the three ways to define one (issue 26).
#[tokio::test]
async fn an_unknown_template_is_answered_with_those_there_are_and_how_to_define_one() {
    let daemon = TestDaemon::builder()
        .args(["--template", "users=empty"])
        .start()
        .await;
    let (code, body) = daemon.lease(json!({ "template": "app" })).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_template", "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    for wanted in [
        "unknown template \"app\"",
        "templates here: default, users",
        "--template app=migrations:DIR",
        "[templates.app]",
        "PUT /templates/app",
    ] {
        assert!(message.contains(wanted), "{wanted:?} not in {message:?}");
    }
    assert!(!message.contains("did you mean"), "{message}");
    // A misspelt name gets the nearest one.
    let (code, body) = daemon.lease(json!({ "template": "usres" })).await;
    assert_eq!(code, 404, "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains("did you mean \"users\"?"), "{message}");
    let out = crate::cli::output_of(&daemon, &["run", "--template", "app", "--", "true"]).await;
    assert!(
        !out.status.success(),
        "run must fail for an unknown template"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("404"), "{stderr}");
    assert!(
        stderr.contains("templates here: default, users"),
        "{stderr}"
    );
    assert!(stderr.contains("--template app=migrations:DIR"), "{stderr}");
}
