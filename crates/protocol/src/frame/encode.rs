//! Frame encoders: simple commands, payload commands (with CRC32C), stored
//! entries (`[metadataSize][MessageMetadata][payload]`) and the
//! broker-entry-metadata prefix.
//!
//! Lengths are checked against the width of their wire fields; an
//! oversized input yields [`EncodeError::TooLarge`] rather than a corrupt
//! frame. Nothing is written to `out` when an error is returned.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use crate::constants::{
    BROKER_ENTRY_METADATA_SIZE_FIELD_LEN, CHECKSUM_LEN, COMMAND_SIZE_FIELD_LEN,
    FRAME_SIZE_FIELD_LEN, MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C, MAGIC_LEN,
    METADATA_SIZE_FIELD_LEN,
};
use crate::error::EncodeError;
use crate::frame::decode::{read_u16, read_u32};
use crate::proto::{BaseCommand, BrokerEntryMetadata, MessageMetadata};

/// Converts a length to the u32 its wire field holds.
pub(crate) fn wire_u32(what: &'static str, size: usize) -> Result<u32, EncodeError> {
    u32::try_from(size).map_err(|_| EncodeError::TooLarge {
        what,
        size: size as u64,
        max: u64::from(u32::MAX),
    })
}

/// Sum of lengths, failing instead of overflowing.
fn sum(what: &'static str, parts: &[usize]) -> Result<usize, EncodeError> {
    parts.iter().try_fold(0usize, |acc, &p| acc.checked_add(p)).ok_or(EncodeError::TooLarge {
        what,
        size: u64::MAX,
        max: u64::from(u32::MAX),
    })
}

/// Appends a simple frame, `[totalSize][commandSize][BaseCommand]`, to `out`.
pub fn encode_command(command: &BaseCommand, out: &mut BytesMut) -> Result<(), EncodeError> {
    let command_len = command.encoded_len();
    let command_size = wire_u32("command", command_len)?;
    let total_size = wire_u32("frame", sum("frame", &[COMMAND_SIZE_FIELD_LEN, command_len])?)?;
    out.reserve(FRAME_SIZE_FIELD_LEN + total_size as usize);
    out.put_u32(total_size);
    out.put_u32(command_size);
    command.encode_raw(out);
    Ok(())
}

/// Appends a complete payload frame (SEND or MESSAGE) to `out`:
///
/// `[totalSize][commandSize][BaseCommand][broker entry metadata?][0x0e01][CRC32C][metadata_and_payload]`
///
/// * `broker_entry_metadata` is an optional, complete
///   `[0x0e02][size][BrokerEntryMetadata]` section, as produced by
///   [`broker_entry_metadata_prefix`] or received in
///   [`crate::PayloadSection::broker_entry_metadata_raw`]. Only send it to
///   clients that negotiated `supports_broker_entry_metadata`.
/// * `metadata_and_payload` is `[metadataSize][MessageMetadata][payload]`,
///   e.g. from [`encode_metadata_and_payload`] or a stored entry.
///
/// The checksum is always written (the Go client requires it) and is
/// computed over `metadata_and_payload`.
pub fn encode_payload_command(
    command: &BaseCommand,
    broker_entry_metadata: Option<&[u8]>,
    metadata_and_payload: &[u8],
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    out.reserve(metadata_and_payload.len());
    encode_payload_command_header(command, broker_entry_metadata, metadata_and_payload, out)?;
    out.extend_from_slice(metadata_and_payload);
    Ok(())
}

