//! Producer deduplication state of one topic, as Pulsar's `MessageDeduplication`: per producer
//! name, the highest sequence id staged ("pushed") and the highest made durable ("persisted").
//!
//! A SEND whose sequence id is at most the producer's pushed id is a duplicate: when it is at
//! most the persisted id too, it is certainly stored (the broker answers a receipt with message
//! id -1:-1 and stores nothing); otherwise its original is still in flight and the outcome is
//! unknown (the broker answers SEND_ERROR, the client retries after reconnecting).
//!
//! Pure: no I/O, no locks. The topic wraps it in a mutex and persists [`DedupSnapshot`]s.

use crate::cursor::Position;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What to do with a SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DupStatus {
    /// New: store it.
    NotDup,
    /// Already stored: acknowledge without storing.
    Dup,
    /// The original is staged but not yet durable: cannot tell now.
    Unknown,
}

/// The durable form of the persisted map: every producer's highest persisted sequence id as of
/// entry `position` (entries after it are replayed on load).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupSnapshot {
    /// `(ledger_id, entry_id)` of the last entry the map covers; `None`: no entry yet.
    pub position: Option<(u64, u64)>,
    pub producers: HashMap<String, u64>,
}

/// Whether an entry is a chunk other than the last of its message: all chunks carry the
/// message's sequence id, so only the last one counts (as in Pulsar).
pub fn is_intermediate_chunk(metadata: &magnetar_protocol::proto::MessageMetadata) -> bool {
    match (metadata.chunk_id, metadata.num_chunks_from_msg) {
        (Some(chunk), Some(chunks)) => chunk.saturating_add(1) < chunks,
        _ => false,
    }
}

#[derive(Debug, Default)]
pub struct DedupState {
    pushed: HashMap<String, u64>,
    persisted: HashMap<String, u64>,
    /// Last entry recorded as persisted (the position a snapshot covers).
    last_position: Option<Position>,
    /// Entries persisted since the last snapshot was taken.
    since_snapshot: u64,
}

impl DedupState {
    /// The state a snapshot describes (replay of the entries after it follows).
    pub fn from_snapshot(snapshot: &DedupSnapshot) -> Self {
        DedupState {
            pushed: snapshot.producers.clone(),
            persisted: snapshot.producers.clone(),
            last_position: snapshot.position.map(|(l, e)| Position::new(l, e)),
            since_snapshot: 0,
        }
    }

    /// Checks a SEND of `producer` carrying sequence ids `sequence_id..=highest`; a new one
    /// is recorded as pushed.
    pub fn check(&mut self, producer: &str, sequence_id: u64, highest: u64) -> DupStatus {
        if let Some(&pushed) = self.pushed.get(producer) {
            if sequence_id <= pushed {
                return match self.persisted.get(producer) {
                    Some(&persisted) if sequence_id <= persisted => DupStatus::Dup,
                    _ => DupStatus::Unknown,
                };
            }
        }
        raise(&mut self.pushed, producer, highest.max(sequence_id));
        DupStatus::NotDup
    }

    /// An entry of `producer` up to sequence id `highest` is durable at `position`.
    pub fn persisted(&mut self, producer: &str, highest: u64, position: Position) {
        raise(&mut self.persisted, producer, highest);
        // Replayed entries count as pushed too: a resend of them is a duplicate.
        raise(&mut self.pushed, producer, highest);
        if self.last_position.is_none_or(|last| position > last) {
            self.last_position = Some(position);
        }
        self.since_snapshot += 1;
    }

    /// A staged append failed: what was pushed but not persisted may be sent again, as Pulsar
    /// resets `highestSequencedPushed` to the persisted ids.
    pub fn append_failed(&mut self) {
        self.pushed = self.persisted.clone();
    }

    /// `last_sequence_id` of PRODUCER_SUCCESS: the producer's highest pushed id, -1 if none.
    pub fn last_sequence_id(&self, producer: &str) -> i64 {
        self.pushed.get(producer).map_or(-1, |&id| i64::try_from(id).unwrap_or(i64::MAX))
    }

    /// Whether at least `interval` entries were persisted since the last snapshot.
    pub fn snapshot_due(&self, interval: u64) -> bool {
        self.since_snapshot >= interval
    }

    /// The persisted map as of the last persisted entry; resets the snapshot counter.
    pub fn take_snapshot(&mut self) -> DedupSnapshot {
        self.since_snapshot = 0;
        DedupSnapshot {
            position: self.last_position.map(|p| (p.ledger_id, p.entry_id)),
            producers: self.persisted.clone(),
        }
    }
}

