//! Namespace and topic policies: the documents Pulsar's admin API reads and writes (field names
//! of Pulsar's `Policies` and `TopicPolicies` Jackson serialisation), and [`Effective`], what a
//! topic obeys once its own policies, its namespace's and the broker defaults are layered
//! (topic over namespace over broker, Pulsar's order).
//!
//! Stored at `keys::namespace_key` (the whole namespace document) and `keys::topic_policies_key`
//! (one document per topic, partitions share their partitioned topic's). Fields Magnetar does
//! not model are kept as they came (`other`), so a round trip through an older broker loses
//! nothing.

use std::collections::BTreeMap;

use crate::schema::SchemaPolicies;
use crate::storage_nodes::IsolationGroups;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Pulsar's `RetentionPolicies`: how much consumed data a topic keeps. `-1` = unlimited,
/// `0` = none (delete once every subscription has consumed it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicies {
    #[serde(default)]
    pub retention_time_in_minutes: i32,
    #[serde(default, rename = "retentionSizeInMB")]
    pub retention_size_in_mb: i64,
}

impl RetentionPolicies {
    pub const NONE: RetentionPolicies =
        RetentionPolicies { retention_time_in_minutes: 0, retention_size_in_mb: 0 };
}

/// Pulsar's `BacklogQuota.RetentionPolicy`: what happens when a backlog quota is exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BacklogQuotaPolicy {
    /// Producers' sends wait (up to their send timeout) until the backlog shrinks.
    ProducerRequestHold,
    /// Producers are refused with `ProducerBlockedQuotaExceededException`/`Error`.
    ProducerException,
    /// The oldest backlog is acknowledged away until the quota holds again.
    ConsumerBacklogEviction,
}

/// Pulsar's `BacklogQuota`: a size limit (`destination_storage`, bytes) or a time limit
/// (`message_age`, seconds) on the backlog of the slowest subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BacklogQuota {
    /// Bytes (`-1`: none). Pulsar 2.x wrote `limit`; accepted on input. Like Pulsar's JSON
    /// binding, a number written as a string (`"limit": "10240"`, as the Go client's tests
    /// send it) is taken as that number.
    #[serde(default = "minus_one", alias = "limit", deserialize_with = "number_or_string")]
    pub limit_size: i64,
    /// Seconds (`-1`: none).
    #[serde(default = "minus_one_i32", deserialize_with = "number_or_string")]
    pub limit_time: i32,
    pub policy: BacklogQuotaPolicy,
}

/// The two kinds of backlog quota, the keys of `backlog_quota_map`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BacklogQuotaType {
    DestinationStorage,
    MessageAge,
}

impl BacklogQuotaType {
    /// Parses the `backlogQuotaType` query parameter (absent = `destination_storage`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "destination_storage" => Some(BacklogQuotaType::DestinationStorage),
            "message_age" => Some(BacklogQuotaType::MessageAge),
            _ => None,
        }
    }
}

/// Pulsar's `DispatchRate`: messages and bytes per period (`-1` or `0`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchRate {
    #[serde(default = "minus_one_i32")]
    pub dispatch_throttling_rate_in_msg: i32,
    #[serde(default = "minus_one")]
    pub dispatch_throttling_rate_in_byte: i64,
    #[serde(default)]
    pub relative_to_publish_rate: bool,
    #[serde(default = "one")]
    pub rate_period_in_second: i32,
}

/// Pulsar's `PublishRate`: messages and bytes per second (`-1` or `0`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishRate {
    #[serde(default = "minus_one_i32")]
    pub publish_throttling_rate_in_msg: i32,
    #[serde(default = "minus_one")]
    pub publish_throttling_rate_in_byte: i64,
}

/// Pulsar's `InactiveTopicDeleteMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InactiveTopicDeleteMode {
    /// Delete a topic with no producers, no consumers and no subscriptions.
    DeleteWhenNoSubscriptions,
    /// Also delete one whose subscriptions have no backlog and no consumers.
    DeleteWhenSubscriptionsCaughtUp,
}

/// Pulsar's `InactiveTopicPolicies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InactiveTopicPolicies {
    pub inactive_topic_delete_mode: InactiveTopicDeleteMode,
    pub max_inactive_duration_seconds: i32,
    pub delete_while_inactive: bool,
}

