//! The broker side of the admin API: [`BrokerHooks`] answered by the broker core.

use std::collections::BTreeMap;
use std::sync::Arc;

use magnetar_broker::{BrokerError, BrokerService};
use magnetar_model::names::{NamespaceName, TopicDomain, TopicName};
use magnetar_model::policy::PolicyDefaults;

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

    async fn unload_namespace(&self, namespace: &NamespaceName) -> Result<usize, HookError> {
        let mut unloaded = 0;
        for loaded in self.0.loaded_topics() {
            if loaded.name.namespace() == namespace && self.0.unload_topic(&loaded.name).await {
                unloaded += 1;
            }
        }
        Ok(unloaded)
    }

    fn policy_defaults(&self) -> PolicyDefaults {
        let config = &self.0.config;
        PolicyDefaults {
            deduplication_enabled: config.broker_deduplication_enabled,
            max_message_size: u32::try_from(config.max_message_size).unwrap_or(u32::MAX),
            ..PolicyDefaults::default()
        }
    }

    fn runtime_configuration(&self) -> BTreeMap<String, String> {
        let c = &self.0.config;
        [
            ("bindAddress", c.bind_address.clone()),
            ("brokerServicePort", c.broker_port.to_string()),
            ("advertisedAddress", c.advertised_address.clone()),
            ("maxMessageSize", c.max_message_size.to_string()),
            ("keepAliveIntervalSeconds", c.keepalive_seconds.to_string()),
            ("allowAutoTopicCreation", c.allow_auto_topic_creation.to_string()),
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
