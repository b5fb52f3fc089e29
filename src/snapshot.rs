//! `pglease snapshot save` and `pglease snapshot show`: snapshots for cold CI runners
//! without serving (docs/snapshots.md). `save` starts the primary server as `serve` would
//! with `--snapshot-dir`, builds every template it holds, and stops, which writes the
//! snapshot; `show` prints what snapshot files hold. Both use the key `serve` uses: a file
//! without a valid MAC under it is not read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pglease_pool::postgres::snapshot;
use pglease_pool::ServerConfig;

use crate::cli::{ServeArgs, ShowArgs};

/// How often `save` asks whether the templates are built.
const POLL: Duration = Duration::from_millis(100);
/// How long `save` waits for postgres to run again after it went down.
const DOWN_LIMIT: Duration = Duration::from_secs(60);
/// How often `save` says what it waits for.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// Builds the templates and writes the snapshot; prints its path.
pub async fn save(args: ServeArgs) -> ExitCode {
    let mut config = match args.into_config() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("pglease: {message}");
            return ExitCode::from(crate::EXIT_CONFIG);
        }
    };
    crate::download_bar::DownloadBar::show_for(&mut config.pool);
    config.config_from.log();
    let (dir, key_file) = match &config.pool.server {
        ServerConfig::Embedded(embedded) => (
            embedded.snapshot_dir.clone(),
            embedded.snapshot_key_file.clone(),
        ),
        ServerConfig::External(_) => (None, None),
    };
    let (Some(dir), Some(key_file)) = (dir, key_file) else {
        eprintln!("pglease: snapshot save writes into --snapshot-dir DIR (or snapshot_dir in [postgres]); give one");
        return ExitCode::from(crate::EXIT_CONFIG);
    };
    config.pool.prebuild = true;
    let started = Instant::now();
    let (servers, pool_task) = match pglease_pool::Servers::start(config.pool).await {
        Ok(started) => started,
        Err(error) => {
            tracing::error!("cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let built = wait_until_built(&servers).await;
    // The stop writes the snapshot (or says it is up to date).
    servers.shutdown().await;
    let _ = pool_task.await;
    let major = match &built {
        Ok(major) => *major,
        Err(message) => {
            eprintln!("pglease: {message}");
            return ExitCode::FAILURE;
        }
    };
    let path = snapshot::path_for(&dir, major);
    // The start made the key if there was none.
    let opened = snapshot::load_key(&key_file)
        .map_err(|e| e.to_string())
        .and_then(|key| snapshot::open(&path, &key).map_err(|e| e.to_string()));
    match opened.map(|found| found.manifest) {
        Ok(manifest) => {
            tracing::info!(
                snapshot = %path.display(),
                templates = %manifest.describe(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "snapshot saved"
            );
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("pglease: no snapshot at {}: {error}", path.display());
            ExitCode::FAILURE
        }
    }
}

/// Waits until every template of the primary server is built; its major, or why not.
async fn wait_until_built(servers: &pglease_pool::Servers) -> Result<u32, String> {
    let mut reported = Instant::now();
    // Since when postgres has been down (the pool restarts it; one that stays down ends
    // the wait instead of hanging it).
    let mut down_since: Option<Instant> = None;
    loop {
        let report = servers.primary().status().await.ok_or("the pool stopped")?;
        if report.postgres.state == "running" {
            down_since = None;
        } else if down_since.get_or_insert_with(Instant::now).elapsed() > DOWN_LIMIT {
            return Err(format!(
                "postgres has not been running for {} s: {}",
                DOWN_LIMIT.as_secs(),
                report
                    .postgres
                    .last_error
                    .as_deref()
                    .unwrap_or("no error recorded")
            ));
        }
        let failed: Vec<String> = report
            .templates
            .iter()
            .filter(|t| t.state == "failed")
            .map(|t| format!("{}: {}", t.name, t.last_error.clone().unwrap_or_default()))
            .collect();
        if !failed.is_empty() {
            return Err(format!("templates failed to build: {}", failed.join("; ")));
        }
        let waiting: Vec<String> = report
            .templates
            .iter()
            .filter(|t| t.state != "ready")
            .map(|t| t.name.to_string())
            .collect();
        let major = report
            .postgres
            .version
            .as_deref()
            .map(snapshot::major_of)
            .filter(|&major| major > 0);
        match (major, waiting.is_empty()) {
            (Some(major), true) => return Ok(major),
            _ if reported.elapsed() >= REPORT_EVERY => {
                tracing::info!(templates = %waiting.join(", "), "waiting for templates to be built");
                reported = Instant::now();
            }
            _ => {}
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Prints each snapshot in the file or directory: its file, size, postgres version, age and
/// templates.
pub fn show(args: ShowArgs) -> ExitCode {
    let files = match snapshot_files(&args.path) {
        Ok(files) => files,
        Err(message) => {
            eprintln!("pglease: {message}");
            return ExitCode::FAILURE;
        }
    };
    if files.is_empty() {
        eprintln!(
            "pglease: no .{} file in {}",
            snapshot::EXTENSION,
            args.path.display()
        );
        return ExitCode::FAILURE;
    }
    let key_file = args.snapshot_key_file.unwrap_or_else(|| {
        snapshot::default_key_path(
            &args
                .cache_dir
                .unwrap_or_else(pglease_binaries::default_cache_root),
        )
    });
    // Never made here: a key made now would prove no snapshot.
    let key = match snapshot::load_key(&key_file) {
        Ok(key) => key,
        Err(error) => {
            eprintln!("pglease: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut status = ExitCode::SUCCESS;
    for file in files {
        let size = std::fs::metadata(&file).map_or(0, |m| m.len());
        match snapshot::open(&file, &key).map(|found| found.manifest) {
            Ok(m) => {
                println!(
                    "{}  {:.1} MB  postgres {}  initdb {}  written by pglease {} at {}",
                    file.display(),
                    size as f64 / 1e6,
                    m.postgres_version,
                    m.initdb_args.join(" "),
                    m.pglease_version,
                    written_at(m.created_unix)
                );
                for t in &m.templates {
                    println!(
                        "  {:<24} {}  {:.1} MB",
                        t.name,
                        t.fingerprint,
                        t.size_bytes as f64 / 1e6
                    );
                }
            }
            Err(error) => {
                println!("{}  not usable: {error}", file.display());
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}

/// A snapshot's time of writing, stored as unix seconds, as RFC 3339 in UTC
/// (`2026-11-23T06:00:00Z`), as the HTTP API writes times.
fn written_at(created_unix: u64) -> String {
    let time = std::time::UNIX_EPOCH + Duration::from_secs(created_unix);
    humantime::format_rfc3339_seconds(time).to_string()
}

fn snapshot_files(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries =
        std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == snapshot::EXTENSION))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    #[test]
    fn show_writes_the_time_of_writing_in_utc() {
        assert_eq!(super::written_at(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::written_at(1_795_413_600), "2026-11-23T06:00:00Z");
    }
}
