//! Cursor acknowledgement state: which entries of a topic a subscription has acknowledged.
//!
//! A cursor is a mark-delete position (everything at or before it is acknowledged) plus the
//! entries acknowledged individually after it; the unacknowledged entries in between are the
//! "ack holes" that must be redelivered. An entry may be a batch of messages acknowledged message
//! by message (Pulsar's `ack_set`, set bit = still unacknowledged), so partially acknowledged
//! batches are tracked per entry until every message is acknowledged.
//!
//! This module is a pure data structure: no I/O, no async, no clock. The broker feeds it
//! acknowledgements plus the topic's ledger layout ([`LedgerBoundaries`]) and appends
//! [`AckState::encode`] output to the subscription's cursor ledger; the metadata store keeps a
//! small [`CursorRecord`] pointing at that ledger (`record.rs`, and `crate::cursor_ledger`).
//!
//! # Design
//! - Individually acked positions are a *set* grouped per ledger into 65,536-entry chunks, each a
//!   run list or a bitmap, whichever is smaller (`chunk.rs`). Ledger adjacency (last entry of
//!   ledger A touching the first of the next non-empty ledger B) is taken from the layout when it
//!   matters: advancing the mark-delete and counting ranges. So closing, adding, emptying or
//!   deleting ledgers never requires re-merging stored ranges.
//! - Memory per acked range (`AckState::approximate_heap_bytes`): a run costs 4 bytes (two
//!   `u16` offsets), up to 16 with `Vec` slack (capacity is shrunk once it exceeds 4x the runs).
//!   A chunk never costs more than its 8 KiB bitmap and only stays a bitmap while it holds at
//!   least 1024 runs, so a bitmap costs at most 8 bytes per range. Each non-empty chunk adds about
//!   80 bytes of map slot. Measured: every other entry acked over 10 million entries (5 million
//!   ranges) takes 1.65 MB, 0.33 bytes per range; one acked entry in 50 takes 6.3 bytes per range.
//! - Encoded size (`codec.rs`): every chunk in its smaller form, varint-delta runs or a trimmed
//!   bitmap. Measured: 1 million ranges of every-other-entry acks encode to 250,532 bytes
//!   (0.25 bytes per range); sparse holes (one acked entry in 100) cost 2.0 bytes per range.
//! - Persist cap: Pulsar's `managedLedgerMaxUnackedRangesToPersist` (10,000) exists because each
//!   range costs a protobuf message, and acks past it are silently lost on reload. Here
//!   [`PersistLimits`] defaults to 1 MiB and 10 million ranges: about 4 million dense or 500,000
//!   sparse ranges fit. Past the limits the ranges furthest from the mark-delete are left out
//!   and reported ([`EncodedAckState::dropped_from`]); they are redelivered, never lost.
//!
//! # Invariants
//! See `state.rs`: acked positions and partial batches are strictly after the mark-delete and
//! disjoint, and the mark-delete has always advanced over the acked run right after it.

mod acked;
mod batch;
mod chunk;
mod codec;
mod error;
mod position;
mod record;
mod state;

#[cfg(test)]
mod model_tests;

pub use batch::{BatchAckState, MAX_BATCH_SIZE};
pub use codec::{
    EncodedAckState, PersistLimits, DEFAULT_MAX_ENCODED_BYTES, DEFAULT_MAX_PERSISTED_RANGES,
};
pub use error::{AckError, CursorStateError};
pub use position::{
    entries_after, entries_between, entry_count, next_position, position_exists, EntryRange,
    LedgerBoundaries, LedgerExtent, LedgerList, Position, PositionRange,
};
pub use record::{
    CursorRecord, CursorValue, MAX_INLINE_STATE_BYTES, MAX_OBSOLETE_LEDGERS, MAX_RECORD_BYTES,
};
pub use state::{AckOutcome, AckState, UnackedRanges};
