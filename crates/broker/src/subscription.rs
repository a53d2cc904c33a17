//! A subscription: its cursor (acknowledgement state and read position), its consumers, and
//! the dispatcher task that sends entries to them within their FLOW permits.
//!
//! Dispatch order: entries queued for redelivery first (oldest first), then new entries after
//! the read position. An entry goes to the active consumer (Exclusive, Failover), the next
//! consumer with permits (Shared), or the consumer owning its key's hash (Key_Shared).
//!
//! Invariants:
//! - Nothing is sent to a consumer without a permit; a batch entry takes as many permits as it
//!   has messages (so permits may go negative, as in Pulsar).
//! - An entry is in at most one of `pending` (sent, unacknowledged) and `redeliver`.
//! - An acknowledged entry is never sent again.
//! - Durable subscriptions persist their acknowledgement state after every change (coalesced:
//!   at most one write in flight), so a restart redelivers only what was not acknowledged.
//! - A cursor reset (seek) detaches every consumer (CLOSE_CONSUMER) and replaces the whole
//!   dispatch state; a dispatch round that read before the reset sends nothing (`epoch`).

use crate::connection::Outbox;
use crate::cursor::{next_position, AckState, Position};
use crate::error::BrokerError;
use crate::managed_ledger::ManagedLedger;
use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, MetadataStore};
use magnetar_protocol::proto::{command_ack::AckType, command_subscribe::SubType, MessageIdData};
use magnetar_protocol::{commands, parse_metadata_and_payload};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tokio::sync::Notify;

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
}

struct ConsumerSlot {
    handle: ConsumerHandle,
    permits: i64,
}

struct State {
    sub_type: SubType,
    ack: AckState,
    /// The last entry sent from the stream of new entries (None: nothing yet).
    last_read: Option<Position>,
    consumers: Vec<ConsumerSlot>,
    round_robin: usize,
    redeliver: BTreeSet<Position>,
    redelivery_counts: HashMap<Position, u32>,
    pending: HashMap<Position, u64>,
    active: Option<u64>,
    persist_in_flight: bool,
    persist_dirty: bool,
    closed: bool,
    /// Bumped by every cursor reset, so a dispatch round that read before it sends nothing.
    epoch: u64,
    /// Moving average of messages per entry, to turn message permits into entries to read
    /// (reading one entry per permit re-read batched entries many times over).
    messages_per_entry: f64,
}

impl State {
    /// Entries sent to consumer `key` and not acknowledged.
    fn pending_of(&self, key: u64) -> Vec<Position> {
        self.pending.iter().filter(|(_, &owner)| owner == key).map(|(&p, _)| p).collect()
    }

    /// Moves pending entries to the redelivery queue, counting a redelivery if asked.
    fn requeue(&mut self, positions: Vec<Position>, count_redelivery: bool) {
        for position in positions {
            self.pending.remove(&position);
            if count_redelivery {
                *self.redelivery_counts.entry(position).or_insert(0) += 1;
            }
            self.redeliver.insert(position);
        }
    }
}

pub struct Subscription {
    pub name: String,
    pub durable: bool,
    partition: i32,
    managed_ledger: Arc<ManagedLedger>,
    metadata: Arc<dyn MetadataStore>,
    cursor_key: String,
    batch_entries: usize,
    state: Mutex<State>,
    wake: Arc<Notify>,
}

/// What one dispatch round reads.
enum Plan {
    Redeliver(Vec<Position>),
    New(Position, usize),
}

