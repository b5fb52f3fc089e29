//! A failed test's database, kept for a look: `DELETE /leases/{id}?keep=SECS`, `GET /kept`,
//! `DELETE /kept/{id}`, and the CLI's `release --keep`, `run --keep-on-failure` and `kept`.

use std::fs;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::output_of;
use crate::support::{connect, id_of, poll_until, scratch_dir, wait_until_dropped, TestDaemon};

async fn daemon(extra: &[&str]) -> TestDaemon {
    let dir = scratch_dir("kept");
    let file = dir.join("schema.sql");
    fs::write(&file, "CREATE TABLE orders (id int);").expect("write");
    let mut args = vec![
        "--template".to_owned(),
        format!("app=sql:{}", file.display()),
        "--min-ready".to_owned(),
        "1".to_owned(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    // With a token: only then does GET /kept show ids and URLs (docs/security.md).
    TestDaemon::builder()
        .args(args)
        .token("kept-token")
        .start()
        .await
}

async fn kept(daemon: &TestDaemon) -> Vec<Value> {
    let (status, body) = daemon.get("/kept").await;
    assert_eq!(status, 200, "{body}");
    body["kept"].as_array().cloned().expect("a kept list")
}

async fn keep(daemon: &TestDaemon, id: &str, query: &str) -> (u16, Value) {
    daemon
        .send(
            daemon
                .http
                .delete(format!("{}/leases/{id}?{query}", daemon.base)),
        )
        .await
}

#[tokio::test]
async fn a_kept_database_stays_as_the_test_left_it_and_opens_with_its_url() {
    let daemon = daemon(&["--max-kept", "2"]).await;
    let (status, lease) = daemon
        .lease(json!({"template": "app", "label": "tests/test_orders.py::test_refund"}))
        .await;
    assert_eq!(status, 201, "{lease}");
    connect(&lease)
        .await
        .expect("connect")
        .batch_execute("INSERT INTO orders VALUES (7)")
        .await
        .expect("the test writes");
    let id = id_of(&lease);
    let (status, body) = keep(&daemon, &id, "keep=60").await;
    assert_eq!(status, 204, "{body}");

    let list = kept(&daemon).await;
    assert_eq!(list.len(), 1, "{list:?}");
    let entry = &list[0];
    assert_eq!(entry["id"], id.as_str());
    assert_eq!(entry["template"], "app");
    assert_eq!(entry["label"], "tests/test_orders.py::test_refund");
    assert_eq!(entry["database"], lease["database"]);
    let kept_for = humantime::parse_rfc3339(entry["expires_at"].as_str().expect("expiry"))
        .expect("rfc3339")
        .duration_since(
            humantime::parse_rfc3339(entry["kept_at"].as_str().expect("kept_at")).expect("rfc3339"),
        )
        .expect("later");
    assert!(
        kept_for.abs_diff(Duration::from_secs(60)) <= Duration::from_secs(1),
        "{entry}"
    );
    // Its URL opens it as the test left it.
    let client = connect(entry).await.expect("the kept URL connects");
    let row = client
        .query_one("SELECT id FROM orders", &[])
        .await
        .expect("the test's row");
    assert_eq!(row.get::<_, i32>(0), 7);
    drop(client);
    // The lease itself is over; a kept database is in no lease count.
    let (status, _) = daemon.release(&id, false).await;
    assert_eq!(status, 404);
    assert_eq!(daemon.template_status("app").await["leased"], 0);
    assert_eq!(daemon.status().await["limits"]["kept"], 1);

    // Dropped on request; then it is gone, and a second drop is 404.
    let http = &daemon.http;
    let (status, body) = daemon
        .send(http.delete(format!("{}/kept/{id}", daemon.base)))
        .await;
    assert_eq!(status, 204, "{body}");
    wait_until_dropped(entry, "the kept database to be dropped").await;
    assert!(kept(&daemon).await.is_empty());
    let (status, body) = daemon
        .send(http.delete(format!("{}/kept/{id}", daemon.base)))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "kept_not_found");

    // At most --max-kept: keeping a third drops the oldest.
    let mut leases = Vec::new();
    for _ in 0..3 {
        let lease = daemon.lease_ok("app").await;
        let (status, body) = keep(&daemon, &id_of(&lease), "keep=600").await;
        assert_eq!(status, 204, "{body}");
        leases.push(lease);
    }
    wait_until_dropped(&leases[0], "the oldest kept database to be dropped").await;
    let ids: Vec<Value> = kept(&daemon)
        .await
        .iter()
        .map(|k| k["id"].clone())
        .collect();
    assert_eq!(ids, [json!(id_of(&leases[1])), json!(id_of(&leases[2]))]);
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_keep_ends_at_the_daemons_longest_keep_and_bad_keeps_are_refused() {
    let daemon = daemon(&["--max-keep", "2"]).await;
    let lease = daemon.lease_ok("app").await;
    let id = id_of(&lease);
    for (query, status_wanted) in [
        ("keep=0", 422),
        ("keep=86401", 422),
        ("keep=60&reuse=true", 422),
        ("keep=soon", 400),
    ] {
        let (status, body) = keep(&daemon, &id, query).await;
        assert_eq!(status, status_wanted, "{query}: {body}");
    }
    // Still leased after every refusal.
    connect(&lease).await.expect("the lease still works");
    let (status, body) = keep(&daemon, &id, "keep=3600").await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(kept(&daemon).await.len(), 1);
    // Shortened to --max-keep 2: dropped two seconds later.
    wait_until_dropped(&lease, "the kept database to go at its end").await;
    poll_until(Duration::from_secs(5), "the kept list to empty", || async {
        kept(&daemon).await.is_empty().then_some(())
    })
    .await;
    assert!(daemon.log().contains("keep over"), "{}", daemon.log());
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn run_keeps_a_failed_commands_database_and_kept_lists_it() {
    let daemon = daemon(&[]).await;
    let out = output_of(
        &daemon,
        &[
            "run",
            "--template",
            "app",
            "--label",
            "suite/test_fails",
            "--keep-on-failure",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kept for up to 3600 s"), "{stderr}");
    let out = output_of(&daemon, &["kept", "--json"]).await;
    let list: Value = serde_json::from_slice(&out.stdout).expect("json");
    let entry = list["kept"][0].clone();
    assert_eq!(entry["label"], "suite/test_fails", "{list}");
    connect(&entry).await.expect("the kept URL connects");
    // The table names it with its URL; --drop drops it.
    let out = output_of(&daemon, &["kept"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    let id = entry["id"].as_str().expect("id");
    assert!(
        table.contains(&format!(
            "{}  {id}  {}",
            entry["database"].as_str().expect("database"),
            entry["url"].as_str().expect("url")
        )),
        "{table}"
    );
    // A command that succeeds gives its database back as usual.
    let out = output_of(
        &daemon,
        &[
            "run",
            "--template",
            "app",
            "--keep-on-failure",
            "--",
            "true",
        ],
    )
    .await;
    assert!(out.status.success());
    assert_eq!(kept(&daemon).await.len(), 1);
    let out = output_of(&daemon, &["kept", "--drop", id]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until_dropped(&entry, "the kept database to be dropped").await;
    // release --keep from the CLI.
    let lease = daemon.lease_ok("app").await;
    let out = output_of(&daemon, &["release", &id_of(&lease), "--keep", "120"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(kept(&daemon).await.len(), 1);
    assert!(daemon.stop().await.success());
}
