//! The set of individually acknowledged positions, as a map of per-ledger chunks.
//!
//! Positions are grouped by `(ledger_id, entry_id >> 16)` into [`Chunk`]s, each a run list or a
//! bitmap. This stores the *set* of acked positions, not ranges stitched across ledgers: whether
//! the last entry of ledger A and the first of ledger B are adjacent depends on the ledger layout,
//! which callers supply when they need adjacency (mark-delete advance, range counting). The set
//! therefore never has to be re-merged when ledgers close, empty ledgers appear or ledgers are
//! deleted.
//!
//! Invariants: no stored chunk is empty; `entry_count` equals the sum of the chunks' counts.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use super::chunk::{Chunk, CHUNK_SHIFT, MAX_OFFSET};
use super::position::{entry_count, EntryRange, LedgerBoundaries, Position};

/// The largest chunk index an entry id can have.
pub(crate) const MAX_CHUNK_INDEX: u64 = u64::MAX >> CHUNK_SHIFT;

/// Which chunk of which ledger; orders like the positions it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ChunkKey {
    pub(crate) ledger_id: u64,
    pub(crate) chunk_index: u64,
}

impl ChunkKey {
    pub(crate) fn of(position: Position) -> (ChunkKey, u16) {
        let key = ChunkKey {
            ledger_id: position.ledger_id,
            chunk_index: position.entry_id >> CHUNK_SHIFT,
        };
        (key, (position.entry_id & u64::from(MAX_OFFSET)) as u16)
    }

    pub(crate) fn position(self, offset: u16) -> Position {
        Position::new(self.ledger_id, (self.chunk_index << CHUNK_SHIFT) | u64::from(offset))
    }

