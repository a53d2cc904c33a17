//! Broker-level endpoints: health check, readiness, the cluster's active brokers and the
//! Prometheus scrape endpoint.
//!
//! As in Pulsar's `BrokersBase`, `GET /admin/v2/brokers/health` and
//! `GET /admin/v2/brokers/ready` answer 200 with the plain-text body `ok`; a broker that is not
//! ready (starting, shutting down, its metadata session lost) answers 503 with the reason.
//! `GET /admin/v2/brokers/{cluster}` lists the registered brokers (`host:web-port`, the
//! children of `/brokers`, ephemeral keys bound to each broker's metadata session).

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use magnetar_metadata::ExpectedVersion;
use magnetar_model::{dynamic_config, keys, BrokerRegistration};

use super::{get_json, to_json_bytes, update_document, PathSegments};
use crate::error::AdminError;
use crate::AdminState;

fn plain_ok() -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))], "ok")
        .into_response()
}

/// `GET /admin/v2/brokers/health`: 200 `ok`, or the hook's failure.
pub(crate) async fn health(State(state): State<AdminState>) -> Result<Response, AdminError> {
    state.hooks.health_check().await?;
    Ok(plain_ok())
}

/// `GET /admin/v2/brokers/ready`: 200 `ok` once the broker is ready, else the hook's failure
/// (503 with the reason while not ready).
pub(crate) async fn ready(State(state): State<AdminState>) -> Result<Response, AdminError> {
    state.hooks.ready().await?;
    Ok(plain_ok())
}

/// `GET /admin/v2/brokers/{cluster}`: the brokers registered in the metadata store, as
/// `["host:web-port", …]` sorted (what `pulsar-admin brokers list CLUSTER` prints); 404 for
/// another cluster.
pub(crate) async fn list_brokers(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Vec<String>>, AdminError> {
    let cluster = PathSegments::new(&uri).decoded(1)?;
    if cluster.as_deref() != Some(state.cluster.as_str()) {
        return Err(AdminError::NotFound("Cluster does not exist".to_string()));
    }
    let mut brokers = state.store.list_children(keys::BROKERS_ROOT).await?;
    brokers.sort();
    Ok(Json(brokers))
}

/// `GET /metrics`: the broker's exposition, Prometheus text 0.0.4, or OpenMetrics when the
/// scraper's `Accept` asks for it.
pub(crate) async fn metrics(State(state): State<AdminState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = magnetar_metrics::Format::negotiate(accept);
    let parts = state.hooks.metrics(format).await;
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()))],
        axum::body::Body::new(TextParts::new(parts)),
    )
        .into_response()
}

/// A response body sent part by part as it was rendered, never joined (a scrape of 10,000
/// topics is ~50 MiB); its exact length is known, so it goes with a `Content-Length`.
struct TextParts {
    parts: std::collections::VecDeque<bytes::Bytes>,
    remaining: u64,
}

impl TextParts {
    fn new(parts: Vec<String>) -> TextParts {
        let parts: std::collections::VecDeque<bytes::Bytes> =
            parts.into_iter().filter(|p| !p.is_empty()).map(bytes::Bytes::from).collect();
        let remaining = parts.iter().map(|p| p.len() as u64).sum();
        TextParts { parts, remaining }
    }
}

impl http_body::Body for TextParts {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let next = this.parts.pop_front().map(|part| {
            this.remaining -= part.len() as u64;
            Ok(http_body::Frame::data(part))
        });
        std::task::Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

/// `GET /admin/v2/brokers`: the active brokers of this cluster (Pulsar 3+), as
/// `GET /admin/v2/brokers/{cluster}`.
pub(crate) async fn list_active_brokers(
    State(state): State<AdminState>,
) -> Result<Json<Vec<String>>, AdminError> {
    let mut brokers = state.store.list_children(keys::BROKERS_ROOT).await?;
    brokers.sort();
    Ok(Json(brokers))
}

/// `GET /admin/v2/brokers/leaderBroker`: Pulsar's `LeaderBroker` `{"brokerId","serviceUrl"}`:
/// the load manager's elected leader (`/loadbalance/leader`); before one is elected, the first
/// registered broker (sorted), or this one when none is registered (standalone).
pub(crate) async fn leader_broker(
    State(state): State<AdminState>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let mut brokers = state.store.list_children(keys::BROKERS_ROOT).await?;
    brokers.sort();
    let elected = state
        .store
        .get(magnetar_coordination::cluster::LEADER_KEY)
        .await?
        .map(|found| String::from_utf8_lossy(&found.value).into_owned())
        .filter(|id| brokers.contains(id));
    if let Some(first) = elected.as_ref().or(brokers.first()) {
        let key = keys::child(keys::BROKERS_ROOT, first);
        let url = super::get_json::<BrokerRegistration>(&state, &key)
            .await
            .ok()
            .flatten()
            .map_or_else(|| format!("http://{first}"), |(r, _)| r.web_service_url);
        return Ok(Json(serde_json::json!({ "brokerId": first, "serviceUrl": url })));
    }
    let url = state.service_url.clone().unwrap_or_default();
    let id = url.trim_start_matches("http://").trim_start_matches("https://").to_string();
    Ok(Json(serde_json::json!({ "brokerId": id, "serviceUrl": url })))
}

/// `GET /admin/v2/brokers/version`: the broker's version, plain text.
pub(crate) async fn version() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))],
        env!("CARGO_PKG_VERSION"),
    )
        .into_response()
}

