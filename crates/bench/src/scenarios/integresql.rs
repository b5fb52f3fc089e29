//! Scenario 8: the shape of an IntegreSQL client's suite that stalled on pglease (issue
//! 18) — packages with a template each, tests that take a test database and never give it
//! back — run through the npm client (`tests/clients/js/suite.mjs`) against pglease with
//! default options, and, when `PGLEASE_BENCH_INTEGRESQL_URL` names a running IntegreSQL
//! server, against it too: runs alternate between the two, and the ratio of their medians
//! is printed. pglease's runs go to the IntegreSQL routes of its main port.
//!
//! The benchmark starts no IntegreSQL itself (it is another project's program); give it
//! one you run, on the same machine, with the postgres of your choice.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::Ctx;
use crate::error::{BenchError, Result};
use crate::stats::{median, round3};

/// Packages (templates) of the suite.
const PACKAGES: usize = 12;
/// Tests per package (each takes a database and keeps it).
const TESTS: usize = 25;
/// The environment variable naming an IntegreSQL server to compare with.
pub const INTEGRESQL_URL_ENV: &str = "PGLEASE_BENCH_INTEGRESQL_URL";

/// One run of the suite.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteRun {
    /// `pglease` or `IntegreSQL`.
    pub server: &'static str,
    /// Wall time of the whole suite (node start to exit), seconds.
    pub secs: f64,
    /// Tests that passed and failed (a 504 is a failure).
    pub passed: u64,
    pub failed: u64,
}

/// What scenario 8 measured.
#[derive(Debug, Serialize)]
pub struct SuiteResult {
    pub packages: usize,
    pub tests_per_package: usize,
    pub runs: Vec<SuiteRun>,
    /// Median seconds of pglease's runs.
    pub pglease_median_secs: Option<f64>,
    /// Median seconds of IntegreSQL's runs, when one was given.
    pub integresql_median_secs: Option<f64>,
    /// pglease ÷ IntegreSQL (medians); at most 1.0 is the target.
    pub ratio: Option<f64>,
    /// Test databases pglease recreated past its connection budget, over all its runs.
    pub reclaimed: u64,
    /// Why IntegreSQL was not measured, if it was not.
    pub integresql_skipped: Option<String>,
}

/// Runs the scenario; `Ok(Err(reason))` when the npm client is not installed.
pub async fn run(ctx: &Ctx) -> Result<std::result::Result<SuiteResult, String>> {
    let js = std::path::absolute(Path::new("tests/clients/js"))
        .map_err(|e| BenchError::io("cannot resolve tests/clients/js", e))?;
    if !js.join("node_modules/@devoxa/integresql-client").is_dir() {
        return Ok(Err(
            "the npm IntegreSQL client is not installed (cd tests/clients/js && npm ci)".into(),
        ));
    }
    let integresql = std::env::var(INTEGRESQL_URL_ENV).ok();
    let daemon = ctx
        .launcher
        .start("integresql-suite", &ctx.cache_args())
        .await?;
    let pglease_url = format!("http://{}/", daemon.addr);
    let mut runs = Vec::new();
    for _ in 0..ctx.plan.integresql_runs {
        runs.push(suite(&js, "pglease", &pglease_url).await?);
        if let Some(url) = &integresql {
            runs.push(suite(&js, "IntegreSQL", url).await?);
        }
    }
    let reclaimed = daemon
        .api()?
        .status()
        .await
        .ok()
        .map_or(0, |s| s.limits.reclaimed);
    daemon.stop().await?;
    let median_of = |server: &str| {
        let secs: Vec<f64> = runs
            .iter()
            .filter(|r| r.server == server)
            .map(|r| r.secs)
            .collect();
        median(&secs).map(round3)
    };
    let (pglease, other) = (median_of("pglease"), median_of("IntegreSQL"));
    Ok(Ok(SuiteResult {
        packages: PACKAGES,
        tests_per_package: TESTS,
        runs,
        pglease_median_secs: pglease,
        integresql_median_secs: other,
        ratio: pglease.zip(other).map(|(a, b)| round3(a / b)),
        reclaimed,
        integresql_skipped: integresql
            .is_none()
            .then(|| format!("{INTEGRESQL_URL_ENV} not set: no IntegreSQL server to compare with")),
    }))
}

/// One run of `suite.mjs` against `url`.
async fn suite(js: &PathBuf, server: &'static str, url: &str) -> Result<SuiteRun> {
    eprintln!("[bench] 8: the suite against {server} ({url})");
    let started = Instant::now();
    let output = tokio::process::Command::new("node")
        .args(["suite.mjs", &PACKAGES.to_string(), &TESTS.to_string()])
        .current_dir(js)
        .env("PGLEASE_INTEGRESQL_URL", url)
        .output()
        .await
        .map_err(|e| BenchError::io("cannot run node", e))?;
    let secs = round3(started.elapsed().as_secs_f64());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let counts: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .ok_or_else(|| {
            BenchError::Other(format!(
                "suite.mjs against {server} printed no counts ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join(" | ")
            ))
        })?;
    Ok(SuiteRun {
        server,
        secs,
        passed: counts["passed"].as_u64().unwrap_or(0),
        failed: counts["failed"].as_u64().unwrap_or(0),
    })
}
