//! The admin API's authentication middleware: 401 with Pulsar's `{"reason"}` body without
//! (good) credentials, the `Principal` extension for handlers once authenticated, the client
//! certificate's CN from the `TransportIdentity` extension, and the paths left open.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::BodyExt;
use magnetar_admin::authentication::require;
use magnetar_security::authentication::{keys, AuthenticationConfig, Authenticator};
use magnetar_security::{Principal, TransportIdentity};
use tower::ServiceExt;

/// base64 of the 32 bytes `0123456789abcdef0123456789abcdef`.
const SECRET_B64: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn authenticator(providers: &[&str]) -> Arc<Authenticator> {
    let config = AuthenticationConfig {
        enabled: true,
        providers: providers.iter().map(|p| p.to_string()).collect(),
        token_secret_key: SECRET_B64.into(),
        ..Default::default()
    };
    Arc::new(Authenticator::from_config(&config).unwrap())
}

fn app(providers: &[&str]) -> Router {
    let inner = Router::new()
        .route("/admin/v2/whoami", get(|Extension(p): Extension<Principal>| async move { p.role }))
        .route("/metrics", get(|| async { "open" }))
        .route("/console/app.js", get(|| async { "js" }));
    require(inner, authenticator(providers))
}

async fn call(
    app: &Router,
    path: &str,
    authorization: Option<&str>,
    identity: Option<TransportIdentity>,
) -> (StatusCode, String) {
    let mut req = Request::builder().uri(path);
    if let Some(value) = authorization {
        req = req.header(header::AUTHORIZATION, value);
    }
    let mut req = req.body(Body::empty()).unwrap();
    if let Some(identity) = identity {
        req.extensions_mut().insert(identity);
    }
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn token(claims: serde_json::Value) -> String {
    keys::sign_token(SECRET, true, None, &[], &claims).unwrap()
}

#[tokio::test]
async fn bearer_tokens_and_401_reasons() {
    let app = app(&["token"]);
    let good = format!("Bearer {}", token(serde_json::json!({"sub": "alice"})));
    assert_eq!(
        call(&app, "/admin/v2/whoami", Some(&good), None).await,
        (StatusCode::OK, "alice".into())
    );
    let (status, body) = call(&app, "/admin/v2/whoami", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let reason = serde_json::from_str::<serde_json::Value>(&body).unwrap()["reason"].clone();
    assert!(reason.as_str().unwrap().contains("no credentials"), "{body}");
    let expired = format!("Bearer {}", token(serde_json::json!({"sub": "alice", "exp": 1})));
    let (status, body) = call(&app, "/admin/v2/whoami", Some(&expired), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("expired"), "{body}");
    let (status, _) = call(&app, "/admin/v2/whoami", Some("Basic Ym9i"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Open paths, as in Pulsar.
    assert_eq!(call(&app, "/metrics", None, None).await.0, StatusCode::OK);
    assert_eq!(call(&app, "/console/app.js", None, None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn client_certificate_common_name() {
    let app = app(&["tls", "token"]);
    let identity = TransportIdentity { tls: true, client_cert_common_name: Some("cn-1".into()) };
    assert_eq!(
        call(&app, "/admin/v2/whoami", None, Some(identity.clone())).await,
        (StatusCode::OK, "cn-1".into())
    );
    // A token wins over the certificate when both are there.
    let good = format!("Bearer {}", token(serde_json::json!({"sub": "alice"})));
    assert_eq!(
        call(&app, "/admin/v2/whoami", Some(&good), Some(identity)).await,
        (StatusCode::OK, "alice".into())
    );
    assert_eq!(call(&app, "/admin/v2/whoami", None, None).await.0, StatusCode::UNAUTHORIZED);
}
