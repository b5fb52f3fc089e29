//! Sealing a built template database: `settle` (ANALYZE, CHECKPOINT, VACUUM (FREEZE)) once
//! its sources are applied, `seal_template` (no connections, `IS_TEMPLATE`) once its
//! sessions are gone, and `write_relcache_init`, the relation cache init file every clone
//! copies. It does not apply sources or run commands: `apply.rs` and `command.rs` do.

use std::time::Duration;

use super::{run_each_in, run_in};
use crate::names::DbName;
use crate::session::Session;
use crate::sql_error::SqlError;

/// Marks a migrated database a template nobody may connect to, once its sessions are gone.
pub(super) async fn seal_template(session: &Session, db: &DbName) -> Result<(), SqlError> {
    session
        .wait_until_unused(db, Duration::from_secs(5))
        .await?;
    session
        .execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false IS_TEMPLATE true",
            db.quoted()
        ))
        .await?;
    Ok(())
}

/// Gives the sealed template `db` a relation cache init file (`pg_internal.init`) by opening
/// one connection to it: the first backend of a database without one builds the cache from
/// the catalogs and writes it. `CREATE DATABASE … STRATEGY FILE_COPY` copies the file into
/// every clone (postgres recomputes the relations' file addresses when it loads one, for
/// that very case), so a lease holder's first connection loads it instead of building it.
/// Without it, every clone's first connection paid that: measured on PostgreSQL 15 with the
/// bench fixture, an idle server, libpq, p50 of 15, 8.3 ms against 4.4 ms with the file.
///
/// Settling the template (its `VACUUM` changes `pg_class`) and every postgres start remove
/// the file, so this runs after each build and for each template a start finds built. The
/// connection needs `ALLOW_CONNECTIONS` for a moment: nobody else can log in to a template
/// (no role bears its name, and the superuser connects only over the private socket). Only
/// an optimization: a failure is logged, and clones then build their cache themselves.
pub(crate) async fn write_relcache_init(session: &Session, db: &DbName) {
    let allow = async |allowed: bool| {
        let sql = format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS {allowed}",
            db.quoted()
        );
        session.execute(&sql).await
    };
    let written = match allow(true).await {
        Ok(()) => {
            let connected = run_in(session, db, "SELECT 1").await;
            // Sealed again whatever happened; until then the build is not complete.
            let sealed = allow(false).await;
            let unused = session.wait_until_unused(db, Duration::from_secs(5)).await;
            connected.and(sealed).and(unused)
        }
        Err(error) => Err(error),
    };
    match written {
        Ok(()) => tracing::debug!(database = %db, "wrote the template's relation cache init file"),
        Err(error) => tracing::warn!(
            database = %db, %error,
            "could not write the template's relation cache init file; each clone's first \
             connection builds the cache itself"
        ),
    }
}

/// After a template's sources are applied, once: `ANALYZE`, `CHECKPOINT`, `VACUUM (FREEZE)`.
/// Without it a clone has no statistics (pg_restore before 18 restores none, and a
/// clone's autovacuum never analyzes tables nobody changes), so the planner guesses in every
/// clone; rows whose hint bits nothing set yet (a table without indexes, or indexed before
/// the load's commit was flushed) are hinted by each clone's first read, which dirties and
/// later writes every page it reads; and no page is all-visible, so no index-only scan.
/// Measured on PostgreSQL 15 (300 MB of pgbench tables): `VACUUM (FREEZE, ANALYZE)` costs
/// what `ANALYZE` alone does (~0.2 s), and a clone's first full scan took 83 to 88 ms after it
/// against 100 to 153 ms without it when the rows were unhinted; after a parallel restore
/// whose index builds had hinted the rows, the same 106 ms either way (bench scenario 10,
/// where the step takes 1.35 s of a 6 s build of 1 GB).
///
/// The order is ANALYZE, CHECKPOINT, VACUUM (FREEZE). The CHECKPOINT before the VACUUM
/// because the server commits asynchronously (`synchronous_commit=off`): until a commit
/// record is flushed, VACUUM may neither hint nor freeze that transaction's rows, and a
/// VACUUM right after a restore left every page unfrozen (measured: a tar dump, 0 of 6 pages
/// all-visible; after a CHECKPOINT, 6 of 6). ANALYZE before both, because the statistics it
/// writes are rows too: analyzed last (`VACUUM (FREEZE, ANALYZE)`), `pg_statistic` was left
/// unhinted, and a clone's first planned query dirtied its page; in this order a clone's
/// reads dirty no buffer at all (measured with pg_buffercache), which is what lets the
/// server prove a released read-only clone unchanged (`session/proof.rs`). For a template of
/// migrations it costs tens of milliseconds.
pub(super) async fn settle(session: &Session, db: &DbName) -> Result<(), SqlError> {
    let started = std::time::Instant::now();
    run_each_in(session, db, &["ANALYZE", "CHECKPOINT", "VACUUM (FREEZE)"])
        .await
        .map_err(|e| e.context("settling the template (ANALYZE, CHECKPOINT, VACUUM (FREEZE))"))?;
    tracing::info!(
        database = %db,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "froze and analyzed the template: its clones read it without setting hint bits, and \
         plan with its statistics"
    );
    Ok(())
}
