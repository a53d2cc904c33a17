//! The axum router and the helpers its handlers share.
//!
//! Handlers read names from the *raw* request path ([`PathSegments`]) rather than axum's
//! `Path` extractor, because Pulsar decodes the topic segment with Java's `URLDecoder` (`+`
//! means space) while tenant and namespace segments are plain percent-decoded; axum's
//! decoding cannot express that difference. Routing itself still happens on the encoded path,
//! so an encoded `/` (`%2F`) never splits a segment.
//!
//! Invariant: no handler panics or unwraps request input; every failure is an
//! [`AdminError`] rendered as `{"reason": …}` with Pulsar's status code.

mod bookies;
mod broker;
mod broker_load;
mod console;
mod expiry;
mod forward;
mod isolation;
pub(crate) mod namespaces;
mod policies;
mod schemas;
mod tenants;
mod topic_ops;
mod topics;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::Uri;
use axum::routing::{delete, get, post, put};
use axum::Router as AxumRouter;
use axum::Router;
use std::future::Future;

use magnetar_metadata::{ExpectedVersion, MetadataError, Versioned};
use serde::de::DeserializeOwned;

use crate::error::AdminError;
use crate::model::PartitionedTopicMetadata;
use crate::AdminState;
use magnetar_model::keys;
use magnetar_model::names::{
    decode_path_segment, decode_topic_name, NamespaceName, TopicDomain, TopicName,
};
use policies::Level;

