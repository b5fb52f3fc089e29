//! The scenarios, one module each (numbered as in the benchmark issue), and what they
//! share: the run's context and the fixture template's name and daemon flags.
//!
//! A scenario returns its figures or an error; it never judges a figure. The only checks
//! that count as failures are correctness ones (a database leased twice, a database
//! missing), which scenario 2 reports in its counts.

pub mod ceiling;
pub mod connect;
pub mod cow;
pub mod dumps;
pub mod front;
pub mod integresql;
pub mod latency;
pub mod majors;
pub mod reuse;
pub mod scale;
pub mod seeds;
pub mod snapshots;
pub mod startup;
pub mod throughput;

use std::path::PathBuf;
use std::time::Duration;

use crate::daemon::Launcher;
use crate::plan::Plan;

/// The fixture template's name in every daemon the benchmark starts.
pub const FIXTURE: &str = "fixture";
/// `wait_ms` sent with every lease request: long enough for 256 clients queued on a
/// pool of 8, well under the API's ceiling of 600000.
pub const WAIT_MS: u64 = 300_000;
/// How long the benchmark waits for a pool to become idle between levels.
pub const IDLE_LIMIT: Duration = Duration::from_secs(180);

/// What every scenario needs.
#[derive(Debug)]
pub struct Ctx {
    /// Sizes and durations.
    pub plan: Plan,
    /// Starts daemons.
    pub launcher: Launcher,
    /// The fixture's migrations directory (absolute).
    pub fixture_dir: PathBuf,
    /// The working directory (absolute): caches, scratch space, the built fsync shim.
    pub work_dir: PathBuf,
    /// The initdb cache shared by every daemon except the cold starts (absolute).
    pub cache_dir: PathBuf,
    /// Scratch space for cold caches (absolute), removed at the end.
    pub scratch_dir: PathBuf,
    /// `pglease serve --help` lists `--lease-auth`.
    pub has_lease_auth: bool,
    /// The pgbench binary, if found.
    pub pgbench: Option<PathBuf>,
}

impl Ctx {
    /// `--template fixture=migrations:DIR`.
    pub fn fixture_args(&self) -> Vec<String> {
        vec![
            "--template".into(),
            format!("{FIXTURE}=migrations:{}", self.fixture_dir.display()),
        ]
    }

    /// `--cache-dir` of the shared (warm) initdb cache.
    pub fn cache_args(&self) -> Vec<String> {
        vec!["--cache-dir".into(), self.cache_dir.display().to_string()]
    }
}

/// `args` as owned strings.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}
