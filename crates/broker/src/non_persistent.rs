//! Non-persistent topics (`non-persistent://…`): at-most-once, in-memory fan-out, as Pulsar's
//! `NonPersistentTopic`. A SEND is acknowledged at once with message id 0:0 and handed to every
//! subscription's consumers that have permits; a subscription whose chosen consumer has no
//! permit drops the message (Pulsar counts it as `msgDrop`). Nothing is written to storage, so
//! there is no backlog: a subscription only sees what is published while it has consumers, and
//! nothing survives a restart. Acks are accepted and ignored.
//!
//! Invariants:
//! - Nothing is sent to a consumer without a permit (a batch takes one permit per message).
//! - A subscription exists only while it has consumers (removed with its last one).

use crate::admission;
use crate::connection::Outbox;
use crate::error::BrokerError;
use crate::key_shared::{sticky_key_hash, wants_sticky, Selector, NONE_KEY};
use crate::stats::{ConsumerStats, Meter, SubscriptionStats, TopicStats};
use crate::topic::ProducerRegistry;
use bytes::Bytes;
use magnetar_model::names::TopicName;
use magnetar_protocol::proto::{command_subscribe::SubType, KeySharedMeta};
use magnetar_protocol::{commands, parse_metadata_and_payload};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A consumer attached to a non-persistent subscription.
pub struct NpConsumer {
    pub key: u64,
    pub consumer_id: u64,
    pub name: String,
    pub priority: i32,
    pub outbox: Outbox,
    permits: i64,
    /// The client has heard SUBSCRIBE's SUCCESS: it hears consumer events from then on (a
    /// client that has not registered the consumer yet, as the Go client, drops them).
    announced: bool,
}

impl NpConsumer {
    pub fn new(key: u64, consumer_id: u64, name: String, priority: i32, outbox: Outbox) -> Self {
        NpConsumer { key, consumer_id, name, priority, outbox, permits: 0, announced: false }
    }
}

/// The pure routing state of one subscription: its type, consumers and their permits.
#[derive(Default)]
struct Consumers {
    sub_type: Option<SubType>,
    list: Vec<NpConsumer>,
    round_robin: usize,
    active: Option<u64>,
    /// Key_Shared: the persistent topics' selectors (Pulsar's non-persistent dispatcher uses
    /// the same), without their draining: at most once, a key's order is not kept across a
    /// consumer change.
    selector: Option<Selector>,
}

impl Consumers {
    /// The consumer the next message goes to, if it may take it now (else it is dropped).
    fn choose(&mut self, key: &[u8]) -> Option<usize> {
        let count = self.list.len();
        if count == 0 {
            return None;
        }
        let index = match self.sub_type.unwrap_or(SubType::Exclusive) {
            SubType::Exclusive | SubType::Failover => {
                self.list.iter().position(|c| Some(c.key) == self.active)?
            }
            SubType::Shared => {
                // Round robin over the consumers with permits (Pulsar's getNextConsumer).
                let found = (0..count)
                    .map(|step| (self.round_robin + step) % count)
                    .find(|&i| self.list[i].permits > 0)?;
                self.round_robin = (found + 1) % count;
                found
            }
            SubType::KeyShared => {
                let owner = self.selector.as_ref()?.select(sticky_key_hash(key))?;
                self.list.iter().position(|c| c.key == owner)?
            }
        };
        (self.list[index].permits > 0).then_some(index)
    }

    /// Failover and Exclusive: the active consumer (lowest priority level, then name; a
    /// partition spreads by its index), announced to Failover consumers when it changes.
    fn pick_active(&mut self, partition: i32) {
        let sub_type = self.sub_type.unwrap_or(SubType::Exclusive);
        if !matches!(sub_type, SubType::Failover | SubType::Exclusive) {
            self.active = None;
            return;
        }
        let mut order: Vec<&NpConsumer> = self.list.iter().collect();
        order.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        let chosen = (!order.is_empty()).then(|| {
            let index = if partition >= 0 { partition as usize % order.len() } else { 0 };
            order[index].key
        });
        if chosen == self.active {
            return;
        }
        self.active = chosen;
        if sub_type == SubType::Failover {
            for consumer in self.list.iter().filter(|c| c.announced) {
                let is_active = Some(consumer.key) == chosen;
                let command = commands::active_consumer_change(consumer.consumer_id, is_active);
                consumer.outbox.send_command(&command);
            }
        }
    }
}

