//! The acknowledged entry ids of one 65,536-entry slice ("chunk") of a ledger.
//!
//! A chunk is stored either as sorted runs (`[first, last]` offset pairs, 4 bytes per run) or as
//! an 8 KiB bitmap, whichever is smaller, so memory stays proportional to the number of acked
//! ranges and is capped at 8 KiB per 65,536 entries however fragmented the acks are. The runs
//! form is kept while it has at most `RUNS_MAX` (2048) runs, i.e. at most 8 KiB; a bitmap turns
//! back into runs below `BITMAP_MIN_RUNS` (1024) runs, the gap keeping conversions amortised.
//!
//! Invariants: runs are sorted, disjoint and never adjacent (touching runs are merged);
//! `run_count` and `acked_count` always describe the stored set; equality is set equality,
//! whatever the representation.

use std::cmp::{max, min};

/// log2 of the number of entries per chunk.
pub(crate) const CHUNK_SHIFT: u32 = 16;
/// Entries per chunk.
pub(crate) const CHUNK_ENTRIES: u32 = 1 << CHUNK_SHIFT;
/// The last offset inside a chunk.
pub(crate) const MAX_OFFSET: u16 = u16::MAX;
/// 64-bit words in a chunk bitmap.
pub(crate) const BITMAP_WORDS: usize = (CHUNK_ENTRIES / 64) as usize;
/// Runs beyond this count would take more memory than the bitmap.
const RUNS_MAX: usize = BITMAP_WORDS * 8 / size_of::<Run>();
/// A bitmap with fewer runs than this is converted back to runs.
const BITMAP_MIN_RUNS: usize = RUNS_MAX / 2;

const _: () = assert!(size_of::<Run>() == 4);
const _: () = assert!(CHUNK_ENTRIES - 1 == MAX_OFFSET as u32);
const _: () = assert!(BITMAP_MIN_RUNS < RUNS_MAX);

/// Offsets `first..=last` inside a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) first: u16,
    pub(crate) last: u16,
}

impl Run {
    pub(crate) fn len(self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }
}

pub(crate) type Bitmap = [u64; BITMAP_WORDS];

#[derive(Clone, Debug)]
enum Container {
    Runs(Vec<Run>),
    Bitmap(Box<Bitmap>),
}

#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    container: Container,
    run_count: u32,
    acked_count: u32,
}

impl PartialEq for Chunk {
    fn eq(&self, other: &Self) -> bool {
        self.acked_count == other.acked_count
            && self.run_count == other.run_count
            && self.runs().eq(other.runs())
    }
}

impl Eq for Chunk {}

impl Chunk {
    /// Builds a chunk from canonical runs (sorted, disjoint, non-adjacent).
    pub(crate) fn from_runs(runs: Vec<Run>) -> Chunk {
        debug_assert!(runs_are_canonical(&runs));
        let acked_count = runs.iter().map(|run| run.len()).sum();
        let mut chunk =
            Chunk { run_count: runs.len() as u32, acked_count, container: Container::Runs(runs) };
        chunk.rebalance();
        chunk
    }

    pub(crate) fn from_bitmap(bitmap: Box<Bitmap>) -> Chunk {
        let acked_count = bitmap.iter().map(|word| word.count_ones()).sum();
        let run_count = count_run_starts(&bitmap, 0, BITMAP_WORDS - 1);
        let mut chunk = Chunk { run_count, acked_count, container: Container::Bitmap(bitmap) };
        chunk.rebalance();
        chunk
    }

    pub(crate) fn single(first: u16, last: u16) -> Chunk {
        Chunk::from_runs(vec![Run { first, last }])
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.acked_count == 0
    }

    pub(crate) fn acked_count(&self) -> u32 {
        self.acked_count
    }

    /// Maximal runs inside this chunk (a run touching the chunk edge may continue next door).
    pub(crate) fn run_count(&self) -> u32 {
        self.run_count
    }

