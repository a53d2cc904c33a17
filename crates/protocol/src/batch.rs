//! Batch payloads: splitting an (uncompressed) batch into its messages and
//! building one.
//!
//! A batch entry has `MessageMetadata.num_messages_in_batch = N` and a
//! payload made of N back-to-back records:
//!
//! ```text
//!  +----------------+-----------------------+----------------------+
//!  | singleMetaSize | SingleMessageMetadata | payload              |
//!  |      u32 BE    | (singleMetaSize bytes)| (payload_size bytes) |
//!  +----------------+-----------------------+----------------------+
//!  ... repeated N times
//! ```
//!
//! `payload_size` is a field of the `SingleMessageMetadata`. Compression,
//! when used, applies to the whole concatenation and must be undone before
//! parsing (not this crate's job).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{encode_varint, encoded_len_varint};
use prost::Message;

use crate::constants::{
    CHECKSUM_LEN, COMMAND_SIZE_FIELD_LEN, FRAME_SIZE_FIELD_LEN, MAGIC_CRC32C, MAGIC_LEN,
    METADATA_SIZE_FIELD_LEN, SINGLE_METADATA_SIZE_FIELD_LEN,
};
use crate::error::{BatchError, EncodeError};
use crate::frame::decode::read_u32;
use crate::frame::encode::{encode_payload_command, metadata_and_payload, wire_u32};
use crate::proto::{BaseCommand, MessageMetadata, SingleMessageMetadata};

/// One message of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchMessage {
    /// Per-message metadata.
    pub metadata: SingleMessageMetadata,
    /// Zero-copy view of the message payload.
    pub payload: Bytes,
}

/// Iterator over the messages of a batch payload.
///
/// Yields exactly `num_messages` items unless an error occurs; after the
/// first error it yields nothing more. Bytes left after the last message
/// are not an error (see [`BatchIter::remaining_bytes`]).
#[derive(Debug, Clone)]
pub struct BatchIter {
    buf: Bytes,
    offset: usize,
    index: u32,
    num_messages: u32,
    failed: bool,
}

impl BatchIter {
    /// Iterates over `num_messages` records of `payload`.
    pub fn new(payload: Bytes, num_messages: u32) -> Self {
        Self { buf: payload, offset: 0, index: 0, num_messages, failed: false }
    }

    /// Bytes of the batch payload not consumed yet.
    pub fn remaining_bytes(&self) -> usize {
        self.buf.len().saturating_sub(self.offset)
    }

    fn next_message(&mut self) -> Result<BatchMessage, BatchError> {
        let index = self.index;
        let len = self.buf.len();
        let offset = self.offset;
        let available = len.saturating_sub(offset);

        let size = read_u32(&self.buf, offset).ok_or(BatchError::TruncatedHeader {
            index,
            offset,
            available,
        })?;
        let meta_start = offset + SINGLE_METADATA_SIZE_FIELD_LEN;
        let meta_available = len.saturating_sub(meta_start);
        let meta_end = usize::try_from(size)
            .ok()
            .filter(|&s| s <= meta_available)
            .map(|s| meta_start + s)
            .ok_or(BatchError::MetadataSizeExceedsBatch {
                index,
                offset: meta_start,
                size,
                available: meta_available,
            })?;
        let metadata = SingleMessageMetadata::decode(self.buf.slice(meta_start..meta_end))
            .map_err(|source| BatchError::MetadataDecode { index, offset: meta_start, source })?;

        let payload_size = metadata.payload_size;
        let payload_available = len.saturating_sub(meta_end);
        let payload_len = usize::try_from(payload_size)
            .map_err(|_| BatchError::NegativePayloadSize { index, size: payload_size })?;
        if payload_len > payload_available {
            return Err(BatchError::PayloadExceedsBatch {
                index,
                offset: meta_end,
                size: payload_size,
                available: payload_available,
            });
        }
        let payload_end = meta_end + payload_len;
        let payload = self.buf.slice(meta_end..payload_end);
        self.offset = payload_end;
        Ok(BatchMessage { metadata, payload })
    }
}

impl Iterator for BatchIter {
    type Item = Result<BatchMessage, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.index >= self.num_messages {
            return None;
        }
        let item = self.next_message();
        match item {
            Ok(_) => self.index += 1,
            Err(_) => self.failed = true,
        }
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.failed {
            return (0, Some(0));
        }
        let left = self.num_messages.saturating_sub(self.index) as usize;
        // Each record needs at least its 4-byte size field.
        let by_bytes = self.remaining_bytes() / SINGLE_METADATA_SIZE_FIELD_LEN;
        (0, Some(left.min(by_bytes.saturating_add(1))))
    }
}

