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
