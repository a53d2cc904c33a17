//! Authorization on the connection: the checks of PRODUCER, SUBSCRIBE, LOOKUP,
//! PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE and the schema commands (the answer is the
//! command's error with `AuthorizationError`), and the re-check of open producers and consumers
//! when a namespace's or tenant's permissions change (the ones no longer allowed are closed
//! with CLOSE_PRODUCER / CLOSE_CONSUMER; their client reconnects and meets the refusal).

use super::*;
use crate::authorization::PermissionChange;
use magnetar_model::names::NamespaceName;
use tokio::sync::broadcast;

/// Whether `principal` may do `op` on the topic named `raw` (as the client sent it).
pub(super) async fn authorize_topic(
    service: &BrokerService,
    principal: Option<&Principal>,
    raw: &str,
    op: TopicOperation,
    subscription: Option<&str>,
) -> Result<(), BrokerError> {
    if !service.authorizer.enabled() {
        return Ok(());
    }
    let name = BrokerService::topic_name(raw)?;
    service.authorizer.check_topic(principal, &name, op, subscription).await?;
    Ok(())
}

/// Whether `principal` may do `op` on `namespace`.
pub(super) async fn authorize_namespace(
    service: &BrokerService,
    principal: Option<&Principal>,
    namespace: &NamespaceName,
    op: NamespaceOperation,
) -> Result<(), BrokerError> {
    if !service.authorizer.enabled() {
        return Ok(());
    }
    service.authorizer.check_namespace(principal, namespace, op).await?;
    Ok(())
}

/// The next permission change, or never (no receiver: authorization is off).
pub(super) async fn next_change(
    changes: &mut Option<broadcast::Receiver<PermissionChange>>,
) -> PermissionChange {
    let Some(receiver) = changes.as_mut() else { return std::future::pending().await };
    match receiver.recv().await {
        Ok(change) => change,
        Err(broadcast::error::RecvError::Lagged(_)) => PermissionChange::All,
        Err(broadcast::error::RecvError::Closed) => {
            *changes = None;
            std::future::pending().await
        }
    }
}

impl Connection {
    /// Opens what a PRODUCER or SUBSCRIBE task finished (`open`); when permissions changed
    /// after the task's check (`changes_before`), what is open now is checked again, so a
    /// revocation racing the request does not leave it open.
    pub(super) fn open_checked(&mut self, changes_before: u64, open: impl FnOnce(&mut Self)) {
        open(self);
        if self.permission_changes_seen != changes_before {
            self.on_permission_change(PermissionChange::All);
        }
    }
}

/// One open producer or consumer to re-check.
enum Open {
    Producer { id: u64, topic: String },
    Consumer { id: u64, topic: String, subscription: String },
}

impl Connection {
    /// Permissions changed: re-checks (in a task) the producers and consumers of this
    /// connection the change may concern; the ones refused now are closed on the loop.
    pub(super) fn on_permission_change(&mut self, change: PermissionChange) {
        self.permission_changes_seen += 1;
        let affected = |topic: &str| {
            BrokerService::topic_name(topic).is_ok_and(|name| change.affects(name.namespace()))
        };
        let mut open = Vec::new();
        for (id, p) in &self.producers {
            if affected(&p.topic.full_name) {
                open.push(Open::Producer { id: *id, topic: p.topic.full_name.clone() });
            }
        }
        for (id, p) in &self.np_producers {
            let topic = p.topic.name.to_string();
            if affected(&topic) {
                open.push(Open::Producer { id: *id, topic });
            }
        }
        for (id, c) in &self.consumers {
            if affected(&c.topic.full_name) {
                let (topic, subscription) =
                    (c.topic.full_name.clone(), c.subscription.name.clone());
                open.push(Open::Consumer {
                    id: *id,
                    topic,
                    subscription: subscription.to_string(),
                });
            }
        }
        for (id, c) in &self.np_consumers {
            let topic = c.topic.name.to_string();
            if affected(&topic) {
                let subscription = c.subscription.name.to_string();
                open.push(Open::Consumer { id: *id, topic, subscription });
            }
        }
        if open.is_empty() {
            return;
        }
        let (service, principal) = (self.service.clone(), self.principal.clone());
        self.spawn_request(async move {
            let mut refused = Vec::new();
            for item in open {
                let (topic, op, sub) = match &item {
                    Open::Producer { topic, .. } => (topic, TopicOperation::Produce, None),
                    Open::Consumer { topic, subscription, .. } => {
                        (topic, TopicOperation::Consume, Some(subscription.as_str()))
                    }
                };
                // A failed read decides nothing: what is open stays open.
                let allowed = authorize_topic(&service, principal.as_ref(), topic, op, sub).await;
                if let Err(BrokerError::Unauthorized(why)) = allowed {
                    refused.push((item, why));
                }
            }
            let finish: Completion = Box::new(move |connection: &mut Connection| {
                for (item, why) in refused {
                    connection.close_refused(item, &why);
                }
            });
            finish
        });
    }

