//! Handlers, one module per resource, and the shared body parsing: JSON that does not parse
//! is 400, JSON of the wrong shape or with bad values is 422, an oversized body is 413, and a
//! query string where the parameters belong in the body is 400.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::RawQuery;
use axum::http::{StatusCode, Uri};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

pub mod front;
pub mod kept;
pub mod leases;
pub mod status;
pub mod templates;

/// Longest part of a refused query string an error quotes back.
const QUOTED_QUERY_CHARS: usize = 80;

/// Parses an optional JSON body: empty means all defaults. The endpoints that take a body
/// take no query string: `POST /lease?template=app` would otherwise lease the default
/// template's database as if the parameter were not there, so a query is refused (400).
fn parse_body<T: DeserializeOwned + Default>(
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        let quoted: String = query.chars().take(QUOTED_QUERY_CHARS).collect();
        let ellipsis = if quoted.len() < query.len() {
            "…"
        } else {
            ""
        };
        return Err(ApiError::malformed(format!(
            "this endpoint takes its parameters as a JSON body, not in the query string \
             (got ?{quoted}{ellipsis}): send the same fields in the JSON body, as in \
             {{\"template\": \"app\"}}"
        )));
    }
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::malformed(rejection.body_text())
        }
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        let hint = if looks_like_a_form(&bytes) {
            " (it reads as a form, `name=value`, which is what `curl -d` sends without \
             JSON: send e.g. -d '{\"template\": \"app\"}')"
        } else {
            ""
        };
        ApiError::malformed(format!("request body is not valid JSON: {e}{hint}"))
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid("request body must be a JSON object"));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
}

/// Whether a body that is not JSON has a form's shape: `name=value` pairs joined by `&`.
fn looks_like_a_form(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    !text.starts_with(['{', '[', '"'])
        && text.split('&').all(|pair| {
            pair.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
        })
}

/// JSON 404 for paths no route serves.
pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::no_route(uri.path())
}

/// JSON 405 for known paths with the wrong method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// A body's `postgres_version` ("17", "17.6"): 422 unless a supported version.
fn parse_postgres_version(
    text: Option<&str>,
) -> Result<Option<pglease_pool::VersionSpec>, ApiError> {
    text.map(|text| {
        text.parse()
            .map_err(|e| ApiError::invalid(format!("postgres_version: {e}")))
    })
    .transpose()
}
