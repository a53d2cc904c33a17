//! Operations on one topic under `/admin/v2/{persistent|non-persistent}/{t}/{ns}/{topic}/…`:
//! stats, internal stats, partitioned stats, subscriptions (list, create, delete, skip, clear
//! backlog, reset cursor, peek), examine / get-by-id, last message id, unload, terminate and
//! topic properties.
//!
//! As Pulsar's `PersistentTopicsBase`: an operation on a partitioned topic's name fans out to
//! its partitions where Pulsar does (subscriptions, create / delete subscription, clear
//! backlog, reset cursor by time, unload, `terminate/partitions`) and is refused with 405
//! where Pulsar refuses it (skip, peek, last message id, terminate). Non-persistent topics
//! answer stats, subscriptions and unload; the rest is 405 there. Missing topics are 404
//! "Topic not found", missing subscriptions 404 "Subscription not found", a subscription
//! with consumers 412 on a non-forced delete, an existing one 409 on create.

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use axum::Json;
use magnetar_broker::cursor::Position;
use magnetar_broker::stats::{AdminMessage, InternalStats, TopicStats};
use magnetar_metadata::ExpectedVersion;
use magnetar_model::keys;
use magnetar_model::names::{decode_topic_name, TopicDomain, TopicName};
use serde::Deserialize;

use super::{
    body_bytes, get_json, partitioned_metadata, query_bool, query_param, require_namespace,
    to_json_bytes, topic_exists, update_document, PathSegments,
};
use crate::error::AdminError;
use crate::hooks::{ExaminePosition, HookError, ResetTarget, SubscriptionStart};
use crate::AdminState;

/// Index of the segment after `{topic}` in `/admin/v2/{d}/{t}/{ns}/{topic}/…`.
const OP: usize = 4;

fn topic_not_found() -> AdminError {
    AdminError::NotFound("Topic not found".to_string())
}

fn not_allowed(what: &str) -> AdminError {
    AdminError::MethodNotAllowed(format!("{what} on a partitioned topic is not allowed"))
}

fn persistent_only(topic: &TopicName) -> Result<(), AdminError> {
    if topic.domain() == TopicDomain::NonPersistent {
        return Err(AdminError::MethodNotAllowed(
            "This operation is not supported on non-persistent topics".to_string(),
        ));
    }
    Ok(())
}

/// The topic of the request, its namespace checked.
async fn request_topic(state: &AdminState, uri: &Uri) -> Result<TopicName, AdminError> {
    let topic = PathSegments::new(uri).topic()?;
    require_namespace(state, topic.namespace()).await?;
    Ok(topic)
}

/// The partition count when `topic` is a partitioned topic.
async fn partition_count(state: &AdminState, topic: &TopicName) -> Result<Option<u32>, AdminError> {
    if topic.partition_index().is_some() {
        return Ok(None);
    }
    Ok(partitioned_metadata(state, topic).await?.map(|(meta, _)| meta.partitions))
}

/// 404 unless the (non-partitioned) topic or partition exists.
async fn require_topic(state: &AdminState, topic: &TopicName) -> Result<(), AdminError> {
    if topic_exists(state, topic).await? {
        Ok(())
    } else {
        Err(topic_not_found())
    }
}

/// The decoded subscription name at segment `OP + 1` (`…/subscription/{sub}/…`).
fn subscription_name(uri: &Uri) -> Result<String, AdminError> {
    let raw = PathSegments::new(uri).segment(OP + 1)?.to_string();
    decode_topic_name(&raw)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| AdminError::PreconditionFailed("Subscription name is not valid".into()))
}

fn number_segment(uri: &Uri, index: usize) -> Result<u64, AdminError> {
    let raw = PathSegments::new(uri).segment(index)?.to_string();
    raw.parse::<u64>().map_err(|_| AdminError::BadRequest(format!("Invalid number: {raw}")))
}

/// `GET …/{topic}/stats`: `TopicStats`. 404 for a missing topic (or a partitioned topic's
/// name: use `partitioned-stats`).
pub(crate) async fn stats(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<TopicStats>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    if topic.domain() == TopicDomain::Persistent {
        require_topic(&state, &topic).await?;
    }
    let mut stats = state.hooks.topic_stats(&topic).await?;
    leave_out(&mut stats, &StatsOptions::of(&uri));
    Ok(Json(stats))
}