    fn next_in_ledger(self) -> Option<ChunkKey> {
        (self.chunk_index < MAX_CHUNK_INDEX)
            .then_some(ChunkKey { ledger_id: self.ledger_id, chunk_index: self.chunk_index + 1 })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AckedEntries {
    chunks: BTreeMap<ChunkKey, Chunk>,
    entry_count: u64,
}

impl AckedEntries {
    pub(crate) fn entry_count(&self) -> u64 {
        self.entry_count
    }

    pub(crate) fn contains(&self, position: Position) -> bool {
        let (key, offset) = ChunkKey::of(position);
        self.chunks.get(&key).is_some_and(|chunk| chunk.contains(offset))
    }

    /// Adds one position; returns whether it was new.
    pub(crate) fn insert(&mut self, position: Position) -> bool {
        self.insert_range(position.ledger_id, position.entry_id, position.entry_id) == 1
    }

    /// Adds entries `first_entry_id..=last_entry_id` of one ledger; returns how many were new.
    pub(crate) fn insert_range(
        &mut self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> u64 {
        assert!(first_entry_id <= last_entry_id);
        let mut added = 0;
        let mut entry_id = first_entry_id;
        loop {
            let (key, first_offset) = ChunkKey::of(Position::new(ledger_id, entry_id));
            let piece_last = last_entry_id.min(entry_id | u64::from(MAX_OFFSET));
            let last_offset = (piece_last & u64::from(MAX_OFFSET)) as u16;
            added += u64::from(match self.chunks.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(Chunk::single(first_offset, last_offset)).acked_count()
                }
                Entry::Occupied(mut slot) => slot.get_mut().insert_range(first_offset, last_offset),
            });
            if piece_last == last_entry_id {
                break;
            }
            entry_id = piece_last + 1;
        }
        self.entry_count += added;
        added
    }

    /// Removes every position `<= through`; returns how many were removed.
    pub(crate) fn remove_through(&mut self, through: Position) -> u64 {
        let (through_key, through_offset) = ChunkKey::of(through);
        let mut removed = 0;
        while let Some(mut first) = self.chunks.first_entry() {
            match first.key().cmp(&through_key) {
                std::cmp::Ordering::Less => removed += u64::from(first.remove().acked_count()),
                std::cmp::Ordering::Equal => {
                    removed += u64::from(first.get_mut().remove_through(through_offset));
                    if first.get().is_empty() {
                        first.remove();
                    }
                    break;
                }
                std::cmp::Ordering::Greater => break,
            }
        }
        self.entry_count -= removed;
        removed
    }

    /// Removes entries `first_entry_id..=last_entry_id` of one ledger; returns how many were
    /// present. Cost is proportional to the chunks the range touches, not to what lies before it.
    pub(crate) fn remove_range(
        &mut self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> u64 {
        assert!(first_entry_id <= last_entry_id);
        let (first_key, first_offset) = ChunkKey::of(Position::new(ledger_id, first_entry_id));
        let (last_key, last_offset) = ChunkKey::of(Position::new(ledger_id, last_entry_id));
        let mut removed = 0;
        let mut emptied = Vec::new();
        for (key, chunk) in self.chunks.range_mut(first_key..=last_key) {
            let from = if *key == first_key { first_offset } else { 0 };
            let through = if *key == last_key { last_offset } else { MAX_OFFSET };
            removed += u64::from(chunk.remove_range(from, through));
            if chunk.is_empty() {
                emptied.push(*key);
            }
        }
        for key in emptied {
            self.chunks.remove(&key);
        }
        self.entry_count -= removed;
        removed
    }

    /// Drops positions the layout says do not exist (deleted ledgers, entries past a ledger's
    /// end); returns how many were dropped.
    pub(crate) fn retain_existing<L: LedgerBoundaries + ?Sized>(&mut self, ledgers: &L) -> u64 {
        let mut removed = 0;
        let mut cached_ledger: Option<(u64, u64)> = None;
        self.chunks.retain(|key, chunk| {
            let existing_entries = match cached_ledger {
                Some((ledger_id, count)) if ledger_id == key.ledger_id => count,
                _ => {
                    let count = entry_count(ledgers, key.ledger_id).unwrap_or(0);
                    cached_ledger = Some((key.ledger_id, count));
                    count
                }
            };
            let chunk_first_entry = key.chunk_index << CHUNK_SHIFT;
            if existing_entries <= chunk_first_entry {
                removed += u64::from(chunk.acked_count());
                return false;
            }
            if let Ok(keep_below) = u16::try_from(existing_entries - chunk_first_entry) {
                removed += u64::from(chunk.remove_from(keep_below));
            }
            !chunk.is_empty()
        });
        self.entry_count -= removed;
        removed
    }

    /// The last entry id of the acked run containing `position` (which must be acked), following
    /// the run across chunk boundaries but not across ledgers.
    pub(crate) fn run_end_in_ledger(&self, position: Position) -> u64 {
        let (mut key, offset) = ChunkKey::of(position);
        let Some(chunk) = self.chunks.get(&key) else {
            debug_assert!(false, "run_end_in_ledger({position}) of an unacked position");
            return position.entry_id;
        };
        let mut end = chunk.run_end(offset);
        while end == MAX_OFFSET {
            let Some(next_key) = key.next_in_ledger() else {
                break;
            };
            match self.chunks.get(&next_key) {
                Some(next_chunk) if next_chunk.contains(0) => {
                    key = next_key;
                    end = next_chunk.run_end(0);
                }
                _ => break,
            }
        }
        key.position(end).entry_id
    }

    /// The smallest acked entry id `>= position.entry_id` in `position`'s ledger.
    pub(crate) fn next_acked_in_ledger(&self, position: Position) -> Option<u64> {
        let (key, offset) = ChunkKey::of(position);
        let ledger_end = ChunkKey { ledger_id: position.ledger_id, chunk_index: MAX_CHUNK_INDEX };
        self.chunks.range(key..=ledger_end).find_map(|(chunk_key, chunk)| {
            let from = if *chunk_key == key { offset } else { 0 };
            chunk.next_present(from).map(|found| chunk_key.position(found).entry_id)
        })
    }

    pub(crate) fn first_position(&self) -> Option<Position> {
        let (key, chunk) = self.chunks.first_key_value()?;
        chunk.next_present(0).map(|offset| key.position(offset))
    }

    /// Maximal acked runs, each inside one ledger, in position order.
    pub(crate) fn ledger_runs(&self) -> impl Iterator<Item = EntryRange> + '_ {
        let pieces = self.chunks.iter().flat_map(|(key, chunk)| {
            let key = *key;
            chunk.runs().map(move |run| EntryRange {
                ledger_id: key.ledger_id,
                first_entry_id: key.position(run.first).entry_id,
                last_entry_id: key.position(run.last).entry_id,
            })
        });
        MergeTouching { pieces: pieces.peekable() }
    }

    pub(crate) fn chunks(&self) -> impl Iterator<Item = (ChunkKey, &Chunk)> + '_ {
        self.chunks.iter().map(|(key, chunk)| (*key, chunk))
    }

