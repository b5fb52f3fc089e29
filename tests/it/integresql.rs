//! The IntegreSQL v1 API against a real daemon and postgres: every route and status code
//! of its contract (shared/integresql-api-v1.md), concurrent initializers, getters waiting
//! for finalize, discard while they wait, unlock and recreate, the reset, never-returned
//! test databases, the native API's view, the separate port, and a restart.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{poll_until, TestDaemon, INTEGRESQL_ROLE_ARGS};

/// A client of the IntegreSQL routes of one daemon.
struct Compat<'a> {
    daemon: &'a TestDaemon,
    base: String,
}

impl<'a> Compat<'a> {
    /// The routes under the daemon's main port.
    fn new(daemon: &'a TestDaemon) -> Self {
        Compat {
            daemon,
            base: format!("{}/api/v1", daemon.base),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .daemon
            .http
            .request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.daemon.send(request).await
    }

    async fn initialize(&self, hash: &str) -> (u16, Value) {
        self.call("POST", "/templates", Some(json!({ "hash": hash })))
            .await
    }

    async fn finalize(&self, hash: &str) -> u16 {
        self.call("PUT", &format!("/templates/{hash}"), None)
            .await
            .0
    }

    async fn test_database(&self, hash: &str) -> (u16, Value) {
        self.call("GET", &format!("/templates/{hash}/tests"), None)
            .await
    }

    /// `GET …/tests` from a background task (it is meant to wait).
    fn test_database_in_background(&self, hash: &str) -> tokio::task::JoinHandle<(u16, Value)> {
        let request = self
            .daemon
            .http
            .get(format!("{}/templates/{hash}/tests", self.base));
        tokio::spawn(async move {
            let response = request.send().await.expect("request");
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
    }
}

/// Connects with a TemplateDatabase's or TestDatabase's config.
async fn connect(answer: &Value) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let config = &answer["database"]["config"];
    let mut pg = tokio_postgres::Config::new();
    pg.host(config["host"].as_str().expect("host"))
        .port(config["port"].as_u64().expect("port") as u16)
        .user(config["username"].as_str().expect("username"))
        .password(config["password"].as_str().expect("password"))
        .dbname(config["database"].as_str().expect("database"));
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Initializes `hash`, creates table `items` with one row as the client, finalizes.
async fn build(compat: &Compat<'_>, hash: &str) {
    let (status, template) = compat.initialize(hash).await;
    assert_eq!(status, 200, "{template}");
    let client = connect(&template)
        .await
        .expect("connect as the migrating client");
    client
        .batch_execute("CREATE TABLE items (id int); INSERT INTO items VALUES (1);")
        .await
        .expect("migrate");
    // Finalize with the connection still open, as clients with a pool do.
    assert_eq!(compat.finalize(hash).await, 204);
}

async fn count_items(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM items", &[])
        .await
        .expect("count")
        .get(0)
}

#[tokio::test]
async fn initialize_migrate_finalize_then_test_databases_with_their_shape() {
    let daemon = TestDaemon::start().await;
    let compat = Compat::new(&daemon);
    let (status, template) = compat.initialize("0a1b2c").await;
    assert_eq!(status, 200, "{template}");
    assert_eq!(template["database"]["templateHash"], "0a1b2c");
    let config = &template["database"]["config"];
    for field in ["host", "port", "username", "password", "database"] {
        assert!(!config[field].is_null(), "config lacks {field}: {template}");
    }
    assert_eq!(config["additionalParams"]["sslmode"], "disable");
    // Getters before finalize wait for it.
    let early = compat.test_database_in_background("0a1b2c");
    let migrator = connect(&template)
        .await
        .expect("the template's credentials work");
    migrator
        .batch_execute("CREATE TABLE items (id int); INSERT INTO items VALUES (1), (2);")
        .await
        .expect("migrate");
    // The getter has reached the pool, which holds it as waiting (it counts in /status);
    // unanswered meanwhile, it waits for finalize.
    daemon.wait_for_waiting("0a1b2c", 1).await;
    assert!(!early.is_finished(), "a getter must wait for finalize");
    assert_eq!(compat.finalize("0a1b2c").await, 204);
    assert_eq!(
        compat.finalize("0a1b2c").await,
        204,
        "finalizing twice is fine"
    );
    let (status, test) = tokio::time::timeout(Duration::from_secs(30), early)
        .await
        .expect("the waiting getter is answered")
        .expect("join");
    assert_eq!(status, 200, "{test}");
    assert!(test["id"].is_u64(), "integer id: {test}");
    assert_eq!(test["database"]["templateHash"], "0a1b2c");
    let client = connect(&test)
        .await
        .expect("the test database's credentials work");
    assert_eq!(
        count_items(&client).await,
        2,
        "the migration is in the clone"
    );
    // The migrator was locked out at finalize; its credentials open nothing now.
    assert!(connect(&template).await.is_err());
    // Parallel test databases: distinct databases and ids.
    let mut handles = Vec::new();
    for _ in 0..8 {
        handles.push(compat.test_database_in_background("0a1b2c"));
    }
    let mut ids = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    for handle in handles {
        let (status, test) = handle.await.expect("join");
        assert_eq!(status, 200, "{test}");
        ids.insert(test["id"].as_u64().expect("id"));
        names.insert(test["database"]["config"]["database"].to_string());
    }
    assert_eq!((ids.len(), names.len()), (8, 8));
    // Unknown hashes.
    assert_eq!(compat.finalize("ffff").await, 404);
    assert_eq!(compat.test_database("ffff").await.0, 404);
    let (status, body) = compat.call("DELETE", "/templates/ffff", None).await;
    assert_eq!(status, 404);
    assert!(body["message"].is_string(), "{body}");
    let (status, body) = compat.call("POST", "/templates", Some(json!({}))).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (400, Some("hash is required"))
    );
}

#[tokio::test]
async fn of_concurrent_initializers_exactly_one_gets_the_template() {
    let daemon = TestDaemon::start().await;
    let mut handles = Vec::new();
    for _ in 0..10 {
        let request = daemon
            .http
            .post(format!("{}/api/v1/templates", daemon.base))
            .json(&json!({"hash": "race"}));
        handles.push(tokio::spawn(async move {
            request.send().await.expect("request").status().as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for handle in handles {
        statuses.push(handle.await.expect("join"));
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 423).count(),
        9,
        "{statuses:?}"
    );
    // Once finalized it is still "initialized" for everyone.
    let compat = Compat::new(&daemon);
    assert_eq!(compat.finalize("race").await, 204);
    assert_eq!(compat.initialize("race").await.0, 423);
}

#[tokio::test]
async fn discard_answers_waiting_and_later_getters_410_until_initialized_again() {
    let daemon = TestDaemon::start().await;
    let compat = Compat::new(&daemon);
    assert_eq!(compat.initialize("gone").await.0, 200);
    let waiting = [
        compat.test_database_in_background("gone"),
        compat.test_database_in_background("gone"),
    ];
    poll_until(Duration::from_secs(10), "two getters waiting", || async {
        let status = daemon.template_status("gone").await;
        (status["waiting"] == 2).then_some(())
    })
    .await;
    assert_eq!(compat.call("DELETE", "/templates/gone", None).await.0, 204);
    for handle in waiting {
        let (status, body) = handle.await.expect("join");
        assert_eq!(status, 410, "{body}");
    }
    assert_eq!(compat.test_database("gone").await.0, 410);
    assert_eq!(compat.call("DELETE", "/templates/gone", None).await.0, 404);
    // The hash is free again.
    build(&compat, "gone").await;
    let (status, test) = compat.test_database("gone").await;
    assert_eq!(status, 200, "{test}");
}

#[tokio::test]
async fn unlock_returns_a_database_as_is_and_recreate_replaces_it() {
    // Warm clones are ready too: a database given back unchanged must still come first.
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "3"])
        .start()
        .await;
    let compat = Compat::new(&daemon);
    build(&compat, "cafe").await;
    let (_, first) = compat.test_database("cafe").await;
    let id = first["id"].as_u64().expect("id");
    let client = connect(&first).await.expect("connect");
    assert_eq!(count_items(&client).await, 1, "a read-only test");
    // Still connected: 423, and the database stays the holder's.
    let unlock = format!("/templates/cafe/tests/{id}/unlock");
    let (status, body) = compat.call("POST", &unlock, None).await;
    assert_eq!(status, 423, "{body}");
    // Given back right after disconnecting, as clients do: the backend still exiting
    // is waited for, not answered with 423. Temporary tables make that exit slow
    // (the backend drops them on its way out), so the race is certain.
    client
        .batch_execute(
            "DO $$ BEGIN FOR i IN 1..300 LOOP \
             EXECUTE format('CREATE TEMP TABLE t%s (a int PRIMARY KEY)', i); END LOOP; END $$",
        )
        .await
        .expect("temporary tables");
    drop(client);
    let (status, body) = compat.call("POST", &unlock, None).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        compat.call("POST", &unlock, None).await.0,
        404,
        "unlocked already"
    );
    // The same database comes back first, under the same id, with a new password (as
    // IntegreSQL hands back the same id; clients name databases by it).
    let (_, second) = compat.test_database("cafe").await;
    assert_eq!(
        second["database"]["config"]["database"],
        first["database"]["config"]["database"]
    );
    assert_eq!(second["id"], first["id"]);
    assert_ne!(
        second["database"]["config"]["password"],
        first["database"]["config"]["password"]
    );
    assert!(connect(&first).await.is_err(), "the old password is void");
    let client = connect(&second).await.expect("connect");
    client
        .batch_execute("INSERT INTO items VALUES (99)")
        .await
        .expect("write");
    let id = second["id"].as_u64().expect("id");
    let recreate = format!("/templates/cafe/tests/{id}/recreate");
    assert_eq!(
        compat.call("POST", &recreate, None).await.0,
        423,
        "still connected"
    );
    drop(client);
    let (status, body) = compat.call("POST", &recreate, None).await;
    assert_eq!(status, 204, "{body}");
    // Recreated from the template: the next one has no trace of the write, and carries
    // the recreated one's id (IntegreSQL recreates a test database under its id).
    let (_, third) = compat.test_database("cafe").await;
    let client = connect(&third).await.expect("connect");
    assert_eq!(count_items(&client).await, 1);
    assert_eq!(third["id"], second["id"], "the recreated id");
    assert_ne!(
        third["database"]["config"]["database"], second["database"]["config"]["database"],
        "a new database"
    );
    // The deprecated alias, bad ids, unknown ids and hashes.
    let id = third["id"].as_u64().expect("id");
    drop(client);
    let alias = format!("/templates/cafe/tests/{id}");
    poll_until(Duration::from_secs(10), "DELETE alias", || async {
        (compat.call("DELETE", &alias, None).await.0 == 204).then_some(())
    })
    .await;
    let (_, fourth) = compat.test_database("cafe").await;
    assert_eq!(fourth["id"], third["id"], "the alias unlocks too");
    assert_eq!(
        fourth["database"]["config"]["database"],
        third["database"]["config"]["database"]
    );
    assert_eq!(
        compat
            .call("POST", "/templates/cafe/tests/abc/unlock", None)
            .await
            .0,
        400
    );
    assert_eq!(
        compat
            .call("POST", "/templates/cafe/tests/x/recreate", None)
            .await
            .0,
        400
    );
    assert_eq!(
        compat
            .call("POST", "/templates/cafe/tests/999/recreate", None)
            .await
            .0,
        404
    );
    assert_eq!(
        compat
            .call("POST", "/templates/beef/tests/0/unlock", None)
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn test_databases_never_given_back_are_recreated_when_the_template_is_full() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "0", "--max-total", "2"])
        .start()
        .await;
    let compat = Compat::new(&daemon);
    build(&compat, "full").await;
    let (_, first) = compat.test_database("full").await;
    let (_, second) = compat.test_database("full").await;
    // A third getter gets a database although nobody gave one back: the longest-held
    // one is recreated for it (IntegreSQL's behaviour).
    let (status, third) = compat.test_database("full").await;
    assert_eq!(status, 200, "{third}");
    assert!(
        connect(&first).await.is_err(),
        "the longest-held one is gone"
    );
    assert!(connect(&second).await.is_ok(), "the other one is untouched");
    let id = first["id"].as_u64().expect("id");
    let path = format!("/templates/full/tests/{id}/unlock");
    assert_eq!(compat.call("POST", &path, None).await.0, 404);
}

/// IntegreSQL's clients never say when a test is done with its database. Of those a full
/// template may recreate, one nobody has been connected to for a while goes first: here
/// the longest-held still has a running test's session, and keeps it.
#[tokio::test]
async fn a_full_template_recreates_a_test_database_nobody_is_connected_to_first() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "0", "--max-total", "2"])
        .start()
        .await;
    let compat = Compat::new(&daemon);
    build(&compat, "busy").await;
    let (_, first) = compat.test_database("busy").await;
    let running = connect(&first).await.expect("connect to the first");
    let (_, second) = compat.test_database("busy").await;
    let ended = connect(&second).await.expect("connect to the second");
    assert_eq!(count_items(&ended).await, 1);
    drop(ended);
    // The daemon looks for sessions on test databases a few times a second, and counts a
    // database without one as idle once it has been held for two seconds (three seconds
    // more for a look on a busy machine).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (status, third) = compat.test_database("busy").await;
    assert_eq!(status, 200, "{third}");
    assert_eq!(
        count_items(&running).await,
        1,
        "the running test's database is still there"
    );
    assert!(
        connect(&second).await.is_err(),
        "the one nobody was connected to was recreated"
    );
}

