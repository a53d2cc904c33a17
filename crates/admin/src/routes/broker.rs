//! Broker-level endpoints: health check, readiness and the Prometheus scrape endpoint.
//!
//! As in Pulsar's `BrokersBase`, `GET /admin/v2/brokers/health` and
//! `GET /admin/v2/brokers/ready` answer 200 with the plain-text body `ok`.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

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

/// `GET /admin/v2/brokers/ready`: 200 `ok` once the broker is ready, else 500.
pub(crate) async fn ready(State(state): State<AdminState>) -> Result<Response, AdminError> {
    if state.hooks.is_ready().await {
        Ok(plain_ok())
    } else {
        Err(AdminError::Internal("Broker is not ready".to_string()))
    }
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
