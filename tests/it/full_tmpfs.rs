//! A full tmpfs: on a dedicated 200 MB tmpfs (`--tmpfs-size`, which needs root), a template
//! too big to build and clones that stop fitting get clear errors, nothing half-made stays,
//! everything that fits keeps being served, and releasing makes room again.

use std::fs;
use std::time::Duration;

use serde_json::json;

use crate::support::{id_of, poll_until, scratch_dir, TestDaemon};

/// Postgres says "No space left on device", or for a short write "wrote only N of M bytes"
/// with the hint "Check free disk space".
fn says_disk_full(message: &str) -> bool {
    message.contains("No space left on device") || message.contains("free disk space")
}

#[tokio::test]
async fn a_full_tmpfs_gives_clear_errors_and_keeps_serving_what_fits() {
    if !nix::unistd::geteuid().is_root() {
        // Mounting the dedicated tmpfs needs root; CI and the dev machines run as root.
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let huge = scratch_dir("tmpfs-huge");
    fs::write(
        huge.join("001.sql"),
        "CREATE TABLE big AS SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, 300000) g;",
    )
    .expect("write");
    let mid = scratch_dir("tmpfs-mid");
    fs::write(
        mid.join("001.sql"),
        "CREATE TABLE mid AS SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, 20000) g;",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        // A budget above the tmpfs' size: this is about a tmpfs that fills for reasons the
        // budget cannot see (tests writing into their databases), where postgres itself
        // says "no space" (the budget's own refusal, 507, is tested in budget.rs).
        .args([
            "--tmpfs-size",
            "200M",
            "--max-bytes",
            "1G",
            "--min-ready",
            "1",
        ])
        .args(["--template", &format!("huge=migrations:{}", huge.display())])
        .args(["--template", &format!("mid=migrations:{}", mid.display())])
        .start()
        .await;
    let instance_dir = {
        let status = daemon.status().await;
        let data_dir =
            std::path::PathBuf::from(status["postgres"]["data_dir"].as_str().expect("data dir"));
        data_dir.parent().expect("instance dir").to_path_buf()
    };

    // A template that cannot fit: a clear build error, and no half-built database.
    let (status, body) = daemon.lease(json!({ "template": "huge" })).await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("001.sql") && says_disk_full(message),
        "{message}"
    );

    // Clones of a template that fits a few times: leases until the space runs out, then 503.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..12 {
        let (status, body) = daemon
            .lease(json!({ "template": "mid", "wait_ms": 5000 }))
            .await;
        match status {
            201 => held.push(body),
            503 => {
                refused = Some(body);
                break;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let refused = refused.expect("the tmpfs never filled up");
    assert!(!held.is_empty(), "at least one clone fits");
    assert_eq!(refused["error"]["code"], "clone_failed");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(says_disk_full),
        "{refused}"
    );

    // What fits is still served, and postgres did not go down.
    daemon.lease_ok("default").await;
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
    let mid_status = daemon.template_status("mid").await;
    assert_eq!(mid_status["leased"].as_u64(), Some(held.len() as u64));

    // Releasing makes room: the next lease of the same template works again.
    for lease in &held {
        let (status, _) = daemon.release(&id_of(lease), false).await;
        assert_eq!(status, 204);
    }
    poll_until(Duration::from_secs(20), "a clone to fit again", || async {
        let (status, body) = daemon
            .lease(json!({ "template": "mid", "wait_ms": 2000 }))
            .await;
        (status == 201).then_some(body)
    })
    .await;

    assert!(daemon.stop().await.success());
    assert!(
        !instance_dir.exists(),
        "the tmpfs is unmounted and its directory removed"
    );
}
