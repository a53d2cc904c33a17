//! Namespace and topic policies: `GET|POST|PUT|DELETE /admin/v2/namespaces/{t}/{ns}/{policy}` and
//! `GET|POST|DELETE /admin/v2/{domain}/{t}/{ns}/{topic}/{policy}`, as Pulsar's `Namespaces` and
//! `PersistentTopics` resources.
//!
//! Every simple policy is one [`PolicySpec`]: the path segment, the field of the stored document
//! (`magnetar_model::policy::NamespacePolicies` at `keys::namespace_key`, or
//! `magnetar_model::policy::TopicPolicies` at `keys::topic_policies_key` of the partitioned
//! topic, so partitions share their topic's), how the body is read and what is checked. The
//! generic handlers here read the document as JSON, change one field, and store it back only
//! once it still decodes as the typed document (so the broker can always read it), by
//! compare-and-set; fields Magnetar does not model survive in the typed documents' `other`.
//!
//! A policy that is not set answers 204 No Content (Pulsar's answer for a null value) unless the
//! spec names a default (Pulsar's non-null defaults, e.g. `offloadThreshold` -1). A topic
//! policy read with `?applied=true` answers what the topic obeys: its own value, else its
//! namespace's, else the broker default ([`magnetar_model::policy::Effective::resolve`]).
//! After each change the broker hears [`crate::BrokerHooks::policies_updated`].

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Json;
use magnetar_metadata::ExpectedVersion;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    body_bytes, get_json, query_bool, query_param, require_namespace, update_document, PathSegments,
};
use crate::error::AdminError;
use crate::AdminState;
use magnetar_model::keys;
use magnetar_model::names::{NamespaceName, TopicName};
use magnetar_model::policy::{
    BacklogQuota, BacklogQuotaType, DispatchRate, Effective, InactiveTopicPolicies,
    NamespacePolicies, PublishRate, RetentionPolicies, TopicPolicies,
};

/// A policies document as JSON (the typed document's serialisation).
pub(crate) type Doc = Map<String, Value>;

/// Reads a policy's value from the request body (or, for some topic policies, the query).
type Parse = fn(&[u8], &Uri) -> Result<Value, AdminError>;
/// Checks a new value against the document it goes into.
type Check = fn(&Value, &Doc, Level, &AdminState) -> Result<(), AdminError>;

/// Which document a policy lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Namespace,
    Topic,
}

impl Level {
    fn retention_field(self) -> &'static str {
        match self {
            Level::Namespace => "retention_policies",
            Level::Topic => "retentionPolicies",
        }
    }

    fn backlog_field(self) -> &'static str {
        match self {
            Level::Namespace => "backlog_quota_map",
            Level::Topic => "backLogQuotaMap",
        }
    }
}

/// What `?applied=true` answers for a topic policy that is not set on the topic.
#[derive(Clone, Copy)]
enum Applied {
    /// From the layered [`Effective`] policies (`None`: 204).
    Effective(fn(&Effective) -> Option<Value>),
    /// The namespace document's field (per cluster or not), else 204.
    Namespace(&'static str, bool),
    /// Nothing beyond the topic's own value.
    None,
}

/// One simple policy endpoint.
#[derive(Clone, Copy)]
pub(crate) struct PolicySpec {
    /// The last path segment(s), e.g. `retention` or `persistence/bookieAffinity`.
    pub(crate) path: &'static str,
    /// The document's field.
    field: &'static str,
    /// Namespace rates are per-cluster maps (`{"standalone": {...}}`), as in Pulsar.
    per_cluster: bool,
    /// Set with `PUT` (else `POST`), as Pulsar declares it.
    put: bool,
    parse: Parse,
    /// Integers below this are refused with 412 and this reason.
    min: Option<(i64, &'static str)>,
    check: Option<Check>,
    /// The GET answer while unset (`None`: 204).
    unset: Option<fn() -> Value>,
    applied: Applied,
}

const BASE: PolicySpec = PolicySpec {
    path: "",
    field: "",
    per_cluster: false,
    put: false,
    parse: int_body,
    min: None,
    check: None,
    unset: None,
    applied: Applied::None,
};

fn bad(what: &str) -> AdminError {
    AdminError::BadRequest(format!("Invalid request body: {what}"))
}

fn parse_json(body: &[u8]) -> Result<Value, AdminError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("empty"));
    }
    serde_json::from_slice(body).map_err(|e| bad(&format!("malformed JSON ({e})")))
}

/// An integer as Jackson reads it (a JSON number, or a string holding one) within `range`.
fn integer(value: &Value, lo: i64, hi: i64) -> Result<i64, AdminError> {
    let n = match value {
        Value::Number(n) => n.as_i64().ok_or_else(|| bad("expected an integer"))?,
        Value::String(s) => s.trim().parse::<i64>().map_err(|_| bad("expected an integer"))?,
        _ => return Err(bad("expected an integer")),
    };
    if n < lo || n > hi {
        return Err(bad("integer out of range"));
    }
    Ok(n)
}

/// A Java `int` body.
fn int_body(body: &[u8], _: &Uri) -> Result<Value, AdminError> {
    Ok(Value::from(integer(&parse_json(body)?, i64::from(i32::MIN), i64::from(i32::MAX))?))
}

/// A Java `long` body.
fn long_body(body: &[u8], _: &Uri) -> Result<Value, AdminError> {
    Ok(Value::from(integer(&parse_json(body)?, i64::MIN, i64::MAX)?))
}

/// A JSON boolean body.
fn bool_body(body: &[u8], _: &Uri) -> Result<Value, AdminError> {
    match parse_json(body)? {
        Value::Bool(b) => Ok(Value::Bool(b)),
        Value::String(s) if s == "true" || s == "false" => Ok(Value::Bool(s == "true")),
        _ => Err(AdminError::BadRequest("Body must be true or false".to_string())),
    }
}

/// A JSON object body decoding as `T` (Pulsar's Jackson type), normalised by a round trip.
fn typed_body<T: DeserializeOwned + Serialize>(body: &[u8], _: &Uri) -> Result<Value, AdminError> {
    let value = parse_json(body)?;
    if !value.is_object() {
        return Err(bad("expected a JSON object"));
    }
    let typed: T = serde_json::from_value(value).map_err(|e| bad(&e.to_string()))?;
    serde_json::to_value(typed).map_err(|e| AdminError::Internal(e.to_string()))
}

