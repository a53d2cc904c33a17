//! Incremental, panic-free frame decoder: turns buffered bytes into
//! [`Frame`]s, verifying sizes and the CRC32C checksum.
//!
//! Every read from input is bounds-checked (`get`, checked arithmetic);
//! malformed input yields a [`FrameError`], never a panic.

use bytes::{Bytes, BytesMut};
use prost::Message;

use super::{Frame, PayloadSection};
use crate::constants::{
    max_frame_size_for, BROKER_ENTRY_METADATA_SIZE_FIELD_LEN, CHECKSUM_LEN, COMMAND_SIZE_FIELD_LEN,
    DEFAULT_MAX_FRAME_SIZE, FRAME_SIZE_FIELD_LEN, MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C,
    MAGIC_LEN, METADATA_SIZE_FIELD_LEN,
};
use crate::error::FrameError;
use crate::proto::{base_command, BaseCommand, BrokerEntryMetadata, MessageMetadata};

/// Offset of the `BaseCommand` bytes inside a frame.
const COMMAND_OFFSET: usize = FRAME_SIZE_FIELD_LEN + COMMAND_SIZE_FIELD_LEN;

/// Splits a byte stream into frames and decodes them.
///
/// The decoder holds no partial state: call it again with the same (grown)
/// buffer when more bytes arrive. Three flavours share the same rules:
///
/// * [`FrameDecoder::decode_buf`] works on a `BytesMut` read buffer,
///   removes the frame from it and is zero-copy;
/// * [`FrameDecoder::decode_bytes`] works on a `Bytes` and is zero-copy;
/// * [`FrameDecoder::decode`] works on any `&[u8]` and copies the one frame
///   it decodes.
///
/// Frame length is checked against the maximum frame size (which includes
/// the 4-byte `totalSize` field, like Pulsar's Netty frame decoder) as soon
/// as the first 4 bytes are available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDecoder {
    max_frame_size: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME_SIZE)
    }
}

impl FrameDecoder {
    /// A decoder accepting frames of at most `max_frame_size` bytes,
    /// counting the `totalSize` field.
    pub const fn new(max_frame_size: usize) -> Self {
        Self { max_frame_size }
    }

    /// A decoder for a given maximum message size: the frame limit is that
    /// size plus [`crate::constants::MESSAGE_SIZE_FRAME_PADDING`].
    pub const fn with_max_message_size(max_message_size: usize) -> Self {
        Self::new(max_frame_size_for(max_message_size))
    }

    /// The maximum frame size, `totalSize` field included.
    pub const fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }

    /// Length of the frame at the start of `buf`, `totalSize` field
    /// included, once its 4-byte size is readable (`Ok(None)` before).
    ///
    /// The whole frame need not be buffered yet; use the result to reserve
    /// room. Fails if the announced frame is too large or too small.
    pub fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        let Some(total_size) = read_u32(buf, 0) else {
            return Ok(None);
        };
        let announced = u64::from(total_size) + FRAME_SIZE_FIELD_LEN as u64;
        let len = usize::try_from(announced)
            .ok()
            .filter(|&len| len <= self.max_frame_size)
            .ok_or(FrameError::FrameTooLarge { size: announced, max: self.max_frame_size })?;
        if (total_size as usize) < COMMAND_SIZE_FIELD_LEN {
            return Err(FrameError::FrameTooSmall { total_size });
        }
        Ok(Some(len))
    }

    /// Decodes the frame at the start of `buf` if it is complete.
    ///
    /// Returns `Ok(Some((frame, consumed)))` where `consumed` is the frame
    /// length, or `Ok(None)` if more bytes are needed. The frame's bytes are
    /// copied once so the returned `Bytes` fields own their memory.
    pub fn decode(&self, buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
        let Some(len) = self.frame_len(buf)? else {
            return Ok(None);
        };
        let Some(frame) = buf.get(..len) else {
            return Ok(None);
        };
        parse_frame(Bytes::copy_from_slice(frame)).map(|f| Some((f, len)))
    }

    /// Zero-copy variant of [`FrameDecoder::decode`]: the returned `Bytes`
    /// fields share `buf`'s memory.
    pub fn decode_bytes(&self, buf: &Bytes) -> Result<Option<(Frame, usize)>, FrameError> {
        let Some(len) = self.frame_len(buf)? else {
            return Ok(None);
        };
        if buf.len() < len {
            return Ok(None);
        }
        parse_frame(buf.slice(..len)).map(|f| Some((f, len)))
    }

    /// Decodes and removes the frame at the start of a read buffer.
    ///
    /// Returns `Ok(None)` when more bytes are needed (after reserving room
    /// for the announced frame). Once a complete frame is buffered it is
    /// split off `buf` (zero-copy) *before* being parsed, so after an error
    /// about its content (any error except `FrameTooLarge` /
    /// `FrameTooSmall`) the buffer is already positioned on the next frame;
    /// this is what makes [`FrameError::ChecksumMismatch`] recoverable.
    pub fn decode_buf(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(len) = self.frame_len(buf)? else {
            return Ok(None);
        };
        if buf.len() < len {
            buf.reserve(len - buf.len());
            return Ok(None);
        }
        parse_frame(buf.split_to(len).freeze()).map(Some)
    }
}