/// Iterates over the `num_messages` messages of an uncompressed batch payload.
pub fn parse_batch(payload: Bytes, num_messages: u32) -> BatchIter {
    BatchIter::new(payload, num_messages)
}

/// Splits a whole batch payload, failing on the first malformed message.
pub fn collect_batch(payload: Bytes, num_messages: u32) -> Result<Vec<BatchMessage>, BatchError> {
    parse_batch(payload, num_messages).collect()
}

/// Builds a batch payload record by record.
///
/// Use [`BatchBuilder::len`] as `MessageMetadata.num_messages_in_batch`
/// and `CommandSend.num_messages`.
#[derive(Debug, Clone, Default)]
pub struct BatchBuilder {
    /// `headroom` bytes kept free, then the records.
    buf: BytesMut,
    headroom: usize,
    count: u32,
}

/// The per-message fields a producer sets, borrowed: [`BatchBuilder::push_fields`] encodes
/// them as a `SingleMessageMetadata` without building one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageFields<'a> {
    /// `partition_key`.
    pub partition_key: Option<&'a str>,
    /// `event_time`, milliseconds since the epoch.
    pub event_time: Option<u64>,
    /// `sequence_id`.
    pub sequence_id: Option<u64>,
}

// SingleMessageMetadata field keys (field number << 3 | wire type).
const KEY_PROPERTIES: u64 = 1 << 3 | 2;
const KEY_PARTITION_KEY: u64 = 2 << 3 | 2;
const KEY_PAYLOAD_SIZE: u64 = 3 << 3;
const KEY_EVENT_TIME: u64 = 5 << 3;
const KEY_SEQUENCE_ID: u64 = 8 << 3;
// KeyValue field keys.
const KEY_KV_KEY: u64 = 1 << 3 | 2;
const KEY_KV_VALUE: u64 = 2 << 3 | 2;

