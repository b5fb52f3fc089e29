//! Why a clone could not be stamped (`proof.rs`): the stamp's query failed, or its
//! directory's listing did. A clone without a stamp is simply never proven unchanged (its
//! release drops it, `actor/jobs.rs`), so nothing decides by these today; they keep what a
//! caller would decide by all the same: a postgres failure stays a [`SqlError`] (its
//! SQLSTATE and kind: a full disk is `DiskFull`, a lost server `ConnectionLost`, an overrun
//! `Timeout`), an I/O failure its path and `io::Error`.

use std::path::PathBuf;

use crate::sql_error::SqlError;

/// A stamp that could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum StampError {
    /// The session does not run the server (an external one): its files are not ours to
    /// read.
    #[error("this server's files are not pglease's")]
    NotOurFiles,
    /// The stamp's query failed (or found no such clone), as postgres or the pool said it.
    #[error(transparent)]
    Sql(#[from] SqlError),
    /// The clone's directory cannot be listed.
    #[error("cannot read {}: {source}", path.display())]
    ListDirectory {
        /// The clone's directory (`base/<oid>`).
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// A file of the clone's directory cannot be stat'ed (it went between the listing and
    /// its stat, most often).
    #[error("cannot stat {}: {source}", path.display())]
    Stat {
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The thread that lists the files ended without an answer (it panicked).
    #[error("listing files failed: {0}")]
    Listing(#[source] tokio::task::JoinError),
}