/// A namespace's policies (Pulsar's `Policies`), the fields Magnetar acts on typed and the rest
/// kept as JSON. Per-cluster maps (`publishMaxMessageRate`, the dispatch rates) are keyed by
/// cluster name as in Pulsar.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NamespacePolicies {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policies: Option<RetentionPolicies>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_ttl_in_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backlog_quota_map: BTreeMap<BacklogQuotaType, BacklogQuota>,
    #[serde(default, rename = "deduplicationEnabled", skip_serializing_if = "Option::is_none")]
    pub deduplication_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_producers_per_topic: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers_per_topic: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers_per_subscription: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unacked_messages_per_consumer: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unacked_messages_per_subscription: Option<i32>,
    #[serde(default, rename = "topicDispatchRate", skip_serializing_if = "BTreeMap::is_empty")]
    pub topic_dispatch_rate: BTreeMap<String, DispatchRate>,
    #[serde(
        default,
        rename = "subscriptionDispatchRate",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub subscription_dispatch_rate: BTreeMap<String, DispatchRate>,
    #[serde(default, rename = "publishMaxMessageRate", skip_serializing_if = "BTreeMap::is_empty")]
    pub publish_max_message_rate: BTreeMap<String, PublishRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_topic_policies: Option<InactiveTopicPolicies>,
    /// Every other field, as stored (bundles, auth_policies, persistence, properties, ...).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One topic's policies (Pulsar's `TopicPolicies`); partitions share their partitioned
/// topic's document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicPolicies {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policies: Option<RetentionPolicies>,
    #[serde(default, rename = "messageTTLInSeconds", skip_serializing_if = "Option::is_none")]
    pub message_ttl_in_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub back_log_quota_map: BTreeMap<BacklogQuotaType, BacklogQuota>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deduplication_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_producer_per_topic: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumer_per_topic: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consumers_per_subscription: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unacked_messages_on_consumer: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unacked_messages_on_subscription: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_rate: Option<DispatchRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_dispatch_rate: Option<DispatchRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_rate: Option<PublishRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_topic_policies: Option<InactiveTopicPolicies>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_size: Option<i32>,
    /// Every other field, as stored.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The broker-wide defaults a policy falls back to (the broker's config fills this in).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDefaults {
    pub retention: RetentionPolicies,
    /// 0: messages never expire.
    pub message_ttl_seconds: u32,
    pub backlog_quotas: BTreeMap<BacklogQuotaType, BacklogQuota>,
    pub deduplication_enabled: bool,
    /// 0 means unlimited for every limit below.
    pub max_producers_per_topic: u32,
    pub max_consumers_per_topic: u32,
    pub max_consumers_per_subscription: u32,
    pub max_unacked_messages_per_consumer: u32,
    pub max_unacked_messages_per_subscription: u32,
    pub dispatch_rate: Option<DispatchRate>,
    pub subscription_dispatch_rate: Option<DispatchRate>,
    pub publish_rate: Option<PublishRate>,
    pub inactive_topic: Option<InactiveTopicPolicies>,
    pub max_message_size: u32,
    /// Most subscriptions a topic takes (Pulsar's `maxSubscriptionsPerTopic`, 0: no limit).
    pub max_subscriptions_per_topic: u32,
    /// A consumer may create its durable subscription (Pulsar's
    /// `allowAutoSubscriptionCreation`, true).
    pub allow_auto_subscription_creation: bool,
    /// Messages with a delivery time wait for it (Pulsar's `delayedDeliveryEnabled`, true).
    pub delayed_delivery_enabled: bool,
}

impl Default for PolicyDefaults {
    /// Pulsar's broker defaults.
    fn default() -> Self {
        PolicyDefaults {
            retention: RetentionPolicies::NONE,
            message_ttl_seconds: 0,
            backlog_quotas: BTreeMap::new(),
            deduplication_enabled: false,
            max_producers_per_topic: 0,
            max_consumers_per_topic: 0,
            max_consumers_per_subscription: 0,
            max_unacked_messages_per_consumer: 50_000,
            max_unacked_messages_per_subscription: 200_000,
            dispatch_rate: None,
            subscription_dispatch_rate: None,
            publish_rate: None,
            inactive_topic: None,
            max_message_size: 5 * 1024 * 1024,
            max_subscriptions_per_topic: 0,
            allow_auto_subscription_creation: true,
            delayed_delivery_enabled: true,
        }
    }
}

