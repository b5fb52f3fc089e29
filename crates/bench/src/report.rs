//! The report: one JSON object (machine, plan, one object per scenario) and the
//! readable tables printed from it. Printing reads the typed results; it judges nothing
//! except the targets the issue names, which it shows beside the figures.

use serde::Serialize;

use crate::cpu::CpuUse;
use crate::machine::MachineInfo;
use crate::plan::Plan;
use crate::scenarios::ceiling::CeilingResult;
use crate::scenarios::connect::ConnectResult;
use crate::scenarios::cow::{self, CowResult};
use crate::scenarios::dumps::{self, DumpsResult};
use crate::scenarios::integresql::SuiteResult;
use crate::scenarios::latency::LatencyResult;
use crate::scenarios::majors::{self, MajorsResult};
use crate::scenarios::reuse::{self, ReuseResult};
use crate::scenarios::scale::ScaleResult;
use crate::scenarios::seeds::SeedsResult;
use crate::scenarios::snapshots::{self, SnapshotsResult};
use crate::scenarios::startup::StartupResult;
use crate::scenarios::throughput::ThroughputResult;
use crate::stats::round3;

/// How a scenario ended.
#[derive(Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome<T> {
    /// Ran; here are its figures.
    Done(T),
    /// The harness failed (not a figure): the error.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// Not run.
    Skipped {
        /// Why.
        reason: String,
    },
}

impl<T> Outcome<T> {
    /// The figures, if the scenario ran.
    pub fn done(&self) -> Option<&T> {
        match self {
            Outcome::Done(value) => Some(value),
            _ => None,
        }
    }

    /// A skipped scenario.
    pub fn skipped(reason: impl Into<String>) -> Self {
        Outcome::Skipped {
            reason: reason.into(),
        }
    }
}

/// What the fixture template is, read from one lease of it.
#[derive(Debug, Serialize)]
pub struct FixtureInfo {
    /// Its migrations directory.
    pub migrations: String,
    /// Tables in `public`, without the harness' `bench_marker`.
    pub tables: i64,
    /// Indexes in `public` (primary keys and unique constraints included).
    pub indexes: i64,
    /// Foreign keys.
    pub foreign_keys: i64,
    /// Rows over all tables.
    pub rows: i64,
    /// `pg_database_size` of a lease, bytes.
    pub lease_database_bytes: i64,
}

/// Scenario 2 against scenario 3 at one concurrency.
#[derive(Debug, Serialize)]
pub struct Fraction {
    /// Concurrency.
    pub workers: usize,
    /// Scenario 2, settled tests per second.
    pub pglease_tests_per_sec: f64,
    /// Scenario 3, create+drop cycles per second.
    pub ceiling_cycles_per_sec: f64,
    /// Their ratio.
    pub fraction: f64,
    /// The target for it.
    pub target: f64,
}

/// Every scenario's outcome.
#[derive(Debug, Serialize)]
pub struct Scenarios {
    /// 1.
    pub warm_lease_latency: Outcome<LatencyResult>,
    /// 2.
    pub end_to_end_throughput: Outcome<ThroughputResult>,
    /// 3.
    pub physical_limit: Outcome<CeilingResult>,
    /// 2 ÷ 3.
    pub throughput_vs_ceiling: Vec<Fraction>,
    /// 4.
    pub startup: Outcome<StartupResult>,
    /// 5.
    pub connection_cost: Outcome<ConnectResult>,
    /// 6.
    pub seed_workloads: Outcome<SeedsResult>,
    /// 7.
    pub pool_scale: Outcome<ScaleResult>,
    /// 8.
    pub integresql_suite: Outcome<SuiteResult>,
    /// 9.
    pub majors: Outcome<MajorsResult>,
    /// Scenario 10.
    pub dumps: Outcome<DumpsResult>,
    /// Scenario 11.
    pub snapshots: Outcome<SnapshotsResult>,
    /// Scenario 12.
    pub reuse: Outcome<ReuseResult>,
    /// 13: copy-on-write storage against tmpfs.
    pub cow: Outcome<CowResult>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `quick` or `full`.
    pub mode: &'static str,
    /// The machine and revision.
    pub machine: MachineInfo,
    /// Sizes and durations used.
    pub plan: Plan,
    /// The settings the daemon's postgres reported (from `/status`).
    pub postgres_settings: serde_json::Map<String, serde_json::Value>,
    /// The fixture template.
    pub fixture: Outcome<FixtureInfo>,
    /// The scenarios.
    pub scenarios: Scenarios,
    /// No double lease and no missing database was seen.
    pub isolation_ok: bool,
    /// Wall time of the whole run, seconds.
    pub total_secs: f64,
}

