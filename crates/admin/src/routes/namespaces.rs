//! Namespace endpoints beyond the simple policies: permissions, properties, bundles and
//! unloading, as Pulsar's `Namespaces` resource.
//!
//! Permissions are stored in the namespace document's `auth_policies` (Pulsar's layout:
//! `namespace_auth` role → actions, `subscription_auth_roles` subscription → roles) and served
//! back, but not enforced: Magnetar has no authorization yet.
//!
//! Bundles: Magnetar does not split namespace ownership by hash range yet, so a namespace has one
//! bundle `0x00000000_0xffffffff` unless created with `bundles` (`numBundles` N, then N even
//! ranges as Pulsar computes them, `magnetar_coordination::Bundles`). Pulsar's own default
//! (`defaultNumberOfNamespaceBundles`) is 4; one bundle says what Magnetar does. `topics
//! bundle-range` answers the bundle a topic hashes into and `split-bundle` splits one. Unloading
//! a bundle unloads the whole namespace.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use super::policies::{Level, Target};
use super::{body_bytes, PathSegments};
use crate::error::AdminError;
use crate::AdminState;

/// Pulsar's `AuthAction` names.
const AUTH_ACTIONS: [&str; 6] = ["produce", "consume", "functions", "sources", "sinks", "packages"];

/// The most bundles a namespace may have (Pulsar's `maxNumberOfNamespaceBundles` default 128).
pub(crate) const MAX_BUNDLES: i64 = 128;

/// Pulsar's `BundlesData` for `n` even bundles over the 32-bit hash range (boundaries
/// `i * 2^32 / n`, the last `0xffffffff`: `magnetar_coordination::Bundles::even`).
pub(crate) fn bundles_data(n: u32) -> Value {
    let n = n.max(1);
    let boundaries = magnetar_coordination::Bundles::even(u64::from(n))
        .expect("1 ..= 2^32 bundles")
        .boundary_strings();
    serde_json::json!({ "boundaries": boundaries, "numBundles": n })
}

/// The `bundles` of a create-namespace body, completed: 412 for a count outside 1..=128, and
/// boundaries computed when only `numBundles` is given (what `pulsar-admin namespaces create
/// --bundles N` sends).
pub(crate) fn normalize_bundles(
    policies: &mut Map<String, Value>,
    default_bundles: u32,
) -> Result<(), AdminError> {
    let invalid = || {
        AdminError::PreconditionFailed(format!(
            "Invalid number of bundles. Number of bundles has to be in the range of (0, {MAX_BUNDLES}]."
        ))
    };
    let Some(bundles) = policies.get("bundles").filter(|b| !b.is_null()) else {
        policies.insert("bundles".to_string(), bundles_data(default_bundles));
        return Ok(());
    };
    let Value::Object(bundles) = bundles else {
        return Err(AdminError::BadRequest("Invalid policies: bundles".to_string()));
    };
    let boundaries = match bundles.get("boundaries") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for item in items {
                let parsed = item
                    .as_str()
                    .and_then(|s| s.strip_prefix("0x"))
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .filter(|b| *b <= 0xffff_ffff);
                out.push(parsed.ok_or_else(|| {
                    AdminError::BadRequest("Invalid policies: bundles boundaries".to_string())
                })?);
            }
            Some(out)
        }
        Some(_) => return Err(AdminError::BadRequest("Invalid policies: bundles".to_string())),
    };
    let count = match (bundles.get("numBundles"), &boundaries) {
        (Some(Value::Number(n)), _) => n.as_i64().ok_or_else(invalid)?,
        (None | Some(Value::Null), Some(b)) => b.len() as i64 - 1,
        (None | Some(Value::Null), None) => 1,
        (Some(_), _) => {
            return Err(AdminError::BadRequest("Invalid policies: bundles".to_string()))
        }
    };
    if !(1..=MAX_BUNDLES).contains(&count) {
        return Err(invalid());
    }
    let data = match boundaries {
        None => bundles_data(count as u32),
        Some(b) => {
            let ordered = b.windows(2).all(|w| w[0] < w[1]);
            if b.len() as i64 != count + 1
                || b.first() != Some(&0)
                || b.last() != Some(&0xffff_ffff)
                || !ordered
            {
                return Err(AdminError::PreconditionFailed(
                    "Bundle boundaries must cover 0x00000000 to 0xffffffff in order".to_string(),
                ));
            }
            let boundaries: Vec<String> = b.iter().map(|x| format!("0x{x:08x}")).collect();
            serde_json::json!({ "boundaries": boundaries, "numBundles": count })
        }
    };
    policies.insert("bundles".to_string(), data);
    Ok(())
}

