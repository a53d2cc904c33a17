//! Where a free bundle goes: the eligible broker with the fewest bundles, ties broken by a hash
//! of the bundle and the broker (rendezvous hashing), so that brokers deciding at once from the
//! same counts agree, and a burst of new bundles between two updates of the counts spreads over
//! the tied brokers instead of piling on one.

use std::collections::HashMap;

/// The broker among `eligible` to own `bundle_key`, given how many bundles each owns now.
pub fn least_loaded<'a>(
    bundle_key: &str,
    eligible: impl Iterator<Item = &'a String>,
    owned: &HashMap<String, usize>,
) -> Option<String> {
    eligible
        .min_by_key(|id| {
            (owned.get(*id).copied().unwrap_or(0), std::cmp::Reverse(score(bundle_key, id)))
        })
        .cloned()
}

/// FNV-1a of the bundle and the broker: stable across processes and versions.
fn score(bundle_key: &str, broker: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bundle_key.bytes().chain([0]).chain(broker.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_least_loaded_broker_wins() {
        let brokers = ids(&["a:1", "b:1", "c:1"]);
        let owned = HashMap::from([("a:1".to_string(), 3), ("b:1".to_string(), 1)]);
        assert_eq!(
            least_loaded("/namespace/t/n/x", brokers.iter(), &owned).as_deref(),
            Some("c:1")
        );
        assert_eq!(least_loaded("k", [].iter(), &owned), None);
    }

    #[test]
    fn ties_spread_bundles_over_the_tied_brokers_and_every_broker_agrees() {
        let brokers = ids(&["a:1", "b:1", "c:1"]);
        let none = HashMap::new();
        let mut chosen = HashMap::new();
        for i in 0..300 {
            let key = format!("/namespace/public/default/bundle-{i}");
            let pick = least_loaded(&key, brokers.iter(), &none).unwrap();
            // Another broker, listing them in another order, picks the same.
            let reversed: Vec<String> = brokers.iter().rev().cloned().collect();
            assert_eq!(least_loaded(&key, reversed.iter(), &none).unwrap(), pick);
            *chosen.entry(pick).or_insert(0) += 1;
        }
        for broker in &brokers {
            let n = chosen.get(broker).copied().unwrap_or(0);
            assert!((60..=140).contains(&n), "{broker} got {n} of 300: {chosen:?}");
        }
    }
}
