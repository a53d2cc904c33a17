//! JSON documents of the admin API and of the metadata values it stores, plus request-body
//! parsing.
//!
//! Field names follow Pulsar's Jackson serialisation (`TenantInfoImpl`,
//! `PartitionedTopicMetadata`, `Policies`). Parsing is lenient where Pulsar's Jackson is
//! (unknown fields are ignored) and never panics: a malformed body is a 400.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::AdminError;
pub use magnetar_model::policies::{PartitionedTopicMetadata, TenantInfo};

/// A partition count from a request body: Pulsar's `int numPartitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionsBody {
    /// The requested count; may be ≤ 0 (the handlers answer 406 as Pulsar does).
    pub partitions: i64,
    /// Properties, when the body was a `PartitionedTopicMetadata` object.
    pub properties: Option<BTreeMap<String, String>>,
}

/// Parses a partition-count body. Accepted: a JSON integer (`3`, what every client sends), a
/// JSON string holding an integer (`"3"`, which Jackson coerces), or a
/// `PartitionedTopicMetadata` object (`{"partitions":3,"properties":{…}}`). Anything else —
/// empty, malformed, fractional, or outside Java's `int` range — is a 400.
pub(crate) fn parse_partitions_body(body: &[u8]) -> Result<PartitionsBody, AdminError> {
    let bad = |what: &str| AdminError::BadRequest(format!("Invalid number of partitions: {what}"));
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("empty request body"));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad(&format!("malformed JSON ({e})")))?;
    let as_int = |v: &Value| -> Result<i64, AdminError> {
        let n = match v {
            Value::Number(n) => n.as_i64().ok_or_else(|| bad("not an integer"))?,
            Value::String(s) => s.trim().parse::<i64>().map_err(|_| bad("not an integer"))?,
            _ => return Err(bad("expected an integer")),
        };
        if n < i64::from(i32::MIN) || n > i64::from(i32::MAX) {
            return Err(bad("out of range"));
        }
        Ok(n)
    };
    match &value {
        Value::Object(map) => {
            let partitions = as_int(map.get("partitions").ok_or_else(|| bad("missing"))?)?;
            let properties = match map.get("properties") {
                None | Some(Value::Null) => None,
                Some(p) => Some(
                    serde_json::from_value::<BTreeMap<String, String>>(p.clone())
                        .map_err(|_| bad("properties must map strings to strings"))?,
                ),
            };
            Ok(PartitionsBody { partitions, properties })
        }
        other => Ok(PartitionsBody { partitions: as_int(other)?, properties: None }),
    }
}

/// Parses an optional JSON-object body (tenant info, namespace policies). `None` when the body
/// is empty; 400 when it is not a JSON object.
pub(crate) fn parse_object_body(
    body: &[u8],
    what: &str,
) -> Result<Option<serde_json::Map<String, Value>>, AdminError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(Value::Null) => Ok(None),
        Ok(_) => Err(AdminError::BadRequest(format!("Invalid {what}: expected a JSON object"))),
        Err(e) => Err(AdminError::BadRequest(format!("Invalid {what}: malformed JSON ({e})"))),
    }
}

/// The policies returned by `GET /admin/v2/namespaces/{t}/{ns}`: the stored object with
/// Pulsar's defaults filled in for the fields clients commonly read.
pub(crate) fn effective_policies(
    stored: serde_json::Map<String, Value>,
    cluster: &str,
) -> serde_json::Map<String, Value> {
    let defaults = serde_json::json!({
        "auth_policies": {
            "namespace_auth": {},
            "destination_auth": {},
            "subscription_auth_roles": {}
        },
        "replication_clusters": [cluster],
        "bundles": { "boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1 },
        "backlog_quota_map": {},
        "clusterDispatchRate": {},
        "topicDispatchRate": {},
        "subscriptionDispatchRate": {},
        "replicatorDispatchRate": {},
        "clusterSubscribeRate": {},
        "publishMaxMessageRate": {},
        "latency_stats_sample_rate": {},
        "deleted": false,
        "encryption_required": false,
        "subscription_auth_mode": "None",
        "offload_threshold": -1,
        "schema_compatibility_strategy": "UNDEFINED",
        "is_allow_auto_update_schema": true,
        "schema_validation_enforced": false,
        "subscription_types_enabled": [],
        "properties": {}
    });
    let mut out = match defaults {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    for (k, v) in stored {
        out.insert(k, v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_bodies() {
        assert_eq!(parse_partitions_body(b"3").unwrap().partitions, 3);
        assert_eq!(parse_partitions_body(b" \"7\" ").unwrap().partitions, 7);
        assert_eq!(parse_partitions_body(b"-1").unwrap().partitions, -1);
        let obj = parse_partitions_body(br#"{"partitions":2,"properties":{"a":"b"}}"#).unwrap();
        assert_eq!(obj.partitions, 2);
        assert_eq!(obj.properties.unwrap()["a"], "b");
        for bad in [
            &b""[..],
            b"  ",
            b"abc",
            b"1.5",
            b"2147483648",
            b"99999999999999999999999",
            b"[1]",
            b"null",
            b"{}",
            b"{\"partitions\":1,\"properties\":[1]}",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(parse_partitions_body(bad), Err(AdminError::BadRequest(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tenant_info_json() {
        let t: TenantInfo =
            serde_json::from_str(r#"{"adminRoles":null,"allowedClusters":["a"],"x":1}"#).unwrap();
        assert_eq!(t, TenantInfo { admin_roles: vec![], allowed_clusters: vec!["a".into()] });
        assert_eq!(
            serde_json::to_string(&TenantInfo::for_cluster("standalone")).unwrap(),
            r#"{"adminRoles":[],"allowedClusters":["standalone"]}"#
        );
    }

    #[test]
    fn policies_defaults() {
        let mut stored = serde_json::Map::new();
        stored.insert("deleted".into(), Value::Bool(true));
        let p = effective_policies(stored, "c1");
        assert_eq!(p["replication_clusters"], serde_json::json!(["c1"]));
        assert_eq!(p["deleted"], Value::Bool(true));
    }
}