/// Any JSON object body (policies Magnetar stores without modelling).
fn object_body(body: &[u8], _: &Uri) -> Result<Value, AdminError> {
    match parse_json(body)? {
        v @ Value::Object(_) => Ok(v),
        _ => Err(bad("expected a JSON object")),
    }
}

/// Topic `messageTTL`: Pulsar takes it from the `messageTTL` query parameter, not the body.
fn ttl_query(_: &[u8], uri: &Uri) -> Result<Value, AdminError> {
    let text = query_param(uri, "messageTTL")
        .ok_or_else(|| AdminError::BadRequest("Missing query parameter messageTTL".to_string()))?;
    let n = text
        .trim()
        .parse::<i32>()
        .map_err(|_| AdminError::BadRequest(format!("Invalid messageTTL: {text}")))?;
    Ok(Value::from(n))
}

/// Pulsar's `SchemaCompatibilityStrategy` names.
const SCHEMA_STRATEGIES: [&str; 9] = [
    "UNDEFINED",
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
];

/// A `SchemaCompatibilityStrategy`: a JSON string (or the bare name).
fn strategy_body(body: &[u8], _: &Uri) -> Result<Value, AdminError> {
    let text = std::str::from_utf8(body).map_err(|_| bad("not UTF-8"))?.trim();
    let name = match serde_json::from_str::<Value>(text) {
        Ok(Value::String(s)) => s,
        Ok(_) => return Err(bad("expected a schema compatibility strategy")),
        Err(_) => text.to_string(),
    };
    let upper = name.to_ascii_uppercase();
    if SCHEMA_STRATEGIES.contains(&upper.as_str()) {
        Ok(Value::String(upper))
    } else {
        Err(bad(&format!("unknown schema compatibility strategy {name:?}")))
    }
}

fn as_typed<T: DeserializeOwned>(value: &Value) -> Result<T, AdminError> {
    serde_json::from_value(value.clone()).map_err(|e| bad(&e.to_string()))
}

/// Pulsar's `validateRetentionPolicies` (400) and, against the backlog quota already set,
/// `checkQuotas` (412).
fn check_retention(
    value: &Value,
    doc: &Doc,
    level: Level,
    _: &AdminState,
) -> Result<(), AdminError> {
    let retention: RetentionPolicies = as_typed(value)?;
    validate_retention(&retention)?;
    let quota = doc
        .get(level.backlog_field())
        .and_then(|m| m.get("destination_storage"))
        .and_then(|q| serde_json::from_value::<BacklogQuota>(q.clone()).ok());
    if !backlog_fits_retention(quota.as_ref(), &retention) {
        return Err(AdminError::PreconditionFailed(match level {
            Level::Namespace => {
                "Retention Quota must exceed configured backlog quota for namespace.".to_string()
            }
            Level::Topic => "Retention Quota must exceed backlog quota".to_string(),
        }));
    }
    Ok(())
}

/// Pulsar's `validateRetentionPolicies`: 400 with Pulsar's reasons.
pub(crate) fn validate_retention(retention: &RetentionPolicies) -> Result<(), AdminError> {
    let (time, size) = (retention.retention_time_in_minutes, retention.retention_size_in_mb);
    if size < -1 {
        return Err(AdminError::BadRequest(
            "Invalid retention policy: size limit must be >= -1".to_string(),
        ));
    }
    if time < -1 {
        return Err(AdminError::BadRequest(
            "Invalid retention policy: time limit must be >= -1".to_string(),
        ));
    }
    if (time == 0) != (size == 0) {
        return Err(AdminError::BadRequest(
            "Invalid retention policy: Setting a single time or size limit to 0 is invalid when \
             one of the limits has a non-zero value. Use the value of -1 instead of 0 to ignore a \
             specific limit. To disable retention both limits must be set to 0."
                .to_string(),
        ));
    }
    Ok(())
}

/// Pulsar's `checkBacklogQuota`: a (size) backlog quota must stay below the retention limits.
/// No quota set means the broker default, which is unlimited (`-1`) in Magnetar.
pub(crate) fn backlog_fits_retention(
    quota: Option<&BacklogQuota>,
    retention: &RetentionPolicies,
) -> bool {
    let (time, size) = (retention.retention_time_in_minutes, retention.retention_size_in_mb);
    if time <= 0 && size <= 0 {
        return true;
    }
    let Some(quota) = quota else { return true };
    if size > 0 && quota.limit_size >= size.saturating_mul(1024 * 1024) {
        return false;
    }
    if time > 0 && i64::from(quota.limit_time) >= i64::from(time) * 60 {
        return false;
    }
    true
}

/// Pulsar's `validatePersistencePolicies` with its default limits (ensemble, write and ack
/// quorum at most 5): 400.
fn check_persistence(value: &Value, _: &Doc, _: Level, _: &AdminState) -> Result<(), AdminError> {
    const MAX: i64 = 5;
    let field = |name: &str| value.get(name).and_then(Value::as_i64).unwrap_or(0);
    let (ensemble, write, ack) =
        (field("bookkeeperEnsemble"), field("bookkeeperWriteQuorum"), field("bookkeeperAckQuorum"));
    let fail = |m: String| Err(AdminError::BadRequest(m));
    if !(1..=MAX).contains(&ensemble) {
        return fail(format!("Bookkeeper-Ensemble must be <= {MAX} and > 0."));
    }
    if !(1..=MAX).contains(&write) {
        return fail(format!("Bookkeeper-WriteQuorum must be <= {MAX} and > 0."));
    }
    if !(1..=MAX).contains(&ack) {
        return fail(format!("Bookkeeper-AckQuorum must be <= {MAX} and > 0."));
    }
    if !(ensemble >= write && write >= ack) {
        return fail(format!(
            "Bookkeeper Ensemble ({ensemble}) >= WriteQuorum ({write}) >= AckQuorum ({ack})"
        ));
    }
    if let Some(rate) = value.get("managedLedgerMaxMarkDeleteRate") {
        if !(rate.is_null() || rate.is_number()) {
            return fail("managedLedgerMaxMarkDeleteRate must be a number".to_string());
        }
    }
    Ok(())
}

