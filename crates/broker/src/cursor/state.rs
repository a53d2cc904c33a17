//! [`AckState`]: what a subscription has acknowledged — mark-delete position, individually acked
//! positions after it, and partially acknowledged batches.
//!
//! Invariants (checked periodically by the randomised model test):
//! - every acked position and every partial batch is strictly after `mark_delete`;
//! - a position is never both individually acked and a partial batch;
//! - every partial batch still has an unacknowledged message;
//! - after any method taking a ledger layout returns, the position after `mark_delete` (per that
//!   layout) is not acked, i.e. the mark-delete position has advanced as far as it can.
//!
//! Acknowledgements are idempotent: acking something already acked (individually, by batch
//! index, or because it is at or before `mark_delete`) changes nothing and reports nothing new.

use std::collections::BTreeMap;

use super::acked::AckedEntries;
use super::batch::{ack_set_acking, validate_batch_size, BatchAckState};
use super::error::AckError;
use super::position::{
    entries_after, entries_between, entry_count, next_position, position_exists, EntryRange,
    LedgerBoundaries, Position, PositionRange,
};

/// Acknowledgement state of one cursor. Pure data: no I/O, no clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckState {
    /// Everything at or before this is acknowledged; `None`: nothing in the topic is.
    mark_delete: Option<Position>,
    acked: AckedEntries,
    partial_batches: BTreeMap<Position, BatchAckState>,
}

/// What an acknowledgement changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckOutcome {
    /// Entries that became fully acknowledged by this call (0 for duplicate and late acks).
    pub newly_acked_entries: u64,
    /// The mark-delete position moved: worth persisting; ledgers before it may be trimmable.
    pub mark_delete_moved: bool,
}

impl AckState {
    /// A state where everything at or before `mark_delete` is acknowledged and nothing after.
    pub fn new(mark_delete: Option<Position>) -> Self {
        Self { mark_delete, ..Self::default() }
    }

    pub(crate) fn from_parts(
        mark_delete: Option<Position>,
        acked: AckedEntries,
        partial_batches: BTreeMap<Position, BatchAckState>,
    ) -> Self {
        Self { mark_delete, acked, partial_batches }
    }

    pub(crate) fn acked(&self) -> &AckedEntries {
        &self.acked
    }

    /// Everything at or before this is acknowledged; `None` when nothing is.
    pub fn mark_delete(&self) -> Option<Position> {
        self.mark_delete
    }

    /// Whether the entry at `position` is fully acknowledged (a partially acked batch is not).
    pub fn is_acked(&self, position: Position) -> bool {
        self.is_covered_by_mark_delete(position) || self.acked.contains(position)
    }

    /// Number of individually acknowledged entries after the mark-delete position. O(1).
    pub fn individually_acked_count(&self) -> u64 {
        self.acked.entry_count()
    }

    /// The remaining ack set of a partially acknowledged batch, to send with its redelivery.
    pub fn partial_batch(&self, position: Position) -> Option<&BatchAckState> {
        self.partial_batches.get(&position)
    }