/// A subscription of a non-persistent topic: its consumers, how messages are routed to them,
/// and what was delivered and dropped.
pub struct NpSubscription {
    pub name: String,
    partition: i32,
    consumers: Mutex<Consumers>,
    /// What was delivered (stats).
    out_meter: Meter,
    /// What was dropped for want of permits (stats: `msgDropRate`).
    drop_meter: Meter,
}

impl NpSubscription {
    fn add(
        &self,
        consumer: NpConsumer,
        sub_type: SubType,
        key_shared: Option<&KeySharedMeta>,
        consistent_hashing: bool,
    ) -> Result<(), BrokerError> {
        let mut consumers = self.consumers.lock();
        let current = consumers.sub_type.filter(|_| !consumers.list.is_empty());
        admission::type_admits(current, sub_type, &self.name)?;
        if sub_type == SubType::KeyShared {
            let selector = consumers.selector.get_or_insert_with(|| {
                Selector::for_first_consumer(key_shared, consistent_hashing)
            });
            if selector.is_sticky() != wants_sticky(key_shared) {
                return Err(admission::different_key_shared_policy(&self.name));
            }
            selector
                .add(consumer.key, &consumer.name, key_shared)
                .map_err(|e| BrokerError::ConsumerAssign(e.to_string()))?;
        }
        consumers.sub_type = Some(sub_type);
        consumers.list.push(consumer);
        consumers.pick_active(self.partition);
        Ok(())
    }

    /// Removes a consumer; returns how many are left.
    fn remove(&self, key: u64) -> usize {
        let mut consumers = self.consumers.lock();
        consumers.list.retain(|c| c.key != key);
        if let Some(selector) = &mut consumers.selector {
            selector.remove(key);
        }
        if consumers.list.is_empty() {
            consumers.selector = None; // the next first consumer sets the policy again
        }
        consumers.pick_active(self.partition);
        consumers.list.len()
    }

    /// The client has heard SUBSCRIBE's SUCCESS for consumer `key`: from now on it hears the
    /// subscription's consumer events, starting (Failover) with whether it is the active one.
    pub fn announce(&self, key: u64) {
        let mut consumers = self.consumers.lock();
        let failover = consumers.sub_type == Some(SubType::Failover);
        let active = consumers.active;
        if let Some(consumer) = consumers.list.iter_mut().find(|c| c.key == key) {
            consumer.announced = true;
            if failover {
                let is_active = active == Some(key);
                let command = commands::active_consumer_change(consumer.consumer_id, is_active);
                consumer.outbox.send_command(&command);
            }
        }
    }

    pub fn flow(&self, key: u64, permits: u32) {
        let mut consumers = self.consumers.lock();
        if let Some(consumer) = consumers.list.iter_mut().find(|c| c.key == key) {
            consumer.permits += i64::from(permits);
        }
    }

    pub fn sub_type(&self) -> SubType {
        self.consumers.lock().sub_type.unwrap_or(SubType::Exclusive)
    }

    pub fn consumer_count(&self) -> usize {
        self.consumers.lock().list.len()
    }

    /// Whether consumer `key` is still attached (an unload detaches every consumer).
    pub fn has_consumer(&self, key: u64) -> bool {
        self.consumers.lock().list.iter().any(|c| c.key == key)
    }

    /// Sends one entry to the consumer it routes to, or drops it. Returns whether it was sent.
    fn deliver(&self, entry: &Bytes, messages: u32, key: &[u8]) -> bool {
        let mut consumers = self.consumers.lock();
        let Some(index) = consumers.choose(key) else {
            drop(consumers);
            self.drop_meter.record(u64::from(messages), entry.len() as u64);
            return false;
        };
        let consumer = &mut consumers.list[index];
        consumer.permits -= i64::from(messages);
        let partition = (self.partition >= 0).then_some(self.partition);
        let command =
            commands::message(consumer.consumer_id, message_id(partition), 0, Vec::new(), None);
        consumer.outbox.send_payload(&command, entry);
        drop(consumers);
        self.out_meter.record(u64::from(messages), entry.len() as u64);
        true
    }

