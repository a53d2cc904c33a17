//! Topic statistics as Pulsar's admin API reports them (`TopicStatsImpl`, `PublisherStatsImpl`,
//! `SubscriptionStatsImpl`, `ConsumerStatsImpl`, `PersistentTopicInternalStats`), and the
//! counters behind them.
//!
//! Counting: every producer, consumer, subscription and topic has a [`Meter`] (two relaxed
//! atomic adds per counted message or entry, on paths that already touch the entry: no lock,
//! no allocation). Rates are computed when stats are asked for, from the counters' deltas
//! since the previous sample of the same meter: a sample younger than [`MIN_RATE_WINDOW`] is
//! not replaced (its rates are reported again), so rates cover at least that window, and at
//! most the time since the previous stats request; the first request takes the first sample
//! (rates 0). (Pulsar recomputes rates every `statsUpdateFrequencyInSecs`, 60 s by default;
//! here no background task is needed.) Times come from the caller (the injected clock).
//!
//! The structs serialise with Pulsar's field names (camelCase) and integer types where
//! Pulsar's are integers, so Apache's `pulsar-admin` and the Go `pulsaradmin` decode them.

use crate::cursor::{Position, PositionRange};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shortest window a rate is computed over.
pub const MIN_RATE_WINDOW: Duration = Duration::from_secs(1);

/// A message and byte counter with request-time rates.
#[derive(Debug)]
pub struct Meter {
    messages: AtomicU64,
    bytes: AtomicU64,
    sample: Mutex<Sample>,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    /// `None` until the first reading.
    at: Option<Instant>,
    messages: u64,
    bytes: u64,
    rate: f64,
    throughput: f64,
}

/// What a meter reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MeterReading {
    pub messages: u64,
    pub bytes: u64,
    /// Messages per second.
    pub rate: f64,
    /// Bytes per second.
    pub throughput: f64,
}

impl Default for Meter {
    fn default() -> Self {
        Meter::new()
    }
}

impl Meter {
    /// A meter whose first reading takes the first sample.
    pub fn new() -> Self {
        Self::with_sample(None)
    }

    /// A meter whose first sample (all zero) is taken at `at`.
    pub fn starting_at(at: Instant) -> Self {
        Self::with_sample(Some(at))
    }

    fn with_sample(at: Option<Instant>) -> Self {
        Meter {
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            sample: Mutex::new(Sample { at, messages: 0, bytes: 0, rate: 0.0, throughput: 0.0 }),
        }
    }

