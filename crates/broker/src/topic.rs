//! A persistent topic: its managed ledger, producers and subscriptions.

use crate::config::BrokerConfig;
use crate::cursor::{AckState, Position};
use crate::error::BrokerError;
use crate::managed_ledger::ManagedLedger;
use crate::subscription::{previous_position, Subscription};
use magnetar_admin::names::{encode_topic_name, TopicName};
use magnetar_ledger::LedgerStore;
use magnetar_metadata::MetadataStore;
use magnetar_protocol::proto::{command_subscribe::SubType, MessageIdData, ProducerAccessMode};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Notify;

/// Where a new subscription starts.
#[derive(Debug, Clone)]
pub enum StartAt {
    Earliest,
    Latest,
    /// A reader's start message id, as sent by the client.
    MessageId(MessageIdData),
}

struct ProducerEntry {
    key: u64,
    mode: ProducerAccessMode,
}

#[derive(Default)]
struct Producers {
    by_name: HashMap<String, ProducerEntry>,
    epoch: u64,
}

pub struct Topic {
    pub name: TopicName,
    pub full_name: String,
    pub partition: i32,
    pub managed_ledger: Arc<ManagedLedger>,
    metadata: Arc<dyn MetadataStore>,
    cursor_prefix: String,
    batch_entries: usize,
    producers: Mutex<Producers>,
    producer_released: Notify,
    subscriptions: Mutex<HashMap<String, Arc<Subscription>>>,
}

fn storage_path(name: &TopicName) -> String {
    format!(
        "{}/{}/{}/{}",
        name.domain().as_str(),
        name.tenant(),
        name.namespace().namespace(),
        name.encoded_local_name()
    )
}

impl Topic {
    /// Loads a topic: its managed ledger and its durable subscriptions.
    pub async fn load(
        name: TopicName,
        config: &BrokerConfig,
        store: Arc<LedgerStore>,
        metadata: Arc<dyn MetadataStore>,
    ) -> Result<Arc<Topic>, BrokerError> {
        let full_name = name.to_string();
        let path = storage_path(&name);
        let managed_ledger = ManagedLedger::open(
            full_name.clone(),
            format!("/managed-ledgers/{path}"),
            store,
            metadata.clone(),
            crate::managed_ledger::RolloverPolicy {
                max_entries: config.max_entries_per_ledger,
                max_bytes: config.max_bytes_per_ledger,
                max_age: std::time::Duration::from_secs(config.max_ledger_age_seconds),
            },
        )
        .await?;
        let partition = name.partition_index().map_or(-1, |p| p as i32);
        let topic = Arc::new(Topic {
            name,
            full_name,
            partition,
            managed_ledger,
            metadata: metadata.clone(),
            cursor_prefix: format!("/cursors/{path}"),
            batch_entries: config.dispatch_batch_entries,
            producers: Mutex::default(),
            producer_released: Notify::new(),
            subscriptions: Mutex::default(),
        });
        let ledgers = topic.managed_ledger.ledgers();
        for encoded in metadata.list_children(&topic.cursor_prefix).await? {
            let Some(found) = metadata.get(&format!("{}/{encoded}", topic.cursor_prefix)).await?
            else {
                continue;
            };
            let mut ack = match AckState::decode(&found.value) {
                Ok(ack) => ack,
                Err(error) => {
                    tracing::error!(topic = %topic.full_name, cursor = %encoded, %error, "cursor unreadable; skipped");
                    continue;
                }
            };
            ack.reconcile(&ledgers);
            let last_read = ack.mark_delete();
            let name =
                magnetar_admin::names::decode_topic_name(&encoded).unwrap_or(encoded.clone());
            let subscription =
                topic.start_subscription(name.clone(), SubType::Exclusive, true, ack, last_read);
            topic.subscriptions.lock().insert(name, subscription);
        }
        Ok(topic)
    }

    fn start_subscription(
        &self,
        name: String,
        sub_type: SubType,
        durable: bool,
        ack: AckState,
        last_read: Option<Position>,
    ) -> Arc<Subscription> {
        let cursor_key = format!("{}/{}", self.cursor_prefix, encode_topic_name(&name));
        Subscription::start(
            name,
            sub_type,
            durable,
            self.partition,
            self.managed_ledger.clone(),
            self.metadata.clone(),
            cursor_key,
            ack,
            last_read,
            self.batch_entries,
        )
    }

