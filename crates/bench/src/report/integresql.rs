//! The table of scenario 8: an IntegreSQL client's suite against pglease and IntegreSQL.

use super::Report;
use crate::outcome::not_done;
use crate::table::{num, Table};

impl Report {
    pub(super) fn render_integresql(&self, out: &mut String) {
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