/// Builds the admin router (see the crate docs for the endpoint list).
pub(crate) fn build(state: AdminState) -> Router {
    let mut router = Router::new()
        .route("/admin/v2/brokers", get(broker::list_active_brokers))
        .route("/admin/v2/brokers/health", get(broker::health))
        .route("/admin/v2/brokers/ready", get(broker::ready))
        .route("/admin/v2/brokers/leaderBroker", get(broker::leader_broker))
        .route("/admin/v2/brokers/version", get(broker::version))
        .route("/admin/v2/brokers/configuration", get(broker::dynamic_configuration_names))
        .route("/admin/v2/brokers/configuration/values", get(broker::dynamic_configuration_values))
        .route("/admin/v2/brokers/configuration/runtime", get(broker::runtime_configuration))
        .route(
            "/admin/v2/brokers/configuration/{name}",
            delete(broker::delete_dynamic_configuration),
        )
        .route(
            "/admin/v2/brokers/configuration/{name}/{value}",
            post(broker::update_dynamic_configuration),
        )
        .route("/admin/v2/brokers/internal-configuration", get(broker::internal_configuration))
        .route("/admin/v2/brokers/{cluster}", get(broker::list_brokers))
        .route(
            "/admin/v2/brokers/{cluster}/{broker}/ownedNamespaces",
            get(broker_load::owned_namespaces),
        )
        .route("/admin/v2/broker-stats/load-report", get(broker_load::load_report))
        .route("/admin/v2/bookies/all", get(bookies::list_all))
        .route("/admin/v2/bookies/racks-info", get(bookies::racks))
        .route("/admin/v2/bookies/autorecovery", get(bookies::autorecovery))
        .route("/admin/v2/bookies/{bookie}", delete(bookies::remove))
        .route(
            "/admin/v2/bookies/{bookie}/decommission",
            get(bookies::decommission_status)
                .put(bookies::decommission)
                .post(bookies::decommission)
                .delete(bookies::cancel_decommission),
        )
        .route(
            "/admin/v2/bookies/racks-info/{bookie}",
            get(bookies::get_rack).post(bookies::set_rack).delete(bookies::delete_rack),
        )
        .route("/admin/v2/broker-stats/topics", get(broker::empty_stats_object))
        .route("/admin/v2/broker-stats/bookieops", get(broker::empty_stats_object))
        .route("/admin/v2/broker-stats/metrics", get(broker::empty_stats_list))
        .route("/admin/v2/broker-stats/mbeans", get(broker::empty_stats_list))
        .route("/metrics", get(broker::metrics))
        .route("/metrics/", get(broker::metrics))
        .route("/admin/v2/clusters", get(tenants::list_clusters))
        .route("/admin/v2/clusters/{cluster}", get(tenants::get_cluster))
        .route("/admin/v2/clusters/{cluster}/namespaceIsolationPolicies", get(isolation::list))
        .route(
            "/admin/v2/clusters/{cluster}/namespaceIsolationPolicies/brokers",
            get(isolation::brokers),
        )
        .route(
            "/admin/v2/clusters/{cluster}/namespaceIsolationPolicies/brokers/{broker}",
            get(isolation::broker),
        )
        .route(
            "/admin/v2/clusters/{cluster}/namespaceIsolationPolicies/{policy}",
            get(isolation::get).post(isolation::set).delete(isolation::delete),
        )
        .route("/admin/v2/tenants", get(tenants::list_tenants))
        .route(
            "/admin/v2/tenants/{tenant}",
            get(tenants::get_tenant)
                .put(tenants::create_tenant)
                .post(tenants::update_tenant)
                .delete(tenants::delete_tenant),
        )
        .route("/admin/v2/namespaces/{tenant}", get(tenants::list_namespaces))
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}",
            get(tenants::get_namespace)
                .put(tenants::create_namespace)
                .delete(tenants::delete_namespace),
        )
        .route("/admin/v2/namespaces/{tenant}/{namespace}/topics", get(tenants::namespace_topics))
        .route(
            "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema",
            get(schemas::get_latest).post(schemas::upload).delete(schemas::delete),
        )
        .route(
            "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema/{version}",
            get(schemas::get_version),
        )
        .route("/admin/v2/schemas/{tenant}/{namespace}/{topic}/schemas", get(schemas::get_all))
        .route(
            "/admin/v2/schemas/{tenant}/{namespace}/{topic}/compatibility",
            post(schemas::compatibility),
        )
        .route("/admin/v2/schemas/{tenant}/{namespace}/{topic}/version", post(schemas::version_of));
    let ns = "/admin/v2/namespaces/{tenant}/{namespace}";
    router = policies::policy_routes(router, ns, Level::Namespace)
        .route(&format!("{ns}/permissions"), get(namespaces::get_permissions))
        .route(
            &format!("{ns}/permissions/subscription"),
            get(namespaces::get_subscription_permissions),
        )
        .route(
            &format!("{ns}/permissions/subscription/{{subscription}}"),
            post(namespaces::grant_subscription_permission),
        )
        .route(
            &format!("{ns}/permissions/{{role}}"),
            post(namespaces::grant_permission).delete(namespaces::revoke_permission),
        )
        .route(
            &format!("{ns}/permissions/{{subscription}}/{{role}}"),
            delete(namespaces::revoke_subscription_permission),
        )
        .route(
            &format!("{ns}/permissions/subscription/{{subscription}}/{{role}}"),
            delete(namespaces::revoke_subscription_permission),
        )
        .route(
            &format!("{ns}/properties"),
            get(namespaces::get_properties)
                .put(namespaces::set_properties)
                .delete(namespaces::clear_properties),
        )
        .route(
            &format!("{ns}/property/{{key}}"),
            get(namespaces::get_property).delete(namespaces::remove_property),
        )
        .route(&format!("{ns}/property/{{key}}/{{value}}"), put(namespaces::set_property))
        .route(&format!("{ns}/bundles"), get(namespaces::get_bundles))
        .route(&format!("{ns}/unload"), put(namespaces::unload_namespace))
        .route(&format!("{ns}/{{bundle}}/unload"), put(namespaces::unload_bundle))
        .route(&format!("{ns}/{{bundle}}/split"), put(namespaces::split_bundle));
    for domain in TopicDomain::ALL {
        router = router
            .route(
                &format!("/lookup/v2/topic/{domain}/{{tenant}}/{{namespace}}/{{topic}}"),
                get(topics::lookup),
            )
            .route(
                &format!("/lookup/v2/topic/{domain}/{{tenant}}/{{namespace}}/{{topic}}/bundle"),
                get(namespaces::bundle_range),
            );
        let base = format!("/admin/v2/{domain}/{{tenant}}/{{namespace}}");
        router = router
            .route(&base, get(topics::list_topics))
            .route(&format!("{base}/partitioned"), get(topics::list_partitioned_topics))
            .route(
                &format!("{base}/{{topic}}"),
                put(topics::create_topic).delete(topics::delete_topic),
            )
            .route(&format!("{base}{}", expiry::BY_TIME), post(expiry::by_time))
            .route(&format!("{base}{}", expiry::BY_POSITION), post(expiry::by_position))
            .route(&format!("{base}{}", expiry::ALL_SUBSCRIPTIONS), post(expiry::all_subscriptions))
            .route(
                &format!("{base}/{{topic}}/partitions"),
                put(topics::create_partitioned)
                    .get(topics::get_partitioned)
                    .post(topics::update_partitioned)
                    .delete(topics::delete_partitioned),
            );
        router = router
            .route(&format!("{base}/{{topic}}/permissions"), get(namespaces::get_topic_permissions))
            .route(
                &format!("{base}/{{topic}}/permissions/{{role}}"),
                post(namespaces::grant_topic_permission)
                    .delete(namespaces::revoke_topic_permission),
            );
        router = policies::policy_routes(router, &format!("{base}/{{topic}}"), Level::Topic);
        router = topic_op_routes(router, &format!("{base}/{{topic}}"));
    }
    router = console::routes(router);
    // Authorization sees the matched route (a route layer), so it covers every route above.
    // Authorization (the outer layer: added last, it runs first), then a 307 to the topic's
    // owner when that is another broker, then the handler, with the caller's credentials kept
    // for the partitions it asks other brokers about.
    router = router.route_layer(axum::middleware::from_fn(crate::remote::keep_caller));
    router =
        router.route_layer(axum::middleware::from_fn_with_state(state.clone(), forward::to_owner));
    router = router
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::authz::authorize));
    router.fallback(not_found).with_state(state)
}