#[tokio::test]
async fn the_reset_forgets_every_client_template_and_its_databases() {
    let daemon = TestDaemon::start().await;
    let compat = Compat::new(&daemon);
    build(&compat, "one").await;
    let (_, test) = compat.test_database("one").await;
    assert!(connect(&test).await.is_ok());
    assert_eq!(compat.call("DELETE", "/admin/templates", None).await.0, 204);
    assert_eq!(compat.test_database("one").await.0, 404);
    poll_until(
        Duration::from_secs(10),
        "the test database dropped",
        || async { connect(&test).await.is_err().then_some(()) },
    )
    .await;
    // Configured templates are not the IntegreSQL API's to reset.
    daemon.lease_ok("default").await;
    assert_eq!(compat.initialize("one").await.0, 200);
}

#[tokio::test]
async fn a_client_template_is_a_template_of_the_native_api_too() {
    let daemon = TestDaemon::start().await;
    let compat = Compat::new(&daemon);
    build(&compat, "native").await;
    let lease = daemon.lease_ok("native").await;
    assert_eq!(
        lease["fingerprint"], "native",
        "the hash is the fingerprint"
    );
    let client = crate::support::connect(&lease).await.expect("connect");
    assert_eq!(count_items(&client).await, 1);
    let status = daemon.template_status("native").await;
    assert_eq!(status["state"], "ready", "{status}");
    assert!(
        status["size_bytes"].as_i64().is_some_and(|s| s > 0),
        "{status}"
    );
    // pglease has no sources to rebuild or replace it from.
    let (code, body) = daemon
        .send(
            daemon
                .http
                .post(format!("{}/templates/native/rebuild", daemon.base)),
        )
        .await;
    assert_eq!(code, 409, "{body}");
    let (code, body) = daemon
        .send(
            daemon
                .http
                .put(format!("{}/templates/native", daemon.base))
                .json(&json!({})),
        )
        .await;
    assert_eq!(code, 409, "{body}");
    // And IntegreSQL clients cannot discard a configured template.
    assert_eq!(
        compat.call("DELETE", "/templates/default", None).await.0,
        409
    );
}

