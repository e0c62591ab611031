//! Order statistics of measured samples.

use std::time::Duration;

/// Milliseconds of a duration, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`-th percentile (0 < p <= 100) of sorted samples, nearest rank:
/// the smallest sample that at least `p` percent of the samples do not exceed.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // The epsilon keeps float error from pushing an exact rank up by one.
    let rank = ((p / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summary of a set of samples.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

pub fn summarize(mut samples: Vec<f64>) -> Summary {
    samples.sort_by(f64::total_cmp);
    Summary {
        n: samples.len(),
        p50: percentile(&samples, 50.0),
        p99: percentile(&samples, 99.0),
        p999: percentile(&samples, 99.9),
        max: samples.last().copied().unwrap_or(f64::NAN),
    }
}

/// The median (the mean of the middle two for an even count).
pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn mean(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// Smoke checks of the statistics, run with the bench in test mode.
pub fn self_check() {
    let v: Vec<f64> = (1..=1000).map(f64::from).collect();
    let s = summarize(v.clone());
    assert_eq!((s.p50, s.p99, s.p999, s.max), (500.0, 990.0, 999.0, 1000.0));
    assert_eq!(percentile(&[7.0], 99.9), 7.0);
    assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
}
