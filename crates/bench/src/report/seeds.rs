//! The tables of scenario 6: the seeds' workloads on the stock, hand-tuned and pglease
//! targets, their set-ups and the shim's checks.

use super::Report;
use crate::outcome::not_done;
use crate::table::{num, Table};

impl Report {
    pub(super) fn render_seeds(&self, out: &mut String) {
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
}