impl Subscription {
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        name: String,
        sub_type: SubType,
        durable: bool,
        partition: i32,
        managed_ledger: Arc<ManagedLedger>,
        metadata: Arc<dyn MetadataStore>,
        cursor_key: String,
        ack: AckState,
        last_read: Option<Position>,
        batch_entries: usize,
    ) -> Arc<Self> {
        let state = State {
            sub_type,
            ack,
            last_read,
            consumers: Vec::new(),
            round_robin: 0,
            redeliver: BTreeSet::new(),
            redelivery_counts: HashMap::new(),
            pending: HashMap::new(),
            active: None,
            persist_in_flight: false,
            persist_dirty: false,
            closed: false,
            epoch: 0,
            messages_per_entry: 1.0,
        };
        let subscription = Arc::new(Subscription {
            name,
            durable,
            partition,
            managed_ledger,
            metadata,
            cursor_key,
            batch_entries,
            state: Mutex::new(state),
            wake: Arc::new(Notify::new()),
        });
        subscription.managed_ledger.add_listener(subscription.wake.clone());
        let dispatcher = subscription.clone();
        tokio::spawn(async move { dispatcher.run_dispatcher().await });
        subscription
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
        self.state.lock().consumers.iter().any(|slot| slot.handle.key == key)
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
                return Err(BrokerError::SubscriptionNotFound(self.name.clone()));
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
            state.redeliver.clear();
            state.redelivery_counts.clear();
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
    ) -> Result<(), BrokerError> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(BrokerError::SubscriptionNotFound(self.name.clone()));
        }
        if !state.consumers.is_empty() {
            if state.sub_type != sub_type {
                return Err(BrokerError::ConsumerBusy(format!(
                    "subscription {} is of a different type",
                    self.name
                )));
            }
            if sub_type == SubType::Exclusive {
                return Err(BrokerError::ConsumerBusy(format!(
                    "exclusive consumer is already connected to subscription {}",
                    self.name
                )));
            }
        }
        state.sub_type = sub_type;
        state.consumers.push(ConsumerSlot { handle, permits: 0 });
        self.pick_active(&mut state);
        drop(state);
        self.wake.notify_one();
        Ok(())
    }

    /// Removes a consumer; what it had not acknowledged is redelivered to the others.
    /// Returns the number of consumers left.
    pub fn remove_consumer(&self, key: u64) -> usize {
        let mut state = self.state.lock();
        state.consumers.retain(|slot| slot.handle.key != key);
        let orphaned = state.pending_of(key);
        state.requeue(orphaned, true);
        self.pick_active(&mut state);
        let left = state.consumers.len();
        drop(state);
        self.wake.notify_one();
        left
    }

    /// Failover and Exclusive: choose the active consumer (priority, then name; for a
    /// partition, spread by partition index) and tell every consumer if it changed.
    fn pick_active(&self, state: &mut State) {
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
            return;
        }
        let previous = state.active;
        state.active = chosen;
        // What the previous active consumer held goes to the new one.
        if let Some(previous) = previous {
            let held = state.pending_of(previous);
            state.requeue(held, false);
        }
        if state.sub_type == SubType::Failover {
            for slot in &state.consumers {
                let is_active = Some(slot.handle.key) == chosen;
                let command = commands::active_consumer_change(slot.handle.consumer_id, is_active);
                slot.handle.outbox.send_command(&command);
            }
        }
    }

    pub fn flow(&self, key: u64, permits: u32) {
        let mut state = self.state.lock();
        if let Some(slot) = state.consumers.iter_mut().find(|s| s.handle.key == key) {
            slot.permits += i64::from(permits);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Individual or cumulative acknowledgement of `ids`.
    pub fn ack(
        self: &Arc<Self>,
        ack_type: AckType,
        ids: &[MessageIdData],
    ) -> Result<(), BrokerError> {
        let ledgers = self.managed_ledger.ledgers();
        let mut state = self.state.lock();
        if ack_type == AckType::Cumulative
            && matches!(state.sub_type, SubType::Shared | SubType::KeyShared)
        {
            return Err(BrokerError::NotAllowed(
                "cumulative ack is not allowed on Shared or Key_Shared subscriptions".into(),
            ));
        }
        for id in ids {
            let position = Position::new(id.ledger_id, id.entry_id);
            let ack_set: Vec<u64> = id.ack_set.iter().map(|&w| w as u64).collect();
            let batch_size = id.batch_size.and_then(|s| u32::try_from(s).ok()).filter(|&s| s > 0);
            let result = match (ack_type, batch_size) {
                (AckType::Cumulative, Some(size)) if !ack_set.is_empty() => {
                    let first_unacked = first_set_bit(&ack_set).unwrap_or(size);
                    match first_unacked.checked_sub(1) {
                        Some(last_acked) => {
                            state.ack.ack_cumulative_batch(position, size, last_acked, &ledgers)
                        }
                        None => match previous_position(&ledgers, position) {
                            Some(previous) => state.ack.ack_cumulative(previous, &ledgers),
                            None => Ok(Default::default()),
                        },
                    }
                }
                (AckType::Cumulative, _) => state.ack.ack_cumulative(position, &ledgers),
                (AckType::Individual, Some(size)) if !ack_set.is_empty() => {
                    state.ack.ack_batch_ack_set(position, size, &ack_set, &ledgers)
                }
                (AckType::Individual, _) => state.ack.ack_individual(position, &ledgers),
            };
            if let Err(error) = result {
                tracing::debug!(subscription = %self.name, %error, "ignored acknowledgement");
            }
        }
        let State { ack, pending, redeliver, redelivery_counts, .. } = &mut *state;
        pending.retain(|p, _| !ack.is_acked(*p));
        redeliver.retain(|p| !ack.is_acked(*p));
        redelivery_counts.retain(|p, _| !ack.is_acked(*p));
        drop(state);
        self.schedule_persist();
        Ok(())
    }

    /// Queues unacknowledged entries of a consumer for redelivery: the given ones, or all.
    pub fn redeliver(&self, key: u64, ids: &[MessageIdData]) {
        let mut state = self.state.lock();
        let chosen: Vec<Position> = if ids.is_empty() {
            state.pending_of(key)
        } else {
            ids.iter()
                .map(|id| Position::new(id.ledger_id, id.entry_id))
                .filter(|p| state.pending.get(p) == Some(&key))
                .collect()
        };
        state.requeue(chosen, true);
        drop(state);
        self.wake.notify_one();
    }

    /// Stops dispatching and forgets the persisted cursor (unsubscribe), or just stops.
    pub async fn close(&self, delete_cursor: bool) -> Result<(), BrokerError> {
        self.state.lock().closed = true;
        self.managed_ledger.remove_listener(&self.wake);
        self.wake.notify_one();
        if delete_cursor && self.durable {
            match self.metadata.delete(&self.cursor_key, ExpectedVersion::Any).await {
                Ok(()) | Err(magnetar_metadata::MetadataError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Writes the acknowledgement state now (first persist of a new subscription).
    pub async fn persist_now(&self) -> Result<(), BrokerError> {
        if !self.durable {
            return Ok(());
        }
        let bytes = self.state.lock().ack.encode();
        self.metadata.put(&self.cursor_key, bytes.into(), ExpectedVersion::Any).await?;
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
                let bytes = {
                    let mut state = me.state.lock();
                    state.persist_dirty = false;
                    state.ack.encode()
                };
                if let Err(error) =
                    me.metadata.put(&me.cursor_key, bytes.into(), ExpectedVersion::Any).await
                {
                    tracing::warn!(subscription = %me.name, %error, "cursor not persisted");
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
        loop {
            self.wake.notified().await;
            loop {
                if self.state.lock().closed {
                    return;
                }
                match self.dispatch_round().await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(error) => {
                        tracing::warn!(subscription = %self.name, %error, "dispatch failed");
                        break;
                    }
                }
            }
        }
    }

    /// One read-and-send round. Returns whether another round may find more to do.
    async fn dispatch_round(self: &Arc<Self>) -> Result<bool, BrokerError> {
        let ledgers = self.managed_ledger.ledgers();
        let (plan, epoch) = {
            let state = self.state.lock();
            let capacity: i64 = match state.sub_type {
                SubType::Exclusive | SubType::Failover => state
                    .consumers
                    .iter()
                    .find(|s| Some(s.handle.key) == state.active)
                    .map_or(0, |s| s.permits.max(0)),
                SubType::Shared | SubType::KeyShared => {
                    state.consumers.iter().map(|s| s.permits.max(0)).sum()
                }
            };
            if capacity <= 0 {
                return Ok(false);
            }
            let entries = (capacity as f64 / state.messages_per_entry.max(1.0)).ceil() as usize;
            let count = entries.clamp(1, self.batch_entries);
            let plan = if !state.redeliver.is_empty() {
                Plan::Redeliver(state.redeliver.iter().take(count).copied().collect())
            } else {
                match next_position(&ledgers, state.last_read) {
                    Some(next) => Plan::New(next, count),
                    None => return Ok(false),
                }
            };
            (plan, state.epoch)
        };
        let managed_ledger = self.managed_ledger.clone();
        let entries = match &plan {
            Plan::Redeliver(positions) => {
                let positions = positions.clone();
                tokio::task::spawn_blocking(move || managed_ledger.read_positions(&positions))
            }
            Plan::New(from, count) => {
                let (from, count) = (*from, *count);
                tokio::task::spawn_blocking(move || managed_ledger.read_from(from, count))
            }
        }
        .await
        .map_err(|_| BrokerError::ShuttingDown)??;
        let mut state = self.state.lock();
        if state.epoch != epoch {
            // The cursor was reset while reading: what was read is stale.
            return Ok(true);
        }
        if let Plan::Redeliver(positions) = &plan {
            // Entries that no longer exist cannot be redelivered.
            for position in positions {
                if !entries.iter().any(|(p, _)| p == position) {
                    state.redeliver.remove(position);
                }
            }
        }
        let mut sent_all = true;
        for (position, data) in entries {
            let from_stream = matches!(plan, Plan::New(..));
            if from_stream && state.last_read.is_some_and(|last| position <= last) {
                continue;
            }
            if state.ack.is_acked(position) || state.pending.contains_key(&position) {
                if from_stream {
                    state.last_read = Some(position);
                } else {
                    state.redeliver.remove(&position);
                }
                continue;
            }
            let (messages, key) = entry_shape(&data);
            state.messages_per_entry = 0.9 * state.messages_per_entry + 0.1 * f64::from(messages);
            let Some(slot_index) = choose_consumer(&mut state, key.as_deref()) else {
                sent_all = false;
                break;
            };
            let slot = &mut state.consumers[slot_index];
            slot.permits -= i64::from(messages);
            let consumer_key = slot.handle.key;
            let consumer_id = slot.handle.consumer_id;
            let outbox = slot.handle.outbox.clone();
            let redelivery_count = state.redelivery_counts.get(&position).copied().unwrap_or(0);
            let ack_set: Vec<i64> = state
                .ack
                .partial_batch(position)
                .map(|batch| batch.ack_set().iter().map(|&w| w as i64).collect())
                .unwrap_or_default();
            let partition = (self.partition >= 0).then_some(self.partition);
            let message_id = commands::message_id(position.ledger_id, position.entry_id, partition);
            let command =
                commands::message(consumer_id, message_id, redelivery_count, ack_set, None);
            outbox.send_payload(&command, &data);
            state.pending.insert(position, consumer_key);
            if from_stream {
                state.last_read = Some(position);
            } else {
                state.redeliver.remove(&position);
            }
        }
        Ok(sent_all)
    }
}

/// Messages in an entry and its routing key (ordering key, else partition key).
fn entry_shape(data: &Bytes) -> (u32, Option<Vec<u8>>) {
    match parse_metadata_and_payload(data) {
        Ok((metadata, _)) => {
            let messages = metadata.num_messages_in_batch.unwrap_or(1).max(1) as u32;
            let key = metadata
                .ordering_key
                .clone()
                .map(|k| k.to_vec())
                .or_else(|| metadata.partition_key.clone().map(String::into_bytes));
            (messages, key)
        }
        Err(_) => (1, None),
    }
}

/// The consumer the next entry goes to, if one may take it now.
fn choose_consumer(state: &mut State, key: Option<&[u8]>) -> Option<usize> {
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
                if state.consumers[index].permits > 0 {
                    state.round_robin = (index + 1) % count;
                    return Some(index);
                }
            }
            None
        }
        SubType::KeyShared => {
            // Sticky by key hash, so each key keeps its order on one consumer.
            let index = match key {
                Some(key) => (crc32c::crc32c(key) as usize) % count,
                None => {
                    let index = state.round_robin % count;
                    state.round_robin = (index + 1) % count;
                    index
                }
            };
            (state.consumers[index].permits > 0).then_some(index)
        }
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
pub fn previous_position(
    ledgers: &crate::cursor::LedgerList,
    position: Position,
) -> Option<Position> {
    if position.entry_id > 0 {
        return Some(Position::new(position.ledger_id, position.entry_id - 1));
    }
    ledgers
        .iter()
        .filter(|extent| extent.ledger_id < position.ledger_id && extent.entry_count > 0)
        .last()
        .map(|extent| Position::new(extent.ledger_id, extent.entry_count - 1))
}
