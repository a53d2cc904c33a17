//! On-demand message expiry, Pulsar's paths under `/admin/v2/{domain}/{t}/{ns}/{topic}`:
//! - `POST …/subscription/{sub}/expireMessages/{expireTimeInSeconds}`: acknowledges on `sub`
//!   every message published more than that many seconds ago;
//! - `POST …/subscription/{sub}/expireMessages` with a message id body (`ResetCursorData`:
//!   `ledgerId`, `entryId`, `partitionIndex`, `isExcluded`): up to that message;
//! - `POST …/all_subscription/expireMessages/{expireTimeInSeconds}`: on every subscription.
//!
//! A partitioned topic's by-time expiry applies to each partition; by position, to the
//! partition the message id names. 204 on success, 404 for a missing topic or subscription.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use serde::Deserialize;

use super::{body_bytes, partitioned_metadata, topic_exists, PathSegments};
use crate::error::AdminError;
use crate::AdminState;
use magnetar_model::names::{decode_topic_name, TopicDomain, TopicName};

/// The registered paths, relative to `/admin/v2/{domain}/{tenant}/{namespace}`.
pub(crate) const BY_TIME: &str = "/{topic}/subscription/{subscription}/expireMessages/{seconds}";
pub(crate) const BY_POSITION: &str = "/{topic}/subscription/{subscription}/expireMessages";
pub(crate) const ALL_SUBSCRIPTIONS: &str = "/{topic}/all_subscription/expireMessages/{seconds}";

/// Pulsar's `ResetCursorData` (the fields expiry reads).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessagePosition {
    ledger_id: i64,
    entry_id: i64,
    #[serde(default = "minus_one")]
    partition_index: i32,
    #[serde(default)]
    is_excluded: bool,
}

fn minus_one() -> i32 {
    -1
}

/// The topic and the subscription (segment 5) of the request.
fn names(segments: &PathSegments<'_>) -> Result<(TopicName, String), AdminError> {
    let topic = segments.topic()?;
    let subscription = decode_topic_name(segments.segment(5)?)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| AdminError::PreconditionFailed("Subscription name is not valid".into()))?;
    Ok((topic, subscription))
}

fn seconds(segments: &PathSegments<'_>, index: usize) -> Result<u64, AdminError> {
    segments
        .segment(index)?
        .parse::<u64>()
        .map_err(|_| AdminError::BadRequest("expireTimeInSeconds must be a number".into()))
}

/// The topics the request addresses: the partitions of a partitioned topic, else itself.
async fn targets(state: &AdminState, topic: &TopicName) -> Result<Vec<TopicName>, AdminError> {
    if topic.domain() != TopicDomain::Persistent {
        return Err(AdminError::MethodNotAllowed(
            "Expiring messages is not supported on non-persistent topics".into(),
        ));
    }
    if topic.partition_index().is_none() {
        if let Some((meta, _)) = partitioned_metadata(state, topic).await? {
            return Ok((0..meta.partitions).map(|i| topic.partition(i)).collect());
        }
    }
    if !topic_exists(state, topic).await? {
        return Err(AdminError::NotFound("Topic not found".into()));
    }
    Ok(vec![topic.clone()])
}

pub(crate) async fn by_time(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let segments = PathSegments::new(&uri);
    let (topic, subscription) = names(&segments)?;
    let seconds = seconds(&segments, 7)?;
    for target in targets(&state, &topic).await? {
        state.hooks.expire_messages(&target, Some(&subscription), seconds).await?;
    }
    tracing::info!(%topic, %subscription, seconds, "messages expired on demand");
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn all_subscriptions(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let segments = PathSegments::new(&uri);
    let topic = segments.topic()?;
    let seconds = seconds(&segments, 6)?;
    for target in targets(&state, &topic).await? {
        state.hooks.expire_messages(&target, None, seconds).await?;
    }
    tracing::info!(%topic, seconds, "messages expired on demand on every subscription");
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn by_position(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let segments = PathSegments::new(&uri);
    let (topic, subscription) = names(&segments)?;
    let body = body_bytes(body)?;
    let position: MessagePosition = serde_json::from_slice(&body)
        .map_err(|e| AdminError::BadRequest(format!("Invalid message id: {e}")))?;
    let (Ok(ledger_id), Ok(entry_id)) =
        (u64::try_from(position.ledger_id), u64::try_from(position.entry_id))
    else {
        return Err(AdminError::PreconditionFailed("Invalid message id".into()));
    };
    let mut targets = targets(&state, &topic).await?;
    if targets.len() > 1 || topic.partition_index().is_none() && targets[0] != topic {
        // A partitioned topic: the message id names the partition.
        let index = u32::try_from(position.partition_index).map_err(|_| {
            AdminError::PreconditionFailed(
                "Expire message by position of a partitioned topic \
                needs the message id's partition index"
                    .into(),
            )
        })?;
        targets = vec![topic.partition(index)];
    }
    for target in targets {
        state
            .hooks
            .expire_messages_through(
                &target,
                &subscription,
                ledger_id,
                entry_id,
                position.is_excluded,
            )
            .await?;
    }
    tracing::info!(%topic, %subscription, ledger_id, entry_id, "messages expired on demand up to a position");
    Ok(StatusCode::NO_CONTENT)
}
