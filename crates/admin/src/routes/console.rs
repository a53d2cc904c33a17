//! The built-in web console: one page of plain HTML, CSS and JavaScript (`crates/admin/console/`),
//! embedded in the binary, served at `/` with its assets under `/console/`, and the broker's
//! recent history its charts read (`GET /console/api/history`).
//!
//! No build step: the files in `console/` are what the browser runs. Everything else the
//! console shows comes from the `/admin/v2/...` API, with the token the user typed, if any.
//!
//! The page may load nothing from elsewhere (it must work offline): its Content-Security-Policy
//! allows this origin only.

use axum::extract::State;
use axum::http::{header, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::query_param;
use crate::error::AdminError;
use crate::AdminState;
use magnetar_model::names::TopicName;

/// An embedded file and its content type.
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
}

const INDEX: Asset = Asset {
    body: include_bytes!("../../console/index.html"),
    content_type: "text/html; charset=utf-8",
};
const SCRIPT: Asset = Asset {
    body: include_bytes!("../../console/app.js"),
    content_type: "text/javascript; charset=utf-8",
};
const STYLE: Asset = Asset {
    body: include_bytes!("../../console/app.css"),
    content_type: "text/css; charset=utf-8",
};
const ICON: Asset =
    Asset { body: include_bytes!("../../console/favicon.svg"), content_type: "image/svg+xml" };

/// This origin only: no CDN, no external fetch, no inline script; images may be data: URLs
/// (the canvas charts draw nothing external either).
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; \
     style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; \
     base-uri 'none'; form-action 'self'";

/// The console's routes, added to the admin router (none of them under `/admin` or `/metrics`).
pub(crate) fn routes(router: Router<AdminState>) -> Router<AdminState> {
    router
        .route("/", get(|| async { serve(&INDEX) }))
        .route("/console", get(|| async { serve(&INDEX) }))
        .route("/console/", get(|| async { serve(&INDEX) }))
        .route("/console/app.js", get(|| async { serve(&SCRIPT) }))
        .route("/console/app.css", get(|| async { serve(&STYLE) }))
        .route("/console/favicon.svg", get(|| async { serve(&ICON) }))
        .route("/console/api/history", get(history))
}

/// An asset with its type. `no-cache`: a browser revalidates, so a new binary's console is
/// never mixed with an old one's cached script.
fn serve(asset: &'static Asset) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        ],
        asset.body,
    )
        .into_response()
}

/// `GET /console/api/history[?topic=persistent://t/ns/x]`: the broker's recent totals, or one
/// topic's series (`magnetar_broker::history::HistoryView`, oldest point first); 400 for a
/// topic name that does not parse.
async fn history(State(state): State<AdminState>, uri: Uri) -> Result<Response, AdminError> {
    let topic = match query_param(&uri, "topic") {
        None => None,
        Some(name) => Some(
            TopicName::parse(&name)
                .map_err(|_| AdminError::BadRequest(format!("Invalid topic name: {name}")))?,
        ),
    };
    let view = state.hooks.history(topic.as_ref());
    Ok(([(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))], Json(view))
        .into_response())
}