#[tokio::test]
async fn the_separate_port_serves_integresql_clients_without_the_token() {
    let daemon = TestDaemon::builder()
        .args(["--token", "s3cret", "--integresql-listen", "127.0.0.1:0"])
        .start()
        .await;
    let address = daemon.integresql_address().await;
    let compat = Compat {
        daemon: &daemon,
        base: format!("http://{address}/api/v1"),
    };
    build(&compat, "open").await;
    assert_eq!(compat.test_database("open").await.0, 200);
    // The main port's copy of the routes wants the token like every other route.
    let (status, _) = Compat::new(&daemon).test_database("open").await;
    assert_eq!(status, 401);
    // A non-loopback address without --integresql-allow-remote is refused at start.
    let (exit, log) = TestDaemon::builder()
        .args(["--integresql-listen", "0.0.0.0:0"])
        .run_to_exit();
    assert!(!exit.success());
    assert!(log.contains("--integresql-allow-remote"), "{log}");
}

#[tokio::test]
async fn the_tokenless_port_reaches_neither_native_leases_nor_configured_templates() {
    let daemon = TestDaemon::builder()
        .args(["--token", "s3cret", "--integresql-listen", "127.0.0.1:0"])
        .start()
        .await;
    let compat = Compat {
        daemon: &daemon,
        base: format!("http://{}/api/v1", daemon.integresql_address().await),
    };
    // A lease through the native API, with the token.
    let (code, lease) = daemon
        .send(
            daemon
                .http
                .post(format!("{}/lease", daemon.base))
                .bearer_auth("s3cret")
                .json(&json!({})),
        )
        .await;
    assert_eq!(code, 201, "{lease}");
    // Without the token, nobody can recreate it by guessing its small number…
    for id in 0..4 {
        let path = format!("/templates/default/tests/{id}/recreate");
        assert_eq!(compat.call("POST", &path, None).await.0, 404, "{path}");
        let path = format!("/templates/default/tests/{id}/unlock");
        assert_eq!(compat.call("POST", &path, None).await.0, 404, "{path}");
    }
    // …nor lease a configured template.
    assert_eq!(compat.test_database("default").await.0, 404);
    let client = crate::support::connect(&lease)
        .await
        .expect("still the holder's");
    drop(client);
}

