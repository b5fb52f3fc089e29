//! The IntegreSQL v1 API (its clients in Go, JS/TS, Python, .NET and Java work unchanged),
//! served from the same pool as the native API: a client-built template is a template
//! whose name is the client's hash, a test database is a lease with a number.
//!
//! Routes, under `/api/v1`:
//! - `POST   /templates`                         — initialize `{"hash"}` (JSON or form) → 200 / 423
//! - `PUT    /templates/{hash}`                  — finalize → 204
//! - `DELETE /templates/{hash}`                  — discard → 204
//! - `GET    /templates/{hash}/tests`            — a test database, waiting for finalize → 200
//! - `POST   /templates/{hash}/tests/{id}/unlock` (and `DELETE …/tests/{id}`) — back unchanged → 204
//! - `POST   /templates/{hash}/tests/{id}/recreate` — drop and replace → 204
//! - `DELETE /admin/templates`                   — forget every client-built template → 204
//!
//! Errors are `{"message": "..."}` with IntegreSQL's statuses. These routes are not in
//! `/openapi.json`: their contract is IntegreSQL's, not ours.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use pglease_pool::{ConnectInfo, LeaseError, LeaseRequest, TemplateName, TemplateOpError};
use serde::{Deserialize, Serialize};

use crate::error::{add_retry_after, ApiError};
use crate::AppState;

/// How long `GET …/tests` waits for a finalize or a free database (IntegreSQL's default).
pub const TEST_DATABASE_WAIT: Duration = Duration::from_secs(60);

/// The IntegreSQL routes, to nest under `/api/v1`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/templates", post(initialize))
        .route("/templates/{hash}", put(finalize).delete(discard))
        .route("/templates/{hash}/tests", get(test_database))
        .route("/templates/{hash}/tests/{id}", delete(unlock))
        .route("/templates/{hash}/tests/{id}/unlock", post(unlock))
        .route("/templates/{hash}/tests/{id}/recreate", post(recreate))
        .route("/admin/templates", delete(reset))
}

/// The IntegreSQL API alone (for `--integresql-listen`): no token, since its clients
/// cannot send one; health checks answer as on the main port.
pub fn router(state: AppState) -> Router {
    Router::new()
        .nest("/api/v1", routes())
        .route("/healthz", get(crate::routes::status::healthz))
        .route("/readyz", get(crate::routes::status::readyz))
        .fallback(no_route)
        .layer(axum::extract::DefaultBodyLimit::max(crate::MAX_BODY_BYTES))
        .with_state(state)
}

