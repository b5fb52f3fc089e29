//! Whether a new clone is stamped for the proof of `--reuse-unchanged`. A stamp costs a
//! query and a listing of the clone's files, and is wasted on a clone whose holder writes:
//! its release finds it changed and drops it. So a template whose last [`WINDOW`] proofs all found
//! changes gets its clones made unstamped (their release drops them without a proof, as
//! with `--no-reuse-unchanged`), save one in every [`PROBE_EVERY`], whose proof notices
//! when tests that only read come back.

use std::collections::VecDeque;

/// How many recent proofs of a template decide.
const WINDOW: usize = 16;
/// While a template's recent proofs all found changes, every this-many-th clone is stamped
/// all the same.
const PROBE_EVERY: u32 = 8;

/// One template's recent proofs.
#[derive(Debug, Default)]
pub(super) struct ProofHistory {
    /// The outcomes of its last proofs, newest last: `true` when the clone was unchanged.
    recent: VecDeque<bool>,
    /// Clones made unstamped since the last stamped one.
    unstamped: u32,
}

impl ProofHistory {
    /// A released clone was put to the proof.
    pub(super) fn record(&mut self, unchanged: bool) {
        self.recent.push_back(unchanged);
        while self.recent.len() > WINDOW {
            self.recent.pop_front();
        }
    }

    /// Whether the next clone is worth a stamp; it is counted as made either way.
    pub(super) fn stamp_next(&mut self) -> bool {
        let all_changed = self.recent.len() >= WINDOW && !self.recent.iter().any(|u| *u);
        if all_changed && self.unstamped + 1 < PROBE_EVERY {
            self.unstamped += 1;
            false
        } else {
            self.unstamped = 0;
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps(history: &mut ProofHistory, clones: usize) -> usize {
        (0..clones).filter(|_| history.stamp_next()).count()
    }

    #[test]
    fn every_clone_is_stamped_until_the_proofs_show_only_writers() {
        let mut history = ProofHistory::default();
        assert_eq!(stamps(&mut history, 20), 20, "no history yet");
        for _ in 0..WINDOW - 1 {
            history.record(false);
        }
        assert_eq!(stamps(&mut history, 20), 20, "too few proofs to judge");
        history.record(false);
        assert_eq!(
            stamps(&mut history, 8 * PROBE_EVERY as usize),
            8,
            "only writers: one probe in every {PROBE_EVERY}"
        );
    }

    #[test]
    fn one_unchanged_proof_brings_the_stamps_back() {
        let mut history = ProofHistory::default();
        for _ in 0..WINDOW {
            history.record(false);
        }
        assert!(!history.stamp_next());
        history.record(true);
        assert_eq!(stamps(&mut history, 10), 10);
        // It takes a full window of changed proofs to stop again.
        for _ in 0..WINDOW - 1 {
            history.record(false);
        }
        assert_eq!(stamps(&mut history, 10), 10);
        history.record(false);
        assert!(!history.stamp_next());
    }
}