    /// Registers a producer. Returns its name and the topic epoch.
    pub async fn add_producer(
        &self,
        name: String,
        key: u64,
        mode: ProducerAccessMode,
    ) -> Result<u64, BrokerError> {
        loop {
            let released = self.producer_released.notified();
            {
                let mut producers = self.producers.lock();
                if producers.by_name.contains_key(&name) {
                    return Err(BrokerError::ProducerBusy(format!(
                        "producer with name '{name}' is already connected to topic {}",
                        self.full_name
                    )));
                }
                let exclusive_present = producers.by_name.values().any(|p| {
                    matches!(
                        p.mode,
                        ProducerAccessMode::Exclusive | ProducerAccessMode::WaitForExclusive
                    )
                });
                let anyone = !producers.by_name.is_empty();
                let blocked = match mode {
                    ProducerAccessMode::Shared => exclusive_present,
                    _ => anyone,
                };
                if !blocked {
                    if mode != ProducerAccessMode::Shared {
                        producers.epoch += 1;
                    }
                    producers.by_name.insert(name, ProducerEntry { key, mode });
                    return Ok(producers.epoch);
                }
                if mode != ProducerAccessMode::WaitForExclusive {
                    return Err(BrokerError::ProducerBusy(format!(
                        "topic {} has an exclusive producer or other producers",
                        self.full_name
                    )));
                }
            }
            released.await;
        }
    }

    pub fn remove_producer(&self, name: &str, key: u64) {
        let mut producers = self.producers.lock();
        if producers.by_name.get(name).is_some_and(|p| p.key == key) {
            producers.by_name.remove(name);
        }
        drop(producers);
        self.producer_released.notify_waiters();
    }

    /// The subscription `name`, created if needed.
    pub async fn subscription(
        &self,
        name: &str,
        sub_type: SubType,
        durable: bool,
        start: StartAt,
    ) -> Result<Arc<Subscription>, BrokerError> {
        if let Some(existing) = self.subscriptions.lock().get(name).cloned() {
            return Ok(existing);
        }
        let ledgers = self.managed_ledger.ledgers();
        let last_confirmed = self.managed_ledger.last_confirmed();
        let last_read = match &start {
            StartAt::Earliest => None,
            StartAt::Latest => last_confirmed,
            StartAt::MessageId(id) if id.ledger_id >= i64::MAX as u64 => {
                // MessageId.earliest is (-1, -1); latest is (i64::MAX, i64::MAX).
                if id.ledger_id == u64::MAX {
                    None
                } else {
                    last_confirmed
                }
            }
            // Start at the given entry itself: the client drops what it must not see, as with
            // Pulsar (which steps back one entry for batch-relative ids).
            StartAt::MessageId(id) => {
                previous_position(&ledgers, Position::new(id.ledger_id, id.entry_id))
            }
        };
        let ack = match (durable, &start) {
            (true, StartAt::Latest) => AckState::new(last_confirmed),
            _ => AckState::new(None),
        };
        let subscription =
            self.start_subscription(name.to_string(), sub_type, durable, ack, last_read);
        let winner = {
            let mut subscriptions = self.subscriptions.lock();
            subscriptions.entry(name.to_string()).or_insert_with(|| subscription.clone()).clone()
        };
        if Arc::ptr_eq(&winner, &subscription) {
            subscription.persist_now().await?;
        } else {
            subscription.close(false).await?;
        }
        Ok(winner)
    }

    pub async fn remove_subscription(
        &self,
        name: &str,
        delete_cursor: bool,
    ) -> Result<(), BrokerError> {
        let removed = self.subscriptions.lock().remove(name);
        if let Some(subscription) = removed {
            subscription.close(delete_cursor).await?;
        }
        Ok(())
    }

    /// No producer, no consumer and no data: only then may a consumer's schema become the
    /// topic's first schema (Pulsar's `addSchemaIfIdleOrCheckCompatible`).
    pub fn is_idle(&self) -> bool {
        self.producers.lock().by_name.is_empty()
            && self.subscriptions.lock().values().all(|s| s.consumer_count() == 0)
            && self.managed_ledger.last_confirmed().is_none()
    }

    pub fn subscription_names(&self) -> Vec<String> {
        self.subscriptions.lock().keys().cloned().collect()
    }
}
