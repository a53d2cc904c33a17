//! A replicated ledger's metadata: the ensemble history, quorums, state and epoch. Stored as
//! JSON in the metadata store and changed only by compare-and-set; every change is checked by
//! [`LedgerMeta::validate_successor`] before it is proposed.

use crate::{EntryId, Epoch, NodeId};
use magnetar_model::storage_nodes::IsolationGroups;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LedgerState {
    Open,
    InRecovery,
    Closed,
}

/// Entries from `first_entry` on (up to the next fragment's first) live on every node of
/// `ensemble` (E = Qw: no striping).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragment {
    pub first_entry: EntryId,
    pub ensemble: Vec<NodeId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerMeta {
    pub write_quorum: u32,
    pub ack_quorum: u32,
    pub state: LedgerState,
    /// Set when CLOSED: the last entry (`None`: the ledger is empty).
    pub last_entry_id: Option<EntryId>,
    /// Ensemble history, first entries strictly increasing; the first starts at 0.
    pub fragments: Vec<Fragment>,
    /// Raised by every recovery open.
    pub epoch: Epoch,
    /// The node groups the ledger's copies keep to (its namespace's bookie affinity when it
    /// was created), for whoever replaces a node: the writer, a recovery, re-replication.
    /// BookKeeper keeps its placement policy's settings in the ledger's metadata likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<IsolationGroups>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("invalid ledger metadata: {0}")]
    Invalid(String),
    #[error("ledger metadata is not valid JSON: {0}")]
    Decode(String),
}

impl LedgerMeta {
    /// A new OPEN ledger on `ensemble`.
    pub fn new(ensemble: Vec<NodeId>, write_quorum: u32, ack_quorum: u32) -> LedgerMeta {
        LedgerMeta {
            write_quorum,
            ack_quorum,
            state: LedgerState::Open,
            last_entry_id: None,
            fragments: vec![Fragment { first_entry: 0, ensemble }],
            epoch: 0,
            isolation: None,
        }
    }

    /// The same ledger keeping its copies to `isolation`'s groups.
    pub fn with_isolation(mut self, isolation: Option<IsolationGroups>) -> LedgerMeta {
        self.isolation = isolation;
        self
    }

    /// The fragment holding `entry`.
    pub fn fragment_for(&self, entry: EntryId) -> &Fragment {
        assert!(!self.fragments.is_empty());
        let index = self.fragments.partition_point(|f| f.first_entry <= entry);
        assert!(index > 0, "the first fragment starts at 0");
        &self.fragments[index - 1]
    }

    pub fn ensemble_for(&self, entry: EntryId) -> &[NodeId] {
        &self.fragment_for(entry).ensemble
    }

    pub fn last_fragment(&self) -> &Fragment {
        self.fragments.last().expect("a ledger has at least one fragment")
    }

    /// Nodes to ask "do you have entry e?" during recovery: `Qw - Qa + 1` of them saying no
    /// means no write of e can have reached Qa.
    pub fn absent_quorum(&self) -> usize {
        (self.write_quorum - self.ack_quorum + 1) as usize
    }

    pub fn validate(&self) -> Result<(), MetaError> {
        let invalid = |why: String| Err(MetaError::Invalid(why));
        if self.ack_quorum == 0 || self.ack_quorum > self.write_quorum {
            return invalid(format!(
                "need write quorum {} >= ack quorum {} >= 1",
                self.write_quorum, self.ack_quorum
            ));
        }
        if self.fragments.is_empty() || self.fragments[0].first_entry != 0 {
            return invalid("the first fragment must start at entry 0".into());
        }
        for pair in self.fragments.windows(2) {
            if pair[1].first_entry <= pair[0].first_entry {
                return invalid(format!(
                    "fragment starts must increase ({} then {})",
                    pair[0].first_entry, pair[1].first_entry
                ));
            }
        }
        for fragment in &self.fragments {
            if fragment.ensemble.len() != self.write_quorum as usize {
                return invalid(format!(
                    "fragment at {} has {} nodes, the write quorum is {}",
                    fragment.first_entry,
                    fragment.ensemble.len(),
                    self.write_quorum
                ));
            }
            let mut sorted = fragment.ensemble.clone();
            sorted.sort();
            sorted.dedup();
            if sorted.len() != fragment.ensemble.len() {
                return invalid(format!(
                    "fragment at {} names a node twice: {:?}",
                    fragment.first_entry, fragment.ensemble
                ));
            }
        }
        match (self.state, self.last_entry_id) {
            (LedgerState::Closed, Some(last)) if last + 1 < self.last_fragment().first_entry => {
                invalid(format!(
                    "closed at {last}, below its last fragment's start {}",
                    self.last_fragment().first_entry
                ))
            }
            (LedgerState::Open | LedgerState::InRecovery, Some(_)) => {
                invalid("only a closed ledger has a last entry id".into())
            }
            _ => Ok(()),
        }
    }

