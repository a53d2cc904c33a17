//! The broker service: the registry of loaded topics, topic-name rules, partition metadata and
//! the hooks the admin API calls.

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::topic::Topic;
use magnetar_admin::keys;
use magnetar_admin::names::TopicName;
use magnetar_admin::PartitionedTopicMetadata;
use magnetar_admin::{BrokerHooks, HookError};
use magnetar_ledger::LedgerStore;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::OnceCell;

pub struct BrokerService {
    pub config: BrokerConfig,
    pub store: Arc<LedgerStore>,
    pub metadata: Arc<dyn MetadataStore>,
    topics: Mutex<HashMap<String, Arc<OnceCell<Arc<Topic>>>>>,
    next_key: AtomicU64,
}

impl BrokerService {
    pub fn new(
        config: BrokerConfig,
        store: Arc<LedgerStore>,
        metadata: Arc<dyn MetadataStore>,
    ) -> Arc<Self> {
        Arc::new(BrokerService {
            config,
            store,
            metadata,
            topics: Mutex::default(),
            next_key: AtomicU64::new(1),
        })
    }

    /// A broker-wide unique key for producers and consumers.
    pub fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Parses a topic name as clients send it; short names are completed as Pulsar does
    /// (`t` -> `persistent://public/default/t`, `a/b/t` -> `persistent://a/b/t`).
    pub fn topic_name(raw: &str) -> Result<TopicName, BrokerError> {
        let full = if raw.contains("://") {
            raw.to_string()
        } else {
            match raw.split('/').count() {
                1 => format!("persistent://public/default/{raw}"),
                3 => format!("persistent://{raw}"),
                _ => return Err(BrokerError::InvalidTopicName(raw.to_string())),
            }
        };
        TopicName::parse(&full).map_err(|_| BrokerError::InvalidTopicName(raw.to_string()))
    }

    /// Partition count of a topic (0: not partitioned).
    pub async fn partitions(&self, name: &TopicName) -> Result<u32, BrokerError> {
        if name.partition_index().is_some() {
            return Ok(0);
        }
        match self.metadata.get(&keys::partitioned_topic_key(name)).await? {
            Some(found) => {
                let metadata: PartitionedTopicMetadata = serde_json::from_slice(&found.value)
                    .map_err(|e| {
                        BrokerError::Metadata(format!("partition metadata of {name}: {e}"))
                    })?;
                Ok(metadata.partitions)
            }
            None => Ok(0),
        }
    }

    pub async fn topic_exists(&self, name: &TopicName) -> Result<bool, BrokerError> {
        if self.topics.lock().get(&name.to_string()).is_some_and(|cell| cell.initialized()) {
            return Ok(true);
        }
        Ok(self.metadata.get(&keys::topic_key(name)).await?.is_some())
    }

    /// The loaded topic, loading (and, if allowed, creating) it first.
    pub async fn topic(&self, name: &TopicName, create: bool) -> Result<Arc<Topic>, BrokerError> {
        let full = name.to_string();
        let cell = self.topics.lock().entry(full.clone()).or_default().clone();
        if let Some(topic) = cell.get() {
            return Ok(topic.clone());
        }
        if !self.topic_exists(name).await? {
            if !(create && self.config.allow_auto_topic_creation) {
                return Err(BrokerError::TopicNotFound(full));
            }
            if self.partitions(name).await? > 0 {
                return Err(BrokerError::NotAllowed(format!(
                    "{full} is a partitioned topic: use its partitions"
                )));
            }
            match self
                .metadata
                .put(&keys::topic_key(name), "{}".into(), ExpectedVersion::Absent)
                .await
            {
                Ok(_) | Err(MetadataError::BadVersion { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let topic = cell
            .get_or_try_init(|| {
                Topic::load(name.clone(), &self.config, self.store.clone(), self.metadata.clone())
            })
            .await?;
        Ok(topic.clone())
    }

    /// Topics loaded now.
    pub fn loaded_topics(&self) -> Vec<Arc<Topic>> {
        self.topics.lock().values().filter_map(|cell| cell.get().cloned()).collect()
    }
}

/// The admin API's view of the broker.
pub struct AdminHooks(pub Arc<BrokerService>);

#[async_trait::async_trait]
impl BrokerHooks for AdminHooks {
    async fn topic_exists(&self, topic: &TopicName) -> Result<bool, HookError> {
        self.0.topic_exists(topic).await.map_err(|e| HookError::Unavailable(e.to_string()))
    }
}
