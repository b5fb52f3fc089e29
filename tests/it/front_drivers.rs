//! The driver matrix and the budgets through the PostgreSQL front (issue 30). Every driver of
//! `drivers.rs` connects to `postgresql://tester@<front>/default` on its default options —
//! the same check scripts in tests/drivers, in their front mode (`PGLEASE_FRONT_URL`), and
//! Go's pgx and lib/pq from tests/drivers/go — and every lease it took is released when its
//! connections close. With TLS at the front (`--front-tls`), lib/pq connects on its default
//! `sslmode=require`, with no `sslmode=disable` in the URL. The budgets hold at the front as over HTTP: a connection beyond
//! `--max-total` waits `POST /lease`'s default wait and then gets `53300` naming the limit, a
//! connection beyond `--max-waiting` or the byte budget (`--max-bytes`) gets it at once, and
//! leases over HTTP and connections at the front count against the same limits and make
//! room for each other.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::process::Command;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

use crate::drivers::{drivers_dir, node_drivers_available, pgjdbc_jar};
use crate::support::{
    current_database, daemon_with_front, id_of, poll_until, tool_available, TestDaemon,
    REQUIRE_TOOLS,
};

/// The variable that puts a check script in its front mode.
const FRONT_URL: &str = "PGLEASE_FRONT_URL";
/// The user every driver names; the front accepts any, and logs in as the lease's role.
const CLIENT_USER: &str = "tester";
/// How long one driver's check may take (Go's first `go run` compiles pgx).
const CHECK_TIMEOUT: Duration = Duration::from_secs(300);

