//! What the embedded server inherits from the daemon: postgres and its backends run with
//! `PATH` and the locale only, so that no process of the server's OS user can read the
//! daemon's API token or a CI job's secrets from `/proc/<pid>/environ`.

use crate::support::{connect, TestDaemon};

/// The API token the daemon gets from its environment.
const TOKEN: &str = "env-token-that-must-not-leak";
/// A CI job's secret in the daemon's environment.
const SECRET: &str = "ci-deploy-key-that-must-not-leak";

/// The environment of process `pid`, as `NAME=value` entries.
fn environ_of(pid: u32) -> Vec<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/environ: {e}"));
    bytes
        .split(|&b| b == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| String::from_utf8_lossy(entry).into_owned())
        .collect()
}

/// Asserts that `environ` (of `what`) holds neither the token nor the secret, nor the
/// daemon's `HOME`.
fn assert_clean(environ: &[String], what: &str) {
    for entry in environ {
        assert!(
            !entry.contains(TOKEN) && !entry.contains(SECRET),
            "{what}'s environment holds a secret of the daemon's: {entry}"
        );
        let name = entry.split('=').next().unwrap_or_default();
        assert!(
            !matches!(name, "PGLEASE_TOKEN" | "CI_DEPLOY_KEY" | "HOME" | "USER"),
            "{what}'s environment holds the daemon's {name}: {environ:?}"
        );
    }
}

#[tokio::test]
async fn postgres_gets_none_of_the_daemons_secrets() {
    let daemon = TestDaemon::builder()
        .token_in_env(TOKEN)
        .env("CI_DEPLOY_KEY", SECRET)
        .env("HOME", "/root/not-for-postgres")
        .start()
        .await;
    // The daemon itself has them, so their absence below is the server's clean start.
    let own = environ_of(daemon.pid());
    assert!(own
        .iter()
        .any(|entry| entry == &format!("PGLEASE_TOKEN={TOKEN}")));
    assert!(own
        .iter()
        .any(|entry| entry == &format!("CI_DEPLOY_KEY={SECRET}")));

    let postmaster = daemon.status().await["postgres"]["pid"]
        .as_u64()
        .expect("postgres pid") as u32;
    let environ = environ_of(postmaster);
    assert_clean(&environ, "the postmaster");
    assert!(
        environ.iter().any(|entry| entry.starts_with("PATH=")),
        "the postmaster has no PATH: {environ:?}"
    );

    // A backend serving a lease holder: the process whose environment the holder's own
    // queries run in. Postgres writes its process title over the area /proc shows (the
    // environment itself moves elsewhere, a copy of the postmaster's), so this mostly
    // shows that nothing of the daemon's is left there.
    let lease = daemon.lease_ok("default").await;
    let client = connect(&lease).await.expect("connect with the lease");
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid")
        .get(0);
    assert_clean(&environ_of(backend as u32), "a lease holder's backend");
    drop(client);
    assert!(daemon.stop().await.success());
}
