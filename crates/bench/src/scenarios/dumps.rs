//! Scenario 10, a template from a dump: a dataset of four like-sized tables — pgbench's
//! accounts (`pgbench -i -s N/4`) and three copies with their primary keys, about 15 MB per
//! unit of N in all — made on a daemon's tuned tmpfs server and dumped with `pg_dump -Fc`
//! (several large tables, as a production dump has: pg_restore -j runs whole entries in
//! parallel, so one dominant table would leave nothing to parallelize), then
//! - restored by hand with `pg_restore -j 1` and `-j <cores>` into empty databases of the
//!   same server (the baseline: what the team did by hand, on a tuned server);
//! - built by pglease as a `dump` template on a fresh daemon (its `build_ms`: the restore
//!   and sealing the template);
//! - cloned (`CREATE DATABASE … STRATEGY FILE_COPY` of the built template, one connection).
//!
//! Ratios are over figures of the same run: `-j N` against `-j 1`, pglease's build against
//! the hand-run `-j N`, and the clone's MB/s is the template's size over its p50 clone time.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ceiling::{self, CeilingLevel};
use super::{strings, Ctx, IDLE_LIMIT};
use crate::admin::{self, SUPERUSER};
use crate::daemon::ServerInfo;
use crate::error::{BenchError, Result};
use crate::outcome::{not_done, Outcome};
use crate::stats::round3;
use crate::table::{num, Table};

/// Scenario 10's figures.
#[derive(Debug, Serialize)]
pub struct DumpsResult {
    /// The dataset's size in pgbench scale units (four tables of a quarter each).
    pub scale: u32,
    /// The dataset's database size, MB.
    pub dataset_mb: f64,
    /// The custom-format dump's size, MB.
    pub dump_mb: f64,
    /// Parallel jobs of the `-j N` restores (the cores).
    pub jobs: usize,
    /// Hand-run `pg_restore -j 1`, seconds.
    pub restore_j1_secs: f64,
    /// Hand-run `pg_restore -j N`, seconds.
    pub restore_jn_secs: f64,
    /// `-j 1` over `-j N` (target ≥ 1.6 on 2 cores).
    pub parallel_speedup: f64,
    /// pglease's build of the `dump` template (its `build_ms`), seconds.
    pub pglease_build_secs: f64,
    /// The hand-run `-j N` again, on pglease's server right after its build, seconds.
    pub restore_jn_same_server_secs: f64,
    /// pglease's build over that hand-run `-j N` (target ≤ 1.1).
    pub build_vs_hand: f64,
    /// Of the build: the ANALYZE, CHECKPOINT and VACUUM (FREEZE) after the restore (from the
    /// daemon's log), seconds.
    pub settle_secs: f64,
    /// The build without that step over the hand-run `-j N`.
    pub restore_vs_hand: f64,
    /// The built template's size, MB.
    pub template_mb: f64,
    /// Clone and drop of the built template, one connection.
    pub clone: CeilingLevel,
    /// Template MB over the p50 clone time.
    pub clone_mb_per_sec: f64,
    /// The first full scan of the largest table on a fresh clone of pglease's template
    /// (checkpointed, frozen and analyzed after the restore), ms.
    pub first_scan_settled_ms: f64,
    /// The same on a clone of the hand-run restore (rows without hint bits), ms.
    pub first_scan_hand_ms: f64,
    /// The second scan of that clone of the hand-run restore (hint bits set by the first), ms.
    pub second_scan_hand_ms: f64,
}

