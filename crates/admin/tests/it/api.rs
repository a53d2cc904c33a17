//! In-process tests of the admin API: requests go through the real axum router with
//! `tower::ServiceExt::oneshot` against a `MemoryStore`, plus one test over a real listener.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use magnetar_admin::{
    bootstrap, router, AdminState, BrokerHooks, HookError, NamespaceName, NoopHooks, TopicDomain,
    TopicName,
};
use magnetar_metadata::{ExpectedVersion, MemoryStore, MetadataStore, SessionStore};
use magnetar_model::keys;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Resp {
    status: StatusCode,
    content_type: String,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    fn reason(&self) -> String {
        self.json()["reason"].as_str().unwrap_or_default().to_string()
    }
}

struct App {
    router: Router,
    store: Arc<MemoryStore>,
}

impl App {
    async fn new() -> App {
        App::with_hooks(Arc::new(NoopHooks)).await
    }

    async fn with_hooks(hooks: Arc<dyn BrokerHooks>) -> App {
        let store = Arc::new(MemoryStore::new());
        bootstrap(store.as_ref(), "standalone").await.unwrap();
        let state = AdminState::new(store.clone(), hooks, "standalone")
            .with_cluster_urls("http://localhost:8080", "pulsar://localhost:6650");
        App { router: router(state), store }
    }

    async fn call(&self, method: Method, uri: &str, body: impl Into<Bytes>) -> Resp {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.into()))
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Resp { status, content_type, body: String::from_utf8_lossy(&bytes).into_owned() }
    }

    async fn get(&self, uri: &str) -> Resp {
        self.call(Method::GET, uri, "").await
    }

    async fn put(&self, uri: &str, body: &'static str) -> Resp {
        self.call(Method::PUT, uri, body).await
    }

    async fn post(&self, uri: &str, body: &'static str) -> Resp {
        self.call(Method::POST, uri, body).await
    }

    async fn delete(&self, uri: &str) -> Resp {
        self.call(Method::DELETE, uri, "").await
    }

    /// Simulates the broker creating a non-partitioned topic.
    async fn broker_creates_topic(&self, full: &str) {
        let t = TopicName::parse(full).unwrap();
        self.store
            .put(&keys::topic_key(&t), Bytes::from_static(b"{}"), ExpectedVersion::Absent)
            .await
            .unwrap();
    }
}

const T1: &str = "/admin/v2/persistent/public/default/t1/partitions";

