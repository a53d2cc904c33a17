//! What the admin API asks of a persistent topic: stats and internal stats, subscriptions
//! created, removed and reset, entries read for peek / examine / get-by-id, terminate.

use super::*;
use crate::stats::{format_time_ms, position_string, InternalStats, LedgerInfoStats, TopicStats};
use bytes::Bytes;

/// Where an admin-created or reset subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionStart {
    /// Before the first entry.
    Earliest,
    /// After the last entry.
    Latest,
    /// At this entry: it is the first delivered.
    At(Position),
    /// After this entry (a reset with `isExcluded`).
    After(Position),
}

/// Where `examinemessage` counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExaminePosition {
    /// `messagePosition` 1 is the first entry.
    Earliest,
    /// `messagePosition` 1 is the last entry.
    Latest,
}

impl Topic {
    /// The subscription `name`, or `SubscriptionNotFound`.
    pub fn has_subscription(&self, name: &str) -> bool {
        self.subscriptions.lock().contains_key(name)
    }

    /// The subscription `name`, created at the earliest entry if the policies allow consumers
    /// to create subscriptions (Pulsar's `findOrCreateSubscriptionAsync`: peek does so).
    pub async fn subscription_or_created(
        &self,
        name: &str,
    ) -> Result<Arc<Subscription>, BrokerError> {
        if let Ok(existing) = self.existing_subscription(name) {
            return Ok(existing);
        }
        if !self.policies().allow_auto_subscription_creation {
            return Err(BrokerError::NotAllowed(format!(
                "Subscription {name} does not exist for topic {} and automatic subscription \
                 creation is disabled",
                self.full_name
            )));
        }
        self.subscription(name, SubType::Exclusive, true, StartAt::Earliest).await
    }

