//! A subscription: its cursor (acknowledgement state and read position), its consumers, and
//! the dispatcher task that sends entries to them within their FLOW permits.
//!
//! Dispatch order: entries queued for redelivery first (oldest first), then new entries after
//! the read position. An entry goes to the active consumer (Exclusive, Failover), the next
//! consumer with permits (Shared), or the consumer owning its key's hash (Key_Shared, see
//! `key_shared`). On Shared and Key_Shared an entry whose `deliver_at_time` is still ahead goes
//! into the delayed-delivery index (`delayed`) and back into the redelivery queue when due.
//!
//! Key_Shared, per key order without stalls: an entry whose owner cannot take it now (no permits,
//! or its hash still drains at the previous owner) is parked in the redelivery queue and the
//! stream goes on for the other keys; a later entry of a parked hash is parked behind it; the
//! queue is served in position order. At most `KEY_SHARED_LOOKAHEAD` entries are parked before
//! reading new entries pauses (as Pulsar's look-ahead limit).
//!
//! Invariants:
//! - Nothing is sent to a consumer without a permit; a batch entry takes as many permits as it
//!   has messages (so permits may go negative, as in Pulsar).
//! - An entry is in at most one of `pending` (sent, unacknowledged) and `redeliver`.
//! - Key_Shared without `allowOutOfOrderDelivery`: an entry goes only to its hash's owner, never
//!   while an earlier entry of its hash is queued or held by another consumer.
//! - An acknowledged entry is never sent again.
//! - Durable subscriptions persist their acknowledgement state after every change (coalesced:
//!   at most one write in flight) to their cursor ledger (`cursor_ledger`), so a restart
//!   redelivers only what was not acknowledged; an ack receipt waits for that write.
//! - A cursor reset (seek) detaches every consumer (CLOSE_CONSUMER) and replaces the whole
//!   dispatch state; a dispatch round that read before the reset sends nothing (`epoch`).

use crate::admission;
use crate::connection::Outbox;
use crate::cursor::{next_position, AckState, LedgerList, PersistLimits, Position};
use crate::cursor_ledger::CursorLedger;
use crate::delayed::{DelayConfig, DelayTracker, Rescan};
use crate::error::BrokerError;
use crate::key_shared::{sticky_key_hash, wants_sticky, DrainingHashes, Selector, NONE_KEY};
use crate::limits::{unacked_blocked, RateLimiter, TopicLimits};
use crate::managed_ledger::ManagedLedger;
use crate::stats::{ClientInfo, ConsumerStats, CursorStats, Meter, SubscriptionStats};
use bytes::Bytes;
use magnetar_protocol::proto::{
    command_ack::AckType, command_subscribe::SubType, KeySharedMeta, MessageIdData,
};
use magnetar_protocol::{commands, parse_metadata_and_payload};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Key_Shared: entries parked in the redelivery queue before reading new entries pauses.
pub const KEY_SHARED_LOOKAHEAD: usize = 10_000;
/// Due delayed entries are moved to the redelivery queue only while it is shorter than this,
/// so a backlog of due messages stays in the (bounded) delay index.
const DUE_QUEUE_LIMIT: usize = 1_000;
/// Entries read per re-read of a delayed-index bucket.
const RESCAN_CHUNK: usize = 500;

/// A consumer attached to a subscription.
#[derive(Clone)]
pub struct ConsumerHandle {
    /// Unique within the broker.
    pub key: u64,
    /// The client's id for it on its connection.
    pub consumer_id: u64,
    pub name: String,
    pub priority: i32,
    pub outbox: Outbox,
    /// Address, version, connection time and the meter of what it was sent (stats).
    pub info: Arc<ClientInfo>,
    /// `readCompacted`: reads the compacted view up to the compaction horizon.
    pub read_compacted: bool,
}

struct ConsumerSlot {
    handle: ConsumerHandle,
    permits: i64,
    /// The client has heard SUBSCRIBE's SUCCESS ([`Subscription::announce`]): consumer events
    /// may go to it (clients drop events for consumers they do not know yet).
    announced: bool,
    /// Failover: when (clock ms) it hears its first ACTIVE_CONSUMER_CHANGE. Pulsar tells a
    /// first pick [`DispatchSettings::failover_delay_ms`] after the subscribe (its delayed
    /// read), and the Go client relies on that: it registers a consumer for events only once it
    /// has read SUBSCRIBE's success, so an event right behind the success is dropped when
    /// several partitions subscribe on one connection at once.
    tell_active_at: Option<u64>,
    /// Told REACHED_END_OF_TOPIC (the topic is terminated and everything was read).
    told_end: bool,
    /// Messages sent to it and not acknowledged (Shared and Key_Shared count them).
    unacked: u64,
    /// Pulsar's `blockedConsumerOnUnackedMsgs`: sent nothing until `unacked` is back to half of
    /// `maxUnackedMessagesPerConsumer`.
    blocked: bool,
}

impl ConsumerSlot {
    /// Whether it may be sent a message now.
    fn can_take(&self) -> bool {
        self.permits > 0 && !self.blocked
    }
}

/// How a subscription dispatches: broker settings, fixed for the subscription's life.
#[derive(Debug, Clone, Copy)]
pub struct DispatchSettings {
    /// Most entries read per dispatch round.
    pub batch_entries: usize,
    /// Failover: how long a newly chosen active consumer waits before it is sent anything, so
    /// the previous one's in-flight acks land first (Pulsar's
    /// `activeConsumerFailoverDelayTimeMillis`).
    pub failover_delay_ms: u64,
    /// Key_Shared AUTO_SPLIT by consistent hashing, else by halving hash ranges (Pulsar's
    /// `subscriptionKeySharedUseConsistentHashing`).
    pub key_shared_consistent_hashing: bool,
}

impl DispatchSettings {
    pub fn new(batch_entries: usize) -> Self {
        DispatchSettings {
            batch_entries,
            failover_delay_ms: 1_000,
            key_shared_consistent_hashing: true,
        }
    }
}

/// An entry sent and not yet acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    consumer: u64,
    /// Messages in the entry (a batch-index ack's bitmap is read against it).
    messages: u32,
    /// Key_Shared hash of the entry (0: not Key_Shared).
    hash: u32,
}

/// Key_Shared routing state.
struct KeyShared {
    selector: Selector,
    allow_out_of_order: bool,
    draining: DrainingHashes,
}

struct State {
    sub_type: SubType,
    ack: AckState,
    /// The last entry read from the stream of new entries (None: nothing yet).
    last_read: Option<Position>,
    consumers: Vec<ConsumerSlot>,
    round_robin: usize,
    redeliver: BTreeSet<Position>,
    /// Key_Shared hashes of queued entries, where known (read before).
    redeliver_hash: HashMap<Position, u32>,
    redelivery_counts: HashMap<Position, u32>,
    pending: HashMap<Position, Pending>,
    key_shared: Option<KeyShared>,
    delayed: DelayTracker,
    active: Option<u64>,
    persist_in_flight: bool,
    persist_dirty: bool,
    closed: bool,
    /// Bumped by every cursor reset, so a dispatch round that read before it sends nothing.
    epoch: u64,
    settings: DispatchSettings,
    /// Failover: when (ms) a consumer that should take over from a still-connected active one
    /// does so ([`DispatchSettings::failover_delay_ms`] after it joined).
    failover_switch_at: Option<u64>,
    /// Moving average of messages per entry, to turn message permits into entries to read
    /// (reading one entry per permit re-read batched entries many times over).
    messages_per_entry: f64,
    /// The topic's limits (unacked messages, consumers, dispatch rates), read per round.
    limits: Arc<TopicLimits>,
    /// Messages sent and not acknowledged, all consumers together (Shared and Key_Shared).
    unacked: u64,
    /// Pulsar's `blockedDispatcherOnUnackedMsgs`: nothing is dispatched until `unacked` is back
    /// to half of `maxUnackedMessagesPerSubscription`.
    dispatch_blocked: bool,
    /// A consumer or the dispatcher was unblocked since the dispatcher last looked.
    unblocked: bool,
    /// The dispatch rate allows nothing before this time (clock ms).
    throttled_until: Option<u64>,
    /// The kept messages of the thinned batches a compacted round is sending (see `compacted`).
    compacted_masks: HashMap<Position, Vec<u64>>,
}