    /// Counts `messages` messages of `bytes` bytes in all.
    #[inline]
    pub fn record(&self, messages: u64, bytes: u64) {
        self.messages.fetch_add(messages, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Counters and rates at `now`: the rates since the previous sample, when that is at
    /// least [`MIN_RATE_WINDOW`] old (it is then replaced), else the previous sample's rates.
    pub fn read_at(&self, now: Instant) -> MeterReading {
        let messages = self.messages();
        let bytes = self.bytes();
        let mut sample = self.sample.lock();
        let Some(at) = sample.at else {
            *sample = Sample { at: Some(now), messages, bytes, rate: 0.0, throughput: 0.0 };
            return MeterReading { messages, bytes, rate: 0.0, throughput: 0.0 };
        };
        let elapsed = now.saturating_duration_since(at);
        if elapsed >= MIN_RATE_WINDOW {
            let seconds = elapsed.as_secs_f64();
            *sample = Sample {
                at: Some(now),
                messages,
                bytes,
                rate: messages.saturating_sub(sample.messages) as f64 / seconds,
                throughput: bytes.saturating_sub(sample.bytes) as f64 / seconds,
            };
        }
        MeterReading { messages, bytes, rate: sample.rate, throughput: sample.throughput }
    }
}

/// What the stats say of a connected producer or consumer besides its name: its connection's
/// address and client version, when it joined, and its meter (in for producers, out for
/// consumers).
#[derive(Debug, Default)]
pub struct ClientInfo {
    /// Pulsar's form: `/ip:port`.
    pub address: String,
    pub client_version: String,
    pub connected_since_ms: u64,
    pub meter: Meter,
    /// A consumer's acknowledged messages (`msgAckRate`) and the redeliveries it asked for
    /// (`msgRateRedeliver`).
    pub acks: Meter,
    pub redeliveries: Meter,
    /// Epoch ms of a consumer's last acknowledgement and of the last message sent to it.
    pub last_acked_ms: std::sync::atomic::AtomicU64,
    pub last_consumed_ms: std::sync::atomic::AtomicU64,
    /// The properties the client gave the producer or consumer (PRODUCER's and SUBSCRIBE's
    /// `metadata`): stats' `metadata`.
    pub metadata: BTreeMap<String, String>,
}

impl ClientInfo {
    /// A client at `address` (`ip:port`) that joined at `connected_since_ms`.
    pub fn new(address: &str, client_version: &str, connected_since_ms: u64) -> Self {
        ClientInfo {
            address: format!("/{address}"),
            client_version: client_version.to_string(),
            connected_since_ms,
            ..ClientInfo::default()
        }
    }

    /// With the producer's or consumer's own properties.
    pub fn with_metadata(mut self, metadata: &[magnetar_protocol::proto::KeyValue]) -> Self {
        self.metadata = metadata.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect();
        self
    }
}

/// Milliseconds since the epoch as Pulsar's `DateFormatter.format` writes them (ISO-8601
/// with milliseconds, UTC): `2024-05-01T12:34:56.789Z`.
pub fn format_time_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A position as Pulsar prints it: `ledger:entry`.
pub fn position_string(position: Position) -> String {
    format!("{}:{}", position.ledger_id, position.entry_id)
}

/// Acknowledged ranges after the mark-delete as Pulsar prints a cursor's
/// `individuallyDeletedMessages` (Guava open-closed ranges): `[(3:1..3:4], (3:6..3:8]]`.
/// A range's lower bound is the entry before its first (`l:-1` at a ledger's start).
pub fn individually_deleted_string(ranges: impl IntoIterator<Item = PositionRange>) -> String {
    let rendered: Vec<String> = ranges
        .into_iter()
        .map(|range| {
            let before = match range.first.entry_id {
                0 => format!("{}:-1", range.first.ledger_id),
                e => format!("{}:{}", range.first.ledger_id, e - 1),
            };
            format!("({before}..{}]", position_string(range.last))
        })
        .collect();
    format!("[{}]", rendered.join(", "))
}

/// `PublisherStatsImpl`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublisherStats {
    pub access_mode: String,
    pub msg_rate_in: f64,
    pub msg_throughput_in: f64,
    pub average_msg_size: f64,
    pub chunked_message_rate: f64,
    pub producer_id: u64,
    pub supports_partial_producer: bool,
    pub producer_name: String,
    pub address: String,
    pub connected_since: String,
    pub client_version: String,
    pub msg_in_counter: u64,
    pub bytes_in_counter: u64,
    pub metadata: BTreeMap<String, String>,
}

/// `ConsumerStatsImpl`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerStats {
    pub msg_rate_out: f64,
    pub msg_throughput_out: f64,
    pub bytes_out_counter: u64,
    pub msg_out_counter: u64,
    pub msg_rate_redeliver: f64,
    pub message_ack_rate: f64,
    pub chunked_message_rate: f64,
    pub consumer_name: String,
    /// The client's id for the consumer on its connection (`GET /metrics` labels it; not in
    /// Pulsar's JSON).
    #[serde(skip)]
    pub consumer_id: u64,
    pub available_permits: i64,
    pub unacked_messages: u64,
    pub avg_messages_per_entry: u64,
    pub blocked_consumer_on_unacked_msgs: bool,
    pub address: String,
    pub connected_since: String,
    pub client_version: String,
    pub last_acked_timestamp: u64,
    pub last_consumed_timestamp: u64,
    pub last_consumed_flow_timestamp: u64,
    pub metadata: BTreeMap<String, String>,
}

