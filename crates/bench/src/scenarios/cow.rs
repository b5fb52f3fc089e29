//! Scenario 13, copy-on-write storage: PostgreSQL 18 on tmpfs (`--storage tmpfs`, every
//! clone copies) against the copy-on-write store (`--storage cow`, `file_copy_method =
//! clone`), side by side in one run:
//! - clone and drop time of templates of growing size (a table of about the plan's MB),
//!   raw `CREATE DATABASE … STRATEGY FILE_COPY` and `DROP DATABASE` on the superuser's
//!   connection, with the ratio of each size's clone to the smallest's (the target:
//!   a 1 GB template within 2× of an empty one on the store);
//! - the store's bytes taken by 16 live clones of the largest template up to 1 GB, over the
//!   template's own size (target ≤ 1.2; on tmpfs it is 16 by construction);
//! - a lease loop on each template up to 1 GB, on a warm pool (one worker; each test
//!   creates a table and reads a row of the big one): where the store starts to pay, the
//!   line `--storage auto` draws;
//! - scenario 2's end-to-end loop of the fixture at 1 and 8 workers on both (target: within
//!   5%).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::throughput::{self, ThroughputLevel};
use super::{strings, Ctx, FIXTURE, IDLE_LIMIT};
use crate::admin;
use crate::daemon::{Daemon, ServerInfo};
use crate::error::{BenchError, Result};
use crate::outcome::{not_done, Outcome};
use crate::stats::{round3, Summary};
use crate::table::{num, Table};

/// The stores compared, in order: the baseline first.
const STORES: [&str; 2] = ["tmpfs", "cow"];
/// End-to-end workers.
const WORKERS: [usize; 2] = [1, 8];
/// Live clones whose store bytes are counted.
const LIVE_CLONES: usize = 16;
/// The largest template the live clones are made of.
const LIVE_MAX_MB: u64 = 1024;
/// How long the sized templates may take to build.
const BUILD_LIMIT: Duration = Duration::from_secs(900);
/// Bytes a row of the sized table takes, about (measured: 10 MB for 62,500 rows).
const ROW_BYTES: u64 = 168;

/// Scenario 13's figures.
#[derive(Debug, Serialize)]
pub struct CowResult {
    /// One entry per template size.
    pub sizes: Vec<SizeRow>,
    /// The live clones on the store.
    pub live: Option<LiveClones>,
    /// The end-to-end loop on both stores.
    pub end_to_end: Vec<EndToEnd>,
}

/// One template size on both stores.
#[derive(Debug, Serialize)]
pub struct SizeRow {
    /// The size asked for, MB.
    pub target_mb: u64,
    /// The template's `pg_database_size`, on tmpfs then on the store.
    pub template_bytes: Vec<i64>,
    /// Each store's times, in [`STORES`] order.
    pub stores: Vec<StoreTimes>,
}

/// Clone and drop of one template on one store.
#[derive(Debug, Serialize)]
pub struct StoreTimes {
    /// The store.
    pub store: &'static str,
    /// The first clone after the build, ms.
    pub first_clone_ms: f64,
    /// The clones after it, ms.
    pub clone: Summary,
    /// The drops, ms.
    pub drop: Summary,
    /// p50 clone over the smallest template's on the same store.
    pub clone_over_smallest: Option<f64>,
    /// Tests per second of a loop on this template (sizes up to 1 GB): lease, connect,
    /// create a table and read a row of the big one, release (dropped and made again).
    pub loop_tests_per_sec: Option<f64>,
}

/// Live clones on the copy-on-write store.
#[derive(Debug, Serialize)]
pub struct LiveClones {
    /// Clones made.
    pub clones: usize,
    /// The template's size, MB asked.
    pub template_mb: u64,
    /// Its `pg_database_size`.
    pub template_bytes: i64,
    /// What the store's used bytes grew by while they were made.
    pub store_grown_bytes: u64,
    /// `(template_bytes + store_grown_bytes) / template_bytes`: the template and its clones
    /// over the template alone.
    pub ratio: f64,
}

/// The end-to-end loop at one worker count on both stores.
#[derive(Debug, Serialize)]
pub struct EndToEnd {
    /// Workers.
    pub workers: usize,
    /// On tmpfs.
    pub tmpfs: ThroughputLevel,
    /// On the store.
    pub cow: ThroughputLevel,
    /// cow ÷ tmpfs tests/s.
    pub ratio: f64,
}

