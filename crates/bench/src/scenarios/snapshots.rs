//! Scenario 11, a cold CI runner: spawning `pglease serve` on a machine with nothing cached
//! (an empty `--cache-dir`: initdb runs) until the first lease of a template, building it
//! from its sources, against the same start from a snapshot (`--snapshot-dir`, which
//! replaces both initdb and the build). A third path, the build with the initdb cache warm,
//! shows what the snapshot saves over a runner that caches only that. A snapshot is used
//! only under the key that sealed it: the snapshot path runs with the first runner's cache
//! root (where its `snapshot.key` is), and a fourth path, a runner with an empty cache root
//! of its own, shares that key through `--snapshot-key-file`, as CI runners do. Both check
//! in the daemon's log that the snapshot was unpacked. The paths alternate run by run, so
//! drift on this shared machine hits them alike.
//!
//! Templates: the fixture (migrations), and in full mode the ~1 GB dump template when
//! scenario 10 ran in the same invocation (its dump is reused).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::startup::first_lease;
use super::{Ctx, FIXTURE};
use crate::error::{BenchError, Result};
use crate::outcome::{not_done, Outcome};
use crate::stats::{round3, Summary};
use crate::table::{num, Table};

/// Scenario 11's figures.
#[derive(Debug, Serialize)]
pub struct SnapshotsResult {
    /// One entry per template.
    pub templates: Vec<SnapshotCase>,
    /// Why a template was left out.
    pub skipped: Vec<String>,
}

/// One template's cold starts.
#[derive(Debug, Serialize)]
pub struct SnapshotCase {
    /// `fixture` or `big` (the dump).
    pub template: String,
    /// The snapshot file's size.
    pub snapshot_mb: f64,
    /// The stop that wrote the snapshot, ms (it drops the clones, stops postgres and
    /// compresses the cluster).
    pub save_stop_ms: f64,
    /// Spawn → first lease, nothing cached: initdb and the build.
    pub cold_build: Summary,
    /// Spawn → first lease with the initdb cache warm: the build only.
    pub warm_build: Summary,
    /// Spawn → first lease from the snapshot, with the cache root that holds its key.
    pub snapshot: Summary,
    /// Spawn → first lease from the snapshot on a runner with an empty cache root of its
    /// own, the key given with `--snapshot-key-file`.
    pub snapshot_shared_key: Summary,
    /// cold_build ÷ snapshot (medians).
    pub cold_vs_snapshot: f64,
    /// cold_build ÷ snapshot_shared_key (medians).
    pub cold_vs_shared_key: f64,
    /// warm_build ÷ snapshot (medians).
    pub warm_vs_snapshot: f64,
    /// The target for cold_vs_snapshot, when it names one.
    pub target: Option<f64>,
}

/// Runs scenario 11.
pub async fn run(ctx: &Ctx) -> Result<SnapshotsResult> {
    let mut templates = Vec::new();
    let mut skipped = Vec::new();
    let runs = ctx.plan.startup_cold_runs.max(2);
    templates.push(case(ctx, FIXTURE, ctx.fixture_args(), runs, Some(5.0)).await?);
    let dump = ctx.scratch_dir.join("dumps").join("pgbench.dump");
    if dump.is_file() {
        let args = vec!["--template".into(), format!("big=dump:{}", dump.display())];
        templates.push(case(ctx, "big", args, 2, None).await?);
    } else {
        skipped.push("big: scenario 10 did not run in this invocation (its dump is reused)".into());
    }
    Ok(SnapshotsResult { templates, skipped })
}

async fn case(
    ctx: &Ctx,
    template: &str,
    template_args: Vec<String>,
    runs: usize,
    target: Option<f64>,
) -> Result<SnapshotCase> {
    let dir = ctx.scratch_dir.join(format!("snapshots-{template}"));
    let snapshots = dir.join("snapshots");
    let warm_cache = dir.join("warm-cache");
    create_dir(&snapshots)?;
    eprintln!("[bench] 11 {template}: the first runner builds and saves a snapshot");
    let mut args = template_args.clone();
    args.extend(flag("--snapshot-dir", &snapshots));
    args.extend(flag("--cache-dir", &warm_cache));
    let daemon = ctx
        .launcher
        .start(&format!("snapshot-save-{template}"), &args)
        .await?;
    first_lease(&daemon, template).await?;
    let save_stop = daemon.stop().await?;
    let snapshot_mb = snapshot_mb(&snapshots)?;

    // The key the first runner made beside its initdb cache, which sealed the snapshot.
    let key_file = warm_cache.join("snapshot.key");
    let (mut cold, mut warm, mut from_snapshot, mut shared_key) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        eprintln!("[bench] 11 {template}: run {} of {runs}", run + 1);
        let empty = dir.join(format!("empty-cache-{run}"));
        cold.push(start(ctx, template, &template_args, &empty, None).await?);
        warm.push(start(ctx, template, &template_args, &warm_cache, None).await?);
        let adopt = Adopt {
            snapshots: &snapshots,
            key_file: None,
        };
        from_snapshot.push(start(ctx, template, &template_args, &warm_cache, Some(adopt)).await?);
        let empty = dir.join(format!("empty-cache-k{run}"));
        let adopt = Adopt {
            snapshots: &snapshots,
            key_file: Some(&key_file),
        };
        shared_key.push(start(ctx, template, &template_args, &empty, Some(adopt)).await?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (cold, warm, from_snapshot, shared_key) = (
        Summary::of(&cold),
        Summary::of(&warm),
        Summary::of(&from_snapshot),
        Summary::of(&shared_key),
    );
    let ratio = |a: f64, b: f64| if b > 0.0 { round3(a / b) } else { 0.0 };
    Ok(SnapshotCase {
        template: template.to_owned(),
        snapshot_mb: round3(snapshot_mb),
        save_stop_ms: round3(save_stop.as_secs_f64() * 1e3),
        cold_vs_snapshot: ratio(cold.p50_ms, from_snapshot.p50_ms),
        cold_vs_shared_key: ratio(cold.p50_ms, shared_key.p50_ms),
        warm_vs_snapshot: ratio(warm.p50_ms, from_snapshot.p50_ms),
        cold_build: cold,
        warm_build: warm,
        snapshot: from_snapshot,
        snapshot_shared_key: shared_key,
        target,
    })
}

/// A start from the snapshot in `snapshots`, with the key in `key_file`
/// (`--snapshot-key-file`), else the one in the cache root.
#[derive(Clone, Copy)]
struct Adopt<'a> {
    snapshots: &'a Path,
    key_file: Option<&'a Path>,
}