/// Like [`encode_payload_command`] but stops after the checksum: appends
/// `[totalSize][commandSize][BaseCommand][broker entry metadata?][0x0e01][CRC32C]`.
///
/// The caller then sends `metadata_and_payload` itself (e.g. as the second
/// buffer of a vectored write), so a stored entry is never copied.
/// `totalSize` and the checksum account for `metadata_and_payload`.
pub fn encode_payload_command_header(
    command: &BaseCommand,
    broker_entry_metadata: Option<&[u8]>,
    metadata_and_payload: &[u8],
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let prefix = broker_entry_metadata.unwrap_or_default();
    if broker_entry_metadata.is_some() && !is_valid_broker_entry_metadata_prefix(prefix) {
        return Err(EncodeError::InvalidBrokerEntryMetadataPrefix);
    }
    let command_len = command.encoded_len();
    let command_size = wire_u32("command", command_len)?;
    let total = sum(
        "frame",
        &[
            COMMAND_SIZE_FIELD_LEN,
            command_len,
            prefix.len(),
            MAGIC_LEN,
            CHECKSUM_LEN,
            metadata_and_payload.len(),
        ],
    )?;
    let total_size = wire_u32("frame", total)?;
    let checksum = crc32c::crc32c(metadata_and_payload);

    out.reserve(
        FRAME_SIZE_FIELD_LEN
            + COMMAND_SIZE_FIELD_LEN
            + command_len
            + prefix.len()
            + MAGIC_LEN
            + CHECKSUM_LEN,
    );
    out.put_u32(total_size);
    out.put_u32(command_size);
    command.encode_raw(out);
    out.extend_from_slice(prefix);
    out.put_u16(MAGIC_CRC32C);
    out.put_u32(checksum);
    Ok(())
}

/// Appends a stored entry, `[metadataSize u32][MessageMetadata][payload]`,
/// to `out`. This is the `metadata_and_payload` argument of
/// [`encode_payload_command`].
pub fn encode_metadata_and_payload(
    metadata: &MessageMetadata,
    payload: &[u8],
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let metadata_len = metadata.encoded_len();
    let metadata_size = wire_u32("message metadata", metadata_len)?;
    out.reserve(METADATA_SIZE_FIELD_LEN + metadata_len + payload.len());
    out.put_u32(metadata_size);
    metadata.encode_raw(out);
    out.extend_from_slice(payload);
    Ok(())
}

/// [`encode_metadata_and_payload`] into a fresh buffer.
pub fn metadata_and_payload(
    metadata: &MessageMetadata,
    payload: &[u8],
) -> Result<Bytes, EncodeError> {
    let mut out = BytesMut::new();
    encode_metadata_and_payload(metadata, payload, &mut out)?;
    Ok(out.freeze())
}

/// The broker-entry-metadata section,
/// `[0x0e02 u16][size u32][BrokerEntryMetadata]`, ready to be passed to
/// [`encode_payload_command`] or stored in front of an entry.
pub fn broker_entry_metadata_prefix(metadata: &BrokerEntryMetadata) -> Bytes {
    let len = metadata.encoded_len();
    let mut out = BytesMut::with_capacity(MAGIC_LEN + BROKER_ENTRY_METADATA_SIZE_FIELD_LEN + len);
    out.put_u16(MAGIC_BROKER_ENTRY_METADATA);
    // Two optional varints: at most 22 bytes, so the cast cannot truncate.
    out.put_u32(len as u32);
    metadata.encode_raw(&mut out);
    out.freeze()
}

