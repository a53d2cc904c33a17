//! Authentication of admin requests (when `[authentication] enabled`).
//!
//! Each request's credentials come from `Authorization: Bearer <token>` or
//! `Authorization: Basic base64(user:password)` or, without that header, the client
//! certificate's common name (the [`TransportIdentity`] extension the listener inserts); the
//! anonymous role when configured. A request that passes carries the [`Principal`] extension
//! (authorization reads it); the others get 401 with Pulsar's body `{"reason": ...}`.
//!
//! Left open, as Pulsar leaves them: the console's static files (the page must load to show its
//! sign-in; its data, `/console/api/*`, needs credentials) and `/metrics` (Pulsar's
//! `authenticateMetricsEndpoint` defaults to false).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use magnetar_security::authentication::Authenticator;
use magnetar_security::TransportIdentity;
use std::sync::Arc;

/// Paths served without credentials.
const OPEN_PATHS: &[&str] = &[
    "/",
    "/console",
    "/console/",
    "/console/app.js",
    "/console/app.css",
    "/console/favicon.svg",
    "/metrics",
    "/metrics/",
];

/// `router` with every request authenticated by `authenticator` (see the module docs).
pub fn require(router: axum::Router, authenticator: Arc<Authenticator>) -> axum::Router {
    router.layer(axum::middleware::from_fn(move |request: Request, next: Next| {
        let authenticator = authenticator.clone();
        async move { authenticate(&authenticator, request, next).await }
    }))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn authenticate(authenticator: &Authenticator, mut request: Request, next: Next) -> Response {
    if OPEN_PATHS.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let identity = request.extensions().get::<TransportIdentity>().cloned().unwrap_or_default();
    let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let (method, result) = authenticator.authenticate_http(authorization, &identity, now_ms());
    match result {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(error) => {
            tracing::debug!(method, %error, path = %request.uri().path(),
                "admin request not authenticated");
            unauthorized(&format!("Authentication required: {error}"))
        }
    }
}

fn unauthorized(reason: &str) -> Response {
    let body = serde_json::json!({ "reason": reason }).to_string();
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/json"), (header::WWW_AUTHENTICATE, "Bearer")],
        Body::from(body),
    )
        .into_response()
}
