//! Snapshots for cold runners (`--snapshot-dir`): a clean stop writes the cluster with its
//! built templates; the next start uses a template whose sources are unchanged without
//! building it, builds again one whose sources changed (the snapshot's version is never
//! leased), and starts fresh from a damaged snapshot, replacing it at its stop.

use std::fs;
use std::path::{Path, PathBuf};

use crate::support::{connect, scratch_dir, TestDaemon};

/// A migration that records a random value when it runs: a rebuilt template has another.
const FIRST: &str = "CREATE TABLE built (token text NOT NULL);\n\
                     INSERT INTO built SELECT md5(random()::text);\n";

fn migrations(dir: &Path) -> PathBuf {
    let migrations = dir.join("migrations");
    fs::create_dir_all(&migrations).expect("mkdir");
    fs::write(migrations.join("001_built.sql"), FIRST).expect("write");
    migrations
}

async fn daemon(snapshots: &Path, migrations: &Path) -> TestDaemon {
    TestDaemon::builder()
        .args([
            "--snapshot-dir",
            &snapshots.display().to_string(),
            "--template",
            &format!("app=migrations:{}", migrations.display()),
        ])
        .start()
        .await
}

/// The token the lease's template recorded when it was built.
async fn token(daemon: &TestDaemon) -> String {
    let lease = daemon.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one("SELECT token FROM built", &[])
        .await
        .expect("query");
    row.get(0)
}

fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "pgsnap"));
    files
}

#[tokio::test]
async fn a_snapshot_is_used_while_its_sources_are_unchanged_and_never_after() {
    let dir = scratch_dir("snapshot-adopt");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);

    // A cold runner: built from the migrations, saved at the stop.
    let first = daemon(&snapshots, &migrations).await;
    let built = token(&first).await;
    let (status, log) = first.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("wrote the snapshot"), "{log}");
    let files = snapshot_files(&snapshots);
    assert_eq!(files.len(), 1, "{files:?}");
    let written = fs::metadata(&files[0])
        .expect("stat")
        .modified()
        .expect("mtime");

    // The next runner: the same template, not built again.
    let second = daemon(&snapshots, &migrations).await;
    assert_eq!(token(&second).await, built, "the template was built again");
    let (status, log) = second.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("started from the snapshot"), "{log}");
    assert!(log.contains("template already built template=app"), "{log}");
    assert!(!log.contains("template built template=app"), "{log}");
    // Nothing changed: the file is left alone.
    assert!(log.contains("the snapshot is up to date"), "{log}");
    let unchanged = fs::metadata(&files[0])
        .expect("stat")
        .modified()
        .expect("mtime");
    assert_eq!(written, unchanged);

    // The sources change: the snapshot's version is dropped, the template built anew.
    fs::write(
        migrations.join("002_more.sql"),
        "CREATE TABLE added (id int);\n",
    )
    .expect("write");
    let third = daemon(&snapshots, &migrations).await;
    let lease = third.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect");
    let rebuilt: String = client
        .query_one("SELECT token FROM built", &[])
        .await
        .expect("query")
        .get(0);
    assert_ne!(rebuilt, built, "a stale snapshot's template was leased");
    client
        .execute("SELECT * FROM added", &[])
        .await
        .expect("the new migration ran");
    drop(client);
    let (status, log) = third.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("built from other sources"), "{log}");
    assert!(log.contains("template built template=app"), "{log}");
    // ... and saved for the runner after.
    assert!(log.contains("wrote the snapshot"), "{log}");
    let fourth = daemon(&snapshots, &migrations).await;
    assert_eq!(token(&fourth).await, rebuilt);
    assert!(fourth.stop().await.success());
    let _ = fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_damaged_snapshot_is_ignored_and_replaced_at_the_stop() {
    let dir = scratch_dir("snapshot-damaged");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let first = daemon(&snapshots, &migrations).await;
    token(&first).await;
    assert!(first.stop().await.success());
    let files = snapshot_files(&snapshots);
    assert_eq!(files.len(), 1, "{files:?}");
    let path = files[0].clone();
    let good = fs::read(&path).expect("read");

    // Cut in half: its MAC is gone with its end, nothing of it is read.
    fs::write(&path, &good[..good.len() / 2]).expect("write");
    let second = daemon(&snapshots, &migrations).await;
    token(&second).await;
    let (status, log) = second.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(
        log.contains("passing over the snapshot, none of it is used: it carries no MAC"),
        "{log}"
    );
    assert!(log.contains("template built template=app"), "{log}");
    assert!(log.contains("wrote the snapshot"), "{log}");

    // Not a snapshot at all.
    fs::write(&path, b"this is not a snapshot").expect("write");
    let third = daemon(&snapshots, &migrations).await;
    token(&third).await;
    let (status, log) = third.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("not a pglease snapshot at all"), "{log}");
    assert!(log.contains("wrote the snapshot"), "{log}");
    assert!(fs::read(&path).expect("read").len() > 1000);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn snapshot_dir_is_refused_beside_an_external_server_or_keep_data() {
    let (status, log) = TestDaemon::builder()
        .args([
            "--snapshot-dir",
            "/tmp/x",
            "--postgres-url",
            "postgres://postgres@127.0.0.1:1/postgres",
        ])
        .run_to_exit();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("external server"), "{log}");
    let (status, log) = TestDaemon::builder()
        .args([
            "--snapshot-dir",
            "/tmp/x",
            "--keep-data",
            "--data-dir",
            "/dev/shm/x",
        ])
        .run_to_exit();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("--keep-data"), "{log}");
}

