//! Scenario 3, the physical limit: on the same postgres and the same template database
//! as scenario 2, a raw loop of `CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY` and
//! `DROP DATABASE … WITH (FORCE)` (the statements pglease itself runs), at the same
//! concurrencies, over superuser connections on the daemon's unix socket. No pglease in
//! the loop. It runs while the daemon's pool is idle — no lease open, its refill done,
//! no drop pending — so the daemon's own work does not compete; the daemon only keeps
//! its few ready clones.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{throughput, Ctx, FIXTURE, IDLE_LIMIT};
use crate::admin::{self, quote_ident};
use crate::cpu::{ByProcess, CpuClock, CpuUse};
use crate::daemon::{Daemon, ServerInfo};
use crate::error::{BenchError, Result};
use crate::stats::{per_second, round3, Summary};

/// Scenario 3's figures.
#[derive(Debug, Serialize)]
pub struct CeilingResult {
    /// The template database cloned.
    pub template_database: String,
    /// Its size, bytes.
    pub template_bytes: i64,
    /// How the daemon was kept out of the way.
    pub method: &'static str,
    /// The statements of one cycle.
    pub cycle: String,
    /// One entry per concurrency.
    pub levels: Vec<CeilingLevel>,
    /// The same loop with scenario 2's test work between CREATE and DROP (connect as the
    /// superuser, the same transaction, disconnect): the ceiling for tests that do that work,
    /// which is what pglease's end-to-end figure includes.
    pub levels_with_work: Vec<CeilingLevel>,
}

/// One concurrency level.
#[derive(Debug, Serialize)]
pub struct CeilingLevel {
    /// Concurrent connections, each looping create → drop.
    pub workers: usize,
    /// Cycles completed.
    pub cycles: usize,
    /// Wall time, seconds.
    pub elapsed_secs: f64,
    /// Create+drop cycles per second: the most tests per second any pool can recycle.
    pub cycles_per_sec: f64,
    /// Failed statements.
    pub errors: usize,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// CREATE DATABASE, ms.
    pub create: Summary,
    /// DROP DATABASE, ms.
    pub drop: Summary,
    /// With the work: the superuser's connection to the clone just made (unix socket,
    /// trust), ms — what a lease's connection (TCP, its own authentication, while the pool
    /// clones and drops beside it) is compared with.
    pub connect: Option<Summary>,
    /// Machine CPU use over the loop.
    pub cpu: Option<CpuUse>,
    /// Busy CPU per cycle, ms.
    pub cpu_ms_per_cycle: Option<f64>,
    /// The same by party (postgres, the idle daemon, this driver, the rest).
    pub cpu_by_process_per_cycle: Option<ByProcess>,
}

/// Runs scenario 3 against the shared daemon's postgres.
pub async fn run(
    ctx: &Ctx,
    daemon: &Daemon,
    server: &ServerInfo,
    admin_conn: &tokio_postgres::Client,
    fingerprint: &str,
) -> Result<CeilingResult> {
    let template = admin::template_database(admin_conn, fingerprint).await?;
    let template_bytes: i64 = admin_conn
        .query_one("SELECT pg_database_size($1)", &[&template])
        .await
        .map_err(|e| BenchError::postgres("sizing the template", e))?
        .get(0);
    let api = daemon.api()?;
    let mut levels = Vec::new();
    for &workers in &ctx.plan.throughput_workers {
        admin::wait_idle(api, admin_conn, FIXTURE, 1, IDLE_LIMIT).await?;
        eprintln!("[bench] 3 create+drop ceiling: {workers} connections");
        levels.push(
            level(
                server,
                &template,
                workers,
                ctx.plan.ceiling_duration,
                false,
                STRATEGY,
            )
            .await?,
        );
    }
    let mut levels_with_work = Vec::new();
    for &workers in &ctx.plan.throughput_workers {
        admin::wait_idle(api, admin_conn, FIXTURE, 1, IDLE_LIMIT).await?;
        eprintln!("[bench] 3 create+work+drop ceiling: {workers} connections");
        levels_with_work.push(
            level(
                server,
                &template,
                workers,
                ctx.plan.ceiling_duration,
                true,
                STRATEGY,
            )
            .await?,
        );
    }
    Ok(CeilingResult {
        cycle: format!(
            "CREATE DATABASE x TEMPLATE {template} STRATEGY FILE_COPY; DROP DATABASE IF EXISTS x WITH (FORCE)"
        ),
        template_database: template,
        template_bytes,
        method: "same daemon and postgres as scenario 2, run after it while the pool is idle (no leases, refill finished, no drops pending)",
        levels,
        levels_with_work,
    })
}

