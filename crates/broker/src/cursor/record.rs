//! The cursor record: what the metadata store keeps at a durable subscription's cursor key
//! (`magnetar_model::keys::cursor_key`). The acknowledgement state itself lives in the
//! subscription's cursor ledger (one encoded [`AckState`] per entry, the last one current); the
//! record points at that ledger and carries a small snapshot, as Pulsar's `ManagedCursorInfo`
//! does (`cursorsLedgerId`, `markDeleteLedgerId/EntryId`, `individualDeletedMessages` when few).
//!
//! Layout (record format version 1; varints as in `codec.rs`):
//!
//! ```text
//! magic          4 bytes  "MCUR" (Magnetar CUrsor Record)
//! version        u8       1
//! flags          u8       bit 0: a mark-delete position follows
//!                         bit 1: an inline state follows; other bits must be 0
//! ledger         varint   the cursor ledger whose last entry is the current state
//! [mark-delete]  varint ledger_id, varint entry_id
//! obsolete       varint count (<= MAX_OBSOLETE_LEDGERS), then that many varint ledger ids:
//!                ledgers no longer in use, deleted by whoever loads or rolls the cursor next
//! [inline]       varint length (<= MAX_INLINE_STATE_BYTES), then an `AckState::encode` output
//! crc32c         u32 little-endian, over every preceding byte
//! ```
//!
//! Older versions stored the raw [`AckState`] encoding (magic "MCAS") at the same key:
//! [`CursorValue::decode`] tells the two apart by their magic and reads both.
//!
//! A record is at most [`MAX_RECORD_BYTES`], far below etcd's 1.5 MiB request limit, whatever
//! the acknowledgement state holds.

use super::codec::{checked_body, put_varint};
use super::error::CursorStateError;
use super::position::Position;
use super::state::AckState;

const MAGIC: [u8; 4] = *b"MCUR";
/// The magic of the raw [`AckState`] encoding older versions stored at the cursor key.
const LEGACY_MAGIC: [u8; 4] = *b"MCAS";
const FORMAT_VERSION: u8 = 1;
const FLAG_MARK_DELETE: u8 = 0b01;
const FLAG_INLINE: u8 = 0b10;
const KNOWN_FLAGS: u8 = FLAG_MARK_DELETE | FLAG_INLINE;

/// Largest encoded state kept inline in the record (Pulsar keeps the individually deleted
/// ranges in the cursor's metadata only when they are few).
pub const MAX_INLINE_STATE_BYTES: usize = 1024;
/// Most obsolete ledgers a record names (more are left out and reported by the writer).
pub const MAX_OBSOLETE_LEDGERS: usize = 16;
/// Upper bound of an encoded record: header, three positions' worth of varints, the obsolete
/// ledgers, the inline state and the checksum fit in it.
pub const MAX_RECORD_BYTES: usize = 4096;

/// What the metadata store holds at a durable subscription's cursor key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorRecord {
    /// The cursor ledger whose last entry is the current state.
    pub ledger: u64,
    /// Ledgers no longer in use, still to delete (a rollover or load that stopped before
    /// deleting the ledger it replaced leaves it here).
    pub obsolete: Vec<u64>,
    /// The mark-delete position when the record was written.
    pub mark_delete: Option<Position>,
    /// The whole encoded state when the record was written, if it was small.
    pub inline_state: Option<Vec<u8>>,
}

/// A decoded cursor-key value: the current record, or the raw state older versions wrote.
#[derive(Debug)]
pub enum CursorValue {
    Record(CursorRecord),
    Legacy(AckState),
}

impl CursorValue {
    /// Decodes a cursor-key value of either format. Never panics on malformed input.
    pub fn decode(bytes: &[u8]) -> Result<CursorValue, CursorStateError> {
        if bytes.starts_with(&LEGACY_MAGIC) {
            return AckState::decode(bytes).map(CursorValue::Legacy);
        }
        CursorRecord::decode(bytes).map(CursorValue::Record)
    }
}

impl CursorRecord {
    /// A record for `ledger` with a snapshot of the state: its mark-delete, and the encoded
    /// state itself if it is at most [`MAX_INLINE_STATE_BYTES`].
    pub fn new(
        ledger: u64,
        obsolete: Vec<u64>,
        mark_delete: Option<Position>,
        encoded_state: &[u8],
    ) -> Self {
        let inline_state =
            (encoded_state.len() <= MAX_INLINE_STATE_BYTES).then(|| encoded_state.to_vec());
        CursorRecord { ledger, obsolete, mark_delete, inline_state }
    }