fn namespace_target(uri: &Uri) -> Result<Target, AdminError> {
    Target::from_uri(uri, Level::Namespace)
}

/// A path segment that names something (a role, a subscription, a property key).
fn name_segment(uri: &Uri, index: usize, what: &str) -> Result<String, AdminError> {
    PathSegments::new(uri)
        .decoded(index)?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| AdminError::PreconditionFailed(format!("Invalid {what}")))
}

fn auth_map(doc: &Map<String, Value>, field: &str) -> Value {
    doc.get("auth_policies")
        .and_then(|a| a.get(field))
        .filter(|m| m.is_object())
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()))
}

/// The `auth_policies.{field}` map of `doc`, created when absent.
fn auth_map_mut<'a>(doc: &'a mut Map<String, Value>, field: &str) -> &'a mut Map<String, Value> {
    let auth = doc.entry("auth_policies").or_insert_with(|| Value::Object(Map::new()));
    if !auth.is_object() {
        *auth = Value::Object(Map::new());
    }
    let Value::Object(auth) = auth else { unreachable!("just made an object") };
    let map = auth.entry(field.to_string()).or_insert_with(|| Value::Object(Map::new()));
    if !map.is_object() {
        *map = Value::Object(Map::new());
    }
    match map {
        Value::Object(map) => map,
        _ => unreachable!("just made an object"),
    }
}

/// A JSON array of strings (a `Set<String>` or `Set<AuthAction>` body), sorted and unique.
fn string_set(body: &[u8], what: &str) -> Result<Vec<String>, AdminError> {
    let bad =
        || AdminError::BadRequest(format!("Invalid {what}: expected a JSON array of strings"));
    let mut items: Vec<String> = serde_json::from_slice(body).map_err(|_| bad())?;
    items.sort();
    items.dedup();
    Ok(items)
}

/// `GET /admin/v2/namespaces/{t}/{ns}/permissions`: role → actions.
pub(crate) async fn get_permissions(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let (doc, _) = namespace_target(&uri)?.load(&state).await?;
    Ok(Json(auth_map(&doc, "namespace_auth")))
}

/// A grant's body: a JSON array of Pulsar's `AuthAction` names; 400 for any other name.
fn granted_actions(body: Result<Bytes, BytesRejection>) -> Result<Value, AdminError> {
    let actions = string_set(&body_bytes(body)?, "actions")?;
    if let Some(bad) = actions.iter().find(|a| !AUTH_ACTIONS.contains(&a.as_str())) {
        return Err(AdminError::BadRequest(format!("Invalid action: {bad}")));
    }
    Ok(Value::from(actions))
}

