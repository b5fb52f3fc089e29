//! `--storage auto`, the default: it keeps tmpfs for small templates, takes the
//! copy-on-write store for a template known at start to be big (from its sources or a
//! snapshot), says why in `/status`, and runs on tmpfs where the store cannot be made.

use std::fs;
use std::path::{Path, PathBuf};

use crate::cow::{
    can_make_store, data_dir, loop_devices_under, mounts_under, storage, write_in_a_lease_of,
    Storage,
};
use crate::support::{scratch_dir, TestDaemon};

/// An SQL file of `mb` MB (a comment: cheap to apply), a template source `auto` weighs.
fn big_sql_file(dir: &Path, mb: usize) -> PathBuf {
    let file = dir.join("big.sql");
    let line = format!("-- {}\n", "x".repeat(1020));
    let mut text = String::with_capacity(mb << 20);
    while text.len() < mb << 20 {
        text.push_str(&line);
    }
    text.push_str("CREATE TABLE seeded (i int);\n");
    fs::write(&file, text).expect("write the big source");
    file
}

/// The default, `auto`, keeps tmpfs for small templates on PostgreSQL 18 and says why.
#[tokio::test]
async fn auto_keeps_tmpfs_for_small_templates() {
    if !can_make_store("auto_keeps_tmpfs_for_small_templates") {
        return;
    }
    let daemon = TestDaemon::of_major("18").start().await;
    let Storage {
        kind,
        reason,
        method,
    } = storage(&daemon).await;
    assert_eq!(kind, "tmpfs");
    assert!(
        reason.contains("no template known at start reaches"),
        "{reason}"
    );
    assert_eq!(method.as_deref(), Some("copy"));
    let dir = data_dir(&daemon).await;
    let instance = dir.parent().expect("instance dir").to_path_buf();
    // The mounts are the databases' own tmpfs and the notification queue's (root, on
    // tmpfs): no store.
    assert_eq!(
        mounts_under(&instance),
        vec![
            dir.join("base").display().to_string(),
            dir.join("pg_notify").display().to_string()
        ],
        "no store was made"
    );
    assert!(daemon.stop().await.success());
    assert!(mounts_under(&instance).is_empty(), "unmounted at stop");
}

/// A template whose sources reach the line makes `auto` build the store (and clone there);
/// where the store cannot be made, `auto` warns and runs on tmpfs instead of failing.
#[tokio::test]
async fn auto_makes_a_store_for_a_big_template_or_falls_back_to_tmpfs() {
    if !can_make_store("auto_makes_a_store_for_a_big_template_or_falls_back_to_tmpfs") {
        return;
    }
    let dir = scratch_dir("cow-auto-big");
    let source = big_sql_file(&dir, 130);
    let template = format!("big=sql:{}", source.display());
    let daemon = TestDaemon::of_major("18")
        .args(["--template", &template])
        .start()
        .await;
    let Storage {
        kind,
        reason,
        method,
    } = storage(&daemon).await;
    assert_eq!(kind, "cow", "{reason}");
    assert!(reason.contains("template big is 130 MB"), "{reason}");
    assert_eq!(method.as_deref(), Some("clone"));
    let instance = data_dir(&daemon)
        .await
        .parent()
        .and_then(Path::parent)
        .expect("instance dir above the store")
        .to_path_buf();
    assert_eq!(mounts_under(&instance).len(), 1, "the store is mounted");
    write_in_a_lease_of(&daemon, "big", "INSERT INTO seeded VALUES (1)").await;
    assert!(daemon.stop().await.success());
    assert!(mounts_under(&instance).is_empty(), "unmounted at stop");
    assert!(
        loop_devices_under(&instance).is_empty(),
        "loop device freed"
    );

    // A tmpfs of 400 MB leaves too little for a store: auto copies instead.
    let daemon = TestDaemon::of_major("18")
        .args(["--template", &template, "--tmpfs-size", "400M"])
        .start()
        .await;
    let Storage {
        kind,
        reason,
        method,
    } = storage(&daemon).await;
    assert_eq!(kind, "tmpfs", "{reason}");
    assert!(reason.contains("could not be made"), "{reason}");
    assert!(
        daemon
            .log()
            .contains("auto: the copy-on-write store cannot be made"),
        "{}",
        daemon.log()
    );
    assert_eq!(method.as_deref(), Some("copy"));
    daemon.lease_ok("big").await;
    assert!(daemon.stop().await.success());
}