/// A text table with right-aligned columns (the first left-aligned).
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self, out: &mut String) {
        let columns = self.header.len();
        let mut widths = vec![0; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::from("  ");
            for (i, cell) in row.iter().enumerate().take(columns) {
                let pad = widths[i] - cell.chars().count();
                if i == 0 {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str("  ");
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

/// A number with one decimal (or two below 10).
pub(crate) fn num(value: f64) -> String {
    if value.abs() < 10.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.1}")
    }
}

/// Busy cores of the machine's, e.g. "1.93/2".
fn busy_cores(cpu: Option<CpuUse>) -> String {
    cpu.map_or("-".into(), |c| format!("{:.2}/{}", c.busy_cores, c.cores))
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_048_576.0)
}

/// A line for a scenario that did not produce figures.
pub(crate) fn not_done<T>(outcome: &Outcome<T>, out: &mut String) -> bool {
    match outcome {
        Outcome::Done(_) => false,
        Outcome::Failed { error } => {
            out.push_str(&format!("  FAILED (harness): {error}\n"));
            true
        }
        Outcome::Skipped { reason } => {
            out.push_str(&format!("  not run: {reason}\n"));
            true
        }
    }
}

impl Report {
    /// The readable tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        out.push_str(&format!(
            "pglease benchmark — {} mode — {} — git {}{} — {} cores, {} MiB — PostgreSQL {} — {:.0} s\n",
            self.mode,
            m.started_at,
            m.git_rev.get(..10).unwrap_or(&m.git_rev),
            if m.git_dirty { " (dirty)" } else { "" },
            m.nproc,
            m.memory_mib,
            m.postgres_version,
            self.total_secs,
        ));
        match &self.fixture {
            Outcome::Done(f) => out.push_str(&format!(
                "fixture: {} tables, {} indexes, {} foreign keys, {} rows; a lease is {} ({} bytes)\n",
                f.tables,
                f.indexes,
                f.foreign_keys,
                f.rows,
                mib(f.lease_database_bytes),
                f.lease_database_bytes
            )),
            other => {
                out.push_str("fixture:\n");
                not_done(other, &mut out);
            }
        }
        self.render_latency(&mut out);
        self.render_throughput(&mut out);
        self.render_ceiling(&mut out);
        self.render_startup(&mut out);
        self.render_connect(&mut out);
        self.render_seeds(&mut out);
        self.render_scale(&mut out);
        self.render_integresql(&mut out);
        majors::render(&self.scenarios.majors, &mut out);
        dumps::render(&self.scenarios.dumps, &mut out);
        snapshots::render(&self.scenarios.snapshots, &mut out);
        reuse::render(&self.scenarios.reuse, &mut out);
        cow::render(&self.scenarios.cow, &mut out);
        out.push_str(&format!(
            "\nisolation: {}\n",
            if self.isolation_ok {
                "OK (0 double leases, 0 missing databases)"
            } else {
                "FAILED — see scenario 2"
            }
        ));
        out
    }

    fn render_latency(&self, out: &mut String) {
        out.push_str(
            "\n1. Warm lease latency: POST /lease, pool ahead of demand, release reuse=true (ms)\n",
        );
        let outcome = &self.scenarios.warm_lease_latency;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        let mut t = Table::new(&[
            "workers",
            "leases",
            "leases/s",
            "p50",
            "p90",
            "p99",
            "max",
            "release p50",
            "errors",
        ]);
        for l in &r.levels {
            t.row(vec![
                l.workers.to_string(),
                l.leases.to_string(),
                num(l.leases_per_sec),
                num(l.lease.p50_ms),
                num(l.lease.p90_ms),
                num(l.lease.p99_ms),
                num(l.lease.max_ms),
                num(l.release.p50_ms),
                l.errors.to_string(),
            ]);
        }
        t.render(out);
        first_errors(r.levels.iter().map(|l| &l.first_error), out);
    }

    fn render_throughput(&self, out: &mut String) {
        out.push_str("\n2. End-to-end tests: lease → connect → tx (10 inserts + select) → disconnect → release(drop)\n");
        let outcome = &self.scenarios.end_to_end_throughput;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        let mut t = Table::new(&[
            "workers",
            "tests",
            "tests/s",
            "settled/s",
            "overhead p50",
            "p90",
            "p99",
            "lease p50",
            "lease p99",
            "connect p50",
            "work p50",
            "busy cores",
            "CPU ms/test",
            "double",
            "missing",
            "errors",
        ]);
        for l in &r.levels {
            t.row(vec![
                l.workers.to_string(),
                l.tests.to_string(),
                num(l.tests_per_sec),
                num(l.tests_per_sec_settled),
                num(l.overhead.p50_ms),
                num(l.overhead.p90_ms),
                num(l.overhead.p99_ms),
                num(l.lease.p50_ms),
                num(l.lease.p99_ms),
                num(l.connect.p50_ms),
                num(l.work.p50_ms),
                busy_cores(l.cpu),
                l.cpu_ms_per_test.map_or("-".into(), num),
                l.double_leases.to_string(),
                l.missing_databases.to_string(),
                l.errors.to_string(),
            ]);
        }
        t.render(out);
        out.push_str(&format!(
            "  double leases: {}, missing databases: {} (must be 0); overhead = lease + release calls, ms\n",
            r.double_leases, r.missing_databases
        ));
        first_errors(r.levels.iter().map(|l| &l.first_error), out);
    }

    fn render_ceiling(&self, out: &mut String) {
        out.push_str("\n3. Physical limit: raw CREATE DATABASE … FILE_COPY + DROP, same postgres and template, no pglease\n");
        let outcome = &self.scenarios.physical_limit;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        out.push_str(&format!(
            "  template {} ({}); {}\n",
            r.template_database,
            mib(r.template_bytes),
            r.method
        ));
        let mut t = Table::new(&[
            "workers",
            "cycles",
            "cycles/s",
            "create p50",
            "create p99",
            "drop p50",
            "drop p99",
            "busy cores",
            "CPU ms/cycle",
            "pglease tests/s",
            "fraction",
            "target",
        ]);
        for l in &r.levels {
            let fraction = self
                .scenarios
                .throughput_vs_ceiling
                .iter()
                .find(|f| f.workers == l.workers);
            t.row(vec![
                l.workers.to_string(),
                l.cycles.to_string(),
                num(l.cycles_per_sec),
                num(l.create.p50_ms),
                num(l.create.p99_ms),
                num(l.drop.p50_ms),
                num(l.drop.p99_ms),
                busy_cores(l.cpu),
                l.cpu_ms_per_cycle.map_or("-".into(), num),
                fraction.map_or("-".into(), |f| num(f.pglease_tests_per_sec)),
                fraction.map_or("-".into(), |f| format!("{:.2}", f.fraction)),
                "≥ 0.90".into(),
            ]);
        }
        t.render(out);
        first_errors(r.levels.iter().map(|l| &l.first_error), out);
        self.render_cpu_bound(r, out);
        if r.levels_with_work.is_empty() {
            return;
        }
        out.push_str("  the same loop with scenario 2's test work between CREATE and DROP (connect, transaction, disconnect):\n");
        let mut t = Table::new(&[
            "workers",
            "cycles",
            "cycles/s",
            "create p50",
            "drop p50",
            "connect p50",
            "busy cores",
            "CPU ms/cycle",
            "pglease tests/s",
            "fraction",
            "lease connect p50",
            "÷ raw",
        ]);
        let lease_connect = |workers: usize| {
            self.scenarios
                .end_to_end_throughput
                .done()
                .and_then(|tp| tp.levels.iter().find(|l| l.workers == workers))
                .map(|l| l.connect.p50_ms)
        };
        for l in &r.levels_with_work {
            let pglease = self
                .scenarios
                .throughput_vs_ceiling
                .iter()
                .find(|f| f.workers == l.workers)
                .map(|f| f.pglease_tests_per_sec);
            let raw_connect = l.connect.as_ref().map(|c| c.p50_ms).filter(|&ms| ms > 0.0);
            let leased = lease_connect(l.workers);
            t.row(vec![
                l.workers.to_string(),
                l.cycles.to_string(),
                num(l.cycles_per_sec),
                num(l.create.p50_ms),
                num(l.drop.p50_ms),
                raw_connect.map_or("-".into(), num),
                busy_cores(l.cpu),
                l.cpu_ms_per_cycle.map_or("-".into(), num),
                pglease.map_or("-".into(), num),
                pglease
                    .filter(|_| l.cycles_per_sec > 0.0)
                    .map_or("-".into(), |p| format!("{:.2}", p / l.cycles_per_sec)),
                leased.map_or("-".into(), num),
                leased
                    .zip(raw_connect)
                    .map_or("-".into(), |(lease, raw)| format!("{:.2}", lease / raw)),
            ]);
        }
        t.render(out);
        out.push_str(
            "  connect p50: the raw loop's superuser connection to the clone it just made (unix socket, trust); \
             lease connect p50: scenario 2's connection with a lease's URL (TCP, the lease's authentication) \
             while the pool clones and drops beside it (target at 1 worker: ÷ raw ≤ 1.5)\n",
        );
        first_errors(r.levels_with_work.iter().map(|l| &l.first_error), out);
    }

    /// Where the cores are busy in both loops, throughput is CPU per unit of work: the
    /// fraction pglease can reach is the raw cycle's CPU over a test's.
    fn render_cpu_bound(&self, r: &CeilingResult, out: &mut String) {
        let Some(tests) = self.scenarios.end_to_end_throughput.done() else {
            return;
        };
        for raw in &r.levels {
            let Some(test) = tests.levels.iter().find(|t| t.workers == raw.workers) else {
                continue;
            };
            let (Some(raw_cpu), Some(test_cpu)) = (raw.cpu, test.cpu) else {
                continue;
            };
            let (Some(per_cycle), Some(per_test)) = (raw.cpu_ms_per_cycle, test.cpu_ms_per_test)
            else {
                continue;
            };
            let saturated = |c: CpuUse| c.busy_cores >= 0.9 * c.cores as f64;
            if !(saturated(raw_cpu) && saturated(test_cpu)) || per_test <= 0.0 {
                continue;
            }
            out.push_str(&format!(
                "  {} workers: CPU-bound (cores ≥ 90% busy in both); a test costs {} CPU ms, a raw cycle {}: the most pglease can reach is {:.2} of the raw loop\n",
                raw.workers,
                num(per_test),
                num(per_cycle),
                per_cycle / per_test
            ));
        }
    }

    fn render_startup(&self, out: &mut String) {
        out.push_str("\n4. Start-up: spawn → first successful lease (ms)\n");
        let outcome = &self.scenarios.startup;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        let mut t = Table::new(&[
            "template",
            "cache",
            "runs",
            "p50",
            "min",
            "max",
            "listening p50",
            "target",
            "met",
        ]);
        for c in &r.cases {
            let listening = {
                let mut sorted = c.listening_ms.clone();
                sorted.sort_by(f64::total_cmp);
                sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
            };
            t.row(vec![
                c.template.to_string(),
                c.cache.to_string(),
                c.first_lease.count.to_string(),
                num(c.first_lease.p50_ms),
                num(c.first_lease.min_ms),
                num(c.first_lease.max_ms),
                num(listening),
                c.target_secs
                    .map_or("-".into(), |s| format!("≤ {} ms", s * 1e3)),
                c.target_secs.map_or("-".into(), |s| {
                    if c.first_lease.p50_ms <= s * 1e3 {
                        "yes".into()
                    } else {
                        "no".into()
                    }
                }),
            ]);
        }
        t.render(out);
    }

    fn render_connect(&self, out: &mut String) {
        out.push_str("\n5. Connection cost: connect + SELECT 1 + disconnect (ms per connection)\n");
        let outcome = &self.scenarios.connection_cost;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        let mut t = Table::new(&[
            "kind", "verifier", "n", "p50", "p90", "p99", "mean", "errors",
        ]);
        for k in &r.kinds {
            t.row(vec![
                k.name.clone(),
                k.verifier.clone().unwrap_or_else(|| "-".into()),
                k.per_connection.count.to_string(),
                num(k.per_connection.p50_ms),
                num(k.per_connection.p90_ms),
                num(k.per_connection.p99_ms),
                num(k.per_connection.mean_ms),
                k.errors.to_string(),
            ]);
        }
        t.render(out);
        if let Some(ratio) = r.scram_over_trust {
            out.push_str(&format!(
                "  lease scram / lease trust (p50, tokio-postgres): {ratio:.2} (target ≤ 1.20)\n"
            ));
        }
        if let Some(libpq) = &r.libpq {
            let list = |runs: &[f64]| runs.iter().map(|v| num(*v)).collect::<Vec<_>>().join(" ");
            out.push_str(&format!(
                "  through libpq ({}): scram {} ms [{}], trust {} ms [{}]",
                libpq.method,
                libpq.scram_median_ms.map_or("-".into(), num),
                list(&libpq.scram_runs_ms),
                libpq.trust_median_ms.map_or("-".into(), num),
                list(&libpq.trust_runs_ms),
            ));
            match libpq.scram_over_trust {
                Some(ratio) => out.push_str(&format!(
                    "; scram / trust (medians): {ratio:.2} (target ≤ 1.20)\n"
                )),
                None => out.push('\n'),
            }
            if let Some(error) = &libpq.error {
                out.push_str(&format!("  libpq runs failed: {error}\n"));
            }
        }
        if let Some(todo) = &r.todo {
            out.push_str(&format!("  {todo}\n"));
        }
        first_errors(r.kinds.iter().map(|k| &k.first_error), out);
    }

    fn render_seeds(&self, out: &mut String) {
        out.push_str("\n6. Seed workloads: stock postgres on disk (+ fsync delay), hand-tuned tmpfs postgres, a pglease lease\n");
        let outcome = &self.scenarios.seed_workloads;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        out.push_str(&format!("  {}\n", r.mode_note));
        // Stock columns first (slowest disk last), then tuned and lease.
        let mut order: Vec<usize> = (0..r.targets.len())
            .filter(|&i| r.targets[i].kind == "stock")
            .collect();
        order.extend((0..r.targets.len()).filter(|&i| r.targets[i].kind == "tuned"));
        order.extend((0..r.targets.len()).filter(|&i| r.targets[i].kind == "lease"));
        let mut header: Vec<String> = vec!["workload".into(), "unit".into()];
        header.extend(order.iter().map(|&i| r.targets[i].name.clone()));
        header.extend(["lease/tuned".into(), "target".into(), "met".into()]);
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut t = Table::new(&header);
        for c in &r.comparisons {
            let mut row = vec![c.workload.clone(), c.unit.to_string()];
            row.extend(order.iter().map(|&i| {
                c.values
                    .get(i)
                    .and_then(|v| v.value)
                    .map_or("-".into(), num)
            }));
            row.push(c.lease_vs_tuned.map_or("-".into(), |v| format!("{v:.3}")));
            row.push(c.target.clone());
            row.push(
                c.met
                    .map_or("-".into(), |met| if met { "yes" } else { "no" }.to_string()),
            );
            t.row(row);
        }
        t.render(out);
        out.push_str("  lease/tuned: a time ratio for s (lower is better), a tps ratio for tps (higher is better)\n");
        let stock_names: Vec<String> = r
            .targets
            .iter()
            .filter(|t| t.kind == "stock")
            .map(|t| t.name.clone())
            .collect();
        if !stock_names.is_empty() {
            out.push_str(
                "  what the tuning buys: the lease is N × faster than stock on that disk\n",
            );
            let mut header: Vec<&str> = vec!["workload"];
            header.extend(stock_names.iter().map(String::as_str));
            let mut t = Table::new(&header);
            for c in &r.comparisons {
                let mut row = vec![c.workload.clone()];
                row.extend(
                    c.lease_speedup_over_stock
                        .iter()
                        .map(|v| v.value.map_or("-".into(), |x| format!("{x:.2}×"))),
                );
                t.row(row);
            }
            t.render(out);
        }
        out.push_str(&format!(
            "  stock: {} on {}, as {}, initdb {}, default settings; shim {}\n",
            r.stock.data_dir,
            r.stock.filesystem,
            r.stock.os_user,
            r.stock.initdb,
            r.stock.preload.as_deref().unwrap_or("not loaded"),
        ));
        let settings: Vec<String> = r
            .tuned
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push_str(&format!(
            "  tuned: {} on {}, initdb {}, {}\n",
            r.tuned.data_dir,
            r.tuned.filesystem,
            r.tuned.initdb,
            settings.join(" ")
        ));
        out.push_str(&format!(
            "  lease: `default` template of `pglease serve {}`\n",
            r.lease_daemon_args.join(" ")
        ));
        match (&r.shim_probe, &r.shim_probe_error) {
            (Some(p), _) => {
                let kinds: Vec<String> = p
                    .kinds
                    .iter()
                    .map(|k| {
                        format!(
                            "{} {:+.2} ms{}",
                            k.name,
                            k.added_ms,
                            if k.delayed_by_design {
                                ""
                            } else {
                                " (not delayed by design)"
                            }
                        )
                    })
                    .collect();
                out.push_str(&format!(
                    "  shim probe ({}={}, {} calls each way, median added per call): {} — {}\n",
                    crate::shim::DELAY_VAR,
                    p.delay_us,
                    p.calls,
                    kinds.join(", "),
                    if p.as_designed() {
                        "as designed"
                    } else {
                        "NOT as designed"
                    }
                ));
            }
            (None, Some(error)) => out.push_str(&format!("  shim probe: did not run: {error}\n")),
            (None, None) => {}
        }
        let mapped: Vec<String> = r
            .targets
            .iter()
            .filter(|t| t.kind == "stock")
            .map(|t| {
                format!(
                    "{} {}",
                    t.name,
                    match t.shim_mapped {
                        Some(true) => "yes",
                        Some(false) => "NO",
                        None => "?",
                    }
                )
            })
            .collect();
        if !mapped.is_empty() {
            out.push_str(&format!(
                "  shim in the stock postmaster's memory map: {}\n",
                mapped.join(", ")
            ));
        }
        for check in &r.shim_in_postgres {
            out.push_str(&format!(
                "  shim in postgres at +{} ms: {} inserts made {} WAL syncs and took {} ms each (≥ the delay: {}){}\n",
                check.delay_us as f64 / 1e3,
                r.insert_rows,
                check.wal_syncs,
                format_args!("{:.3}", check.per_insert_ms),
                if check.per_insert_covers_delay { "yes" } else { "NO" },
                match (check.baseline_secs, check.extra_ms_per_sync) {
                    (Some(baseline), Some(extra)) => format!(
                        "; {} s vs {} s at +0 ms = {extra:.3} ms more per sync",
                        num(check.secs),
                        num(baseline)
                    ),
                    _ => String::new(),
                },
            ));
        }
        for target in &r.targets {
            for error in &target.errors {
                out.push_str(&format!("  error ({}): {error}\n", target.name));
            }
        }
    }

    fn render_scale(&self, out: &mut String) {
        out.push_str("\n7. Scale of the pool\n");
        let outcome = &self.scenarios.pool_scale;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        out.push_str(&format!(
            "  {} clients at once, pool of {} ({}); POST /lease as each client saw it (ms)\n",
            r.queue.clients,
            self.plan.scale_pool,
            without_template(&r.queue.daemon_args)
        ));
        let mut t = Table::new(&[
            "release", "rounds", "leases", "leases/s", "p50", "p90", "p99", "max", "errors",
        ]);
        for run in &r.queue.runs {
            t.row(vec![
                run.release.to_string(),
                run.rounds.to_string(),
                run.leases.to_string(),
                num(run.leases_per_sec),
                num(run.lease.p50_ms),
                num(run.lease.p90_ms),
                num(run.lease.p99_ms),
                num(run.lease.max_ms),
                run.errors.to_string(),
            ]);
        }
        t.render(out);
        first_errors(r.queue.runs.iter().map(|run| &run.first_error), out);
        let m = &r.memory;
        out.push_str(&format!(
            "  daemon RSS: idle {:.1} MiB; with {} open leases {:.1} MiB (peak {:.1} MiB); target ≤ 30 MiB at 1,000\n",
            m.idle.rss_kib as f64 / 1024.0,
            m.open_leases,
            m.loaded.rss_kib as f64 / 1024.0,
            m.loaded.hwm_kib as f64 / 1024.0,
        ));
        out.push_str(&format!(
            "  opening them: {:.1} s, {} clones/s (default template, --clone-concurrency 2, --min-ready 0)\n",
            m.open_secs,
            num(m.clones_per_sec)
        ));
        out.push_str("  clone time against template size (one at a time)\n");
        let mut t = Table::new(&[
            "template",
            "size",
            "create p50",
            "create max",
            "drop p50",
            "build s",
        ]);
        for p in &r.clone_size.points {
            t.row(vec![
                p.template.clone(),
                mib(p.bytes),
                num(p.create.p50_ms),
                num(p.create.max_ms),
                num(p.drop.p50_ms),
                p.build_secs.map_or("-".into(), |s| num(round3(s))),
            ]);
        }
        t.render(out);
        if let Some(skipped) = &r.clone_size.skipped {
            out.push_str(&format!("  skipped: {skipped}\n"));
        }
    }
}

