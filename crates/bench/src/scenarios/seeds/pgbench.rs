//! Running pgbench against a database and reading the figures it prints; scenario 5
//! runs it through here too.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use pglease_api::wire::LeaseResponse;

use super::PgbenchFigures;
use crate::cluster;
use crate::error::{BenchError, Result};
use crate::stats::round3;

/// A fresh database and how to reach it over TCP.
pub(in crate::scenarios) struct Db {
    pub(in crate::scenarios) host: String,
    pub(in crate::scenarios) port: u16,
    pub(in crate::scenarios) user: String,
    pub(in crate::scenarios) password: Option<String>,
    pub(in crate::scenarios) dbname: String,
    pub(in crate::scenarios) lease_id: Option<String>,
}

impl From<LeaseResponse> for Db {
    fn from(lease: LeaseResponse) -> Self {
        Db {
            host: lease.host,
            port: lease.port,
            user: lease.user,
            password: Some(lease.password),
            dbname: lease.database,
            lease_id: Some(lease.id),
        }
    }
}

/// Runs pgbench against `db` with `args`; returns stdout and stderr together.
pub(in crate::scenarios) async fn run_pgbench(
    pgbench: &Path,
    db: &Db,
    args: &[&str],
    limit: Duration,
) -> Result<String> {
    let mut command = tokio::process::Command::new(pgbench);
    command
        .args(["-h", &db.host, "-p", &db.port.to_string(), "-U", &db.user])
        .args(args)
        .arg(&db.dbname)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // The caller's PG* variables must not redirect it (PGHOSTADDR beats -h, for one).
    cluster::scrub_env(&mut command);
    if let Some(password) = &db.password {
        // Through the environment, not the command line (ps would show it).
        command.env("PGPASSWORD", password);
    }
    let what = format!("pgbench {}", args.join(" "));
    let output = tokio::time::timeout(limit, command.output())
        .await
        .map_err(|_| BenchError::Other(format!("{what} took over {}s; killed", limit.as_secs())))?
        .map_err(|e| BenchError::io(format!("cannot run {}", pgbench.display()), e))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        return Err(BenchError::Other(format!(
            "{what} failed ({}): {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    }
    Ok(text)
}

/// The figures at the end of a `pgbench -T` run. PG14+ prints one `tps = X (without
/// initial connection time)` line; older versions print `including connections
/// establishing` and `excluding connections establishing`, and the latter is taken.
pub fn parse_pgbench(output: &str) -> Result<PgbenchFigures> {
    let after = |line: &str, prefix: &str| -> Option<String> {
        line.trim()
            .strip_prefix(prefix)
            .map(|rest| rest.trim().to_string())
    };
    let first_number = |text: &str| -> Option<f64> {
        text.split(|c: char| c.is_whitespace() || c == '/' || c == '(')
            .find(|part| !part.is_empty())
            .and_then(|part| part.parse().ok())
    };
    let mut tps_lines: Vec<(f64, bool)> = Vec::new();
    let mut figures = PgbenchFigures {
        tps: 0.0,
        latency_avg_ms: None,
        transactions: None,
        failed_transactions: None,
    };
    for line in output.lines() {
        if let Some(rest) = after(line, "tps =") {
            if let Some(tps) = first_number(&rest) {
                let preferred = rest.contains("without initial connection time")
                    || rest.contains("excluding connections establishing");
                tps_lines.push((tps, preferred));
            }
        } else if let Some(rest) = after(line, "latency average =") {
            figures.latency_avg_ms = first_number(&rest);
        } else if let Some(rest) = after(line, "number of transactions actually processed:") {
            figures.transactions = first_number(&rest).map(|n| n as u64);
        } else if let Some(rest) = after(line, "number of failed transactions:") {
            figures.failed_transactions = first_number(&rest).map(|n| n as u64);
        }
    }
    let tps = tps_lines
        .iter()
        .find(|(_, preferred)| *preferred)
        .or(tps_lines.last())
        .map(|(tps, _)| *tps)
        .ok_or_else(|| BenchError::Other("pgbench printed no `tps =` line".into()))?;
    figures.tps = round3(tps);
    Ok(figures)
}
