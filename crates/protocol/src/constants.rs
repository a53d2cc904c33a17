//! Wire constants of the Pulsar binary protocol: magic numbers, size limits
//! and the protocol version Magnetar speaks.

/// Magic number that introduces the CRC32C checksum section of a payload
/// frame: `[0x0e01 u16][crc32c u32]`.
pub const MAGIC_CRC32C: u16 = 0x0e01;

/// Magic number that introduces the broker-entry-metadata section of a
/// payload frame: `[0x0e02 u16][size u32][BrokerEntryMetadata]` (PIP-90).
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;

/// Default maximum message size (metadata + payload of one entry): 5 MiB.
///
/// The broker may advertise another value in `CommandConnected.max_message_size`.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 5 * 1024 * 1024;

/// Room allowed on top of the maximum message size for the command, the
/// checksum and other frame headers: 10 KiB.
pub const MESSAGE_SIZE_FRAME_PADDING: usize = 10 * 1024;

/// Default maximum frame size: [`DEFAULT_MAX_MESSAGE_SIZE`] +
/// [`MESSAGE_SIZE_FRAME_PADDING`] = 5 253 120 bytes (Pulsar's
/// `nettyMaxFrameSizeBytes`).
pub const DEFAULT_MAX_FRAME_SIZE: usize = DEFAULT_MAX_MESSAGE_SIZE + MESSAGE_SIZE_FRAME_PADDING;

/// Highest protocol version Magnetar speaks (`ProtocolVersion::V21`).
pub const CURRENT_PROTOCOL_VERSION: i32 = 21;

/// Size of the leading `totalSize` field of every frame.
pub const FRAME_SIZE_FIELD_LEN: usize = 4;

/// Size of the `commandSize` field that follows `totalSize`.
pub const COMMAND_SIZE_FIELD_LEN: usize = 4;

/// Size of a magic number field.
pub const MAGIC_LEN: usize = 2;

/// Size of the CRC32C value that follows [`MAGIC_CRC32C`].
pub const CHECKSUM_LEN: usize = 4;

/// Size of the `size` field that follows [`MAGIC_BROKER_ENTRY_METADATA`].
pub const BROKER_ENTRY_METADATA_SIZE_FIELD_LEN: usize = 4;

/// Size of the `metadataSize` field that precedes `MessageMetadata`.
pub const METADATA_SIZE_FIELD_LEN: usize = 4;

/// Size of the `singleMetaSize` field that precedes each
/// `SingleMessageMetadata` inside a batch payload.
pub const SINGLE_METADATA_SIZE_FIELD_LEN: usize = 4;

/// Maximum frame size (including the `totalSize` field) for a given maximum
/// message size: `max_message_size + MESSAGE_SIZE_FRAME_PADDING`, saturating.
pub const fn max_frame_size_for(max_message_size: usize) -> usize {
    max_message_size.saturating_add(MESSAGE_SIZE_FRAME_PADDING)
}

/// Protocol version a broker should answer in CONNECTED for a client that
/// announced `client_version`: `min(client_version, CURRENT_PROTOCOL_VERSION)`,
/// never below 0.
pub const fn negotiate_protocol_version(client_version: i32) -> i32 {
    let v = if client_version < CURRENT_PROTOCOL_VERSION {
        client_version
    } else {
        CURRENT_PROTOCOL_VERSION
    };
    if v < 0 {
        0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ProtocolVersion;

    #[test]
    fn limits_match_pulsar_defaults() {
        assert_eq!(DEFAULT_MAX_MESSAGE_SIZE, 5_242_880);
        assert_eq!(MESSAGE_SIZE_FRAME_PADDING, 10_240);
        assert_eq!(DEFAULT_MAX_FRAME_SIZE, 5_253_120);
        assert_eq!(max_frame_size_for(DEFAULT_MAX_MESSAGE_SIZE), DEFAULT_MAX_FRAME_SIZE);
        assert_eq!(max_frame_size_for(usize::MAX), usize::MAX);
    }

    #[test]
    fn current_version_is_the_last_enum_value() {
        assert_eq!(CURRENT_PROTOCOL_VERSION, ProtocolVersion::V21 as i32);
        assert!(ProtocolVersion::try_from(CURRENT_PROTOCOL_VERSION + 1).is_err());
    }

    #[test]
    fn negotiation_caps_and_floors() {
        assert_eq!(negotiate_protocol_version(20), 20);
        assert_eq!(negotiate_protocol_version(21), 21);
        assert_eq!(negotiate_protocol_version(99), 21);
        assert_eq!(negotiate_protocol_version(-3), 0);
    }
}
