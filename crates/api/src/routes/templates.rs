//! `GET /templates`, `GET /templates/{name}`, `POST /templates/{name}/rebuild`: what each
//! template's current version is, and forcing a new one.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use pglease_pool::{LeaseError, TemplateName, TemplateStatus};

use super::leases::rfc3339;
use crate::error::ApiError;
use crate::wire::TemplateJson;
use crate::AppState;

/// `GET /templates`: every template.
pub async fn list(State(state): State<AppState>) -> Result<Json<Vec<TemplateJson>>, ApiError> {
    let report = state
        .pool
        .status()
        .await
        .ok_or_else(ApiError::shutting_down)?;
    Ok(Json(
        report.templates.into_iter().map(template_json).collect(),
    ))
}

/// `GET /templates/{name}`: one template, 404 if unknown.
pub async fn show(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<TemplateJson>, ApiError> {
    let name = parse_name(&name)?;
    let report = state
        .pool
        .status()
        .await
        .ok_or_else(ApiError::shutting_down)?;
    report
        .templates
        .into_iter()
        .find(|t| t.name == name)
        .map(|t| Json(template_json(t)))
        .ok_or_else(|| LeaseError::UnknownTemplate(name).into())
}

/// `POST /templates/{name}/rebuild` → 202: a new version is being built.
pub async fn rebuild(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<TemplateJson>), ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let name = parse_name(&name)?;
    let status = state.pool.rebuild(name).await?;
    Ok((StatusCode::ACCEPTED, Json(template_json(status))))
}

fn parse_name(name: &str) -> Result<TemplateName, ApiError> {
    TemplateName::new(name).map_err(|e| ApiError::invalid(e.to_string()))
}

/// The JSON of one template (also used by `/status`).
pub(crate) fn template_json(t: TemplateStatus) -> TemplateJson {
    TemplateJson {
        name: t.name.to_string(),
        fingerprint: t.fingerprint,
        version: t.version,
        state: t.state,
        build_ms: t.build_ms,
        size_bytes: t.size_bytes,
        built_at: t.built_at.map(rfc3339),
        ready: t.ready,
        leased: t.leased,
        in_progress: t.in_progress,
        waiting: t.waiting,
        last_error: t.last_error,
    }
}