/// What the stats query leaves out (`excludePublishers`, `excludeConsumers`: Pulsar's
/// `GetStatsOptions`; the Go admin client sends them).
struct StatsOptions {
    exclude_publishers: bool,
    exclude_consumers: bool,
}

impl StatsOptions {
    fn of(uri: &Uri) -> Self {
        StatsOptions {
            exclude_publishers: query_bool(uri, "excludePublishers"),
            exclude_consumers: query_bool(uri, "excludeConsumers"),
        }
    }
}

fn leave_out(stats: &mut TopicStats, options: &StatsOptions) {
    if options.exclude_publishers {
        stats.publishers.clear();
    }
    if options.exclude_consumers {
        for subscription in stats.subscriptions.values_mut() {
            subscription.consumers.clear();
        }
    }
    for partition in stats.partitions.iter_mut().flat_map(|p| p.values_mut()) {
        leave_out(partition, options);
    }
}

/// `GET …/{topic}/internalStats`: `PersistentTopicInternalStats`.
pub(crate) async fn internal_stats(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<InternalStats>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    require_topic(&state, &topic).await?;
    Ok(Json(state.hooks.topic_internal_stats(&topic).await?))
}

/// `GET …/{topic}/partitioned-stats[?perPartition=true]`: the partitions' stats added up,
/// with `metadata` and (per partition) `partitions`. A partition nobody used yet counts as
/// empty. 404 when the topic is not partitioned.
pub(crate) async fn partitioned_stats(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<TopicStats>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    let Some(partitions) = partition_count(&state, &topic).await? else {
        return Err(AdminError::NotFound(format!("Partitioned Topic not found: {topic}")));
    };
    // Pulsar's default for perPartition is true.
    let per_partition =
        query_param(&uri, "perPartition").is_none_or(|v| v.eq_ignore_ascii_case("true"));
    let mut total = TopicStats::default();
    let mut each = BTreeMap::new();
    for i in 0..partitions {
        let partition = topic.partition(i);
        let stats = match state.hooks.topic_stats(&partition).await {
            Ok(stats) => stats,
            Err(HookError::NotFound(_)) => TopicStats::default(),
            Err(e) => return Err(e.into()),
        };
        total.add(&stats);
        if per_partition {
            each.insert(partition.to_string(), stats);
        }
    }
    total.metadata = Some(serde_json::json!({ "partitions": partitions }));
    if per_partition {
        total.partitions = Some(each);
    }
    leave_out(&mut total, &StatsOptions::of(&uri));
    Ok(Json(total))
}

