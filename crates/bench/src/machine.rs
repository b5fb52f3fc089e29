//! What the figures were measured on: cores, CPU, memory, kernel, git revision, time.
//! Read from /proc and `git`; anything unreadable is left empty rather than failing.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The machine and the code under test.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    /// Cores available to this process.
    pub nproc: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// MemTotal, MiB.
    pub memory_mib: u64,
    /// Kernel release.
    pub kernel: String,
    /// PostgreSQL `server_version` (filled in once a daemon runs).
    pub postgres_version: String,
    /// `git rev-parse HEAD` of the repository.
    pub git_rev: String,
    /// Whether the work tree had uncommitted changes.
    pub git_dirty: bool,
    /// The pglease binary measured.
    pub pglease_binary: String,
    /// When the run started, UTC, RFC 3339.
    pub started_at: String,
}

impl MachineInfo {
    /// Reads what it can; `repo` is where `git` runs.
    pub fn collect(repo: &Path, binary: &Path) -> MachineInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_mib = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let git = |args: &[&str]| -> Option<String> {
            let output = Command::new("git")
                .args(args)
                .current_dir(repo)
                .output()
                .ok()?;
            output
                .status
                .success()
                .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
        };
        MachineInfo {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            memory_mib,
            kernel,
            postgres_version: String::new(),
            git_rev: git(&["rev-parse", "HEAD"]).unwrap_or_default(),
            git_dirty: git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty()),
            pglease_binary: binary.display().to_string(),
            started_at: utc_now(),
        }
    }
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's civil_from_days).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn formats_utc_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_294_800), "2026-11-21T21:00:00Z");
    }
}
