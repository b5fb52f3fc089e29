//! One lease's bytes are bounded (`--lease-max-bytes`, issue 41 row 7): a holder that
//! writes its database past the limit is cut off — its database dropped, its sessions
//! ended — and told why on its next call (410 `lease_exceeded_max_bytes`), while every
//! other lease keeps writing. The default (as root, on the databases' own tmpfs) is in
//! `full_tmpfs.rs`. Real daemon, real postgres.

use serde_json::Value;
use tokio_postgres::error::SqlState;

use crate::support::disk_full::{insert_rows, FILL_TABLE};
use crate::support::{connect, id_of, wait_until_dropped, TestDaemon};

/// Writes batches into `filler`'s database until a statement fails, while `bystander`
/// writes a row after each batch (each must succeed); returns the filler's error and the
/// batches that went in. Panics when `max_batches` went in without an error.
pub async fn fill_until_cut_off(
    filler: &Value,
    bystander: &tokio_postgres::Client,
    max_batches: usize,
) -> (tokio_postgres::Error, usize) {
    let client = connect(filler).await.expect("the filler connects");
    client.batch_execute(FILL_TABLE).await.expect("create");
    for batch in 0..max_batches {
        // About 10 MB of rows a batch.
        if let Err(error) = client.batch_execute(&insert_rows(100_000)).await {
            return (error, batch);
        }
        bystander
            .batch_execute("INSERT INTO mine VALUES (1)")
            .await
            .expect("the bystander keeps writing while the filler fills");
    }
    panic!("the filler was never cut off: {max_batches} batches went in");
}

/// The filler's statement failed because pglease ended it, not because the room ran out:
/// its session was terminated (the drop's FORCE), or its connection closed under it.
pub fn is_cut_off(error: &tokio_postgres::Error) -> bool {
    error.is_closed()
        || error.code() == Some(&SqlState::ADMIN_SHUTDOWN)
        || error.code() == Some(&SqlState::UNDEFINED_DATABASE)
}

/// A bystander's lease with a table it writes into.
pub async fn bystander(daemon: &TestDaemon) -> (Value, tokio_postgres::Client) {
    let lease = daemon.lease_ok("default").await;
    let client = connect(&lease).await.expect("the bystander connects");
    client
        .batch_execute("CREATE TABLE mine (n int); INSERT INTO mine VALUES (1)")
        .await
        .expect("the bystander writes");
    (lease, client)
}

/// The holder's next call about its ended lease: 410 naming the reason, the limit and
/// the size seen; the same on renew and release.
pub async fn told_why(daemon: &TestDaemon, filler: &Value, limit: u64) {
    let id = id_of(filler);
    let renew = daemon
        .send(
            daemon
                .http
                .post(format!("{}/leases/{id}/renew", daemon.base)),
        )
        .await;
    let release = daemon.release(&id, false).await;
    for (what, (status, body)) in [("renew", renew), ("release", release)] {
        assert_eq!(status, 410, "{what}: {body}");
        assert_eq!(
            body["error"]["code"], "lease_exceeded_max_bytes",
            "{what}: {body}"
        );
        let message = body["error"]["message"].as_str().expect("message");
        assert!(
            message.contains(&format!("limit of {limit} bytes"))
                && message.contains("--lease-max-bytes")
                && message.contains(filler["database"].as_str().expect("database")),
            "{what}: {message}"
        );
    }
}

#[tokio::test]
async fn a_lease_past_lease_max_bytes_is_ended_and_the_others_keep_writing() {
    let limit: u64 = 32 << 20;
    let daemon = TestDaemon::builder()
        .args(["--lease-max-bytes", "32MiB", "--min-ready", "1"])
        .start()
        .await;
    assert_eq!(
        daemon.status().await["limits"]["lease_max_bytes"],
        limit,
        "shown in /status"
    );
    let filler = daemon.lease_ok("default").await;
    let (_, other) = bystander(&daemon).await;

    let (error, batches) = fill_until_cut_off(&filler, &other, 100).await;
    assert!(is_cut_off(&error), "after {batches} batches: {error:?}");
    wait_until_dropped(&filler, "the filler's database to be dropped").await;
    told_why(&daemon, &filler, limit).await;

    // /status names it, the metric counts it, the log says so.
    let database = filler["database"].as_str().expect("database");
    let limits = daemon.status().await["limits"].clone();
    assert_eq!(limits["exceeded_max_bytes"], 1, "{limits}");
    let last = &limits["last_exceeded_max_bytes"];
    assert_eq!(last["database"], database, "{limits}");
    assert_eq!(last["limit"], limit, "{limits}");
    assert!(
        last["bytes"].as_u64().is_some_and(|b| b > limit),
        "{limits}"
    );
    let (_, metrics) = daemon.get("/metrics").await;
    let metrics = metrics.as_str().expect("text").to_owned();
    assert!(
        metrics.contains("pglease_leases_exceeded_max_bytes_total 1"),
        "{metrics}"
    );
    let log = daemon.log();
    let warning = log
        .lines()
        .find(|line| line.contains("grew past --lease-max-bytes"))
        .unwrap_or_else(|| panic!("no warning in the log:\n{log}"));
    assert!(
        warning.contains("WARN")
            && warning.contains(database)
            && warning.contains(&id_of(&filler))
            && warning.contains(&format!("limit={limit}")),
        "{warning}"
    );

    // The bystander still writes, and its lease is whole.
    other
        .batch_execute("INSERT INTO mine VALUES (2)")
        .await
        .expect("the bystander writes after");
    let rows = other
        .query("SELECT count(*) FROM mine", &[])
        .await
        .expect("count");
    assert_eq!(rows[0].get::<_, i64>(0), batches as i64 + 2);
    assert_eq!(daemon.status().await["postgres"]["restarts"], 0);
    assert!(daemon.stop().await.success());
}