/// The per-topic operations of `topic_ops` under `topic` (`/admin/v2/{d}/{t}/{ns}/{topic}`).
fn topic_op_routes(router: AxumRouter<AdminState>, topic: &str) -> AxumRouter<AdminState> {
    let sub = format!("{topic}/subscription/{{subscription}}");
    router
        .route(&format!("{topic}/stats"), get(topic_ops::stats))
        .route(&format!("{topic}/internalStats"), get(topic_ops::internal_stats))
        .route(&format!("{topic}/partitioned-stats"), get(topic_ops::partitioned_stats))
        .route(
            &format!("{topic}/partitioned-internalStats"),
            get(topic_ops::partitioned_internal_stats),
        )
        .route(&format!("{topic}/subscriptions"), get(topic_ops::list_subscriptions))
        .route(&sub, put(topic_ops::create_subscription).delete(topic_ops::delete_subscription))
        .route(&format!("{sub}/skip/{{n}}"), post(topic_ops::skip))
        .route(&format!("{sub}/skip_all"), post(topic_ops::skip_all))
        .route(&format!("{sub}/resetcursor"), post(topic_ops::reset_cursor_to_id))
        .route(&format!("{sub}/resetcursor/{{time}}"), post(topic_ops::reset_cursor_to_time))
        .route(&format!("{sub}/position/{{n}}"), get(topic_ops::peek))
        .route(&format!("{topic}/examinemessage"), get(topic_ops::examine))
        .route(&format!("{topic}/ledger/{{ledger}}/entry/{{entry}}"), get(topic_ops::get_message))
        .route(&format!("{topic}/lastMessageId"), get(topic_ops::last_message_id))
        .route(&format!("{topic}/messageid/{{timestamp}}"), get(topic_ops::message_id_by_timestamp))
        .route(&format!("{topic}/unload"), put(topic_ops::unload))
        .route(
            &format!("{topic}/compaction"),
            put(topic_ops::compact).get(topic_ops::compaction_status),
        )
        .route(&format!("{topic}/terminate"), post(topic_ops::terminate))
        .route(&format!("{topic}/terminate/partitions"), post(topic_ops::terminate_partitions))
        .route(
            &format!("{topic}/properties"),
            get(topic_ops::get_properties)
                .put(topic_ops::put_properties)
                .delete(topic_ops::delete_property),
        )
}

