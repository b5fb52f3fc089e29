//! Scenario 14's tables: one per part, each with the target beside the ratio.

use super::idle::IdleResult;
use super::libpq::LibpqRoundTrips;
use super::suite::SuiteResult;
use super::{
    ConnectCost, FrontResult, RoundTrips, CONNECT_TARGET, ROUND_TRIP_TARGET, SUITE_TARGET,
};
use crate::outcome::{not_done, Outcome};
use crate::plan::Plan;
use crate::stats::Summary;
use crate::table::{num, Table};

/// Renders scenario 14.
pub(crate) fn render(outcome: &Outcome<FrontResult>, plan: &Plan, out: &mut String) {
    out.push_str(
        "\n14. The PostgreSQL front (--front-listen) against the HTTP way, one daemon, side by side\n",
    );
    if not_done(outcome, out) {
        return;
    }
    let Some(r) = outcome.done() else { return };
    if plan.mode == "quick" {
        out.push_str(&format!(
            "  quick mode: {} queries a kind, {} connects, {} s a suite level, {} idle connections (full: 1,000)\n",
            plan.front_queries,
            plan.front_connects,
            plan.front_suite_duration.as_secs(),
            plan.front_idle_connections
        ));
    }
    out.push_str(&format!("  daemon: {}\n", r.daemon_args.join(" ")));
    out.push_str("  (a) relayed round trips, one connection, µs per query\n");
    if !not_done(&r.round_trips, out) {
        if let Some(result) = r.round_trips.done() {
            round_trips(&result.kinds, out);
            match &result.libpq {
                Some(libpq) => libpq_line(libpq, out),
                None => out.push_str("  libpq: pgbench not found, not measured\n"),
            }
        }
    }
    out.push_str("  (b) connect + SELECT 1 + close, ms\n");
    if !not_done(&r.connect, out) {
        if let Some(cost) = r.connect.done() {
            connect(cost, out);
        }
    }
    out.push_str(
        "  (c) the fixture's end-to-end test (scenario 2's), tests/s and CPU ms per test\n",
    );
    if !not_done(&r.suite, out) {
        if let Some(suite) = r.suite.done() {
            suite_table(suite, out);
        }
    }
    out.push_str("  (d) idle connections through the front, default template\n");
    if !not_done(&r.idle, out) {
        if let Some(idle) = r.idle.done() {
            idle_lines(idle, out);
        }
    }
}

/// Microseconds of a figure in ms.
fn us(ms: f64) -> String {
    format!("{:.0}", ms * 1000.0)
}

fn ratio_or_dash(value: Option<f64>) -> String {
    value.map_or("-".into(), num)
}

/// "met" or "not met" against an upper or lower bound.
fn met(value: Option<f64>, target: f64, at_most: bool) -> &'static str {
    match value {
        Some(v) if (at_most && v <= target) || (!at_most && v >= target) => "met",
        Some(_) => "not met",
        None => "-",
    }
}

fn round_trips(kinds: &[RoundTrips], out: &mut String) {
    let mut t = Table::new(&[
        "query",
        "n",
        "direct p50",
        "front p50",
        "direct p99",
        "front p99",
        "front ÷ direct p50",
        "p99",
        "added p50 µs",
        "target",
    ]);
    for k in kinds {
        t.row(vec![
            k.kind.to_string(),
            k.front.count.to_string(),
            us(k.direct.p50_ms),
            us(k.front.p50_ms),
            us(k.direct.p99_ms),
            us(k.front.p99_ms),
            ratio_or_dash(k.p50_ratio),
            ratio_or_dash(k.p99_ratio),
            format!("{:.0}", k.p50_added_us),
            format!(
                "≤ {:.2} {}",
                ROUND_TRIP_TARGET,
                met(k.p50_ratio, ROUND_TRIP_TARGET, true)
            ),
        ]);
    }
    t.render(out);
}

fn libpq_line(l: &LibpqRoundTrips, out: &mut String) {
    let runs = |ms: &[f64]| ms.iter().map(|m| us(*m)).collect::<Vec<_>>().join(" / ");
    out.push_str(&format!(
        "  libpq ({}): direct {} µs, front {} µs: front ÷ direct {} (target ≤ {ROUND_TRIP_TARGET:.2}: {})\n",
        l.method,
        runs(&l.direct_runs_ms),
        runs(&l.front_runs_ms),
        ratio_or_dash(l.front_over_direct),
        met(l.front_over_direct, ROUND_TRIP_TARGET, true),
    ));
    if let Some(error) = &l.error {
        out.push_str(&format!("  libpq: {error}\n"));
    }
}

