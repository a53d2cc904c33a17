//! Compact, versioned binary encoding of an [`AckState`] for the metadata store.
//!
//! Layout (format version 1; varints are unsigned LEB128, at most 10 bytes):
//!
//! ```text
//! magic          4 bytes  "MCAS" (Magnetar Cursor Ack State)
//! version        u8       1
//! flags          u8       bit 0: a mark-delete position follows; other bits must be 0
//! [mark-delete]  varint ledger_id, varint entry_id
//! ledger_groups  varint count, then per ledger (ascending):
//!   ledger_delta   varint  ledger_id - previous ledger_id (the first group is relative to the
//!                          mark-delete ledger, or to 0); must be >= 1 after the first group
//!   chunk_count    varint  >= 1, then per non-empty 65,536-entry chunk (ascending):
//!     chunk_delta    varint  chunk_index - previous chunk_index (the first is absolute);
//!                            >= 1 after the first; entry_id = chunk_index << 16 | offset
//!     kind           u8      0 = runs, 1 = bitmap
//!     runs:   varint run_count (1..=32768), then per run:
//!             varint gap  (first run: its first offset; later runs: first - previous last - 2,
//!                          so touching runs are unrepresentable)
//!             varint length - 1
//!     bitmap: varint first_word, varint word_count (>= 1, first_word + word_count <= 1024),
//!             word_count x u64 little-endian (bit i of word w = offset 64 * w + i), not all 0
//! partial_batches varint count, then per batch (ascending position):
//!   varint ledger_id, varint entry_id, varint batch_size (1..=65536),
//!   ceil(batch_size / 64) x u64 little-endian: Pulsar ack_set, set bit = message unacked
//! crc32c         u32 little-endian, over every preceding byte
//! ```
//!
//! Each chunk is written in whichever of the two forms is smaller. Every other entry acked costs
//! one bit per entry (bitmap, ~0.25 bytes per range); sparse holes cost ~2 bytes per range (runs
//! with one-byte varints), at worst 6 bytes plus chunk overhead.
//!
//! Decoding is strict (order, ranges, no trailing bytes, checksum) and never panics: malformed
//! input returns a [`CursorStateError`]. Counts read from the input never size an allocation
//! beyond the format's fixed maxima.

use std::collections::BTreeMap;

use super::acked::{AckedEntries, ChunkKey, MAX_CHUNK_INDEX};
use super::batch::{word_count, BatchAckState, MAX_BATCH_SIZE};
use super::chunk::{Bitmap, Chunk, Run, BITMAP_WORDS, CHUNK_ENTRIES};
use super::error::CursorStateError;
use super::position::Position;
use super::state::AckState;

const MAGIC: [u8; 4] = *b"MCAS";
const FORMAT_VERSION: u8 = 1;
const FLAG_HAS_MARK_DELETE: u8 = 0b1;
const KNOWN_FLAGS: u8 = FLAG_HAS_MARK_DELETE;
const KIND_RUNS: u8 = 0;
const KIND_BITMAP: u8 = 1;
const HEADER_LEN: usize = MAGIC.len() + 2;
const CHECKSUM_LEN: usize = 4;
/// At most every other offset of a chunk starts a run.
const MAX_RUNS_PER_CHUNK: u64 = CHUNK_ENTRIES as u64 / 2;
/// Generous upper bound for the varint counts written around the groups and batches.
const COUNT_FIELDS_MAX_LEN: usize = 3 * 10;

/// Default cap on persisted acked ranges: 1000x Pulsar's `managedLedgerMaxUnackedRangesToPersist`
/// (10,000), affordable because a range costs bytes, not a protobuf message.
pub const DEFAULT_MAX_PERSISTED_RANGES: u64 = 10_000_000;
/// Default cap on the encoded size (1 MiB): what a durable subscription appends to its cursor
/// ledger per persist at most.
pub const DEFAULT_MAX_ENCODED_BYTES: usize = 1 << 20;

/// Bounds on what [`AckState::encode_with_limits`] writes. Anything beyond them is left out and
/// will be redelivered after a reload (at-least-once is preserved; nothing is lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PersistLimits {
    /// Acked ranges to keep (counted per chunk, so a range crossing a 65,536-entry chunk
    /// boundary counts twice: a conservative count).
    pub max_ranges: u64,
    /// Encoded bytes to stay under. Partial batches may use up to a quarter of it.
    pub max_bytes: usize,
}

