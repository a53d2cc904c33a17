//! Topic endpoints under `/admin/v2/{persistent|non-persistent}/{tenant}/{namespace}`:
//! listing, partitioned-topic metadata (create / get / grow / delete) and non-partitioned
//! topic create / delete (delegated to the broker hooks).
//!
//! Status codes and messages follow Pulsar's `PersistentTopics` / `PersistentTopicsBase` /
//! `AdminResource` (Pulsar 3.x/4.x): 412 for invalid names, 406 for a partition count ≤ 0 or
//! above the limit, 409 for existing topics, 404 for missing namespaces / topics. The check
//! order matches Pulsar's so clients see the same error for the same request.

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::Json;
use magnetar_metadata::{ExpectedVersion, MetadataError};

use super::{
    body_bytes, partitioned_metadata, query_bool, query_param, require_namespace, to_json_bytes,
    topic_exists, PathSegments,
};
use crate::error::AdminError;
use crate::hooks::HookError;
use crate::model::{parse_partitions_body, PartitionedTopicMetadata};
use crate::AdminState;
use magnetar_broker::ownership::BrokerUrls;
use magnetar_broker::schema_registry::SchemaRegistry;
use magnetar_model::keys;
use magnetar_model::names::{
    decode_topic_name, is_system_topic, partition_index, NamespaceName, TopicDomain, TopicName,
    PARTITIONED_TOPIC_SUFFIX,
};

