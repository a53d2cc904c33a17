//! Topic compaction, the deciding core (Pulsar's `TwoPhaseCompactor` /
//! `PublishingOrderCompactor`), without I/O: the broker's shell reads entries, parses them into
//! [`EntryShape`]s and writes what this core keeps.
//!
//! A compaction run reads the topic from its first entry (or the previous compacted ledger, then
//! the topic after its horizon) up to the last entry at the run's start:
//! - **phase one** ([`LatestPerKey`]) keeps, per key, the id of its latest message; a message
//!   with an empty payload (a null value) deletes its key; a message without a key is dropped
//!   (Pulsar's `topicCompactionRetainNullKey` default); a batch is looked at message by message.
//! - **phase two** ([`LatestPerKey::keep`]) reads the same entries again and says what the
//!   compacted ledger gets of each: the whole entry, some of a batch's messages (the others are
//!   marked compacted out, so message ids stay those of the topic), or nothing.
//! - the run **commits** ([`CompactionState::commit`]) by recording the new compacted ledger and
//!   its horizon (the last entry read) in one write; until then the previous compacted ledger
//!   stays in force, so a crash mid-run loses only the run (its ledger is left to delete).
//!
//! A compacted read ([`start_index`]) at a position before the horizon starts at the first
//! compacted entry at or after it, and goes on in the topic after the horizon.

use std::collections::HashMap;

pub mod entry;
pub mod topic;

pub use entry::CompactedEntry;
pub use topic::{
    CompactedView, CompactionError, CompactionHost, CompactionRecord, CompactionStats, RunStatus,
    TopicCompaction,
};

/// A message's position: ledger, entry, and index in its batch (`None`: not a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId {
    pub ledger: u64,
    pub entry: u64,
    pub batch_index: Option<u32>,
}

impl MessageId {
    pub fn entry(ledger: u64, entry: u64) -> Self {
        MessageId { ledger, entry, batch_index: None }
    }

    /// The entry holding the message.
    pub fn position(&self) -> (u64, u64) {
        (self.ledger, self.entry)
    }
}

/// One message as compaction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageShape {
    /// The partition key (`None`: the message has none).
    pub key: Option<String>,
    /// Payload bytes (uncompressed); 0, or a null value, deletes the key.
    pub payload_len: usize,
    pub null_value: bool,
    /// Already compacted out of its batch by an earlier run.
    pub compacted_out: bool,
}

impl MessageShape {
    /// Whether the message deletes its key.
    fn is_tombstone(&self) -> bool {
        self.null_value || self.payload_len == 0
    }
}

/// One entry as compaction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryShape {
    /// A single message.
    Single(MessageShape),
    /// A batch, its messages in order.
    Batch(Vec<MessageShape>),
    /// An entry whose messages compaction cannot see (encrypted, undecodable): kept whole,
    /// deciding nothing about keys, as Pulsar does.
    Opaque,
    /// A broker marker (no user message): dropped.
    Marker,
}

/// What the compacted ledger keeps of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    Whole,
    /// A batch with only these message indexes kept (the others marked compacted out).
    Messages(Vec<u32>),
    Nothing,
}

/// Phase one's result: the latest message of each key.
#[derive(Debug, Default)]
pub struct LatestPerKey {
    latest: HashMap<String, MessageId>,
    /// Messages this run leaves out: replaced values, tombstones, messages without a key
    /// (Pulsar's `lastCompactionRemovedEventCount`).
    pub removed: u64,
    /// The last entry phase one read (the run's horizon).
    pub last_read: Option<(u64, u64)>,
}

impl LatestPerKey {
    pub fn new() -> Self {
        Self::default()
    }

    /// Phase one: takes entry `(ledger, entry)`, read in topic order.
    pub fn observe(&mut self, ledger: u64, entry: u64, shape: &EntryShape) {
        assert!(
            self.last_read.is_none_or(|last| last < (ledger, entry)),
            "entries are observed in topic order"
        );
        self.last_read = Some((ledger, entry));
        match shape {
            EntryShape::Single(message) => {
                self.message(MessageId::entry(ledger, entry), message);
            }
            EntryShape::Batch(messages) => {
                for (index, message) in messages.iter().enumerate() {
                    if message.compacted_out {
                        continue;
                    }
                    let index = u32::try_from(index).unwrap_or(u32::MAX);
                    let id = MessageId { ledger, entry, batch_index: Some(index) };
                    self.message(id, message);
                }
            }
            EntryShape::Opaque => {}
            EntryShape::Marker => self.removed += 1,
        }
    }