impl Default for PersistLimits {
    fn default() -> Self {
        Self { max_ranges: DEFAULT_MAX_PERSISTED_RANGES, max_bytes: DEFAULT_MAX_ENCODED_BYTES }
    }
}

impl PersistLimits {
    pub const UNLIMITED: PersistLimits =
        PersistLimits { max_ranges: u64::MAX, max_bytes: usize::MAX };
}

/// The result of [`AckState::encode_with_limits`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedAckState {
    pub bytes: Vec<u8>,
    /// Acked ranges written (per chunk, see [`PersistLimits::max_ranges`]).
    pub persisted_ranges: u64,
    /// The first acked position left out, when the limits cut the acked set short.
    pub dropped_from: Option<Position>,
    /// Partial batches left out (they will be redelivered whole).
    pub dropped_partial_batches: usize,
}

impl AckState {
    /// Encodes the whole state (no limits).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with_limits(&PersistLimits::UNLIMITED).bytes
    }

    /// Encodes as much of the state as `limits` allow, keeping the acks nearest the mark-delete.
    pub fn encode_with_limits(&self, limits: &PersistLimits) -> EncodedAckState {
        let mut header = Vec::with_capacity(HEADER_LEN + 20);
        header.extend_from_slice(&MAGIC);
        header.push(FORMAT_VERSION);
        let mark_delete = self.mark_delete();
        header.push(if mark_delete.is_some() { FLAG_HAS_MARK_DELETE } else { 0 });
        if let Some(position) = mark_delete {
            put_varint(&mut header, position.ledger_id);
            put_varint(&mut header, position.entry_id);
        }

        let (batches, batch_count, dropped_partial_batches) =
            self.encode_batches(limits.max_bytes / 4);
        let fixed_len = header.len() + batches.len() + CHECKSUM_LEN + COUNT_FIELDS_MAX_LEN;
        let mut groups = GroupWriter::new(
            mark_delete.map_or(0, |position| position.ledger_id),
            limits.max_ranges,
            limits.max_bytes.saturating_sub(fixed_len),
        );
        for (key, chunk) in self.acked().chunks() {
            if !groups.push_chunk(key, chunk) {
                break;
            }
        }
        let (group_bytes, group_count, persisted_ranges, dropped_from) = groups.finish();

        let mut bytes = header;
        put_varint(&mut bytes, group_count);
        bytes.extend_from_slice(&group_bytes);
        put_varint(&mut bytes, batch_count);
        bytes.extend_from_slice(&batches);
        let checksum = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        EncodedAckState { bytes, persisted_ranges, dropped_from, dropped_partial_batches }
    }

    /// Partial batches in position order while they fit in `budget` bytes.
    fn encode_batches(&self, budget: usize) -> (Vec<u8>, u64, usize) {
        let mut out = Vec::new();
        let mut written = 0;
        for (position, batch) in self.partial_batches() {
            let mut entry = Vec::with_capacity(30 + batch.ack_set().len() * 8);
            put_varint(&mut entry, position.ledger_id);
            put_varint(&mut entry, position.entry_id);
            put_varint(&mut entry, u64::from(batch.batch_size()));
            for word in batch.ack_set() {
                entry.extend_from_slice(&word.to_le_bytes());
            }
            if out.len() + entry.len() > budget {
                break;
            }
            out.extend_from_slice(&entry);
            written += 1;
        }
        (out, written, self.partial_batch_count() - written as usize)
    }

    /// Decodes bytes written by [`AckState::encode`]. The result holds exactly what was encoded;
    /// call [`AckState::reconcile`] with the current ledger layout before using it.
    pub fn decode(bytes: &[u8]) -> Result<AckState, CursorStateError> {
        let (body, mut reader) = checked_body(bytes, MAGIC, FORMAT_VERSION)?;
        let state = decode_body(&mut reader)?;
        if reader.offset != body.len() {
            return Err(CursorStateError::TrailingBytes {
                offset: reader.offset,
                remaining: body.len() - reader.offset,
            });
        }
        Ok(state)
    }
}

