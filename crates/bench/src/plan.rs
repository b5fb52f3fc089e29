//! How much each scenario does in quick and full mode: durations, repetitions, sizes.
//! The numbers are chosen so quick mode stays under two minutes on a 2-core machine and
//! full mode under fifteen (scenario 6 alone takes about ten of them).

use std::time::Duration;

use serde::Serialize;

/// The parameters of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// `quick` or `full`.
    pub mode: &'static str,
    /// Scenario 1: concurrency levels.
    pub latency_workers: Vec<usize>,
    /// Scenario 1: how long each level runs.
    #[serde(serialize_with = "secs")]
    pub latency_duration: Duration,
    /// Scenario 2 and 3: concurrency levels.
    pub throughput_workers: Vec<usize>,
    /// Scenario 2: how long each level starts new tests.
    #[serde(serialize_with = "secs")]
    pub throughput_duration: Duration,
    /// Scenario 3: how long each level starts new create/drop cycles.
    #[serde(serialize_with = "secs")]
    pub ceiling_duration: Duration,
    /// Scenario 4: warm starts per template.
    pub startup_warm_runs: usize,
    /// Scenario 4: cold starts per template.
    pub startup_cold_runs: usize,
    /// Scenario 5: connections per kind.
    pub connect_iterations: usize,
    /// Scenario 5 through libpq: alternating `pgbench -C` runs per `--lease-auth` mode.
    pub connect_libpq_runs: usize,
    /// Scenario 5 through libpq: seconds per run.
    pub connect_libpq_secs: u64,
    /// Scenario 7: clients waiting at once on a pool of `scale_pool`.
    pub scale_clients: usize,
    /// Scenario 7: the pool's `--max-total`.
    pub scale_pool: usize,
    /// Scenario 7: lease → release(reuse) rounds per client.
    pub scale_reuse_rounds: usize,
    /// Scenario 7: lease → release(drop) rounds per client.
    pub scale_drop_rounds: usize,
    /// Scenario 7: leases held open for the RSS figure.
    pub rss_leases: usize,
    /// Scenario 7: pgbench scale factors for clone time vs template size (empty: skipped).
    pub clone_size_scales: Vec<u32>,
    /// Scenario 7: clones timed per size.
    pub clone_size_reps: usize,
    /// Scenario 6: autocommit `INSERT`s in workload (a).
    pub seeds_insert_rows: usize,
    /// Scenario 6: `pgbench -i -s N` of workload (b).
    pub seeds_pgbench_scale: u32,
    /// Scenario 6: `pgbench -T` of each run.
    #[serde(serialize_with = "secs")]
    pub seeds_pgbench_duration: Duration,
    /// Scenario 6: `pgbench -c N -j N`, one run each.
    pub seeds_pgbench_clients: Vec<usize>,
    /// Scenario 6: `FSYNC_DELAY_US` values of the stock postgres, one restart each.
    pub seeds_fsync_delays_us: Vec<u64>,
    /// Scenario 8: runs of the IntegreSQL suite per server.
    pub integresql_runs: usize,
    /// Scenario 9: the PostgreSQL majors, the first one the baseline.
    pub majors: Vec<u32>,
    /// Scenario 9: how long each major's clone+drop loop and end-to-end loop run.
    #[serde(serialize_with = "secs")]
    pub majors_duration: Duration,
    /// Scenario 10: `pgbench -i -s` scale of the dumped dataset (about 15 MB a unit).
    pub dump_pgbench_scale: u32,
    /// Scenario 10: how long the clone+drop loop of the built template runs.
    #[serde(serialize_with = "secs")]
    pub dump_clone_duration: Duration,
    /// Scenario 13: the template sizes, MB (the first is the baseline of the ratios).
    pub cow_template_mb: Vec<u64>,
    /// Scenario 13: clone+drop cycles per template and store, after the first clone.
    pub cow_clone_reps: usize,
    /// Scenario 13: how long each end-to-end level runs.
    #[serde(serialize_with = "secs")]
    pub cow_duration: Duration,
    /// Scenario 14: queries timed per kind and per path (front, direct).
    pub front_queries: usize,
    /// Scenario 14: pgbench runs per path (select-only-like, one connection), alternating.
    pub front_pgbench_runs: usize,
    /// Scenario 14: seconds per pgbench run.
    pub front_pgbench_secs: u64,
    /// Scenario 14: connections timed per path (front, `POST /lease` + direct).
    pub front_connects: usize,
    /// Scenario 14: the fixture's suite, concurrency levels (the issue's: 1 and 8).
    pub front_suite_workers: Vec<usize>,
    /// Scenario 14: how long each suite level runs, per path.
    #[serde(serialize_with = "secs")]
    pub front_suite_duration: Duration,
    /// Scenario 14: idle connections held open through the front (the issue's: 1,000).
    pub front_idle_connections: usize,
}

