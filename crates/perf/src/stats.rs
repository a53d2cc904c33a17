//! Throughput and latency bookkeeping for the client benchmarks: counters and HDR histograms
//! shared by the worker tasks, a live line per interval, and the final summary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::latency::{self, Latency};

/// One measured stream (e.g. "publish" or "end-to-end"): message and byte counters plus a latency
/// histogram for the current interval and one for the whole measured run.
pub struct Stream {
    pub name: &'static str,
    messages: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    /// Messages recorded during warm-up (not in the figures; told when a run failed, which
    /// may have been after them).
    warmup_messages: AtomicU64,
    histograms: Mutex<Histograms>,
    /// Off during warm-up: nothing is counted but `warmup_messages`.
    measuring: AtomicBool,
}

/// A message's latency goes into `interval` only; each interval is added to `total` when it is
/// taken (one histogram record per message, not two: at 2 M msg/s that matters).
struct Histograms {
    interval: Histogram<u64>,
    total: Histogram<u64>,
}

/// What the summary says of one stream.
#[derive(Debug, Clone, Serialize)]
pub struct StreamSummary {
    pub name: &'static str,
    pub messages: u64,
    pub bytes: u64,
    /// Failures since the start, warm-up included.
    pub errors: u64,
    /// Messages done during warm-up, before `messages` were counted.
    pub warmup_messages: u64,
    pub seconds: f64,
    pub msg_per_s: f64,
    pub mb_per_s: f64,
    /// Absent when the stream records no latency (e.g. consume without publish times).
    pub latency: Option<Latency>,
}

impl Stream {
    pub fn new(name: &'static str) -> Self {
        Stream {
            name,
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            warmup_messages: AtomicU64::new(0),
            histograms: Mutex::new(Histograms {
                interval: latency::histogram(),
                total: latency::histogram(),
            }),
            measuring: AtomicBool::new(false),
        }
    }

    /// Counts one message of `bytes` and, if known, its latency.
    pub fn record(&self, bytes: usize, elapsed: Option<Duration>) {
        if !self.measuring.load(Ordering::Relaxed) {
            self.warmup_messages.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if let Some(elapsed) = elapsed {
            latency::record(&mut self.lock().interval, elapsed);
        }
    }

    /// Counts messages of `bytes` each, one per latency, under one lock.
    pub fn record_all(&self, bytes: usize, latencies: impl ExactSizeIterator<Item = Duration>) {
        let n = latencies.len() as u64;
        if !self.measuring.load(Ordering::Relaxed) {
            self.warmup_messages.fetch_add(n, Ordering::Relaxed);
            return;
        }
        self.messages.fetch_add(n, Ordering::Relaxed);
        self.bytes.fetch_add(n * bytes as u64, Ordering::Relaxed);
        let mut histograms = self.lock();
        for elapsed in latencies {
            latency::record(&mut histograms.interval, elapsed);
        }
    }

    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Messages counted so far in the measured window.
    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Histograms> {
        self.histograms.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start_measuring(&self) {
        self.messages.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        let mut h = self.lock();
        h.interval.reset();
        h.total.reset();
        self.measuring.store(true, Ordering::Relaxed);
    }

    /// Takes the interval's latency histogram (leaving an empty one).
    fn take_interval(&self) -> Histogram<u64> {
        let mut guard = self.lock();
        let h = &mut *guard;
        h.total.add(&h.interval).expect("same bounds");
        let taken = h.interval.clone();
        h.interval.reset();
        taken
    }

    fn summary(&self, seconds: f64) -> StreamSummary {
        let messages = self.messages.load(Ordering::Relaxed);
        let bytes = self.bytes.load(Ordering::Relaxed);
        let total = {
            let h = self.lock();
            let mut total = h.total.clone();
            total.add(&h.interval).expect("same bounds");
            total
        };
        let per_s = |n: u64| if seconds > 0.0 { n as f64 / seconds } else { 0.0 };
        StreamSummary {
            name: self.name,
            messages,
            bytes,
            errors: self.errors.load(Ordering::Relaxed),
            warmup_messages: self.warmup_messages.load(Ordering::Relaxed),
            seconds,
            msg_per_s: per_s(messages),
            mb_per_s: per_s(bytes) / 1e6,
            latency: (!total.is_empty()).then(|| Latency::of(&total)),
        }
    }
}

/// Prints a line per interval for each stream, and the summary at the end.
pub struct Reporter<'a> {
    streams: Vec<&'a Stream>,
    started: Option<Instant>,
    last: Instant,
    last_counts: Vec<(u64, u64)>,
    quiet: bool,
}

impl<'a> Reporter<'a> {
    pub fn new(streams: Vec<&'a Stream>, quiet: bool) -> Self {
        let n = streams.len();
        Reporter {
            streams,
            started: None,
            last: Instant::now(),
            last_counts: vec![(0, 0); n],
            quiet,
        }
    }