/// `GET /admin/v2/{domain}/{tenant}/{namespace}[?includeSystemTopic=true]`: every topic of
/// the namespace in that domain, partitions included (partitioned parents are not listed).
pub(crate) async fn list_topics(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Vec<String>>, AdminError> {
    let (domain, ns) = PathSegments::new(&uri).domain_namespace()?;
    require_namespace(&state, &ns).await?;
    let include_system = query_bool(&uri, "includeSystemTopic");
    let topics = collect_topics(&state, &ns, domain).await?;
    Ok(Json(render(topics, include_system)))
}

/// `GET /admin/v2/{domain}/{tenant}/{namespace}/partitioned`: the partitioned topics.
pub(crate) async fn list_partitioned_topics(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Vec<String>>, AdminError> {
    let (domain, ns) = PathSegments::new(&uri).domain_namespace()?;
    require_namespace(&state, &ns).await?;
    let include_system = query_bool(&uri, "includeSystemTopic");
    let names = partitioned_topic_names(&state, &ns, domain).await?;
    Ok(Json(render(names.into_iter().collect(), include_system)))
}

fn render(topics: BTreeSet<TopicName>, include_system: bool) -> Vec<String> {
    topics
        .into_iter()
        .filter(|t| include_system || !is_system_topic(t))
        .map(|t| t.to_string())
        .collect()
}

/// The partitioned topics of a namespace / domain, from their metadata keys.
pub(crate) async fn partitioned_topic_names(
    state: &AdminState,
    ns: &NamespaceName,
    domain: TopicDomain,
) -> Result<Vec<TopicName>, AdminError> {
    let parent = keys::partitioned_topics_of(ns.tenant(), ns.namespace(), domain);
    let children = state.store.list_children(&parent).await?;
    Ok(children
        .iter()
        .filter_map(|c| decode_topic_name(c))
        .filter_map(|local| TopicName::new(domain, ns.clone(), &local).ok())
        .collect())
}

/// All topics of a namespace / domain: the broker's `/topics/…` keys, what the broker hooks
/// report, and the partitions of every partitioned topic.
pub(crate) async fn collect_topics(
    state: &AdminState,
    ns: &NamespaceName,
    domain: TopicDomain,
) -> Result<BTreeSet<TopicName>, AdminError> {
    let mut out = BTreeSet::new();
    let parent = keys::topics_of(ns.tenant(), ns.namespace(), domain);
    for child in state.store.list_children(&parent).await? {
        if let Some(t) =
            decode_topic_name(&child).and_then(|l| TopicName::new(domain, ns.clone(), &l).ok())
        {
            out.insert(t);
        }
    }
    for name in state.hooks.list_topics(ns, domain).await? {
        let parsed = if name.contains("://") {
            TopicName::parse(&name)
        } else {
            TopicName::new(domain, ns.clone(), &name)
        };
        match parsed {
            Ok(t) if t.domain() == domain && t.namespace() == ns => {
                out.insert(t);
            }
            _ => tracing::debug!(%name, "ignoring topic reported by broker hooks"),
        }
    }
    for base in partitioned_topic_names(state, ns, domain).await? {
        if let Some((meta, _)) = partitioned_metadata(state, &base).await? {
            out.extend((0..meta.partitions).map(|i| base.partition(i)));
        }
    }
    Ok(out)
}

/// `PUT …/{topic}/partitions` with body `N`: creates a partitioned topic. 204; 400 bad body;
/// 412 invalid name or `-partition-` in it; 404 namespace missing; 406 `N` out of range;
/// 409 the topic already exists (partitioned or not) or partitions beyond `N` exist.
pub(crate) async fn create_partitioned(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let body = parse_partitions_body(&body_bytes(body)?)?;
    let segments = PathSegments::new(&uri);
    let (_, ns) = segments.domain_namespace()?;
    require_namespace(&state, &ns).await?;
    let topic = segments.topic()?;
    reject_partition_suffix(&topic)?;
    let partitions = check_partition_count(&state, body.partitions)?;

    if topic_exists(&state, &topic).await? {
        return Err(already_exists());
    }
    if topic.domain() == TopicDomain::Persistent {
        if let Some(max) = max_existing_partition_index(&state, &topic).await? {
            if max >= partitions {
                return Err(AdminError::Conflict(format!(
                    "The topic has a max partition index of {max}, the number of partitions \
                     must be at least {}",
                    u64::from(max) + 1
                )));
            }
        }
    }
    let meta = PartitionedTopicMetadata { partitions, properties: body.properties };
    match state
        .store
        .put(&keys::partitioned_topic_key(&topic), to_json_bytes(&meta)?, ExpectedVersion::Absent)
        .await
    {
        Ok(_) => {}
        Err(MetadataError::BadVersion { .. }) => return Err(already_exists()),
        Err(e) => return Err(e.into()),
    }
    tracing::info!(%topic, partitions, "created partitioned topic");
    state.hooks.partitions_updated(&topic, 0, partitions).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn already_exists() -> AdminError {
    AdminError::Conflict("This topic already exists".to_string())
}

fn reject_partition_suffix(topic: &TopicName) -> Result<(), AdminError> {
    if topic.local_name().contains(PARTITIONED_TOPIC_SUFFIX) {
        return Err(AdminError::PreconditionFailed(
            "Partitioned Topic Name should not contain '-partition-'".to_string(),
        ));
    }
    Ok(())
}

/// 406 unless `0 < n <= max` (Pulsar's checks for a new partitioned topic).
fn check_partition_count(state: &AdminState, n: i64) -> Result<u32, AdminError> {
    if n <= 0 {
        return Err(AdminError::NotAcceptable(
            "Number of partitions should be more than 0".to_string(),
        ));
    }
    let max = state.max_partitions_per_topic;
    match u32::try_from(n) {
        Ok(n) if max == 0 || n <= max => Ok(n),
        _ => Err(AdminError::NotAcceptable(format!(
            "Number of partitions should be less than or equal to {max}"
        ))),
    }
}

/// The highest `i` among existing broker topics named `{topic}-partition-{i}` (Pulsar refuses
/// to create a partitioned topic that would not cover them).
async fn max_existing_partition_index(
    state: &AdminState,
    topic: &TopicName,
) -> Result<Option<u32>, AdminError> {
    let ns = topic.namespace();
    let parent = keys::topics_of(ns.tenant(), ns.namespace(), topic.domain());
    let prefix = format!("{}{PARTITIONED_TOPIC_SUFFIX}", topic.local_name());
    let mut max = None;
    for child in state.store.list_children(&parent).await? {
        let Some(local) = decode_topic_name(&child) else {
            continue;
        };
        let Some(rest) = local.strip_prefix(&prefix) else {
            continue;
        };
        // `rest` must be exactly the index: `{topic}-partition-x-partition-1` is not ours.
        if rest.contains(PARTITIONED_TOPIC_SUFFIX) {
            continue;
        }
        if let Some(i) = partition_index(&local) {
            max = max.max(Some(i));
        }
    }
    Ok(max)
}

/// `GET …/{topic}/partitions[?checkAllowAutoCreation=true]`: `{"partitions":N}`. For a topic
/// that is not partitioned: `{"partitions":0}` when it exists as a non-partitioned topic or
/// when `checkAllowAutoCreation` is set (a client lookup, which may auto-create it), else 404.
pub(crate) async fn get_partitioned(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<PartitionedTopicMetadata>, AdminError> {
    let topic = PathSegments::new(&uri).topic()?;
    require_namespace(&state, topic.namespace()).await?;
    if let Some((meta, _)) = partitioned_metadata(&state, &topic).await? {
        return Ok(Json(meta));
    }
    if query_bool(&uri, "checkAllowAutoCreation") || topic_exists(&state, &topic).await? {
        return Ok(Json(PartitionedTopicMetadata::new(0)));
    }
    Err(AdminError::NotFound(format!("Topic {topic} not found")))
}

/// `POST …/{topic}/partitions` with body `N`: grows a partitioned topic. 204 (also when `N`
/// equals the current count, as Pulsar); 400 bad body; 412 invalid name; 406 `N` ≤ 0;
/// 409 not a partitioned topic or concurrent update; 422 `N` below the current count or above
/// the limit.
pub(crate) async fn update_partitioned(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let body = parse_partitions_body(&body_bytes(body)?)?;
    let topic = PathSegments::new(&uri).topic()?;
    reject_partition_suffix(&topic)?;
    if body.partitions <= 0 {
        return Err(AdminError::NotAcceptable(
            "Number of partitions should be more than 0".to_string(),
        ));
    }
    let Some((mut meta, version)) = partitioned_metadata(&state, &topic).await? else {
        return Err(AdminError::Conflict(format!("Topic {topic} is not the partitioned topic.")));
    };
    let current = meta.partitions;
    let expected = body.partitions;
    if expected < i64::from(current) {
        return Err(AdminError::Unprocessable(format!(
            "Expect partitions {expected} can't less than current partitions {current}."
        )));
    }
    let max = state.max_partitions_per_topic;
    let new = match u32::try_from(expected) {
        Ok(n) if max == 0 || n <= max => n,
        _ => {
            return Err(AdminError::Unprocessable(format!(
                "Expect partitions {expected} grater than maximum partitions per topic {max}"
            )))
        }
    };
    if new == current {
        return Ok(StatusCode::NO_CONTENT);
    }
    meta.partitions = new;
    if let Some(props) = body.properties {
        meta.properties = Some(props);
    }
    match state
        .store
        .put(
            &keys::partitioned_topic_key(&topic),
            to_json_bytes(&meta)?,
            ExpectedVersion::Exactly(version),
        )
        .await
    {
        Ok(_) => {}
        Err(MetadataError::BadVersion { actual: None, .. }) => {
            return Err(AdminError::Conflict(format!(
                "Topic {topic} is not the partitioned topic."
            )))
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(%topic, current, new, "updated partitioned topic");
    state.hooks.partitions_updated(&topic, current, new).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/{topic}/partitions[?force=true]`: deletes every partition (through the broker
/// hooks, missing partitions ignored) and then the metadata. 204; 412 invalid name;
/// 404 no such topic; 409 the topic is non-partitioned, or concurrent modification; hook
/// errors (e.g. 412 active producers) abort before the metadata is removed.
pub(crate) async fn delete_partitioned(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = PathSegments::new(&uri).topic()?;
    let force = query_bool(&uri, "force");
    let Some((meta, version)) = partitioned_metadata(&state, &topic).await? else {
        if topic_exists(&state, &topic).await? {
            return Err(AdminError::Conflict(format!(
                "{topic} is a non-partitioned topic. Instead of calling delete-partitioned-topic \
                 please call delete."
            )));
        }
        return Err(AdminError::NotFound(format!("Topic {topic} not found.")));
    };
    for i in 0..meta.partitions {
        match state.hooks.delete_topic(&topic.partition(i), force).await {
            Ok(()) | Err(HookError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match state
        .store
        .delete(&keys::partitioned_topic_key(&topic), ExpectedVersion::Exactly(version))
        .await
    {
        Ok(()) => {}
        Err(MetadataError::NotFound { .. }) => {
            return Err(AdminError::NotFound(format!("Partitioned Topic {topic} not found")))
        }
        Err(e) => return Err(e.into()),
    }
    // The partitions share this schema; it goes with the topic (Pulsar's deleteSchema).
    SchemaRegistry::new(state.store.clone()).delete(&topic, true).await?;
    tracing::info!(%topic, "deleted partitioned topic");
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT …/{topic}`: creates a non-partitioned topic through the broker hooks. 204;
/// 412 invalid name; 404 namespace missing; 409 a topic (partitioned or not) of that name
/// exists. The optional properties body is ignored.
pub(crate) async fn create_topic(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    // Pulsar's `createNonPartitionedTopic` takes the topic's properties as its body (the Go
    // admin client's `CreateWithProperties`); none, `null` or `{}` is no properties.
    let body = body_bytes(body)?;
    let properties: Option<BTreeMap<String, String>> = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| AdminError::BadRequest(format!("Invalid properties: {e}")))?
    };
    let segments = PathSegments::new(&uri);
    let (_, ns) = segments.domain_namespace()?;
    require_namespace(&state, &ns).await?;
    let topic = segments.topic()?;
    if partitioned_metadata(&state, &topic).await?.is_some() || topic_exists(&state, &topic).await?
    {
        return Err(already_exists());
    }
    state.hooks.create_topic(&topic).await?;
    if let Some(properties) = properties.filter(|p| !p.is_empty()) {
        let key = keys::topic_key(&topic);
        super::topic_ops::update_properties(&state, &key, |current| {
            current.extend(properties.iter().map(|(k, v)| (k.clone(), v.clone())))
        })
        .await?;
    }
    tracing::info!(%topic, "created non-partitioned topic");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/{topic}[?force=true]`: deletes a non-partitioned topic (or one partition) through
/// the broker hooks. 204; 412 invalid name; 404 not found; hook errors as reported.
pub(crate) async fn delete_topic(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = PathSegments::new(&uri).topic()?;
    let force = query_bool(&uri, "force");
    if !topic_exists(&state, &topic).await? {
        return Err(AdminError::NotFound(format!("Topic {topic} not found")));
    }
    state.hooks.delete_topic(&topic, force).await?;
    // A partition leaves the schema to its partitioned topic, as Pulsar's deleteSchema does.
    if topic.partition_index().is_none() {
        SchemaRegistry::new(state.store.clone()).delete(&topic, true).await?;
    }
    tracing::info!(%topic, "deleted topic");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}`: the broker that serves the
/// topic, as Pulsar's `TopicLookup` answers clients configured with an HTTP service URL
/// (`LookupData`): this broker, the owner of the topic's bundle, or (a free bundle) a 307 to the
/// broker chosen to take it, with `authoritative=true`. 412 invalid name; 404 namespace missing.
pub(crate) async fn lookup(
    State(state): State<AdminState>,
    uri: Uri,
    headers: axum::http::HeaderMap,
) -> Result<axum::response::Response, AdminError> {
    use axum::response::IntoResponse;
    let topic = PathSegments::after(&uri, "/lookup/v2/topic/").topic()?;
    require_namespace(&state, topic.namespace()).await?;
    let authoritative = query_param(&uri, "authoritative").is_some_and(|v| v == "true");
    // Pulsar's `TopicLookup`: the `listenerName` parameter, else the `X-Pulsar-ListenerName`
    // header; a listener the owner does not have is a server error (500), as in Pulsar.
    let named = query_param(&uri, "listenerName").filter(|n| !n.is_empty()).or_else(|| {
        headers.get("X-Pulsar-ListenerName").and_then(|v| v.to_str().ok()).map(str::to_string)
    });
    let owner = state.hooks.topic_owner(&topic, authoritative).await?;
    if let Some(owner) = owner.as_ref().filter(|owner| owner.redirect) {
        // The redirected request keeps its `listenerName` (or header) for the next broker.
        let mut query: Vec<&str> = (uri.query().unwrap_or_default().split('&'))
            .filter(|p| !p.is_empty() && !p.starts_with("authoritative="))
            .collect();
        query.push("authoritative=true");
        let location = format!("{}{}?{}", owner.web_url, uri.path(), query.join("&"));
        return Ok(super::temporary_redirect(&location));
    }
    // The owner's URLs (another broker's, or this one's), as the listener named sees them.
    let urls = match owner {
        Some(o) => BrokerUrls {
            broker_url: o.broker_url,
            broker_url_tls: o.broker_url_tls,
            web_url: Some(o.web_url),
            web_url_tls: o.web_url_tls,
            listeners: o.listeners,
        },
        None => BrokerUrls {
            broker_url: state.broker_service_url.clone().unwrap_or_default(),
            broker_url_tls: state.broker_service_url_tls.clone(),
            web_url: state.service_url.clone(),
            web_url_tls: state.service_url_tls.clone(),
            listeners: state.listeners.clone(),
        },
    };
    let urls = urls.for_listener(named.as_deref()).map_err(AdminError::Internal)?;
    Ok(Json(serde_json::json!({
        "brokerUrl": urls.broker_url.clone(),
        "brokerUrlTls": urls.broker_url_tls.unwrap_or_default(),
        "httpUrl": urls.web_url.unwrap_or_default(),
        "httpUrlTls": urls.web_url_tls.unwrap_or_default(),
        "nativeUrl": urls.broker_url,
    }))
    .into_response())
}