/// `SubscriptionStatsImpl`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionStats {
    pub msg_rate_out: f64,
    pub msg_throughput_out: f64,
    pub bytes_out_counter: u64,
    pub msg_out_counter: u64,
    pub msg_rate_redeliver: f64,
    pub message_ack_rate: f64,
    pub chunked_message_rate: f64,
    pub msg_backlog: u64,
    pub backlog_size: u64,
    pub earliest_msg_publish_time_in_backlog: u64,
    pub msg_backlog_no_delayed: u64,
    pub blocked_subscription_on_unacked_msgs: bool,
    pub msg_delayed: u64,
    pub unacked_messages: u64,
    #[serde(rename = "type")]
    pub sub_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_consumer_name: Option<String>,
    pub msg_rate_expired: f64,
    pub total_msg_expired: u64,
    pub last_expire_timestamp: u64,
    pub last_consumed_flow_timestamp: u64,
    pub last_consumed_timestamp: u64,
    pub last_acked_timestamp: u64,
    pub last_mark_delete_advanced_timestamp: u64,
    pub consumers: Vec<ConsumerStats>,
    pub is_durable: bool,
    pub is_replicated: bool,
    pub allow_out_of_order_delivery: bool,
    pub consumers_after_mark_delete_position: BTreeMap<String, String>,
    pub non_contiguous_deleted_messages_ranges: u64,
    pub non_contiguous_deleted_messages_ranges_serialized_size: u64,
    pub delayed_message_index_size_in_bytes: u64,
    pub subscription_properties: BTreeMap<String, String>,
    pub filter_processed_msg_count: u64,
    pub filter_accepted_msg_count: u64,
    pub filter_rejected_msg_count: u64,
    pub filter_rescheduled_msg_count: u64,
    /// Non-persistent subscriptions only (`NonPersistentSubscriptionStatsImpl`): messages
    /// dropped per second because the consumer they routed to had no permits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msg_drop_rate: Option<f64>,
}

/// `TopicStatsImpl` (and, with `metadata` and `partitions`, `PartitionedTopicStatsImpl`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicStats {
    pub msg_rate_in: f64,
    pub msg_throughput_in: f64,
    pub msg_rate_out: f64,
    pub msg_throughput_out: f64,
    pub bytes_in_counter: u64,
    pub msg_in_counter: u64,
    pub bytes_out_counter: u64,
    pub msg_out_counter: u64,
    pub average_msg_size: f64,
    pub msg_chunk_published: bool,
    pub storage_size: u64,
    pub backlog_size: u64,
    pub earliest_msg_publish_time_in_backlogs: u64,
    pub offloaded_storage_size: u64,
    pub publish_rate_limited_times: u64,
    pub publishers: Vec<PublisherStats>,
    pub waiting_publishers: u64,
    pub subscriptions: BTreeMap<String, SubscriptionStats>,
    pub replication: BTreeMap<String, serde_json::Value>,
    pub deduplication_status: String,
    pub non_contiguous_deleted_messages_ranges: u64,
    pub non_contiguous_deleted_messages_ranges_serialized_size: u64,
    pub delayed_message_index_size_in_bytes: u64,
    /// The last compaction run (Pulsar's `CompactionStatsImpl`).
    pub compaction: CompactionStats,
    /// Epoch ms of the last publish (0: none since the topic was loaded); partitioned stats
    /// take the latest partition's.
    pub last_publish_time_stamp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic_epoch: Option<u64>,
    /// Non-persistent topics only (`NonPersistentTopicStatsImpl`): messages dropped per second,
    /// over all subscriptions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msg_drop_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_broker: Option<String>,
    /// Partitioned stats only: `{"partitions": N}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// Partitioned stats with `perPartition`: each partition's stats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<BTreeMap<String, TopicStats>>,
}

