//! Load shedding: which bundles the leader moves between brokers, decided from the brokers' load
//! reports (Pulsar's `TransferShedder`, PIP-192's extensible load manager). Pure: reports and a
//! clock in, transfers out; the shell applies each as a hand-over.
//!
//! - Each broker's load is the largest of its resource uses (CPU, memory, network in and out,
//!   fractions of its limits), smoothed by an exponential moving average (Pulsar's
//!   `loadBalancerHistoryResourcePercentage` = 0.9 of the previous value).
//! - While the standard deviation of the loads exceeds `target_std` (Pulsar's
//!   `loadBalancerBrokerLoadTargetStd` = 0.25) for `hit_threshold` decisions in a row
//!   (`loadBalancerSheddingConditionHitCountThreshold` = 3), the most loaded broker gives the
//!   least loaded bundles carrying about half the difference of their loads, for at most
//!   `max_brokers_per_cycle` pairs (`loadBalancerMaxNumberOfBrokerSheddingPerCycle` = 3).
//! - A bundle moved is not moved again for `cool_down` (`loadBalanceSheddingDelayInSeconds`,
//!   180 s), and a broker never gives away its last bundle.
//! - Ours, beyond Pulsar's: a broker owning no bundle while another owns two or more gets one at
//!   once (the least busy of the fullest broker's), so a broker added to an idle cluster is used
//!   without waiting for load to build up.

use std::collections::{BTreeMap, HashMap};

/// One bundle's traffic on its broker.
#[derive(Debug, Clone, PartialEq)]
pub struct BundleLoad {
    pub key: String,
    /// Bytes per second in and out.
    pub throughput: f64,
    /// Topics loaded in it.
    pub topics: u32,
    /// Messages per second in.
    pub msg_rate: f64,
}

/// What a broker reports (resource uses as fractions of its limits, 0..=1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    pub cpu: f64,
    pub memory: f64,
    pub bandwidth_in: f64,
    pub bandwidth_out: f64,
    pub bundles: Vec<BundleLoad>,
}

impl LoadReport {
    /// The broker's load now: its most used resource.
    pub fn max_resource(&self) -> f64 {
        [self.cpu, self.memory, self.bandwidth_in, self.bandwidth_out]
            .into_iter()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShedderConfig {
    pub target_std: f64,
    pub history: f64,
    pub hit_threshold: u32,
    pub max_brokers_per_cycle: usize,
    pub cool_down_ms: u64,
}

impl Default for ShedderConfig {
    fn default() -> Self {
        ShedderConfig {
            target_std: 0.25,
            history: 0.9,
            hit_threshold: 3,
            max_brokers_per_cycle: 3,
            cool_down_ms: 180_000,
        }
    }
}

/// Move `bundle` from broker `from` to broker `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub bundle: String,
    pub from: String,
    pub to: String,
}

/// The shedder's memory between decisions (the leader's; a new leader starts afresh).
#[derive(Debug, Default)]
pub struct Shedder {
    config: ShedderConfig,
    load: BTreeMap<String, f64>,
    hits: u32,
    moved_at: HashMap<String, u64>,
}

impl Shedder {
    pub fn new(config: ShedderConfig) -> Shedder {
        Shedder { config, ..Shedder::default() }
    }

    /// The smoothed load of each broker seen in the last decision.
    pub fn loads(&self) -> &BTreeMap<String, f64> {
        &self.load
    }