impl State {
    /// The consumer `key`'s slot, if it is still attached.
    fn slot(&self, key: u64) -> Option<&ConsumerSlot> {
        self.consumers.iter().find(|s| s.handle.key == key)
    }

    fn new(
        sub_type: SubType,
        ack: AckState,
        last_read: Option<Position>,
        settings: DispatchSettings,
    ) -> State {
        State {
            sub_type,
            ack,
            last_read,
            consumers: Vec::new(),
            round_robin: 0,
            redeliver: BTreeSet::new(),
            redeliver_hash: HashMap::new(),
            redelivery_counts: HashMap::new(),
            pending: HashMap::new(),
            key_shared: None,
            delayed: DelayTracker::new(DelayConfig::default()),
            active: None,
            persist_in_flight: false,
            persist_dirty: false,
            closed: false,
            epoch: 0,
            settings,
            failover_switch_at: None,
            messages_per_entry: 1.0,
            limits: Arc::default(),
            unacked: 0,
            dispatch_blocked: false,
            unblocked: false,
            throttled_until: None,
            compacted_masks: HashMap::new(),
        }
    }

    /// Whether the unacked-message limits apply (Pulsar: Shared and Key_Shared dispatchers).
    fn counts_unacked(&self) -> bool {
        matches!(self.sub_type, SubType::Shared | SubType::KeyShared)
    }

    /// Counts `messages` sent to the consumer at `slot` (or given back: `sent == false`) and
    /// updates the consumer's and the subscription's blocking.
    fn count_unacked(&mut self, consumer: u64, messages: u32, sent: bool) {
        if !self.counts_unacked() {
            return;
        }
        let messages = u64::from(messages);
        let per_consumer = self.limits.max_unacked_per_consumer.load(Ordering::Relaxed);
        let per_subscription = self.limits.max_unacked_per_subscription.load(Ordering::Relaxed);
        self.unacked =
            if sent { self.unacked + messages } else { self.unacked.saturating_sub(messages) };
        let was = self.dispatch_blocked;
        self.dispatch_blocked = unacked_blocked(was, self.unacked, per_subscription);
        self.unblocked |= was && !self.dispatch_blocked;
        if let Some(slot) = self.consumers.iter_mut().find(|s| s.handle.key == consumer) {
            slot.unacked =
                if sent { slot.unacked + messages } else { slot.unacked.saturating_sub(messages) };
            let was = slot.blocked;
            slot.blocked = unacked_blocked(was, slot.unacked, per_consumer);
            self.unblocked |= was && !slot.blocked;
        }
    }

    /// The acknowledgement state as persisted (at most [`PersistLimits::default`]: acks past
    /// it are left out and redelivered after a restart), and its mark-delete position.
    fn encode_ack(&self) -> (Bytes, Option<Position>) {
        let encoded = self.ack.encode_with_limits(&PersistLimits::default());
        if let Some(from) = encoded.dropped_from {
            tracing::debug!(%from, "cursor state too large: later acks not persisted");
        }
        (encoded.bytes.into(), self.ack.mark_delete())
    }

    /// Entries sent to consumer `key` and not acknowledged, in position order.
    fn pending_of(&self, key: u64) -> Vec<Position> {
        let mut held: Vec<Position> =
            self.pending.iter().filter(|(_, p)| p.consumer == key).map(|(&p, _)| p).collect();
        held.sort_unstable();
        held
    }

    /// Forgets a pending entry (acknowledged or taken back); its hash may finish draining.
    fn take_pending(&mut self, position: Position) -> Option<Pending> {
        let pending = self.pending.remove(&position)?;
        self.count_unacked(pending.consumer, pending.messages, false);
        if let Some(key_shared) = &mut self.key_shared {
            key_shared.draining.release(pending.hash, pending.consumer);
        }
        Some(pending)
    }

    fn queue(&mut self, position: Position, hash: Option<u32>) {
        self.redeliver.insert(position);
        if let Some(hash) = hash.filter(|&h| h != 0) {
            self.redeliver_hash.insert(position, hash);
        }
    }

    fn unqueue(&mut self, position: Position) {
        self.redeliver.remove(&position);
        self.redeliver_hash.remove(&position);
    }

    /// Moves pending entries to the redelivery queue, counting a redelivery if asked.
    fn requeue(&mut self, positions: Vec<Position>, count_redelivery: bool) {
        for position in positions {
            let Some(pending) = self.take_pending(position) else { continue };
            if count_redelivery {
                *self.redelivery_counts.entry(position).or_insert(0) += 1;
            }
            self.queue(position, Some(pending.hash));
        }
    }

    /// Key_Shared, after the consumers changed: every hash whose messages are held by a
    /// consumer that no longer owns it drains before its new owner gets more of it.
    fn recompute_draining(&mut self) {
        let Some(key_shared) = &mut self.key_shared else { return };
        key_shared.draining = DrainingHashes::default();
        if key_shared.allow_out_of_order {
            return;
        }
        for pending in self.pending.values() {
            if pending.hash != 0
                && key_shared.selector.select(pending.hash) != Some(pending.consumer)
            {
                key_shared.draining.add(pending.hash, pending.consumer);
            }
        }
    }

    /// Drops acknowledged entries from the dispatch state: the `touched` positions (what
    /// individual and batch-index acks named: nothing else becomes acknowledged by them), or,
    /// for `None` (a cumulative ack, expiry), everything, by a scan. Returns whether the
    /// dispatcher should look again (Key_Shared: an ack may end a hash's draining and free
    /// parked entries).
    fn forget_acked(&mut self, touched: Option<&[Position]>) -> bool {
        match touched {
            Some(positions) => {
                for &position in positions {
                    if self.ack.is_acked(position) {
                        self.take_pending(position);
                        self.unqueue(position);
                        self.redelivery_counts.remove(&position);
                    }
                }
            }
            None => {
                let acked: Vec<Position> =
                    self.pending.keys().copied().filter(|p| self.ack.is_acked(*p)).collect();
                for position in acked {
                    self.take_pending(position);
                }
                let State { ack, redeliver, redeliver_hash, redelivery_counts, .. } = self;
                redeliver.retain(|p| !ack.is_acked(*p));
                redeliver_hash.retain(|p, _| !ack.is_acked(*p));
                redelivery_counts.retain(|p, _| !ack.is_acked(*p));
            }
        }
        let unblocked = std::mem::take(&mut self.unblocked);
        unblocked || (self.key_shared.is_some() && !self.redeliver.is_empty())
    }