/// Accumulates ledger groups of chunks within the range and byte budgets.
struct GroupWriter {
    out: Vec<u8>,
    group_count: u64,
    previous_ledger_id: u64,
    /// The ledger being written and its encoded chunks.
    open_group: Option<(u64, u64, Vec<u8>)>,
    previous_chunk_index: u64,
    ranges_left: u64,
    bytes_left: usize,
    persisted_ranges: u64,
    dropped_from: Option<Position>,
}

impl GroupWriter {
    fn new(first_ledger_base: u64, max_ranges: u64, max_bytes: usize) -> Self {
        Self {
            out: Vec::new(),
            group_count: 0,
            previous_ledger_id: first_ledger_base,
            open_group: None,
            previous_chunk_index: 0,
            ranges_left: max_ranges,
            bytes_left: max_bytes,
            persisted_ranges: 0,
            dropped_from: None,
        }
    }

    /// Adds a chunk (clipped to the range budget); returns false once the budget is spent.
    fn push_chunk(&mut self, key: ChunkKey, chunk: &Chunk) -> bool {
        let clipped;
        let mut chunk = chunk;
        if u64::from(chunk.run_count()) > self.ranges_left {
            let kept = self.ranges_left as usize;
            self.dropped_from = chunk.runs().nth(kept).map(|run| key.position(run.first));
            clipped = chunk.first_runs(kept);
            chunk = &clipped;
            if chunk.is_empty() {
                return false;
            }
        }
        let same_ledger =
            matches!(&self.open_group, Some((ledger, _, _)) if *ledger == key.ledger_id);
        if !same_ledger {
            self.close_group();
        }
        let mut encoded = Vec::new();
        let chunk_delta =
            if same_ledger { key.chunk_index - self.previous_chunk_index } else { key.chunk_index };
        put_varint(&mut encoded, chunk_delta);
        encode_chunk(&mut encoded, chunk);
        // A new group also pays for its ledger delta and chunk count.
        let group_overhead = if same_ledger { 0 } else { 20 };
        if encoded.len() + group_overhead > self.bytes_left {
            self.dropped_from = chunk.runs().next().map(|run| key.position(run.first));
            return false;
        }
        self.bytes_left -= encoded.len() + group_overhead;
        self.ranges_left -= u64::from(chunk.run_count());
        self.persisted_ranges += u64::from(chunk.run_count());
        self.previous_chunk_index = key.chunk_index;
        match &mut self.open_group {
            Some((_, chunk_count, bytes)) if same_ledger => {
                *chunk_count += 1;
                bytes.extend_from_slice(&encoded);
            }
            _ => self.open_group = Some((key.ledger_id, 1, encoded)),
        }
        self.dropped_from.is_none()
    }

    fn close_group(&mut self) {
        if let Some((ledger_id, chunk_count, bytes)) = self.open_group.take() {
            // State invariant: acked positions follow the mark-delete, and ledgers ascend.
            assert!(ledger_id >= self.previous_ledger_id);
            put_varint(&mut self.out, ledger_id - self.previous_ledger_id);
            put_varint(&mut self.out, chunk_count);
            self.out.extend_from_slice(&bytes);
            self.previous_ledger_id = ledger_id;
            self.group_count += 1;
        }
    }

    fn finish(mut self) -> (Vec<u8>, u64, u64, Option<Position>) {
        self.close_group();
        (self.out, self.group_count, self.persisted_ranges, self.dropped_from)
    }
}

