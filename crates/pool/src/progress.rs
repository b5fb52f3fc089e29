//! Where a long build is, while it runs: a command that reports progress (a dump's
//! restore) registers a [`Live`] entry on its session's [`Board`] for its template, counts
//! into it from its output, and the entry goes when the command ends. The log reads it every
//! few seconds; `/status` and `GET /templates/{name}` read it when asked. It is a module of
//! its own, below both, because the session carries the board (one per server) and the
//! template builds write on it: the session never names the template module.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::names::TemplateName;
use crate::types::BuildProgress;

/// The builds in progress of one server, by template. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<HashMap<TemplateName, Live>>>);

/// One build's progress.
#[derive(Debug, Clone)]
pub struct Live {
    /// What runs, e.g. `restoring /data/prod.dump`.
    pub step: String,
    /// Entries expected, when known.
    pub total: Option<u64>,
    /// Entries done so far, counted by the output readers.
    pub done: Arc<AtomicU64>,
    /// When the step started.
    pub started: Instant,
}

impl Board {
    /// Registers `live` for `template` until the returned guard is dropped.
    pub fn show(&self, template: &TemplateName, live: Live) -> Shown {
        if let Ok(mut map) = self.0.lock() {
            map.insert(template.clone(), live);
        }
        Shown {
            board: self.clone(),
            template: template.clone(),
        }
    }

    /// The progress of `template`'s build, if one is running and reports.
    pub fn get(&self, template: &TemplateName) -> Option<BuildProgress> {
        let map = self.0.lock().ok()?;
        map.get(template).map(Live::report)
    }
}

/// Removes its entry when dropped (the build ended, failed or was cancelled).
#[derive(Debug)]
pub struct Shown {
    board: Board,
    template: TemplateName,
}

impl Drop for Shown {
    fn drop(&mut self) {
        if let Ok(mut map) = self.board.0.lock() {
            map.remove(&self.template);
        }
    }
}

impl Live {
    /// Where it is now.
    pub fn report(&self) -> BuildProgress {
        estimate(
            &self.step,
            self.done.load(Ordering::Relaxed),
            self.total,
            self.started.elapsed(),
        )
    }
}

/// done of total, with a share and an estimate of the time left (by entries, so one big
/// table skews it).
pub fn estimate(step: &str, done: u64, total: Option<u64>, elapsed: Duration) -> BuildProgress {
    let total = total.filter(|&t| t > 0);
    // Serial entries count as they begin: the one still running is not done.
    let done = total.map_or(done, |t| done.min(t.saturating_sub(1)));
    let share = total.map(|t| done as f64 / t as f64);
    let eta_secs = share.filter(|&s| s > 0.0).map(|s| {
        let elapsed = elapsed.as_secs_f64();
        (elapsed / s - elapsed).max(0.0) as u64
    });
    BuildProgress {
        step: step.to_owned(),
        done,
        total,
        percent: share.map(|s| (s * 100.0).round() as u64),
        elapsed_secs: elapsed.as_secs(),
        eta_secs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_estimate_counts_the_running_entry_as_not_done() {
        let p = estimate("restoring x", 10, Some(10), Duration::from_secs(9));
        assert_eq!((p.done, p.percent, p.eta_secs), (9, Some(90), Some(1)));
        let p = estimate("restoring x", 0, Some(10), Duration::from_secs(3));
        assert_eq!((p.percent, p.eta_secs), (Some(0), None));
        let p = estimate("restoring x.sql", 0, None, Duration::from_secs(3));
        assert_eq!((p.total, p.percent, p.elapsed_secs), (None, None, 3));
    }

    #[test]
    fn an_entry_shows_while_its_guard_lives() {
        let board = Board::default();
        let name = TemplateName::new("big").expect("name");
        let done = Arc::new(AtomicU64::new(3));
        let shown = board.show(
            &name,
            Live {
                step: "restoring big.dump".into(),
                total: Some(6),
                done: done.clone(),
                started: Instant::now(),
            },
        );
        assert_eq!(board.get(&name).map(|p| p.done), Some(3));
        done.store(4, Ordering::Relaxed);
        assert_eq!(board.get(&name).and_then(|p| p.percent), Some(67));
        drop(shown);
        assert_eq!(board.get(&name), None);
    }
}
