//! The per-topic operations of the admin API through the real router, with hooks that record
//! what the router asks of the broker: request parsing (message ids, reset targets, peek
//! positions), partitioned fan-out and refusals, statuses, and the peek response's headers.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use magnetar_admin::{
    bootstrap, router, AdminState, BrokerHooks, ExaminePosition, HookError, ResetTarget,
    SubscriptionStart, TopicName,
};
use magnetar_broker::cursor::Position;
use magnetar_broker::stats::{AdminMessage, TopicStats};
use magnetar_metadata::{ExpectedVersion, MemoryStore, MetadataStore};
use magnetar_model::keys;
use serde_json::Value;
use tower::ServiceExt;

#[derive(Default)]
struct Hooks {
    calls: Mutex<Vec<String>>,
}

impl Hooks {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

#[async_trait]
impl BrokerHooks for Hooks {
    async fn create_topic(&self, _: &TopicName) -> Result<(), HookError> {
        Ok(())
    }

    async fn delete_topic(&self, _: &TopicName, _: bool) -> Result<(), HookError> {
        Ok(())
    }

    async fn topic_stats(&self, topic: &TopicName) -> Result<TopicStats, HookError> {
        if topic.partition_index() == Some(2) {
            return Err(HookError::NotFound("never used".into()));
        }
        Ok(TopicStats { msg_in_counter: 5, storage_size: 50, ..Default::default() })
    }

    async fn subscriptions(&self, topic: &TopicName) -> Result<Vec<String>, HookError> {
        Ok(vec![format!("s{}", topic.partition_index().unwrap_or(9))])
    }

    async fn create_subscription(
        &self,
        topic: &TopicName,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<(), HookError> {
        self.record(format!("create {} {name} {start:?}", topic.local_name()));
        if name == "dup" {
            return Err(HookError::Conflict("Subscription already exists for topic".into()));
        }
        Ok(())
    }

    async fn skip_messages(
        &self,
        topic: &TopicName,
        name: &str,
        count: Option<u64>,
    ) -> Result<(), HookError> {
        self.record(format!("skip {} {name} {count:?}", topic.local_name()));
        Ok(())
    }

    async fn reset_cursor(
        &self,
        topic: &TopicName,
        name: &str,
        target: ResetTarget,
    ) -> Result<(), HookError> {
        self.record(format!("reset {} {name} {target:?}", topic.local_name()));
        Ok(())
    }

    async fn peek_message(
        &self,
        _: &TopicName,
        name: &str,
        n: u64,
    ) -> Result<AdminMessage, HookError> {
        if n > 1 {
            return Err(HookError::NotFound("Message not found".into()));
        }
        let metadata = magnetar_protocol::proto::MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 7,
            publish_time: 0,
            num_messages_in_batch: Some(3),
            properties: vec![magnetar_protocol::proto::KeyValue {
                key: "k".into(),
                value: name.into(),
            }],
            ..Default::default()
        };
        let entry = magnetar_protocol::metadata_and_payload(&metadata, b"batch").unwrap();
        Ok(AdminMessage::from_entry(Position::new(4, 2), &entry))
    }

    async fn examine_message(
        &self,
        topic: &TopicName,
        from: ExaminePosition,
        n: u64,
    ) -> Result<AdminMessage, HookError> {
        self.record(format!("examine {} {from:?} {n}", topic.local_name()));
        Err(HookError::NotFound("Message not found".into()))
    }

    async fn last_message_id(&self, _: &TopicName) -> Result<(u64, i64), HookError> {
        Ok((3, -1))
    }

    async fn unload_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        self.record(format!("unload {}", topic.local_name()));
        Ok(())
    }
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Bytes,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

struct App {
    router: Router,
    store: Arc<MemoryStore>,
    hooks: Arc<Hooks>,
}

impl App {
    async fn new() -> App {
        let store = Arc::new(MemoryStore::new());
        bootstrap(store.as_ref(), "standalone").await.unwrap();
        let hooks = Arc::new(Hooks::default());
        let state = AdminState::new(store.clone(), hooks.clone(), "standalone");
        let app = App { router: router(state), store, hooks };
        for topic in ["plain", "plain-2"] {
            let name = TopicName::parse(&format!("persistent://public/default/{topic}")).unwrap();
            app.store
                .put(&keys::topic_key(&name), Bytes::from_static(b"{}"), ExpectedVersion::Absent)
                .await
                .unwrap();
        }
        let put = app.call(Method::PUT, "/admin/v2/persistent/public/default/part/partitions", "3");
        assert_eq!(put.await.status, StatusCode::NO_CONTENT);
        app
    }