    fn delays_apply(&self) -> bool {
        matches!(self.sub_type, SubType::Shared | SubType::KeyShared)
            && !self.limits.delayed_delivery_disabled.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn capacity(&self) -> i64 {
        match self.sub_type {
            SubType::Exclusive | SubType::Failover => self
                .consumers
                .iter()
                .find(|s| Some(s.handle.key) == self.active)
                .map_or(0, |s| s.permits.max(0)),
            SubType::Shared | SubType::KeyShared => {
                self.consumers.iter().filter(|s| !s.blocked).map(|s| s.permits.max(0)).sum()
            }
        }
    }

    /// What the next dispatch round reads, if anything.
    /// `compacted_horizon`: the horizon of the compacted view the round reads, if it does.
    fn plan(
        &mut self,
        ledgers: &LedgerList,
        batch_entries: usize,
        now: u64,
        compacted_horizon: Option<Position>,
    ) -> Option<Plan> {
        let capacity = self.capacity();
        if capacity <= 0 || self.dispatch_blocked {
            return None;
        }
        if self.delays_apply() {
            if self.redeliver.len() < DUE_QUEUE_LIMIT {
                let room = DUE_QUEUE_LIMIT - self.redeliver.len();
                for position in self.delayed.pop_due(now, room) {
                    if !self.ack.is_acked(position) && !self.pending.contains_key(&position) {
                        self.queue(position, None);
                    }
                }
            }
            if self.redeliver.len() < DUE_QUEUE_LIMIT {
                if let Some(rescan) = self.delayed.rescan(now) {
                    let start = if rescan.inclusive {
                        Some(rescan.from)
                    } else {
                        next_position(ledgers, Some(rescan.from))
                    };
                    return Some(Plan::Rescan(rescan, start));
                }
            }
        }
        let entries = (capacity as f64 / self.messages_per_entry.max(1.0)).ceil() as usize;
        let count = entries.clamp(1, batch_entries);
        if !self.redeliver.is_empty() {
            if self.key_shared.is_none() {
                return Some(Plan::Redeliver(self.redeliver.iter().take(count).copied().collect()));
            }
            let candidates = self.key_shared_candidates(count);
            if !candidates.is_empty() {
                return Some(Plan::Redeliver(candidates));
            }
            if self.redeliver.len() >= KEY_SHARED_LOOKAHEAD {
                return None;
            }
        }
        match next_position(ledgers, self.last_read) {
            Some(next) => Some(Plan::New(next, count)),
            // The compacted view may hold entries whose ledgers are gone.
            None => compacted_horizon
                .filter(|&horizon| self.last_read.is_none_or(|last| last < horizon))
                .map(|horizon| Plan::New(horizon, count)),
        }
    }

    /// Key_Shared: queued entries that may go out now, in position order. A queued entry that
    /// cannot go blocks the later entries of its hash.
    fn key_shared_candidates(&self, count: usize) -> Vec<Position> {
        let Some(key_shared) = &self.key_shared else { return Vec::new() };
        let mut budget: HashMap<u64, i64> = self
            .consumers
            .iter()
            .map(|s| (s.handle.key, if s.blocked { 0 } else { s.permits }))
            .collect();
        let mut blocked = HashSet::new();
        let mut candidates = Vec::new();
        for (scanned, &position) in self.redeliver.iter().enumerate() {
            if candidates.len() >= count || scanned >= KEY_SHARED_LOOKAHEAD {
                break;
            }
            let Some(&hash) = self.redeliver_hash.get(&position) else {
                // Not read yet: read it to learn its hash.
                candidates.push(position);
                continue;
            };
            let ordered = !key_shared.allow_out_of_order;
            if ordered && blocked.contains(&hash) {
                continue;
            }
            let target = key_shared.selector.select(hash);
            let go = target.is_some_and(|target| {
                budget.get(&target).is_some_and(|&p| p > 0)
                    && !(ordered && key_shared.draining.blocks(hash, target))
            });
            match target {
                Some(target) if go => {
                    if let Some(permits) = budget.get_mut(&target) {
                        *permits -= 1;
                    }
                    candidates.push(position);
                }
                _ => {
                    blocked.insert(hash);
                }
            }
        }
        candidates
    }

    /// Applies what a round read: sends (as `Outgoing`) what may go now, parks or indexes the
    /// rest. Returns the messages to send and whether another round may make progress.
    fn apply(
        &mut self,
        plan: &Plan,
        entries: Vec<(Position, Bytes)>,
        now: u64,
        partition: i32,
    ) -> (Vec<Outgoing>, bool) {
        let mut out = Vec::new();
        if let Plan::Rescan(rescan, _) = plan {
            let shaped: Vec<(Position, Option<u64>)> =
                entries.iter().map(|(p, data)| (*p, entry_shape(data).deliver_at)).collect();
            for position in self.delayed.on_rescanned(*rescan, &shaped, now) {
                if !self.ack.is_acked(position) && !self.pending.contains_key(&position) {
                    self.queue(position, None);
                }
            }
            return (out, true);
        }
        let from_stream = matches!(plan, Plan::New(..));
        if from_stream
            && matches!(self.sub_type, SubType::Exclusive | SubType::Failover)
            && !self.redeliver.is_empty()
        {
            // Entries came back (a consumer left) while this round read ahead: they go first,
            // so the single active consumer sees the stream in order. The read is dropped.
            return (out, true);
        }
        if let Plan::Redeliver(positions) = plan {
            // Entries that no longer exist cannot be redelivered.
            for position in positions {
                if !entries.iter().any(|(p, _)| p == position) {
                    self.unqueue(*position);
                }
            }
        }
        // Key_Shared: hashes with an entry waiting in the queue (a newer one must wait behind).
        let mut blocked: HashSet<u32> = if from_stream && self.key_shared.is_some() {
            self.redeliver.iter().filter_map(|p| self.redeliver_hash.get(p).copied()).collect()
        } else {
            HashSet::new()
        };
        let mut progress = false;
        for (position, data) in entries {
            if self.dispatch_blocked {
                // maxUnackedMessagesPerSubscription reached: the rest waits (re-read later).
                return (out, progress);
            }
            if from_stream && self.last_read.is_some_and(|last| position <= last) {
                continue;
            }
            if !from_stream && !self.redeliver.contains(&position) {
                continue;
            }
            if self.ack.is_acked(position) || self.pending.contains_key(&position) {
                if from_stream {
                    self.last_read = Some(position);
                } else {
                    self.unqueue(position);
                }
                progress = true;
                continue;
            }
            let shape = entry_shape(&data);
            self.messages_per_entry =
                0.9 * self.messages_per_entry + 0.1 * f64::from(shape.messages.max(1));
            if from_stream && self.delays_apply() {
                if let Some(at) = shape.deliver_at.filter(|&at| at > now) {
                    self.delayed.add(at, position);
                    self.last_read = Some(position);
                    progress = true;
                    continue;
                }
            }
            let (slot_index, hash) = if let Some(key_shared) = &self.key_shared {
                let hash = sticky_key_hash(shape.key.as_deref().unwrap_or(NONE_KEY));
                let ordered = !key_shared.allow_out_of_order;
                let target = key_shared.selector.select(hash);
                let slot =
                    target.and_then(|t| self.consumers.iter().position(|s| s.handle.key == t));
                let go = match (target, slot) {
                    (Some(target), Some(slot)) => {
                        self.consumers[slot].can_take()
                            && !(ordered
                                && (blocked.contains(&hash)
                                    || key_shared.draining.blocks(hash, target)))
                    }
                    _ => false,
                };
                if !go {
                    // Parked: the stream goes on for the other keys.
                    if ordered {
                        blocked.insert(hash);
                    }
                    if from_stream {
                        self.queue(position, Some(hash));
                        self.last_read = Some(position);
                        progress = true;
                    } else if self.redeliver_hash.insert(position, hash).is_none() {
                        progress = true;
                    }
                    continue;
                }
                (slot.unwrap_or_default(), hash)
            } else {
                match choose_consumer(self) {
                    Some(index) => (index, 0),
                    None => return (out, progress),
                }
            };
            let ack_set = self.message_ack_set(position);
            let slot = &mut self.consumers[slot_index];
            slot.permits -= i64::from(shape.messages);
            let consumer = slot.handle.key;
            let consumer_id = slot.handle.consumer_id;
            let outbox = slot.handle.outbox.clone();
            let redelivery_count = self.redelivery_counts.get(&position).copied().unwrap_or(0);
            let partition = (partition >= 0).then_some(partition);
            let message_id = commands::message_id(position.ledger_id, position.entry_id, partition);
            let command =
                commands::message(consumer_id, message_id, redelivery_count, ack_set, None);
            slot.handle.info.meter.record(u64::from(shape.messages), data.len() as u64);
            slot.handle.info.last_consumed_ms.store(now, std::sync::atomic::Ordering::Relaxed);
            let messages = shape.messages;
            out.push(Outgoing { outbox, consumer, position, command, data, messages });
            self.pending.insert(position, Pending { consumer, messages: shape.messages, hash });
            self.count_unacked(consumer, shape.messages, true);
            if from_stream {
                self.last_read = Some(position);
            } else {
                self.unqueue(position);
            }
            progress = true;
        }
        // Shared and others: a full batch sent means there may be more to send.
        (out, progress)
    }
}

/// A MESSAGE to send, decided under the lock, sent after it.
struct Outgoing {
    outbox: Outbox,
    #[cfg_attr(not(test), allow(dead_code))]
    consumer: u64,
    #[cfg_attr(not(test), allow(dead_code))]
    position: Position,
    command: magnetar_protocol::BaseCommand,
    data: Bytes,
    /// Messages in the entry (the stats and the dispatch rate count them).
    messages: u32,
}

pub struct Subscription {
    pub name: String,
    pub durable: bool,
    partition: i32,
    managed_ledger: Arc<ManagedLedger>,
    /// Durable subscriptions: where the acknowledgement state is persisted. Held across each
    /// write, so the subscription's writes form one chain (and one compare-and-set chain on
    /// its cursor record).
    cursor: Option<tokio::sync::Mutex<CursorLedger>>,
    batch_entries: usize,
    state: Mutex<State>,
    wake: Arc<Notify>,
    /// Acknowledgements made so far (a counter), and the count covered by the last cursor
    /// write that is durable: an ack receipt waits for the second to pass it.
    acks_made: std::sync::atomic::AtomicU64,
    acks_persisted: tokio::sync::watch::Sender<u64>,
    /// What was sent to consumers, asked to be redelivered, and acknowledged (stats).
    out_meter: Meter,
    redeliver_meter: Meter,
    ack_meter: Meter,
    /// When a consumer last acknowledged, was last sent messages, last sent permits (clock
    /// ms; 0: never) (stats: `lastAckedTimestamp`, `lastConsumedTimestamp`,
    /// `lastConsumedFlowTimestamp`).
    last_acked_ms: std::sync::atomic::AtomicU64,
    last_consumed_ms: std::sync::atomic::AtomicU64,
    last_flow_ms: std::sync::atomic::AtomicU64,
    /// The topic's limits (shared with the topic, which updates them).
    limits: Arc<TopicLimits>,
    /// This subscription's own dispatch rate (Pulsar's subscription dispatch rate limiter).
    rate: RateLimiter,
    /// The topic's compaction, for `readCompacted` consumers (set once, at the start).
    compaction: std::sync::OnceLock<Arc<magnetar_compaction::TopicCompaction>>,
}

/// How long an acknowledgement with a receipt waits for its cursor write.
const ACK_PERSIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Identifies an acknowledgement, to wait for its cursor write ([`Subscription::persisted`]).
#[derive(Debug, Clone, Copy)]
pub struct AckTicket(u64);

/// What one dispatch round reads.
enum Plan {
    Redeliver(Vec<Position>),
    New(Position, usize),
    /// Re-read a delayed-index bucket's span, starting at the given existing position.
    Rescan(Rescan, Option<Position>),
}

impl Plan {
    /// At most `messages` entries read (the dispatch rate's allowance; at least one).
    fn limited(self, messages: u64) -> Plan {
        let most = usize::try_from(messages).unwrap_or(usize::MAX).max(1);
        match self {
            Plan::Redeliver(mut positions) => {
                positions.truncate(most);
                Plan::Redeliver(positions)
            }
            Plan::New(from, count) => Plan::New(from, count.min(most)),
            rescan => rescan,
        }
    }
}

impl Subscription {
    /// Starts a subscription; durable ones have a `cursor` to persist to.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        name: String,
        sub_type: SubType,
        partition: i32,
        managed_ledger: Arc<ManagedLedger>,
        cursor: Option<CursorLedger>,
        ack: AckState,
        last_read: Option<Position>,
        settings: DispatchSettings,
    ) -> Arc<Self> {
        Self::start_limited(
            name,
            sub_type,
            partition,
            managed_ledger,
            cursor,
            ack,
            last_read,
            settings,
            Arc::default(),
        )
    }

