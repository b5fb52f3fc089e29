//! Scenario 7, the scale of the pool:
//! - **queue**: 256 clients at once on a pool of 8 (`--max-total 8`), each doing lease →
//!   release rounds, once recycling (`reuse=true`: the queue hand-off alone) and once
//!   dropping (`reuse=false`: every lease waits for a clone);
//! - **memory**: the daemon's RSS (VmRSS of the process the benchmark spawned, not
//!   postgres) idle and with N leases open (`--max-total N --min-ready 0
//!   --clone-concurrency 2`, the `default` template);
//! - **clone size**: time of one `CREATE DATABASE … STRATEGY FILE_COPY` (and its drop)
//!   against templates of growing size, made with `pgbench -i -s N` on the daemon's own
//!   postgres (the fixture template is the smallest point).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::{strings, Ctx, FIXTURE, IDLE_LIMIT, WAIT_MS};
use crate::admin::{self, quote_ident};
use crate::api::Api;
use crate::daemon::{Memory, ServerInfo};
use crate::error::{BenchError, Result};
use crate::stats::{per_second, round3, Summary};

/// Concurrent lease requests while opening the leases for the memory figure.
const RSS_OPENERS: usize = 16;

/// Scenario 7's figures.
#[derive(Debug, Serialize)]
pub struct ScaleResult {
    /// The 256-clients-on-8 runs.
    pub queue: QueueResult,
    /// Daemon memory with many leases open.
    pub memory: MemoryResult,
    /// Clone time against template size (empty when skipped).
    pub clone_size: CloneSizeResult,
}

/// Many clients on a small pool.
#[derive(Debug, Serialize)]
pub struct QueueResult {
    /// Flags of the daemon.
    pub daemon_args: Vec<String>,
    /// Concurrent clients.
    pub clients: usize,
    /// One entry per release mode.
    pub runs: Vec<QueueRun>,
}

/// One release mode.
#[derive(Debug, Serialize)]
pub struct QueueRun {
    /// `reuse` or `drop`.
    pub release: &'static str,
    /// Rounds per client.
    pub rounds: usize,
    /// Leases granted.
    pub leases: usize,
    /// Wall time, seconds.
    pub elapsed_secs: f64,
    /// Leases per second.
    pub leases_per_sec: f64,
    /// Failed calls.
    pub errors: usize,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// `POST /lease` as each waiting client saw it, ms.
    pub lease: Summary,
}

/// RSS with many open leases.
#[derive(Debug, Serialize)]
pub struct MemoryResult {
    /// Flags of the daemon.
    pub daemon_args: Vec<String>,
    /// Leases open when measured.
    pub open_leases: usize,
    /// Seconds to open them (each waited for its clone; `default` template).
    pub open_secs: f64,
    /// Clones per second while opening them.
    pub clones_per_sec: f64,
    /// Idle, after start.
    pub idle: Memory,
    /// With the leases open.
    pub loaded: Memory,
    /// The target for `loaded.rss_kib` with 1,000 leases, KiB.
    pub target_rss_kib: u64,
}

/// Clone time against template size.
#[derive(Debug, Serialize)]
pub struct CloneSizeResult {
    /// Why some or all sizes were skipped, if they were.
    pub skipped: Option<String>,
    /// One entry per template.
    pub points: Vec<ClonePoint>,
}

/// One template size.
#[derive(Debug, Serialize)]
pub struct ClonePoint {
    /// What the template is.
    pub template: String,
    /// `pg_database_size`, bytes.
    pub bytes: i64,
    /// `pgbench -i` time, seconds (none for the fixture).
    pub build_secs: Option<f64>,
    /// CREATE DATABASE … STRATEGY FILE_COPY, ms.
    pub create: Summary,
    /// DROP DATABASE … WITH (FORCE), ms.
    pub drop: Summary,
}

/// Runs scenario 7.
pub async fn run(ctx: &Ctx) -> Result<ScaleResult> {
    let (queue, clone_size) = queue_and_sizes(ctx).await?;
    let memory = memory(ctx).await?;
    Ok(ScaleResult {
        queue,
        memory,
        clone_size,
    })
}