    pub(crate) fn contains(&self, offset: u16) -> bool {
        match &self.container {
            Container::Runs(runs) => {
                let index = runs.partition_point(|run| run.last < offset);
                runs.get(index).is_some_and(|run| run.first <= offset)
            }
            Container::Bitmap(bits) => bits[usize::from(offset) / 64] >> (offset % 64) & 1 == 1,
        }
    }

    /// Adds `first..=last`; returns how many offsets were not present before.
    pub(crate) fn insert_range(&mut self, first: u16, last: u16) -> u32 {
        assert!(first <= last);
        let added = match &mut self.container {
            Container::Runs(runs) => {
                // runs[touching_start..touching_end] overlap or touch the new range.
                let touching_start =
                    runs.partition_point(|run| u32::from(run.last) + 1 < u32::from(first));
                let touching_end =
                    runs.partition_point(|run| u32::from(run.first) <= u32::from(last) + 1);
                let mut merged = Run { first, last };
                let mut already_present = 0;
                for run in &runs[touching_start..touching_end] {
                    merged.first = min(merged.first, run.first);
                    merged.last = max(merged.last, run.last);
                    already_present += run.len();
                }
                runs.splice(touching_start..touching_end, std::iter::once(merged));
                self.run_count = runs.len() as u32;
                merged.len() - already_present
            }
            Container::Bitmap(bits) => {
                let (first_word, last_word) = (usize::from(first) / 64, usize::from(last) / 64);
                // Setting bits can only change run starts inside the range and right after it.
                let recount_end = min(last_word + 1, BITMAP_WORDS - 1);
                let starts_before = count_run_starts(bits, first_word, recount_end);
                let mut added = 0;
                for word_index in first_word..=last_word {
                    let mask = word_mask(word_index, first, last);
                    added += (mask & !bits[word_index]).count_ones();
                    bits[word_index] |= mask;
                }
                let starts_after = count_run_starts(bits, first_word, recount_end);
                self.run_count = self.run_count - starts_before + starts_after;
                added
            }
        };
        self.acked_count += added;
        self.rebalance();
        added
    }

    /// Removes every offset `<= offset`; returns how many were removed.
    pub(crate) fn remove_through(&mut self, offset: u16) -> u32 {
        let removed = match &mut self.container {
            Container::Runs(runs) => {
                let whole_runs = runs.partition_point(|run| run.last <= offset);
                let mut removed: u32 = runs.drain(..whole_runs).map(|run| run.len()).sum();
                if let Some(straddling) = runs.first_mut().filter(|run| run.first <= offset) {
                    // `offset < straddling.last`, so `offset + 1` cannot overflow.
                    removed += u32::from(offset - straddling.first) + 1;
                    straddling.first = offset + 1;
                }
                self.run_count = runs.len() as u32;
                removed
            }
            Container::Bitmap(bits) => {
                let last_word = usize::from(offset) / 64;
                let recount_end = min(last_word + 1, BITMAP_WORDS - 1);
                let starts_before = count_run_starts(bits, 0, recount_end);
                let mut removed = 0;
                for word_index in 0..=last_word {
                    let mask = word_mask(word_index, 0, offset);
                    removed += (bits[word_index] & mask).count_ones();
                    bits[word_index] &= !mask;
                }
                let starts_after = count_run_starts(bits, 0, recount_end);
                self.run_count = self.run_count - starts_before + starts_after;
                removed
            }
        };
        self.acked_count -= removed;
        self.rebalance();
        removed
    }