    /// [`Self::start`] under the topic's `limits`.
    #[allow(clippy::too_many_arguments)]
    pub fn start_limited(
        name: String,
        sub_type: SubType,
        partition: i32,
        managed_ledger: Arc<ManagedLedger>,
        cursor: Option<CursorLedger>,
        ack: AckState,
        last_read: Option<Position>,
        settings: DispatchSettings,
        limits: Arc<TopicLimits>,
    ) -> Arc<Self> {
        let mut state = State::new(sub_type, ack, last_read, settings);
        state.limits = limits.clone();
        let subscription = Arc::new(Subscription {
            name,
            durable: cursor.is_some(),
            partition,
            managed_ledger,
            cursor: cursor.map(tokio::sync::Mutex::new),
            batch_entries: settings.batch_entries,
            state: Mutex::new(state),
            wake: Arc::new(Notify::new()),
            acks_made: std::sync::atomic::AtomicU64::new(0),
            acks_persisted: tokio::sync::watch::Sender::new(0),
            out_meter: Meter::new(),
            redeliver_meter: Meter::new(),
            ack_meter: Meter::new(),
            last_acked_ms: std::sync::atomic::AtomicU64::new(0),
            last_consumed_ms: std::sync::atomic::AtomicU64::new(0),
            last_flow_ms: std::sync::atomic::AtomicU64::new(0),
            limits,
            rate: RateLimiter::default(),
            compaction: std::sync::OnceLock::new(),
        });
        subscription.managed_ledger.add_listener(subscription.wake.clone());
        let dispatcher = subscription.clone();
        tokio::spawn(async move { dispatcher.run_dispatcher().await });
        subscription
    }

    fn now_ms(&self) -> u64 {
        self.managed_ledger.clock().now_ms()
    }

    /// The topic's compaction, which `readCompacted` consumers read (set by the topic).
    pub fn set_compaction(&self, compaction: Arc<magnetar_compaction::TopicCompaction>) {
        let _ = self.compaction.set(compaction);
    }

    pub fn sub_type(&self) -> SubType {
        self.state.lock().sub_type
    }

    pub fn consumer_count(&self) -> usize {
        self.state.lock().consumers.len()
    }

    pub fn mark_delete(&self) -> Option<Position> {
        self.state.lock().ack.mark_delete()
    }

    /// Whether the consumer `key` is still attached (a reset detaches them all).
    pub fn has_consumer(&self, key: u64) -> bool {
        let state = self.state.lock();
        !state.closed && state.consumers.iter().any(|slot| slot.handle.key == key)
    }

    /// Detaches every consumer, telling each client (CLOSE_CONSUMER); clients resubscribe.
    pub fn close_consumers(&self) {
        self.close_consumers_to(None);
    }

    /// [`Subscription::close_consumers`], naming the broker the topic moves to (PIP-307).
    pub fn close_consumers_to(&self, assigned: Option<&commands::AssignedBroker>) {
        let slots = std::mem::take(&mut self.state.lock().consumers);
        for slot in slots {
            let command = commands::close_consumer_to(slot.handle.consumer_id, u64::MAX, assigned);
            slot.handle.outbox.send_command(&command);
        }
    }

    /// Resets the cursor so that the next entry delivered is the one after `mark_delete`
    /// (`None`: the start of the topic), as Pulsar's `resetCursor` (seek) does: every consumer
    /// is disconnected (CLOSE_CONSUMER; clients reconnect and subscribe again), the
    /// individual acknowledgements, pending and redelivery state are dropped, the read position
    /// is reset and the new state is persisted before this returns.
    /// Returns the keys of the consumers that were disconnected.
    pub async fn reset_cursor(
        self: &Arc<Self>,
        mark_delete: Option<Position>,
    ) -> Result<Vec<u64>, BrokerError> {
        let detached = {
            let mut state = self.state.lock();
            if state.closed {
                return Err(BrokerError::no_subscription(&self.name));
            }
            let detached: Vec<ConsumerHandle> =
                state.consumers.drain(..).map(|slot| slot.handle).collect();
            for handle in &detached {
                let close = commands::close_consumer(handle.consumer_id, u64::MAX);
                handle.outbox.send_command(&close);
            }
            state.active = None;
            state.round_robin = 0;
            state.pending.clear();
            state.unacked = 0;
            state.dispatch_blocked = false;
            state.redeliver.clear();
            state.redeliver_hash.clear();
            state.redelivery_counts.clear();
            state.key_shared = None;
            state.delayed.clear();
            state.ack = AckState::new(mark_delete);
            state.last_read = mark_delete;
            state.epoch += 1;
            detached.into_iter().map(|handle| handle.key).collect()
        };
        // Any persist already in flight may write the old state: mark dirty so it writes again.
        self.schedule_persist();
        self.persist_now().await?;
        self.wake.notify_one();
        Ok(detached)
    }

    /// Adds a consumer, enforcing the subscription type's rules.
    pub fn add_consumer(
        &self,
        handle: ConsumerHandle,
        sub_type: SubType,
        key_shared_meta: Option<&KeySharedMeta>,
    ) -> Result<(), BrokerError> {
        let mut state = self.state.lock();
        let max = self.limits.max_consumers_per_subscription.load(Ordering::Relaxed);
        admission::subscription_has_room(max, state.consumers.len())?;
        state.add_consumer(handle, sub_type, key_shared_meta, &self.name)?;
        self.pick_active(&mut state);
        drop(state);
        self.wake.notify_one();
        Ok(())
    }
}

