//! The OpenAPI document of the API, generated from the handlers' annotations and the wire
//! types (utoipa), served at `GET /openapi.json`: it cannot drift from the code, and the
//! fuzz test in CI (schemathesis) drives the running daemon from it.

use axum::Json;
use utoipa::OpenApi;

use crate::routes::{front, kept, leases, status, templates};
use crate::wire;

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "pglease",
        description = "Throw-away PostgreSQL databases for parallel tests"
    ),
    paths(
        leases::lease,
        leases::release,
        leases::renew,
        kept::list,
        kept::drop,
        status::status,
        status::metrics,
        status::healthz,
        status::readyz,
        front::release_key,
        templates::list,
        templates::show,
        templates::register,
        templates::rebuild,
    ),
    components(schemas(
        wire::LeaseBody,
        wire::RenewBody,
        wire::TemplateBody,
        wire::LeaseResponse,
        wire::RenewResponse,
        wire::KeptResponse,
        wire::KeptJson,
        wire::ErrorBody,
        wire::ErrorDetail,
        wire::StatusResponse,
        wire::ServerJson,
        wire::PostgresJson,
        wire::StorageJson,
        wire::DatabasesSpaceJson,
        wire::FilledByJson,
        wire::ExceededMaxBytesJson,
        wire::TemplateJson,
        wire::ProgressJson,
        wire::LeaseJson,
        wire::DropsJson,
        wire::LimitsJson,
        wire::RefusedJson,
        wire::HealthResponse,
        wire::ReadyResponse,
        wire::FailedTemplateJson,
        wire::FrontJson,
        wire::FrontConnectionJson,
        wire::FrontKeyJson,
        wire::FrontTlsJson,
        wire::KeyReleasedResponse,
    ))
)]
pub struct ApiDoc;

/// `GET /openapi.json`.
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
