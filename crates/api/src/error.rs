//! `ApiError`: every error the HTTP API answers, the conversions from pool errors, and its
//! `IntoResponse` impl that renders `{"error": {"code", "message"}}` with the right status.
//! The IntegreSQL routes answer in IntegreSQL's shape instead, through `CompatError`'s
//! own impl (`integresql.rs`); those two are the only ones.
//! 4xx are not logged; each 5xx is logged once with its cause, and internal ones reach the
//! client only as a generic message.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pglease_pool::{LeaseError, LeaseOpError, SqlErrorKind};

use crate::wire::{ErrorBody, ErrorDetail};

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: &str = "1";

/// An error answered to an HTTP client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// The machine-readable code (`timeout`, `unknown_template`, …).
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }

    /// 400: the request cannot be parsed.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_request", message)
    }

    /// 422: the request parses but a value is not acceptable.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_value", message)
    }

    /// 500: the daemon failed at something that should not fail.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// 413: the body is over the limit.
    pub fn too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!(
                "request bodies are limited to {} bytes",
                crate::MAX_BODY_BYTES
            ),
        )
    }

    /// 404 for a path no route serves.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for {path}"),
        )
    }

    /// 405 for a known path with the wrong method.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this path",
        )
    }

    /// 401: no or a wrong bearer token.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this pglease requires Authorization: Bearer <token> (the daemon's --token / PGLEASE_TOKEN)",
        )
    }

    /// 403: the daemon does not allow this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 503 while the daemon stops.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "pglease is shutting down",
        )
    }

    /// 404 for a lease id that is not one of ours.
    pub fn lease_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "lease_not_found",
            format!("no open lease with id {id:?}"),
        )
    }

    /// 404 for a key no lease is shared under, or when the PostgreSQL front is off.
    pub fn key_not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "key_not_found", message)
    }

    /// 503 `too_many_connections` (with `Retry-After`): postgres refused pglease a
    /// connection slot (53300) for its own work for a lease; unlike the 422 of a lease
    /// that can never fit, a released connection makes room.
    fn no_connection_slot(message: String) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            message,
        )
    }

    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<LeaseError> for ApiError {
    /// The status and code of each lease error. Long on purpose: one match arm per variant
    /// (and per cause of a failed build or clone), the table `docs/http-api.md` lists.
    fn from(error: LeaseError) -> Self {
        let message = error.to_string();
        match error {
            LeaseError::UnknownTemplate { .. } => {
                Self::new(StatusCode::NOT_FOUND, "unknown_template", message)
            }
            LeaseError::VersionNotOffered { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "postgres_version_not_served",
                message,
            ),
            LeaseError::InvalidSource { .. } => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_source", message)
            }
            // The storage filled while the template was built: room, not the sources.
            LeaseError::BuildFailed {
                cause: SqlErrorKind::DiskFull,
                ..
            } => Self::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", message),
            // Postgres had no connection slot for the build (53300): the connection
            // budget's trouble, gone once a holder lets go of a connection, not the sources'.
            LeaseError::BuildFailed {
                cause: SqlErrorKind::TooManyConnections,
                ..
            } => Self::no_connection_slot(message),
            // The template's own sources are broken: the client must see postgres' words.
            LeaseError::BuildFailed { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "template_build_failed",
                message,
            ),
            LeaseError::TimedOut { .. } => {
                Self::new(StatusCode::GATEWAY_TIMEOUT, "timeout", message)
            }
            LeaseError::ShuttingDown => Self::shutting_down(),
            LeaseError::PostgresDown(_) | LeaseError::ServerStart { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "postgres_unavailable",
                message,
            ),
            // The server's storage is full: room, as for the byte budget (507), not a
            // server in trouble; a release or a smaller test makes room again.
            LeaseError::CloneFailed {
                cause: SqlErrorKind::DiskFull,
                ..
            } => Self::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", message),
            LeaseError::CloneFailed {
                cause: SqlErrorKind::TooManyConnections,
                ..
            } => Self::no_connection_slot(message),
            LeaseError::CloneFailed { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "clone_failed", message)
            }
            LeaseError::TooManyConnections { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "too_many_connections",
                message,
            ),
            LeaseError::OutOfSpace { .. } => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                message,
            ),
            LeaseError::TooManyWaiting { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_waiting", message)
            }
            LeaseError::Internal(_) => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
            LeaseError::Discarded(_) => Self::new(StatusCode::GONE, "template_discarded", message),
            LeaseError::ClientBuilt(_) => {
                Self::new(StatusCode::CONFLICT, "client_built_template", message)
            }
            LeaseError::ConfiguredTemplate(_) => {
                Self::new(StatusCode::FORBIDDEN, "template_is_configured", message)
            }
            LeaseError::OnOtherServer { .. } => {
                Self::new(StatusCode::CONFLICT, "template_on_other_server", message)
            }
            LeaseError::VersionNotServed { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "postgres_version_not_served",
                message,
            ),
        }
    }
}

impl From<LeaseOpError> for ApiError {
    fn from(error: LeaseOpError) -> Self {
        let message = error.to_string();
        match error {
            LeaseOpError::NotFound(_) => {
                Self::new(StatusCode::NOT_FOUND, "lease_not_found", message)
            }
            LeaseOpError::Lost(_) => Self::new(StatusCode::GONE, "lease_lost", message),
            // Ended by pglease for its size: gone, and the holder is told why.
            LeaseOpError::ExceededMaxBytes { .. } => {
                Self::new(StatusCode::GONE, "lease_exceeded_max_bytes", message)
            }
            LeaseOpError::NotKept(_) => Self::new(StatusCode::NOT_FOUND, "kept_not_found", message),
            LeaseOpError::ShuttingDown => Self::shutting_down(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut message = self.message;
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), code = self.code, error = %message, "request failed");
            if self.status == StatusCode::INTERNAL_SERVER_ERROR {
                message = "internal error; see the pglease log".into();
            }
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.into(),
                message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        add_retry_after(&mut response);
        response
    }
}

/// Tells the client when to try again after a 503 or a 429 (both front doors).
pub(crate) fn add_retry_after(response: &mut Response) {
    let status = response.status();
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECS),
        );
    }
}