impl State {
    fn add_consumer(
        &mut self,
        handle: ConsumerHandle,
        sub_type: SubType,
        key_shared_meta: Option<&KeySharedMeta>,
        name: &str,
    ) -> Result<(), BrokerError> {
        let state = self;
        if state.closed {
            return Err(BrokerError::no_subscription(name));
        }
        let current = (!state.consumers.is_empty()).then_some(state.sub_type);
        admission::type_admits(current, sub_type, name)?;
        if sub_type == SubType::KeyShared {
            let allow_out_of_order =
                key_shared_meta.and_then(|m| m.allow_out_of_order_delivery).unwrap_or(false);
            if state.consumers.is_empty() || state.key_shared.is_none() {
                let consistent = state.settings.key_shared_consistent_hashing;
                state.key_shared = Some(KeyShared {
                    selector: Selector::for_first_consumer(key_shared_meta, consistent),
                    allow_out_of_order,
                    draining: DrainingHashes::default(),
                });
            }
            let Some(key_shared) = &mut state.key_shared else {
                return Err(BrokerError::InvalidRequest("no Key_Shared state".into()));
            };
            if key_shared.selector.is_sticky() != wants_sticky(key_shared_meta)
                || key_shared.allow_out_of_order != allow_out_of_order
            {
                return Err(admission::different_key_shared_policy(name));
            }
            key_shared
                .selector
                .add(handle.key, &handle.name, key_shared_meta)
                .map_err(|e| BrokerError::ConsumerAssign(e.to_string()))?;
        } else {
            state.key_shared = None;
        }
        state.sub_type = sub_type;
        state.consumers.push(ConsumerSlot {
            handle,
            permits: 0,
            announced: false,
            tell_active_at: None,
            told_end: false,
            unacked: 0,
            blocked: false,
        });
        state.recompute_draining();
        Ok(())
    }

    /// Removes a consumer; what it had not acknowledged goes back to the queue (in order, ahead
    /// of newer entries of the same keys). Returns the number of consumers left.
    fn remove_consumer(&mut self, key: u64) -> usize {
        self.consumers.retain(|slot| slot.handle.key != key);
        if let Some(key_shared) = &mut self.key_shared {
            key_shared.selector.remove(key);
        }
        let orphaned = self.pending_of(key);
        self.requeue(orphaned, true);
        self.recompute_draining();
        self.consumers.len()
    }
}

impl Subscription {
    /// Removes a consumer; what it had not acknowledged is redelivered to the others.
    /// Returns the number of consumers left.
    pub fn remove_consumer(&self, key: u64) -> usize {
        let mut state = self.state.lock();
        let left = state.remove_consumer(key);
        self.pick_active(&mut state);
        drop(state);
        self.wake.notify_one();
        left
    }

    /// Failover and Exclusive: choose the active consumer (priority, then name; for a
    /// partition, spread by partition index) and tell every consumer if it changed.
    fn pick_active(&self, state: &mut State) {
        self.pick_active_at(state, self.now_ms());
    }

    /// As [`Self::pick_active`] at time `now` (ms). On a Failover subscription a change of the
    /// active consumer happens only after the failover delay, as Pulsar does (a current one keeps
    /// receiving meanwhile, and its in-flight acks land); the dispatcher makes the switch, and
    /// tells every consumer, when the time comes.
    fn pick_active_at(&self, state: &mut State, now: u64) {
        if !matches!(state.sub_type, SubType::Failover | SubType::Exclusive) {
            state.active = None;
            return;
        }
        let mut order: Vec<&ConsumerSlot> = state.consumers.iter().collect();
        order.sort_by(|a, b| {
            (a.handle.priority, &a.handle.name).cmp(&(b.handle.priority, &b.handle.name))
        });
        let chosen = if order.is_empty() {
            None
        } else {
            let index = if self.partition >= 0 { self.partition as usize % order.len() } else { 0 };
            Some(order[index].handle.key)
        };
        if chosen == state.active {
            state.failover_switch_at = None;
            return;
        }
        let previous = state.active;
        // A hand-over (not the first pick, not the last consumer leaving) waits, whether the
        // active consumer left or a preferred one joined, as in Pulsar.
        if state.sub_type == SubType::Failover
            && previous.is_some()
            && chosen.is_some()
            && state.settings.failover_delay_ms > 0
        {
            match state.failover_switch_at {
                Some(at) if now >= at => state.failover_switch_at = None,
                Some(_) => return,
                None => {
                    state.failover_switch_at = Some(now + state.settings.failover_delay_ms);
                    return;
                }
            }
        }
        state.failover_switch_at = None;
        state.active = chosen;
        // What the previous active consumer held goes to the new one.
        if let Some(previous) = previous {
            let held = state.pending_of(previous);
            state.requeue(held, false);
        }
        if state.sub_type == SubType::Failover {
            for slot in state.consumers.iter_mut().filter(|slot| slot.announced) {
                slot.tell_active_at = None;
                let is_active = Some(slot.handle.key) == chosen;
                let command = commands::active_consumer_change(slot.handle.consumer_id, is_active);
                slot.handle.outbox.send_command(&command);
            }
        }
    }

    /// Makes a Failover hand-over whose delay has passed, and tells the consumers whose first
    /// ACTIVE_CONSUMER_CHANGE is due.
    fn switch_if_due(&self) {
        let mut state = self.state.lock();
        let now = self.now_ms();
        if state.failover_switch_at.is_some_and(|at| now >= at) {
            self.pick_active(&mut state);
        }
        let active = state.active;
        for slot in &mut state.consumers {
            if slot.tell_active_at.is_some_and(|at| now >= at) {
                slot.tell_active_at = None;
                let is_active = active == Some(slot.handle.key);
                let command = commands::active_consumer_change(slot.handle.consumer_id, is_active);
                slot.handle.outbox.send_command(&command);
            }
        }
    }

    /// The client has heard SUBSCRIBE's SUCCESS for consumer `key`: from now on it hears the
    /// subscription's consumer events, starting (Failover) with whether it is the active one.
    pub fn announce(&self, key: u64) {
        let mut state = self.state.lock();
        // With a hand-over pending, everyone hears the outcome when it happens.
        let failover = state.sub_type == SubType::Failover && state.failover_switch_at.is_none();
        let active = state.active;
        let delay = state.settings.failover_delay_ms;
        let now = self.now_ms();
        if let Some(slot) = state.consumers.iter_mut().find(|slot| slot.handle.key == key) {
            slot.announced = true;
            if failover && delay > 0 {
                slot.tell_active_at = Some(now + delay);
            } else if failover {
                let is_active = active == Some(key);
                let command = commands::active_consumer_change(slot.handle.consumer_id, is_active);
                slot.handle.outbox.send_command(&command);
            }
        }
        drop(state);
        // A consumer of a terminated topic that read everything hears so once it is announced.
        self.wake.notify_one();
    }