impl TopicStats {
    /// Adds a partition's stats into aggregated ones, as Pulsar's
    /// `PartitionedTopicStatsImpl.add`: counters and rates summed, publishers listed,
    /// subscriptions merged by name (their consumers listed).
    pub fn add(&mut self, other: &TopicStats) {
        self.msg_rate_in += other.msg_rate_in;
        self.msg_throughput_in += other.msg_throughput_in;
        self.msg_rate_out += other.msg_rate_out;
        self.msg_throughput_out += other.msg_throughput_out;
        self.bytes_in_counter += other.bytes_in_counter;
        self.msg_in_counter += other.msg_in_counter;
        self.bytes_out_counter += other.bytes_out_counter;
        self.msg_out_counter += other.msg_out_counter;
        self.storage_size += other.storage_size;
        self.backlog_size += other.backlog_size;
        self.offloaded_storage_size += other.offloaded_storage_size;
        self.waiting_publishers += other.waiting_publishers;
        self.publish_rate_limited_times += other.publish_rate_limited_times;
        self.last_publish_time_stamp =
            self.last_publish_time_stamp.max(other.last_publish_time_stamp);
        self.msg_drop_rate = add_rates(self.msg_drop_rate, other.msg_drop_rate);
        self.non_contiguous_deleted_messages_ranges += other.non_contiguous_deleted_messages_ranges;
        self.msg_chunk_published |= other.msg_chunk_published;
        self.average_msg_size =
            if self.msg_rate_in > 0.0 { self.msg_throughput_in / self.msg_rate_in } else { 0.0 };
        if self.deduplication_status.is_empty() {
            self.deduplication_status = other.deduplication_status.clone();
        }
        self.publishers.extend(other.publishers.iter().cloned());
        for (name, sub) in &other.subscriptions {
            match self.subscriptions.get_mut(name) {
                None => {
                    self.subscriptions.insert(name.clone(), sub.clone());
                }
                Some(mine) => {
                    mine.msg_rate_out += sub.msg_rate_out;
                    mine.msg_throughput_out += sub.msg_throughput_out;
                    mine.bytes_out_counter += sub.bytes_out_counter;
                    mine.msg_out_counter += sub.msg_out_counter;
                    mine.msg_rate_redeliver += sub.msg_rate_redeliver;
                    mine.msg_drop_rate = add_rates(mine.msg_drop_rate, sub.msg_drop_rate);
                    mine.msg_backlog += sub.msg_backlog;
                    mine.backlog_size += sub.backlog_size;
                    mine.msg_backlog_no_delayed += sub.msg_backlog_no_delayed;
                    mine.msg_delayed += sub.msg_delayed;
                    mine.unacked_messages += sub.unacked_messages;
                    mine.non_contiguous_deleted_messages_ranges +=
                        sub.non_contiguous_deleted_messages_ranges;
                    mine.consumers.extend(sub.consumers.iter().cloned());
                }
            }
        }
    }
}

/// The sum of two rates that only some topics have (absent where neither has one).
fn add_rates(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

/// A ledger in `PersistentTopicInternalStats.ledgers` (`LedgerInfo`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerInfoStats {
    pub ledger_id: i64,
    pub entries: i64,
    pub size: i64,
    pub timestamp: i64,
    pub offloaded: bool,
    pub under_replicated: bool,
}

/// Topic stats' `compaction`: the last run's outcome (epoch ms; 0: never).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionStats {
    pub last_compaction_removed_event_count: u64,
    pub last_compaction_succeed_timestamp: u64,
    pub last_compaction_failed_timestamp: u64,
    pub last_compaction_duration_time_in_mills: u64,
}

