//! The PostgreSQL front's part of the API: `DELETE /front/keys/{name}`, and its section of
//! `/status` (`front_json`). The front itself is `pglease-front`; this only shows and asks.

use axum::extract::{Path, State};
use axum::Json;
use pglease_front::{FrontHandle, FrontReport, KeyError, TlsSource};

use super::leases::rfc3339;
use crate::error::ApiError;
use crate::wire::{
    ErrorBody, FrontConnectionJson, FrontJson, FrontKeyJson, FrontTlsJson, KeyReleasedResponse,
};
use crate::AppState;

/// `DELETE /front/keys/{name}`: releases the lease every connection to database
/// `<template>.<key>` shares, now rather than a grace after its last connection closes. Its
/// connections end with it; the next connection to the key gets a new database.
#[utoipa::path(delete, path = "/front/keys/{name}",
    params(("name" = String, Path, description = "The key: `<template>.<key>`, as the database name the connections gave")),
    responses(
        (status = 200, description = "Released", body = KeyReleasedResponse),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 404, description = "No lease is shared under this key, or the front is off", body = ErrorBody),
        (status = 422, description = "Not `<template>.<key>`", body = ErrorBody),
    ))]
pub async fn release_key(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<KeyReleasedResponse>, ApiError> {
    let front: &FrontHandle = state.front.as_ref().ok_or_else(|| {
        ApiError::key_not_found("the PostgreSQL front is off (--front-listen off, or its default port was taken at start)")
    })?;
    match front.release_key(&name).await {
        Ok(lease_id) => Ok(Json(KeyReleasedResponse {
            key: name,
            lease_id: state.shows_lease_secrets().then(|| lease_id.to_string()),
        })),
        Err(error @ KeyError::Invalid { .. }) => Err(ApiError::invalid(error.to_string())),
        Err(error @ KeyError::NotFound(_)) => Err(ApiError::key_not_found(error.to_string())),
    }
}

/// The front's section of `/status`; lease ids only where a token guards the API, as for
/// the leases.
pub(crate) fn front_json(report: FrontReport, ids: bool) -> FrontJson {
    FrontJson {
        accepted: report.accepted,
        connections: report
            .connections
            .into_iter()
            .map(|c| FrontConnectionJson {
                peer: c.peer.to_string(),
                stage: c.stage.name().to_owned(),
                since: rfc3339(c.since),
                template: c.template.map(|t| t.to_string()),
                key: c.key,
                lease_id: c.lease_id.filter(|_| ids).map(|id| id.to_string()),
                database: c.database.map(|d| d.to_string()),
                tls: c.tls,
            })
            .collect(),
        keys: report
            .keys
            .into_iter()
            .map(|k| FrontKeyJson {
                name: k.name,
                lease_id: k.lease_id.filter(|_| ids).map(|id| id.to_string()),
                database: k.database.map(|d| d.to_string()),
                connections: k.connections,
                release_at: k.release_at.map(rfc3339),
            })
            .collect(),
        tls: match report.tls {
            None => FrontTlsJson::default(),
            Some(TlsSource::SelfSigned) => FrontTlsJson {
                mode: "self-signed".to_owned(),
                cert_file: None,
                required: report.tls_required,
            },
            Some(TlsSource::Files { cert, .. }) => FrontTlsJson {
                mode: "certificate".to_owned(),
                cert_file: Some(cert.display().to_string()),
                required: report.tls_required,
            },
        },
    }
}
