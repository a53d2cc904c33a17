//! A persistent topic: its managed ledger, producers and subscriptions.

use crate::config::BrokerConfig;
use crate::cursor::{AckState, Position};
use crate::dedup::{DedupSnapshot, DedupState, DupStatus};
use crate::error::BrokerError;
use crate::managed_ledger::ManagedLedger;
use crate::subscription::{previous_position, Subscription};
use magnetar_admin::names::{encode_topic_name, TopicName};
use magnetar_ledger::LedgerStore;
use magnetar_metadata::MetadataStore;
use magnetar_protocol::proto::{command_subscribe::SubType, MessageIdData, ProducerAccessMode};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::Notify;

/// Entries between two deduplication snapshots (Pulsar's `brokerDeduplicationEntriesInterval`):
/// a load replays at most about this many entries.
const DEDUP_SNAPSHOT_INTERVAL: u64 = 1000;
/// Entries read per round while replaying the tail for deduplication state.
const DEDUP_REPLAY_BATCH: usize = 256;

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

/// A topic's producers: unique names and the access modes (Shared, Exclusive,
/// WaitForExclusive), shared by persistent and non-persistent topics.
pub struct ProducerRegistry {
    topic: String,
    producers: Mutex<Producers>,
    released: Notify,
}

impl ProducerRegistry {
    pub fn new(topic: String) -> Self {
        ProducerRegistry { topic, producers: Mutex::default(), released: Notify::new() }
    }

    /// Registers a producer. Returns the topic epoch.
    pub async fn add(
        &self,
        name: String,
        key: u64,
        mode: ProducerAccessMode,
    ) -> Result<u64, BrokerError> {
        loop {
            let released = self.released.notified();
            {
                let mut producers = self.producers.lock();
                if producers.by_name.contains_key(&name) {
                    return Err(BrokerError::ProducerBusy(format!(
                        "producer with name '{name}' is already connected to topic {}",
                        self.topic
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
                        self.topic
                    )));
                }
            }
            released.await;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.producers.lock().by_name.is_empty()
    }

    pub fn remove(&self, name: &str, key: u64) {
        let mut producers = self.producers.lock();
        if producers.by_name.get(name).is_some_and(|p| p.key == key) {
            producers.by_name.remove(name);
        }
        drop(producers);
        self.released.notify_waiters();
    }
}

pub struct Topic {
    pub name: TopicName,
    pub full_name: String,
    pub partition: i32,
    pub managed_ledger: Arc<ManagedLedger>,
    metadata: Arc<dyn MetadataStore>,
    cursor_prefix: String,
    batch_entries: usize,
    producers: ProducerRegistry,
    subscriptions: Mutex<HashMap<String, Arc<Subscription>>>,
    /// Producer-name -> sequence-id state; tracked whether or not deduplication is enabled, so
    /// enabling it later needs no replay.
    dedup: Mutex<DedupState>,
    dedup_enabled: AtomicBool,
    dedup_default: bool,
    dedup_key: String,
    dedup_snapshot_due: Arc<Notify>,
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
        let producers = ProducerRegistry::new(full_name.clone());
        let topic = Arc::new(Topic {
            name,
            full_name,
            partition,
            managed_ledger,
            metadata: metadata.clone(),
            cursor_prefix: format!("/cursors/{path}"),
            batch_entries: config.dispatch_batch_entries,
            producers,
            subscriptions: Mutex::default(),
            dedup: Mutex::default(),
            dedup_enabled: AtomicBool::new(config.broker_deduplication_enabled),
            dedup_default: config.broker_deduplication_enabled,
            dedup_key: format!("/dedup/{path}"),
            dedup_snapshot_due: Arc::new(Notify::new()),
        });
        topic.recover_dedup().await?;
        topic.refresh_policies().await?;
        tokio::spawn(snapshot_task(Arc::downgrade(&topic), topic.dedup_snapshot_due.clone()));
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

    /// Rebuilds the deduplication state: the last snapshot, then every entry written after it
    /// (as Pulsar replays its dedup cursor).
    async fn recover_dedup(self: &Arc<Self>) -> Result<(), BrokerError> {
        let snapshot = match self.metadata.get(&self.dedup_key).await? {
            Some(found) => serde_json::from_slice::<DedupSnapshot>(&found.value).map_err(|e| {
                BrokerError::Metadata(format!("dedup snapshot of {}: {e}", self.full_name))
            })?,
            None => DedupSnapshot::default(),
        };
        let after = snapshot.position.map(|(l, e)| Position::new(l, e));
        let managed_ledger = self.managed_ledger.clone();
        let state = tokio::task::spawn_blocking(move || {
            let mut state = DedupState::from_snapshot(&snapshot);
            let ledgers = managed_ledger.ledgers();
            let mut next = crate::cursor::next_position(&ledgers, after);
            while let Some(from) = next {
                let entries = managed_ledger.read_from(from, DEDUP_REPLAY_BATCH)?;
                let Some(&(last, _)) = entries.last() else { break };
                for (position, data) in entries {
                    // An entry whose metadata does not parse cannot be a producer's: skipped.
                    if let Ok((metadata, _)) = magnetar_protocol::parse_metadata_and_payload(&data)
                    {
                        if crate::dedup::is_intermediate_chunk(&metadata) {
                            continue;
                        }
                        let highest =
                            metadata.highest_sequence_id.unwrap_or(0).max(metadata.sequence_id);
                        state.persisted(&metadata.producer_name, highest, position);
                    }
                }
                next = crate::cursor::next_position(&ledgers, Some(last));
            }
            Ok::<_, BrokerError>(state)
        })
        .await
        .map_err(|_| BrokerError::ShuttingDown)??;
        let due = state.snapshot_due(DEDUP_SNAPSHOT_INTERVAL);
        *self.dedup.lock() = state;
        if due {
            self.write_dedup_snapshot().await?;
        }
        Ok(())
    }