impl BatchBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty builder with room for `capacity` bytes of records, and `headroom` bytes kept
    /// free in front of them so that [`BatchBuilder::into_send_frame`] can put the frame
    /// header and message metadata there instead of copying the records behind them.
    pub fn with_headroom(headroom: usize, capacity: usize) -> Self {
        let mut buf = BytesMut::with_capacity(headroom + capacity);
        buf.resize(headroom, 0);
        Self { buf, headroom, count: 0 }
    }

    /// Appends one message. `metadata.payload_size` is set from `payload`.
    pub fn push(
        &mut self,
        mut metadata: SingleMessageMetadata,
        payload: &[u8],
    ) -> Result<&mut Self, EncodeError> {
        metadata.payload_size = payload_size(payload)?;
        let count = self.next_count()?;
        let metadata_len = metadata.encoded_len();
        let metadata_size = wire_u32("single message metadata", metadata_len)?;
        self.buf.reserve(SINGLE_METADATA_SIZE_FIELD_LEN + metadata_len + payload.len());
        self.buf.put_u32(metadata_size);
        metadata.encode_raw(&mut self.buf);
        self.buf.extend_from_slice(payload);
        self.count = count;
        Ok(self)
    }

    /// Appends one message with these fields and `properties`: the same bytes as
    /// [`BatchBuilder::push`] of the equivalent `SingleMessageMetadata`, without building it
    /// (a producer's per-message cost at millions of messages a second).
    pub fn push_fields<'p>(
        &mut self,
        fields: MessageFields<'_>,
        properties: impl IntoIterator<Item = (&'p str, &'p str)>,
        payload: &[u8],
    ) -> Result<&mut Self, EncodeError> {
        let size = payload_size(payload)?;
        let count = self.next_count()?;
        let start = self.buf.len();
        let buf = &mut self.buf;
        buf.reserve(SINGLE_METADATA_SIZE_FIELD_LEN + 32 + payload.len());
        buf.put_u32(0); // the metadata size, patched below
        for (key, value) in properties {
            let kv_len = string_field_len(key) + string_field_len(value);
            encode_varint(KEY_PROPERTIES, buf);
            encode_varint(kv_len as u64, buf);
            put_string_field(KEY_KV_KEY, key, buf);
            put_string_field(KEY_KV_VALUE, value, buf);
        }
        if let Some(key) = fields.partition_key {
            put_string_field(KEY_PARTITION_KEY, key, buf);
        }
        encode_varint(KEY_PAYLOAD_SIZE, buf);
        encode_varint(size as u64, buf);
        if let Some(time) = fields.event_time {
            encode_varint(KEY_EVENT_TIME, buf);
            encode_varint(time, buf);
        }
        if let Some(id) = fields.sequence_id {
            encode_varint(KEY_SEQUENCE_ID, buf);
            encode_varint(id, buf);
        }
        let metadata_len = buf.len() - start - SINGLE_METADATA_SIZE_FIELD_LEN;
        let metadata_size = match wire_u32("single message metadata", metadata_len) {
            Ok(size) => size,
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        };
        buf[start..start + SINGLE_METADATA_SIZE_FIELD_LEN]
            .copy_from_slice(&metadata_size.to_be_bytes());
        buf.extend_from_slice(payload);
        self.count = count;
        Ok(self)
    }

    fn next_count(&self) -> Result<u32, EncodeError> {
        self.count.checked_add(1).ok_or(EncodeError::TooLarge {
            what: "batch message count",
            size: u64::from(self.count) + 1,
            max: u64::from(u32::MAX),
        })
    }

    /// Number of messages pushed so far.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Whether no message was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Size in bytes of the batch payload built so far.
    pub fn byte_len(&self) -> usize {
        self.buf.len() - self.headroom
    }

    /// The batch payload.
    pub fn finish(mut self) -> Bytes {
        self.buf.advance(self.headroom);
        self.buf.freeze()
    }

    /// The complete payload frame (e.g. SEND) carrying this batch, uncompressed, as
    /// `metadata`: the same bytes as [`encode_payload_command`] of
    /// [`metadata_and_payload`]`(metadata, finish())`. Written into the headroom when it is
    /// large enough (the records are not copied), else built by copying once.
    pub fn into_send_frame(
        mut self,
        command: &BaseCommand,
        metadata: &MessageMetadata,
    ) -> Result<Bytes, EncodeError> {
        let metadata_len = metadata.encoded_len();
        let command_len = command.encoded_len();
        let entry_head = METADATA_SIZE_FIELD_LEN + metadata_len;
        let frame_head =
            FRAME_SIZE_FIELD_LEN + COMMAND_SIZE_FIELD_LEN + command_len + MAGIC_LEN + CHECKSUM_LEN;
        if frame_head + entry_head > self.headroom {
            let entry = metadata_and_payload(metadata, &self.finish())?;
            let mut out = BytesMut::new();
            encode_payload_command(command, None, &entry, &mut out)?;
            return Ok(out.freeze());
        }
        let metadata_size = wire_u32("message metadata", metadata_len)?;
        let command_size = wire_u32("command", command_len)?;
        let total = (self.buf.len() - self.headroom)
            .saturating_add(frame_head - FRAME_SIZE_FIELD_LEN + entry_head);
        let total_size = wire_u32("frame", total)?;
        // [metadataSize][MessageMetadata] right before the records: the entry the checksum covers.
        let entry_start = self.headroom - entry_head;
        let mut at = &mut self.buf[entry_start..self.headroom];
        at.put_u32(metadata_size);
        metadata.encode_raw(&mut at);
        let checksum = crc32c::crc32c(&self.buf[entry_start..]);
        let start = entry_start - frame_head;
        let mut at = &mut self.buf[start..entry_start];
        at.put_u32(total_size);
        at.put_u32(command_size);
        command.encode_raw(&mut at);
        at.put_u16(MAGIC_CRC32C);
        at.put_u32(checksum);
        self.buf.advance(start);
        Ok(self.buf.freeze())
    }
}

fn payload_size(payload: &[u8]) -> Result<i32, EncodeError> {
    i32::try_from(payload.len()).map_err(|_| EncodeError::TooLarge {
        what: "batch message payload",
        size: payload.len() as u64,
        max: i32::MAX as u64,
    })
}

/// Encoded length of a string field (key, length, bytes).
fn string_field_len(s: &str) -> usize {
    1 + encoded_len_varint(s.len() as u64) + s.len()
}