/// `GET /admin/v2/brokers/configuration`: the names of the dynamically updatable settings.
pub(crate) async fn dynamic_configuration_names() -> Json<Vec<&'static str>> {
    Json(dynamic_config::NAMES.to_vec())
}

/// The stored dynamic configuration and its version (`{}`, absent, when none was set).
async fn dynamic_document(
    state: &AdminState,
) -> Result<(BTreeMap<String, String>, ExpectedVersion), AdminError> {
    match get_json::<BTreeMap<String, String>>(state, keys::DYNAMIC_CONFIGURATION).await? {
        Some((document, version)) => Ok((document, ExpectedVersion::Exactly(version))),
        None => Ok((BTreeMap::new(), ExpectedVersion::Absent)),
    }
}

/// `GET /admin/v2/brokers/configuration/values`: the settings the dynamic configuration
/// overrides, `{name: value}`.
pub(crate) async fn dynamic_configuration_values(
    State(state): State<AdminState>,
) -> Result<Json<BTreeMap<String, String>>, AdminError> {
    Ok(Json(dynamic_document(&state).await?.0))
}

/// Changes the stored dynamic configuration (compare-and-set), then has the broker apply it.
/// Every broker of a cluster applies it through its policy watch.
async fn change_dynamic_configuration(
    state: &AdminState,
    change: impl Fn(&mut BTreeMap<String, String>),
) -> Result<(), AdminError> {
    update_document(state, keys::DYNAMIC_CONFIGURATION, "Not found", || async {
        let (mut document, expected) = dynamic_document(state).await?;
        change(&mut document);
        Ok((to_json_bytes(&document)?, expected))
    })
    .await?;
    state.hooks.dynamic_configuration_changed().await?;
    Ok(())
}

/// `POST /admin/v2/brokers/configuration/{name}/{value}` (`pulsar-admin brokers
/// update-dynamic-config`): 204; 412 " Can't update non-dynamic configuration" for a setting
/// that is not dynamic, 412 " Invalid dynamic-config value" for a value of the wrong type.
pub(crate) async fn update_dynamic_configuration(
    State(state): State<AdminState>,
    Path((name, value)): Path<(String, String)>,
) -> Result<StatusCode, AdminError> {
    dynamic_config::validate(&name, &value)
        .map_err(|e| AdminError::PreconditionFailed(e.to_string()))?;
    change_dynamic_configuration(&state, |document| {
        document.insert(name.clone(), value.trim().to_string());
    })
    .await?;
    tracing::info!(%name, %value, "dynamic configuration updated");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/brokers/configuration/{name}`: the setting goes back to the
/// configuration file's value. 204; 412 "Can't delete non-dynamic configuration".
pub(crate) async fn delete_dynamic_configuration(
    State(state): State<AdminState>,
    Path(name): Path<String>,
) -> Result<StatusCode, AdminError> {
    if !dynamic_config::NAMES.contains(&name.as_str()) {
        return Err(AdminError::PreconditionFailed(
            "Can't delete non-dynamic configuration".to_string(),
        ));
    }
    change_dynamic_configuration(&state, |document| {
        document.remove(&name);
    })
    .await?;
    tracing::info!(%name, "dynamic configuration removed");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /admin/v2/brokers/configuration/runtime`: the broker's settings by Pulsar's names
/// (those Magnetar has), plus `clusterName`.
pub(crate) async fn runtime_configuration(
    State(state): State<AdminState>,
) -> Json<std::collections::BTreeMap<String, String>> {
    let mut config = state.hooks.runtime_configuration();
    config.insert("clusterName".to_string(), state.cluster.clone());
    if let Some(url) = &state.service_url {
        config.insert("webServiceUrl".to_string(), url.clone());
    }
    if let Some(url) = &state.broker_service_url {
        config.insert("brokerServiceUrl".to_string(), url.clone());
    }
    if let Some(url) = &state.service_url_tls {
        config.insert("webServiceUrlTls".to_string(), url.clone());
    }
    if let Some(url) = &state.broker_service_url_tls {
        config.insert("brokerServiceUrlTls".to_string(), url.clone());
    }
    Json(config)
}

/// `GET /admin/v2/brokers/internal-configuration`: Pulsar's `InternalConfigurationData`; the
/// ZooKeeper and BookKeeper fields do not apply to Magnetar and are null.
pub(crate) async fn internal_configuration() -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "zookeeperServers": null,
        "configurationStoreServers": null,
        "metadataStoreUrl": null,
        "configurationMetadataStoreUrl": null,
        "ledgersRootPath": null,
        "bookkeeperMetadataServiceUri": null,
        "stateStorageServiceUrl": null
    }))
}

/// `GET /admin/v2/broker-stats/topics` and `…/bookieops`: `{}` (stubbed: per-topic stats are
/// served by the topic stats endpoints).
pub(crate) async fn empty_stats_object() -> Json<serde_json::Value> {
    Json(serde_json::json!({}))
}

/// `GET /admin/v2/broker-stats/metrics` and `…/mbeans`: `[]` (stubbed: metrics are at
/// `GET /metrics`).
pub(crate) async fn empty_stats_list() -> Json<serde_json::Value> {
    Json(serde_json::json!([]))
}