    async fn write_dedup_snapshot(&self) -> Result<(), BrokerError> {
        let snapshot = self.dedup.lock().take_snapshot();
        let value =
            serde_json::to_vec(&snapshot).map_err(|e| BrokerError::Metadata(e.to_string()))?;
        self.metadata
            .put(&self.dedup_key, value.into(), magnetar_metadata::ExpectedVersion::Any)
            .await?;
        Ok(())
    }

    /// Re-reads the deduplication policy: the topic's, else its namespace's, else the broker
    /// default (Pulsar's order).
    pub async fn refresh_policies(&self) -> Result<(), BrokerError> {
        let topic_policy = self
            .metadata
            .get(&magnetar_admin::keys::topic_policies_key(&self.name.partitioned_topic()))
            .await?;
        let namespace =
            self.metadata.get(&magnetar_admin::keys::namespace_key(self.name.namespace())).await?;
        let flag = |value: Option<magnetar_metadata::Versioned>| {
            value
                .and_then(|v| serde_json::from_slice::<serde_json::Value>(&v.value).ok())
                .and_then(|v| v.get("deduplicationEnabled").and_then(serde_json::Value::as_bool))
        };
        let enabled = flag(topic_policy).or(flag(namespace)).unwrap_or(self.dedup_default);
        self.dedup_enabled.store(enabled, Ordering::Relaxed);
        Ok(())
    }

    pub fn deduplication_enabled(&self) -> bool {
        self.dedup_enabled.load(Ordering::Relaxed)
    }

    /// `last_sequence_id` for PRODUCER_SUCCESS: -1 unless deduplication is enabled (Pulsar
    /// tracks nothing then).
    pub fn last_sequence_id(&self, producer: &str) -> i64 {
        if self.deduplication_enabled() {
            self.dedup.lock().last_sequence_id(producer)
        } else {
            -1
        }
    }

    /// Whether a SEND is new; a new one is recorded as pushed. Everything is new with
    /// deduplication disabled.
    pub fn check_duplicate(&self, producer: &str, sequence_id: u64, highest: u64) -> DupStatus {
        if !self.deduplication_enabled() {
            return DupStatus::NotDup;
        }
        self.dedup.lock().check(producer, sequence_id, highest)
    }

    /// A producer's entry is durable (runs on the storage completion thread: short).
    pub fn entry_persisted(&self, producer: &str, highest: u64, position: Position) {
        let due = {
            let mut dedup = self.dedup.lock();
            dedup.persisted(producer, highest, position);
            dedup.snapshot_due(DEDUP_SNAPSHOT_INTERVAL)
        };
        if due {
            self.dedup_snapshot_due.notify_one();
        }
    }

    /// A producer's append failed.
    pub fn entry_failed(&self) {
        self.dedup.lock().append_failed();
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

    /// Registers a producer. Returns the topic epoch.
    pub async fn add_producer(
        &self,
        name: String,
        key: u64,
        mode: ProducerAccessMode,
    ) -> Result<u64, BrokerError> {
        self.producers.add(name, key, mode).await
    }

    pub fn remove_producer(&self, name: &str, key: u64) {
        self.producers.remove(name, key)
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
        self.producers.is_empty()
            && self.subscriptions.lock().values().all(|s| s.consumer_count() == 0)
            && self.managed_ledger.last_confirmed().is_none()
    }

    pub fn subscription_names(&self) -> Vec<String> {
        self.subscriptions.lock().keys().cloned().collect()
    }
}

/// Writes a deduplication snapshot whenever enough entries were persisted since the last; at
/// most one write in flight. Ends with the topic.
async fn snapshot_task(topic: Weak<Topic>, due: Arc<Notify>) {
    loop {
        due.notified().await;
        let Some(topic) = topic.upgrade() else { return };
        if let Err(error) = topic.write_dedup_snapshot().await {
            tracing::warn!(topic = %topic.full_name, %error, "dedup snapshot not written");
        }
    }
}