fn put_string_field(key: u64, s: &str, buf: &mut BytesMut) {
    encode_varint(key, buf);
    encode_varint(s.len() as u64, buf);
    buf.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::KeyValue;

    fn be32(v: u32) -> [u8; 4] {
        v.to_be_bytes()
    }

    fn meta(key: &str) -> SingleMessageMetadata {
        SingleMessageMetadata {
            properties: vec![KeyValue { key: "k".into(), value: key.into() }],
            partition_key: Some(key.into()),
            sequence_id: Some(7),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let mut b = BatchBuilder::new();
        assert!(b.is_empty());
        b.push(meta("a"), b"first").unwrap();
        b.push(meta("b"), b"").unwrap();
        b.push(SingleMessageMetadata { null_value: Some(true), ..Default::default() }, b"")
            .unwrap();
        b.push(meta("d"), &[0xff; 1000]).unwrap();
        assert_eq!(b.len(), 4);
        let bytes_len = b.byte_len();
        let payload = b.finish();
        assert_eq!(payload.len(), bytes_len);

        let msgs = collect_batch(payload.clone(), 4).unwrap();
        assert_eq!(msgs.len(), 4);
        assert_eq!(msgs[0].metadata.partition_key.as_deref(), Some("a"));
        assert_eq!(msgs[0].metadata.payload_size, 5);
        assert_eq!(&msgs[0].payload[..], b"first");
        assert!(msgs[1].payload.is_empty());
        assert!(msgs[2].metadata.null_value());
        assert_eq!(msgs[3].payload.len(), 1000);

        // Zero-copy views into the batch buffer.
        assert!(payload.as_ptr_range().contains(&msgs[3].payload.as_ptr()));

        // Fewer messages than present: stops early, leftovers reported.
        let mut it = parse_batch(payload, 1);
        assert!(it.next().unwrap().is_ok());
        assert!(it.next().is_none());
        assert!(it.remaining_bytes() > 1000);
    }

    #[test]
    fn hand_encoded_batch() {
        // SingleMessageMetadata { payload_size: 2 } = 18 02
        // SingleMessageMetadata { partition_key: "k", payload_size: 1 } = 12 01 6b 18 01
        let payload =
            [&be32(2)[..], &[0x18, 0x02], b"hi", &be32(5), &[0x12, 0x01, b'k', 0x18, 0x01], b"!"]
                .concat();
        let msgs = collect_batch(Bytes::from(payload), 2).unwrap();
        assert_eq!(&msgs[0].payload[..], b"hi");
        assert_eq!(msgs[1].metadata.partition_key.as_deref(), Some("k"));
        assert_eq!(&msgs[1].payload[..], b"!");

        // And the builder writes exactly these bytes for the same input.
        let mut b = BatchBuilder::new();
        b.push(SingleMessageMetadata::default(), b"hi").unwrap();
        b.push(
            SingleMessageMetadata { partition_key: Some("k".into()), ..Default::default() },
            b"!",
        )
        .unwrap();
        let built = b.finish();
        let again = collect_batch(built.clone(), 2).unwrap();
        assert_eq!(again, msgs);
        assert_eq!(built.len(), 4 + 2 + 2 + 4 + 5 + 1);
    }

    #[test]
    fn empty_batch() {
        assert!(collect_batch(Bytes::new(), 0).unwrap().is_empty());
        assert_eq!(
            collect_batch(Bytes::new(), 1),
            Err(BatchError::TruncatedHeader { index: 0, offset: 0, available: 0 })
        );
    }

    #[test]
    fn malformed_batches() {
        let one = {
            let mut b = BatchBuilder::new();
            b.push(meta("a"), b"xyz").unwrap();
            b.finish()
        };

        // Claims two messages, holds one.
        let mut it = parse_batch(one.clone(), 2);
        assert!(it.next().unwrap().is_ok());
        assert_eq!(
            it.next().unwrap(),
            Err(BatchError::TruncatedHeader { index: 1, offset: one.len(), available: 0 })
        );
        assert!(it.next().is_none(), "iterator fuses after an error");

        // Truncated size field.
        assert!(matches!(
            collect_batch(Bytes::from_static(&[0, 0, 1]), 1),
            Err(BatchError::TruncatedHeader { available: 3, .. })
        ));

        // Metadata size past the end.
        let bad = [&be32(100)[..], &[0x18, 0x00]].concat();
        assert_eq!(
            collect_batch(Bytes::from(bad), 1),
            Err(BatchError::MetadataSizeExceedsBatch {
                index: 0,
                offset: 4,
                size: 100,
                available: 2
            })
        );
        assert!(matches!(
            collect_batch(Bytes::from(be32(u32::MAX).to_vec()), 1),
            Err(BatchError::MetadataSizeExceedsBatch { .. })
        ));

        // Malformed protobuf.
        let bad = [&be32(2)[..], &[0x12, 0x05]].concat();
        assert!(matches!(
            collect_batch(Bytes::from(bad), 1),
            Err(BatchError::MetadataDecode { index: 0, offset: 4, .. })
        ));

        // Negative payload size (-1 as a 10-byte varint).
        let neg = [0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        let bad = [&be32(neg.len() as u32)[..], &neg].concat();
        assert_eq!(
            collect_batch(Bytes::from(bad), 1),
            Err(BatchError::NegativePayloadSize { index: 0, size: -1 })
        );

        // Payload size past the end.
        let bad = [&be32(2)[..], &[0x18, 0x09], b"abc"].concat();
        assert_eq!(
            collect_batch(Bytes::from(bad), 1),
            Err(BatchError::PayloadExceedsBatch { index: 0, offset: 6, size: 9, available: 3 })
        );

        // Second message broken: first still yielded.
        let mut two = one.to_vec();
        two.extend_from_slice(&[0, 0, 0, 9]);
        let items: Vec<_> = parse_batch(Bytes::from(two), 2).collect();
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert!(matches!(items[1], Err(BatchError::MetadataSizeExceedsBatch { index: 1, .. })));
    }

    #[test]
    fn huge_count_on_small_input_is_cheap() {
        let it = parse_batch(Bytes::from_static(&[0, 0, 0, 0]), u32::MAX);
        assert!(it.size_hint().1.unwrap() <= 2);
        // payload_size 0 with empty metadata: one valid empty message, then an error.
        let items: Vec<_> = parse_batch(Bytes::from_static(&[0, 0, 0, 0]), u32::MAX).collect();
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert!(items[1].is_err());
    }

    #[test]
    fn push_fields_writes_what_push_writes() {
        let properties = [("a", "1"), ("key with spaces", ""), ("", "v")];
        let long_key = "k".repeat(300);
        let cases = [
            MessageFields::default(),
            MessageFields { sequence_id: Some(0), ..Default::default() },
            MessageFields {
                sequence_id: Some(u64::MAX),
                event_time: Some(1 << 40),
                ..Default::default()
            },
            MessageFields {
                partition_key: Some(&long_key),
                sequence_id: Some(300),
                event_time: None,
            },
        ];
        for fields in cases {
            for (n, payload) in [(0, &b""[..]), (3, &[7u8; 200][..])] {
                let props = &properties[..n];
                let mut by_fields = BatchBuilder::new();
                by_fields.push_fields(fields, props.iter().copied(), payload).unwrap();
                let mut by_struct = BatchBuilder::new();
                let metadata = SingleMessageMetadata {
                    properties: props
                        .iter()
                        .map(|(k, v)| KeyValue { key: k.to_string(), value: v.to_string() })
                        .collect(),
                    partition_key: fields.partition_key.map(str::to_string),
                    event_time: fields.event_time,
                    sequence_id: fields.sequence_id,
                    ..Default::default()
                };
                by_struct.push(metadata.clone(), payload).unwrap();
                assert_eq!(by_fields.finish(), by_struct.finish(), "{fields:?} {n}");
            }
        }
    }

    #[test]
    fn send_frame_in_the_headroom_matches_the_copying_encoder() {
        use crate::frame::encode::{encode_payload_command, metadata_and_payload};
        let command = crate::commands::send(3, 1000, 2);
        let metadata = MessageMetadata {
            producer_name: "p-1".into(),
            sequence_id: 1000,
            publish_time: 1_700_000_000_000,
            num_messages_in_batch: Some(2),
            ..Default::default()
        };
        // Enough headroom (written in place), and too little (copied), give the same frame.
        for headroom in [0, 16, 256] {
            let mut b = BatchBuilder::with_headroom(headroom, 64);
            b.push_fields(
                MessageFields { sequence_id: Some(1000), ..Default::default() },
                [],
                b"x",
            )
            .unwrap();
            b.push(meta("y"), &[1; 100]).unwrap();
            assert_eq!(b.byte_len(), b.clone().finish().len());
            let expected = {
                let entry = metadata_and_payload(&metadata, &b.clone().finish()).unwrap();
                let mut out = BytesMut::new();
                encode_payload_command(&command, None, &entry, &mut out).unwrap();
                out.freeze()
            };
            let framed = b.into_send_frame(&command, &metadata).unwrap();
            assert_eq!(framed, expected, "headroom {headroom}");
            let decoded = crate::FrameDecoder::default().decode(&framed).unwrap();
            let (_, used) = decoded.expect("one whole frame");
            assert_eq!(used, framed.len());
        }
    }

    #[test]
    fn payload_size_is_overwritten_by_builder() {
        let mut b = BatchBuilder::new();
        let mut m = meta("x");
        m.payload_size = 12345;
        b.push(m, b"ab").unwrap();
        let msgs = collect_batch(b.finish(), 1).unwrap();
        assert_eq!(msgs[0].metadata.payload_size, 2);
    }
}
