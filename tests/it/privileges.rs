//! What a template may do: its SQL runs as a role that owns the template's objects and
//! nothing more, never as postgres' superuser — whoever registers it (over HTTP, without a
//! token on loopback), whatever it says (`RESET ROLE` included). Only the operator can
//! grant a template the superuser (`superuser = true` in the configuration file, or over
//! HTTP with --allow-http-commands). A lease holder cannot plant SQL the daemon later runs
//! with its rights, and a client building its own template (IntegreSQL API) gets no more.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{connect, scratch_dir, PlainPostgres, TestDaemon};

/// A scratch directory anyone may write to: a program a trap makes postgres run must be able
/// to leave its mark there, or a sprung trap would go unseen.
fn open_dir(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// Registers `sql` as template `name` over HTTP and asks for a lease of it: the build must
/// fail with postgres' permission error.
async fn refused(daemon: &TestDaemon, dir: &Path, name: &str, sql: &str) -> String {
    let file = dir.join(format!("{name}.sql"));
    fs::write(&file, sql).expect("write");
    let (status, body) = daemon.put_template(name, json!({ "sql": file })).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = daemon
        .lease(json!({ "template": name, "wait_ms": 30000 }))
        .await;
    assert_eq!(status, 422, "{name} must not build: {body}");
    assert_eq!(body["error"]["code"], "template_build_failed");
    let message = body["error"]["message"].as_str().unwrap_or("").to_owned();
    assert!(
        message.contains("permission denied")
            || message.contains("must be superuser")
            || message.contains("must be owner"),
        "{name}: postgres' permission error expected, got: {message}"
    );
    message
}

#[tokio::test]
async fn a_template_cannot_reach_the_superuser() {
    let dir = open_dir("privileges");
    let marker = dir.join("ran-as-postgres");
    let daemon = TestDaemon::start().await;
    // The reproduction: undo the role switch, then run a program on the server.
    let message = refused(
        &daemon,
        &dir,
        "evil-program",
        &format!(
            "RESET ROLE; COPY (SELECT 1) TO PROGRAM 'touch {}';",
            marker.display()
        ),
    )
    .await;
    assert!(message.contains("evil-program.sql"), "{message}");
    assert!(!marker.exists(), "the program ran");
    // (ALTER SYSTEM cannot run in a file's transaction at all; the client-built test
    // below tries it on a connection of its own.)
    refused(
        &daemon,
        &dir,
        "evil-database",
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET work_mem = ''1GB''', current_database()); END $$;",
    )
    .await;
    refused(
        &daemon,
        &dir,
        "evil-extension",
        "CREATE EXTENSION file_fdw;",
    )
    .await;
    refused(
        &daemon,
        &dir,
        "evil-read",
        "SELECT pg_read_file('/etc/passwd');",
    )
    .await;
    refused(
        &daemon,
        &dir,
        "evil-copy",
        "CREATE TABLE t (line text); COPY t FROM '/etc/passwd';",
    )
    .await;
    refused(&daemon, &dir, "evil-role", "SET ROLE postgres;").await;
    refused(
        &daemon,
        &dir,
        "evil-none",
        &format!(
            "SET ROLE NONE; COPY (SELECT 1) TO PROGRAM 'touch {}';",
            marker.display()
        ),
    )
    .await;
    refused(
        &daemon,
        &dir,
        "evil-grant",
        "ALTER ROLE CURRENT_USER SUPERUSER;",
    )
    .await;
    // A migrations directory runs the same way.
    let migrations = dir.join("migrations");
    fs::create_dir_all(&migrations).expect("mkdir");
    fs::write(migrations.join("001_ok.sql"), "CREATE TABLE fine (id int);").expect("write");
    fs::write(
        migrations.join("002_evil.sql"),
        format!(
            "RESET ROLE; COPY (SELECT 1) TO PROGRAM 'touch {}';",
            marker.display()
        ),
    )
    .expect("write");
    let (status, body) = daemon
        .put_template("evil-migrations", json!({ "migrations": migrations }))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = daemon
        .lease(json!({ "template": "evil-migrations", "wait_ms": 30000 }))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(!marker.exists(), "the program ran");
    // What a template may do still works: own its objects, trusted extensions.
    let good = dir.join("good.sql");
    fs::write(
        &good,
        "CREATE EXTENSION pgcrypto; CREATE TABLE items (id uuid DEFAULT gen_random_uuid());",
    )
    .expect("write");
    let (status, _) = daemon.put_template("good", json!({ "sql": good })).await;
    assert_eq!(status, 201);
    let lease = daemon.lease_ok("good").await;
    let client = connect(&lease).await.expect("connect");
    client
        .batch_execute("INSERT INTO items DEFAULT VALUES; TRUNCATE items; DROP TABLE items;")
        .await
        .expect("a lease owns the template's objects");
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn only_the_operator_can_give_a_template_the_superuser() {
    let dir = scratch_dir("privileges-operator");
    let ext = dir.join("ext.sql");
    // Its sessions act as pglease_owner until the SQL says SET ROLE NONE.
    fs::write(
        &ext,
        "SET ROLE NONE; CREATE EXTENSION file_fdw; SET ROLE pglease_owner; CREATE TABLE items (id int);",
    )
    .expect("write");
    let config = dir.join("pglease.toml");
    fs::write(
        &config,
        format!(
            "[templates.ext]\nsql = \"{}\"\nsuperuser = true\n",
            ext.display()
        ),
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args(["--config", config.to_str().expect("utf8")])
        .start()
        .await;
    let lease = daemon.lease_ok("ext").await;
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_extension WHERE extname = 'file_fdw'",
            &[],
        )
        .await
        .expect("query");
    assert_eq!(row.get::<_, i64>(0), 1, "the configured template got it");
    client
        .batch_execute("INSERT INTO items VALUES (1); TRUNCATE items;")
        .await
        .expect("what it made as the owner role, a lease owns");
    let owner = client
        .query_one(
            "SELECT pg_get_userbyid(fdwowner) FROM pg_foreign_data_wrapper WHERE fdwname = 'file_fdw'",
            &[],
        )
        .await
        .expect("query");
    assert_eq!(
        owner.get::<_, String>(0),
        "postgres",
        "what it made as the superuser stays the superuser's"
    );
    // Over HTTP the flag needs the operator's consent.
    let (status, body) = daemon
        .put_template("ext2", json!({ "sql": ext, "superuser": true }))
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--allow-http-commands")),
        "{body}"
    );
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_lease_holder_cannot_plant_sql_for_the_daemon() {
    let dir = open_dir("privileges-traps");
    let marker = dir.join("trap-sprung");
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "1", "--max-total", "2"])
        .start()
        .await;
    for round in 0..2 {
        let lease = daemon.lease_ok("default").await;
        let database = lease["database"].as_str().expect("database").to_owned();
        let client = connect(&lease).await.expect("connect");
        // Functions shadowing what an administrator's SQL calls, which only a superuser
        // could run through, and a search path that puts them first for everyone who
        // enters this database or is this role.
        let trap = format!(
            "BEGIN COPY (SELECT 1) TO PROGRAM 'touch {}'; RETURN {{}}; END;",
            marker.display()
        );
        client
            .batch_execute(&format!(
                "CREATE OR REPLACE FUNCTION public.pg_terminate_backend(integer) RETURNS boolean \
                   LANGUAGE plpgsql SECURITY DEFINER AS $${t}$$; \
                 CREATE OR REPLACE FUNCTION public.count(text) RETURNS bigint \
                   LANGUAGE plpgsql AS $${c}$$; \
                 CREATE OR REPLACE FUNCTION public.current_setting(text) RETURNS text \
                   LANGUAGE plpgsql AS $${s}$$; \
                 ALTER DATABASE \"{database}\" SET search_path = public, pg_catalog; \
                 ALTER ROLE CURRENT_USER SET search_path = public, pg_catalog;",
                t = trap.replace("{}", "true"),
                c = trap.replace("{}", "0"),
                s = trap.replace("{}", "''"),
            ))
            .await
            .expect("a lease holder may do this in its own database");
        drop(client);
        // Reuse recycles it (the daemon locks the holder out and ends its sessions); the
        // second round drops it. The second round may be handed the recycled database
        // (whichever is ready first), traps and all: hence OR REPLACE above.
        let (status, _) = daemon
            .release(lease["id"].as_str().expect("id"), round == 0)
            .await;
        assert_eq!(status, 204);
    }
    // Whatever the daemon did with those databases, no trap ran with its rights.
    for _ in 0..4 {
        let lease = daemon.lease_ok("default").await;
        let (status, _) = daemon
            .release(lease["id"].as_str().expect("id"), true)
            .await;
        assert_eq!(status, 204);
    }
    assert!(!marker.exists(), "a trap ran as the superuser");
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_client_built_template_gets_no_superuser_either() {
    let daemon = TestDaemon::start().await;
    let (status, template) = daemon
        .send(
            daemon
                .http
                .post(format!("{}/api/v1/templates", daemon.base))
                .json(&json!({ "hash": "f00d" })),
        )
        .await;
    assert_eq!(status, 200, "{template}");
    let config = &template["database"]["config"];
    let url = format!(
        "postgres://{}:{}@{}:{}/{}",
        config["username"].as_str().expect("username"),
        config["password"].as_str().expect("password"),
        config["host"].as_str().expect("host"),
        config["port"],
        config["database"].as_str().expect("database"),
    );
    let client = connect(&json!({ "url": url }))
        .await
        .expect("the initialize answer's credentials connect");
    let row = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = session_user",
            &[],
        )
        .await
        .expect("query");
    assert!(!row.get::<_, bool>(0), "the migrating role is no superuser");
    for sql in [
        "RESET ROLE; COPY (SELECT 1) TO PROGRAM 'true';",
        "ALTER SYSTEM SET work_mem = '1GB';",
        "SELECT pg_read_file('/etc/passwd');",
        "SET ROLE postgres;",
    ] {
        let error = client.batch_execute(sql).await.expect_err(sql);
        let message = error.as_db_error().map(|e| e.message().to_owned());
        assert!(
            message.as_deref().is_some_and(|m| m.contains("must be superuser")
                || m.contains("permission denied")),
            "{sql}: {error:?}"
        );
    }
    assert!(daemon.stop().await.success());
}

/// On an external server whose `postgres` database anyone may create in (clusters from
/// before PostgreSQL 15), a lease holder plants a function shadowing one the daemon's sweep
/// calls as the superuser at the next start; the daemon's pinned search_path never finds it.
#[tokio::test]
async fn a_trap_in_an_external_servers_admin_database_is_not_run_by_the_sweep() {
    let dir = open_dir("privileges-admin-trap");
    let server = PlainPostgres::start("admin-trap");
    server
        .connect()
        .await
        .batch_execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        .await
        .expect("grant");
    let args = ["--postgres-url".to_owned(), server.url()];
    let daemon = TestDaemon::builder().args(args.clone()).start().await;
    let lease = daemon.lease_ok("default").await;
    let mut config = tokio_postgres::Config::new();
    config
        .host(lease["host"].as_str().expect("host"))
        .port(server.port)
        .user(lease["user"].as_str().expect("user"))
        .password(lease["password"].as_str().expect("password"))
        .dbname("postgres");
    let (holder, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("the lease role opens postgres on this server");
    tokio::spawn(connection);
    // A better match than the catalog's shobj_description(oid, name) for a text literal.
    holder
        .batch_execute(&format!(
            "CREATE FUNCTION public.shobj_description(oid, text) RETURNS text LANGUAGE plpgsql AS $$
             BEGIN
               BEGIN
                 EXECUTE 'COPY (SELECT 1) TO PROGRAM ''touch {}/sprung''';
               EXCEPTION WHEN insufficient_privilege THEN NULL;
               END;
               RETURN NULL;
             END $$;",
            dir.display()
        ))
        .await
        .expect("plant the trap");
    drop(holder);
    assert!(daemon.stop().await.success());
    // The next start sweeps what the last one left, reading comments as the superuser.
    let daemon = TestDaemon::builder().args(args).start().await;
    daemon.lease_ok("default").await;
    assert!(
        !dir.join("sprung").exists(),
        "the sweep ran the holder's function as the superuser"
    );
    assert!(daemon.stop().await.success());
}