async fn not_found() -> AdminError {
    AdminError::NotFound("Not Found".to_string())
}

/// The raw (still percent-encoded) segments of a request path after `/admin/v2/`.
pub(crate) struct PathSegments<'a> {
    segments: Vec<&'a str>,
}

impl<'a> PathSegments<'a> {
    pub(crate) fn new(uri: &'a Uri) -> Self {
        Self::after(uri, "/admin/v2/")
    }

    /// The segments after `prefix` (e.g. `/lookup/v2/topic/`).
    pub(crate) fn after(uri: &'a Uri, prefix: &str) -> Self {
        let path = uri.path();
        let rest = path.find(prefix).map_or("", |i| &path[i + prefix.len()..]);
        PathSegments { segments: rest.split('/').collect() }
    }

    pub(crate) fn len(&self) -> usize {
        self.segments.len()
    }

    fn raw(&self, index: usize) -> Result<&'a str, AdminError> {
        self.segments
            .get(index)
            .copied()
            .ok_or_else(|| AdminError::NotFound("Not Found".to_string()))
    }

    /// Segment `index`, percent-decoded like a JAX-RS `@PathParam`.
    pub(crate) fn decoded(&self, index: usize) -> Result<Option<String>, AdminError> {
        Ok(decode_path_segment(self.raw(index)?))
    }

    /// The tenant and namespace at `index` and `index + 1`; 412 when invalid.
    pub(crate) fn namespace(&self, index: usize) -> Result<NamespaceName, AdminError> {
        let invalid = || AdminError::PreconditionFailed("Namespace name is not valid".to_string());
        let tenant = self.decoded(index)?.ok_or_else(invalid)?;
        let namespace = self.decoded(index + 1)?.ok_or_else(invalid)?;
        NamespaceName::new(&tenant, &namespace).map_err(|_| invalid())
    }

    /// For `/admin/v2/{domain}/{tenant}/{namespace}/…`: the domain and namespace.
    pub(crate) fn domain_namespace(&self) -> Result<(TopicDomain, NamespaceName), AdminError> {
        let domain = TopicDomain::parse(self.raw(0)?)
            .map_err(|_| AdminError::NotFound("Not Found".to_string()))?;
        Ok((domain, self.namespace(1)?))
    }

    /// For `/admin/v2/{domain}/{tenant}/{namespace}/{topic}…`: the topic, its segment decoded
    /// with Pulsar's `Codec.decode`; 412 when the namespace or topic name is invalid.
    pub(crate) fn topic(&self) -> Result<TopicName, AdminError> {
        let (domain, namespace) = self.domain_namespace()?;
        let invalid = || AdminError::PreconditionFailed("Topic name is not valid".to_string());
        let local = decode_topic_name(self.raw(3)?).ok_or_else(invalid)?;
        TopicName::new(domain, namespace, &local).map_err(|_| invalid())
    }
}

impl PathSegments<'_> {
    /// For `/admin/v2/schemas/{tenant}/{namespace}/{topic}/…`: the (persistent) topic; 412
    /// when a name is invalid.
    pub(crate) fn schema_topic(&self) -> Result<TopicName, AdminError> {
        let namespace = self.namespace(1)?;
        let invalid = || AdminError::PreconditionFailed("Topic name is not valid".to_string());
        let local = decode_topic_name(self.raw(3)?).ok_or_else(invalid)?;
        TopicName::new(TopicDomain::Persistent, namespace, &local).map_err(|_| invalid())
    }

    /// Raw segment `index` (for plain values such as a version number).
    pub(crate) fn segment(&self, index: usize) -> Result<&str, AdminError> {
        self.raw(index)
    }
}

/// The value of query parameter `name` (first occurrence), decoded like a form value.
pub(crate) fn query_param(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode_topic_name(k).as_deref() == Some(name)).then(|| decode_topic_name(v))?
    })
}