    /// One decision over the current `reports` (broker id -> report) at `now_ms`; a bundle
    /// moves only to a broker `may_own(bundle, broker)` allows (the isolation policies).
    pub fn decide(
        &mut self,
        reports: &BTreeMap<String, LoadReport>,
        now_ms: u64,
        may_own: &dyn Fn(&str, &str) -> bool,
    ) -> Vec<Transfer> {
        let history = self.config.history.clamp(0.0, 1.0);
        self.load.retain(|id, _| reports.contains_key(id));
        for (id, report) in reports {
            let now = report.max_resource();
            let smoothed = match self.load.get(id) {
                Some(before) => before * history + now * (1.0 - history),
                None => now,
            };
            self.load.insert(id.clone(), smoothed);
        }
        let cool = self.config.cool_down_ms;
        self.moved_at.retain(|_, at| now_ms.saturating_sub(*at) < cool);
        // Bundles of each broker, what is left to give after this decision's transfers.
        let mut owned: BTreeMap<&str, Vec<&BundleLoad>> =
            reports.iter().map(|(id, r)| (id.as_str(), r.bundles.iter().collect())).collect();
        let mut transfers = Vec::new();
        self.fill_empty_brokers(&mut owned, &mut transfers, may_own);
        if self.load.len() < 2 {
            return self.commit(transfers, now_ms);
        }
        let n = self.load.len() as f64;
        let mean = self.load.values().sum::<f64>() / n;
        let std = (self.load.values().map(|l| (l - mean).powi(2)).sum::<f64>() / n).sqrt();
        if std <= self.config.target_std {
            self.hits = 0;
            return self.commit(transfers, now_ms);
        }
        self.hits += 1;
        if self.hits < self.config.hit_threshold {
            return self.commit(transfers, now_ms);
        }
        self.hits = 0;
        let mut by_load: Vec<(&str, f64)> =
            self.load.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        by_load.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
        let pairs = self.config.max_brokers_per_cycle.min(by_load.len() / 2);
        for i in 0..pairs {
            let (from, high) = by_load[i];
            let (to, low) = by_load[by_load.len() - 1 - i];
            if high - low <= self.config.target_std || high <= 0.0 {
                break;
            }
            // Give about half the difference: that share of the busy broker's traffic.
            let share = (high - low) / 2.0 / high;
            let bundles = owned.get_mut(from).expect("every reporting broker is listed");
            let total: f64 = bundles.iter().map(|b| b.throughput).sum();
            let mut to_move = share * total;
            let mut candidates: Vec<&BundleLoad> = bundles
                .iter()
                .copied()
                .filter(|b| !self.moved_at.contains_key(&b.key) && may_own(&b.key, to))
                .collect();
            candidates
                .sort_by(|a, b| b.throughput.total_cmp(&a.throughput).then(a.key.cmp(&b.key)));
            for bundle in candidates {
                if to_move <= 0.0 || bundles.len() <= 1 {
                    break;
                }
                if bundle.throughput > to_move {
                    continue; // too big: it would only move the imbalance over
                }
                to_move -= bundle.throughput;
                bundles.retain(|b| b.key != bundle.key);
                transfers.push(Transfer {
                    bundle: bundle.key.clone(),
                    from: from.to_string(),
                    to: to.to_string(),
                });
            }
        }
        self.commit(transfers, now_ms)
    }

    /// A broker with no bundle gets the least busy bundle of the broker with the most (two or
    /// more), one per empty broker.
    fn fill_empty_brokers<'a>(
        &self,
        owned: &mut BTreeMap<&'a str, Vec<&'a BundleLoad>>,
        transfers: &mut Vec<Transfer>,
        may_own: &dyn Fn(&str, &str) -> bool,
    ) {
        let empty: Vec<&str> =
            owned.iter().filter(|(_, b)| b.is_empty()).map(|(id, _)| *id).collect();
        for to in empty {
            let Some((from, _)) = owned
                .iter()
                .filter(|(_, b)| b.len() >= 2)
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
                .map(|(id, b)| (*id, b.len()))
            else {
                return;
            };
            let bundles = owned.get_mut(from).expect("listed");
            let pick = bundles
                .iter()
                .filter(|b| !self.moved_at.contains_key(&b.key) && may_own(&b.key, to))
                .min_by(|a, b| a.throughput.total_cmp(&b.throughput).then(a.key.cmp(&b.key)))
                .copied();
            let Some(pick) = pick else { continue };
            bundles.retain(|b| b.key != pick.key);
            owned.get_mut(to).expect("listed").push(pick);
            transfers.push(Transfer { bundle: pick.key.clone(), from: from.into(), to: to.into() });
        }
    }

