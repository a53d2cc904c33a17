//! Cluster, tenant and namespace endpoints (`/admin/v2/clusters`, `/admin/v2/tenants`,
//! `/admin/v2/namespaces`), following Pulsar's `ClustersBase`, `TenantsBase` and
//! `NamespacesBase`.
//!
//! There is exactly one cluster, the one named in [`AdminState`]. Forced deletes of tenants and
//! namespaces are allowed (Pulsar's `forceDeleteTenantAllowed` / `forceDeleteNamespaceAllowed`
//! on): they delete everything beneath.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::Json;
use magnetar_metadata::{ExpectedVersion, MetadataError};
use serde_json::{Map, Value};

use super::namespaces::normalize_bundles;
use super::policies::validate_retention;
use super::topics::{collect_topics, partitioned_topic_names};
use super::{
    body_bytes, get_json, query_bool, query_param, require_namespace, to_json_bytes, PathSegments,
};
use crate::error::AdminError;
use crate::hooks::HookError;
use crate::model::{effective_policies, parse_object_body, TenantInfo};
use crate::AdminState;
use magnetar_model::keys;
use magnetar_model::names::{is_system_topic, is_valid_entity_name, NamespaceName, TopicDomain};
use magnetar_model::policy::NamespacePolicies;

/// `GET /admin/v2/clusters`: `["<cluster>"]`.
pub(crate) async fn list_clusters(State(state): State<AdminState>) -> Json<Vec<String>> {
    Json(vec![state.cluster.clone()])
}

/// `GET /admin/v2/clusters/{cluster}`: the cluster's `ClusterData`: the record `magnetar
/// metadata init` stored at `/admin/clusters/{cluster}` (unknown fields kept), with this
/// broker's service URLs filling what it does not set; 404 for any other cluster.
pub(crate) async fn get_cluster(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let name = PathSegments::new(&uri).decoded(1)?;
    if name.as_deref() != Some(state.cluster.as_str()) {
        return Err(AdminError::NotFound("Cluster does not exist".to_string()));
    }
    let mut data =
        match get_json::<Map<String, Value>>(&state, &keys::cluster(&state.cluster)).await? {
            Some((stored, _)) => stored,
            None => Map::new(),
        };
    if let Some(url) = &state.service_url {
        data.entry("serviceUrl").or_insert_with(|| Value::String(url.clone()));
    }
    if let Some(url) = &state.broker_service_url {
        data.entry("brokerServiceUrl").or_insert_with(|| Value::String(url.clone()));
    }
    if let Some(url) = &state.service_url_tls {
        data.entry("serviceUrlTls").or_insert_with(|| Value::String(url.clone()));
    }
    if let Some(url) = &state.broker_service_url_tls {
        data.entry("brokerServiceUrlTls").or_insert_with(|| Value::String(url.clone()));
    }
    Ok(Json(Value::Object(data)))
}

/// `GET /admin/v2/tenants`: tenant names, sorted.
pub(crate) async fn list_tenants(
    State(state): State<AdminState>,
) -> Result<Json<Vec<String>>, AdminError> {
    Ok(Json(state.store.list_children(keys::TENANTS_ROOT).await?))
}

/// The tenant in path segment 1, or `None` when the name cannot name any tenant.
fn tenant_segment(uri: &Uri) -> Result<Option<String>, AdminError> {
    Ok(PathSegments::new(uri).decoded(1)?.filter(|t| is_valid_entity_name(t)))
}

async fn load_tenant(
    state: &AdminState,
    tenant: Option<&str>,
) -> Result<Option<(TenantInfo, u64)>, AdminError> {
    match tenant {
        Some(t) => get_json(state, &keys::tenant(t)).await,
        None => Ok(None),
    }
}

