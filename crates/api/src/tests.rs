//! The router driven in memory (`tower::ServiceExt::oneshot`) against a fake pool
//! (`pglease_pool::testing`): each test plays the pool actor, checks the command a handler
//! sent and answers it, then checks the status, headers and JSON the client gets.
//! No postgres, no sockets; what the real pool answers is `tests/it`'s business.

use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use pglease_pool::testing::{fake_pool, FakeActor, FakeCommand};
use pglease_pool::{
    Changer, ConnectInfo, DbName, DropStatus, Lease, LeaseError, LeaseId, LeaseOpError,
    LeaseSummary, LimitStatus, PostgresStatus, Readiness, Refusals, Servers, SqlErrorKind,
    StatusReport, TemplateName, TemplateStatus,
};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::{router, ApiConfig, AppState};

/// A lease id as the pool makes them: 32 lowercase hex characters.
const LEASE_ID: &str = "0123456789abcdef0123456789abcdef";

/// How long a test waits for a handler to reach the fake before failing instead of hanging.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A router over a fresh fake pool, and the fake.
fn app() -> (Router, FakeActor) {
    let (handle, actor) = fake_pool();
    (
        router(AppState::new(
            Servers::single(handle, 16, "16.4"),
            ApiConfig::default(),
        )),
        actor,
    )
}

fn request(method: &str, uri: &str, body: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .expect("a valid request")
}

/// Sends `request` through `app` while `answer` plays the actor for the one command the
/// handler is expected to send.
async fn exchange(
    app: &Router,
    request: Request<Body>,
    actor: &mut FakeActor,
    answer: impl FnOnce(FakeCommand),
) -> Response {
    let actor_side = async {
        let command = tokio::time::timeout(COMMAND_TIMEOUT, actor.recv())
            .await
            .expect("the handler sent no command in time")
            .expect("every handle was dropped");
        answer(command);
    };
    let (response, ()) = tokio::join!(app.clone().oneshot(request), actor_side);
    response.expect("the router is infallible")
}

/// Sends `request` through `app` without playing the actor.
async fn send(app: &Router, request: Request<Body>) -> Response {
    app.clone()
        .oneshot(request)
        .await
        .expect("the router is infallible")
}

/// Status, headers and the body as JSON (`Null` when empty).
async fn read(response: Response) -> (StatusCode, HeaderMap, Value) {
    let (parts, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .expect("the body can be read")
        .to_bytes();
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("the body is JSON")
    };
    (parts.status, parts.headers, json)
}

/// 2023-11-14T22:13:20Z.
fn expiry() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn lease_id() -> LeaseId {
    LeaseId::parse(LEASE_ID).expect("a valid lease id")
}

fn template(name: &str) -> TemplateName {
    TemplateName::new(name).expect("a valid template name")
}

fn lease(template_name: &str) -> Lease {
    Lease {
        id: lease_id(),
        template: template(template_name),
        fingerprint: "f00d".repeat(16),
        connect: ConnectInfo {
            host: "127.0.0.1".into(),
            port: 54321,
            user: "pglease_user".into(),
            password: "s3cret-pw".into(),
            database: DbName::from_server("pglease_abc123_7".into()),
            ssl: false,
        },
        expires_at: expiry(),
        number: 3,
        local_socket: None,
    }
}

fn assert_json(headers: &HeaderMap) {
    assert_eq!(
        headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
}

fn assert_retry_after(headers: &HeaderMap, expected: bool) {
    assert_eq!(
        headers.contains_key(header::RETRY_AFTER),
        expected,
        "Retry-After in {headers:?}"
    );
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().expect("an error code")
}

fn error_message(body: &Value) -> &str {
    body["error"]["message"].as_str().expect("an error message")
}

#[tokio::test]
async fn lease_with_empty_body_asks_for_the_default_template() {
    let (app, mut actor) = app();
    let response = exchange(
        &app,
        request("POST", "/lease", ""),
        &mut actor,
        |command| match command {
            FakeCommand::Lease { request, reply } => {
                assert_eq!(request.template, TemplateName::default_name());
                assert_eq!(request.ttl, None);
                assert_eq!(request.wait, Duration::from_secs(60));
                reply.send(Ok(lease("default"))).expect("the client waits");
            }
            other => panic!("expected a lease, got {other:?}"),
        },
    )
    .await;
    let (status, headers, body) = read(response).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_json(&headers);
    assert_eq!(
        body,
        json!({
            "id": LEASE_ID,
            "template": "default",
            "fingerprint": "f00d".repeat(16),
            "database": "pglease_abc123_7",
            "host": "127.0.0.1",
            "port": 54321,
            "user": "pglease_user",
            "password": "s3cret-pw",
            "url": "postgresql://pglease_user:s3cret-pw@127.0.0.1:54321/pglease_abc123_7?sslmode=disable",
            "jdbc_url": "jdbc:postgresql://127.0.0.1:54321/pglease_abc123_7?user=pglease_user&password=s3cret-pw&sslmode=disable",
            "expires_at": "2023-11-14T22:13:20Z",
        })
    );
}

#[tokio::test]
async fn lease_converts_ttl_and_wait_to_durations() {
    let (app, mut actor) = app();
    let body = r#"{"template": "app", "ttl_secs": 120, "wait_ms": 1500}"#;
    let response = exchange(
        &app,
        request("POST", "/lease", body),
        &mut actor,
        |command| match command {
            FakeCommand::Lease { request, reply } => {
                assert_eq!(request.template, template("app"));
                assert_eq!(request.ttl, Some(Duration::from_secs(120)));
                assert_eq!(request.wait, Duration::from_millis(1500));
                reply.send(Ok(lease("app"))).expect("the client waits");
            }
            other => panic!("expected a lease, got {other:?}"),
        },
    )
    .await;
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body["template"], "app");
}