    async fn call(&self, method: Method, path: &str, body: &'static str) -> Resp {
        let req = Request::builder()
            .method(method)
            .uri(format!(
                "/admin/v2/persistent/public/default/{}",
                path.trim_start_matches("/admin/v2/persistent/public/default/")
            ))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Resp { status, headers, body }
    }
}

#[tokio::test]
async fn subscriptions_are_created_at_the_requested_position_and_fan_out_on_partitioned_topics() {
    let app = App::new().await;
    let ok = StatusCode::NO_CONTENT;
    assert_eq!(app.call(Method::PUT, "plain/subscription/a", "").await.status, ok);
    let body = r#"{"ledgerId":-1,"entryId":-1,"partitionIndex":-1}"#;
    assert_eq!(app.call(Method::PUT, "plain/subscription/b", body).await.status, ok);
    let body = r#"{"ledgerId":5,"entryId":3,"partitionIndex":-1}"#;
    assert_eq!(app.call(Method::PUT, "plain/subscription/c%20d", body).await.status, ok);
    let conflict = app.call(Method::PUT, "plain/subscription/dup", "").await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    assert_eq!(
        app.call(Method::PUT, "nope/subscription/a", "").await.status,
        StatusCode::NOT_FOUND
    );
    let bad = app.call(Method::PUT, "plain/subscription/a", "{not json").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.call(Method::PUT, "part/subscription/p", "").await.status, ok);
    assert_eq!(
        app.hooks.take(),
        [
            "create plain a Latest",
            "create plain b Earliest",
            "create plain c d At(Position { ledger_id: 5, entry_id: 3 })",
            "create plain dup Latest",
            "create part-partition-0 p Latest",
            "create part-partition-1 p Latest",
            "create part-partition-2 p Latest",
        ]
    );
    // Subscriptions of a partitioned topic: those of its partitions.
    assert_eq!(
        app.call(Method::GET, "part/subscriptions", "").await.json(),
        serde_json::json!(["s0", "s1", "s2"])
    );
}

#[tokio::test]
async fn skip_clear_and_reset_parse_their_targets_and_refuse_what_pulsar_refuses() {
    let app = App::new().await;
    let ok = StatusCode::NO_CONTENT;
    assert_eq!(app.call(Method::POST, "plain/subscription/s/skip/3", "").await.status, ok);
    assert_eq!(app.call(Method::POST, "plain/subscription/s/skip_all", "").await.status, ok);
    let bad = app.call(Method::POST, "plain/subscription/s/skip/x", "").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let refused = app.call(Method::POST, "part/subscription/s/skip/3", "").await;
    assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(app.call(Method::POST, "part/subscription/s/skip_all", "").await.status, ok);
    assert_eq!(
        app.call(Method::POST, "plain/subscription/s/resetcursor/1700000000000", "").await.status,
        ok
    );
    let body = r#"{"ledgerId":4,"entryId":2,"partitionIndex":-1,"batchIndex":-1,"excluded":true}"#;
    assert_eq!(app.call(Method::POST, "plain/subscription/s/resetcursor", body).await.status, ok);
    let body = r#"{"ledgerId":4,"entryId":2,"partitionIndex":1}"#;
    assert_eq!(app.call(Method::POST, "part/subscription/s/resetcursor", body).await.status, ok);
    assert_eq!(
        app.hooks.take(),
        [
            "skip plain s Some(3)",
            "skip plain s None",
            "skip part-partition-0 s None",
            "skip part-partition-1 s None",
            "skip part-partition-2 s None",
            "reset plain s PublishTime(1700000000000)",
            "reset plain s Position(After(Position { ledger_id: 4, entry_id: 2 }))",
            "reset part-partition-1 s Position(At(Position { ledger_id: 4, entry_id: 2 }))",
        ]
    );
}