fn secs<S: serde::Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(value.as_secs_f64())
}

impl Plan {
    /// Quick mode: every scenario, small.
    pub fn quick() -> Plan {
        Plan {
            mode: "quick",
            latency_workers: vec![1, 8, 32],
            latency_duration: Duration::from_secs(2),
            throughput_workers: vec![1, 2, 8, 32],
            throughput_duration: Duration::from_secs(4),
            ceiling_duration: Duration::from_secs(3),
            startup_warm_runs: 2,
            startup_cold_runs: 1,
            connect_iterations: 100,
            connect_libpq_runs: 3,
            connect_libpq_secs: 2,
            scale_clients: 256,
            scale_pool: 8,
            scale_reuse_rounds: 2,
            scale_drop_rounds: 1,
            rss_leases: 100,
            clone_size_scales: vec![1],
            clone_size_reps: 3,
            // About 30 s on 2 cores: the 5 ms disk alone would add 5 s of inserts.
            seeds_insert_rows: 1_000,
            seeds_pgbench_scale: 1,
            seeds_pgbench_duration: Duration::from_secs(2),
            seeds_pgbench_clients: vec![1, 3],
            seeds_fsync_delays_us: vec![0, 1_000],
            integresql_runs: 1,
            majors: vec![15, 13, 16, 18],
            majors_duration: Duration::from_secs(3),
            dump_pgbench_scale: 10,
            dump_clone_duration: Duration::from_secs(5),
            cow_template_mb: vec![10, 100],
            cow_clone_reps: 3,
            cow_duration: Duration::from_secs(3),
            front_queries: 2_000,
            front_pgbench_runs: 2,
            front_pgbench_secs: 2,
            front_connects: 60,
            front_suite_workers: vec![1, 8],
            front_suite_duration: Duration::from_secs(3),
            front_idle_connections: 100,
        }
    }

    /// Full mode: longer runs, 1,000 open leases, templates up to ~1 GB.
    pub fn full() -> Plan {
        Plan {
            mode: "full",
            latency_workers: vec![1, 8, 32],
            latency_duration: Duration::from_secs(10),
            throughput_workers: vec![1, 2, 8, 32],
            throughput_duration: Duration::from_secs(20),
            ceiling_duration: Duration::from_secs(15),
            startup_warm_runs: 5,
            startup_cold_runs: 3,
            connect_iterations: 500,
            connect_libpq_runs: 5,
            connect_libpq_secs: 4,
            scale_clients: 256,
            scale_pool: 8,
            scale_reuse_rounds: 10,
            scale_drop_rounds: 2,
            rss_leases: 1000,
            clone_size_scales: vec![1, 10, 70],
            clone_size_reps: 5,
            // The parameters: about 10 minutes, most of it the 15 pgbench runs.
            seeds_insert_rows: 10_000,
            seeds_pgbench_scale: 10,
            seeds_pgbench_duration: Duration::from_secs(30),
            seeds_pgbench_clients: vec![1, 2, 3],
            seeds_fsync_delays_us: vec![0, 1_000, 5_000],
            integresql_runs: 3,
            majors: vec![15, 13, 14, 16, 17, 18],
            majors_duration: Duration::from_secs(10),
            // About 1 GB, as the issue asks.
            dump_pgbench_scale: 70,
            dump_clone_duration: Duration::from_secs(20),
            // About 10 MB, 100 MB, 1 GB and 4 GB, as the issue asks.
            cow_template_mb: vec![10, 50, 100, 250, 1024, 4096],
            cow_clone_reps: 5,
            cow_duration: Duration::from_secs(10),
            front_queries: 20_000,
            front_pgbench_runs: 4,
            front_pgbench_secs: 5,
            front_connects: 300,
            front_suite_workers: vec![1, 8],
            front_suite_duration: Duration::from_secs(15),
            front_idle_connections: 1_000,
        }
    }
}
