//! SIGTERM/SIGINT handling: handlers are installed first thing in `serve`, so a signal that
//! arrives while postgres is still starting is not fatal but handled once serving begins.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Installed handlers for SIGTERM and SIGINT.
pub struct ShutdownSignal {
    term: Signal,
    int: Signal,
}

impl ShutdownSignal {
    /// Installs the handlers; from now on these signals no longer kill the process.
    pub fn install() -> std::io::Result<Self> {
        Ok(ShutdownSignal {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves on SIGTERM or SIGINT (also one that arrived before this call) and logs which.
    pub async fn recv(&mut self) {
        let name = tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
    }
}