#[tokio::test]
async fn a_client_template_survives_a_restart_with_a_kept_data_directory() {
    let dir = std::path::PathBuf::from(format!(
        "/dev/shm/pglease-test-integresql-kept-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let args = [
        "--data-dir".to_owned(),
        dir.display().to_string(),
        "--keep-data".to_owned(),
        "--min-ready".to_owned(),
        "2".to_owned(),
    ];
    let daemon = TestDaemon::builder().args(args.clone()).start().await;
    let compat = Compat::new(&daemon);
    build(&compat, "kept").await;
    assert_eq!(compat.test_database("kept").await.0, 200);
    poll_until(Duration::from_secs(10), "two warm clones", || async {
        (daemon.template_status("kept").await["ready"] == 2).then_some(())
    })
    .await;
    assert!(daemon.stop().await.success());
    let daemon = TestDaemon::builder().args(args).start().await;
    let compat = Compat::new(&daemon);
    assert_eq!(compat.initialize("kept").await.0, 423, "still initialized");
    assert!(
        daemon.log().contains("adopting a ready clone"),
        "its warm clones are adopted: {}",
        daemon.log()
    );
    let (status, test) = compat.test_database("kept").await;
    assert_eq!(status, 200, "{test}");
    let client = connect(&test).await.expect("connect");
    assert_eq!(count_items(&client).await, 1, "no migration ran again");
    drop(client);
    assert!(daemon.stop().await.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_getter_waiting_when_the_daemon_stops_gets_503() {
    // A process: the test stops it with SIGTERM.
    let daemon = TestDaemon::builder().process().start().await;
    let compat = Compat::new(&daemon);
    assert_eq!(compat.initialize("stop").await.0, 200);
    let waiting = compat.test_database_in_background("stop");
    poll_until(Duration::from_secs(10), "a getter waiting", || async {
        (daemon.template_status("stop").await["waiting"] == 1).then_some(())
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, body) = waiting.await.expect("join");
    assert_eq!(status, 503, "{body}");
    assert!(body["message"].is_string(), "{body}");
}

/// Clients that load a dump into the template with `psql` (integresql-client-go's dump
/// helper) set the PG* variables from the initialize answer: its credentials are the
/// template owner's and reach the template database over TCP. A `pg_dump --no-owner
/// --no-privileges` dump loads as it is.
#[tokio::test]
async fn a_dump_loads_into_the_template_with_psql_and_the_initialize_answer() {
    let test = "a_dump_loads_into_the_template_with_psql_and_the_initialize_answer";
    if !crate::support::tool_available("psql", test, "install postgresql-client") {
        return;
    }
    let daemon = TestDaemon::start().await;
    let compat = Compat::new(&daemon);
    let (status, template) = compat.initialize("d0d0").await;
    assert_eq!(status, 200, "{template}");
    let dump = crate::support::scratch_dir("psql-dump").join("dump.sql");
    // What pg_dump --no-owner --no-privileges writes, trimmed.
    std::fs::write(
        &dump,
        "SET statement_timeout = 0;\nSET client_encoding = 'UTF8';\n\
         SET standard_conforming_strings = on;\n\
         SELECT pg_catalog.set_config('search_path', '', false);\n\
         SET default_table_access_method = heap;\n\
         CREATE TABLE public.users (id integer NOT NULL, name text);\n\
         CREATE SEQUENCE public.users_id_seq AS integer START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1;\n\
         ALTER SEQUENCE public.users_id_seq OWNED BY public.users.id;\n\
         ALTER TABLE ONLY public.users ALTER COLUMN id SET DEFAULT nextval('public.users_id_seq'::regclass);\n\
         COPY public.users (id, name) FROM stdin;\n1\tada\n2\tgrace\n\\.\n\n\
         SELECT pg_catalog.setval('public.users_id_seq', 2, true);\n\
         ALTER TABLE ONLY public.users ADD CONSTRAINT users_pkey PRIMARY KEY (id);\n",
    )
    .expect("write the dump");
    let config = template["database"]["config"].clone();
    let value = |key: &str| match &config[key] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let output = tokio::task::spawn_blocking({
        let (host, port, user, password, database) = (
            value("host"),
            value("port"),
            value("username"),
            value("password"),
            value("database"),
        );
        move || {
            std::process::Command::new("psql")
                .args(["-v", "ON_ERROR_STOP=1", "-q", "-f"])
                .arg(&dump)
                .env("PGHOST", host)
                .env("PGPORT", port)
                .env("PGUSER", user)
                .env("PGPASSWORD", password)
                .env("PGDATABASE", database)
                .env("PGSSLMODE", "disable")
                .output()
                .expect("run psql")
        }
    })
    .await
    .expect("join");
    assert!(
        output.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(compat.finalize("d0d0").await, 204);
    let (status, test_db) = compat.test_database("d0d0").await;
    assert_eq!(status, 200, "{test_db}");
    let client = connect(&test_db).await.expect("connect");
    let row = client
        .query_one("SELECT count(*), max(id) FROM users", &[])
        .await
        .expect("the dump's rows");
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i32>(1)), (2, 2));
    client
        .batch_execute("INSERT INTO users (name) VALUES ('linus'); TRUNCATE users;")
        .await
        .expect("a test owns the dump's tables");
    assert!(daemon.stop().await.success());
}

/// Issue 25, row 6: the initialize answer's role once had no connection limit, and one
/// client holding 263 connections left lease holders none. It gets what a lease gets.
#[tokio::test]
async fn a_migrating_client_gets_a_leases_connection_limit() {
    let daemon = TestDaemon::builder()
        .args(["--lease-connections", "3"])
        .start()
        .await;
    let compat = Compat::new(&daemon);
    let (status, template) = compat.initialize("c0ffee").await;
    assert_eq!(status, 200, "{template}");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect(&template).await.expect("within the limit"));
    }
    let error = connect(&template)
        .await
        .expect_err("a fourth connection is refused");
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS),
        "{error}"
    );
    // Its connections count against the budget, beside a lease's, until it is finalized.
    let limits = &daemon.status().await["limits"];
    assert_eq!(limits["connections_in_use"], 3, "{limits}");
    // Lease holders are still served.
    let lease = daemon.lease_ok("default").await;
    crate::support::connect(&lease)
        .await
        .expect("a lease connects");
    assert_eq!(daemon.status().await["limits"]["connections_in_use"], 6);
    drop(held);
    assert_eq!(compat.finalize("c0ffee").await, 204);
    assert_eq!(daemon.status().await["limits"]["connections_in_use"], 3);
    assert!(daemon.stop().await.success());
}

