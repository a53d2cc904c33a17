//! The injected clock. Core crates (journal, ledger, metadata, broker) never read the system's
//! clocks themselves (each has a `clippy.toml` banning `Instant::now` and `SystemTime::now`):
//! they ask a [`Clock`], so a simulation or a test can drive time with [`ManualClock`].
//!
//! Two readings, as the standard library has: wall-clock milliseconds (publish times, ages that
//! survive a restart) and a monotonic [`Instant`] (timeouts, batching windows, tick schedules).
//!
//! Beside it, [`log_limit`]: log lines a peer can trigger, limited per call site by clock
//! readings.

pub mod log_limit;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub trait Clock: Send + Sync + 'static {
    /// Wall-clock milliseconds since the Unix epoch (message publish times use the same scale).
    fn now_ms(&self) -> u64;

    /// A monotonic reading: never goes backwards, unrelated to the wall clock.
    fn now(&self) -> Instant;
}

/// The operating system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place the wall clock is read
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    #[allow(clippy::disallowed_methods)] // the one place the monotonic clock is read
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told (tests, simulations). Both readings advance together.
#[derive(Debug)]
pub struct ManualClock {
    start_ms: u64,
    elapsed_ns: AtomicU64,
}

impl ManualClock {
    /// A clock reading `now_ms` on the wall clock.
    pub fn new(now_ms: u64) -> Self {
        ManualClock { start_ms: now_ms, elapsed_ns: AtomicU64::new(0) }
    }

    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_ns.fetch_add(ns, Ordering::SeqCst);
    }

    pub fn advance_ms(&self, ms: u64) {
        self.advance(Duration::from_millis(ms));
    }

    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_ns.load(Ordering::SeqCst))
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new(0)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.start_ms + self.elapsed().as_millis() as u64
    }

    fn now(&self) -> Instant {
        // Instants cannot be built from numbers: count from one real instant, taken once.
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(|| SystemClock.now()) + self.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_both_readings_together() {
        let clock = ManualClock::new(1_000);
        let (ms, at) = (clock.now_ms(), clock.now());
        assert_eq!((clock.now_ms(), clock.now()), (ms, at));
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now_ms(), 1_250);
        assert_eq!(clock.now() - at, Duration::from_millis(250));
    }

    #[test]
    fn system_clock_is_monotonic_and_after_2020() {
        let a = SystemClock.now();
        assert!(SystemClock.now() >= a);
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