    /// Checks that `next` may replace `self` in the store: valid, same quorums, an epoch that
    /// does not go back, no way out of CLOSED, and an ensemble history that only grows at its
    /// end (a fragment is replaced only at or after the last one's start).
    pub fn validate_successor(&self, next: &LedgerMeta) -> Result<(), MetaError> {
        next.validate()?;
        let invalid = |why: &str| Err(MetaError::Invalid(why.to_string()));
        if next.write_quorum != self.write_quorum || next.ack_quorum != self.ack_quorum {
            return invalid("quorums never change");
        }
        if next.isolation != self.isolation {
            return invalid("node groups never change");
        }
        if next.epoch < self.epoch {
            return invalid("the epoch never decreases");
        }
        if self.state == LedgerState::Closed {
            return invalid("a closed ledger never changes");
        }
        let kept = self.fragments.len() - 1;
        if next.fragments.len() < kept || next.fragments[..kept] != self.fragments[..kept] {
            return invalid("earlier fragments never change");
        }
        if next.fragments[kept].first_entry < self.fragments[kept].first_entry {
            return invalid("the last fragment never starts earlier");
        }
        Ok(())
    }

    /// Checks that `next` is `self` with copies moved (re-replication): valid, and the same in
    /// everything but the nodes of its ensembles, where each fragment keeps its start and its
    /// size, and every node it drops is replaced by one it did not have. Unlike
    /// [`validate_successor`](Self::validate_successor), any fragment may change, a CLOSED
    /// ledger's too: the entries do not change, only where their copies are.
    pub fn validate_replacement(&self, next: &LedgerMeta) -> Result<(), MetaError> {
        next.validate()?;
        let invalid = |why: &str| Err(MetaError::Invalid(why.to_string()));
        let same = next.write_quorum == self.write_quorum
            && next.ack_quorum == self.ack_quorum
            && next.state == self.state
            && next.last_entry_id == self.last_entry_id
            && next.epoch == self.epoch
            && next.isolation == self.isolation;
        if !same {
            return invalid("a re-replication changes nothing but ensembles");
        }
        if next.fragments.len() != self.fragments.len() {
            return invalid("a re-replication keeps every fragment");
        }
        for (old, new) in self.fragments.iter().zip(&next.fragments) {
            if old.first_entry != new.first_entry {
                return invalid("a re-replication keeps every fragment's start");
            }
        }
        Ok(())
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("ledger metadata always serializes")
    }