/// An initialize the connection budget has no room for is refused with 503 and says why;
/// a finalize makes room for the next.
#[tokio::test]
async fn an_initialize_the_connection_budget_has_no_room_for_is_refused() {
    // 40 connections less the superusers' and the daemon's: room for two roles of 10.
    let daemon = TestDaemon::builder()
        .args([
            "--pg-setting",
            "max_connections=40",
            "--lease-connections",
            "10",
        ])
        .start()
        .await;
    let compat = Compat::new(&daemon);
    let budget = daemon.status().await["limits"]["connection_budget"]
        .as_u64()
        .expect("budget");
    assert!((10..100).contains(&budget), "{budget}");
    for n in 0..budget / 10 {
        let (status, body) = compat.initialize(&format!("cafe{n:02}")).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = compat.initialize("cafeff").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("no connections left")),
        "{body}"
    );
    assert_eq!(compat.finalize("cafe00").await, 204);
    let (status, body) = compat.initialize("cafeff").await;
    assert_eq!(status, 200, "{body}");
    assert!(daemon.stop().await.success());
}

/// Connects as the IntegreSQL clients' role (`dbuser`/`dbpass`) to `database` on the
/// daemon's postgres, as psql does with the run's PG* variables.
async fn connect_as_dbuser(
    postgres: &Value,
    database: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut pg = tokio_postgres::Config::new();
    pg.host(postgres["host"].as_str().expect("host"))
        .port(postgres["port"].as_u64().expect("port") as u16)
        .user("dbuser")
        .password("dbpass")
        .dbname(database);
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Issues 26 and 42 (docs/security.md): the role `--integresql-pg-user` makes for suites'
/// PG* variables reaches a client-built template's database from its initialize to its
/// finalize, and the test databases of client-built templates, and nothing else — not the
/// `postgres` database, not a finalized template, not a lease of a configured template —
/// is no superuser, cannot create databases, and holds a lease's connection limit; a
/// finalize ends its sessions in the template. The initialize answer carries its
/// credentials. A role of that name the daemon did not make is not taken over.
#[tokio::test]
async fn the_integresql_role_reaches_client_templates_and_their_test_databases_and_nothing_else() {
    let daemon = TestDaemon::builder()
        .args(["--lease-connections", "3"])
        .args(INTEGRESQL_ROLE_ARGS)
        .start()
        .await;
    let postgres = daemon.status().await["servers"][0]["postgres"].clone();
    let refused = async |database: &str, what: &str| {
        let error = connect_as_dbuser(&postgres, database)
            .await
            .err()
            .unwrap_or_else(|| panic!("the role reached {what}"));
        // "no pg_hba.conf entry": the samerole rule does not match.
        assert_eq!(
            error.code(),
            Some(&tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION),
            "{what}: {error:?}"
        );
    };
    refused("postgres", "the postgres database").await;
    refused("template1", "template1").await;
    let lease = daemon.lease_ok("default").await;
    refused(
        lease["database"].as_str().expect("database"),
        "a lease of a configured template",
    )
    .await;

    let compat = Compat::new(&daemon);
    let (status, template) = compat.initialize("beef01").await;
    assert_eq!(status, 200, "{template}");
    assert_eq!(
        template["database"]["config"]["username"], "dbuser",
        "the initialize answer carries the shared role's credentials: {template}"
    );
    let database = template["database"]["config"]["database"]
        .as_str()
        .expect("database")
        .to_owned();
    let client = connect_as_dbuser(&postgres, &database)
        .await
        .expect("the template being initialized");
    let row = client
        .query_one(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .expect("its attributes");
    assert_eq!(
        (
            row.get::<_, bool>(0),
            row.get::<_, bool>(1),
            row.get::<_, bool>(2)
        ),
        (false, false, false)
    );
    let error = client
        .batch_execute("CREATE DATABASE not_allowed")
        .await
        .expect_err("no CREATEDB");
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{error}"
    );
    client
        .batch_execute("CREATE TABLE public.t (id int); ALTER TABLE public.t OWNER TO dbuser")
        .await
        .expect("it builds the template");
    let mut held = vec![client];
    for _ in 0..2 {
        held.push(
            connect_as_dbuser(&postgres, &database)
                .await
                .expect("within the limit"),
        );
    }
    let error = connect_as_dbuser(&postgres, &database)
        .await
        .expect_err("past the limit");
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS),
        "{error}"
    );

    assert_eq!(compat.finalize("beef01").await, 204);
    poll_until(
        Duration::from_secs(5),
        "the finalize to end its sessions",
        || {
            let held = &held;
            async move { held.iter().all(|c| c.is_closed()).then_some(()) }
        },
    )
    .await;
    refused(&database, "a finalized template").await;
    let (status, test_db) = compat.test_database("beef01").await;
    assert_eq!(status, 200, "{test_db}");
    let test_database = test_db["database"]["config"]["database"]
        .as_str()
        .expect("database")
        .to_owned();
    // A dump loaded with psql and the run's PG* variables into a test database (go-starter's
    // TestWithTestDatabaseEmpty): the shared role gets in, creates and changes.
    let shared = connect_as_dbuser(&postgres, &test_database)
        .await
        .expect("a test database of a client-built template");
    shared
        .batch_execute(
            "CREATE TABLE public.users (id int); ALTER TABLE public.users OWNER TO dbuser; \
             ALTER TABLE public.t RENAME TO t2; ALTER TABLE public.t2 RENAME TO t",
        )
        .await
        .expect("it loads a dump and changes the template's tables there");
    drop(shared);
    let owner = connect(&test_db)
        .await
        .expect("the test's own role")
        .query_one(
            "SELECT tableowner::text FROM pg_tables WHERE tablename = 't'",
            &[],
        )
        .await
        .expect("the table");
    assert_eq!(owner.get::<_, String>(0), "pglease_owner");
    assert!(daemon.stop().await.success());
}