/// Writes `kind` + payload of `chunk` in its smaller form.
fn encode_chunk(out: &mut Vec<u8>, chunk: &Chunk) {
    let mut runs_len = varint_len(u64::from(chunk.run_count()));
    let mut previous_last: Option<u16> = None;
    for run in chunk.runs() {
        runs_len += varint_len(run_gap(previous_last, run)) + varint_len(u64::from(run.len() - 1));
        previous_last = Some(run.last);
    }
    let first_word = chunk.runs().next().map_or(0, |run| usize::from(run.first) / 64);
    let last_word = chunk.runs().last().map_or(0, |run| usize::from(run.last) / 64);
    let word_count = last_word - first_word + 1;
    let bitmap_len = varint_len(first_word as u64) + varint_len(word_count as u64) + word_count * 8;

    if runs_len <= bitmap_len {
        out.push(KIND_RUNS);
        put_varint(out, u64::from(chunk.run_count()));
        let mut previous_last: Option<u16> = None;
        for run in chunk.runs() {
            put_varint(out, run_gap(previous_last, run));
            put_varint(out, u64::from(run.len() - 1));
            previous_last = Some(run.last);
        }
    } else {
        out.push(KIND_BITMAP);
        put_varint(out, first_word as u64);
        put_varint(out, word_count as u64);
        let bitmap = chunk.to_bitmap();
        for word in &bitmap[first_word..=last_word] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
}

/// Gap before `run`: its first offset for the first run, else the count of absent offsets
/// between the runs minus one (canonical runs never touch, so at least one is absent).
fn run_gap(previous_last: Option<u16>, run: Run) -> u64 {
    match previous_last {
        None => u64::from(run.first),
        Some(last) => u64::from(run.first) - u64::from(last) - 2,
    }
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn decode_body(reader: &mut Reader<'_>) -> Result<AckState, CursorStateError> {
    let flags = reader.byte()?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(CursorStateError::UnknownFlags { flags });
    }
    let mark_delete = if flags & FLAG_HAS_MARK_DELETE != 0 {
        Some(Position::new(reader.varint()?, reader.varint()?))
    } else {
        None
    };
    let acked = decode_groups(reader, mark_delete)?;
    if let (Some(first), Some(mark_delete)) = (acked.first_position(), mark_delete) {
        if first <= mark_delete {
            return Err(reader.invalid("acked position at or before the mark-delete"));
        }
    }
    let partial_batches = decode_batches(reader, mark_delete, &acked)?;
    Ok(AckState::from_parts(mark_delete, acked, partial_batches))
}

fn decode_groups(
    reader: &mut Reader<'_>,
    mark_delete: Option<Position>,
) -> Result<AckedEntries, CursorStateError> {
    let mut acked = AckedEntries::default();
    let group_count = reader.varint()?;
    let mut ledger_id = mark_delete.map_or(0, |position| position.ledger_id);
    for group in 0..group_count {
        let ledger_delta = reader.varint()?;
        if group > 0 && ledger_delta == 0 {
            return Err(reader.invalid("ledger groups out of order"));
        }
        ledger_id = ledger_id
            .checked_add(ledger_delta)
            .ok_or_else(|| reader.invalid("ledger id overflows"))?;
        let chunk_count = reader.varint()?;
        if chunk_count == 0 {
            return Err(reader.invalid("empty ledger group"));
        }
        let mut chunk_index = 0u64;
        for chunk_number in 0..chunk_count {
            let chunk_delta = reader.varint()?;
            if chunk_number > 0 && chunk_delta == 0 {
                return Err(reader.invalid("chunks out of order"));
            }
            chunk_index = chunk_index
                .checked_add(chunk_delta)
                .filter(|index| *index <= MAX_CHUNK_INDEX)
                .ok_or_else(|| reader.invalid("chunk index out of range"))?;
            let chunk = decode_chunk(reader)?;
            acked.push_chunk(ChunkKey { ledger_id, chunk_index }, chunk);
        }
    }
    Ok(acked)
}

fn decode_chunk(reader: &mut Reader<'_>) -> Result<Chunk, CursorStateError> {
    match reader.byte()? {
        KIND_RUNS => {
            let run_count = reader.varint()?;
            if run_count == 0 || run_count > MAX_RUNS_PER_CHUNK {
                return Err(reader.invalid("run count out of range"));
            }
            let mut runs = Vec::with_capacity(run_count as usize);
            // The smallest offset the next run may start at.
            let mut next_free: u64 = 0;
            for _ in 0..run_count {
                let first = reader.varint()?.checked_add(next_free);
                let length_minus_one = reader.varint()?;
                let last = first.and_then(|first| first.checked_add(length_minus_one));
                let (Some(first), Some(last)) = (first, last) else {
                    return Err(reader.invalid("run beyond the chunk"));
                };
                let (Ok(first), Ok(last)) = (u16::try_from(first), u16::try_from(last)) else {
                    return Err(reader.invalid("run beyond the chunk"));
                };
                runs.push(Run { first, last });
                next_free = u64::from(last) + 2;
            }
            Ok(Chunk::from_runs(runs))
        }
        KIND_BITMAP => {
            let first_word = reader.varint()?;
            let word_count = reader.varint()?;
            let words_end = first_word.checked_add(word_count);
            if word_count == 0 || words_end.is_none_or(|end| end > BITMAP_WORDS as u64) {
                return Err(reader.invalid("bitmap words out of range"));
            }
            let mut bitmap: Box<Bitmap> = Box::new([0; BITMAP_WORDS]);
            for word in &mut bitmap[first_word as usize..(first_word + word_count) as usize] {
                *word = reader.u64_le()?;
            }
            let chunk = Chunk::from_bitmap(bitmap);
            if chunk.is_empty() {
                return Err(reader.invalid("empty bitmap chunk"));
            }
            Ok(chunk)
        }
        _ => Err(reader.invalid("unknown chunk kind")),
    }
}

fn decode_batches(
    reader: &mut Reader<'_>,
    mark_delete: Option<Position>,
    acked: &AckedEntries,
) -> Result<BTreeMap<Position, BatchAckState>, CursorStateError> {
    let mut batches = BTreeMap::new();
    let batch_count = reader.varint()?;
    let mut previous: Option<Position> = mark_delete;
    for _ in 0..batch_count {
        let position = Position::new(reader.varint()?, reader.varint()?);
        if previous.is_some_and(|previous| position <= previous) {
            return Err(reader.invalid("partial batch out of order or before the mark-delete"));
        }
        if acked.contains(position) {
            return Err(reader.invalid("partial batch of an acked entry"));
        }
        let batch_size = u32::try_from(reader.varint()?)
            .ok()
            .filter(|size| (1..=MAX_BATCH_SIZE).contains(size))
            .ok_or_else(|| reader.invalid("batch size out of range"))?;
        let mut words = Vec::with_capacity(word_count(batch_size));
        for _ in 0..word_count(batch_size) {
            words.push(reader.u64_le()?);
        }
        let batch = BatchAckState::from_unacked_words(batch_size, words.into_boxed_slice())
            .ok_or_else(|| reader.invalid("batch ack set has stray or no unacked bits"))?;
        batches.insert(position, batch);
        previous = Some(position);
    }
    Ok(batches)
}

/// The framing both cursor formats share: 4-byte magic, a version byte, the body, and a CRC32C
/// of everything before it. Checks all of it; returns the checksummed bytes and a reader placed
/// just after the version byte.
pub(super) fn checked_body(
    bytes: &[u8],
    magic: [u8; 4],
    version: u8,
) -> Result<(&[u8], Reader<'_>), CursorStateError> {
    // Magic, version and at least one more byte (the formats' first field), then the checksum.
    let need = magic.len() + 2 + CHECKSUM_LEN;
    if bytes.len() < need {
        return Err(CursorStateError::Truncated { offset: 0, need, have: bytes.len() });
    }
    let mut found = [0u8; 4];
    found.copy_from_slice(&bytes[..magic.len()]);
    if found != magic {
        return Err(CursorStateError::BadMagic { found });
    }
    if bytes[magic.len()] != version {
        return Err(CursorStateError::UnsupportedVersion { version: bytes[magic.len()] });
    }
    let (body, checksum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
    let mut stored = [0u8; CHECKSUM_LEN];
    stored.copy_from_slice(checksum);
    let stored = u32::from_le_bytes(stored);
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(CursorStateError::ChecksumMismatch { stored, computed });
    }
    Ok((body, Reader { bytes: body, offset: magic.len() + 1 }))
}

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) offset: usize,
}