/// Scenario 2's transaction on a fresh clone, as the superuser over the socket: connect,
/// the same transaction (`throughput::work`), disconnect. Returns how long the connect took.
async fn test_work(server: &ServerInfo, database: &str, customer: i32) -> Result<Duration> {
    let started = Instant::now();
    let conn = admin::superuser(server, database).await?;
    let connected = started.elapsed();
    let worked = throughput::work(&conn.client, "raw", customer).await;
    conn.close().await;
    match worked? {
        None => Ok(connected),
        Some(other) => Err(BenchError::Other(format!(
            "a fresh clone already had the marker {other:?}"
        ))),
    }
}

#[derive(Default)]
struct Samples {
    create: Vec<Duration>,
    drop: Vec<Duration>,
    connect: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

/// The clause pglease adds to CREATE DATABASE (on postgres 15 and later).
const STRATEGY: &str = " STRATEGY FILE_COPY";

/// `workers` connections looping CREATE DATABASE (with `strategy` appended) and DROP
/// DATABASE for `duration`, with scenario 2's work between them when `with_work`.
pub(crate) async fn level(
    server: &ServerInfo,
    template: &str,
    workers: usize,
    duration: Duration,
    with_work: bool,
    strategy: &'static str,
) -> Result<CeilingLevel> {
    // Connections are made before the clock starts: the ceiling is of the SQL alone.
    let mut conns = Vec::new();
    for _ in 0..workers {
        conns.push(admin::superuser(server, "postgres").await?);
    }
    let cpu = CpuClock::watching(server.daemon_pid);
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (index, conn) in conns.into_iter().enumerate() {
        let template = quote_ident(template);
        let server = server.clone();
        tasks.spawn(async move {
            let mut samples = Samples::default();
            let mut cycle = 0usize;
            while Instant::now() < deadline && samples.errors < 20 {
                cycle += 1;
                let db = quote_ident(&format!("bench_raw_{workers}_{index}_{cycle}"));
                let t0 = Instant::now();
                let created = conn
                    .client
                    .batch_execute(&format!(
                        "CREATE DATABASE {db} TEMPLATE {template}{strategy}"
                    ))
                    .await;
                if let Err(error) = created {
                    samples.errors += 1;
                    samples
                        .first_error
                        .get_or_insert(format!("CREATE DATABASE: {error}"));
                    continue;
                }
                let create_time = t0.elapsed();
                // A cycle whose work failed is dropped but not counted: the ceiling is of
                // cycles that did what they claim.
                let mut worked = true;
                let mut connected = None;
                if with_work {
                    let name = format!("bench_raw_{workers}_{index}_{cycle}");
                    match test_work(&server, &name, index as i32 + 1).await {
                        Ok(took) => connected = Some(took),
                        Err(error) => {
                            worked = false;
                            samples.errors += 1;
                            samples
                                .first_error
                                .get_or_insert(format!("test work: {error}"));
                        }
                    }
                }
                let t1 = Instant::now();
                let dropped = conn
                    .client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                    .await;
                match dropped {
                    Ok(()) if worked => {
                        samples.create.push(create_time);
                        samples.drop.push(t1.elapsed());
                        samples.connect.extend(connected);
                    }
                    Ok(()) => {}
                    Err(error) => {
                        samples.errors += 1;
                        samples
                            .first_error
                            .get_or_insert(format!("DROP DATABASE: {error}"));
                    }
                }
            }
            // Closed after the CPU is read: its backend's time then stays with the
            // server's running processes, not with the backends that exited.
            (samples, conn)
        });
    }
    let mut all = Samples::default();
    let mut open = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((samples, conn)) => {
                open.push(conn);
                all.create.extend(samples.create);
                all.drop.extend(samples.drop);
                all.connect.extend(samples.connect);
                all.errors += samples.errors;
                all.first_error = all.first_error.or(samples.first_error);
            }
            Err(error) => {
                all.errors += 1;
                all.first_error
                    .get_or_insert(format!("worker panicked: {error}"));
            }
        }
    }
    let elapsed = started.elapsed();
    let cpu = cpu.since();
    for conn in open {
        conn.close().await;
    }
    Ok(CeilingLevel {
        workers,
        cycles: all.drop.len(),
        elapsed_secs: round3(elapsed.as_secs_f64()),
        cycles_per_sec: per_second(all.drop.len(), elapsed),
        errors: all.errors,
        first_error: all.first_error,
        create: Summary::of(&all.create),
        drop: Summary::of(&all.drop),
        connect: with_work.then(|| Summary::of(&all.connect)),
        cpu,
        cpu_ms_per_cycle: cpu.and_then(|c| c.ms_per(all.drop.len())),
        cpu_by_process_per_cycle: cpu.and_then(|c| c.by_process_per(all.drop.len())),
    })
}
