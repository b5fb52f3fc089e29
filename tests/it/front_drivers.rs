//! The driver matrix through the PostgreSQL front (issue 30). Every driver of `drivers.rs`
//! connects to `postgresql://tester@<front>/default` on its default options — the same check
//! scripts in tests/drivers, in their front mode (`PGLEASE_FRONT_URL`), and Go's pgx and
//! lib/pq from tests/drivers/go — and every lease it took is released when its connections
//! close.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Command;

use crate::drivers::{drivers_dir, pgjdbc_jar};
use crate::support::{tool_available, TestDaemon, REQUIRE_TOOLS};

/// The variable that puts a check script in its front mode.
const FRONT_URL: &str = "PGLEASE_FRONT_URL";
/// The user every driver names; the front accepts any, and logs in as the lease's role.
const CLIENT_USER: &str = "tester";
/// How long one driver's check may take (Go's first `go run` compiles pgx).
const CHECK_TIMEOUT: Duration = Duration::from_secs(300);

/// A daemon with the front on a port of its own.
async fn daemon_with_front() -> (TestDaemon, SocketAddr) {
    let daemon = TestDaemon::builder()
        .args(["--front-listen", "127.0.0.1:0"])
        .start()
        .await;
    let front = daemon.front_address().await;
    (daemon, front)
}

/// The open leases `/status` shows.
async fn open_leases(daemon: &TestDaemon) -> Vec<Value> {
    daemon.status().await["leases"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until `/status` shows no open lease; returns those still open after 10 s.
async fn leases_left(daemon: &TestDaemon) -> Option<Vec<Value>> {
    let started = Instant::now();
    loop {
        let leases = open_leases(daemon).await;
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

    if tool_available("node", "front drivers (Node)", "apt-get install nodejs npm") {
        if drivers_dir().join("node/node_modules/postgres").is_dir() {
            for driver in ["pg", "postgres.js"] {
                let mut node = Command::new("node");
                node.arg(drivers_dir().join("node/check.mjs")).arg(driver);
                add(driver, node, &url);
            }
        } else {
            assert!(
                std::env::var_os(REQUIRE_TOOLS).is_none(),
                "the Node drivers are missing: (cd tests/drivers/node && npm install)"
            );
            eprintln!("SKIPPED front drivers (Node): (cd tests/drivers/node && npm install)");
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
    let (daemon, front) = daemon_with_front().await;
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
