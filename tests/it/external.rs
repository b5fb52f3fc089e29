//! `--postgres-url`: attaching to a server pglease did not start. pglease creates and drops
//! only its own (prefixed, marked) databases, warns about fsync, reuses its templates
//! across restarts, and keeps a second daemon off a server it manages.

use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, connect, scratch_dir, PlainPostgres, TestDaemon};

async fn database_names(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query("SELECT datname FROM pg_database ORDER BY datname", &[])
        .await
        .expect("list databases")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test]
async fn an_external_server_is_used_and_only_our_databases_are_touched() {
    let server = PlainPostgres::start("external");
    let admin = server.connect().await;
    // Someone else's databases, one of them with our prefix but without our marker.
    admin
        .batch_execute("CREATE DATABASE keepme")
        .await
        .expect("create");
    admin
        .batch_execute("CREATE DATABASE pglease_lookalike")
        .await
        .expect("create");
    let schema = scratch_dir("external-schema").join("schema.sql");
    std::fs::write(
        &schema,
        "CREATE TABLE t (id int); INSERT INTO t VALUES (1);",
    )
    .expect("write");
    let args = vec![
        "--postgres-url".to_owned(),
        server.url(),
        "--template".to_owned(),
        format!("app=sql:{}", schema.display()),
        "--min-ready".to_owned(),
        "2".to_owned(),
    ];

    let daemon = TestDaemon::builder().args(args.clone()).start().await;
    let lease = daemon.lease_ok("app").await;
    assert_eq!(lease["port"], server.port);
    let client = connect(&lease)
        .await
        .expect("connect to the external server");
    let row = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("template applied");
    assert_eq!(row.get::<_, i64>(0), 1);
    drop(client);
    // The PostgreSQL front (on by default) reaches an external server over TCP, logging in
    // with the lease's password: there is no private socket of ours there.
    let front = daemon.front_address().await;
    let (through, connection) = tokio_postgres::connect(
        &format!(
            "host={} port={} user=u dbname=app",
            front.ip(),
            front.port()
        ),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect through the front");
    let task = tokio::spawn(connection);
    let row = through
        .query_one(
            "SELECT count(*), inet_server_addr() IS NOT NULL FROM t",
            &[],
        )
        .await
        .expect("a clone of app through the front");
    assert_eq!((row.get::<_, i64>(0), row.get::<_, bool>(1)), (1, true));
    drop(through);
    let _ = task.await;
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["external"], true);
    assert_eq!(status["postgres"]["settings"]["fsync"], "on");
    assert_eq!(status["postgres"]["admin_timeouts"], 0);
    assert!(
        daemon.log().contains("fsync=on"),
        "warns about fsync:\n{}",
        daemon.log()
    );
    assert!(daemon.stop().await.success());

    // The leased clone is gone; templates and the ready clones (marked for adoption) stay
    // for the next run; foreign databases are untouched.
    let names = database_names(&admin).await;
    let leased_first = lease["database"].as_str().expect("db").to_owned();
    assert!(
        !names.contains(&leased_first),
        "the leased clone was dropped: {names:?}"
    );
    for name in ["keepme", "pglease_lookalike", "postgres"] {
        assert!(
            names.contains(&name.to_owned()),
            "{name} missing from {names:?}"
        );
    }
    let ours: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("pglease_") && *n != "pglease_lookalike")
        .collect();
    let templates = ours
        .iter()
        .filter(|n| n.starts_with("pglease_tpl_"))
        .count();
    assert_eq!(templates, 2, "both templates remain: {ours:?}");
    for clone in ours.iter().filter(|n| !n.starts_with("pglease_tpl_")) {
        let comment: Option<String> = admin
            .query_one(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1",
                &[clone],
            )
            .await
            .expect("comment")
            .get(0);
        assert!(
            comment.is_some_and(|c| c.contains("; ready; template=")),
            "{clone} is kept only as a ready clone"
        );
    }

    // The next run reuses them instead of building again.
    // A process: the test kills it (SIGKILL).
    let again = TestDaemon::builder()
        .args(args.clone())
        .process()
        .start()
        .await;
    let leased = again.lease_ok("app").await;
    let leased_db = leased["database"].as_str().expect("db").to_owned();
    assert!(
        again.log().contains("template already built"),
        "{}",
        again.log()
    );
    // Killed, it cannot clean up: its clones and their roles stay until the next start.
    again.kill();
    assert!(database_names(&admin).await.contains(&leased_db));
    let third = TestDaemon::builder().args(args.clone()).start().await;
    let names = database_names(&admin).await;
    assert!(!names.contains(&leased_db), "swept: {names:?}");
    assert!(
        names.contains(&"keepme".to_owned()) && names.contains(&"pglease_lookalike".to_owned())
    );
    let role_left = admin
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&leased_db])
        .await
        .expect("roles");
    assert!(
        role_left.is_none(),
        "the killed run's lease role was swept too"
    );
    assert!(third.stop().await.success());

    // --verify-templates builds from scratch once even though the fingerprint matches.
    let mut verify = args;
    verify.push("--verify-templates".to_owned());
    let verifying = TestDaemon::builder().args(verify).start().await;
    verifying.lease_ok("app").await;
    let log = verifying.log();
    assert!(!log.contains("template already built"), "{log}");
    assert!(log.contains("template built"), "{log}");
    assert!(verifying.stop().await.success());
}

