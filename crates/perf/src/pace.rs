//! Sending at a fixed rate with a finer grain than tokio's timer.
//!
//! Apache's pulsar-perf paces messages with a rate limiter that sleeps for the gap before each
//! one (microseconds). Pacing on tokio's 1 ms timer sent bursts of 50-100 messages every 1-2 ms
//! at 50,000 msg/s instead: the broker saw larger, rarer batches than the same rate from
//! pulsar-perf gives it. Here a thread wakes every 100 µs and releases send permits for the
//! time that passed; the producers (all of them: the rate is the total) take one per message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How often permits are released.
const TICK: Duration = Duration::from_micros(100);

pub struct Pacer {
    permits: Arc<Semaphore>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pacer {
    /// Releases `rate` permits per second (positive) until dropped.
    pub fn start(rate: f64) -> std::io::Result<Pacer> {
        assert!(rate > 0.0, "a pacer needs a positive rate");
        let permits = Arc::new(Semaphore::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("perf-pacer".into()).spawn({
            let (permits, stop) = (permits.clone(), stop.clone());
            move || release(rate, &permits, &stop)
        })?;
        Ok(Pacer { permits, stop, thread: Some(thread) })
    }

    /// Waits for the next send slot.
    pub async fn wait(&self) {
        if let Ok(permit) = self.permits.acquire().await {
            permit.forget();
        }
    }
}

fn release(rate: f64, permits: &Semaphore, stop: &AtomicBool) {
    let start = Instant::now();
    let mut released = 0u64;
    // After a stall (senders that cannot keep up), at most one second's worth piles up, as
    // pulsar-perf's limiter does not burst to catch up either.
    let most = (rate.ceil() as usize).clamp(1, Semaphore::MAX_PERMITS);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(TICK);
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        let owed = (due - released) as usize;
        released = due;
        let room = most.saturating_sub(permits.available_permits());
        if owed.min(room) > 0 {
            permits.add_permits(owed.min(room));
        }
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.permits.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn paces_at_the_rate_without_bursts_of_a_millisecond() {
        let pacer = Pacer::start(20_000.0).unwrap();
        let begin = Instant::now();
        let mut largest_gap = Duration::ZERO;
        let mut last = Instant::now();
        for _ in 0..2_000 {
            tokio::time::timeout(Duration::from_secs(10), pacer.wait()).await.expect("a slot");
            largest_gap = largest_gap.max(last.elapsed());
            last = Instant::now();
        }
        let took = begin.elapsed();
        // 2,000 at 20,000/s: 0.1 s (generous bounds: the machine is shared).
        assert!(took >= Duration::from_millis(90), "too fast: {took:?}");
        assert!(took < Duration::from_secs(2), "too slow: {took:?}");
        assert!(largest_gap < Duration::from_millis(500), "stalled: {largest_gap:?}");
    }
}