    /// Ends the warm-up: counting starts now.
    pub fn start(&mut self) {
        for s in &self.streams {
            s.start_measuring();
        }
        let now = Instant::now();
        self.started = Some(now);
        self.last = now;
        self.last_counts.iter_mut().for_each(|c| *c = (0, 0));
    }

    pub fn elapsed(&self) -> Duration {
        self.started.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// One live line per stream: rates since the previous line and the interval's latencies.
    pub fn tick(&mut self) {
        let now = Instant::now();
        let secs = now.duration_since(self.last).as_secs_f64().max(1e-9);
        self.last = now;
        let total = self.elapsed().as_secs_f64();
        for (i, s) in self.streams.iter().enumerate() {
            let messages = s.messages.load(Ordering::Relaxed);
            let bytes = s.bytes.load(Ordering::Relaxed);
            let (m0, b0) = self.last_counts[i];
            self.last_counts[i] = (messages, bytes);
            let h = s.take_interval();
            if self.quiet {
                continue;
            }
            let latency =
                if h.is_empty() { String::new() } else { format!("  {}", Latency::of(&h)) };
            eprintln!(
                "[{total:7.1}s] {:<9} {:>12} msg/s {:>9.1} MB/s{latency}",
                s.name,
                thousands((messages - m0) as f64 / secs),
                (bytes - b0) as f64 / secs / 1e6,
            );
        }
    }

    pub fn summaries(&self) -> Vec<StreamSummary> {
        let seconds = self.elapsed().as_secs_f64();
        self.streams.iter().map(|s| s.summary(seconds)).collect()
    }
}

/// Prints the final summary of each stream.
pub fn print_summary(summaries: &[StreamSummary]) {
    for s in summaries {
        println!(
            "{}: {} messages in {:.1} s = {} msg/s, {:.1} MB/s{}",
            s.name,
            s.messages,
            s.seconds,
            thousands(s.msg_per_s),
            s.mb_per_s,
            if s.errors > 0 { format!(", {} errors", s.errors) } else { String::new() }
        );
        if let Some(latency) = &s.latency {
            println!("  latency: {latency}");
        }
        if s.errors > 0 && s.warmup_messages > 0 {
            // Errors count from the start; a run that failed early is not a run that did nothing.
            println!(
                "  warm-up: {} messages before measuring began (not counted above)",
                s.warmup_messages
            );
        }
    }
}

/// 1234567.8 -> "1,234,568".
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1234567.8), "1,234,568");
    }

    #[test]
    fn nothing_counts_before_start_and_summary_has_rates() {
        let s = Stream::new("publish");
        s.record(100, Some(Duration::from_millis(1)));
        s.record_all(100, [Duration::from_millis(1); 2].into_iter());
        assert_eq!(s.messages(), 0, "warm-up messages must not count");
        let mut r = Reporter::new(vec![&s], true);
        r.start();
        for _ in 0..10 {
            s.record(100, Some(Duration::from_millis(2)));
        }
        s.record(100, None);
        r.tick();
        // After the tick: the summary covers both the ticked interval and the open one.
        s.record(100, Some(Duration::from_millis(50)));
        let summary = &r.summaries()[0];
        assert_eq!(summary.messages, 12);
        assert_eq!(summary.bytes, 1200);
        assert_eq!(summary.warmup_messages, 3, "told apart, for a run that failed after them");
        let latency = summary.latency.expect("latencies were recorded");
        assert!((1900..=2100).contains(&latency.p50_us), "{latency:?}");
        assert!((49_000..=51_000).contains(&latency.max_us), "{latency:?}");
        let summary = &r.summaries()[0];
        assert_eq!(summary.messages, 12);
        assert!(summary.msg_per_s > 0.0);
    }
}
