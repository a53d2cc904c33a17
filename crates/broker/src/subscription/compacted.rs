//! Compacted reads (`readCompacted`, Exclusive and Failover only): while the subscription's
//! position is at or before the compaction horizon, entries come from the compacted view (the
//! latest message per key, at their topic positions), then from the topic after the horizon
//! (Pulsar's `CompactedTopicImpl.asyncReadEntriesOrWait`). A batch compaction thinned goes out
//! whole with an `ack_set` naming its kept messages, which every official client honours; its
//! other messages count as acknowledged, so that acknowledging the kept ones completes it.

use super::{Plan, State, SubType};
use crate::cursor::{next_position, LedgerList, Position};
use crate::error::BrokerError;
use bytes::Bytes;
use magnetar_compaction::{CompactedEntry, CompactedView, TopicCompaction};
use std::collections::HashMap;
use std::sync::Arc;

/// A round's entries, and the kept-message masks of those that came thinned.
pub(super) struct CompactedRead {
    pub entries: Vec<(Position, Bytes)>,
    pub masks: HashMap<Position, (u32, Vec<u64>)>,
    /// Nothing of the view is left after the subscription's position: it moves to the horizon.
    pub past_horizon: Option<Position>,
}

impl State {
    /// Whether the consumer dispatched to reads compacted.
    pub(super) fn reads_compacted(&self) -> bool {
        matches!(self.sub_type, SubType::Exclusive | SubType::Failover)
            && self
                .consumers
                .iter()
                .find(|s| Some(s.handle.key) == self.active)
                .is_some_and(|s| s.handle.read_compacted)
    }

    /// Takes a compacted round's masks: a thinned batch's other messages are acknowledged
    /// (where its entry still exists), and its MESSAGE carries the kept ones as `ack_set`.
    pub(super) fn take_masks(
        &mut self,
        masks: HashMap<Position, (u32, Vec<u64>)>,
        ledgers: &LedgerList,
    ) {
        for (position, (batch_size, kept)) in &masks {
            if self.ack.partial_batch(*position).is_none() {
                let _ = self.ack.ack_batch_ack_set(*position, *batch_size, kept, ledgers);
            }
        }
        self.compacted_masks = masks.into_iter().map(|(p, (_, kept))| (p, kept)).collect();
    }

    /// The `ack_set` of a MESSAGE for `position`: its partial batch's unacknowledged messages,
    /// and, if it came thinned from the compacted view, only its kept ones.
    pub(super) fn message_ack_set(&self, position: Position) -> Vec<i64> {
        let partial = self.ack.partial_batch(position).map(|batch| batch.ack_set().to_vec());
        // The dispatch path: no compacted round, no lookup.
        let kept = if self.compacted_masks.is_empty() {
            None
        } else {
            self.compacted_masks.get(&position)
        };
        let words: Vec<u64> = match (partial, kept) {
            (None, None) => Vec::new(),
            (Some(partial), None) => partial,
            (None, Some(kept)) => kept.clone(),
            (Some(partial), Some(kept)) => partial
                .iter()
                .zip(kept.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a & b)
                .collect(),
        };
        words.into_iter().map(|w| w as i64).collect()
    }
}

impl super::Subscription {
    /// The compacted view consumer `key` reads, if it reads compacted and the topic was
    /// compacted (GET_LAST_MESSAGE_ID answers from it).
    pub fn compacted_view_of(&self, key: u64) -> Option<Arc<CompactedView>> {
        let reads = self.state.lock().slot(key).is_some_and(|s| s.handle.read_compacted);
        if !reads {
            return None;
        }
        self.compaction.get()?.view()
    }
}

/// The view a round reads from: the compaction's, if the dispatched-to consumer reads compacted
/// and the subscription's position is not past the horizon.
pub(super) fn view_for(
    compaction: Option<&Arc<TopicCompaction>>,
    state: &State,
) -> Option<Arc<CompactedView>> {
    if !state.reads_compacted() {
        return None;
    }
    let view = compaction?.view()?;
    let horizon = Position::new(view.horizon.0, view.horizon.1);
    state.last_read.is_none_or(|last| last < horizon).then_some(view)
}

/// The horizon of the view the subscription would read, for planning: a compacted read may
/// have entries left when the topic has none (its ledgers trimmed).
pub(super) fn planning_horizon(
    compaction: Option<&Arc<TopicCompaction>>,
    state: &State,
) -> Option<Position> {
    if !state.reads_compacted() {
        return None;
    }
    compaction?.horizon().map(|(l, e)| Position::new(l, e))
}

/// Reads what `plan` names through `view`. May block.
pub(super) fn read(
    view: &CompactedView,
    managed_ledger: &crate::managed_ledger::ManagedLedger,
    ledgers: &LedgerList,
    plan: &Plan,
    last_read: Option<Position>,
) -> Result<CompactedRead, BrokerError> {
    let horizon = Position::new(view.horizon.0, view.horizon.1);
    let to_pos = |p: Position| (p.ledger_id, p.entry_id);
    let mut read = CompactedRead { entries: Vec::new(), masks: HashMap::new(), past_horizon: None };
    let take = |entries: Vec<CompactedEntry>, read: &mut CompactedRead| {
        for entry in entries {
            let position = Position::new(entry.position.0, entry.position.1);
            if let Some(kept) = entry.kept {
                read.masks.insert(position, (entry.batch_size, kept));
            }
            read.entries.push((position, entry.data));
        }
    };
    match plan {
        Plan::New(_, count) => {
            let entries = view.read_after(last_read.map(to_pos), *count)?;
            if entries.is_empty() {
                read.past_horizon = Some(horizon);
                if let Some(from) = next_position(ledgers, Some(horizon)) {
                    read.entries = managed_ledger.read_from(from, *count)?;
                }
            } else {
                take(entries, &mut read);
            }
        }
        Plan::Redeliver(positions) => {
            let (compacted, topic): (Vec<Position>, Vec<Position>) =
                positions.iter().partition(|p| **p <= horizon);
            let compacted: Vec<_> = compacted.into_iter().map(to_pos).collect();
            take(view.read_positions(&compacted)?, &mut read);
            read.entries.extend(managed_ledger.read_positions(&topic)?);
        }
        Plan::Rescan(..) => {}
    }
    Ok(read)
}
