//! `LISTEN`/`NOTIFY`'s queue (`pg_notify/`), which a lease holder can grow without bound: it
//! listens, stays idle in a transaction (so it reads nothing), and notifies from a second
//! session of its lease. Before the queue was bounded it filled the room WAL lives in and
//! postgres PANICked on its next WAL or checkpoint write, restarting and ending every lease.
//! Now the queue has a tmpfs of its own where the databases have one (as root), and on
//! PostgreSQL 17+ `max_notify_queue_pages` keeps it well inside that: the notifier gets an
//! error, the server stays up.

use std::time::Duration;

use serde_json::Value;
use tokio_postgres::error::SqlState;

use crate::support::{connect, poll_until, TestDaemon};

/// One statement's notifications: 1000 of 7000 bytes, each distinct (postgres keeps one of
/// identical notifications in a transaction), a page of the queue each, so 8 MB.
const NOTIFY_BATCH: &str = "SELECT pg_notify('c', g::text || repeat('x', 7000)) \
                            FROM generate_series(1, 1000) g";

/// Statements of [`NOTIFY_BATCH`] before the test gives up: 800 MB, far more than the room
/// the rest of a 300M tmpfs has (96 MB).
const MAX_BATCHES: usize = 100;

/// A holder's listener, idle in a transaction so that it reads nothing, and a notifier that
/// sends until an error; the error, after how many batches.
async fn fill_the_notify_queue(
    lease: &Value,
) -> (tokio_postgres::Client, tokio_postgres::Error, usize) {
    let listener = connect(lease).await.expect("the listener connects");
    // LISTEN commits first: in one query string with BEGIN it would belong to the open
    // transaction, and listen only once that ends.
    listener.batch_execute("LISTEN c").await.expect("LISTEN");
    listener
        .batch_execute("BEGIN; SELECT 1")
        .await
        .expect("the listener stays in an open transaction");
    let notifier = connect(lease).await.expect("the notifier connects");
    for batch in 0..MAX_BATCHES {
        if let Err(error) = notifier.batch_execute(NOTIFY_BATCH).await {
            return (listener, error, batch);
        }
    }
    panic!("{MAX_BATCHES} batches of notifications went into the queue without an error");
}

/// The server did not restart: `/status` says so, the listener's session (which a PANIC
/// would end) still answers, and a new lease (which makes a clone, a checkpoint) works and
/// writes.
async fn the_server_stayed_up(daemon: &TestDaemon, listener: &tokio_postgres::Client) {
    let other = daemon.lease_ok("default").await;
    let client = connect(&other).await.expect("another lease connects");
    if let Err(error) = client
        .batch_execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 100000) g")
        .await
    {
        // A PANIC ends every session: then /status says why.
        let status = daemon.status().await;
        panic!("another lease cannot write ({error:?}); /status: {status}");
    }
    // The refill after that lease makes a clone: CREATE DATABASE checkpoints, which needs
    // room beside WAL.
    poll_until(Duration::from_secs(30), "the pool refilled", || async {
        (daemon.template_status("default").await["ready"] == 1).then_some(())
    })
    .await;
    listener
        .batch_execute("SELECT 1")
        .await
        .expect("the listener's session survived");
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
}

/// PostgreSQL 15 (no `max_notify_queue_pages`): the queue's own tmpfs fills, the notifier
/// gets postgres' I/O error (SQLSTATE 53100), and the server stays up. (What stays broken,
/// docs/security.md says: the queue's files are not removed again until a restart, as
/// postgres writes its pages out before it removes them.)
#[tokio::test]
async fn a_notify_queue_nobody_reads_fails_its_notifier_not_the_server() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let daemon = TestDaemon::builder()
        .args(["--tmpfs-size", "300M", "--min-ready", "1"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let (listener, error, batches) = fill_the_notify_queue(&lease).await;
    let db_error = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not an error of the notifier's statement: {error:?}"));
    assert_eq!(
        db_error.code(),
        &SqlState::DISK_FULL,
        "after {batches} batches: {db_error:?}"
    );
    assert!(
        db_error
            .message()
            .contains("could not access status of transaction")
            && db_error
                .detail()
                .is_some_and(|detail| detail.contains("pg_notify")
                    && detail.contains("No space left on device")),
        "after {batches} batches: {db_error:?}"
    );
    the_server_stayed_up(&daemon, &listener).await;

    assert!(daemon.stop().await.success());
}

/// PostgreSQL 17+ (here the newest): `max_notify_queue_pages` refuses the notification
/// that would pass half the queue's tmpfs with postgres' own error (SQLSTATE 54000), before
/// any write fails.
#[tokio::test]
async fn from_postgresql_17_the_queue_stops_at_max_notify_queue_pages() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let daemon = TestDaemon::of_major("18")
        .args(["--tmpfs-size", "300M", "--min-ready", "1"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let (listener, error, batches) = fill_the_notify_queue(&lease).await;
    let db_error = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not an error of the notifier's statement: {error:?}"));
    assert_eq!(
        db_error.code(),
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "after {batches} batches: {db_error:?}"
    );
    assert!(
        db_error
            .message()
            .contains("too many notifications in the NOTIFY queue"),
        "{db_error:?}"
    );
    the_server_stayed_up(&daemon, &listener).await;
    assert!(daemon.stop().await.success());
}