    fn stats(&self, now: std::time::Instant) -> SubscriptionStats {
        let out = self.out_meter.read_at(now);
        let consumers = self.consumers.lock();
        SubscriptionStats {
            msg_rate_out: out.rate,
            msg_throughput_out: out.throughput,
            msg_out_counter: out.messages,
            bytes_out_counter: out.bytes,
            sub_type: crate::stats::sub_type_name(consumers.sub_type.unwrap_or(SubType::Exclusive)),
            active_consumer_name: consumers.active.and_then(|active| {
                consumers.list.iter().find(|c| c.key == active).map(|c| c.name.clone())
            }),
            consumers: consumers
                .list
                .iter()
                .map(|c| ConsumerStats {
                    consumer_name: c.name.clone(),
                    consumer_id: c.consumer_id,
                    available_permits: c.permits,
                    ..Default::default()
                })
                .collect(),
            is_durable: false,
            msg_drop_rate: Some(self.drop_meter.read_at(now).rate),
            ..Default::default()
        }
    }
}

/// Every message of a non-persistent topic has id 0:0 (Pulsar builds each entry at position
/// 0:0), with the partition index on a partition.
pub fn message_id(partition: Option<i32>) -> magnetar_protocol::proto::MessageIdData {
    commands::message_id(0, 0, partition)
}

pub struct NonPersistentTopic {
    pub name: TopicName,
    pub full_name: String,
    pub partition: i32,
    pub producers: ProducerRegistry,
    subscriptions: Mutex<HashMap<String, Arc<NpSubscription>>>,
    /// What producers published (stats).
    pub in_meter: Meter,
    /// The topic's own `maxMessageSize` policy when below the broker's (0: none), checked per
    /// SEND as on persistent topics; the broker's own is the frame limit.
    max_message_size: AtomicU32,
    /// `maxConsumersPerTopic` and `maxConsumersPerSubscription` (0: no limit).
    max_consumers: AtomicU32,
    max_consumers_per_subscription: AtomicU32,
    /// Held while the topic's policies are read and applied (`BrokerService`), so refreshes
    /// apply in the order they read.
    pub(crate) policy_refresh: tokio::sync::Mutex<()>,
    /// The topic's and namespace's publish rate, as on persistent topics (SEND pauses the
    /// connection past it); no dispatch rates, as Pulsar's non-persistent dispatchers.
    pub publish_rate: crate::limits::RateLimiter,
    /// Times the publish rate paused the topic's producers (`publishRateLimitedTimes`).
    pub publish_rate_limited_times: std::sync::atomic::AtomicU64,
}

