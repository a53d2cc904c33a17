//! Typed errors of the cursor acknowledgement state.
//!
//! `AckError` rejects a client acknowledgement that cannot be applied (it names a position the
//! topic does not have, or a malformed batch); the state is left unchanged when one is returned.
//! `CursorStateError` rejects persisted bytes that are not a valid encoded state; decoding never
//! panics and never returns a partially decoded state.

use super::batch::MAX_BATCH_SIZE;
use super::position::Position;

/// Why an acknowledgement was rejected. The state is unchanged when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// The position is after the mark-delete position but the ledger list has no such entry
    /// (unknown or deleted ledger, or an entry id past the ledger's end).
    #[error("position {position} does not exist in the topic's ledgers")]
    UnknownPosition { position: Position },
    /// A batch must hold between 1 and `MAX_BATCH_SIZE` messages.
    #[error("batch size {batch_size} is outside 1..={MAX_BATCH_SIZE}")]
    InvalidBatchSize { batch_size: u32 },
    /// A batch index must be below the batch size.
    #[error("batch index {index} is outside the batch of {batch_size} at {position}")]
    BatchIndexOutOfRange { position: Position, index: u32, batch_size: u32 },
    /// The entry was partially acknowledged before with a different batch size.
    #[error("batch at {position} was acknowledged with size {known} before, now with {given}")]
    BatchSizeMismatch { position: Position, known: u32, given: u32 },
}

/// Why persisted cursor-state bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CursorStateError {
    /// The input ends before a field it announces.
    #[error("cursor state truncated at byte {offset}: need {need} bytes, have {have}")]
    Truncated { offset: usize, need: usize, have: usize },
    /// The input does not start with the cursor-state magic.
    #[error("not a cursor ack state: magic is {found:02x?}")]
    BadMagic { found: [u8; 4] },
    /// Written by a newer (or unknown) format version.
    #[error("unsupported cursor state format version {version}")]
    UnsupportedVersion { version: u8 },
    /// Flag bits this version does not define are set.
    #[error("unknown cursor state flags {flags:#04x}")]
    UnknownFlags { flags: u8 },
    /// The trailing CRC32C does not match the content.
    #[error("cursor state checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
    /// A varint is longer than 64 bits allow.
    #[error("varint at byte {offset} overflows 64 bits")]
    VarintOverflow { offset: usize },
    /// A field holds a value the format forbids (out of range, out of order, empty).
    #[error("invalid cursor state at byte {offset}: {reason}")]
    Invalid { offset: usize, reason: &'static str },
    /// Bytes remain after the last field.
    #[error("{remaining} unexpected bytes after the cursor state at byte {offset}")]
    TrailingBytes { offset: usize, remaining: usize },
}