    pub fn existing_subscription(&self, name: &str) -> Result<Arc<Subscription>, BrokerError> {
        self.subscriptions
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::no_subscription(name))
    }

    /// `TopicStatsImpl` of this topic.
    pub fn stats(&self) -> TopicStats {
        let ledgers = self.managed_ledger.ledgers();
        let ledger_stats = self.managed_ledger.ledger_stats();
        let subscriptions: Vec<(String, Arc<Subscription>)> =
            self.subscriptions.lock().iter().map(|(n, s)| (n.clone(), s.clone())).collect();
        let now = self.managed_ledger.clock().now();
        let reading = self.in_meter.read_at(now);
        let mut stats = TopicStats {
            msg_rate_in: reading.rate,
            msg_throughput_in: reading.throughput,
            bytes_in_counter: reading.bytes,
            msg_in_counter: reading.messages,
            average_msg_size: if reading.rate > 0.0 {
                reading.throughput / reading.rate
            } else {
                0.0
            },
            storage_size: ledger_stats.iter().map(|l| l.size).sum(),
            publishers: self.producers.stats(now),
            waiting_publishers: self.producers.waiting() as u64,
            deduplication_status: if self.deduplication_enabled() { "Enabled" } else { "Disabled" }
                .to_string(),
            topic_epoch: self.producers.epoch(),
            last_publish_time_stamp: self.last_publish_ms(),
            publish_rate_limited_times: self
                .limits()
                .publish_rate_limited_times
                .load(std::sync::atomic::Ordering::Relaxed),
            compaction: {
                let run = self.compaction.stats();
                crate::stats::CompactionStats {
                    last_compaction_removed_event_count: run.last_removed_events,
                    last_compaction_succeed_timestamp: run.last_succeed_ms,
                    last_compaction_failed_timestamp: run.last_failed_ms,
                    last_compaction_duration_time_in_mills: run.last_duration_ms,
                }
            },
            ..Default::default()
        };
        let mut slowest: Option<Option<Position>> = None;
        for (name, subscription) in subscriptions {
            let sub = subscription.stats(&ledgers, &ledger_stats);
            stats.msg_rate_out += sub.msg_rate_out;
            stats.msg_throughput_out += sub.msg_throughput_out;
            stats.msg_out_counter += sub.msg_out_counter;
            stats.bytes_out_counter += sub.bytes_out_counter;
            stats.non_contiguous_deleted_messages_ranges +=
                sub.non_contiguous_deleted_messages_ranges;
            stats.non_contiguous_deleted_messages_ranges_serialized_size +=
                sub.non_contiguous_deleted_messages_ranges_serialized_size;
            if subscription.durable {
                let mark_delete = subscription.mark_delete();
                slowest = Some(slowest.map_or(mark_delete, |s| s.min(mark_delete)));
            }
            stats.subscriptions.insert(name, sub);
        }
        // The estimated backlog of the slowest durable subscription (Pulsar's
        // `getEstimatedBacklogSize`).
        stats.backlog_size = slowest.map_or(0, |mark_delete| {
            crate::managed_ledger::estimate_size_after(&ledger_stats, mark_delete)
        });
        stats
    }

    /// What the console's history samples of this topic (counters, not rates: see `history`).
    pub fn history_sample(&self) -> crate::history::TopicSample {
        let ledgers = self.managed_ledger.ledgers();
        let storage_size = self.managed_ledger.ledger_stats().iter().map(|l| l.size).sum();
        let mut sample = crate::history::TopicSample {
            name: self.full_name.clone(),
            storage_size,
            producers: self.producers.len() as u64,
            ..Default::default()
        };
        sample.counters.msg_in = self.in_meter.messages();
        sample.counters.bytes_in = self.in_meter.bytes();
        for subscription in self.subscriptions() {
            let (messages, bytes, redelivered) = subscription.out_counters();
            sample.counters.msg_out += messages;
            sample.counters.bytes_out += bytes;
            sample.counters.redelivered += redelivered;
            sample.backlog += subscription.backlog(&ledgers);
            sample.subscriptions += 1;
            sample.consumers += subscription.consumer_count() as u64;
        }
        sample
    }

    /// `PersistentTopicInternalStats` of this topic.
    pub fn internal_stats(&self) -> InternalStats {
        let ml = &self.managed_ledger;
        let ledgers = ml.ledgers();
        let ledger_stats = ml.ledger_stats();
        let current = ledger_stats.iter().find(|l| l.current).copied();
        let first_ledger = ledger_stats.first().map_or(0, |l| l.ledger_id);
        let end = match current {
            Some(current) => Position::new(current.ledger_id, current.entries),
            None => Position::new(ml.current_ledger(), 0),
        };
        let last_confirmed = match ml.last_confirmed() {
            Some(position) => position_string(position),
            None => format!("{}:-1", ml.current_ledger()),
        };
        let subscriptions: Vec<(String, Arc<Subscription>)> =
            self.subscriptions.lock().iter().map(|(n, s)| (n.clone(), s.clone())).collect();
        InternalStats {
            entries_added_counter: ml.entries_added(),
            number_of_entries: ledger_stats.iter().map(|l| l.entries).sum(),
            total_size: ledger_stats.iter().map(|l| l.size).sum(),
            current_ledger_entries: current.map_or(0, |l| l.entries),
            current_ledger_size: current.map_or(0, |l| l.size),
            last_ledger_created_timestamp: format_time_ms(ml.current_ledger_opened_ms()),
            last_confirmed_entry: last_confirmed,
            state: if ml.is_terminated() { "Terminated" } else { "LedgerOpened" }.to_string(),
            ledgers: ledger_stats
                .iter()
                .map(|l| LedgerInfoStats {
                    ledger_id: l.ledger_id as i64,
                    entries: l.entries as i64,
                    size: l.size as i64,
                    timestamp: l.timestamp_ms as i64,
                    ..Default::default()
                })
                .collect(),
            cursors: subscriptions
                .into_iter()
                .map(|(name, s)| (name, s.cursor_stats(&ledgers, first_ledger, end)))
                .collect(),
            compacted_ledger: match self.compaction.view() {
                Some(view) => LedgerInfoStats {
                    ledger_id: view.ledger as i64,
                    entries: view.entries() as i64,
                    size: view.bytes as i64,
                    ..Default::default()
                },
                None => {
                    LedgerInfoStats { ledger_id: -1, entries: -1, size: -1, ..Default::default() }
                }
            },
            ..Default::default()
        }
    }

    /// Seals the topic (Pulsar's `terminate`): producers' sends fail with TopicTerminated, new
    /// producers are refused, consumers that read everything hear REACHED_END_OF_TOPIC; kept
    /// across reloads. Returns the last entry.
    pub async fn terminate(&self) -> Result<Option<Position>, BrokerError> {
        self.managed_ledger.terminate().await
    }

    /// The mark-delete position that makes `start` the next entry delivered.
    pub fn mark_delete_for(&self, start: SubscriptionStart) -> Option<Position> {
        let ledgers = self.managed_ledger.ledgers();
        let last = self.managed_ledger.last_confirmed();
        match start {
            SubscriptionStart::Earliest => None,
            SubscriptionStart::Latest => last,
            SubscriptionStart::At(position) if last.is_some_and(|last| position > last) => last,
            SubscriptionStart::At(position) => previous_position(&ledgers, position),
            SubscriptionStart::After(position) => match last {
                Some(last) if position >= last => Some(last),
                _ => Some(position),
            },
        }
    }

    /// Creates durable subscription `name` starting at `start` (admin `create-subscription`).
    /// `Ok(false)` when it exists already.
    pub async fn create_subscription(
        &self,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<bool, BrokerError> {
        if self.has_subscription(name) {
            return Ok(false);
        }
        let initial = match start {
            SubscriptionStart::Latest => StartAt::Latest,
            _ => StartAt::Earliest,
        };
        let subscription = self.subscription(name, SubType::Exclusive, true, initial).await?;
        if !matches!(start, SubscriptionStart::Latest | SubscriptionStart::Earliest) {
            subscription.reset_cursor(self.mark_delete_for(start)).await?;
        }
        Ok(true)
    }

    /// Removes subscription `name` and its cursor (admin `unsubscribe`): refused while
    /// consumers are connected unless `force`, which disconnects them.
    pub async fn unsubscribe(&self, name: &str, force: bool) -> Result<(), BrokerError> {
        let subscription = self.existing_subscription(name)?;
        if subscription.consumer_count() > 0 {
            if !force {
                return Err(BrokerError::NotAllowed(
                    "Subscription has active connected consumers".to_string(),
                ));
            }
            subscription.close_consumers();
        }
        self.remove_subscription(name, true).await
    }

    /// Resets subscription `name` so that `start` is delivered next (admin `reset-cursor`);
    /// its consumers are disconnected and reconnect.
    pub async fn reset_subscription(
        &self,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<(), BrokerError> {
        let subscription = self.existing_subscription(name)?;
        subscription.reset_cursor(self.mark_delete_for(start)).await.map(|_| ())
    }

    /// Resets subscription `name` to the first entry published at or after `publish_time`
    /// (ms), or past the end when there is none.
    pub async fn reset_subscription_to_time(
        &self,
        name: &str,
        publish_time: u64,
    ) -> Result<(), BrokerError> {
        let subscription = self.existing_subscription(name)?;
        let found = self.first_published_at_or_after(publish_time).await?;
        let start = found.map_or(SubscriptionStart::Latest, SubscriptionStart::At);
        subscription.reset_cursor(self.mark_delete_for(start)).await.map(|_| ())
    }

    /// The first entry published at or after `publish_time` (ms), if any (Pulsar's
    /// `getMessageIdByTimestamp`, reset-cursor by time).
    pub async fn first_published_at_or_after(
        &self,
        publish_time: u64,
    ) -> Result<Option<Position>, BrokerError> {
        let ml = self.managed_ledger.clone();
        tokio::task::spawn_blocking(move || ml.first_published_at_or_after(publish_time))
            .await
            .map_err(|_| BrokerError::ShuttingDown)?
    }

    /// The stored entry at `position`, if it exists.
    pub async fn read_entry(&self, position: Position) -> Result<Option<Bytes>, BrokerError> {
        let ledgers = self.managed_ledger.ledgers();
        if !crate::cursor::position_exists(&ledgers, position) {
            return Ok(None);
        }
        let ml = self.managed_ledger.clone();
        let mut read = tokio::task::spawn_blocking(move || ml.read_positions(&[position]))
            .await
            .map_err(|_| BrokerError::ShuttingDown)??;
        Ok(read.pop().map(|(_, data)| data))
    }

    /// The `n`th entry (from 1) counted from the first or from the last.
    pub fn examine_position(&self, from: ExaminePosition, n: u64) -> Option<Position> {
        let index = n.checked_sub(1)?;
        let extents: Vec<(u64, u64)> = self
            .managed_ledger
            .ledgers()
            .iter()
            .filter(|e| e.entry_count > 0)
            .map(|e| (e.ledger_id, e.entry_count))
            .collect();
        let total: u64 = extents.iter().map(|&(_, count)| count).sum();
        if index >= total {
            return None;
        }
        let mut offset = match from {
            ExaminePosition::Earliest => index,
            ExaminePosition::Latest => total - 1 - index,
        };
        for (ledger_id, count) in extents {
            if offset < count {
                return Some(Position::new(ledger_id, offset));
            }
            offset -= count;
        }
        None
    }

    /// The last entry's id, as Pulsar's `getLastMessageId` answers it: `(ledger, entry)`, and
    /// `(current ledger, -1)` for a topic without entries.
    pub fn last_message_id(&self) -> (u64, i64) {
        match self.managed_ledger.last_confirmed() {
            Some(position) => (position.ledger_id, position.entry_id as i64),
            None => (self.managed_ledger.current_ledger(), -1),
        }
    }
}
