//! The broker side of the admin API: [`BrokerHooks`] answered by the broker core.

use std::collections::BTreeMap;
use std::sync::Arc;

use magnetar_broker::cursor::Position;
use magnetar_broker::history::HistoryView;
use magnetar_broker::stats::{AdminMessage, InternalStats, TopicStats};
use magnetar_broker::topic::{ExaminePosition, SubscriptionStart, Topic};
use magnetar_broker::{BrokerError, BrokerService};
use magnetar_model::names::{encode_topic_name, NamespaceName, TopicDomain, TopicName};
use magnetar_model::policy::PolicyDefaults;

use crate::hooks::{BrokerHooks, HookError, ResetTarget, TopicOwner};
use crate::remote::RemoteOwner;
use hyper::Method;

/// The admin API's view of the broker.
pub struct AdminHooks(pub Arc<BrokerService>);

/// A broker error as the admin API reports it (Pulsar's statuses and reasons).
fn hook_error(error: BrokerError) -> HookError {
    match error {
        BrokerError::TopicNotFound(_) => HookError::NotFound("Topic not found".into()),
        BrokerError::SubscriptionNotFound(_) => {
            HookError::NotFound("Subscription not found".into())
        }
        BrokerError::NotAllowed(why) => HookError::PreconditionFailed(why),
        BrokerError::ServiceNotReady(why) | BrokerError::Fenced(why) => HookError::Unavailable(why),
        BrokerError::ShuttingDown => HookError::Unavailable(error.to_string()),
        other => HookError::Internal(other.to_string()),
    }
}

impl AdminHooks {
    /// The other broker that owns the partition `topic`, if another does: a partitioned
    /// topic's operations reach all of its partitions from the broker asked. (Every other
    /// topic reaching a hook is this broker's: the router sends a topic's requests to its
    /// owner first.) Standalone: never, without I/O.
    async fn elsewhere(&self, topic: &TopicName) -> Result<Option<RemoteOwner>, HookError> {
        if topic.partition_index().is_none() {
            return Ok(None);
        }
        Ok(self.topic_owner(topic, false).await?.map(|owner| RemoteOwner::of(&owner)))
    }

    /// The persistent topic `name`, loaded if it exists (never created).
    async fn loaded(&self, name: &TopicName) -> Result<Arc<Topic>, HookError> {
        self.0.topic(name, false).await.map_err(hook_error)
    }

    async fn message_at(
        &self,
        topic: &Topic,
        position: Option<Position>,
    ) -> Result<AdminMessage, HookError> {
        let not_found = || HookError::NotFound("Message not found".into());
        let position = position.ok_or_else(not_found)?;
        let data = topic.read_entry(position).await.map_err(hook_error)?.ok_or_else(not_found)?;
        Ok(AdminMessage::from_entry(position, &data))
    }
}

#[async_trait::async_trait]
impl BrokerHooks for AdminHooks {
    async fn topic_exists(&self, topic: &TopicName) -> Result<bool, HookError> {
        self.0.topic_exists(topic).await.map_err(|e| HookError::Unavailable(e.to_string()))
    }

    async fn list_topics(
        &self,
        namespace: &NamespaceName,
        domain: TopicDomain,
    ) -> Result<Vec<String>, HookError> {
        Ok(match domain {
            TopicDomain::NonPersistent => self.0.non_persistent_topics_of(namespace),
            TopicDomain::Persistent => Vec::new(),
        })
    }