/// Issue 42, go-starter's TestWithTestDatabaseFromDumpGorp: a dump loaded with psql and
/// the run's PG* variables makes tables owned by the shared role, which the client's
/// migrations (through the initialize answer) then rename; the test databases get them
/// owned by the owner role, so each test's own role changes them too.
#[tokio::test]
async fn what_the_integresql_role_makes_in_a_template_the_initialize_answer_changes() {
    let daemon = TestDaemon::builder()
        .args(INTEGRESQL_ROLE_ARGS)
        .start()
        .await;
    let postgres = daemon.status().await["servers"][0]["postgres"].clone();
    let compat = Compat::new(&daemon);
    let (status, template) = compat.initialize("0ddba11").await;
    assert_eq!(status, 200, "{template}");
    let database = template["database"]["config"]["database"]
        .as_str()
        .expect("database");
    connect_as_dbuser(&postgres, database)
        .await
        .expect("psql with the run's PG* variables")
        .batch_execute(
            "CREATE TABLE public.gorp_migrations (id text PRIMARY KEY); \
             ALTER TABLE public.gorp_migrations OWNER TO dbuser;",
        )
        .await
        .expect("the dump loads");
    connect(&template)
        .await
        .expect("the initialize answer")
        .batch_execute("ALTER TABLE IF EXISTS gorp_migrations RENAME TO migrations")
        .await
        .expect("the migrations rename the dump's table");
    assert_eq!(compat.finalize("0ddba11").await, 204);
    let (status, test_db) = compat.test_database("0ddba11").await;
    assert_eq!(status, 200, "{test_db}");
    connect(&test_db)
        .await
        .expect("the test's own role")
        .batch_execute("ALTER TABLE migrations ADD COLUMN applied_at timestamptz")
        .await
        .expect("a test changes it");
    assert!(daemon.stop().await.success());
}

