//! Time bounds on the admin SQL the pool's workers run. A CREATE or DROP that hangs (on a
//! lock someone else holds, or on a server that stopped answering) would otherwise hold a
//! clone slot and a pooled connection forever. It does not decide what happens to an
//! operation that timed out: the caller sees an error, as for any other failure.
//!
//! Each operation runs under [`Session::admin_timeout`] on a pooled connection; when the
//! bound passes, the connection leaves the pool (a later operation would queue behind its
//! statement), the server is asked to cancel the statement, and the error says "timed out
//! after …". The pool's connections also carry a `statement_timeout` a little longer than
//! the bound, so a statement whose cancel request got lost still ends.

use std::sync::atomic::Ordering;
use std::time::Duration;

use deadpool_postgres::{Object, PoolError, TimeoutType};
use tokio_postgres::NoTls;

use super::Session;
use crate::sql_error::pg_message;
use crate::sql_error::SqlError;

/// Default bound on one admin operation. Generous on purpose: cloning or dropping a big
/// template database legitimately takes minutes on a slow disk, and the bound is there for
/// what hangs, not for what is slow.
pub const DEFAULT_ADMIN_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Bound on opening one connection when the configuration names none: a server that
/// answers at all answers within seconds.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much longer than the bound the server's own `statement_timeout` is: the bound
/// always fires first, and the server's cancels only what our cancel request missed.
const STATEMENT_MARGIN: Duration = Duration::from_secs(10);
/// How long the cancel request of a timed-out operation may take.
const CANCEL_LIMIT: Duration = Duration::from_secs(10);

/// The admin pool's connection settings: the superuser's, plus a connect timeout when they
/// have none, a `statement_timeout` just past `bound` and `search_path` pinned to
/// `pg_catalog`.
pub(super) fn pool_config(
    admin_config: &tokio_postgres::Config,
    bound: Duration,
) -> tokio_postgres::Config {
    let mut config = admin_config.clone();
    let statement_ms = (bound + STATEMENT_MARGIN).as_millis();
    // search_path pinned: the daemon names catalog functions unqualified, and in a database
    // where others may create objects (an external server's `postgres` from before 15, where
    // PUBLIC may create in `public`) a `public.shobj_description(oid, text)` would match a
    // text literal better than the catalog's and run as the superuser.
    add_options(
        &mut config,
        &format!("-c statement_timeout={statement_ms} {PINNED_SEARCH_PATH}"),
    );
    config
}

/// Runs `sql` (a query with no literal of the moment in its text) on an admin connection as
/// a statement prepared once per connection: the proof and the recycle run the same few
/// queries at every release, and parsing and planning them again cost more CPU than running
/// them.
pub(super) async fn query_one_prepared(
    client: &Object,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<tokio_postgres::Row, SqlError> {
    let statement = client
        .prepare_cached(sql)
        .await
        .map_err(|e| SqlError::from_pg(&e))?;
    client
        .query_one(&statement, params)
        .await
        .map_err(|e| SqlError::from_pg(&e))
}

/// The daemon's own `search_path` (see [`pool_config`]).
pub(crate) const PINNED_SEARCH_PATH: &str = "-c search_path=pg_catalog";

/// Adds startup options after those the operator's URL gave, so that ours win.
pub(crate) fn add_options(config: &mut tokio_postgres::Config, ours: &str) {
    let options = match config.get_options() {
        Some(theirs) if !theirs.trim().is_empty() => format!("{theirs} {ours}"),
        _ => ours.to_owned(),
    };
    config.options(options);
}

/// How long opening a pooled connection may take in all (the socket, then the startup
/// and authentication exchange): the configured connect timeout, at least
/// [`CONNECT_TIMEOUT`].
pub(super) fn create_bound(admin_config: &tokio_postgres::Config) -> Duration {
    admin_config
        .get_connect_timeout()
        .map_or(CONNECT_TIMEOUT, |configured| {
            (*configured).max(CONNECT_TIMEOUT)
        })
}

/// The superuser's settings with a connect timeout when they name none.
pub(super) fn with_connect_timeout(
    admin_config: &tokio_postgres::Config,
) -> tokio_postgres::Config {
    let mut config = admin_config.clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config
}

impl Session {
    /// A pooled connection. Waiting for one, or opening one, that takes too long counts as
    /// an admin timeout.
    pub(super) async fn client(&self) -> Result<Object, SqlError> {
        self.pool.get().await.map_err(|e| match e {
            PoolError::Backend(error) => SqlError::from_pg(&error),
            PoolError::Timeout(kind) => {
                self.admin_timeouts.fetch_add(1, Ordering::Relaxed);
                let (what, bound) = match kind {
                    TimeoutType::Wait => ("waiting for a free admin connection", super::POOL_WAIT),
                    _ => (
                        "opening an admin connection",
                        create_bound(&self.admin_config),
                    ),
                };
                SqlError::timeout(format!("{what} timed out after {bound:?}"))
            }
            other => SqlError::other(other.to_string()),
        })
    }

    /// Runs `operation` on a pooled connection within [`Session::admin_timeout`]; `what`
    /// names it in the error ("cloning x" → "cloning x timed out after 300s").
    /// Its error is the operation's own: words (`String`) or a typed [`SqlError`].
    pub(super) async fn bounded<T, E: From<SqlError>>(
        &self,
        what: impl FnOnce() -> String,
        operation: impl AsyncFnOnce(&Object) -> Result<T, E>,
    ) -> Result<T, E> {
        let client = self.client().await?;
        match tokio::time::timeout(self.admin_timeout, operation(&client)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.admin_timeouts.fetch_add(1, Ordering::Relaxed);
                abandon(client);
                let message = format!("{} timed out after {:?}", what(), self.admin_timeout);
                tracing::warn!(error = %message, "admin operation timed out");
                Err(SqlError::timeout(message).into())
            }
        }
    }

    /// Admin operations that timed out since this session opened.
    pub fn admin_timeouts(&self) -> u64 {
        self.admin_timeouts.load(Ordering::Relaxed)
    }
}

/// Takes a connection whose statement may still run out of the pool, so that no later
/// operation queues behind that statement, and asks the server to cancel it (the
/// connection closes once its answer comes).
fn abandon(client: Object) {
    let cancel = client.cancel_token();
    drop(Object::take(client));
    tokio::spawn(async move {
        match tokio::time::timeout(CANCEL_LIMIT, cancel.cancel_query(NoTls)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %pg_message(&error), "could not cancel a timed-out statement; statement_timeout will end it");
            }
            Err(_) => {
                tracing::warn!(
                    "cancelling a timed-out statement timed out; statement_timeout will end it"
                );
            }
        }
    });
}
