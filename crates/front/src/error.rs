//! What goes wrong in a session (`SessionError`), and what its client is told (`Refusal`):
//! an ErrorResponse of severity FATAL with a SQLSTATE, after which the front closes the
//! connection. Pool errors get the SQLSTATE that fits them, the way `pglease-api` gives them
//! an HTTP status (`crates/api/src/error.rs`): an unknown template is `3D000`, a budget or
//! limit that blocks `53300`, a full disk `53100`, a stopping or restarting server `57P03`.

use bytes::BytesMut;
use pglease_pool::{Blocked, LeaseError, SqlErrorKind};

use crate::backend::BackendError;
use crate::codec::{self, CodecError};

/// An ErrorResponse for the client: its SQLSTATE and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The SQLSTATE.
    pub(crate) code: &'static str,
    /// The message.
    pub(crate) message: String,
}

impl Refusal {
    /// A refusal with this SQLSTATE.
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }

    /// `08P01` (protocol_violation): the client broke the protocol.
    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Refusal::new("08P01", message)
    }

    /// Writes it as a FATAL ErrorResponse.
    pub(crate) fn write(&self, out: &mut BytesMut) {
        codec::fatal_error(self.code, &self.message, out);
    }
}

impl From<LeaseError> for Refusal {
    fn from(error: LeaseError) -> Self {
        let message = error.to_string();
        let code = match &error {
            // invalid_catalog_name: what postgres says of a database that does not exist.
            LeaseError::UnknownTemplate { .. } | LeaseError::Discarded(_) => "3D000",
            LeaseError::VersionNotOffered { .. } | LeaseError::VersionNotServed { .. } => "0A000",
            LeaseError::BuildFailed {
                cause: SqlErrorKind::DiskFull,
                ..
            }
            | LeaseError::CloneFailed {
                cause: SqlErrorKind::DiskFull,
                ..
            } => "53100",
            // object_not_in_prerequisite_state: the template cannot be used as it is; the
            // message is the build's error.
            LeaseError::BuildFailed { .. }
            | LeaseError::InvalidSource { .. }
            | LeaseError::ClientBuilt(_)
            | LeaseError::OnOtherServer { .. } => "55000",
            // too_many_connections: a limit blocks, and the message names it.
            LeaseError::TimedOut {
                blocked_by: Blocked::MaxTotal { .. } | Blocked::ConnectionBudget { .. },
                ..
            }
            | LeaseError::TooManyConnections { .. }
            | LeaseError::OutOfSpace { .. }
            | LeaseError::TooManyWaiting { .. } => "53300",
            // cannot_connect_now: what postgres says while it starts or stops.
            LeaseError::TimedOut { .. }
            | LeaseError::ShuttingDown
            | LeaseError::PostgresDown(_)
            | LeaseError::ServerStart { .. } => "57P03",
            // insufficient_privilege: a lease never gets it, but the answer is the pool's.
            LeaseError::ConfiguredTemplate(_) => "42501",
            LeaseError::CloneFailed { .. } => "58000",
            LeaseError::Internal(_) => {
                tracing::error!(%error, "a lease at the front failed");
                return Refusal::new("XX000", "internal error; see the pglease log");
            }
        };
        Refusal::new(code, message)
    }
}

/// Why a session ended before or while relaying.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    /// Reading from or writing to the client failed.
    #[error("{doing}: {source}")]
    Io {
        /// What the front was doing.
        doing: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The client sent a packet the front cannot accept.
    #[error(transparent)]
    Codec(CodecError),
    /// The client closed the connection in the middle of a packet.
    #[error("incomplete startup packet: the connection closed after {received} bytes")]
    Incomplete {
        /// The bytes of the packet that arrived.
        received: usize,
    },
    /// The client closed the connection between packets.
    #[error("the client closed the connection during the start-up")]
    ClientLeft,
    /// The TLS handshake the client asked for failed (or it left during it); its
    /// connection is closed without a word, since nothing may follow in plain text.
    #[error("the TLS handshake failed: {0}")]
    TlsHandshake(std::io::Error),
    /// The client began a TLS handshake without an SSLRequest (libpq's
    /// `sslnegotiation=direct`) at a front without TLS: closed without a word, since the
    /// client reads nothing but TLS.
    #[error("a TLS handshake without an SSLRequest, and the front serves no TLS (--front-tls)")]
    DirectTlsRefused,
    /// The client did not finish its start-up in time.
    #[error("the client did not finish its start-up within {secs} s")]
    StartupTimeout {
        /// The limit.
        secs: u64,
    },
    /// The front refused the client, and told it why.
    #[error("{} (SQLSTATE {})", .0.message, .0.code)]
    Refused(Refusal),
    /// The lease's connection to postgres could not be opened.
    #[error(transparent)]
    Backend(BackendError),
    /// Postgres did not finish the lease's login in time.
    #[error("postgres did not finish the lease's login within {secs} s")]
    BackendTimeout {
        /// The limit.
        secs: u64,
    },
}

