//! A persistent topic: its managed ledger, producers and subscriptions.

use crate::config::BrokerConfig;
use crate::cursor::{AckState, Position};
use crate::cursor_ledger::{CursorLedger, CursorLedgerLimits, LoadError};
use crate::dedup::{DedupSnapshot, DedupState, DupStatus};
use crate::error::BrokerError;
use crate::managed_ledger::ManagedLedger;
use crate::retention::{Consumed, RetentionLimits};
use crate::stats::{ClientInfo, Meter, PublisherStats};
use crate::subscription::{previous_position, DispatchSettings, Subscription};
use magnetar_metadata::MetadataStore;
use magnetar_model::names::TopicName;
use magnetar_model::policy::{
    Effective, InactiveTopicDeleteMode, InactiveTopicPolicies, NamespacePolicies, TopicPolicies,
};
use magnetar_protocol::commands::{self, AssignedBroker};
use magnetar_protocol::proto::{command_subscribe::SubType, MessageIdData, ProducerAccessMode};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::Notify;

/// Entries between two deduplication snapshots (Pulsar's `brokerDeduplicationEntriesInterval`):
/// a load replays at most about this many entries.
const DEDUP_SNAPSHOT_INTERVAL: u64 = 1000;
/// Entries read per round while replaying the tail for deduplication state.
const DEDUP_REPLAY_BATCH: usize = 256;
/// How long closing the producers (an unload, a backlog quota) waits for the sends taken
/// before to be answered. They always are (storage answers every append, failing it at the
/// latest on its time-out); this only bounds the wait against a storage that broke that
/// promise.
const PRODUCER_CLOSE_DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Bound on the storage steps of an unload together (cursors' last writes, ledgers' closes).
const UNLOAD_STORAGE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `step`, or a `ServiceNotReady` error once `deadline` has passed.
async fn bounded_step<T>(
    deadline: tokio::time::Instant,
    step: impl std::future::Future<Output = Result<T, BrokerError>>,
) -> Result<T, BrokerError> {
    tokio::time::timeout_at(deadline, step).await.unwrap_or_else(|_| {
        Err(BrokerError::ServiceNotReady(format!(
            "unload's storage steps not finished within {UNLOAD_STORAGE_LIMIT:?}"
        )))
    })
}

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
    /// Where the broker tells the client its producer was closed (topic deleted or unloaded).
    client: ProducerClient,
}

/// A producer as its connection knows it.
#[derive(Clone)]
pub struct ProducerClient {
    pub producer_id: u64,
    pub outbox: crate::connection::Outbox,
    /// Address, version, connection time and the meter of what it published (stats).
    pub info: Arc<ClientInfo>,
    /// Set when the broker closes the producer, before CLOSE_PRODUCER is queued: its
    /// connection stops taking sends under it from then on (SeqCst with `begin_publish`).
    pub closed: Arc<AtomicBool>,
}

impl ProducerClient {
    pub fn new(producer_id: u64, outbox: crate::connection::Outbox, info: Arc<ClientInfo>) -> Self {
        Self { producer_id, outbox, info, closed: Arc::default() }
    }
}

#[derive(Default)]
struct Producers {
    by_name: HashMap<String, ProducerEntry>,
    /// WaitForExclusive producers queued for the topic, first come first served (keys).
    waiting: VecDeque<u64>,
    /// Queued producers an ExclusiveWithFencing producer took the topic from: each hears
    /// ProducerFenced when it looks again (keys).
    fenced_waiters: HashSet<u64>,
    /// Bumped each time an exclusive producer takes the topic; a reconnecting exclusive producer
    /// whose epoch is behind it has been replaced and is fenced.
    epoch: u64,
}

/// What the access-mode rules say of a producer asking for the topic now.
#[derive(Debug)]
enum Admission {
    Admit,
    Wait,
    Reject(BrokerError),
}

impl Producers {
    fn exclusive_holder(&self) -> Option<&str> {
        self.by_name
            .iter()
            .find(|(_, p)| p.mode != ProducerAccessMode::Shared)
            .map(|(name, _)| name.as_str())
    }

    /// Pulsar's `AbstractTopic.incrementTopicEpochIfNeeded`, with the same error kinds: Shared
    /// meets an exclusive producer (held or queued) with ProducerBusy; Exclusive meets any
    /// producer, a queue, or its own stale epoch with ProducerFenced; WaitForExclusive queues;
    /// ExclusiveWithFencing always takes the topic (`add` fences out whoever holds or waits).
    fn admission(
        &self,
        topic: &str,
        name: &str,
        key: u64,
        mode: ProducerAccessMode,
        client_epoch: Option<u64>,
    ) -> Admission {
        if self.fenced_waiters.contains(&key) {
            return Admission::Reject(BrokerError::ProducerFenced("Fenced out".into()));
        }
        if self.by_name.contains_key(name) && mode != ProducerAccessMode::ExclusiveWithFencing {
            return Admission::Reject(BrokerError::ProducerBusy(format!(
                "Producer with name '{name}' is already connected to topic {topic}"
            )));
        }
        let holder = self.exclusive_holder();
        let stale_epoch = client_epoch.is_some_and(|e| e < self.epoch);
        match mode {
            ProducerAccessMode::Shared => match holder {
                Some(holder) => Admission::Reject(BrokerError::ProducerBusy(format!(
                    "Topic has an existing exclusive producer: {holder}"
                ))),
                None if !self.waiting.is_empty() => Admission::Reject(BrokerError::ProducerBusy(
                    "Topic has an exclusive producer waiting".into(),
                )),
                None => Admission::Admit,
            },
            ProducerAccessMode::WaitForExclusive => {
                let first_in_line = self.waiting.front().is_none_or(|&k| k == key);
                if !self.by_name.is_empty() || !first_in_line {
                    Admission::Wait
                } else if stale_epoch {
                    Admission::Reject(self.epoch_moved(client_epoch))
                } else {
                    Admission::Admit
                }
            }
            ProducerAccessMode::ExclusiveWithFencing => Admission::Admit,
            ProducerAccessMode::Exclusive => match holder {
                Some(holder) => Admission::Reject(BrokerError::ProducerFenced(format!(
                    "Topic has an existing exclusive producer: {holder}"
                ))),
                None if !self.waiting.is_empty() => Admission::Reject(BrokerError::ProducerFenced(
                    "Topic has an exclusive producer waiting".into(),
                )),
                None if !self.by_name.is_empty() => Admission::Reject(BrokerError::ProducerFenced(
                    "Topic has existing shared producers".into(),
                )),
                None if stale_epoch => Admission::Reject(self.epoch_moved(client_epoch)),
                None => Admission::Admit,
            },
        }
    }

