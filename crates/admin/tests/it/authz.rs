//! Authorization of the admin API: the real router with `[authorization]` enabled and the
//! caller's `Principal` inserted by a test layer (from the `x-test-role` header), as the
//! authentication middleware inserts it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use magnetar_admin::{bootstrap, router, AdminState, NoopHooks};
use magnetar_metadata::MemoryStore;
use magnetar_security::authorization::AuthorizationConfig;
use magnetar_security::Principal;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Resp {
    status: StatusCode,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

async fn principal_from_header(mut request: Request, next: Next) -> Response {
    let role =
        request.headers().get("x-test-role").and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Some(role) = role {
        let principal = Principal { role, method: "token".into(), expires_at_ms: None };
        request.extensions_mut().insert(principal);
    }
    next.run(request).await
}

struct App {
    router: Router,
}

impl App {
    async fn new() -> App {
        let store = Arc::new(MemoryStore::new());
        bootstrap(store.as_ref(), "standalone").await.expect("bootstrap");
        let authorization = AuthorizationConfig {
            enabled: true,
            super_user_roles: vec!["root".into()],
            ..Default::default()
        };
        let state = AdminState::new(store, Arc::new(NoopHooks), "standalone")
            .with_authorization(authorization);
        let router = router(state).layer(axum::middleware::from_fn(principal_from_header));
        App { router }
    }

    async fn call(&self, role: Option<&str>, method: Method, uri: &str, body: &str) -> Resp {
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(role) = role {
            builder = builder.header("x-test-role", role);
        }
        let request = builder.body(Body::from(Bytes::from(body.to_string()))).expect("request");
        let response = self.router.clone().oneshot(request).await.expect("response");
        let status = response.status();
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        Resp { status, body: String::from_utf8_lossy(&bytes).into_owned() }
    }

    async fn status(
        &self,
        role: Option<&str>,
        method: Method,
        uri: &str,
        body: &str,
    ) -> StatusCode {
        self.call(role, method, uri, body).await.status
    }
}

const OK: StatusCode = StatusCode::OK;
const NO_CONTENT: StatusCode = StatusCode::NO_CONTENT;
const FORBIDDEN: StatusCode = StatusCode::FORBIDDEN;

/// Two tenants (`a` administered by `admin-a`, `b` by `admin-b`) with a namespace each, and a
/// topic in `a/ns`.
async fn two_tenants() -> App {
    let app = App::new().await;
    let root = Some("root");
    for (tenant, admin) in [("a", "admin-a"), ("b", "admin-b")] {
        let body = format!(r#"{{"adminRoles":["{admin}"],"allowedClusters":["standalone"]}}"#);
        let uri = format!("/admin/v2/tenants/{tenant}");
        assert_eq!(app.status(root, Method::PUT, &uri, &body).await, NO_CONTENT);
        let uri = format!("/admin/v2/namespaces/{tenant}/ns");
        assert_eq!(app.status(root, Method::PUT, &uri, "").await, NO_CONTENT);
    }
    let uri = "/admin/v2/persistent/a/ns/t/partitions";
    assert_eq!(app.status(root, Method::PUT, uri, "2").await, NO_CONTENT);
    app
}

#[tokio::test]
async fn super_user_operations_are_refused_to_everyone_else() {
    let app = two_tenants().await;
    let body = r#"{"adminRoles":[],"allowedClusters":["standalone"]}"#;
    for role in [Some("admin-a"), Some("stranger"), None] {
        let r = app.call(role, Method::PUT, "/admin/v2/tenants/c", body).await;
        assert_eq!(r.status, FORBIDDEN, "{role:?}");
        assert!(!r.json()["reason"].as_str().unwrap_or_default().is_empty(), "{}", r.body);
        assert_eq!(app.status(role, Method::GET, "/admin/v2/tenants", "").await, FORBIDDEN);
        assert_eq!(app.status(role, Method::DELETE, "/admin/v2/tenants/a", "").await, FORBIDDEN);
        assert_eq!(
            app.status(role, Method::GET, "/admin/v2/brokers/standalone", "").await,
            FORBIDDEN
        );
    }
    assert_eq!(app.status(Some("root"), Method::GET, "/admin/v2/tenants", "").await, OK);
    // Public: health and readiness, whoever asks.
    assert_eq!(app.status(None, Method::GET, "/admin/v2/brokers/ready", "").await, OK);
    assert_eq!(app.status(None, Method::GET, "/admin/v2/brokers/health", "").await, OK);
    // Cluster reads: any authenticated role.
    assert_eq!(app.status(Some("stranger"), Method::GET, "/admin/v2/clusters", "").await, OK);
    assert_eq!(app.status(None, Method::GET, "/admin/v2/clusters", "").await, FORBIDDEN);
}

#[tokio::test]
async fn a_tenant_admin_rules_its_tenant_and_nothing_else() {
    let app = two_tenants().await;
    let admin = Some("admin-a");
    assert_eq!(app.status(admin, Method::GET, "/admin/v2/tenants/a", "").await, OK);
    assert_eq!(app.status(admin, Method::GET, "/admin/v2/namespaces/a", "").await, OK);
    assert_eq!(app.status(admin, Method::PUT, "/admin/v2/namespaces/a/ns2", "").await, NO_CONTENT);
    let retention = r#"{"retentionTimeInMinutes":10,"retentionSizeInMB":10}"#;
    let uri = "/admin/v2/namespaces/a/ns/retention";
    assert_eq!(app.status(admin, Method::POST, uri, retention).await, NO_CONTENT);
    let uri = "/admin/v2/namespaces/a/ns/permissions/reader";
    assert_eq!(app.status(admin, Method::POST, uri, r#"["consume"]"#).await, NO_CONTENT);
    assert_ne!(
        app.status(admin, Method::GET, "/admin/v2/persistent/a/ns/t/stats", "").await,
        FORBIDDEN
    );
    // Tenant b: nothing.
    for (method, uri, body) in [
        (Method::GET, "/admin/v2/tenants/b", ""),
        (Method::GET, "/admin/v2/namespaces/b", ""),
        (Method::PUT, "/admin/v2/namespaces/b/ns2", ""),
        (Method::GET, "/admin/v2/namespaces/b/ns", ""),
        (Method::GET, "/admin/v2/namespaces/b/ns/topics", ""),
        (Method::GET, "/admin/v2/persistent/b/ns", ""),
        (Method::POST, "/admin/v2/namespaces/b/ns/retention", retention),
        (Method::POST, "/admin/v2/namespaces/b/ns/permissions/me", r#"["produce"]"#),
        (Method::PUT, "/admin/v2/persistent/b/ns/x", ""),
        (Method::GET, "/lookup/v2/topic/persistent/b/ns/x", ""),
    ] {
        let r = app.call(admin, method.clone(), uri, body).await;
        assert_eq!(r.status, FORBIDDEN, "{method} {uri}: {}", r.body);
    }
}

#[tokio::test]
async fn produce_and_consume_permissions_open_what_pulsar_opens() {
    let app = two_tenants().await;
    let root = Some("root");
    let grant = "/admin/v2/namespaces/a/ns/permissions";
    let status = app.status(root, Method::POST, &format!("{grant}/reader"), r#"["consume"]"#).await;
    assert_eq!(status, NO_CONTENT);
    let status = app.status(root, Method::POST, &format!("{grant}/writer"), r#"["produce"]"#).await;
    assert_eq!(status, NO_CONTENT);
    let topic = "/admin/v2/persistent/a/ns/t";
    for role in ["reader", "writer"] {
        let r = Some(role);
        assert_eq!(app.status(r, Method::GET, "/admin/v2/namespaces/a/ns/topics", "").await, OK);
        assert_eq!(app.status(r, Method::GET, "/admin/v2/persistent/a/ns", "").await, OK);
        assert_eq!(app.status(r, Method::GET, &format!("{topic}/partitions"), "").await, OK);
        // Tenant-admin business.
        assert_eq!(
            app.status(r, Method::PUT, "/admin/v2/persistent/a/ns/new", "").await,
            FORBIDDEN
        );
        assert_eq!(app.status(r, Method::GET, grant, "").await, FORBIDDEN);
        let r2 = app.status(r, Method::POST, &format!("{grant}/{role}"), r#"["produce"]"#).await;
        assert_eq!(r2, FORBIDDEN);
        assert_eq!(app.status(r, Method::GET, "/admin/v2/namespaces/a/ns", "").await, FORBIDDEN);
        assert_eq!(app.status(r, Method::POST, &format!("{topic}/terminate"), "").await, FORBIDDEN);
    }
    // Subscriptions need consume.
    let sub = format!("{topic}/subscription/s");
    assert_eq!(app.status(Some("writer"), Method::PUT, &sub, "").await, FORBIDDEN);
    assert_ne!(app.status(Some("reader"), Method::PUT, &sub, "").await, FORBIDDEN);
    assert_eq!(
        app.status(Some("writer"), Method::GET, &format!("{topic}/subscriptions"), "").await,
        FORBIDDEN
    );
    // A subscription reserved to another role.
    let reserve = "/admin/v2/namespaces/a/ns/permissions/subscription/locked";
    assert_eq!(app.status(root, Method::POST, reserve, r#"["other"]"#).await, NO_CONTENT);
    let locked = format!("{topic}/subscription/locked/skip_all");
    assert_eq!(app.status(Some("reader"), Method::POST, &locked, "").await, FORBIDDEN);
    // Nothing in tenant b.
    assert_eq!(
        app.status(Some("reader"), Method::GET, "/admin/v2/namespaces/b/ns/topics", "").await,
        FORBIDDEN
    );
}

#[tokio::test]
async fn topic_level_permissions_as_pulsar_admin_uses_them() {
    let app = two_tenants().await;
    let root = Some("root");
    let ns_grant = "/admin/v2/namespaces/a/ns/permissions/everyone";
    assert_eq!(app.status(root, Method::POST, ns_grant, r#"["consume"]"#).await, NO_CONTENT);
    let topic = "/admin/v2/persistent/a/ns/t";
    let grant = format!("{topic}/permissions/bob");
    assert_eq!(app.status(root, Method::POST, &grant, r#"["produce"]"#).await, NO_CONTENT);
    assert_eq!(app.status(root, Method::POST, &grant, r#"["fly"]"#).await, StatusCode::BAD_REQUEST);
    let listed = app.call(root, Method::GET, &format!("{topic}/permissions"), "").await;
    assert_eq!(listed.status, OK);
    assert_eq!(listed.json(), json!({"bob": ["produce"], "everyone": ["consume"]}));
    // Stored as Pulsar stores it.
    let policies = app.call(root, Method::GET, "/admin/v2/namespaces/a/ns", "").await.json();
    assert_eq!(
        policies["auth_policies"]["destination_auth"],
        json!({"persistent://a/ns/t": {"bob": ["produce"]}})
    );
    // bob may now look at t (and its partitions), not at another topic.
    assert_ne!(
        app.status(Some("bob"), Method::GET, &format!("{topic}/stats"), "").await,
        FORBIDDEN
    );
    let partition = "/admin/v2/persistent/a/ns/t-partition-1/stats";
    assert_ne!(app.status(Some("bob"), Method::GET, partition, "").await, FORBIDDEN);
    let other = "/admin/v2/persistent/a/ns/u/stats";
    assert_eq!(app.status(Some("bob"), Method::GET, other, "").await, FORBIDDEN);
    // ...but not manage permissions.
    assert_eq!(app.status(Some("bob"), Method::DELETE, &grant, "").await, FORBIDDEN);
    // Revoke; a second revoke has nothing at topic level (412, as Pulsar).
    assert_eq!(app.status(root, Method::DELETE, &grant, "").await, NO_CONTENT);
    assert_eq!(app.status(root, Method::DELETE, &grant, "").await, StatusCode::PRECONDITION_FAILED);
    assert_eq!(
        app.status(Some("bob"), Method::GET, &format!("{topic}/stats"), "").await,
        FORBIDDEN
    );
    let listed = app.call(root, Method::GET, &format!("{topic}/permissions"), "").await;
    assert_eq!(listed.json(), json!({"everyone": ["consume"]}));
}
