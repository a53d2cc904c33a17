//! Partial acknowledgement of one batch entry, by message index inside the batch.
//!
//! Uses Pulsar's `ack_set` convention (see `ManagedCursorImpl.asyncDelete`, which ANDs incoming
//! ack sets into `batchDeletedIndexes` and treats an empty set as "entry fully acked"): a bitset
//! of little-endian 64-bit words in which a SET bit means the message at that index is still
//! UNacknowledged. The stored words can therefore be sent unchanged with a redelivered entry so
//! the consumer skips messages it already acknowledged.
//!
//! Invariants: `unacked` has exactly `ceil(batch_size / 64)` words, no bit at or beyond
//! `batch_size` is set, and a stored state has at least one set (unacked) bit.

use super::error::AckError;
use super::position::Position;

/// Largest batch (messages per entry) a cursor tracks by index; bounds ack-set memory to 8 KiB.
pub const MAX_BATCH_SIZE: u32 = 65_536;

/// Which messages of a batch entry are still unacknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchAckState {
    batch_size: u32,
    unacked: Box<[u64]>,
}

impl BatchAckState {
    pub(crate) fn all_unacked(batch_size: u32) -> Self {
        debug_assert!((1..=MAX_BATCH_SIZE).contains(&batch_size));
        let mut unacked = vec![u64::MAX; word_count(batch_size)].into_boxed_slice();
        if let Some(last) = unacked.last_mut() {
            *last &= tail_mask(batch_size);
        }
        Self { batch_size, unacked }
    }

    /// Rebuilds a persisted state; `None` when the words break the invariants.
    pub(crate) fn from_unacked_words(batch_size: u32, unacked: Box<[u64]>) -> Option<Self> {
        let valid = (1..=MAX_BATCH_SIZE).contains(&batch_size)
            && unacked.len() == word_count(batch_size)
            && unacked.last().is_some_and(|last| last & !tail_mask(batch_size) == 0)
            && unacked.iter().any(|word| *word != 0);
        valid.then_some(Self { batch_size, unacked })
    }

    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    /// Pulsar's `ack_set` for this entry: bit `i` set means message `i` is still unacknowledged.
    pub fn ack_set(&self) -> &[u64] {
        &self.unacked
    }

    pub fn unacked_count(&self) -> u32 {
        self.unacked.iter().map(|word| word.count_ones()).sum()
    }

    /// Whether message `index` was acknowledged (`false` for indexes outside the batch).
    pub fn is_index_acked(&self, index: u32) -> bool {
        index < self.batch_size && self.unacked[(index / 64) as usize] >> (index % 64) & 1 == 0
    }

    /// Keeps unacked only the messages `ack_set` also marks unacked. Words missing from `ack_set`
    /// count as zero (acked), as Java's `BitSet.valueOf` reads them.
    pub(crate) fn retain_unacked(&mut self, ack_set: &[u64]) {
        for (index, word) in self.unacked.iter_mut().enumerate() {
            *word &= ack_set.get(index).copied().unwrap_or(0);
        }
    }

    pub(crate) fn is_fully_acked(&self) -> bool {
        self.unacked.iter().all(|word| *word == 0)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.unacked.len() * size_of::<u64>()
    }
}

pub(crate) fn validate_batch_size(batch_size: u32) -> Result<(), AckError> {
    if (1..=MAX_BATCH_SIZE).contains(&batch_size) {
        Ok(())
    } else {
        Err(AckError::InvalidBatchSize { batch_size })
    }
}

/// The ack set (set bit = unacked) that acknowledges exactly `acked_indexes`.
pub(crate) fn ack_set_acking(
    position: Position,
    batch_size: u32,
    acked_indexes: impl IntoIterator<Item = u32>,
) -> Result<Box<[u64]>, AckError> {
    let mut ack_set = BatchAckState::all_unacked(batch_size).unacked;
    for index in acked_indexes {
        if index >= batch_size {
            return Err(AckError::BatchIndexOutOfRange { position, index, batch_size });
        }
        ack_set[(index / 64) as usize] &= !(1 << (index % 64));
    }
    Ok(ack_set)
}

pub(crate) fn word_count(batch_size: u32) -> usize {
    batch_size.div_ceil(64) as usize
}

/// Valid bits of the last word of a batch of `batch_size` messages.
fn tail_mask(batch_size: u32) -> u64 {
    match batch_size % 64 {
        0 => u64::MAX,
        used => (1u64 << used) - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_batch_has_every_message_unacked_and_no_stray_bits() {
        let state = BatchAckState::all_unacked(70);
        assert_eq!(state.ack_set(), [u64::MAX, (1 << 6) - 1]);
        assert_eq!(state.unacked_count(), 70);
        assert!(!state.is_index_acked(69));
        assert!(!state.is_index_acked(70));
    }

    #[test]
    fn retain_unacked_intersects_with_incoming_ack_sets() {
        let position = Position::new(1, 1);
        let mut state = BatchAckState::all_unacked(10);
        state.retain_unacked(&ack_set_acking(position, 10, [0, 3]).unwrap());
        state.retain_unacked(&ack_set_acking(position, 10, [3, 9]).unwrap());
        assert_eq!(state.unacked_count(), 7);
        assert!(state.is_index_acked(0) && state.is_index_acked(3) && state.is_index_acked(9));
        state.retain_unacked(&[]);
        assert!(state.is_fully_acked());
    }

    #[test]
    fn out_of_range_indexes_are_rejected() {
        let position = Position::new(1, 1);
        assert_eq!(
            ack_set_acking(position, 4, [4]),
            Err(AckError::BatchIndexOutOfRange { position, index: 4, batch_size: 4 })
        );
        assert!(validate_batch_size(0).is_err());
        assert!(validate_batch_size(MAX_BATCH_SIZE + 1).is_err());
    }

    #[test]
    fn persisted_words_are_validated() {
        assert!(BatchAckState::from_unacked_words(3, Box::new([0b101])).is_some());
        assert!(BatchAckState::from_unacked_words(3, Box::new([0b1000])).is_none());
        assert!(BatchAckState::from_unacked_words(3, Box::new([0])).is_none());
        assert!(BatchAckState::from_unacked_words(3, Box::new([1, 0])).is_none());
        assert!(BatchAckState::from_unacked_words(0, Box::new([])).is_none());
    }
}
