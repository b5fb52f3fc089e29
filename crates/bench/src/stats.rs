//! Latency summaries: percentiles of a set of durations, in milliseconds. Nearest-rank
//! percentiles, no interpolation and no histogram: the sample counts here are small.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// Smallest sample.
    pub min_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

impl Summary {
    /// Summarises `samples` (any order); all zeros when there are none.
    pub fn of(samples: &[Duration]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let total: f64 = ms.iter().sum();
        Summary {
            count: ms.len(),
            mean_ms: round3(total / ms.len() as f64),
            min_ms: round3(ms[0]),
            p50_ms: round3(nearest_rank(&ms, 0.50)),
            p90_ms: round3(nearest_rank(&ms, 0.90)),
            p99_ms: round3(nearest_rank(&ms, 0.99)),
            max_ms: round3(ms[ms.len() - 1]),
        }
    }
}

/// The nearest-rank percentile `q` (0..=1) of sorted, non-empty `sorted`.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The nearest-rank median of `values` (any order), None when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (!sorted.is_empty()).then(|| round3(nearest_rank(&sorted, 0.5)))
}

/// Rounds to three decimals, so the JSON stays readable (microsecond resolution in ms).
pub fn round3(value: f64) -> f64 {
    (value * 1e3).round() / 1e3
}

/// `count / elapsed` per second, rounded; zero for an empty interval.
pub fn per_second(count: usize, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        round3(count as f64 / secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let summary = Summary::of(&samples);
        assert_eq!(summary.count, 100);
        assert_eq!(summary.p50_ms, 50.0);
        assert_eq!(summary.p90_ms, 90.0);
        assert_eq!(summary.p99_ms, 99.0);
        assert_eq!(summary.max_ms, 100.0);
        assert_eq!(summary.min_ms, 1.0);
        assert_eq!(summary.mean_ms, 50.5);
    }

    #[test]
    fn one_sample_is_every_percentile() {
        let summary = Summary::of(&[Duration::from_micros(1500)]);
        assert_eq!(summary.p50_ms, 1.5);
        assert_eq!(summary.p99_ms, 1.5);
    }

    #[test]
    fn median_is_the_middle_value_whatever_the_order() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(
            median(&[4.0, 1.0, 3.0, 2.0]),
            Some(2.0),
            "nearest rank: the lower middle"
        );
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Summary::of(&[]).count, 0);
        assert_eq!(per_second(3, Duration::ZERO), 0.0);
        assert_eq!(per_second(3, Duration::from_millis(1500)), 2.0);
    }
}
