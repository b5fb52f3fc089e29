//! The text the report's and the scenarios' tables are made of: the table itself and the
//! way figures are written.

use crate::cpu::CpuUse;

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

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
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
pub(crate) fn busy_cores(cpu: Option<CpuUse>) -> String {
    cpu.map_or("-".into(), |c| format!("{:.2}/{}", c.busy_cores, c.cores))
}

pub(crate) fn mib(bytes: i64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_048_576.0)
}

/// Daemon flags without `--template NAME=…` (long paths), for the tables.
pub(crate) fn without_template(args: &[String]) -> String {
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
pub(crate) fn first_errors<'a>(errors: impl Iterator<Item = &'a Option<String>>, out: &mut String) {
    let mut seen: Vec<&str> = Vec::new();
    for error in errors.flatten() {
        if !seen.contains(&error.as_str()) {
            seen.push(error);
            out.push_str(&format!("  first error: {error}\n"));
        }
    }
}
