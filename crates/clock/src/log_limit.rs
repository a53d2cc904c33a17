//! Rate-limited log lines: what a peer can trigger at will (malformed frames, bad credentials,
//! failed TLS handshakes) is logged at most once per interval per call site, with the number of
//! lines left out since, so a misbehaving peer cannot flood the log. The broker and the storage
//! node both use it; the caller passes a clock reading, so tests drive it.

use std::sync::atomic::{AtomicU64, Ordering};

/// How often one call site logs, at most.
pub const INTERVAL_MS: u64 = 1_000;

/// The system clock's milliseconds, for the shells' call sites (cores pass their injected
/// clock's reading instead).
pub fn system_ms() -> u64 {
    use crate::Clock;
    crate::SystemClock.now_ms()
}

/// One call site's limit (a `static` next to the log line; see [`crate::warn_limited`]).
#[derive(Debug, Default)]
pub struct LogLimiter {
    /// Clock ms from which the next line may be written (0: the first one may).
    next_allowed_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimiter {
    pub const fn new() -> Self {
        LogLimiter { next_allowed_ms: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(lines left out since the last one)` when a line may be written at `now_ms`.
    pub fn check(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_allowed_ms.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next_allowed_ms
                .compare_exchange(next, now_ms + INTERVAL_MS, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// `tracing::warn!` at most once a second from this call site, with `suppressed` = lines left
/// out since: `warn_limited!(clock_ms, peer = %peer, "message")`. The calling crate depends
/// on `tracing`.
#[macro_export]
macro_rules! warn_limited {
    ($now_ms:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::log_limit::LogLimiter = $crate::log_limit::LogLimiter::new();
        if let Some(suppressed) = LIMIT.check($now_ms) {
            tracing::warn!(suppressed, $($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_then_the_count_of_those_left_out() {
        let limit = LogLimiter::new();
        assert_eq!(limit.check(5_000), Some(0));
        assert_eq!(limit.check(5_001), None);
        assert_eq!(limit.check(5_999), None);
        assert_eq!(limit.check(6_000), Some(2), "two lines were left out");
        assert_eq!(limit.check(6_500), None);
        assert_eq!(limit.check(9_000), Some(1));
    }
}