/// Runs scenario 13.
pub async fn run(ctx: &Ctx) -> Result<CowResult> {
    let sql_dir = ctx.scratch_dir.join("cow-templates");
    std::fs::create_dir_all(&sql_dir)
        .map_err(|e| BenchError::io(format!("cannot create {}", sql_dir.display()), e))?;
    let mut template_args = Vec::new();
    let mut loop_args = Vec::new();
    for &mb in &ctx.plan.cow_template_mb {
        let file = sql_dir.join(format!("size{mb}.sql"));
        let rows = mb * 1024 * 1024 / ROW_BYTES;
        std::fs::write(
            &file,
            format!(
                "CREATE TABLE big AS SELECT g AS id, md5(g::text) AS note, repeat('x', 100) AS pad \
                 FROM generate_series(1, {rows}) g;"
            ),
        )
        .map_err(|e| BenchError::io(format!("cannot write {}", file.display()), e))?;
        let arg = [
            "--template".to_owned(),
            format!("size{mb}=sql:{}", file.display()),
        ];
        if mb <= LIVE_MAX_MB {
            loop_args.extend(arg.iter().cloned());
        }
        template_args.extend(arg);
    }
    let mut per_store: Vec<Vec<(i64, StoreTimes)>> = Vec::new();
    let mut live = None;
    for store in STORES {
        let args = sized_args(store, "0", &template_args);
        eprintln!(
            "[bench] 13 {store}: building templates of {:?} MB",
            ctx.plan.cow_template_mb
        );
        let daemon = ctx
            .launcher
            .start(&format!("cow-sizes-{store}"), &args)
            .await?;
        let figures = sizes_on(ctx, &daemon, store).await;
        let figures = match figures {
            Ok((times, live_here)) => {
                if store == "cow" {
                    live = live_here;
                }
                Ok(times)
            }
            Err(error) => Err(error),
        };
        daemon.stop().await?;
        per_store.push(figures?);
    }
    // Each store's clone p50 of the smallest template, the ratios' base.
    let smallest: Vec<f64> = per_store
        .iter()
        .map(|rows| rows.first().map_or(0.0, |row| row.1.clone.p50_ms))
        .collect();
    let mut sizes: Vec<SizeRow> = ctx
        .plan
        .cow_template_mb
        .iter()
        .map(|&target_mb| SizeRow {
            target_mb,
            template_bytes: Vec::new(),
            stores: Vec::new(),
        })
        .collect();
    for (rows, base) in per_store.into_iter().zip(smallest) {
        for (row, (bytes, mut times)) in sizes.iter_mut().zip(rows) {
            times.clone_over_smallest =
                (base > 0.0 && times.clone.p50_ms > 0.0).then(|| round3(times.clone.p50_ms / base));
            row.template_bytes.push(bytes);
            row.stores.push(times);
        }
    }
    let loop_sizes: Vec<u64> = ctx
        .plan
        .cow_template_mb
        .iter()
        .copied()
        .filter(|&mb| mb <= LIVE_MAX_MB)
        .collect();
    for (store_index, store) in STORES.into_iter().enumerate() {
        let figures = size_loops(ctx, store, &loop_args, &loop_sizes).await?;
        for (row, tests_per_sec) in sizes.iter_mut().zip(figures) {
            if let Some(times) = row.stores.get_mut(store_index) {
                times.loop_tests_per_sec = Some(tests_per_sec);
            }
        }
    }
    let end_to_end = end_to_end(ctx).await?;
    Ok(CowResult {
        sizes,
        live,
        end_to_end,
    })
}

/// A daemon of PostgreSQL 18 on `store` with the sized templates built at start.
fn sized_args(store: &str, min_ready: &str, template_args: &[String]) -> Vec<String> {
    let mut args = strings(&[
        "--storage",
        store,
        "--postgres-version",
        "18",
        "--prebuild",
        "--min-ready",
        min_ready,
    ]);
    args.extend(template_args.iter().cloned());
    args
}

