//! Which storage nodes are lost, and which ledgers they leave short of copies (BookKeeper's
//! `Auditor`). A node is lost once it has been missing from the registrations for
//! `lost_node_recovery_delay` (a restart or an upgrade comes back sooner and costs no copy), or
//! at once when it came back with a wiped disk (a new instance under its id: its copies are
//! gone). A node that registers again within the delay is not lost.

use std::collections::{BTreeMap, BTreeSet};

use magnetar_replication::{LedgerId, LedgerMeta, NodeId};

/// The auditor's memory between rounds: since when each node named by a ledger is missing.
#[derive(Debug, Clone)]
pub struct Auditor {
    delay_ms: u64,
    missing_since: BTreeMap<NodeId, u64>,
    wiped: BTreeSet<NodeId>,
}

impl Auditor {
    /// `delay_ms`: BookKeeper's `lostBookieRecoveryDelay` (how long a node may be away).
    pub fn new(delay_ms: u64) -> Auditor {
        Auditor { delay_ms, missing_since: BTreeMap::new(), wiped: BTreeSet::new() }
    }

    /// One round: the nodes registered now and those among them back with a wiped disk, at
    /// `now_ms`. Returns the nodes lost (to be re-replicated from).
    pub fn observe(
        &mut self,
        named: &BTreeSet<NodeId>,
        registered: &BTreeSet<NodeId>,
        wiped: &BTreeSet<NodeId>,
        now_ms: u64,
    ) -> BTreeSet<NodeId> {
        self.missing_since.retain(|node, _| named.contains(node) && !registered.contains(node));
        for node in named.difference(registered) {
            self.missing_since.entry(*node).or_insert(now_ms);
        }
        // A wiped node stays lost for the ledgers that named it until they no longer do.
        self.wiped.extend(wiped.iter().copied());
        self.wiped.retain(|node| named.contains(node));
        let overdue = self
            .missing_since
            .iter()
            .filter(|(_, since)| now_ms.saturating_sub(**since) >= self.delay_ms)
            .map(|(node, _)| *node);
        overdue.chain(self.wiped.iter().copied()).collect()
    }

    /// When `node` went missing, if it is.
    pub fn missing_since(&self, node: NodeId) -> Option<u64> {
        self.missing_since.get(&node).copied()
    }
}

/// Every node some fragment of `ledgers` names.
pub fn named_nodes<'a>(ledgers: impl IntoIterator<Item = &'a LedgerMeta>) -> BTreeSet<NodeId> {
    ledgers
        .into_iter()
        .flat_map(|meta| meta.fragments.iter().flat_map(|f| f.ensemble.iter().copied()))
        .collect()
}

/// The ledgers with a copy on a `lost` node, each with the lost nodes it names.
pub fn under_replicated(
    ledgers: &BTreeMap<LedgerId, LedgerMeta>,
    lost: &BTreeSet<NodeId>,
) -> BTreeMap<LedgerId, BTreeSet<NodeId>> {
    let mut found = BTreeMap::new();
    for (id, meta) in ledgers {
        let gone: BTreeSet<NodeId> = named_nodes([meta]).intersection(lost).copied().collect();
        if !gone.is_empty() {
            found.insert(*id, gone);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(ids: &[u64]) -> BTreeSet<NodeId> {
        ids.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn a_node_is_lost_only_once_missing_for_the_delay() {
        let mut auditor = Auditor::new(1_000);
        let named = nodes(&[1, 2, 3]);
        assert!(auditor.observe(&named, &nodes(&[1, 2, 3]), &nodes(&[]), 0).is_empty());
        assert!(auditor.observe(&named, &nodes(&[1, 2]), &nodes(&[]), 100).is_empty());
        assert_eq!(auditor.missing_since(NodeId(3)), Some(100));
        assert!(auditor.observe(&named, &nodes(&[1, 2]), &nodes(&[]), 1_099).is_empty());
        assert_eq!(auditor.observe(&named, &nodes(&[1, 2]), &nodes(&[]), 1_100), nodes(&[3]));
    }

    #[test]
    fn a_node_back_within_the_delay_is_not_lost_and_its_clock_starts_again() {
        let mut auditor = Auditor::new(1_000);
        let named = nodes(&[1, 2, 3]);
        auditor.observe(&named, &nodes(&[1, 2]), &nodes(&[]), 0);
        assert!(auditor.observe(&named, &nodes(&[1, 2, 3]), &nodes(&[]), 900).is_empty());
        assert_eq!(auditor.missing_since(NodeId(3)), None);
        auditor.observe(&named, &nodes(&[1, 2]), &nodes(&[]), 1_000);
        assert!(auditor.observe(&named, &nodes(&[1, 2]), &nodes(&[]), 1_999).is_empty());
        assert_eq!(auditor.observe(&named, &nodes(&[1, 2]), &nodes(&[]), 2_000), nodes(&[3]));
    }

    #[test]
    fn a_wiped_node_is_lost_at_once_until_no_ledger_names_it() {
        let mut auditor = Auditor::new(60_000);
        let all = nodes(&[1, 2, 3]);
        assert_eq!(auditor.observe(&all, &all, &nodes(&[2]), 0), nodes(&[2]));
        assert_eq!(auditor.observe(&all, &all, &nodes(&[]), 10), nodes(&[2]), "until moved");
        assert!(auditor.observe(&nodes(&[1, 3]), &all, &nodes(&[]), 20).is_empty());
    }

    #[test]
    fn a_node_no_ledger_names_is_never_lost() {
        let mut auditor = Auditor::new(0);
        assert!(auditor.observe(&nodes(&[1]), &nodes(&[1]), &nodes(&[]), 0).is_empty());
        assert!(auditor.observe(&nodes(&[1]), &nodes(&[]), &nodes(&[]), 5).contains(&NodeId(1)));
    }

    #[test]
    fn under_replicated_ledgers_name_their_lost_nodes() {
        let mut a = LedgerMeta::new(vec![NodeId(1), NodeId(2)], 2, 2);
        a.fragments.push(magnetar_replication::Fragment {
            first_entry: 10,
            ensemble: vec![NodeId(1), NodeId(3)],
        });
        let b = LedgerMeta::new(vec![NodeId(2), NodeId(4)], 2, 2);
        let ledgers = BTreeMap::from([(7, a), (8, b)]);
        assert_eq!(named_nodes(ledgers.values()), nodes(&[1, 2, 3, 4]));
        let found = under_replicated(&ledgers, &nodes(&[3, 5]));
        assert_eq!(found, BTreeMap::from([(7, nodes(&[3]))]));
        let found = under_replicated(&ledgers, &nodes(&[2]));
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), vec![7, 8]);
    }
}
