//! What a broker holds, as Pulsar's admin API shows it:
//! - `GET /admin/v2/brokers/{cluster}/{broker}/ownedNamespaces` (`pulsar-admin brokers
//!   namespaces CLUSTER --url BROKER`): the bundles `broker` owns, by name
//!   (`tenant/ns/0xLOWER_0xUPPER`), each a `NamespaceOwnershipStatus`. In a cluster, from the
//!   ownership records in the metadata store (any broker answers for any other); standalone, the
//!   one broker owns every bundle of every namespace.
//! - `GET /admin/v2/broker-stats/load-report` (`pulsar-admin broker-stats load-report`): this
//!   broker's last load report, as Pulsar's `LocalBrokerData` (the shape pulsar-admin reads
//!   when `loadReportType` says so): resource uses as percentages, the bundles it owns, its
//!   topic count and message rates. Standalone (no load manager): the URLs and zero loads.

use axum::extract::State;
use axum::http::Uri;
use axum::Json;
use magnetar_coordination::cluster::{LOAD_ROOT, OWNERSHIP_ROOT};
use magnetar_model::keys;
use serde_json::{json, Map, Value};

use super::{get_json, PathSegments};
use crate::error::AdminError;
use crate::AdminState;

/// This broker's id (`host:web-port`, its registration's name), from its web URL.
fn own_id(state: &AdminState) -> String {
    let url = state.service_url.clone().unwrap_or_default();
    url.trim_start_matches("http://").trim_start_matches("https://").trim_end_matches('/').into()
}

/// `tenant/ns/0xLOWER_0xUPPER` of an ownership record's key.
fn bundle_name(key: &str) -> &str {
    key.strip_prefix(OWNERSHIP_ROOT).unwrap_or(key).trim_start_matches('/')
}

/// Pulsar's `NamespaceOwnershipStatus` of a bundle in the shared broker pool.
fn ownership_status() -> Value {
    json!({ "broker_assignment": "shared", "is_controlled": false, "is_active": true })
}

pub(crate) async fn owned_namespaces(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Map<String, Value>>, AdminError> {
    let segments = PathSegments::new(&uri);
    let (cluster, broker) = (segments.decoded(1)?, segments.decoded(2)?.unwrap_or_default());
    if cluster.as_deref() != Some(state.cluster.as_str()) {
        return Err(AdminError::NotFound("Cluster does not exist".to_string()));
    }
    let registered = state.store.list_children(keys::BROKERS_ROOT).await?;
    if !registered.contains(&broker) {
        return Err(AdminError::NotFound(format!("Broker {broker} is not an active broker")));
    }
    let mut owned = Map::new();
    let records = state.store.list(&format!("{OWNERSHIP_ROOT}/")).await?;
    let clustered = !records.is_empty() || registered.len() > 1;
    for key in records {
        let bundle = bundle_name(&key);
        let Some((record, _)) = get_json::<Value>(&state, &key).await? else { continue };
        let field = |name: &str| record.get(name).and_then(Value::as_str);
        if field("state") == Some("Owned") && field("dst") == Some(broker.as_str()) {
            owned.insert(bundle.to_string(), ownership_status());
        }
    }
    if !clustered && broker == own_id(&state) {
        // A single broker without ownership records serves every bundle itself.
        for tenant in state.store.list_children(keys::TENANTS_ROOT).await? {
            for ns in state.store.list_children(&keys::namespaces_of(&tenant)).await? {
                let Some((doc, _)) =
                    get_json::<Map<String, Value>>(&state, &keys::namespace(&tenant, &ns)).await?
                else {
                    continue;
                };
                let name = format!("{tenant}/{ns}");
                for range in super::namespaces::namespace_bundles(&doc, &name)?.ranges() {
                    owned.insert(format!("{name}/{}", range.name()), ownership_status());
                }
            }
        }
    }
    Ok(Json(owned))
}

pub(crate) async fn load_report(
    State(state): State<AdminState>,
) -> Result<Json<Value>, AdminError> {
    let id = own_id(&state);
    let key = format!("{LOAD_ROOT}/{id}");
    let stored = get_json::<Value>(&state, &key).await?.map(|(report, _)| report);
    let stored = stored.unwrap_or_default();
    let fraction = |name: &str| stored.get(name).and_then(Value::as_f64).unwrap_or(0.0);
    let usage = |name: &str| json!({ "usage": fraction(name) * 100.0, "limit": 100.0 });
    let sum = |name: &str| -> f64 {
        stored
            .get(name)
            .and_then(Value::as_object)
            .map_or(0.0, |m| m.values().filter_map(Value::as_f64).sum())
    };
    let bundles: Vec<String> = stored
        .get("bundles")
        .and_then(Value::as_object)
        .map(|m| m.keys().map(|k| bundle_name(k).to_string()).collect())
        .unwrap_or_default();
    let max = ["cpu", "memory", "bandwidthIn", "bandwidthOut"]
        .into_iter()
        .map(fraction)
        .fold(0.0, f64::max);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Ok(Json(json!({
        "loadReportType": "LocalBrokerData",
        "webServiceUrl": state.service_url,
        "webServiceUrlTls": state.service_url_tls,
        "pulsarServiceUrl": state.broker_service_url,
        "pulsarServiceUrlTls": state.broker_service_url_tls,
        "persistentTopicsEnabled": true,
        "nonPersistentTopicsEnabled": true,
        "cpu": usage("cpu"),
        "memory": usage("memory"),
        "directMemory": { "usage": 0.0, "limit": 0.0 },
        "bandwidthIn": usage("bandwidthIn"),
        "bandwidthOut": usage("bandwidthOut"),
        "msgThroughputIn": sum("bundles"),
        "msgThroughputOut": 0.0,
        "msgRateIn": sum("msgRates"),
        "msgRateOut": 0.0,
        "numTopics": sum("topics") as u64,
        "numBundles": bundles.len(),
        "numConsumers": 0,
        "numProducers": 0,
        "bundles": bundles,
        "lastBundleGains": [],
        "lastBundleLosses": [],
        "lastUpdate": now_ms,
        "brokerVersionString": env!("CARGO_PKG_VERSION"),
        "maxResourceUsage": max,
    })))
}