#[test]
fn a_lease_body_leaves_unset_fields_out() {
    let body = crate::wire::LeaseBody {
        template: Some("app".into()),
        wait_ms: Some(1500),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&body).expect("serializes"),
        json!({ "template": "app", "wait_ms": 1500 })
    );
}

#[tokio::test]
async fn lease_errors_map_to_status_and_code() {
    struct Case {
        error: LeaseError,
        status: StatusCode,
        code: &'static str,
        retry_after: bool,
    }
    let cases = [
        Case {
            error: LeaseError::unknown_template(template("nope")),
            status: StatusCode::NOT_FOUND,
            code: "unknown_template",
            retry_after: false,
        },
        Case {
            error: LeaseError::BuildFailed {
                template: template("app"),
                message: "schema.sql line 3: syntax error at or near \"TABL\"".into(),
                cause: SqlErrorKind::Other,
            },
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "template_build_failed",
            retry_after: false,
        },
        Case {
            error: LeaseError::BuildFailed {
                template: template("app"),
                message: "001.sql: could not extend file: No space left on device".into(),
                cause: SqlErrorKind::DiskFull,
            },
            status: StatusCode::INSUFFICIENT_STORAGE,
            code: "disk_full",
            retry_after: false,
        },
        Case {
            error: LeaseError::BuildFailed {
                template: template("app"),
                message:
                    "cannot connect to template database x: FATAL: sorry, too many clients already"
                        .into(),
                cause: SqlErrorKind::TooManyConnections,
            },
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "too_many_connections",
            retry_after: true,
        },
        Case {
            error: LeaseError::CloneFailed {
                template: template("app"),
                message: "FATAL: remaining connection slots are reserved for superusers".into(),
                cause: SqlErrorKind::TooManyConnections,
            },
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "too_many_connections",
            retry_after: true,
        },
        Case {
            error: LeaseError::TimedOut {
                template: template("app"),
                waited_ms: 1500,
                blocked_by: pglease_pool::Blocked::MaxTotal {
                    leased: 8,
                    max_total: 8,
                },
            },
            status: StatusCode::GATEWAY_TIMEOUT,
            code: "timeout",
            retry_after: false,
        },
        Case {
            error: LeaseError::ShuttingDown,
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "shutting_down",
            retry_after: true,
        },
        Case {
            error: LeaseError::PostgresDown("restarting after a crash".into()),
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "postgres_unavailable",
            retry_after: true,
        },
        Case {
            error: LeaseError::CloneFailed {
                template: template("app"),
                message: "could not write: No space left on device".into(),
                cause: SqlErrorKind::DiskFull,
            },
            status: StatusCode::INSUFFICIENT_STORAGE,
            code: "disk_full",
            retry_after: false,
        },
        Case {
            error: LeaseError::CloneFailed {
                template: template("app"),
                message: "terminating connection due to administrator command".into(),
                cause: SqlErrorKind::ConnectionLost,
            },
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "clone_failed",
            retry_after: true,
        },
        Case {
            error: LeaseError::Internal("state table corrupt at slot 17".into()),
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            retry_after: false,
        },
    ];
    for case in cases {
        let (app, mut actor) = app();
        let response = exchange(
            &app,
            request("POST", "/lease", r#"{"template": "app"}"#),
            &mut actor,
            |command| match command {
                FakeCommand::Lease { reply, .. } => {
                    reply.send(Err(case.error)).expect("the client waits");
                }
                other => panic!("expected a lease, got {other:?}"),
            },
        )
        .await;
        let (status, headers, body) = read(response).await;
        assert_eq!(status, case.status, "{body}");
        assert_json(&headers);
        assert_eq!(error_code(&body), case.code, "{body}");
        assert_retry_after(&headers, case.retry_after);
        let message = error_message(&body);
        match case.code {
            // The template's own sources are broken: postgres' words must reach the client.
            "template_build_failed" => {
                assert!(message.contains("syntax error at or near"), "{message}")
            }
            "internal" => {
                assert!(
                    !message.contains("slot 17"),
                    "internal detail leaked: {message}"
                );
                assert_eq!(message, "internal error; see the pglease log");
            }
            _ => assert!(!message.is_empty()),
        }
    }
}

#[tokio::test]
async fn release_answers_204_and_defaults_reuse_to_false() {
    let (app, mut actor) = app();
    let response = exchange(
        &app,
        request("DELETE", &format!("/leases/{LEASE_ID}"), ""),
        &mut actor,
        |command| match command {
            FakeCommand::Release { id, reuse, reply } => {
                assert_eq!(id, lease_id());
                assert!(!reuse);
                reply.send(Ok(())).expect("the client waits");
            }
            other => panic!("expected a release, got {other:?}"),
        },
    )
    .await;
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(body, Value::Null);
}

#[tokio::test]
async fn release_passes_reuse_true_to_the_pool() {
    let (app, mut actor) = app();
    let response = exchange(
        &app,
        request("DELETE", &format!("/leases/{LEASE_ID}?reuse=true"), ""),
        &mut actor,
        |command| match command {
            FakeCommand::Release { reuse, reply, .. } => {
                assert!(reuse);
                reply.send(Ok(())).expect("the client waits");
            }
            other => panic!("expected a release, got {other:?}"),
        },
    )
    .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn release_errors_map_to_404_and_410() {
    let cases = [
        (
            LeaseOpError::NotFound(LEASE_ID.into()),
            StatusCode::NOT_FOUND,
            "lease_not_found",
        ),
        (
            LeaseOpError::Lost(LEASE_ID.into()),
            StatusCode::GONE,
            "lease_lost",
        ),
        (
            LeaseOpError::ExceededMaxBytes {
                id: LEASE_ID.into(),
                database: "pglease_abc123_6".into(),
                bytes: 300 << 20,
                limit: 256 << 20,
            },
            StatusCode::GONE,
            "lease_exceeded_max_bytes",
        ),
    ];
    for (error, expected_status, expected_code) in cases {
        let (app, mut actor) = app();
        let response = exchange(
            &app,
            request("DELETE", &format!("/leases/{LEASE_ID}"), ""),
            &mut actor,
            |command| match command {
                FakeCommand::Release { reply, .. } => {
                    reply.send(Err(error)).expect("the client waits");
                }
                other => panic!("expected a release, got {other:?}"),
            },
        )
        .await;
        let (status, headers, body) = read(response).await;
        assert_eq!(status, expected_status);
        assert_json(&headers);
        assert_eq!(error_code(&body), expected_code);
        assert!(error_message(&body).contains(LEASE_ID));
    }
}

#[tokio::test]
async fn release_of_a_malformed_id_is_404_without_asking_the_pool() {
    let (app, mut actor) = app();
    let response = send(&app, request("DELETE", "/leases/not-hex-at-all", "")).await;
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body), "lease_not_found");
    assert!(actor.try_recv().is_none(), "the pool was asked");
}