/// Whether `prefix` is exactly one `[0x0e02][size][size bytes]` section.
fn is_valid_broker_entry_metadata_prefix(prefix: &[u8]) -> bool {
    let header = MAGIC_LEN + BROKER_ENTRY_METADATA_SIZE_FIELD_LEN;
    read_u16(prefix, 0) == Some(MAGIC_BROKER_ENTRY_METADATA)
        && read_u32(prefix, MAGIC_LEN)
            .and_then(|size| usize::try_from(size).ok())
            .and_then(|size| size.checked_add(header))
            == Some(prefix.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands;
    use crate::frame::FrameDecoder;

    fn metadata() -> MessageMetadata {
        MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 2,
            publish_time: 3,
            ..Default::default()
        }
    }

    #[test]
    fn simple_frame_layout() {
        let cmd = commands::success(300);
        let mut out = BytesMut::new();
        encode_command(&cmd, &mut out).unwrap();
        let body = cmd.encode_to_vec();
        assert_eq!(read_u32(&out, 0), Some(4 + body.len() as u32));
        assert_eq!(read_u32(&out, 4), Some(body.len() as u32));
        assert_eq!(&out[8..], &body[..]);
    }

    #[test]
    fn appends_without_touching_existing_bytes() {
        let mut out = BytesMut::from(&b"keep"[..]);
        encode_command(&commands::ping(), &mut out).unwrap();
        assert_eq!(&out[..4], b"keep");
        assert_eq!(out.len(), 4 + 4 + 4 + 5);
    }

    #[test]
    fn entry_layout() {
        let md = metadata();
        let entry = metadata_and_payload(&md, b"hello").unwrap();
        let md_bytes = md.encode_to_vec();
        assert_eq!(read_u32(&entry, 0), Some(md_bytes.len() as u32));
        assert_eq!(&entry[4..4 + md_bytes.len()], &md_bytes[..]);
        assert_eq!(&entry[4 + md_bytes.len()..], b"hello");
    }

    #[test]
    fn payload_frame_layout_and_checksum() {
        let cmd = commands::send(1, 2, 1);
        let entry = metadata_and_payload(&metadata(), b"hello").unwrap();
        let mut out = BytesMut::new();
        encode_payload_command(&cmd, None, &entry, &mut out).unwrap();
        let cmd_len = cmd.encoded_len();
        assert_eq!(read_u32(&out, 0), Some((out.len() - 4) as u32));
        assert_eq!(read_u32(&out, 4), Some(cmd_len as u32));
        let at = 8 + cmd_len;
        assert_eq!(read_u16(&out, at), Some(MAGIC_CRC32C));
        assert_eq!(read_u32(&out, at + 2), Some(crc32c::crc32c(&entry)));
        assert_eq!(&out[at + 6..], &entry[..]);
    }

    #[test]
    fn header_plus_entry_equals_full_frame() {
        let cmd = commands::message(1, commands::message_id(1, 2, None), 0, vec![], None);
        let bem = broker_entry_metadata_prefix(&BrokerEntryMetadata {
            broker_timestamp: Some(10),
            index: None,
        });
        let entry = metadata_and_payload(&metadata(), b"vectored").unwrap();
        let mut full = BytesMut::new();
        encode_payload_command(&cmd, Some(&bem), &entry, &mut full).unwrap();
        let mut header = BytesMut::new();
        encode_payload_command_header(&cmd, Some(&bem), &entry, &mut header).unwrap();
        header.extend_from_slice(&entry);
        assert_eq!(header, full);
        assert!(FrameDecoder::default().decode(&full).unwrap().is_some());
    }

    #[test]
    fn broker_entry_metadata_prefix_layout() {
        let empty = broker_entry_metadata_prefix(&BrokerEntryMetadata::default());
        assert_eq!(&empty[..], &[0x0e, 0x02, 0, 0, 0, 0]);
        let full = broker_entry_metadata_prefix(&BrokerEntryMetadata {
            broker_timestamp: Some(u64::MAX),
            index: Some(u64::MAX),
        });
        assert_eq!(full.len(), 6 + 22);
        assert_eq!(read_u32(&full, 2), Some(22));
        assert!(is_valid_broker_entry_metadata_prefix(&full));
    }

    #[test]
    fn invalid_broker_entry_metadata_prefix_rejected() {
        let entry = metadata_and_payload(&metadata(), b"x").unwrap();
        let cmd = commands::send(1, 1, 1);
        let cases: [&[u8]; 5] = [
            &[],
            &[0x0e, 0x02, 0, 0],
            &[0x0e, 0x01, 0, 0, 0, 0],
            &[0x0e, 0x02, 0, 0, 0, 1],
            &[0x0e, 0x02, 0, 0, 0, 0, 0],
        ];
        for bad in cases {
            let mut out = BytesMut::new();
            assert_eq!(
                encode_payload_command(&cmd, Some(bad), &entry, &mut out),
                Err(EncodeError::InvalidBrokerEntryMetadataPrefix),
                "{bad:?}"
            );
            assert!(out.is_empty());
        }
    }

    #[test]
    fn lengths_are_checked() {
        assert!(wire_u32("x", u32::MAX as usize).is_ok());
        assert!(matches!(
            wire_u32("x", u32::MAX as usize + 1),
            Err(EncodeError::TooLarge { what: "x", .. })
        ));
        assert!(sum("x", &[usize::MAX, 1]).is_err());
        assert_eq!(sum("x", &[1, 2, 3]), Ok(6));
    }
}