    pub fn from_json(bytes: &[u8]) -> Result<LedgerMeta, MetaError> {
        let meta: LedgerMeta =
            serde_json::from_slice(bytes).map_err(|e| MetaError::Decode(e.to_string()))?;
        meta.validate()?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(ids: &[u64]) -> Vec<NodeId> {
        ids.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn fragment_lookup_follows_first_entries() {
        let mut meta = LedgerMeta::new(nodes(&[1, 2]), 2, 2);
        meta.fragments.push(Fragment { first_entry: 10, ensemble: nodes(&[1, 3]) });
        assert_eq!(meta.ensemble_for(0), nodes(&[1, 2]).as_slice());
        assert_eq!(meta.ensemble_for(9), nodes(&[1, 2]).as_slice());
        assert_eq!(meta.ensemble_for(10), nodes(&[1, 3]).as_slice());
        assert_eq!(meta.ensemble_for(u64::MAX), nodes(&[1, 3]).as_slice());
        meta.validate().unwrap();
    }

    #[test]
    fn a_replacement_moves_copies_of_any_fragment_and_changes_nothing_else() {
        let mut closed = LedgerMeta::new(nodes(&[1, 2]), 2, 2);
        closed.fragments.push(Fragment { first_entry: 10, ensemble: nodes(&[1, 3]) });
        closed.state = LedgerState::Closed;
        closed.last_entry_id = Some(20);
        let mut moved = closed.clone();
        moved.fragments[0].ensemble = nodes(&[4, 2]);
        moved.fragments[1].ensemble = nodes(&[5, 3]);
        closed.validate_replacement(&moved).unwrap();
        assert!(closed.validate_successor(&moved).is_err(), "a writer may not do it");
        let changed = |f: &dyn Fn(&mut LedgerMeta)| {
            let mut next = moved.clone();
            f(&mut next);
            closed.validate_replacement(&next).is_err()
        };
        assert!(changed(&|m| m.last_entry_id = Some(19)));
        assert!(changed(&|m| m.state = LedgerState::Open));
        assert!(changed(&|m| m.epoch += 1));
        assert!(changed(&|m| m.fragments[1].first_entry = 11));
        assert!(changed(&|m| {
            m.fragments.pop();
        }));
        assert!(changed(&|m| m.fragments[0].ensemble = nodes(&[2, 2])), "distinct nodes");
    }

    #[test]
    fn invalid_metadata_is_refused() {
        let mut twice = LedgerMeta::new(nodes(&[1, 1]), 2, 2);
        assert!(twice.validate().is_err());
        twice.fragments[0].ensemble = nodes(&[1, 2, 3]);
        assert!(twice.validate().is_err(), "ensemble larger than the write quorum");
        let mut quorum = LedgerMeta::new(nodes(&[1, 2]), 2, 3);
        assert!(quorum.validate().is_err());
        quorum.ack_quorum = 0;
        assert!(quorum.validate().is_err());
        let mut order = LedgerMeta::new(nodes(&[1, 2]), 2, 1);
        order.fragments.push(Fragment { first_entry: 0, ensemble: nodes(&[1, 3]) });
        assert!(order.validate().is_err());
        let mut open_with_last = LedgerMeta::new(nodes(&[1, 2]), 2, 1);
        open_with_last.last_entry_id = Some(3);
        assert!(open_with_last.validate().is_err());
        assert!(LedgerMeta::from_json(b"{\"write_quorum\":1}").is_err());
        assert!(LedgerMeta::from_json(b"\xff").is_err());
    }

    #[test]
    fn a_ledger_s_node_groups_are_stored_with_it_and_never_change() {
        let groups = IsolationGroups::parse("g0,g1", Some("g2"));
        let isolated = LedgerMeta::new(nodes(&[1, 2]), 2, 2).with_isolation(groups.clone());
        let decoded = LedgerMeta::from_json(&isolated.to_json()).unwrap();
        assert_eq!(decoded.isolation, groups);
        // Metadata written before the field existed (or without groups) has none.
        let plain = LedgerMeta::new(nodes(&[1, 2]), 2, 2);
        let json = String::from_utf8(plain.to_json()).unwrap();
        assert!(!json.contains("isolation"), "{json}");
        assert_eq!(LedgerMeta::from_json(json.as_bytes()).unwrap().isolation, None);
        assert!(plain.validate_successor(&isolated).is_err());
        assert!(isolated.validate_successor(&plain).is_err());
        let mut replaced = isolated.clone();
        replaced.fragments[0].ensemble = nodes(&[1, 3]);
        assert!(isolated.validate_successor(&replaced).is_ok());
    }

    #[test]
    fn successors_only_grow_the_history_and_never_reopen() {
        let open = LedgerMeta::new(nodes(&[1, 2]), 2, 2);
        let mut changed = open.clone();
        changed.fragments.push(Fragment { first_entry: 5, ensemble: nodes(&[1, 3]) });
        open.validate_successor(&changed).unwrap();
        let mut rewritten = changed.clone();
        rewritten.fragments[0].ensemble = nodes(&[3, 2]);
        assert!(changed.validate_successor(&rewritten).is_err());
        let mut closed = changed.clone();
        closed.state = LedgerState::Closed;
        closed.last_entry_id = Some(7);
        changed.validate_successor(&closed).unwrap();
        assert!(closed.validate_successor(&changed).is_err());
        let mut older = changed.clone();
        older.epoch = 0;
        let mut newer = changed.clone();
        newer.epoch = 3;
        assert!(newer.validate_successor(&older).is_err());
        let round_trip = LedgerMeta::from_json(&closed.to_json()).unwrap();
        assert_eq!(round_trip, closed);
    }
}