    /// Appends a decoded chunk; the decoder guarantees keys ascend and chunks are non-empty.
    pub(crate) fn push_chunk(&mut self, key: ChunkKey, chunk: Chunk) {
        assert!(!chunk.is_empty());
        assert!(self.chunks.last_key_value().is_none_or(|(last, _)| *last < key));
        self.entry_count += u64::from(chunk.acked_count());
        self.chunks.insert(key, chunk);
    }

    #[cfg(test)]
    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Approximate heap bytes: chunk payloads plus B-tree slots (a node holds up to 11 slots and is
    /// on average about 2/3 full, so each slot costs about 1.5x its size plus edge pointers).
    pub(crate) fn heap_bytes(&self) -> usize {
        let slot = size_of::<ChunkKey>() + size_of::<Chunk>();
        let payload: usize = self.chunks.values().map(Chunk::heap_bytes).sum();
        payload + self.chunks.len() * (slot * 3 / 2 + size_of::<usize>())
    }
}

/// Joins runs that continue from one chunk into the next chunk of the same ledger.
struct MergeTouching<I: Iterator<Item = EntryRange>> {
    pieces: std::iter::Peekable<I>,
}

impl<I: Iterator<Item = EntryRange>> Iterator for MergeTouching<I> {
    type Item = EntryRange;

    fn next(&mut self) -> Option<EntryRange> {
        let mut current = self.pieces.next()?;
        while let Some(next) = self.pieces.next_if(|next| {
            next.ledger_id == current.ledger_id
                && current.last_entry_id.checked_add(1) == Some(next.first_entry_id)
        }) {
            current.last_entry_id = next.last_entry_id;
        }
        Some(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::position::LedgerList;

    #[test]
    fn ranges_split_across_chunks_and_join_again_when_listed() {
        let mut acked = AckedEntries::default();
        assert_eq!(acked.insert_range(7, 65_530, 131_080), 131_080 - 65_530 + 1);
        assert_eq!(acked.chunk_count(), 3);
        assert_eq!(
            acked.ledger_runs().collect::<Vec<_>>(),
            [EntryRange { ledger_id: 7, first_entry_id: 65_530, last_entry_id: 131_080 }]
        );
        assert_eq!(acked.run_end_in_ledger(Position::new(7, 65_531)), 131_080);
        assert!(acked.contains(Position::new(7, 65_536)));
        assert!(!acked.contains(Position::new(7, 131_081)));
    }

    #[test]
    fn remove_through_drops_whole_and_partial_chunks() {
        let mut acked = AckedEntries::default();
        acked.insert_range(1, 0, 10);
        acked.insert_range(2, 5, 70_000);
        assert_eq!(acked.remove_through(Position::new(2, 65_540)), 11 + 65_536);
        assert_eq!(acked.first_position(), Some(Position::new(2, 65_541)));
        assert_eq!(acked.entry_count(), 70_000 - 65_540);
        assert_eq!(acked.remove_through(Position::new(3, 0)), 70_000 - 65_540);
        assert_eq!(acked.chunk_count(), 0);
    }

    #[test]
    fn next_acked_in_ledger_stays_inside_the_ledger() {
        let mut acked = AckedEntries::default();
        acked.insert(Position::new(1, 3));
        acked.insert(Position::new(1, 200_000));
        acked.insert(Position::new(2, 0));
        assert_eq!(acked.next_acked_in_ledger(Position::new(1, 0)), Some(3));
        assert_eq!(acked.next_acked_in_ledger(Position::new(1, 4)), Some(200_000));
        assert_eq!(acked.next_acked_in_ledger(Position::new(1, 200_001)), None);
    }

    #[test]
    fn retain_existing_drops_deleted_ledgers_and_entries_past_the_end() {
        let mut acked = AckedEntries::default();
        acked.insert_range(1, 0, 9);
        acked.insert_range(2, 0, 70_000);
        acked.insert_range(3, 0, 4);
        let ledgers: LedgerList = [(1, 5), (2, 65_540)].into_iter().collect();
        assert_eq!(acked.retain_existing(&ledgers), 5 + (70_001 - 65_540) + 5);
        assert_eq!(acked.entry_count(), 5 + 65_540);
        assert!(acked.contains(Position::new(2, 65_539)));
        assert!(!acked.contains(Position::new(2, 65_540)));
    }
}
