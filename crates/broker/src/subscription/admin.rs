//! What the admin API asks of a subscription: its stats and cursor stats, skipping and clearing
//! its backlog, the nth unacknowledged entry (peek), and telling consumers that a terminated
//! topic has no more entries for them.

use super::*;
use crate::cursor::LedgerList;
use crate::managed_ledger::LedgerStat;
use crate::stats::{format_time_ms, individually_deleted_string, position_string};
use std::sync::atomic::Ordering;

/// An exclusive upper bound past every position.
const END: Position = Position { ledger_id: u64::MAX, entry_id: u64::MAX };

impl Subscription {
    /// Entries after the mark-delete position not yet acknowledged (Pulsar's `msgBacklog`,
    /// which counts entries).
    pub fn backlog(&self, ledgers: &LedgerList) -> u64 {
        self.state.lock().ack.backlog_entries(ledgers)
    }

    /// Messages and bytes sent to consumers so far, and messages redelivered: the counters
    /// alone, so reading them leaves the stats' rate windows where they are.
    pub fn out_counters(&self) -> (u64, u64, u64) {
        (self.out_meter.messages(), self.out_meter.bytes(), self.redeliver_meter.messages())
    }

    /// `SubscriptionStatsImpl` of this subscription; `ledger_stats` sizes the backlog.
    pub fn stats(&self, ledgers: &LedgerList, ledger_stats: &[LedgerStat]) -> SubscriptionStats {
        let now = self.managed_ledger.clock().now();
        let out = self.out_meter.read_at(now);
        let redeliver = self.redeliver_meter.read_at(now);
        let acks = self.ack_meter.read_at(now);
        let state = self.state.lock();
        let backlog = state.ack.backlog_entries(ledgers);
        let delayed = state.delayed.len();
        let mut unacked_by_consumer: HashMap<u64, u64> = HashMap::new();
        for pending in state.pending.values() {
            *unacked_by_consumer.entry(pending.consumer).or_default() +=
                u64::from(pending.messages);
        }
        let consumers: Vec<ConsumerStats> = state
            .consumers
            .iter()
            .map(|slot| {
                let info = &slot.handle.info;
                let reading = info.meter.read_at(now);
                let timestamp = |ms: &std::sync::atomic::AtomicU64| ms.load(Ordering::Relaxed);
                ConsumerStats {
                    msg_rate_out: reading.rate,
                    msg_throughput_out: reading.throughput,
                    bytes_out_counter: reading.bytes,
                    msg_out_counter: reading.messages,
                    message_ack_rate: info.acks.read_at(now).rate,
                    msg_rate_redeliver: info.redeliveries.read_at(now).rate,
                    last_acked_timestamp: timestamp(&info.last_acked_ms),
                    last_consumed_timestamp: timestamp(&info.last_consumed_ms),
                    metadata: info.metadata.clone(),
                    consumer_name: slot.handle.name.clone(),
                    consumer_id: slot.handle.consumer_id,
                    available_permits: slot.permits,
                    blocked_consumer_on_unacked_msgs: slot.blocked,
                    unacked_messages: unacked_by_consumer
                        .get(&slot.handle.key)
                        .copied()
                        .unwrap_or(0),
                    avg_messages_per_entry: state.messages_per_entry.round().max(1.0) as u64,
                    address: info.address.clone(),
                    connected_since: format_time_ms(info.connected_since_ms),
                    client_version: info.client_version.clone(),
                    ..Default::default()
                }
            })
            .collect();
        let active_consumer_name =
            state.active.and_then(|active| state.slot(active).map(|s| s.handle.name.clone()));
        let ranges = state.ack.acked_range_count(ledgers);
        SubscriptionStats {
            msg_rate_out: out.rate,
            msg_throughput_out: out.throughput,
            bytes_out_counter: out.bytes,
            msg_out_counter: out.messages,
            msg_rate_redeliver: redeliver.rate,
            message_ack_rate: acks.rate,
            msg_backlog: backlog,
            blocked_subscription_on_unacked_msgs: state.dispatch_blocked,
            backlog_size: crate::managed_ledger::estimate_size_after(
                ledger_stats,
                state.ack.mark_delete(),
            ),
            msg_backlog_no_delayed: backlog.saturating_sub(delayed),
            msg_delayed: delayed,
            unacked_messages: unacked_by_consumer.values().sum(),
            sub_type: crate::stats::sub_type_name(state.sub_type),
            active_consumer_name,
            consumers,
            is_durable: self.durable,
            allow_out_of_order_delivery: state
                .key_shared
                .as_ref()
                .is_some_and(|key_shared| key_shared.allow_out_of_order),
            non_contiguous_deleted_messages_ranges: ranges,
            non_contiguous_deleted_messages_ranges_serialized_size: ranges * 16,
            last_acked_timestamp: self.last_acked_ms.load(Ordering::Relaxed),
            last_consumed_timestamp: self.last_consumed_ms.load(Ordering::Relaxed),
            last_consumed_flow_timestamp: self.last_flow_ms.load(Ordering::Relaxed),
            ..Default::default()
        }
    }