impl SessionError {
    /// An I/O error while `doing`.
    pub(crate) fn io(doing: &'static str, source: std::io::Error) -> Self {
        SessionError::Io { doing, source }
    }

    /// Writes what the client is told about this error, if anything: postgres' own
    /// ErrorResponse when it refused the lease's login, a refusal of the front's otherwise;
    /// nothing when the client is gone.
    pub(crate) fn answer(&self, out: &mut BytesMut) {
        match self {
            SessionError::Io { .. }
            | SessionError::ClientLeft
            | SessionError::TlsHandshake(_)
            | SessionError::DirectTlsRefused
            | SessionError::Incomplete { .. } => {}
            SessionError::Codec(error) => Refusal::protocol(error.to_string()).write(out),
            SessionError::StartupTimeout { .. } => {
                Refusal::protocol(self.to_string()).write(out);
            }
            SessionError::Refused(refusal) => refusal.write(out),
            SessionError::Backend(BackendError::Refused { raw, .. }) => out.extend_from_slice(raw),
            // connection_failure: the lease's database could not be reached.
            SessionError::Backend(_) | SessionError::BackendTimeout { .. } => {
                Refusal::new("08006", format!("cannot open the lease's database: {self}"))
                    .write(out);
            }
        }
    }

    /// Whether this is the client's doing (a bad packet, a wrong password, leaving early),
    /// logged at debug, rather than the front's or the pool's, logged as a warning.
    pub(crate) fn is_clients(&self) -> bool {
        match self {
            SessionError::Io { .. }
            | SessionError::Codec(_)
            | SessionError::Incomplete { .. }
            | SessionError::ClientLeft
            | SessionError::TlsHandshake(_)
            | SessionError::DirectTlsRefused
            | SessionError::StartupTimeout { .. } => true,
            SessionError::Refused(refusal) => !refusal.code.starts_with("XX"),
            SessionError::Backend(_) | SessionError::BackendTimeout { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use pglease_pool::TemplateName;

    use super::*;

    fn template() -> TemplateName {
        TemplateName::new("app").expect("a valid name")
    }

    #[test]
    fn pool_errors_get_the_sqlstate_that_fits() {
        let unknown = LeaseError::UnknownTemplate {
            template: template(),
            known: vec![TemplateName::default_name()],
        };
        let refusal = Refusal::from(unknown);
        assert_eq!(refusal.code, "3D000");
        assert!(refusal.message.contains("default"), "{}", refusal.message);
        let blocked = LeaseError::TimedOut {
            template: template(),
            waited_ms: 10,
            blocked_by: Blocked::MaxTotal {
                leased: 2,
                max_total: 2,
            },
        };
        let refusal = Refusal::from(blocked);
        assert_eq!(refusal.code, "53300");
        assert!(refusal.message.contains("max_total"), "{}", refusal.message);
        let build = LeaseError::BuildFailed {
            template: template(),
            message: "syntax error at or near \"CREAT\"".into(),
            cause: SqlErrorKind::Other,
        };
        let refusal = Refusal::from(build);
        assert_eq!(refusal.code, "55000");
        assert!(refusal.message.contains("CREAT"), "{}", refusal.message);
        assert_eq!(
            Refusal::from(LeaseError::Internal("secret detail".into())),
            Refusal::new("XX000", "internal error; see the pglease log")
        );
        assert_eq!(Refusal::from(LeaseError::ShuttingDown).code, "57P03");
    }
}