#[tokio::test]
async fn ready_clones_survive_a_clean_restart_and_leased_ones_do_not() {
    let server = PlainPostgres::start("adopt");
    let admin = server.connect().await;
    let args = vec![
        "--postgres-url".to_owned(),
        server.url(),
        "--min-ready".to_owned(),
        "2".to_owned(),
    ];
    let first = TestDaemon::builder().args(args.clone()).start().await;
    let leased = first.lease_ok("default").await;
    crate::support::poll_until(
        std::time::Duration::from_secs(10),
        "two warm clones",
        || async { (first.template_status("default").await["ready"] == 2).then_some(()) },
    )
    .await;

    assert!(first.stop().await.success());
    let after_stop = database_names(&admin).await;
    let leased_db = leased["database"].as_str().expect("db").to_owned();
    assert!(
        !after_stop.contains(&leased_db),
        "the leased clone was dropped"
    );
    let kept: Vec<String> = after_stop
        .iter()
        .filter(|n| n.starts_with("pglease_") && !n.starts_with("pglease_tpl_"))
        .cloned()
        .collect();
    assert_eq!(kept.len(), 2, "two ready clones kept: {after_stop:?}");

    // The next run adopts them: its first leases are those very databases, with new
    // passwords that work.
    let second = TestDaemon::builder().args(args).start().await;
    // Adoption ends when both have a new password and sit in the ready queue (a lease
    // asked earlier could be served by a fresh clone that happened to finish first).
    crate::support::poll_until(
        std::time::Duration::from_secs(10),
        "the adopted clones",
        || async {
            let status = second.template_status("default").await;
            (status["ready"] == 2 && status["in_progress"] == 0).then_some(())
        },
    )
    .await;
    let mut adopted = Vec::new();
    for _ in 0..2 {
        let lease = second.lease_ok("default").await;
        connect(&lease)
            .await
            .expect("the adopted clone's new password works");
        adopted.push(lease["database"].as_str().expect("db").to_owned());
    }
    adopted.sort();
    let mut kept_sorted = kept.clone();
    kept_sorted.sort();
    assert_eq!(adopted, kept_sorted, "{}", second.log());
    assert!(second.log().contains("adopting a ready clone"));
    assert!(second.stop().await.success());
}

/// Runs `pglease serve ARGS` that should exit by itself; `None` (after killing it) when it
/// still runs after `limit`. Returns its log.
/// Runs the daemon until it exits or `limit` passes; its log goes to a scratch directory of
/// its own (`name`: tests run at once, and each scratch directory starts empty).
fn run_expecting_exit(
    name: &str,
    args: &[String],
    limit: Duration,
) -> (Option<ExitStatus>, String) {
    let log_path = scratch_dir(name).join("stderr");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut child = support::binary()
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn pglease");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status,
        std::fs::read_to_string(&log_path).unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_second_daemon_on_the_same_server_refuses_to_start() {
    let server = PlainPostgres::start("two-daemons");
    let args = vec![
        "--postgres-url".to_owned(),
        server.url(),
        "--min-ready".to_owned(),
        "1".to_owned(),
    ];
    // A process: the second one names the first one's pid.
    let first = TestDaemon::builder()
        .args(args.clone())
        .process()
        .start()
        .await;
    let lease = first.lease_ok("default").await;
    let held = connect(&lease).await.expect("connect to the lease");

    let second_args = args.clone();
    let (status, log) = tokio::task::spawn_blocking(move || {
        run_expecting_exit("second-daemon", &second_args, Duration::from_secs(30))
    })
    .await
    .expect("join");
    let status = status.unwrap_or_else(|| {
        panic!("the second daemon kept running next to the first. Its log:\n{log}")
    });
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("another pglease already manages the postgres server"),
        "{log}"
    );
    assert!(
        log.contains(&format!("pglease (pid {} on ", first.pid())),
        "names the holder: {log}"
    );

    // The first one's clone was not swept: the open session and new logins still work.
    held.simple_query("SELECT 1")
        .await
        .expect("the leased clone's session survived");
    connect(&lease)
        .await
        .expect("the leased clone still exists");
    assert!(first.stop().await.success());

    // Once the first is gone, another starts.
    let next = TestDaemon::builder().args(args).start().await;
    next.lease_ok("default").await;
    assert!(next.stop().await.success());
}

