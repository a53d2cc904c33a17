//! Broker-level endpoints: health check, readiness, the cluster's active brokers and the
//! Prometheus scrape endpoint.
//!
//! As in Pulsar's `BrokersBase`, `GET /admin/v2/brokers/health` and
//! `GET /admin/v2/brokers/ready` answer 200 with the plain-text body `ok`; a broker that is not
//! ready (starting, shutting down, its metadata session lost) answers 503 with the reason.
//! `GET /admin/v2/brokers/{cluster}` lists the registered brokers (`host:web-port`, the
//! children of `/brokers`, ephemeral keys bound to each broker's metadata session).

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use magnetar_model::keys;

use super::PathSegments;
use crate::error::AdminError;
use crate::AdminState;

/// Content type of the Prometheus text exposition format.
pub(crate) const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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

/// `GET /metrics`: the broker's Prometheus exposition (the hooks' counters; empty without a broker).
pub(crate) async fn metrics(State(state): State<AdminState>) -> Response {
    let body = state.hooks.metrics().await;
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_CONTENT_TYPE))],
        body,
    )
        .into_response()
}
