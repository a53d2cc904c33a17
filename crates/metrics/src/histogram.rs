//! Fixed-bucket histograms on relaxed atomics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bounds of the buckets in the recorded unit (microseconds, bytes, ...), ascending;
/// values above the last bound land in an overflow bucket.
fn bucket_of(bounds: &[u64], value: u64) -> usize {
    bounds.partition_point(|&bound| bound < value)
}

/// A cumulative histogram: counts since creation, as Prometheus histograms are.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One per bound plus the overflow bucket; each counts only its own range.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Self {
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend: {bounds:?}");
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub fn record(&self, value: u64) {
        self.counts[bucket_of(self.bounds, value)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    pub fn record_duration_us(&self, elapsed: Duration) {
        self.record(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn bounds(&self) -> &'static [u64] {
        self.bounds
    }

    /// Per-bucket (not cumulative) counts, the overflow bucket last, and the sum.
    pub fn snapshot(&self) -> (Vec<u64>, u64) {
        let counts = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        (counts, self.sum.load(Ordering::Relaxed))
    }

    /// Cumulative counts per bound (`le`), then the total count; and the sum.
    pub fn cumulative(&self) -> (Vec<u64>, u64) {
        let mut running = 0;
        let cumulative = self
            .counts
            .iter()
            .map(|count| {
                running += count.load(Ordering::Relaxed);
                running
            })
            .collect();
        (cumulative, self.sum.load(Ordering::Relaxed))
    }
}

/// What [`WindowedBuckets`] reports: the last completed interval's counts per bucket (the
/// last one is the overflow bucket), their number and the sum of the values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowReading {
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum: u64,
}

impl WindowReading {
    /// The value below which a fraction `q` (0..=1) of the interval's values fall, estimated
    /// by linear interpolation inside the bucket that holds that rank (from 0 for the first
    /// bucket); a rank in the overflow bucket reads as the last bound. 0 for an empty interval.
    pub fn quantile(&self, bounds: &[u64], q: f64) -> f64 {
        assert_eq!(self.buckets.len(), bounds.len() + 1, "one count per bound and overflow");
        if self.count == 0 {
            return 0.0;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).max(1.0);
        let mut below = 0u64;
        for (i, &in_bucket) in self.buckets.iter().enumerate() {
            if in_bucket > 0 && (below + in_bucket) as f64 >= rank {
                let Some(&upper) = bounds.get(i) else { break };
                let lower = if i == 0 { 0 } else { bounds[i - 1] };
                let into = (rank - below as f64) / in_bucket as f64;
                return lower as f64 + into * (upper - lower) as f64;
            }
            below += in_bucket;
        }
        bounds.last().copied().unwrap_or(0) as f64
    }
}

/// The last completed stats interval of a histogram that only counts up: each reading after
/// the interval has passed takes the difference from the snapshot at its start. Reading rolls
/// the window (no background task).
#[derive(Debug)]
pub struct RollingWindow {
    interval: Duration,
    started: Option<Instant>,
    /// Per-bucket counts and the sum when the current interval started.
    base: (Vec<u64>, u64),
    last: WindowReading,
}

impl RollingWindow {
    pub fn new(buckets: usize, interval: Duration) -> Self {
        let last = WindowReading { buckets: vec![0; buckets], count: 0, sum: 0 };
        RollingWindow { interval, started: None, base: (vec![0; buckets], 0), last }
    }

    /// The last completed interval as of `now`, given the histogram's per-bucket counts and
    /// sum now (all zero until one has completed; the first reading starts the first one).
    pub fn read(&mut self, now: Instant, current: (Vec<u64>, u64)) -> WindowReading {
        let due = match self.started {
            None => {
                self.started = Some(now);
                self.base = current;
                return self.last.clone();
            }
            Some(started) => now.saturating_duration_since(started) >= self.interval,
        };
        if due {
            let buckets: Vec<u64> = current
                .0
                .iter()
                .zip(&self.base.0)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect();
            let count = buckets.iter().sum();
            let sum = current.1.saturating_sub(self.base.1);
            self.last = WindowReading { buckets, count, sum };
            self.base = current;
            self.started = Some(now);
        }
        self.last.clone()
    }
}

/// Pulsar's `StatsBuckets`: each bucket counts the values in its own range (not
/// cumulative), and what is reported is the last completed stats interval, so a dashboard
/// plots the values directly. Recording is one relaxed add per bucket and one for the sum.
#[derive(Debug)]
pub struct WindowedBuckets {
    total: Histogram,
    window: Mutex<RollingWindow>,
}

impl WindowedBuckets {
    pub fn new(bounds: &'static [u64]) -> Self {
        // The interval is given at each reading (a broker's can change); see `read`.
        let window = RollingWindow::new(bounds.len() + 1, Duration::ZERO);
        WindowedBuckets { total: Histogram::new(bounds), window: Mutex::new(window) }
    }

    pub fn record(&self, value: u64) {
        self.total.record(value);
    }

    pub fn record_duration_us(&self, elapsed: Duration) {
        self.total.record_duration_us(elapsed);
    }

    /// Everything recorded since creation (a Prometheus histogram's or summary's totals).
    pub fn total(&self) -> &Histogram {
        &self.total
    }

    /// The last completed interval of length `interval` as of `now` (all zero until one
    /// has completed; the first reading starts the first interval).
    pub fn read(&self, now: Instant, interval: Duration) -> WindowReading {
        let mut window = self.window.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        window.interval = interval;
        window.read(now, self.total.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[u64] = &[10, 100, 1000];

    #[test]
    fn values_land_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let h = Histogram::new(BOUNDS);
        for v in [0, 10, 11, 100, 1000, 1001, u64::MAX / 2] {
            h.record(v);
        }
        let (cumulative, sum) = h.cumulative();
        assert_eq!(cumulative, vec![2, 4, 5, 7], "le 10: 0,10; le 100: +11,100; le 1000: +1000");
        assert_eq!(sum, 10 + 11 + 100 + 1000 + 1001 + u64::MAX / 2);
    }

    #[test]
    fn windowed_buckets_report_the_last_completed_interval_only() {
        let w = WindowedBuckets::new(BOUNDS);
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        w.record(5);
        assert_eq!(w.read(t0, second).count, 0, "no interval has completed yet");
        w.record(50);
        w.record(5000);
        let first = w.read(t0 + second, second);
        assert_eq!(first.buckets, vec![0, 1, 0, 1], "what came after the interval started");
        assert_eq!((first.count, first.sum), (2, 5050));
        w.record(7);
        let early = w.read(t0 + second + second / 2, second);
        assert_eq!(early, first, "mid-interval: the last completed one again");
        let second_window = w.read(t0 + second * 2, second);
        assert_eq!(second_window.buckets, vec![1, 0, 0, 0]);
        assert_eq!(w.read(t0 + second * 3, second).count, 0, "an idle interval reads zero");
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_that_holds_the_rank() {
        let reading = |buckets: Vec<u64>| {
            let count = buckets.iter().sum();
            WindowReading { buckets, count, sum: 0 }
        };
        let empty = reading(vec![0, 0, 0, 0]);
        assert_eq!(empty.quantile(BOUNDS, 0.5), 0.0, "nothing recorded reads zero");
        // 10 values in (10, 100]: the median is half-way through that bucket.
        let middle = reading(vec![0, 10, 0, 0]);
        assert_eq!(middle.quantile(BOUNDS, 0.5), 55.0);
        assert_eq!(middle.quantile(BOUNDS, 1.0), 100.0, "the maximum is the bucket's bound");
        // 90 values up to 10, 10 in (100, 1000]: p50 in the first bucket, p99 in the third.
        let split = reading(vec![90, 0, 10, 0]);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(split.quantile(BOUNDS, 0.5), 50.0 / 90.0 * 10.0));
        assert!(near(split.quantile(BOUNDS, 0.99), 100.0 + 0.9 * 900.0));
        let over = reading(vec![1, 0, 0, 1]);
        assert_eq!(over.quantile(BOUNDS, 1.0), 1000.0, "overflow reads as the last bound");
        assert_eq!(over.quantile(BOUNDS, 0.0), 10.0, "the lowest rank is the first value");
    }

    #[test]
    fn a_rolling_window_over_a_cumulative_histogram_reads_what_came_in_the_last_interval() {
        let h = Histogram::new(BOUNDS);
        let second = Duration::from_secs(1);
        let mut window = RollingWindow::new(BOUNDS.len() + 1, second);
        let t0 = Instant::now();
        h.record(5000);
        assert_eq!(window.read(t0, h.snapshot()).count, 0, "the first reading starts it");
        h.record(50);
        let first = window.read(t0 + second, h.snapshot());
        assert_eq!(first.buckets, vec![0, 1, 0, 0], "the value before the start is not in it");
        assert_eq!(window.read(t0 + second * 2, h.snapshot()).count, 0, "idle: zero");
    }
}