    fn epoch_moved(&self, client_epoch: Option<u64>) -> BrokerError {
        BrokerError::ProducerFenced(format!(
            "Topic epoch has already moved. Current epoch: {}, Producer epoch: {}",
            self.epoch,
            client_epoch.unwrap_or_default()
        ))
    }

    /// What an ExclusiveWithFencing producer takes the topic from: the producers attached
    /// (detached here and marked closed; the caller tells their clients) and those in line
    /// (each hears ProducerFenced when it looks again).
    fn fence_out(&mut self) -> Vec<ProducerEntry> {
        self.fenced_waiters.extend(self.waiting.drain(..));
        self.detach_all()
    }

    /// Takes every attached producer off and marks it closed (its connection takes no more
    /// sends under it from then on); the caller tells their clients.
    fn detach_all(&mut self) -> Vec<ProducerEntry> {
        let detached: Vec<ProducerEntry> = self.by_name.drain().map(|(_, entry)| entry).collect();
        for entry in &detached {
            entry.client.closed.store(true, Ordering::SeqCst);
        }
        detached
    }

    /// Registers an admitted producer; returns the topic epoch it is told.
    fn admit(
        &mut self,
        name: String,
        key: u64,
        mode: ProducerAccessMode,
        epoch: Option<u64>,
        client: ProducerClient,
    ) -> u64 {
        if mode != ProducerAccessMode::Shared {
            // A returning exclusive producer keeps its epoch; a new one moves the topic on.
            self.epoch = match epoch {
                Some(epoch) if epoch >= self.epoch => epoch,
                _ => self.epoch + 1,
            };
        }
        self.waiting.retain(|&k| k != key);
        self.by_name.insert(name, ProducerEntry { key, mode, client });
        self.epoch
    }
}

/// A topic's producers: unique names and the access modes (Shared, Exclusive,
/// WaitForExclusive), shared by persistent and non-persistent topics.
pub struct ProducerRegistry {
    topic: String,
    producers: Mutex<Producers>,
    released: Notify,
    /// Most producers at once (Pulsar's `maxProducersPerTopic`; 0: no limit).
    max_producers: std::sync::atomic::AtomicU32,
}

/// Takes a queued WaitForExclusive producer out of the line when its request goes away
/// (connection closed, producer closed) before it got the topic.
struct LeaveQueue<'a> {
    registry: &'a ProducerRegistry,
    key: u64,
}

impl Drop for LeaveQueue<'_> {
    fn drop(&mut self) {
        let mut producers = self.registry.producers.lock();
        let before = producers.waiting.len();
        producers.waiting.retain(|&k| k != self.key);
        producers.fenced_waiters.remove(&self.key);
        let left = producers.waiting.len() != before;
        drop(producers);
        if left {
            self.registry.released.notify_waiters();
        }
    }
}