/// `GET …/{topic}/partitioned-internalStats`: `{"metadata":{"partitions":N},"partitions":
/// {name: PersistentTopicInternalStats}}` (partitions nobody used are left out).
pub(crate) async fn partitioned_internal_stats(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let Some(partitions) = partition_count(&state, &topic).await? else {
        return Err(AdminError::NotFound(format!("Partitioned Topic not found: {topic}")));
    };
    let mut each = serde_json::Map::new();
    for i in 0..partitions {
        let partition = topic.partition(i);
        match state.hooks.topic_internal_stats(&partition).await {
            Ok(stats) => {
                let value =
                    serde_json::to_value(stats).map_err(|e| AdminError::Internal(e.to_string()))?;
                each.insert(partition.to_string(), value);
            }
            Err(HookError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Json(serde_json::json!({ "metadata": { "partitions": partitions }, "partitions": each })))
}

/// `GET …/{topic}/subscriptions`: subscription names (a partitioned topic: those of any
/// partition).
pub(crate) async fn list_subscriptions(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Vec<String>>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    if let Some(partitions) = partition_count(&state, &topic).await? {
        let mut names = std::collections::BTreeSet::new();
        for i in 0..partitions {
            match state.hooks.subscriptions(&topic.partition(i)).await {
                Ok(found) => names.extend(found),
                Err(HookError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(Json(names.into_iter().collect()));
    }
    if topic.domain() == TopicDomain::Persistent {
        require_topic(&state, &topic).await?;
    }
    Ok(Json(state.hooks.subscriptions(&topic).await?))
}

/// A `MessageIdImpl` or `ResetCursorData` body.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageIdBody {
    ledger_id: Option<i64>,
    entry_id: Option<i64>,
    #[serde(default)]
    partition_index: Option<i32>,
    #[serde(default, alias = "isExcluded")]
    excluded: bool,
}

impl MessageIdBody {
    fn parse(body: &[u8]) -> Result<Option<MessageIdBody>, AdminError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        serde_json::from_slice(body)
            .map(Some)
            .map_err(|e| AdminError::BadRequest(format!("Invalid message id: {e}")))
    }

    /// Earliest for `(-1, -1)`, latest for `(i64::MAX, i64::MAX)`, else the entry (delivered
    /// first, or, excluded, the one after it).
    fn start(&self) -> SubscriptionStart {
        match (self.ledger_id, self.entry_id) {
            (Some(l), _) if l < 0 => SubscriptionStart::Earliest,
            (Some(l), _) if l == i64::MAX => SubscriptionStart::Latest,
            (Some(l), e) => {
                let position = Position::new(l as u64, e.unwrap_or(0).max(0) as u64);
                if self.excluded {
                    SubscriptionStart::After(position)
                } else {
                    SubscriptionStart::At(position)
                }
            }
            (None, _) => SubscriptionStart::Latest,
        }
    }
}

/// `PUT …/{topic}/subscription/{sub}[?replicated=…]` with an optional `MessageId` /
/// `ResetCursorData` body (latest by default): creates a durable subscription, on every
/// partition of a partitioned topic. 204; 409 it exists; 404 no such topic.
pub(crate) async fn create_subscription(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let body = body_bytes(body)?;
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let name = subscription_name(&uri)?;
    let start = MessageIdBody::parse(&body)?.map_or(SubscriptionStart::Latest, |b| b.start());
    if let Some(partitions) = partition_count(&state, &topic).await? {
        for i in 0..partitions {
            state.hooks.create_subscription(&topic.partition(i), &name, start).await?;
        }
        return Ok(StatusCode::NO_CONTENT);
    }
    require_topic(&state, &topic).await?;
    state.hooks.create_subscription(&topic, &name, start).await?;
    tracing::info!(%topic, subscription = %name, ?start, "subscription created");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/{topic}/subscription/{sub}[?force=true]`: unsubscribes (every partition of a
/// partitioned topic). 204; 404 no such topic or subscription; 412 consumers connected.
pub(crate) async fn delete_subscription(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let name = subscription_name(&uri)?;
    let force = query_bool(&uri, "force");
    if let Some(partitions) = partition_count(&state, &topic).await? {
        let mut found = false;
        for i in 0..partitions {
            match state.hooks.delete_subscription(&topic.partition(i), &name, force).await {
                Ok(()) => found = true,
                Err(HookError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        return if found {
            Ok(StatusCode::NO_CONTENT)
        } else {
            Err(AdminError::NotFound("Subscription not found".into()))
        };
    }
    require_topic(&state, &topic).await?;
    state.hooks.delete_subscription(&topic, &name, force).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/subscription/{sub}/skip/{n}`: skips the next `n` unacknowledged entries. 204;
/// 404; 405 on a partitioned topic.
pub(crate) async fn skip(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let name = subscription_name(&uri)?;
    let n = number_segment(&uri, OP + 3)?;
    if partition_count(&state, &topic).await?.is_some() {
        return Err(not_allowed("Skip messages"));
    }
    require_topic(&state, &topic).await?;
    state.hooks.skip_messages(&topic, &name, Some(n)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/subscription/{sub}/skip_all`: clears the subscription's backlog (every partition
/// of a partitioned topic). 204; 404.
pub(crate) async fn skip_all(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let name = subscription_name(&uri)?;
    if let Some(partitions) = partition_count(&state, &topic).await? {
        for i in 0..partitions {
            match state.hooks.skip_messages(&topic.partition(i), &name, None).await {
                Ok(()) | Err(HookError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(StatusCode::NO_CONTENT);
    }
    require_topic(&state, &topic).await?;
    state.hooks.skip_messages(&topic, &name, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/subscription/{sub}/resetcursor/{timestamp}`: the subscription starts again at the
/// first entry published at or after `timestamp` (ms); every partition of a partitioned topic.
pub(crate) async fn reset_cursor_to_time(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let name = subscription_name(&uri)?;
    let time = number_segment(&uri, OP + 3)?;
    let target = ResetTarget::PublishTime(time);
    if let Some(partitions) = partition_count(&state, &topic).await? {
        for i in 0..partitions {
            match state.hooks.reset_cursor(&topic.partition(i), &name, target).await {
                Ok(()) | Err(HookError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(StatusCode::NO_CONTENT);
    }
    require_topic(&state, &topic).await?;
    state.hooks.reset_cursor(&topic, &name, target).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/subscription/{sub}/resetcursor` with `ResetCursorData` (`ledgerId`, `entryId`,
/// `partitionIndex`, `excluded`): the subscription starts again at that entry (after it when
/// excluded). On a partitioned topic the id's partition is reset.
pub(crate) async fn reset_cursor_to_id(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let body = body_bytes(body)?;
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let name = subscription_name(&uri)?;
    let id = MessageIdBody::parse(&body)?
        .ok_or_else(|| AdminError::BadRequest("A message id is required".into()))?;
    let target = ResetTarget::Position(id.start());
    let topic = match partition_count(&state, &topic).await? {
        Some(partitions) => match id.partition_index {
            Some(i) if i >= 0 && (i as u32) < partitions => topic.partition(i as u32),
            _ => return Err(not_allowed("Reset cursor to a message id without its partition")),
        },
        None => topic,
    };
    require_topic(&state, &topic).await?;
    state.hooks.reset_cursor(&topic, &name, target).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// An entry as Pulsar returns it: 200, `X-Pulsar-*` headers, the payload as the body.
fn message_response(message: AdminMessage) -> Response {
    let mut response = Response::new(Body::from(message.payload));
    let headers = response.headers_mut();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    for (name, value) in message.headers {
        if let (Ok(name), Ok(value)) =
            (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str()))
        {
            headers.append(name, value);
        }
    }
    response
}

/// `GET …/subscription/{sub}/position/{n}`: the `n`th unacknowledged entry (peek). 404
/// "Message not found" past the end; 405 on a partitioned topic.
pub(crate) async fn peek(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Response, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let name = subscription_name(&uri)?;
    let n = number_segment(&uri, OP + 3)?;
    if partition_count(&state, &topic).await?.is_some() {
        return Err(not_allowed("Peek messages"));
    }
    require_topic(&state, &topic).await?;
    Ok(message_response(state.hooks.peek_message(&topic, &name, n).await?))
}

/// `GET …/examinemessage?initialPosition=earliest|latest&messagePosition=n`: the `n`th entry
/// (from 1) from the first or from the last. 400 bad parameters; 404; 405 partitioned.
pub(crate) async fn examine(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Response, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let from = match query_param(&uri, "initialPosition").as_deref() {
        None | Some("latest") => ExaminePosition::Latest,
        Some("earliest") => ExaminePosition::Earliest,
        Some(other) => {
            return Err(AdminError::BadRequest(format!(
                "Invalid initialPosition {other}, it should be latest or earliest"
            )))
        }
    };
    let n = match query_param(&uri, "messagePosition") {
        None => 1,
        Some(raw) => raw.parse::<u64>().ok().filter(|&n| n >= 1).ok_or_else(|| {
            AdminError::BadRequest("Invalid messagePosition, it should be at least 1".into())
        })?,
    };
    if partition_count(&state, &topic).await?.is_some() {
        return Err(not_allowed("Examine message"));
    }
    require_topic(&state, &topic).await?;
    Ok(message_response(state.hooks.examine_message(&topic, from, n).await?))
}

/// `GET …/ledger/{ledger}/entry/{entry}`: that entry. 404 "Message not found".
pub(crate) async fn get_message(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Response, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let ledger = number_segment(&uri, OP + 1)?;
    let entry = number_segment(&uri, OP + 3)?;
    if partition_count(&state, &topic).await?.is_some() {
        return Err(not_allowed("Get message by id"));
    }
    require_topic(&state, &topic).await?;
    Ok(message_response(state.hooks.get_message(&topic, ledger, entry).await?))
}

fn message_id_json(topic: &TopicName, (ledger, entry): (u64, i64)) -> serde_json::Value {
    serde_json::json!({
        "ledgerId": ledger,
        "entryId": entry,
        "partitionIndex": topic.partition_index().map_or(-1, i64::from),
        "batchIndex": -1,
    })
}

/// `GET …/lastMessageId`: `{"ledgerId":…,"entryId":…,"partitionIndex":…}` (`entryId` -1
/// without entries). 405 on a partitioned topic.
pub(crate) async fn last_message_id(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    if partition_count(&state, &topic).await?.is_some() {
        return Err(not_allowed("Get last message id"));
    }
    require_topic(&state, &topic).await?;
    let id = state.hooks.last_message_id(&topic).await?;
    Ok(Json(message_id_json(&topic, id)))
}

/// `GET …/messageid/{timestamp}`: the id of the first message published at or after
/// `timestamp` (ms), as `lastMessageId` writes ids. 404 "Message ID not found" when every
/// message is older; 405 on a partitioned topic (ask a partition) or a non-persistent one.
pub(crate) async fn message_id_by_timestamp(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    if topic.domain() == TopicDomain::NonPersistent {
        return Err(AdminError::MethodNotAllowed(
            "Get message ID by timestamp on a non-persistent topic is not allowed".into(),
        ));
    }
    let raw = PathSegments::new(&uri).segment(OP + 1)?.to_string();
    // JAX-RS answers a path parameter that is not a `long` with 404.
    let timestamp: i64 = raw.parse().map_err(|_| AdminError::NotFound("Not Found".into()))?;
    if partition_count(&state, &topic).await?.is_some() {
        return Err(AdminError::MethodNotAllowed(
            "Get message ID by timestamp on a partitioned topic is not allowed, please try do it \
             on specific topic partition"
                .into(),
        ));
    }
    require_topic(&state, &topic).await?;
    let publish_time = u64::try_from(timestamp).unwrap_or(0);
    match state.hooks.message_id_by_publish_time(&topic, publish_time).await? {
        Some((ledger, entry)) => Ok(Json(message_id_json(&topic, (ledger, entry as i64)))),
        None => Err(AdminError::NotFound("Message ID not found".into())),
    }
}

/// `PUT …/compaction` (`pulsar-admin topics compact`): starts a compaction run in the
/// background; 204. A partitioned topic's partitions each start one. 409 "Compaction already
/// in progress"; 404 on a missing topic, then 405 on a non-persistent one.
pub(crate) async fn compact(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    // Existence first: a missing topic is 404 whatever its domain (as Pulsar answers).
    if let Some(partitions) = partition_count(&state, &topic).await? {
        persistent_only(&topic)?;
        for i in 0..partitions {
            state.hooks.compact_topic(&topic.partition(i)).await?;
        }
        return Ok(StatusCode::NO_CONTENT);
    }
    require_topic(&state, &topic).await?;
    persistent_only(&topic)?;
    state.hooks.compact_topic(&topic).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET …/compaction` (`pulsar-admin topics compaction-status`): Pulsar's
/// `LongRunningProcessStatus`, `{"status": "NOT_RUN|RUNNING|SUCCESS|ERROR", "lastError": ""}`.
pub(crate) async fn compaction_status(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    require_topic(&state, &topic).await?;
    persistent_only(&topic)?;
    let (status, last_error) = state.hooks.compaction_status(&topic).await?;
    Ok(Json(serde_json::json!({ "status": status, "lastError": last_error })))
}

/// `PUT …/unload`: closes the topic's producers and consumers and drops it from the broker
/// (every partition of a partitioned topic); clients reconnect and carry on. 204; 404.
pub(crate) async fn unload(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    if let Some(partitions) = partition_count(&state, &topic).await? {
        for i in 0..partitions {
            state.hooks.unload_topic(&topic.partition(i)).await?;
        }
        return Ok(StatusCode::NO_CONTENT);
    }
    require_topic(&state, &topic).await?;
    state.hooks.unload_topic(&topic).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/terminate`: seals the topic; 200 with its last message id. 405 on a partitioned
/// topic (use `terminate/partitions`) or a non-persistent one; 404.
pub(crate) async fn terminate(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    if partition_count(&state, &topic).await?.is_some() {
        return Err(AdminError::MethodNotAllowed(
            "Termination of a partitioned topic is not allowed".into(),
        ));
    }
    require_topic(&state, &topic).await?;
    let id = state.hooks.terminate_topic(&topic).await?;
    tracing::info!(%topic, ?id, "topic terminated");
    Ok(Json(message_id_json(&topic, id)))
}

/// `POST …/terminate/partitions`: terminates every partition; 200 with
/// `{partition index: message id}`. 404 when not partitioned.
pub(crate) async fn terminate_partitions(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let Some(partitions) = partition_count(&state, &topic).await? else {
        return Err(AdminError::NotFound(format!("Partitioned Topic not found: {topic}")));
    };
    let mut out = serde_json::Map::new();
    for i in 0..partitions {
        let partition = topic.partition(i);
        match state.hooks.terminate_topic(&partition).await {
            Ok(id) => {
                out.insert(i.to_string(), message_id_json(&partition, id));
            }
            Err(HookError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Json(serde_json::Value::Object(out)))
}

/// Where a topic's properties live: a partitioned topic's in its metadata, a non-partitioned
/// topic's (or partition's) in its `/topics/…` value (`{"properties":{…}}`).
async fn properties_key(state: &AdminState, topic: &TopicName) -> Result<String, AdminError> {
    if partition_count(state, topic).await?.is_some() {
        return Ok(keys::partitioned_topic_key(topic));
    }
    let key = keys::topic_key(topic);
    if state.store.get(&key).await?.is_none() {
        return Err(topic_not_found());
    }
    Ok(key)
}

/// Reads the properties at `key`; `(properties, whole document, version)`.
async fn read_properties(
    state: &AdminState,
    key: &str,
) -> Result<(BTreeMap<String, String>, serde_json::Value, u64), AdminError> {
    let Some((document, version)) = get_json::<serde_json::Value>(state, key).await? else {
        return Err(topic_not_found());
    };
    let properties = document
        .get("properties")
        .and_then(|p| serde_json::from_value(p.clone()).ok())
        .unwrap_or_default();
    Ok((properties, document, version))
}

/// `GET …/properties`: the topic's properties (`{}` when none).
pub(crate) async fn get_properties(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<BTreeMap<String, String>>, AdminError> {
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let key = properties_key(&state, &topic).await?;
    Ok(Json(read_properties(&state, &key).await?.0))
}

/// Applies `change` to the properties at `key` by compare-and-set (retried on a conflict).
pub(crate) async fn update_properties(
    state: &AdminState,
    key: &str,
    change: impl Fn(&mut BTreeMap<String, String>),
) -> Result<(), AdminError> {
    update_document(state, key, "Topic not found", || async {
        let (mut properties, mut document, version) = read_properties(state, key).await?;
        change(&mut properties);
        if !document.is_object() {
            document = serde_json::json!({});
        }
        document["properties"] =
            serde_json::to_value(&properties).map_err(|e| AdminError::Internal(e.to_string()))?;
        Ok((to_json_bytes(&document)?, ExpectedVersion::Exactly(version)))
    })
    .await
}

/// `PUT …/properties` with a JSON object of strings: adds or replaces those properties. 204.
pub(crate) async fn put_properties(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let body = body_bytes(body)?;
    let added: BTreeMap<String, String> = serde_json::from_slice(&body)
        .map_err(|e| AdminError::BadRequest(format!("Invalid properties: {e}")))?;
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let key = properties_key(&state, &topic).await?;
    update_properties(&state, &key, |properties| {
        properties.extend(added.iter().map(|(k, v)| (k.clone(), v.clone())))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE …/properties?key=k`: removes one property. 204; 400 without `key`.
pub(crate) async fn delete_property(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let name = query_param(&uri, "key")
        .ok_or_else(|| AdminError::BadRequest("The key of the property is required".into()))?;
    let topic = request_topic(&state, &uri).await?;
    persistent_only(&topic)?;
    let key = properties_key(&state, &topic).await?;
    update_properties(&state, &key, |properties| {
        properties.remove(&name);
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
