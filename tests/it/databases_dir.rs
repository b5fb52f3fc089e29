//! The databases' room an operator gives (`--databases-dir`, issue 41 row 8): a daemon that
//! cannot mount (a container's; here root without CAP_SYS_ADMIN) keeps every database on a
//! second tmpfs, apart from WAL and the shared catalogs, so that a lease that fills it gets
//! SQLSTATE 53100 and the server stays up; `LISTEN`/`NOTIFY`'s queue lives there too, so
//! that a queue nobody reads fills the room, not WAL's file system; a directory that would
//! give no room of its own is refused before anything starts (exit 64). The tests make the
//! tmpfs mounts (root).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::disk_full::{
    assert_refused_for_room, churn_when_full, fill_until_refused, FILL_TABLE,
};
use crate::support::notify_queue::{assert_the_queue_found_no_room, fill_the_notify_queue};
use crate::support::{connect, id_of, poll_until, scratch_dir, TestDaemon};

/// A tmpfs the test mounts (root), unmounted and removed when dropped.
struct Tmpfs {
    point: PathBuf,
}

impl Tmpfs {
    fn mount(point: &Path, options: &str) -> Tmpfs {
        std::fs::create_dir_all(point).expect("mount point");
        nix::mount::mount(
            Some("pglease-test"),
            point,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options),
        )
        .expect("mount a tmpfs");
        Tmpfs {
            point: point.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.point, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.point);
    }
}

/// The two tmpfs a container's operator gives (the test mounts them, as root): the
/// instance's, 300 MB, and the databases' room, 150 MB.
fn two_tmpfs(name: &str) -> (Tmpfs, Tmpfs) {
    let scratch = scratch_dir(name);
    (
        Tmpfs::mount(&scratch.join("instance"), "size=300m,mode=0755"),
        Tmpfs::mount(&scratch.join("databases"), "size=150m,mode=0755"),
    )
}

/// A daemon as a container's root runs it, without CAP_SYS_ADMIN (it cannot mount), its
/// data directory on `instance` and `--databases-dir` on `databases`, one ready clone, and
/// `extra` flags. Declared after the two tmpfs, it is dropped (stopped) before they are.
async fn start_without_mount(instance: &Tmpfs, databases: &Tmpfs, extra: &[&str]) -> TestDaemon {
    let data_dir = instance.point.join("data");
    TestDaemon::builder()
        .wrapped_in(
            "setpriv",
            ["--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"],
        )
        .args([
            "--data-dir",
            data_dir.to_str().expect("utf-8"),
            "--databases-dir",
            databases.point.to_str().expect("utf-8"),
            "--min-ready",
            "1",
        ])
        .args(extra.iter().copied())
        .start()
        .await
}

