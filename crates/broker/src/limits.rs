//! Per-topic limits read on the hot paths (publish, dispatch) without a lock: the policy values
//! as atomics ([`TopicLimits`], written by `Topic::refresh_policies`), token buckets for the
//! publish and dispatch rates ([`RateLimiter`]), and the block/resume rule of the unacked-message
//! limits ([`unacked_blocked`]).
//!
//! Rates are token buckets refilled continuously from the injected clock: one period's worth of
//! tokens at most (the burst), consumption may overdraw (a batch entry is never split), and
//! whoever overdrew waits until the bucket is positive again. Everything is a relaxed atomic:
//! two threads racing on a refill at worst lose a token's worth of precision, never block.

use magnetar_model::policy::{DispatchRate, Effective, PublishRate};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Starts the broker's periodic policy passes: message expiry (`expiry::run`) and backlog
/// quotas (`backlog_quota::run`). They end with the service or at `shutdown`.
pub fn spawn_tasks(
    service: &std::sync::Arc<crate::BrokerService>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let weak = std::sync::Arc::downgrade(service);
    tokio::spawn(crate::expiry::run(weak.clone(), shutdown.clone()));
    tokio::spawn(crate::backlog_quota::run(weak, shutdown));
}

/// The limits a topic's publish and dispatch paths read per message (0: unlimited).
#[derive(Default)]
pub struct TopicLimits {
    pub max_unacked_per_consumer: AtomicU32,
    pub max_unacked_per_subscription: AtomicU32,
    pub max_consumers_per_subscription: AtomicU32,
    pub max_message_size: AtomicU32,
    /// Messages and bytes published per second to the topic.
    pub publish_rate: RateLimiter,
    /// Times the publish rate paused the topic's producers (Pulsar's `publishRateLimitedTimes`).
    pub publish_rate_limited_times: AtomicU64,
    /// Messages and bytes dispatched per period from the topic, all subscriptions together.
    pub dispatch_rate: RateLimiter,
    /// The rate each subscription's own limiter follows (messages, bytes, period ms).
    subscription_rate: (AtomicU64, AtomicU64, AtomicU64),
    /// Delayed delivery is off: messages go out regardless of their delivery time.
    pub delayed_delivery_disabled: std::sync::atomic::AtomicBool,
}

impl TopicLimits {
    /// Takes the values of `policies` (called at load and whenever policies change).
    pub fn apply(&self, policies: &Effective, now_ms: u64) {
        let relaxed = Ordering::Relaxed;
        self.max_unacked_per_consumer.store(policies.max_unacked_messages_per_consumer, relaxed);
        self.max_unacked_per_subscription
            .store(policies.max_unacked_messages_per_subscription, relaxed);
        self.max_consumers_per_subscription.store(policies.max_consumers_per_subscription, relaxed);
        self.max_message_size.store(policies.max_message_size, relaxed);
        self.delayed_delivery_disabled.store(!policies.delayed_delivery_enabled, relaxed);
        let (msgs, bytes) = publish_rate(policies.publish_rate);
        self.publish_rate.set(msgs, bytes, 1_000, now_ms);
        let (msgs, bytes, period) = dispatch_rate(policies.dispatch_rate);
        self.dispatch_rate.set(msgs, bytes, period, now_ms);
        let (msgs, bytes, period) = dispatch_rate(policies.subscription_dispatch_rate);
        self.subscription_rate.0.store(msgs, relaxed);
        self.subscription_rate.1.store(bytes, relaxed);
        self.subscription_rate.2.store(period, relaxed);
    }

    /// Brings a subscription's limiter to the topic's subscription dispatch rate.
    pub fn configure_subscription_rate(&self, limiter: &RateLimiter, now_ms: u64) {
        let relaxed = Ordering::Relaxed;
        limiter.set(
            self.subscription_rate.0.load(relaxed),
            self.subscription_rate.1.load(relaxed),
            self.subscription_rate.2.load(relaxed),
            now_ms,
        );
    }
}

/// Counts a SEND of `messages` and `bytes` against a topic's publish rate and answers how long
/// its connection stops reading (Pulsar pauses auto-read: sends are delayed, never failed);
/// each pause is counted in `limited_times`. `None`: no pause (or no rate). The clock is read
/// (`now_ms`) only when there is a rate: an unlimited SEND costs one check.
pub fn throttle_publish(
    rate: &RateLimiter,
    limited_times: &AtomicU64,
    messages: u64,
    bytes: u64,
    now_ms: impl FnOnce() -> u64,
) -> Option<std::time::Duration> {
    if rate.is_unlimited() {
        return None;
    }
    rate.consume(messages, bytes);
    let wait = rate.wait_ms(now_ms());
    if wait == 0 {
        return None;
    }
    limited_times.fetch_add(1, Ordering::Relaxed);
    Some(std::time::Duration::from_millis(wait))
}

