//! Memory of the delayed-delivery index (`magnetar_broker::delayed::DelayTracker`) holding
//! many delayed messages: live heap bytes measured by a counting global allocator.
//!
//! Usage: `cargo run -p magnetar-perf --release --example delay-index-bench -- [messages]
//! [spread_seconds]` (default 10,000,000 over one day).
//! Positions grow like a topic's (50,000 entries per ledger); deadlines are uniform random in
//! the spread, as for messages published with random `deliver_after`.

use magnetar_broker::cursor::Position;
use magnetar_broker::delayed::{DelayConfig, DelayTracker};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours: `layout` has a non-zero size.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` came from `System.alloc` with this `layout` (our `alloc`).
        unsafe { System.dealloc(pointer, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let mut args = std::env::args().skip(1);
    let messages: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000_000);
    let spread_s: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(86_400);
    let config = DelayConfig::default();
    let base_ms = 1_700_000_000_000u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;

    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let started = Instant::now();
    let mut tracker = DelayTracker::new(config);
    for i in 0..messages {
        // xorshift64
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let deliver_at = base_ms + rng % (spread_s * 1_000);
        tracker.add(deliver_at, Position::new(i / 50_000, i % 50_000));
    }
    let elapsed = started.elapsed();
    let live = LIVE.load(Ordering::Relaxed) - before;
    let peak = PEAK.load(Ordering::Relaxed) - before;
    println!("delayed messages      {messages}");
    println!("deadline spread       {spread_s} s");
    println!(
        "config                exact_capacity={} bucket_ms={} max_buckets={} window_ms={}",
        config.exact_capacity, config.bucket_ms, config.max_buckets, config.window_ms
    );
    println!("exact entries         {}", tracker.exact_len());
    println!("buckets               {}", tracker.bucket_count());
    println!("tracked (counted)     {}", tracker.len());
    println!("index bytes (live)    {live}");
    println!("index bytes (peak)    {peak}");
    println!("bytes per message     {:.4}", live as f64 / messages.max(1) as f64);
    println!(
        "insert time           {:.2} s ({:.0} ns/message)",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / messages.max(1) as f64
    );
    assert_eq!(tracker.len(), messages, "every message is accounted for");
}