/// What the daemon logs when it unpacked a snapshot (`postgres/snapshot.rs`).
const UNPACKED: &str = "unpacked the snapshot";

/// One start with `cache_dir` (created if missing) and, when given, the snapshot to adopt:
/// spawn → first lease of `template`. A start meant to adopt the snapshot that built the
/// template instead (a key that does not prove it) is an error, not a figure.
async fn start(
    ctx: &Ctx,
    template: &str,
    template_args: &[String],
    cache_dir: &Path,
    adopt: Option<Adopt<'_>>,
) -> Result<Duration> {
    create_dir(cache_dir)?;
    let mut args = template_args.to_vec();
    args.extend(flag("--cache-dir", cache_dir));
    if let Some(adopt) = adopt {
        args.extend(flag("--snapshot-dir", adopt.snapshots));
        if let Some(key_file) = adopt.key_file {
            args.extend(flag("--snapshot-key-file", key_file));
        }
    }
    let label = format!(
        "snapshot-{template}-{}",
        match adopt {
            Some(Adopt {
                key_file: Some(_), ..
            }) => "adopt-shared-key",
            Some(_) => "adopt",
            None => "build",
        }
    );
    let daemon = ctx.launcher.start(&label, &args).await?;
    let elapsed = first_lease(&daemon, template).await?;
    let log = std::fs::read_to_string(&daemon.log_path).unwrap_or_default();
    let log_path = daemon.log_path.clone();
    daemon.stop().await?;
    if adopt.is_some() && !log.contains(UNPACKED) {
        return Err(BenchError::Other(format!(
            "{label}: the daemon did not unpack the snapshot (no \"{UNPACKED}\" in {})",
            log_path.display()
        )));
    }
    Ok(elapsed)
}

fn flag(name: &str, path: &Path) -> [String; 2] {
    [name.to_owned(), path.display().to_string()]
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::io(format!("cannot create {}", dir.display()), e))
}

fn snapshot_mb(dir: &Path) -> Result<f64> {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| BenchError::io(format!("cannot read {}", dir.display()), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pgsnap"))
        .collect();
    let [file] = files.as_slice() else {
        return Err(BenchError::Other(format!(
            "expected one snapshot in {}, found {files:?}",
            dir.display()
        )));
    };
    let meta = std::fs::metadata(file)
        .map_err(|e| BenchError::io(format!("cannot stat {}", file.display()), e))?;
    Ok(meta.len() as f64 / 1e6)
}

pub(crate) fn render(outcome: &Outcome<SnapshotsResult>, out: &mut String) {
    out.push_str("\n11. A cold CI runner: spawn → first lease, building the template vs starting from a snapshot\n");
    if not_done(outcome, out) {
        return;
    }
    let Some(r) = outcome.done() else { return };
    let mut t = Table::new(&[
        "template",
        "snapshot MB",
        "save (stop) ms",
        "cold build p50 ms",
        "warm-initdb build p50 ms",
        "snapshot p50 ms",
        "shared-key snapshot p50 ms",
        "cold ÷ snapshot",
        "cold ÷ shared key",
        "warm ÷ snapshot",
        "target",
    ]);
    for c in &r.templates {
        t.row(vec![
            c.template.clone(),
            num(c.snapshot_mb),
            num(c.save_stop_ms),
            num(c.cold_build.p50_ms),
            num(c.warm_build.p50_ms),
            num(c.snapshot.p50_ms),
            num(c.snapshot_shared_key.p50_ms),
            num(c.cold_vs_snapshot),
            num(c.cold_vs_shared_key),
            num(c.warm_vs_snapshot),
            c.target.map_or_else(String::new, |x| format!("≥ {x}")),
        ]);
    }
    t.render(out);
    for reason in &r.skipped {
        out.push_str(&format!("  skipped {reason}\n"));
    }
}
