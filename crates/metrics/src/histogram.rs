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

/// Pulsar's `StatsBuckets`: each bucket counts the values in its own range (not
/// cumulative), and what is reported is the last completed stats interval, so a dashboard
/// plots the values directly. Recording is one relaxed add per bucket and one for the sum;
/// reading rolls the window when the interval has passed (no background task).
#[derive(Debug)]
pub struct WindowedBuckets {
    total: Histogram,
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Option<Instant>,
    /// The cumulative counts and sum when the current interval started.
    base: (Vec<u64>, u64),
    last: WindowReading,
}

impl WindowedBuckets {
    pub fn new(bounds: &'static [u64]) -> Self {
        let total = Histogram::new(bounds);
        let zero = (vec![0; bounds.len() + 1], 0);
        let last = WindowReading { buckets: vec![0; bounds.len() + 1], count: 0, sum: 0 };
        WindowedBuckets { total, window: Mutex::new(Window { started: None, base: zero, last }) }
    }

    pub fn record(&self, value: u64) {
        self.total.record(value);
    }

    pub fn record_duration_us(&self, elapsed: Duration) {
        self.total.record_duration_us(elapsed);
    }

    /// The last completed interval of length `interval` as of `now` (all zero until one
    /// has completed; the first reading starts the first interval).
    pub fn read(&self, now: Instant, interval: Duration) -> WindowReading {
        let mut window = self.window.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let due = match window.started {
            None => {
                window.started = Some(now);
                window.base = self.snapshot();
                false
            }
            Some(started) => now.saturating_duration_since(started) >= interval,
        };
        if due {
            let current = self.snapshot();
            let buckets: Vec<u64> = current
                .0
                .iter()
                .zip(&window.base.0)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect();
            let count = buckets.iter().sum();
            let sum = current.1.saturating_sub(window.base.1);
            window.last = WindowReading { buckets, count, sum };
            window.base = current;
            window.started = Some(now);
        }
        window.last.clone()
    }

    /// Per-bucket (not cumulative) counts since creation, and the sum.
    fn snapshot(&self) -> (Vec<u64>, u64) {
        let counts = self.total.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        (counts, self.total.sum.load(Ordering::Relaxed))
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
}