fn connect(c: &ConnectCost, out: &mut String) {
    let mut t = Table::new(&["path", "step", "p50", "p99", "n"]);
    let mut row = |path: &str, step: &str, s: &Summary| {
        t.row(vec![
            path.into(),
            step.into(),
            num(s.p50_ms),
            num(s.p99_ms),
            s.count.to_string(),
        ])
    };
    row("front", "connect (lease included)", &c.front_connect);
    row("front", "connect + SELECT 1 + close", &c.front_cycle);
    row("HTTP", "POST /lease", &c.http_lease);
    row("HTTP", "POST /lease + connect", &c.http_lease_connect);
    row("HTTP", "DELETE /leases/{id}", &c.http_release);
    row(
        "HTTP",
        "lease + connect + SELECT 1 + close + release",
        &c.http_cycle,
    );
    t.render(out);
    out.push_str(&format!(
        "  front connect ÷ (POST /lease + connect): p50 {} (target ≤ {CONNECT_TARGET}: {}), p99 {}; whole cycle p50 {}\n",
        ratio_or_dash(c.connect_ratio),
        met(c.connect_ratio, CONNECT_TARGET, true),
        ratio_or_dash(c.connect_ratio_p99),
        ratio_or_dash(c.cycle_ratio),
    ));
    if let Some(error) = &c.first_error {
        out.push_str(&format!("  {} failed; first: {error}\n", c.errors));
    }
}

fn suite_table(s: &SuiteResult, out: &mut String) {
    let mut t = Table::new(&[
        "workers",
        "HTTP tests/s",
        "front tests/s",
        "front ÷ HTTP",
        "target",
        "HTTP CPU ms/test",
        "front CPU ms/test",
        "HTTP lease+connect p50",
        "front connect p50",
    ]);
    for l in &s.levels {
        let http_connect = l.http.lease.p50_ms + l.http.connect.p50_ms;
        t.row(vec![
            l.workers.to_string(),
            num(l.http.tests_per_sec),
            num(l.front.tests_per_sec),
            ratio_or_dash(l.front_over_http),
            format!(
                "≥ {SUITE_TARGET:.2} {}",
                met(l.front_over_http, SUITE_TARGET, false)
            ),
            l.http.cpu_ms_per_test.map(num).unwrap_or_default(),
            l.front.cpu_ms_per_test.map(num).unwrap_or_default(),
            num(http_connect),
            num(l.front.connect.p50_ms),
        ]);
    }
    t.render(out);
    out.push_str(&format!(
        "  double leases: {}, missing databases: {} (both must be 0)\n",
        s.double_leases, s.missing_databases
    ));
    for l in &s.levels {
        for (path, errors, first) in [
            ("HTTP", l.http.errors, &l.http.first_error),
            ("front", l.front.errors, &l.front.first_error),
        ] {
            if let Some(first) = first {
                out.push_str(&format!(
                    "  {} workers, {path}: {errors} errors; first: {first}\n",
                    l.workers
                ));
            }
        }
    }
}

fn idle_lines(i: &IdleResult, out: &mut String) {
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    out.push_str(&format!("  daemon: {}\n", i.daemon_args.join(" ")));
    out.push_str(&format!(
        "  opened {} of {} in {:.2} s ({} /s); leased while held: {}; postgres max_connections {}\n",
        i.opened,
        i.wanted,
        i.open_secs,
        num(i.connects_per_sec),
        i.leased_while_held,
        i.max_connections.as_deref().unwrap_or("?"),
    ));
    out.push_str(&format!(
        "  daemon RSS: {} before, {} with them open (peak {}): {} KiB a connection; {} open files\n",
        mib(i.daemon_before.rss_kib),
        mib(i.daemon_after.rss_kib),
        mib(i.daemon_after.hwm_kib),
        i.daemon_kib_per_connection
            .map_or("-".into(), |k| format!("{k:.1}")),
        i.daemon_open_files.map_or("?".into(), |n| n.to_string()),
    ));
    if let (Some(before), Some(after)) = (i.postgres_before, i.postgres_after) {
        out.push_str(&format!(
            "  postgres PSS (postmaster and children): {} in {} processes before, {} in {} after: {} KiB a backend\n",
            mib(before.pss_kib),
            before.processes,
            mib(after.pss_kib),
            after.processes,
            i.postgres_kib_per_connection
                .map_or("-".into(), |k| format!("{k:.0}")),
        ));
    }
    if let Some((daemon, driver)) = &i.open_files_limits {
        out.push_str(&format!(
            "  open files limit: daemon {daemon}, driver {driver}; released all in {}\n",
            i.released_secs
                .map_or("(not within a minute)".into(), |s| format!("{s:.2} s")),
        ));
    }
    if let Some(error) = &i.first_error {
        out.push_str(&format!("  an opener stopped at: {error}\n"));
    }
}