/// `GET /admin/v2/tenants/{tenant}`: the TenantInfo; 404 "Tenant does not exist".
pub(crate) async fn get_tenant(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<TenantInfo>, AdminError> {
    let tenant = tenant_segment(&uri)?;
    match load_tenant(&state, tenant.as_deref()).await? {
        Some((info, _)) => Ok(Json(info)),
        None => Err(AdminError::NotFound("Tenant does not exist".to_string())),
    }
}

/// Parses a TenantInfo body and checks its clusters as Pulsar's `validateClusters`: 400 for a
/// malformed body, 412 "Clusters can not be empty" / "Clusters do not exist".
fn tenant_info_from_body(state: &AdminState, body: &[u8]) -> Result<TenantInfo, AdminError> {
    let mut info = match parse_object_body(body, "tenant info")? {
        Some(map) => serde_json::from_value::<TenantInfo>(Value::Object(map))
            .map_err(|e| AdminError::BadRequest(format!("Invalid tenant info: {e}")))?,
        None => TenantInfo::default(),
    };
    if info.allowed_clusters.is_empty() || info.allowed_clusters.iter().any(|c| c.trim().is_empty())
    {
        return Err(AdminError::PreconditionFailed("Clusters can not be empty".to_string()));
    }
    if info.allowed_clusters.iter().any(|c| c != &state.cluster && c != "global") {
        return Err(AdminError::PreconditionFailed("Clusters do not exist".to_string()));
    }
    info.normalize();
    Ok(info)
}

/// `PUT /admin/v2/tenants/{tenant}` with a TenantInfo body: 204; 400 bad body; 412 invalid
/// name or clusters; 409 "Tenant already exist".
pub(crate) async fn create_tenant(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let info = tenant_info_from_body(&state, &body_bytes(body)?)?;
    let Some(tenant) = tenant_segment(&uri)? else {
        return Err(AdminError::PreconditionFailed("Tenant name is not valid".to_string()));
    };
    match state
        .store
        .put(&keys::tenant(&tenant), to_json_bytes(&info)?, ExpectedVersion::Absent)
        .await
    {
        Ok(_) => {
            tracing::info!(%tenant, "created tenant");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(MetadataError::BadVersion { .. }) => {
            Err(AdminError::Conflict("Tenant already exist".to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// `POST /admin/v2/tenants/{tenant}` with a TenantInfo body: replaces it. 204; 400 bad body;
/// 412 invalid clusters; 404 unknown tenant; 409 concurrent modification.
pub(crate) async fn update_tenant(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let info = tenant_info_from_body(&state, &body_bytes(body)?)?;
    let tenant = tenant_segment(&uri)?;
    let Some((_, version)) = load_tenant(&state, tenant.as_deref()).await? else {
        let shown = tenant.unwrap_or_default();
        return Err(AdminError::NotFound(format!("Tenant {shown} not found")));
    };
    let tenant = tenant.unwrap_or_default();
    state
        .store
        .put(&keys::tenant(&tenant), to_json_bytes(&info)?, ExpectedVersion::Exactly(version))
        .await?;
    tracing::info!(%tenant, "updated tenant");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/tenants/{tenant}[?force=true]`: 204; 404 unknown tenant; 409 "The tenant
/// still has active namespaces" unless `force`, which deletes every namespace first (each as
/// a forced namespace delete: with its topics).
pub(crate) async fn delete_tenant(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let force = query_bool(&uri, "force");
    let tenant = tenant_segment(&uri)?;
    let Some(_) = load_tenant(&state, tenant.as_deref()).await? else {
        return Err(AdminError::NotFound("Tenant doesn't exist".to_string()));
    };
    let tenant = tenant.unwrap_or_default();
    let namespaces = state.store.list_children(&keys::namespaces_of(&tenant)).await?;
    if !namespaces.is_empty() {
        if !force {
            return Err(AdminError::Conflict("The tenant still has active namespaces".to_string()));
        }
        for name in namespaces {
            let Ok(ns) = NamespaceName::new(&tenant, &name) else { continue };
            match remove_namespace(&state, &ns, true).await {
                Ok(()) | Err(AdminError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    // Read again: the namespace deletes do not touch the tenant, but another admin may have.
    let Some((_, version)) = load_tenant(&state, Some(&tenant)).await? else {
        return Err(AdminError::NotFound("Tenant doesn't exist".to_string()));
    };
    match state.store.delete(&keys::tenant(&tenant), ExpectedVersion::Exactly(version)).await {
        Ok(()) => {
            tracing::info!(%tenant, force, "deleted tenant");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(MetadataError::NotFound { .. }) => {
            Err(AdminError::NotFound("Tenant doesn't exist".to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// `GET /admin/v2/namespaces/{tenant}`: `["tenant/ns", …]`; 404 "Tenant does not exist".
pub(crate) async fn list_namespaces(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Vec<String>>, AdminError> {
    let tenant = tenant_segment(&uri)?;
    if load_tenant(&state, tenant.as_deref()).await?.is_none() {
        return Err(AdminError::NotFound("Tenant does not exist".to_string()));
    }
    let tenant = tenant.unwrap_or_default();
    let children = state.store.list_children(&keys::namespaces_of(&tenant)).await?;
    Ok(Json(children.into_iter().map(|ns| format!("{tenant}/{ns}")).collect()))
}

/// `PUT /admin/v2/namespaces/{tenant}/{namespace}` with an optional Policies body: 204;
/// 400 bad body; 412 invalid name; 404 "Tenant does not exist"; 403 replication cluster not
/// allowed for the tenant; 409 "Namespace already exists".
pub(crate) async fn create_namespace(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let mut policies = parse_object_body(&body_bytes(body)?, "policies")?.unwrap_or_default();
    let ns = PathSegments::new(&uri).namespace(1)?;
    normalize_bundles(&mut policies, state.default_bundles)?;
    // The stored document must decode as the typed policies the broker reads.
    let typed: NamespacePolicies = serde_json::from_value(Value::Object(policies.clone()))
        .map_err(|e| AdminError::BadRequest(format!("Invalid policies: {e}")))?;
    if let Some(retention) = &typed.retention_policies {
        validate_retention(retention)?;
    }
    let Some((tenant_info, _)) = load_tenant(&state, Some(ns.tenant())).await? else {
        return Err(AdminError::NotFound("Tenant does not exist".to_string()));
    };
    if let Some(clusters) = policies.get("replication_clusters") {
        let clusters: Vec<String> = serde_json::from_value(clusters.clone()).map_err(|_| {
            AdminError::BadRequest("Invalid policies: replication_clusters".to_string())
        })?;
        for c in clusters {
            if !tenant_info.allowed_clusters.contains(&c) {
                return Err(AdminError::Status(
                    StatusCode::FORBIDDEN,
                    format!(
                        "Cluster [{c}] is not in the list of allowed clusters list for tenant [{}]",
                        ns.tenant()
                    ),
                ));
            }
        }
    }
    // No replication clusters (what `pulsar-admin namespaces create` sends): the local one, as
    // Pulsar does.
    let mut typed = typed;
    let no_clusters = |c: &Value| c.is_null() || c.as_array().is_some_and(Vec::is_empty);
    if typed.other.get("replication_clusters").is_none_or(no_clusters) {
        typed
            .other
            .insert("replication_clusters".to_string(), Value::from(vec![state.cluster.clone()]));
    }
    match state
        .store
        .put(&keys::namespace_key(&ns), to_json_bytes(&typed)?, ExpectedVersion::Absent)
        .await
    {
        Ok(_) => {
            tracing::info!(namespace = %ns, "created namespace");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(MetadataError::BadVersion { .. }) => {
            Err(AdminError::Conflict("Namespace already exists".to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// `GET /admin/v2/namespaces/{tenant}/{namespace}`: the policies (stored values over
/// Pulsar's defaults); 412 invalid name; 404 "Namespace does not exist".
pub(crate) async fn get_namespace(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let ns = PathSegments::new(&uri).namespace(1)?;
    let Some((stored, _)) =
        get_json::<Map<String, Value>>(&state, &keys::namespace_key(&ns)).await?
    else {
        return Err(AdminError::NotFound("Namespace does not exist".to_string()));
    };
    Ok(Json(Value::Object(effective_policies(stored, &state.cluster))))
}

/// `DELETE /admin/v2/namespaces/{tenant}/{namespace}[?force=true]`: 204; 412 invalid name;
/// 404 unknown namespace; 409 "Cannot delete non empty namespace" when a non-system topic exists
/// and not `force`. System topics (and, forced, every topic: deleted by the broker with its
/// data, clients closed), partitioned-topic metadata and topic policies go with the namespace.
pub(crate) async fn delete_namespace(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let force = query_bool(&uri, "force");
    let ns = PathSegments::new(&uri).namespace(1)?;
    remove_namespace(&state, &ns, force).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_key(state: &AdminState, key: &str) -> Result<(), AdminError> {
    match state.store.delete(key, ExpectedVersion::Any).await {
        Ok(()) | Err(MetadataError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes namespace `ns` with its topics (see [`delete_namespace`]).
pub(crate) async fn remove_namespace(
    state: &AdminState,
    ns: &NamespaceName,
    force: bool,
) -> Result<(), AdminError> {
    let key = keys::namespace_key(ns);
    let Some(current) = state.store.get(&key).await? else {
        return Err(AdminError::NotFound("Namespace does not exist".to_string()));
    };
    let mut topics = Vec::new();
    for domain in TopicDomain::ALL {
        for topic in collect_topics(state, ns, domain).await? {
            if !force && !is_system_topic(&topic) {
                return Err(AdminError::Conflict("Cannot delete non empty namespace".to_string()));
            }
            topics.push(topic);
        }
    }
    for topic in &topics {
        match state.hooks.delete_topic(topic, true).await {
            Ok(()) | Err(HookError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        // What the broker did not own (e.g. a key written without it) goes too.
        delete_key(state, &keys::topic_key(topic)).await?;
    }
    for domain in TopicDomain::ALL {
        for base in partitioned_topic_names(state, ns, domain).await? {
            delete_key(state, &keys::partitioned_topic_key(&base)).await?;
        }
        let policies =
            format!("{}/{}/{}/{domain}", keys::TOPIC_POLICIES_ROOT, ns.tenant(), ns.namespace());
        for child in state.store.list_children(&policies).await? {
            delete_key(state, &keys::child(&policies, &child)).await?;
        }
    }
    match state.store.delete(&key, ExpectedVersion::Exactly(current.version)).await {
        Ok(()) => {
            tracing::info!(namespace = %ns, force, topics = topics.len(), "deleted namespace");
            Ok(())
        }
        Err(MetadataError::NotFound { .. }) => {
            Err(AdminError::NotFound("Namespace does not exist".to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// `GET /admin/v2/namespaces/{tenant}/{namespace}/topics[?mode=PERSISTENT|NON_PERSISTENT|ALL]
/// [&includeSystemTopic=true]`: the namespace's topics (default mode PERSISTENT).
pub(crate) async fn namespace_topics(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Vec<String>>, AdminError> {
    let ns: NamespaceName = PathSegments::new(&uri).namespace(1)?;
    require_namespace(&state, &ns).await?;
    let domains: &[TopicDomain] =
        match query_param(&uri, "mode").map(|m| m.to_ascii_uppercase()).as_deref() {
            None | Some("PERSISTENT") => &[TopicDomain::Persistent],
            Some("NON_PERSISTENT") => &[TopicDomain::NonPersistent],
            Some("ALL") => &TopicDomain::ALL,
            Some(_) => {
                return Err(AdminError::BadRequest(
                    "Invalid mode: expected PERSISTENT, NON_PERSISTENT or ALL".to_string(),
                ))
            }
        };
    let include_system = query_bool(&uri, "includeSystemTopic");
    let mut out = Vec::new();
    for &domain in domains {
        for topic in collect_topics(&state, &ns, domain).await? {
            if include_system || !is_system_topic(&topic) {
                out.push(topic.to_string());
            }
        }
    }
    Ok(Json(out))
}
