//! pglease-api: the HTTP JSON API over the pool (axum). It validates requests into pool
//! requests, calls the pools ([`Servers`]), and turns pool errors into JSON errors. It runs no
//! SQL and spawns no processes.
//!
//! Routes:
//! - `POST   /lease`              — lease a database (`routes::leases::lease`)
//! - `DELETE /leases/{id}`        — release it, `?reuse=true` to recycle as is, `?keep=SECS` to keep it for a look (`routes::leases::release`)
//! - `POST   /leases/{id}/renew`  — extend its time to live (`routes::leases::renew`)
//! - `GET    /kept`               — databases kept after failed tests, with their URLs (`routes::kept::list`)
//! - `DELETE /kept/{id}`          — drop a kept database now (`routes::kept::drop`)
//! - `GET    /templates`          — every template's version, state, size (`routes::templates::list`)
//! - `GET    /templates/{name}`   — one template (`routes::templates::show`)
//! - `PUT    /templates/{name}`   — register a template, or give it a new source (`routes::templates::register`)
//! - `POST   /templates/{name}/rebuild` — build a new version now (`routes::templates::rebuild`)
//! - `GET    /status`             — postgres, templates, open leases, the PostgreSQL front (`routes::status::status`)
//! - `DELETE /front/keys/{name}`  — release the lease shared under `<template>.<key>` at the PostgreSQL front (`routes::front::release_key`)
//! - `GET    /healthz`            — the daemon is alive (`routes::status::healthz`)
//! - `GET    /readyz`             — postgres up and the default template built (`routes::status::readyz`)
//! - `GET    /openapi.json`       — this API as an OpenAPI document (`openapi::document`)
//! - `/api/v1/...`                — the IntegreSQL API over the same pool (`integresql`); also
//!   alone on its own port (`integresql::router`, the daemon's `--integresql-listen`)
//!
//! With a token configured every route but `/healthz`, `/readyz` and `/openapi.json` needs
//! `Authorization: Bearer <token>` (`require_token`). Only a request that showed it may change
//! a template the operator defined (`PUT` and `rebuild`; the pool decides, from
//! [`pglease_pool::Changer`]): without a token nobody may. No CORS headers are sent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::Router;
use pglease_front::FrontHandle;
use pglease_pool::Servers;

pub mod error;
pub mod integresql;
mod metrics;
pub mod openapi;
mod routes;
mod serve;
pub mod wire;

pub use error::ApiError;

/// Largest request body accepted; lease requests are a few dozen bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Limits the API applies to requests before they reach the pool.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// `wait_ms` when a request names none.
    pub default_wait: Duration,
    /// Largest `wait_ms` accepted.
    pub max_wait: Duration,
    /// Largest `ttl_secs` accepted.
    pub max_ttl: Duration,
    /// Every request but `/healthz`, `/readyz` and `/openapi.json` must carry
    /// `Authorization: Bearer <token>`.
    pub token: Option<Token>,
    /// `PUT /templates/{name}` may register `command` sources (commands run as the
    /// daemon's OS user, so this is off unless the operator trusts every API client).
    pub allow_http_commands: bool,
    /// The external server's own login, when `--integresql-pg-user` names it: the
    /// IntegreSQL routes answer with its credentials for test databases too, as IntegreSQL
    /// does (see `pglease_pool::IntegresqlRole::server_login`).
    pub integresql_server_login: Option<pglease_pool::IntegresqlRole>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            default_wait: Duration::from_secs(60),
            max_wait: Duration::from_secs(10 * 60),
            max_ttl: Duration::from_secs(24 * 60 * 60),
            allow_http_commands: false,
            token: None,
            integresql_server_login: None,
        }
    }
}

/// The API's bearer token (the front's password too).
pub use pglease_pool::Token;

/// Shared by every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    pool: Servers,
    config: ApiConfig,
    /// The PostgreSQL front, when the daemon serves one: shown in `/status` and `/metrics`.
    front: Option<FrontHandle>,
    metrics: metrics::Metrics,
    shutting_down: Arc<AtomicBool>,
}

impl AppState {
    /// State for a router over the daemon's servers.
    pub fn new(pool: Servers, config: ApiConfig) -> Self {
        AppState {
            pool,
            config,
            front: None,
            metrics: metrics::Metrics::new(),
            shutting_down: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The same, with the daemon's PostgreSQL front in `/status` and `/metrics`, and its keys
    /// released by `DELETE /front/keys/{name}`.
    pub fn with_front(mut self, front: FrontHandle) -> Self {
        self.front = Some(front);
        self
    }

    /// From now on every request is answered 503 with Retry-After.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Whether answers may carry other leases' secrets (ids, which release a lease, and
    /// passwords): only where a token guards the API. Without one anybody on loopback is a
    /// caller, and each holder has its own lease's from the lease answer.
    fn shows_lease_secrets(&self) -> bool {
        self.config.token.is_some()
    }
}

/// The whole API as an axum router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/lease", post(routes::leases::lease))
        .route("/leases/{id}", delete(routes::leases::release))
        .route("/leases/{id}/renew", post(routes::leases::renew))
        .route("/kept", get(routes::kept::list))
        .route("/kept/{id}", delete(routes::kept::drop))
        .route("/templates", get(routes::templates::list))
        .route(
            "/templates/{name}",
            get(routes::templates::show).put(routes::templates::register),
        )
        .route(
            "/templates/{name}/rebuild",
            post(routes::templates::rebuild),
        )
        .route("/status", get(routes::status::status))
        .route("/metrics", get(routes::status::metrics))
        .route("/front/keys/{name}", delete(routes::front::release_key))
        .route("/healthz", get(routes::status::healthz))
        .route("/readyz", get(routes::status::readyz))
        .route("/openapi.json", get(openapi::document))
        .nest("/api/v1", integresql::routes())
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        .with_state(state)
}

/// With a token configured, lets through only requests that carry it (health checks
/// excepted, so container and systemd probes need no secret).
async fn require_token(
    axum::extract::State(state): axum::extract::State<AppState>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(token) = &state.config.token else {
        return next.run(request).await;
    };
    if matches!(
        request.uri().path(),
        "/healthz" | "/readyz" | "/openapi.json"
    ) {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    if given.is_some_and(|given| token.matches(given.as_bytes())) {
        request.extensions_mut().insert(TokenShown);
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

/// Marks a request that showed the API's token (`require_token` sets it): its caller may
/// change the operator's templates. A request without it is anybody's, as on a port no
/// token guards (`--integresql-listen`, or every port without `--token`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenShown;

/// Who a request's caller is to the pool, which decides whose templates it may change.
pub(crate) fn changer(shown: Option<axum::Extension<TokenShown>>) -> pglease_pool::Changer {
    match shown {
        Some(_) => pglease_pool::Changer::TokenHolder,
        None => pglease_pool::Changer::Anyone,
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve::serve(listener, router(state), shutdown).await
}

/// Serves the IntegreSQL API alone on `listener` (no token: its clients cannot send one)
/// until `shutdown` resolves.
pub async fn serve_integresql(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve::serve(listener, integresql::router(state), shutdown).await
}

#[cfg(test)]
mod tests;
