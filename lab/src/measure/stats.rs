//! Percentiles of sorted samples, by the two rules the benches report with.

use std::time::Duration;

/// The `p`-th percentile of `sorted` at the rounded rank `p/100 x (n - 1)`
/// (the churn bench's pod waits); `NaN` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The `p`-th percentile (nearest rank: the smallest sample with at least
/// `p`% at or below it) of `sorted`, in milliseconds; `NaN` when empty.
pub fn nearest_rank_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_rules_on_the_same_samples() {
        let samples = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&samples, 50.0), 3.0);
        assert_eq!(percentile(&samples, 100.0), 4.0);
        assert!(percentile(&[], 50.0).is_nan());
        let millis: Vec<Duration> = samples
            .iter()
            .map(|&ms| Duration::from_secs_f64(ms / 1e3))
            .collect();
        assert!((nearest_rank_ms(&millis, 50.0) - 2.0).abs() < 1e-9);
        assert!((nearest_rank_ms(&millis, 100.0) - 4.0).abs() < 1e-9);
        assert!((nearest_rank_ms(&millis, 0.0) - 1.0).abs() < 1e-9);
    }
}
