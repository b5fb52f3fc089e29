//! The server's lifecycle as the pool sees it: up, down (and why), stopping; how often it
//! was lost; its generation (which reports still describe it); and the second look at a
//! server whose monitor connection closed, before it is declared lost.

use tokio::time::Instant;

use super::PoolState;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Server {
    Down(String),
    Up,
    Stopping,
}

/// The second look at a server whose monitor connection closed: a closed connection alone
/// proves little (an idle timeout or a proxy may end it while postgres runs on), and
/// losing the server drops every lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Probe {
    Idle,
    /// A new connection is being tried.
    Running,
    /// It failed: the server is lost, for this reason.
    Unanswered(String),
}

impl PoolState {
    /// True while postgres is up.
    pub fn server_is_up(&self) -> bool {
        self.server == Server::Up
    }

    /// The pool is stopping (`stopping` was called).
    pub fn is_stopping(&self) -> bool {
        self.server == Server::Stopping
    }

    /// Bringing the server (back) up failed; another try is due at `retry_at`.
    pub fn server_start_failed(&mut self, reason: String, retry_at: Instant) {
        self.last_server_error = Some(reason);
        self.restart_at = Some(retry_at);
    }

    /// Whether a new try at bringing the server up is due now (it is then under way).
    pub fn restart_due(&mut self, now: Instant) -> bool {
        if self.restart_at.is_some_and(|at| at <= now) {
            self.restart_at = None;
            return true;
        }
        false
    }

    /// Times the server was lost and restarted, and why it last went or failed to start.
    pub fn server_history(&self) -> (u32, Option<&str>) {
        (self.restarts, self.last_server_error.as_deref())
    }

    /// The server generation: it changes when the server is lost, so a job's report
    /// tagged with an older one describes a server that is gone.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The monitor connection closed: true when a second look should start now (none
    /// runs, and none has failed yet).
    pub fn begin_probe(&mut self) -> bool {
        if self.probe != Probe::Idle {
            return false;
        }
        self.probe = Probe::Running;
        true
    }

    /// The second look ended: the server answered, or not (and why).
    // A message by design: the reason is only said (in the log, and as why the server is
    // declared lost); nothing decides by its kind.
    pub fn probe_ended(&mut self, outcome: Result<(), String>) {
        self.probe = match outcome {
            Ok(()) => Probe::Idle,
            Err(error) => Probe::Unanswered(error),
        };
    }

    /// Why the server is to be declared lost, when a second look found it unanswering.
    pub fn probe_failure(&self) -> Option<&str> {
        match &self.probe {
            Probe::Unanswered(error) => Some(error),
            Probe::Idle | Probe::Running => None,
        }
    }
}
