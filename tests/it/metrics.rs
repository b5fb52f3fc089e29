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

/// The `pglease_*` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("pglease_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

#[tokio::test]
async fn the_grafana_dashboard_is_valid_and_queries_only_exported_metrics() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/grafana/pglease-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for field in ["title", "uid", "schemaVersion", "panels", "templating"] {
        assert!(!dashboard[field].is_null(), "the dashboard has no {field}");
    }
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let mut names = std::collections::BTreeSet::new();
    let mut ids = std::collections::BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].to_string()),
            "panel id twice: {panel}"
        );
        for field in ["type", "title", "gridPos", "targets"] {
            assert!(!panel[field].is_null(), "panel without {field}: {panel}");
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel without queries: {panel}");
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            let found = metric_names(expr);
            assert!(!found.is_empty(), "a query of no pglease metric: {expr}");
            names.extend(found);
        }
    }

    // Every series the queries name is one a live daemon exports (its family declared).
    let daemon = TestDaemon::start().await;
    let lease = daemon.lease_ok("default").await;
    daemon.release(&id_of(&lease), false).await;
    let text = scrape(&daemon).await;
    for name in &names {
        let family = ["_bucket", "_count", "_sum", "_total"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "the dashboard queries {name}, which /metrics does not export:\n{text}"
        );
    }
    assert!(names.contains("pglease_lease_wait_seconds_bucket"));
}
