//! Making a clone: its lease role (a member of the owner role, with a fresh password and
//! its SCRAM verifier), `CREATE DATABASE … TEMPLATE`, retried while stray sessions leave
//! the template, and what CREATE DATABASE does not copy (grants, settings); and setting a
//! lease's own connection limit. It does not choose what to clone: the state does.

use std::time::Duration;

use super::{Session, OWNER_ROLE};
use crate::config::LeaseAuth;
use crate::names::{quote_ident, quote_literal, DbName};
use crate::scram;
use crate::sql_error::SqlError;

/// How many times a clone is retried while stray sessions leave its template.
const CLONE_BUSY_RETRIES: u32 = 40;

impl Session {
    /// Makes a clone ready to lease: its own LOGIN role (named like the database, a member
    /// of the owner role, with a fresh password), `CREATE DATABASE clone TEMPLATE
    /// template_db` owned by that role, CONNECT and TEMPORARY revoked from PUBLIC, the
    /// template's database-level settings re-applied, and our marker on both.
    /// Returns the role's password.
    /// `standard_scram` marks a clone of a client-built template (the IntegreSQL API): its
    /// verifier has postgres' standard iteration count (those clients' Go drivers refuse
    /// fewer), and the IntegreSQL clients' role, if any, becomes a member of its role, so
    /// that `samerole` lets the suites' shared PG* user into their test databases.
    pub async fn clone_database(
        &self,
        template_db: &DbName,
        clone: &DbName,
        standard_scram: bool,
    ) -> Result<String, SqlError> {
        self.bounded(
            || format!("cloning {template_db} into {clone}"),
            async |client| {
                self.clone_with(client, template_db, clone, standard_scram)
                    .await
            },
        )
        .await
    }

    async fn clone_with(
        &self,
        client: &tokio_postgres::Client,
        template_db: &DbName,
        clone: &DbName,
        standard_scram: bool,
    ) -> Result<String, SqlError> {
        let role = quote_ident(clone.as_str());
        let password = scram::random_password();
        let superuser = if self.lease_superuser {
            "SUPERUSER"
        } else {
            "NOSUPERUSER"
        };
        // Membership in the owner role (and the prefix) marks the role, and through it the
        // database it owns, as ours: no comment to write on the hot path.
        let shared = match self.integresql_role() {
            Some(shared) if standard_scram => {
                format!(" GRANT {role} TO {};", quote_ident(shared))
            }
            _ => String::new(),
        };
        client
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN {superuser} CONNECTION LIMIT {limit} IN ROLE {owner}; {set}{shared}",
                limit = self.lease_connections,
                owner = quote_ident(OWNER_ROLE),
                set = self.set_password_sql(clone, &password, standard_scram),
            ))
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        // STRATEGY exists from postgres 15; older servers always copy files.
        let strategy = if self.pg_major >= 15 {
            format!(" STRATEGY {}", self.clone_strategy.as_sql())
        } else {
            String::new()
        };
        let create = format!(
            "CREATE DATABASE {} TEMPLATE {}{strategy} OWNER {role}",
            clone.quoted(),
            template_db.quoted(),
        );
        let mut attempt = 0;
        loop {
            match client.batch_execute(&create).await {
                Ok(()) => break,
                // "source database is being accessed by other users": a session is leaving.
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                        && attempt < CLONE_BUSY_RETRIES =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Err(e) => {
                    if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) {
                        // Someone else's database of that name, made since the start: the
                        // pool leaves it alone and never takes the name again
                        // (`PoolState::drop_after_failed_create`), so the role made for it
                        // above goes now, not at the next start's sweep.
                        if let Err(drop) = Self::drop_role(client, clone).await {
                            tracing::warn!(role = %clone, error = %drop, "cannot drop the role of a clone whose name was taken; the next start's sweep drops it");
                        }
                    }
                    return Err(SqlError::from_pg(&e));
                }
            }
        }
        // CREATE DATABASE does not copy database-level grants or settings.
        // Reading and re-applying the settings keep their SQLSTATE too: a clone that meets
        // a full disk here is the room's failure (507), like its CREATE DATABASE.
        let settings = self.template_settings(client, template_db).await?;
        let sql = format!(
            "REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC;{}",
            clone.quoted(),
            settings.sql_for(clone)
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| SqlError::from_pg(&e))?;
        settings.verify(self, client, template_db, clone).await?;
        Ok(password)
    }

    /// Sets the connection limit of a clone's role (for a lease that asked for its own).
    pub async fn set_connection_limit(&self, clone: &DbName, limit: u32) -> Result<(), SqlError> {
        let sql = format!(
            "ALTER ROLE {} CONNECTION LIMIT {limit}",
            quote_ident(clone.as_str())
        );
        self.bounded(
            || format!("setting the connection limit of {clone}"),
            async |client| {
                client
                    .batch_execute(&sql)
                    .await
                    .map_err(|e| SqlError::from_pg(&e))
            },
        )
        .await
    }

    /// The statement that stores `password` for the role `role`, as `ALTER ROLE … PASSWORD`
    /// stores it, by writing `pg_authid` itself (the session's admin is a superuser). That
    /// skips the check postgres runs on a new password first — that it is not the empty
    /// password's verifier, a whole PBKDF2 at the verifier's iteration count on the server:
    /// 7 ms of postgres' CPU at 4096 (pgbench here), twenty times the rest of the role's
    /// statements. Our passwords are 64 random hex digits, never empty.
    pub(crate) fn set_password_sql(&self, role: &DbName, password: &str, standard: bool) -> String {
        format!(
            "UPDATE pg_catalog.pg_authid SET rolpassword = {} WHERE rolname = {};",
            self.password_sql(password, standard),
            quote_literal(role.as_str())
        )
    }

    /// What the stored password is for `password`: its SCRAM verifier under the configured
    /// iteration count (at least postgres' standard count with `standard`), quoted; `NULL`
    /// under trust, which checks no password (computing a verifier nobody reads would cost
    /// a PBKDF2 per clone).
    pub(super) fn password_sql(&self, password: &str, standard: bool) -> String {
        let iterations = match self.lease_auth {
            LeaseAuth::Scram { iterations } if standard => {
                iterations.max(scram::STANDARD_ITERATIONS)
            }
            LeaseAuth::Scram { iterations } => iterations,
            LeaseAuth::Trust => return "NULL".into(),
        };
        quote_literal(&scram::verifier(password, iterations))
    }
}