    /// Removes offsets `first..=last`; returns how many were present. Costs O(log runs + width / 64),
    /// which keeps mark-delete advances cheap however far into a bitmap they are.
    pub(crate) fn remove_range(&mut self, first: u16, last: u16) -> u32 {
        assert!(first <= last);
        let removed = match &mut self.container {
            Container::Runs(runs) => {
                let overlap_start = runs.partition_point(|run| run.last < first);
                let overlap_end = runs.partition_point(|run| run.first <= last);
                if overlap_start == overlap_end {
                    return 0;
                }
                let mut removed = 0;
                for run in &runs[overlap_start..overlap_end] {
                    removed +=
                        u32::from(min(run.last, last)) - u32::from(max(run.first, first)) + 1;
                }
                let (head, tail) = (runs[overlap_start], runs[overlap_end - 1]);
                let mut remainders = Vec::with_capacity(2);
                if head.first < first {
                    remainders.push(Run { first: head.first, last: first - 1 });
                }
                if tail.last > last {
                    remainders.push(Run { first: last + 1, last: tail.last });
                }
                runs.splice(overlap_start..overlap_end, remainders);
                self.run_count = runs.len() as u32;
                removed
            }
            Container::Bitmap(bits) => {
                let (first_word, last_word) = (usize::from(first) / 64, usize::from(last) / 64);
                let recount_end = min(last_word + 1, BITMAP_WORDS - 1);
                let starts_before = count_run_starts(bits, first_word, recount_end);
                let mut removed = 0;
                for word_index in first_word..=last_word {
                    let mask = word_mask(word_index, first, last);
                    removed += (bits[word_index] & mask).count_ones();
                    bits[word_index] &= !mask;
                }
                let starts_after = count_run_starts(bits, first_word, recount_end);
                self.run_count = self.run_count - starts_before + starts_after;
                removed
            }
        };
        self.acked_count -= removed;
        self.rebalance();
        removed
    }

    /// Removes every offset `>= offset`; returns how many were removed. Rare (ledger shrink on
    /// reconcile), so it simply rebuilds.
    pub(crate) fn remove_from(&mut self, offset: u16) -> u32 {
        let kept: Vec<Run> = self
            .runs()
            .filter(|run| run.first < offset)
            .map(|run| Run { first: run.first, last: min(run.last, offset - 1) })
            .collect();
        let before = self.acked_count;
        *self = Chunk::from_runs(kept);
        before - self.acked_count
    }

    /// A copy holding only the first `count` runs (a persist budget ran out mid-chunk).
    pub(crate) fn first_runs(&self, count: usize) -> Chunk {
        Chunk::from_runs(self.runs().take(count).collect())
    }

    /// The last offset of the run containing `offset` (which must be present).
    pub(crate) fn run_end(&self, offset: u16) -> u16 {
        debug_assert!(self.contains(offset));
        match &self.container {
            Container::Runs(runs) => {
                let index = runs.partition_point(|run| run.last < offset);
                runs.get(index).map_or(offset, |run| run.last)
            }
            Container::Bitmap(bits) => {
                next_clear_bit(bits, u32::from(offset)).map_or(MAX_OFFSET, |clear| clear - 1)
            }
        }
    }

    /// The smallest present offset `>= offset`.
    pub(crate) fn next_present(&self, offset: u16) -> Option<u16> {
        match &self.container {
            Container::Runs(runs) => {
                let index = runs.partition_point(|run| run.last < offset);
                runs.get(index).map(|run| max(run.first, offset))
            }
            Container::Bitmap(bits) => next_set_bit(bits, u32::from(offset)),
        }
    }