    pub fn partial_batches(&self) -> impl Iterator<Item = (Position, &BatchAckState)> + '_ {
        self.partial_batches.iter().map(|(position, state)| (*position, state))
    }

    pub fn partial_batch_count(&self) -> usize {
        self.partial_batches.len()
    }

    /// Acknowledges one whole entry.
    pub fn ack_individual<L: LedgerBoundaries + ?Sized>(
        &mut self,
        position: Position,
        ledgers: &L,
    ) -> Result<AckOutcome, AckError> {
        if self.is_covered_by_mark_delete(position) {
            return Ok(AckOutcome::default());
        }
        ensure_exists(ledgers, position)?;
        Ok(self.complete_entry(position, ledgers))
    }

    /// Acknowledges everything at or before `position`, holes included.
    pub fn ack_cumulative<L: LedgerBoundaries + ?Sized>(
        &mut self,
        position: Position,
        ledgers: &L,
    ) -> Result<AckOutcome, AckError> {
        if self.is_covered_by_mark_delete(position) {
            return Ok(AckOutcome::default());
        }
        ensure_exists(ledgers, position)?;
        let entries_covered = entries_between(ledgers, self.mark_delete, position);
        let already_acked = self.acked.remove_through(position);
        self.partial_batches = self.partial_batches.split_off(&next_after(position));
        self.mark_delete = Some(position);
        self.advance_mark_delete(ledgers);
        Ok(AckOutcome {
            newly_acked_entries: entries_covered.saturating_sub(already_acked),
            mark_delete_moved: true,
        })
    }

    /// Acknowledges messages `acked_indexes` of the batch entry at `position`. The entry counts as
    /// acknowledged once every index of the batch is.
    pub fn ack_batch_indexes<L: LedgerBoundaries + ?Sized>(
        &mut self,
        position: Position,
        batch_size: u32,
        acked_indexes: &[u32],
        ledgers: &L,
    ) -> Result<AckOutcome, AckError> {
        validate_batch_size(batch_size)?;
        let ack_set = ack_set_acking(position, batch_size, acked_indexes.iter().copied())?;
        self.ack_batch_ack_set(position, batch_size, &ack_set, ledgers)
    }

    /// Applies a Pulsar `ack_set` (set bit = message still unacknowledged; missing words count as
    /// acknowledged) to the batch entry at `position`. `batch_size` comes from the entry's
    /// metadata (`num_messages_in_batch`), which the broker knows from dispatching it.
    pub fn ack_batch_ack_set<L: LedgerBoundaries + ?Sized>(
        &mut self,
        position: Position,
        batch_size: u32,
        ack_set: &[u64],
        ledgers: &L,
    ) -> Result<AckOutcome, AckError> {
        validate_batch_size(batch_size)?;
        if self.is_acked(position) {
            return Ok(AckOutcome::default());
        }
        ensure_exists(ledgers, position)?;
        let mut batch = match self.partial_batches.get(&position) {
            Some(known) if known.batch_size() != batch_size => {
                return Err(AckError::BatchSizeMismatch {
                    position,
                    known: known.batch_size(),
                    given: batch_size,
                });
            }
            Some(known) => known.clone(),
            None => BatchAckState::all_unacked(batch_size),
        };
        batch.retain_unacked(ack_set);
        if batch.is_fully_acked() {
            return Ok(self.complete_entry(position, ledgers));
        }
        if batch.unacked_count() < batch_size {
            self.partial_batches.insert(position, batch);
        }
        Ok(AckOutcome::default())
    }

    /// Pulsar's cumulative ack of one message inside a batch: everything before the entry at
    /// `position` plus messages `0..=last_acked_index` of that batch.
    pub fn ack_cumulative_batch<L: LedgerBoundaries + ?Sized>(
        &mut self,
        position: Position,
        batch_size: u32,
        last_acked_index: u32,
        ledgers: &L,
    ) -> Result<AckOutcome, AckError> {
        validate_batch_size(batch_size)?;
        let ack_set = ack_set_acking(position, batch_size, 0..=last_acked_index)?;
        if self.is_covered_by_mark_delete(position) {
            return Ok(AckOutcome::default());
        }
        ensure_exists(ledgers, position)?;
        if let Some(known) = self.partial_batches.get(&position) {
            if known.batch_size() != batch_size {
                return Err(AckError::BatchSizeMismatch {
                    position,
                    known: known.batch_size(),
                    given: batch_size,
                });
            }
        }
        let before = self.ack_everything_before(position, ledgers);
        let batch = self.ack_batch_ack_set(position, batch_size, &ack_set, ledgers)?;
        let moved_by_range = self.advance_mark_delete(ledgers);
        Ok(AckOutcome {
            newly_acked_entries: before + batch.newly_acked_entries,
            mark_delete_moved: moved_by_range || batch.mark_delete_moved,
        })
    }

    /// Positions after the mark-delete and before `read_position` (exclusive) that are not fully
    /// acknowledged — what to redeliver — as per-ledger ranges. Skips acked runs in O(1) per run.
    pub fn unacked_ranges<'a, L: LedgerBoundaries + ?Sized>(
        &'a self,
        read_position: Position,
        ledgers: &'a L,
    ) -> UnackedRanges<'a, L> {
        UnackedRanges {
            state: self,
            ledgers,
            next_candidate: next_position(ledgers, self.mark_delete),
            end: read_position,
        }
    }

    /// [`Self::unacked_ranges`], one position at a time.
    pub fn unacked_positions<'a, L: LedgerBoundaries + ?Sized>(
        &'a self,
        read_position: Position,
        ledgers: &'a L,
    ) -> impl Iterator<Item = Position> + 'a {
        self.unacked_ranges(read_position, ledgers).flat_map(EntryRange::positions)
    }

    /// Maximal acknowledged ranges after the mark-delete position, merged across ledger
    /// boundaries (the last entry of a ledger touches the first of the next non-empty one).
    pub fn acked_ranges<'a, L: LedgerBoundaries + ?Sized>(
        &'a self,
        ledgers: &'a L,
    ) -> impl Iterator<Item = PositionRange> + 'a {
        let mut runs = self.acked.ledger_runs().peekable();
        std::iter::from_fn(move || {
            let first = runs.next()?;
            let mut range = PositionRange { first: first.first(), last: first.last() };
            while let Some(next) = runs.next_if(|next| {
                next.ledger_id != range.last.ledger_id
                    && next_position(ledgers, Some(range.last)) == Some(next.first())
            }) {
                range.last = next.last();
            }
            Some(range)
        })
    }

    /// Number of [`Self::acked_ranges`] (Pulsar's "individually deleted ranges"). O(ranges).
    pub fn acked_range_count<L: LedgerBoundaries + ?Sized>(&self, ledgers: &L) -> u64 {
        self.acked_ranges(ledgers).count() as u64
    }

    /// Entries after the mark-delete position not yet fully acknowledged (partially acked
    /// batches count as unacknowledged).
    pub fn backlog_entries<L: LedgerBoundaries + ?Sized>(&self, ledgers: &L) -> u64 {
        entries_after(ledgers, self.mark_delete).saturating_sub(self.acked.entry_count())
    }

    /// Brings the state in line with a changed ledger layout (after loading, or after ledgers were
    /// deleted): drops acks of positions that no longer exist, then advances the mark-delete.
    /// Returns whether the mark-delete moved.
    pub fn reconcile<L: LedgerBoundaries + ?Sized>(&mut self, ledgers: &L) -> bool {
        self.acked.retain_existing(ledgers);
        self.partial_batches.retain(|position, _| position_exists(ledgers, *position));
        self.advance_mark_delete(ledgers)
    }

    /// Approximate heap bytes held by this state.
    pub fn approximate_heap_bytes(&self) -> usize {
        let batch_slot = size_of::<Position>() + size_of::<BatchAckState>();
        self.acked.heap_bytes()
            + self
                .partial_batches
                .values()
                .map(|batch| batch.heap_bytes() + batch_slot * 3 / 2)
                .sum::<usize>()
    }

    fn is_covered_by_mark_delete(&self, position: Position) -> bool {
        self.mark_delete.is_some_and(|mark_delete| position <= mark_delete)
    }

    /// Marks an existing entry after the mark-delete fully acknowledged.
    fn complete_entry<L: LedgerBoundaries + ?Sized>(
        &mut self,
        position: Position,
        ledgers: &L,
    ) -> AckOutcome {
        if !self.acked.insert(position) {
            return AckOutcome::default();
        }
        self.partial_batches.remove(&position);
        AckOutcome { newly_acked_entries: 1, mark_delete_moved: self.advance_mark_delete(ledgers) }
    }

    /// Individually acks every existing position after the mark-delete and before `position`;
    /// returns how many were not acked before.
    fn ack_everything_before<L: LedgerBoundaries + ?Sized>(
        &mut self,
        position: Position,
        ledgers: &L,
    ) -> u64 {
        let mut added = 0;
        let mut cursor = next_position(ledgers, self.mark_delete);
        while let Some(start) = cursor.filter(|start| *start < position) {
            let ledger_last =
                entry_count(ledgers, start.ledger_id).map_or(start.entry_id, |n| n - 1);
            let last = if start.ledger_id == position.ledger_id {
                position.entry_id - 1
            } else {
                ledger_last
            };
            added += self.acked.insert_range(start.ledger_id, start.entry_id, last);
            cursor = next_position(ledgers, Some(Position::new(start.ledger_id, last)));
        }
        let before = std::mem::take(&mut self.partial_batches);
        let (covered, kept): (BTreeMap<_, _>, BTreeMap<_, _>) =
            before.into_iter().partition(|(batch, _)| *batch < position);
        debug_assert!(covered.keys().all(|batch| self.acked.contains(*batch)));
        self.partial_batches = kept;
        added
    }

    /// Moves the mark-delete over the acked run right after it, repeatedly (runs continue across
    /// ledger boundaries per `ledgers`). Returns whether it moved.
    fn advance_mark_delete<L: LedgerBoundaries + ?Sized>(&mut self, ledgers: &L) -> bool {
        let mut moved = false;
        while let Some(next) = next_position(ledgers, self.mark_delete) {
            if !self.acked.contains(next) {
                break;
            }
            let run_last = Position::new(next.ledger_id, self.acked.run_end_in_ledger(next));
            // Nothing acked lies before `next`, so removing the run alone empties `..=run_last`.
            self.acked.remove_range(next.ledger_id, next.entry_id, run_last.entry_id);
            self.mark_delete = Some(run_last);
            moved = true;
        }
        if moved {
            // Partial batches are never inside an acked run, but ones before a mark-delete set by
            // an older layout could be; drop them so the invariant holds regardless.
            let after = next_after(self.mark_delete.unwrap_or_default());
            if self.partial_batches.first_key_value().is_some_and(|(p, _)| *p < after) {
                self.partial_batches = self.partial_batches.split_off(&after);
            }
        }
        moved
    }
}