#[tokio::test]
async fn health_ready_metrics_clusters() {
    let app = App::new().await;
    let r = app.get("/admin/v2/brokers/health").await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "ok"));
    assert!(r.content_type.starts_with("text/plain"));
    let r = app.get("/admin/v2/brokers/ready").await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "ok"));

    let r = app.get("/metrics").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.content_type.starts_with("text/plain; version=0.0.4"), "{}", r.content_type);
    assert_eq!(r.body, "");

    let r = app.get("/admin/v2/clusters").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), json!(["standalone"]));
    let r = app.get("/admin/v2/clusters/standalone").await;
    assert_eq!(r.json()["brokerServiceUrl"], "pulsar://localhost:6650");
    assert_eq!(app.get("/admin/v2/clusters/other").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn brokers_list_and_the_stored_cluster_record() {
    let app = App::new().await;
    let r = app.get("/admin/v2/brokers/standalone").await;
    assert_eq!((r.status, r.json()), (StatusCode::OK, json!([])), "nobody registered yet");
    for (host, port) in [("h2", 8080), ("h1", 8081)] {
        app.store
            .put_ephemeral(
                &keys::broker(host, port),
                Bytes::from_static(b"{}"),
                ExpectedVersion::Any,
            )
            .await
            .unwrap();
    }
    let r = app.get("/admin/v2/brokers/standalone").await;
    assert_eq!(r.json(), json!(["h1:8081", "h2:8080"]));
    assert_eq!(app.get("/admin/v2/brokers/other").await.status, StatusCode::NOT_FOUND);
    app.store.expire_session().unwrap();
    assert_eq!(app.get("/admin/v2/brokers/standalone").await.json(), json!([]), "ephemeral");

    // The stored cluster record wins over the broker's own URLs; missing fields are filled.
    let record = json!({"serviceUrl": "http://cluster:8080", "peerClusterNames": null});
    app.store
        .put(&keys::cluster("standalone"), record.to_string().into(), ExpectedVersion::Absent)
        .await
        .unwrap();
    let r = app.get("/admin/v2/clusters/standalone").await;
    assert_eq!(r.json()["serviceUrl"], "http://cluster:8080");
    assert_eq!(r.json()["brokerServiceUrl"], "pulsar://localhost:6650");
}

/// `pulsar-admin bookies list-bookies`: every node with a cookie, up or not, at its latest
/// address, and registered nodes without one (an older version's), each address once.
#[tokio::test]
async fn bookies_are_listed_by_cookie_and_by_registration() {
    let app = App::new().await;
    let r = app.get("/admin/v2/bookies/all").await;
    assert_eq!((r.status, r.json()), (StatusCode::OK, json!({"bookies": []})));
    for (id, address) in [(2, "h:2"), (1, "h:1")] {
        let cookie = json!({"address": address, "instance": "00000000000000aa"});
        let key = keys::storage_node_cookie(id);
        app.store.put(&key, cookie.to_string().into(), ExpectedVersion::Absent).await.unwrap();
    }
    let unreadable = keys::storage_node_cookie(9);
    app.store.put(&unreadable, Bytes::from_static(b"{"), ExpectedVersion::Absent).await.unwrap();
    for (id, address) in [(1, "h:1"), (3, "h:3")] {
        let registration = json!({"address": address, "freeBytes": 1});
        let key = keys::storage_node(id);
        let value = registration.to_string().into();
        app.store.put_ephemeral(&key, value, ExpectedVersion::Any).await.unwrap();
    }
    let listed = |addresses: &[&str]| json!({"bookies": addresses.iter().map(|a| json!({"bookieId": a})).collect::<Vec<_>>()});
    let r = app.get("/admin/v2/bookies/all").await;
    assert_eq!((r.status, r.json()), (StatusCode::OK, listed(&["h:1", "h:2", "h:3"])));
    app.store.expire_session().unwrap();
    let r = app.get("/admin/v2/bookies/all").await;
    assert_eq!(r.json(), listed(&["h:1", "h:2"]), "nodes with a cookie stay listed when down");
}

#[tokio::test]
async fn unknown_routes_and_methods() {
    let app = App::new().await;
    let r = app.get("/admin/v2/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.reason(), "Not Found");
    let r = app.call(Method::PATCH, T1, "").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn bootstrap_is_idempotent_and_preserves_existing_values() {
    let store = MemoryStore::new();
    bootstrap(&store, "standalone").await.unwrap();
    // A later change must survive a second bootstrap.
    store
        .put(
            &keys::tenant("public"),
            Bytes::from_static(br#"{"adminRoles":["admin"],"allowedClusters":["standalone"]}"#),
            ExpectedVersion::Any,
        )
        .await
        .unwrap();
    bootstrap(&store, "standalone").await.unwrap();
    assert_eq!(store.list_children(keys::TENANTS_ROOT).await.unwrap(), vec!["public", "pulsar"]);
    let public = store.get(&keys::tenant("public")).await.unwrap().unwrap();
    assert_eq!(public.version, 2);
    assert!(std::str::from_utf8(&public.value).unwrap().contains("admin"));
    let ns = store.get(&keys::namespace("public", "default")).await.unwrap().unwrap();
    assert_eq!(ns.version, 1);
    let policies: serde_json::Value = serde_json::from_slice(&ns.value).unwrap();
    assert_eq!(policies["bundles"]["numBundles"], 4, "Pulsar's defaultNumberOfNamespaceBundles");
    assert!(store.get(&keys::namespace("pulsar", "system")).await.unwrap().is_some());
    assert!(bootstrap(&store, "bad/cluster").await.is_err());
}

#[tokio::test]
async fn bootstrapped_layout_is_visible_through_the_api() {
    let app = App::new().await;
    assert_eq!(app.get("/admin/v2/tenants").await.json(), json!(["public", "pulsar"]));
    let r = app.get("/admin/v2/tenants/public").await;
    assert_eq!(r.json(), json!({"adminRoles": [], "allowedClusters": ["standalone"]}));
    assert_eq!(app.get("/admin/v2/namespaces/public").await.json(), json!(["public/default"]));
    let r = app.get("/admin/v2/namespaces/public/default").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["replication_clusters"], json!(["standalone"]));
    assert_eq!(r.json()["bundles"]["numBundles"], 4);
}

#[tokio::test]
async fn tenants_crud() {
    let app = App::new().await;
    let body = r#"{"adminRoles":["r2","r1","r1"],"allowedClusters":["standalone"]}"#;
    assert_eq!(app.put("/admin/v2/tenants/acme", body).await.status, StatusCode::NO_CONTENT);
    let r = app.get("/admin/v2/tenants/acme").await;
    assert_eq!(r.json(), json!({"adminRoles": ["r1", "r2"], "allowedClusters": ["standalone"]}));

    let r = app.put("/admin/v2/tenants/acme", body).await;
    assert_eq!((r.status, r.reason().as_str()), (StatusCode::CONFLICT, "Tenant already exist"));

    let r = app.put("/admin/v2/tenants/bad%24name", body).await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::PRECONDITION_FAILED, "Tenant name is not valid")
    );
    for empty in ["", "{}", r#"{"allowedClusters":[]}"#, r#"{"allowedClusters":[" "]}"#] {
        let r = app.put("/admin/v2/tenants/other", empty).await;
        assert_eq!(r.status, StatusCode::PRECONDITION_FAILED, "{empty}");
        assert_eq!(r.reason(), "Clusters can not be empty");
    }
    let r = app.put("/admin/v2/tenants/other", r#"{"allowedClusters":["nowhere"]}"#).await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::PRECONDITION_FAILED, "Clusters do not exist")
    );
    for bad in ["{", "[1]", r#"{"allowedClusters":"standalone"}"#, "\u{0}"] {
        let r = app.put("/admin/v2/tenants/other", bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(!r.reason().is_empty());
    }

    // Update.
    let r =
        app.post("/admin/v2/tenants/acme", r#"{"allowedClusters":["standalone","global"]}"#).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get("/admin/v2/tenants/acme").await.json()["allowedClusters"],
        json!(["global", "standalone"])
    );
    let r = app.post("/admin/v2/tenants/ghost", body).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Delete refuses while namespaces exist.
    assert_eq!(app.put("/admin/v2/namespaces/acme/ns1", "").await.status, StatusCode::NO_CONTENT);
    let r = app.delete("/admin/v2/tenants/acme").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::CONFLICT, "The tenant still has active namespaces")
    );
    assert_eq!(app.delete("/admin/v2/namespaces/acme/ns1").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.delete("/admin/v2/tenants/acme").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get("/admin/v2/tenants/acme").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.delete("/admin/v2/tenants/acme").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.get("/admin/v2/tenants/..").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.get("/admin/v2/tenants/%FF").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.get("/admin/v2/tenants").await.json(), json!(["public", "pulsar"]));
}