    pub fn flow(&self, key: u64, permits: u32) {
        let mut state = self.state.lock();
        if let Some(slot) = state.consumers.iter_mut().find(|s| s.handle.key == key) {
            slot.permits += i64::from(permits);
        }
        drop(state);
        let now_ms = self.managed_ledger.clock().now_ms();
        self.last_flow_ms.store(now_ms, std::sync::atomic::Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Individual or cumulative acknowledgement of `ids`.
    /// `by`: the consumer that sent them, if any (its own stats count them).
    pub fn ack(
        self: &Arc<Self>,
        by: Option<u64>,
        ack_type: AckType,
        ids: &[MessageIdData],
    ) -> Result<AckTicket, BrokerError> {
        let ledgers = self.managed_ledger.ledgers();
        let mut state = self.state.lock();
        if ack_type == AckType::Cumulative
            && matches!(state.sub_type, SubType::Shared | SubType::KeyShared)
        {
            return Err(BrokerError::NotAllowed(
                "cumulative ack is not allowed on Shared or Key_Shared subscriptions".into(),
            ));
        }
        let mut acked_messages = 0u64;
        // What the acks named, unless one was cumulative (then everything below is looked at).
        let mut touched = Some(Vec::with_capacity(ids.len()));
        for id in ids {
            let position = Position::new(id.ledger_id, id.entry_id);
            let ack_set: Vec<u64> = id.ack_set.iter().map(|&w| w as u64).collect();
            // The Go and Java clients send a batch-index ack's bitmap without `batch_size`: the
            // size is the dispatched entry's (as Pulsar takes it from its pending acks).
            // (Looked up only for a bitmap: plain acks, the common case, pay nothing.)
            let batch_size = if ack_set.is_empty() {
                None
            } else {
                id.batch_size
                    .and_then(|s| u32::try_from(s).ok())
                    .filter(|&s| s > 0)
                    .or_else(|| state.pending.get(&position).map(|p| p.messages))
                    .or_else(|| state.ack.partial_batch(position).map(|b| b.batch_size()))
            };
            // Messages acknowledged (stats: `msgAckRate`): a whole entry counts the messages it
            // was sent with; a batch-index ack's bitmap keeps a bit set per message not acked.
            acked_messages += match batch_size {
                None => state.pending.get(&position).map_or(1, |p| u64::from(p.messages)),
                Some(size) => {
                    let left: u32 = ack_set.iter().map(|word| word.count_ones()).sum();
                    u64::from(size.saturating_sub(left)).max(1)
                }
            };
            let action = translate_ack(ack_type, position, &ack_set, batch_size);
            match &action {
                AckAction::Entry(p) | AckAction::BatchIndexes { position: p, .. } => {
                    if let Some(named) = touched.as_mut() {
                        named.push(*p);
                    }
                }
                AckAction::Ignore(_) => {}
                // Cumulative: anything below may have become acknowledged.
                _ => touched = None,
            }
            let result = match action {
                AckAction::Entry(position) => state.ack.ack_individual(position, &ledgers),
                AckAction::BatchIndexes { position, batch_size } => {
                    state.ack.ack_batch_ack_set(position, batch_size, &ack_set, &ledgers)
                }
                AckAction::Through(position) => state.ack.ack_cumulative(position, &ledgers),
                AckAction::ThroughBatchIndex { position, batch_size, last_acked } => {
                    state.ack.ack_cumulative_batch(position, batch_size, last_acked, &ledgers)
                }
                AckAction::Before(position) => match previous_position(&ledgers, position) {
                    Some(previous) => state.ack.ack_cumulative(previous, &ledgers),
                    None => Ok(Default::default()),
                },
                AckAction::Ignore(why) => {
                    tracing::debug!(subscription = %self.name, %position, why, "ignored ack");
                    Ok(Default::default())
                }
            };
            if let Err(error) = result {
                tracing::debug!(subscription = %self.name, %error, "ignored acknowledgement");
            }
        }
        let wake = state.forget_acked(touched.as_deref());
        // Counted under the state lock, so a cursor encoding that sees this count includes
        // these acknowledgements.
        let ticket = self.acks_made.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let now_ms = self.managed_ledger.clock().now_ms();
        if let Some(slot) = by.and_then(|key| state.slot(key)) {
            slot.handle.info.acks.record(acked_messages, 0);
            slot.handle.info.last_acked_ms.store(now_ms, std::sync::atomic::Ordering::Relaxed);
        }
        drop(state);
        self.last_acked_ms.store(now_ms, std::sync::atomic::Ordering::Relaxed);
        self.ack_meter.record(acked_messages, 0);
        if wake {
            self.wake.notify_one();
        }
        self.schedule_persist();
        Ok(AckTicket(ticket))
    }

    /// Acknowledges everything up to and including `through` (message expiry, backlog
    /// eviction: Pulsar's mark-delete by the expiry monitor), persisted like a cumulative ack.
    /// Entries sent and not yet acknowledged stop being pending (a later ack of them is a
    /// no-op); the read position skips what was acknowledged. Returns whether the mark-delete
    /// position moved.
    pub fn expire_through(self: &Arc<Self>, through: Position) -> bool {
        let ledgers = self.managed_ledger.ledgers();
        let mut state = self.state.lock();
        if state.closed || state.ack.mark_delete().is_some_and(|m| m >= through) {
            return false;
        }
        if let Err(error) = state.ack.ack_cumulative(through, &ledgers) {
            tracing::debug!(subscription = %self.name, %error, "expiry not applied");
            return false;
        }
        if state.last_read.is_none_or(|last| last < through) {
            state.last_read = Some(through);
        }
        state.forget_acked(None);
        self.acks_made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        drop(state);
        self.wake.notify_one();
        self.schedule_persist();
        true
    }

    /// Entries not acknowledged (the backlog), by the ledger layout.
    pub fn backlog_entries(&self) -> u64 {
        let ledgers = self.managed_ledger.ledgers();
        self.state.lock().ack.backlog_entries(&ledgers)
    }

    /// Waits until the cursor write that covers `ticket` is durable (at once for non-durable
    /// subscriptions), so an ack receipt never promises more than a restart keeps.
    pub async fn persisted(&self, ticket: AckTicket) -> Result<(), BrokerError> {
        if !self.durable {
            return Ok(());
        }
        let mut persisted = self.acks_persisted.subscribe();
        let fence = self.managed_ledger.fence();
        let done = tokio::time::timeout(ACK_PERSIST_TIMEOUT, async {
            tokio::select! {
                biased;
                written = persisted.wait_for(|&n| n >= ticket.0) => written.is_ok(),
                // Fenced: nothing more is persisted from here.
                () = fence.fenced() => false,
            }
        })
        .await;
        match done {
            Ok(true) => Ok(()),
            _ if fence.is_fenced() => Err(fence.error()),
            _ => Err(BrokerError::Metadata("the cursor could not be persisted in time".into())),
        }
    }

    /// Waits until every acknowledgement made so far is durable (a consumer closing: what it
    /// acknowledged survives a crash of the broker right after).
    pub async fn acks_durable(&self) -> Result<(), BrokerError> {
        let made = self.acks_made.load(std::sync::atomic::Ordering::SeqCst);
        self.persisted(AckTicket(made)).await
    }

    /// Queues unacknowledged entries of a consumer for redelivery: the given ones, or all.
    pub fn redeliver(&self, key: u64, ids: &[MessageIdData]) {
        let mut state = self.state.lock();
        let chosen: Vec<Position> = if ids.is_empty() {
            state.pending_of(key)
        } else {
            ids.iter()
                .map(|id| Position::new(id.ledger_id, id.entry_id))
                .filter(|p| state.pending.get(p).is_some_and(|pending| pending.consumer == key))
                .collect()
        };
        self.redeliver_meter.record(chosen.len() as u64, 0);
        if let Some(slot) = state.slot(key) {
            slot.handle.info.redeliveries.record(chosen.len() as u64, 0);
        }
        state.requeue(chosen, true);
        drop(state);
        self.wake.notify_one();
    }

    /// Stops dispatching and forgets the persisted cursor, its ledgers and its record
    /// (unsubscribe), or just stops.
    pub async fn close(&self, delete_cursor: bool) -> Result<(), BrokerError> {
        self.state.lock().closed = true;
        self.managed_ledger.remove_listener(&self.wake);
        self.wake.notify_one();
        if let Some(cursor) = self.cursor.as_ref().filter(|_| delete_cursor) {
            cursor.lock().await.delete().await?;
        }
        Ok(())
    }

    /// Closes the cursor ledger (topic unload, after `persist_now`): see [`CursorLedger::close`].
    pub async fn close_cursor_ledger(&self) -> Result<(), BrokerError> {
        let Some(cursor) = &self.cursor else { return Ok(()) };
        cursor.lock().await.close().await
    }

    /// Writes the acknowledgement state now (first persist of a new or loaded subscription:
    /// it starts the subscription's own cursor ledger).
    pub async fn persist_now(&self) -> Result<(), BrokerError> {
        if !self.durable {
            return Ok(());
        }
        self.write_latest(false).await
    }

    /// One cursor write (an append to the cursor ledger, a rollover now and then) of the
    /// acknowledgement state as it is once this writer holds the cursor: encoded under the
    /// cursor's lock, so a write never puts an older state after a newer one (the scheduled
    /// persist and `persist_now` may race for it). The acknowledgements it covers count as
    /// persisted once it is durable. `scheduled`: the scheduled persist, which owns
    /// `persist_dirty`. A lost compare-and-set or a fenced ledger fences the topic (another
    /// broker owns it).
    async fn write_latest(&self, scheduled: bool) -> Result<(), BrokerError> {
        let mut cursor = match &self.cursor {
            Some(cursor) => Some(cursor.lock().await),
            None => None,
        };
        let ((bytes, mark_delete), covers) = {
            let mut state = self.state.lock();
            if scheduled {
                state.persist_dirty = false;
            }
            (state.encode_ack(), self.acks_made.load(std::sync::atomic::Ordering::SeqCst))
        };
        if let Some(cursor) = cursor.as_mut() {
            cursor.persist(bytes, mark_delete).await?;
        }
        self.acks_persisted.send_if_modified(|n| {
            let advanced = covers > *n;
            *n = (*n).max(covers);
            advanced
        });
        Ok(())
    }

    fn schedule_persist(self: &Arc<Self>) {
        if !self.durable {
            return;
        }
        {
            let mut state = self.state.lock();
            state.persist_dirty = true;
            if state.persist_in_flight {
                return;
            }
            state.persist_in_flight = true;
        }
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                match me.write_latest(true).await {
                    Ok(()) => {}
                    Err(BrokerError::Fenced(_)) => {
                        // Another broker owns the topic: nothing more is written from here.
                        me.state.lock().persist_in_flight = false;
                        return;
                    }
                    Err(error) => {
                        {
                            let mut state = me.state.lock();
                            if state.closed {
                                // Unloaded meanwhile (its last state persisted by the unload,
                                // the cursor ledger closed): nothing to retry.
                                state.persist_in_flight = false;
                                return;
                            }
                        }
                        tracing::warn!(subscription = %me.name, %error, "cursor not persisted");
                        // Try again (not in a hot loop): receipts wait, bounded, for it.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        me.state.lock().persist_dirty = true;
                    }
                }
                let mut state = me.state.lock();
                if !state.persist_dirty || state.closed {
                    state.persist_in_flight = false;
                    return;
                }
            }
        });
    }

    async fn run_dispatcher(self: Arc<Self>) {
        let mut read_ahead = ReadAhead::default();
        // Rounds failed in a row, and when to try again after the last: a read that failed
        // (storage nodes frozen or unreachable) is retried by itself, not only at the next
        // publish or FLOW, which may never come for a consumer that waits on its backlog.
        let mut failures = 0u32;
        let mut retry_at = None;
        loop {
            // Sleep until woken, or until the next delayed message is due (only when a consumer
            // could take it: permits arrive with a wake-up), or a failed round's retry.
            let deadline = {
                self.switch_if_due();
                let state = self.state.lock();
                let delayed = if state.capacity() > 0 { state.delayed.next_wake() } else { None };
                let tell_active = state.consumers.iter().filter_map(|s| s.tell_active_at).min();
                [delayed, state.failover_switch_at, state.throttled_until, retry_at, tell_active]
                    .into_iter()
                    .flatten()
                    .min()
            };
            retry_at = None;
            match deadline {
                Some(at) => {
                    // A deadline already passed but blocked (queue full) is retried at a
                    // short, not a zero, interval.
                    let wait = at.saturating_sub(self.now_ms()).max(10);
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    }
                }
                None => self.wake.notified().await,
            }
            self.switch_if_due();
            loop {
                if self.state.lock().closed {
                    return;
                }
                match self.dispatch_round(&mut read_ahead).await {
                    Ok(true) => failures = 0,
                    Ok(false) => {
                        failures = 0;
                        self.tell_end_of_topic();
                        break;
                    }
                    Err(error) => {
                        failures += 1;
                        let backoff = dispatch_retry_backoff(failures);
                        tracing::warn!(
                            subscription = %self.name,
                            %error,
                            retry_in_ms = backoff,
                            "dispatch failed"
                        );
                        retry_at = Some(self.now_ms() + backoff);
                        break;
                    }
                }
            }
        }
    }

    /// One read-and-send round. Returns whether another round may find more to do.
    async fn dispatch_round(
        self: &Arc<Self>,
        read_ahead: &mut ReadAhead,
    ) -> Result<bool, BrokerError> {
        let ledgers = self.managed_ledger.ledgers();
        // The dispatch rates (topic and subscription): wait for the next tokens, or read no
        // more messages than they allow now.
        let now = self.now_ms();
        let topic_rate = &self.limits.dispatch_rate;
        self.limits.configure_subscription_rate(&self.rate, now);
        let wait = topic_rate.wait_ms(now).max(self.rate.wait_ms(now));
        if wait > 0 {
            self.state.lock().throttled_until = Some(now + wait);
            return Ok(false);
        }
        let allowed = topic_rate.available_messages().min(self.rate.available_messages());
        let compaction = self.compaction.get();
        let (plan, epoch, view, last_read) = {
            let mut state = self.state.lock();
            state.throttled_until = None;
            let horizon = compacted::planning_horizon(compaction, &state);
            match state.plan(&ledgers, self.batch_entries, now, horizon) {
                Some(plan) => (
                    plan.limited(allowed),
                    state.epoch,
                    compacted::view_for(compaction, &state),
                    state.last_read,
                ),
                None => return Ok(false),
            }
        };
        let managed_ledger = &self.managed_ledger;
        if let Some(view) = view.filter(|_| !matches!(plan, Plan::Rescan(..))) {
            read_ahead.clear();
            let (managed_ledger, read_ledgers) = (managed_ledger.clone(), ledgers.clone());
            let read = tokio::task::spawn_blocking(move || {
                compacted::read(&view, &managed_ledger, &read_ledgers, &plan, last_read)
                    .map(|read| (read, plan))
            })
            .await
            .map_err(|_| BrokerError::ShuttingDown)??;
            let (read, plan) = read;
            let outgoing = {
                let mut state = self.state.lock();
                if state.epoch != epoch {
                    return Ok(true);
                }
                if let Some(horizon) = read.past_horizon {
                    if state.last_read == last_read {
                        state.last_read = Some(horizon);
                    }
                }
                state.take_masks(read.masks, &ledgers);
                let outgoing = state.apply(&plan, read.entries, self.now_ms(), self.partition);
                state.compacted_masks.clear();
                outgoing
            };
            return Ok(self.send_round(outgoing, read.past_horizon.is_some()));
        }
        let entries = match &plan {
            Plan::New(from, count) => {
                // Tailing readers find their entries in the write cache: no hand-off to a
                // blocking thread. Catching-up readers find them read ahead, or read them now
                // and have the next ones read while these go out.
                if let Some(entries) = managed_ledger.read_cached(*from, *count) {
                    read_ahead.clear();
                    entries
                } else {
                    let entries = match read_ahead.take(*from, *count).await {
                        Some(entries) => entries?,
                        None => Self::read_blocking(managed_ledger.clone(), &plan).await?,
                    };
                    if let Some((last, _)) = entries.last() {
                        read_ahead.start(managed_ledger, &ledgers, *last, *count);
                    }
                    entries
                }
            }
            _ => Self::read_blocking(managed_ledger.clone(), &plan).await?,
        };
        let outgoing = {
            let mut state = self.state.lock();
            if state.epoch != epoch {
                // The cursor was reset while reading: what was read is stale.
                return Ok(true);
            }
            state.apply(&plan, entries, self.now_ms(), self.partition)
        };
        Ok(self.send_round(outgoing, false))
    }

    /// Sends what a round decided; returns whether another round may make progress.
    fn send_round(&self, outgoing: (Vec<Outgoing>, bool), moved: bool) -> bool {
        let topic_rate = &self.limits.dispatch_rate;
        let (messages, progress) = outgoing;
        let (mut count, mut bytes) = (0u64, 0u64);
        for message in messages {
            count += u64::from(message.messages);
            bytes += message.data.len() as u64;
            message.outbox.send_payload(&message.command, &message.data);
        }
        if !(topic_rate.is_unlimited() && self.rate.is_unlimited()) {
            topic_rate.consume(count, bytes);
            self.rate.consume(count, bytes);
        }
        if count > 0 {
            self.out_meter.record(count, bytes);
            let now_ms = self.managed_ledger.clock().now_ms();
            self.last_consumed_ms.store(now_ms, std::sync::atomic::Ordering::Relaxed);
        }
        progress || moved
    }

    /// Reads what `plan` names on a blocking thread (the disk may be involved).
    async fn read_blocking(
        managed_ledger: Arc<ManagedLedger>,
        plan: &Plan,
    ) -> Result<Vec<(Position, Bytes)>, BrokerError> {
        match plan {
            Plan::Redeliver(positions) => {
                let positions = positions.clone();
                tokio::task::spawn_blocking(move || managed_ledger.read_positions(&positions))
            }
            Plan::New(from, count) => {
                let (from, count) = (*from, *count);
                tokio::task::spawn_blocking(move || managed_ledger.read_from(from, count))
            }
            Plan::Rescan(_, start) => {
                let start = *start;
                tokio::task::spawn_blocking(move || match start {
                    Some(from) => managed_ledger.read_from(from, RESCAN_CHUNK),
                    None => Ok(Vec::new()),
                })
            }
        }
        .await
        .map_err(|_| BrokerError::ShuttingDown)?
    }
}

