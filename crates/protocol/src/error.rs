//! Typed errors of the codec: [`FrameError`] (decoding frames and entries),
//! [`EncodeError`] (building frames and batches) and [`BatchError`]
//! (walking a batch payload).
//!
//! Offsets are byte positions counted from the first byte of the frame,
//! i.e. the first byte of its `totalSize` field, or from the start of the
//! buffer given to the function for entry and batch helpers.

use crate::proto::BaseCommand;

/// Why bytes received from a peer could not be turned into a frame.
///
/// Apart from [`FrameError::ChecksumMismatch`], these errors mean the peer
/// is broken or hostile and the connection should be closed; see
/// [`FrameError::is_fatal`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame announced in `totalSize` exceeds the configured maximum.
    /// Reported as soon as the 4-byte size is readable, before the frame
    /// body is buffered.
    #[error("frame of {size} bytes exceeds the maximum frame size of {max} bytes")]
    FrameTooLarge {
        /// Announced frame length including the 4-byte `totalSize` field.
        size: u64,
        /// Configured maximum.
        max: usize,
    },

    /// `totalSize` is smaller than the 4-byte `commandSize` field it must contain.
    #[error("frame size {total_size} is too small to hold the command size field")]
    FrameTooSmall {
        /// The `totalSize` value read from the wire.
        total_size: u32,
    },

    /// `commandSize` points past the end of the frame.
    #[error("command size {command_size} exceeds the {available} bytes left in the frame")]
    CommandSizeExceedsFrame {
        /// The `commandSize` value read from the wire.
        command_size: u32,
        /// Bytes of the frame remaining after the `commandSize` field.
        available: usize,
    },

    /// The `BaseCommand` protobuf is malformed.
    #[error("malformed BaseCommand ({command_size} bytes at offset 8): {source}")]
    CommandDecode {
        /// The `commandSize` value.
        command_size: u32,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },

    /// A SEND or MESSAGE command arrived without the metadata/payload section.
    #[error("{command} frame has no metadata/payload section")]
    MissingPayload {
        /// Name of the command type (`SEND` or `MESSAGE`).
        command: &'static str,
    },

    /// The broker-entry-metadata section is cut short or its size points
    /// past the end of the frame.
    #[error(
        "broker entry metadata at offset {offset} needs {needed} bytes but only {available} remain"
    )]
    TruncatedBrokerEntryMetadata {
        /// Offset of the 0x0e02 magic.
        offset: usize,
        /// Bytes needed from `offset` (magic + size field + metadata).
        needed: u64,
        /// Bytes available from `offset` to the end of the frame.
        available: usize,
    },

    /// The `BrokerEntryMetadata` protobuf is malformed.
    #[error("malformed BrokerEntryMetadata at offset {offset}: {source}")]
    BrokerEntryMetadataDecode {
        /// Offset of the protobuf bytes.
        offset: usize,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },

    /// The 0x0e01 magic is present but the 4-byte checksum after it is cut short.
    #[error("checksum at offset {offset} is truncated: {available} bytes after the magic")]
    TruncatedChecksum {
        /// Offset of the 0x0e01 magic.
        offset: usize,
        /// Bytes available after the magic (fewer than 4).
        available: usize,
    },

    /// The CRC32C stored in the frame does not match the one computed over
    /// `[metadataSize][metadata][payload]`.
    ///
    /// The frame boundaries were intact, so the byte stream is still in
    /// sync: the whole frame (`frame_len` bytes) has been consumed and the
    /// connection can go on. A broker answers a SEND with this error by a
    /// SEND_ERROR carrying `ServerError::ChecksumError`, using the producer
    /// and sequence ids from `command`.
    #[error("checksum mismatch: frame carries {expected:#010x}, computed {actual:#010x}")]
    ChecksumMismatch {
        /// Checksum stored in the frame.
        expected: u32,
        /// Checksum computed over the received bytes.
        actual: u32,
        /// Length of the whole frame including its `totalSize` field.
        frame_len: usize,
        /// The decoded command of the frame (SEND or MESSAGE).
        command: Box<BaseCommand>,
    },

    /// The `[metadataSize][MessageMetadata]` section is cut short or its
    /// size points past the end of the frame / entry.
    #[error(
        "message metadata at offset {offset} needs {needed} bytes but only {available} remain"
    )]
    TruncatedMetadata {
        /// Offset of the `metadataSize` field.
        offset: usize,
        /// Bytes needed from `offset` (size field + metadata).
        needed: u64,
        /// Bytes available from `offset` to the end.
        available: usize,
    },

    /// The `MessageMetadata` protobuf is malformed.
    #[error("malformed MessageMetadata at offset {offset}: {source}")]
    MetadataDecode {
        /// Offset of the protobuf bytes.
        offset: usize,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },
}