/// What a topic obeys: topic policies over namespace policies over broker defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    pub retention: RetentionPolicies,
    pub message_ttl_seconds: u32,
    pub backlog_quotas: BTreeMap<BacklogQuotaType, BacklogQuota>,
    pub deduplication_enabled: bool,
    pub max_producers_per_topic: u32,
    pub max_consumers_per_topic: u32,
    pub max_consumers_per_subscription: u32,
    pub max_unacked_messages_per_consumer: u32,
    pub max_unacked_messages_per_subscription: u32,
    pub dispatch_rate: Option<DispatchRate>,
    pub subscription_dispatch_rate: Option<DispatchRate>,
    pub publish_rate: Option<PublishRate>,
    pub inactive_topic: Option<InactiveTopicPolicies>,
    pub max_message_size: u32,
    /// How new ledgers are replicated (Pulsar's `persistence`, topic over namespace); `None`:
    /// the broker's `[ledgers]` defaults.
    pub persistence: Option<Persistence>,
    /// Where new ledgers may go (the namespace's `persistence/bookieAffinity`); `None`: any
    /// storage node.
    pub bookie_affinity: Option<IsolationGroups>,
    /// Schema compatibility and validation (the namespace's, the topic's strategy over it).
    pub schema: SchemaPolicies,
    pub max_subscriptions_per_topic: u32,
    pub allow_auto_subscription_creation: bool,
    pub delayed_delivery_enabled: bool,
    /// Automatic compaction once the bytes not compacted pass this (Pulsar's
    /// `compactionThreshold`, topic over namespace; 0: off, the broker default).
    pub compaction_threshold: u64,
}

/// Pulsar's `PersistencePolicies` as a broker acts on it: ensemble, write and ack quorums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persistence {
    pub ensemble: u32,
    pub write_quorum: u32,
    pub ack_quorum: u32,
}

impl Persistence {
    /// The stored document's quorums, if they make a valid placement (E >= Qw >= Qa >= 1).
    pub fn from_document(value: &Value) -> Option<Persistence> {
        let field = |name: &str| value.get(name)?.as_u64().and_then(|n| u32::try_from(n).ok());
        let persistence = Persistence {
            ensemble: field("bookkeeperEnsemble")?,
            write_quorum: field("bookkeeperWriteQuorum")?,
            ack_quorum: field("bookkeeperAckQuorum")?,
        };
        let valid = persistence.ack_quorum >= 1
            && persistence.ack_quorum <= persistence.write_quorum
            && persistence.write_quorum <= persistence.ensemble;
        valid.then_some(persistence)
    }
}

/// Pulsar's stored `BookieAffinityGroupData`, as the groups placement keeps to.
fn bookie_affinity(value: &Value) -> Option<IsolationGroups> {
    let primary = value.get("bookkeeperAffinityGroupPrimary")?.as_str()?;
    let secondary = value.get("bookkeeperAffinityGroupSecondary").and_then(Value::as_str);
    IsolationGroups::parse(primary, secondary)
}

/// The value at `path` in a document's unmodelled fields.
fn field_at<'a>(other: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(other.get(*first)?, |value, name| value.get(name))
}

fn int_field(other: &Map<String, Value>, path: &[&str]) -> Option<i32> {
    field_at(other, path)?
        .as_i64()
        .map(|n| n.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32)
}

fn long_field(other: &Map<String, Value>, path: &[&str]) -> Option<i64> {
    field_at(other, path)?.as_i64()
}

fn bool_field(other: &Map<String, Value>, path: &[&str]) -> Option<bool> {
    field_at(other, path)?.as_bool()
}

