//! Deduplication policies: `POST|GET|DELETE /admin/v2/namespaces/{t}/{ns}/deduplication` (the
//! `deduplicationEnabled` field of the namespace policies) and
//! `POST|GET|DELETE /admin/v2/{domain}/{t}/{ns}/{topic}/deduplicationEnabled` (one key per topic,
//! [`keys::topic_policies_key`]). The broker applies a change through
//! [`crate::BrokerHooks::policies_updated`].

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use magnetar_metadata::{ExpectedVersion, MetadataError};
use serde_json::{Map, Value};

use super::{body_bytes, get_json, require_namespace, to_json_bytes, PathSegments};
use crate::error::AdminError;
use crate::AdminState;
use magnetar_model::keys;

const FIELD: &str = "deduplicationEnabled";

/// A JSON boolean body (`true` / `false`), as Pulsar's `@RequestBody boolean`.
fn parse_flag(body: &Bytes) -> Result<bool, AdminError> {
    serde_json::from_slice::<bool>(body)
        .map_err(|_| AdminError::BadRequest("Body must be true or false".to_string()))
}

/// Sets (`Some`) or removes (`None`) the field in the JSON object at `key`, with a CAS retry.
/// `must_exist`: the key must already exist (a namespace), else 404 with that reason.
async fn update_field(
    state: &AdminState,
    key: &str,
    value: Option<bool>,
    must_exist: Option<&str>,
) -> Result<(), AdminError> {
    loop {
        let current = get_json::<Map<String, Value>>(state, key).await?;
        let (mut policies, expected) = match current {
            Some((policies, version)) => (policies, ExpectedVersion::Exactly(version)),
            None => match must_exist {
                Some(reason) => return Err(AdminError::NotFound(reason.to_string())),
                None => (Map::new(), ExpectedVersion::Absent),
            },
        };
        match value {
            Some(flag) => policies.insert(FIELD.to_string(), Value::Bool(flag)),
            None => policies.remove(FIELD),
        };
        match state.store.put(key, to_json_bytes(&Value::Object(policies))?, expected).await {
            Ok(_) => return Ok(()),
            Err(MetadataError::BadVersion { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The field's value, or 204 when unset (Pulsar answers a null policy with no content).
async fn read_field(state: &AdminState, key: &str) -> Result<Response, AdminError> {
    let flag = get_json::<Map<String, Value>>(state, key)
        .await?
        .and_then(|(policies, _)| policies.get(FIELD).and_then(Value::as_bool));
    Ok(match flag {
        Some(flag) => Json(flag).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

pub(crate) async fn set_namespace_dedup(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let flag = parse_flag(&body_bytes(body)?)?;
    change_namespace(&state, &uri, Some(flag)).await
}

pub(crate) async fn remove_namespace_dedup(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    change_namespace(&state, &uri, None).await
}

async fn change_namespace(
    state: &AdminState,
    uri: &Uri,
    flag: Option<bool>,
) -> Result<StatusCode, AdminError> {
    let ns = PathSegments::new(uri).namespace(1)?;
    update_field(state, &keys::namespace_key(&ns), flag, Some("Namespace does not exist")).await?;
    state.hooks.policies_updated(&ns, None).await?;
    tracing::info!(namespace = %ns, deduplication = ?flag, "namespace deduplication policy set");
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn get_namespace_dedup(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Response, AdminError> {
    let ns = PathSegments::new(&uri).namespace(1)?;
    require_namespace(&state, &ns).await?;
    read_field(&state, &keys::namespace_key(&ns)).await
}

pub(crate) async fn set_topic_dedup(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let flag = parse_flag(&body_bytes(body)?)?;
    change_topic(&state, &uri, Some(flag)).await
}

pub(crate) async fn remove_topic_dedup(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    change_topic(&state, &uri, None).await
}

async fn change_topic(
    state: &AdminState,
    uri: &Uri,
    flag: Option<bool>,
) -> Result<StatusCode, AdminError> {
    let topic = PathSegments::new(uri).topic()?;
    require_namespace(state, topic.namespace()).await?;
    // Policies of a partitioned topic apply to all its partitions: keyed by the base name.
    let key = keys::topic_policies_key(&topic.partitioned_topic());
    update_field(state, &key, flag, None).await?;
    state.hooks.policies_updated(topic.namespace(), Some(&topic)).await?;
    tracing::info!(%topic, deduplication = ?flag, "topic deduplication policy set");
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn get_topic_dedup(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Response, AdminError> {
    let topic = PathSegments::new(&uri).topic()?;
    require_namespace(&state, topic.namespace()).await?;
    read_field(&state, &keys::topic_policies_key(&topic.partitioned_topic())).await
}