#[tokio::test]
async fn peek_answers_the_entry_with_pulsars_headers() {
    let app = App::new().await;
    let peek = app.call(Method::GET, "plain/subscription/s/position/1", "").await;
    assert_eq!(peek.status, StatusCode::OK);
    let header = |name: &str| peek.headers.get(name).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(header("X-Pulsar-Message-ID").as_deref(), Some("4:2"));
    assert_eq!(header("X-Pulsar-num-batch-message").as_deref(), Some("3"));
    assert_eq!(header("X-Pulsar-PROPERTY-k").as_deref(), Some("s"));
    assert_eq!(header("X-Pulsar-publish-time").as_deref(), Some("1970-01-01T00:00:00.000Z"));
    assert_eq!(header("X-Pulsar-sequence-id").as_deref(), Some("7"));
    assert_eq!(&peek.body[..], b"batch");
    let past = app.call(Method::GET, "plain/subscription/s/position/2", "").await;
    assert_eq!(past.status, StatusCode::NOT_FOUND);
    assert_eq!(past.json()["reason"], "Message not found");
    let partitioned = app.call(Method::GET, "part/subscription/s/position/1", "").await;
    assert_eq!(partitioned.status, StatusCode::METHOD_NOT_ALLOWED);
    // Examine: parameters checked and passed on.
    let missing = app
        .call(Method::GET, "plain/examinemessage?initialPosition=earliest&messagePosition=4", "")
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let bad = app.call(Method::GET, "plain/examinemessage?initialPosition=middle", "").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad = app.call(Method::GET, "plain/examinemessage?messagePosition=0", "").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.hooks.take(), ["examine plain Earliest 4"]);
}

#[tokio::test]
async fn stats_last_message_id_unload_and_properties() {
    let app = App::new().await;
    let stats = app.call(Method::GET, "plain/stats", "").await;
    assert_eq!((stats.status, stats.json()["msgInCounter"].as_u64()), (StatusCode::OK, Some(5)));
    assert_eq!(app.call(Method::GET, "nope/stats", "").await.status, StatusCode::NOT_FOUND);
    // Partitioned stats add up the partitions (one never used counts as empty).
    let stats = app.call(Method::GET, "part/partitioned-stats?perPartition=true", "").await.json();
    assert_eq!(stats["msgInCounter"], 10);
    assert_eq!(stats["metadata"]["partitions"], 3);
    assert_eq!(stats["partitions"].as_object().unwrap().len(), 3);
    let stats = app.call(Method::GET, "part/partitioned-stats?perPartition=false", "").await.json();
    assert!(stats.get("partitions").is_none(), "{stats}");
    assert_eq!(
        app.call(Method::GET, "plain/partitioned-stats", "").await.status,
        StatusCode::NOT_FOUND
    );

    let id = app.call(Method::GET, "plain/lastMessageId", "").await.json();
    assert_eq!((id["ledgerId"].as_i64(), id["entryId"].as_i64()), (Some(3), Some(-1)));
    let terminate = app.call(Method::POST, "part/terminate", "").await;
    assert_eq!(terminate.status, StatusCode::METHOD_NOT_ALLOWED);

    assert_eq!(app.call(Method::PUT, "part/unload", "").await.status, StatusCode::NO_CONTENT);
    assert_eq!(app.call(Method::PUT, "plain/unload", "").await.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.hooks.take(),
        [
            "unload part-partition-0",
            "unload part-partition-1",
            "unload part-partition-2",
            "unload plain"
        ]
    );

    // Properties: merged on PUT, one removed by DELETE; partitioned ones in the metadata.
    for topic in ["plain", "part"] {
        let path = format!("{topic}/properties");
        let put = app.call(Method::PUT, &path, r#"{"a":"1","b":"2"}"#).await;
        assert_eq!(put.status, StatusCode::NO_CONTENT);
        let put = app.call(Method::PUT, &path, r#"{"b":"3"}"#).await;
        assert_eq!(put.status, StatusCode::NO_CONTENT);
        let del = app.call(Method::DELETE, &format!("{path}?key=a"), "").await;
        assert_eq!(del.status, StatusCode::NO_CONTENT);
        let got = app.call(Method::GET, &format!("{topic}/properties"), "").await.json();
        assert_eq!(got, serde_json::json!({"b": "3"}), "{topic}");
    }
    let meta = app.call(Method::GET, "part/partitions", "").await.json();
    assert_eq!(meta, serde_json::json!({"partitions": 3, "properties": {"b": "3"}}));
    assert_eq!(app.call(Method::GET, "nope/properties", "").await.status, StatusCode::NOT_FOUND);
    let bad = app.call(Method::PUT, "plain/properties", "[1]").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}