#[tokio::test]
async fn namespaces_crud() {
    let app = App::new().await;
    let ns = "/admin/v2/namespaces/public/ns2";
    assert_eq!(app.put(ns, "").await.status, StatusCode::NO_CONTENT);
    let r = app.put(ns, "").await;
    assert_eq!((r.status, r.reason().as_str()), (StatusCode::CONFLICT, "Namespace already exists"));
    assert_eq!(
        app.get("/admin/v2/namespaces/public").await.json(),
        json!(["public/default", "public/ns2"])
    );

    // A Policies body is kept and merged over the defaults.
    let r = app
        .put(
            "/admin/v2/namespaces/public/ns3",
            r#"{"bundles":{"numBundles":4},"replication_clusters":["standalone"]}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let p = app.get("/admin/v2/namespaces/public/ns3").await.json();
    assert_eq!(p["bundles"]["numBundles"], json!(4));
    assert_eq!(p["bundles"]["boundaries"].as_array().map(Vec::len), Some(5));
    assert_eq!(p["deleted"], json!(false));

    let r = app.put("/admin/v2/namespaces/public/ns4", r#"{"replication_clusters":["x"]}"#).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = app.put("/admin/v2/namespaces/public/ns4", "[]").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = app.put("/admin/v2/namespaces/ghost/ns", "").await;
    assert_eq!((r.status, r.reason().as_str()), (StatusCode::NOT_FOUND, "Tenant does not exist"));
    let r = app.put("/admin/v2/namespaces/public/b%20ad", "").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::PRECONDITION_FAILED, "Namespace name is not valid")
    );
    assert_eq!(app.get("/admin/v2/namespaces/ghost").await.status, StatusCode::NOT_FOUND);
    let r = app.get("/admin/v2/namespaces/public/missing").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::NOT_FOUND, "Namespace does not exist")
    );

    // Not empty while a topic exists.
    assert_eq!(
        app.put("/admin/v2/persistent/public/ns2/t/partitions", "2").await.status,
        StatusCode::NO_CONTENT
    );
    let r = app.delete(ns).await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::CONFLICT, "Cannot delete non empty namespace")
    );
    assert_eq!(
        app.delete("/admin/v2/persistent/public/ns2/t/partitions").await.status,
        StatusCode::NO_CONTENT
    );
    app.broker_creates_topic("non-persistent://public/ns2/np").await;
    assert_eq!(app.delete(ns).await.status, StatusCode::CONFLICT);
    app.store.delete("/topics/public/ns2/non-persistent/np", ExpectedVersion::Any).await.unwrap();
    // Only system topics left: they go with the namespace.
    app.broker_creates_topic("persistent://public/ns2/__change_events").await;
    assert_eq!(app.delete(ns).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(ns).await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.delete(ns).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn partitioned_topic_lifecycle() {
    let app = App::new().await;
    assert_eq!(app.put(T1, "3").await.status, StatusCode::NO_CONTENT);
    let r = app.get(T1).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), json!({"partitions": 3}));
    let stored = app
        .store
        .get("/admin/partitioned-topics/public/default/persistent/t1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&stored.value[..], br#"{"partitions":3}"#);

    let r = app.put(T1, "3").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::CONFLICT, "This topic already exists")
    );

    // Grow, no-op, shrink.
    assert_eq!(app.post(T1, "5").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(T1).await.json(), json!({"partitions": 5}));
    assert_eq!(app.post(T1, "5").await.status, StatusCode::NO_CONTENT);
    let r = app.post(T1, "4").await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.reason(), "Expect partitions 4 can't less than current partitions 5.");
    assert_eq!(app.post(T1, "0").await.status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(app.post(T1, "x").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.post(T1, "10001").await.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = app.post("/admin/v2/persistent/public/default/nope/partitions", "4").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.reason(), "Topic persistent://public/default/nope is not the partitioned topic.");

    // The non-persistent domain is separate.
    let np = "/admin/v2/non-persistent/public/default/t1/partitions";
    assert_eq!(app.get(np).await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.put(np, "1").await.status, StatusCode::NO_CONTENT);

    assert_eq!(app.delete(T1).await.status, StatusCode::NO_CONTENT);
    let r = app.get(T1).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.reason(), "Topic persistent://public/default/t1 not found");
    let r = app.delete(T1).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Re-creating after a delete works.
    assert_eq!(app.put(T1, "1").await.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn create_partitioned_bad_bodies_and_limits() {
    let app = App::new().await;
    for (body, status) in [
        ("", StatusCode::BAD_REQUEST),
        ("abc", StatusCode::BAD_REQUEST),
        ("{", StatusCode::BAD_REQUEST),
        ("1.5", StatusCode::BAD_REQUEST),
        ("1e3", StatusCode::BAD_REQUEST),
        ("[3]", StatusCode::BAD_REQUEST),
        ("2147483648", StatusCode::BAD_REQUEST),
        ("-9223372036854775809", StatusCode::BAD_REQUEST),
        ("340282366920938463463374607431768211456", StatusCode::BAD_REQUEST),
        ("0", StatusCode::NOT_ACCEPTABLE),
        ("-3", StatusCode::NOT_ACCEPTABLE),
        ("2147483647", StatusCode::NOT_ACCEPTABLE),
        ("10001", StatusCode::NOT_ACCEPTABLE),
    ] {
        let r = app.put(T1, body).await;
        assert_eq!(r.status, status, "body {body:?}: {}", r.body);
        assert!(!r.reason().is_empty(), "body {body:?}");
        assert!(r.content_type.starts_with("application/json"));
    }
    let r = app.put(T1, "0").await;
    assert_eq!(r.reason(), "Number of partitions should be more than 0");
    let r = app.put(T1, "10001").await;
    assert_eq!(r.reason(), "Number of partitions should be less than or equal to 10000");
    assert_eq!(app.get(T1).await.status, StatusCode::NOT_FOUND);

    // Jackson-style coercions and the PartitionedTopicMetadata form.
    assert_eq!(app.put(T1, "\"2\"").await.status, StatusCode::NO_CONTENT);
    let t2 = "/admin/v2/persistent/public/default/t2/partitions";
    let r = app.put(t2, r#"{"partitions":2,"properties":{"k":"v"}}"#).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(t2).await.json(), json!({"partitions": 2, "properties": {"k": "v"}}));

    // Oversized bodies are refused without buffering them whole.
    let big = vec![b' '; 3 * 1024 * 1024];
    let r = app.call(Method::PUT, t2, big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn max_partitions_is_configurable() {
    let store = Arc::new(MemoryStore::new());
    bootstrap(store.as_ref(), "standalone").await.unwrap();
    let app = App {
        router: router(
            AdminState::new(store.clone(), Arc::new(NoopHooks), "standalone")
                .with_max_partitions_per_topic(4),
        ),
        store,
    };
    assert_eq!(app.put(T1, "5").await.status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(app.put(T1, "4").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.post(T1, "5").await.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn create_partitioned_conflicts_and_missing_namespace() {
    let app = App::new().await;
    let r = app.put("/admin/v2/persistent/public/nope/t/partitions", "2").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::NOT_FOUND, "Namespace does not exist")
    );
    let r = app.put("/admin/v2/persistent/ghost/ns/t/partitions", "2").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // A non-partitioned topic with the same name exists.
    app.broker_creates_topic("persistent://public/default/plain").await;
    let r = app.put("/admin/v2/persistent/public/default/plain/partitions", "2").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::CONFLICT, "This topic already exists")
    );
    let r = app.get("/admin/v2/persistent/public/default/plain/partitions").await;
    assert_eq!((r.status, r.json()), (StatusCode::OK, json!({"partitions": 0})));
    let r = app.delete("/admin/v2/persistent/public/default/plain/partitions").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.reason().contains("is a non-partitioned topic"), "{}", r.reason());

    // Left-over partitions beyond the requested count.
    app.broker_creates_topic("persistent://public/default/old-partition-4").await;
    let r = app.put("/admin/v2/persistent/public/default/old/partitions", "3").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        r.reason(),
        "The topic has a max partition index of 4, the number of partitions must be at least 5"
    );
    let r = app.put("/admin/v2/persistent/public/default/old/partitions", "5").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);

    // Names containing -partition- cannot be partitioned topics.
    let r = app.put("/admin/v2/persistent/public/default/x-partition-1/partitions", "2").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (
            StatusCode::PRECONDITION_FAILED,
            "Partitioned Topic Name should not contain '-partition-'"
        )
    );
}