/// A cursor in `PersistentTopicInternalStats.cursors` (`CursorStats`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CursorStats {
    pub mark_delete_position: String,
    pub read_position: String,
    pub waiting_read_op: bool,
    pub pending_read_ops: u64,
    pub messages_consumed_counter: i64,
    pub cursor_ledger: i64,
    pub cursor_ledger_last_entry: i64,
    pub individually_deleted_messages: String,
    pub last_ledger_switch_timestamp: String,
    pub state: String,
    pub active: bool,
    pub number_of_entries_since_first_not_acked_message: i64,
    pub total_non_contiguous_deleted_messages_range: u64,
    pub subscription_have_pending_read: bool,
    pub subscription_have_pending_replay_read: bool,
    pub properties: BTreeMap<String, i64>,
}

/// `PersistentTopicInternalStats` (`ManagedLedgerInternalStats` plus cursors).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InternalStats {
    pub entries_added_counter: u64,
    pub number_of_entries: u64,
    pub total_size: u64,
    pub current_ledger_entries: u64,
    pub current_ledger_size: u64,
    pub last_ledger_created_timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ledger_creation_failure_timestamp: Option<String>,
    pub waiting_cursors_count: u64,
    pub pending_add_entries_count: u64,
    pub last_confirmed_entry: String,
    pub state: String,
    pub ledgers: Vec<LedgerInfoStats>,
    pub cursors: BTreeMap<String, CursorStats>,
    pub schema_ledgers: Vec<LedgerInfoStats>,
    pub compacted_ledger: LedgerInfoStats,
}

/// A stored entry as the admin API returns it (peek, examine, get by id): Pulsar's
/// `X-Pulsar-*` headers and the payload (a batch's payload holds its messages, each with its
/// single-message metadata, as clients parse it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminMessage {
    pub position: Position,
    pub headers: Vec<(String, String)>,
    pub payload: bytes::Bytes,
}

impl AdminMessage {
    /// The headers Pulsar's `generateResponseWithEntry` sets, from the entry's metadata. An
    /// entry whose metadata does not parse is returned whole, with its id only.
    pub fn from_entry(position: Position, entry: &bytes::Bytes) -> AdminMessage {
        let mut headers = vec![("X-Pulsar-Message-ID".to_string(), position_string(position))];
        let Ok((metadata, payload)) = magnetar_protocol::parse_metadata_and_payload(entry) else {
            return AdminMessage { position, headers, payload: entry.clone() };
        };
        for property in &metadata.properties {
            headers.push((format!("X-Pulsar-PROPERTY-{}", property.key), property.value.clone()));
        }
        headers.push(("X-Pulsar-publish-time".into(), format_time_ms(metadata.publish_time)));
        if let Some(event_time) = metadata.event_time.filter(|&t| t > 0) {
            headers.push(("X-Pulsar-event-time".into(), format_time_ms(event_time)));
        }
        if let Some(at) = metadata.deliver_at_time.filter(|&t| t > 0) {
            headers.push(("X-Pulsar-deliver-at-time".into(), format_time_ms(at as u64)));
        }
        if let Some(count) = metadata.num_messages_in_batch {
            headers.push(("X-Pulsar-num-batch-message".into(), count.to_string()));
            headers.push(("X-Pulsar-batch-size".into(), payload.len().to_string()));
        }
        headers.push(("X-Pulsar-producer-name".into(), metadata.producer_name.clone()));
        headers.push(("X-Pulsar-sequence-id".into(), metadata.sequence_id.to_string()));
        if let Some(key) = &metadata.partition_key {
            headers.push(("X-Pulsar-partition-key".into(), key.clone()));
        }
        if let Some(size) = metadata.uncompressed_size {
            headers.push(("X-Pulsar-uncompressed-size".into(), size.to_string()));
        }
        // Headers must be visible ASCII: anything else is left out rather than sent mangled.
        headers.retain(|(name, value)| {
            name.bytes().all(|b| b.is_ascii_graphic())
                && value.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
        });
        AdminMessage { position, headers, payload }
    }
}

