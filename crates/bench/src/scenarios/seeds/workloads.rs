//! Where scenario 6's workloads get their databases (a lease, or a new database on a raw
//! server) and the steps run target by target: the inserts of workload (a), pgbench's
//! init and runs of workload (b).

use std::path::Path;
use std::time::{Duration, Instant};

use super::pgbench::{parse_pgbench, run_pgbench, Db};
use super::{InitFigures, InsertFigures, PgbenchRun, TargetResult, RAW_ROLE};
use crate::admin;
use crate::api::Api;
use crate::cluster::Cluster;
use crate::error::{BenchError, Result};
use crate::scenarios::{Ctx, IDLE_LIMIT, WAIT_MS};
use crate::stats::round3;

/// The statement of workload (a), as the seed script runs it.
const INSERT: &str = "INSERT INTO test (data) VALUES ('hello!')";
/// The table of workload (a).
const CREATE_TABLE: &str = "CREATE TABLE test (id serial primary key, data text)";
/// The lease's template.
const TEMPLATE: &str = "default";
/// Ceiling on `pgbench -i` (scale 10 takes seconds; a slow disk makes it longer).
const INIT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Margin on top of `-T` before a pgbench run is killed.
const RUN_MARGIN: Duration = Duration::from_secs(180);
/// How long a finished backend may take to leave `pg_stat_activity`.
const BACKEND_EXIT_LIMIT: Duration = Duration::from_secs(10);

/// Where a workload gets its database.
pub(super) enum Venue<'a> {
    /// A lease of pglease's `default` template; `admin` is the daemon's superuser, to
    /// see that the pool has settled.
    Lease {
        api: &'a Api,
        admin: &'a tokio_postgres::Client,
    },
    /// A new database on a raw server.
    Raw(&'a Cluster),
}

impl Venue<'_> {
    /// A fresh database for `workload`.
    async fn fresh(&self, workload: &str) -> Result<Db> {
        match self {
            Venue::Lease { api, .. } => Ok(api.lease(TEMPLATE, WAIT_MS).await?.into()),
            Venue::Raw(cluster) => {
                let dbname = format!("seeds_{workload}");
                let conn = cluster.superuser("postgres").await?;
                let created = admin::execute_each(
                    &conn.client,
                    &[
                        format!("DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"),
                        format!("CREATE DATABASE {dbname} OWNER {RAW_ROLE}"),
                    ],
                    &format!("creating {dbname}"),
                )
                .await;
                conn.close().await;
                created?;
                Ok(Db {
                    host: "127.0.0.1".into(),
                    port: cluster.port(),
                    user: RAW_ROLE.into(),
                    password: None,
                    dbname,
                    lease_id: None,
                })
            }
        }
    }

    /// Releases the lease (drop) or drops the database.
    async fn discard(&self, db: Db) -> Result<()> {
        match self {
            Venue::Lease { api, .. } => match &db.lease_id {
                Some(id) => api.release(id, false).await,
                None => Ok(()),
            },
            Venue::Raw(cluster) => {
                let conn = cluster.superuser("postgres").await?;
                let dropped = conn
                    .client
                    .batch_execute(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        db.dbname
                    ))
                    .await
                    .map_err(|e| BenchError::postgres(format!("dropping {}", db.dbname), e));
                conn.close().await;
                dropped
            }
        }
    }

    /// Waits until the daemon's background work is done ([`admin::wait_quiet`]); raw
    /// servers have nothing to wait for.
    async fn settle(&self) -> Result<()> {
        match self {
            Venue::Lease { api, admin } => admin::wait_quiet(api, admin, IDLE_LIMIT).await,
            Venue::Raw(_) => Ok(()),
        }
    }

    /// `pg_stat_wal.wal_sync` (raw servers only: tmpfs syncs nothing anyway). None where
    /// the server has no such column (before 14, and 18 moved it): the figure is a check
    /// on the shim, not the workload, so its absence fails nothing.
    async fn wal_syncs(&self) -> Result<Option<i64>> {
        let Venue::Raw(cluster) = self else {
            return Ok(None);
        };
        let conn = cluster.superuser("postgres").await?;
        let row = conn
            .client
            .query_one("SELECT wal_sync FROM pg_stat_wal", &[])
            .await;
        conn.close().await;
        Ok(row.ok().map(|row| row.get(0)))
    }

    /// Waits until backend `pid` has left `pg_stat_activity`: by then it has flushed its
    /// statistics (that happens before it leaves the process array).
    async fn wait_backend_gone(&self, pid: i32) -> Result<()> {
        let Venue::Raw(cluster) = self else {
            return Ok(());
        };
        let conn = cluster.superuser("postgres").await?;
        let started = Instant::now();
        let gone = loop {
            let row = conn
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .map_err(|e| BenchError::postgres("reading pg_stat_activity", e));
            match row {
                Ok(row) if row.get::<_, i64>(0) == 0 => break Ok(()),
                Ok(_) if started.elapsed() > BACKEND_EXIT_LIMIT => {
                    break Err(BenchError::Other(format!(
                        "backend {pid} did not exit within {}s",
                        BACKEND_EXIT_LIMIT.as_secs()
                    )))
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(error) => break Err(error),
            }
        };
        conn.close().await;
        gone
    }
}