/// Raises `map[producer]` to at least `id`. Runs once per stored entry: the producer's name is
/// copied only the first time it is seen, not on every entry.
fn raise(map: &mut HashMap<String, u64>, producer: &str, id: u64) {
    match map.get_mut(producer) {
        Some(current) => *current = (*current).max(id),
        None => {
            map.insert(producer.to_string(), id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_pass_and_resends_are_duplicates_once_persisted() {
        let mut state = DedupState::default();
        assert_eq!(state.last_sequence_id("p"), -1);
        assert_eq!(state.check("p", 0, 0), DupStatus::NotDup);
        assert_eq!(state.check("p", 1, 1), DupStatus::NotDup);
        // Pushed but not durable yet: unknown.
        assert_eq!(state.check("p", 1, 1), DupStatus::Unknown);
        state.persisted("p", 0, Position::new(1, 0));
        state.persisted("p", 1, Position::new(1, 1));
        assert_eq!(state.check("p", 0, 0), DupStatus::Dup);
        assert_eq!(state.check("p", 1, 1), DupStatus::Dup);
        assert_eq!(state.check("p", 2, 2), DupStatus::NotDup);
        assert_eq!(state.last_sequence_id("p"), 2);
        // Producers are independent.
        assert_eq!(state.check("q", 0, 0), DupStatus::NotDup);
    }

    #[test]
    fn batches_count_up_to_their_highest_sequence_id() {
        let mut state = DedupState::default();
        assert_eq!(state.check("p", 10, 14), DupStatus::NotDup);
        state.persisted("p", 14, Position::new(3, 0));
        assert_eq!(state.check("p", 12, 12), DupStatus::Dup);
        assert_eq!(state.check("p", 14, 14), DupStatus::Dup);
        assert_eq!(state.check("p", 15, 20), DupStatus::NotDup);
        assert_eq!(state.last_sequence_id("p"), 20);
        // A lower highest_sequence_id than sequence_id counts as the sequence id.
        let mut other = DedupState::default();
        assert_eq!(other.check("p", 5, 0), DupStatus::NotDup);
        assert_eq!(other.last_sequence_id("p"), 5);
    }

    #[test]
    fn failed_append_forgets_what_was_only_pushed() {
        let mut state = DedupState::default();
        assert_eq!(state.check("p", 0, 0), DupStatus::NotDup);
        state.persisted("p", 0, Position::new(1, 0));
        assert_eq!(state.check("p", 1, 1), DupStatus::NotDup);
        state.append_failed();
        assert_eq!(state.check("p", 1, 1), DupStatus::NotDup);
        assert_eq!(state.check("p", 0, 0), DupStatus::Dup);
    }

    #[test]
    fn snapshot_and_replay_restore_the_persisted_ids() {
        let mut state = DedupState::default();
        for i in 0..5 {
            assert_eq!(state.check("p", i, i), DupStatus::NotDup);
            state.persisted("p", i, Position::new(7, i));
        }
        assert!(state.snapshot_due(5));
        assert!(!state.snapshot_due(6));
        let snapshot = state.take_snapshot();
        assert!(!state.snapshot_due(1));
        assert_eq!(snapshot.position, Some((7, 4)));
        assert_eq!(snapshot.producers.get("p"), Some(&4));
        let json = serde_json::to_vec(&snapshot).unwrap();
        let decoded: DedupSnapshot = serde_json::from_slice(&json).unwrap();
        assert_eq!(decoded, snapshot);
        // A restart: the snapshot, then the entries written after it, replayed.
        let mut restored = DedupState::from_snapshot(&decoded);
        restored.persisted("p", 5, Position::new(8, 0));
        restored.persisted("q", 3, Position::new(8, 1));
        assert_eq!(restored.last_sequence_id("p"), 5);
        assert_eq!(restored.last_sequence_id("q"), 3);
        assert_eq!(restored.check("p", 5, 5), DupStatus::Dup);
        assert_eq!(restored.check("p", 6, 6), DupStatus::NotDup);
        assert_eq!(restored.take_snapshot().position, Some((8, 1)));
    }

    #[test]
    fn only_the_last_chunk_counts() {
        let chunk = |id, of| magnetar_protocol::proto::MessageMetadata {
            chunk_id: Some(id),
            num_chunks_from_msg: Some(of),
            ..Default::default()
        };
        assert!(is_intermediate_chunk(&chunk(0, 3)));
        assert!(is_intermediate_chunk(&chunk(1, 3)));
        assert!(!is_intermediate_chunk(&chunk(2, 3)));
        assert!(!is_intermediate_chunk(&Default::default()));
    }
}
