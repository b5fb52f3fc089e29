//! A lease's database filled until the file system refuses, and that refusal told apart
//! from any other failure: shared by the tests of a full tmpfs (`full_tmpfs.rs`), of the
//! databases' room (`databases_dir.rs`) and of a build that meets a full disk.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// The filler's table; an `INSERT` of [`insert_rows`] goes into it.
pub const FILL_TABLE: &str = "CREATE TABLE fill (n int, pad text)";

/// `rows` rows of about 70 bytes into `fill`: every row goes through WAL too, as tests write.
pub fn insert_rows(rows: u32) -> String {
    format!(
        "INSERT INTO fill SELECT g, md5(g::text) || md5((g + 1)::text) \
         FROM generate_series(1, {rows}) g"
    )
}

/// Whether a message (or a hint) says the storage is full: "No space left on device", or
/// for a short write "wrote only N of M bytes" with the hint "Check free disk space".
pub fn says_disk_full(message: &str) -> bool {
    message.contains("No space left on device") || message.contains("free disk space")
}

/// Inserts 100,000 rows at a time into `fill` until a statement fails, at most `tries`
/// times, and returns that failure.
pub async fn fill_until_refused(client: &Client, tries: usize) -> tokio_postgres::Error {
    for _ in 0..tries {
        if let Err(error) = client.batch_execute(&insert_rows(100_000)).await {
            return error;
        }
    }
    panic!("the storage never filled in {tries} inserts of 100,000 rows");
}

/// Fills `fill` to its last few rows: 100,000, then 1,000, then 10 at a time until each
/// size is refused with SQLSTATE 53100 (any other failure panics), so that even a small
/// write of anyone's needs room there is none of.
pub async fn fill_to_the_last_rows(client: &Client) {
    let mut full = false;
    for rows in [100_000, 1_000, 10] {
        for _ in 0..400 {
            match client.batch_execute(&insert_rows(rows)).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::DISK_FULL) => {
                    full = true;
                    break;
                }
                Err(e) => panic!("filling: {e:?}"),
            }
        }
    }
    assert!(full, "the storage never filled");
}

/// Asserts that `error` is the filler's own statement refused for lack of room: SQLSTATE
/// 53100, saying so in its message or hint (not a lost connection: the server stayed up).
pub fn assert_refused_for_room(error: &tokio_postgres::Error) {
    let db_error = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not an error of the filler's own statement: {error:?}"));
    assert_eq!(db_error.code(), &SqlState::DISK_FULL, "{db_error:?}");
    assert!(
        says_disk_full(db_error.message()) || db_error.hint().is_some_and(says_disk_full),
        "{db_error:?}"
    );
}

/// Churn on a full storage, as a suite does, three times: rows deleted, vacuumed, their
/// room reused. The data stays the size it is, but WAL grows by every row. Each statement
/// succeeds or is refused for room (53100); anything else panics, naming `place`.
pub async fn churn_when_full(client: &Client, place: &str) {
    for _ in 0..3 {
        for statement in [
            "DELETE FROM fill WHERE n % 2 = 0",
            "VACUUM fill",
            "INSERT INTO fill SELECT g * 2, md5(g::text) || md5((g + 1)::text) \
             FROM generate_series(1, 100000) g",
        ] {
            match client.batch_execute(statement).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::DISK_FULL) => {}
                Err(e) => panic!("`{statement}` {place}: {e:?}"),
            }
        }
    }
}