/// Runs scenario 10.
pub async fn run(ctx: &Ctx) -> Result<DumpsResult> {
    let scale = ctx.plan.dump_pgbench_scale;
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dir = ctx.scratch_dir.join("dumps");
    std::fs::create_dir_all(&dir).map_err(|e| BenchError::io("creating the dump dir", e))?;
    let dump = dir.join("pgbench.dump");

    eprintln!("[bench] 10 making a pgbench dataset of scale {scale} and dumping it");
    let daemon = ctx
        .launcher
        .start("dumps-source", &strings(&["--min-ready", "0"]))
        .await?;
    let figures = async {
        let server = daemon.server_info().await?;
        let admin_conn = admin::superuser(&server, "postgres").await?;
        let sql = |text: String| {
            let client = &admin_conn.client;
            async move {
                client
                    .batch_execute(&text)
                    .await
                    .map_err(|e| BenchError::postgres("scenario 10 SQL", e))
            }
        };
        sql("CREATE DATABASE bench_dump_src".into()).await?;
        let part = (scale / 4).max(1).to_string();
        tool(
            &server,
            "pgbench",
            &["-i", "-q", "-s", &part, "bench_dump_src"],
        )
        .await?;
        let src = admin::superuser(&server, "bench_dump_src").await?;
        for n in 2..=4 {
            src.client
                .batch_execute(&format!(
                    "CREATE TABLE accounts_{n} AS SELECT * FROM pgbench_accounts; \
                     ALTER TABLE accounts_{n} ADD PRIMARY KEY (aid)"
                ))
                .await
                .map_err(|e| BenchError::postgres("copying pgbench_accounts", e))?;
        }
        src.close().await;
        let dataset_mb = db_mb(&admin_conn.client, "bench_dump_src").await?;
        let path = dump.display().to_string();
        tool(&server, "pg_dump", &["-Fc", "-f", &path, "bench_dump_src"]).await?;
        let dump_mb = file_mb(&dump)?;

        eprintln!("[bench] 10 pg_restore -j 1 and -j {jobs} by hand");
        let mut timed = Vec::new();
        for (db, j) in [("bench_restore_j1", 1), ("bench_restore_jn", jobs)] {
            sql(format!("CREATE DATABASE {db}")).await?;
            let started = Instant::now();
            restore(&server, &dump, db, j).await?;
            timed.push(started.elapsed().as_secs_f64());
        }
        admin_conn.close().await;
        Ok::<_, BenchError>((dataset_mb, dump_mb, timed[0], timed[1]))
    }
    .await;
    daemon.stop().await?;
    let (dataset_mb, dump_mb, restore_j1_secs, restore_jn_secs) = figures?;

    eprintln!("[bench] 10 pglease builds the dump template");
    let args = vec![
        "--template".to_owned(),
        format!("big=dump:{}", dump.display()),
        "--prebuild".to_owned(),
        "--min-ready".to_owned(),
        "0".to_owned(),
    ];
    let daemon = ctx.launcher.start("dumps-build", &args).await?;
    let build_log = daemon.log_path.clone();
    let built = async {
        let server = daemon.server_info().await?;
        let api = daemon.api()?.clone();
        let deadline = Instant::now() + IDLE_LIMIT.max(Duration::from_secs(3600));
        let template = loop {
            let status = api.status().await?;
            let big = status
                .templates
                .into_iter()
                .find(|t| t.name == "big")
                .ok_or_else(|| BenchError::Other("no template big".into()))?;
            match big.state.as_ref() {
                "ready" => break big,
                "failed" => {
                    return Err(BenchError::Other(format!(
                        "the dump template failed: {}",
                        big.last_error.clone().unwrap_or_default()
                    )))
                }
                _ if Instant::now() > deadline => {
                    return Err(BenchError::Other(
                        "the dump template was not built in time".into(),
                    ))
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let build_secs = template.build_ms.unwrap_or_default() as f64 / 1000.0;
        let template_mb = template.size_bytes.unwrap_or_default() as f64 / 1e6;
        let admin_conn = admin::superuser(&server, "postgres").await?;
        let fingerprint = template
            .fingerprint
            .clone()
            .ok_or_else(|| BenchError::Other("the dump template has no fingerprint".into()))?;
        let template_db = admin::template_database(&admin_conn.client, &fingerprint).await?;
        // The hand-run -j N again, on this very server right after pglease's build: the
        // ratio of the two is then free of the drift between two servers' runs.
        admin_conn
            .client
            .batch_execute("CREATE DATABASE bench_restore_again")
            .await
            .map_err(|e| BenchError::postgres("scenario 10 SQL", e))?;
        admin_conn.close().await;
        let started = Instant::now();
        restore(&server, &dump, "bench_restore_again", jobs).await?;
        let hand_again = started.elapsed().as_secs_f64();
        eprintln!("[bench] 10 the first scan of a clone: pglease's template vs the hand restore");
        let scans = first_scans(&server, &template_db).await?;
        eprintln!("[bench] 10 cloning the {template_mb:.0} MB template");
        let clone = ceiling::level(
            &server,
            &template_db,
            1,
            ctx.plan.dump_clone_duration,
            false,
            " STRATEGY FILE_COPY",
        )
        .await?;
        Ok::<_, BenchError>((build_secs, template_mb, clone, hand_again, scans))
    }
    .await;
    daemon.stop().await?;
    let (pglease_build_secs, template_mb, clone, restore_jn_same_server_secs, scans) = built?;
    let ratio = |a: f64, b: f64| if b > 0.0 { round3(a / b) } else { 0.0 };
    let settle_secs = settle_secs(&build_log);
    Ok(DumpsResult {
        scale,
        dataset_mb: round3(dataset_mb),
        dump_mb: round3(dump_mb),
        jobs,
        restore_j1_secs: round3(restore_j1_secs),
        restore_jn_secs: round3(restore_jn_secs),
        parallel_speedup: ratio(restore_j1_secs, restore_jn_secs),
        pglease_build_secs: round3(pglease_build_secs),
        restore_jn_same_server_secs: round3(restore_jn_same_server_secs),
        build_vs_hand: ratio(pglease_build_secs, restore_jn_same_server_secs),
        settle_secs: round3(settle_secs),
        restore_vs_hand: ratio(
            pglease_build_secs - settle_secs,
            restore_jn_same_server_secs,
        ),
        template_mb: round3(template_mb),
        clone_mb_per_sec: ratio(template_mb, clone.create.p50_ms / 1000.0),
        clone,
        first_scan_settled_ms: round3(scans.0),
        first_scan_hand_ms: round3(scans.1),
        second_scan_hand_ms: round3(scans.2),
    })
}

/// The `elapsed_ms` of the daemon's "froze and analyzed the template" lines, the longest
/// (the dump template's; `default` is settled too), in seconds (0 when absent).
fn settle_secs(log: &Path) -> f64 {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("froze and analyzed the template"))
        .filter_map(|l| l.split("elapsed_ms=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|ms| ms.parse::<f64>().ok())
        .fold(0.0, f64::max)
        / 1000.0
}

/// Clones pglease's template and the hand-run restore `bench_restore_again`, then scans
/// `accounts_2` in full on each: (first scan of pglease's, first scan of the hand one's,
/// second scan of the hand one's), ms.
async fn first_scans(server: &ServerInfo, template_db: &str) -> Result<(f64, f64, f64)> {
    let admin_conn = admin::superuser(server, "postgres").await?;
    for (clone, template) in [
        ("bench_scan_settled", template_db),
        ("bench_scan_hand", "bench_restore_again"),
    ] {
        admin_conn
            .client
            .batch_execute(&format!(
                "CREATE DATABASE {clone} TEMPLATE \"{template}\" STRATEGY FILE_COPY"
            ))
            .await
            .map_err(|e| BenchError::postgres("cloning for the scan", e))?;
    }
    admin_conn.close().await;
    let mut times = Vec::new();
    for (clone, scans) in [("bench_scan_settled", 1), ("bench_scan_hand", 2)] {
        let conn = admin::superuser(server, clone).await?;
        for _ in 0..scans {
            let started = Instant::now();
            conn.client
                .query_one("SELECT count(*) FROM accounts_2", &[])
                .await
                .map_err(|e| BenchError::postgres("scanning accounts_2", e))?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        conn.close().await;
    }
    Ok((times[0], times[1], times[2]))
}

/// `pg_restore -j jobs` of `dump` into the empty database `db`, by hand: what pglease runs
/// but its --verbose.
async fn restore(server: &ServerInfo, dump: &Path, db: &str, jobs: usize) -> Result<()> {
    let (jobs, path) = (jobs.to_string(), dump.display().to_string());
    let args = [
        "--no-owner",
        "--no-privileges",
        "--exit-on-error",
        "-j",
        &jobs,
        "-d",
        db,
        &path,
    ];
    tool(server, "pg_restore", &args).await
}

/// Runs a PostgreSQL client tool against the daemon's server as the superuser, over its
/// private socket.
async fn tool(server: &ServerInfo, program: &str, args: &[&str]) -> Result<()> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .env("PGHOST", &server.socket_dir)
        .env("PGPORT", server.port.to_string())
        .env("PGUSER", SUPERUSER)
        .output()
        .await
        .map_err(|e| BenchError::io(format!("running {program}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BenchError::Other(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

async fn db_mb(client: &tokio_postgres::Client, db: &str) -> Result<f64> {
    let row = client
        .query_one("SELECT pg_database_size($1)", &[&db])
        .await
        .map_err(|e| BenchError::postgres("pg_database_size", e))?;
    Ok(row.get::<_, i64>(0) as f64 / 1e6)
}

fn file_mb(path: &Path) -> Result<f64> {
    let meta = std::fs::metadata(path).map_err(|e| BenchError::io("the dump's size", e))?;
    Ok(meta.len() as f64 / 1e6)
}

/// Scenario 10's table.
pub(crate) fn render(outcome: &Outcome<DumpsResult>, out: &mut String) {
    out.push_str("\n10. A template from a dump: four pgbench-sized tables, pg_restore by hand vs pglease's build, then clones\n");
    if not_done(outcome, out) {
        return;
    }
    let Some(r) = outcome.done() else { return };
    let mut t = Table::new(&["figure", "value", "target"]);
    let row = |t: &mut Table, figure: &str, value: String, target: &str| {
        t.row(vec![figure.into(), value, target.into()]);
    };
    row(
        &mut t,
        "scale (4 tables of a quarter)",
        r.scale.to_string(),
        "",
    );
    row(&mut t, "dataset MB", num(r.dataset_mb), "");
    row(&mut t, "dump MB (-Fc)", num(r.dump_mb), "");
    row(&mut t, "pg_restore -j 1 s", num(r.restore_j1_secs), "");
    row(
        &mut t,
        &format!("pg_restore -j {} s", r.jobs),
        num(r.restore_jn_secs),
        "",
    );
    row(
        &mut t,
        "speed-up -j N over -j 1 ×",
        num(r.parallel_speedup),
        "≥ 1.6 on 2 cores",
    );
    row(&mut t, "pglease build s", num(r.pglease_build_secs), "");
    row(
        &mut t,
        "pg_restore -j N s, same server",
        num(r.restore_jn_same_server_secs),
        "",
    );
    row(
        &mut t,
        "pglease build / hand -j N ×",
        num(r.build_vs_hand),
        "≤ 1.1",
    );
    row(
        &mut t,
        "of the build: ANALYZE + CHECKPOINT + VACUUM (FREEZE) s",
        num(r.settle_secs),
        "",
    );
    row(
        &mut t,
        "build without it / hand -j N ×",
        num(r.restore_vs_hand),
        "",
    );
    row(&mut t, "template MB", num(r.template_mb), "");
    row(&mut t, "clone p50 ms", num(r.clone.create.p50_ms), "");
    row(&mut t, "drop p50 ms", num(r.clone.drop.p50_ms), "");
    row(
        &mut t,
        "clone MB/s",
        num(r.clone_mb_per_sec),
        "near tmpfs copy speed",
    );
    row(
        &mut t,
        "1st scan of a clone, pglease's template ms",
        num(r.first_scan_settled_ms),
        "",
    );
    row(
        &mut t,
        "1st scan of a clone, hand restore ms",
        num(r.first_scan_hand_ms),
        "",
    );
    row(
        &mut t,
        "2nd scan of that clone ms",
        num(r.second_scan_hand_ms),
        "",
    );
    t.render(out);
}