/// Issue 42: on its own server pglease names the databases of the IntegreSQL API as
/// IntegreSQL does, `integresql_template_<hash>` and `integresql_test_<hash>_<n>`
/// (go-starter tells templates apart by the hash in a test database's name), and keeps
/// its own names where IntegreSQL's would not fit in a postgres identifier.
#[tokio::test]
async fn integresql_databases_are_named_as_integresql_names_them() {
    let daemon = TestDaemon::builder().start().await;
    let compat = Compat::new(&daemon);
    let hash = "0123456789abcdef0123456789abcdef";
    let (status, template) = compat.initialize(hash).await;
    assert_eq!(status, 200, "{template}");
    assert_eq!(
        template["database"]["config"]["database"],
        format!("integresql_template_{hash}")
    );
    connect(&template)
        .await
        .expect("the initialize answer")
        .batch_execute("CREATE TABLE items (id int)")
        .await
        .expect("migrate");
    assert_eq!(compat.finalize(hash).await, 204);
    let mut names = Vec::new();
    for _ in 0..2 {
        let (status, test_db) = compat.test_database(hash).await;
        assert_eq!(status, 200, "{test_db}");
        let name = test_db["database"]["config"]["database"]
            .as_str()
            .expect("database")
            .to_owned();
        let number = name
            .strip_prefix(&format!("integresql_test_{hash}_"))
            .unwrap_or_else(|| panic!("IntegreSQL's name: {name}"));
        assert!(number.parse::<u64>().is_ok(), "{name}");
        let current: String = connect(&test_db)
            .await
            .expect("the test database")
            .query_one("SELECT current_database()", &[])
            .await
            .expect("its name")
            .get(0);
        assert_eq!(current, name);
        names.push(name);
    }
    assert_ne!(names[0], names[1]);
    // Too long for IntegreSQL's name (postgres would cut it): ours, and it works.
    let long = "f".repeat(64);
    build(&compat, &long).await;
    let (status, test_db) = compat.test_database(&long).await;
    assert_eq!(status, 200, "{test_db}");
    let name = test_db["database"]["config"]["database"]
        .as_str()
        .expect("database");
    assert!(name.starts_with("pglease_"), "{name}");
    assert!(name.len() <= 63, "{name}");
    assert_eq!(
        count_items(&connect(&test_db).await.expect("connect")).await,
        1
    );
    assert!(daemon.stop().await.success());
}

/// A role of the server's named like `--integresql-pg-user` is not the daemon's to take
/// over (its password, its rights): the start is refused with the reason.
#[tokio::test]
async fn a_role_the_server_already_has_is_not_taken_over() {
    let server = crate::support::PlainPostgres::start("integresql-role-taken");
    server
        .connect()
        .await
        .batch_execute("CREATE ROLE dbuser LOGIN SUPERUSER PASSWORD 'theirs'")
        .await
        .expect("the server's own role");
    let (status, log) = TestDaemon::builder()
        .args(["--postgres-url", &server.url()])
        .args(INTEGRESQL_ROLE_ARGS)
        .run_to_exit();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("a role of that name exists on the server and pglease did not make it"),
        "{log}"
    );
}

/// A daemon attached to `server` whose IntegreSQL answers carry the server's own login
/// (compose's layout: `--integresql-pg-user` is the `--postgres-url`'s user).
async fn server_login_daemon(server: &crate::support::PlainPostgres) -> TestDaemon {
    TestDaemon::builder()
        .args(["--postgres-url", &server.url()])
        .args(["--integresql-pg-user", "postgres"])
        .args(["--integresql-pg-password", "trust-ignores-it"])
        .start()
        .await
}

