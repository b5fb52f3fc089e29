//! `POST /lease`, `DELETE /leases/{id}`, `POST /leases/{id}/renew`: validate, call the pool,
//! render the answer. A lease is handed out by the pool actor (pglease-pool `state/grants.rs`,
//! `request_lease`); this handler only asks for it.

use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use pglease_pool::{Lease, LeaseId, LeaseRequest, TemplateName};

use super::{parse_body, parse_postgres_version};
use crate::error::ApiError;
use crate::wire::{ErrorBody, LeaseBody, LeaseResponse, ReleaseQuery, RenewBody, RenewResponse};
use crate::AppState;

/// Largest `max_connections` a request may name (postgres' own limit is far above).
const MAX_LEASE_CONNECTIONS: u32 = 10_000;

/// `POST /lease` → 201 with connection details.
#[utoipa::path(post, path = "/lease", request_body(content = Option<LeaseBody>, description = "All fields optional; an empty body means all defaults"),
    responses(
        (status = 201, description = "A database leased", body = LeaseResponse),
        (status = 400, description = "The body is not JSON, or a query string was sent", body = ErrorBody),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 404, description = "No such template", body = ErrorBody),
        (status = 410, description = "The template was discarded by its IntegreSQL client", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid values, or the template failed to build", body = ErrorBody),
        (status = 429, description = "Too many requests waiting", body = ErrorBody),
        (status = 503, description = "Stopping, postgres down, or a clone failed", body = ErrorBody),
        (status = 504, description = "No database became ready within wait_ms", body = ErrorBody),
        (status = 507, description = "No room in the byte budget", body = ErrorBody),
    ))]
pub async fn lease(
    State(state): State<AppState>,
    query: RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<LeaseResponse>), ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let body: LeaseBody = parse_body(query, body)?;
    let template = match body.template.as_deref() {
        None => TemplateName::default_name(),
        Some(name) => TemplateName::new(name).map_err(|e| ApiError::invalid(e.to_string()))?,
    };
    let ttl = body
        .ttl_secs
        .map(|secs| validate_ttl(&state, secs))
        .transpose()?;
    let wait = match body.wait_ms {
        None => state.config.default_wait,
        Some(ms) if Duration::from_millis(ms) <= state.config.max_wait => Duration::from_millis(ms),
        Some(ms) => {
            return Err(ApiError::invalid(format!(
                "wait_ms {ms} is over the maximum of {}",
                state.config.max_wait.as_millis()
            )))
        }
    };
    let connections = match body.max_connections {
        None => None,
        Some(n @ 1..=MAX_LEASE_CONNECTIONS) => Some(n),
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "max_connections must be between 1 and {MAX_LEASE_CONNECTIONS}, got {n}"
            )))
        }
    };
    let postgres_version = parse_postgres_version(body.postgres_version.as_deref())?;
    let label = body.label.map(validate_label).transpose()?;
    // If the client goes away, axum drops this future and with it the reply receiver:
    // the pool then takes the database back.
    let request = LeaseRequest {
        template,
        ttl,
        wait,
        connections,
        reclaimable: false,
        postgres_version,
        label,
    };
    let started = std::time::Instant::now();
    let answer = state.pool.lease(request).await.map_err(ApiError::from);
    let outcome = answer.as_ref().map_or_else(ApiError::code, |_| "granted");
    state.metrics.lease_answered(outcome, started.elapsed());
    Ok((StatusCode::CREATED, Json(lease_response(answer?))))
}

/// `DELETE /leases/{id}[?reuse=true | ?keep=SECS]` → 204.
#[utoipa::path(delete, path = "/leases/{id}",
    params(("id" = String, Path, description = "The lease id", pattern = "^[0-9a-f]{32}$"), ("reuse" = Option<bool>, Query, description = "The database is unchanged: recycle it as is"), ("keep" = Option<u64>, Query, description = "Keep the database as it is for this many seconds (1 to 86400; shortened to the daemon's --max-keep), listed by GET /kept", minimum = 1, maximum = 86400)),
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "The query string does not parse", body = ErrorBody),
        (status = 422, description = "keep out of range, or with reuse=true", body = ErrorBody),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 404, description = "No open lease with this id", body = ErrorBody),
        (status = 410, description = "The lease was lost when postgres restarted (lease_lost), or ended because its database grew past --lease-max-bytes (lease_exceeded_max_bytes)", body = ErrorBody),
        (status = 503, description = "Stopping", body = ErrorBody),
    ))]