#[tokio::test]
async fn a_server_out_of_connection_slots_is_waited_for_at_start() {
    let server = PlainPostgres::start_with(
        "slots",
        &["max_connections=20", "superuser_reserved_connections=0"],
    );
    let mut taken = Vec::new();
    for _ in 0..20 {
        taken.push(server.connect().await);
    }
    let args = vec!["--postgres-url".to_owned(), server.url()];
    let mut starting = TestDaemon::builder().args(args).spawn();
    // The daemon's own word, naming the wait and postgres' reason, proves it was refused
    // for want of a slot and chose to ask again (a refusal it gave up on would end the
    // process, which fails this wait). Only then are the slots given back.
    starting
        .wait_for_log("that it waits for a connection slot", |line| {
            line.contains("postgres does not take connections yet")
                && line.contains("too many clients")
        })
        .await;
    drop(taken);
    let daemon = starting.listening().await;
    daemon.lease_ok("default").await;
    assert!(daemon.stop().await.success());
}

/// Runs the daemon on `server` as `role`, expecting it to fail its start: the log.
async fn start_refused_as(server: &PlainPostgres, role: &str) -> String {
    let url = server.url().replace("postgres@", &format!("{role}@"));
    let args = vec!["--postgres-url".to_owned(), url];
    let name = format!("refused-as-{role}");
    let (status, log) = tokio::task::spawn_blocking(move || {
        run_expecting_exit(&name, &args, Duration::from_secs(30))
    })
    .await
    .expect("join");
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
    log
}

#[tokio::test]
async fn an_unknown_role_in_the_url_stops_the_start_with_postgres_message() {
    let server = PlainPostgres::start("no-role");
    let log = start_refused_as(&server, "nosuchrole").await;
    assert!(
        log.contains("cannot connect to postgres at")
            && log.contains("role \"nosuchrole\" does not exist"),
        "{log}"
    );
}

/// Issue 27: a URL naming a role that is not a superuser is told as that, not as an invalid
/// URL (StartError::BadUrl once carried it, and the pool's own connection errors).
#[tokio::test]
async fn a_role_that_is_not_a_superuser_is_told_as_such() {
    let server = PlainPostgres::start("not-superuser");
    server
        .connect()
        .await
        .batch_execute("CREATE ROLE plain LOGIN")
        .await
        .expect("a plain role");
    let log = start_refused_as(&server, "plain").await;
    assert!(
        log.contains("is not a superuser") && log.contains("--postgres-url must name a superuser"),
        "{log}"
    );
    assert!(!log.contains("invalid --postgres-url"), "{log}");
}

/// Issue 27: a build whose connection is lost midway (here the server's admin ends it; a
/// restart or a failover does the same) is no fault of the template's SQL. The waiting
/// request hears that the server was unavailable (503 `postgres_unavailable`, retry), not
/// 422 `template_build_failed`; the template is not marked failed, and the next request
/// builds it.
#[tokio::test]
async fn a_build_that_loses_its_connection_is_not_blamed_on_its_sql() {
    let server = PlainPostgres::start("build-connection-lost");
    let admin = server.connect().await;
    let migrations = scratch_dir("build-connection-lost");
    std::fs::write(
        migrations.join("001_slow.sql"),
        "CREATE TABLE t (id int); SELECT pg_sleep(3);",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args(["--postgres-url", &server.url()])
        .args([
            "--template",
            &format!("slow=migrations:{}", migrations.display()),
        ])
        .start()
        .await;
    let lease = daemon.lease_in_background(serde_json::json!({ "template": "slow" }));
    let ended = support::poll_until(Duration::from_secs(30), "the build's sleep", || {
        let admin = &admin;
        async move {
            let row = admin
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname LIKE 'pglease\\_tpl\\_%' AND query LIKE '%pg_sleep%'",
                    &[],
                )
                .await
                .expect("end the build's session");
            (row.get::<_, i64>(0) > 0).then_some(())
        }
    })
    .await;
    let () = ended;
    let answer = lease.await.expect("join");
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(
        answer.body["error"]["code"], "postgres_unavailable",
        "{}",
        answer.body
    );
    assert_ne!(daemon.template_status("slow").await["state"], "failed");
    // Nothing was wrong with the SQL: the next request builds it and gets a database.
    let lease = daemon.lease_ok("slow").await;
    connect(&lease)
        .await
        .expect("connect")
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("the template's table");
    assert!(daemon.stop().await.success());
}