/// Parses one complete frame (`totalSize` field included). The caller has
/// checked that `frame.len()` equals the announced size, which is at least 8.
fn parse_frame(frame: Bytes) -> Result<Frame, FrameError> {
    let frame_len = frame.len();
    let Some(command_size) = read_u32(&frame, FRAME_SIZE_FIELD_LEN) else {
        return Err(FrameError::FrameTooSmall {
            total_size: u32::try_from(frame_len.saturating_sub(FRAME_SIZE_FIELD_LEN))
                .unwrap_or(u32::MAX),
        });
    };
    let available = frame_len.saturating_sub(COMMAND_OFFSET);
    let command_end = usize::try_from(command_size)
        .ok()
        .filter(|&size| size <= available)
        .and_then(|size| COMMAND_OFFSET.checked_add(size))
        .ok_or(FrameError::CommandSizeExceedsFrame { command_size, available })?;

    let command = BaseCommand::decode(frame.slice(COMMAND_OFFSET..command_end))
        .map_err(|source| FrameError::CommandDecode { command_size, source })?;

    let kind = base_command::Type::try_from(command.r#type).ok();
    if !matches!(kind, Some(base_command::Type::Send | base_command::Type::Message)) {
        return Ok(Frame { command, payload: None });
    }
    if command_end >= frame_len {
        return Err(FrameError::MissingPayload { command: kind.map_or("?", |k| k.as_str_name()) });
    }
    parse_payload_section(frame, command_end, command)
}

/// Parses `[0x0e02 section][0x0e01 section][metadataSize][metadata][payload]`
/// starting at `pos` in `frame`.
fn parse_payload_section(
    frame: Bytes,
    mut pos: usize,
    command: BaseCommand,
) -> Result<Frame, FrameError> {
    let frame_len = frame.len();

    let mut broker_entry_metadata_raw = None;
    let mut broker_entry_metadata = None;
    if read_u16(&frame, pos) == Some(MAGIC_BROKER_ENTRY_METADATA) {
        let header_len = MAGIC_LEN + BROKER_ENTRY_METADATA_SIZE_FIELD_LEN;
        let available = frame_len.saturating_sub(pos);
        let truncated = |needed: u64| FrameError::TruncatedBrokerEntryMetadata {
            offset: pos,
            needed,
            available,
        };
        let size = read_u32(&frame, pos + MAGIC_LEN).ok_or(truncated(header_len as u64))?;
        let needed = header_len as u64 + u64::from(size);
        let end = checked_end(pos, needed, frame_len).ok_or(truncated(needed))?;
        let body_start = pos + header_len;
        let decoded =
            BrokerEntryMetadata::decode(frame.slice(body_start..end)).map_err(|source| {
                FrameError::BrokerEntryMetadataDecode { offset: body_start, source }
            })?;
        broker_entry_metadata_raw = Some(frame.slice(pos..end));
        broker_entry_metadata = Some(decoded);
        pos = end;
    }

    let mut checksum = None;
    if read_u16(&frame, pos) == Some(MAGIC_CRC32C) {
        let Some(stored) = read_u32(&frame, pos + MAGIC_LEN) else {
            return Err(FrameError::TruncatedChecksum {
                offset: pos,
                available: frame_len.saturating_sub(pos + MAGIC_LEN),
            });
        };
        pos += MAGIC_LEN + CHECKSUM_LEN;
        let computed = crc32c::crc32c(frame.get(pos..).unwrap_or_default());
        if stored != computed {
            return Err(FrameError::ChecksumMismatch {
                expected: stored,
                actual: computed,
                frame_len,
                command: Box::new(command),
            });
        }
        checksum = Some(stored);
    }

    if pos > frame_len {
        // Unreachable given the checks above; kept so slicing cannot panic.
        return Err(FrameError::TruncatedMetadata {
            offset: pos,
            needed: METADATA_SIZE_FIELD_LEN as u64,
            available: 0,
        });
    }
    let metadata_and_payload = frame.slice(pos..);
    let (metadata, payload) = split_metadata_and_payload(&metadata_and_payload, pos)?;
    Ok(Frame {
        command,
        payload: Some(PayloadSection {
            broker_entry_metadata_raw,
            broker_entry_metadata,
            checksum,
            metadata_and_payload,
            metadata,
            payload,
        }),
    })
}

/// Decodes a stored entry, `[metadataSize u32][MessageMetadata][payload]`,
/// into its metadata and a zero-copy view of the payload.
///
/// This is the `metadata_and_payload` part of a SEND/MESSAGE frame, the
/// bytes a broker stores. Error offsets are relative to the start of `entry`.
pub fn parse_metadata_and_payload(entry: &Bytes) -> Result<(MessageMetadata, Bytes), FrameError> {
    split_metadata_and_payload(entry, 0)
}

/// [`parse_metadata_and_payload`] reporting offsets shifted by `base`.
fn split_metadata_and_payload(
    entry: &Bytes,
    base: usize,
) -> Result<(MessageMetadata, Bytes), FrameError> {
    let available = entry.len();
    let truncated = |needed: u64| FrameError::TruncatedMetadata { offset: base, needed, available };
    let size = read_u32(entry, 0).ok_or(truncated(METADATA_SIZE_FIELD_LEN as u64))?;
    let needed = METADATA_SIZE_FIELD_LEN as u64 + u64::from(size);
    let end = checked_end(0, needed, available).ok_or(truncated(needed))?;
    let metadata =
        MessageMetadata::decode(entry.slice(METADATA_SIZE_FIELD_LEN..end)).map_err(|source| {
            FrameError::MetadataDecode {
                offset: base.saturating_add(METADATA_SIZE_FIELD_LEN),
                source,
            }
        })?;
    Ok((metadata, entry.slice(end..)))
}

/// `start + len` if it does not exceed `limit`.
fn checked_end(start: usize, len: u64, limit: usize) -> Option<usize> {
    let len = usize::try_from(len).ok()?;
    start.checked_add(len).filter(|&end| end <= limit)
}

/// Big-endian u16 at `at`, if in bounds.
pub(crate) fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    let bytes = buf.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes(bytes.try_into().ok()?))
}

