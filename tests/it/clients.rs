//! Real IntegreSQL client libraries, installed from their registries by `.ci/run`, driven
//! against the daemon's `--integresql-listen` port: the npm `@devoxa/integresql-client`
//! (tests/clients/js/flow.mjs) and PyPI's `integresql-client-python`
//! (tests/clients/python/flow.py). Each script checks its own flow and prints its counts.

use std::path::{Path, PathBuf};

use crate::support::{tool_available, TestDaemon, INTEGRESQL_ROLE_ARGS, REQUIRE_TOOLS};

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// A daemon serving the IntegreSQL API on a port of its own, and that port's address.
async fn daemon() -> (TestDaemon, String) {
    let daemon = TestDaemon::builder()
        .args(["--integresql-listen", "127.0.0.1:0"])
        .start()
        .await;
    let address = daemon.integresql_address().await;
    (daemon, address)
}

/// Whether a library is installed; like `tool_available`, a skip outside CI, a failure in it.
fn installed(what: &str, found: bool, test: &str, hint: &str) -> bool {
    if !found {
        assert!(
            std::env::var_os(REQUIRE_TOOLS).is_none(),
            "{what} is required here ({REQUIRE_TOOLS} is set): {hint}"
        );
        eprintln!("SKIPPED {test}: {what} not installed ({hint}; bash .ci/run installs it)");
    }
    found
}

/// tests/clients/js, if node and the npm client are installed (see [`installed`]).
fn npm_client(test: &str) -> Option<PathBuf> {
    let js = clients_dir().join("js");
    let found = tool_available("node", test, "install Node.js")
        && installed(
            "@devoxa/integresql-client",
            js.join("node_modules/@devoxa/integresql-client").is_dir(),
            test,
            "cd tests/clients/js && npm ci",
        );
    found.then_some(js)
}

async fn run(mut command: std::process::Command) -> String {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run the client script");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the client flow failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test]
async fn the_npm_integresql_client_runs_its_flow_unchanged() {
    let test = "the_npm_integresql_client_runs_its_flow_unchanged";
    let Some(js) = npm_client(test) else {
        return;
    };
    let (daemon, address) = daemon().await;
    let mut command = std::process::Command::new("node");
    command
        .arg("flow.mjs")
        .current_dir(&js)
        .env("PGLEASE_INTEGRESQL_URL", format!("http://{address}/"));
    let out = run(command).await;
    let counts: serde_json::Value =
        serde_json::from_str(out.trim()).expect("the flow prints one JSON line");
    assert_eq!(counts["migrations"], 1, "{counts}");
    assert_eq!(counts["parallel"], 20, "{counts}");
    assert_eq!(counts["after_discard"], 410, "{counts}");
    assert!(!daemon.log().contains(" ERROR "), "{}", daemon.log());
}

#[tokio::test]
async fn the_python_integresql_client_runs_its_flow_unchanged() {
    let test = "the_python_integresql_client_runs_its_flow_unchanged";
    let found = std::process::Command::new("python3")
        .args(["-c", "import integresql_client_python"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed(
        "integresql-client-python",
        found,
        test,
        "pip install integresql-client-python",
    ) {
        return;
    }
    let (daemon, address) = daemon().await;
    let mut command = std::process::Command::new("python3");
    command
        .arg(clients_dir().join("python/flow.py"))
        .env("PGLEASE_INTEGRESQL_URL", format!("http://{address}/api"));
    let out = run(command).await;
    let counts: serde_json::Value =
        serde_json::from_str(out.trim()).expect("the flow prints one JSON line");
    assert_eq!(counts["migrations"], 1, "{counts}");
    assert_eq!(counts["tests"], 10, "{counts}");
    assert_eq!(
        counts["distinct_ids"], 1,
        "one database, given back and got again: {counts}"
    );
    assert!(!daemon.log().contains(" ERROR "), "{}", daemon.log());
}

/// The shape of a real suite that stalled (issue 18): 12 packages with a template each, 25
/// tests per package that take a test database and never give it back — 300 databases, far
/// more than the connection budget holds — against default options. No request may fail.
#[tokio::test]
async fn a_suite_that_never_gives_databases_back_runs_without_a_timeout() {
    let test = "a_suite_that_never_gives_databases_back_runs_without_a_timeout";
    let Some(js) = npm_client(test) else {
        return;
    };
    let (daemon, address) = daemon().await;
    let mut command = std::process::Command::new("node");
    command
        .args(["suite.mjs", "12", "25"])
        .current_dir(&js)
        .env("PGLEASE_INTEGRESQL_URL", format!("http://{address}/"));
    let out = run(command).await;
    let counts: serde_json::Value =
        serde_json::from_str(out.trim()).expect("the suite prints one JSON line");
    assert_eq!(counts["passed"], 300, "{counts}");
    assert_eq!(counts["migrations"], 12, "{counts}");
    let limits = daemon.status().await["limits"].clone();
    assert!(
        limits["reclaimed"].as_u64().is_some_and(|n| n > 0),
        "past the connection budget, test databases were recreated: {limits}"
    );
    assert_eq!(limits["refused"]["connection_budget"], 0, "{limits}");
    assert!(daemon.stop().await.success());
}

/// Issue 26: a suite that loads a dump into its template with `psql` and the PG* variables
/// of its whole run (allaboutapps' go-starter: `cat dump.sql | psql <template>`), as
/// IntegreSQL's shared user allows, runs unchanged once the daemon has the role those
/// variables name (`--integresql-pg-user`/`--integresql-pg-password`). The dump's owner
/// statements name that role; what it made is the test databases' to change.
#[tokio::test]
async fn a_dump_loads_with_psql_and_the_runs_pg_variables_set_once() {
    let test = "a_dump_loads_with_psql_and_the_runs_pg_variables_set_once";
    if !tool_available("psql", test, "install postgresql-client") {
        return;
    }
    let Some(js) = npm_client(test) else {
        return;
    };
    let daemon = TestDaemon::builder()
        .args(["--integresql-listen", "127.0.0.1:0"])
        .args(INTEGRESQL_ROLE_ARGS)
        .start()
        .await;
    let address = daemon.integresql_address().await;
    let postgres = daemon.status().await["servers"][0]["postgres"].clone();
    let mut command = std::process::Command::new("node");
    command
        .arg("dump.mjs")
        .current_dir(&js)
        .env("PGLEASE_INTEGRESQL_URL", format!("http://{address}/"))
        .env("PGHOST", postgres["host"].as_str().expect("host"))
        .env("PGPORT", postgres["port"].to_string())
        .env("PGUSER", "dbuser")
        .env("PGPASSWORD", "dbpass");
    let out = run(command).await;
    let counts: serde_json::Value =
        serde_json::from_str(out.trim()).expect("the suite prints one JSON line");
    assert_eq!(counts["loads"], 1, "{counts}");
    assert_eq!(counts["tests"], 5, "{counts}");
    assert!(!daemon.log().contains(" ERROR "), "{}", daemon.log());
    assert!(daemon.stop().await.success());
}