pub async fn release(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<ReleaseQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::malformed(e.body_text()))?;
    let id = LeaseId::parse(&id).ok_or_else(|| ApiError::lease_not_found(&id))?;
    let reuse = query.reuse.unwrap_or(false);
    match query.keep {
        None => state.pool.release(id, reuse).await?,
        Some(_) if reuse => {
            return Err(ApiError::invalid(
                "keep and reuse=true contradict each other: a kept database is not reused",
            ))
        }
        Some(secs @ 1..=86_400) => {
            state.pool.keep(id, Duration::from_secs(secs)).await?;
        }
        Some(secs) => {
            return Err(ApiError::invalid(format!(
                "keep must be between 1 and 86400 seconds, got {secs}"
            )))
        }
    }
    state.metrics.released(reuse);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /leases/{id}/renew` `{"ttl_secs": N}` → 200 with the new expiry.
#[utoipa::path(post, path = "/leases/{id}/renew", params(("id" = String, Path, description = "The lease id", pattern = "^[0-9a-f]{32}$")),
    request_body(content = Option<RenewBody>, description = "Optional; the default time to live when empty"),
    responses(
        (status = 200, description = "Renewed", body = RenewResponse),
        (status = 400, description = "The body is not JSON, or a query string was sent", body = ErrorBody),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 404, description = "No open lease with this id", body = ErrorBody),
        (status = 410, description = "The lease was lost when postgres restarted (lease_lost), or ended because its database grew past --lease-max-bytes (lease_exceeded_max_bytes)", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid values", body = ErrorBody),
        (status = 503, description = "Stopping", body = ErrorBody),
    ))]
pub async fn renew(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<RenewResponse>, ApiError> {
    let body: RenewBody = parse_body(query, body)?;
    let ttl = body
        .ttl_secs
        .map(|secs| validate_ttl(&state, secs))
        .transpose()?;
    let id = LeaseId::parse(&id).ok_or_else(|| ApiError::lease_not_found(&id))?;
    let expires_at = state.pool.renew(id.clone(), ttl).await?;
    Ok(Json(RenewResponse {
        id: id.to_string(),
        expires_at: rfc3339(expires_at),
    }))
}

fn validate_ttl(state: &AppState, secs: u64) -> Result<Duration, ApiError> {
    let max = state.config.max_ttl.as_secs();
    if secs == 0 || secs > max {
        return Err(ApiError::invalid(format!(
            "ttl_secs must be between 1 and {max}, got {secs}"
        )));
    }
    Ok(Duration::from_secs(secs))
}

fn lease_response(lease: Lease) -> LeaseResponse {
    LeaseResponse {
        url: lease.connect.url(),
        jdbc_url: lease.connect.jdbc_url(),
        id: lease.id.to_string(),
        template: lease.template.to_string(),
        fingerprint: lease.fingerprint,
        database: lease.connect.database.to_string(),
        host: lease.connect.host,
        port: lease.connect.port,
        user: lease.connect.user,
        password: lease.connect.password,
        expires_at: rfc3339(lease.expires_at),
    }
}

/// RFC 3339 in UTC, whole seconds.
pub(crate) fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// Longest label a lease may carry, in characters.
const MAX_LABEL_CHARS: usize = 256;

/// A lease's label: short, printable text (it goes into logs and `/status`).
fn validate_label(label: String) -> Result<String, ApiError> {
    if label.chars().count() > MAX_LABEL_CHARS {
        return Err(ApiError::invalid(format!(
            "label is longer than {MAX_LABEL_CHARS} characters"
        )));
    }
    if label.chars().any(char::is_control) {
        return Err(ApiError::invalid("label contains control characters"));
    }
    Ok(label)
}
