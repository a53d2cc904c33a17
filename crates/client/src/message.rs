//! Message ids, outgoing messages and received messages.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use magnetar_protocol::proto::MessageIdData;

/// Position of a message in a topic: ledger, entry, partition and, for
/// messages of a batch, their index in the batch.
///
/// Ordering compares `(ledger_id, entry_id, batch_index)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageId {
    /// Ledger holding the entry.
    pub ledger_id: u64,
    /// Entry within the ledger.
    pub entry_id: u64,
    /// Partition index, -1 for a non-partitioned topic.
    pub partition: i32,
    /// Index within the batch, -1 when the entry is not a batch.
    pub batch_index: i32,
    /// Number of messages in the batch, 0 when the entry is not a batch.
    pub batch_size: i32,
}

impl MessageId {
    /// The first message of a topic (Pulsar's `MessageId.earliest`, `(-1, -1)`).
    pub const fn earliest() -> Self {
        Self {
            ledger_id: u64::MAX,
            entry_id: u64::MAX,
            partition: -1,
            batch_index: -1,
            batch_size: 0,
        }
    }

    /// Past the last message of a topic (Pulsar's `MessageId.latest`).
    pub const fn latest() -> Self {
        Self {
            ledger_id: i64::MAX as u64,
            entry_id: i64::MAX as u64,
            partition: -1,
            batch_index: -1,
            batch_size: 0,
        }
    }

    /// A message id for a non-batched entry.
    pub const fn new(ledger_id: u64, entry_id: u64, partition: i32) -> Self {
        Self { ledger_id, entry_id, partition, batch_index: -1, batch_size: 0 }
    }

    /// From the wire form.
    pub fn from_wire(id: &MessageIdData) -> Self {
        Self {
            ledger_id: id.ledger_id,
            entry_id: id.entry_id,
            partition: id.partition(),
            batch_index: id.batch_index(),
            batch_size: id.batch_size(),
        }
    }

    /// The wire form.
    pub fn to_wire(&self) -> MessageIdData {
        MessageIdData {
            ledger_id: self.ledger_id,
            entry_id: self.entry_id,
            partition: (self.partition >= 0).then_some(self.partition),
            batch_index: (self.batch_index >= 0).then_some(self.batch_index),
            batch_size: (self.batch_size > 0).then_some(self.batch_size),
            ..Default::default()
        }
    }

    /// The id of the whole entry (batch index dropped).
    pub(crate) fn entry(&self) -> MessageIdData {
        MessageIdData {
            ledger_id: self.ledger_id,
            entry_id: self.entry_id,
            partition: (self.partition >= 0).then_some(self.partition),
            ..Default::default()
        }
    }

    fn key(&self) -> (u64, u64, i32) {
        (self.ledger_id, self.entry_id, self.batch_index)
    }
}

impl PartialOrd for MessageId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for MessageId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key()).then(self.partition.cmp(&other.partition))
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}:{}", self.ledger_id, self.entry_id, self.partition, self.batch_index)
    }
}

/// A message to publish. Build one from bytes and add optional fields:
///
/// ```
/// use magnetar_client::ProducerMessage;
/// let msg = ProducerMessage::new("hello")
///     .key("user-42")
///     .property("origin", "doc")
///     .event_time(1_700_000_000_000);
/// assert_eq!(&msg.payload[..], b"hello");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProducerMessage {
    /// The payload.
    pub payload: Bytes,
    /// Partition key: routes the message on partitioned topics and is
    /// visible to consumers.
    pub key: Option<String>,
    /// Application properties.
    pub properties: BTreeMap<String, String>,
    /// Application event time, milliseconds since the epoch.
    pub event_time: Option<u64>,
}

impl ProducerMessage {
    /// A message with this payload.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self { payload: payload.into(), ..Default::default() }
    }

    /// Sets the partition key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a property.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Sets the event time (ms since the epoch).
    pub fn event_time(mut self, millis: u64) -> Self {
        self.event_time = Some(millis);
        self
    }
}

impl From<Vec<u8>> for ProducerMessage {
    fn from(v: Vec<u8>) -> Self {
        Self::new(v)
    }
}

impl From<&'static [u8]> for ProducerMessage {
    fn from(v: &'static [u8]) -> Self {
        Self::new(v)
    }
}

impl From<&'static str> for ProducerMessage {
    fn from(v: &'static str) -> Self {
        Self::new(v)
    }
}

impl From<String> for ProducerMessage {
    fn from(v: String) -> Self {
        Self::new(v)
    }
}

impl From<Bytes> for ProducerMessage {
    fn from(v: Bytes) -> Self {
        Self::new(v)
    }
}

/// A received message (one message of a batch, already decompressed).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Its id (with batch index for batched messages).
    pub id: MessageId,
    /// The topic (partition) it came from.
    pub topic: String,
    /// The payload.
    pub payload: Bytes,
    /// Partition key, if any.
    pub key: Option<String>,
    /// Application properties.
    pub properties: BTreeMap<String, String>,
    /// Event time (ms since the epoch), if the producer set one.
    pub event_time: Option<u64>,
    /// Publish time (ms since the epoch) set by the producer.
    pub publish_time: u64,
    /// Name of the producer.
    pub producer_name: String,
    /// Sequence id set by the producer.
    pub sequence_id: u64,
    /// How many times the broker redelivered it.
    pub redelivery_count: u32,
    pub(crate) consumer_id: u64,
}

impl Message {
    /// The payload as UTF-8 text, if it is.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_order_and_convert() {
        let a = MessageId::new(1, 2, -1);
        let mut b = a;
        b.batch_index = 3;
        b.batch_size = 5;
        assert!(a < b);
        assert!(MessageId::new(1, 3, -1) > b);
        assert_eq!(MessageId::from_wire(&b.to_wire()), b);
        assert_eq!(MessageId::from_wire(&MessageId::earliest().to_wire()), MessageId::earliest());
        assert_eq!(b.entry().batch_index, None);
    }
}
