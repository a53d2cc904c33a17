//! Frames of the Pulsar binary protocol: the decoded [`Frame`] type, the
//! incremental [`FrameDecoder`] and the encoders.
//!
//! Every frame on a connection carries exactly one `BaseCommand`. All
//! integers are unsigned 32-bit (or 16-bit for magics) **big-endian**.
//!
//! # Simple command
//!
//! ```text
//!  0        4          8                     8+commandSize
//!  +--------+----------+---------------------+
//!  |totalSz |commandSz | BaseCommand         |
//!  |  u32   |   u32    | (commandSize bytes) |
//!  +--------+----------+---------------------+
//!  totalSize   = 4 + commandSize        (counts every byte after itself)
//! ```
//!
//! # Payload command (SEND client->broker, MESSAGE broker->client)
//!
//! ```text
//!  +--------+----------+-------------+
//!  |totalSz |commandSz | BaseCommand |
//!  +--------+----------+-------------+
//!  optional broker entry metadata (PIP-90), only from brokers / in stored entries:
//!  +--------+--------+---------------------+
//!  | 0x0e02 | bemSz  | BrokerEntryMetadata |
//!  |  u16   |  u32   | (bemSz bytes)       |
//!  +--------+--------+---------------------+
//!  optional checksum (always written by official clients and by us):
//!  +--------+--------+
//!  | 0x0e01 | CRC32C |   CRC32C (Castagnoli) of every byte after this field,
//!  |  u16   |  u32   |   i.e. of [metadataSize][MessageMetadata][payload]
//!  +--------+--------+
//!  entry proper ("metadata and payload", what the broker stores):
//!  +------------+-----------------+-----------------------------+
//!  | metadataSz | MessageMetadata | payload (up to frame end)   |
//!  |    u32     | (metadataSz)    | single message or a batch   |
//!  +------------+-----------------+-----------------------------+
//! ```
//!
//! The broker-entry-metadata section, when present, sits *before* the
//! checksum magic and is not covered by the checksum. Both optional sections
//! are recognised by their 2-byte magic. A section without magic is taken to
//! start with `metadataSize`; the two cannot be confused because a
//! `metadataSize` starting with 0x0e01 or 0x0e02 would be over 235 MB, far
//! beyond any frame limit.
//!
//! When the checksum magic is absent there is nothing to verify (Pulsar
//! clients below protocol v6 omit it). Go clients reject MESSAGE frames
//! without it, so the encoders here always write it.
//!
//! Only SEND and MESSAGE frames are parsed for a payload section; bytes after
//! the command of any other frame are ignored, as Pulsar's own decoder does.
//!
//! # Decoding
//!
//! [`FrameDecoder`] is stateless apart from its size limit and can be
//! called again on the same buffer as more bytes arrive: it answers
//! `Ok(None)` until a whole frame is buffered. Oversized frames are
//! rejected as soon as the 4-byte `totalSize` is readable.
//!
//! # Encoding
//!
//! [`encode_command`] writes a simple frame; [`encode_payload_command`]
//! writes a payload frame and computes the checksum;
//! [`encode_payload_command_header`] writes everything up to the checksum so
//! the stored entry bytes can be sent with a vectored write without copying.
//! [`encode_metadata_and_payload`] builds the stored-entry bytes and
//! [`broker_entry_metadata_prefix`] the optional 0x0e02 section.

pub(crate) mod decode;
pub(crate) mod encode;

pub use decode::{parse_metadata_and_payload, FrameDecoder};
pub use encode::{
    broker_entry_metadata_prefix, encode_command, encode_metadata_and_payload,
    encode_payload_command, encode_payload_command_header, metadata_and_payload,
};

use bytes::Bytes;

use crate::proto::{base_command, BaseCommand, BrokerEntryMetadata, MessageMetadata};

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The command every frame carries.
    pub command: BaseCommand,
    /// The metadata/payload section of SEND and MESSAGE frames; `None` for
    /// every other command.
    pub payload: Option<PayloadSection>,
}

impl Frame {
    /// The command type, or `None` if the peer sent a type number this
    /// crate does not know (e.g. a future command).
    ///
    /// Prefer this over prost's `BaseCommand::r#type()` accessor, which
    /// silently maps unknown numbers to the first enum value.
    pub fn command_type(&self) -> Option<base_command::Type> {
        crate::commands::command_type(&self.command)
    }
}

/// Everything that follows the command in a SEND or MESSAGE frame.
///
/// All `Bytes` fields are zero-copy views into the frame buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadSection {
    /// The complete broker-entry-metadata section as received,
    /// `[0x0e02 u16][size u32][BrokerEntryMetadata]`, if present. It can be
    /// passed unchanged to [`encode_payload_command`].
    pub broker_entry_metadata_raw: Option<Bytes>,
    /// The decoded broker entry metadata, if present.
    pub broker_entry_metadata: Option<BrokerEntryMetadata>,
    /// The CRC32C carried by the frame, if the 0x0e01 magic was present.
    /// A present checksum has been verified: a mismatch is reported as
    /// [`crate::FrameError::ChecksumMismatch`] instead of a frame.
    pub checksum: Option<u32>,
    /// `[metadataSize u32][MessageMetadata][payload]`: the entry as the
    /// broker stores it and as it is sent back in MESSAGE frames.
    pub metadata_and_payload: Bytes,
    /// The decoded message metadata.
    pub metadata: MessageMetadata,
    /// The payload after the metadata (possibly compressed, possibly a batch).
    pub payload: Bytes,
}

impl PayloadSection {
    /// Whether the frame carried a checksum (which then was valid).
    pub fn has_verified_checksum(&self) -> bool {
        self.checksum.is_some()
    }
}
