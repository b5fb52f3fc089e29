//! The temporary login role a build's source runs as: created before the source runs
//! (named like the template database, acting as the owner role), and retired after it,
//! what it made handed on. SQL files (`apply.rs`), commands and dumps (`command.rs`) and
//! client-built templates (`client.rs`) all run as one, so it sits below the three.

use super::run_in;
use crate::names::{quote_ident, quote_literal, DbName, MARKER};
use crate::session::{Session, OWNER_ROLE};
use crate::sql_error::SqlError;

/// Creates the temporary login role of a build: named like the template database `db`
/// (so the `sameuser` rule admits it there only), its sessions acting as the owner role.
/// Returns its password.
pub(super) async fn create_build_role(
    session: &Session,
    db: &DbName,
    superuser: bool,
) -> Result<String, SqlError> {
    let role = quote_ident(db.as_str());
    let password = crate::scram::random_password();
    // Either way its sessions start acting as the owner role (`RESET ROLE` returns to that
    // default); a superuser one regains its rights only with an explicit `SET ROLE NONE`
    // (see `retire_build_role` for what it then makes).
    let attribute = if superuser {
        "SUPERUSER"
    } else {
        "NOSUPERUSER"
    };
    session
        .execute(&format!(
            "CREATE ROLE {role} LOGIN {attribute} NOCREATEDB NOCREATEROLE NOREPLICATION \
               PASSWORD {verifier} IN ROLE {owner}; \
             ALTER ROLE {role} SET role = {owner_literal}; \
             COMMENT ON ROLE {role} IS {marker};",
            // Postgres' standard count, not the lease roles' low one: some drivers (Go's
            // lib/pq, used by dbmate and others) refuse fewer than 4096 iterations, and a
            // build connects only a few times.
            verifier = quote_literal(&crate::scram::verifier(
                &password,
                crate::scram::STANDARD_ITERATIONS
            )),
            owner = quote_ident(OWNER_ROLE),
            owner_literal = quote_literal(OWNER_ROLE),
            marker = quote_literal(MARKER),
        ))
        .await?;
    Ok(password)
}

/// Hands whatever the temporary login role `db` made as itself (a tool may reset its role)
/// to the owner role, and drops the login role.
///
/// A superuser build's own objects — what its SQL made after `SET ROLE NONE`: an untrusted
/// extension's functions, a foreign-data wrapper — go to the daemon's superuser instead.
/// Handed to the owner role, they would make every lease role their owner, with rights the
/// extension withholds from everyone (adminpack's `pg_file_write`, for one).
pub(super) async fn retire_build_role(
    session: &Session,
    db: &DbName,
    superuser: bool,
) -> Result<(), SqlError> {
    let role = quote_ident(db.as_str());
    let (heir, whose) = if superuser {
        ("CURRENT_USER".to_owned(), "the superuser")
    } else {
        (quote_ident(OWNER_ROLE), OWNER_ROLE)
    };
    run_in(
        session,
        db,
        &format!("REASSIGN OWNED BY {role} TO {heir}; DROP OWNED BY {role};"),
    )
    .await
    .map_err(|e| e.context(format!("handing the objects of {db} to {whose}")))?;
    session
        .execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await?;
    Ok(())
}
