//! Namespace isolation policies (`pulsar-admin ns-isolation-policy`): which brokers may own the
//! bundles of which namespaces. Pure: the shell keeps the stored policies current and asks
//! [`IsolationPolicies::candidates`] wherever a bundle is placed (assignment, hand-over,
//! reassignment of a dead broker's bundles, load shedding).
//!
//! Pulsar's rules (`LoadManagerShared.applyNamespacePolicies`):
//! - a namespace matched by a policy (its `namespaces` regexes, against `tenant/namespace`) goes
//!   to the policy's *primary* brokers; when fewer than `min_limit` primaries are available
//!   (`auto_failover_policy` `min_available`), to its *secondary* brokers as well; never to
//!   any other broker (no candidate: the lookup waits and retries);
//! - a namespace no policy matches goes to the *shared* brokers: those no policy names as
//!   primary (a secondary-only broker is shared).
//!
//! Every regex matches a whole string, as Java's `String.matches` does; a broker's regexes are
//! tried on its id (`host:port`) and on its host alone, as Pulsar's newest versions do (on
//! loopback every broker has the same host, so the port tells them apart).

use std::collections::BTreeMap;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The only auto-failover policy type Pulsar has.
pub const MIN_AVAILABLE: &str = "min_available";

/// Pulsar's `NamespaceIsolationData`, as the admin API takes and returns it (fields it does
/// not know, such as `unloadScope`, are kept).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NamespaceIsolationData {
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub primary: Vec<String>,
    #[serde(default)]
    pub secondary: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_failover_policy: Option<AutoFailoverPolicy>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `{"policy_type": "min_available", "parameters": {"min_limit": "1", "usage_threshold": "80"}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AutoFailoverPolicy {
    #[serde(default)]
    pub policy_type: Option<String>,
    #[serde(default)]
    pub parameters: BTreeMap<String, Value>,
}

/// The stored policies of a cluster, by name (at `/admin/clusters/{cluster}/namespaceIsolationPolicies`).
pub type StoredPolicies = BTreeMap<String, NamespaceIsolationData>;

/// One policy, its regexes compiled.
#[derive(Debug, Clone)]
struct Policy {
    name: String,
    namespaces: Vec<Regex>,
    primary: Vec<Regex>,
    secondary: Vec<Regex>,
    min_limit: usize,
}

impl NamespaceIsolationData {
    /// Pulsar's checks (`NamespaceIsolationDataImpl.validate`): namespaces and primary brokers
    /// given, every regex valid, a `min_available` policy with integer `min_limit` and
    /// `usage_threshold`. The reason when not.
    pub fn validate(&self) -> Result<(), String> {
        self.compile("").map(|_| ())
    }

    fn compile(&self, name: &str) -> Result<Policy, String> {
        if self.namespaces.is_empty() {
            return Err("namespaces must not be empty".to_string());
        }
        if self.primary.is_empty() {
            return Err("primary brokers must not be empty".to_string());
        }
        let policy = self
            .auto_failover_policy
            .as_ref()
            .ok_or_else(|| "auto_failover_policy is required".to_string())?;
        if policy.policy_type.as_deref() != Some(MIN_AVAILABLE) {
            return Err(format!(
                "Unrecognized auto_failover_policy {:?}: the one type is {MIN_AVAILABLE}",
                policy.policy_type.as_deref().unwrap_or("")
            ));
        }
        let integer = |key: &str| -> Result<u64, String> {
            let value = policy.parameters.get(key).ok_or_else(|| {
                format!("auto_failover_policy parameter {key} is required for {MIN_AVAILABLE}")
            })?;
            let parsed = match value {
                Value::String(s) => s.trim().parse::<u64>().ok(),
                Value::Number(n) => n.as_u64(),
                _ => None,
            };
            parsed.ok_or_else(|| format!("auto_failover_policy parameter {key} is not an integer"))
        };
        let min_limit = integer("min_limit")?;
        integer("usage_threshold")?;
        Ok(Policy {
            name: name.to_string(),
            namespaces: compile_all(&self.namespaces)?,
            primary: compile_all(&self.primary)?,
            secondary: compile_all(&self.secondary)?,
            min_limit: usize::try_from(min_limit).unwrap_or(usize::MAX),
        })
    }
}

fn compile_all(patterns: &[String]) -> Result<Vec<Regex>, String> {
    patterns
        .iter()
        .map(|p| Regex::new(&format!("^(?:{p})$")).map_err(|e| format!("invalid regex {p:?}: {e}")))
        .collect()
}

/// How a broker stands with the policies (`ns-isolation-policy brokers`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerIsolation {
    /// The last policy naming the broker (primary or secondary), if any.
    pub policy_name: Option<String>,
    /// Whether that policy names it primary.
    pub is_primary: bool,
    /// The namespace regexes of every policy naming the broker.
    pub namespace_regex: Vec<String>,
}

/// A cluster's policies, ready to place bundles by. Empty: every broker may own anything.
#[derive(Debug, Clone, Default)]
pub struct IsolationPolicies {
    policies: Vec<Policy>,
}

impl IsolationPolicies {
    /// Compiles `stored` (in name order, so that every broker picks the same policy for a
    /// namespace two policies match); a policy that does not validate (written past the admin
    /// API) is left out, with the reason.
    pub fn new(stored: &StoredPolicies) -> (IsolationPolicies, Vec<(String, String)>) {
        let mut policies = Vec::new();
        let mut rejected = Vec::new();
        for (name, data) in stored {
            match data.compile(name) {
                Ok(policy) => policies.push(policy),
                Err(reason) => rejected.push((name.clone(), reason)),
            }
        }
        (IsolationPolicies { policies }, rejected)
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// The brokers of `available` that may own a bundle of `namespace` (`tenant/namespace`).
    pub fn candidates<'a>(&self, namespace: &str, available: &[&'a str]) -> Vec<&'a str> {
        if self.policies.is_empty() {
            return available.to_vec();
        }
        let Some(policy) =
            self.policies.iter().find(|p| p.namespaces.iter().any(|r| r.is_match(namespace)))
        else {
            return available.iter().copied().filter(|b| self.is_shared(b)).collect();
        };
        let primaries: Vec<&str> =
            available.iter().copied().filter(|b| matches_broker(&policy.primary, b)).collect();
        if primaries.len() >= policy.min_limit {
            return primaries;
        }
        available
            .iter()
            .copied()
            .filter(|b| matches_broker(&policy.primary, b) || matches_broker(&policy.secondary, b))
            .collect()
    }

    /// Whether a broker takes namespaces no policy matches: no policy names it primary.
    fn is_shared(&self, broker: &str) -> bool {
        !self.policies.iter().any(|p| matches_broker(&p.primary, broker))
    }

    /// How `broker` stands with the policies.
    pub fn broker(&self, broker: &str) -> BrokerIsolation {
        let mut found = BrokerIsolation::default();
        for policy in &self.policies {
            let primary = matches_broker(&policy.primary, broker);
            if primary || matches_broker(&policy.secondary, broker) {
                found.policy_name = Some(policy.name.clone());
                found.is_primary = primary;
                found
                    .namespace_regex
                    .extend(policy.namespaces.iter().map(|r| unanchored(r.as_str()).to_string()));
            }
        }
        found
    }
}

/// A broker id `host:port` matches a regex whole, or by its host alone.
fn matches_broker(patterns: &[Regex], broker: &str) -> bool {
    let host = broker.rsplit_once(':').map_or(broker, |(host, _)| host);
    patterns.iter().any(|r| r.is_match(broker) || r.is_match(host))
}

/// The pattern as given, without the anchors [`compile_all`] adds.
fn unanchored(pattern: &str) -> &str {
    pattern.strip_prefix("^(?:").and_then(|p| p.strip_suffix(")$")).unwrap_or(pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(namespaces: &[&str], primary: &[&str], secondary: &[&str], min: u64) -> Value {
        serde_json::json!({
            "namespaces": namespaces, "primary": primary, "secondary": secondary,
            "auto_failover_policy": {"policy_type": "min_available",
                                     "parameters": {"min_limit": min.to_string(), "usage_threshold": "80"}}
        })
    }

    fn policies(entries: &[(&str, Value)]) -> IsolationPolicies {
        let stored: StoredPolicies = entries
            .iter()
            .map(|(n, v)| (n.to_string(), serde_json::from_value(v.clone()).unwrap()))
            .collect();
        let (policies, rejected) = IsolationPolicies::new(&stored);
        assert!(rejected.is_empty(), "{rejected:?}");
        policies
    }

    const BROKERS: [&str; 4] = ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080", "10.0.0.4:8080"];

    #[test]
    fn without_policies_every_broker_is_a_candidate() {
        let none = IsolationPolicies::default();
        assert_eq!(none.candidates("public/default", &BROKERS), BROKERS.to_vec());
    }

    #[test]
    fn an_isolated_namespace_goes_to_its_primaries_and_others_to_the_shared_brokers() {
        let p = policies(&[(
            "gold",
            policy(&["gold/.*"], &["10.0.0.1", "10.0.0.2"], &["10.0.0.3"], 1),
        )]);
        assert_eq!(p.candidates("gold/orders", &BROKERS), vec!["10.0.0.1:8080", "10.0.0.2:8080"]);
        // Not primary anywhere: shared, whether secondary or not.
        assert_eq!(
            p.candidates("public/default", &BROKERS),
            vec!["10.0.0.3:8080", "10.0.0.4:8080"]
        );
    }

    #[test]
    fn too_few_primaries_fail_over_to_the_secondaries_and_never_to_other_brokers() {
        let p = policies(&[("gold", policy(&["gold/.*"], &["10.0.0.[12]"], &["10.0.0.3"], 2))]);
        assert_eq!(p.candidates("gold/a", &BROKERS), vec!["10.0.0.1:8080", "10.0.0.2:8080"]);
        let one_primary = ["10.0.0.1:8080", "10.0.0.3:8080", "10.0.0.4:8080"];
        assert_eq!(p.candidates("gold/a", &one_primary), vec!["10.0.0.1:8080", "10.0.0.3:8080"]);
        assert!(p.candidates("gold/a", &["10.0.0.4:8080"]).is_empty());
    }

    #[test]
    fn brokers_on_one_host_are_told_apart_by_port_and_regexes_match_whole() {
        let local = ["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:18081"];
        let p = policies(&[("iso", policy(&["t/ns"], &["127.0.0.1:8081"], &[], 1))]);
        assert_eq!(p.candidates("t/ns", &local), vec!["127.0.0.1:8081"]);
        assert!(p.candidates("t/ns2", &local).len() == 2, "t/ns2 is not t/ns: a whole match");
        assert_eq!(p.broker("127.0.0.1:8081").policy_name.as_deref(), Some("iso"));
        assert!(p.broker("127.0.0.1:8081").is_primary);
        assert_eq!(p.broker("127.0.0.1:8081").namespace_regex, vec!["t/ns".to_string()]);
        assert_eq!(p.broker("127.0.0.1:8082"), BrokerIsolation::default());
    }

    #[test]
    fn bad_policies_are_refused_with_the_reason() {
        let bad = |v: Value| {
            serde_json::from_value::<NamespaceIsolationData>(v).unwrap().validate().unwrap_err()
        };
        assert!(bad(policy(&[], &["b"], &[], 1)).contains("namespaces"));
        assert!(bad(policy(&["n"], &[], &[], 1)).contains("primary"));
        assert!(bad(policy(&["n"], &["(unclosed"], &[], 1)).contains("invalid regex"));
        let mut wrong_type = policy(&["n"], &["b"], &[], 1);
        wrong_type["auto_failover_policy"]["policy_type"] = "max_available".into();
        assert!(bad(wrong_type).contains("Unrecognized"));
        let mut not_integer = policy(&["n"], &["b"], &[], 1);
        not_integer["auto_failover_policy"]["parameters"]["min_limit"] = "one".into();
        assert!(bad(not_integer).contains("min_limit"));
        // Numbers are taken as well as strings; unknown fields are kept.
        let mut fine = policy(&["n"], &["b"], &[], 1);
        fine["auto_failover_policy"]["parameters"]["min_limit"] = 1.into();
        fine["unloadScope"] = "all_matching".into();
        let data: NamespaceIsolationData = serde_json::from_value(fine.clone()).unwrap();
        data.validate().unwrap();
        assert_eq!(serde_json::to_value(&data).unwrap()["unloadScope"], "all_matching");
    }
}