/// How long the dispatcher waits before its next round after `failures` failed rounds in a
/// row: 100 ms doubling to 10 s (Pulsar's dispatcher backs off its read failures too, from
/// `dispatcherReadFailureBackoffInitialTimeInMs`). A replicated read fails only after its own
/// read timeout (5 s), so a frozen cluster is asked about once per read timeout plus this.
fn dispatch_retry_backoff(failures: u32) -> u64 {
    assert!(failures >= 1);
    (100u64 << (failures - 1).min(7)).min(10_000)
}

/// What the dispatcher needs of an entry's metadata.
struct EntryShape {
    /// Messages in the entry (a batch counts each).
    messages: u32,
    /// Sticky key: ordering key, else partition key (a batch's is the batch metadata's, set by
    /// the clients' key-based batcher).
    key: Option<Vec<u8>>,
    deliver_at: Option<u64>,
}

fn entry_shape(data: &Bytes) -> EntryShape {
    match parse_metadata_and_payload(data) {
        Ok((metadata, _)) => EntryShape {
            messages: metadata.num_messages_in_batch.unwrap_or(1).max(1) as u32,
            key: metadata
                .ordering_key
                .clone()
                .map(|k| k.to_vec())
                .or_else(|| metadata.partition_key.clone().map(String::into_bytes)),
            deliver_at: metadata.deliver_at_time.and_then(|t| u64::try_from(t).ok()),
        },
        Err(_) => EntryShape { messages: 1, key: None, deliver_at: None },
    }
}