/// Pulsar's `PersistencePolicies`: the ensemble numbers must be integers.
fn persistence_body(body: &[u8], uri: &Uri) -> Result<Value, AdminError> {
    let value = object_body(body, uri)?;
    for name in ["bookkeeperEnsemble", "bookkeeperWriteQuorum", "bookkeeperAckQuorum"] {
        match value.get(name) {
            None | Some(Value::Null) => {}
            Some(v) => {
                integer(v, i64::from(i32::MIN), i64::from(i32::MAX))?;
            }
        }
    }
    Ok(value)
}

/// Pulsar's `AutoTopicCreationOverride` check: 412 when the override is not valid.
fn check_auto_topic_creation(
    value: &Value,
    _: &Doc,
    _: Level,
    state: &AdminState,
) -> Result<(), AdminError> {
    let invalid = |why: &str| {
        AdminError::PreconditionFailed(format!(
            "Invalid configuration for autoTopicCreationOverride. the detail is {why}"
        ))
    };
    let allow = match value.get("allowAutoTopicCreation") {
        Some(Value::Bool(b)) => *b,
        None | Some(Value::Null) => false,
        Some(_) => return Err(bad("allowAutoTopicCreation must be a boolean")),
    };
    if !allow {
        return Ok(());
    }
    // Pulsar's `AutoTopicCreationOverrideImpl.validateOverride`, message for message.
    let topic_type = value.get("topicType").and_then(Value::as_str);
    let partitions = value.get("defaultNumPartitions").filter(|v| !v.is_null());
    let known =
        |t: &str| ["partitioned", "non-partitioned"].iter().any(|k| k.eq_ignore_ascii_case(t));
    match topic_type {
        Some(t) if !known(t) => Err(invalid(&format!("Unknown topic type [{t}]"))),
        None => Err(invalid("Unknown topic type [null]")),
        Some("partitioned") => {
            let Some(n) = partitions else {
                return Err(invalid(
                    "[defaultNumPartitions] cannot be null when the type is partitioned.",
                ));
            };
            let n = n.as_i64().ok_or_else(|| bad("defaultNumPartitions must be an integer"))?;
            if n <= 0 {
                return Err(invalid(
                    "[defaultNumPartitions] cannot be less than 1 for partition type.",
                ));
            }
            let max = i64::from(state.max_partitions_per_topic);
            if max > 0 && n > max {
                return Err(AdminError::NotAcceptable(format!(
                    "Number of partitions should be less than or equal to {max}"
                )));
            }
            Ok(())
        }
        Some("non-partitioned") if partitions.is_some() => Err(invalid(
            "[defaultNumPartitions] is not allowed to be set when the type is non-partition.",
        )),
        Some(_) => Ok(()),
    }
}

/// Pulsar's `BookieAffinityGroupData`: a primary group is required.
fn check_bookie_affinity(
    value: &Value,
    _: &Doc,
    _: Level,
    _: &AdminState,
) -> Result<(), AdminError> {
    for name in ["bookkeeperAffinityGroupPrimary", "bookkeeperAffinityGroupSecondary"] {
        if let Some(v) = value.get(name) {
            if !(v.is_null() || v.is_string()) {
                return Err(bad(&format!("{name} must be a string")));
            }
        }
    }
    if value.get("bookkeeperAffinityGroupPrimary").and_then(Value::as_str).is_none_or(str::is_empty)
    {
        return Err(AdminError::BadRequest(
            "Bookie affinity group primary is required".to_string(),
        ));
    }
    Ok(())
}

/// The topic `maxMessageSize`: 0 or more, at most the broker's.
fn check_max_message_size(
    value: &Value,
    _: &Doc,
    _: Level,
    state: &AdminState,
) -> Result<(), AdminError> {
    let size = value.as_i64().unwrap_or(0);
    let broker = i64::from(state.hooks.policy_defaults().max_message_size);
    if size > broker {
        return Err(AdminError::PreconditionFailed(
            "topic-level maxMessageSize must be less than or equal to broker-level maxMessageSize"
                .to_string(),
        ));
    }
    Ok(())
}

fn minus_one() -> Value {
    Value::from(-1)
}

fn undefined() -> Value {
    Value::String("UNDEFINED".to_string())
}

/// Pulsar's `isAllowAutoUpdateSchemaEnabled` default: producers may add schema versions.
fn allow_auto_update_schema_default() -> Value {
    Value::Bool(true)
}

/// `schema_validation_enforced` is false unless set.
fn schema_validation_enforced_default() -> Value {
    Value::Bool(false)
}

