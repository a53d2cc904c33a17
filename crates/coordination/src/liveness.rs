//! Which other brokers are alive, from the probes a broker makes of them: the failure detector
//! behind a fast takeover. It decides only *when* to stop waiting for an owner; safety does not
//! rest on it (a broker taking a bundle over fences the ledgers of every topic it loads, so a
//! broker wrongly thought dead loses its next append or compare-and-set, not data).
//!
//! A refused or reset connection means no process listens: dead after
//! [`LivenessConfig::refused_misses`] in a row (a restart of the same broker answers again at
//! once). A probe that times out may be a slow or frozen process: dead only after
//! [`LivenessConfig::timeout_misses`] in a row, so a loaded broker is not taken over for one
//! slow answer. One good answer makes a broker alive again.

use std::collections::HashMap;
use std::time::Duration;

/// What one probe of a broker found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// It answered.
    Answered,
    /// The connection was refused or reset: no process listens there.
    Refused,
    /// No answer within the probe timeout.
    TimedOut,
}

/// How many failed probes in a row make a broker dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Refused (or reset) probes in a row. Default 2.
    pub refused_misses: u32,
    /// Timed-out probes in a row. Default 3.
    pub timeout_misses: u32,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        LivenessConfig { refused_misses: 2, timeout_misses: 3 }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Misses {
    refused: u32,
    timed_out: u32,
}

/// The probes' verdicts, per broker id.
#[derive(Debug, Default)]
pub struct Liveness {
    config: LivenessConfig,
    misses: HashMap<String, Misses>,
}

impl Liveness {
    pub fn new(config: LivenessConfig) -> Liveness {
        assert!(config.refused_misses >= 1 && config.timeout_misses >= 1);
        Liveness { config, misses: HashMap::new() }
    }

    /// Records a probe of `broker`; returns whether it is dead now.
    pub fn observe(&mut self, broker: &str, probe: Probe) -> bool {
        let misses = self.misses.entry(broker.to_string()).or_default();
        match probe {
            Probe::Answered => *misses = Misses::default(),
            // A refusal after timeouts still counts them: either way nothing answered.
            Probe::Refused => misses.refused += 1,
            Probe::TimedOut => misses.timed_out += 1,
        }
        self.is_dead(broker)
    }

    /// Whether the probes of `broker` say it is dead (never probed: alive).
    pub fn is_dead(&self, broker: &str) -> bool {
        self.misses.get(broker).is_some_and(|m| {
            m.refused >= self.config.refused_misses
                || m.timed_out >= self.config.timeout_misses
                || m.refused + m.timed_out >= self.config.timeout_misses
        })
    }

    /// Forgets a broker (its registration is gone, or it registered anew).
    pub fn forget(&mut self, broker: &str) {
        self.misses.remove(broker);
    }
}

/// Whether a round of probes, each bounded by `timeout`, that took `took` in all measured the
/// brokers probed. A round far past its bound means this process itself stalled (frozen by
/// SIGSTOP, starved of CPU, a VM paused): its probes' timers fired late, and their time-outs
/// say nothing of the others. Counting them would make a thawed broker take every bundle back.
pub fn round_measured_others(took: Duration, timeout: Duration) -> bool {
    took <= timeout.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_kill_sooner_than_timeouts_and_one_answer_revives() {
        let mut live = Liveness::new(LivenessConfig::default());
        assert!(!live.is_dead("b1"), "never probed: alive");
        assert!(!live.observe("b1", Probe::Refused));
        assert!(live.observe("b1", Probe::Refused), "two refusals: nobody listens");
        assert!(!live.observe("b1", Probe::Answered), "restarted: alive again");

        assert!(!live.observe("b2", Probe::TimedOut));
        assert!(!live.observe("b2", Probe::TimedOut), "two slow answers are not death");
        assert!(live.observe("b2", Probe::TimedOut));
        assert!(!live.is_dead("b1"), "verdicts are per broker");
    }

    #[test]
    fn an_answer_between_misses_resets_the_count() {
        let mut live = Liveness::new(LivenessConfig::default());
        for _ in 0..10 {
            assert!(!live.observe("b", Probe::TimedOut));
            assert!(!live.observe("b", Probe::TimedOut));
            assert!(!live.observe("b", Probe::Answered), "a slow broker that answers stays");
        }
        assert!(!live.observe("b", Probe::TimedOut));
        assert!(!live.observe("b", Probe::TimedOut));
        assert!(live.observe("b", Probe::Refused), "timeouts and a refusal add up");
        live.forget("b");
        assert!(!live.is_dead("b"));
    }

    #[test]
    fn a_round_far_past_its_timeout_measured_this_process() {
        let timeout = Duration::from_secs(1);
        assert!(round_measured_others(Duration::from_millis(3), timeout));
        assert!(round_measured_others(Duration::from_millis(1_001), timeout), "timed out on time");
        assert!(round_measured_others(Duration::from_millis(2_000), timeout), "a busy runtime");
        assert!(!round_measured_others(Duration::from_secs(12), timeout), "frozen for 12 s");
    }
}