    async fn create_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        match self.0.create_topic(topic).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(HookError::Conflict("This topic already exists".into())),
            Err(e) => Err(HookError::Internal(e.to_string())),
        }
    }

    async fn delete_topic(&self, topic: &TopicName, force: bool) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let query = if force { "?force=true" } else { "" };
            return owner.call(Method::DELETE, topic, query, None).await.map(drop);
        }
        match self.0.delete_topic(topic, force).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(HookError::NotFound(format!("Topic {topic} not found"))),
            Err(BrokerError::NotAllowed(why)) => Err(HookError::PreconditionFailed(why)),
            Err(e) => Err(HookError::Internal(e.to_string())),
        }
    }

    async fn topic_stats(&self, topic: &TopicName) -> Result<TopicStats, HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            return owner.json(Method::GET, topic, "/stats").await;
        }
        if topic.domain() == TopicDomain::NonPersistent {
            let live = self.0.non_persistent_topic(topic, false).await.map_err(hook_error)?;
            return Ok(live.stats(self.0.ledgers.clock.now()));
        }
        Ok(self.loaded(topic).await?.stats())
    }

    async fn topic_internal_stats(&self, topic: &TopicName) -> Result<InternalStats, HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            return owner.json(Method::GET, topic, "/internalStats").await;
        }
        Ok(self.loaded(topic).await?.internal_stats())
    }

    async fn subscriptions(&self, topic: &TopicName) -> Result<Vec<String>, HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            return owner.json(Method::GET, topic, "/subscriptions").await;
        }
        let mut names = if topic.domain() == TopicDomain::NonPersistent {
            self.0
                .non_persistent_topic(topic, false)
                .await
                .map_err(hook_error)?
                .subscription_names()
        } else {
            self.loaded(topic).await?.subscription_names()
        };
        names.sort();
        Ok(names)
    }

    async fn create_subscription(
        &self,
        topic: &TopicName,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let path = format!("/subscription/{}", encode_topic_name(name));
            let body = Some(message_id_body(start));
            return owner.call(Method::PUT, topic, &path, body).await.map(drop);
        }
        if topic.partition_index().is_some() {
            // A partition nobody used yet: created now, as Pulsar does for a subscription.
            self.0.create_topic(topic).await.map_err(hook_error)?;
        }
        let loaded = self.loaded(topic).await?;
        match loaded.create_subscription(name, start).await.map_err(hook_error)? {
            true => Ok(()),
            false => Err(HookError::Conflict("Subscription already exists for topic".into())),
        }
    }

    async fn delete_subscription(
        &self,
        topic: &TopicName,
        name: &str,
        force: bool,
    ) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let path = format!("/subscription/{}?force={force}", encode_topic_name(name));
            return owner.call(Method::DELETE, topic, &path, None).await.map(drop);
        }
        self.loaded(topic).await?.unsubscribe(name, force).await.map_err(hook_error)
    }

    async fn skip_messages(
        &self,
        topic: &TopicName,
        name: &str,
        count: Option<u64>,
    ) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let name = encode_topic_name(name);
            let path = match count {
                Some(n) => format!("/subscription/{name}/skip/{n}"),
                None => format!("/subscription/{name}/skip_all"),
            };
            return owner.call(Method::POST, topic, &path, None).await.map(drop);
        }
        let subscription =
            self.loaded(topic).await?.existing_subscription(name).map_err(hook_error)?;
        match count {
            Some(n) => subscription.skip(n).map(|_| ()),
            None => subscription.clear_backlog(),
        }
        .map_err(hook_error)
    }

    async fn reset_cursor(
        &self,
        topic: &TopicName,
        name: &str,
        target: ResetTarget,
    ) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let path = format!("/subscription/{}/resetcursor", encode_topic_name(name));
            let (path, body) = match target {
                ResetTarget::PublishTime(time) => (format!("{path}/{time}"), None),
                ResetTarget::Position(start) => (path, Some(message_id_body(start))),
            };
            return owner.call(Method::POST, topic, &path, body).await.map(drop);
        }
        let loaded = self.loaded(topic).await?;
        match target {
            ResetTarget::PublishTime(time) => loaded.reset_subscription_to_time(name, time).await,
            ResetTarget::Position(start) => loaded.reset_subscription(name, start).await,
        }
        .map_err(hook_error)
    }

    async fn peek_message(
        &self,
        topic: &TopicName,
        name: &str,
        n: u64,
    ) -> Result<AdminMessage, HookError> {
        let loaded = self.loaded(topic).await?;
        let subscription = loaded.subscription_or_created(name).await.map_err(hook_error)?;
        self.message_at(&loaded, subscription.nth_unacked(n)).await
    }

    async fn examine_message(
        &self,
        topic: &TopicName,
        from: ExaminePosition,
        n: u64,
    ) -> Result<AdminMessage, HookError> {
        let loaded = self.loaded(topic).await?;
        self.message_at(&loaded, loaded.examine_position(from, n)).await
    }

    async fn get_message(
        &self,
        topic: &TopicName,
        ledger: u64,
        entry: u64,
    ) -> Result<AdminMessage, HookError> {
        let loaded = self.loaded(topic).await?;
        self.message_at(&loaded, Some(Position::new(ledger, entry))).await
    }

    async fn last_message_id(&self, topic: &TopicName) -> Result<(u64, i64), HookError> {
        Ok(self.loaded(topic).await?.last_message_id())
    }

    async fn message_id_by_publish_time(
        &self,
        topic: &TopicName,
        publish_time: u64,
    ) -> Result<Option<(u64, u64)>, HookError> {
        let loaded = self.loaded(topic).await?;
        let found = loaded.first_published_at_or_after(publish_time).await.map_err(hook_error)?;
        Ok(found.map(|p| (p.ledger_id, p.entry_id)))
    }

    async fn compact_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            return owner.call(Method::PUT, topic, "/compaction", None).await.map(drop);
        }
        let loaded = self.loaded(topic).await?;
        loaded
            .compaction
            .start()
            .map_err(|_| HookError::Conflict("Compaction already in progress".into()))?;
        tracing::info!(%topic, "compaction started");
        Ok(())
    }

    async fn compaction_status(&self, topic: &TopicName) -> Result<(String, String), HookError> {
        let loaded = self.loaded(topic).await?;
        let (status, error) = loaded.compaction.status();
        let status = serde_json::to_value(status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        Ok((status, error))
    }

    async fn unload_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            return owner.call(Method::PUT, topic, "/unload", None).await.map(drop);
        }
        self.0.unload_topic(topic).await.map(|_| ()).map_err(hook_error)
    }

    async fn terminate_topic(&self, topic: &TopicName) -> Result<(u64, i64), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let id: serde_json::Value = owner.json(Method::POST, topic, "/terminate").await?;
            let field = |name: &str| id.get(name).and_then(serde_json::Value::as_i64);
            return match (field("ledgerId"), field("entryId")) {
                (Some(ledger), Some(entry)) if ledger >= 0 => Ok((ledger as u64, entry)),
                _ => Err(HookError::Internal(format!("the owner of {topic} answered {id}"))),
            };
        }
        let loaded = self.loaded(topic).await?;
        loaded.terminate().await.map_err(hook_error)?;
        Ok(loaded.last_message_id())
    }

    /// Ready while the broker's registration holds (see `magnetar_broker::registration`).
    async fn ready(&self) -> Result<(), HookError> {
        self.0.readiness.check().map_err(|e| HookError::Unavailable(e.to_string()))
    }

    /// Healthy while ready: a broker whose metadata session is lost answers 503 with the
    /// reason (it serves loaded topics, but takes on no new ones).
    async fn health_check(&self) -> Result<(), HookError> {
        self.ready().await
    }

    async fn unload_namespace(
        &self,
        namespace: &NamespaceName,
        bundle: Option<&str>,
        destination: Option<&str>,
    ) -> Result<usize, HookError> {
        self.0.unload_bundles(Some(namespace), bundle, destination).await.map_err(hook_error)
    }

    async fn topic_owner(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<Option<TopicOwner>, HookError> {
        use magnetar_broker::ownership::LookupAnswer;
        let answer = self.0.ownership.lookup(topic, authoritative).await.map_err(hook_error)?;
        let (urls, redirect) = match answer {
            LookupAnswer::Connect { urls } => (urls, false),
            LookupAnswer::Redirect { urls, .. } => (urls, true),
        };
        // A single broker (no web URL in its answer) or this broker: served here.
        let Some(web_url) = urls.web_url.clone() else { return Ok(None) };
        if !redirect && urls.broker_url == self.0.config.service_url() {
            return Ok(None);
        }
        Ok(Some(TopicOwner {
            broker_url: urls.broker_url,
            broker_url_tls: urls.broker_url_tls,
            web_url,
            web_url_tls: urls.web_url_tls,
            redirect,
            listeners: urls.listeners,
        }))
    }

    fn policy_defaults(&self) -> PolicyDefaults {
        // The broker's own, with the dynamic configuration's values: what its topics fall
        // back to (`?applied=true` answers from them).
        self.0.policy_defaults()
    }

    fn runtime_configuration(&self) -> BTreeMap<String, String> {
        let c = &self.0.config;
        [
            ("bindAddress", c.bind_address.clone()),
            ("brokerServicePort", c.broker_port.to_string()),
            ("advertisedAddress", c.advertised_address.clone()),
            ("maxMessageSize", c.max_message_size.to_string()),
            ("keepAliveIntervalSeconds", c.keepalive_seconds.to_string()),
            ("allowAutoTopicCreation", self.0.allow_auto_topic_creation().to_string()),
            (
                "allowAutoSubscriptionCreation",
                self.0.policy_defaults().allow_auto_subscription_creation.to_string(),
            ),
            ("managedLedgerMaxEntriesPerLedger", c.max_entries_per_ledger.to_string()),
            ("managedLedgerMaxSizePerLedgerMbytes", (c.max_bytes_per_ledger >> 20).to_string()),
            (
                "managedLedgerMaxLedgerRolloverTimeMinutes",
                (c.max_ledger_age_seconds / 60).to_string(),
            ),
            ("brokerDeduplicationEnabled", c.broker_deduplication_enabled.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    async fn dynamic_configuration_changed(&self) -> Result<(), HookError> {
        self.0.reload_dynamic_configuration().await.map_err(hook_error)
    }

    async fn metrics(&self, format: magnetar_metrics::Format) -> Vec<String> {
        // Reading every topic's stats takes locks briefly; off the async workers' hot loop.
        let service = self.0.clone();
        tokio::task::spawn_blocking(move || service.metrics_parts(format)).await.unwrap_or_default()
    }

    fn history(&self, topic: Option<&TopicName>) -> HistoryView {
        let history = self.0.history.lock();
        match topic {
            Some(topic) => history.topic(&topic.to_string()),
            None => history.totals(),
        }
    }

    async fn expire_messages(
        &self,
        topic: &TopicName,
        subscription: Option<&str>,
        expire_time_seconds: u64,
    ) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let path = match subscription {
                Some(name) => format!("/subscription/{}/expireMessages", encode_topic_name(name)),
                None => "/all_subscription/expireMessages".to_string(),
            };
            let path = format!("{path}/{expire_time_seconds}");
            return owner.call(Method::POST, topic, &path, None).await.map(drop);
        }
        let loaded = self.0.topic(topic, false).await.map_err(expiry_error)?;
        let ttl_ms = expire_time_seconds.saturating_mul(1000);
        magnetar_broker::expiry::expire_by_time(&loaded, subscription, ttl_ms)
            .await
            .map_err(expiry_error)?;
        Ok(())
    }

    async fn expire_messages_through(
        &self,
        topic: &TopicName,
        subscription: &str,
        ledger_id: u64,
        entry_id: u64,
        excluded: bool,
    ) -> Result<(), HookError> {
        if let Some(owner) = self.elsewhere(topic).await? {
            let path = format!("/subscription/{}/expireMessages", encode_topic_name(subscription));
            let body = serde_json::json!({
                "ledgerId": ledger_id, "entryId": entry_id, "isExcluded": excluded,
            });
            return owner.call(Method::POST, topic, &path, Some(body)).await.map(drop);
        }
        let loaded = self.0.topic(topic, false).await.map_err(expiry_error)?;
        let position = magnetar_broker::cursor::Position::new(ledger_id, entry_id);
        let through = if excluded {
            let ledgers = loaded.managed_ledger.ledgers();
            match magnetar_broker::subscription::previous_position(&ledgers, position) {
                Some(previous) => previous,
                None => return Ok(()),
            }
        } else {
            position
        };
        magnetar_broker::expiry::expire_through(&loaded, subscription, through)
            .map_err(expiry_error)?;
        Ok(())
    }

    async fn policies_updated(
        &self,
        namespace: &NamespaceName,
        topic: Option<&TopicName>,
    ) -> Result<(), HookError> {
        if topic.is_none() {
            // Permissions live in the namespace document: open producers and consumers there
            // are re-checked (the metadata watch announces it too; this is the direct path).
            self.0.authorizer.invalidate_namespace(namespace);
        }
        let base = topic.map(|t| t.partitioned_topic());
        let affected = |name: &TopicName| match &base {
            Some(base) => name.partitioned_topic() == *base,
            None => name.namespace() == namespace,
        };
        self.0.refresh_policies_of(affected).await.map_err(|e| HookError::Internal(e.to_string()))
    }
}

/// Pulsar's answers for expiry: 404 for a missing topic or subscription.
fn expiry_error(error: BrokerError) -> HookError {
    match error {
        BrokerError::TopicNotFound(_) => HookError::NotFound("Topic not found".into()),
        BrokerError::SubscriptionNotFound(_) => {
            HookError::NotFound("Subscription not found".into())
        }
        BrokerError::NotAllowed(why) => HookError::PreconditionFailed(why),
        other => HookError::Internal(other.to_string()),
    }
}

/// A subscription start as the admin API's `MessageId` body gives it (Pulsar's earliest and
/// latest ids for those).
fn message_id_body(start: SubscriptionStart) -> serde_json::Value {
    let at = |p: Position, excluded: bool| serde_json::json!({ "ledgerId": p.ledger_id, "entryId": p.entry_id, "isExcluded": excluded });
    match start {
        SubscriptionStart::Latest => {
            serde_json::json!({ "ledgerId": i64::MAX, "entryId": i64::MAX })
        }
        SubscriptionStart::Earliest => serde_json::json!({ "ledgerId": -1, "entryId": -1 }),
        SubscriptionStart::At(p) => at(p, false),
        SubscriptionStart::After(p) => at(p, true),
    }
}
