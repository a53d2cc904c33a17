//! Namespace isolation policies (`pulsar-admin ns-isolation-policy …`, super-user only), under
//! `/admin/v2/clusters/{cluster}/namespaceIsolationPolicies`:
//!
//! - `GET …`: every policy, name -> `NamespaceIsolationData` (`{}` for none, where Pulsar
//!   answers 404 until the first is set);
//! - `GET …/{policy}`: one (404 when there is none by that name);
//! - `POST …/{policy}` with a `NamespaceIsolationData`: sets it, 204 (400 with the reason when it
//!   does not validate: namespaces and primary brokers given, regexes valid, a `min_available`
//!   auto-failover policy with integer `min_limit` and `usage_threshold`);
//! - `DELETE …/{policy}`: 204, whether it was there or not (as Pulsar);
//! - `GET …/brokers`, `GET …/brokers/{broker}`: how each registered broker (`host:port`) stands
//!   with the policies, Pulsar's `BrokerNamespaceIsolationData`.
//!
//! The policies are one document at Pulsar's path, `/admin/clusters/{cluster}/namespaceIsolationPolicies`,
//! changed by compare-and-set; every broker watches it, and the rules
//! (`magnetar_coordination::isolation`) apply to every bundle placed from then on; the leader
//! moves bundles that sit on a broker a new policy does not allow. Another cluster's name: 412
//! (404 for the list), as Pulsar.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::Json;
use magnetar_coordination::isolation::{IsolationPolicies, NamespaceIsolationData, StoredPolicies};
use magnetar_metadata::ExpectedVersion;
use magnetar_model::keys;
use serde_json::{json, Value};

use super::{body_bytes, get_json, to_json_bytes, update_document, PathSegments};
use crate::error::AdminError;
use crate::AdminState;

/// `GET …/namespaceIsolationPolicies`.
pub(crate) async fn list(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<StoredPolicies>, AdminError> {
    cluster(&state, &uri).map_err(|_| AdminError::NotFound("Cluster does not exist".into()))?;
    Ok(Json(load(&state).await?.0))
}

/// `GET …/namespaceIsolationPolicies/{policy}`.
pub(crate) async fn get(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<NamespaceIsolationData>, AdminError> {
    let cluster = cluster(&state, &uri)?;
    let name = policy_name(&uri)?;
    let (policies, _) = load(&state).await?;
    policies.get(&name).cloned().map(Json).ok_or_else(|| {
        AdminError::NotFound(format!(
            "Cannot find NamespaceIsolationPolicy {name} for cluster {cluster}"
        ))
    })
}

/// `POST …/namespaceIsolationPolicies/{policy}`.
pub(crate) async fn set(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    cluster(&state, &uri)?;
    let name = policy_name(&uri)?;
    let body = body_bytes(body)?;
    let invalid = |reason: String| {
        AdminError::BadRequest(format!(
            "Invalid format of input policy data. policy: {name}; data: {}: {reason}",
            String::from_utf8_lossy(&body)
        ))
    };
    let data: NamespaceIsolationData =
        serde_json::from_slice(&body).map_err(|e| invalid(e.to_string()))?;
    data.validate().map_err(invalid)?;
    update(&state, |policies| {
        policies.insert(name.clone(), data.clone());
    })
    .await?;
    tracing::info!(policy = %name, "namespace isolation policy set");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/namespaceIsolationPolicies/{policy}`.
pub(crate) async fn delete(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    cluster(&state, &uri)?;
    let name = policy_name(&uri)?;
    update(&state, |policies| {
        policies.remove(&name);
    })
    .await?;
    tracing::info!(policy = %name, "namespace isolation policy deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET …/namespaceIsolationPolicies/brokers`: every registered broker.
pub(crate) async fn brokers(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Vec<Value>>, AdminError> {
    cluster(&state, &uri)?;
    let policies = compiled(&state).await?;
    let mut brokers = state.store.list_children(keys::BROKERS_ROOT).await?;
    brokers.sort();
    Ok(Json(brokers.iter().map(|b| broker_entry(&policies, b)).collect()))
}

/// `GET …/namespaceIsolationPolicies/brokers/{broker}`.
pub(crate) async fn broker(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    cluster(&state, &uri)?;
    let broker = PathSegments::new(&uri)
        .decoded(4)?
        .filter(|b| !b.is_empty())
        .ok_or_else(|| AdminError::PreconditionFailed("Broker name is missing".into()))?;
    Ok(Json(broker_entry(&compiled(&state).await?, &broker)))
}

/// Pulsar's `BrokerNamespaceIsolationData` (its boolean under both names Jackson may use).
fn broker_entry(policies: &IsolationPolicies, broker: &str) -> Value {
    let found = policies.broker(broker);
    json!({
        "brokerName": broker,
        "policyName": found.policy_name,
        "isPrimary": found.is_primary,
        "primary": found.is_primary,
        "namespaceRegex": found.namespace_regex,
    })
}

/// The `{cluster}` segment, which must be this cluster (412 otherwise).
fn cluster(state: &AdminState, uri: &Uri) -> Result<String, AdminError> {
    let name = PathSegments::new(uri).decoded(1)?.unwrap_or_default();
    if name != state.cluster {
        return Err(AdminError::PreconditionFailed(format!("Cluster {name} does not exist.")));
    }
    Ok(name)
}

fn policy_name(uri: &Uri) -> Result<String, AdminError> {
    PathSegments::new(uri)
        .decoded(3)?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| AdminError::PreconditionFailed("Policy name is missing".into()))
}

fn key(state: &AdminState) -> String {
    format!("{}{}", keys::cluster(&state.cluster), magnetar_coordination::cluster::ISOLATION_SUFFIX)
}

async fn load(state: &AdminState) -> Result<(StoredPolicies, ExpectedVersion), AdminError> {
    Ok(match get_json(state, &key(state)).await? {
        Some((policies, version)) => (policies, ExpectedVersion::Exactly(version)),
        None => (StoredPolicies::new(), ExpectedVersion::Absent),
    })
}

async fn compiled(state: &AdminState) -> Result<IsolationPolicies, AdminError> {
    Ok(IsolationPolicies::new(&load(state).await?.0).0)
}

/// Applies `change` to the policies by compare-and-set, retried on a concurrent change.
async fn update(
    state: &AdminState,
    change: impl Fn(&mut StoredPolicies),
) -> Result<(), AdminError> {
    update_document(state, &key(state), "No isolation policies", || async {
        let (mut policies, expected) = load(state).await?;
        change(&mut policies);
        Ok((to_json_bytes(&policies)?, expected))
    })
    .await
}