/// The consumer the next entry goes to, if one may take it now (not Key_Shared).
fn choose_consumer(state: &mut State) -> Option<usize> {
    let count = state.consumers.len();
    if count == 0 {
        return None;
    }
    match state.sub_type {
        SubType::Exclusive | SubType::Failover => {
            let index = state.consumers.iter().position(|s| Some(s.handle.key) == state.active)?;
            (state.consumers[index].permits > 0).then_some(index)
        }
        SubType::Shared => {
            for step in 0..count {
                let index = (state.round_robin + step) % count;
                if state.consumers[index].can_take() {
                    state.round_robin = (index + 1) % count;
                    return Some(index);
                }
            }
            None
        }
        // Routed by `State::apply`.
        SubType::KeyShared => None,
    }
}

/// What one message id of an ACK asks of the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckAction {
    /// The whole entry (individual ack).
    Entry(Position),
    /// The messages of a batch entry that the ack set marks acknowledged (bit clear).
    BatchIndexes { position: Position, batch_size: u32 },
    /// Everything up to and including the entry (cumulative ack).
    Through(Position),
    /// Everything before the entry, and the batch entry's messages up to `last_acked`.
    ThroughBatchIndex { position: Position, batch_size: u32, last_acked: u32 },
    /// Everything before the entry, none of it.
    Before(Position),
    /// Nothing: the ack cannot be applied safely (the message stays unacknowledged).
    Ignore(&'static str),
}

/// Pulsar's rule (`Consumer.messageAcked`): an `ack_set` present on an ack is used, for
/// individual and cumulative acks alike, whether or not `batch_size` is sent; a set bit means
/// "still unacknowledged". `batch_size` is the client's or, failing that, the broker's own.
/// Never acks a message the bitmap leaves unacknowledged.
fn translate_ack(
    ack_type: AckType,
    position: Position,
    ack_set: &[u64],
    batch_size: Option<u32>,
) -> AckAction {
    let first_unacked = first_set_bit(ack_set);
    match (ack_type, first_unacked, batch_size) {
        (AckType::Individual, None, _) => AckAction::Entry(position),
        (AckType::Individual, Some(_), Some(batch_size)) => {
            AckAction::BatchIndexes { position, batch_size }
        }
        (AckType::Individual, Some(_), None) => AckAction::Ignore("batch size unknown"),
        (AckType::Cumulative, None, _) => AckAction::Through(position),
        (AckType::Cumulative, Some(0), _) => AckAction::Before(position),
        (AckType::Cumulative, Some(first), Some(batch_size)) if first >= batch_size => {
            AckAction::Through(position)
        }
        (AckType::Cumulative, Some(first), Some(batch_size)) => {
            AckAction::ThroughBatchIndex { position, batch_size, last_acked: first - 1 }
        }
        (AckType::Cumulative, Some(_), None) => AckAction::Before(position),
    }
}

fn first_set_bit(words: &[u64]) -> Option<u32> {
    words
        .iter()
        .enumerate()
        .find(|(_, &w)| w != 0)
        .map(|(i, &w)| i as u32 * 64 + w.trailing_zeros())
}

/// The entry before `position`, crossing back over empty ledgers.
pub fn previous_position(ledgers: &LedgerList, position: Position) -> Option<Position> {
    if position.entry_id > 0 {
        return Some(Position::new(position.ledger_id, position.entry_id - 1));
    }
    ledgers
        .iter()
        .filter(|extent| extent.ledger_id < position.ledger_id && extent.entry_count > 0)
        .last()
        .map(|extent| Position::new(extent.ledger_id, extent.entry_count - 1))
}

mod admin;
mod compacted;
mod read_ahead;
use read_ahead::ReadAhead;

#[cfg(test)]
mod dispatch_tests;

#[cfg(test)]
mod read_ahead_tests;

#[cfg(test)]
mod ack_receipt_tests;

#[cfg(test)]
mod ack_translation_tests {
    use super::*;

    const AT: Position = Position { ledger_id: 3, entry_id: 7 };

    /// The Java client's bitmap for a batch of `size` with `acked` indexes cleared.
    fn bitmap(size: u32, acked: &[u32]) -> Vec<u64> {
        let mut words = vec![0u64; size.div_ceil(64) as usize];
        for index in (0..size).filter(|i| !acked.contains(i)) {
            words[(index / 64) as usize] |= 1 << (index % 64);
        }
        words
    }

    #[test]
    fn individual_bitmap_without_batch_size_acks_only_the_cleared_indexes() {
        // Go and Java send no batch_size: the broker's own size must be used, not "whole entry".
        let set = bitmap(10, &[0, 1, 2, 3, 4]);
        assert_eq!(
            translate_ack(AckType::Individual, AT, &set, Some(10)),
            AckAction::BatchIndexes { position: AT, batch_size: 10 }
        );
        assert_eq!(
            translate_ack(AckType::Individual, AT, &set, None),
            AckAction::Ignore("batch size unknown")
        );
    }

    #[test]
    fn cumulative_bitmap_stops_before_the_first_unacked_index() {
        let through_fifth = bitmap(10, &[0, 1, 2, 3, 4]);
        assert_eq!(
            translate_ack(AckType::Cumulative, AT, &through_fifth, Some(10)),
            AckAction::ThroughBatchIndex { position: AT, batch_size: 10, last_acked: 4 }
        );
        // Unknown size: nothing of the batch is acked, only what lies before it.
        assert_eq!(
            translate_ack(AckType::Cumulative, AT, &through_fifth, None),
            AckAction::Before(AT)
        );
        assert_eq!(
            translate_ack(AckType::Cumulative, AT, &bitmap(10, &[]), Some(10)),
            AckAction::Before(AT)
        );
    }

    #[test]
    fn a_bitmap_with_nothing_left_unacked_acks_the_entry() {
        let all = bitmap(10, &(0..10).collect::<Vec<_>>());
        assert_eq!(translate_ack(AckType::Individual, AT, &all, None), AckAction::Entry(AT));
        assert_eq!(translate_ack(AckType::Cumulative, AT, &all, None), AckAction::Through(AT));
        // Bits past the batch's end (a client's bug) leave nothing of the batch unacked.
        assert_eq!(
            translate_ack(AckType::Cumulative, AT, &[1 << 12], Some(10)),
            AckAction::Through(AT)
        );
    }

    #[test]
    fn no_bitmap_means_the_whole_entry() {
        assert_eq!(translate_ack(AckType::Individual, AT, &[], Some(10)), AckAction::Entry(AT));
        assert_eq!(translate_ack(AckType::Cumulative, AT, &[], None), AckAction::Through(AT));
    }
}
