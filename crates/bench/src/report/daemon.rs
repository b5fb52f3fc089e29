//! The tables of scenarios 4, 5 and 7: a daemon's start-up, the cost of a connection,
//! and the scale of the pool.

use super::Report;
use crate::outcome::not_done;
use crate::stats::round3;
use crate::table::{first_errors, mib, num, without_template, Table};

impl Report {
    pub(super) fn render_startup(&self, out: &mut String) {
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

    pub(super) fn render_connect(&self, out: &mut String) {
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

    pub(super) fn render_scale(&self, out: &mut String) {
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