    /// Closes a producer or consumer whose permission was revoked.
    fn close_refused(&mut self, item: Open, why: &str) {
        match item {
            Open::Producer { id, topic } => {
                let mut closed = false;
                if let Some(producer) = self.producers.remove(&id) {
                    producer.topic.remove_producer(&producer.name, producer.key);
                    closed = true;
                }
                if let Some(producer) = self.np_producers.remove(&id) {
                    producer.topic.producers.remove(&producer.name, producer.key);
                    closed = true;
                }
                if closed {
                    // Sends already on their way under this id are dropped, not refused (a
                    // send error makes the client drop its connection and every producer on it).
                    self.closed_by_broker.insert(id);
                    tracing::info!(peer = %self.peer, topic, producer_id = id, why,
                        "producer closed: permission revoked");
                    self.outbox.send_command(&commands::close_producer(id, u64::MAX));
                }
            }
            Open::Consumer { id, topic, subscription } => {
                let persistent = self.consumers.remove(&id);
                let non_persistent = self.np_consumers.remove(&id);
                if persistent.is_none() && non_persistent.is_none() {
                    return;
                }
                tracing::info!(peer = %self.peer, topic, subscription, consumer_id = id, why,
                    "consumer closed: permission revoked");
                if let Some(consumer) = non_persistent {
                    consumer.detach();
                }
                if let Some(consumer) = persistent {
                    tokio::spawn(consumer.detach());
                }
                self.outbox.send_command(&commands::close_consumer(id, u64::MAX));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! A connection with a principal, driven command by command: refusals carry
    //! `AuthorizationError`, allowed commands go through, and a revoked permission closes the
    //! open producer / consumer.

    use super::*;
    use crate::config::BrokerConfig;
    use magnetar_journal::sim::SimStorage;
    use magnetar_journal::JournalConfig;
    use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
    use magnetar_metadata::{ExpectedVersion, MemoryStore, MetadataStore};
    use magnetar_protocol::proto::{
        CommandGetTopicsOfNamespace, CommandLookupTopic, CommandPartitionedTopicMetadata,
    };
    use magnetar_security::authorization::AuthorizationConfig;

    const WAIT: Duration = Duration::from_secs(10);
    const TOPIC: &str = "persistent://acme/ns/orders";

    struct Harness {
        connection: Connection,
        frames: mpsc::UnboundedReceiver<OutFrame>,
        completed: mpsc::UnboundedReceiver<Completion>,
        metadata: Arc<dyn MetadataStore>,
    }

    async fn put(store: &dyn MetadataStore, key: &str, value: &str) {
        store.put(key, Bytes::from(value.to_string()), ExpectedVersion::Any).await.expect("put");
    }

    const GRANTS: &str = r#"{"auth_policies":{
        "namespace_auth":{"writer":["produce"],"reader":["consume"]},
        "subscription_auth_roles":{"private":["someone-else"]}}}"#;

    async fn harness(role: &str) -> Harness {
        let journal = JournalConfig {
            segment_size_bytes: 1 << 20,
            max_group_bytes: 256 << 10,
            ..JournalConfig::default()
        };
        let config = LedgerStoreConfig { journal, ..LedgerStoreConfig::default() };
        let storage = Arc::new(SimStorage::new(7));
        let store = LedgerStore::open_with_storage(config, storage).expect("store").0;
        let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        put(&*metadata, "/admin/tenants/acme", r#"{"adminRoles":["boss"]}"#).await;
        put(&*metadata, "/admin/namespaces/acme/ns", GRANTS).await;
        let authorization = AuthorizationConfig {
            enabled: true,
            super_user_roles: vec!["root".into()],
            ..Default::default()
        };
        let config = BrokerConfig { authorization, ..BrokerConfig::default() };
        let service = BrokerService::new(config, Arc::new(store), metadata.clone());
        let (outbox, frames) = Outbox::channel();
        let (completions, completed) = mpsc::unbounded_channel();
        let principal =
            Principal { role: role.to_string(), method: "token".into(), expires_at_ms: None };
        let connection = Connection {
            service,
            outbox,
            connected: true,
            producers: HashMap::new(),
            consumers: HashMap::new(),
            np_producers: HashMap::new(),
            np_consumers: HashMap::new(),
            pending_producers: HashMap::new(),
            pending_consumers: HashMap::new(),
            closed_by_broker: Default::default(),
            completions,
            peer: "test".into(),
            client_version: "test".into(),
            paused_until: None,
            identity: TransportIdentity::default(),
            principal: Some(principal),
            auth: Default::default(),
            permission_changes_seen: 0,
        };
        Harness { connection, frames, completed, metadata }
    }

    impl Harness {
        async fn send(&mut self, command: BaseCommand) {
            self.connection.handle(Frame { command, payload: None }).await.expect("handled");
        }

        /// Runs the next completion a request task reports.
        async fn complete(&mut self) {
            let finish = tokio::time::timeout(WAIT, self.completed.recv()).await;
            let finish = finish.expect("in time").expect("open");
            finish(&mut self.connection);
        }

        async fn reply(&mut self) -> BaseCommand {
            let frame = tokio::time::timeout(WAIT, self.frames.recv()).await;
            frame.expect("in time").expect("open").decode().command
        }

        async fn producer(&mut self, producer_id: u64) -> BaseCommand {
            let command = BaseCommand {
                producer: Some(Box::new(CommandProducer {
                    topic: TOPIC.into(),
                    producer_id,
                    request_id: producer_id,
                    ..Default::default()
                })),
                ..commands::base(Type::Producer)
            };
            self.send(command).await;
            self.complete().await;
            self.reply().await
        }

        async fn subscribe(&mut self, consumer_id: u64, subscription: &str) -> BaseCommand {
            let command = BaseCommand {
                subscribe: Some(Box::new(CommandSubscribe {
                    topic: TOPIC.into(),
                    subscription: subscription.into(),
                    consumer_id,
                    request_id: 100 + consumer_id,
                    ..Default::default()
                })),
                ..commands::base(Type::Subscribe)
            };
            self.send(command).await;
            self.complete().await;
            self.reply().await
        }
    }

    fn authorization_error(command: &BaseCommand) -> bool {
        let code = Some(ServerError::AuthorizationError as i32);
        command.error.as_ref().is_some_and(|e| Some(e.error) == code)
            || command.lookup_topic_response.as_ref().is_some_and(|r| r.error == code)
            || command.partition_metadata_response.as_ref().is_some_and(|r| r.error == code)
    }

    #[tokio::test]
    async fn a_reader_cannot_produce_and_a_writer_cannot_consume() {
        let mut reader = harness("reader").await;
        let refused = reader.producer(1).await;
        assert!(authorization_error(&refused), "{refused:?}");
        assert!(reader.connection.producers.is_empty());
        let ok = reader.subscribe(1, "s").await;
        assert!(ok.success.is_some(), "{ok:?}");
        // The subscription's own permission lists another role only.
        let private = reader.subscribe(2, "private").await;
        assert!(authorization_error(&private), "{private:?}");

        let mut writer = harness("writer").await;
        let ok = writer.producer(1).await;
        assert!(ok.producer_success.is_some(), "{ok:?}");
        let refused = writer.subscribe(1, "s").await;
        assert!(authorization_error(&refused), "{refused:?}");
        assert!(writer.connection.consumers.is_empty());
    }

    #[tokio::test]
    async fn super_users_and_tenant_admins_may_do_everything_strangers_nothing() {
        for role in ["root", "boss"] {
            let mut h = harness(role).await;
            assert!(h.producer(1).await.producer_success.is_some(), "{role}");
            assert!(h.subscribe(1, "private").await.success.is_some(), "{role}");
        }
        let mut stranger = harness("stranger").await;
        assert!(authorization_error(&stranger.producer(1).await));
        assert!(authorization_error(&stranger.subscribe(1, "s").await));
        // LOOKUP (answered from a task of its own).
        let lookup = BaseCommand {
            lookup_topic: Some(Box::new(CommandLookupTopic {
                topic: TOPIC.into(),
                request_id: 7,
                ..Default::default()
            })),
            ..commands::base(Type::Lookup)
        };
        stranger.send(lookup).await;
        let reply = stranger.reply().await;
        assert!(authorization_error(&reply), "{reply:?}");
        // PARTITIONED_METADATA
        let metadata = BaseCommand {
            partition_metadata: Some(Box::new(CommandPartitionedTopicMetadata {
                topic: TOPIC.into(),
                request_id: 8,
                ..Default::default()
            })),
            ..commands::base(Type::PartitionedMetadata)
        };
        stranger.send(metadata).await;
        let reply = stranger.reply().await;
        assert!(authorization_error(&reply), "{reply:?}");
        // GET_TOPICS_OF_NAMESPACE
        let list = BaseCommand {
            get_topics_of_namespace: Some(Box::new(CommandGetTopicsOfNamespace {
                namespace: "acme/ns".into(),
                request_id: 9,
                ..Default::default()
            })),
            ..commands::base(Type::GetTopicsOfNamespace)
        };
        stranger.send(list.clone()).await;
        let reply = stranger.reply().await;
        assert!(authorization_error(&reply), "{reply:?}");
        // ...which a reader may do.
        let mut reader = harness("reader").await;
        reader.send(list).await;
        let reply = reader.reply().await;
        assert!(reply.get_topics_of_namespace_response.is_some(), "{reply:?}");
    }

    #[tokio::test]
    async fn a_revoked_permission_closes_the_open_producer_and_consumer() {
        let mut writer = harness("writer").await;
        assert!(writer.producer(1).await.producer_success.is_some());
        let mut changes = writer.connection.service.authorizer.changes();
        // A change elsewhere leaves it open.
        let other = NamespaceName::new("acme", "other").expect("name");
        writer.connection.service.authorizer.invalidate_namespace(&other);
        let change = changes.recv().await.expect("change");
        writer.connection.on_permission_change(change);
        assert!(writer.completed.try_recv().is_err(), "nothing to re-check");
        assert_eq!(writer.connection.producers.len(), 1);
        // Revoked: closed with CLOSE_PRODUCER.
        put(&*writer.metadata, "/admin/namespaces/acme/ns", r#"{"auth_policies":{}}"#).await;
        let ns = NamespaceName::new("acme", "ns").expect("name");
        writer.connection.service.authorizer.invalidate_namespace(&ns);
        let change = changes.recv().await.expect("change");
        writer.connection.on_permission_change(change);
        writer.complete().await;
        let close = writer.reply().await;
        assert_eq!(close.close_producer.as_ref().map(|c| c.producer_id), Some(1), "{close:?}");
        assert!(writer.connection.producers.is_empty());
        // Its reconnection is refused.
        assert!(authorization_error(&writer.producer(1).await));

        let mut reader = harness("reader").await;
        assert!(reader.subscribe(1, "s").await.success.is_some());
        let mut changes = reader.connection.service.authorizer.changes();
        // The subscription is now reserved for another role.
        let reserved = r#"{"auth_policies":{"namespace_auth":{"reader":["consume"]},
            "subscription_auth_roles":{"s":["other"]}}}"#;
        put(&*reader.metadata, "/admin/namespaces/acme/ns", reserved).await;
        reader.connection.service.authorizer.invalidate_namespace(&ns);
        let change = changes.recv().await.expect("change");
        reader.connection.on_permission_change(change);
        reader.complete().await;
        let close = reader.reply().await;
        assert_eq!(close.close_consumer.as_ref().map(|c| c.consumer_id), Some(1), "{close:?}");
        assert!(reader.connection.consumers.is_empty());
    }

    #[tokio::test]
    async fn a_revocation_racing_a_producer_request_still_closes_it() {
        let mut writer = harness("writer").await;
        let mut changes = writer.connection.service.authorizer.changes();
        let command = BaseCommand {
            producer: Some(Box::new(CommandProducer {
                topic: TOPIC.into(),
                producer_id: 1,
                request_id: 1,
                ..Default::default()
            })),
            ..commands::base(Type::Producer)
        };
        writer.send(command).await;
        // The request's task was allowed and made the producer; its completion waits.
        let finish = tokio::time::timeout(WAIT, writer.completed.recv()).await;
        let finish = finish.expect("in time").expect("open");
        // Revoked before the producer is on the connection: nothing open to re-check yet.
        put(&*writer.metadata, "/admin/namespaces/acme/ns", r#"{"auth_policies":{}}"#).await;
        let ns = NamespaceName::new("acme", "ns").expect("name");
        writer.connection.service.authorizer.invalidate_namespace(&ns);
        let change = changes.recv().await.expect("change");
        writer.connection.on_permission_change(change);
        assert!(writer.completed.try_recv().is_err(), "nothing open yet");
        // It opens, and is checked again because permissions changed since its check.
        finish(&mut writer.connection);
        assert!(writer.reply().await.producer_success.is_some());
        writer.complete().await;
        let close = writer.reply().await;
        assert_eq!(close.close_producer.as_ref().map(|c| c.producer_id), Some(1), "{close:?}");
        assert!(writer.connection.producers.is_empty());
    }
}
