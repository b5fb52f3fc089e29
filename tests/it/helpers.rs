//! The client helpers in `clients/` (Go, Python/pytest, Node), each running its own test
//! suite — a small real suite of parallel tests — against a real daemon serving the migrated
//! template `app` of clients/testdata/migrations. `.ci/run` installs what each needs.

use std::path::{Path, PathBuf};

use crate::support::{test_python, tool_available, TestDaemon, TEST_PYTHON_INSTALL};

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients")
}

/// A daemon serving `app` on default options (which every driver accepts: lib/pq, among
/// the Go examples, wants at least 1000 SCRAM iterations and sslmode=disable in the URL),
/// guarded by a token as on a shared CI host: the suites match
/// their leases in `/status` and `/kept` by id, which only a token holder is shown
/// (docs/security.md), and each helper must send the token it finds in PGLEASE_TOKEN.
async fn daemon() -> TestDaemon {
    let migrations = clients_dir().join("testdata/migrations");
    TestDaemon::builder()
        .args([
            "--template",
            &format!("app=migrations:{}", migrations.display()),
            "--min-ready",
            "4",
        ])
        .token("helpers-token")
        .start()
        .await
}

/// Runs a suite's command with PGLEASE_URL set; fails with its output unless it succeeds.
async fn run_suite(daemon: &TestDaemon, dir: PathBuf, program: &str, args: &[&str]) -> String {
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .current_dir(&dir)
        .env("PGLEASE_URL", &daemon.base)
        .env("PGLEASE_BIN", env!("CARGO_BIN_EXE_pglease"))
        .env("PGLEASE_TOKEN", daemon.token.as_deref().unwrap_or_default());
    let what = format!("{program} {}", args.join(" "));
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} in {} failed ({}):\n{stdout}\n{}\ndaemon log:\n{}",
        program,
        dir.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    stdout
}

/// No lease of the suite is left open, and nothing is kept but what it meant to keep.
async fn assert_all_released(daemon: &TestDaemon) {
    let status = daemon.status().await;
    assert_eq!(
        status["leases"].as_array().map(Vec::len),
        Some(0),
        "leases left open: {status}"
    );
}

#[tokio::test]
async fn the_go_helper_suite_passes_against_a_real_daemon() {
    let test = "the_go_helper_suite_passes_against_a_real_daemon";
    if !tool_available("go", test, "install Go (https://go.dev/dl)") {
        return;
    }
    let daemon = daemon().await;
    let go = clients_dir().join("go");
    run_suite(&daemon, go.clone(), "go", &["test", "-count=1", "./..."]).await;
    run_suite(
        &daemon,
        go.join("examples"),
        "go",
        &["test", "-count=1", "./..."],
    )
    .await;
    assert_all_released(&daemon).await;
    assert!(daemon.stop().await.success());
}

/// Whether the tests' Python ([`test_python`]) can import the plugin and what its tests use
/// (installed by `.ci/run`).
fn python_suite_ready(test: &str) -> bool {
    let found = std::process::Command::new(test_python())
        .args([
            "-c",
            "import pytest_pglease, psycopg, xdist, django, pytest_django",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os(crate::support::REQUIRE_TOOLS).is_none(),
            "pytest-pglease and what its tests use are required here: {TEST_PYTHON_INSTALL}"
        );
        eprintln!("SKIPPED {test}: {TEST_PYTHON_INSTALL}");
    }
    found
}

#[tokio::test]
async fn the_pytest_plugin_suite_passes_against_a_real_daemon() {
    let test = "the_pytest_plugin_suite_passes_against_a_real_daemon";
    if !python_suite_ready(test) {
        return;
    }
    let daemon = daemon().await;
    run_suite(
        &daemon,
        clients_dir().join("python"),
        &test_python(),
        &["-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
    )
    .await;
    assert_all_released(&daemon).await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn the_node_helper_suite_passes_against_a_real_daemon() {
    let test = "the_node_helper_suite_passes_against_a_real_daemon";
    let node = clients_dir().join("node");
    let installed = node.join("node_modules/.bin/vitest").is_file();
    if !tool_available("node", test, "install Node.js") || !installed {
        assert!(
            std::env::var_os(crate::support::REQUIRE_TOOLS).is_none(),
            "clients/node's dev dependencies are required here: cd clients/node && npm install"
        );
        eprintln!("SKIPPED {test}: cd clients/node && npm install");
        return;
    }
    let daemon = daemon().await;
    run_suite(&daemon, node, "node", &["test/run.mjs"]).await;
    assert_all_released(&daemon).await;
    assert!(daemon.stop().await.success());
}