    fn message(&mut self, id: MessageId, message: &MessageShape) {
        let Some(key) = &message.key else {
            self.removed += 1;
            return;
        };
        let replaced = if message.is_tombstone() {
            self.removed += 1;
            self.latest.remove(key)
        } else {
            self.latest.insert(key.clone(), id)
        };
        if replaced.is_some() {
            self.removed += 1;
        }
    }

    /// The keys kept, with their latest message.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }

    pub fn latest(&self, key: &str) -> Option<MessageId> {
        self.latest.get(key).copied()
    }

    /// Phase two: what the compacted ledger keeps of entry `(ledger, entry)`.
    pub fn keep(&self, ledger: u64, entry: u64, shape: &EntryShape) -> Keep {
        let kept = |id: MessageId, message: &MessageShape| {
            !message.compacted_out
                && message.key.as_ref().is_some_and(|key| self.latest.get(key) == Some(&id))
        };
        match shape {
            EntryShape::Single(message) => {
                if kept(MessageId::entry(ledger, entry), message) {
                    Keep::Whole
                } else {
                    Keep::Nothing
                }
            }
            EntryShape::Batch(messages) => {
                let indexes: Vec<u32> = (0u32..)
                    .zip(messages)
                    .filter(|(index, message)| {
                        kept(MessageId { ledger, entry, batch_index: Some(*index) }, message)
                    })
                    .map(|(index, _)| index)
                    .collect();
                if indexes.is_empty() {
                    Keep::Nothing
                } else if indexes.len() == messages.len() {
                    Keep::Whole
                } else {
                    Keep::Messages(indexes)
                }
            }
            EntryShape::Opaque => Keep::Whole,
            EntryShape::Marker => Keep::Nothing,
        }
    }
}

/// A compacted ledger in force: its id and its horizon (the last topic entry it covers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    pub ledger: u64,
    pub horizon: (u64, u64),
}

/// How a topic's compaction stands: the compacted ledger in force, and a run under way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionState {
    pub committed: Option<Compacted>,
    running: bool,
}

/// Why a run cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompactionRefused {
    /// Pulsar's 409 "Compaction already in progress".
    AlreadyRunning,
}

impl CompactionState {
    /// From what the subscription's stored properties say (at load).
    pub fn recovered(committed: Option<Compacted>) -> Self {
        CompactionState { committed, running: false }
    }

    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Starts a run: one at a time.
    pub fn begin(&mut self) -> Result<(), CompactionRefused> {
        if self.running {
            return Err(CompactionRefused::AlreadyRunning);
        }
        self.running = true;
        Ok(())
    }

    /// The run wrote `compacted` and recorded it: it takes over; returns the ledger it
    /// replaces (to delete once nothing reads it).
    pub fn commit(&mut self, compacted: Compacted) -> Option<u64> {
        assert!(self.running, "a commit ends a run");
        if let Some(previous) = self.committed {
            assert!(compacted.horizon >= previous.horizon, "a horizon never moves back");
        }
        self.running = false;
        self.committed.replace(compacted).map(|previous| previous.ledger)
    }

    /// The run failed before its commit: the compacted ledger in force stays.
    pub fn fail(&mut self) {
        self.running = false;
    }

    /// Whether a read at `position` is served from the compacted ledger (it is at or before
    /// the horizon).
    pub fn reads_compacted(&self, position: (u64, u64)) -> bool {
        self.committed.is_some_and(|c| position <= c.horizon)
    }
}

/// Where a compacted read at `position` starts in the compacted ledger whose entries hold the
/// topic positions `kept` (ascending): the index of the first at or after `position`
/// (`kept.len()`: none, the read goes on in the topic after the horizon).
pub fn start_index(kept: &[(u64, u64)], position: (u64, u64)) -> usize {
    kept.partition_point(|&p| p < position)
}

/// Whether automatic compaction is due: a threshold is set and the backlog not yet compacted
/// (bytes after the horizon) is over it (Pulsar's `checkCompaction`).
pub fn compaction_due(threshold_bytes: u64, uncompacted_bytes: u64) -> bool {
    threshold_bytes > 0 && uncompacted_bytes > threshold_bytes
}

#[cfg(test)]
mod tests;
