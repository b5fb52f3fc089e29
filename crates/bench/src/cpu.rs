//! Machine-wide CPU use over a stretch of a scenario, from `/proc/stat`: how many cores
//! were busy, and busy CPU time per unit of work (a test, a create+drop cycle).
//!
//! It explains throughput that stops growing with concurrency: when the cores are busy,
//! tests per second is bounded by CPU time per test, and a test that does more than the
//! raw create+drop loop (connect, its transaction, the daemon's role and grants) costs
//! more CPU per unit.

use std::time::Instant;

use serde::Serialize;

use crate::stats::round3;

mod processes;
pub(crate) use processes::postgres_pids;
pub use processes::ByProcess;

/// A reading of the machine's CPU counters, to measure from.
pub struct CpuClock {
    at: Instant,
    counters: Option<Counters>,
    /// The daemon whose share is split out, and the parties' ticks at the start.
    processes: Option<(u32, processes::Ticks)>,
}

/// CPU use between a [`CpuClock`] and now.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuUse {
    /// Cores on the machine.
    pub cores: usize,
    /// Average number of cores busy (user, system, interrupts, steal), 0 to `cores`.
    pub busy_cores: f64,
    /// Busy CPU time in the stretch, ms (`busy_cores` × wall time).
    pub busy_ms: f64,
    /// That time by party, when the clock watched a daemon.
    pub by_process: Option<ByProcess>,
}

impl CpuUse {
    /// Busy CPU ms per unit of work, or None without units.
    pub fn ms_per(&self, units: usize) -> Option<f64> {
        (units > 0).then(|| round3(self.busy_ms / units as f64))
    }

    /// Each party's CPU ms per unit of work, when the clock watched a daemon.
    pub fn by_process_per(&self, units: usize) -> Option<ByProcess> {
        self.by_process?.per(units)
    }
}

/// The aggregate `cpu` line of `/proc/stat`, in clock ticks.
#[derive(Clone, Copy)]
struct Counters {
    busy: u64,
    total: u64,
    cores: usize,
}

impl CpuClock {
    pub fn start() -> Self {
        CpuClock {
            at: Instant::now(),
            counters: read_counters(),
            processes: None,
        }
    }

    /// Like [`CpuClock::start`], and splits the busy time into the postgres servers that
    /// `daemon` (a pid) started, the daemon, this driver and the rest.
    pub fn watching(daemon: u32) -> Self {
        let processes = processes::read(daemon).map(|ticks| (daemon, ticks));
        CpuClock {
            processes,
            ..CpuClock::start()
        }
    }

    /// CPU use since [`CpuClock::start`]; None where `/proc/stat` cannot be read.
    pub fn since(&self) -> Option<CpuUse> {
        let wall = self.at.elapsed();
        let before = self.counters?;
        let now = read_counters()?;
        let total = now.total.checked_sub(before.total)?;
        let busy = now.busy.checked_sub(before.busy)?;
        if total == 0 {
            return None;
        }
        let busy_cores = busy as f64 / total as f64 * now.cores as f64;
        let busy_ms = busy_cores * wall.as_secs_f64() * 1000.0;
        let by_process = self.processes.as_ref().and_then(|(daemon, before)| {
            processes::split(before, &processes::read(*daemon)?, busy_ms)
        });
        Some(CpuUse {
            cores: now.cores,
            busy_cores: round3(busy_cores),
            busy_ms: round3(busy_ms),
            by_process,
        })
    }
}

fn read_counters() -> Option<Counters> {
    parse_counters(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`; guest time is
/// already counted in user, so it is left out; idle and iowait are not busy.
fn parse_counters(stat: &str) -> Option<Counters> {
    let mut lines = stat.lines();
    let fields: Vec<u64> = lines
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = fields[..] else {
        return None;
    };
    let cores = lines
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    let busy = user + nice + system + irq + softirq + steal;
    Some(Counters {
        busy,
        total: busy + idle + iowait,
        cores: cores.max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_busy_and_total_ticks_and_counts_cores() {
        let stat = "cpu  100 5 50 800 20 3 2 10 7 0\ncpu0 50 2 25 400 10 1 1 5 3 0\ncpu1 50 3 25 400 10 2 1 5 4 0\nintr 1 2\n";
        let c = parse_counters(stat).expect("parsed");
        assert_eq!((c.busy, c.total, c.cores), (170, 990, 2));
        assert!(parse_counters("cpu  1 2 3\n").is_none(), "too few fields");
        assert!(parse_counters("intr 1\n").is_none());
    }

    #[test]
    fn a_busy_loop_shows_as_busy_cpu() {
        let clock = CpuClock::start();
        let until = Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let used = clock.since().expect("/proc/stat on Linux");
        assert!(used.busy_cores > 0.5, "{used:?}");
        assert!(used.busy_ms > 150.0, "{used:?}");
        assert_eq!(used.ms_per(0), None);
    }
}
