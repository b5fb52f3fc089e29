//! SIGTERM/SIGINT handling: handlers are installed first thing in `serve`, so a signal that
//! arrives while postgres is still starting is not fatal but handled once serving begins.
//! `pglease run` installs the same handlers to pass these signals on to its command; it
//! does not use them to stop itself.

use nix::sys::signal::Signal as Kind;
use nix::unistd::Pid;
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
        let name = self.next().await.as_str();
        tracing::info!(signal = name, "shutting down");
    }

    /// Resolves on SIGTERM or SIGINT (also one that arrived before this call) and says which.
    pub async fn next(&mut self) -> Kind {
        tokio::select! {
            _ = self.term.recv() => Kind::SIGTERM,
            _ = self.int.recv() => Kind::SIGINT,
        }
    }
}

/// Whether a SIGINT we received has already reached `child` from the terminal: Ctrl-C
/// signals the terminal's whole foreground process group, and that is ours and holds
/// `child` when we run in the foreground and `child` stayed in our group. Sending it a
/// second SIGINT would then read as "press Ctrl-C again to force" to many tools.
pub fn terminal_already_interrupted(child: Pid) -> bool {
    // No controlling terminal (CI, systemd, docker without -t): nobody pressed Ctrl-C.
    let Ok(terminal) = std::fs::File::open("/dev/tty") else {
        return false;
    };
    let ours = nix::unistd::getpgrp();
    nix::unistd::tcgetpgrp(&terminal) == Ok(ours) && nix::unistd::getpgid(Some(child)) == Ok(ours)
}