impl ProducerRegistry {
    pub fn new(topic: String) -> Self {
        ProducerRegistry {
            topic,
            producers: Mutex::default(),
            released: Notify::new(),
            max_producers: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Sets the most producers the topic accepts (0: no limit).
    pub fn set_max_producers(&self, max: u32) {
        self.max_producers.store(max, Ordering::Relaxed);
    }

    /// Registers a producer. Returns the topic epoch. A WaitForExclusive producer that cannot
    /// have the topic yet calls `queued` once and waits here, in line, until it can; dropping
    /// the future leaves the line.
    pub async fn add(
        &self,
        name: String,
        key: u64,
        mode: ProducerAccessMode,
        epoch: Option<u64>,
        client: ProducerClient,
        queued: impl FnOnce(),
    ) -> Result<u64, BrokerError> {
        let mut queued = Some(queued);
        let mut _in_line = None;
        loop {
            let released = self.released.notified();
            {
                let mut producers = self.producers.lock();
                let max = self.max_producers.load(Ordering::Relaxed) as usize;
                if max > 0
                    && producers.by_name.len() >= max
                    && !producers.by_name.contains_key(&name)
                {
                    // Pulsar's `isProducersExceeded`: ProducerBusy.
                    producers.waiting.retain(|&k| k != key);
                    return Err(BrokerError::ProducerBusy(
                        "Topic reached max producers limit".into(),
                    ));
                }
                match producers.admission(&self.topic, &name, key, mode, epoch) {
                    Admission::Admit if mode == ProducerAccessMode::ExclusiveWithFencing => {
                        let fenced = producers.fence_out();
                        let epoch = producers.admit(name, key, mode, epoch, client);
                        drop(producers);
                        // Pulsar disconnects the fenced producers: CLOSE_PRODUCER; an exclusive
                        // one reconnecting then meets this holder and is fenced for good.
                        Self::tell_closed(fenced, None);
                        self.released.notify_waiters();
                        return Ok(epoch);
                    }
                    Admission::Admit => {
                        return Ok(producers.admit(name, key, mode, epoch, client));
                    }
                    Admission::Reject(error) => {
                        producers.waiting.retain(|&k| k != key);
                        producers.fenced_waiters.remove(&key);
                        return Err(error);
                    }
                    Admission::Wait => {
                        if !producers.waiting.contains(&key) {
                            producers.waiting.push_back(key);
                            _in_line = Some(LeaveQueue { registry: self, key });
                        }
                    }
                }
            }
            if let Some(queued) = queued.take() {
                queued();
            }
            released.await;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.producers.lock().by_name.is_empty()
    }

    pub fn len(&self) -> usize {
        self.producers.lock().by_name.len()
    }

    /// WaitForExclusive producers in line.
    pub fn waiting(&self) -> usize {
        self.producers.lock().waiting.len()
    }

    /// The topic epoch, once an exclusive producer took the topic.
    pub fn epoch(&self) -> Option<u64> {
        Some(self.producers.lock().epoch).filter(|&epoch| epoch > 0)
    }

    /// `PublisherStatsImpl` of every producer, by name; rates at `now`.
    pub fn stats(&self, now: std::time::Instant) -> Vec<PublisherStats> {
        let producers = self.producers.lock();
        let mut stats: Vec<PublisherStats> = producers
            .by_name
            .iter()
            .map(|(name, entry)| {
                let info = &entry.client.info;
                let reading = info.meter.read_at(now);
                PublisherStats {
                    access_mode: crate::stats::access_mode_name(entry.mode),
                    msg_rate_in: reading.rate,
                    msg_throughput_in: reading.throughput,
                    average_msg_size: if reading.rate > 0.0 {
                        reading.throughput / reading.rate
                    } else {
                        0.0
                    },
                    producer_id: entry.client.producer_id,
                    producer_name: name.clone(),
                    address: info.address.clone(),
                    connected_since: crate::stats::format_time_ms(info.connected_since_ms),
                    client_version: info.client_version.clone(),
                    msg_in_counter: reading.messages,
                    bytes_in_counter: reading.bytes,
                    metadata: info.metadata.clone(),
                    ..Default::default()
                }
            })
            .collect();
        stats.sort_by(|a, b| a.producer_name.cmp(&b.producer_name));
        stats
    }

    /// Closes every producer: each client hears CLOSE_PRODUCER (and reconnects, as clients do).
    pub fn close_all(&self) {
        self.close_all_to(None);
    }

    /// Closes every producer, naming the broker the topic moves to (PIP-307) when there is one.
    pub fn close_all_to(&self, assigned: Option<&AssignedBroker>) {
        Self::tell_closed(self.detach_all(), assigned);
    }

    /// Takes every producer off the topic and marks it closed (its connection takes no more
    /// sends under it); `tell_closed` then tells the clients. The one way the broker removes a
    /// producer (`remove` is the client's own close, and `admit` never replaces one), so a
    /// producer's `closed` flag alone says whether the broker closed it.
    fn detach_all(&self) -> Vec<ProducerEntry> {
        let detached = self.producers.lock().detach_all();
        self.released.notify_waiters();
        detached
    }

    fn tell_closed(detached: Vec<ProducerEntry>, assigned: Option<&AssignedBroker>) {
        for entry in detached {
            let command = commands::close_producer_to(entry.client.producer_id, u64::MAX, assigned);
            entry.client.outbox.send_command(&command);
        }
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
    /// Topic compaction: runs, the compacted ledger in force, compacted reads.
    pub compaction: Arc<magnetar_compaction::TopicCompaction>,
    metadata: Arc<dyn MetadataStore>,
    cursor_prefix: String,
    cursor_limits: CursorLedgerLimits,
    dispatch: DispatchSettings,
    producers: ProducerRegistry,
    subscriptions: Mutex<HashMap<String, Arc<Subscription>>>,
    /// Producer-name -> sequence-id state; tracked whether or not deduplication is enabled, so
    /// enabling it later needs no replay.
    dedup: Mutex<DedupState>,
    dedup_enabled: AtomicBool,
    /// What the topic obeys (topic over namespace over broker policies), re-read at load, at
    /// each producer's and consumer's creation and whenever a policy changes, here or through
    /// another broker ([`Topic::refresh_policies`], `policy_watch`).
    policies: Mutex<Arc<Effective>>,
    /// Held while policies are read and applied, so refreshes apply in the order they read.
    policy_refresh: tokio::sync::Mutex<()>,
    /// The broker's policy defaults (the dynamic configuration may change them).
    policy_defaults: crate::service::SharedPolicyDefaults,
    /// How the broker stores ledgers where no policy says (`[ledgers]`).
    ledger_defaults: magnetar_ledger::LedgerMetadata,
    cluster: String,
    dedup_key: String,
    dedup_snapshot_due: Arc<Notify>,
    /// The snapshot key's version as this broker last wrote or read it (compare-and-set).
    dedup_version: tokio::sync::Mutex<Option<u64>>,
    /// The position the stored deduplication snapshot covers: with deduplication on, what
    /// comes after it is replayed at load, so retention keeps it (Pulsar's dedup cursor).
    dedup_snapshot_position: Mutex<Option<Position>>,
    /// Set once a delete starts: no producer or subscription attaches after it.
    deleted: AtomicBool,
    /// When the broker's housekeeping last saw a producer or consumer on the topic (clock ms;
    /// starts at load): what inactive-topic deletion measures idleness from.
    last_active_ms: AtomicU64,
    /// When the topic was loaded (monotonic), and the last send taken since, as nanoseconds
    /// after it plus one (0: none): stats' `lastPublishTimeStamp`, as Pulsar's ledger keeps
    /// its last add time. Kept as an offset so the send path stores a number, reading no clock
    /// of its own.
    loaded_at: std::time::Instant,
    last_publish_nanos: AtomicU64,
    /// Set once an unload starts: the broker loads the topic afresh on next use.
    unloaded: AtomicBool,
    /// Sends taken for storing whose answer (receipt or error) is not queued yet: an unload
    /// closes the producers only once this is back to zero (see `unload`).
    publishes_in_flight: AtomicUsize,
    publishes_drained: Notify,
    /// What producers published (stats).
    pub in_meter: Meter,
    /// Time from staging an entry to its durability, in microseconds (Pulsar's
    /// `pulsar_storage_write_latency_le_*`).
    pub write_latency: magnetar_metrics::WindowedBuckets,
    /// Sizes of the entries published (`pulsar_entry_size_le_*`).
    pub entry_size: magnetar_metrics::WindowedBuckets,
    /// The policy limits the publish and dispatch paths read without a lock (`limits`).
    limits: Arc<crate::limits::TopicLimits>,
}

/// A send counted in flight on its topic (`Topic::begin_publish`), counted out when dropped.
pub struct PublishTicket(Arc<Topic>);

impl PublishTicket {
    pub fn topic(&self) -> &Arc<Topic> {
        &self.0
    }
}

impl Drop for PublishTicket {
    fn drop(&mut self) {
        self.0.end_publish();
    }
}

/// The topic's and its namespace's policies layered over the broker defaults (Pulsar's order).
/// A document that does not parse counts as absent (logged): a bad policy must not make the
/// topic unloadable.
pub(crate) async fn read_effective(
    metadata: &dyn MetadataStore,
    name: &TopicName,
    defaults: &magnetar_model::policy::PolicyDefaults,
    cluster: &str,
) -> Result<Effective, BrokerError> {
    let topic_key = magnetar_model::keys::topic_policies_key(&name.partitioned_topic());
    let namespace_key = magnetar_model::keys::namespace_key(name.namespace());
    let topic: Option<TopicPolicies> = read_policy_document(metadata, name, &topic_key).await?;
    let namespace: Option<NamespacePolicies> =
        read_policy_document(metadata, name, &namespace_key).await?;
    Ok(Effective::resolve(defaults, namespace.as_ref(), topic.as_ref(), cluster))
}

async fn read_policy_document<T: serde::de::DeserializeOwned>(
    metadata: &dyn MetadataStore,
    name: &TopicName,
    key: &str,
) -> Result<Option<T>, BrokerError> {
    let Some(found) = metadata.get(key).await? else { return Ok(None) };
    match serde_json::from_slice(&found.value) {
        Ok(document) => Ok(Some(document)),
        Err(error) => {
            tracing::error!(topic = %name, key, %error, "policy document unreadable; ignored");
            Ok(None)
        }
    }
}

/// How a topic's next ledgers are stored on storage nodes: the namespace's or topic's
/// `persistence` (else the broker's quorums), and its bookie affinity (else the broker's
/// `[ledgers] isolation_groups`).
fn ledger_persistence(
    effective: &Effective,
    defaults: &magnetar_ledger::LedgerMetadata,
) -> magnetar_ledger::LedgerMetadata {
    let mut persistence = match &effective.persistence {
        Some(p) => magnetar_ledger::LedgerMetadata {
            ensemble_size: p.ensemble,
            write_quorum: p.write_quorum,
            ack_quorum: p.ack_quorum,
            properties: Default::default(),
            isolation: None,
        },
        None => defaults.clone(),
    };
    persistence.isolation = effective.bookie_affinity.clone().or(defaults.isolation.clone());
    persistence
}

impl Topic {
    /// Loads a topic: its managed ledger and its durable subscriptions.
    pub async fn load(
        name: TopicName,
        config: &BrokerConfig,
        policy_defaults: crate::service::SharedPolicyDefaults,
        ledgers: &crate::managed_ledger::LedgerBackend,
        metadata: Arc<dyn MetadataStore>,
    ) -> Result<Arc<Topic>, BrokerError> {
        let full_name = name.to_string();
        // On storage nodes, the namespace's or topic's `persistence` picks the quorums of the
        // topic's new ledgers, and the namespace's bookie affinity the nodes they may use.
        // Read here for the first ledger; a change applies from the topic's next ledger
        // (`refresh_policies`), as Pulsar's does.
        let ledger_defaults = ledgers.persistence();
        let defaults = policy_defaults.read().clone();
        let ledgers = if ledgers.persistence_policies {
            let effective =
                read_effective(&*metadata, &name, &defaults, &config.cluster_name).await?;
            ledgers.clone().with_persistence(ledger_persistence(&effective, &ledger_defaults))
        } else {
            ledgers.clone()
        };
        let managed_ledger = ManagedLedger::open(
            full_name.clone(),
            magnetar_model::keys::managed_ledger_key(&name),
            &ledgers,
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
        let cursor_prefix = magnetar_model::keys::cursors_of(&name);
        let dedup_key = magnetar_model::keys::dedup_key(&name);
        let compaction_host = crate::compaction_host::CompactionHostImpl {
            managed_ledger: managed_ledger.clone(),
            metadata: metadata.clone(),
            fence: managed_ledger.fence().clone(),
            key: magnetar_model::keys::compaction_key(&name),
            topic: full_name.clone(),
            version: tokio::sync::Mutex::new(None),
        };
        let compaction = magnetar_compaction::TopicCompaction::load(
            Arc::new(compaction_host),
            managed_ledger.backend().storage.clone(),
        )
        .await?;
        let topic = Arc::new(Topic {
            name,
            full_name,
            partition,
            managed_ledger,
            compaction,
            metadata: metadata.clone(),
            cursor_prefix,
            cursor_limits: config.cursor_ledger_limits(),
            dispatch: config.dispatch_settings(),
            producers,
            subscriptions: Mutex::default(),
            dedup: Mutex::default(),
            dedup_enabled: AtomicBool::new(config.broker_deduplication_enabled),
            policies: Mutex::new(Arc::new(Effective::resolve(
                &defaults,
                None,
                None,
                &config.cluster_name,
            ))),
            policy_refresh: tokio::sync::Mutex::new(()),
            policy_defaults,
            ledger_defaults,
            cluster: config.cluster_name.clone(),
            dedup_key,
            dedup_snapshot_due: Arc::new(Notify::new()),
            dedup_version: tokio::sync::Mutex::new(None),
            dedup_snapshot_position: Mutex::new(None),
            deleted: AtomicBool::new(false),
            last_active_ms: AtomicU64::new(ledgers.clock.now_ms()),
            loaded_at: ledgers.clock.now(),
            last_publish_nanos: AtomicU64::new(0),
            unloaded: AtomicBool::new(false),
            publishes_in_flight: AtomicUsize::new(0),
            publishes_drained: Notify::new(),
            in_meter: Meter::new(),
            write_latency: magnetar_metrics::WindowedBuckets::new(
                crate::prometheus::WRITE_LATENCY_BUCKETS_US,
            ),
            entry_size: magnetar_metrics::WindowedBuckets::new(
                crate::prometheus::ENTRY_SIZE_BUCKETS,
            ),
            limits: Arc::default(),
        });
        topic.recover_dedup().await?;
        topic.refresh_policies().await?;
        tokio::spawn(snapshot_task(Arc::downgrade(&topic), topic.dedup_snapshot_due.clone()));
        tokio::spawn(fence_task(Arc::downgrade(&topic), topic.managed_ledger.fence().clone()));
        let ledgers = topic.managed_ledger.ledgers();
        let storage = topic.managed_ledger.backend().storage.clone();
        // Every cursor record in one request.
        let names = metadata.list_children(&topic.cursor_prefix).await?;
        let records: Vec<String> = names
            .iter()
            .map(|encoded| magnetar_model::keys::child(&topic.cursor_prefix, encoded))
            .collect();
        let found_records = metadata.get_many(&records).await?;
        for (encoded, found) in names.into_iter().zip(found_records) {
            let Some(found) = found else { continue };
            // Fences the cursor's ledger (a previous owner's persists fail from now on) and
            // reads its last state.
            let loaded = match crate::cursor_ledger::load(&storage, &found).await {
                Ok(loaded) => loaded,
                Err(LoadError::Unreadable(error)) => {
                    // As before cursors moved to ledgers: logged and skipped (the key stays,
                    // for an operator; a new subscription of that name fences the topic).
                    tracing::error!(topic = %topic.full_name, cursor = %encoded, %error, "cursor unreadable; skipped");
                    continue;
                }
                Err(LoadError::Broker(error)) => return Err(error),
            };
            let mut ack = loaded.ack;
            ack.reconcile(&ledgers);
            let last_read = ack.mark_delete();
            let name =
                magnetar_model::names::decode_topic_name(&encoded).unwrap_or(encoded.clone());
            let cursor = topic.cursor_ledger(&name, Some(loaded.version), loaded.obsolete);
            let subscription = topic.start_subscription(
                name.clone(),
                SubType::Exclusive,
                Some(cursor),
                ack,
                last_read,
            );
            topic.subscriptions.lock().insert(name, subscription.clone());
            // The subscription's own cursor ledger, as Pulsar opens a new one: the loaded state
            // is its first entry, the record names it (an old-format value is converted here),
            // and the ledgers the record named are deleted.
            subscription.persist_now().await?;
        }
        Ok(topic)
    }

    /// Rebuilds the deduplication state: the last snapshot, then every entry written after it
    /// (as Pulsar replays its dedup cursor).
    async fn recover_dedup(self: &Arc<Self>) -> Result<(), BrokerError> {
        let found = self.metadata.get(&self.dedup_key).await?;
        *self.dedup_version.lock().await = found.as_ref().map(|f| f.version);
        let stored_position = |found: &magnetar_metadata::Versioned| {
            serde_json::from_slice::<DedupSnapshot>(&found.value).ok()?.position
        };
        *self.dedup_snapshot_position.lock() =
            found.as_ref().and_then(stored_position).map(|(l, e)| Position::new(l, e));
        let snapshot = match found {
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

    /// Writes a deduplication snapshot by compare-and-set (a conflict fences the topic).
    async fn write_dedup_snapshot(&self) -> Result<(), BrokerError> {
        let mut version = self.dedup_version.lock().await;
        let snapshot = self.dedup.lock().take_snapshot();
        let value =
            serde_json::to_vec(&snapshot).map_err(|e| BrokerError::Metadata(e.to_string()))?;
        let fence = self.managed_ledger.fence();
        fence.put(&*self.metadata, &self.dedup_key, value.into(), &mut version).await?;
        *self.dedup_snapshot_position.lock() = snapshot.position.map(|(l, e)| Position::new(l, e));
        Ok(())
    }

    /// Re-reads the topic's and its namespace's policies and layers them over the broker
    /// defaults (Pulsar's order). A document that does not parse counts as absent (logged): a
    /// bad policy must not make the topic unloadable.
    pub async fn refresh_policies(&self) -> Result<(), BrokerError> {
        // Read and applied under the lock: a refresh that read older documents cannot apply
        // them after one that read newer (the admin API, the policy watch and producer or
        // consumer creation refresh concurrently).
        let _serial = self.policy_refresh.lock().await;
        let defaults = self.policy_defaults.read().clone();
        let effective =
            read_effective(&*self.metadata, &self.name, &defaults, &self.cluster).await?;
        self.dedup_enabled.store(effective.deduplication_enabled, Ordering::Relaxed);
        self.limits.apply(&effective, self.managed_ledger.clock().now_ms());
        if effective.max_message_size >= defaults.max_message_size {
            // Only a topic's own, smaller limit is checked per SEND (as Pulsar): the broker's
            // is the frame limit, enforced when frames are decoded.
            self.limits.max_message_size.store(0, Ordering::Relaxed);
        }
        self.producers.set_max_producers(effective.max_producers_per_topic);
        let backend = self.managed_ledger.backend();
        if backend.persistence_policies {
            backend.set_persistence(ledger_persistence(&effective, &self.ledger_defaults));
        }
        *self.policies.lock() = Arc::new(effective);
        Ok(())
    }

    /// The policies the topic obeys now.
    pub fn policies(&self) -> Arc<Effective> {
        self.policies.lock().clone()
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

    /// The cursor persistence of durable subscription `name`: its record's `version` and the
    /// ledgers to delete as loaded (a new subscription: `None` and nothing).
    fn cursor_ledger(&self, name: &str, version: Option<u64>, obsolete: Vec<u64>) -> CursorLedger {
        CursorLedger::new(
            self.managed_ledger.backend().clone(),
            self.metadata.clone(),
            self.managed_ledger.fence().clone(),
            magnetar_model::keys::cursor_key(&self.name, name),
            &self.full_name,
            name,
            self.cursor_limits,
            version,
            obsolete,
        )
    }

    fn start_subscription(
        &self,
        name: String,
        sub_type: SubType,
        cursor: Option<CursorLedger>,
        ack: AckState,
        last_read: Option<Position>,
    ) -> Arc<Subscription> {
        let subscription = Subscription::start_limited(
            name,
            sub_type,
            self.partition,
            self.managed_ledger.clone(),
            cursor,
            ack,
            last_read,
            self.dispatch,
            self.limits.clone(),
        );
        subscription.set_compaction(self.compaction.clone());
        subscription
    }

    /// A send was taken at `at` (the send path's own clock reading).
    pub fn note_publish(&self, at: std::time::Instant) {
        let nanos = at.saturating_duration_since(self.loaded_at).as_nanos();
        let stored = u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1;
        self.last_publish_nanos.fetch_max(stored, Ordering::Relaxed);
    }

    /// Epoch ms of the last send taken since the topic was loaded (0: none).
    pub fn last_publish_ms(&self) -> u64 {
        let stored = self.last_publish_nanos.load(Ordering::Relaxed);
        if stored == 0 {
            return 0;
        }
        let clock = self.managed_ledger.clock();
        let at = self.loaded_at + std::time::Duration::from_nanos(stored - 1);
        let ago = clock.now().saturating_duration_since(at).as_millis();
        clock.now_ms().saturating_sub(u64::try_from(ago).unwrap_or(u64::MAX))
    }

    /// Registers a producer. Returns the topic epoch.
    pub async fn add_producer(
        &self,
        name: String,
        key: u64,
        mode: ProducerAccessMode,
        epoch: Option<u64>,
        client: ProducerClient,
        queued: impl FnOnce(),
    ) -> Result<u64, BrokerError> {
        if self.is_closed() {
            return Err(BrokerError::ServiceNotReady(format!(
                "topic {} is being deleted or unloaded",
                self.full_name
            )));
        }
        if self.managed_ledger.is_terminated() {
            return Err(BrokerError::TopicTerminated(format!(
                "Topic {} was already terminated",
                self.full_name
            )));
        }
        self.producers.add(name, key, mode, epoch, client, queued).await
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
        if self.is_closed() {
            return Err(BrokerError::ServiceNotReady(format!(
                "topic {} is being deleted or unloaded",
                self.full_name
            )));
        }
        if let Some(existing) = self.subscriptions.lock().get(name).cloned() {
            return Ok(existing);
        }
        // Pulsar's `checkMaxSubscriptionsPerTopicExceed` (readers' subscriptions count too).
        let max = self.policies().max_subscriptions_per_topic as usize;
        if max > 0 && self.subscriptions.lock().len() >= max {
            return Err(BrokerError::NotAllowed(format!(
                "Exceed the maximum number of subscriptions of the topic: {}",
                self.full_name
            )));
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
        // A durable subscription at the latest entry starts with everything before acknowledged.
        // A non-durable one (a reader's) starts acknowledged up to the entry before its start, as
        // Pulsar's non-durable cursor does: GET_LAST_MESSAGE_ID then answers a mark-delete
        // position, which a reader at `latest` with an inclusive start compares with the last
        // entry (`hasMessageAvailable`).
        let ack = match (durable, &start) {
            (true, StartAt::Latest) => AckState::new(last_confirmed),
            (false, _) => AckState::new(last_read),
            _ => AckState::new(None),
        };
        // A new cursor: its first write expects no key (another owner's would fence us).
        let cursor = durable.then(|| self.cursor_ledger(name, None, Vec::new()));
        let subscription =
            self.start_subscription(name.to_string(), sub_type, cursor, ack, last_read);
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

    /// Deletes what every durable subscription has consumed and retention no longer covers
    /// (readers do not hold data, as in Pulsar: retention is what keeps it for them), at most
    /// `max` ledgers. Returns how many ledgers went.
    pub async fn trim(&self, max: usize) -> Result<usize, BrokerError> {
        if self.is_deleted() {
            return Ok(0);
        }
        let policies = self.policies();
        let consumed = {
            let subscriptions = self.subscriptions.lock();
            let cursors = subscriptions.values().filter(|s| s.durable).map(|s| s.mark_delete());
            // With deduplication on, what its snapshot does not cover is replayed at load.
            let dedup = self.deduplication_enabled().then(|| *self.dedup_snapshot_position.lock());
            // Compaction reads what comes after its horizon at its next run.
            let compaction = self
                .compaction
                .retention_hold()
                .map(|horizon| horizon.map(|(l, e)| Position::new(l, e)));
            Consumed::slowest(cursors.chain(dedup).chain(compaction))
        };
        let limits = RetentionLimits {
            time_ms: policies.retention_time_ms(),
            size_bytes: policies.retention_size_bytes(),
        };
        self.managed_ledger.trim(consumed, limits, max).await
    }

    /// Whether inactive-topic deletion may delete the topic now, under `policy`: no producer
    /// and no consumer since at least `max_inactive_duration_seconds`, and no subscription
    /// (`delete_when_no_subscriptions`) or only caught-up ones
    /// (`delete_when_subscriptions_caught_up`). Also records activity seen now.
    pub fn inactive_for_deletion(&self, policy: &InactiveTopicPolicies) -> bool {
        let now = self.managed_ledger.clock().now_ms();
        if self.client_count() > 0 {
            self.last_active_ms.store(now, Ordering::Relaxed);
            return false;
        }
        if !policy.delete_while_inactive || self.is_deleted() {
            return false;
        }
        let idle_ms = now.saturating_sub(self.last_active_ms.load(Ordering::Relaxed));
        if idle_ms < u64::try_from(policy.max_inactive_duration_seconds).unwrap_or(0) * 1000 {
            return false;
        }
        let subscriptions = self.subscriptions.lock();
        match policy.inactive_topic_delete_mode {
            InactiveTopicDeleteMode::DeleteWhenNoSubscriptions => {
                subscriptions.values().all(|s| !s.durable)
            }
            InactiveTopicDeleteMode::DeleteWhenSubscriptionsCaughtUp => {
                let last = self.managed_ledger.last_confirmed();
                subscriptions.values().filter(|s| s.durable).all(|s| s.mark_delete() >= last)
            }
        }
    }

    /// The limits the publish and dispatch paths read (atomics, no lock).
    pub fn limits(&self) -> &Arc<crate::limits::TopicLimits> {
        &self.limits
    }

    /// The topic's subscriptions now.
    pub fn subscriptions(&self) -> Vec<Arc<Subscription>> {
        self.subscriptions.lock().values().cloned().collect()
    }

    /// Consumers connected now, all subscriptions together.
    pub fn consumer_count(&self) -> usize {
        self.subscriptions.lock().values().map(|s| s.consumer_count()).sum()
    }

    /// Closes every producer (they reconnect, and meet the backlog quota and disk checks), as
    /// Pulsar's `BacklogQuotaManager.disconnectProducers`. As an unload does, it first waits (bounded)
    /// for the sends taken before, so that their receipts precede CLOSE_PRODUCER: a client
    /// resends whatever is unanswered when its producer is closed (a receipt after the close
    /// would have that message stored twice). Sends under a closed producer are not taken.
    pub async fn disconnect_producers(&self) {
        let detached = self.producers.detach_all();
        self.close_detached(detached).await;
    }

    /// As [`Self::disconnect_producers`], from a path that cannot wait (a send refused for want
    /// of disk): the producers are detached now, so none of their later sends is taken, and
    /// their CLOSE_PRODUCER follows from a task once the sends taken before are answered.
    pub fn disconnect_producers_soon(self: &Arc<Self>) {
        let detached = self.producers.detach_all();
        if detached.is_empty() {
            return;
        }
        let topic = self.clone();
        tokio::spawn(async move { topic.close_detached(detached).await });
    }

    async fn close_detached(&self, detached: Vec<ProducerEntry>) {
        if !self.publishes_drained(PRODUCER_CLOSE_DRAIN_LIMIT).await {
            tracing::warn!(topic = %self.full_name, in_flight = self.publishes_in_flight.load(Ordering::SeqCst),
                "disconnecting producers: sends still being stored after {PRODUCER_CLOSE_DRAIN_LIMIT:?}; closing them anyway (their clients may store those twice)");
        }
        ProducerRegistry::tell_closed(detached, None);
    }

    pub fn producer_count(&self) -> usize {
        self.producers.len()
    }

    pub fn subscription_names(&self) -> Vec<String> {
        self.subscriptions.lock().keys().cloned().collect()
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// Deleted or unloaded: clients holding this topic must look it up again.
    pub fn is_closed(&self) -> bool {
        self.is_deleted() || self.unloaded.load(Ordering::Acquire)
    }

    /// Unloads the topic (admin `unload`): new producers and subscriptions are refused (clients
    /// retry), sends are no longer taken, every producer and consumer is closed (clients
    /// reconnect), and each subscription persists its acknowledgements and stops. The caller
    /// then drops the topic from the broker's map, so the next use loads it afresh from what is
    /// stored.
    pub async fn unload(&self) {
        self.unload_to(None).await
    }

    /// [`Topic::unload`], telling the clients which broker takes the topic over (PIP-307), so
    /// they reconnect there without a lookup.
    pub async fn unload_to(&self, assigned: Option<&AssignedBroker>) {
        // SeqCst with `begin_publish`: a send either sees the flag or is counted here.
        self.unloaded.store(true, Ordering::SeqCst);
        // The sends taken before get their receipts ahead of CLOSE_PRODUCER (one queue per
        // connection). A client resends whatever is unanswered when its producer is closed, so
        // a receipt queued after the close would have that message stored twice. Pulsar's
        // producer close waits for its pending publish acknowledgements the same way.
        if !self.publishes_drained(PRODUCER_CLOSE_DRAIN_LIMIT).await {
            tracing::warn!(topic = %self.full_name, in_flight = self.publishes_in_flight.load(Ordering::SeqCst),
                "unload: sends still being stored after {PRODUCER_CLOSE_DRAIN_LIMIT:?}; closing the producers anyway (their clients may store those twice)");
        }
        self.producers.close_all_to(assigned);
        let subscriptions: Vec<Arc<Subscription>> =
            self.subscriptions.lock().drain().map(|(_, s)| s).collect();
        // Every client goes first: nothing below may keep one on a topic being dropped.
        for subscription in &subscriptions {
            subscription.close_consumers_to(assigned);
        }
        // The storage steps are bounded: one that cannot finish (storage or metadata out of
        // reach) leaves its ledger open, which the next load recovers, instead of holding the
        // unload, and every bundle hand-over queued behind it, for good.
        let deadline = tokio::time::Instant::now() + UNLOAD_STORAGE_LIMIT;
        for subscription in subscriptions {
            let persisted = bounded_step(deadline, subscription.persist_now()).await;
            if let Err(error) = &persisted {
                tracing::warn!(topic = %self.full_name, subscription = %subscription.name, %error, "cursor not persisted on unload");
            }
            let _ = subscription.close(false).await; // stops dispatching: no I/O without a delete
            if persisted.is_ok() {
                if let Err(error) = bounded_step(deadline, subscription.close_cursor_ledger()).await
                {
                    tracing::warn!(topic = %self.full_name, subscription = %subscription.name, %error, "cursor ledger not closed on unload: the next load recovers it");
                }
            }
        }
        if let Err(error) = bounded_step(deadline, self.managed_ledger.close()).await {
            tracing::warn!(topic = %self.full_name, %error, "ledger not closed on unload: the next load recovers it");
        }
    }

    /// Counts a send in before anything is decided about it; `None` when the topic is
    /// unloading (the send is not taken). The ticket counts it out when dropped: keep it until
    /// the send's answer is queued.
    pub fn begin_publish(self: &Arc<Self>) -> Option<PublishTicket> {
        self.publishes_in_flight.fetch_add(1, Ordering::SeqCst);
        if self.unloaded.load(Ordering::SeqCst) {
            self.end_publish();
            return None;
        }
        Some(PublishTicket(self.clone()))
    }

    fn end_publish(&self) {
        let before = self.publishes_in_flight.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "end_publish without begin_publish on {}", self.full_name);
        if before == 1 {
            self.publishes_drained.notify_waiters();
        }
    }

    /// Waits until no send is in flight (true) or `limit` passes (false).
    async fn publishes_drained(&self, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let drained = self.publishes_drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.publishes_in_flight.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, drained).await.is_err() {
                return self.publishes_in_flight.load(Ordering::SeqCst) == 0;
            }
        }
    }

    /// Fenced: another broker owns the topic; the broker loads it afresh on next use.
    pub fn is_fenced(&self) -> bool {
        self.managed_ledger.fence().is_fenced()
    }

    /// Closes every producer and consumer (each client hears CLOSE_PRODUCER / CLOSE_CONSUMER and
    /// reconnects) and stops the subscriptions, keeping their cursors.
    pub async fn close_clients(&self) {
        self.producers.close_all();
        let subscriptions: Vec<Arc<Subscription>> =
            self.subscriptions.lock().drain().map(|(_, s)| s).collect();
        for subscription in subscriptions {
            subscription.close_consumers();
            let _ = subscription.close(false).await;
        }
    }

    /// Producers and consumers connected now.
    pub fn client_count(&self) -> usize {
        self.producers.len()
            + self.subscriptions.lock().values().map(|s| s.consumer_count()).sum::<usize>()
    }

    /// Deletes the topic, as Pulsar's `PersistentTopic.delete`: refused while clients are
    /// connected unless `force`, which closes them (they reconnect and, with auto-creation on,
    /// find a new, empty topic). Then its subscriptions' cursors (records and cursor ledgers),
    /// deduplication state, policies, ledger list and topic key go from the metadata store,
    /// and its ledgers from storage.
    /// The caller takes the topic out of the broker's map first.
    pub async fn delete(&self, force: bool) -> Result<(), BrokerError> {
        if !force && self.client_count() > 0 {
            return Err(BrokerError::NotAllowed(format!(
                "Topic has {} connected producers/consumers",
                self.client_count()
            )));
        }
        self.deleted.store(true, Ordering::Release);
        self.producers.close_all();
        let subscriptions: Vec<Arc<Subscription>> =
            self.subscriptions.lock().drain().map(|(_, s)| s).collect();
        for subscription in subscriptions {
            subscription.close_consumers();
            // Its cursor ledgers and record (after any persist in flight).
            subscription.close(true).await?;
        }
        // Cursors no subscription held (unreadable ones, skipped at load), and the rest of the
        // topic's keys.
        let storage = &self.managed_ledger.backend().storage;
        for encoded in self.metadata.list_children(&self.cursor_prefix).await? {
            let key = magnetar_model::keys::child(&self.cursor_prefix, &encoded);
            crate::cursor_ledger::delete_stored(storage, &*self.metadata, &key).await?;
        }
        delete_key(&*self.metadata, &self.dedup_key).await?;
        self.compaction.delete().await?;
        delete_key(&*self.metadata, &magnetar_model::keys::compaction_key(&self.name)).await?;
        delete_key(&*self.metadata, &magnetar_model::keys::topic_policies_key(&self.name)).await?;
        self.managed_ledger.delete().await?;
        delete_key(&*self.metadata, &magnetar_model::keys::topic_key(&self.name)).await?;
        Ok(())
    }
}

async fn delete_key(metadata: &dyn MetadataStore, key: &str) -> Result<(), BrokerError> {
    match metadata.delete(key, magnetar_metadata::ExpectedVersion::Any).await {
        Ok(()) | Err(magnetar_metadata::MetadataError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
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

/// Once the topic is fenced (another broker wrote its metadata), closes its producers and
/// consumers here: they reconnect and find the topic's owner. Ends with the topic.
async fn fence_task(topic: Weak<Topic>, fence: Arc<crate::fence::Fence>) {
    fence.fenced().await;
    let Some(topic) = topic.upgrade() else { return };
    topic.close_clients().await;
}

mod admin;
pub use admin::{ExaminePosition, SubscriptionStart};

#[cfg(test)]
mod admin_tests;

#[cfg(test)]
mod producer_access_tests {
    use super::*;
    use ProducerAccessMode::{Exclusive, ExclusiveWithFencing, Shared, WaitForExclusive};

    fn add_now(
        registry: &ProducerRegistry,
        name: &str,
        key: u64,
        mode: ProducerAccessMode,
        epoch: Option<u64>,
    ) -> Result<u64, BrokerError> {
        let future =
            registry.add(name.into(), key, mode, epoch, client(key), || panic!("{name} queued"));
        futures_now(future)
    }

    fn client(producer_id: u64) -> ProducerClient {
        ProducerClient::new(producer_id, crate::connection::Outbox::channel().0, Default::default())
    }

    /// Polls once: these registrations never wait.
    fn futures_now<F: std::future::Future>(future: F) -> F::Output {
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        match std::pin::pin!(future).poll(&mut context) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("the registration waited"),
        }
    }

    #[test]
    fn a_second_exclusive_producer_is_fenced_and_a_shared_one_is_busy() {
        let registry = ProducerRegistry::new("t".into());
        assert_eq!(add_now(&registry, "a", 1, Exclusive, None).unwrap(), 1);
        let second = add_now(&registry, "b", 2, Exclusive, None).unwrap_err();
        assert!(
            matches!(second, BrokerError::ProducerFenced(ref why) if why.contains("existing exclusive producer: a")),
            "{second:?}"
        );
        let shared = add_now(&registry, "c", 3, Shared, None).unwrap_err();
        assert!(matches!(shared, BrokerError::ProducerBusy(_)), "{shared:?}");
        let same_name = add_now(&registry, "a", 4, Shared, None).unwrap_err();
        assert!(matches!(same_name, BrokerError::ProducerBusy(_)), "{same_name:?}");
    }

    #[test]
    fn an_exclusive_producer_behind_the_topic_epoch_is_fenced() {
        let registry = ProducerRegistry::new("t".into());
        assert_eq!(add_now(&registry, "a", 1, Exclusive, None).unwrap(), 1);
        registry.remove("a", 1);
        assert_eq!(add_now(&registry, "b", 2, Exclusive, None).unwrap(), 2);
        registry.remove("b", 2);
        // "a" comes back with the epoch it was given: "b" held the topic since.
        let stale = add_now(&registry, "a", 3, Exclusive, Some(1)).unwrap_err();
        assert!(
            matches!(stale, BrokerError::ProducerFenced(ref why) if why.contains("epoch")),
            "{stale:?}"
        );
        // "b" reconnecting with the current epoch keeps it.
        assert_eq!(add_now(&registry, "b", 4, Exclusive, Some(2)).unwrap(), 2);
    }

    #[tokio::test]
    async fn exclusive_with_fencing_takes_the_topic_from_the_holder_and_the_waiters() {
        let registry = Arc::new(ProducerRegistry::new("t".into()));
        let (held, mut held_outbox) = {
            let (outbox, rx) = crate::connection::Outbox::channel();
            (ProducerClient::new(1, outbox, Default::default()), rx)
        };
        let held_closed = held.closed.clone();
        futures_now(registry.add("a".into(), 1, Exclusive, None, held, || panic!("queued")))
            .unwrap();
        let (told, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let waiter = {
            let registry = registry.clone();
            tokio::spawn(async move {
                registry
                    .add("w".into(), 2, WaitForExclusive, None, client(2), move || {
                        told.send(()).unwrap()
                    })
                    .await
            })
        };
        heard.recv().await.unwrap();
        let epoch = add_now(&registry, "f", 3, ExclusiveWithFencing, None).unwrap();
        assert_eq!(epoch, 2, "the fencing producer moves the epoch on");
        assert!(held_closed.load(Ordering::SeqCst), "the holder is closed");
        assert!(held_outbox.try_recv().is_ok(), "the holder's client is told (CLOSE_PRODUCER)");
        let waited = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the waiter is answered")
            .unwrap();
        assert!(matches!(waited, Err(BrokerError::ProducerFenced(ref why)) if why == "Fenced out"));
        assert_eq!((registry.len(), registry.waiting()), (1, 0));
        // The old holder reconnecting with its epoch meets the new holder: fenced.
        let back = add_now(&registry, "a", 4, Exclusive, Some(1)).unwrap_err();
        assert!(matches!(back, BrokerError::ProducerFenced(_)), "{back:?}");
        // A second fencing producer takes it in turn, from shared producers too.
        assert_eq!(add_now(&registry, "g", 5, ExclusiveWithFencing, None).unwrap(), 3);
        assert_eq!(registry.len(), 1);
    }

    #[test]
    fn exclusive_meets_shared_producers_with_fenced() {
        let registry = ProducerRegistry::new("t".into());
        add_now(&registry, "s", 1, Shared, None).unwrap();
        let exclusive = add_now(&registry, "x", 2, Exclusive, None).unwrap_err();
        assert!(matches!(exclusive, BrokerError::ProducerFenced(_)), "{exclusive:?}");
    }

    #[tokio::test]
    async fn wait_for_exclusive_is_told_it_waits_gets_the_topic_in_turn_and_leaves_the_line_when_dropped(
    ) {
        let registry = Arc::new(ProducerRegistry::new("t".into()));
        add_now(&registry, "a", 1, Exclusive, None).unwrap();
        let (told, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let waiter = {
            let (registry, told) = (registry.clone(), told.clone());
            tokio::spawn(async move {
                registry
                    .add("w".into(), 2, WaitForExclusive, None, client(2), move || {
                        told.send(2).unwrap()
                    })
                    .await
            })
        };
        assert_eq!(heard.recv().await, Some(2), "the waiting producer is told at once");
        // A second waiter, dropped while in line, must not block the first forever.
        let dropped = {
            let (registry, told) = (registry.clone(), told.clone());
            tokio::spawn(async move {
                registry
                    .add("v".into(), 3, WaitForExclusive, None, client(3), move || {
                        told.send(3).unwrap()
                    })
                    .await
            })
        };
        assert_eq!(heard.recv().await, Some(3));
        dropped.abort();
        let _ = dropped.await;
        // Shared producers are refused while someone waits for the topic.
        assert!(matches!(
            add_now(&registry, "s", 9, Shared, None),
            Err(BrokerError::ProducerBusy(_))
        ));
        registry.remove("a", 1);
        let epoch = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the waiter gets the topic")
            .unwrap()
            .unwrap();
        assert_eq!(epoch, 2);
        assert!(registry.producers.lock().waiting.is_empty());
    }
}