/// The queue runs, then the clone sizes on the same (idle) daemon.
async fn queue_and_sizes(ctx: &Ctx) -> Result<(QueueResult, CloneSizeResult)> {
    let pool = ctx.plan.scale_pool;
    let mut daemon_args = ctx.fixture_args();
    daemon_args.extend(strings(&["--prebuild", "--min-ready", "4", "--max-total"]));
    daemon_args.push(pool.to_string());
    let mut args = daemon_args.clone();
    args.extend(ctx.cache_args());
    let daemon = ctx.launcher.start("scale-queue", &args).await?;
    let server = daemon.server_info().await?;
    let admin_conn = admin::superuser(&server, "postgres").await?;
    let api = daemon.api()?.clone();
    let mut runs = Vec::new();
    for (release, reuse, rounds) in [
        ("reuse", true, ctx.plan.scale_reuse_rounds),
        ("drop", false, ctx.plan.scale_drop_rounds),
    ] {
        admin::wait_idle(&api, &admin_conn.client, FIXTURE, 1, IDLE_LIMIT).await?;
        eprintln!(
            "[bench] 7 scale: {} clients on a pool of {pool}, release {release}",
            ctx.plan.scale_clients
        );
        runs.push(queue_run(&api, ctx.plan.scale_clients, release, reuse, rounds).await);
    }
    admin::wait_idle(&api, &admin_conn.client, FIXTURE, 1, IDLE_LIMIT).await?;
    let fingerprint = crate::api::template(&api.status().await?, FIXTURE)
        .and_then(|t| t.fingerprint.clone())
        .unwrap_or_default();
    let sizes = clone_sizes(ctx, &server, &admin_conn.client, &fingerprint).await;
    admin_conn.close().await;
    daemon.stop().await?;
    Ok((
        QueueResult {
            daemon_args,
            clients: ctx.plan.scale_clients,
            runs,
        },
        sizes,
    ))
}

async fn queue_run(
    api: &Api,
    clients: usize,
    release: &'static str,
    reuse: bool,
    rounds: usize,
) -> QueueRun {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let api = api.clone();
        tasks.spawn(async move {
            let mut samples = Vec::new();
            let mut errors = Vec::new();
            for _ in 0..rounds {
                let t0 = Instant::now();
                match api.lease(FIXTURE, WAIT_MS).await {
                    Ok(lease) => {
                        samples.push(t0.elapsed());
                        if let Err(error) = api.release(&lease.id, reuse).await {
                            errors.push(error.to_string());
                        }
                    }
                    Err(error) => errors.push(error.to_string()),
                }
            }
            (samples, errors)
        });
    }
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((s, e)) => {
                samples.extend(s);
                errors.extend(e);
            }
            Err(error) => errors.push(format!("client panicked: {error}")),
        }
    }
    let elapsed = started.elapsed();
    QueueRun {
        release,
        rounds,
        leases: samples.len(),
        elapsed_secs: round3(elapsed.as_secs_f64()),
        leases_per_sec: per_second(samples.len(), elapsed),
        errors: errors.len(),
        first_error: errors.into_iter().next(),
        lease: Summary::of(&samples),
    }
}

/// RSS idle and with `plan.rss_leases` leases open.
async fn memory(ctx: &Ctx) -> Result<MemoryResult> {
    let leases = ctx.plan.rss_leases;
    let mut daemon_args = vec!["--max-total".to_string(), leases.to_string()];
    // One connection per lease: with the default 10, postgres' max_connections (capped at
    // 5,000) leaves room for ~500 open leases, and the rest would queue for connections.
    daemon_args.extend(strings(&[
        "--min-ready",
        "0",
        "--clone-concurrency",
        "2",
        "--lease-connections",
        "1",
    ]));
    let mut args = daemon_args.clone();
    args.extend(ctx.cache_args());
    let daemon = ctx.launcher.start("scale-memory", &args).await?;
    let server = daemon.server_info().await?;
    let admin_conn = admin::superuser(&server, "postgres").await?;
    let api = daemon.api()?.clone();
    admin::wait_idle(&api, &admin_conn.client, "default", 0, IDLE_LIMIT).await?;
    admin_conn.close().await;
    let idle = daemon.memory()?;
    eprintln!("[bench] 7 scale: opening {leases} leases (default template)");
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for opener in 0..RSS_OPENERS {
        let api = api.clone();
        let count = leases / RSS_OPENERS + usize::from(opener < leases % RSS_OPENERS);
        tasks.spawn(async move {
            let mut opened = 0usize;
            for _ in 0..count {
                api.lease("default", WAIT_MS).await?;
                opened += 1;
            }
            Ok::<usize, BenchError>(opened)
        });
    }
    let mut opened = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(n)) => opened += n,
            Ok(Err(error)) => return Err(error),
            Err(error) => return Err(BenchError::Other(format!("opener panicked: {error}"))),
        }
    }
    let open_time = started.elapsed();
    let loaded = daemon.memory()?;
    // Stopping the daemon removes the whole cluster; no need to release one by one.
    daemon.stop().await?;
    Ok(MemoryResult {
        daemon_args,
        open_leases: opened,
        open_secs: round3(open_time.as_secs_f64()),
        clones_per_sec: per_second(opened, open_time),
        idle,
        loaded,
        target_rss_kib: 30 * 1024,
    })
}

