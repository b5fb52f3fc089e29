//! The driver matrix (issue 26): a daemon on default options, one lease, and every
//! mainstream driver the package registries give CI connecting with the lease answer exactly
//! as docs/using-from-tests.md tells its users to — the `url` as it is, `jdbc_url` for Java,
//! the fields for pg8000. `.ci/run` installs the drivers: Python's from PyPI, Node's into
//! tests/drivers/node from npm, pgjdbc from Maven Central; Go's pgx and lib/pq run in the Go
//! helper's examples (`helpers.rs`), on the same defaults.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::{tool_available, TestDaemon, REQUIRE_TOOLS};

/// The check scripts' directory, tests/drivers (`front_drivers.rs` runs them too).
pub(crate) fn drivers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drivers")
}

/// Runs one language's check with the lease in PGLEASE_LEASE; returns its `ok`/`FAIL` lines.
fn run_check(mut command: Command, lease: &Value) -> (bool, String) {
    let output = command
        .env("PGLEASE_LEASE", lease.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// pgjdbc's jar: `PGLEASE_PGJDBC_JAR`, else the newest in the local Maven repository
/// (`mvn dependency:get -Dartifact=org.postgresql:postgresql:<version>` puts it there).
pub(crate) fn pgjdbc_jar() -> Option<PathBuf> {
    if let Some(jar) = std::env::var_os("PGLEASE_PGJDBC_JAR") {
        return Some(PathBuf::from(jar));
    }
    let home = std::env::var_os("HOME")?;
    let dir = Path::new(&home).join(".m2/repository/org/postgresql/postgresql");
    let mut jars: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|version| {
            let name = version.file_name().to_string_lossy().into_owned();
            let jar = version.path().join(format!("postgresql-{name}.jar"));
            jar.is_file().then_some(jar)
        })
        .collect();
    jars.sort();
    jars.pop()
}

/// Whether node and the Node drivers (tests/drivers/node/node_modules) are here; without
/// them `test` is skipped, or fails where CI requires every tool (`REQUIRE_TOOLS`).
pub(crate) fn node_drivers_available(test: &str) -> bool {
    if !tool_available("node", test, "apt-get install nodejs npm") {
        return false;
    }
    if drivers_dir().join("node/node_modules/postgres").is_dir() {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_TOOLS).is_none(),
        "the Node drivers are missing: (cd tests/drivers/node && npm install)"
    );
    eprintln!("SKIPPED {test}: (cd tests/drivers/node && npm install)");
    false
}

#[tokio::test]
async fn every_driver_connects_with_the_lease_answer_on_default_options() {
    let daemon = TestDaemon::start().await;
    let lease = daemon.lease_ok("default").await;
    let mut results = Vec::new();

    if tool_available("python3", "drivers (Python)", "apt-get install python3") {
        let mut python = Command::new("python3");
        python.arg(drivers_dir().join("python/check.py"));
        results.push(run_check(python, &lease));
    }

    if node_drivers_available("drivers (Node)") {
        let mut node = Command::new("node");
        node.arg(drivers_dir().join("node/check.mjs"));
        results.push(run_check(node, &lease));
    }

    if tool_available(
        "java",
        "drivers (Java)",
        "apt-get install default-jdk-headless",
    ) {
        match pgjdbc_jar() {
            Some(jar) => {
                let mut java = Command::new("java");
                java.arg("-cp")
                    .arg(jar)
                    .arg(drivers_dir().join("java/Check.java"))
                    .arg(lease["jdbc_url"].as_str().expect("a jdbc_url"))
                    .arg(lease["user"].as_str().expect("a user"));
                results.push(run_check(java, &lease));
            }
            None => {
                assert!(
                    std::env::var_os(REQUIRE_TOOLS).is_none(),
                    "pgjdbc is missing: mvn dependency:get -Dartifact=org.postgresql:postgresql:42.7.14"
                );
                eprintln!("SKIPPED drivers (Java): no pgjdbc jar in ~/.m2");
            }
        }
    }

    let report: String = results.iter().map(|(_, text)| text.as_str()).collect();
    assert!(
        results.iter().all(|(ok, _)| *ok),
        "drivers that failed on the lease answer:\n{report}"
    );
    eprintln!("{report}");
    assert!(daemon.stop().await.success());
}