fn ensure_exists<L: LedgerBoundaries + ?Sized>(
    ledgers: &L,
    position: Position,
) -> Result<(), AckError> {
    if position_exists(ledgers, position) {
        Ok(())
    } else {
        Err(AckError::UnknownPosition { position })
    }
}

/// The smallest `Position` value greater than `position`, whether or not it exists.
fn next_after(position: Position) -> Position {
    match position.entry_id.checked_add(1) {
        Some(entry_id) => Position::new(position.ledger_id, entry_id),
        None => Position::new(position.ledger_id.saturating_add(1), 0),
    }
}

/// Iterator of [`AckState::unacked_ranges`].
pub struct UnackedRanges<'a, L: LedgerBoundaries + ?Sized> {
    state: &'a AckState,
    ledgers: &'a L,
    /// An existing position not yet reported or skipped.
    next_candidate: Option<Position>,
    /// Exclusive upper bound.
    end: Position,
}

impl<L: LedgerBoundaries + ?Sized> Iterator for UnackedRanges<'_, L> {
    type Item = EntryRange;

    fn next(&mut self) -> Option<EntryRange> {
        loop {
            let candidate = self.next_candidate.filter(|candidate| *candidate < self.end)?;
            let acked = &self.state.acked;
            if acked.contains(candidate) {
                let run_last = acked.run_end_in_ledger(candidate);
                let skip_to = Position::new(candidate.ledger_id, run_last);
                self.next_candidate = next_position(self.ledgers, Some(skip_to));
                continue;
            }
            let ledger_entries = entry_count(self.ledgers, candidate.ledger_id)?;
            let mut last_entry_id = match acked.next_acked_in_ledger(candidate) {
                Some(acked_entry_id) => acked_entry_id - 1,
                None => ledger_entries - 1,
            }
            .min(ledger_entries - 1);
            if candidate.ledger_id == self.end.ledger_id {
                // candidate < end in the same ledger, so end.entry_id >= 1.
                last_entry_id = last_entry_id.min(self.end.entry_id - 1);
            }
            let hole = EntryRange {
                ledger_id: candidate.ledger_id,
                first_entry_id: candidate.entry_id,
                last_entry_id,
            };
            self.next_candidate = next_position(self.ledgers, Some(hole.last()));
            return Some(hole);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::position::LedgerList;

    fn at(ledger_id: u64, entry_id: u64) -> Position {
        Position::new(ledger_id, entry_id)
    }

    /// Ledger 1: 5 entries, ledger 2: empty, ledger 3 deleted, ledger 4: 3 entries, ledger 5 open
    /// with 100 entries so far.
    fn ledgers() -> LedgerList {
        [(1, 5), (2, 0), (4, 3), (5, 100)].into_iter().collect()
    }

    #[test]
    fn individual_acks_advance_mark_delete_only_when_contiguous() {
        let ledgers = ledgers();
        let mut state = AckState::new(None);
        let outcome = state.ack_individual(at(1, 1), &ledgers).unwrap();
        assert_eq!(outcome, AckOutcome { newly_acked_entries: 1, mark_delete_moved: false });
        assert_eq!(state.mark_delete(), None);
        assert!(state.is_acked(at(1, 1)) && !state.is_acked(at(1, 0)));
        let outcome = state.ack_individual(at(1, 0), &ledgers).unwrap();
        assert!(outcome.mark_delete_moved);
        assert_eq!(state.mark_delete(), Some(at(1, 1)));
        assert_eq!(state.individually_acked_count(), 0);
    }

    #[test]
    fn mark_delete_merges_across_ledger_boundaries_skipping_empty_and_deleted_ledgers() {
        let ledgers = ledgers();
        let mut state = AckState::new(Some(at(1, 3)));
        state.ack_individual(at(4, 0), &ledgers).unwrap();
        state.ack_individual(at(4, 1), &ledgers).unwrap();
        assert_eq!(state.acked_range_count(&ledgers), 1);
        // The last entry of ledger 1 touches ledger 4's first: one range (1:4 ..= 4:1).
        state.ack_individual(at(1, 4), &ledgers).unwrap();
        assert_eq!(state.mark_delete(), Some(at(4, 1)));
        assert_eq!(state.acked_range_count(&ledgers), 0);

        state.ack_individual(at(5, 0), &ledgers).unwrap();
        assert_eq!(state.mark_delete(), Some(at(4, 1)));
        let ranges: Vec<_> = {
            state.ack_individual(at(4, 2), &ledgers).unwrap();
            state.acked_ranges(&ledgers).collect()
        };
        assert!(ranges.is_empty());
        assert_eq!(state.mark_delete(), Some(at(5, 0)));
    }

    #[test]
    fn acked_ranges_join_ledgers_only_when_nothing_lies_between() {
        let ledgers = ledgers();
        let mut state = AckState::new(None);
        for position in [at(1, 3), at(1, 4), at(4, 0), at(4, 2), at(5, 0), at(5, 7)] {
            state.ack_individual(position, &ledgers).unwrap();
        }
        let ranges: Vec<_> = state.acked_ranges(&ledgers).collect();
        let expected = [
            PositionRange { first: at(1, 3), last: at(4, 0) },
            PositionRange { first: at(4, 2), last: at(5, 0) },
            PositionRange { first: at(5, 7), last: at(5, 7) },
        ];
        assert_eq!(ranges, expected);
    }

    #[test]
    fn cumulative_ack_jumps_over_holes_and_absorbs_later_runs() {
        let ledgers = ledgers();
        let mut state = AckState::new(None);
        for position in [at(1, 1), at(1, 3), at(4, 1), at(4, 2), at(5, 0)] {
            state.ack_individual(position, &ledgers).unwrap();
        }
        state.ack_batch_indexes(at(1, 4), 4, &[0], &ledgers).unwrap();
        let outcome = state.ack_cumulative(at(4, 0), &ledgers).unwrap();
        // 1:0, 1:2, 1:4 (partial batch) and 4:0 were not acked before.
        assert_eq!(outcome.newly_acked_entries, 4);
        assert!(outcome.mark_delete_moved);
        assert_eq!(state.mark_delete(), Some(at(5, 0)));
        assert_eq!(state.partial_batch_count(), 0);
        assert_eq!(state.individually_acked_count(), 0);
        // Late cumulative acks change nothing.
        assert_eq!(state.ack_cumulative(at(1, 0), &ledgers).unwrap(), AckOutcome::default());
    }

    #[test]
    fn batch_index_acks_complete_the_entry_when_every_index_is_acked() {
        let ledgers = ledgers();
        let mut state = AckState::new(Some(at(1, 0)));
        state.ack_batch_indexes(at(1, 2), 3, &[0, 2], &ledgers).unwrap();
        let partial = state.partial_batch(at(1, 2)).unwrap();
        assert_eq!(partial.ack_set(), [0b010]);
        assert!(!state.is_acked(at(1, 2)));
        assert_eq!(
            state.ack_batch_indexes(at(1, 2), 4, &[1], &ledgers),
            Err(AckError::BatchSizeMismatch { position: at(1, 2), known: 3, given: 4 })
        );
        let outcome = state.ack_batch_indexes(at(1, 2), 3, &[1], &ledgers).unwrap();
        assert_eq!(outcome.newly_acked_entries, 1);
        assert!(state.is_acked(at(1, 2)));
        assert_eq!(state.partial_batch_count(), 0);
        // Batch acks of an acked entry are harmless.
        let again = state.ack_batch_indexes(at(1, 2), 3, &[1], &ledgers).unwrap();
        assert_eq!(again, AckOutcome::default());
    }

    #[test]
    fn ack_sets_use_set_bit_means_unacked() {
        let ledgers = ledgers();
        let mut state = AckState::new(None);
        // Client says messages 1 and 3 are still unacked.
        state.ack_batch_ack_set(at(1, 0), 4, &[0b1010], &ledgers).unwrap();
        assert_eq!(state.partial_batch(at(1, 0)).unwrap().ack_set(), [0b1010]);
        // An ack set that acks nothing is not stored.
        state.ack_batch_ack_set(at(1, 1), 4, &[0b1111], &ledgers).unwrap();
        assert!(state.partial_batch(at(1, 1)).is_none());
        // Individual ack of a partially acked batch acks the whole entry.
        let outcome = state.ack_individual(at(1, 0), &ledgers).unwrap();
        assert!(outcome.mark_delete_moved);
        assert_eq!(state.partial_batch_count(), 0);
    }

    #[test]
    fn cumulative_batch_ack_covers_earlier_entries_and_part_of_the_batch() {
        let ledgers = ledgers();
        let mut state = AckState::new(None);
        state.ack_individual(at(1, 2), &ledgers).unwrap();
        let outcome = state.ack_cumulative_batch(at(4, 1), 10, 4, &ledgers).unwrap();
        assert_eq!(outcome.newly_acked_entries, 5);
        assert_eq!(state.mark_delete(), Some(at(4, 0)));
        let partial = state.partial_batch(at(4, 1)).unwrap();
        assert_eq!(partial.unacked_count(), 5);
        let outcome = state.ack_cumulative_batch(at(4, 1), 10, 9, &ledgers).unwrap();
        assert_eq!(outcome.newly_acked_entries, 1);
        assert_eq!(state.mark_delete(), Some(at(4, 1)));
    }

    #[test]
    fn duplicate_late_and_out_of_order_acks_are_harmless() {
        let ledgers = ledgers();
        let mut in_order = AckState::new(None);
        let mut shuffled = AckState::new(None);
        let positions = [at(1, 0), at(1, 1), at(1, 2), at(1, 3), at(1, 4), at(4, 0)];
        for position in positions {
            in_order.ack_individual(position, &ledgers).unwrap();
        }
        for position in [5, 3, 3, 1, 0, 0, 4, 2, 1, 5].map(|index| positions[index]) {
            shuffled.ack_individual(position, &ledgers).unwrap();
        }
        assert_eq!(in_order, shuffled);
        assert_eq!(in_order.mark_delete(), Some(at(4, 0)));
        let late = shuffled.ack_individual(at(1, 0), &ledgers).unwrap();
        assert_eq!(late, AckOutcome::default());
    }

    #[test]
    fn acks_of_positions_that_do_not_exist_are_rejected() {
        let ledgers = ledgers();
        let mut state = AckState::new(None);
        for position in [at(1, 5), at(2, 0), at(3, 0), at(5, 100), at(9, 0)] {
            assert_eq!(
                state.ack_individual(position, &ledgers),
                Err(AckError::UnknownPosition { position })
            );
        }
        assert_eq!(state, AckState::new(None));
        assert!(state.ack_batch_indexes(at(1, 0), 0, &[], &ledgers).is_err());
        assert!(state.ack_batch_indexes(at(1, 0), 2, &[2], &ledgers).is_err());
    }

    #[test]
    fn unacked_ranges_list_holes_up_to_the_read_position() {
        let ledgers = ledgers();
        let mut state = AckState::new(Some(at(1, 0)));
        for position in [at(1, 2), at(1, 3), at(4, 1), at(5, 1)] {
            state.ack_individual(position, &ledgers).unwrap();
        }
        state.ack_batch_indexes(at(4, 0), 2, &[1], &ledgers).unwrap();
        let holes: Vec<_> = state.unacked_ranges(at(5, 4), &ledgers).collect();
        let expected = [
            EntryRange { ledger_id: 1, first_entry_id: 1, last_entry_id: 1 },
            EntryRange { ledger_id: 1, first_entry_id: 4, last_entry_id: 4 },
            EntryRange { ledger_id: 4, first_entry_id: 0, last_entry_id: 0 },
            EntryRange { ledger_id: 4, first_entry_id: 2, last_entry_id: 2 },
            EntryRange { ledger_id: 5, first_entry_id: 0, last_entry_id: 0 },
            EntryRange { ledger_id: 5, first_entry_id: 2, last_entry_id: 3 },
        ];
        assert_eq!(holes, expected);
        assert_eq!(state.unacked_positions(at(1, 4), &ledgers).count(), 1);
        assert_eq!(state.unacked_positions(at(1, 0), &ledgers).count(), 0);
    }

    #[test]
    fn backlog_counts_unacked_entries_after_mark_delete() {
        let ledgers = ledgers();
        let mut state = AckState::new(None);
        assert_eq!(state.backlog_entries(&ledgers), 108);
        state.ack_individual(at(4, 1), &ledgers).unwrap();
        state.ack_batch_indexes(at(4, 2), 2, &[0], &ledgers).unwrap();
        assert_eq!(state.backlog_entries(&ledgers), 107);
        state.ack_cumulative(at(1, 4), &ledgers).unwrap();
        assert_eq!(state.backlog_entries(&ledgers), 102);
    }

    #[test]
    fn reconcile_drops_deleted_ledgers_and_advances() {
        let mut ledgers = ledgers();
        let mut state = AckState::new(Some(at(1, 4)));
        state.ack_individual(at(4, 1), &ledgers).unwrap();
        state.ack_individual(at(4, 2), &ledgers).unwrap();
        state.ack_individual(at(5, 0), &ledgers).unwrap();
        // Ledger 4's unacked entry 0 is gone with its ledger (e.g. expired by TTL).
        ledgers.remove_ledger(4);
        assert!(state.reconcile(&ledgers));
        assert_eq!(state.mark_delete(), Some(at(5, 0)));
        assert_eq!(state.individually_acked_count(), 0);
    }
}
