//! Refilling ahead of demand: how many ready clones a template needs so that leases are
//! answered from the queue while clones are made. It watches how fast the template's
//! ready clones are used up — leased, less those that come back unchanged (`reuse`) — and
//! how long a clone takes, and asks for the clones that this rate uses up in two clone
//! times. A suite that reuses its databases uses up nothing and keeps `min_ready`.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// How far back the rate is measured.
const WINDOW: Duration = Duration::from_secs(2);
/// Weight of the newest clone time in the running average.
const CLONE_TIME_WEIGHT: f64 = 0.2;

/// One template's recent use of ready clones.
#[derive(Debug, Default)]
pub(super) struct Demand {
    taken: VecDeque<Instant>,
    returned: VecDeque<Instant>,
    clone_time: Option<Duration>,
}

impl Demand {
    /// A ready clone was leased.
    pub(super) fn taken(&mut self, now: Instant) {
        self.taken.push_back(now);
        Self::forget_old(&mut self.taken, now);
    }

    /// A leased clone came back to the queue (released with `reuse`, or never delivered).
    pub(super) fn returned(&mut self, now: Instant) {
        self.returned.push_back(now);
        Self::forget_old(&mut self.returned, now);
    }

    /// A clone took `took` to make.
    pub(super) fn cloned(&mut self, took: Duration) {
        self.clone_time = Some(match self.clone_time {
            None => took,
            Some(average) => {
                average.mul_f64(1.0 - CLONE_TIME_WEIGHT) + took.mul_f64(CLONE_TIME_WEIGHT)
            }
        });
    }

    /// Ready clones to keep beyond `min_ready`'s floor: those the recent rate uses up in
    /// two clone times.
    pub(super) fn ahead(&self, now: Instant) -> usize {
        let Some(clone_time) = self.clone_time else {
            return 0;
        };
        // The queues are pruned as events arrive; here, only count what is recent.
        let recent = |events: &VecDeque<Instant>| {
            events
                .iter()
                .rev()
                .take_while(|t| now.saturating_duration_since(**t) <= WINDOW)
                .count()
        };
        let used_up = recent(&self.taken).saturating_sub(recent(&self.returned));
        let per_second = used_up as f64 / WINDOW.as_secs_f64();
        (per_second * clone_time.as_secs_f64() * 2.0).round() as usize
    }

    fn forget_old(events: &mut VecDeque<Instant>, now: Instant) {
        while events
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > WINDOW)
        {
            events.pop_front();
        }
    }
}