impl FrameError {
    /// Whether the connection cannot sensibly continue after this error.
    ///
    /// Only [`FrameError::ChecksumMismatch`] is non-fatal: Pulsar brokers
    /// reply with a SEND_ERROR and keep the connection, and clients discard
    /// the message. Every other error means the peer does not speak the
    /// protocol correctly.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, FrameError::ChecksumMismatch { .. })
    }
}

/// Why a frame, entry or batch could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A length does not fit the u32 (or, for batch payload sizes, i32)
    /// field the wire format gives it.
    #[error("{what} of {size} bytes does not fit its {max}-byte wire field")]
    TooLarge {
        /// Which length overflowed.
        what: &'static str,
        /// The length.
        size: u64,
        /// The largest value the field can carry.
        max: u64,
    },

    /// The bytes given as broker-entry-metadata prefix are not a well-formed
    /// `[0x0e02 u16][size u32][BrokerEntryMetadata]` section.
    #[error("broker entry metadata prefix is malformed (expected 0x0e02 magic and matching size)")]
    InvalidBrokerEntryMetadataPrefix,
}

/// Why a batch payload could not be split into its messages.
///
/// `index` is the position of the message in the batch (0-based) and
/// `offset` is a byte offset from the start of the batch payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Fewer than 4 bytes left where a `singleMetaSize` field was expected.
    #[error(
        "batch message {index}: size field at offset {offset} truncated ({available} bytes left)"
    )]
    TruncatedHeader {
        /// Message index.
        index: u32,
        /// Offset of the size field.
        offset: usize,
        /// Bytes left.
        available: usize,
    },

    /// `singleMetaSize` points past the end of the batch payload.
    #[error(
        "batch message {index}: metadata of {size} bytes at offset {offset} exceeds the {available} bytes left"
    )]
    MetadataSizeExceedsBatch {
        /// Message index.
        index: u32,
        /// Offset of the metadata bytes.
        offset: usize,
        /// The `singleMetaSize` value.
        size: u32,
        /// Bytes left.
        available: usize,
    },

    /// The `SingleMessageMetadata` protobuf is malformed.
    #[error("batch message {index}: malformed SingleMessageMetadata at offset {offset}: {source}")]
    MetadataDecode {
        /// Message index.
        index: u32,
        /// Offset of the metadata bytes.
        offset: usize,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },

    /// `payload_size` is negative.
    #[error("batch message {index}: negative payload size {size}")]
    NegativePayloadSize {
        /// Message index.
        index: u32,
        /// The `payload_size` value.
        size: i32,
    },

    /// `payload_size` points past the end of the batch payload.
    #[error(
        "batch message {index}: payload of {size} bytes at offset {offset} exceeds the {available} bytes left"
    )]
    PayloadExceedsBatch {
        /// Message index.
        index: u32,
        /// Offset of the payload bytes.
        offset: usize,
        /// The `payload_size` value.
        size: i32,
        /// Bytes left.
        available: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_checksum_mismatch_is_recoverable() {
        let mismatch = FrameError::ChecksumMismatch {
            expected: 1,
            actual: 2,
            frame_len: 10,
            command: Box::default(),
        };
        assert!(!mismatch.is_fatal());
        assert!(mismatch.to_string().contains("0x00000001"));
        assert!(FrameError::FrameTooSmall { total_size: 1 }.is_fatal());
        assert!(FrameError::FrameTooLarge { size: 10, max: 5 }.is_fatal());
    }
}