/// Each size's template size and clone/drop times on `daemon`'s server, and on the store the
/// live clones.
async fn sizes_on(
    ctx: &Ctx,
    daemon: &Daemon,
    store: &'static str,
) -> Result<(Vec<(i64, StoreTimes)>, Option<LiveClones>)> {
    let server = daemon.server_info().await?;
    let admin_conn = admin::superuser(&server, "postgres").await?;
    let status = built(daemon, &ctx.plan.cow_template_mb).await?;
    let mut rows = Vec::new();
    let mut live = None;
    for &mb in &ctx.plan.cow_template_mb {
        let name = format!("size{mb}");
        let fingerprint = crate::api::template(&status, &name)
            .and_then(|t| t.fingerprint.clone())
            .ok_or_else(|| BenchError::Other(format!("template {name} was not built")))?;
        let template = admin::template_database(&admin_conn.client, &fingerprint).await?;
        let bytes: i64 = admin_conn
            .client
            .query_one("SELECT pg_database_size($1)", &[&template])
            .await
            .map_err(|e| BenchError::postgres("sizing a template", e))?
            .get(0);
        eprintln!(
            "[bench] 13 {store}: clone and drop of {name} ({} MB)",
            bytes / 1_048_576
        );
        let times = clone_drop(
            &admin_conn.client,
            &template,
            store,
            ctx.plan.cow_clone_reps,
        )
        .await?;
        rows.push((bytes, times));
        let largest_live = ctx
            .plan
            .cow_template_mb
            .iter()
            .copied()
            .filter(|&m| m <= LIVE_MAX_MB)
            .max();
        if store == "cow" && Some(mb) == largest_live {
            eprintln!("[bench] 13 cow: {LIVE_CLONES} live clones of {name}");
            live = Some(live_clones(&server, &admin_conn.client, &template, mb, bytes).await?);
        }
    }
    admin_conn.close().await;
    Ok((rows, live))
}