/// docs/security.md, "a lease holder fills the storage", for a daemon that cannot mount:
/// with `--databases-dir` on a tmpfs of its own, the filler's writes fail with 53100, the
/// bystander keeps writing, postgres is not restarted, `/status` shows the databases' room;
/// at the stop the room is emptied. Without the option (the same daemon, one tmpfs) postgres
/// PANICs on its next WAL or checkpoint write and restarts, ending every lease.
#[tokio::test]
async fn a_lease_that_fills_the_databases_dir_fails_alone() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test mounts its two tmpfs (root)");
        return;
    }
    let (instance, databases) = two_tmpfs("databases-dir-fill");
    let data_dir = instance.point.join("data");
    let daemon = start_without_mount(&instance, &databases, &["--lease-max-bytes", "off"]).await;
    let status = poll_until(Duration::from_secs(10), "the room measured", || async {
        let status = daemon.status().await;
        (status["postgres"]["databases_space"]["bytes"].as_u64() > Some(0)).then_some(status)
    })
    .await;
    let room = status["postgres"]["databases_space"]["bytes"]
        .as_u64()
        .expect("bytes");
    assert_eq!(room, 150 << 20, "the room is the second tmpfs: {status}");
    assert!(
        daemon
            .log()
            .contains("the databases have room of their own in --databases-dir"),
        "{}",
        daemon.log()
    );

    let filler = daemon.lease_ok("default").await;
    let bystander = daemon.lease_ok("default").await;
    let other = connect(&bystander).await.expect("the bystander connects");
    other
        .batch_execute("CREATE TABLE mine (n int); INSERT INTO mine VALUES (1)")
        .await
        .expect("the bystander writes");
    let client = connect(&filler).await.expect("the filler connects");
    client.batch_execute(FILL_TABLE).await.expect("create");
    assert_refused_for_room(&fill_until_refused(&client, 40).await);

    // Churn in the full room: WAL grows by every row (tens of MB: several segments, and
    // checkpoints as `max_wal_size` is passed) on the instance's tmpfs, which the room's
    // filling left alone.
    churn_when_full(&client, "in the full room").await;
    // The server stayed up: the bystander's session and data are there and it writes on.
    let rows = other
        .query("SELECT count(*) FROM mine", &[])
        .await
        .expect("the bystander's connection survived");
    assert_eq!(rows[0].get::<_, i64>(0), 1);
    other
        .batch_execute("INSERT INTO mine VALUES (2)")
        .await
        .expect("a row that fits its page");
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
    let database = filler["database"].as_str().expect("database").to_owned();
    poll_until(
        Duration::from_secs(10),
        "/status to name the filler",
        || {
            let daemon = &daemon;
            let database = database.clone();
            async move {
                let status = daemon.status().await;
                (status["postgres"]["databases_space"]["filled_by"]["database"]
                    == database.as_str())
                .then_some(())
            }
        },
    )
    .await;

    // Releasing the filler makes room, and a fresh lease writes.
    drop(client);
    let (code, _) = daemon.release(&id_of(&filler), false).await;
    assert_eq!(code, 204);
    poll_until(Duration::from_secs(20), "room again", || async {
        let status = daemon.status().await;
        (status["postgres"]["databases_space"]["full"] == false).then_some(())
    })
    .await;
    let fresh = daemon.lease_ok("default").await;
    connect(&fresh)
        .await
        .expect("a new lease connects")
        .batch_execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g")
        .await
        .expect("a new lease writes");
    assert_eq!(daemon.status().await["postgres"]["restarts"], 0);
    assert!(daemon.stop().await.success());
    let left: Vec<_> = std::fs::read_dir(&databases.point)
        .expect("read the room")
        .collect();
    assert!(left.is_empty(), "left in the databases' room: {left:?}");
    assert!(!data_dir.exists(), "the instance directory is removed");
}

/// A `--databases-dir` that gives no room of its own is refused with exit 64 and one line
/// naming why: on the instance directory's file system, not a directory, missing, or not
/// writable (a read-only tmpfs, root being allowed everything else).
#[tokio::test]
async fn a_databases_dir_that_gives_no_room_of_its_own_is_refused() {
    let scratch = scratch_dir("databases-dir-refused");
    let data_dir = scratch.join("data");
    let same = scratch.join("same");
    std::fs::create_dir(&same).expect("mkdir");
    let file = scratch.join("file");
    std::fs::write(&file, b"x").expect("write");
    let mut cases = vec![
        (
            same.clone(),
            "is on the same file system as the instance directory",
        ),
        (file, "not a directory"),
        (scratch.join("missing"), "No such file or directory"),
    ];
    let read_only = nix::unistd::geteuid()
        .is_root()
        .then(|| Tmpfs::mount(&scratch.join("read-only"), "size=1m"))
        .inspect(|tmpfs| {
            nix::mount::mount(
                None::<&str>,
                &tmpfs.point,
                None::<&str>,
                nix::mount::MsFlags::MS_REMOUNT | nix::mount::MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .expect("remount read-only");
        });
    if let Some(tmpfs) = &read_only {
        cases.push((tmpfs.point.clone(), "not writable"));
    }
    for (dir, why) in cases {
        let (status, log) = TestDaemon::builder()
            .args([
                "--data-dir",
                data_dir.to_str().expect("utf-8"),
                "--databases-dir",
                dir.to_str().expect("utf-8"),
            ])
            .run_to_exit();
        assert_eq!(status.code(), Some(64), "{dir:?}: {log}");
        assert_eq!(log.trim().lines().count(), 1, "{dir:?}: {log}");
        assert!(
            log.starts_with("pglease: --databases-dir") && log.contains(why),
            "{dir:?}: {log}"
        );
    }
    assert!(!data_dir.exists(), "nothing was made");
    // --keep-data would leave a kept cluster's databases in the room.
    let (status, log) = TestDaemon::builder()
        .args([
            "--databases-dir",
            "/nonexistent-is-not-looked-at",
            "--keep-data",
        ])
        .run_to_exit();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("--keep-data"), "{log}");
}

