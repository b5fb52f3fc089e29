//! `GET /status`, `/healthz`, `/readyz`: read-only views of the pool.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use pglease_pool::{DropStatus, FilledBy, LimitStatus, PostgresStatus};

use super::front::front_json;
use super::leases::rfc3339;
use super::templates::template_json;
use crate::error::ApiError;
use crate::wire::{
    DatabasesSpaceJson, DropsJson, ErrorBody, ExceededMaxBytesJson, FailedTemplateJson,
    FilledByJson, HealthResponse, LeaseJson, LimitsJson, PostgresJson, ReadyResponse, RefusedJson,
    ServerJson, StatusResponse, StorageJson,
};
use crate::AppState;

/// `GET /status`: postgres, templates and open leases (never credentials; lease ids only
/// where a token guards the API, see `docs/security.md`).
#[utoipa::path(get, path = "/status", responses(
    (status = 200, description = "The pool", body = StatusResponse),
    (status = 401, description = "A token is required", body = ErrorBody),
    (status = 503, description = "Stopping", body = ErrorBody),
))]
pub async fn status(State(state): State<AppState>) -> Result<Json<StatusResponse>, ApiError> {
    let report = state
        .pool
        .status()
        .await
        .ok_or_else(ApiError::shutting_down)?;
    let ids = state.shows_lease_secrets();
    Ok(Json(StatusResponse {
        postgres: postgres_json(report.postgres),
        templates: report.templates.into_iter().map(template_json).collect(),
        leases: report
            .leases
            .into_iter()
            .map(|l| LeaseJson {
                id: ids.then(|| l.id.to_string()),
                template: l.template.to_string(),
                database: l.database.to_string(),
                expires_at: rfc3339(l.expires_at),
                label: l.label,
            })
            .collect(),
        drops: drops_json(report.drops),
        limits: limits_json(report.limits),
        servers: report
            .servers
            .into_iter()
            .map(|server| ServerJson {
                major: server.major,
                postgres: postgres_json(server.postgres),
                templates: server.templates.iter().map(ToString::to_string).collect(),
                drops: drops_json(server.drops),
                limits: limits_json(server.limits),
            })
            .collect(),
        front: state
            .front
            .as_ref()
            .map(|front| front_json(front.report(), ids)),
    }))
}

fn postgres_json(postgres: PostgresStatus) -> PostgresJson {
    PostgresJson {
        state: postgres.state.into(),
        external: postgres.external,
        version: postgres.version,
        pid: postgres.pid,
        data_dir: postgres.data_dir.map(|d| d.display().to_string()),
        storage: postgres.storage.map(|s| StorageJson {
            kind: s.kind.into(),
            reason: s.reason,
        }),
        host: postgres.host,
        port: postgres.port,
        settings: postgres
            .settings
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect(),
        restarts: postgres.restarts,
        last_error: postgres.last_error,
        admin_timeouts: postgres.admin_timeouts,
        databases_space: postgres.databases_space.map(|space| DatabasesSpaceJson {
            path: space.path.display().to_string(),
            bytes: space.bytes,
            free_bytes: space.free_bytes,
            full: space.full,
            filled_by: space.filled_by.map(filled_by_json),
            last_filled_by: space.last_filled_by.map(filled_by_json),
        }),
    }
}

fn filled_by_json(filled: FilledBy) -> FilledByJson {
    FilledByJson {
        database: filled.database.to_string(),
        template: filled.template.map(|t| t.to_string()),
        bytes: filled.bytes,
        at: rfc3339(filled.at),
    }
}

fn drops_json(drops: DropStatus) -> DropsJson {
    DropsJson {
        pending: drops.pending,
        failed: drops.failed,
        last_error: drops.last_error,
    }
}

fn limits_json(limits: LimitStatus) -> LimitsJson {
    LimitsJson {
        connection_budget: limits.connection_budget,
        connections_in_use: limits.connections_in_use,
        refused: RefusedJson {
            connection_budget: limits.refused.connection_budget,
            max_total: limits.refused.max_total,
            byte_budget: limits.refused.byte_budget,
            max_waiting: limits.refused.max_waiting,
            making: limits.refused.making,
        },
        kept: limits.kept,
        reclaimed: limits.reclaimed,
        abandoned: limits.abandoned,
        expired: limits.expired,
        reused_unchanged: limits.reused_unchanged,
        replaced_changed: limits.replaced_changed,
        replaced_unstamped: limits.replaced_unstamped,
        byte_budget: limits.byte_budget,
        logical_bytes: limits.logical_bytes,
        store_bytes: limits.store_bytes,
        lease_max_bytes: limits.lease_max_bytes,
        exceeded_max_bytes: limits.exceeded_max_bytes,
        last_exceeded_max_bytes: limits
            .last_exceeded_max_bytes
            .map(|ended| ExceededMaxBytesJson {
                lease_id: ended.lease_id.to_string(),
                template: ended.template.to_string(),
                database: ended.database.to_string(),
                bytes: ended.bytes,
                limit: ended.limit,
                at: rfc3339(ended.at),
            }),
    }
}

/// `GET /metrics`: the pool in the OpenMetrics text format (Prometheus scrapes it).
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String),
    (status = 401, description = "A token is required", body = ErrorBody),
    (status = 503, description = "Stopping", body = ErrorBody),
))]
pub async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let report = state
        .pool
        .status()
        .await
        .ok_or_else(ApiError::shutting_down)?;
    let front = state.front.as_ref().map(|front| front.report());
    let text = state
        .metrics
        .render(&report, front.as_ref())
        .map_err(|e| ApiError::internal(format!("encoding the metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text))
}

/// `GET /healthz`: the daemon answers.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "Alive", body = HealthResponse)))]
pub async fn healthz() -> Json<HealthResponse> {
    Json(HealthResponse { status: "ok" })
}

/// `GET /readyz`: 200 when postgres is up, the default template built and no configured
/// template failed (with `--prebuild`, each one built), else 503 with the `reason`.
#[utoipa::path(get, path = "/readyz", responses(
    (status = 200, description = "Ready", body = ReadyResponse),
    (status = 503, description = "Not ready", body = ReadyResponse),
))]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<ReadyResponse>) {
    let readiness = state.pool.readiness().await;
    let shutting_down = state.is_shutting_down();
    let ready = readiness.is_ready() && !shutting_down;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let reason = if shutting_down {
        Some("pglease is shutting down".to_owned())
    } else {
        readiness.reason()
    };
    (
        status,
        Json(ReadyResponse {
            ready,
            postgres: readiness.postgres_up,
            default_template: readiness.default_template_ready,
            reason,
            failed_templates: readiness
                .failed_templates
                .into_iter()
                .map(|(name, error)| FailedTemplateJson {
                    name: name.to_string(),
                    error,
                })
                .collect(),
            building_templates: readiness
                .building_templates
                .iter()
                .map(ToString::to_string)
                .collect(),
        }),
    )
}