/// `POST /lease?template=app` reads like a lease of `app`; answering it with a database of
/// the default template, as if the query were not there, would hand a test the wrong schema.
#[tokio::test]
async fn a_query_string_on_an_endpoint_that_takes_a_body_is_400_without_asking_the_pool() {
    let (app, mut actor) = app();
    for (method, uri, body) in [
        ("POST", "/lease?template=app", ""),
        ("POST", "/lease?template=app", "{\"template\": \"app\"}"),
        ("POST", &format!("/leases/{LEASE_ID}/renew?ttl_secs=60"), ""),
        ("PUT", "/templates/app?sql=schema.sql", ""),
    ] {
        let response =
            tokio::time::timeout(COMMAND_TIMEOUT, send(&app, request(method, uri, body)))
                .await
                .unwrap_or_else(|_| panic!("{method} {uri} waited for the pool"));
        let (status, _, answer) = read(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {answer}");
        assert_eq!(error_code(&answer), "malformed_request", "{method} {uri}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        let query = uri.split_once('?').map_or("", |(_, q)| q);
        assert!(
            message.contains("JSON body") && message.contains(query),
            "{method} {uri}: {message}"
        );
    }
    assert!(actor.try_recv().is_none(), "the pool was asked");
}

/// `curl -d template=app` sends a form: the 400 says so and shows the JSON to send instead.
#[tokio::test]
async fn a_form_body_is_400_with_the_json_to_send_instead() {
    let (app, _actor) = app();
    for (body, hinted) in [
        ("template=app", true),
        ("template=app&ttl_secs=60", true),
        ("{not json", false),
        ("template", false),
    ] {
        let response =
            tokio::time::timeout(COMMAND_TIMEOUT, send(&app, request("POST", "/lease", body)))
                .await
                .expect("answered without waiting for the pool");
        let (status, _, answer) = read(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(message.contains("curl -d"), hinted, "{body}: {message}");
    }
}

#[tokio::test]
async fn a_long_refused_query_string_is_quoted_in_part() {
    let (app, _actor) = app();
    let uri = format!("/lease?template={}", "x".repeat(5_000));
    let response = tokio::time::timeout(COMMAND_TIMEOUT, send(&app, request("POST", &uri, "")))
        .await
        .expect("answered without waiting for the pool");
    let (status, _, answer) = read(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.len() < 400 && message.contains("…"), "{message}");
}

#[tokio::test]
async fn renew_answers_the_new_expiry() {
    let (app, mut actor) = app();
    let response = exchange(
        &app,
        request(
            "POST",
            &format!("/leases/{LEASE_ID}/renew"),
            r#"{"ttl_secs": 300}"#,
        ),
        &mut actor,
        |command| match command {
            FakeCommand::Renew { id, ttl, reply } => {
                assert_eq!(id, lease_id());
                assert_eq!(ttl, Some(Duration::from_secs(300)));
                reply.send(Ok(expiry())).expect("the client waits");
            }
            other => panic!("expected a renew, got {other:?}"),
        },
    )
    .await;
    let (status, headers, body) = read(response).await;
    assert_eq!(status, StatusCode::OK);
    assert_json(&headers);
    assert_eq!(
        body,
        json!({ "id": LEASE_ID, "expires_at": "2023-11-14T22:13:20Z" })
    );
}

#[tokio::test]
async fn readyz_follows_the_pool_readiness() {
    let cases = [
        (true, true, StatusCode::OK, None),
        (
            true,
            false,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("the default template is being built"),
        ),
        (
            false,
            true,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("postgres is not up (yet)"),
        ),
    ];
    for (postgres_up, default_template_ready, expected, reason) in cases {
        let (app, mut actor) = app();
        let response =
            exchange(
                &app,
                request("GET", "/readyz", ""),
                &mut actor,
                |command| match command {
                    FakeCommand::Readiness { reply } => {
                        let readiness = Readiness {
                            postgres_up,
                            default_template_ready,
                            ..Readiness::default()
                        };
                        reply.send(readiness).expect("the client waits");
                    }
                    other => panic!("expected a readiness query, got {other:?}"),
                },
            )
            .await;
        let (status, _, body) = read(response).await;
        assert_eq!(status, expected);
        assert_eq!(
            body,
            json!({
                "ready": expected == StatusCode::OK,
                "postgres": postgres_up,
                "default_template": default_template_ready,
                "reason": reason,
                "failed_templates": [],
                "building_templates": [],
            })
        );
    }
}

#[tokio::test]
async fn readyz_names_the_configured_templates_that_cannot_be_built() {
    let (app, mut actor) = app();
    let response = exchange(
        &app,
        request("GET", "/readyz", ""),
        &mut actor,
        |command| match command {
            FakeCommand::Readiness { reply } => {
                let readiness = Readiness {
                    postgres_up: true,
                    default_template_ready: true,
                    failed_templates: vec![(
                        template("app"),
                        "cannot read migrations directory /src/migratoins".into(),
                    )],
                    building_templates: vec![template("reports")],
                };
                reply.send(readiness).expect("the client waits");
            }
            other => panic!("expected a readiness query, got {other:?}"),
        },
    )
    .await;
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body,
        json!({
            "ready": false,
            "postgres": true,
            "default_template": true,
            "reason": "template app cannot be built: cannot read migrations directory /src/migratoins",
            "failed_templates": [
                {"name": "app", "error": "cannot read migrations directory /src/migratoins"},
            ],
            "building_templates": ["reports"],
        })
    );
}

#[tokio::test]
async fn healthz_answers_without_the_pool() {
    let (app, mut actor) = app();
    let (status, headers, body) = read(send(&app, request("GET", "/healthz", "")).await).await;
    assert_eq!(status, StatusCode::OK);
    assert_json(&headers);
    assert_eq!(body, json!({ "status": "ok" }));
    assert!(actor.try_recv().is_none(), "the pool was asked");
}

#[tokio::test]
async fn status_renders_the_report_without_credentials() {
    let report = StatusReport {
        postgres: PostgresStatus {
            storage: Some(pglease_pool::StorageStatus {
                kind: "cow",
                reason: "--storage cow: a store made in RAM".into(),
            }),
            state: "running",
            external: false,
            version: Some("16.4".into()),
            pid: Some(4242),
            data_dir: Some("/dev/shm/pglease-abc123".into()),
            host: Some("127.0.0.1".into()),
            port: Some(54321),
            settings: vec![
                ("fsync".into(), "off".into()),
                ("synchronous_commit".into(), "off".into()),
            ],
            restarts: 1,
            last_error: Some("postgres exited (signal 9)".into()),
            admin_timeouts: 2,
            databases_space: Some(pglease_pool::DatabasesSpace {
                path: "/dev/shm/pglease-abc123/pgdata-1/base".into(),
                bytes: 1 << 30,
                free_bytes: 1 << 20,
                full: true,
                filled_by: Some(pglease_pool::FilledBy {
                    database: pglease_pool::DbName::from_server("pglease_abc123_7".into()),
                    template: Some(TemplateName::default_name()),
                    bytes: 900 << 20,
                    at: expiry(),
                }),
                last_filled_by: Some(pglease_pool::FilledBy {
                    database: pglease_pool::DbName::from_server("pglease_abc123_5".into()),
                    template: None,
                    bytes: 800 << 20,
                    at: expiry(),
                }),
            }),
        },
        templates: vec![
            TemplateStatus {
                name: TemplateName::default_name(),
                fingerprint: Some("f00d".repeat(16)),
                version: 2,
                build_ms: Some(31),
                size_bytes: Some(7_500_000),
                built_at: Some(expiry()),
                state: "ready",
                ready: 4,
                leased: 1,
                in_progress: 2,
                waiting: 0,
                blocked_by: None,
                last_error: None,
                unwatched: false,
                postgres_version: None,
                progress: None,
            },
            TemplateStatus {
                name: template("app"),
                fingerprint: None,
                version: 0,
                build_ms: None,
                size_bytes: None,
                built_at: None,
                state: "failed",
                ready: 0,
                leased: 0,
                in_progress: 0,
                waiting: 3,
                blocked_by: Some("making"),
                last_error: Some("schema.sql line 3: syntax error".into()),
                unwatched: false,
                postgres_version: None,
                progress: None,
            },
        ],
        leases: vec![LeaseSummary {
            id: lease_id(),
            template: TemplateName::default_name(),
            database: DbName::from_server("pglease_abc123_7".into()),
            expires_at: expiry(),
            label: Some("tests/test_orders.py::test_refund".into()),
        }],
        drops: DropStatus {
            pending: 2,
            failed: 1,
            last_error: Some("ERROR: disk full".into()),
        },
        limits: LimitStatus {
            connection_budget: 350,
            connections_in_use: 10,
            refused: Refusals {
                connection_budget: 2,
                ..Refusals::default()
            },
            reclaimed: 1,
            abandoned: 0,
            expired: 3,
            kept: 1,
            reused_unchanged: 0,
            replaced_changed: 0,
            replaced_unstamped: 0,
            byte_budget: Some(1 << 30),
            logical_bytes: 300 << 20,
            store_bytes: Some(40 << 20),
            lease_max_bytes: Some(256 << 20),
            exceeded_max_bytes: 1,
            last_exceeded_max_bytes: Some(pglease_pool::ExceededMaxBytes {
                lease_id: lease_id(),
                template: TemplateName::default_name(),
                database: pglease_pool::DbName::from_server("pglease_abc123_6".into()),
                bytes: 300 << 20,
                limit: 256 << 20,
                at: expiry(),
            }),
        },
        servers: Vec::new(),
    };
    let (app, mut actor) = app();
    let response = exchange(
        &app,
        request("GET", "/status", ""),
        &mut actor,
        |command| match command {
            FakeCommand::Status { reply } => reply.send(report).expect("the client waits"),
            other => panic!("expected a status query, got {other:?}"),
        },
    )
    .await;
    let (status, headers, body) = read(response).await;
    assert_eq!(status, StatusCode::OK);
    assert_json(&headers);
    let postgres = json!({
        "state": "running",
        "external": false,
        "version": "16.4",
        "pid": 4242,
        "data_dir": "/dev/shm/pglease-abc123",
        "storage": { "kind": "cow", "reason": "--storage cow: a store made in RAM" },
        "host": "127.0.0.1",
        "port": 54321,
        "settings": { "fsync": "off", "synchronous_commit": "off" },
        "restarts": 1,
        "last_error": "postgres exited (signal 9)",
        "admin_timeouts": 2,
        "databases_space": {
            "path": "/dev/shm/pglease-abc123/pgdata-1/base",
            "bytes": 1u64 << 30,
            "free_bytes": 1u64 << 20,
            "full": true,
            "filled_by": {
                "database": "pglease_abc123_7",
                "template": "default",
                "bytes": 900u64 << 20,
                "at": humantime::format_rfc3339_seconds(expiry()).to_string(),
            },
            "last_filled_by": {
                "database": "pglease_abc123_5",
                "template": null,
                "bytes": 800u64 << 20,
                "at": humantime::format_rfc3339_seconds(expiry()).to_string(),
            },
        },
    });
    let drops = json!({ "pending": 2, "failed": 1, "last_error": "ERROR: disk full" });
    let limits = json!({
        "connection_budget": 350,
        "connections_in_use": 10,
        "refused": { "connection_budget": 2, "max_total": 0, "byte_budget": 0, "max_waiting": 0, "making": 0 },
        "kept": 1,
        "reclaimed": 1,
        "abandoned": 0,
        "expired": 3,
        "reused_unchanged": 0,
        "replaced_changed": 0,
        "replaced_unstamped": 0,
        "byte_budget": 1u64 << 30,
        "logical_bytes": 300u64 << 20,
        "store_bytes": 40u64 << 20,
        "lease_max_bytes": 256u64 << 20,
        "exceeded_max_bytes": 1,
        "last_exceeded_max_bytes": {
            "lease_id": LEASE_ID,
            "template": "default",
            "database": "pglease_abc123_6",
            "bytes": 300u64 << 20,
            "limit": 256u64 << 20,
            "at": humantime::format_rfc3339_seconds(expiry()).to_string(),
        },
    });
    assert_eq!(
        body,
        json!({
            "postgres": postgres,
            "templates": [
                {
                    "name": "default",
                    "fingerprint": "f00d".repeat(16),
                    "version": 2,
                    "build_ms": 31,
                    "size_bytes": 7_500_000,
                    "built_at": humantime::format_rfc3339_seconds(expiry()).to_string(),
                    "state": "ready",
                    "ready": 4,
                    "leased": 1,
                    "in_progress": 2,
                    "waiting": 0,
                    "blocked_by": null,
                    "last_error": null,
                    "unwatched": false,
                    "postgres_version": "16.4",
                },
                {
                    "name": "app",
                    "fingerprint": null,
                    "version": 0,
                    "build_ms": null,
                    "size_bytes": null,
                    "built_at": null,
                    "state": "failed",
                    "ready": 0,
                    "leased": 0,
                    "in_progress": 0,
                    "waiting": 3,
                    "blocked_by": "making",
                    "last_error": "schema.sql line 3: syntax error",
                    "unwatched": false,
                    "postgres_version": "16.4",
                },
            ],
            // No token guards this API: no lease id, which would release the lease.
            "leases": [
                {
                    "template": "default",
                    "database": "pglease_abc123_7",
                    "expires_at": "2023-11-14T22:13:20Z",
                    "label": "tests/test_orders.py::test_refund",
                },
            ],
            "drops": drops,
            "limits": limits,
            "servers": [{
                "major": 16,
                "postgres": postgres,
                "templates": ["default", "app"],
                "drops": drops,
                "limits": limits,
            }],
        })
    );
    assert!(
        !body.to_string().contains("password"),
        "credentials in /status: {body}"
    );
    // A client (the benchmark) reads the answer back into the same wire types, losing
    // nothing.
    let typed: crate::wire::StatusResponse =
        serde_json::from_value(body.clone()).expect("/status reads back");
    assert_eq!(serde_json::to_value(&typed).expect("serializes"), body);
}

#[tokio::test]
async fn lease_after_begin_shutdown_is_503_without_asking_the_pool() {
    let (handle, mut actor) = fake_pool();
    let state = AppState::new(Servers::single(handle, 16, "16.4"), ApiConfig::default());
    let app = router(state.clone());
    state.begin_shutdown();
    let (status, headers, body) = read(send(&app, request("POST", "/lease", "")).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_retry_after(&headers, true);
    assert_eq!(error_code(&body), "shutting_down");
    assert!(actor.try_recv().is_none(), "the pool was asked");
}

#[tokio::test]
async fn a_stopped_pool_reads_as_shutting_down() {
    let (app, actor) = app();
    drop(actor);
    let (status, headers, body) = read(send(&app, request("POST", "/lease", "")).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_retry_after(&headers, true);
    assert_eq!(error_code(&body), "shutting_down");
    let (status, _, body) = read(send(&app, request("GET", "/status", "")).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&body), "shutting_down");
    let (status, _, body) = read(send(&app, request("GET", "/readyz", "")).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["ready"], false);
}

/// The contract the actor relies on to take a database back: when the client goes away,
/// axum drops the handler, the reply receiver goes with it, and the actor's `send` fails
/// and hands the lease back.
#[tokio::test]
async fn a_dropped_request_closes_the_reply_channel() {
    let (app, mut actor) = app();
    let mut pending = Box::pin(app.oneshot(request("POST", "/lease", "")));
    let command = tokio::select! {
        response = &mut pending => panic!("answered before the pool replied: {response:?}"),
        command = tokio::time::timeout(COMMAND_TIMEOUT, actor.recv()) => command
            .expect("the handler sent no command in time")
            .expect("every handle was dropped"),
    };
    let FakeCommand::Lease { reply, .. } = command else {
        panic!("expected a lease command");
    };
    assert!(!reply.is_closed(), "the client is still waiting");

    // The client disconnects: hyper drops the in-flight request future.
    drop(pending);

    assert!(reply.is_closed(), "the reply receiver outlived the request");
    let returned = reply
        .send(Ok(lease("default")))
        .expect_err("nobody is waiting for the lease");
    let lease = returned.expect("the lease itself comes back to the actor");
    assert_eq!(lease.id, lease_id());
}

#[tokio::test]
async fn the_openapi_document_lists_every_route_and_needs_no_pool() {
    let (app, _actor) = app();
    let response = app
        .clone()
        .oneshot(request("GET", "/openapi.json", ""))
        .await
        .expect("infallible");
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::OK);
    let paths = body["paths"].as_object().expect("paths");
    for path in [
        "/lease",
        "/leases/{id}",
        "/leases/{id}/renew",
        "/status",
        "/healthz",
        "/readyz",
        "/templates",
        "/templates/{name}",
        "/templates/{name}/rebuild",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from {:?}",
            paths.keys()
        );
    }
    assert_eq!(
        body["paths"]["/lease"]["post"]["responses"]["504"]["description"],
        "No database became ready within wait_ms"
    );
}

// The IntegreSQL API (`integresql.rs`): parsing and the mapping of pool answers to its
// statuses and `{"message"}` bodies. Its semantics against a real pool: tests/it/integresql.rs.

fn form(uri: &str, body: &str) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body.to_owned()))
        .expect("a valid request")
}

