//! Topic operations on a broker that does not serve the topic: a 307 to the broker that does
//! (Pulsar's `validateTopicOwnership` redirect), which `pulsar-admin` follows with the same method
//! and body. Standalone, and for a topic this broker owns, requests pass through untouched.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use magnetar_model::keys;

use super::{query_param, temporary_redirect, PathSegments};
use crate::AdminState;

pub(crate) async fn to_owner(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let topic_route =
        path.starts_with("/admin/v2/persistent/") || path.starts_with("/admin/v2/non-persistent/");
    let segments = PathSegments::new(request.uri());
    // `{domain}/{tenant}/{namespace}/{topic}…`, but not the namespace's `…/partitioned` list,
    // nor a partitioned topic's metadata (`…/{topic}/partitions`: created, grown, read or
    // deleted on any broker, as in Pulsar; a delete reaches each partition's owner).
    let names_topic = (segments.len() > 4
        || (segments.len() == 4 && !path.ends_with("/partitioned")))
        && !path.ends_with("/partitions");
    let topic = match segments.topic() {
        Ok(topic) if topic_route && names_topic => topic,
        _ => return next.run(request).await,
    };
    let authoritative = query_param(request.uri(), "authoritative").is_some_and(|v| v == "true");
    // An error (a namespace that does not exist, a bundle being unloaded) is the handler's to
    // report, in its own words. Standalone answers `None` without I/O.
    let Ok(Some(owner)) = state.hooks.topic_owner(&topic, authoritative).await else {
        return next.run(request).await;
    };
    // A partitioned topic's own routes: its partitions have owners of their own.
    if topic.partition_index().is_none() {
        let key = keys::partitioned_topic_key(&topic);
        if matches!(state.store.get(&key).await, Ok(Some(_))) {
            return next.run(request).await;
        }
    }
    let path_and_query = request.uri().path_and_query().map_or(path, |pq| pq.as_str());
    let mut location = format!("{}{}", owner.web_url.trim_end_matches('/'), path_and_query);
    if owner.redirect && !authoritative {
        location.push(if path_and_query.contains('?') { '&' } else { '?' });
        location.push_str("authoritative=true");
    }
    tracing::debug!(%topic, %location, "admin request redirected to the topic's owner");
    temporary_redirect(&location)
}
