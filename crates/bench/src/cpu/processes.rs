//! Whose CPU it was: the postgres servers a daemon runs (each postmaster and every backend,
//! those that exited too: the postmaster reaps them, so their time is in its children's
//! counters), the pglease daemon itself, this driver, and the rest of the machine, from
//! `/proc/<pid>/stat`. It turns "a test costs 6 CPU ms more than the raw loop" into where
//! those milliseconds are spent.

use std::collections::HashMap;

use serde::Serialize;

use crate::stats::round3;

/// CPU ticks of each party at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Ticks {
    postgres: u64,
    /// Of `postgres`, processes that exited (and were reaped) since the postmaster started.
    postgres_exited: u64,
    /// The postgres processes running now, by pid, and their own ticks: one that exits
    /// later brings these along into `postgres_exited`, though they were spent before.
    postgres_running: HashMap<u32, u64>,
    daemon: u64,
    driver: u64,
}

/// CPU time of each party over a stretch, ms.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ByProcess {
    /// The daemon's postgres servers: postmasters, backends (exited ones included), and
    /// their auxiliary processes.
    pub postgres_ms: f64,
    /// Of `postgres_ms`, the backends that exited within the stretch: mostly the tests'
    /// own sessions; the rest (admin connections, checkpointer, …) were still running.
    pub postgres_exited_ms: f64,
    /// The pglease daemon's own threads.
    pub daemon_ms: f64,
    /// This benchmark driver (its HTTP and postgres clients).
    pub driver_ms: f64,
    /// Everything else busy on the machine (the kernel's own threads, other programs).
    pub other_ms: f64,
}

impl ByProcess {
    /// Each party's ms per unit of work.
    pub fn per(&self, units: usize) -> Option<ByProcess> {
        let n = (units > 0).then_some(units as f64)?;
        Some(ByProcess {
            postgres_ms: round3(self.postgres_ms / n),
            postgres_exited_ms: round3(self.postgres_exited_ms / n),
            daemon_ms: round3(self.daemon_ms / n),
            driver_ms: round3(self.driver_ms / n),
            other_ms: round3(self.other_ms / n),
        })
    }
}

/// One process's line of `/proc/<pid>/stat`, the fields used here.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    pid: u32,
    ppid: u32,
    comm: String,
    /// utime + stime.
    own: u64,
    /// cutime + cstime: children it has waited for.
    reaped: u64,
}

/// The ticks of `daemon`, the postgres servers it started, and this process, now.
pub(super) fn read(daemon: u32) -> Option<Ticks> {
    let stats: Vec<Stat> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?.parse::<u32>().ok()?;
            let text = std::fs::read_to_string(entry_path(&name)).ok()?;
            parse_stat(&text)
        })
        .collect();
    Some(attribute(&stats, daemon, std::process::id()))
}

/// The pids of the postgres servers `daemon` runs: each postmaster (a child of the daemon
/// named `postgres`) and its children (backends and auxiliary processes), as [`read`]
/// counts them. Scenario 14 sums their memory.
pub(crate) fn postgres_pids(daemon: u32) -> Vec<u32> {
    let stats: Vec<Stat> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?.parse::<u32>().ok()?;
            parse_stat(&std::fs::read_to_string(entry_path(&name)).ok()?)
        })
        .collect();
    let postmasters: Vec<u32> = stats
        .iter()
        .filter(|s| s.ppid == daemon && s.comm == "postgres")
        .map(|s| s.pid)
        .collect();
    stats
        .iter()
        .filter(|s| postmasters.contains(&s.pid) || postmasters.contains(&s.ppid))
        .map(|s| s.pid)
        .collect()
}

fn entry_path(name: &std::ffi::OsStr) -> std::path::PathBuf {
    std::path::Path::new("/proc").join(name).join("stat")
}

/// Sums the parties' ticks out of every process's stat.
fn attribute(stats: &[Stat], daemon: u32, driver: u32) -> Ticks {
    let own = |pid: u32| stats.iter().find(|s| s.pid == pid).map_or(0, |s| s.own);
    let postmasters: Vec<&Stat> = stats
        .iter()
        .filter(|s| s.ppid == daemon && s.comm == "postgres")
        .collect();
    let children = |pm: &Stat| {
        let pid = pm.pid;
        stats.iter().filter(move |s| s.ppid == pid)
    };
    let postgres = postmasters
        .iter()
        .map(|pm| pm.own + pm.reaped + children(pm).map(|s| s.own + s.reaped).sum::<u64>())
        .sum();
    let postgres_exited = postmasters
        .iter()
        .map(|pm| pm.reaped + children(pm).map(|s| s.reaped).sum::<u64>())
        .sum();
    let postgres_running = postmasters
        .iter()
        .flat_map(|pm| children(pm).map(|s| (s.pid, s.own)))
        .collect();
    Ticks {
        postgres,
        postgres_exited,
        postgres_running,
        daemon: own(daemon),
        driver: own(driver),
    }
}