    pub(crate) fn runs(&self) -> ChunkRuns<'_> {
        match &self.container {
            Container::Runs(runs) => ChunkRuns::Runs(runs.iter()),
            Container::Bitmap(bits) => ChunkRuns::Bitmap { bits, next_offset: 0 },
        }
    }

    /// The chunk as a bitmap, borrowed or materialised.
    pub(crate) fn to_bitmap(&self) -> std::borrow::Cow<'_, Bitmap> {
        match &self.container {
            Container::Bitmap(bits) => std::borrow::Cow::Borrowed(&**bits),
            Container::Runs(runs) => {
                let mut bits = [0u64; BITMAP_WORDS];
                set_runs(&mut bits, runs);
                std::borrow::Cow::Owned(bits)
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn is_bitmap(&self) -> bool {
        matches!(self.container, Container::Bitmap(_))
    }

    /// Heap bytes owned by this chunk (not counting the map slot that holds it).
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.container {
            Container::Runs(runs) => runs.capacity() * size_of::<Run>(),
            Container::Bitmap(_) => size_of::<Bitmap>(),
        }
    }

    /// Picks the smaller representation for the current run count.
    fn rebalance(&mut self) {
        let run_count = self.run_count as usize;
        let replacement = match &mut self.container {
            Container::Runs(runs) if runs.len() > RUNS_MAX => {
                let mut bits = Box::new([0u64; BITMAP_WORDS]);
                set_runs(&mut bits, runs);
                Some(Container::Bitmap(bits))
            }
            Container::Runs(runs) => {
                // Give back slack left by merges and trims so memory tracks the run count.
                if runs.capacity() > 4 * max(runs.len(), 4) {
                    runs.shrink_to(2 * runs.len());
                }
                None
            }
            Container::Bitmap(bits) if run_count < BITMAP_MIN_RUNS => {
                let runs: Vec<Run> = ChunkRuns::Bitmap { bits, next_offset: 0 }.collect();
                Some(Container::Runs(runs))
            }
            Container::Bitmap(_) => None,
        };
        if let Some(container) = replacement {
            self.container = container;
        }
    }
}

/// Maximal runs of a chunk in ascending order.
pub(crate) enum ChunkRuns<'a> {
    Runs(std::slice::Iter<'a, Run>),
    Bitmap { bits: &'a Bitmap, next_offset: u32 },
}

impl Iterator for ChunkRuns<'_> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        match self {
            ChunkRuns::Runs(runs) => runs.next().copied(),
            ChunkRuns::Bitmap { bits, next_offset } => {
                let first = next_set_bit(bits, *next_offset)?;
                let last = next_clear_bit(bits, u32::from(first)).map_or(MAX_OFFSET, |c| c - 1);
                *next_offset = u32::from(last) + 1;
                Some(Run { first, last })
            }
        }
    }
}

pub(crate) fn runs_are_canonical(runs: &[Run]) -> bool {
    runs.iter().all(|run| run.first <= run.last)
        && runs.windows(2).all(|pair| u32::from(pair[0].last) + 1 < u32::from(pair[1].first))
}

fn set_runs(bits: &mut Bitmap, runs: &[Run]) {
    for run in runs {
        let (first_word, last_word) = (usize::from(run.first) / 64, usize::from(run.last) / 64);
        let words = bits.iter_mut().enumerate();
        for (word_index, word) in words.take(last_word + 1).skip(first_word) {
            *word |= word_mask(word_index, run.first, run.last);
        }
    }
}

/// The bits of word `word_index` that fall inside offsets `first..=last` (which must overlap it).
fn word_mask(word_index: usize, first: u16, last: u16) -> u64 {
    let word_first = word_index as u32 * 64;
    let low = max(u32::from(first), word_first) - word_first;
    let high = min(u32::from(last), word_first + 63) - word_first;
    debug_assert!(low <= high);
    (u64::MAX << low) & (u64::MAX >> (63 - high))
}

/// Run starts (set bits whose predecessor is clear) inside words `first_word..=last_word`.
fn count_run_starts(bits: &Bitmap, first_word: usize, last_word: usize) -> u32 {
    (first_word..=last_word)
        .map(|word_index| {
            let carry = if word_index == 0 { 0 } else { bits[word_index - 1] >> 63 };
            let word = bits[word_index];
            (word & !((word << 1) | carry)).count_ones()
        })
        .sum()
}

fn next_set_bit(bits: &Bitmap, from: u32) -> Option<u16> {
    next_bit_matching(bits, from, |word| word)
}

fn next_clear_bit(bits: &Bitmap, from: u32) -> Option<u16> {
    next_bit_matching(bits, from, |word| !word)
}