    fn commit(&mut self, transfers: Vec<Transfer>, now_ms: u64) -> Vec<Transfer> {
        for t in &transfers {
            self.moved_at.insert(t.bundle.clone(), now_ms);
        }
        transfers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(cpu: f64, bundles: &[(&str, f64)]) -> LoadReport {
        LoadReport {
            cpu,
            bundles: bundles
                .iter()
                .map(|(k, t)| BundleLoad {
                    key: k.to_string(),
                    throughput: *t,
                    topics: 1,
                    msg_rate: 0.0,
                })
                .collect(),
            ..LoadReport::default()
        }
    }

    fn anywhere(_bundle: &str, _to: &str) -> bool {
        true
    }

    fn reports(list: Vec<(&str, LoadReport)>) -> BTreeMap<String, LoadReport> {
        list.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn balanced_brokers_keep_their_bundles() {
        let mut shedder = Shedder::new(ShedderConfig::default());
        let r = reports(vec![
            ("a", report(0.5, &[("a1", 10.0), ("a2", 10.0)])),
            ("b", report(0.45, &[("b1", 10.0)])),
            ("c", report(0.55, &[("c1", 10.0), ("c2", 5.0)])),
        ]);
        for cycle in 0..10 {
            assert!(shedder.decide(&r, cycle * 5_000, &anywhere).is_empty(), "cycle {cycle}");
        }
    }

    #[test]
    fn an_overloaded_broker_sheds_about_half_the_difference_after_the_hit_threshold() {
        let mut shedder = Shedder::new(ShedderConfig::default());
        let r = reports(vec![
            ("hot", report(0.9, &[("h1", 40.0), ("h2", 30.0), ("h3", 20.0), ("h4", 10.0)])),
            ("cold", report(0.1, &[("c1", 1.0)])),
        ]);
        assert!(shedder.decide(&r, 0, &anywhere).is_empty(), "one hit");
        assert!(shedder.decide(&r, 5_000, &anywhere).is_empty(), "two hits");
        let moved = shedder.decide(&r, 10_000, &anywhere);
        // (0.9 - 0.1) / 2 / 0.9 = 44 % of 100 B/s: h1 (40); then every other is bigger than
        // the 4 B/s left.
        let names: Vec<&str> = moved.iter().map(|t| t.bundle.as_str()).collect();
        assert_eq!(names, vec!["h1"], "the biggest bundle under 44 first: {moved:?}");
        assert!(moved.iter().all(|t| t.from == "hot" && t.to == "cold"));
        // The same reports again: the moved bundle cools down, the rest waits for new hits.
        assert!(shedder.decide(&r, 15_000, &anywhere).is_empty());
    }

    #[test]
    fn a_moved_bundle_is_not_moved_again_within_the_cool_down() {
        let config = ShedderConfig { hit_threshold: 1, ..ShedderConfig::default() };
        let mut shedder = Shedder::new(config);
        let r = reports(vec![
            ("hot", report(0.9, &[("h1", 40.0), ("h2", 60.0)])),
            ("cold", report(0.1, &[("c1", 1.0)])),
        ]);
        assert_eq!(shedder.decide(&r, 0, &anywhere).len(), 1);
        // Reports not yet refreshed (h1 still listed on hot): h1 stays put; h2 is too big.
        assert!(shedder.decide(&r, 60_000, &anywhere).is_empty());
        assert_eq!(shedder.decide(&r, 181_000, &anywhere).len(), 1, "cooled down");
    }

    #[test]
    fn a_broker_never_gives_its_last_bundle() {
        let config = ShedderConfig { hit_threshold: 1, ..ShedderConfig::default() };
        let mut shedder = Shedder::new(config);
        let r = reports(vec![
            ("hot", report(1.0, &[("h1", 100.0)])),
            ("cold", report(0.0, &[("c1", 1.0)])),
        ]);
        assert!(shedder.decide(&r, 0, &anywhere).is_empty());
    }

    #[test]
    fn an_empty_broker_gets_a_bundle_from_the_fullest_at_once() {
        let mut shedder = Shedder::new(ShedderConfig::default());
        let r = reports(vec![
            ("a", report(0.1, &[("a1", 5.0), ("a2", 1.0), ("a3", 9.0)])),
            ("b", report(0.1, &[("b1", 5.0), ("b2", 1.0)])),
            ("new", report(0.0, &[])),
        ]);
        let moved = shedder.decide(&r, 0, &anywhere);
        assert_eq!(
            moved,
            vec![Transfer { bundle: "a2".into(), from: "a".into(), to: "new".into() }]
        );
        // A broker alone, or brokers with one bundle each, move nothing.
        let mut shedder = Shedder::new(ShedderConfig::default());
        let r = reports(vec![("a", report(0.1, &[("a1", 5.0)])), ("new", report(0.0, &[]))]);
        assert!(shedder.decide(&r, 0, &anywhere).is_empty());
    }

    #[test]
    fn bundles_move_only_where_the_isolation_policies_allow() {
        let config = ShedderConfig { hit_threshold: 1, ..ShedderConfig::default() };
        let mut shedder = Shedder::new(config);
        let r = reports(vec![
            ("hot", report(0.9, &[("iso1", 40.0), ("h2", 30.0), ("h3", 20.0)])),
            ("cold", report(0.1, &[("c1", 1.0)])),
            ("new", report(0.0, &[])),
        ]);
        // `iso…` bundles may not go to `new`; nothing may go to `cold`.
        let may_own =
            |bundle: &str, to: &str| to != "cold" && !(to == "new" && bundle.starts_with("iso"));
        let moved = shedder.decide(&r, 0, &may_own);
        assert!(!moved.is_empty());
        assert!(moved.iter().all(|t| may_own(&t.bundle, &t.to)), "{moved:?}");
    }

    #[test]
    fn loads_are_smoothed_and_forgotten_with_their_broker() {
        let mut shedder = Shedder::new(ShedderConfig::default());
        shedder.decide(&reports(vec![("a", report(1.0, &[]))]), 0, &anywhere);
        assert_eq!(shedder.loads()["a"], 1.0, "the first report is taken as it is");
        shedder.decide(&reports(vec![("a", report(0.0, &[]))]), 1, &anywhere);
        assert!((shedder.loads()["a"] - 0.9).abs() < 1e-9, "90 % history");
        shedder.decide(&reports(vec![("b", report(0.0, &[]))]), 2, &anywhere);
        assert!(!shedder.loads().contains_key("a"));
    }
}
