//! Server binaries on demand: `--postgres-version` picks a major the machine does not have
//! (downloaded from Maven Central, or taken from the cache a previous run filled), and a
//! machine with no PostgreSQL at all still serves, and so does the tests' own plain server
//! (`PlainPostgres`, for `--postgres-url` tests). These use the daemon's default cache root,
//! not the tests' own, so that a machine downloads each release once.

use std::time::Duration;

use crate::support::{
    binary, connect, poll_until, scratch_dir, PlainPostgres, TestDaemon, PG_BIN_ENV,
};

/// The value of a one-row, one-column query on a lease.
async fn query_text(lease: &serde_json::Value, sql: &str) -> String {
    let client = connect(lease).await.expect("connect with the lease");
    let row = client.query_one(sql, &[]).await.expect("query");
    row.get(0)
}

/// The `using PostgreSQL server binaries` line of the daemon's log.
async fn binaries_line(daemon: &TestDaemon) -> String {
    poll_until(Duration::from_secs(5), "the binaries log line", || async {
        daemon
            .log()
            .lines()
            .find(|line| line.contains("using PostgreSQL server binaries"))
            .map(str::to_owned)
    })
    .await
}

#[tokio::test]
async fn postgres_version_16_runs_a_16_server() {
    let daemon = TestDaemon::builder()
        .args(["--postgres-version", "16"])
        .default_cache()
        .no_pg_bin_dir()
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let version = query_text(&lease, "SELECT current_setting('server_version_num')").await;
    assert!(version.starts_with("16"), "server_version_num {version}");
    let line = binaries_line(&daemon).await;
    assert!(line.contains("requested=16"), "{line}");
    assert!(daemon.stop().await.success());
}

/// Mounts an empty tmpfs on Debian's server directory, then runs its arguments: with an
/// empty PATH (no pg_config, no postgres), in a private mount namespace (`unshare -m`),
/// nothing is installed as far as pglease-binaries can tell.
const HIDE_INSTALLED: &str = "if [ -d /usr/lib/postgresql ]; then \
                              /bin/mount -t tmpfs none /usr/lib/postgresql || exit 1; fi; \
                              exec \"$0\" \"$@\"";

#[tokio::test]
async fn a_machine_without_postgresql_still_leases() {
    // Tests run as root, which unshare and mount need.
    let empty_path = scratch_dir("no-postgres-path");
    let daemon = TestDaemon::builder()
        .default_cache()
        .no_pg_bin_dir()
        .wrapped_in("/usr/bin/unshare", ["-m", "/bin/sh", "-c", HIDE_INSTALLED])
        .env("PATH", empty_path.to_str().expect("utf8"))
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let version = query_text(&lease, "SELECT version()").await;
    assert!(version.starts_with("PostgreSQL 1"), "{version}");
    let line = binaries_line(&daemon).await;
    assert!(
        line.contains("origin=cached") || line.contains("origin=downloaded"),
        "{line}"
    );
    assert!(line.contains("/binaries/postgresql-"), "{line}");
    assert!(daemon.stop().await.success());
}

/// The plain server starts and serves, from whatever binaries it found (which it prints).
/// [`the_plain_server_runs_on_a_machine_without_postgresql`] runs this test again, with no
/// server installed.
#[tokio::test]
async fn the_plain_server_serves() {
    let server = PlainPostgres::start("serves");
    eprintln!("plain server binaries: {}", server.bin_dir.display());
    let row = server
        .connect()
        .await
        .query_one("SELECT version()", &[])
        .await
        .expect("query the plain server");
    let version: String = row.get(0);
    assert!(version.starts_with("PostgreSQL 1"), "{version}");
}

#[test]
fn the_plain_server_runs_on_a_machine_without_postgresql() {
    // This test binary, run again for the one test above, with nothing installed and no
    // PGLEASE_PG_BIN_DIR: the plain server must then find the daemon's cached or downloaded
    // binaries, as `pglease serve` does.
    let empty_path = scratch_dir("no-postgres-path-plain");
    let output = std::process::Command::new("/usr/bin/unshare")
        .args(["-m", "/bin/sh", "-c", HIDE_INSTALLED])
        .arg(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "binaries::the_plain_server_serves",
            "--nocapture",
        ])
        .env("PATH", &empty_path)
        .env_remove(PG_BIN_ENV)
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the test ran: {stdout}");
    assert!(
        stderr.contains("plain server binaries: ") && stderr.contains("/binaries/postgresql-"),
        "binaries from the cache: {stderr}"
    );
}

#[tokio::test]
async fn postgres_fetch_prints_a_bin_dir_and_list_shows_it() {
    // As root the cache is /var/cache/pglease whatever XDG_CACHE_HOME says: postgres runs
    // as another OS user, who could not get through /root to the binaries.
    let fetched = binary()
        .args(["postgres", "fetch", "16"])
        .env("XDG_CACHE_HOME", "/root/.cache")
        .output()
        .expect("run pglease postgres fetch");
    let stderr = String::from_utf8_lossy(&fetched.stderr);
    assert!(fetched.status.success(), "{stderr}");
    let bin_dir = String::from_utf8_lossy(&fetched.stdout).trim().to_owned();
    if nix::unistd::geteuid().is_root() {
        assert!(bin_dir.starts_with("/var/cache/pglease/"), "{bin_dir}");
    }
    assert!(
        std::path::Path::new(&bin_dir).join("postgres").is_file(),
        "{bin_dir:?} {stderr}"
    );
    let listed = binary()
        .args(["postgres", "list"])
        .output()
        .expect("run pglease postgres list");
    assert!(listed.status.success());
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed
            .lines()
            .any(|line| line.starts_with("cached") && line.ends_with(&bin_dir)),
        "{listed}"
    );
    let bad = binary()
        .args(["postgres", "fetch", "12"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2), "clap refuses it");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("13 to 18"));
}