/// The namespace policies with a simple get / set / remove (`backlogQuota`, `permissions`,
/// `properties`, `bundles` and `unload` have their own handlers).
pub(crate) const NAMESPACE_POLICIES: &[PolicySpec] = &[
    PolicySpec {
        path: "retention",
        field: "retention_policies",
        parse: typed_body::<RetentionPolicies>,
        check: Some(check_retention),
        ..BASE
    },
    PolicySpec {
        path: "messageTTL",
        field: "message_ttl_in_seconds",
        min: Some((0, "Invalid value for message TTL")),
        ..BASE
    },
    PolicySpec { path: "deduplication", field: "deduplicationEnabled", parse: bool_body, ..BASE },
    PolicySpec {
        path: "maxUnackedMessagesPerConsumer",
        field: "max_unacked_messages_per_consumer",
        min: Some((0, "maxUnackedMessagesPerConsumer must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "maxUnackedMessagesPerSubscription",
        field: "max_unacked_messages_per_subscription",
        min: Some((0, "maxUnackedMessagesPerSubscription must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "maxProducersPerTopic",
        field: "max_producers_per_topic",
        min: Some((0, "maxProducersPerTopic must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "maxConsumersPerTopic",
        field: "max_consumers_per_topic",
        min: Some((0, "maxConsumersPerTopic must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "maxConsumersPerSubscription",
        field: "max_consumers_per_subscription",
        min: Some((0, "maxConsumersPerSubscription must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "dispatchRate",
        field: "topicDispatchRate",
        per_cluster: true,
        parse: typed_body::<DispatchRate>,
        ..BASE
    },
    PolicySpec {
        path: "subscriptionDispatchRate",
        field: "subscriptionDispatchRate",
        per_cluster: true,
        parse: typed_body::<DispatchRate>,
        ..BASE
    },
    PolicySpec {
        path: "publishRate",
        field: "publishMaxMessageRate",
        per_cluster: true,
        parse: typed_body::<PublishRate>,
        ..BASE
    },
    PolicySpec {
        path: "inactiveTopicPolicies",
        field: "inactive_topic_policies",
        parse: typed_body::<InactiveTopicPolicies>,
        ..BASE
    },
    PolicySpec {
        path: "autoTopicCreation",
        field: "autoTopicCreationOverride",
        parse: object_body,
        check: Some(check_auto_topic_creation),
        ..BASE
    },
    PolicySpec {
        path: "autoSubscriptionCreation",
        field: "autoSubscriptionCreationOverride",
        parse: typed_body::<AutoSubscriptionCreationOverride>,
        ..BASE
    },
    PolicySpec {
        path: "maxSubscriptionsPerTopic",
        field: "max_subscriptions_per_topic",
        min: Some((0, "maxSubscriptionsPerTopic must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "delayedDelivery",
        field: "delayed_delivery_policies",
        parse: delayed_delivery_body,
        ..BASE
    },
    PolicySpec {
        path: "subscriptionExpirationTime",
        field: "subscription_expiration_time_minutes",
        min: Some((0, "Invalid value for subscription expiration time")),
        ..BASE
    },
    PolicySpec {
        path: "schemaCompatibilityStrategy",
        field: "schema_compatibility_strategy",
        put: true,
        parse: strategy_body,
        unset: Some(undefined),
        ..BASE
    },
    PolicySpec {
        path: "isAllowAutoUpdateSchema",
        field: "is_allow_auto_update_schema",
        parse: bool_body,
        unset: Some(allow_auto_update_schema_default),
        ..BASE
    },
    PolicySpec {
        path: "schemaValidationEnforced",
        field: "schema_validation_enforced",
        parse: bool_body,
        unset: Some(schema_validation_enforced_default),
        ..BASE
    },
    PolicySpec {
        path: "maxTopicsPerNamespace",
        field: "max_topics_per_namespace",
        min: Some((0, "maxTopicsPerNamespace must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "persistence",
        field: "persistence",
        parse: persistence_body,
        check: Some(check_persistence),
        ..BASE
    },
    PolicySpec {
        path: "compactionThreshold",
        field: "compaction_threshold",
        put: true,
        parse: long_body,
        min: Some((0, "compactionThreshold must be 0 or more")),
        ..BASE
    },
    PolicySpec {
        path: "offloadThreshold",
        field: "offload_threshold",
        put: true,
        parse: long_body,
        unset: Some(minus_one),
        ..BASE
    },
    PolicySpec {
        path: "offloadThresholdInSeconds",
        field: "offload_threshold_in_seconds",
        put: true,
        parse: long_body,
        unset: Some(minus_one),
        ..BASE
    },
    PolicySpec {
        path: "offloadDeletionLagMs",
        field: "offload_deletion_lag_ms",
        put: true,
        parse: long_body,
        ..BASE
    },
    PolicySpec {
        path: "persistence/bookieAffinity",
        field: "bookie_affinity_group",
        parse: object_body,
        check: Some(check_bookie_affinity),
        ..BASE
    },
];

/// Pulsar's `AutoSubscriptionCreationOverride`.
#[derive(serde::Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct AutoSubscriptionCreationOverride {
    allow_auto_subscription_creation: bool,
}

/// Pulsar's `SubscribeRate`.
#[derive(serde::Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct SubscribeRate {
    #[serde(default = "minus_one_i32")]
    subscribe_throttling_rate_per_consumer: i32,
    #[serde(default = "thirty")]
    rate_period_in_second: i32,
}

fn minus_one_i32() -> i32 {
    -1
}

fn thirty() -> i32 {
    30
}

fn json<T: Serialize>(value: T) -> Option<Value> {
    serde_json::to_value(value).ok()
}

/// The topic policies with a simple get / set / remove (`backlogQuota` has its own handlers).
pub(crate) const TOPIC_POLICIES: &[PolicySpec] = &[
    PolicySpec {
        path: "schemaCompatibilityStrategy",
        field: "schemaCompatibilityStrategy",
        put: true,
        parse: strategy_body,
        applied: Applied::Namespace("schema_compatibility_strategy", false),
        ..BASE
    },
    PolicySpec {
        path: "retention",
        field: "retentionPolicies",
        parse: typed_body::<RetentionPolicies>,
        check: Some(check_retention),
        applied: Applied::Effective(|e| json(e.retention)),
        ..BASE
    },
    PolicySpec {
        path: "messageTTL",
        field: "messageTTLInSeconds",
        parse: ttl_query,
        min: Some((0, "Invalid value for message TTL")),
        applied: Applied::Effective(|e| json(e.message_ttl_seconds)),
        ..BASE
    },
    PolicySpec {
        path: "deduplicationEnabled",
        field: "deduplicationEnabled",
        parse: bool_body,
        applied: Applied::Effective(|e| json(e.deduplication_enabled)),
        ..BASE
    },
    PolicySpec {
        path: "maxUnackedMessagesOnConsumer",
        field: "maxUnackedMessagesOnConsumer",
        min: Some((0, "maxUnackedNum must be 0 or more")),
        applied: Applied::Effective(|e| json(e.max_unacked_messages_per_consumer)),
        ..BASE
    },
    PolicySpec {
        path: "maxUnackedMessagesOnSubscription",
        field: "maxUnackedMessagesOnSubscription",
        min: Some((0, "maxUnackedNum must be 0 or more")),
        applied: Applied::Effective(|e| json(e.max_unacked_messages_per_subscription)),
        ..BASE
    },
    PolicySpec {
        path: "maxProducers",
        field: "maxProducerPerTopic",
        min: Some((0, "maxProducers must be 0 or more")),
        applied: Applied::Effective(|e| json(e.max_producers_per_topic)),
        ..BASE
    },
    PolicySpec {
        path: "maxConsumers",
        field: "maxConsumerPerTopic",
        min: Some((0, "maxConsumers must be 0 or more")),
        applied: Applied::Effective(|e| json(e.max_consumers_per_topic)),
        ..BASE
    },
    PolicySpec {
        path: "maxConsumersPerSubscription",
        field: "maxConsumersPerSubscription",
        min: Some((0, "Invalid value for maxConsumersPerSubscription")),
        applied: Applied::Effective(|e| json(e.max_consumers_per_subscription)),
        ..BASE
    },
    PolicySpec {
        path: "dispatchRate",
        field: "dispatchRate",
        parse: typed_body::<DispatchRate>,
        applied: Applied::Effective(|e| e.dispatch_rate.and_then(json)),
        ..BASE
    },
    PolicySpec {
        path: "subscriptionDispatchRate",
        field: "subscriptionDispatchRate",
        parse: typed_body::<DispatchRate>,
        applied: Applied::Effective(|e| e.subscription_dispatch_rate.and_then(json)),
        ..BASE
    },
    PolicySpec {
        path: "publishRate",
        field: "publishRate",
        parse: typed_body::<PublishRate>,
        applied: Applied::Effective(|e| e.publish_rate.and_then(json)),
        ..BASE
    },
    PolicySpec {
        path: "inactiveTopicPolicies",
        field: "inactiveTopicPolicies",
        parse: typed_body::<InactiveTopicPolicies>,
        applied: Applied::Effective(|e| e.inactive_topic.and_then(json)),
        ..BASE
    },
    PolicySpec {
        path: "maxMessageSize",
        field: "maxMessageSize",
        min: Some((0, "maxMessageSize must be 0 or more")),
        check: Some(check_max_message_size),
        applied: Applied::Effective(|e| json(e.max_message_size)),
        ..BASE
    },
    PolicySpec {
        path: "subscribeRate",
        field: "subscribeRate",
        parse: typed_body::<SubscribeRate>,
        applied: Applied::Namespace("clusterSubscribeRate", true),
        ..BASE
    },
    PolicySpec {
        path: "persistence",
        field: "persistence",
        parse: persistence_body,
        check: Some(check_persistence),
        applied: Applied::Namespace("persistence", false),
        ..BASE
    },
    PolicySpec {
        path: "compactionThreshold",
        field: "compactionThreshold",
        parse: long_body,
        min: Some((0, "compactionThreshold must be 0 or more")),
        applied: Applied::Namespace("compaction_threshold", false),
        ..BASE
    },
    PolicySpec {
        path: "maxSubscriptionsPerTopic",
        field: "maxSubscriptionsPerTopic",
        min: Some((0, "maxSubscriptionsPerTopic must be 0 or more")),
        applied: Applied::Effective(|e| json(e.max_subscriptions_per_topic)),
        ..BASE
    },
    PolicySpec {
        path: "autoSubscriptionCreation",
        field: "autoSubscriptionCreationOverride",
        parse: typed_body::<AutoSubscriptionCreationOverride>,
        applied: Applied::Effective(|e| {
            json(AutoSubscriptionCreationOverride {
                allow_auto_subscription_creation: e.allow_auto_subscription_creation,
            })
        }),
        ..BASE
    },
    PolicySpec {
        path: "delayedDelivery",
        field: "delayedDeliveryPolicies",
        parse: delayed_delivery_body,
        applied: Applied::Namespace("delayed_delivery_policies", false),
        ..BASE
    },
    // Stored and served; Magnetar has no replicator, offloader or dedup snapshot interval to
    // apply them to yet (geo-replication and tiered storage are issues of their own).
    PolicySpec {
        path: "deduplicationSnapshotInterval",
        field: "deduplicationSnapshotIntervalSeconds",
        min: Some((0, "deduplicationSnapshotInterval must be 0 or more")),
        applied: Applied::Namespace("deduplicationSnapshotIntervalSeconds", false),
        ..BASE
    },
    PolicySpec {
        path: "replicatorDispatchRate",
        field: "replicatorDispatchRate",
        parse: typed_body::<DispatchRate>,
        applied: Applied::Namespace("replicatorDispatchRate", true),
        ..BASE
    },
    PolicySpec {
        path: "offloadPolicies",
        field: "offloadPolicies",
        parse: object_body,
        applied: Applied::Namespace("offload_policies", false),
        ..BASE
    },
    PolicySpec {
        path: "replication",
        field: "replicationClusters",
        parse: cluster_list_body,
        applied: Applied::Namespace("replication_clusters", false),
        ..BASE
    },
];

/// Pulsar's `DelayedDeliveryPolicies`: `{"active": bool, "tickTime": ms,
/// "maxDeliveryDelayInMillis": ms}` (fields left out keep Pulsar's defaults).
fn delayed_delivery_body(body: &[u8], uri: &Uri) -> Result<Value, AdminError> {
    let mut value = object_body(body, uri)?;
    match value.get("active") {
        Some(Value::Bool(_)) => {}
        None | Some(Value::Null) => value["active"] = Value::Bool(true),
        Some(_) => return Err(bad("active must be true or false")),
    }
    for (name, default) in [("tickTime", 1_000), ("maxDeliveryDelayInMillis", 0)] {
        match value.get(name) {
            None | Some(Value::Null) => value[name] = Value::from(default),
            Some(v) => {
                let n = integer(v, 0, i64::MAX)?;
                value[name] = Value::from(n);
            }
        }
    }
    Ok(value)
}

/// A topic's replication clusters: a JSON array of cluster names.
fn cluster_list_body(body: &[u8], _: &Uri) -> Result<Value, AdminError> {
    let clusters: Vec<String> = serde_json::from_value(parse_json(body)?)
        .map_err(|_| bad("expected a JSON array of cluster names"))?;
    if clusters.is_empty() || clusters.iter().any(|c| c.trim().is_empty()) {
        return Err(AdminError::PreconditionFailed(
            "ClusterIds should not be null or empty".to_string(),
        ));
    }
    Ok(Value::from(clusters))
}

/// The document a request addresses.
pub(crate) enum Target {
    Namespace(NamespaceName),
    /// The topic as addressed, and the partitioned topic whose document it uses.
    Topic(TopicName),
}

impl Target {
    pub(crate) fn from_uri(uri: &Uri, level: Level) -> Result<Target, AdminError> {
        let segments = PathSegments::new(uri);
        Ok(match level {
            Level::Namespace => Target::Namespace(segments.namespace(1)?),
            Level::Topic => Target::Topic(segments.topic()?),
        })
    }

    fn level(&self) -> Level {
        match self {
            Target::Namespace(_) => Level::Namespace,
            Target::Topic(_) => Level::Topic,
        }
    }

    fn namespace(&self) -> &NamespaceName {
        match self {
            Target::Namespace(ns) => ns,
            Target::Topic(topic) => topic.namespace(),
        }
    }

    fn key(&self) -> String {
        match self {
            Target::Namespace(ns) => keys::namespace_key(ns),
            // Policies of a partitioned topic apply to all its partitions: keyed by the base name.
            Target::Topic(topic) => keys::topic_policies_key(&topic.partitioned_topic()),
        }
    }

    /// The document and the version to expect when writing it back. 404 "Namespace does not
    /// exist" for a missing namespace; a topic without policies has an empty document.
    pub(crate) async fn load(
        &self,
        state: &AdminState,
    ) -> Result<(Doc, ExpectedVersion), AdminError> {
        let key = self.key();
        match self {
            Target::Namespace(_) => match get_json::<NamespacePolicies>(state, &key).await? {
                Some((doc, version)) => Ok((to_doc(&doc)?, ExpectedVersion::Exactly(version))),
                None => Err(AdminError::NotFound("Namespace does not exist".to_string())),
            },
            Target::Topic(topic) => {
                require_namespace(state, topic.namespace()).await?;
                match get_json::<TopicPolicies>(state, &key).await? {
                    Some((doc, version)) => Ok((to_doc(&doc)?, ExpectedVersion::Exactly(version))),
                    None => Ok((Map::new(), ExpectedVersion::Absent)),
                }
            }
        }
    }

    /// `doc` as the stored bytes, once it decodes as the typed document (400 otherwise).
    fn encode(&self, doc: Doc) -> Result<Bytes, AdminError> {
        let value = Value::Object(doc);
        let invalid =
            |e: serde_json::Error| AdminError::BadRequest(format!("Invalid policies: {e}"));
        let bytes = match self {
            Target::Namespace(_) => serde_json::to_vec(
                &serde_json::from_value::<NamespacePolicies>(value).map_err(invalid)?,
            ),
            Target::Topic(_) => serde_json::to_vec(
                &serde_json::from_value::<TopicPolicies>(value).map_err(invalid)?,
            ),
        };
        bytes.map(Bytes::from).map_err(|e| AdminError::Internal(e.to_string()))
    }

    /// Applies `change` to the document by compare-and-set (retried on a concurrent change),
    /// then tells the broker.
    pub(crate) async fn update<F>(&self, state: &AdminState, change: F) -> Result<(), AdminError>
    where
        F: Fn(&mut Doc) -> Result<(), AdminError>,
    {
        let gone = match self.level() {
            Level::Namespace => "Namespace does not exist",
            Level::Topic => "Topic does not exist",
        };
        update_document(state, &self.key(), gone, || async {
            let (mut doc, expected) = self.load(state).await?;
            change(&mut doc)?;
            Ok((self.encode(doc)?, expected))
        })
        .await?;
        let topic = match self {
            Target::Topic(topic) => Some(topic),
            Target::Namespace(_) => None,
        };
        state.hooks.policies_updated(self.namespace(), topic).await?;
        Ok(())
    }
}

pub(crate) fn to_doc<T: Serialize>(typed: &T) -> Result<Doc, AdminError> {
    match serde_json::to_value(typed) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Ok(Map::new()),
        Err(e) => Err(AdminError::Internal(e.to_string())),
    }
}

/// A field of `doc`, under `cluster` for a per-cluster map; `None` when unset or null.
fn read_field<'a>(doc: &'a Doc, field: &str, cluster: Option<&str>) -> Option<&'a Value> {
    let value = doc.get(field)?;
    let value = match cluster {
        Some(c) => value.get(c)?,
        None => value,
    };
    (!value.is_null()).then_some(value)
}

fn write_field(doc: &mut Doc, field: &str, cluster: Option<&str>, value: Option<Value>) {
    match cluster {
        None => match value {
            Some(v) => {
                doc.insert(field.to_string(), v);
            }
            None => {
                doc.remove(field);
            }
        },
        Some(c) => {
            let entry = doc.entry(field.to_string()).or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            if let Value::Object(map) = entry {
                match value {
                    Some(v) => map.insert(c.to_string(), v),
                    None => map.remove(c),
                };
                if map.is_empty() {
                    doc.remove(field);
                }
            }
        }
    }
}

fn answer(value: Option<Value>) -> Response {
    match value {
        Some(v) => Json(v).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

impl PolicySpec {
    fn cluster<'a>(&self, state: &'a AdminState, level: Level) -> Option<&'a str> {
        (self.per_cluster && level == Level::Namespace).then_some(state.cluster.as_str())
    }

    async fn get(
        &self,
        state: &AdminState,
        uri: &Uri,
        level: Level,
    ) -> Result<Response, AdminError> {
        let target = Target::from_uri(uri, level)?;
        let (doc, _) = target.load(state).await?;
        let own = read_field(&doc, self.field, self.cluster(state, level)).cloned();
        if own.is_some() || level == Level::Namespace || !query_bool(uri, "applied") {
            return Ok(answer(own.or_else(|| self.unset.map(|f| f()))));
        }
        let Target::Topic(topic) = &target else { return Ok(answer(None)) };
        let namespace = Target::Namespace(topic.namespace().clone()).load(state).await?.0;
        Ok(answer(match self.applied {
            Applied::Effective(pick) => {
                let ns: NamespacePolicies = serde_json::from_value(Value::Object(namespace))
                    .map_err(|e| AdminError::Internal(e.to_string()))?;
                let tp: TopicPolicies = serde_json::from_value(Value::Object(doc))
                    .map_err(|e| AdminError::Internal(e.to_string()))?;
                let defaults = state.hooks.policy_defaults();
                pick(&Effective::resolve(&defaults, Some(&ns), Some(&tp), &state.cluster))
            }
            Applied::Namespace(field, per_cluster) => {
                read_field(&namespace, field, per_cluster.then_some(state.cluster.as_str()))
                    .cloned()
            }
            Applied::None => None,
        }))
    }

    async fn set(
        &self,
        state: &AdminState,
        uri: &Uri,
        body: &[u8],
        level: Level,
    ) -> Result<StatusCode, AdminError> {
        let target = Target::from_uri(uri, level)?;
        let value = (self.parse)(body, uri)?;
        if let (Some((min, reason)), Some(n)) = (self.min, value.as_i64()) {
            if n < min {
                return Err(AdminError::PreconditionFailed(reason.to_string()));
            }
        }
        let cluster = self.cluster(state, level);
        target
            .update(state, |doc| {
                if let Some(check) = self.check {
                    check(&value, doc, level, state)?;
                }
                write_field(doc, self.field, cluster, Some(value.clone()));
                Ok(())
            })
            .await?;
        tracing::info!(policy = self.path, namespace = %target.namespace(), ?level, %value, "policy set");
        Ok(StatusCode::NO_CONTENT)
    }

    async fn remove(
        &self,
        state: &AdminState,
        uri: &Uri,
        level: Level,
    ) -> Result<StatusCode, AdminError> {
        let target = Target::from_uri(uri, level)?;
        let cluster = self.cluster(state, level);
        target
            .update(state, |doc| {
                write_field(doc, self.field, cluster, None);
                Ok(())
            })
            .await?;
        tracing::info!(policy = self.path, namespace = %target.namespace(), ?level, "policy removed");
        Ok(StatusCode::NO_CONTENT)
    }

    /// The route for this policy: GET, POST or PUT, DELETE.
    pub(crate) fn route(&'static self, level: Level) -> MethodRouter<AdminState> {
        let getter = get(move |State(state): State<AdminState>, uri: Uri| async move {
            self.get(&state, &uri, level).await
        });
        let setter = move |State(state): State<AdminState>,
                           uri: Uri,
                           body: Result<Bytes, BytesRejection>| async move {
            let body = body_bytes(body)?;
            self.set(&state, &uri, &body, level).await
        };
        let router = if self.put { getter.put(setter) } else { getter.post(setter) };
        router.delete(move |State(state): State<AdminState>, uri: Uri| async move {
            self.remove(&state, &uri, level).await
        })
    }
}

/// The `backlogQuotaType` query parameter (absent: `destination_storage`); 400 otherwise.
fn quota_type(uri: &Uri) -> Result<BacklogQuotaType, AdminError> {
    match query_param(uri, "backlogQuotaType") {
        None => Ok(BacklogQuotaType::DestinationStorage),
        Some(t) if t.is_empty() => Ok(BacklogQuotaType::DestinationStorage),
        Some(t) => BacklogQuotaType::parse(&t)
            .ok_or_else(|| AdminError::BadRequest(format!("Invalid backlogQuotaType: {t}"))),
    }
}

fn quota_key(kind: BacklogQuotaType) -> &'static str {
    match kind {
        BacklogQuotaType::DestinationStorage => "destination_storage",
        BacklogQuotaType::MessageAge => "message_age",
    }
}

/// A BacklogQuota body. Java's `BacklogQuotaImpl` serialises both `limitSize` and its
/// deprecated twin `limit` (same value): `limitSize` wins.
fn quota_body(body: &[u8]) -> Result<Value, AdminError> {
    let mut value = parse_json(body)?;
    let Value::Object(map) = &mut value else {
        return Err(bad("expected a JSON object"));
    };
    if map.contains_key("limitSize") {
        map.remove("limit");
    }
    let typed: BacklogQuota = as_typed(&value)?;
    serde_json::to_value(typed).map_err(|e| AdminError::Internal(e.to_string()))
}

/// `POST …/backlogQuota[?backlogQuotaType=destination_storage|message_age]` with a
/// BacklogQuota body: 204; 400 bad body or type; 404; 412 when a size quota does not stay
/// below the retention limits (Pulsar's message).
async fn set_backlog_quota(
    state: &AdminState,
    uri: &Uri,
    body: &[u8],
    level: Level,
) -> Result<StatusCode, AdminError> {
    let target = Target::from_uri(uri, level)?;
    let kind = quota_type(uri)?;
    let quota: BacklogQuota = as_typed(&quota_body(body)?)?;
    if kind == BacklogQuotaType::MessageAge && quota.limit_time <= 0 && quota.limit_time != -1 {
        return Err(AdminError::PreconditionFailed(
            "backlog quota limitTime must be positive or -1".to_string(),
        ));
    }
    let value = serde_json::to_value(quota).map_err(|e| AdminError::Internal(e.to_string()))?;
    target
        .update(state, |doc| {
            if kind == BacklogQuotaType::DestinationStorage {
                let retention = doc
                    .get(level.retention_field())
                    .and_then(|r| serde_json::from_value::<RetentionPolicies>(r.clone()).ok());
                if let Some(retention) = retention {
                    if !backlog_fits_retention(Some(&quota), &retention) {
                        return Err(AdminError::PreconditionFailed(match level {
                            Level::Namespace => "Backlog Quota exceeds configured retention quota \
                                                 for namespace. Please increase retention quota \
                                                 and retry"
                                .to_string(),
                            Level::Topic => "Backlog Quota exceeds configured retention quota for \
                                             topic. Please increase retention quota and retry"
                                .to_string(),
                        }));
                    }
                }
            }
            let map = doc
                .entry(level.backlog_field().to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !map.is_object() {
                *map = Value::Object(Map::new());
            }
            if let Value::Object(map) = map {
                map.insert(quota_key(kind).to_string(), value.clone());
            }
            Ok(())
        })
        .await?;
    tracing::info!(namespace = %target.namespace(), ?level, ?kind, %value, "backlog quota set");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/backlogQuota[?backlogQuotaType=…]`: 204.
async fn remove_backlog_quota(
    state: &AdminState,
    uri: &Uri,
    level: Level,
) -> Result<StatusCode, AdminError> {
    let target = Target::from_uri(uri, level)?;
    let kind = quota_type(uri)?;
    target
        .update(state, |doc| {
            let field = level.backlog_field();
            if let Some(Value::Object(map)) = doc.get_mut(field) {
                map.remove(quota_key(kind));
                if map.is_empty() {
                    doc.remove(field);
                }
            }
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET …/backlogQuotaMap[?applied=true]`: the quotas by type (`{}` when none; applied: the
/// topic's, else the namespace's, else the broker's).
async fn get_backlog_quota_map(
    state: &AdminState,
    uri: &Uri,
    level: Level,
) -> Result<Response, AdminError> {
    let target = Target::from_uri(uri, level)?;
    let (doc, _) = target.load(state).await?;
    let own =
        doc.get(level.backlog_field()).filter(|m| m.as_object().is_some_and(|m| !m.is_empty()));
    if let Some(own) = own {
        return Ok(Json(own.clone()).into_response());
    }
    if let (Target::Topic(topic), true) = (&target, query_bool(uri, "applied")) {
        let (namespace, _) = Target::Namespace(topic.namespace().clone()).load(state).await?;
        if let Some(ns) = namespace.get("backlog_quota_map") {
            return Ok(Json(ns.clone()).into_response());
        }
        let defaults = state.hooks.policy_defaults();
        let map = serde_json::to_value(&defaults.backlog_quotas)
            .map_err(|e| AdminError::Internal(e.to_string()))?;
        return Ok(Json(map).into_response());
    }
    Ok(Json(Value::Object(Map::new())).into_response())
}

/// Routes `backlogQuota` (set, remove) and `backlogQuotaMap` (get) under `base`.
pub(crate) fn backlog_quota_routes(
    router: axum::Router<AdminState>,
    base: &str,
    level: Level,
) -> axum::Router<AdminState> {
    router
        .route(
            &format!("{base}/backlogQuota"),
            post(
                move |State(state): State<AdminState>,
                      uri: Uri,
                      body: Result<Bytes, BytesRejection>| async move {
                    let body = body_bytes(body)?;
                    set_backlog_quota(&state, &uri, &body, level).await
                },
            )
            .delete(move |State(state): State<AdminState>, uri: Uri| async move {
                remove_backlog_quota(&state, &uri, level).await
            }),
        )
        .route(
            &format!("{base}/backlogQuotaMap"),
            get(move |State(state): State<AdminState>, uri: Uri| async move {
                get_backlog_quota_map(&state, &uri, level).await
            }),
        )
}

/// Routes every simple policy of `level` under `base` (`…/{namespace}` or `…/{topic}`).
pub(crate) fn policy_routes(
    mut router: axum::Router<AdminState>,
    base: &str,
    level: Level,
) -> axum::Router<AdminState> {
    let specs = match level {
        Level::Namespace => NAMESPACE_POLICIES,
        Level::Topic => TOPIC_POLICIES,
    };
    for spec in specs {
        router = router.route(&format!("{base}/{}", spec.path), spec.route(level));
    }
    backlog_quota_routes(router, base, level)
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_model::policy::BacklogQuotaPolicy;

    fn retention(time: i32, size: i64) -> RetentionPolicies {
        RetentionPolicies { retention_time_in_minutes: time, retention_size_in_mb: size }
    }

    #[test]
    fn retention_rules_are_pulsars() {
        for ok in [(0, 0), (-1, -1), (10, -1), (-1, 10), (60, 1024)] {
            assert!(validate_retention(&retention(ok.0, ok.1)).is_ok(), "{ok:?}");
        }
        for bad in [(0, 10), (10, 0), (-2, 5), (5, -2)] {
            assert!(
                matches!(
                    validate_retention(&retention(bad.0, bad.1)),
                    Err(AdminError::BadRequest(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn backlog_quota_must_stay_below_retention() {
        let quota = |size: i64, time: i32| BacklogQuota {
            limit_size: size,
            limit_time: time,
            policy: BacklogQuotaPolicy::ProducerRequestHold,
        };
        // 10 MB retention: a 5 MB quota fits, a 10 MB one does not.
        assert!(backlog_fits_retention(Some(&quota(5 << 20, -1)), &retention(-1, 10)));
        assert!(!backlog_fits_retention(Some(&quota(10 << 20, -1)), &retention(-1, 10)));
        // 1 minute retention: a 30 s quota fits, a 60 s one does not.
        assert!(backlog_fits_retention(Some(&quota(-1, 30)), &retention(1, -1)));
        assert!(!backlog_fits_retention(Some(&quota(-1, 60)), &retention(1, -1)));
        // Unlimited or no retention: anything goes.
        assert!(backlog_fits_retention(Some(&quota(i64::MAX, i32::MAX)), &retention(-1, -1)));
        assert!(backlog_fits_retention(Some(&quota(i64::MAX, i32::MAX)), &retention(0, 0)));
        assert!(backlog_fits_retention(None, &retention(10, 10)));
    }

    #[test]
    fn bodies() {
        let uri: Uri = "/x?messageTTL=12".parse().unwrap();
        assert_eq!(int_body(b"5", &uri).unwrap(), Value::from(5));
        assert_eq!(int_body(b"\"7\"", &uri).unwrap(), Value::from(7));
        for bad in [&b""[..], b"x", b"1.5", b"2147483648", b"[1]", b"{}", b"true"] {
            assert!(int_body(bad, &uri).is_err(), "{bad:?}");
        }
        assert_eq!(long_body(b"2147483648", &uri).unwrap(), Value::from(2_147_483_648_i64));
        assert_eq!(bool_body(b"true", &uri).unwrap(), Value::Bool(true));
        assert!(bool_body(b"1", &uri).is_err());
        assert_eq!(ttl_query(b"", &uri).unwrap(), Value::from(12));
        assert!(ttl_query(b"", &"/x".parse().unwrap()).is_err());
        assert_eq!(strategy_body(b"\"full\"", &uri).unwrap(), Value::from("FULL"));
        assert_eq!(strategy_body(b"BACKWARD", &uri).unwrap(), Value::from("BACKWARD"));
        assert!(strategy_body(b"\"SIDEWAYS\"", &uri).is_err());
        let r = typed_body::<RetentionPolicies>(
            br#"{"retentionTimeInMinutes":5,"retentionSizeInMB":-1}"#,
            &uri,
        )
        .unwrap();
        assert_eq!(r["retentionSizeInMB"], -1);
        assert!(
            typed_body::<RetentionPolicies>(br#"{"retentionTimeInMinutes":"x"}"#, &uri).is_err()
        );
        assert!(quota_body(br#"{"limitSize":1,"policy":"nope"}"#).is_err());
        let java = br#"{"limit":5,"limitSize":5,"limitTime":-1,"policy":"producer_exception"}"#;
        assert_eq!(quota_body(java).unwrap()["limitSize"], 5);
        assert_eq!(
            quota_body(br#"{"limit":7,"policy":"producer_exception"}"#).unwrap()["limitSize"],
            7
        );
    }

    #[test]
    fn per_cluster_fields() {
        let mut doc = Map::new();
        write_field(&mut doc, "topicDispatchRate", Some("c1"), Some(Value::from(1)));
        assert_eq!(read_field(&doc, "topicDispatchRate", Some("c1")), Some(&Value::from(1)));
        assert_eq!(read_field(&doc, "topicDispatchRate", Some("c2")), None);
        write_field(&mut doc, "topicDispatchRate", Some("c1"), None);
        assert!(doc.is_empty());
    }
}