/// Test databases answered with the server's own login hold no connections of a role of
/// their own: the budget keeps none for them, so a suite that never gives its databases
/// back is not cut off from the one it is using when more are out than the budget has
/// lease shares for (go-starter in compose's layout lost a database mid-test that way).
#[tokio::test]
async fn with_the_servers_own_user_test_databases_reserve_no_connections() {
    let server = crate::support::PlainPostgres::start("integresql-server-login-budget");
    let daemon = server_login_daemon(&server).await;
    let compat = Compat::new(&daemon);
    let hash = "b0d9e7";
    let (status, template) = compat.initialize(hash).await;
    assert_eq!(status, 200, "{template}");
    assert_eq!(compat.finalize(hash).await, 204);
    let limits = daemon.status().await["limits"].clone();
    let budget = limits["connection_budget"].as_u64().expect("budget");
    // More databases out at once than the budget has room for at the default share (10).
    let wanted = budget / 10 + 2;
    let mut first = None;
    for _ in 0..wanted {
        let (status, test_db) = compat.test_database(hash).await;
        assert_eq!(status, 200, "{test_db}");
        if first.is_none() {
            first = Some(test_db);
        }
    }
    let first = first.expect("a test database");
    let client = connect(&first)
        .await
        .expect("the first test database is still there, unchanged");
    client.batch_execute("SELECT 1").await.expect("a query");
    let limits = daemon.status().await["limits"].clone();
    assert_eq!(limits["reclaimed"], 0, "{limits}");
    assert_eq!(limits["connections_in_use"], 0, "{limits}");
    drop(client);
    assert!(daemon.stop().await.success());
}

/// Issue 42, compose's layout (go-starter's): IntegreSQL and the app share one server and
/// its user, which the suite's PG* variables name. pglease attached to that server with
/// `--integresql-pg-user` naming the `--postgres-url`'s own user takes IntegreSQL's place:
/// the role is left as it is, every answer carries its credentials (the initialize's and
/// each test database's), so what a dump loaded with `psql` made, the migrations and the
/// tests change; the databases have IntegreSQL's names, save one someone else's database
/// already has, which is left alone.
#[tokio::test]
async fn on_a_shared_server_its_own_user_is_the_integresql_user_and_others_databases_stay() {
    let server = crate::support::PlainPostgres::start("integresql-server-login");
    let admin = server.connect().await;
    let hash = "5eed0fc0ffee";
    // A real IntegreSQL's template of the same hash, from an earlier run on this server.
    for sql in [
        format!("CREATE DATABASE integresql_template_{hash}"),
        format!("COMMENT ON DATABASE integresql_template_{hash} IS 'someone else''s'"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .expect("someone else's database");
    }
    let daemon = server_login_daemon(&server).await;
    let compat = Compat::new(&daemon);
    let (status, template) = compat.initialize(hash).await;
    assert_eq!(status, 200, "{template}");
    let config = &template["database"]["config"];
    assert_eq!(config["username"], "postgres", "{template}");
    assert_eq!(config["password"], "trust-ignores-it", "{template}");
    let database = config["database"].as_str().expect("database").to_owned();
    assert_ne!(database, format!("integresql_template_{hash}"));
    // The dump, loaded as the run's user; the migrations rename what it made.
    let client = connect(&template).await.expect("the initialize answer");
    client
        .batch_execute(
            "CREATE TABLE gorp_migrations (id text PRIMARY KEY); \
             ALTER TABLE gorp_migrations RENAME TO migrations; \
             CREATE TABLE items (id int); INSERT INTO items VALUES (1);",
        )
        .await
        .expect("the dump and the migrations, as one user");
    drop(client);
    assert_eq!(compat.finalize(hash).await, 204);
    let (status, test_db) = compat.test_database(hash).await;
    assert_eq!(status, 200, "{test_db}");
    let config = &test_db["database"]["config"];
    assert_eq!(config["username"], "postgres", "{test_db}");
    let name = config["database"].as_str().expect("database");
    assert!(
        name.starts_with(&format!("integresql_test_{hash}_")),
        "IntegreSQL's name: {name}"
    );
    let test_client = connect(&test_db).await.expect("the test database");
    assert_eq!(count_items(&test_client).await, 1);
    test_client
        .batch_execute("ALTER TABLE migrations ADD COLUMN applied_at timestamptz")
        .await
        .expect("a test changes what the dump made");
    drop(test_client);
    // The server's user is as it was, and so is someone else's database.
    let row = admin
        .query_one(
            "SELECT rolsuper, shobj_description(oid, 'pg_authid') FROM pg_roles \
             WHERE rolname = 'postgres'",
            &[],
        )
        .await
        .expect("the server's user");
    assert!(row.get::<_, bool>(0));
    assert_eq!(row.get::<_, Option<String>>(1), None);
    let theirs: Option<String> = admin
        .query_one(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1",
            &[&format!("integresql_template_{hash}")],
        )
        .await
        .expect("someone else's database is still there")
        .get(0);
    assert_eq!(theirs.as_deref(), Some("someone else's"));
    assert!(daemon.stop().await.success());
}
