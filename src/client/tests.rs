//! The client's own rules: the requests it sends, how it reads answers and refusals.

use pglease_api::wire::{LeaseResponse, RenewBody};
use reqwest::StatusCode;
use serde_json::json;

use super::{Client, ClientError, Ending, LeaseOptions};
use crate::cli::ClientArgs;

#[test]
fn requests_carry_the_fields_given_and_no_others() {
    let body = |options| serde_json::to_value(super::lease_body("app", options)).ok();
    assert_eq!(
        body(LeaseOptions::default()),
        Some(json!({"template": "app"}))
    );
    assert_eq!(
        body(LeaseOptions {
            ttl: Some(60),
            wait_ms: Some(500),
            postgres_version: "17.6".parse().ok(),
            label: Some("suite/test"),
        }),
        Some(json!({
            "template": "app",
            "ttl_secs": 60,
            "wait_ms": 500,
            "postgres_version": "17.6",
            "label": "suite/test",
        }))
    );
    assert_eq!(
        serde_json::to_value(RenewBody { ttl_secs: None }).ok(),
        Some(json!({}))
    );
    let query = |ending: Ending| {
        reqwest::Client::new()
            .delete("http://127.0.0.1:9/leases/abc")
            .query(&ending.query())
            .build()
            .ok()
            .and_then(|request| request.url().query().map(str::to_owned))
    };
    assert_eq!(query(Ending::Drop).as_deref(), Some("reuse=false"));
    assert_eq!(query(Ending::Reuse).as_deref(), Some("reuse=true"));
    assert_eq!(query(Ending::Keep(600)).as_deref(), Some("keep=600"));
}

#[test]
fn an_answer_of_another_shape_is_an_error_that_shows_it() {
    let Ok(client) = Client::new(&ClientArgs {
        server: "http://127.0.0.1:9/".into(),
        token: None,
    }) else {
        panic!("no HTTP client");
    };
    let answer = |body: &str| super::Answer {
        status: StatusCode::OK,
        body: body.into(),
    };
    for body in ["", "<html>proxy</html>", r#"{"id": "abc"}"#] {
        match client.read::<LeaseResponse>(&answer(body)) {
            Ok(lease) => panic!("{body:?} read as {lease:?}"),
            Err(ClientError(message)) => assert!(
                message.starts_with("unexpected answer from http://127.0.0.1:9 (200 OK): ")
                    && message.ends_with(if body.is_empty() { "nothing" } else { body }),
                "{message}"
            ),
        }
    }
    // An error answer: the daemon's message, else what came, cut short.
    assert_eq!(
        super::error_message(
            r#"{"error": {"code": "unknown_template", "message": "no template \"x\""}}"#
        ),
        "no template \"x\""
    );
    assert_eq!(
        super::error_message("<html>bad gateway</html>"),
        "<html>bad gateway</html>"
    );
    assert_eq!(super::error_message(""), "");
    assert_eq!(
        super::error_message(&"x".repeat(500)),
        format!("{}…", "x".repeat(200))
    );
}

#[test]
fn a_refusal_reads_as_a_sentence_with_the_daemons_message() {
    assert_eq!(
        super::refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the lease asks for 16, but template \"app\" lives on PostgreSQL 17"
        ),
        "the daemon refused the request (422 Unprocessable Entity): the lease asks for 16, but template \"app\" lives on PostgreSQL 17"
    );
    assert_eq!(
        super::refused(StatusCode::SERVICE_UNAVAILABLE, "postgres is restarting"),
        "the daemon could not carry out the request (503 Service Unavailable): postgres is restarting"
    );
    // An answer without a body says no more than its status.
    assert_eq!(
        super::refused(StatusCode::NOT_FOUND, ""),
        "the daemon refused the request (404 Not Found)"
    );
}