/// A snapshot's big template makes `auto` take the store at the next start (its sources,
/// one small SQL file, could not tell), and what the snapshot put in the store counts in the
/// byte budget's measured usage before any clone is made.
#[tokio::test]
async fn a_snapshots_big_template_makes_auto_take_the_store_and_counts_in_it() {
    if !can_make_store("a_snapshots_big_template_makes_auto_take_the_store_and_counts_in_it") {
        return;
    }
    let dir = scratch_dir("cow-snapshot-auto");
    let snapshots = dir.join("snapshots");
    let source = dir.join("big.sql");
    // ~150 MB of rows from a few bytes of SQL.
    fs::write(
        &source,
        "CREATE TABLE big AS SELECT g AS id, repeat('x', 200) AS pad \
         FROM generate_series(1, 600000) g;",
    )
    .expect("write");
    let args = [
        "--snapshot-dir".to_owned(),
        snapshots.display().to_string(),
        "--template".to_owned(),
        format!("big=sql:{}", source.display()),
        "--min-ready".to_owned(),
        "0".to_owned(),
    ];
    let first = TestDaemon::of_major("18").args(args.clone()).start().await;
    let Storage { kind, reason, .. } = storage(&first).await;
    assert_eq!(kind, "tmpfs", "the source is small: {reason}");
    first.lease_ok("big").await;
    let (status, log) = first.stop_with_log().await;
    assert!(
        status.success() && log.contains("wrote the snapshot"),
        "{log}"
    );
    // Built big where every clone copies it: the log points at the store.
    assert!(
        log.contains("every clone of this template copies it"),
        "{log}"
    );

    let second = TestDaemon::of_major("18").args(args).start().await;
    let Storage { kind, reason, .. } = storage(&second).await;
    assert_eq!(kind, "cow", "{reason}");
    assert!(reason.contains("template big is"), "{reason}");
    let status = second.status().await;
    let store_bytes = status["limits"]["store_bytes"]
        .as_u64()
        .expect("store_bytes");
    assert!(
        store_bytes > 140 << 20,
        "the snapshot's template counts in the store: {store_bytes} bytes"
    );
    second.lease_ok("big").await;
    let (status, log) = second.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("template already built template=big"), "{log}");
}

/// Without mkfs.xfs (here: a PATH without /usr/sbin), `auto` says so and runs on tmpfs, and
/// `--storage cow` refuses to start, naming the package.
#[tokio::test]
async fn without_mkfs_xfs_auto_stays_on_tmpfs_and_cow_names_the_package() {
    if !can_make_store("without_mkfs_xfs_auto_stays_on_tmpfs_and_cow_names_the_package") {
        return;
    }
    let dir = scratch_dir("cow-no-mkfs");
    let source = big_sql_file(&dir, 130);
    let template = format!("big=sql:{}", source.display());
    let daemon = TestDaemon::of_major("18")
        .args(["--template", &template])
        .env("PATH", "/usr/bin:/bin")
        .start()
        .await;
    let Storage { kind, reason, .. } = storage(&daemon).await;
    assert_eq!(kind, "tmpfs", "{reason}");
    assert!(
        reason.contains("mkfs.xfs is not installed (Debian: apt-get install xfsprogs)"),
        "{reason}"
    );
    assert!(daemon.stop().await.success());

    let (status, log) = TestDaemon::of_major("18")
        .args(["--storage", "cow"])
        .env("PATH", "/usr/bin:/bin")
        .run_to_exit();
    assert!(!status.success());
    assert!(
        log.contains("mkfs.xfs is not installed (Debian: apt-get install xfsprogs)"),
        "{log}"
    );
}
