//! pglease-api: the HTTP JSON API over the pool (axum). It validates requests into pool
//! requests, calls the [`PoolHandle`], and turns pool errors into JSON errors. It runs no
//! SQL and spawns no processes.
//!
//! Routes:
//! - `POST   /lease`              — lease a database (`routes::leases::lease`)
//! - `DELETE /leases/{id}`        — release it, `?reuse=true` to recycle as is (`routes::leases::release`)
//! - `POST   /leases/{id}/renew`  — extend its time to live (`routes::leases::renew`)
//! - `GET    /templates`          — every template's version, state, size (`routes::templates::list`)
//! - `GET    /templates/{name}`   — one template (`routes::templates::show`)
//! - `PUT    /templates/{name}`   — register a template, or give it a new source (`routes::templates::register`)
//! - `POST   /templates/{name}/rebuild` — build a new version now (`routes::templates::rebuild`)
//! - `GET    /status`             — postgres, templates, open leases (`routes::status::status`)
//! - `GET    /healthz`            — the daemon is alive (`routes::status::healthz`)
//! - `GET    /readyz`             — postgres up and the default template built (`routes::status::readyz`)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::Router;
use pglease_pool::PoolHandle;

pub mod error;
mod routes;
pub mod wire;

pub use error::ApiError;

/// Largest request body accepted; lease requests are a few dozen bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Limits the API applies to requests before they reach the pool.
#[derive(Debug, Clone, Copy)]
pub struct ApiConfig {
    /// `wait_ms` when a request names none.
    pub default_wait: Duration,
    /// Largest `wait_ms` accepted.
    pub max_wait: Duration,
    /// Largest `ttl_secs` accepted.
    pub max_ttl: Duration,
    /// `PUT /templates/{name}` may register `command` sources (commands run as the
    /// daemon's OS user, so this is off unless the operator trusts every API client).
    pub allow_http_commands: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            default_wait: Duration::from_secs(60),
            max_wait: Duration::from_secs(10 * 60),
            max_ttl: Duration::from_secs(24 * 60 * 60),
            allow_http_commands: false,
        }
    }
}

/// Shared by every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    pool: PoolHandle,
    config: ApiConfig,
    shutting_down: Arc<AtomicBool>,
}

impl AppState {
    /// State for a router over `pool`.
    pub fn new(pool: PoolHandle, config: ApiConfig) -> Self {
        AppState {
            pool,
            config,
            shutting_down: Arc::new(AtomicBool::new(false)),
        }
    }

    /// From now on every request is answered 503 with Retry-After.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// The whole API as an axum router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/lease", post(routes::leases::lease))
        .route("/leases/{id}", delete(routes::leases::release))
        .route("/leases/{id}/renew", post(routes::leases::renew))
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
        .route("/healthz", get(routes::status::healthz))
        .route("/readyz", get(routes::status::readyz))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests;