/// A limit as Pulsar stores it (`-1`/`0`/negative: unlimited) as ours (0: unlimited).
fn limit(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

impl Effective {
    /// Layers `topic` over `namespace` over `defaults`. `cluster` picks the per-cluster rates.
    pub fn resolve(
        defaults: &PolicyDefaults,
        namespace: Option<&NamespacePolicies>,
        topic: Option<&TopicPolicies>,
        cluster: &str,
    ) -> Effective {
        let ns = namespace.cloned().unwrap_or_default();
        let tp = topic.cloned().unwrap_or_default();
        let backlog_quotas = if !tp.back_log_quota_map.is_empty() {
            tp.back_log_quota_map
        } else if !ns.backlog_quota_map.is_empty() {
            ns.backlog_quota_map
        } else {
            defaults.backlog_quotas.clone()
        };
        let limit_or = |t: Option<i32>, n: Option<i32>, d: u32| t.or(n).map_or(d, limit);
        Effective {
            retention: tp
                .retention_policies
                .or(ns.retention_policies)
                .unwrap_or(defaults.retention),
            message_ttl_seconds: limit_or(
                tp.message_ttl_in_seconds,
                ns.message_ttl_in_seconds,
                defaults.message_ttl_seconds,
            ),
            backlog_quotas,
            deduplication_enabled: tp
                .deduplication_enabled
                .or(ns.deduplication_enabled)
                .unwrap_or(defaults.deduplication_enabled),
            max_producers_per_topic: limit_or(
                tp.max_producer_per_topic,
                ns.max_producers_per_topic,
                defaults.max_producers_per_topic,
            ),
            max_consumers_per_topic: limit_or(
                tp.max_consumer_per_topic,
                ns.max_consumers_per_topic,
                defaults.max_consumers_per_topic,
            ),
            max_consumers_per_subscription: limit_or(
                tp.max_consumers_per_subscription,
                ns.max_consumers_per_subscription,
                defaults.max_consumers_per_subscription,
            ),
            max_unacked_messages_per_consumer: limit_or(
                tp.max_unacked_messages_on_consumer,
                ns.max_unacked_messages_per_consumer,
                defaults.max_unacked_messages_per_consumer,
            ),
            max_unacked_messages_per_subscription: limit_or(
                tp.max_unacked_messages_on_subscription,
                ns.max_unacked_messages_per_subscription,
                defaults.max_unacked_messages_per_subscription,
            ),
            dispatch_rate: tp
                .dispatch_rate
                .or_else(|| ns.topic_dispatch_rate.get(cluster).copied())
                .or(defaults.dispatch_rate),
            subscription_dispatch_rate: tp
                .subscription_dispatch_rate
                .or_else(|| ns.subscription_dispatch_rate.get(cluster).copied())
                .or(defaults.subscription_dispatch_rate),
            publish_rate: tp
                .publish_rate
                .or_else(|| ns.publish_max_message_rate.get(cluster).copied())
                .or(defaults.publish_rate),
            inactive_topic: tp
                .inactive_topic_policies
                .or(ns.inactive_topic_policies)
                .or(defaults.inactive_topic),
            persistence: tp
                .other
                .get("persistence")
                .and_then(Persistence::from_document)
                .or_else(|| ns.other.get("persistence").and_then(Persistence::from_document)),
            bookie_affinity: ns.other.get("bookie_affinity_group").and_then(bookie_affinity),
            schema: SchemaPolicies::from_documents(&ns.other, &tp.other),
            max_subscriptions_per_topic: limit_or(
                int_field(&tp.other, &["maxSubscriptionsPerTopic"]),
                int_field(&ns.other, &["max_subscriptions_per_topic"]),
                defaults.max_subscriptions_per_topic,
            ),
            allow_auto_subscription_creation: bool_field(
                &tp.other,
                &["autoSubscriptionCreationOverride", "allowAutoSubscriptionCreation"],
            )
            .or_else(|| {
                bool_field(
                    &ns.other,
                    &["autoSubscriptionCreationOverride", "allowAutoSubscriptionCreation"],
                )
            })
            .unwrap_or(defaults.allow_auto_subscription_creation),
            delayed_delivery_enabled: bool_field(&tp.other, &["delayedDeliveryPolicies", "active"])
                .or_else(|| bool_field(&ns.other, &["delayed_delivery_policies", "active"]))
                .unwrap_or(defaults.delayed_delivery_enabled),
            compaction_threshold: long_field(&tp.other, &["compactionThreshold"])
                .or_else(|| long_field(&ns.other, &["compaction_threshold"]))
                .map_or(0, |bytes| u64::try_from(bytes).unwrap_or(0)),
            max_message_size: tp.max_message_size.map_or(defaults.max_message_size, |size| {
                if size > 0 {
                    (size as u32).min(defaults.max_message_size)
                } else {
                    defaults.max_message_size
                }
            }),
        }
    }

    /// Retention time in milliseconds, `None` = unlimited.
    pub fn retention_time_ms(&self) -> Option<u64> {
        match self.retention.retention_time_in_minutes {
            t if t < 0 => None,
            t => Some(t as u64 * 60_000),
        }
    }

    /// Retention size in bytes, `None` = unlimited.
    pub fn retention_size_bytes(&self) -> Option<u64> {
        match self.retention.retention_size_in_mb {
            s if s < 0 => None,
            s => Some((s as u64).saturating_mul(1024 * 1024)),
        }
    }
}

/// A number, or a string holding one (Jackson's coercion, which Pulsar's admin API inherits).
fn number_or_string<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr + Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Lenient<T> {
        Number(T),
        Text(String),
    }
    match Lenient::<T>::deserialize(d)? {
        Lenient::Number(n) => Ok(n),
        Lenient::Text(text) => text
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("'{text}' is not a number"))),
    }
}