/// The token the lease's template recorded when it was built.
async fn built_token(daemon: &TestDaemon) -> String {
    let lease = daemon.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one("SELECT token FROM built", &[])
        .await
        .expect("query");
    row.get(0)
}

/// A snapshot (`--snapshot-dir`) of a cluster whose databases and notification queue are in
/// the room is written from what the room holds (the queue as an empty directory) and
/// started from again: by a daemon without a room (the links are not in the snapshot), and
/// into a fresh room. The template built in the first run is leased in the others without a
/// build (same token).
#[tokio::test]
async fn a_snapshot_round_trips_through_the_databases_room() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test mounts a tmpfs (root)");
        return;
    }
    let scratch = scratch_dir("databases-dir-snapshot");
    let databases = Tmpfs::mount(&scratch.join("databases"), "size=200m,mode=0755");
    let migrations = scratch.join("migrations");
    std::fs::create_dir(&migrations).expect("mkdir");
    std::fs::write(
        migrations.join("001.sql"),
        "CREATE TABLE built (token text); INSERT INTO built SELECT md5(random()::text);",
    )
    .expect("write");
    let snapshots = scratch.join("snapshots");
    let start = |room: bool| {
        let mut args = vec![
            "--snapshot-dir".to_owned(),
            snapshots.to_str().expect("utf-8").to_owned(),
            "--template".to_owned(),
            format!("app=migrations:{}", migrations.display()),
        ];
        if room {
            args.extend([
                "--databases-dir".to_owned(),
                databases.point.to_str().expect("utf-8").to_owned(),
            ]);
        }
        TestDaemon::builder().args(args).start()
    };
    let first = start(true).await;
    let built = built_token(&first).await;
    let (status, log) = first.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("wrote the snapshot"), "{log}");

    for room in [false, true] {
        let daemon = start(room).await;
        assert_eq!(
            built_token(&daemon).await,
            built,
            "the template was built again (room: {room})"
        );
        let status = daemon.status().await;
        assert!(
            status["postgres"]["databases_space"].is_object(),
            "{status}"
        );
        let (code, log) = daemon.stop_with_log().await;
        assert!(code.success(), "{log}");
        assert!(log.contains("started from the snapshot"), "{log}");
        assert!(log.contains("template already built template=app"), "{log}");
    }
    let left: Vec<_> = std::fs::read_dir(&databases.point)
        .expect("read the room")
        .collect();
    assert!(left.is_empty(), "left in the databases' room: {left:?}");
}

/// The lines of a daemon's log that tell of a crash of postgres, for a failure's message
/// (postgres' own PANIC may not reach its log: the file system it is on is the full one).
fn crashes_in(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains("crash") || line.contains("PANIC"))
        .collect()
}

/// The bytes of the notification queue's files in the room `databases` (every cluster's
/// `pg_notify/` there).
fn queue_bytes_in(databases: &Path) -> u64 {
    let mut bytes = 0;
    for room in std::fs::read_dir(databases).into_iter().flatten().flatten() {
        for cluster in std::fs::read_dir(room.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let queue = cluster.path().join("pg_notify");
            for file in std::fs::read_dir(queue).into_iter().flatten().flatten() {
                bytes += file.metadata().map_or(0, |meta| meta.len());
            }
        }
    }
    bytes
}

