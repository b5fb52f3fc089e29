//! `GET /metrics`: Prometheus' text format, with figures that follow what happened.

use std::time::Duration;

use serde_json::json;

use crate::support::{id_of, poll_until, TestDaemon};

/// The scrape's text, checked for the OpenMetrics content type and terminator.
async fn scrape(daemon: &TestDaemon) -> String {
    let response = reqwest::get(format!("{}/metrics", daemon.base))
        .await
        .expect("GET /metrics");
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.text().await.expect("body");
    assert!(text.ends_with("# EOF\n"), "{text}");
    text
}

/// The value of the sample named exactly `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn metrics_follow_leases_releases_refusals_and_expiry() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "2"])
        .start()
        .await;
    let first = daemon.lease_ok("default").await;
    let _second = daemon.lease_ok("default").await;
    let (status, _) = daemon.lease(json!({"template": "nope"})).await;
    assert_eq!(status, 404);
    let (status, _) = daemon.release(&id_of(&first), false).await;
    assert_eq!(status, 204);
    let (status, short) = daemon.lease(json!({"ttl_secs": 1})).await;
    assert_eq!(status, 201, "{short}");

    let text = scrape(&daemon).await;
    let granted = r#"pglease_lease_wait_seconds_count{outcome="granted"}"#;
    assert_eq!(sample(&text, granted), Some(3.0), "{text}");
    let unknown = r#"pglease_lease_wait_seconds_count{outcome="unknown_template"}"#;
    assert_eq!(sample(&text, unknown), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, r#"pglease_releases_total{reuse="false"}"#),
        Some(1.0),
        "{text}"
    );
    let status = daemon.status().await;
    let leased = status["templates"][0]["leased"].as_f64();
    let major = status["servers"][0]["major"].clone();
    assert_eq!(
        sample(
            &text,
            &format!(
                r#"pglease_databases{{template="default",postgres="{major}",state="leased"}}"#
            )
        ),
        leased,
        "{text}"
    );
    assert_eq!(sample(&text, "pglease_postgres_up"), Some(1.0), "{text}");

    // The short lease runs out: the expiry counter follows.
    poll_until(
        Duration::from_secs(10),
        "the short lease to expire",
        || async {
            let text = scrape(&daemon).await;
            (sample(&text, "pglease_leases_expired_total") == Some(1.0)).then_some(())
        },
    )
    .await;
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn metrics_need_the_token_when_one_is_set() {
    let daemon = TestDaemon::builder()
        .args(["--token", "s3cret-token-for-metrics"])
        .start()
        .await;
    let response = reqwest::get(format!("{}/metrics", daemon.base))
        .await
        .expect("GET /metrics");
    assert_eq!(response.status(), 401);
    let response = reqwest::Client::new()
        .get(format!("{}/metrics", daemon.base))
        .bearer_auth("s3cret-token-for-metrics")
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(response.status(), 200);
}