/// Pulsar's subscription type names.
pub fn sub_type_name(sub_type: magnetar_protocol::proto::command_subscribe::SubType) -> String {
    use magnetar_protocol::proto::command_subscribe::SubType;
    match sub_type {
        SubType::Exclusive => "Exclusive",
        SubType::Shared => "Shared",
        SubType::Failover => "Failover",
        SubType::KeyShared => "Key_Shared",
    }
    .to_string()
}

/// Pulsar's producer access mode names.
pub fn access_mode_name(mode: magnetar_protocol::proto::ProducerAccessMode) -> String {
    use magnetar_protocol::proto::ProducerAccessMode;
    match mode {
        ProducerAccessMode::Shared => "Shared",
        ProducerAccessMode::Exclusive => "Exclusive",
        ProducerAccessMode::WaitForExclusive => "WaitForExclusive",
        ProducerAccessMode::ExclusiveWithFencing => "ExclusiveWithFencing",
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_deltas_over_at_least_the_minimum_window() {
        let clock = crate::clock::ManualClock::new(0);
        let start = crate::clock::Clock::now(&clock);
        let meter = Meter::starting_at(start);
        meter.record(10, 1000);
        // Too early for a new sample: the previous (zero) rates and the live counters.
        let early = meter.read_at(start + Duration::from_millis(500));
        assert_eq!((early.messages, early.bytes, early.rate), (10, 1000, 0.0));
        let first = meter.read_at(start + Duration::from_secs(2));
        assert_eq!((first.rate, first.throughput), (5.0, 500.0));
        meter.record(4, 40);
        // Within the window the rates stay; after it they cover only the new delta.
        assert_eq!(meter.read_at(start + Duration::from_millis(2500)).rate, 5.0);
        let second = meter.read_at(start + Duration::from_secs(4));
        assert_eq!((second.messages, second.rate, second.throughput), (14, 2.0, 20.0));
    }

    #[test]
    fn a_meter_without_a_start_takes_its_first_sample_at_the_first_reading() {
        let clock = crate::clock::ManualClock::new(0);
        let start = crate::clock::Clock::now(&clock);
        let meter = Meter::new();
        meter.record(3, 30);
        assert_eq!(meter.read_at(start).rate, 0.0);
        meter.record(2, 20);
        let later = meter.read_at(start + Duration::from_secs(2));
        assert_eq!((later.messages, later.rate, later.throughput), (5, 1.0, 10.0));
    }

    #[test]
    fn formats_times_like_pulsars_date_formatter() {
        assert_eq!(format_time_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time_ms(1_709_210_096_789), "2024-02-29T12:34:56.789Z");
        assert_eq!(format_time_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn individually_deleted_ranges_are_open_closed() {
        let ranges = vec![
            PositionRange { first: Position::new(3, 0), last: Position::new(3, 2) },
            PositionRange { first: Position::new(3, 5), last: Position::new(4, 1) },
        ];
        assert_eq!(individually_deleted_string(ranges), "[(3:-1..3:2], (3:4..4:1]]");
        assert_eq!(individually_deleted_string(Vec::new()), "[]");
    }

    #[test]
    fn partition_stats_add_up_and_subscriptions_merge_by_name() {
        let mut sub = SubscriptionStats { msg_backlog: 3, ..Default::default() };
        sub.consumers.push(ConsumerStats::default());
        let part = TopicStats {
            msg_in_counter: 5,
            msg_rate_in: 2.0,
            msg_throughput_in: 200.0,
            storage_size: 10,
            subscriptions: BTreeMap::from([("s".to_string(), sub)]),
            publishers: vec![PublisherStats::default()],
            ..Default::default()
        };
        let mut total = TopicStats::default();
        total.add(&part);
        total.add(&part);
        assert_eq!((total.msg_in_counter, total.storage_size), (10, 20));
        assert_eq!(total.average_msg_size, 100.0);
        assert_eq!(total.publishers.len(), 2);
        assert_eq!(total.subscriptions["s"].msg_backlog, 6);
        assert_eq!(total.subscriptions["s"].consumers.len(), 2);
    }
}