/// Clone and drop times against the fixture and pgbench templates of each scale.
async fn clone_sizes(
    ctx: &Ctx,
    server: &ServerInfo,
    admin_conn: &tokio_postgres::Client,
    fingerprint: &str,
) -> CloneSizeResult {
    let mut points = Vec::new();
    let mut skipped = None;
    let reps = ctx.plan.clone_size_reps;
    eprintln!("[bench] 7 scale: clone time of the fixture template");
    let status = match admin::template_database(admin_conn, fingerprint).await {
        Ok(fixture) => time_clones(admin_conn, &fixture, "fixture", None, reps).await,
        Err(error) => Err(error),
    };
    match status {
        Ok(point) => points.push(point),
        Err(error) => skipped = Some(format!("fixture: {error}")),
    }
    let Some(pgbench) = ctx.pgbench.as_deref() else {
        return CloneSizeResult {
            skipped: Some("pgbench not found: pgbench templates skipped".into()),
            points,
        };
    };
    for &scale in &ctx.plan.clone_size_scales {
        eprintln!("[bench] 7 scale: pgbench -i -s {scale} template, then clones");
        match pgbench_point(pgbench, server, admin_conn, scale, reps).await {
            Ok(point) => points.push(point),
            Err(error) => {
                skipped = Some(format!("pgbench scale {scale}: {error}"));
                break;
            }
        }
    }
    CloneSizeResult { skipped, points }
}

async fn pgbench_point(
    pgbench: &Path,
    server: &ServerInfo,
    admin_conn: &tokio_postgres::Client,
    scale: u32,
    reps: usize,
) -> Result<ClonePoint> {
    let db = format!("bench_size_s{scale}");
    let quoted = quote_ident(&db);
    admin::execute_each(
        admin_conn,
        &[
            format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"),
            format!("CREATE DATABASE {quoted}"),
        ],
        &format!("creating {db}"),
    )
    .await?;
    let started = Instant::now();
    let output = tokio::process::Command::new(pgbench)
        .args([
            "-i",
            "-q",
            "-s",
            &scale.to_string(),
            "-U",
            admin::SUPERUSER,
            "-h",
        ])
        .arg(&server.socket_dir)
        .args(["-p", &server.port.to_string(), &db])
        .output()
        .await
        .map_err(|e| BenchError::io(format!("cannot run {}", pgbench.display()), e))?;
    let build_secs = round3(started.elapsed().as_secs_f64());
    let point = if output.status.success() {
        time_clones(
            admin_conn,
            &db,
            &format!("pgbench -s {scale}"),
            Some(build_secs),
            reps,
        )
        .await
    } else {
        Err(BenchError::Other(format!(
            "pgbench -i failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    };
    let _ = admin_conn
        .batch_execute(&format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
        .await;
    point
}

/// `reps` times: CREATE DATABASE from `template` (FILE_COPY), then DROP it.
async fn time_clones(
    admin_conn: &tokio_postgres::Client,
    template: &str,
    label: &str,
    build_secs: Option<f64>,
    reps: usize,
) -> Result<ClonePoint> {
    let bytes: i64 = admin_conn
        .query_one("SELECT pg_database_size($1)", &[&template])
        .await
        .map_err(|e| BenchError::postgres(format!("sizing {template}"), e))?
        .get(0);
    let clone = quote_ident("bench_size_clone");
    let mut create = Vec::new();
    let mut drop = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        admin_conn
            .batch_execute(&format!(
                "CREATE DATABASE {clone} TEMPLATE {} STRATEGY FILE_COPY",
                quote_ident(template)
            ))
            .await
            .map_err(|e| BenchError::postgres(format!("cloning {template}"), e))?;
        create.push(t0.elapsed());
        let t1 = Instant::now();
        admin_conn
            .batch_execute(&format!("DROP DATABASE IF EXISTS {clone} WITH (FORCE)"))
            .await
            .map_err(|e| BenchError::postgres("dropping the clone", e))?;
        drop.push(t1.elapsed());
    }
    Ok(ClonePoint {
        template: label.to_string(),
        bytes,
        build_secs,
        create: Summary::of(&create),
        drop: Summary::of(&drop),
    })
}