impl NonPersistentTopic {
    pub fn new(name: TopicName) -> Arc<Self> {
        let full_name = name.to_string();
        let partition = name.partition_index().map_or(-1, |p| p as i32);
        Arc::new(NonPersistentTopic {
            producers: ProducerRegistry::new(full_name.clone()),
            name,
            full_name,
            partition,
            subscriptions: Mutex::default(),
            in_meter: Meter::new(),
            max_message_size: AtomicU32::new(0),
            max_consumers: AtomicU32::new(0),
            max_consumers_per_subscription: AtomicU32::new(0),
            policy_refresh: tokio::sync::Mutex::new(()),
            publish_rate: crate::limits::RateLimiter::default(),
            publish_rate_limited_times: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Applies the policies a non-persistent topic obeys (read when a producer or consumer is
    /// created, as persistent topics re-read theirs): the topic's message size limit, its
    /// publish rate (a changed rate starts full at `now_ms`), its producer cap and its
    /// consumer caps.
    pub fn apply_policies(
        &self,
        effective: &magnetar_model::policy::Effective,
        broker_max_size: u32,
        now_ms: u64,
    ) {
        let (messages, bytes) = crate::limits::publish_rate(effective.publish_rate);
        self.publish_rate.set(messages, bytes, 1_000, now_ms);
        let own = effective.max_message_size;
        let limit = if own < broker_max_size { own } else { 0 };
        self.max_message_size.store(limit, Ordering::Relaxed);
        self.producers.set_max_producers(effective.max_producers_per_topic);
        self.max_consumers.store(effective.max_consumers_per_topic, Ordering::Relaxed);
        let per_subscription = effective.max_consumers_per_subscription;
        self.max_consumers_per_subscription.store(per_subscription, Ordering::Relaxed);
    }

    /// Whether an entry of `len` bytes is above the topic's own message size limit.
    pub fn exceeds_max_message_size(&self, len: usize) -> bool {
        let limit = self.max_message_size.load(Ordering::Relaxed) as usize;
        limit > 0 && len > limit
    }

    /// No producer and no consumer (a non-persistent topic holds no data): a consumer's
    /// schema may become the topic's (Pulsar's `addSchemaIfIdleOrCheckCompatible`).
    pub fn is_idle(&self) -> bool {
        self.producers.is_empty()
            && self.subscriptions.lock().values().all(|s| s.consumer_count() == 0)
    }

    /// Attaches a consumer to subscription `name`, creating it if needed.
    pub fn subscribe(
        &self,
        name: &str,
        sub_type: SubType,
        consumer: NpConsumer,
        key_shared: Option<&KeySharedMeta>,
        consistent_hashing: bool,
    ) -> Result<Arc<NpSubscription>, BrokerError> {
        let mut subscriptions = self.subscriptions.lock();
        admission::topic_has_room(self.max_consumers.load(Ordering::Relaxed), || {
            subscriptions.values().map(|s| s.consumer_count()).sum()
        })?;
        let on_subscription = subscriptions.get(name).map_or(0, |s| s.consumer_count());
        let max = self.max_consumers_per_subscription.load(Ordering::Relaxed);
        admission::subscription_has_room(max, on_subscription)?;
        let subscription = subscriptions
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(NpSubscription {
                    name: name.to_string(),
                    partition: self.partition,
                    consumers: Mutex::default(),
                    out_meter: Meter::new(),
                    drop_meter: Meter::new(),
                })
            })
            .clone();
        let added = subscription.add(consumer, sub_type, key_shared, consistent_hashing);
        if added.is_err() && subscription.consumer_count() == 0 {
            subscriptions.remove(name);
        }
        added.map(|()| subscription)
    }

    /// Detaches a consumer; the subscription goes with its last consumer.
    pub fn unsubscribe_consumer(&self, subscription: &Arc<NpSubscription>, key: u64) {
        let mut subscriptions = self.subscriptions.lock();
        if subscription.remove(key) == 0 {
            if let Some(current) = subscriptions.get(&subscription.name) {
                if Arc::ptr_eq(current, subscription) {
                    subscriptions.remove(&subscription.name);
                }
            }
        }
    }

    pub fn subscription_names(&self) -> Vec<String> {
        self.subscriptions.lock().keys().cloned().collect()
    }

    /// What the console's history samples of this topic (no backlog, no storage: in memory,
    /// at most once).
    pub fn history_sample(&self) -> crate::history::TopicSample {
        let mut sample = crate::history::TopicSample {
            name: self.full_name.clone(),
            producers: self.producers.len() as u64,
            ..Default::default()
        };
        sample.counters.msg_in = self.in_meter.messages();
        sample.counters.bytes_in = self.in_meter.bytes();
        let subscriptions: Vec<Arc<NpSubscription>> =
            self.subscriptions.lock().values().cloned().collect();
        for subscription in subscriptions {
            sample.counters.msg_out += subscription.out_meter.messages();
            sample.counters.bytes_out += subscription.out_meter.bytes();
            sample.subscriptions += 1;
            sample.consumers += subscription.consumer_count() as u64;
        }
        sample
    }

    /// `NonPersistentTopicStatsImpl`, as far as an in-memory topic has them; rates at `now`.
    pub fn stats(&self, now: std::time::Instant) -> TopicStats {
        let reading = self.in_meter.read_at(now);
        let subscriptions: Vec<Arc<NpSubscription>> =
            self.subscriptions.lock().values().cloned().collect();
        let mut stats = TopicStats {
            msg_rate_in: reading.rate,
            msg_throughput_in: reading.throughput,
            msg_in_counter: reading.messages,
            bytes_in_counter: reading.bytes,
            average_msg_size: if reading.rate > 0.0 {
                reading.throughput / reading.rate
            } else {
                0.0
            },
            publishers: self.producers.stats(now),
            deduplication_status: "Disabled".to_string(),
            msg_drop_rate: Some(0.0),
            publish_rate_limited_times: self.publish_rate_limited_times.load(Ordering::Relaxed),
            ..Default::default()
        };
        for subscription in subscriptions {
            let sub = subscription.stats(now);
            stats.msg_rate_out += sub.msg_rate_out;
            stats.msg_throughput_out += sub.msg_throughput_out;
            stats.msg_out_counter += sub.msg_out_counter;
            stats.bytes_out_counter += sub.bytes_out_counter;
            stats.msg_drop_rate =
                Some(stats.msg_drop_rate.unwrap_or(0.0) + sub.msg_drop_rate.unwrap_or(0.0));
            stats.subscriptions.insert(subscription.name.clone(), sub);
        }
        stats
    }

    /// Closes every producer and consumer (unload): clients reconnect to a fresh topic.
    pub fn close_clients(&self) {
        self.close_clients_to(None);
    }

    /// [`NonPersistentTopic::close_clients`], naming the broker the topic moves to (PIP-307).
    pub fn close_clients_to(&self, assigned: Option<&commands::AssignedBroker>) {
        self.producers.close_all_to(assigned);
        let subscriptions: Vec<Arc<NpSubscription>> =
            self.subscriptions.lock().drain().map(|(_, s)| s).collect();
        for subscription in subscriptions {
            let consumers = std::mem::take(&mut subscription.consumers.lock().list);
            for consumer in consumers {
                let command = commands::close_consumer_to(consumer.consumer_id, u64::MAX, assigned);
                consumer.outbox.send_command(&command);
            }
        }
    }

    /// Fans one entry out to every subscription; returns to how many it was delivered.
    pub fn publish(&self, entry: &Bytes) -> usize {
        let (messages, key) = match parse_metadata_and_payload(entry) {
            Ok((metadata, _)) => {
                let messages = metadata.num_messages_in_batch.unwrap_or(1).max(1) as u32;
                let key = metadata
                    .ordering_key
                    .map(|k| k.to_vec())
                    .or_else(|| metadata.partition_key.map(String::into_bytes));
                (messages, key)
            }
            Err(_) => (1, None),
        };
        self.in_meter.record(u64::from(messages), entry.len() as u64);
        let key = key.as_deref().unwrap_or(NONE_KEY);
        let subscriptions: Vec<Arc<NpSubscription>> =
            self.subscriptions.lock().values().cloned().collect();
        subscriptions.iter().filter(|s| s.deliver(entry, messages, key)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::sync::mpsc;

    fn consumer(
        key: u64,
        name: &str,
    ) -> (NpConsumer, mpsc::UnboundedReceiver<crate::connection::OutFrame>) {
        let (outbox, receiver) = Outbox::channel();
        (NpConsumer::new(key, key, name.to_string(), 0, outbox), receiver)
    }

    fn count(receiver: &mut mpsc::UnboundedReceiver<crate::connection::OutFrame>) -> usize {
        let mut n = 0;
        while receiver.try_recv().is_ok() {
            n += 1;
        }
        n
    }

    fn entry(key: Option<&str>) -> Bytes {
        let metadata = magnetar_protocol::proto::MessageMetadata {
            producer_name: "p".into(),
            partition_key: key.map(str::to_string),
            ..Default::default()
        };
        let mut buf = bytes::BytesMut::new();
        magnetar_protocol::encode_metadata_and_payload(&metadata, b"x", &mut buf).unwrap();
        buf.freeze()
    }

    fn topic() -> Arc<NonPersistentTopic> {
        NonPersistentTopic::new(TopicName::parse("non-persistent://t/n/x").unwrap())
    }

    #[test]
    fn messages_without_permits_are_dropped() {
        let topic = topic();
        let (c, mut rx) = consumer(1, "a");
        let sub = topic.subscribe("s", SubType::Exclusive, c, None, true).unwrap();
        assert_eq!(topic.publish(&entry(None)), 0);
        sub.flow(1, 2);
        assert_eq!(topic.publish(&entry(None)), 1);
        assert_eq!(topic.publish(&entry(None)), 1);
        assert_eq!(topic.publish(&entry(None)), 0);
        assert_eq!(count(&mut rx), 2);
    }

    /// Pulsar's `msgDropRate`: per subscription and summed for the topic, only on
    /// non-persistent topics' stats.
    #[test]
    fn dropped_messages_are_counted_in_the_drop_rate() {
        use crate::clock::{Clock, ManualClock};
        let clock = ManualClock::new(0);
        let topic = topic();
        let (c, _rx) = consumer(1, "a");
        let sub = topic.subscribe("s", SubType::Exclusive, c, None, true).unwrap();
        let (d, _rx_d) = consumer(2, "b");
        topic.subscribe("all-taken", SubType::Exclusive, d, None, true).unwrap().flow(2, 100);
        let before = topic.stats(clock.now()); // the meters' first sample
        assert_eq!(before.msg_drop_rate, Some(0.0));
        sub.flow(1, 2);
        for _ in 0..10 {
            topic.publish(&entry(None));
        }
        clock.advance(std::time::Duration::from_secs(2));
        let stats = topic.stats(clock.now());
        assert_eq!(stats.subscriptions["s"].msg_drop_rate, Some(4.0), "8 dropped in 2 s");
        assert_eq!(stats.subscriptions["all-taken"].msg_drop_rate, Some(0.0));
        assert_eq!(stats.msg_drop_rate, Some(4.0));
        let json = serde_json::to_value(&stats).unwrap();
        assert_eq!(json["msgDropRate"], 4.0);
        assert_eq!(json["subscriptions"]["s"]["msgDropRate"], 4.0);
    }

    /// Failover: a consumer hears ACTIVE_CONSUMER_CHANGE only once announced (after the
    /// client has its SUBSCRIBE's SUCCESS), then every change.
    #[test]
    fn failover_consumers_hear_changes_only_once_announced() {
        let topic = topic();
        let (a, mut rx_a) = consumer(1, "b-second");
        let sub = topic.subscribe("fo", SubType::Failover, a, None, true).unwrap();
        assert_eq!(count(&mut rx_a), 0, "nothing before SUCCESS");
        sub.announce(1);
        assert_eq!(count(&mut rx_a), 1, "told it is active");
        let (b, mut rx_b) = consumer(2, "a-first");
        topic.subscribe("fo", SubType::Failover, b, None, true).unwrap();
        assert_eq!(count(&mut rx_a), 1, "told it is no longer active");
        assert_eq!(count(&mut rx_b), 0, "the new one hears nothing before SUCCESS");
        sub.announce(2);
        assert_eq!(count(&mut rx_b), 1, "told it is active");
        topic.publish(&entry(None));
        sub.flow(2, 1);
        topic.publish(&entry(None));
        assert_eq!((count(&mut rx_a), count(&mut rx_b)), (0, 1), "the active one gets it");
    }

    /// `maxConsumersPerTopic` and `maxConsumersPerSubscription`, as on persistent topics.
    #[test]
    fn consumer_limits_refuse_the_consumer_one_too_many() {
        use magnetar_model::policy::{Effective, PolicyDefaults};
        let topic = topic();
        let mut effective = Effective::resolve(&PolicyDefaults::default(), None, None, "c");
        effective.max_consumers_per_topic = 3;
        effective.max_consumers_per_subscription = 2;
        topic.apply_policies(&effective, u32::MAX, 0);
        let (a, _ra) = consumer(1, "a");
        let (b, _rb) = consumer(2, "b");
        let (c, _rc) = consumer(3, "c");
        topic.subscribe("s", SubType::Shared, a, None, true).unwrap();
        topic.subscribe("s", SubType::Shared, b, None, true).unwrap();
        let refused = topic.subscribe("s", SubType::Shared, c, None, true);
        assert!(matches!(refused, Err(BrokerError::ConsumerBusy(m)) if m.contains("Subscription")));
        let (c, _rc) = consumer(3, "c");
        topic.subscribe("other", SubType::Shared, c, None, true).unwrap();
        let (d, _rd) = consumer(4, "d");
        let refused = topic.subscribe("third", SubType::Shared, d, None, true);
        assert!(matches!(refused, Err(BrokerError::ConsumerBusy(m)) if m.contains("Topic")));
        assert_eq!(topic.subscription_names().len(), 2, "a refused consumer makes no subscription");
    }

    #[test]
    fn fans_out_to_subscriptions_and_splits_shared() {
        let topic = topic();
        let (a, mut rx_a) = consumer(1, "a");
        let (b, mut rx_b) = consumer(2, "b");
        let (c, mut rx_c) = consumer(3, "c");
        let shared = topic.subscribe("shared", SubType::Shared, a, None, true).unwrap();
        topic.subscribe("shared", SubType::Shared, b, None, true).unwrap();
        let other = topic.subscribe("other", SubType::Exclusive, c, None, true).unwrap();
        for key in 1..=3 {
            shared.flow(key, 100);
            other.flow(key, 100);
        }
        for _ in 0..10 {
            assert_eq!(topic.publish(&entry(None)), 2);
        }
        assert_eq!((count(&mut rx_a), count(&mut rx_b), count(&mut rx_c)), (5, 5, 10));
        // Exclusive admits one consumer; type changes are refused.
        let (d, _rx_d) = consumer(4, "d");
        assert!(topic.subscribe("other", SubType::Exclusive, d, None, true).is_err());
        let (e, _rx_e) = consumer(5, "e");
        assert!(topic.subscribe("shared", SubType::Failover, e, None, true).is_err());
        // The subscription goes with its last consumer: a later one starts empty.
        topic.unsubscribe_consumer(&other, 3);
        assert_eq!(topic.subscription_names(), vec!["shared".to_string()]);
    }

    #[test]
    fn key_shared_keeps_a_key_on_one_consumer() {
        let topic = topic();
        let (a, mut rx_a) = consumer(1, "a");
        let (b, mut rx_b) = consumer(2, "b");
        let sub = topic.subscribe("ks", SubType::KeyShared, a, None, true).unwrap();
        topic.subscribe("ks", SubType::KeyShared, b, None, true).unwrap();
        sub.flow(1, 1000);
        sub.flow(2, 1000);
        let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
        let mut owner = HashMap::new();
        for key in &keys {
            for _ in 0..3 {
                topic.publish(&entry(Some(key)));
                let (got_a, got_b) = (count(&mut rx_a), count(&mut rx_b));
                assert_eq!(got_a + got_b, 1);
                let this = if got_a == 1 { 1 } else { 2 };
                assert_eq!(*owner.entry(key.clone()).or_insert(this), this, "{key} moved");
            }
        }
        let on_a = owner.values().filter(|&&o| o == 1).count();
        assert!(on_a > 0 && on_a < keys.len(), "keys all on one consumer");
    }

    /// STICKY consumers take the ranges they ask for, as on persistent topics: an overlap is
    /// refused, and a consumer asking for AUTO_SPLIT beside them is another policy.
    #[test]
    fn key_shared_sticky_ranges_are_the_consumers_own() {
        use magnetar_protocol::proto::{IntRange, KeySharedMode};
        let sticky = |start, end| KeySharedMeta {
            key_shared_mode: KeySharedMode::Sticky as i32,
            hash_ranges: vec![IntRange { start, end }],
            ..Default::default()
        };
        let topic = topic();
        let (a, mut rx_a) = consumer(1, "a");
        let (b, mut rx_b) = consumer(2, "b");
        let sub = topic.subscribe("ks", SubType::KeyShared, a, Some(&sticky(0, 32767)), true);
        let sub = sub.unwrap();
        topic.subscribe("ks", SubType::KeyShared, b, Some(&sticky(32768, 65535)), true).unwrap();
        let (c, _rx_c) = consumer(3, "c");
        let overlap = topic.subscribe("ks", SubType::KeyShared, c, Some(&sticky(100, 200)), true);
        assert!(matches!(overlap, Err(BrokerError::ConsumerAssign(_))), "overlap accepted");
        let (d, _rx_d) = consumer(4, "d");
        let auto = topic.subscribe("ks", SubType::KeyShared, d, None, true);
        assert!(matches!(auto, Err(BrokerError::ConsumerBusy(_))), "another policy accepted");
        sub.flow(1, 1000);
        sub.flow(2, 1000);
        for i in 0..50 {
            let key = format!("key-{i}");
            topic.publish(&entry(Some(&key)));
            let want_a = sticky_key_hash(key.as_bytes()) <= 32767;
            assert_eq!((count(&mut rx_a), count(&mut rx_b)), if want_a { (1, 0) } else { (0, 1) });
        }
    }
}
