//! `pglease-bench`: the benchmark driver behind `bench/run.sh`. It starts `pglease serve`
//! daemons itself (release binary, `--listen 127.0.0.1:0`), runs the scenarios of the
//! benchmark issue against them, writes one JSON report and prints readable tables.
//! Progress goes to stderr, the tables to stdout.
//!
//! It judges no figure: targets are printed beside the figures. The exit status is 0
//! when every scenario ran, 1 when the harness failed somewhere (the report says where),
//! and 2 when scenario 2 or 14 saw a database leased twice or missing. On SIGINT/SIGTERM it
//! stops every daemon it started before exiting.
//!
//! The scenarios, numbered as in the benchmark issue (`--only N,…`):
//! 1. warm lease latency;
//! 2. end-to-end test throughput;
//! 3. the create+drop ceiling on the same postgres;
//! 4. start-up;
//! 5. connection cost;
//! 6. the seeds' workloads (10,000 autocommit INSERTs, pgbench TPC-B) on a lease, on
//!    stock postgres on disk (with an fsync-delay shim standing for slower disks) and on
//!    hand-tuned tmpfs postgres;
//! 7. the pool's scale;
//! 8. an IntegreSQL client's suite with many templates and never-returned databases,
//!    against pglease and (`PGLEASE_BENCH_INTEGRESQL_URL`) an IntegreSQL server;
//! 9. PostgreSQL majors side by side: clone, drop and the end-to-end loop per major;
//! 10. a template from a dump: pg_restore -j 1 vs -j N by hand, pglease's build, clones;
//! 11. a cold CI runner: first lease after building the template vs from a snapshot;
//! 12. half the tests read only: --reuse-unchanged off vs on.
//! 13. copy-on-write storage on PostgreSQL 18: tmpfs vs --storage cow;
//! 14. the PostgreSQL front (`--front-listen`) against the HTTP way: round trips,
//!     connect, the fixture's suite, idle connections.

mod admin;
mod api;
mod cluster;
mod cpu;
mod daemon;
mod error;
mod machine;
mod outcome;
mod plan;
mod report;
mod scenarios;
mod shim;
mod stats;
mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use crate::daemon::{Daemon, Launcher, ServerInfo};
use crate::error::{BenchError, Result};
use crate::machine::MachineInfo;
use crate::outcome::Outcome;
use crate::plan::Plan;
use crate::report::{FixtureInfo, Fraction, Report, Scenarios};
use crate::scenarios::{
    ceiling, connect, cow, dumps, front, integresql, latency, majors, reuse, scale, seeds,
    snapshots, startup, throughput, Ctx, FIXTURE,
};

/// Benchmarks of pglease: lease latency, test throughput against the create+drop
/// ceiling, start-up, connection cost, the seeds' workloads against stock and hand-tuned
/// postgres, pool scale.
#[derive(Debug, Parser)]
#[command(name = "pglease-bench", version)]
struct Cli {
    /// Small and fast (under two minutes on 2 cores); the default is the full run.
    #[arg(long)]
    quick: bool,
    /// The pglease binary to measure.
    #[arg(long, default_value = "target/release/pglease", value_name = "PATH")]
    pglease: PathBuf,
    /// The fixture template's migrations.
    #[arg(long, default_value = "bench/fixtures/migrations", value_name = "DIR")]
    fixture: PathBuf,
    /// Where the JSON report goes.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Working directory: the shared initdb cache, scratch space, daemon logs.
    #[arg(long, default_value = "target/pglease-bench", value_name = "DIR")]
    work_dir: PathBuf,
    /// Where daemon logs go [default: WORK_DIR/logs].
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Append every daemon pid and instance directory here (for a shell exit trap).
    #[arg(long, value_name = "FILE")]
    pid_file: Option<PathBuf>,
    /// Run only these scenarios (comma-separated numbers: 1 to 14).
    #[arg(long, value_delimiter = ',', value_name = "N,…")]
    only: Vec<u8>,
    /// An argument for every `pglease serve` started (repeatable), e.g.
    /// `--daemon-arg=--clone-concurrency=4`.
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    daemon_args: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pglease-bench: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        tokio::select! {
            code = run(cli) => code,
            signal = interrupted() => {
                // Dropping `run` dropped its daemons, which stopped them.
                eprintln!("pglease-bench: {signal}; stopped everything it had started");
                ExitCode::from(130)
            }
        }
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "interrupted (SIGINT)",
        _ = term.recv() => "terminated (SIGTERM)",
    }
}

/// A scenario left out with `--only`.
fn not_run<T>() -> Outcome<T> {
    Outcome::skipped("not selected (--only)")
}

/// A scenario that could not run.
fn failed<T>(message: &str) -> Outcome<T> {
    Outcome::Failed {
        error: message.to_string(),
    }
}