/// Big-endian u32 at `at`, if in bounds.
pub(crate) fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands;
    use crate::constants::DEFAULT_MAX_MESSAGE_SIZE;
    use crate::frame::{
        broker_entry_metadata_prefix, encode_command, encode_payload_command, metadata_and_payload,
    };
    use crate::proto::base_command::Type;
    use crate::proto::{CompressionType, KeyValue};

    fn be32(v: u32) -> [u8; 4] {
        v.to_be_bytes()
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    fn decode_one(bytes: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
        FrameDecoder::default().decode(bytes)
    }

    fn decode_all(bytes: &[u8]) -> Frame {
        let (frame, used) = decode_one(bytes).expect("decodes").expect("complete");
        assert_eq!(used, bytes.len());
        frame
    }

    // ---- hand-encoded frames, byte by byte from the spec -----------------

    /// BaseCommand { type: PING(18), ping: {} }
    const PING_CMD: [u8; 5] = [0x08, 0x12, 0x92, 0x01, 0x00];
    /// BaseCommand { type: SEND(6), send: { producer_id: 1, sequence_id: 2 } }
    const SEND_CMD: [u8; 8] = [0x08, 0x06, 0x32, 0x04, 0x08, 0x01, 0x10, 0x02];
    /// BaseCommand { type: MESSAGE(9), message: { consumer_id: 1,
    ///   message_id: { ledgerId: 10, entryId: 20 } } }
    const MESSAGE_CMD: [u8; 12] =
        [0x08, 0x09, 0x4a, 0x08, 0x08, 0x01, 0x12, 0x04, 0x08, 0x0a, 0x10, 0x14];
    /// MessageMetadata { producer_name: "p", sequence_id: 2, publish_time: 3 }
    const METADATA: [u8; 7] = [0x0a, 0x01, b'p', 0x10, 0x02, 0x18, 0x03];
    /// BrokerEntryMetadata { broker_timestamp: 5, index: 6 }
    const BEM: [u8; 4] = [0x08, 0x05, 0x10, 0x06];

    fn hand_metadata_and_payload() -> Vec<u8> {
        cat(&[&be32(METADATA.len() as u32), &METADATA, b"hi"])
    }

    #[test]
    fn crc32c_is_castagnoli() {
        // Standard check value of CRC-32C.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn hand_encoded_simple_frame() {
        let wire = cat(&[&be32(4 + 5), &be32(5), &PING_CMD]);
        let frame = decode_all(&wire);
        assert_eq!(frame.command_type(), Some(Type::Ping));
        assert!(frame.command.ping.is_some());
        assert!(frame.payload.is_none());

        // And our encoder produces exactly these bytes.
        let mut out = BytesMut::new();
        encode_command(&commands::ping(), &mut out).unwrap();
        assert_eq!(&out[..], &wire[..]);
    }

    #[test]
    fn hand_encoded_send_with_checksum() {
        let mp = hand_metadata_and_payload();
        let crc = crc32c::crc32c(&mp);
        let total = (4 + SEND_CMD.len() + 2 + 4 + mp.len()) as u32;
        let wire = cat(&[
            &be32(total),
            &be32(SEND_CMD.len() as u32),
            &SEND_CMD,
            &[0x0e, 0x01],
            &be32(crc),
            &mp,
        ]);
        let frame = decode_all(&wire);
        assert_eq!(frame.command_type(), Some(Type::Send));
        let send = frame.command.send.as_ref().unwrap();
        assert_eq!((send.producer_id, send.sequence_id), (1, 2));
        let p = frame.payload.unwrap();
        assert_eq!(p.checksum, Some(crc));
        assert!(p.has_verified_checksum());
        assert!(p.broker_entry_metadata.is_none() && p.broker_entry_metadata_raw.is_none());
        assert_eq!(&p.metadata_and_payload[..], &mp[..]);
        assert_eq!(p.metadata.producer_name, "p");
        assert_eq!(p.metadata.sequence_id, 2);
        assert_eq!(p.metadata.publish_time, 3);
        assert_eq!(p.metadata.num_messages_in_batch(), 1);
        assert_eq!(&p.payload[..], b"hi");

        // Our encoder produces the same bytes from the same command/entry.
        let mut out = BytesMut::new();
        encode_payload_command(&commands::send(1, 2, 1), None, &mp, &mut out).unwrap();
        // commands::send sets num_messages explicitly, so compare decoded forms.
        let again = decode_all(&out);
        assert_eq!(again.payload.unwrap().metadata_and_payload, &mp[..]);
    }

    #[test]
    fn hand_encoded_send_without_checksum() {
        let mp = hand_metadata_and_payload();
        let total = (4 + SEND_CMD.len() + mp.len()) as u32;
        let wire = cat(&[&be32(total), &be32(SEND_CMD.len() as u32), &SEND_CMD, &mp]);
        let p = decode_all(&wire).payload.unwrap();
        assert_eq!(p.checksum, None);
        assert!(!p.has_verified_checksum());
        assert_eq!(&p.metadata_and_payload[..], &mp[..]);
        assert_eq!(&p.payload[..], b"hi");
    }

    #[test]
    fn hand_encoded_message_with_broker_entry_metadata() {
        let mp = hand_metadata_and_payload();
        let crc = crc32c::crc32c(&mp);
        let bem_section = cat(&[&[0x0e, 0x02], &be32(BEM.len() as u32), &BEM]);
        let total = (4 + MESSAGE_CMD.len() + bem_section.len() + 6 + mp.len()) as u32;
        let wire = cat(&[
            &be32(total),
            &be32(MESSAGE_CMD.len() as u32),
            &MESSAGE_CMD,
            &bem_section,
            &[0x0e, 0x01],
            &be32(crc),
            &mp,
        ]);
        let frame = decode_all(&wire);
        assert_eq!(frame.command_type(), Some(Type::Message));
        let msg = frame.command.message.as_ref().unwrap();
        assert_eq!(msg.consumer_id, 1);
        assert_eq!((msg.message_id.ledger_id, msg.message_id.entry_id), (10, 20));
        let p = frame.payload.unwrap();
        let bem = p.broker_entry_metadata.unwrap();
        assert_eq!((bem.broker_timestamp, bem.index), (Some(5), Some(6)));
        assert_eq!(p.broker_entry_metadata_raw.as_deref(), Some(&bem_section[..]));
        assert_eq!(p.checksum, Some(crc));
        assert_eq!(&p.payload[..], b"hi");

        // Our prefix helper and encoder agree with the hand layout.
        let prefix = broker_entry_metadata_prefix(&BrokerEntryMetadata {
            broker_timestamp: Some(5),
            index: Some(6),
        });
        assert_eq!(&prefix[..], &bem_section[..]);
        let mut out = BytesMut::new();
        encode_payload_command(&frame.command, Some(&prefix), &mp, &mut out).unwrap();
        assert_eq!(&out[..], &wire[..]);
    }

    #[test]
    fn broker_entry_metadata_without_checksum() {
        let mp = hand_metadata_and_payload();
        let bem_section = cat(&[&[0x0e, 0x02], &be32(BEM.len() as u32), &BEM]);
        let total = (4 + MESSAGE_CMD.len() + bem_section.len() + mp.len()) as u32;
        let wire =
            cat(&[&be32(total), &be32(MESSAGE_CMD.len() as u32), &MESSAGE_CMD, &bem_section, &mp]);
        let p = decode_all(&wire).payload.unwrap();
        assert!(p.broker_entry_metadata.is_some());
        assert_eq!(p.checksum, None);
        assert_eq!(&p.payload[..], b"hi");
    }

    // ---- round trips ------------------------------------------------------

    fn rich_metadata() -> MessageMetadata {
        MessageMetadata {
            producer_name: "producer-1".into(),
            sequence_id: 42,
            publish_time: 1_700_000_000_000,
            properties: vec![KeyValue { key: "k".into(), value: "v".into() }],
            partition_key: Some("key".into()),
            compression: Some(CompressionType::Lz4 as i32),
            uncompressed_size: Some(100),
            num_messages_in_batch: Some(3),
            event_time: Some(9),
            ordering_key: Some(Bytes::from_static(b"ok")),
            deliver_at_time: Some(123),
            schema_version: Some(Bytes::from_static(&[0, 0, 0, 1])),
            compacted_batch_indexes: vec![0, 2],
            entry_hash_min: Some(1),
            entry_hash_max: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_every_frame_kind() {
        let md = rich_metadata();
        let mp = metadata_and_payload(&md, b"payload bytes").unwrap();
        let bem = broker_entry_metadata_prefix(&BrokerEntryMetadata {
            broker_timestamp: Some(1),
            index: Some(99),
        });
        let simple = [
            commands::connect("c", 21),
            commands::connected("s", 21, Some(5_242_880), None),
            commands::ping(),
            commands::pong(),
            commands::success(1),
            commands::error(1, crate::proto::ServerError::ConsumerBusy, "busy"),
            commands::flow(1, 1000),
        ];
        let mut wire = BytesMut::new();
        for c in &simple {
            encode_command(c, &mut wire).unwrap();
        }
        let send = commands::send(1, 42, 3);
        let msg = commands::message(7, commands::message_id(3, 4, None), 2, vec![-1], None);
        encode_payload_command(&send, None, &mp, &mut wire).unwrap();
        encode_payload_command(&msg, Some(&bem), &mp, &mut wire).unwrap();
        encode_payload_command(&msg, None, &mp, &mut wire).unwrap();

        let dec = FrameDecoder::default();
        let all = wire.clone().freeze();
        let mut frames = Vec::new();
        while let Some(f) = dec.decode_buf(&mut wire).unwrap() {
            frames.push(f);
        }
        assert!(wire.is_empty());
        assert_eq!(frames.len(), simple.len() + 3);
        for (f, c) in frames.iter().zip(&simple) {
            assert_eq!(&f.command, c);
            assert!(f.payload.is_none());
        }
        let payload_frames = &frames[simple.len()..];
        for (f, (cmd, has_bem)) in
            payload_frames.iter().zip([(&send, false), (&msg, true), (&msg, false)])
        {
            assert_eq!(&f.command, cmd);
            let p = f.payload.as_ref().unwrap();
            assert_eq!(p.metadata, md);
            assert_eq!(&p.payload[..], b"payload bytes");
            assert_eq!(p.metadata_and_payload, mp);
            assert_eq!(p.checksum, Some(crc32c::crc32c(&mp)));
            assert_eq!(p.broker_entry_metadata_raw.is_some(), has_bem);
            if has_bem {
                assert_eq!(p.broker_entry_metadata.as_ref().unwrap().index, Some(99));
                assert_eq!(p.broker_entry_metadata_raw.as_ref().unwrap(), &bem);
            }
        }

        // decode_bytes and decode agree with decode_buf and report sizes.
        let mut offset = 0;
        for expected in &frames {
            let rest = all.slice(offset..);
            let (f1, n1) = dec.decode_bytes(&rest).unwrap().unwrap();
            let (f2, n2) = dec.decode(&rest).unwrap().unwrap();
            assert_eq!((&f1, n1), (expected, n2));
            assert_eq!(f2, f1);
            offset += n1;
        }
        assert_eq!(offset, all.len());
    }

    #[test]
    fn decode_bytes_is_zero_copy() {
        let mp = metadata_and_payload(&rich_metadata(), b"zzz").unwrap();
        let mut wire = BytesMut::new();
        encode_payload_command(&commands::send(1, 1, 1), None, &mp, &mut wire).unwrap();
        let wire = wire.freeze();
        let (f, _) = FrameDecoder::default().decode_bytes(&wire).unwrap().unwrap();
        let p = f.payload.unwrap();
        let range = wire.as_ptr_range();
        assert!(range.contains(&p.payload.as_ptr()));
        assert!(range.contains(&p.metadata_and_payload.as_ptr()));
    }

    #[test]
    fn byte_by_byte_feeding() {
        let mp = metadata_and_payload(&rich_metadata(), b"abc").unwrap();
        let mut wire = BytesMut::new();
        encode_command(&commands::ping(), &mut wire).unwrap();
        encode_payload_command(&commands::send(1, 1, 1), None, &mp, &mut wire).unwrap();
        encode_command(&commands::pong(), &mut wire).unwrap();

        let dec = FrameDecoder::default();
        let mut buf = BytesMut::new();
        let mut kinds = Vec::new();
        for &b in wire.iter() {
            buf.extend_from_slice(&[b]);
            while let Some(f) = dec.decode_buf(&mut buf).unwrap() {
                kinds.push(f.command_type().unwrap());
            }
        }
        assert_eq!(kinds, [Type::Ping, Type::Send, Type::Pong]);
        assert!(buf.is_empty());
    }

    // ---- checksum ---------------------------------------------------------

    #[test]
    fn checksum_mismatch_is_reported_and_recoverable() {
        let mp = metadata_and_payload(&rich_metadata(), b"payload").unwrap();
        let mut wire = BytesMut::new();
        encode_payload_command(&commands::send(5, 77, 1), None, &mp, &mut wire).unwrap();
        let first_len = wire.len();
        let good_crc = crc32c::crc32c(&mp);
        // Corrupt the last payload byte.
        let last = first_len - 1;
        wire[last] ^= 0x40;
        encode_command(&commands::ping(), &mut wire).unwrap();

        let dec = FrameDecoder::default();
        match dec.decode(&wire) {
            Err(FrameError::ChecksumMismatch { expected, actual, frame_len, command }) => {
                assert_eq!(expected, good_crc);
                assert_ne!(actual, expected);
                assert_eq!(frame_len, first_len);
                let send = command.send.unwrap();
                assert_eq!((send.producer_id, send.sequence_id), (5, 77));
            }
            other => panic!("expected checksum mismatch, got {other:?}"),
        }
        // decode_buf consumes the bad frame and carries on with the next one.
        let err = dec.decode_buf(&mut wire).unwrap_err();
        assert!(!err.is_fatal());
        let next = dec.decode_buf(&mut wire).unwrap().unwrap();
        assert_eq!(next.command_type(), Some(Type::Ping));
        assert!(wire.is_empty());
    }

    #[test]
    fn corrupted_checksum_field_is_detected() {
        let mp = metadata_and_payload(&rich_metadata(), b"payload").unwrap();
        let mut wire = BytesMut::new();
        encode_payload_command(&commands::send(5, 77, 1), None, &mp, &mut wire).unwrap();
        let crc_at = wire.len() - mp.len() - 4;
        wire[crc_at] ^= 0xff;
        assert!(matches!(decode_one(&wire), Err(FrameError::ChecksumMismatch { .. })));
    }

    // ---- sizes ------------------------------------------------------------

    #[test]
    fn oversize_frame_rejected_from_the_size_field_alone() {
        let dec = FrameDecoder::default();
        // Exactly at the limit: accepted (waits for more bytes).
        let at_limit = (dec.max_frame_size() - 4) as u32;
        assert_eq!(dec.frame_len(&be32(at_limit)).unwrap(), Some(dec.max_frame_size()));
        assert!(dec.decode(&be32(at_limit)).unwrap().is_none());
        // One byte over: rejected with only 4 bytes buffered.
        let mut buf = BytesMut::from(&be32(at_limit + 1)[..]);
        match dec.decode_buf(&mut buf) {
            Err(FrameError::FrameTooLarge { size, max }) => {
                assert_eq!(size, dec.max_frame_size() as u64 + 1);
                assert_eq!(max, 5_253_120);
            }
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        assert!(buf.capacity() < 1024, "must not reserve room for a rejected frame");
        assert!(matches!(dec.decode(&be32(u32::MAX)), Err(FrameError::FrameTooLarge { .. })));
        // Configurable limit.
        let small = FrameDecoder::with_max_message_size(100);
        assert_eq!(small.max_frame_size(), 100 + 10 * 1024);
        assert!(FrameDecoder::with_max_message_size(DEFAULT_MAX_MESSAGE_SIZE) == dec);
        let tiny = FrameDecoder::new(16);
        assert!(matches!(
            tiny.decode(&be32(13)),
            Err(FrameError::FrameTooLarge { size: 17, max: 16 })
        ));
    }

    #[test]
    fn too_small_total_size() {
        for total in 0..4u32 {
            let wire = cat(&[&be32(total), &[0; 8]]);
            assert!(matches!(
                decode_one(&wire),
                Err(FrameError::FrameTooSmall { total_size }) if total_size == total
            ));
        }
    }

    #[test]
    fn command_size_larger_than_frame() {
        let wire = cat(&[&be32(4 + 5), &be32(6), &PING_CMD]);
        assert!(matches!(
            decode_one(&wire),
            Err(FrameError::CommandSizeExceedsFrame { command_size: 6, available: 5 })
        ));
        let wire = cat(&[&be32(4), &be32(u32::MAX)]);
        assert!(matches!(decode_one(&wire), Err(FrameError::CommandSizeExceedsFrame { .. })));
    }

    #[test]
    fn malformed_command() {
        // Field 1 as a varint that never ends.
        let cmd = [0x08, 0xff, 0xff];
        let wire = cat(&[&be32(4 + 3), &be32(3), &cmd]);
        assert!(matches!(
            decode_one(&wire),
            Err(FrameError::CommandDecode { command_size: 3, .. })
        ));
    }

    #[test]
    fn empty_command_and_unknown_type_still_decode() {
        // Zero-length command: prost does not enforce `required`, and a
        // missing required enum takes its first value, CONNECT, without body.
        let wire = cat(&[&be32(4), &be32(0)]);
        let f = decode_all(&wire);
        assert_eq!(f.command_type(), Some(Type::Connect));
        assert!(f.command.connect.is_none());
        // Unknown type with trailing bytes: not a payload frame, bytes ignored.
        let cmd = [0x08, 0xe8, 0x07]; // type = 1000
        let wire = cat(&[&be32(4 + 3 + 3), &be32(3), &cmd, &[1, 2, 3]]);
        let f = decode_all(&wire);
        assert_eq!(f.command.r#type, 1000);
        assert!(f.payload.is_none());
    }

    #[test]
    fn trailing_bytes_after_simple_command_are_ignored() {
        let wire = cat(&[&be32(4 + 5 + 2), &be32(5), &PING_CMD, &[0xaa, 0xbb]]);
        let (f, used) = decode_one(&wire).unwrap().unwrap();
        assert_eq!(used, wire.len());
        assert!(f.payload.is_none());
    }

    #[test]
    fn send_without_payload() {
        let wire = cat(&[&be32(4 + 8), &be32(8), &SEND_CMD]);
        assert!(matches!(decode_one(&wire), Err(FrameError::MissingPayload { command: "SEND" })));
    }

    #[test]
    fn truncated_sections_inside_a_complete_frame() {
        let send_frame = |rest: &[u8]| {
            cat(&[
                &be32((4 + SEND_CMD.len() + rest.len()) as u32),
                &be32(SEND_CMD.len() as u32),
                &SEND_CMD,
                rest,
            ])
        };
        // 1..3 bytes where metadataSize should be.
        for n in 1..4 {
            assert!(matches!(
                decode_one(&send_frame(&vec![0; n])),
                Err(FrameError::TruncatedMetadata { offset: 16, needed: 4, .. })
            ));
        }
        // metadataSize pointing past the end.
        assert!(matches!(
            decode_one(&send_frame(&cat(&[&be32(100), &METADATA]))),
            Err(FrameError::TruncatedMetadata { needed: 104, available: 11, .. })
        ));
        // Checksum magic with a short checksum.
        assert!(matches!(
            decode_one(&send_frame(&[0x0e, 0x01, 0, 0])),
            Err(FrameError::TruncatedChecksum { offset: 16, available: 2 })
        ));
        // Checksum present but nothing after it: CRC of nothing is 0.
        assert!(matches!(
            decode_one(&send_frame(&[0x0e, 0x01, 0, 0, 0, 0])),
            Err(FrameError::TruncatedMetadata { offset: 22, .. })
        ));
        // Broker entry metadata cut short.
        assert!(matches!(
            decode_one(&send_frame(&[0x0e, 0x02, 0, 0])),
            Err(FrameError::TruncatedBrokerEntryMetadata { offset: 16, needed: 6, .. })
        ));
        assert!(matches!(
            decode_one(&send_frame(&cat(&[&[0x0e, 0x02], &be32(50), &BEM]))),
            Err(FrameError::TruncatedBrokerEntryMetadata { needed: 56, .. })
        ));
        // Malformed broker entry metadata.
        assert!(matches!(
            decode_one(&send_frame(&cat(&[&[0x0e, 0x02], &be32(2), &[0x08, 0x80]]))),
            Err(FrameError::BrokerEntryMetadataDecode { offset: 22, .. })
        ));
        // Malformed metadata protobuf behind a valid checksum.
        let bad_mp = cat(&[&be32(2), &[0x0a, 0x05]]);
        let crc = crc32c::crc32c(&bad_mp);
        assert!(matches!(
            decode_one(&send_frame(&cat(&[&[0x0e, 0x01], &be32(crc), &bad_mp]))),
            Err(FrameError::MetadataDecode { offset: 26, .. })
        ));
    }

    #[test]
    fn every_truncation_of_a_stream_waits_for_more() {
        let mp = metadata_and_payload(&rich_metadata(), b"truncate me").unwrap();
        let bem = broker_entry_metadata_prefix(&BrokerEntryMetadata {
            broker_timestamp: Some(1),
            index: Some(2),
        });
        let mut wire = BytesMut::new();
        encode_payload_command(
            &commands::message(1, commands::message_id(1, 2, None), 0, vec![], None),
            Some(&bem),
            &mp,
            &mut wire,
        )
        .unwrap();
        let dec = FrameDecoder::default();
        for n in 0..wire.len() {
            assert!(dec.decode(&wire[..n]).unwrap().is_none(), "prefix {n}");
            let b = Bytes::copy_from_slice(&wire[..n]);
            assert!(dec.decode_bytes(&b).unwrap().is_none(), "prefix {n}");
        }
        assert!(dec.decode(&wire).unwrap().is_some());
    }

    #[test]
    fn every_shortened_total_size_errors_or_decodes_without_panic() {
        // The frame claims to end early: each inner section gets truncated
        // in turn while the frame itself looks complete.
        let mp = metadata_and_payload(&rich_metadata(), b"truncate me").unwrap();
        let bem = broker_entry_metadata_prefix(&BrokerEntryMetadata {
            broker_timestamp: Some(1),
            index: Some(2),
        });
        let mut wire = BytesMut::new();
        encode_payload_command(
            &commands::message(1, commands::message_id(1, 2, None), 0, vec![], None),
            Some(&bem),
            &mp,
            &mut wire,
        )
        .unwrap();
        let dec = FrameDecoder::default();
        let full = wire.len();
        for len in 4..=full {
            let mut v = wire[..len].to_vec();
            v[..4].copy_from_slice(&be32((len - 4) as u32));
            match dec.decode(&v) {
                Ok(Some((_, used))) => assert_eq!(used, len),
                Ok(None) => panic!("complete frame of {len} bytes reported as partial"),
                Err(_) => {}
            }
        }
    }

    #[test]
    fn parse_stored_entry() {
        let md = rich_metadata();
        let entry = metadata_and_payload(&md, b"xyz").unwrap();
        let (m, p) = parse_metadata_and_payload(&entry).unwrap();
        assert_eq!(m, md);
        assert_eq!(&p[..], b"xyz");
        let short = entry.slice(..10);
        assert!(matches!(
            parse_metadata_and_payload(&short),
            Err(FrameError::TruncatedMetadata { offset: 0, available: 10, .. })
        ));
        assert!(matches!(
            parse_metadata_and_payload(&Bytes::new()),
            Err(FrameError::TruncatedMetadata { needed: 4, available: 0, .. })
        ));
    }

    // ---- randomized robustness ---------------------------------------------

    /// xorshift64*: tiny deterministic PRNG, good enough for fuzzing.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn seed() -> u64 {
        let seed =
            std::env::var("MAGNETAR_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(
                || {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos() as u64)
                        .unwrap_or(1)
                },
            ) | 1;
        println!("random decoder test seed: {seed} (rerun with MAGNETAR_FUZZ_SEED={seed})");
        seed
    }

    fn encode_frame(frame: &Frame) -> BytesMut {
        let mut out = BytesMut::new();
        match &frame.payload {
            None => encode_command(&frame.command, &mut out).unwrap(),
            Some(p) => encode_payload_command(
                &frame.command,
                p.broker_entry_metadata_raw.as_deref(),
                &p.metadata_and_payload,
                &mut out,
            )
            .unwrap(),
        }
        out
    }

    /// Whatever decodes re-encodes to bytes that decode to the same frame
    /// (bytes are compared: consumer stats may hold NaN floats).
    fn check_round_trip(frame: &Frame) {
        let first = encode_frame(frame);
        let (again, used) = FrameDecoder::new(usize::MAX).decode(&first).unwrap().unwrap();
        assert_eq!(used, first.len());
        assert_eq!(encode_frame(&again), first);
    }

    fn exercise(dec: &FrameDecoder, bytes: &[u8]) {
        let _ = dec.decode(bytes);
        let _ = dec.decode_bytes(&Bytes::copy_from_slice(bytes));
        let mut buf = BytesMut::from(bytes);
        // Drain as many frames as possible, skipping recoverable errors.
        for _ in 0..64 {
            match dec.decode_buf(&mut buf) {
                Ok(Some(frame)) => check_round_trip(&frame),
                Err(e) if !e.is_fatal() => {}
                _ => break,
            }
        }
        let _ = parse_metadata_and_payload(&Bytes::copy_from_slice(bytes));
        for m in crate::batch::parse_batch(Bytes::copy_from_slice(bytes), 8) {
            if m.is_err() {
                break;
            }
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = Rng(seed());
        let small = FrameDecoder::new(4096);
        let dec = FrameDecoder::default();

        // Valid frames to mutate: mutation finds deeper paths than pure noise.
        let mp = metadata_and_payload(&rich_metadata(), b"mutate me please").unwrap();
        let bem = broker_entry_metadata_prefix(&BrokerEntryMetadata {
            broker_timestamp: Some(1),
            index: Some(2),
        });
        // (frame bytes, offset of the CRC32C field if any)
        let mut seeds = Vec::new();
        for with_bem in [false, true] {
            let mut w = BytesMut::new();
            let cmd = commands::message(1, commands::message_id(1, 2, Some(0)), 1, vec![3], None);
            encode_payload_command(&cmd, with_bem.then_some(&bem[..]), &mp, &mut w).unwrap();
            let crc_at = w.len() - mp.len() - 4;
            seeds.push((w.to_vec(), Some(crc_at)));
        }
        let mut w = BytesMut::new();
        encode_command(&commands::connected("s", 21, None, None), &mut w).unwrap();
        seeds.push((w.to_vec(), None));

        for _ in 0..20_000 {
            let len = rng.below(300);
            let noise: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            exercise(&small, &noise);

            // Noise behind a plausible header.
            let mut framed = be32(len as u32 + 4).to_vec();
            let cmd_len = rng.below(len + 2) as u32;
            framed.extend_from_slice(&be32(cmd_len));
            framed.extend_from_slice(&noise);
            exercise(&dec, &framed);

            // Mutated valid frame.
            let (seed_frame, crc_at) = &seeds[rng.below(seeds.len())];
            let mut m = seed_frame.clone();
            for _ in 0..=rng.below(4) {
                let i = rng.below(m.len());
                m[i] = match rng.below(3) {
                    0 => m[i] ^ (1 << rng.below(8)),
                    1 => rng.next() as u8,
                    _ => [0x00, 0xff, 0x0e, 0x01, 0x02][rng.below(5)],
                };
            }
            // Often repair the checksum so the metadata parser sees the damage.
            if let (Some(at), true) = (crc_at, rng.below(2) == 0) {
                let crc = crc32c::crc32c(&m[at + 4..]);
                m[*at..at + 4].copy_from_slice(&crc.to_be_bytes());
            }
            if rng.below(4) == 0 {
                m.truncate(rng.below(m.len() + 1));
            }
            exercise(&dec, &m);
        }
    }
}
