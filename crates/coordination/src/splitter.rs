//! Automatic bundle splits (Pulsar's `loadBalancerAutoBundleSplitEnabled` and its
//! `BundleSplitterTask`): the leader splits a bundle whose load passed a threshold, so that a hot
//! bundle's topics can be spread over brokers. Pure: the brokers' load reports in, the bundles to
//! split out; the shell splits each at the middle of its range (`range_equally_divide`) in the
//! namespace's policies, and the owner keeps both halves (it sees the new bundles through its
//! watch) until the shedder moves one.
//!
//! A bundle is split when it has more than `max_topics` topics, or carries more than
//! `max_msg_rate` messages or `max_bandwidth` bytes per second, as long as it has two topics or
//! more (one topic cannot be spread) and its namespace has fewer than `max_bundles` bundles; at
//! most one bundle per namespace per decision (the next decision sees the halves' own load).

use std::collections::{BTreeMap, BTreeSet};

use crate::shedder::LoadReport;

/// The thresholds. Defaults are Pulsar's.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitConfig {
    /// `loadBalancerAutoBundleSplitEnabled`. Default true.
    pub enabled: bool,
    /// `loadBalancerNamespaceBundleMaxTopics`. Default 1000.
    pub max_topics: u32,
    /// `loadBalancerNamespaceBundleMaxMsgRate`, messages per second in. Default 30000.
    pub max_msg_rate: f64,
    /// `loadBalancerNamespaceBundleMaxBandwidthMbytes`, as bytes per second. Default 100 MB/s.
    pub max_bandwidth: f64,
    /// `loadBalancerNamespaceMaximumBundles`. Default 128.
    pub max_bundles: usize,
}

impl Default for SplitConfig {
    fn default() -> Self {
        SplitConfig {
            enabled: true,
            max_topics: 1000,
            max_msg_rate: 30_000.0,
            max_bandwidth: 100.0 * 1024.0 * 1024.0,
            max_bundles: 128,
        }
    }
}

/// The bundles (ownership keys) to split now. `namespace_of(key)` names a bundle's namespace and
/// `bundle_count(namespace)` says how many bundles it has (None: not known, no split).
pub fn bundles_to_split(
    reports: &BTreeMap<String, LoadReport>,
    namespace_of: &dyn Fn(&str) -> Option<String>,
    bundle_count: &dyn Fn(&str) -> Option<usize>,
    config: &SplitConfig,
) -> Vec<String> {
    if !config.enabled {
        return Vec::new();
    }
    let mut hot: Vec<(&str, f64)> = Vec::new();
    for report in reports.values() {
        for bundle in &report.bundles {
            let over = bundle.topics > config.max_topics
                || bundle.msg_rate > config.max_msg_rate
                || bundle.throughput > config.max_bandwidth;
            if over && bundle.topics >= 2 {
                // The most overloaded first: its share of the thresholds it passed.
                let excess = (bundle.topics as f64 / config.max_topics.max(1) as f64)
                    .max(bundle.msg_rate / config.max_msg_rate.max(1.0))
                    .max(bundle.throughput / config.max_bandwidth.max(1.0));
                hot.push((bundle.key.as_str(), excess));
            }
        }
    }
    hot.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let mut namespaces = BTreeSet::new();
    let mut out = Vec::new();
    for (key, _) in hot {
        let Some(namespace) = namespace_of(key) else { continue };
        let Some(count) = bundle_count(&namespace) else { continue };
        if count >= config.max_bundles || !namespaces.insert(namespace) {
            continue;
        }
        out.push(key.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shedder::BundleLoad;

    fn bundle(key: &str, topics: u32, msg_rate: f64, throughput: f64) -> BundleLoad {
        BundleLoad { key: key.into(), throughput, topics, msg_rate }
    }

    fn reports(bundles: Vec<BundleLoad>) -> BTreeMap<String, LoadReport> {
        let report = LoadReport { bundles, ..LoadReport::default() };
        BTreeMap::from([("b1".to_string(), report)])
    }

    fn namespace_of(key: &str) -> Option<String> {
        key.rsplit_once('/').map(|(ns, _)| ns.to_string())
    }

    #[test]
    fn a_bundle_past_any_threshold_is_split_one_per_namespace_hottest_first() {
        let config = SplitConfig { max_topics: 10, max_msg_rate: 100.0, ..Default::default() };
        let loads = reports(vec![
            bundle("/namespace/t/a/0x00000000_0x80000000", 11, 0.0, 0.0),
            bundle("/namespace/t/a/0x80000000_0xffffffff", 50, 0.0, 0.0),
            bundle("/namespace/t/b/0x00000000_0xffffffff", 3, 150.0, 0.0),
            bundle("/namespace/t/c/0x00000000_0xffffffff", 3, 10.0, 1e3),
        ]);
        let split = bundles_to_split(&loads, &namespace_of, &|_| Some(2), &config);
        assert_eq!(
            split,
            [
                "/namespace/t/a/0x80000000_0xffffffff", // 5x its topics' threshold
                "/namespace/t/b/0x00000000_0xffffffff", // 1.5x its message rate's
            ]
        );
    }

    #[test]
    fn one_topic_a_full_namespace_or_splits_off_split_nothing() {
        let config = SplitConfig { max_topics: 10, max_bundles: 4, ..Default::default() };
        let hot = reports(vec![
            bundle("/namespace/t/a/0x00000000_0xffffffff", 1, 1e9, 1e12),
            bundle("/namespace/t/b/0x00000000_0xffffffff", 99, 0.0, 0.0),
        ]);
        let count = |ns: &str| Some(if ns.ends_with("/b") { 4 } else { 1 });
        assert!(bundles_to_split(&hot, &namespace_of, &count, &config).is_empty());
        let unknown = |_: &str| None;
        let any = reports(vec![bundle("/namespace/t/c/0x00000000_0xffffffff", 99, 0.0, 0.0)]);
        assert!(bundles_to_split(&any, &namespace_of, &unknown, &config).is_empty());
        let off = SplitConfig { enabled: false, ..config };
        assert!(bundles_to_split(&any, &namespace_of, &|_| Some(1), &off).is_empty());
    }
}