/// Settles every venue (see [`Venue::settle`]) before a timed step.
async fn settle_all(entries: &[(TargetResult, Venue<'_>)]) -> Result<()> {
    for (_, venue) in entries {
        venue.settle().await?;
    }
    Ok(())
}

/// The order of the targets in step `step`: as given in even steps, reversed in odd
/// ones, so that no target always goes first (on a shared machine the first run of a
/// pair was often the faster one).
pub(super) fn step_order(step: usize, targets: usize) -> Vec<usize> {
    if step.is_multiple_of(2) {
        (0..targets).collect()
    } else {
        (0..targets).rev().collect()
    }
}

/// Both workloads on the given targets, step by step: each step runs on every target in
/// turn (see [`step_order`]) before the next step starts. Failures are recorded in the
/// target, not returned; a target whose pgbench database failed skips its remaining
/// pgbench steps.
pub(super) async fn run_targets(
    ctx: &Ctx,
    pgbench: &Path,
    mut entries: Vec<(TargetResult, Venue<'_>)>,
) -> Vec<TargetResult> {
    let plan = &ctx.plan;
    let count = entries.len();
    for index in step_order(0, count) {
        eprintln!(
            "[bench] 6 seeds: {}: {} inserts",
            entries[index].0.name, plan.seeds_insert_rows
        );
        let measured = match settle_all(&entries).await {
            Ok(()) => inserts(&entries[index].1, plan.seeds_insert_rows).await,
            Err(error) => Err(error),
        };
        let target = &mut entries[index].0;
        match measured {
            Ok(figures) => target.inserts = Some(figures),
            Err(error) => target.errors.push(format!("inserts: {error}")),
        }
    }
    // Workload (b): one database per target for the init and every run.
    let mut dbs: Vec<Option<Db>> = (0..count).map(|_| None).collect();
    let mut usable = vec![false; count];
    for index in step_order(1, count) {
        eprintln!(
            "[bench] 6 seeds: {}: pgbench -i -s {}",
            entries[index].0.name, plan.seeds_pgbench_scale
        );
        let (db, figures) = pgbench_init(ctx, pgbench, &entries, index).await;
        let target = &mut entries[index].0;
        usable[index] = figures.is_ok();
        match figures {
            Ok(figures) => target.pgbench_init = Some(figures),
            Err(error) => target.errors.push(format!("pgbench -i: {error}")),
        }
        dbs[index] = db;
    }
    let duration = plan.seeds_pgbench_duration;
    for (run, &clients) in plan.seeds_pgbench_clients.iter().enumerate() {
        for index in step_order(2 + run, count) {
            let Some(db) = dbs[index].as_ref().filter(|_| usable[index]) else {
                continue;
            };
            eprintln!(
                "[bench] 6 seeds: {}: pgbench -T {} -c {clients} -j {clients}",
                entries[index].0.name,
                duration.as_secs()
            );
            let measured = match settle_all(&entries).await {
                Ok(()) => pgbench_run(pgbench, db, clients, duration).await,
                Err(error) => Err(error),
            };
            let target = &mut entries[index].0;
            match measured {
                Ok(run) => target.pgbench_runs.push(run),
                Err(error) => {
                    target.errors.push(format!("pgbench -c {clients}: {error}"));
                    usable[index] = false;
                }
            }
        }
    }
    let mut results = Vec::new();
    for ((mut target, venue), db) in entries.into_iter().zip(dbs) {
        if let Some(db) = db {
            if let Err(error) = venue.discard(db).await {
                target
                    .errors
                    .push(format!("discarding the pgbench database: {error}"));
            }
        }
        results.push(target);
    }
    results
}

/// Connects to a workload's database over TCP.
async fn connect(db: &Db) -> Result<admin::Conn> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&db.host)
        .port(db.port)
        .user(&db.user)
        .dbname(&db.dbname)
        .application_name("pglease-bench");
    if let Some(password) = &db.password {
        config.password(password);
    }
    admin::connect_config(&config, &format!("{} as {}", db.dbname, db.user)).await
}

/// Workload (a): one connection, the table, `rows` autocommit INSERTs (timed).
async fn inserts(venue: &Venue<'_>, rows: usize) -> Result<InsertFigures> {
    let db = venue.fresh("inserts").await?;
    let measured = async {
        venue.settle().await?;
        let before = venue.wal_syncs().await?;
        let conn = connect(&db).await?;
        let pg = |what: &'static str| move |e| BenchError::postgres(what, e);
        conn.client
            .batch_execute(CREATE_TABLE)
            .await
            .map_err(pg("CREATE TABLE test"))?;
        let backend: i32 = conn
            .client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(pg("pg_backend_pid()"))?
            .get(0);
        // The simple query protocol, one round trip per statement, as a script runs it.
        let started = Instant::now();
        for _ in 0..rows {
            conn.client
                .batch_execute(INSERT)
                .await
                .map_err(pg("INSERT"))?;
        }
        let elapsed = started.elapsed();
        let counted: i64 = conn
            .client
            .query_one("SELECT count(*) FROM test", &[])
            .await
            .map_err(pg("counting the rows"))?
            .get(0);
        conn.close().await;
        if usize::try_from(counted).ok() != Some(rows) {
            return Err(BenchError::Other(format!(
                "{rows} INSERTs left {counted} rows in test"
            )));
        }
        let wal_syncs = match before {
            Some(before) => {
                venue.wait_backend_gone(backend).await?;
                venue.wal_syncs().await?.map(|after| after - before)
            }
            None => None,
        };
        let secs = elapsed.as_secs_f64();
        Ok(InsertFigures {
            rows,
            secs: round3(secs),
            per_insert_ms: round3(secs * 1e3 / rows.max(1) as f64),
            wal_syncs,
        })
    }
    .await;
    let discarded = venue.discard(db).await;
    let figures = measured?;
    discarded?;
    Ok(figures)
}

/// Workload (b)'s start on target `index`: a fresh database and `pgbench -i -s S` in it
/// (timed). Returns the database whenever one was made, so it is always discarded.
async fn pgbench_init(
    ctx: &Ctx,
    pgbench: &Path,
    entries: &[(TargetResult, Venue<'_>)],
    index: usize,
) -> (Option<Db>, Result<InitFigures>) {
    let venue = &entries[index].1;
    let db = match venue.fresh("pgbench").await {
        Ok(db) => db,
        Err(error) => return (None, Err(error)),
    };
    let figures = async {
        settle_all(entries).await?;
        let scale = ctx.plan.seeds_pgbench_scale.to_string();
        let started = Instant::now();
        let output = run_pgbench(pgbench, &db, &["-i", "-s", &scale], INIT_TIMEOUT).await?;
        Ok(InitFigures {
            secs: round3(started.elapsed().as_secs_f64()),
            summary: output
                .lines()
                .find(|line| line.starts_with("done in"))
                .map(str::to_string),
        })
    }
    .await;
    (Some(db), figures)
}

/// One `pgbench -T D -c N -j N` run.
async fn pgbench_run(
    pgbench: &Path,
    db: &Db,
    clients: usize,
    duration: Duration,
) -> Result<PgbenchRun> {
    let n = clients.to_string();
    let output = run_pgbench(
        pgbench,
        db,
        &["-T", &duration.as_secs().to_string(), "-c", &n, "-j", &n],
        duration + RUN_MARGIN,
    )
    .await?;
    Ok(PgbenchRun {
        clients,
        duration_secs: duration.as_secs_f64(),
        figures: parse_pgbench(&output)?,
    })
}