/// Turns a scenario's result into its outcome, logging failures.
fn outcome<T>(name: &str, result: Result<T>) -> Outcome<T> {
    match result {
        Ok(value) => Outcome::Done(value),
        Err(error) => {
            eprintln!("[bench] scenario {name} failed: {error}");
            Outcome::Failed {
                error: error.to_string(),
            }
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    let started = Instant::now();
    let plan = if cli.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    let ctx = match context(&cli, plan.clone()) {
        Ok(ctx) => ctx,
        Err(error) => {
            eprintln!("pglease-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let wanted = |n: u8| cli.only.is_empty() || cli.only.contains(&n);
    let repo = std::env::current_dir().unwrap_or_default();
    let mut machine = MachineInfo::collect(&repo, &ctx.launcher.binary);
    eprintln!(
        "[bench] {} mode; logs in {}",
        plan.mode,
        ctx.launcher.log_dir.display()
    );

    let mut fixture = not_run();
    let mut postgres_settings = serde_json::Map::new();
    let (mut s2, mut s3, mut s5) = (not_run(), not_run(), not_run());
    if wanted(2) || wanted(3) || wanted(5) {
        match shared_daemon(&ctx).await {
            Ok((daemon, server)) => {
                machine.postgres_version = server.version.clone();
                postgres_settings = server.settings.clone();
                let shared = shared_scenarios(&ctx, &daemon, &server, &wanted).await;
                (fixture, s2, s3, s5) = shared;
                if let Err(error) = daemon.stop().await {
                    eprintln!("[bench] {error}");
                }
            }
            Err(error) => {
                eprintln!("[bench] the shared daemon did not start: {error}");
                let message = format!("the shared daemon did not start: {error}");
                (fixture, s2, s3, s5) = (
                    failed(&message),
                    failed(&message),
                    failed(&message),
                    failed(&message),
                );
            }
        }
    }
    let s1 = if wanted(1) {
        outcome("1", latency::run(&ctx).await)
    } else {
        not_run()
    };
    let s4 = if wanted(4) {
        outcome("4", startup::run(&ctx).await)
    } else {
        not_run()
    };
    let s6 = if wanted(6) {
        match ctx.pgbench.as_deref() {
            Some(pgbench) => outcome("6", seeds::run(&ctx, pgbench).await),
            None => Outcome::skipped(
                "pgbench not found (PGLEASE_PG_BIN_DIR, /usr/lib/postgresql/*/bin, PATH)",
            ),
        }
    } else {
        not_run()
    };
    let s7 = if wanted(7) {
        outcome("7", scale::run(&ctx).await)
    } else {
        not_run()
    };
    let s8 = if wanted(8) {
        match integresql::run(&ctx).await {
            Ok(Ok(result)) => Outcome::Done(result),
            Ok(Err(reason)) => Outcome::skipped(reason),
            Err(error) => outcome("8", Err(error)),
        }
    } else {
        not_run()
    };
    let s9 = if wanted(9) {
        outcome("9", majors::run(&ctx).await)
    } else {
        not_run()
    };
    let s10 = if wanted(10) {
        outcome("10", dumps::run(&ctx).await)
    } else {
        not_run()
    };
    let s11 = if wanted(11) {
        outcome("11", snapshots::run(&ctx).await)
    } else {
        not_run()
    };
    let s12 = if wanted(12) {
        outcome("12", reuse::run(&ctx).await)
    } else {
        not_run()
    };
    let s13 = if wanted(13) {
        outcome("13", cow::run(&ctx).await)
    } else {
        not_run()
    };
    let s14 = if wanted(14) {
        outcome("14", front::run(&ctx).await)
    } else {
        not_run()
    };
    let _ = std::fs::remove_dir_all(&ctx.scratch_dir);

    if machine.postgres_version.is_empty() {
        machine.postgres_version = ctx.launcher.postgres_version();
    }
    let throughput_vs_ceiling = fractions(&s2, &s3);
    let isolation_ok = s2
        .done()
        .is_none_or(|r| r.double_leases == 0 && r.missing_databases == 0)
        && s14.done().is_none_or(|r| r.isolation_failures() == 0);
    let harness_failed = [
        matches!(fixture, Outcome::Failed { .. }),
        matches!(s1, Outcome::Failed { .. }),
        matches!(s2, Outcome::Failed { .. }),
        matches!(s3, Outcome::Failed { .. }),
        matches!(s4, Outcome::Failed { .. }),
        matches!(s5, Outcome::Failed { .. }),
        matches!(s6, Outcome::Failed { .. }),
        // A target of scenario 6 that failed is a harness failure too.
        s6.done()
            .is_some_and(|r| r.targets.iter().any(|t| !t.errors.is_empty())),
        matches!(s7, Outcome::Failed { .. }),
        matches!(s8, Outcome::Failed { .. }),
        matches!(s10, Outcome::Failed { .. }),
        matches!(s11, Outcome::Failed { .. }),
        matches!(s12, Outcome::Failed { .. }),
        s12.done().is_some_and(|r| r.dirty_handouts > 0),
        matches!(s13, Outcome::Failed { .. }),
        matches!(s14, Outcome::Failed { .. }),
        // So is a part of 14 that did not run.
        s14.done().is_some_and(|r| r.harness_failed()),
        // So is a major that did not run.
        s9.done()
            .is_some_and(|r| r.majors.iter().any(|m| m.outcome.is_err())),
    ]
    .into_iter()
    .any(|failed| failed);
    let report = Report {
        mode: plan.mode,
        machine,
        plan,
        postgres_settings,
        fixture,
        scenarios: Scenarios {
            warm_lease_latency: s1,
            end_to_end_throughput: s2,
            physical_limit: s3,
            throughput_vs_ceiling,
            startup: s4,
            connection_cost: s5,
            seed_workloads: s6,
            pool_scale: s7,
            integresql_suite: s8,
            majors: s9,
            dumps: s10,
            snapshots: s11,
            reuse: s12,
            cow: s13,
            front: s14,
        },
        isolation_ok,
        total_secs: stats::round3(started.elapsed().as_secs_f64()),
    };
    if let Some(path) = &cli.out {
        if let Err(error) = write_json(path, &report) {
            eprintln!("pglease-bench: {error}");
            return ExitCode::FAILURE;
        }
        eprintln!("[bench] report written to {}", path.display());
    }
    print!("{}", report.render());
    if !isolation_ok {
        eprintln!("pglease-bench: ISOLATION FAILURE: a database was leased twice or went missing");
        ExitCode::from(2)
    } else if harness_failed {
        eprintln!("pglease-bench: some scenarios failed (harness errors, see the report)");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Builds the context: absolute paths, the launcher, what the binary supports.
fn context(cli: &Cli, plan: Plan) -> Result<Ctx> {
    let absolute = |path: &Path| -> Result<PathBuf> {
        std::path::absolute(path)
            .map_err(|e| BenchError::io(format!("cannot resolve {}", path.display()), e))
    };
    let binary = absolute(&cli.pglease)?;
    if !binary.is_file() {
        return Err(BenchError::Other(format!(
            "{} not found: build it with `cargo build --release` (bench/run.sh does)",
            binary.display()
        )));
    }
    let fixture_dir = absolute(&cli.fixture)?;
    if !fixture_dir.is_dir() {
        return Err(BenchError::Other(format!(
            "fixture directory {} not found",
            fixture_dir.display()
        )));
    }
    let work_dir = absolute(&cli.work_dir)?;
    let cache_dir = work_dir.join("initdb-cache");
    let scratch_dir = work_dir.join(format!("scratch-{}", std::process::id()));
    for dir in [&cache_dir, &scratch_dir] {
        std::fs::create_dir_all(dir)
            .map_err(|e| BenchError::io(format!("cannot create {}", dir.display()), e))?;
    }
    let log_dir = match &cli.log_dir {
        Some(dir) => absolute(dir)?,
        None => work_dir.join("logs"),
    };
    let help = std::process::Command::new(&binary)
        .args(["serve", "--help"])
        .output()
        .map_err(|e| BenchError::io(format!("cannot run {} serve --help", binary.display()), e))?;
    let has_lease_auth = String::from_utf8_lossy(&help.stdout).contains("--lease-auth");
    let mut launcher = Launcher::new(binary, log_dir, cli.pid_file.clone())?;
    launcher.extra_args = cli.daemon_args.clone();
    Ok(Ctx {
        plan,
        launcher,
        fixture_dir,
        work_dir,
        cache_dir,
        scratch_dir,
        has_lease_auth,
        pgbench: find_pgbench(),
    })
}

/// pgbench beside the postgres pglease would pick: `PGLEASE_PG_BIN_DIR`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `PATH`.
fn find_pgbench() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PGLEASE_PG_BIN_DIR") {
        let candidate = PathBuf::from(dir).join("pgbench");
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let candidate = entry.path().join("bin/pgbench");
            candidate.is_file().then_some((major, candidate))
        })
        .collect();
    versions.sort();
    if let Some((_, path)) = versions.pop() {
        return Some(path);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("pgbench"))
            .find(|candidate| candidate.is_file())
    })
}

/// The daemon shared by scenarios 2, 3 and 5: the fixture prebuilt, default pool
/// settings except `--max-total 64` (32 workers hold 32 leases and the pool still needs
/// room to refill).
async fn shared_daemon(ctx: &Ctx) -> Result<(Daemon, ServerInfo)> {
    let mut args = ctx.fixture_args();
    args.extend(scenarios::strings(&["--prebuild", "--max-total", "64"]));
    args.extend(ctx.cache_args());
    let daemon = ctx.launcher.start("shared", &args).await?;
    let server = daemon.server_info().await?;
    Ok((daemon, server))
}

type SharedOutcomes = (
    Outcome<FixtureInfo>,
    Outcome<throughput::ThroughputResult>,
    Outcome<ceiling::CeilingResult>,
    Outcome<connect::ConnectResult>,
);

/// The fixture's description, then scenarios 2, 3, 5 on the shared daemon.
async fn shared_scenarios(
    ctx: &Ctx,
    daemon: &Daemon,
    server: &ServerInfo,
    wanted: &dyn Fn(u8) -> bool,
) -> SharedOutcomes {
    let admin_conn = match admin::superuser(server, "postgres").await {
        Ok(conn) => conn,
        Err(error) => {
            let message = error.to_string();
            return (
                failed(&message),
                failed(&message),
                failed(&message),
                failed(&message),
            );
        }
    };
    let fixture = outcome("fixture", fixture_info(ctx, daemon).await);
    let s2 = if wanted(2) {
        outcome("2", throughput::run(ctx, daemon, &admin_conn.client).await)
    } else {
        not_run()
    };
    let s3 = if wanted(3) {
        let fingerprint = match daemon.api() {
            Ok(api) => api.status().await.ok().and_then(|s| {
                crate::api::template(&s, FIXTURE).and_then(|t| t.fingerprint.clone())
            }),
            Err(_) => None,
        };
        match fingerprint {
            Some(fp) => outcome(
                "3",
                ceiling::run(ctx, daemon, server, &admin_conn.client, &fp).await,
            ),
            None => Outcome::Failed {
                error: "the fixture template has no fingerprint in /status".into(),
            },
        }
    } else {
        not_run()
    };
    let s5 = if wanted(5) {
        outcome(
            "5",
            connect::run(ctx, daemon, server, &admin_conn.client).await,
        )
    } else {
        not_run()
    };
    admin_conn.close().await;
    (fixture, s2, s3, s5)
}

/// Leases the fixture once and describes it.
async fn fixture_info(ctx: &Ctx, daemon: &Daemon) -> Result<FixtureInfo> {
    let api = daemon.api()?;
    let lease = api.lease(FIXTURE, scenarios::WAIT_MS).await?;
    let described = async {
        let conn = admin::connect_url(&lease.url).await?;
        let row = conn
            .client
            .query_one(
                "SELECT \
                   (SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'bench_marker'), \
                   (SELECT count(*) FROM pg_indexes WHERE schemaname = 'public' AND tablename <> 'bench_marker'), \
                   (SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND connamespace = 'public'::regnamespace), \
                   (SELECT sum((xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM %I', tablename), false, true, '')))[1]::text::bigint)::bigint \
                      FROM pg_tables WHERE schemaname = 'public'), \
                   pg_database_size(current_database())",
                &[],
            )
            .await
            .map_err(|e| BenchError::postgres("describing the fixture", e));
        conn.close().await;
        row
    }
    .await;
    api.release(&lease.id, false).await?;
    let row = described?;
    Ok(FixtureInfo {
        migrations: ctx.fixture_dir.display().to_string(),
        tables: row.get(0),
        indexes: row.get(1),
        foreign_keys: row.get(2),
        rows: row.get(3),
        lease_database_bytes: row.get(4),
    })
}

/// Scenario 2's settled throughput over scenario 3's ceiling, per concurrency.
fn fractions(
    s2: &Outcome<throughput::ThroughputResult>,
    s3: &Outcome<ceiling::CeilingResult>,
) -> Vec<Fraction> {
    let (Some(s2), Some(s3)) = (s2.done(), s3.done()) else {
        return Vec::new();
    };
    s2.levels
        .iter()
        .filter_map(|level| {
            let ceiling = s3.levels.iter().find(|c| c.workers == level.workers)?;
            (ceiling.cycles_per_sec > 0.0).then(|| Fraction {
                workers: level.workers,
                pglease_tests_per_sec: level.tests_per_sec_settled,
                ceiling_cycles_per_sec: ceiling.cycles_per_sec,
                fraction: stats::round3(level.tests_per_sec_settled / ceiling.cycles_per_sec),
                target: 0.9,
            })
        })
        .collect()
}

fn write_json(path: &Path, report: &Report) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| BenchError::io(format!("cannot create {}", parent.display()), e))?;
    }
    let json = serde_json::to_string_pretty(report)
        .map_err(|e| BenchError::Other(format!("cannot serialize the report: {e}")))?;
    std::fs::write(path, json + "\n")
        .map_err(|e| BenchError::io(format!("cannot write {}", path.display()), e))
}
