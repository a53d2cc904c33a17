//! The broker side of the admin API: [`BrokerHooks`] answered by the broker core.

use std::sync::Arc;

use magnetar_broker::{BrokerError, BrokerService};
use magnetar_model::names::{NamespaceName, TopicDomain, TopicName};

use crate::hooks::{BrokerHooks, HookError};

/// The admin API's view of the broker.
pub struct AdminHooks(pub Arc<BrokerService>);

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
        match self.0.delete_topic(topic, force).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(HookError::NotFound(format!("Topic {topic} not found"))),
            Err(BrokerError::NotAllowed(why)) => Err(HookError::PreconditionFailed(why)),
            Err(e) => Err(HookError::Internal(e.to_string())),
        }
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

    async fn metrics(&self) -> String {
        self.0.metrics_text()
    }

    async fn expire_messages(
        &self,
        topic: &TopicName,
        subscription: Option<&str>,
        expire_time_seconds: u64,
    ) -> Result<(), HookError> {
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
        let base = topic.map(|t| t.partitioned_topic());
        for loaded in self.0.loaded_topics() {
            let affected = match &base {
                Some(base) => loaded.name.partitioned_topic() == *base,
                None => loaded.name.namespace() == namespace,
            };
            if affected {
                loaded.refresh_policies().await.map_err(|e| HookError::Internal(e.to_string()))?;
            }
        }
        Ok(())
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
