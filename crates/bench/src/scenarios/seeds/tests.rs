//! Scenario 6's pure parts: pgbench's output, the comparisons, the shim check, the
//! order of the steps, the names and the tuned settings.

use super::pgbench::parse_pgbench;
use super::servers::{stock_name, tuned_settings};
use super::workloads::step_order;
use super::*;

/// pgbench 15's output of a `-T` run.
const PG15_RUN: &str = "\
pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: TPC-B (sort of)>
scaling factor: 1
query mode: simple
number of clients: 2
number of threads: 2
maximum number of tries: 1
duration: 2 s
number of transactions actually processed: 6641
number of failed transactions: 0 (0.000%)
latency average = 0.600 ms
initial connection time = 9.461 ms
tps = 3335.370750 (without initial connection time)
";

/// pgbench 13's: two tps lines.
const PG13_RUN: &str = "\
number of transactions actually processed: 1200
latency average = 2.500 ms
tps = 398.100000 (including connections establishing)
tps = 400.200000 (excluding connections establishing)
";

#[test]
fn parses_pgbench_15() {
    let figures = parse_pgbench(PG15_RUN).expect("figures");
    assert_eq!(
        figures,
        PgbenchFigures {
            tps: 3335.371,
            latency_avg_ms: Some(0.6),
            transactions: Some(6641),
            failed_transactions: Some(0),
        }
    );
}

#[test]
fn parses_older_pgbench_and_takes_the_tps_without_connections() {
    let figures = parse_pgbench(PG13_RUN).expect("figures");
    assert_eq!(figures.tps, 400.2);
    assert_eq!(figures.transactions, Some(1200));
    assert_eq!(figures.failed_transactions, None);
}

#[test]
fn a_run_without_tps_is_an_error() {
    assert!(parse_pgbench("pgbench: error: connection failed\n").is_err());
    assert!(parse_pgbench("tps = fast\n").is_err());
}

fn target(
    name: &str,
    kind: &'static str,
    delay: Option<u64>,
    secs: f64,
    syncs: Option<i64>,
    tps: f64,
) -> TargetResult {
    let mut t = TargetResult::new(name.into(), kind, delay);
    t.inserts = Some(InsertFigures {
        rows: 1000,
        secs,
        per_insert_ms: secs,
        wal_syncs: syncs,
    });
    t.pgbench_init = Some(InitFigures {
        secs: secs / 2.0,
        summary: None,
    });
    t.pgbench_runs.push(PgbenchRun {
        clients: 1,
        duration_secs: 2.0,
        figures: PgbenchFigures {
            tps,
            latency_avg_ms: None,
            transactions: None,
            failed_transactions: None,
        },
    });
    t
}

fn sample() -> Vec<TargetResult> {
    vec![
        target("lease", "lease", None, 1.04, None, 950.0),
        target("tuned", "tuned", None, 1.0, Some(0), 1000.0),
        target("stock+0ms", "stock", Some(0), 3.0, Some(1002), 400.0),
        target("stock+1ms", "stock", Some(1000), 4.1, Some(1002), 190.0),
    ]
}

#[test]
fn compares_the_lease_with_tuned_and_stock() {
    let rows = comparisons(&sample(), 1);
    assert_eq!(rows.len(), 3, "inserts, init, one pgbench run");
    let inserts = &rows[0];
    assert_eq!(inserts.workload, "1000 inserts");
    assert_eq!(inserts.lease_vs_tuned, Some(1.04));
    assert_eq!(inserts.met, Some(true), "a time ratio of 1.04 is within 5%");
    assert_eq!(inserts.lease_speedup_over_stock[0].value, Some(2.885));
    let tps = &rows[2];
    assert_eq!(tps.unit, "tps");
    assert_eq!(tps.lease_vs_tuned, Some(0.95));
    assert_eq!(tps.met, Some(true), "a tps ratio of 0.95 is the limit");
    assert_eq!(tps.lease_speedup_over_stock[1].value, Some(5.0));
}

#[test]
fn a_slow_lease_misses_the_target_and_a_missing_figure_judges_nothing() {
    let mut targets = sample();
    if let Some(inserts) = targets[0].inserts.as_mut() {
        inserts.secs = 1.2;
    }
    targets[1].pgbench_runs.clear();
    let rows = comparisons(&targets, 1);
    assert_eq!(rows[0].met, Some(false));
    assert_eq!(rows[2].lease_vs_tuned, None);
    assert_eq!(rows[2].met, None);
}

#[test]
fn the_shim_check_divides_the_extra_time_by_the_syncs() {
    let checks = shim_checks(&sample());
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].delay_us, 1000);
    assert_eq!(checks[0].extra_ms_per_sync, Some(1.098));
    // 4.1 ms per INSERT (the sample's per_insert_ms) covers a 1 ms delay.
    assert!(checks[0].per_insert_covers_delay);
}

#[test]
fn inserts_faster_than_the_delay_fail_the_shim_check() {
    let mut targets = sample();
    if let Some(inserts) = targets[3].inserts.as_mut() {
        inserts.per_insert_ms = 0.5;
    }
    targets.remove(2);
    let checks = shim_checks(&targets);
    assert!(!checks[0].per_insert_covers_delay);
    assert_eq!(checks[0].baseline_secs, None, "no stock+0ms run");
    assert_eq!(checks[0].extra_ms_per_sync, None);
}

#[test]
fn the_first_target_alternates_between_steps() {
    assert_eq!(step_order(0, 2), vec![0, 1]);
    assert_eq!(step_order(1, 2), vec![1, 0]);
    assert_eq!(step_order(2, 2), vec![0, 1]);
    assert_eq!(step_order(3, 1), vec![0]);
}

#[test]
fn names_the_delays() {
    assert_eq!(stock_name(0), "stock+0ms");
    assert_eq!(stock_name(5_000), "stock+5ms");
    assert_eq!(stock_name(500), "stock+0.5ms");
}

#[test]
fn tuned_settings_follow_the_daemon() {
    let mut reported = serde_json::Map::new();
    reported.insert("max_connections".into(), "350".into());
    reported.insert("fsync".into(), "off".into());
    let settings = tuned_settings(&reported);
    let get = |key: &str| {
        settings
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("max_connections"), Some("350"));
    assert_eq!(get("wal_level"), Some("minimal"));
    assert_eq!(get("max_wal_senders"), Some("0"));
    assert_eq!(get("dynamic_shared_memory_type"), Some("mmap"));
    assert_eq!(get("shared_buffers"), Some("128MB"));
    let mut keys: Vec<&str> = settings.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), settings.len(), "a setting given twice");
}