/// The parties' share of `busy_ms` between two readings.
pub(super) fn split(before: &Ticks, now: &Ticks, busy_ms: f64) -> Option<ByProcess> {
    let ms_per_tick = 1000.0 / ticks_per_second()?;
    let ms = |b: u64, n: u64| n.saturating_sub(b) as f64 * ms_per_tick;
    let postgres_ms = ms(before.postgres, now.postgres);
    // What processes that were running at the start had spent by then went into the
    // reaped counters with them: not spent in the stretch.
    let spent_before: u64 = before
        .postgres_running
        .iter()
        .filter(|(pid, _)| !now.postgres_running.contains_key(pid))
        .map(|(_, own)| own)
        .sum();
    let postgres_exited_ms = ms(before.postgres_exited + spent_before, now.postgres_exited);
    let daemon_ms = ms(before.daemon, now.daemon);
    let driver_ms = ms(before.driver, now.driver);
    Some(ByProcess {
        postgres_ms: round3(postgres_ms),
        postgres_exited_ms: round3(postgres_exited_ms),
        daemon_ms: round3(daemon_ms),
        driver_ms: round3(driver_ms),
        other_ms: round3((busy_ms - postgres_ms - daemon_ms - driver_ms).max(0.0)),
    })
}

fn ticks_per_second() -> Option<f64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    (ticks > 0).then_some(ticks as f64)
}

/// `pid (comm) state ppid … utime stime cutime cstime …` (fields 14–17); comm may hold
/// spaces and parentheses, so the fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state).
    let field = |n: usize| rest.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        pid,
        ppid: u32::try_from(field(4)?).ok()?,
        comm,
        own: field(14)? + field(15)?,
        reaped: field(16)? + field(17)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, ppid: u32, comm: &str, own: u64, reaped: u64) -> Stat {
        Stat {
            pid,
            ppid,
            comm: comm.into(),
            own,
            reaped,
        }
    }

    #[test]
    fn parses_a_stat_line_whose_name_has_spaces_and_parentheses() {
        let line =
            "4242 (tokio (rt) 1) S 17 4242 17 0 -1 4194560 1 0 0 0 250 31 7 2 20 0 9 0 1 2 3\n";
        assert_eq!(
            parse_stat(line),
            Some(stat(4242, 17, "tokio (rt) 1", 281, 9))
        );
        assert_eq!(parse_stat("12 (x) S 1 2"), None, "too few fields");
    }

    #[test]
    fn postgres_is_the_daemons_postmasters_and_their_children() {
        let stats = [
            stat(10, 1, "pglease", 100, 5_000),
            stat(20, 10, "postgres", 30, 400),
            stat(21, 20, "postgres", 7, 0),
            stat(22, 20, "postgres", 3, 1),
            stat(30, 10, "sh", 50, 0),
            stat(40, 1, "postgres", 1_000, 0),
            stat(50, 1, "bench", 60, 0),
        ];
        assert_eq!(
            attribute(&stats, 10, 50),
            Ticks {
                postgres: 30 + 400 + 7 + 3 + 1,
                postgres_exited: 400 + 1,
                postgres_running: HashMap::from([(21, 7), (22, 3)]),
                daemon: 100,
                driver: 60,
            }
        );
    }

    #[test]
    fn a_backend_that_exits_brings_only_its_time_in_the_stretch_into_exited() {
        let tick_ms = 1000.0 / ticks_per_second().expect("CLK_TCK");
        let before = Ticks {
            postgres: 1_000,
            postgres_exited: 500,
            postgres_running: HashMap::from([(21, 300), (22, 100)]),
            ..Ticks::default()
        };
        // 21 spent 20 more ticks and exited; 22 spent 5 more and runs on.
        let now = Ticks {
            postgres: 1_025,
            postgres_exited: 500 + 320,
            postgres_running: HashMap::from([(22, 105)]),
            ..Ticks::default()
        };
        let split = split(&before, &now, 1_000.0).expect("CLK_TCK");
        assert_eq!(split.postgres_ms, round3(25.0 * tick_ms));
        assert_eq!(split.postgres_exited_ms, round3(20.0 * tick_ms));
    }

    #[test]
    fn this_process_reads_its_own_time() {
        let before = read(u32::MAX).expect("/proc on Linux");
        let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
        let mut x = 0u64;
        while std::time::Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let now = read(u32::MAX).expect("/proc on Linux");
        let split = split(&before, &now, 1_000.0).expect("CLK_TCK");
        assert!(split.driver_ms >= 100.0, "{split:?}");
        assert_eq!((split.postgres_ms, split.daemon_ms), (0.0, 0.0));
    }
}
