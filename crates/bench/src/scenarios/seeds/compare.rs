//! Scenario 6's judgement of its figures: one row per workload with the lease's ratio
//! to the hand-tuned server and its speed-up over each stock one, and the shim seen
//! through the stock inserts.

use super::{Comparison, NamedValue, ShimCheck, TargetResult};
use crate::stats::round3;

/// The target "lease within 5% of hand-tuned": time ratio at most this…
const TIME_TARGET: f64 = 1.05;
/// …and tps ratio at least this.
const TPS_TARGET: f64 = 0.95;

/// One row per workload, every target's figure, and the ratios.
pub fn comparisons(targets: &[TargetResult], scale: u32) -> Vec<Comparison> {
    let mut rows: Vec<(String, &'static str, Vec<NamedValue>)> = Vec::new();
    let values = |figure: &dyn Fn(&TargetResult) -> Option<f64>| -> Vec<NamedValue> {
        targets
            .iter()
            .map(|t| NamedValue {
                target: t.name.clone(),
                value: figure(t),
            })
            .collect()
    };
    let rows_run = targets
        .iter()
        .find_map(|t| t.inserts.as_ref().map(|i| i.rows))
        .unwrap_or(0);
    rows.push((
        format!("{rows_run} inserts"),
        "s",
        values(&|t| t.inserts.as_ref().map(|i| i.secs)),
    ));
    rows.push((
        format!("pgbench -i -s {scale}"),
        "s",
        values(&|t| t.pgbench_init.as_ref().map(|i| i.secs)),
    ));
    let mut clients: Vec<usize> = targets
        .iter()
        .flat_map(|t| t.pgbench_runs.iter().map(|r| r.clients))
        .collect();
    clients.sort_unstable();
    clients.dedup();
    for n in clients {
        rows.push((
            format!("pgbench -c {n} -j {n}"),
            "tps",
            values(&|t| {
                t.pgbench_runs
                    .iter()
                    .find(|r| r.clients == n)
                    .map(|r| r.figures.tps)
            }),
        ));
    }
    rows.into_iter()
        .map(|(workload, unit, values)| compare(workload, unit, values, targets))
        .collect()
}

fn compare(
    workload: String,
    unit: &'static str,
    values: Vec<NamedValue>,
    targets: &[TargetResult],
) -> Comparison {
    let of_kind = |kind: &str| {
        targets
            .iter()
            .zip(&values)
            .find(|(t, _)| t.kind == kind)
            .and_then(|(_, v)| v.value)
            .filter(|v| *v > 0.0)
    };
    let (lease, tuned) = (of_kind("lease"), of_kind("tuned"));
    let higher_is_better = unit == "tps";
    let lease_vs_tuned = lease.zip(tuned).map(|(l, t)| round3(l / t));
    let (target, met) = if higher_is_better {
        (
            format!("≥ {TPS_TARGET:.2}"),
            lease_vs_tuned.map(|r| r >= TPS_TARGET),
        )
    } else {
        (
            format!("≤ {TIME_TARGET:.2}"),
            lease_vs_tuned.map(|r| r <= TIME_TARGET),
        )
    };
    let lease_speedup_over_stock = targets
        .iter()
        .zip(&values)
        .filter(|(t, _)| t.kind == "stock")
        .map(|(t, v)| NamedValue {
            target: t.name.clone(),
            value: lease.zip(v.value.filter(|s| *s > 0.0)).map(|(l, s)| {
                if higher_is_better {
                    round3(l / s)
                } else {
                    round3(s / l)
                }
            }),
        })
        .collect();
    Comparison {
        workload,
        unit,
        values,
        lease_vs_tuned,
        target,
        met,
        lease_speedup_over_stock,
    }
}

/// The stock inserts at each delay against those at delay 0.
pub fn shim_checks(targets: &[TargetResult]) -> Vec<ShimCheck> {
    let baseline = targets
        .iter()
        .filter(|t| t.kind == "stock" && t.fsync_delay_us == Some(0))
        .find_map(|t| t.inserts.as_ref().map(|i| i.secs));
    targets
        .iter()
        .filter(|t| t.kind == "stock")
        .filter_map(|t| Some((t.fsync_delay_us.filter(|&d| d > 0)?, t.inserts.clone()?)))
        .map(|(delay_us, figures)| {
            let wal_syncs = figures.wal_syncs.unwrap_or(0);
            let delay_ms = delay_us as f64 / 1e3;
            let syncs_per_insert = wal_syncs as f64 / figures.rows.max(1) as f64;
            ShimCheck {
                delay_us,
                secs: figures.secs,
                wal_syncs,
                per_insert_ms: figures.per_insert_ms,
                per_insert_covers_delay: wal_syncs > 0
                    && figures.per_insert_ms >= delay_ms * syncs_per_insert.min(1.0),
                baseline_secs: baseline,
                extra_ms_per_sync: baseline
                    .filter(|_| wal_syncs > 0)
                    .map(|baseline| round3((figures.secs - baseline) * 1e3 / wal_syncs as f64)),
            }
        })
        .collect()
}