/// docs/security.md: an external server someone stops (`pg_ctl stop -m smart`, a SIGTERM)
/// sits in smart shutdown while any session is open, a holder's here, refusing every new
/// connection with 57P03. Before, pglease went on granting leases on it that could not
/// connect, with `/status` saying all was well, for as long as any session lasted. Now a
/// new connection a second tells it: `/lease` answers 503 naming the reason, `/status`
/// says why, and once the server is back (its operator's to restart) leases work again.
#[tokio::test]
async fn an_external_server_that_is_shutting_down_is_let_go_until_it_is_back() {
    let mut server = PlainPostgres::start("smart-shutdown");
    let args = vec![
        "--postgres-url".to_owned(),
        server.url(),
        "--min-ready".to_owned(),
        "1".to_owned(),
    ];
    let daemon = TestDaemon::builder().args(args).start().await;
    let held = daemon.lease_ok("default").await;
    let session = connect(&held).await.expect("connect with the held lease");

    server.begin_smart_shutdown();
    let sent = Instant::now();
    let refused = support::poll_until(
        Duration::from_secs(15),
        "a lease refused while the server shuts down",
        || async {
            let (code, body) = daemon
                .lease(serde_json::json!({ "template": "default" }))
                .await;
            (code != 201).then_some((code, body))
        },
    )
    .await;
    let took = sent.elapsed();
    let (code, body) = refused;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error"]["code"], "postgres_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the external postgres server is shutting down"),
        "{message}"
    );
    assert!(took < Duration::from_secs(5), "noticed only after {took:?}");
    let status = daemon.status().await;
    let reason = status["postgres"]["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("shutting down"), "{status}");
    // The holder's session is the server's, not pglease's to end.
    session
        .simple_query("SELECT 1")
        .await
        .expect("the held session goes on");

    // The last session ends, the shutdown finishes (pglease holds no session there any
    // more), the operator starts the server again: leases work again.
    drop(session);
    support::poll_until(Duration::from_secs(20), "the shutdown to finish", || {
        let exited = server.has_exited();
        async move { exited.then_some(()) }
    })
    .await;
    server.restart();
    support::poll_until(
        Duration::from_secs(30),
        "a lease whose URL connects",
        || async {
            let (code, lease) = daemon
                .lease(serde_json::json!({ "template": "default" }))
                .await;
            if code != 201 {
                return None;
            }
            connect(&lease).await.ok().map(|_| ())
        },
    )
    .await;
    assert!(daemon.stop().await.success());
}

/// Issue 43: when postgres has no connection slot for the build's own connection (SQLSTATE
/// 53300: the slots a non-superuser may take are all in use), the lease hears the connection
/// budget's 503 `too_many_connections` with Retry-After, not a 422 `template_build_failed`
/// that blames the template's migrations; and the template is not remembered as failed: once
/// a slot is free, the next request builds it.
#[tokio::test]
async fn a_build_postgres_has_no_connection_slot_for_is_the_budgets_503() {
    let dir = scratch_dir("migrations-no-slot");
    std::fs::write(dir.join("001_table.sql"), "CREATE TABLE t (id int);\n").expect("write");
    // Non-superusers (the build's own role) may take 25 slots; the daemon's superuser
    // connections still get in through the 25 reserved ones.
    let server = PlainPostgres::start_with(
        "no-slot",
        &["max_connections=50", "superuser_reserved_connections=25"],
    );
    let mut taken = Vec::new();
    for _ in 0..25 {
        taken.push(server.connect().await);
    }
    let args = vec![
        "--postgres-url".to_owned(),
        server.url(),
        "--lease-connections".to_owned(),
        "2".to_owned(),
        "--template".to_owned(),
        format!("app=migrations:{}", dir.display()),
    ];
    let daemon = TestDaemon::builder().args(args).start().await;
    let response = daemon
        .http
        .post(format!("{}/lease", daemon.base))
        .json(&serde_json::json!({ "template": "app" }))
        .send()
        .await
        .expect("lease request");
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key("retry-after");
    let body: serde_json::Value = response.json().await.expect("a JSON body");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "too_many_connections", "{body}");
    assert!(retry_after, "a 503 says when to try again: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no connection slot") && message.contains("reserved"),
        "names the refusal in postgres' words: {message}"
    );
    assert_ne!(daemon.template_status("app").await["state"], "failed");

    drop(taken);
    let lease = daemon.lease_ok("app").await;
    connect(&lease)
        .await
        .expect("connect")
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("built once a slot was free");
    assert!(daemon.stop().await.success());
}