/// First offset `>= from` whose bit is set in `view(word)`.
fn next_bit_matching(bits: &Bitmap, from: u32, view: impl Fn(u64) -> u64) -> Option<u16> {
    let mut word_index = (from / 64) as usize;
    if word_index >= BITMAP_WORDS {
        return None;
    }
    let mut word = view(bits[word_index]) & (u64::MAX << (from % 64));
    loop {
        if word != 0 {
            return Some((word_index * 64) as u16 + word.trailing_zeros() as u16);
        }
        word_index += 1;
        if word_index == BITMAP_WORDS {
            return None;
        }
        word = view(bits[word_index]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn offsets(chunk: &Chunk) -> BTreeSet<u16> {
        chunk.runs().flat_map(|run| run.first..=run.last).collect()
    }

    fn is_bitmap(chunk: &Chunk) -> bool {
        matches!(chunk.container, Container::Bitmap(_))
    }

    #[test]
    fn insert_range_merges_touching_runs() {
        let mut chunk = Chunk::single(10, 12);
        assert_eq!(chunk.insert_range(14, 15), 2);
        assert_eq!(chunk.run_count(), 2);
        assert_eq!(chunk.insert_range(13, 13), 1);
        assert_eq!(chunk.run_count(), 1);
        assert_eq!(chunk.insert_range(0, 20), 21 - 6);
        assert_eq!(chunk.runs().collect::<Vec<_>>(), [Run { first: 0, last: 20 }]);
        assert_eq!(chunk.insert_range(5, 6), 0);
        assert_eq!(chunk.acked_count(), 21);
    }

    #[test]
    fn alternating_offsets_switch_to_a_bitmap_and_back() {
        let mut chunk = Chunk::single(0, 0);
        for offset in (2..=MAX_OFFSET).step_by(2) {
            chunk.insert_range(offset, offset);
        }
        assert!(is_bitmap(&chunk));
        assert_eq!(chunk.run_count(), 32_768);
        assert_eq!(chunk.heap_bytes(), 8192);
        // Filling the holes merges runs until the chunk is one run again.
        for offset in (1..=MAX_OFFSET).step_by(2) {
            chunk.insert_range(offset, offset);
        }
        assert!(!is_bitmap(&chunk));
        assert_eq!(chunk.runs().collect::<Vec<_>>(), [Run { first: 0, last: MAX_OFFSET }]);
        assert_eq!(chunk.acked_count(), CHUNK_ENTRIES);
    }

    #[test]
    fn bitmap_and_runs_agree_on_every_query() {
        let mut runs_chunk = Chunk::single(1, 1);
        for offset in (3..6000u16).step_by(2) {
            runs_chunk.insert_range(offset, offset);
        }
        assert!(is_bitmap(&runs_chunk));
        let as_runs = Chunk::from_runs(runs_chunk.runs().collect());
        assert!(is_bitmap(&as_runs));
        let from_bitmap = Chunk::from_bitmap(Box::new(*runs_chunk.to_bitmap()));
        assert_eq!(from_bitmap, runs_chunk);
        for offset in [0u16, 1, 2, 3, 5999, 6000, 6001, MAX_OFFSET] {
            assert_eq!(runs_chunk.contains(offset), offset % 2 == 1 && offset < 6000);
        }
        assert_eq!(runs_chunk.next_present(6000), None);
        assert_eq!(runs_chunk.next_present(4), Some(5));
        assert_eq!(runs_chunk.run_end(5), 5);
    }

    #[test]
    fn remove_through_trims_both_representations() {
        let mut chunk = Chunk::single(5, 9);
        chunk.insert_range(20, 30);
        assert_eq!(chunk.remove_through(7), 3);
        assert_eq!(offsets(&chunk), (8..=9).chain(20..=30).collect());
        assert_eq!(chunk.remove_through(25), 8);
        assert_eq!(chunk.run_count(), 1);

        let mut dense = Chunk::single(0, 0);
        for offset in (2..8000u16).step_by(2) {
            dense.insert_range(offset, offset);
        }
        assert!(is_bitmap(&dense));
        assert_eq!(dense.remove_through(99), 50);
        assert_eq!(dense.run_count(), 3950);
        assert_eq!(dense.remove_through(7000), 3451);
        assert!(!is_bitmap(&dense));
        assert_eq!(dense.next_present(0), Some(7002));
    }

    #[test]
    fn run_end_crosses_words_in_bitmaps() {
        let mut chunk = Chunk::single(0, 0);
        for offset in (2..5000u16).step_by(2) {
            chunk.insert_range(offset, offset);
        }
        chunk.insert_range(4999, 5300);
        assert!(is_bitmap(&chunk));
        assert_eq!(chunk.run_end(4998), 5300);
        chunk.insert_range(5301, MAX_OFFSET);
        assert_eq!(chunk.run_end(5000), MAX_OFFSET);
    }

    #[test]
    fn remove_range_splits_runs_and_clears_bitmap_bits() {
        let mut chunk = Chunk::single(0, 100);
        chunk.insert_range(200, 300);
        assert_eq!(chunk.remove_range(50, 250), 51 + 51);
        assert_eq!(offsets(&chunk), (0..=49).chain(251..=300).collect());
        assert_eq!(chunk.remove_range(100, 200), 0);

        let mut dense = Chunk::single(0, 0);
        for offset in (2..6000u16).step_by(2) {
            dense.insert_range(offset, offset);
        }
        dense.insert_range(6000, 6100);
        assert!(is_bitmap(&dense));
        assert_eq!(dense.remove_range(5998, 6050), 1 + 51);
        assert_eq!(dense.run_count(), 3000);
        assert_eq!(dense.next_present(5997), Some(6051));
        assert_eq!(dense.remove_range(0, 5997), 2999);
        assert_eq!(dense.runs().collect::<Vec<_>>(), [Run { first: 6051, last: 6100 }]);
    }

    /// The cached counters must match a recount from the runs themselves.
    fn assert_counters_consistent(chunk: &Chunk) {
        assert_eq!(chunk.run_count() as usize, chunk.runs().count());
        assert_eq!(chunk.acked_count(), chunk.runs().map(Run::len).sum::<u32>());
    }

    #[test]
    fn bitmap_run_counts_stay_exact_at_word_boundaries() {
        let mut dense = Chunk::single(0, 0);
        for offset in (2..6000u16).step_by(2) {
            dense.insert_range(offset, offset);
        }
        // Evens below 100, one run 100..=300, evens above 300.
        dense.insert_range(100, 300);
        assert!(is_bitmap(&dense));
        assert_eq!(dense.run_count(), 50 + 1 + 2849);
        // 191 is the last bit of word 2; bit 192 stays set and becomes a run start.
        assert_eq!(dense.remove_range(100, 191), 92);
        assert_eq!(dense.run_count(), 2900);
        assert_counters_consistent(&dense);
        // Removing through a word's last bit makes the next word's first bit a run start too.
        assert_eq!(dense.remove_through(255), 50 + 64);
        assert_eq!(dense.next_present(0), Some(256));
        assert_counters_consistent(&dense);
        // Filling up to a word boundary merges with the run starting in the next word.
        dense.insert_range(200, 255);
        assert_eq!(dense.run_end(200), 300);
        assert_counters_consistent(&dense);
    }

    #[test]
    fn remove_from_keeps_only_lower_offsets() {
        let mut chunk = Chunk::single(0, 10);
        chunk.insert_range(20, 30);
        assert_eq!(chunk.remove_from(25), 6);
        assert_eq!(offsets(&chunk), (0..=10).chain(20..=24).collect());
        assert_eq!(chunk.remove_from(0), 16);
        assert!(chunk.is_empty());
    }
}
