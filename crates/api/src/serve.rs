//! Serving a router on a listener: hyper's HTTP/1 connection loop, as `axum::serve` runs it,
//! plus read timeouts — `axum::serve` sets none, so a client that sends its headers or body
//! a byte at a time (or not at all) held a connection and a task for as long as it liked.
//! Anybody on loopback is a caller (`docs/security.md`).
//!
//! Headers must arrive within [`HEADER_READ_TIMEOUT`] of a request's start (hyper closes
//! the connection otherwise) and a body within [`BODY_READ_TIMEOUT`] (the handler then sees
//! a body that failed to read, a 400). A stop lets requests in flight finish.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's body (at most 64 KiB).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` resolves, then lets the requests in
/// flight finish.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router.layer(RequestBodyTimeoutLayer::new(BODY_READ_TIMEOUT));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(%error, "cannot accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that hangs up or times out ends its connection; nothing to report.
            let _ = connection.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