#[tokio::test]
async fn get_partitions_of_missing_and_partition_topics() {
    let app = App::new().await;
    let missing = "/admin/v2/persistent/public/default/missing/partitions";
    assert_eq!(app.get(missing).await.status, StatusCode::NOT_FOUND);
    let r = app.get(&format!("{missing}?checkAllowAutoCreation=true")).await;
    assert_eq!((r.status, r.json()), (StatusCode::OK, json!({"partitions": 0})));
    assert_eq!(
        app.get("/admin/v2/persistent/public/nope/x/partitions?checkAllowAutoCreation=true")
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    assert_eq!(app.put(T1, "2").await.status, StatusCode::NO_CONTENT);
    let p1 = "/admin/v2/persistent/public/default/t1-partition-1/partitions";
    assert_eq!(app.get(p1).await.json(), json!({"partitions": 0}));
    let p2 = "/admin/v2/persistent/public/default/t1-partition-2/partitions";
    assert_eq!(app.get(p2).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn names_are_validated_and_decoded_like_pulsar() {
    let app = App::new().await;
    for (uri, status) in [
        ("/admin/v2/persistent/public/default/%ZZ/partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/public/default/%FF%FE/partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/public/default/a%2Fb/partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/public/default/../partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/public/default/./partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/public/default/%2E%2E/partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/pub%20lic/default/t/partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/public/de*fault/t/partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/persistent/public/default//partitions", StatusCode::PRECONDITION_FAILED),
        ("/admin/v2/Persistent/public/default/t/partitions", StatusCode::NOT_FOUND),
    ] {
        let r = app.put(uri, "2").await;
        assert_eq!(r.status, status, "{uri}: {}", r.body);
        assert!(!r.reason().is_empty(), "{uri}");
    }
    let huge = format!("/admin/v2/persistent/public/default/{}/partitions", "x".repeat(5000));
    let r = app.put(&huge, "2").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::PRECONDITION_FAILED, "Topic name is not valid")
    );

    // '+' is a space (Java URLDecoder), %2B a plus; non-ASCII round-trips.
    let r = app.put("/admin/v2/persistent/public/default/my+topic/partitions", "1").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get("/admin/v2/persistent/public/default/my%20topic/partitions").await.json()
            ["partitions"],
        1
    );
    let r = app.put("/admin/v2/persistent/public/default/a%2Bb/partitions", "1").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = app.put("/admin/v2/persistent/public/default/%C3%BC%E2%82%AC/partitions", "1").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let listed = app.get("/admin/v2/persistent/public/default/partitioned").await.json();
    assert_eq!(
        listed,
        json!([
            "persistent://public/default/a+b",
            "persistent://public/default/my topic",
            "persistent://public/default/ü€"
        ])
    );
    assert!(app
        .store
        .get("/admin/partitioned-topics/public/default/persistent/my+topic")
        .await
        .unwrap()
        .is_some());
    assert!(app
        .store
        .get("/admin/partitioned-topics/public/default/persistent/a%2Bb")
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn topic_listing_merges_all_sources() {
    #[derive(Default)]
    struct ListHooks;
    #[async_trait]
    impl BrokerHooks for ListHooks {
        async fn create_topic(&self, _: &TopicName) -> Result<(), HookError> {
            Ok(())
        }
        async fn delete_topic(&self, _: &TopicName, _: bool) -> Result<(), HookError> {
            Ok(())
        }
        async fn list_topics(
            &self,
            ns: &NamespaceName,
            domain: TopicDomain,
        ) -> Result<Vec<String>, HookError> {
            Ok(match (ns.to_string().as_str(), domain) {
                ("public/default", TopicDomain::NonPersistent) => vec![
                    "live".to_string(),
                    "non-persistent://public/default/live2".to_string(),
                    "non-persistent://other/ns/ignored".to_string(),
                    "bad/name".to_string(),
                ],
                _ => vec![],
            })
        }
    }
    let app = App::with_hooks(Arc::new(ListHooks)).await;
    assert_eq!(app.put(T1, "2").await.status, StatusCode::NO_CONTENT);
    app.broker_creates_topic("persistent://public/default/plain").await;
    app.broker_creates_topic("persistent://public/default/t1-partition-0").await;
    app.broker_creates_topic("persistent://public/default/__change_events").await;

    let r = app.get("/admin/v2/persistent/public/default").await;
    assert_eq!(
        r.json(),
        json!([
            "persistent://public/default/plain",
            "persistent://public/default/t1-partition-0",
            "persistent://public/default/t1-partition-1"
        ])
    );
    let r = app.get("/admin/v2/persistent/public/default?includeSystemTopic=true").await;
    assert_eq!(r.json().as_array().map(Vec::len), Some(4));
    let r = app.get("/admin/v2/non-persistent/public/default").await;
    assert_eq!(
        r.json(),
        json!(["non-persistent://public/default/live", "non-persistent://public/default/live2"])
    );
    let r = app.get("/admin/v2/persistent/public/default/partitioned").await;
    assert_eq!(r.json(), json!(["persistent://public/default/t1"]));
    let r = app.get("/admin/v2/namespaces/public/default/topics?mode=ALL").await;
    assert_eq!(r.json().as_array().map(Vec::len), Some(5));
    let r = app.get("/admin/v2/namespaces/public/default/topics").await;
    assert_eq!(r.json().as_array().map(Vec::len), Some(3));
    assert_eq!(
        app.get("/admin/v2/namespaces/public/default/topics?mode=bogus").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(app.get("/admin/v2/persistent/public/nope").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        app.get("/admin/v2/persistent/public/nope/partitioned").await.status,
        StatusCode::NOT_FOUND
    );
}

/// Hooks that record calls and can be told to refuse deletes.
#[derive(Default)]
struct RecordingHooks {
    calls: Mutex<Vec<String>>,
    refuse_delete: AtomicBool,
}

impl RecordingHooks {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl BrokerHooks for RecordingHooks {
    async fn create_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        self.calls.lock().unwrap().push(format!("create {topic}"));
        Ok(())
    }

    async fn delete_topic(&self, topic: &TopicName, force: bool) -> Result<(), HookError> {
        self.calls.lock().unwrap().push(format!("delete {topic} {force}"));
        if self.refuse_delete.load(Ordering::SeqCst) {
            return Err(HookError::PreconditionFailed(
                "Topic has active producers/subscriptions".to_string(),
            ));
        }
        if topic.partition_index() == Some(1) {
            return Err(HookError::NotFound("never used".to_string()));
        }
        Ok(())
    }

    async fn partitions_updated(
        &self,
        topic: &TopicName,
        old: u32,
        new: u32,
    ) -> Result<(), HookError> {
        self.calls.lock().unwrap().push(format!("partitions {topic} {old}->{new}"));
        Ok(())
    }

    async fn ready(&self) -> Result<(), HookError> {
        Err(HookError::Unavailable("metadata session lost".to_string()))
    }

    async fn health_check(&self) -> Result<(), HookError> {
        Err(HookError::Unavailable("ledger storage down".to_string()))
    }

    async fn metrics(&self, _format: magnetar_metrics::Format) -> Vec<String> {
        vec!["magnetar_up".to_string(), String::new(), " 1\n".to_string()]
    }
}

#[tokio::test]
async fn hooks_are_called() {
    let hooks = Arc::new(RecordingHooks::default());
    let app = App::with_hooks(hooks.clone()).await;
    assert_eq!(app.put(T1, "2").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.post(T1, "3").await.status, StatusCode::NO_CONTENT);

    hooks.refuse_delete.store(true, Ordering::SeqCst);
    let r = app.delete(T1).await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::PRECONDITION_FAILED, "Topic has active producers/subscriptions")
    );
    assert_eq!(app.get(T1).await.json(), json!({"partitions": 3}), "metadata kept");
    hooks.refuse_delete.store(false, Ordering::SeqCst);
    assert_eq!(app.delete(&format!("{T1}?force=true")).await.status, StatusCode::NO_CONTENT);

    // Non-partitioned create / delete go to the broker.
    let plain = "/admin/v2/persistent/public/default/plain";
    assert_eq!(app.put(plain, "").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.delete(plain).await.status, StatusCode::NOT_FOUND, "hooks did not create a key");
    app.broker_creates_topic("persistent://public/default/plain").await;
    assert_eq!(app.put(plain, "").await.status, StatusCode::CONFLICT);
    assert_eq!(app.delete(plain).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.put(T1, "1").await.status, StatusCode::NO_CONTENT);
    let r = app.put("/admin/v2/persistent/public/default/t1", "").await;
    assert_eq!(r.status, StatusCode::CONFLICT, "partitioned topic of that name exists");
    assert_eq!(
        app.put("/admin/v2/persistent/public/nope/t", "").await.status,
        StatusCode::NOT_FOUND
    );

    assert_eq!(
        hooks.calls(),
        vec![
            "partitions persistent://public/default/t1 0->2",
            "partitions persistent://public/default/t1 2->3",
            "delete persistent://public/default/t1-partition-0 false",
            "delete persistent://public/default/t1-partition-0 true",
            "delete persistent://public/default/t1-partition-1 true",
            "delete persistent://public/default/t1-partition-2 true",
            "create persistent://public/default/plain",
            "delete persistent://public/default/plain false",
            "partitions persistent://public/default/t1 0->1",
        ]
    );

    let r = app.get("/admin/v2/brokers/ready").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "metadata session lost")
    );
    let r = app.get("/admin/v2/brokers/health").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "ledger storage down")
    );
    assert_eq!(app.get("/metrics").await.body, "magnetar_up 1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_have_one_winner() {
    let app = Arc::new(App::new().await);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move { app.put(T1, "4").await.status }));
    }
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::NO_CONTENT => created += 1,
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(created, 1);
}

