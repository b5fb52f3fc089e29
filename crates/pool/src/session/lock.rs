//! The server lock: one pglease per postgres server. The start-up sweep drops every
//! database and role that carries our marker, so a second daemon on the same server would
//! drop the first one's leased clones. Each session therefore holds a session-level
//! advisory lock, taken before the sweep, on a connection of its own that lives as long
//! as any clone of the `Session`; a second daemon finds it taken and refuses to start,
//! naming the holder. It does not coordinate anything else between daemons.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

use super::describe_target;
use crate::error::StartError;
use crate::sql_error::pg_message;

/// The advisory lock's key: the bytes of "pglease\0" read as a big-endian integer.
const LOCK_KEY: i64 = i64::from_be_bytes(*b"pglease\0");
/// Advisory locks belong to a database, so every daemon takes it in the same one whatever
/// database its URL names (when the server has it).
const LOCK_DATABASE: &str = "postgres";
/// How long a lock held by someone else is retried: a daemon that has just exited (and is
/// being restarted, say by systemd) leaves a backend that takes a moment to go.
const FOREIGN_WAIT: Duration = Duration::from_secs(2);
/// How long a lock held by this very process is waited for: after a reconnect, the last
/// jobs of the previous session may still hold it until their SQL ends.
const OWN_WAIT: Duration = Duration::from_secs(10);
/// Pause between attempts.
const RETRY: Duration = Duration::from_millis(50);

/// The connection that holds the server lock; dropping it (with the last `Session` clone)
/// closes the connection, and postgres releases the lock.
pub(super) struct ServerLock {
    _client: tokio_postgres::Client,
}

impl ServerLock {
    /// Connects and takes the lock, or says who holds it.
    pub(super) async fn acquire(admin_config: &tokio_postgres::Config) -> Result<Self, StartError> {
        let target = describe_target(admin_config);
        let name = own_name();
        let client = connect(admin_config, &name).await?;
        let sql_error = |context: &'static str| {
            move |source| StartError::Sql {
                context: context.to_owned(),
                source,
            }
        };
        // Server-wide idle timeouts must not end this idle connection and with it the lock.
        // Set here rather than in the startup options, which servers before 14 (without
        // idle_session_timeout) would refuse.
        client
            .batch_execute(
                "SELECT pg_catalog.set_config(name, '0', false) FROM pg_catalog.pg_settings \
                 WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout', \
                                'statement_timeout')",
            )
            .await
            .map_err(sql_error("configuring the server lock's connection"))?;
        let started = Instant::now();
        loop {
            let taken: bool = client
                .query_one("SELECT pg_catalog.pg_try_advisory_lock($1)", &[&LOCK_KEY])
                .await
                .map_err(sql_error("taking the server lock"))?
                .get(0);
            if taken {
                return Ok(ServerLock { _client: client });
            }
            let holder = holder(&client)
                .await
                .map_err(sql_error("reading who holds the server lock"))?;
            let wait = match &holder {
                Some(holder) if holder.application_name != name => FOREIGN_WAIT,
                // Ours (a reconnect whose last jobs still run), or nobody any more: the
                // holder let go between the two queries, and the next attempt takes it.
                // Giving up then, after a long wait for our own holder, would blame "an
                // unknown session" for a lock that is free.
                _ => OWN_WAIT,
            };
            if started.elapsed() >= wait {
                return Err(StartError::ServerInUse {
                    target,
                    holder: holder
                        .map_or_else(|| "an unknown session".to_owned(), |h| h.describe()),
                });
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// How this daemon names its lock connection (`application_name`, at most 63 bytes).
fn own_name() -> String {
    // Linux only, like the rest of pglease; the name is for people, not for matching.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|host| host.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".to_owned());
    let mut name = format!("pglease (pid {} on {host})", std::process::id());
    // Postgres truncates longer names; cut at a character boundary to compare equal.
    while name.len() > 63 {
        name.pop();
    }
    name
}

/// Connects to [`LOCK_DATABASE`], or to the configured database on a server without one.
async fn connect(
    admin_config: &tokio_postgres::Config,
    name: &str,
) -> Result<tokio_postgres::Client, StartError> {
    let mut config = admin_config.clone();
    config.application_name(name).dbname(LOCK_DATABASE);
    let connected = match config.connect(NoTls).await {
        Err(error) if error.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
            tracing::warn!(
                database = LOCK_DATABASE,
                "the server has no such database; taking the server lock in the configured one, \
                 which only stops daemons configured with the same database"
            );
            config = admin_config.clone();
            config.application_name(name);
            config.connect(NoTls).await
        }
        other => other,
    };
    let (client, connection) = connected.map_err(|source| StartError::Connect {
        target: describe_target(admin_config),
        source,
    })?;
    tokio::spawn(async move {
        // Ends quietly when the last session clone drops the client; an error means the
        // server went away or ended the connection, and the lock with it.
        if let Err(error) = connection.await {
            tracing::info!(error = %pg_message(&error), "the connection holding the server lock ended");
        }
    });
    Ok(client)
}

/// The session holding the lock, as far as the server shows it.
struct Holder {
    application_name: String,
    client_addr: Option<String>,
    pid: i32,
}

impl Holder {
    fn describe(&self) -> String {
        let name = if self.application_name.is_empty() {
            "a session without an application_name".to_owned()
        } else {
            format!("{:?}", self.application_name)
        };
        let from = self
            .client_addr
            .as_deref()
            .map_or_else(|| "the local socket".to_owned(), |addr| addr.to_owned());
        format!("{name} (backend pid {}, connected from {from})", self.pid)
    }
}

/// Who holds the lock: an advisory lock on a bigint key shows its high half as `classid`,
/// its low half as `objid`, and `objsubid` 1.
async fn holder(client: &tokio_postgres::Client) -> Result<Option<Holder>, tokio_postgres::Error> {
    let high = LOCK_KEY >> 32;
    let low = LOCK_KEY & 0xffff_ffff;
    let row = client
        .query_opt(
            "SELECT coalesce(a.application_name, ''), host(a.client_addr), l.pid \
             FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid::bigint = $1 AND l.objid::bigint = $2 \
             LIMIT 1",
            &[&high, &low],
        )
        .await?;
    Ok(row.map(|row| Holder {
        application_name: row.get(0),
        client_addr: row.get(1),
        pid: row.get(2),
    }))
}