/// `POST /admin/v2/namespaces/{t}/{ns}/permissions/{role}` with a JSON array of actions
/// (`produce`, `consume`, `functions`, `sources`, `sinks`, `packages`): 204; 400 unknown action.
pub(crate) async fn grant_permission(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    let role = name_segment(&uri, 4, "role")?;
    let value = granted_actions(body)?;
    target
        .update(&state, |doc| {
            auth_map_mut(doc, "namespace_auth").insert(role.clone(), value.clone());
            Ok(())
        })
        .await?;
    tracing::info!(%role, actions = %value, "granted namespace permission");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/namespaces/{t}/{ns}/permissions/{role}`: 204 (also when the role had none).
pub(crate) async fn revoke_permission(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    let role = name_segment(&uri, 4, "role")?;
    target
        .update(&state, |doc| {
            auth_map_mut(doc, "namespace_auth").remove(&role);
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /admin/v2/namespaces/{t}/{ns}/permissions/subscription`: subscription → roles.
pub(crate) async fn get_subscription_permissions(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let (doc, _) = namespace_target(&uri)?.load(&state).await?;
    Ok(Json(auth_map(&doc, "subscription_auth_roles")))
}

/// `POST /admin/v2/namespaces/{t}/{ns}/permissions/subscription/{subscription}` with a JSON
/// array of roles: 204.
pub(crate) async fn grant_subscription_permission(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    let subscription = name_segment(&uri, 5, "subscription")?;
    let roles = string_set(&body_bytes(body)?, "roles")?;
    let value = Value::from(roles);
    target
        .update(&state, |doc| {
            auth_map_mut(doc, "subscription_auth_roles")
                .insert(subscription.clone(), value.clone());
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/namespaces/{t}/{ns}/permissions/subscription/{subscription}/{role}`
/// (what `pulsar-admin namespaces revoke-subscription-permission` sends) and the older
/// `…/permissions/{subscription}/{role}`: 204.
pub(crate) async fn revoke_subscription_permission(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    // namespaces/{t}/{ns}/permissions[/subscription]/{subscription}/{role}
    let first = if PathSegments::new(&uri).len() == 7 { 5 } else { 4 };
    let subscription = name_segment(&uri, first, "subscription")?;
    let role = name_segment(&uri, first + 1, "role")?;
    target
        .update(&state, |doc| {
            let map = auth_map_mut(doc, "subscription_auth_roles");
            if let Some(Value::Array(roles)) = map.get_mut(&subscription) {
                roles.retain(|r| r.as_str() != Some(role.as_str()));
            }
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

fn properties_of(doc: &Map<String, Value>) -> Map<String, Value> {
    doc.get("properties").and_then(Value::as_object).cloned().unwrap_or_default()
}

/// `GET /admin/v2/namespaces/{t}/{ns}/properties`: the properties (`{}` when none).
pub(crate) async fn get_properties(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let (doc, _) = namespace_target(&uri)?.load(&state).await?;
    Ok(Json(Value::Object(properties_of(&doc))))
}

/// `PUT /admin/v2/namespaces/{t}/{ns}/properties` with a string → string object: merged into
/// the properties (as Pulsar's `putAll`). 204; 400 not such an object.
pub(crate) async fn set_properties(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    let added: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&body_bytes(body)?).map_err(|_| {
            AdminError::BadRequest("Invalid properties: expected a JSON object of strings".into())
        })?;
    target
        .update(&state, |doc| {
            let mut props = properties_of(doc);
            for (k, v) in &added {
                props.insert(k.clone(), Value::String(v.clone()));
            }
            doc.insert("properties".to_string(), Value::Object(props));
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/namespaces/{t}/{ns}/properties`: clears them. 204.
pub(crate) async fn clear_properties(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    namespace_target(&uri)?
        .update(&state, |doc| {
            doc.remove("properties");
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /admin/v2/namespaces/{t}/{ns}/property/{key}`: the value as plain text, 204 unset.
pub(crate) async fn get_property(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Response, AdminError> {
    let target = namespace_target(&uri)?;
    let key = name_segment(&uri, 4, "property key")?;
    let (doc, _) = target.load(&state).await?;
    Ok(match properties_of(&doc).get(&key).and_then(Value::as_str) {
        Some(v) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))],
            v.to_string(),
        )
            .into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// `PUT /admin/v2/namespaces/{t}/{ns}/property/{key}/{value}`: 204.
pub(crate) async fn set_property(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    let key = name_segment(&uri, 4, "property key")?;
    let value = PathSegments::new(&uri)
        .decoded(5)?
        .ok_or_else(|| AdminError::PreconditionFailed("Invalid property value".to_string()))?;
    target
        .update(&state, |doc| {
            let mut props = properties_of(doc);
            props.insert(key.clone(), Value::String(value.clone()));
            doc.insert("properties".to_string(), Value::Object(props));
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/namespaces/{t}/{ns}/property/{key}`: 204.
pub(crate) async fn remove_property(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    let key = name_segment(&uri, 4, "property key")?;
    target
        .update(&state, |doc| {
            let mut props = properties_of(doc);
            props.remove(&key);
            if props.is_empty() {
                doc.remove("properties");
            } else {
                doc.insert("properties".to_string(), Value::Object(props));
            }
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The namespace's `BundlesData` (one bundle when the document has none).
fn bundles_of(doc: &Map<String, Value>) -> Value {
    doc.get("bundles")
        .filter(|b| b.get("boundaries").is_some_and(Value::is_array))
        .cloned()
        .unwrap_or_else(|| bundles_data(1))
}

/// The namespace's bundles, parsed (a stored document whose boundaries do not cover the hash
/// range is a server error: the admin API never stores one).
pub(crate) fn namespace_bundles(
    doc: &Map<String, Value>,
    ns: &impl std::fmt::Display,
) -> Result<magnetar_coordination::Bundles, AdminError> {
    let boundaries: Vec<String> = bundles_of(doc)["boundaries"]
        .as_array()
        .map(|b| b.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    magnetar_coordination::Bundles::from_boundaries(&boundaries)
        .map_err(|e| AdminError::Internal(format!("bundles of {ns}: {e}")))
}

/// The `{bundle}` segment of a namespace route: 412 when it is not `0xLOWER_0xUPPER`.
fn bundle_segment(uri: &Uri) -> Result<magnetar_coordination::BundleRange, AdminError> {
    let name = PathSegments::new(uri).decoded(3)?.unwrap_or_default();
    magnetar_coordination::BundleRange::parse(&name)
        .map_err(|_| AdminError::PreconditionFailed(format!("Invalid bundle range {name}")))
}

/// `GET /admin/v2/namespaces/{t}/{ns}/bundles`: `{"boundaries":[…],"numBundles":N}`.
pub(crate) async fn get_bundles(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let (doc, _) = namespace_target(&uri)?.load(&state).await?;
    Ok(Json(bundles_of(&doc)))
}

/// `GET /lookup/v2/topic/{domain}/{t}/{ns}/{topic}/bundle` (`pulsar-admin topics bundle-range`):
/// the namespace bundle the topic hashes into (CRC32 of its full name, `magnetar_coordination`),
/// as plain text. 404 when the namespace does not exist.
pub(crate) async fn bundle_range(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<String, AdminError> {
    let topic = PathSegments::after(&uri, "/lookup/v2/topic/").topic()?;
    let key = magnetar_model::keys::namespace_key(topic.namespace());
    let found = state.store.get(&key).await.map_err(|e| AdminError::Internal(e.to_string()))?;
    let Some(found) = found else {
        return Err(AdminError::NotFound("Namespace does not exist".to_string()));
    };
    let doc: Map<String, Value> = serde_json::from_slice(&found.value).unwrap_or_default();
    let bundles = namespace_bundles(&doc, topic.namespace())?;
    Ok(bundles.find_topic(&topic.to_string()).name())
}

/// `PUT /admin/v2/namespaces/{t}/{ns}/unload`: unloads the namespace's loaded topics (their
/// clients reconnect). 204.
pub(crate) async fn unload_namespace(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    target.load(&state).await?;
    let ns = PathSegments::new(&uri).namespace(1)?;
    let unloaded = state.hooks.unload_namespace(&ns, None, None).await?;
    tracing::info!(namespace = %ns, unloaded, "unloaded namespace");
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /admin/v2/namespaces/{t}/{ns}/{bundle}/unload[?destinationBroker=host:port]`:
/// `{bundle}` is `0xLOWER_0xUPPER`, one of the namespace's bundles (412 when malformed, 404 when
/// not one of them). In a cluster the bundle's topics close and the bundle is handed over to
/// another broker: `destinationBroker` (a broker id, as `brokers list` names it; 412 when it is
/// not a live broker) or the least-loaded one; standalone, the whole namespace unloads (one
/// broker holds every bundle). 204.
pub(crate) async fn unload_bundle(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let target = namespace_target(&uri)?;
    let range = bundle_segment(&uri)?;
    let (doc, _) = target.load(&state).await?;
    let ns = PathSegments::new(&uri).namespace(1)?;
    if !namespace_bundles(&doc, &ns)?.has(range) {
        return Err(AdminError::NotFound(format!("Bundle {range} not found")));
    }
    let destination = super::query_param(&uri, "destinationBroker").filter(|b| !b.is_empty());
    let unloaded =
        state.hooks.unload_namespace(&ns, Some(&range.name()), destination.as_deref()).await?;
    tracing::info!(namespace = %ns, bundle = %range, unloaded, "unloaded bundle");
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /admin/v2/namespaces/{t}/{ns}/{bundle}/split` (`pulsar-admin namespaces split-bundle`):
/// replaces the bundle by two, split where `splitAlgorithmName` says (`range_equally_divide`, the
/// default, or `topic_count_equally_divide` over the namespace's topics), in the namespace's
/// policies by compare-and-set. 204; 412 for a malformed range, an unknown algorithm or a bundle
/// that cannot be split; 404 for a bundle the namespace does not have. With `unload=true` the
/// namespace's topics are unloaded too. In a cluster the owner of the split bundle keeps both
/// halves (it sees the new bundles through its watch).
pub(crate) async fn split_bundle(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    use magnetar_coordination::{BundleError, Bundles, SplitAlgorithm};
    let target = namespace_target(&uri)?;
    let ns = PathSegments::new(&uri).namespace(1)?;
    let range = bundle_segment(&uri)?;
    let name = range.name();
    let algorithm_name = super::query_param(&uri, "splitAlgorithmName")
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "range_equally_divide".to_string());
    let Some(algorithm) = SplitAlgorithm::from_name(&algorithm_name) else {
        return Err(AdminError::PreconditionFailed(
            "Unsupported namespace bundle split algorithm, supported algorithms are \
             [range_equally_divide, topic_count_equally_divide]"
                .to_string(),
        ));
    };
    let mut hashes = Vec::new();
    if algorithm == SplitAlgorithm::TopicCountEquallyDivide {
        for domain in magnetar_model::names::TopicDomain::ALL {
            for topic in super::topics::collect_topics(&state, &ns, domain).await? {
                hashes.push(magnetar_coordination::topic_hash(&topic.to_string()));
            }
        }
    }
    target
        .update(&state, |doc| {
            let bundles = namespace_bundles(doc, &ns)?;
            if !bundles.has(range) {
                return Err(AdminError::NotFound(format!("Bundle {name} not found")));
            }
            let cannot =
                || AdminError::PreconditionFailed(format!("Bundle {name} cannot be split"));
            let at = Bundles::split_point(range, algorithm, &hashes).ok_or_else(cannot)?;
            let split = bundles.split_at(range, at).map_err(|e| match e {
                BundleError::NoSuchBundle(_) => {
                    AdminError::NotFound(format!("Bundle {name} not found"))
                }
                _ => cannot(),
            })?;
            if split.len() as i64 > MAX_BUNDLES {
                return Err(AdminError::PreconditionFailed(format!(
                    "Namespace {ns} has the most bundles it may have ({MAX_BUNDLES})"
                )));
            }
            let numbers = split.boundary_strings();
            doc.insert(
                "bundles".to_string(),
                serde_json::json!({ "boundaries": numbers, "numBundles": split.len() }),
            );
            Ok(())
        })
        .await?;
    tracing::info!(namespace = %ns, bundle = %name, algorithm = %algorithm_name, "bundle split");
    if super::query_param(&uri, "unload").is_some_and(|v| v == "true") {
        state.hooks.unload_namespace(&ns, None, None).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The topic of a `…/{topic}/permissions[/{role}]` route (its partitioned topic for a
/// partition: permissions are kept per partitioned topic, as Pulsar grants them on every
/// partition) and the namespace document holding them.
fn topic_permissions_target(uri: &Uri) -> Result<(String, Target), AdminError> {
    let topic = PathSegments::new(uri).topic()?.partitioned_topic();
    let target = Target::Namespace(topic.namespace().clone());
    Ok((topic.to_string(), target))
}

/// `GET /admin/v2/{domain}/{t}/{ns}/{topic}/permissions`: role → actions on the topic, its
/// namespace's grants merged with its own (Pulsar's `getPermissionsOnTopic`).
pub(crate) async fn get_topic_permissions(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let (topic, target) = topic_permissions_target(&uri)?;
    let (doc, _) = target.load(&state).await?;
    let mut merged: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    let namespace_level = auth_map(&doc, "namespace_auth");
    let topic_level = auth_map(&doc, "destination_auth").get(&topic).cloned().unwrap_or_default();
    for level in [&namespace_level, &topic_level] {
        for (role, actions) in level.as_object().into_iter().flatten() {
            let entry = merged.entry(role.clone()).or_default();
            for action in actions.as_array().into_iter().flatten().filter_map(Value::as_str) {
                entry.insert(action.to_string());
            }
        }
    }
    Ok(Json(serde_json::to_value(merged).map_err(|e| AdminError::Internal(e.to_string()))?))
}

/// `POST /admin/v2/{domain}/{t}/{ns}/{topic}/permissions/{role}` with a JSON array of actions:
/// 204; stored in the namespace's `auth_policies.destination_auth`, as Pulsar does.
pub(crate) async fn grant_topic_permission(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let (topic, target) = topic_permissions_target(&uri)?;
    let role = name_segment(&uri, 5, "role")?;
    let value = granted_actions(body)?;
    target
        .update(&state, |doc| {
            let topics = auth_map_mut(doc, "destination_auth");
            let roles = topics.entry(topic.clone()).or_insert_with(|| Value::Object(Map::new()));
            if !roles.is_object() {
                *roles = Value::Object(Map::new());
            }
            if let Value::Object(roles) = roles {
                roles.insert(role.clone(), value.clone());
            }
            Ok(())
        })
        .await?;
    tracing::info!(%topic, %role, actions = %value, "granted topic permission");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/{domain}/{t}/{ns}/{topic}/permissions/{role}`: 204; 412 when the role has
/// no permission of the topic's own (Pulsar's answer).
pub(crate) async fn revoke_topic_permission(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let (topic, target) = topic_permissions_target(&uri)?;
    let role = name_segment(&uri, 5, "role")?;
    target
        .update(&state, |doc| {
            let topics = auth_map_mut(doc, "destination_auth");
            let removed = match topics.get_mut(&topic) {
                Some(Value::Object(roles)) => {
                    let removed = roles.remove(&role).is_some();
                    if roles.is_empty() {
                        topics.remove(&topic);
                    }
                    removed
                }
                _ => false,
            };
            if !removed {
                return Err(AdminError::PreconditionFailed(
                    "Permissions are not set at the topic level".to_string(),
                ));
            }
            Ok(())
        })
        .await?;
    tracing::info!(%topic, %role, "revoked topic permission");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_like_pulsar() {
        assert_eq!(
            bundles_data(1),
            serde_json::json!({"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1})
        );
        assert_eq!(
            bundles_data(4)["boundaries"],
            serde_json::json!([
                "0x00000000",
                "0x40000000",
                "0x80000000",
                "0xc0000000",
                "0xffffffff"
            ])
        );
        let mut p = Map::new();
        normalize_bundles(&mut p, 4).unwrap();
        assert_eq!(p["bundles"]["numBundles"], 4, "the cluster default");
        let mut p: Map<String, Value> =
            serde_json::from_str(r#"{"bundles":{"numBundles":4}}"#).unwrap();
        normalize_bundles(&mut p, 4).unwrap();
        assert_eq!(p["bundles"]["boundaries"].as_array().unwrap().len(), 5);
        for bad in [
            r#"{"bundles":{"numBundles":0}}"#,
            r#"{"bundles":{"numBundles":129}}"#,
            r#"{"bundles":{"boundaries":["0x00000000","0x10000000"]}}"#,
        ] {
            let mut p: Map<String, Value> = serde_json::from_str(bad).unwrap();
            assert!(matches!(normalize_bundles(&mut p, 4), Err(AdminError::PreconditionFailed(_))));
        }
        for bad in [
            r#"{"bundles":3}"#,
            r#"{"bundles":{"numBundles":"x"}}"#,
            r#"{"bundles":{"boundaries":["zz"]}}"#,
        ] {
            let mut p: Map<String, Value> = serde_json::from_str(bad).unwrap();
            assert!(
                matches!(normalize_bundles(&mut p, 4), Err(AdminError::BadRequest(_))),
                "{bad}"
            );
        }
    }
}
