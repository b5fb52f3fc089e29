//! Bad input: every malformed or invalid request gets a JSON error with the right status,
//! and the daemon keeps serving.

use serde_json::Value;

use crate::support::TestDaemon;

#[tokio::test]
async fn malformed_and_invalid_requests_get_json_errors() {
    let daemon = TestDaemon::start().await;
    let huge = format!("{{\"template\": \"{}\"}}", "x".repeat(100_000));
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            "POST",
            "/lease",
            "{not json".into(),
            400,
            "malformed_request",
        ),
        (
            "POST",
            "/lease",
            "{\"template\": \"def".into(),
            400,
            "malformed_request",
        ),
        ("POST", "/lease", "[1, 2]".into(), 422, "invalid_value"),
        (
            "POST",
            "/lease",
            "{\"template\": 5}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"ttl_secs\": -5}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"ttl_secs\": 0}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"ttl_secs\": 1e30}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"ttl_secs\": 99999999999999999999999}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"wait_ms\": 999999999999}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"surprise\": true}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"template\": \"Robert'); DROP TABLE students;--\"}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"template\": \"../../etc/passwd\"}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"template\": \"ünïcödé\"}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            format!("{{\"template\": \"{}\"}}", "a".repeat(65)),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"template\": \"\"}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease",
            "{\"template\": \"nope\"}".into(),
            404,
            "unknown_template",
        ),
        ("POST", "/lease", huge, 413, "body_too_large"),
        (
            "DELETE",
            "/leases/not-a-lease",
            String::new(),
            404,
            "lease_not_found",
        ),
        (
            "DELETE",
            "/leases/0123456789abcdef0123456789abcdef",
            String::new(),
            404,
            "lease_not_found",
        ),
        (
            "DELETE",
            "/leases/0123456789abcdef0123456789abcdef?reuse=maybe",
            String::new(),
            400,
            "malformed_request",
        ),
        (
            "POST",
            "/leases/0123456789abcdef0123456789abcdef/renew",
            "{\"ttl_secs\": \"long\"}".into(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/leases/0123456789abcdef0123456789abcdef/renew",
            "{}".into(),
            404,
            "lease_not_found",
        ),
        (
            "DELETE",
            "/leases/'%3B%20DROP%20DATABASE%20postgres%3B--",
            String::new(),
            404,
            "lease_not_found",
        ),
        (
            "DELETE",
            "/leases/%C3%BC%C3%B1%C3%AF%C3%A7%C3%B6d%C3%A9",
            String::new(),
            404,
            "lease_not_found",
        ),
        (
            "POST",
            "/leases/..%2F..%2Fetc%2Fpasswd/renew",
            "{}".into(),
            404,
            "lease_not_found",
        ),
        (
            "GET",
            "/templates/x'%3B%20DROP%20TABLE%20t%3B--",
            String::new(),
            422,
            "invalid_value",
        ),
        (
            "POST",
            "/lease?template=nope",
            String::new(),
            400,
            "malformed_request",
        ),
        ("GET", "/no/such/route", String::new(), 404, "not_found"),
        ("GET", "/lease", String::new(), 405, "method_not_allowed"),
    ];
    for (method, path, body, expected_status, expected_code) in cases {
        let request = daemon
            .http
            .request(
                method.parse().expect("method"),
                format!("{}{path}", daemon.base),
            )
            .body(body.clone());
        let (status, answer) = daemon.send(request).await;
        let shown: String = body.chars().take(80).collect();
        assert_eq!(status, expected_status, "{method} {path} {shown}: {answer}");
        assert_eq!(
            answer["error"]["code"], expected_code,
            "{method} {path} {shown}: {answer}"
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{method} {path}: {answer}"
        );
    }
    // After all that, the daemon still serves, with an empty body meaning all defaults.
    let (status, lease) = daemon
        .send(daemon.http.post(format!("{}/lease", daemon.base)))
        .await;
    assert_eq!(status, 201, "{lease}");
    let (status, health) = daemon.get("/healthz").await;
    assert_eq!((status, health["status"].clone()), (200, Value::from("ok")));
}

#[tokio::test]
async fn readyz_reports_postgres_and_the_default_template() {
    let daemon = TestDaemon::start().await;
    let (status, body) =
        crate::support::poll_until(std::time::Duration::from_secs(10), "readiness", || async {
            let (status, body) = daemon.get("/readyz").await;
            (status == 200).then_some((status, body))
        })
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["postgres"], true);
    assert_eq!(body["default_template"], true);
}