/// A boolean query parameter, parsed like Java's `Boolean.valueOf` (`true`, any case, is true;
/// anything else, or absence, is false).
pub(crate) fn query_bool(uri: &Uri, name: &str) -> bool {
    query_param(uri, name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Unwraps a body extraction, mapping axum's rejection (e.g. 413 for an oversized body).
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, AdminError> {
    body.map_err(|r| AdminError::Status(r.status(), r.body_text()))
}

/// Reads and decodes a JSON value; a value that does not decode is a 500 (corrupt metadata).
pub(crate) async fn get_json<T: DeserializeOwned>(
    state: &AdminState,
    key: &str,
) -> Result<Option<(T, u64)>, AdminError> {
    match state.store.get(key).await? {
        None => Ok(None),
        Some(Versioned { value, version }) => match serde_json::from_slice(&value) {
            Ok(v) => Ok(Some((v, version))),
            Err(e) => Err(AdminError::Internal(format!("Corrupt metadata at {key}: {e}"))),
        },
    }
}

/// How often a read-change-write of one document is tried before it is refused with 409: each
/// retry means another writer changed the document between our read and our write.
const UPDATE_ATTEMPTS: usize = 8;

/// Writes what `next` builds (from a fresh read of the document each time) at `key` by
/// compare-and-set, again when another writer changed the document in between. A document
/// deleted in between is `gone` (404); 409 after `UPDATE_ATTEMPTS` conflicts.
pub(crate) async fn update_document<F, Fut>(
    state: &AdminState,
    key: &str,
    gone: &str,
    mut next: F,
) -> Result<(), AdminError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(Bytes, ExpectedVersion), AdminError>>,
{
    for _ in 0..UPDATE_ATTEMPTS {
        let (bytes, expected) = next().await?;
        match state.store.put(key, bytes, expected).await {
            Ok(_) => return Ok(()),
            Err(MetadataError::BadVersion { .. }) => continue,
            Err(MetadataError::NotFound { .. }) => return Err(AdminError::NotFound(gone.into())),
            Err(e) => return Err(e.into()),
        }
    }
    Err(AdminError::Conflict(format!("Concurrent modification of {key}; try again")))
}

/// Serialises a value for the store.
pub(crate) fn to_json_bytes<T: serde::Serialize>(value: &T) -> Result<Bytes, AdminError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| AdminError::Internal(format!("cannot serialise metadata: {e}")))
}

/// Whether the namespace's key exists.
pub(crate) async fn namespace_exists(
    state: &AdminState,
    ns: &NamespaceName,
) -> Result<bool, AdminError> {
    Ok(state.store.get(&keys::namespace_key(ns)).await?.is_some())
}

/// 404 "Namespace does not exist" unless the namespace exists.
pub(crate) async fn require_namespace(
    state: &AdminState,
    ns: &NamespaceName,
) -> Result<(), AdminError> {
    if namespace_exists(state, ns).await? {
        Ok(())
    } else {
        Err(AdminError::NotFound("Namespace does not exist".to_string()))
    }
}

/// The partitioned-topic metadata of `topic` and its version, when it is partitioned.
pub(crate) async fn partitioned_metadata(
    state: &AdminState,
    topic: &TopicName,
) -> Result<Option<(PartitionedTopicMetadata, u64)>, AdminError> {
    get_json(state, &keys::partitioned_topic_key(topic)).await
}

/// Whether `topic` exists as a non-partitioned topic (or partition): its `/topics/…` key
/// exists, the broker reports it, or it is a partition `i < N` of a partitioned topic.
pub(crate) async fn topic_exists(
    state: &AdminState,
    topic: &TopicName,
) -> Result<bool, AdminError> {
    if state.store.get(&keys::topic_key(topic)).await?.is_some() {
        return Ok(true);
    }
    if state.hooks.topic_exists(topic).await? {
        return Ok(true);
    }
    if let Some(index) = topic.partition_index() {
        if let Some((meta, _)) = partitioned_metadata(state, &topic.partitioned_topic()).await? {
            return Ok(index < meta.partitions);
        }
    }
    Ok(false)
}

/// A 307 to `location`: Pulsar's answer when another broker serves what was asked (its clients
/// and `pulsar-admin` follow it, keeping the method and body).
pub(crate) fn temporary_redirect(location: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    (axum::http::StatusCode::TEMPORARY_REDIRECT, [(axum::http::header::LOCATION, location)])
        .into_response()
}