/// Policy writes to one namespace at the same moment each re-read the document when another
/// won the compare-and-set: every one lands, none is lost or refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_policy_updates_of_one_namespace_all_land() {
    let app = Arc::new(App::new().await);
    let ns = "/admin/v2/namespaces/public/default";
    let updates: [(&str, &str); 8] = [
        ("messageTTL", "60"),
        ("maxProducersPerTopic", "7"),
        ("maxConsumersPerTopic", "8"),
        ("maxConsumersPerSubscription", "9"),
        ("maxUnackedMessagesPerConsumer", "10"),
        ("maxUnackedMessagesPerSubscription", "11"),
        ("deduplication", "true"),
        ("retention", r#"{"retentionTimeInMinutes":60,"retentionSizeInMB":100}"#),
    ];
    let mut tasks = Vec::new();
    for (policy, body) in updates {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            (policy, app.post(&format!("{ns}/{policy}"), body).await.status)
        }));
    }
    for task in tasks {
        let (policy, status) = task.await.unwrap();
        assert_eq!(status, StatusCode::NO_CONTENT, "{policy}");
    }
    for (policy, body) in updates {
        let stored = app.get(&format!("{ns}/{policy}")).await.json();
        assert_eq!(stored, serde_json::from_str::<Value>(body).unwrap(), "{policy}");
    }
}

