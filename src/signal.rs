//! A future that resolves on SIGTERM or SIGINT and logs which one arrived.

use tokio::signal::unix::{signal, SignalKind};

/// Waits for SIGTERM or SIGINT. If the handlers cannot be installed, waits forever
/// (the daemon then stops only when killed) after logging why.
pub async fn shutdown_signal() {
    let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(error), _) | (_, Err(error)) => {
            tracing::error!(%error, "cannot install signal handlers");
            return std::future::pending().await;
        }
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "shutting down");
}