impl Reader<'_> {
    pub(super) fn invalid(&self, reason: &'static str) -> CursorStateError {
        CursorStateError::Invalid { offset: self.offset, reason }
    }

    pub(super) fn take(&mut self, count: usize) -> Result<&[u8], CursorStateError> {
        let have = self.bytes.len() - self.offset;
        if have < count {
            return Err(CursorStateError::Truncated { offset: self.offset, need: count, have });
        }
        let taken = &self.bytes[self.offset..self.offset + count];
        self.offset += count;
        Ok(taken)
    }

    pub(super) fn byte(&mut self) -> Result<u8, CursorStateError> {
        Ok(self.take(1)?[0])
    }

    fn u64_le(&mut self) -> Result<u64, CursorStateError> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    pub(super) fn varint(&mut self) -> Result<u64, CursorStateError> {
        let start = self.offset;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(CursorStateError::VarintOverflow { offset: start });
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(CursorStateError::VarintOverflow { offset: start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::position::LedgerList;

    fn at(ledger_id: u64, entry_id: u64) -> Position {
        Position::new(ledger_id, entry_id)
    }

    #[test]
    fn varints_round_trip_at_every_length() {
        for value in [0, 1, 127, 128, 16_383, 16_384, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value));
            let mut reader = Reader { bytes: &out, offset: 0 };
            assert_eq!(reader.varint(), Ok(value));
        }
        let mut reader = Reader { bytes: &[0xff; 10], offset: 0 };
        assert_eq!(reader.varint(), Err(CursorStateError::VarintOverflow { offset: 0 }));
    }

    #[test]
    fn empty_and_mark_delete_only_states_round_trip() {
        for state in [AckState::new(None), AckState::new(Some(at(5, 9)))] {
            let bytes = state.encode();
            assert_eq!(AckState::decode(&bytes), Ok(state));
        }
        assert_eq!(AckState::new(None).encode().len(), HEADER_LEN + 2 + CHECKSUM_LEN);
    }

    #[test]
    fn mixed_state_round_trips() {
        let ledgers: LedgerList = [(3, 10), (4, 0), (6, 200_000)].into_iter().collect();
        let mut state = AckState::new(Some(at(3, 1)));
        state.ack_individual(at(3, 5), &ledgers).unwrap();
        state.ack_individual(at(3, 9), &ledgers).unwrap();
        for entry_id in (10..150_000).step_by(3) {
            state.ack_individual(at(6, entry_id), &ledgers).unwrap();
        }
        state.ack_batch_indexes(at(3, 7), 100, &[1, 99], &ledgers).unwrap();
        state.ack_batch_indexes(at(6, 0), 1, &[], &ledgers).unwrap();
        let bytes = state.encode();
        let decoded = AckState::decode(&bytes).unwrap();
        assert_eq!(decoded, state);
        assert_eq!(decoded.partial_batch(at(3, 7)), state.partial_batch(at(3, 7)));
    }

    #[test]
    fn limits_keep_the_acks_nearest_the_mark_delete() {
        let ledgers: LedgerList = [(1, 1_000_000)].into_iter().collect();
        let mut state = AckState::new(None);
        for entry_id in (1..20_000).step_by(2) {
            state.ack_individual(at(1, entry_id), &ledgers).unwrap();
        }
        let limits = PersistLimits { max_ranges: 100, max_bytes: usize::MAX };
        let encoded = state.encode_with_limits(&limits);
        assert_eq!(encoded.persisted_ranges, 100);
        assert_eq!(encoded.dropped_from, Some(at(1, 201)));
        let decoded = AckState::decode(&encoded.bytes).unwrap();
        assert_eq!(decoded.individually_acked_count(), 100);
        assert!(decoded.is_acked(at(1, 199)) && !decoded.is_acked(at(1, 201)));

        let by_bytes =
            state.encode_with_limits(&PersistLimits { max_ranges: u64::MAX, max_bytes: 1000 });
        assert!(by_bytes.bytes.len() <= 1000);
        assert!(by_bytes.dropped_from.is_some());
        assert!(AckState::decode(&by_bytes.bytes).is_ok());
    }

    #[test]
    fn partial_batches_get_at_most_a_quarter_of_the_byte_budget() {
        let ledgers: LedgerList = [(1, 1000)].into_iter().collect();
        let mut state = AckState::new(None);
        for entry_id in 0..100 {
            state.ack_batch_indexes(at(1, entry_id), 1000, &[7], &ledgers).unwrap();
        }
        let encoded =
            state.encode_with_limits(&PersistLimits { max_ranges: u64::MAX, max_bytes: 4000 });
        // Each batch costs 1 + 1 + 2 varint bytes and 16 words: 132 bytes; 7 fit in 1000.
        assert_eq!(encoded.dropped_partial_batches, 93);
        assert!(encoded.bytes.len() <= 4000);
        let decoded = AckState::decode(&encoded.bytes).unwrap();
        assert_eq!(decoded.partial_batch_count(), 7);
        assert_eq!(decoded.partial_batch(at(1, 6)), state.partial_batch(at(1, 6)));
    }

    #[test]
    fn a_million_alternating_acks_encode_to_a_bit_per_entry() {
        let ledgers: LedgerList = (1..=40).map(|ledger_id| (ledger_id, 50_000)).collect();
        let mut state = AckState::new(None);
        let mut acked = 0u64;
        'fill: for ledger_id in 1..=40 {
            for entry_id in (1..50_000).step_by(2) {
                state.ack_individual(at(ledger_id, entry_id), &ledgers).unwrap();
                acked += 1;
                if acked == 1_000_000 {
                    break 'fill;
                }
            }
        }
        let ranges = state.acked_range_count(&ledgers);
        assert_eq!(ranges, 1_000_000);
        let encoded = state.encode_with_limits(&PersistLimits::default());
        assert_eq!(encoded.dropped_from, None);
        let bytes_per_range = encoded.bytes.len() as f64 / ranges as f64;
        println!(
            "1M alternating acks: {} bytes encoded, {bytes_per_range:.3} bytes/range, {} heap bytes",
            encoded.bytes.len(),
            state.approximate_heap_bytes()
        );
        assert!(bytes_per_range < 0.3, "{bytes_per_range} bytes per range");
        assert_eq!(AckState::decode(&encoded.bytes).as_ref(), Ok(&state));
    }

    #[test]
    fn sparse_holes_encode_to_about_two_bytes_per_range() {
        let ledgers: LedgerList = [(1, 10_000_000)].into_iter().collect();
        let mut state = AckState::new(None);
        for entry_id in (1..10_000_000).step_by(100) {
            state.ack_individual(at(1, entry_id), &ledgers).unwrap();
        }
        let ranges = state.acked_range_count(&ledgers);
        let bytes = state.encode();
        let bytes_per_range = bytes.len() as f64 / ranges as f64;
        println!("{ranges} sparse ranges: {} bytes, {bytes_per_range:.3} bytes/range", bytes.len());
        assert!(bytes_per_range < 2.1, "{bytes_per_range} bytes per range");
        assert_eq!(AckState::decode(&bytes).as_ref(), Ok(&state));
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let good = AckState::new(Some(at(1, 1))).encode();
        assert!(matches!(AckState::decode(&good[..5]), Err(CursorStateError::Truncated { .. })));
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        assert!(matches!(AckState::decode(&bad_magic), Err(CursorStateError::BadMagic { .. })));
        let mut bad_version = good.clone();
        bad_version[4] = 9;
        assert_eq!(
            AckState::decode(&bad_version),
            Err(CursorStateError::UnsupportedVersion { version: 9 })
        );
        let mut flipped = good.clone();
        flipped[7] ^= 1;
        assert!(matches!(
            AckState::decode(&flipped),
            Err(CursorStateError::ChecksumMismatch { .. })
        ));
        let mut unknown_flags = good.clone();
        unknown_flags[5] |= 0x80;
        reseal(&mut unknown_flags);
        assert_eq!(
            AckState::decode(&unknown_flags),
            Err(CursorStateError::UnknownFlags { flags: 0x81 })
        );
        let mut trailing = good[..good.len() - CHECKSUM_LEN].to_vec();
        trailing.push(0);
        trailing.extend_from_slice(&[0; CHECKSUM_LEN]);
        reseal(&mut trailing);
        assert!(matches!(
            AckState::decode(&trailing),
            Err(CursorStateError::TrailingBytes { remaining: 1, .. })
        ));
    }

    #[test]
    fn acks_at_or_before_the_mark_delete_are_rejected() {
        // Hand-built: mark-delete 1:10, one group for ledger 1 with a run at offset 10.
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[FORMAT_VERSION, FLAG_HAS_MARK_DELETE, 1, 10]);
        bytes.extend_from_slice(&[1, 0, 1, 0, KIND_RUNS, 1, 10, 0, 0]);
        bytes.extend_from_slice(&[0; CHECKSUM_LEN]);
        reseal(&mut bytes);
        assert!(matches!(AckState::decode(&bytes), Err(CursorStateError::Invalid { .. })));
    }

    /// Rewrites the trailing checksum so a test reaches the parser behind it.
    fn reseal(bytes: &mut [u8]) {
        let body_len = bytes.len() - CHECKSUM_LEN;
        let checksum = crc32c::crc32c(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&checksum.to_le_bytes());
    }
}