#[tokio::test]
async fn metadata_store_failures_are_5xx() {
    let app = App::new().await;
    app.store.close().await.unwrap();
    let r = app.get(T1).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!r.reason().is_empty());
    assert_eq!(app.get("/admin/v2/tenants").await.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn corrupt_metadata_is_a_500_not_a_panic() {
    let app = App::new().await;
    app.store
        .put(
            "/admin/partitioned-topics/public/default/persistent/t1",
            Bytes::from_static(b"garbage"),
            ExpectedVersion::Any,
        )
        .await
        .unwrap();
    assert_eq!(app.get(T1).await.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        app.get("/admin/v2/persistent/public/default").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[tokio::test]
async fn serves_over_a_real_listener_with_graceful_shutdown() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let store = Arc::new(MemoryStore::new());
    bootstrap(store.as_ref(), "standalone").await.unwrap();
    let state = AdminState::new(store, Arc::new(NoopHooks), "standalone");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(magnetar_admin::serve(listener, router(state), async move {
        let _ = stop_rx.await;
    }));

    let request = |raw: String| async move {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(raw.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        conn.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    let resp = request(
        "GET /admin/v2/brokers/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into(),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with("ok"), "{resp}");
    let body = "2";
    let resp = request(format!(
        "PUT /admin/v2/persistent/public/default/my+t/partitions HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
    .await;
    assert!(resp.starts_with("HTTP/1.1 204"), "{resp}");
    let resp = request(
        "GET /admin/v2/persistent/public/default/my%20t/partitions HTTP/1.1\r\nHost: x\r\n\
         Connection: close\r\n\r\n"
            .into(),
    )
    .await;
    assert!(resp.ends_with(r#"{"partitions":2}"#), "{resp}");

    stop_tx.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn schema_endpoints() {
    let app = App::new().await;
    let base = "/admin/v2/schemas/public/default/sch%20ema";
    let v1 = r#"{"type":"record","name":"U","fields":[{"name":"a","type":"int"}]}"#;
    let v2 = r#"{"type":"record","name":"U","fields":[{"name":"a","type":"int"},{"name":"b","type":["null","string"],"default":null}]}"#;
    let bad = r#"{"type":"record","name":"U","fields":[{"name":"a","type":"string"}]}"#;
    let payload = |schema: &str| json!({"type": "AVRO", "schema": schema}).to_string();

    assert_eq!(app.get(&format!("{base}/schema")).await.status, StatusCode::NOT_FOUND);
    let r = app.call(Method::POST, &format!("{base}/schema"), payload(v1)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    assert_eq!(r.json(), json!({"version": {"version": 0}}));
    let r = app.call(Method::POST, &format!("{base}/schema"), payload(v1)).await;
    assert_eq!(r.json(), json!({"version": {"version": 0}}), "same schema, same version");
    let r = app.call(Method::POST, &format!("{base}/schema"), payload(v2)).await;
    assert_eq!(r.json(), json!({"version": {"version": 1}}));
    let r = app.call(Method::POST, &format!("{base}/schema"), payload(bad)).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let r = app.call(Method::POST, &format!("{base}/schema"), payload("{nope")).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);

    let r = app.get(&format!("{base}/schema")).await;
    assert_eq!(r.status, StatusCode::OK);
    let latest = r.json();
    assert_eq!((latest["version"].as_u64(), latest["type"].as_str()), (Some(1), Some("AVRO")));
    assert_eq!(latest["data"], v2);
    assert_eq!(app.get(&format!("{base}/schema/0")).await.json()["data"], v1);
    assert_eq!(app.get(&format!("{base}/schema/9")).await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.get(&format!("{base}/schema/x")).await.status, StatusCode::BAD_REQUEST);
    let all = app.get(&format!("{base}/schemas")).await.json();
    let versions: Vec<u64> = all["getSchemaResponses"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["version"].as_u64())
        .collect();
    assert_eq!(versions, vec![0, 1]);

    let r = app.call(Method::POST, &format!("{base}/compatibility"), payload(bad)).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.json()["reason"].as_str().unwrap().contains("cannot read"), "{:?}", r.json());
    let r = app.call(Method::POST, &format!("{base}/compatibility"), payload(v1)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.json(), json!({"compatibility": true, "schemaCompatibilityStrategy": "FULL"}));
    let r = app.call(Method::POST, &format!("{base}/compatibility"), r#"{"type":"NOPE"}"#).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let r = app.call(Method::DELETE, &format!("{base}/schema"), "").await;
    assert_eq!(r.json(), json!({"version": 2}));
    let r = app.get(&format!("{base}/schema")).await;
    assert_eq!((r.status, r.reason()), (StatusCode::NOT_FOUND, "Schema is deleted".to_string()));
    assert_eq!(app.get(&format!("{base}/schemas")).await.json()["getSchemaResponses"], json!([]));
    let r = app.call(Method::DELETE, &format!("{base}/schema"), "").await;
    assert_eq!(r.json(), json!({"version": -1}), "nothing left to delete");
    // The history lives under the topic's schema key.
    assert!(app.store.get("/schemas/public/default/sch+ema").await.unwrap().is_some());
    assert_eq!(
        app.get("/admin/v2/schemas/public/nope/t/schema").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn forced_deletes_take_everything_beneath() {
    let hooks = Arc::new(RecordingHooks::default());
    let app = App::with_hooks(hooks.clone()).await;
    let body = r#"{"allowedClusters":["standalone"]}"#;
    assert_eq!(app.put("/admin/v2/tenants/acme", body).await.status, StatusCode::NO_CONTENT);
    for ns in ["a", "b"] {
        let path = format!("/admin/v2/namespaces/acme/{ns}");
        assert_eq!(app.put(&path, "").await.status, StatusCode::NO_CONTENT);
    }
    let topic = "/admin/v2/persistent/acme/a/t/partitions";
    assert_eq!(app.put(topic, "2").await.status, StatusCode::NO_CONTENT);
    app.broker_creates_topic("persistent://acme/b/plain").await;
    let retention = r#"{"retentionTimeInMinutes":5,"retentionSizeInMB":-1}"#;
    let path = "/admin/v2/persistent/acme/a/t/retention";
    assert_eq!(app.post(path, retention).await.status, StatusCode::NO_CONTENT);

    let r = app.delete("/admin/v2/namespaces/acme/a").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let r = app.delete("/admin/v2/tenants/acme").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let r = app.delete("/admin/v2/namespaces/acme/a?force=true").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let calls = hooks.calls();
    assert!(
        calls.contains(&"delete persistent://acme/a/t-partition-0 true".to_string()),
        "{calls:?}"
    );
    assert_eq!(app.get("/admin/v2/namespaces/acme/a").await.status, StatusCode::NOT_FOUND);
    assert!(app.store.get("/admin/topic-policies/acme/a/persistent/t").await.unwrap().is_none());
    assert!(app
        .store
        .get("/admin/partitioned-topics/acme/a/persistent/t")
        .await
        .unwrap()
        .is_none());

    let r = app.delete("/admin/v2/tenants/acme?force=true").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(hooks.calls().contains(&"delete persistent://acme/b/plain true".to_string()));
    assert_eq!(app.get("/admin/v2/tenants/acme").await.status, StatusCode::NOT_FOUND);
    assert!(app.store.get("/topics/acme/b/persistent/plain").await.unwrap().is_none());
}

#[tokio::test]
async fn namespace_policies_round_trip() {
    let app = App::new().await;
    let ns = "/admin/v2/namespaces/public/default";
    // Unset: 204.
    for policy in
        ["retention", "messageTTL", "maxProducersPerTopic", "dispatchRate", "deduplication"]
    {
        assert_eq!(
            app.get(&format!("{ns}/{policy}")).await.status,
            StatusCode::NO_CONTENT,
            "{policy}"
        );
    }
    let r = app
        .post(
            &format!("{ns}/retention"),
            r#"{"retentionTimeInMinutes":60,"retentionSizeInMB":100}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&format!("{ns}/retention")).await.json(),
        json!({"retentionTimeInMinutes":60,"retentionSizeInMB":100})
    );
    let r = app
        .post(&format!("{ns}/retention"), r#"{"retentionTimeInMinutes":0,"retentionSizeInMB":100}"#)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.reason().starts_with("Invalid retention policy"), "{}", r.reason());

    let r = app.post(&format!("{ns}/messageTTL"), "-1").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::PRECONDITION_FAILED, "Invalid value for message TTL")
    );
    assert_eq!(app.post(&format!("{ns}/messageTTL"), "30").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("{ns}/messageTTL")).await.json(), json!(30));

    // A size quota at or above the retention size is refused.
    let quota = r#"{"limitSize":209715200,"limitTime":-1,"policy":"producer_request_hold"}"#;
    let r = app.post(&format!("{ns}/backlogQuota"), quota).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    let quota = r#"{"limitSize":1048576,"policy":"producer_exception"}"#;
    assert_eq!(app.post(&format!("{ns}/backlogQuota"), quota).await.status, StatusCode::NO_CONTENT);
    let quota = r#"{"limitTime":30,"policy":"consumer_backlog_eviction"}"#;
    let r = app.post(&format!("{ns}/backlogQuota?backlogQuotaType=message_age"), quota).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let map = app.get(&format!("{ns}/backlogQuotaMap")).await.json();
    assert_eq!(map["destination_storage"]["limitSize"], json!(1048576));
    assert_eq!(map["message_age"]["limitTime"], json!(30));
    let r = app.post(&format!("{ns}/backlogQuota?backlogQuotaType=nope"), quota).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let rate = r#"{"dispatchThrottlingRateInMsg":100,"dispatchThrottlingRateInByte":1000,"ratePeriodInSecond":1}"#;
    assert_eq!(app.post(&format!("{ns}/dispatchRate"), rate).await.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&format!("{ns}/dispatchRate")).await.json()["dispatchThrottlingRateInMsg"],
        json!(100)
    );

    // The whole document carries everything, unknown fields kept.
    let p = app.get(ns).await.json();
    assert_eq!(p["retention_policies"]["retentionSizeInMB"], json!(100));
    assert_eq!(p["message_ttl_in_seconds"], json!(30));
    assert_eq!(p["topicDispatchRate"]["standalone"]["dispatchThrottlingRateInMsg"], json!(100));
    let quarters = json!(["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"]);
    assert_eq!(p["bundles"]["boundaries"], quarters);

    assert_eq!(app.delete(&format!("{ns}/messageTTL")).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("{ns}/messageTTL")).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.delete(&format!("{ns}/backlogQuota")).await.status, StatusCode::NO_CONTENT);
    let map = app.get(&format!("{ns}/backlogQuotaMap")).await.json();
    assert_eq!(map.as_object().map(|m| m.len()), Some(1));

    // Permissions and properties.
    let r = app.post(&format!("{ns}/permissions/role1"), r#"["produce","consume"]"#).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&format!("{ns}/permissions")).await.json(),
        json!({"role1": ["consume", "produce"]})
    );
    assert_eq!(
        app.post(&format!("{ns}/permissions/role1"), r#"["fly"]"#).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(app.delete(&format!("{ns}/permissions/role1")).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("{ns}/permissions")).await.json(), json!({}));
    assert_eq!(app.put(&format!("{ns}/property/k/v"), "").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("{ns}/property/k")).await.body, "v");
    assert_eq!(app.get(&format!("{ns}/properties")).await.json(), json!({"k": "v"}));

    // Missing namespace: 404.
    let r = app.post("/admin/v2/namespaces/public/ghost/messageTTL", "5").await;
    assert_eq!(
        (r.status, r.reason().as_str()),
        (StatusCode::NOT_FOUND, "Namespace does not exist")
    );
    assert_eq!(
        app.get("/admin/v2/namespaces/public/default/bundles").await.json()["numBundles"],
        json!(4)
    );
    assert_eq!(
        app.put("/admin/v2/namespaces/public/default/unload", "").await.status,
        StatusCode::NO_CONTENT
    );
    let r = app.put("/admin/v2/namespaces/public/default/0x40000000_0x80000000/unload", "").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = app.put("/admin/v2/namespaces/public/default/0x00000000_0xffffffff/unload", "").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "not one of its bundles");
    let r = app.put("/admin/v2/namespaces/public/default/0x00000000_0x0fffffff/unload", "").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn topic_policies_and_applied_values() {
    let app = App::new().await;
    let ns = "/admin/v2/namespaces/public/default";
    let topic = "/admin/v2/persistent/public/default/tp";
    assert_eq!(app.get(&format!("{topic}/messageTTL")).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("{topic}/messageTTL?applied=true")).await.json(), json!(0));
    assert_eq!(app.post(&format!("{ns}/messageTTL"), "40").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("{topic}/messageTTL?applied=true")).await.json(), json!(40));
    assert_eq!(
        app.post(&format!("{topic}/messageTTL?messageTTL=7"), "").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.get(&format!("{topic}/messageTTL")).await.json(), json!(7));
    let r = app.post(&format!("{topic}/messageTTL?messageTTL=-3"), "").await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    // Partitions share their topic's document.
    assert_eq!(app.get(&format!("{topic}-partition-1/messageTTL")).await.json(), json!(7));

    let retention = r#"{"retentionTimeInMinutes":-1,"retentionSizeInMB":-1}"#;
    assert_eq!(
        app.post(&format!("{topic}/retention"), retention).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.get(&format!("{topic}/retention")).await.json()["retentionTimeInMinutes"],
        json!(-1)
    );
    assert_eq!(
        app.get(&format!("{topic}/maxUnackedMessagesOnConsumer?applied=true")).await.json(),
        json!(50000)
    );
    assert_eq!(
        app.post(&format!("{topic}/maxProducers"), "-1").await.status,
        StatusCode::PRECONDITION_FAILED
    );
    assert_eq!(
        app.post(&format!("{topic}/maxProducers"), "3").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.get(&format!("{topic}/backlogQuotaMap?applied=true")).await.json(), json!({}));
    let r = app.post(&format!("{topic}/maxMessageSize"), "999999999").await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(
        app.post(&format!("{topic}/deduplicationEnabled"), "true").await.status,
        StatusCode::NO_CONTENT
    );

    let stored: Value = serde_json::from_slice(
        &app.store
            .get("/admin/topic-policies/public/default/persistent/tp")
            .await
            .unwrap()
            .unwrap()
            .value,
    )
    .unwrap();
    assert_eq!(stored["messageTTLInSeconds"], json!(7));
    assert_eq!(stored["maxProducerPerTopic"], json!(3));
    assert_eq!(stored["deduplicationEnabled"], json!(true));
    assert_eq!(app.delete(&format!("{topic}/messageTTL")).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("{topic}/messageTTL")).await.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn broker_endpoints() {
    let app = App::new().await;
    assert_eq!(app.get("/admin/v2/brokers").await.json(), json!([]));
    let leader = app.get("/admin/v2/brokers/leaderBroker").await.json();
    assert_eq!(leader["serviceUrl"], json!("http://localhost:8080"));
    let names = app.get("/admin/v2/brokers/configuration").await.json();
    assert!(names.as_array().unwrap().contains(&json!("allowAutoSubscriptionCreation")));
    assert_eq!(app.get("/admin/v2/brokers/configuration/values").await.json(), json!({}));
    let runtime = app.get("/admin/v2/brokers/configuration/runtime").await.json();
    assert_eq!(runtime["clusterName"], json!("standalone"));
    let r = app.post("/admin/v2/brokers/configuration/foo/1", "").await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(r.json()["reason"], json!(" Can't update non-dynamic configuration"));
    let r = app.post("/admin/v2/brokers/configuration/allowAutoTopicCreation/maybe", "").await;
    assert_eq!(r.json()["reason"], json!(" Invalid dynamic-config value"));
    let r = app.post("/admin/v2/brokers/configuration/allowAutoTopicCreation/false", "").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get("/admin/v2/brokers/configuration/values").await.json(),
        json!({"allowAutoTopicCreation": "false"})
    );
    let r = app.call(Method::DELETE, "/admin/v2/brokers/configuration/allowAutoTopicCreation", "");
    assert_eq!(r.await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get("/admin/v2/brokers/configuration/values").await.json(), json!({}));
    let r = app.call(Method::DELETE, "/admin/v2/brokers/configuration/maxMessageSize", "").await;
    assert_eq!(r.json()["reason"], json!("Can't delete non-dynamic configuration"));
    assert_eq!(app.get("/admin/v2/brokers/internal-configuration").await.status, StatusCode::OK);
    assert_eq!(app.get("/admin/v2/broker-stats/topics").await.json(), json!({}));
}

#[tokio::test]
async fn unknown_policy_fields_survive_policy_changes() {
    let app = App::new().await;
    let ns = "/admin/v2/namespaces/public/keep";
    let body = r#"{"x_custom":{"a":[1,2]},"offload_policies":null,"bundles":{"numBundles":2}}"#;
    assert_eq!(app.put(ns, body).await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.post(&format!("{ns}/messageTTL"), "5").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.delete(&format!("{ns}/messageTTL")).await.status, StatusCode::NO_CONTENT);
    let r = app.post(&format!("{ns}/permissions/r"), r#"["consume"]"#).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let p = app.get(ns).await.json();
    assert_eq!(p["x_custom"], json!({"a": [1, 2]}));
    assert_eq!(p["bundles"]["numBundles"], json!(2));
    assert_eq!(p["auth_policies"]["namespace_auth"], json!({"r": ["consume"]}));
    assert!(p.get("message_ttl_in_seconds").is_none());
    let r = app.put("/admin/v2/namespaces/public/keep/0x80000000_0xffffffff/unload", "").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);

    // A topic document another writer left with a field Magnetar does not model.
    let key = "/admin/topic-policies/public/keep/persistent/t";
    let raw = Bytes::from_static(br#"{"deduplicationEnabled":true,"entryFilters":{"x":1}}"#);
    app.store.put(key, raw, ExpectedVersion::Absent).await.unwrap();
    let topic = "/admin/v2/persistent/public/keep/t";
    assert_eq!(app.get(&format!("{topic}/deduplicationEnabled")).await.json(), json!(true));
    assert_eq!(
        app.post(&format!("{topic}/maxProducers"), "2").await.status,
        StatusCode::NO_CONTENT
    );
    let stored: Value =
        serde_json::from_slice(&app.store.get(key).await.unwrap().unwrap().value).unwrap();
    assert_eq!(stored["entryFilters"], json!({"x": 1}));
    assert_eq!(stored["maxProducerPerTopic"], json!(2));
}
