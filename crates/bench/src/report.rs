//! The report: one JSON object (machine, plan, one object per scenario) and the
//! readable tables printed from it. Printing reads the typed results; it judges nothing
//! except the targets the issue names, which it shows beside the figures.
//!
//! Here: the report's types and the header; the tables of scenarios 1–8 are in
//! `lease` (1–3), `daemon` (4, 5, 7), `seeds` (6) and `integresql` (8), those of 9 and
//! later with their scenarios. How a scenario ended (`Outcome`) and the text tables are
//! made of (`table`) are modules of their own below both this and the scenarios, so that
//! a scenario printing its table does not import the report that lists it.

mod daemon;
mod integresql;
mod lease;
mod seeds;

use serde::Serialize;

use crate::machine::MachineInfo;
use crate::outcome::{not_done, Outcome};
use crate::plan::Plan;
use crate::scenarios::ceiling::CeilingResult;
use crate::scenarios::connect::ConnectResult;
use crate::scenarios::cow::{self, CowResult};
use crate::scenarios::dumps::{self, DumpsResult};
use crate::scenarios::front::{self, FrontResult};
use crate::scenarios::integresql::SuiteResult;
use crate::scenarios::latency::LatencyResult;
use crate::scenarios::majors::{self, MajorsResult};
use crate::scenarios::reuse::{self, ReuseResult};
use crate::scenarios::scale::ScaleResult;
use crate::scenarios::seeds::SeedsResult;
use crate::scenarios::snapshots::{self, SnapshotsResult};
use crate::scenarios::startup::StartupResult;
use crate::scenarios::throughput::ThroughputResult;
use crate::table::mib;

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
    /// 14: the PostgreSQL front against the HTTP way.
    pub front: Outcome<FrontResult>,
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
        front::render(&self.scenarios.front, &self.plan, &mut out);
        out.push_str(&format!(
            "\nisolation: {}\n",
            if self.isolation_ok {
                "OK (0 double leases, 0 missing databases)"
            } else {
                "FAILED — see scenarios 2 and 14"
            }
        ));
        out
    }
}
