//! Schema endpoints under `/admin/v2/schemas/{tenant}/{namespace}/{topic}`, as Pulsar's
//! `SchemasResource` / `SchemasResourceBase`: the latest schema, one version, every live
//! version, delete (a tombstone version; `?force=true` removes the history), upload, a
//! compatibility check, and the version a given schema has. Partitions share their partitioned topic's schema.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body_bytes, query_bool, require_namespace, PathSegments};
use crate::error::AdminError;
use crate::AdminState;
use magnetar_broker::schema_registry::SchemaRegistry;
use magnetar_model::names::TopicName;
use magnetar_model::schema::{type_code, type_name, SchemaData, StoredSchema};

/// Pulsar's `GetSchemaResponse`.
fn render(schema: &StoredSchema) -> Value {
    json!({
        "version": schema.version,
        "type": type_name(schema.schema_type),
        "timestamp": schema.timestamp,
        "data": String::from_utf8_lossy(&schema.data),
        "properties": schema.properties,
    })
}

async fn topic_of(state: &AdminState, uri: &Uri) -> Result<TopicName, AdminError> {
    let topic = PathSegments::new(uri).schema_topic()?;
    require_namespace(state, topic.namespace()).await?;
    Ok(topic)
}

/// `GET …/schema`: the latest schema; 404 when there is none or it was deleted.
pub(crate) async fn get_latest(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let topic = topic_of(&state, &uri).await?;
    let (history, _) = SchemaRegistry::new(state.store.clone()).history(&topic).await?;
    match history.versions.last() {
        None => Err(AdminError::NotFound("Schema not found".into())),
        Some(s) if s.deleted => Err(AdminError::NotFound("Schema is deleted".into())),
        Some(s) => Ok(Json(render(s))),
    }
}

/// `GET …/schema/{version}`.
pub(crate) async fn get_version(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let topic = topic_of(&state, &uri).await?;
    let raw = PathSegments::new(&uri).segment(5)?.to_string();
    let version: u64 = raw
        .parse()
        .map_err(|_| AdminError::BadRequest(format!("Invalid schema version {raw:?}")))?;
    let (history, _) = SchemaRegistry::new(state.store.clone()).history(&topic).await?;
    // A version before the last delete is gone for readers too (Pulsar trims them).
    match history.get_live(version) {
        None => Err(AdminError::NotFound("Schema not found".into())),
        Some(s) if s.deleted => Err(AdminError::NotFound("Schema is deleted".into())),
        Some(s) => Ok(Json(render(s))),
    }
}

/// `GET …/schemas`: every version since the last delete, oldest first.
pub(crate) async fn get_all(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let topic = topic_of(&state, &uri).await?;
    let (history, _) = SchemaRegistry::new(state.store.clone()).history(&topic).await?;
    let all: Vec<Value> = history.live().iter().map(render).collect();
    Ok(Json(json!({ "getSchemaResponses": all })))
}

/// `DELETE …/schema[?force=true]`: `{"version": N}`, the tombstone's version (-1 when there
/// was no schema).
pub(crate) async fn delete(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let topic = topic_of(&state, &uri).await?;
    let force = query_bool(&uri, "force");
    let deleted = SchemaRegistry::new(state.store.clone()).delete(&topic, force).await?;
    let version = deleted.and_then(|v| i64::try_from(v).ok()).unwrap_or(-1);
    Ok(Json(json!({ "version": version })))
}

/// Pulsar's `PostSchemaPayload`.
#[derive(Deserialize)]
struct PostSchemaPayload {
    #[serde(rename = "type")]
    schema_type: String,
    #[serde(default)]
    schema: String,
    #[serde(default)]
    properties: Option<BTreeMap<String, String>>,
}

fn payload(body: Result<Bytes, BytesRejection>) -> Result<SchemaData, AdminError> {
    let body = body_bytes(body)?;
    let payload: PostSchemaPayload = serde_json::from_slice(&body)
        .map_err(|e| AdminError::BadRequest(format!("Invalid schema payload: {e}")))?;
    let schema_type = type_code(&payload.schema_type)
        .filter(|code| *code != magnetar_model::schema::TYPE_AUTO_CONSUME)
        .ok_or_else(|| {
            AdminError::BadRequest(format!("Unsupported schema type {}", payload.schema_type))
        })?;
    Ok(SchemaData {
        schema_type,
        data: payload.schema.into_bytes(),
        properties: payload.properties.unwrap_or_default(),
    })
}

/// `POST …/schema` with a `PostSchemaPayload`: 202 `{"version": {"version": N}}`; 409 when
/// incompatible, 422 when the definition is invalid.
pub(crate) async fn upload(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), AdminError> {
    let topic = topic_of(&state, &uri).await?;
    let schema = payload(body)?;
    let registry = SchemaRegistry::new(state.store.clone());
    let mut policies = registry.policies(&topic).await?;
    // An explicit upload is not a producer's auto-update.
    policies.allow_auto_update = true;
    let version = registry.put_if_absent(&topic, &schema, policies).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "version": { "version": version } }))))
}

/// `POST …/compatibility` with a `PostSchemaPayload`: 202 `{"compatibility": true,
/// "schemaCompatibilityStrategy": "FULL"}` (Pulsar's `IsCompatibilityResponse`, whose Lombok
/// `isCompatibility` Jackson writes as `compatibility`). An incompatible schema is an error
/// with the reason, as Pulsar answers it (an exception, never `false`); here 409 with the
/// reason, as an incompatible upload gets.
pub(crate) async fn compatibility(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), AdminError> {
    let topic = topic_of(&state, &uri).await?;
    let schema = payload(body)?;
    let registry = SchemaRegistry::new(state.store.clone());
    let strategy = registry.policies(&topic).await?.strategy;
    let (history, _) = registry.history(&topic).await?;
    history.check(&schema, strategy)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "compatibility": true,
            "schemaCompatibilityStrategy": strategy.name(),
        })),
    ))
}

/// `POST …/version` with a `PostSchemaPayload`: `{"version": N}`, the live version holding
/// exactly that schema, -1 when none does (Pulsar's `getVersionBySchema`).
pub(crate) async fn version_of(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, AdminError> {
    let topic = topic_of(&state, &uri).await?;
    let schema = payload(body)?;
    let (history, _) = SchemaRegistry::new(state.store.clone()).history(&topic).await?;
    let version = history.find(&schema).and_then(|v| i64::try_from(v).ok()).unwrap_or(-1);
    Ok(Json(json!({ "version": version })))
}
