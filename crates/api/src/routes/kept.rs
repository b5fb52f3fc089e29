//! `GET /kept`, `DELETE /kept/{id}`: the databases kept after failed tests
//! (`DELETE /leases/{id}?keep=SECS`), with the lease's credentials that still open them.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use pglease_pool::{KeptDatabase, LeaseId, LeaseOpError};

use super::leases::rfc3339;
use crate::error::ApiError;
use crate::wire::{ErrorBody, KeptJson, KeptResponse};
use crate::AppState;

/// `GET /kept`: every kept database, oldest first; ids and credentials only where a token
/// guards the API (`docs/security.md`).
#[utoipa::path(get, path = "/kept", responses(
    (status = 200, description = "The kept databases", body = KeptResponse),
    (status = 401, description = "A token is required", body = ErrorBody),
))]
pub async fn list(State(state): State<AppState>) -> Json<KeptResponse> {
    let kept = state.pool.kept().await;
    let secrets = state.shows_lease_secrets();
    Json(KeptResponse {
        kept: kept.into_iter().map(|k| kept_json(k, secrets)).collect(),
    })
}

/// `DELETE /kept/{id}` → 204: the kept database is dropped now.
#[utoipa::path(delete, path = "/kept/{id}",
    params(("id" = String, Path, description = "The id of the lease it was kept from", pattern = "^[0-9a-f]{32}$")),
    responses(
        (status = 204, description = "Dropped"),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 404, description = "No database kept under this id", body = ErrorBody),
        (status = 503, description = "Stopping", body = ErrorBody),
    ))]
pub async fn drop(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = LeaseId::parse(&id).ok_or_else(|| ApiError::from(LeaseOpError::NotKept(id)))?;
    state.pool.drop_kept(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn kept_json(kept: KeptDatabase, secrets: bool) -> KeptJson {
    KeptJson {
        id: secrets.then(|| kept.id.to_string()),
        template: Some(kept.template.to_string()),
        database: kept.connect.database.to_string(),
        label: kept.label,
        url: secrets.then(|| kept.connect.url()),
        host: kept.connect.host,
        port: kept.connect.port,
        user: kept.connect.user,
        password: secrets.then_some(kept.connect.password),
        kept_at: rfc3339(kept.kept_at),
        expires_at: rfc3339(kept.expires_at),
        size_bytes: kept.size_bytes,
    }
}
