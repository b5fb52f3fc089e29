//! The byte budget: templates and clones fit in `--max-bytes`; a waiting request evicts
//! warm clones of other templates, and when nothing can be evicted it gets 507.

use std::time::Duration;

use serde_json::json;

use crate::support::{id_of, poll_until, TestDaemon};

#[tokio::test]
async fn the_byte_budget_evicts_then_refuses_with_507() {
    // An empty database is ~7.5 MB: 40 MB hold five.
    let daemon = TestDaemon::builder()
        .args([
            "--max-bytes",
            "40M",
            "--min-ready",
            "3",
            "--max-total",
            "20",
        ])
        .args(["--template", "other=empty"])
        .start()
        .await;
    poll_until(Duration::from_secs(10), "default's warm clones", || async {
        (daemon.template_status("default").await["ready"] == 3).then_some(())
    })
    .await;

    // `other` has no warm clones; its lease evicts one of default's.
    let other = daemon.lease_ok("other").await;
    let default = daemon.template_status("default").await;
    assert!(
        default["ready"].as_u64() < Some(3),
        "a warm clone of default was evicted: {default}"
    );

    // Leases until nothing more fits, then 507, never a crash.
    let mut held = vec![other];
    let refused = loop {
        let (status, body) = daemon
            .lease(json!({ "template": "other", "wait_ms": 5000 }))
            .await;
        match status {
            201 => held.push(body),
            507 => break body,
            code => panic!("unexpected {code}: {body}"),
        }
        assert!(held.len() < 10, "the budget never filled");
    };
    assert_eq!(refused["error"]["code"], "insufficient_storage");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("budget")),
        "{refused}"
    );
    let sizes: Vec<i64> = [
        daemon.template_status("default").await,
        daemon.template_status("other").await,
    ]
    .iter()
    .filter_map(|t| t["size_bytes"].as_i64())
    .collect();
    assert_eq!(sizes.len(), 2);

    // The default template is still served if it has a clone, and a release makes room.
    let (status, _) = daemon.release(&id_of(&held[0]), false).await;
    assert_eq!(status, 204);
    poll_until(
        Duration::from_secs(10),
        "room for another lease",
        || async {
            let (status, _) = daemon
                .lease(json!({ "template": "other", "wait_ms": 2000 }))
                .await;
            (status == 201).then_some(())
        },
    )
    .await;
}
