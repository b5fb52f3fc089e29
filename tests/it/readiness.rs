//! Readiness speaks for the configured templates (issue 26): a template whose sources are
//! missing at start, or whose prebuild failed, makes `/readyz` answer 503 with the reason
//! and `pglease ready` fail with it; once its sources are fixed pglease builds it again
//! by itself and is ready.

use std::fs;
use std::time::Duration;

use crate::cli::output_of;
use crate::support::{poll_until, scratch_dir, TestDaemon};

/// `/readyz` once it answers 503 naming `template` among the failed ones.
async fn failed_readyz(daemon: &TestDaemon, template: &str) -> serde_json::Value {
    poll_until(
        Duration::from_secs(60),
        "/readyz naming the failed template",
        || async {
            let (code, body) = daemon.get("/readyz").await;
            let named = body["failed_templates"]
                .as_array()
                .is_some_and(|failed| failed.iter().any(|t| t["name"] == template));
            (code == 503 && named).then_some(body)
        },
    )
    .await
}

/// Polls until `/readyz` answers 200.
async fn wait_ready(daemon: &TestDaemon) {
    poll_until(Duration::from_secs(60), "/readyz 200", || async {
        let (code, body) = daemon.get("/readyz").await;
        (code == 200).then_some(body)
    })
    .await;
}

#[tokio::test]
async fn a_misspelt_migrations_directory_fails_readiness_until_it_exists() {
    let dir = scratch_dir("ready-misspelt");
    let meant = dir.join("migrations");
    let typo = dir.join("migratoins");
    fs::create_dir(&meant).expect("mkdir");
    fs::write(
        meant.join("001_users.sql"),
        "CREATE TABLE users (id int);\n",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            &format!("app=migrations:{}", typo.display()),
            "--min-ready",
            "1",
        ])
        .start()
        .await;
    let body = failed_readyz(&daemon, "app").await;
    assert_eq!(body["ready"], false, "{body}");
    let reason = body["reason"].as_str().expect("a reason");
    assert!(reason.contains("template app cannot be built"), "{reason}");
    assert!(
        reason.contains(&typo.display().to_string()),
        "the reason names the path: {reason}"
    );
    let status = daemon.template_status("app").await;
    assert_eq!(status["state"], "failed", "{status}");
    assert!(
        status["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("migratoins")),
        "{status}"
    );

    let out = output_of(&daemon, &["ready", "--timeout", "30"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("template app cannot be built"), "{stderr}");
    assert!(stderr.contains("migratoins"), "{stderr}");

    // The directory appears where the flag points: pglease sees it, builds, and is ready,
    // with no lease needed to notice.
    fs::rename(&meant, &typo).expect("rename");
    wait_ready(&daemon).await;
    let status = daemon.template_status("app").await;
    assert_eq!(status["state"], "ready", "{status}");
    let out = output_of(&daemon, &["ready", "--timeout", "30"]).await;
    assert!(out.status.success(), "{out:?}");
    let lease = daemon.lease_ok("app").await;
    let client = crate::support::connect(&lease).await.expect("connect");
    client
        .query_one("SELECT count(*) FROM users", &[])
        .await
        .expect("the migration ran");
}

#[tokio::test]
async fn a_failed_prebuild_fails_readiness_with_postgres_words_until_it_is_fixed() {
    let dir = scratch_dir("ready-prebuild");
    let migration = dir.join("001_broken.sql");
    fs::write(&migration, "CREATE TABLE broken (;\n").expect("write");
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            &format!("bad=migrations:{}", dir.display()),
            "--prebuild",
            "--min-ready",
            "1",
        ])
        .start()
        .await;
    // Asked at once: it waits while the template builds, and fails when the build does.
    let out = output_of(&daemon, &["ready", "--timeout", "60"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("template bad cannot be built"), "{stderr}");
    assert!(stderr.contains("syntax error"), "{stderr}");
    let body = failed_readyz(&daemon, "bad").await;
    let failed = &body["failed_templates"][0];
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("001_broken.sql")),
        "{body}"
    );

    fs::write(&migration, "CREATE TABLE broken (id int);\n").expect("write");
    wait_ready(&daemon).await;
    assert_eq!(daemon.template_status("bad").await["state"], "ready");
    let out = output_of(&daemon, &["ready", "--timeout", "30"]).await;
    assert!(out.status.success(), "{out:?}");
}