/// docs/security.md, "a notification queue nobody reads", for a daemon that cannot mount:
/// with `--databases-dir`, each cluster's `pg_notify/` is a link into the room, so a holder
/// that listens, reads nothing and notifies fills the room, not the file system WAL
/// shares: the notifier gets SQLSTATE 53100, postgres is not restarted and another lease
/// keeps its session and data (though, the room being full, it cannot grow until the
/// queue shrinks). Once the listener's session has ended and a drop makes room, the next
/// notifying transaction that commits lets postgres remove the queue's files, and the room
/// is back. Without the link (the queue beside WAL) postgres PANICs on its next WAL write
/// and restarts, ending every lease.
#[tokio::test]
async fn a_notify_queue_nobody_reads_fills_the_databases_dir_not_wals() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test mounts its two tmpfs (root)");
        return;
    }
    let (instance, databases) = two_tmpfs("databases-dir-notify");
    let data_dir = instance.point.join("data");
    // It cannot mount the queue a tmpfs of its own either.
    let daemon = start_without_mount(&instance, &databases, &[]).await;
    let bystander = daemon.lease_ok("default").await;
    let other = connect(&bystander).await.expect("the bystander connects");
    // `pad` (about 15 MB) is what the bystander drops later to make room.
    other
        .batch_execute(
            "CREATE TABLE mine (n int); INSERT INTO mine VALUES (1); \
             CREATE TABLE pad AS SELECT g, md5(g::text) AS m FROM generate_series(1, 200000) g",
        )
        .await
        .expect("the bystander writes");

    let notifying = daemon.lease_ok("default").await;
    let (listener, error, batches) = fill_the_notify_queue(&notifying).await;
    assert_the_queue_found_no_room(&error, batches);

    // The server stayed up: the bystander's session and data are there and it writes what
    // fits its page; the listener's session (which a PANIC would end) answers.
    let rows = other
        .query("SELECT count(*) FROM mine", &[])
        .await
        .expect("the bystander's connection survived");
    assert_eq!(rows[0].get::<_, i64>(0), 1);
    other
        .batch_execute("INSERT INTO mine VALUES (2)")
        .await
        .expect("a row that fits its page");
    // A lease takes the ready clone and the pool makes another: CREATE DATABASE
    // checkpoints, writing files beside WAL. In the full room the copy fails (logged, tried
    // again later); with the queue beside WAL the checkpoint PANICs and postgres restarts.
    let _third = daemon.lease_ok("default").await;
    poll_until(
        Duration::from_secs(30),
        "the pool to try a clone",
        || async {
            let restarts = daemon.status().await["postgres"]["restarts"].as_u64();
            (daemon.log().contains("clone failed") || restarts > Some(0)).then_some(())
        },
    )
    .await;
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
    // The room is the databases' too: while the queue fills it, a write that needs new
    // pages fails with the same SQLSTATE.
    let big = "INSERT INTO mine SELECT generate_series(1, 300000)";
    let full = other
        .batch_execute(big)
        .await
        .expect_err("room in a full room");
    assert_eq!(
        full.code(),
        Some(&tokio_postgres::error::SqlState::DISK_FULL),
        "{full:?}; {:?}",
        crashes_in(&daemon.log())
    );
    listener
        .batch_execute("SELECT 1")
        .await
        .expect("the listener's session survived");
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
    // It was the room that filled: the queue's files are there, behind the link.
    let queue = data_dir.join("pgdata-1").join("pg_notify");
    assert!(
        std::fs::symlink_metadata(&queue).is_ok_and(|meta| meta.is_symlink()),
        "{queue:?} is not a link into the room"
    );
    let queued = queue_bytes_in(&databases.point);
    assert!(queued > 64 << 20, "{queued} bytes of queue in the room");

    // The listener's session ends and the bystander makes room: the next notifications
    // that commit let postgres advance the queue's tail and remove its files.
    drop(listener);
    let database = notifying["database"].as_str().expect("database").to_owned();
    poll_until(
        Duration::from_secs(20),
        "the listener's session ended",
        || {
            let other = &other;
            let database = database.clone();
            async move {
                let rows = other
                    .query(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                        &[&database],
                    )
                    .await
                    .ok()?;
                // The notifier's session is still there.
                (rows[0].get::<_, i64>(0) <= 1).then_some(())
            }
        },
    )
    .await;
    other
        .batch_execute("DROP TABLE pad")
        .await
        .expect("a drop in the full room");
    let notifier = connect(&notifying).await.expect("the notifier connects");
    poll_until(
        Duration::from_secs(30),
        "the queue's files removed",
        || async {
            // Ten pages: the tail is advanced at a commit that filled a few.
            let _ = notifier
                .batch_execute(
                    "SELECT pg_notify('c', g::text || repeat('x', 7000)) \
                 FROM generate_series(1, 10) g",
                )
                .await;
            (queue_bytes_in(&databases.point) < 1 << 20).then_some(())
        },
    )
    .await;
    other
        .batch_execute(big)
        .await
        .expect("the bystander writes again");
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
    assert!(daemon.stop().await.success());
    let left: Vec<_> = std::fs::read_dir(&databases.point)
        .expect("read the room")
        .collect();
    assert!(left.is_empty(), "left in the databases' room: {left:?}");
}
