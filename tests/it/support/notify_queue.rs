//! Filling `LISTEN`/`NOTIFY`'s queue (`pg_notify/`) as a lease holder can: it listens,
//! stays idle in a transaction (so it reads nothing), and notifies from a second session
//! of its lease until postgres refuses. Shared by the tests of the queue's own tmpfs
//! (`notify_queue.rs`) and of the databases' room (`databases_dir.rs`); what the refusal
//! must be is theirs to say.

use serde_json::Value;

use super::connect;

/// One statement's notifications: 1000 of 7000 bytes, each distinct (postgres keeps one of
/// identical notifications in a transaction), a page of the queue each, so 8 MB.
pub const NOTIFY_BATCH: &str = "SELECT pg_notify('c', g::text || repeat('x', 7000)) \
                                FROM generate_series(1, 1000) g";

/// Statements of [`NOTIFY_BATCH`] before the helper gives up: 800 MB, far more than any
/// room the tests give the queue (the rest of a 300M tmpfs has 96 MB).
pub const MAX_BATCHES: usize = 100;

/// A holder's listener, idle in a transaction so that it reads nothing, and a notifier that
/// sends until an error; the listener, the error, and after how many batches it came.
pub async fn fill_the_notify_queue(
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

/// Asserts that `error` (after `batches` batches) is postgres' refusal to write a queue page
/// on a full file system: "could not access status of transaction 0", SQLSTATE 53100, its
/// detail naming `pg_notify` and "No space left on device".
pub fn assert_the_queue_found_no_room(error: &tokio_postgres::Error, batches: usize) {
    let db_error = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not an error of the notifier's statement: {error:?}"));
    assert_eq!(
        db_error.code(),
        &tokio_postgres::error::SqlState::DISK_FULL,
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
}
