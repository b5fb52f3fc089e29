//! `LISTEN`/`NOTIFY`'s queue (`pg_notify/`), which a lease holder can grow without bound: it
//! listens, stays idle in a transaction (so it reads nothing), and notifies from a second
//! session of its lease. Before the queue was bounded it filled the room WAL lives in and
//! postgres PANICked on its next WAL or checkpoint write, restarting and ending every lease.
//! Now the queue has a tmpfs of its own where the databases have one (as root; in the
//! databases' room of `--databases-dir` it lives in that room, `databases_dir.rs`), and on
//! PostgreSQL 17+ `max_notify_queue_pages` keeps it well inside that: the notifier gets an
//! error, the server stays up.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::support::notify_queue::{assert_the_queue_found_no_room, fill_the_notify_queue};
use crate::support::{connect, poll_until, TestDaemon};

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
    assert_the_queue_found_no_room(&error, batches);
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
