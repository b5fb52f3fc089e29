//! Facts read from the server: whether it answers, whether it accepts SSL, database sizes,
//! whether a template build is complete, and the sessions on a database (counting them,
//! waiting for them to go, ending them). Nothing here changes what the pool manages.

use std::time::Duration;

use super::Session;
use crate::names::DbName;
use crate::sql_error::SqlError;

impl Session {
    /// Whether the server still answers a query on an admin connection.
    pub(crate) async fn answers(&self) -> bool {
        self.bounded(
            || "asking whether the server answers".to_owned(),
            async |client| {
                client
                    .batch_execute("SELECT 1")
                    .await
                    .map_err(|e| SqlError::from_pg(&e))
            },
        )
        .await
        .is_ok()
    }

    /// The server accepts SSL (`ssl = on`).
    pub fn ssl(&self) -> bool {
        self.settings
            .iter()
            .any(|(name, value)| name == "ssl" && value == "on")
    }

    /// `pg_database_size(db)` in bytes.
    pub async fn database_size(&self, db: &DbName) -> Result<i64, SqlError> {
        self.bounded(
            || format!("sizing {db}"),
            async |client| {
                let row = client
                    .query_one("SELECT pg_database_size($1::text::name)", &[&db.as_str()])
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(row.get(0))
            },
        )
        .await
    }

    /// The `pg_database_size` of each of `dbs` that exists, in bytes: what
    /// `--lease-max-bytes` is judged by, a few times a second while leases are open. One
    /// query for all of them; a database dropped meanwhile is left out (its directory
    /// gone, postgres sizes it 0; the superuser's size check does not look it up).
    pub async fn sizes_of(&self, dbs: &[DbName]) -> Result<Vec<(String, i64)>, SqlError> {
        let names: Vec<&str> = dbs.iter().map(DbName::as_str).collect();
        self.bounded(
            || "sizing the leased databases".to_string(),
            async |client| {
                let rows = client
                    .query(
                        "SELECT datname::text, coalesce(pg_database_size(oid), 0) \
                         FROM pg_database WHERE datname::text = ANY($1::text[])",
                        &[&names],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
            },
        )
        .await
    }

    /// Every database's name and `pg_database_size`, in bytes.
    pub async fn database_sizes(&self) -> Result<Vec<(String, i64)>, SqlError> {
        self.bounded(
            || "sizing the databases".to_string(),
            async |client| {
                let rows = client
                    .query(
                        "SELECT datname::text, pg_database_size(oid) FROM pg_database",
                        &[],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
            },
        )
        .await
    }

    /// True when `db` exists, is marked a template and refuses connections: a finished build.
    pub async fn is_complete_template(&self, db: &DbName) -> Result<bool, SqlError> {
        self.bounded(
            || format!("looking up {db}"),
            async |client| {
                let row = client
                    .query_opt(
                        "SELECT datistemplate AND NOT datallowconn FROM pg_database WHERE datname = $1",
                        &[&db.as_str()],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
            },
        )
        .await
    }

    /// Waits until no session is connected to `db` (a build's connection may take a moment
    /// to go), terminating stragglers after half the time.
    pub async fn wait_until_unused(&self, db: &DbName, limit: Duration) -> Result<(), SqlError> {
        let started = tokio::time::Instant::now();
        loop {
            if self.sessions_on(db).await? == 0 {
                return Ok(());
            }
            if started.elapsed() > limit / 2 {
                self.terminate_sessions(db).await?;
            }
            if started.elapsed() > limit {
                return Err(SqlError::timeout(format!(
                    "sessions still connected to {db} after {limit:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sessions still connected to `db` after up to `grace`: a client that has just closed
    /// its connection leaves a backend that takes a few milliseconds to exit, so an
    /// immediate count would call a finished test "in use".
    pub async fn sessions_after(&self, db: &DbName, grace: Duration) -> Result<i64, SqlError> {
        let started = tokio::time::Instant::now();
        loop {
            let sessions = self.sessions_on(db).await?;
            if sessions == 0 || started.elapsed() >= grace {
                return Ok(sessions);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sessions connected to `db` (other than this one).
    pub async fn sessions_on(&self, db: &DbName) -> Result<i64, SqlError> {
        self.bounded(
            || format!("counting the sessions on {db}"),
            async |client| {
                let row = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                        &[&db.as_str()],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(row.get(0))
            },
        )
        .await
    }

    /// Those of `dbs` that have a session (other than this one): one query for all of them,
    /// a few times a second while IntegreSQL test databases are out, so that the one
    /// recreated to make room is one whose test has ended (`state/expiry.rs`).
    pub async fn with_sessions(&self, dbs: &[DbName]) -> Result<Vec<String>, SqlError> {
        let names: Vec<&str> = dbs.iter().map(DbName::as_str).collect();
        self.bounded(
            || "looking for sessions on the test databases".to_string(),
            async |client| {
                let rows = client
                    .query(
                        "SELECT DISTINCT datname::text FROM pg_stat_activity \
                         WHERE datname::text = ANY($1::text[]) AND pid <> pg_backend_pid()",
                        &[&names],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(rows.iter().map(|row| row.get(0)).collect())
            },
        )
        .await
    }

    /// Ends every session connected to `db`.
    pub async fn terminate_sessions(&self, db: &DbName) -> Result<(), SqlError> {
        self.bounded(
            || format!("ending the sessions on {db}"),
            async |client| {
                client
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                        &[&db.as_str()],
                    )
                    .await
                    .map_err(|e| SqlError::from_pg(&e))?;
                Ok(())
            },
        )
        .await
    }
}
