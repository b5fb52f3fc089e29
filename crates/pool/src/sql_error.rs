//! What went wrong with SQL the pool ran, kept as postgres said it: the message, the
//! SQLSTATE, and the kind of failure the state and the API decide by (a full disk is the
//! server's room running out, 507; a connection slot refused is the connection budget's,
//! 503 `too_many_connections`; anything else a clone meets is the server's trouble, 503; a
//! connection lost is no fault of the user's SQL). Every SQL job's outcome carries
//! it: builds, clones, recycles, drops, connection limits, and the opening and finalizing
//! of templates clients build. `pg_message`, postgres' words for a driver error, lives here
//! too: the error enums, the session and the builds all use it, and this module uses no
//! other of the pool's.

use tokio_postgres::error::SqlState;

/// A failed SQL operation of the pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SqlError {
    /// What kind of failure it is.
    pub kind: SqlErrorKind,
    /// Postgres' SQLSTATE, when postgres answered with an error.
    pub sqlstate: Option<String>,
    /// Postgres' words (severity, message, detail, hint), or what the driver or the pool said.
    pub message: String,
}

/// The kinds of failure a caller must tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlErrorKind {
    /// The server's storage is full (SQLSTATE 53100, `disk_full`).
    DiskFull,
    /// Postgres refused a connection for want of a slot (SQLSTATE 53300,
    /// `too_many_connections`: the server's `max_connections` less its reserved slots, or a
    /// role's or a database's `CONNECTION LIMIT`). It is the connection budget's failure,
    /// never the sources' or the SQL's. Postgres answers every connection limit with 53300;
    /// 53400 (`configuration_limit_exceeded`) names other limits (locks, replication
    /// slots, background workers) and stays [`SqlErrorKind::Other`].
    TooManyConnections,
    /// The connection went away or the server is shutting down (class 08, 57P01–57P03, or
    /// a closed connection).
    ConnectionLost,
    /// The operation overran its time bound, or waited too long for a connection.
    Timeout,
    /// Anything else: the server refused the statement.
    Other,
}

/// Postgres' own words for an error: severity, message, detail and hint when the server
/// sent them, else the driver's description with its causes.
pub fn pg_message(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!("{}: {}", db.severity(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" DETAIL: {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!(" HINT: {hint}"));
        }
        return text;
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

impl SqlError {
    /// Classifies a driver error, keeping postgres' words.
    pub fn from_pg(error: &tokio_postgres::Error) -> SqlError {
        SqlError::described(error, pg_message(error))
    }

    /// Classifies a driver error, with `message` saying it (postgres' words with context:
    /// the file a migration failed in, the database it could not reach).
    pub fn described(error: &tokio_postgres::Error, message: String) -> SqlError {
        let Some(code) = error.code() else {
            let kind = if error.is_closed() {
                SqlErrorKind::ConnectionLost
            } else {
                SqlErrorKind::Other
            };
            return SqlError {
                kind,
                sqlstate: None,
                message,
            };
        };
        let kind = if *code == SqlState::DISK_FULL {
            SqlErrorKind::DiskFull
        } else if *code == SqlState::TOO_MANY_CONNECTIONS {
            SqlErrorKind::TooManyConnections
        } else if code.code().starts_with("08")
            || [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ]
            .contains(code)
        {
            SqlErrorKind::ConnectionLost
        } else {
            SqlErrorKind::Other
        };
        SqlError {
            kind,
            sqlstate: Some(code.code().to_owned()),
            message,
        }
    }

    /// A failure the pool itself describes (no SQLSTATE).
    pub fn other(message: impl Into<String>) -> SqlError {
        SqlError {
            kind: SqlErrorKind::Other,
            sqlstate: None,
            message: message.into(),
        }
    }

    /// The same failure, its message preceded by `what` the pool was doing ("settling the
    /// template: …"): the kind and the SQLSTATE stay, so a full disk met in any step of a
    /// build is still a full disk where the API decides the answer.
    pub fn context(self, what: impl std::fmt::Display) -> SqlError {
        SqlError {
            message: format!("{what}: {}", self.message),
            ..self
        }
    }

    /// An operation that overran its bound.
    pub fn timeout(message: impl Into<String>) -> SqlError {
        SqlError {
            kind: SqlErrorKind::Timeout,
            sqlstate: None,
            message: message.into(),
        }
    }
}

/// Tests write failures as words.
#[cfg(test)]
impl From<&str> for SqlError {
    fn from(message: &str) -> SqlError {
        SqlError::other(message)
    }
}
