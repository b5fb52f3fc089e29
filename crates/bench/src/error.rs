//! The benchmark's one error type. Every failure names what was being done; a scenario
//! that fails is recorded in the report with this text and the others still run.

/// What went wrong, with the step that was being taken.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An HTTP request could not be made or its body not read.
    #[error("{context}: {source}")]
    Http {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The daemon answered with an unexpected status.
    #[error("{context}: HTTP {status}: {body}")]
    Status {
        /// What was being done.
        context: String,
        /// The HTTP status code.
        status: u16,
        /// The answer's body, for the error code and message.
        body: String,
    },
    /// A postgres connection or statement failed.
    #[error("{context}: {}", postgres_text(source))]
    Postgres {
        /// What was being done.
        context: String,
        /// The driver's error (its Display includes the server's message).
        #[source]
        source: tokio_postgres::Error,
    },
    /// The daemon did something the harness does not expect (exited, never listened).
    #[error("{0}")]
    Daemon(String),
    /// Anything else, said in one sentence.
    #[error("{0}")]
    Other(String),
}

impl BenchError {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        BenchError::Io {
            context: context.into(),
            source,
        }
    }

    /// An HTTP client error with context.
    pub fn http(context: impl Into<String>, source: reqwest::Error) -> Self {
        BenchError::Http {
            context: context.into(),
            source,
        }
    }

    /// A postgres error with context.
    pub fn postgres(context: impl Into<String>, source: tokio_postgres::Error) -> Self {
        BenchError::Postgres {
            context: context.into(),
            source,
        }
    }
}

/// A postgres error as pglease words it (`pglease_pool::pg_message`: the server's
/// message with its detail and hint, or the client-side causes; the driver's own
/// `Display` says only "db error"), followed by the SQLSTATE, which pglease keeps apart
/// (`SqlError::sqlstate`) but a benchmark report has only this text to show.
pub fn postgres_text(error: &tokio_postgres::Error) -> String {
    let text = pglease_pool::pg_message(error);
    match error.code() {
        Some(code) => format!("{text} (SQLSTATE {})", code.code()),
        None => text,
    }
}

/// The benchmark's result type.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