/// Waits until `/status` shows no open lease; returns those still open after 10 s.
async fn leases_left(daemon: &TestDaemon) -> Option<Vec<Value>> {
    let started = Instant::now();
    loop {
        let leases = daemon.open_leases().await;
        if leases.is_empty() {
            return None;
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Some(leases);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One driver's check: which driver, and the command that runs it.
struct Check {
    driver: String,
    command: Command,
}

/// The checks of the drivers whose tools are here, each run for one driver.
fn checks(front: SocketAddr) -> Vec<Check> {
    let url = format!("postgresql://{CLIENT_USER}@{front}/default");
    let mut checks = Vec::new();
    let mut add = |driver: &str, mut command: Command, url: &str| {
        command.env(FRONT_URL, url);
        checks.push(Check {
            driver: driver.to_owned(),
            command,
        });
    };

    if tool_available(
        "python3",
        "front drivers (Python)",
        "apt-get install python3",
    ) {
        for driver in ["psycopg", "psycopg2", "asyncpg", "sqlalchemy", "pg8000"] {
            let mut python = Command::new("python3");
            python
                .arg(drivers_dir().join("python/check.py"))
                .arg(driver);
            add(driver, python, &url);
        }
    }

    if node_drivers_available("front drivers (Node)") {
        for driver in ["pg", "postgres.js"] {
            let mut node = Command::new("node");
            node.arg(drivers_dir().join("node/check.mjs")).arg(driver);
            add(driver, node, &url);
        }
    }

    if tool_available(
        "java",
        "front drivers (Java)",
        "apt-get install default-jdk-headless",
    ) {
        match pgjdbc_jar() {
            Some(jar) => {
                let mut java = Command::new("java");
                java.arg("-cp")
                    .arg(jar)
                    .arg(drivers_dir().join("java/Check.java"));
                let jdbc = format!("jdbc:postgresql://{front}/default?user={CLIENT_USER}");
                add("pgjdbc", java, &jdbc);
            }
            None => {
                assert!(
                    std::env::var_os(REQUIRE_TOOLS).is_none(),
                    "pgjdbc is missing: mvn dependency:get -Dartifact=org.postgresql:postgresql:42.7.14"
                );
                eprintln!("SKIPPED front drivers (Java): no pgjdbc jar in ~/.m2");
            }
        }
    }

    if tool_available("go", "front drivers (Go)", "install Go (https://go.dev/dl)") {
        // The same pgx and lib/pq as clients/go/examples, whose `go mod download` in
        // .ci/run fills the module cache for both.
        let go_dir: PathBuf = drivers_dir().join("go");
        for driver in ["pgx", "lib/pq"] {
            let mut go = Command::new("go");
            go.args(["run", ".", driver]).current_dir(&go_dir);
            add(driver, go, &url);
        }
    }
    checks
}

/// Runs a check to its end (killed after [`CHECK_TIMEOUT`]); returns whether it succeeded
/// and what it printed.
async fn run(mut command: Command) -> (bool, String) {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let what = format!("{command:?}");
    let output = tokio::time::timeout(CHECK_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {CHECK_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The two databases of `ok <driver> <first> <second>`.
fn databases_of(driver: &str, text: &str) -> Option<[String; 2]> {
    let rest = text
        .lines()
        .find_map(|line| line.strip_prefix(&format!("ok {driver} ")))?;
    let mut names = rest.split_whitespace().map(str::to_owned);
    Some([names.next()?, names.next()?])
}

/// Whether the daemon logged `database` as leased at the front.
fn leased_at_the_front(log: &str, database: &str) -> bool {
    let field = format!("database={database}");
    log.lines().any(|line| {
        line.contains("leased at the PostgreSQL front")
            && line.split_whitespace().any(|word| word == field)
    })
}

#[tokio::test]
async fn every_driver_connects_through_the_front_on_default_options() {
    let (daemon, front) = daemon_with_front(&[]).await;
    let mut failures = Vec::new();
    let mut report = String::new();
    let mut seen = HashSet::new();
    for Check { driver, command } in checks(front) {
        let (ok, text) = run(command).await;
        report.push_str(&text);
        if !ok {
            failures.push(format!("{driver} failed:\n{text}"));
        } else {
            match databases_of(&driver, &text) {
                None => failures.push(format!("{driver}: no databases in {text:?}")),
                Some(databases) => {
                    for database in databases {
                        if !leased_at_the_front(&daemon.log(), &database) {
                            failures.push(format!("{driver}: {database} not leased at the front"));
                        }
                        // Each connection wrote a table, so its database was dropped, never
                        // handed out again: every connection of every driver had its own.
                        if !seen.insert(database.clone()) {
                            failures.push(format!("{driver}: {database} handed out twice"));
                        }
                    }
                }
            }
        }
        // The driver's connections are closed: their leases are released.
        if let Some(leases) = leases_left(&daemon).await {
            failures.push(format!("{driver}: leases left open: {leases:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "drivers that failed through the front:\n{}\n\nall output:\n{report}\ndaemon log:\n{}",
        failures.join("\n"),
        daemon.log()
    );
    eprintln!("{report}");
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn lib_pq_needs_no_sslmode_when_the_front_serves_tls() {
    if !tool_available("go", "lib/pq over TLS", "install Go (https://go.dev/dl)") {
        return;
    }
    let (daemon, front) = daemon_with_front(&["--front-tls", "self-signed"]).await;
    let driver = "lib/pq-tls";
    let mut go = Command::new("go");
    go.args(["run", ".", driver])
        .current_dir(drivers_dir().join("go"))
        .env(
            FRONT_URL,
            format!("postgresql://{CLIENT_USER}@{front}/default"),
        );
    let (ok, text) = run(go).await;
    let log = daemon.log();
    assert!(
        ok,
        "lib/pq on its default sslmode failed:\n{text}\ndaemon log:\n{log}"
    );
    let databases = databases_of(driver, &text).unwrap_or_else(|| panic!("{text}"));
    for database in databases {
        let field = format!("database={database}");
        assert!(
            log.lines()
                .any(|line| line.contains("leased at the PostgreSQL front")
                    && line.split_whitespace().any(|word| word == field)
                    && line.split_whitespace().any(|word| word == "tls=true")),
            "{database} leased over TLS: {log}"
        );
    }
    assert_eq!(leases_left(&daemon).await, None);
    assert!(daemon.stop().await.success());
}

/// Connects to `template` through the front; the connection runs in a task of its own, and
/// closes when the client is dropped.
async fn connect_to(front: SocketAddr, template: &str) -> Result<Client, tokio_postgres::Error> {
    let config = format!(
        "host={} port={} user={CLIENT_USER} dbname={template}",
        front.ip(),
        front.port()
    );
    let (client, connection) = tokio_postgres::connect(&config, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Connects to `default` through the front.
async fn connect(front: SocketAddr) -> Result<Client, tokio_postgres::Error> {
    connect_to(front, "default").await
}

/// Connects from a task, for connections that are meant to wait.
fn connect_in_background(
    front: SocketAddr,
) -> tokio::task::JoinHandle<Result<Client, tokio_postgres::Error>> {
    tokio::spawn(connect(front))
}

/// A refused connection's SQLSTATE and message.
fn refusal(error: &tokio_postgres::Error) -> (Option<&SqlState>, String) {
    let message = error
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_else(|| error.to_string());
    (error.code(), message)
}

#[tokio::test]
async fn a_connection_beyond_max_total_waits_the_default_wait_then_gets_53300() {
    let (daemon, front) = daemon_with_front(&["--min-ready", "1", "--max-total", "1"]).await;
    let holder = connect(front).await.expect("the first connection");
    let started = Instant::now();
    let waiting = connect_in_background(front);
    daemon.wait_for_waiting("default", 1).await;
    let error = waiting
        .await
        .expect("join")
        .expect_err("no room beyond --max-total");
    let waited = started.elapsed();
    let (code, message) = refusal(&error);
    assert_eq!(code, Some(&SqlState::TOO_MANY_CONNECTIONS), "{error}");
    assert!(
        message.contains("max_total") && message.contains("--max-total"),
        "the message names the limit: {message}"
    );
    // POST /lease's default wait_ms, 60 s: the front waits as an HTTP request would.
    assert!(
        waited >= Duration::from_secs(59) && waited < Duration::from_secs(90),
        "refused after {waited:?}"
    );
    // The refused connection took nothing; the holder's lease is the only one.
    assert_eq!(daemon.open_leases().await.len(), 1);
    assert_ne!(current_database(&holder).await, "default");
    drop(holder);
    assert_eq!(leases_left(&daemon).await, None);
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn leases_over_http_and_connections_at_the_front_share_the_budgets() {
    let (daemon, front) =
        daemon_with_front(&["--min-ready", "1", "--max-total", "2", "--max-waiting", "1"]).await;
    // One lease over HTTP and one connection at the front fill --max-total 2.
    let over_http = daemon.lease_ok("default").await;
    let first = connect(front)
        .await
        .expect("a connection within the budget");

    // The front's connection counts against HTTP's requests...
    let (status, body) = daemon
        .lease(json!({ "template": "default", "wait_ms": 300 }))
        .await;
    assert_eq!(status, 504, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_total")),
        "{body}"
    );

    // ...and the HTTP lease against the front's connections: the next one waits...
    let second = connect_in_background(front);
    daemon.wait_for_waiting("default", 1).await;
    assert!(!second.is_finished());
    // ...and one more is refused at once: --max-waiting is full, for both.
    let started = Instant::now();
    let error = connect(front).await.expect_err("no room to wait");
    let (code, message) = refusal(&error);
    assert_eq!(code, Some(&SqlState::TOO_MANY_CONNECTIONS), "{error}");
    assert!(message.contains("already waiting"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let (status, body) = daemon.lease(json!({ "template": "default" })).await;
    assert_eq!(status, 429, "{body}");

    // An HTTP release lets the waiting connection in.
    let (status, _) = daemon.release(&id_of(&over_http), false).await;
    assert_eq!(status, 204);
    let second = second.await.expect("join").expect("in after the release");
    let first_db = current_database(&first).await;
    let second_db = current_database(&second).await;
    assert_ne!(first_db, second_db);

    // A closed connection lets a waiting connection in...
    let third = connect_in_background(front);
    daemon.wait_for_waiting("default", 1).await;
    drop(first);
    let third = third
        .await
        .expect("join")
        .expect("in after a connection closed");
    assert_ne!(current_database(&third).await, "default");

    // ...and a waiting HTTP request.
    let waiter = daemon.lease_in_background(json!({ "template": "default", "wait_ms": 20000 }));
    daemon.wait_for_waiting("default", 1).await;
    drop(second);
    let answer = waiter.await.expect("waiter");
    assert_eq!(answer.status, 201, "{answer:?}");

    let (status, _) = daemon.release(&id_of(&answer.body), false).await;
    assert_eq!(status, 204);
    drop(third);
    poll_until(Duration::from_secs(10), "every lease released", || async {
        daemon.open_leases().await.is_empty().then_some(())
    })
    .await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn the_byte_budget_refuses_a_connection_at_the_front_with_53300() {
    // As in budget.rs: an empty database is ~7.5 MB, 40 MB hold five.
    let (daemon, front) = daemon_with_front(&[
        "--max-bytes",
        "40M",
        "--min-ready",
        "3",
        "--max-total",
        "20",
        "--template",
        "other=empty",
    ])
    .await;
    poll_until(Duration::from_secs(10), "default's warm clones", || async {
        (daemon.template_status("default").await["ready"] == 3).then_some(())
    })
    .await;
    // Connections until nothing more fits: refused, not kept waiting.
    let mut held = Vec::new();
    let error = loop {
        let started = Instant::now();
        match connect_to(front, "other").await {
            Ok(client) => held.push(client),
            Err(error) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "refused only after {:?}",
                    started.elapsed()
                );
                break error;
            }
        }
        assert!(held.len() < 10, "the budget never filled");
    };
    assert!(!held.is_empty(), "no connection fitted: {error}");
    let (code, message) = refusal(&error);
    assert_eq!(code, Some(&SqlState::TOO_MANY_CONNECTIONS), "{error}");
    assert!(message.contains("budget"), "{message}");
    assert_eq!(daemon.open_leases().await.len(), held.len());
    // The same budget over HTTP.
    let (status, body) = daemon
        .lease(json!({ "template": "other", "wait_ms": 2000 }))
        .await;
    assert_eq!(status, 507, "{body}");

    // A closed connection makes room for the next.
    held.pop();
    let next = poll_until(
        Duration::from_secs(10),
        "room for another connection",
        || async { connect_to(front, "other").await.ok() },
    )
    .await;
    assert_ne!(current_database(&next).await, "other");
    drop((held, next));
    assert_eq!(leases_left(&daemon).await, None);
    assert!(daemon.stop().await.success());
}