    /// The snapshot as a state: the inline state if there is one (and it decodes), else the
    /// mark-delete position alone (what was individually acknowledged after it is redelivered).
    pub fn snapshot(&self) -> AckState {
        // (The record's checksum covers the inline state: it decodes unless a writer erred.)
        self.inline_state
            .as_deref()
            .and_then(|inline| AckState::decode(inline).ok())
            .unwrap_or_else(|| AckState::new(self.mark_delete))
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.obsolete.len() <= MAX_OBSOLETE_LEDGERS, "too many obsolete ledgers");
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&MAGIC);
        out.push(FORMAT_VERSION);
        let mut flags = 0;
        if self.mark_delete.is_some() {
            flags |= FLAG_MARK_DELETE;
        }
        if self.inline_state.is_some() {
            flags |= FLAG_INLINE;
        }
        out.push(flags);
        put_varint(&mut out, self.ledger);
        if let Some(position) = self.mark_delete {
            put_varint(&mut out, position.ledger_id);
            put_varint(&mut out, position.entry_id);
        }
        put_varint(&mut out, self.obsolete.len() as u64);
        for &ledger in &self.obsolete {
            put_varint(&mut out, ledger);
        }
        if let Some(inline) = &self.inline_state {
            assert!(inline.len() <= MAX_INLINE_STATE_BYTES, "inline state too large");
            put_varint(&mut out, inline.len() as u64);
            out.extend_from_slice(inline);
        }
        let checksum = crc32c::crc32c(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        assert!(out.len() <= MAX_RECORD_BYTES, "cursor record of {} bytes", out.len());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<CursorRecord, CursorStateError> {
        let (body, mut reader) = checked_body(bytes, MAGIC, FORMAT_VERSION)?;
        let flags = reader.byte()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(CursorStateError::UnknownFlags { flags });
        }
        let ledger = reader.varint()?;
        let mark_delete = if flags & FLAG_MARK_DELETE != 0 {
            Some(Position::new(reader.varint()?, reader.varint()?))
        } else {
            None
        };
        let count = reader.varint()?;
        if count > MAX_OBSOLETE_LEDGERS as u64 {
            return Err(reader.invalid("too many obsolete ledgers"));
        }
        let mut obsolete = Vec::with_capacity(count as usize);
        for _ in 0..count {
            obsolete.push(reader.varint()?);
        }
        let inline_state = if flags & FLAG_INLINE != 0 {
            let length = reader.varint()?;
            if length > MAX_INLINE_STATE_BYTES as u64 {
                return Err(reader.invalid("inline state too large"));
            }
            Some(reader.take(length as usize)?.to_vec())
        } else {
            None
        };
        if reader.offset != body.len() {
            return Err(CursorStateError::TrailingBytes {
                offset: reader.offset,
                remaining: body.len() - reader.offset,
            });
        }
        Ok(CursorRecord { ledger, obsolete, mark_delete, inline_state })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::LedgerList;

    fn state_with_holes() -> AckState {
        let mut ledgers = LedgerList::new();
        ledgers.set_entry_count(5, 100_000);
        let mut state = AckState::new(Some(Position::new(5, 9)));
        for entry in (20..100_000).step_by(37) {
            state.ack_individual(Position::new(5, entry), &ledgers).unwrap();
        }
        state
    }

    #[test]
    fn round_trips_with_and_without_an_inline_state() {
        let small = AckState::new(Some(Position::new(3, 4))).encode();
        let record = CursorRecord::new(42, vec![7, 8], Some(Position::new(3, 4)), &small);
        assert!(record.inline_state.is_some());
        let decoded = CursorRecord::decode(&record.encode()).unwrap();
        assert_eq!(decoded, record);
        assert_eq!(decoded.snapshot().mark_delete(), Some(Position::new(3, 4)));

        let big = state_with_holes();
        let encoded = big.encode();
        assert!(encoded.len() > MAX_INLINE_STATE_BYTES, "{} bytes", encoded.len());
        let record = CursorRecord::new(43, vec![], big.mark_delete(), &encoded);
        assert!(record.inline_state.is_none(), "a big state stays in the ledger");
        let bytes = record.encode();
        assert!(bytes.len() < 64, "{} bytes", bytes.len());
        let decoded = CursorRecord::decode(&bytes).unwrap();
        assert_eq!(decoded, record);
        let snapshot = decoded.snapshot();
        assert_eq!(snapshot.mark_delete(), big.mark_delete());
        assert_eq!(snapshot.individually_acked_count(), 0, "holes are not in the snapshot");
    }

    #[test]
    fn the_largest_record_stays_within_its_bound() {
        let inline = vec![0u8; MAX_INLINE_STATE_BYTES];
        let record = CursorRecord {
            ledger: u64::MAX,
            obsolete: vec![u64::MAX; MAX_OBSOLETE_LEDGERS],
            mark_delete: Some(Position::new(u64::MAX, u64::MAX)),
            inline_state: Some(inline),
        };
        let bytes = record.encode();
        assert!(bytes.len() <= MAX_RECORD_BYTES);
        assert_eq!(CursorRecord::decode(&bytes).unwrap(), record);
    }

    #[test]
    fn tells_the_legacy_raw_state_from_a_record() {
        let state = state_with_holes();
        match CursorValue::decode(&state.encode()).unwrap() {
            CursorValue::Legacy(decoded) => assert_eq!(decoded.encode(), state.encode()),
            other => panic!("{other:?}"),
        }
        let record = CursorRecord::new(1, vec![], None, &AckState::new(None).encode());
        assert!(matches!(CursorValue::decode(&record.encode()), Ok(CursorValue::Record(_))));
    }

    #[test]
    fn malformed_records_are_errors_never_panics() {
        let record = CursorRecord::new(9, vec![1, 2, 3], Some(Position::new(1, 2)), b"abc");
        let bytes = record.encode();
        for cut in 0..bytes.len() {
            assert!(CursorValue::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for index in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[index] ^= 0x40;
            assert!(CursorValue::decode(&flipped).is_err(), "flip at {index}");
        }
        assert!(CursorValue::decode(b"{\"json\": true}").is_err());
    }
}