/// `{"database": {...}}` (initialize) and `{"id": N, "database": {...}}` (tests).
#[derive(Debug, Serialize)]
struct DatabaseBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u32>,
    database: Database,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Database {
    template_hash: String,
    config: DatabaseConfig,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DatabaseConfig {
    host: String,
    port: u16,
    username: String,
    password: String,
    database: String,
    /// `sslmode=disable`: Go's lib/pq asks for TLS unless told, and the embedded server
    /// has none.
    additional_params: BTreeMap<&'static str, &'static str>,
}

#[derive(Debug, Deserialize)]
struct InitializeBody {
    hash: Option<String>,
}

fn database(hash: &TemplateName, id: Option<u32>, connect: ConnectInfo) -> Json<DatabaseBody> {
    Json(DatabaseBody {
        id,
        database: Database {
            template_hash: hash.to_string(),
            config: DatabaseConfig {
                host: connect.host,
                port: connect.port,
                username: connect.user,
                password: connect.password,
                database: connect.database.to_string(),
                additional_params: BTreeMap::from([("sslmode", "disable")]),
            },
        },
    })
}

/// `POST /templates` `{"hash": "..."}`: JSON, or a form (Python clients send one).
async fn initialize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DatabaseBody>, CompatError> {
    refuse_when_stopping(&state)?;
    // A rejection carries its own status: 400 for a malformed body, 413 for a large one.
    let body = body.map_err(|e| CompatError::new(e.status(), e.body_text()))?;
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let parsed: Result<InitializeBody, String> = if is_form {
        serde_urlencoded::from_bytes(&body).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice(&body).map_err(|e| e.to_string())
    };
    let parsed = parsed.map_err(|e| {
        CompatError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    let hash = match parsed.hash.as_deref() {
        None | Some("") => {
            return Err(CompatError::new(
                StatusCode::BAD_REQUEST,
                "hash is required",
            ))
        }
        Some(hash) => TemplateName::new(hash)
            .map_err(|e| CompatError::new(StatusCode::BAD_REQUEST, format!("invalid hash: {e}")))?,
    };
    let connect = state.pool.primary().initialize(hash.clone()).await?;
    Ok(database(&hash, None, connect))
}

/// `PUT /templates/{hash}` → 204 once finalized (also when it already was).
async fn finalize(
    State(state): State<AppState>,
    Path(hash): Path<String>,
) -> Result<StatusCode, CompatError> {
    refuse_when_stopping(&state)?;
    state.pool.primary().finalize(known_hash(&hash)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /templates/{hash}` → 204.
async fn discard(
    State(state): State<AppState>,
    Path(hash): Path<String>,
) -> Result<StatusCode, CompatError> {
    refuse_when_stopping(&state)?;
    state.pool.primary().discard(known_hash(&hash)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{hash}/tests` → 200 with a test database; waits for the template to be
/// finalized (or a database to be free) up to [`TEST_DATABASE_WAIT`].
async fn test_database(
    State(state): State<AppState>,
    Path(hash): Path<String>,
) -> Result<Json<DatabaseBody>, CompatError> {
    refuse_when_stopping(&state)?;
    let template = known_hash(&hash)?;
    // If the client goes away, axum drops this future; the pool takes the database back.
    let lease = state
        .pool
        .primary()
        .lease(LeaseRequest {
            template: template.clone(),
            ttl: None,
            wait: TEST_DATABASE_WAIT,
            // With the server's own user as the suites' user, the answer carries that
            // login and not the lease's role: the role gets no connection (a limit of 0)
            // and the lease reserves none of the budget. Reserving the usual share for a
            // login that does not use it made a full budget recreate test databases a
            // suite was still using (go-starter: "database … does not exist" mid-test),
            // where IntegreSQL recreates only when its pool is full.
            connections: state.config.integresql_server_login.as_ref().map(|_| 0),
            // IntegreSQL's clients need not give test databases back.
            reclaimable: true,
            postgres_version: None,
            label: None,
        })
        .await?;
    let mut connect = lease.connect;
    if let Some(login) = &state.config.integresql_server_login {
        // The suite's one user, as under IntegreSQL: what its dump and migrations made in
        // the template is that user's, and each test changes it as that user.
        connect.user.clone_from(&login.name);
        connect.password.clone_from(&login.password);
    }
    Ok(database(&template, Some(lease.number), connect))
}

/// `POST /templates/{hash}/tests/{id}/unlock`, `DELETE /templates/{hash}/tests/{id}` → 204.
async fn unlock(
    State(state): State<AppState>,
    Path((hash, id)): Path<(String, String)>,
) -> Result<StatusCode, CompatError> {
    give_back(state, &hash, &id, false).await
}

/// `POST /templates/{hash}/tests/{id}/recreate` → 204.
async fn recreate(
    State(state): State<AppState>,
    Path((hash, id)): Path<(String, String)>,
) -> Result<StatusCode, CompatError> {
    give_back(state, &hash, &id, true).await
}

async fn give_back(
    state: AppState,
    hash: &str,
    id: &str,
    recreate: bool,
) -> Result<StatusCode, CompatError> {
    refuse_when_stopping(&state)?;
    let number: u32 = id
        .parse()
        .map_err(|_| CompatError::new(StatusCode::BAD_REQUEST, "invalid test database ID"))?;
    state
        .pool
        .primary()
        .give_back(known_hash(hash)?, number, recreate)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/templates` → 204.
async fn reset(State(state): State<AppState>) -> Result<StatusCode, CompatError> {
    refuse_when_stopping(&state)?;
    state.pool.primary().discard_all_client_built().await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn no_route(uri: axum::http::Uri) -> CompatError {
    CompatError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {}", uri.path()),
    )
}

/// A hash in a path: one that cannot be a template name is simply unknown.
fn known_hash(hash: &str) -> Result<TemplateName, CompatError> {
    TemplateName::new(hash)
        .map_err(|_| CompatError::new(StatusCode::NOT_FOUND, "template not found"))
}

fn refuse_when_stopping(state: &AppState) -> Result<(), CompatError> {
    if state.is_shutting_down() {
        return Err(CompatError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "pglease is shutting down",
        ));
    }
    Ok(())
}

/// An error in IntegreSQL's shape: `{"message": "..."}` with its status.
#[derive(Debug)]
pub struct CompatError {
    status: StatusCode,
    message: String,
}

impl CompatError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        CompatError {
            status,
            message: message.into(),
        }
    }
}

impl From<TemplateOpError> for CompatError {
    fn from(error: TemplateOpError) -> Self {
        let status = match &error {
            TemplateOpError::UnknownTemplate(_) | TemplateOpError::UnknownTest { .. } => {
                StatusCode::NOT_FOUND
            }
            TemplateOpError::AlreadyInitialized(_) | TemplateOpError::InUse { .. } => {
                StatusCode::LOCKED
            }
            TemplateOpError::NotClientBuilt(_) => StatusCode::CONFLICT,
            TemplateOpError::Discarded(_) => StatusCode::GONE,
            TemplateOpError::Failed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            TemplateOpError::ShuttingDown
            | TemplateOpError::PostgresDown(_)
            | TemplateOpError::TooManyConnections { .. }
            | TemplateOpError::NoConnectionSlot { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        CompatError::new(status, error.to_string())
    }
}

impl From<LeaseError> for CompatError {
    /// The native API's status for each error (IntegreSQL's contract agrees where it has
    /// one: 404, 410, 503), with IntegreSQL's `{"message"}` body.
    fn from(error: LeaseError) -> Self {
        let message = error.to_string();
        CompatError::new(ApiError::from(error).status(), message)
    }
}

#[derive(Serialize)]
struct MessageBody {
    message: String,
}

impl IntoResponse for CompatError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), error = %self.message, "IntegreSQL API request failed");
        }
        let mut response = (
            self.status,
            Json(MessageBody {
                message: self.message,
            }),
        )
            .into_response();
        add_retry_after(&mut response);
        response
    }
}