/// `pglease snapshot ARGS…` with the tests' initdb cache (and binaries); (status, stdout,
/// stderr).
async fn snapshot_command(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let mut command = crate::support::binary();
    command.arg("snapshot").args(args);
    // The tests' cache root holds the key their daemons use.
    command.arg("--cache-dir").arg(crate::support::cache_dir());
    if args.first() == Some(&"save") {
        if let Ok(bin_dir) = std::env::var(crate::support::PG_BIN_ENV) {
            command.arg("--pg-bin-dir").arg(bin_dir);
        }
    }
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run pglease snapshot");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn snapshot_save_builds_without_serving_and_serve_starts_from_it() {
    let dir = scratch_dir("snapshot-save");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let template = format!("app=migrations:{}", migrations.display());
    let snapshot_dir = snapshots.display().to_string();
    let args = [
        "save",
        "--snapshot-dir",
        &snapshot_dir,
        "--template",
        &template,
    ];
    let (status, stdout, stderr) = snapshot_command(&args).await;
    assert!(status.success(), "{stderr}");
    let path = PathBuf::from(stdout.trim());
    assert_eq!(snapshot_files(&snapshots), vec![path.clone()], "{stdout}");

    // show names the template and its fingerprint.
    let (status, shown, stderr) = snapshot_command(&["show", &snapshot_dir]).await;
    assert!(status.success(), "{stderr}");
    assert!(
        shown.contains("app ") && shown.contains("postgres "),
        "{shown}"
    );

    // serve starts from it without building.
    let daemon = daemon(&snapshots, &migrations).await;
    token(&daemon).await;
    let (status, log) = daemon.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("template already built template=app"), "{log}");

    // A template that fails: exit 1, naming it and postgres' message.
    let bad = dir.join("bad.sql");
    fs::write(&bad, "SELECT no_such_column;\n").expect("write");
    let bad_template = format!("bad=sql:{}", bad.display());
    let args = [
        "save",
        "--snapshot-dir",
        &snapshot_dir,
        "--template",
        &bad_template,
    ];
    let (status, _, stderr) = snapshot_command(&args).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("templates failed to build: bad:") && stderr.contains("no_such_column"),
        "{stderr}"
    );
    // Without a directory to write into: a configuration error.
    let (status, _, stderr) = snapshot_command(&["save", "--template", "x=empty"]).await;
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--snapshot-dir"), "{stderr}");
    // show of a file that is not a snapshot says so.
    let (status, shown, _) = snapshot_command(&["show", &bad.display().to_string()]).await;
    assert_eq!(status.code(), Some(1));
    assert!(shown.contains("not usable"), "{shown}");
    let _ = fs::remove_dir_all(&dir);
}