    /// The cursor as `PersistentTopicInternalStats.cursors` shows it. `first_ledger` names the
    /// mark-delete of a cursor before any entry (`first:-1`); `end` is the position after the
    /// last entry (the read position of a cursor that read everything).
    pub fn cursor_stats(
        &self,
        ledgers: &LedgerList,
        first_ledger: u64,
        end: Position,
    ) -> CursorStats {
        let cursor_ledger = self
            .cursor
            .as_ref()
            .and_then(|cursor| cursor.try_lock().ok().and_then(|c| c.log().current_ledger()))
            .map_or(-1, |id| id as i64);
        let state = self.state.lock();
        let mark_delete = state.ack.mark_delete();
        let read = next_position(ledgers, state.last_read.max(mark_delete)).unwrap_or(end);
        let total = crate::cursor::entries_after(ledgers, None);
        let backlog = state.ack.backlog_entries(ledgers);
        let since_first_unacked = match state.ack.unacked_positions(END, ledgers).next() {
            Some(first) => crate::cursor::entries_between(
                ledgers,
                previous_position(ledgers, first),
                state.last_read.unwrap_or(first),
            ) as i64,
            None => 0,
        };
        CursorStats {
            mark_delete_position: match mark_delete {
                Some(position) => position_string(position),
                None => format!("{first_ledger}:-1"),
            },
            read_position: position_string(read),
            messages_consumed_counter: total.saturating_sub(backlog) as i64,
            cursor_ledger,
            cursor_ledger_last_entry: -1,
            individually_deleted_messages: individually_deleted_string(
                state.ack.acked_ranges(ledgers),
            ),
            last_ledger_switch_timestamp: format_time_ms(0),
            state: if state.closed { "Closed" } else { "Open" }.to_string(),
            active: !state.consumers.is_empty(),
            number_of_entries_since_first_not_acked_message: since_first_unacked,
            total_non_contiguous_deleted_messages_range: state.ack.acked_range_count(ledgers),
            ..Default::default()
        }
    }

    /// Acknowledges the next `n` unacknowledged entries after the mark-delete position
    /// (Pulsar's `skipEntries(n, Exclude)`). Returns how many were skipped.
    pub fn skip(self: &Arc<Self>, n: u64) -> Result<u64, BrokerError> {
        let ledgers = self.managed_ledger.ledgers();
        let skipped = {
            let mut state = self.state.lock();
            if state.closed {
                return Err(BrokerError::no_subscription(&self.name));
            }
            let chosen: Vec<Position> = state
                .ack
                .unacked_positions(END, &ledgers)
                .take(usize::try_from(n).unwrap_or(usize::MAX))
                .collect();
            for &position in &chosen {
                if let Err(error) = state.ack.ack_individual(position, &ledgers) {
                    tracing::debug!(subscription = %self.name, %error, "skip: ack ignored");
                }
            }
            state.forget_acked(Some(&chosen));
            chosen.len() as u64
        };
        self.acks_made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.schedule_persist();
        self.wake.notify_one();
        Ok(skipped)
    }

    /// Acknowledges everything written so far (Pulsar's `clearBacklog`, `skip_all`).
    pub fn clear_backlog(self: &Arc<Self>) -> Result<(), BrokerError> {
        let ledgers = self.managed_ledger.ledgers();
        let Some(last) = self.managed_ledger.last_confirmed() else { return Ok(()) };
        {
            let mut state = self.state.lock();
            if state.closed {
                return Err(BrokerError::no_subscription(&self.name));
            }
            if let Err(error) = state.ack.ack_cumulative(last, &ledgers) {
                tracing::debug!(subscription = %self.name, %error, "clear backlog: ack ignored");
            }
            state.forget_acked(None);
            if state.last_read.is_none_or(|read| read < last) {
                state.last_read = Some(last);
            }
        }
        self.acks_made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.schedule_persist();
        self.wake.notify_one();
        Ok(())
    }

    /// The `n`th (from 1) unacknowledged entry after the mark-delete position, if any
    /// (what Pulsar's `peekNthMessage` reads).
    pub fn nth_unacked(&self, n: u64) -> Option<Position> {
        let index = usize::try_from(n.checked_sub(1)?).ok()?;
        let ledgers = self.managed_ledger.ledgers();
        let state = self.state.lock();
        let found = state.ack.unacked_positions(END, &ledgers).nth(index);
        found
    }

    /// On a terminated topic, once nothing is left to read: each consumer that has not heard
    /// it yet is told REACHED_END_OF_TOPIC (as Pulsar's dispatchers do), except C++-based
    /// clients (see below).
    pub(super) fn tell_end_of_topic(&self) {
        if !self.managed_ledger.is_terminated() {
            return;
        }
        let ledgers = self.managed_ledger.ledgers();
        let mut state = self.state.lock();
        if state.closed
            || !state.redeliver.is_empty()
            || next_position(&ledgers, state.last_read.max(state.ack.mark_delete())).is_some()
        {
            return;
        }
        for slot in state.consumers.iter_mut().filter(|slot| slot.announced && !slot.told_end) {
            slot.told_end = true;
            // The C++ client (and the Python, Node.js and C# clients built on it) does not know
            // this command and drops its connection on it; Pulsar sends it anyway and such a
            // consumer reconnects in a loop. It is left out for them: they find the end through
            // GET_LAST_MESSAGE_ID (`hasMessageAvailable`).
            if slot.handle.info.client_version.starts_with("Pulsar-CPP") {
                continue;
            }
            let command = commands::reached_end_of_topic(slot.handle.consumer_id);
            slot.handle.outbox.send_command(&command);
        }
    }
}
