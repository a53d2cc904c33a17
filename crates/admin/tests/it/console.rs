//! The web console's routes through the real router: the page and its assets with their content
//! types, nothing fetched from elsewhere, the history endpoint's JSON, and the admin API and
//! `/metrics` still answering beside them.

use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use magnetar_admin::{bootstrap, router, AdminState, BrokerHooks, HookError, NoopHooks, TopicName};
use magnetar_broker::history::{HistoryPoint, HistoryView};
use magnetar_metadata::MemoryStore;
use serde_json::Value;
use tower::ServiceExt;

struct Resp {
    status: StatusCode,
    content_type: String,
    csp: String,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

async fn app(hooks: Arc<dyn BrokerHooks>) -> Router {
    let store = Arc::new(MemoryStore::new());
    bootstrap(store.as_ref(), "standalone").await.unwrap();
    router(AdminState::new(store, hooks, "standalone"))
}

async fn get(router: &Router, uri: &str) -> Resp {
    let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let header_text = |name| {
        response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    };
    let content_type = header_text(header::CONTENT_TYPE);
    let csp = header_text(header::CONTENT_SECURITY_POLICY);
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Resp { status, content_type, csp, body: String::from_utf8_lossy(&bytes).into_owned() }
}

#[tokio::test]
async fn serves_the_page_and_its_assets_with_their_types() {
    let router = app(Arc::new(NoopHooks)).await;
    for path in ["/", "/console", "/console/"] {
        let page = get(&router, path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert_eq!(page.content_type, "text/html; charset=utf-8", "{path}");
        assert!(page.body.starts_with("<!doctype html>"), "{path}");
        assert!(page.csp.contains("default-src 'self'"), "{path}: {}", page.csp);
    }
    let page = get(&router, "/").await;
    for asset in ["/console/app.js", "/console/app.css", "/console/favicon.svg"] {
        assert!(page.body.contains(asset), "the page links {asset}");
    }
    let cases = [
        ("/console/app.js", "text/javascript; charset=utf-8", "'use strict';"),
        ("/console/app.css", "text/css; charset=utf-8", ":root"),
        ("/console/favicon.svg", "image/svg+xml", "<svg"),
    ];
    for (path, content_type, marker) in cases {
        let asset = get(&router, path).await;
        assert_eq!(asset.status, StatusCode::OK, "{path}");
        assert_eq!(asset.content_type, content_type, "{path}");
        assert!(asset.body.contains(marker), "{path}");
    }
    // Offline: nothing the page loads or runs names another origin.
    for path in ["/", "/console/app.js", "/console/app.css"] {
        let body = get(&router, path).await.body;
        assert!(!body.contains("http://") && !body.contains("https://"), "{path} links elsewhere");
    }
    let missing = get(&router, "/console/nothing.js").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_admin_api_and_metrics_still_answer_beside_the_console() {
    let router = app(Arc::new(NoopHooks)).await;
    let clusters = get(&router, "/admin/v2/clusters").await;
    assert_eq!(
        (clusters.status, clusters.json()),
        (StatusCode::OK, serde_json::json!(["standalone"]))
    );
    assert_eq!(get(&router, "/admin/v2/tenants").await.status, StatusCode::OK);
    let metrics = get(&router, "/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(metrics.content_type.starts_with("text/plain"), "{}", metrics.content_type);
}

#[tokio::test]
async fn history_without_a_broker_is_empty_json() {
    let router = app(Arc::new(NoopHooks)).await;
    let history = get(&router, "/console/api/history").await;
    assert_eq!(history.status, StatusCode::OK);
    assert_eq!(history.content_type, "application/json");
    assert_eq!(history.json()["points"], serde_json::json!([]));
    let bad = get(&router, "/console/api/history?topic=not%20a%20topic%3A%2F%2F").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.json()["reason"].as_str().unwrap_or_default().contains("Invalid topic name"));
}

/// Hooks whose history has one point of totals and one per topic asked for.
struct WithHistory;

#[async_trait]
impl BrokerHooks for WithHistory {
    async fn create_topic(&self, _: &TopicName) -> Result<(), HookError> {
        Ok(())
    }

    async fn delete_topic(&self, _: &TopicName, _: bool) -> Result<(), HookError> {
        Ok(())
    }

    fn history(&self, topic: Option<&TopicName>) -> HistoryView {
        let point = HistoryPoint {
            time_ms: 1_000,
            msg_rate_in: 12.5,
            msg_backlog: if topic.is_some() { 3 } else { 7 },
            ..Default::default()
        };
        HistoryView {
            interval_ms: 2_000,
            capacity: 300,
            topic: topic.map(|t| t.to_string()),
            points: vec![point],
        }
    }
}

#[tokio::test]
async fn history_answers_the_totals_or_one_topics_series() {
    let router = app(Arc::new(WithHistory)).await;
    let totals = get(&router, "/console/api/history").await.json();
    assert_eq!(totals["intervalMs"], 2_000);
    assert_eq!(totals["capacity"], 300);
    assert_eq!(totals["points"][0]["msgRateIn"], 12.5);
    assert_eq!(totals["points"][0]["msgBacklog"], 7);
    assert!(totals.get("topic").is_none());
    let uri = "/console/api/history?topic=persistent%3A%2F%2Fpublic%2Fdefault%2Fa%2Bb";
    let topic = get(&router, uri).await.json();
    assert_eq!(topic["topic"], "persistent://public/default/a+b");
    assert_eq!(topic["points"][0]["msgBacklog"], 3);
}
