//! Dropping a database of ours and the role named like it: the two statements of a clone's
//! drop (the hot path), a template's (unmarked first), and the careful drop of a clone its
//! holder made undroppable, which locks the holder out before anything else.

use super::Session;
use crate::names::{quote_ident, DbName};
use crate::sql_error::pg_message;
use crate::sql_error::SqlError;

impl Session {
    /// Drops `db` if it exists, ending its sessions, and the role named like it; a template
    /// is unmarked first. A clone takes two statements and no look-ups (the hot path).
    pub async fn drop_database(&self, db: &DbName) -> Result<(), SqlError> {
        self.bounded(
            || format!("dropping {db}"),
            async |client| Self::drop_with(client, db).await,
        )
        .await
    }

    async fn drop_with(client: &tokio_postgres::Client, db: &DbName) -> Result<(), SqlError> {
        if !db.is_template() {
            let dropped = client
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    db.quoted()
                ))
                .await;
            if let Err(error) = dropped {
                return Self::drop_held_clone(client, db, &error).await;
            }
            return client
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(db.as_str())))
                .await
                .map_err(|e| SqlError::from_pg(&e));
        }
        let row = client
            .query_opt(
                "SELECT datistemplate FROM pg_database WHERE datname = $1",
                &[&db.as_str()],
            )
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        let Some(row) = row else {
            // A clone whose CREATE DATABASE failed may still have its role.
            return Self::drop_role(client, db).await;
        };
        if row.get::<_, bool>(0) {
            client
                .batch_execute(&format!(
                    "ALTER DATABASE {} WITH IS_TEMPLATE false",
                    db.quoted()
                ))
                .await
                .map_err(|e| SqlError::from_pg(&e))?;
        }
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                db.quoted()
            ))
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        Self::drop_role(client, db).await
    }

    /// The drop of a clone whose plain drop failed: its holder may have made it undroppable
    /// (`ALTER DATABASE … IS_TEMPLATE true` — it owns the database). First its role is
    /// locked out — no login, no password, no settings — so that whatever happens next the
    /// former holder's credentials never work again; then its sessions are ended, the
    /// attributes an owner can set are undone, and the drop is tried again. An error names
    /// what still failed and the first failure.
    async fn drop_held_clone(
        client: &tokio_postgres::Client,
        db: &DbName,
        first: &tokio_postgres::Error,
    ) -> Result<(), SqlError> {
        let first = pg_message(first);
        tracing::warn!(database = %db, error = %first, "a released database did not drop; undoing what its holder may have done to it");
        let role = quote_ident(db.as_str());
        let careful = async {
            let role_exists = client
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&db.as_str()])
                .await?
                .is_some();
            if role_exists {
                client
                    .batch_execute(&format!(
                        "ALTER ROLE {role} NOLOGIN PASSWORD NULL; ALTER ROLE {role} RESET ALL"
                    ))
                    .await?;
            }
            client
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 OR usename = $1",
                    &[&db.as_str()],
                )
                .await?;
            let db_exists = client
                .query_opt(
                    "SELECT 1 FROM pg_database WHERE datname = $1",
                    &[&db.as_str()],
                )
                .await?
                .is_some();
            if db_exists {
                client
                    .batch_execute(&format!(
                        "ALTER DATABASE {db} WITH IS_TEMPLATE false ALLOW_CONNECTIONS true \
                         CONNECTION LIMIT -1",
                        db = db.quoted()
                    ))
                    .await?;
                client
                    .batch_execute(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        db.quoted()
                    ))
                    .await?;
            }
            client
                .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
                .await
        };
        careful.await.map_err(|e: tokio_postgres::Error| {
            SqlError::described(
                &e,
                format!("{} (the first attempt: {first})", pg_message(&e)),
            )
        })
    }

    /// Drops the lease role named like `db`, if there is one (templates have none).
    pub(super) async fn drop_role(
        client: &tokio_postgres::Client,
        db: &DbName,
    ) -> Result<(), SqlError> {
        let exists = client
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&db.as_str()])
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        if exists.is_some() {
            client
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(db.as_str())))
                .await
                .map_err(|e| SqlError::from_pg(&e))?;
        }
        Ok(())
    }
}