/// Waits until every sized template is built (a 4 GB one takes a minute or more).
async fn built(daemon: &Daemon, sizes: &[u64]) -> Result<pglease_api::wire::StatusResponse> {
    let started = Instant::now();
    loop {
        let status = daemon.api()?.status().await?;
        let pending: Vec<String> = sizes
            .iter()
            .map(|mb| format!("size{mb}"))
            .filter(|name| {
                crate::api::template(&status, name)
                    .is_none_or(|t| t.fingerprint.is_none() || t.state != "ready")
            })
            .collect();
        if pending.is_empty() {
            return Ok(status);
        }
        if let Some(error) = pending
            .iter()
            .find_map(|name| crate::api::template(&status, name).and_then(|t| t.last_error.clone()))
        {
            return Err(BenchError::Other(format!(
                "a sized template failed: {error}"
            )));
        }
        if started.elapsed() > BUILD_LIMIT {
            return Err(BenchError::Other(format!(
                "templates {pending:?} were not built within {}s",
                BUILD_LIMIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `reps` clone+drop cycles of `template`: the first clone apart.
async fn clone_drop(
    admin: &tokio_postgres::Client,
    template: &str,
    store: &'static str,
    reps: usize,
) -> Result<StoreTimes> {
    let mut clones = Vec::new();
    let mut drops = Vec::new();
    let mut first = None;
    for rep in 0..=reps {
        let started = Instant::now();
        admin
            .batch_execute(&format!(
                "CREATE DATABASE bench_cow_x TEMPLATE \"{template}\" STRATEGY FILE_COPY"
            ))
            .await
            .map_err(|e| BenchError::postgres("cloning", e))?;
        let cloned = started.elapsed();
        let started = Instant::now();
        admin
            .batch_execute("DROP DATABASE bench_cow_x")
            .await
            .map_err(|e| BenchError::postgres("dropping", e))?;
        drops.push(started.elapsed());
        if rep == 0 {
            first = Some(cloned);
        } else {
            clones.push(cloned);
        }
    }
    Ok(StoreTimes {
        store,
        first_clone_ms: first.map_or(0.0, |d| round3(d.as_secs_f64() * 1e3)),
        clone: Summary::of(&clones),
        drop: Summary::of(&drops),
        clone_over_smallest: None,
        loop_tests_per_sec: None,
    })
}

/// [`lease_loop`] on each of `sizes` (the first ones of the plan) on a warm pool of `store`:
/// a daemon with two ready clones of each, refilled in the background as in real use.
async fn size_loops(
    ctx: &Ctx,
    store: &'static str,
    template_args: &[String],
    sizes: &[u64],
) -> Result<Vec<f64>> {
    let mut args = sized_args(store, "2", template_args);
    args.push("--no-reuse-unchanged".to_owned());
    eprintln!("[bench] 13 {store}: building templates of {sizes:?} MB for the loops");
    let daemon = ctx
        .launcher
        .start(&format!("cow-loops-{store}"), &args)
        .await?;
    let figures = async {
        built(&daemon, sizes).await?;
        let server = daemon.server_info().await?;
        let admin_conn = admin::superuser(&server, "postgres").await?;
        let mut figures = Vec::new();
        for &mb in sizes {
            let name = format!("size{mb}");
            admin::wait_idle(daemon.api()?, &admin_conn.client, &name, 2, BUILD_LIMIT).await?;
            eprintln!("[bench] 13 {store}: a lease loop on {name}");
            figures.push(lease_loop(&daemon, &name, ctx.plan.cow_duration).await?);
        }
        admin_conn.close().await;
        Ok(figures)
    }
    .await;
    daemon.stop().await?;
    figures
}

/// One worker's tests per second on `template` for `duration` (at least three tests): each
/// leases, connects, creates a table, reads a row of `big`, and releases (the clone is
/// dropped and made again). What a test that touches little of a big template pays.
async fn lease_loop(daemon: &Daemon, template: &str, duration: Duration) -> Result<f64> {
    let api = daemon.api()?;
    let started = Instant::now();
    let mut tests = 0u32;
    while tests < 3 || started.elapsed() < duration {
        let lease = api.lease(template, super::WAIT_MS).await?;
        let conn = admin::connect_url(&lease.url).await?;
        conn.client
            .batch_execute(
                "CREATE TABLE t (i int); INSERT INTO t VALUES (1); SELECT id FROM big LIMIT 1",
            )
            .await
            .map_err(|e| BenchError::postgres("a test's work", e))?;
        conn.close().await;
        api.release(&lease.id, false).await?;
        tests += 1;
    }
    Ok(round3(f64::from(tests) / started.elapsed().as_secs_f64()))
}

/// Bytes in use on the file system holding `path`.
fn used_bytes(path: &Path) -> Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)
        .map_err(|e| BenchError::Other(format!("statvfs {}: {e}", path.display())))?;
    Ok((stat.blocks() - stat.blocks_free()) * stat.fragment_size())
}

/// The store's mount point: `cow/` in the instance directory, beside the socket's.
fn store_of(server: &ServerInfo) -> PathBuf {
    server
        .socket_dir
        .parent()
        .map_or_else(PathBuf::new, |instance| instance.join("cow"))
}

/// Makes [`LIVE_CLONES`] clones of `template`, reads what the store grew by, drops them.
async fn live_clones(
    server: &ServerInfo,
    admin: &tokio_postgres::Client,
    template: &str,
    template_mb: u64,
    template_bytes: i64,
) -> Result<LiveClones> {
    let store = store_of(server);
    admin
        .batch_execute("CHECKPOINT")
        .await
        .map_err(|e| BenchError::postgres("checkpoint", e))?;
    let before = used_bytes(&store)?;
    for i in 0..LIVE_CLONES {
        admin
            .batch_execute(&format!(
                "CREATE DATABASE bench_cow_live_{i} TEMPLATE \"{template}\" STRATEGY FILE_COPY"
            ))
            .await
            .map_err(|e| BenchError::postgres("cloning", e))?;
    }
    admin
        .batch_execute("CHECKPOINT")
        .await
        .map_err(|e| BenchError::postgres("checkpoint", e))?;
    // XFS reports blocks it has handed out; give delayed allocation a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = used_bytes(&store)?.saturating_sub(before);
    for i in 0..LIVE_CLONES {
        admin
            .batch_execute(&format!("DROP DATABASE bench_cow_live_{i}"))
            .await
            .map_err(|e| BenchError::postgres("dropping", e))?;
    }
    Ok(LiveClones {
        clones: LIVE_CLONES,
        template_mb,
        template_bytes,
        store_grown_bytes: grown,
        ratio: if template_bytes > 0 {
            round3((template_bytes as f64 + grown as f64) / template_bytes as f64)
        } else {
            0.0
        },
    })
}

/// Scenario 2's loop of the fixture at each worker count, tmpfs then the store.
async fn end_to_end(ctx: &Ctx) -> Result<Vec<EndToEnd>> {
    let mut daemons = Vec::new();
    for store in STORES {
        let mut args = ctx.fixture_args();
        args.extend(strings(&[
            "--storage",
            store,
            "--postgres-version",
            "18",
            "--prebuild",
            "--no-reuse-unchanged",
        ]));
        let daemon = ctx
            .launcher
            .start(&format!("cow-loop-{store}"), &args)
            .await?;
        let server = daemon.server_info().await?;
        let admin_conn = admin::superuser(&server, "postgres").await?;
        daemons.push((daemon, admin_conn));
    }
    let mut rows = Vec::new();
    for &workers in &WORKERS {
        let mut levels = Vec::new();
        for (i, (daemon, _)) in daemons.iter().enumerate() {
            for (other, other_conn) in &daemons {
                admin::wait_idle(other.api()?, &other_conn.client, FIXTURE, 1, IDLE_LIMIT).await?;
            }
            eprintln!("[bench] 13 end to end on {}: {workers} workers", STORES[i]);
            levels.push(throughput::level(daemon.api()?, workers, ctx.plan.cow_duration).await);
        }
        let cow = levels.pop().expect("two stores");
        let tmpfs = levels.pop().expect("two stores");
        let ratio = if tmpfs.tests_per_sec > 0.0 {
            round3(cow.tests_per_sec / tmpfs.tests_per_sec)
        } else {
            0.0
        };
        rows.push(EndToEnd {
            workers,
            tmpfs,
            cow,
            ratio,
        });
    }
    for (daemon, admin_conn) in daemons {
        admin_conn.close().await;
        daemon.stop().await?;
    }
    Ok(rows)
}

/// Scenario 13's tables.
pub(crate) fn render(outcome: &Outcome<CowResult>, out: &mut String) {
    out.push_str("\n13. Copy-on-write storage on PostgreSQL 18: tmpfs (copies) vs --storage cow (file_copy_method = clone)\n");
    if not_done(outcome, out) {
        return;
    }
    let Some(r) = outcome.done() else { return };
    let mut t = Table::new(&[
        "template",
        "MB",
        "store",
        "first clone ms",
        "clone p50 ms",
        "drop p50 ms",
        "clone ÷ smallest",
        "loop tests/s",
    ]);
    for row in &r.sizes {
        for (times, bytes) in row.stores.iter().zip(&row.template_bytes) {
            t.row(vec![
                format!("{} MB", row.target_mb),
                num(*bytes as f64 / 1_048_576.0),
                times.store.to_owned(),
                num(times.first_clone_ms),
                num(times.clone.p50_ms),
                num(times.drop.p50_ms),
                times.clone_over_smallest.map_or("-".into(), num),
                times.loop_tests_per_sec.map_or("-".into(), num),
            ]);
        }
    }
    t.render(out);
    out.push_str("  target: on the store, a 1 GB template's clone within 2× of the smallest's\n");
    out.push_str("  loop: 1 worker, warm pool (2 ready); lease, connect, create a table, read a row, release (drop and clone again)\n");
    for row in &r.sizes {
        if let [tmpfs, cow] = row.stores.as_slice() {
            if let (Some(t), Some(c)) = (tmpfs.loop_tests_per_sec, cow.loop_tests_per_sec) {
                if t > 0.0 {
                    out.push_str(&format!(
                        "  {} MB template: loop cow ÷ tmpfs {}\n",
                        row.target_mb,
                        num(round3(c / t))
                    ));
                }
            }
        }
    }
    if let Some(live) = &r.live {
        out.push_str(&format!(
            "  {} live clones of the {} MB template ({:.1} MB) grew the store by {:.1} MB: template and clones {} × the template (target ≤ 1.2; copies: {})\n",
            live.clones,
            live.template_mb,
            live.template_bytes as f64 / 1_048_576.0,
            live.store_grown_bytes as f64 / 1_048_576.0,
            num(live.ratio),
            live.clones + 1,
        ));
    }
    let mut t = Table::new(&["workers", "tmpfs tests/s", "cow tests/s", "cow ÷ tmpfs"]);
    for row in &r.end_to_end {
        t.row(vec![
            row.workers.to_string(),
            num(row.tmpfs.tests_per_sec),
            num(row.cow.tests_per_sec),
            num(row.ratio),
        ]);
    }
    out.push_str("  the fixture's end-to-end loop (scenario 2), target: cow within 5% of tmpfs\n");
    t.render(out);
}
