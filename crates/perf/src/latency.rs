//! Latency summaries from HDR histograms (microsecond resolution, up to 60 s).

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

pub fn record(histogram: &mut Histogram<u64>, elapsed: Duration) {
    let micros = (elapsed.as_micros() as u64).clamp(1, 60_000_000);
    histogram.record(micros).expect("value within bounds");
}

/// Percentiles in microseconds.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Latency {
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl Latency {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        Latency {
            p50_us: histogram.value_at_quantile(0.5),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |us: u64| us as f64 / 1000.0;
        write!(
            f,
            "p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms",
            ms(self.p50_us),
            ms(self.p99_us),
            ms(self.p999_us),
            ms(self.max_us)
        )
    }
}