fn minus_one() -> i64 {
    -1
}

fn minus_one_i32() -> i32 {
    -1
}

fn one() -> i32 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_is_topic_over_namespace_and_only_when_valid() {
        let doc = |e: u64, w: u64, a: u64| {
            serde_json::json!({"bookkeeperEnsemble": e, "bookkeeperWriteQuorum": w,
                               "bookkeeperAckQuorum": a, "managedLedgerMaxMarkDeleteRate": 0.0})
        };
        let mut namespace = NamespacePolicies::default();
        namespace.other.insert("persistence".into(), doc(3, 3, 2));
        let mut topic = TopicPolicies::default();
        let defaults = PolicyDefaults::default();
        let three = Persistence { ensemble: 3, write_quorum: 3, ack_quorum: 2 };
        assert_eq!(
            Effective::resolve(&defaults, Some(&namespace), None, "c").persistence,
            Some(three)
        );
        topic.other.insert("persistence".into(), doc(2, 2, 2));
        let two = Persistence { ensemble: 2, write_quorum: 2, ack_quorum: 2 };
        assert_eq!(
            Effective::resolve(&defaults, Some(&namespace), Some(&topic), "c").persistence,
            Some(two)
        );
        topic.other.insert("persistence".into(), doc(1, 2, 1));
        assert_eq!(
            Effective::resolve(&defaults, Some(&namespace), Some(&topic), "c").persistence,
            Some(three),
            "an invalid topic document falls back to the namespace's"
        );
        assert_eq!(Effective::resolve(&defaults, None, None, "c").persistence, None);
    }

    #[test]
    fn bookie_affinity_is_the_namespaces() {
        let mut namespace = NamespacePolicies::default();
        let defaults = PolicyDefaults::default();
        assert_eq!(
            Effective::resolve(&defaults, Some(&namespace), None, "c").bookie_affinity,
            None
        );
        namespace.other.insert(
            "bookie_affinity_group".into(),
            serde_json::json!({"bookkeeperAffinityGroupPrimary": "g1,g2",
                               "bookkeeperAffinityGroupSecondary": "g3"}),
        );
        let groups = Effective::resolve(&defaults, Some(&namespace), None, "c")
            .bookie_affinity
            .expect("the namespace's groups");
        assert_eq!(groups.primary.len(), 2);
        assert!(groups.secondary.contains("g3"));
    }

    #[test]
    fn a_backlog_quota_limit_written_as_a_string_is_read_as_its_number() {
        let quota: BacklogQuota =
            serde_json::from_str(r#"{"limit": "10240", "policy": "producer_request_hold"}"#)
                .unwrap();
        assert_eq!((quota.limit_size, quota.limit_time), (10_240, -1));
        let quota: BacklogQuota =
            serde_json::from_str(r#"{"limitTime": "30", "policy": "producer_exception"}"#).unwrap();
        assert_eq!((quota.limit_size, quota.limit_time), (-1, 30));
        let bad = serde_json::from_str::<BacklogQuota>(r#"{"limit": "ten", "policy": "x"}"#);
        assert!(bad.unwrap_err().to_string().contains("'ten' is not a number"));
    }

    #[test]
    fn namespace_policies_keep_unknown_fields_and_read_pulsar_names() {
        let json = r#"{"retention_policies":{"retentionTimeInMinutes":60,"retentionSizeInMB":-1},
            "message_ttl_in_seconds":30,"deduplicationEnabled":true,
            "backlog_quota_map":{"destination_storage":{"limit":1048576,"policy":"producer_exception"}},
            "publishMaxMessageRate":{"standalone":{"publishThrottlingRateInMsg":10,"publishThrottlingRateInByte":-1}},
            "bundles":{"boundaries":["0x00000000","0xffffffff"],"numBundles":1}}"#;
        let ns: NamespacePolicies = serde_json::from_str(json).unwrap();
        assert_eq!(ns.retention_policies.unwrap().retention_time_in_minutes, 60);
        assert_eq!(ns.message_ttl_in_seconds, Some(30));
        assert_eq!(ns.deduplication_enabled, Some(true));
        let quota = ns.backlog_quota_map[&BacklogQuotaType::DestinationStorage];
        assert_eq!((quota.limit_size, quota.limit_time), (1_048_576, -1));
        assert_eq!(quota.policy, BacklogQuotaPolicy::ProducerException);
        assert!(ns.other.contains_key("bundles"));
        let back: Value = serde_json::to_value(&ns).unwrap();
        assert_eq!(back["bundles"]["numBundles"], 1);
        assert_eq!(back["backlog_quota_map"]["destination_storage"]["limitSize"], 1_048_576);
    }

    #[test]
    fn topic_over_namespace_over_broker() {
        let defaults = PolicyDefaults::default();
        let ns = NamespacePolicies {
            retention_policies: Some(RetentionPolicies {
                retention_time_in_minutes: 10,
                retention_size_in_mb: 100,
            }),
            message_ttl_in_seconds: Some(60),
            max_producers_per_topic: Some(3),
            ..Default::default()
        };
        let tp = TopicPolicies { message_ttl_in_seconds: Some(5), ..Default::default() };
        let e = Effective::resolve(&defaults, Some(&ns), Some(&tp), "standalone");
        assert_eq!(e.message_ttl_seconds, 5);
        assert_eq!(e.retention_time_ms(), Some(600_000));
        assert_eq!(e.retention_size_bytes(), Some(100 << 20));
        assert_eq!(e.max_producers_per_topic, 3);
        assert_eq!(e.max_unacked_messages_per_consumer, 50_000);
        let none = Effective::resolve(&defaults, None, None, "standalone");
        assert_eq!(none.retention, RetentionPolicies::NONE);
        assert_eq!(none.message_ttl_seconds, 0);
        let infinite =
            RetentionPolicies { retention_time_in_minutes: -1, retention_size_in_mb: -1 };
        let tp = TopicPolicies { retention_policies: Some(infinite), ..Default::default() };
        let e = Effective::resolve(&defaults, Some(&ns), Some(&tp), "standalone");
        assert_eq!((e.retention_time_ms(), e.retention_size_bytes()), (None, None));
    }

    #[test]
    fn schema_policies_come_from_the_namespace_with_the_topic_strategy_over_it() {
        use crate::schema::{CompatibilityStrategy, SchemaPolicies};
        let defaults = PolicyDefaults::default();
        let none = Effective::resolve(&defaults, None, None, "standalone");
        assert_eq!(none.schema, SchemaPolicies::default());
        let ns: NamespacePolicies = serde_json::from_str(
            r#"{"schema_compatibility_strategy":"BACKWARD","is_allow_auto_update_schema":false,
                "schema_validation_enforced":true}"#,
        )
        .unwrap();
        let e = Effective::resolve(&defaults, Some(&ns), None, "standalone");
        assert_eq!(e.schema.strategy, CompatibilityStrategy::Backward);
        assert!(!e.schema.allow_auto_update && e.schema.validation_enforced);
        let undefined: TopicPolicies =
            serde_json::from_str(r#"{"schemaCompatibilityStrategy":"UNDEFINED"}"#).unwrap();
        let e = Effective::resolve(&defaults, Some(&ns), Some(&undefined), "standalone");
        assert_eq!(e.schema.strategy, CompatibilityStrategy::Backward);
        let own: TopicPolicies =
            serde_json::from_str(r#"{"schemaCompatibilityStrategy":"FORWARD"}"#).unwrap();
        let e = Effective::resolve(&defaults, Some(&ns), Some(&own), "standalone");
        assert_eq!(e.schema.strategy, CompatibilityStrategy::Forward);
    }

    #[test]
    fn topic_policies_use_pulsar_field_names() {
        let tp: TopicPolicies = serde_json::from_str(
            r#"{"messageTTLInSeconds":7,"maxProducerPerTopic":2,"deduplicationEnabled":false}"#,
        )
        .unwrap();
        assert_eq!(tp.message_ttl_in_seconds, Some(7));
        assert_eq!(tp.max_producer_per_topic, Some(2));
        assert_eq!(tp.deduplication_enabled, Some(false));
    }
}