#[tokio::test]
async fn integresql_initialize_takes_json_or_a_form_and_answers_its_shape() {
    let (app, mut actor) = app();
    for request in [
        request("POST", "/api/v1/templates", r#"{"hash": "d41d8cd9"}"#),
        form("/api/v1/templates", "hash=d41d8cd9"),
    ] {
        let response = exchange(&app, request, &mut actor, |command| {
            let FakeCommand::Initialize { template: t, reply } = command else {
                panic!("expected Initialize, got {command:?}");
            };
            assert_eq!(t, template("d41d8cd9"));
            let _ = reply.send(Ok(lease("d41d8cd9").connect));
        })
        .await;
        let (status, _, body) = read(response).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            json!({"database": {"templateHash": "d41d8cd9", "config": {
                "host": "127.0.0.1", "port": 54321, "username": "pglease_user",
                "password": "s3cret-pw", "database": "pglease_abc123_7",
                "additionalParams": {"sslmode": "disable"}}}})
        );
    }
}

#[tokio::test]
async fn integresql_bad_requests_are_400_without_asking_the_pool() {
    let (app, mut actor) = app();
    for (request, message) in [
        (
            request("POST", "/api/v1/templates", "{}"),
            "hash is required",
        ),
        (
            request("POST", "/api/v1/templates", "not json"),
            "invalid request body",
        ),
        (
            request("POST", "/api/v1/templates", r#"{"hash": "UPPER"}"#),
            "invalid hash",
        ),
        (
            request("POST", "/api/v1/templates/abc/tests/x/unlock", ""),
            "invalid test database ID",
        ),
        (
            request("POST", "/api/v1/templates/abc/tests/-1/recreate", ""),
            "invalid test database ID",
        ),
    ] {
        let (status, _, body) = read(send(&app, request).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let text = body["message"].as_str().expect("a message");
        assert!(text.contains(message), "{text:?} should say {message:?}");
    }
    assert!(actor.try_recv().is_none());
}

#[tokio::test]
async fn integresql_pool_answers_map_to_its_statuses() {
    use pglease_pool::TemplateOpError;
    let (app, mut actor) = app();
    let t = template("abc");
    let cases: Vec<(Request<Body>, StatusCode, FakeAnswer)> = vec![
        (
            request("POST", "/api/v1/templates", r#"{"hash": "abc"}"#),
            StatusCode::LOCKED,
            FakeAnswer::Op(TemplateOpError::AlreadyInitialized(t.clone())),
        ),
        (
            request("PUT", "/api/v1/templates/abc", ""),
            StatusCode::NOT_FOUND,
            FakeAnswer::Op(TemplateOpError::UnknownTemplate(t.clone())),
        ),
        (
            request("DELETE", "/api/v1/templates/abc", ""),
            StatusCode::SERVICE_UNAVAILABLE,
            FakeAnswer::Op(TemplateOpError::PostgresDown("gone".into())),
        ),
        (
            request("GET", "/api/v1/templates/abc/tests", ""),
            StatusCode::GONE,
            FakeAnswer::Lease(LeaseError::Discarded(t.clone())),
        ),
        (
            request("GET", "/api/v1/templates/abc/tests", ""),
            StatusCode::NOT_FOUND,
            FakeAnswer::Lease(LeaseError::unknown_template(t.clone())),
        ),
        (
            request("POST", "/api/v1/templates/abc/tests/3/unlock", ""),
            StatusCode::LOCKED,
            FakeAnswer::Op(TemplateOpError::InUse {
                template: t.clone(),
                number: 3,
                sessions: 1,
            }),
        ),
        (
            request("DELETE", "/api/v1/templates/abc/tests/3", ""),
            StatusCode::NOT_FOUND,
            FakeAnswer::Op(TemplateOpError::UnknownTest {
                template: t.clone(),
                number: 3,
            }),
        ),
        (
            request("DELETE", "/api/v1/admin/templates", ""),
            StatusCode::NO_CONTENT,
            FakeAnswer::Ok,
        ),
        (
            request("DELETE", "/api/v1/admin/templates", ""),
            StatusCode::SERVICE_UNAVAILABLE,
            FakeAnswer::Op(TemplateOpError::PostgresDown("restarting".into())),
        ),
        (
            request("POST", "/api/v1/templates", r#"{"hash": "abc"}"#),
            StatusCode::SERVICE_UNAVAILABLE,
            FakeAnswer::Op(TemplateOpError::PostgresDown("restarting".into())),
        ),
        (
            request("PUT", "/api/v1/templates/abc", ""),
            StatusCode::SERVICE_UNAVAILABLE,
            FakeAnswer::Op(TemplateOpError::ShuttingDown),
        ),
        (
            request("GET", "/api/v1/templates/abc/tests", ""),
            StatusCode::SERVICE_UNAVAILABLE,
            FakeAnswer::Lease(LeaseError::PostgresDown("restarting".into())),
        ),
        (
            request("POST", "/api/v1/templates/abc/tests/3/recreate", ""),
            StatusCode::LOCKED,
            FakeAnswer::Op(TemplateOpError::InUse {
                template: t.clone(),
                number: 3,
                sessions: 2,
            }),
        ),
    ];
    for (request, expected, answer) in cases {
        let response = exchange(&app, request, &mut actor, |command| answer.give(command)).await;
        let (status, _, body) = read(response).await;
        assert_eq!(status, expected);
        if status != StatusCode::NO_CONTENT {
            assert!(body["message"].is_string(), "{body}");
        }
    }
}

/// What the fake pool answers in `integresql_pool_answers_map_to_its_statuses`.
enum FakeAnswer {
    Op(pglease_pool::TemplateOpError),
    Lease(LeaseError),
    Ok,
}

impl FakeAnswer {
    fn give(self, command: FakeCommand) {
        match (self, command) {
            (FakeAnswer::Op(e), FakeCommand::Initialize { reply, .. }) => {
                let _ = reply.send(Err(e));
            }
            (FakeAnswer::Op(e), FakeCommand::Finalize { reply, .. })
            | (FakeAnswer::Op(e), FakeCommand::Discard { reply, .. })
            | (FakeAnswer::Op(e), FakeCommand::GiveBack { reply, .. }) => {
                let _ = reply.send(Err(e));
            }
            (FakeAnswer::Lease(e), FakeCommand::Lease { request, reply }) => {
                assert!(
                    request.reclaimable,
                    "IntegreSQL test databases are reclaimable"
                );
                let _ = reply.send(Err(e));
            }
            (FakeAnswer::Ok, FakeCommand::DiscardAllClientBuilt { reply }) => {
                let _ = reply.send(Ok(()));
            }
            (FakeAnswer::Op(e), FakeCommand::DiscardAllClientBuilt { reply }) => {
                let _ = reply.send(Err(e));
            }
            (_, command) => panic!("unexpected command {command:?}"),
        }
    }
}

// Who may change a template the operator defined (issue 41): the pool decides from who asks;
// the API says only whether the request showed the token. Against a real pool:
// tests/it/security.rs.

/// A router over a fake pool whose API is guarded by `token`.
fn app_with_token(token: &str) -> (Router, FakeActor) {
    let (handle, actor) = fake_pool();
    let config = ApiConfig {
        token: Some(crate::Token::new(token.to_owned())),
        ..ApiConfig::default()
    };
    (
        router(AppState::new(Servers::single(handle, 16, "16.4"), config)),
        actor,
    )
}

/// A template being built, at `version`.
fn template_status(name: TemplateName, version: u32) -> TemplateStatus {
    TemplateStatus {
        name,
        fingerprint: None,
        version,
        build_ms: None,
        size_bytes: None,
        built_at: None,
        state: "building",
        ready: 0,
        leased: 0,
        in_progress: 0,
        waiting: 0,
        blocked_by: None,
        last_error: None,
        unwatched: false,
        postgres_version: None,
        progress: None,
    }
}

fn with_bearer(mut request: Request<Body>, token: &str) -> Request<Body> {
    let value = format!("Bearer {token}").parse().expect("a header value");
    request.headers_mut().insert(header::AUTHORIZATION, value);
    request
}

/// Without a token the API cannot tell callers apart: a `PUT` and a rebuild reach the pool
/// as anybody's, and the pool's refusal of the operator's template is a 403 that says who
/// may change it.
#[tokio::test]
async fn without_a_token_template_changes_are_anybodys_and_the_refusal_is_403() {
    let (app, mut actor) = app();
    let response = exchange(
        &app,
        request("PUT", "/templates/app", r#"{"sql": "/tmp/evil.sql"}"#),
        &mut actor,
        |command| match command {
            FakeCommand::Register {
                name,
                changer,
                reply,
                ..
            } => {
                assert_eq!(changer, Changer::Anyone);
                let _ = reply.send(Err(LeaseError::ConfiguredTemplate(name)));
            }
            other => panic!("unexpected {other:?}"),
        },
    )
    .await;
    let (status, headers, body) = read(response).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_json(&headers);
    assert_eq!(error_code(&body), "template_is_configured");
    let message = error_message(&body);
    assert!(
        message.contains("\"app\"")
            && message.contains("configuration")
            && message.contains("token"),
        "{message}"
    );

    let response = exchange(
        &app,
        request("POST", "/templates/app/rebuild", ""),
        &mut actor,
        |command| match command {
            FakeCommand::Rebuild {
                template,
                changer,
                reply,
            } => {
                assert_eq!(changer, Changer::Anyone);
                let _ = reply.send(Err(LeaseError::ConfiguredTemplate(template)));
            }
            other => panic!("unexpected {other:?}"),
        },
    )
    .await;
    let (status, _, body) = read(response).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(error_code(&body), "template_is_configured");
}

/// With a token, a request that showed it asks as a token holder; one that did not is 401
/// and never reaches the pool.
#[tokio::test]
async fn with_a_token_only_its_holders_ask_as_token_holders() {
    let (app, mut actor) = app_with_token("s3cret");
    let response = send(
        &app,
        request("PUT", "/templates/app", r#"{"sql": "/tmp/new.sql"}"#),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(actor.try_recv().is_none(), "a 401 reached the pool");

    let put = with_bearer(
        request("PUT", "/templates/app", r#"{"sql": "/tmp/new.sql"}"#),
        "s3cret",
    );
    let response = exchange(&app, put, &mut actor, |command| match command {
        FakeCommand::Register {
            name,
            changer,
            reply,
            ..
        } => {
            assert_eq!(changer, Changer::TokenHolder);
            let status = template_status(name, 2);
            let _ = reply.send(Ok((pglease_pool::Registered::Replaced, status)));
        }
        other => panic!("unexpected {other:?}"),
    })
    .await;
    assert_eq!(response.status(), StatusCode::OK);

    let rebuild = with_bearer(request("POST", "/templates/app/rebuild", ""), "s3cret");
    let response = exchange(&app, rebuild, &mut actor, |command| match command {
        FakeCommand::Rebuild {
            template,
            changer,
            reply,
        } => {
            assert_eq!(changer, Changer::TokenHolder);
            let _ = reply.send(Ok(template_status(template, 3)));
        }
        other => panic!("unexpected {other:?}"),
    })
    .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
}