/// Pulsar's `PublishRate` as (messages, bytes) per second; `-1`/`0`: unlimited (0).
pub(crate) fn publish_rate(rate: Option<PublishRate>) -> (u64, u64) {
    rate.map_or((0, 0), |r| {
        (
            u64::try_from(r.publish_throttling_rate_in_msg).unwrap_or(0),
            u64::try_from(r.publish_throttling_rate_in_byte).unwrap_or(0),
        )
    })
}

/// Pulsar's `DispatchRate` as (messages, bytes, period ms); `-1`/`0`: unlimited (0).
fn dispatch_rate(rate: Option<DispatchRate>) -> (u64, u64, u64) {
    rate.map_or((0, 0, 1_000), |r| {
        (
            u64::try_from(r.dispatch_throttling_rate_in_msg).unwrap_or(0),
            u64::try_from(r.dispatch_throttling_rate_in_byte).unwrap_or(0),
            u64::try_from(r.rate_period_in_second).unwrap_or(1).max(1) * 1_000,
        )
    })
}

/// One dimension of a rate: `rate` tokens per period, at most `rate` banked.
#[derive(Default)]
struct Bucket {
    rate: AtomicU64,
    tokens: AtomicI64,
    /// When tokens were last added (clock ms).
    refilled_at: AtomicU64,
}

impl Bucket {
    fn set(&self, rate: u64, now_ms: u64) {
        if self.rate.swap(rate, Ordering::Relaxed) != rate {
            self.tokens.store(clamp_i64(rate), Ordering::Relaxed);
            self.refilled_at.store(now_ms, Ordering::Relaxed);
        }
    }

    /// Adds the tokens earned since the last refill; only whole tokens, and the clock moves on
    /// by exactly the time they took to earn, so frequent calls lose nothing to rounding.
    fn refill(&self, period_ms: u64, now_ms: u64) {
        let rate = self.rate.load(Ordering::Relaxed);
        if rate == 0 {
            return;
        }
        let last = self.refilled_at.load(Ordering::Relaxed);
        if now_ms <= last {
            return;
        }
        let elapsed = now_ms - last;
        let earned = u128::from(elapsed) * u128::from(rate) / u128::from(period_ms.max(1));
        if earned == 0 {
            return;
        }
        // A bucket idle for long is simply full: no need to account for the time exactly.
        let spent_ms = if earned >= u128::from(rate) {
            elapsed
        } else {
            (earned * u128::from(period_ms) / u128::from(rate)) as u64
        };
        if self
            .refilled_at
            .compare_exchange(last, last + spent_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another thread refilled for this interval
        }
        let cap = clamp_i64(rate);
        let earned = i64::try_from(earned).unwrap_or(i64::MAX);
        let _ = self.tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
            Some(tokens.saturating_add(earned).min(cap))
        });
    }

    /// Milliseconds until the bucket is positive again (0: it is now; unlimited: 0).
    fn wait_ms(&self, period_ms: u64) -> u64 {
        let rate = self.rate.load(Ordering::Relaxed);
        let tokens = self.tokens.load(Ordering::Relaxed);
        if rate == 0 || tokens > 0 {
            return 0;
        }
        let missing = u128::from(tokens.unsigned_abs()) + 1;
        let ms = (missing * u128::from(period_ms)).div_ceil(u128::from(rate));
        u64::try_from(ms).unwrap_or(u64::MAX).max(1)
    }

    fn available(&self) -> u64 {
        if self.rate.load(Ordering::Relaxed) == 0 {
            return u64::MAX;
        }
        u64::try_from(self.tokens.load(Ordering::Relaxed)).unwrap_or(0)
    }

    fn consume(&self, amount: u64) {
        if self.rate.load(Ordering::Relaxed) != 0 {
            self.tokens.fetch_sub(clamp_i64(amount), Ordering::Relaxed);
        }
    }
}

fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A message and a byte rate per period (Pulsar's publish and dispatch rate limiters), as token
/// buckets over atomics; unlimited when both rates are 0.
pub struct RateLimiter {
    messages: Bucket,
    bytes: Bucket,
    period_ms: AtomicU64,
}

impl Default for RateLimiter {
    fn default() -> Self {
        RateLimiter {
            messages: Bucket::default(),
            bytes: Bucket::default(),
            period_ms: AtomicU64::new(1_000),
        }
    }
}

impl RateLimiter {
    /// Sets the rates (0: unlimited); a changed rate starts with a full bucket.
    pub fn set(&self, messages: u64, bytes: u64, period_ms: u64, now_ms: u64) {
        self.period_ms.store(period_ms.max(1), Ordering::Relaxed);
        self.messages.set(messages, now_ms);
        self.bytes.set(bytes, now_ms);
    }

    pub fn is_unlimited(&self) -> bool {
        self.messages.rate.load(Ordering::Relaxed) == 0
            && self.bytes.rate.load(Ordering::Relaxed) == 0
    }

    /// Milliseconds to wait before sending more (0: go now).
    pub fn wait_ms(&self, now_ms: u64) -> u64 {
        if self.is_unlimited() {
            return 0;
        }
        let period = self.period_ms.load(Ordering::Relaxed);
        self.messages.refill(period, now_ms);
        self.bytes.refill(period, now_ms);
        self.messages.wait_ms(period).max(self.bytes.wait_ms(period))
    }

    /// Messages that may go now (`u64::MAX` when the message rate is unlimited); call after
    /// [`Self::wait_ms`] answered 0.
    pub fn available_messages(&self) -> u64 {
        self.messages.available()
    }

    /// Counts what was sent (may overdraw: the next wait is longer).
    pub fn consume(&self, messages: u64, bytes: u64) {
        self.messages.consume(messages);
        self.bytes.consume(bytes);
    }
}

/// Pulsar's unacked-message blocking (`blockedConsumerOnUnackedMsgs`,
/// `blockedDispatcherOnUnackedMsgs`): blocked once `unacked` reaches `max`, unblocked once it is
/// back to half of it; in between it stays as it was. `max == 0`: never blocked.
pub fn unacked_blocked(blocked: bool, unacked: u64, max: u32) -> bool {
    let max = u64::from(max);
    if max == 0 {
        false
    } else if unacked >= max {
        true
    } else if unacked <= max / 2 {
        false
    } else {
        blocked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unacked_limit_blocks_at_the_limit_and_resumes_at_half() {
        let mut blocked = false;
        for unacked in 0..10 {
            blocked = unacked_blocked(blocked, unacked, 10);
            assert!(!blocked, "{unacked} unacked is under the limit");
        }
        blocked = unacked_blocked(blocked, 10, 10);
        assert!(blocked);
        for unacked in (6..10).rev() {
            blocked = unacked_blocked(blocked, unacked, 10);
            assert!(blocked, "still blocked at {unacked}: resumes only at half");
        }
        blocked = unacked_blocked(blocked, 5, 10);
        assert!(!blocked);
        blocked = unacked_blocked(blocked, 8, 10);
        assert!(!blocked, "unblocked stays so until the limit again");
        assert!(!unacked_blocked(true, 1_000, 0), "0 means unlimited");
    }

    #[test]
    fn token_bucket_refills_with_the_injected_clock() {
        let clock = magnetar_clock::ManualClock::new(1_000_000);
        use magnetar_clock::Clock;
        let limiter = RateLimiter::default();
        assert!(limiter.is_unlimited());
        assert_eq!(limiter.wait_ms(clock.now_ms()), 0);
        limiter.set(10, 0, 1_000, clock.now_ms());
        assert_eq!(limiter.wait_ms(clock.now_ms()), 0);
        assert_eq!(limiter.available_messages(), 10);
        limiter.consume(10, 500);
        // Empty: one token takes 100 ms.
        assert_eq!(limiter.wait_ms(clock.now_ms()), 100);
        clock.advance_ms(50);
        assert_eq!(limiter.wait_ms(clock.now_ms()), 100, "half a token is no token");
        clock.advance_ms(50);
        assert_eq!(limiter.wait_ms(clock.now_ms()), 0);
        assert_eq!(limiter.available_messages(), 1);
        // Many small steps earn the same as one big one (no rounding loss).
        for _ in 0..90 {
            clock.advance_ms(10);
            limiter.wait_ms(clock.now_ms());
        }
        assert_eq!(limiter.available_messages(), 10);
        // Never more than one period's worth banked.
        clock.advance_ms(60_000);
        limiter.wait_ms(clock.now_ms());
        assert_eq!(limiter.available_messages(), 10);
        // Overdraw (a big batch): the wait covers the debt.
        limiter.consume(25, 0);
        assert_eq!(limiter.wait_ms(clock.now_ms()), 1_600);
        // The same rate set again changes nothing; a new rate starts full.
        limiter.set(10, 0, 1_000, clock.now_ms());
        assert_eq!(limiter.wait_ms(clock.now_ms()), 1_600);
        limiter.set(20, 0, 1_000, clock.now_ms());
        assert_eq!(limiter.wait_ms(clock.now_ms()), 0);
    }

    #[test]
    fn byte_rate_throttles_on_its_own() {
        let limiter = RateLimiter::default();
        limiter.set(0, 1_000, 1_000, 0);
        assert_eq!(limiter.available_messages(), u64::MAX);
        limiter.consume(1, 3_000);
        assert_eq!(limiter.wait_ms(0), 2_001);
        assert_eq!(limiter.wait_ms(2_001), 0);
    }
}