impl Report {
    fn render_integresql(&self, out: &mut String) {
        out.push_str("\n8. An IntegreSQL client's suite: packages with a template each, tests that never give their database back (npm client, default options)\n");
        let outcome = &self.scenarios.integresql_suite;
        if not_done(outcome, out) {
            return;
        }
        let Some(r) = outcome.done() else { return };
        out.push_str(&format!(
            "  {} packages × {} tests = {} test databases per run; runs alternate between the servers\n",
            r.packages,
            r.tests_per_package,
            r.packages * r.tests_per_package
        ));
        let mut t = Table::new(&["server", "run", "seconds", "passed", "failed"]);
        for (i, run) in r.runs.iter().enumerate() {
            let nth = r.runs[..=i]
                .iter()
                .filter(|o| o.server == run.server)
                .count();
            t.row(vec![
                run.server.to_string(),
                nth.to_string(),
                num(run.secs),
                run.passed.to_string(),
                run.failed.to_string(),
            ]);
        }
        t.render(out);
        out.push_str(&format!(
            "  pglease median {} s; test databases recreated past the connection budget: {}\n",
            r.pglease_median_secs.map_or("-".into(), num),
            r.reclaimed
        ));
        match (r.integresql_median_secs, r.ratio) {
            (Some(other), Some(ratio)) => out.push_str(&format!(
                "  IntegreSQL median {} s; pglease / IntegreSQL (medians): {} (target ≤ 1.00)\n",
                num(other),
                num(ratio)
            )),
            _ => out.push_str(&format!(
                "  IntegreSQL: {}\n",
                r.integresql_skipped.as_deref().unwrap_or("not measured")
            )),
        }
    }
}

/// Daemon flags without `--template NAME=…` (long paths), for the tables.
fn without_template(args: &[String]) -> String {
    let mut kept = Vec::new();
    let mut skip = false;
    for arg in args {
        if skip {
            skip = false;
        } else if arg == "--template" {
            skip = true;
        } else {
            kept.push(arg.as_str());
        }
    }
    kept.join(" ")
}

/// Prints the distinct first errors of a scenario's parts.
fn first_errors<'a>(errors: impl Iterator<Item = &'a Option<String>>, out: &mut String) {
    let mut seen: Vec<&str> = Vec::new();
    for error in errors.flatten() {
        if !seen.contains(&error.as_str()) {
            seen.push(error);
            out.push_str(&format!("  first error: {error}\n"));
        }
    }
}
