//! Where one under-replicated ledger's lost copies go. For every fragment that names a lost
//! node: a replacement chosen by the placement rules (the ledger's node groups, racks, free
//! disk: `magnetar_replication::placement`), the fragment's entries to copy to it, and the
//! survivors to copy them from. A storage node holds one run of entries per ledger, so a
//! replacement is never a node that already holds (or is chosen to hold) another fragment of
//! the ledger. An OPEN ledger's last fragment is left to its writer (which replaces a failed node
//! itself, or is fenced by a recovery when it is gone): the plan says so and copies the rest.
//! The nodes whose copies move are lost ones (gone from the registrations) or leaving ones (being
//! decommissioned: still registered, read-only): a leaving node is read from too, after the
//! fragment's other copies, so a drain never lowers a fragment's copies even for a moment.

use std::collections::BTreeSet;

use magnetar_replication::placement::{allowed, choose_replacement};
use magnetar_replication::{EntryId, LedgerMeta, LedgerState, MetaError, NodeId, NodeInfo};

/// One fragment's lost copy moved to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Index of the fragment in the ledger's metadata.
    pub fragment: usize,
    pub lost: NodeId,
    pub to: NodeId,
    /// The survivors, to read from in this order.
    pub from: Vec<NodeId>,
    /// The entries to copy, `first..=last`; `None`: the fragment holds none (only the metadata
    /// changes).
    pub entries: Option<(EntryId, EntryId)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub transfers: Vec<Transfer>,
    /// The ledger is OPEN and its last fragment names a lost node: that one is its writer's
    /// (or, once the writer is given up on, a recovery's).
    pub left_to_writer: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Every copy of a fragment is on lost nodes: its entries cannot be restored from here.
    #[error("fragment {fragment} (from entry {first_entry}) has no surviving copy")]
    NoSurvivor { fragment: usize, first_entry: EntryId },
    /// No live node may take the copy (too few nodes, groups or disk).
    #[error("no node can take fragment {fragment}'s copy of {lost}")]
    NoReplacement { fragment: usize, lost: NodeId },
    #[error(transparent)]
    Meta(#[from] MetaError),
}

/// The plan for `meta`, whose copies on `lost` move elsewhere, over the `live` (registered)
/// nodes: a node of `lost` that is live (a decommissioned one) is read from last.
pub fn plan(
    meta: &LedgerMeta,
    lost: &BTreeSet<NodeId>,
    live: &[NodeInfo],
) -> Result<Plan, PlanError> {
    let healthy: Vec<NodeInfo> = live.iter().filter(|n| !lost.contains(&n.id)).cloned().collect();
    let leaving: BTreeSet<NodeId> =
        live.iter().map(|n| n.id).filter(|id| lost.contains(id)).collect();
    let candidates = allowed(&healthy, meta.isolation.as_ref(), meta.write_quorum as usize);
    // Nodes that hold (or will hold) a run of this ledger's entries.
    let mut holders: BTreeSet<NodeId> =
        meta.fragments.iter().flat_map(|f| f.ensemble.iter().copied()).collect();
    let mut plan = Plan { transfers: Vec::new(), left_to_writer: false };
    let last_index = meta.fragments.len() - 1;
    for (index, fragment) in meta.fragments.iter().enumerate() {
        let gone: Vec<NodeId> =
            fragment.ensemble.iter().copied().filter(|n| lost.contains(n)).collect();
        if gone.is_empty() {
            continue;
        }
        if index == last_index && meta.state != LedgerState::Closed {
            plan.left_to_writer = true;
            continue;
        }
        let entries = fragment_entries(meta, index);
        let from: Vec<NodeId> = (fragment.ensemble.iter().copied())
            .filter(|n| !lost.contains(n))
            .chain(fragment.ensemble.iter().copied().filter(|n| leaving.contains(n)))
            .collect();
        if from.is_empty() && entries.is_some() {
            return Err(PlanError::NoSurvivor {
                fragment: index,
                first_entry: fragment.first_entry,
            });
        }
        for node in gone {
            // The fragment's survivors stay among the nodes placement sees (their racks
            // count); nodes holding other runs of the ledger are never chosen.
            let eligible: Vec<NodeInfo> = candidates
                .iter()
                .filter(|n| fragment.ensemble.contains(&n.id) || !holders.contains(&n.id))
                .cloned()
                .collect();
            let to = choose_replacement(&eligible, &fragment.ensemble, &[node])
                .ok_or(PlanError::NoReplacement { fragment: index, lost: node })?;
            holders.insert(to);
            plan.transfers.push(Transfer {
                fragment: index,
                lost: node,
                to,
                from: from.clone(),
                entries,
            });
        }
    }
    Ok(plan)
}

/// The entries fragment `index` of `meta` holds, `first..=last` (`None`: none). For every
/// fragment but the last: up to the next one's start; the last one's end is the ledger's last
/// entry (the plan copies an OPEN ledger's last fragment never).
fn fragment_entries(meta: &LedgerMeta, index: usize) -> Option<(EntryId, EntryId)> {
    let first = meta.fragments[index].first_entry;
    let end = match meta.fragments.get(index + 1) {
        Some(next) => next.first_entry.checked_sub(1),
        None => meta.last_entry_id,
    }?;
    (end >= first).then_some((first, end))
}

impl Plan {
    /// `meta` with the planned copies in place, once every transfer is done: what is stored by
    /// compare-and-set (checked by `validate_replacement`).
    pub fn apply(&self, meta: &LedgerMeta) -> Result<LedgerMeta, PlanError> {
        let mut next = meta.clone();
        for transfer in &self.transfers {
            let ensemble = &mut next.fragments[transfer.fragment].ensemble;
            for node in ensemble.iter_mut().filter(|n| **n == transfer.lost) {
                *node = transfer.to;
            }
        }
        meta.validate_replacement(&next)?;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_replication::Fragment;

    fn node(id: u64, rack: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId(id),
            free_bytes: 1_000 - id,
            rack: Some(rack.to_string()),
            group: None,
            read_only: false,
        }
    }

    fn lost(ids: &[u64]) -> BTreeSet<NodeId> {
        ids.iter().map(|&i| NodeId(i)).collect()
    }

    /// Closed, entries 0..=29 over fragments at 0 (nodes 1, 2) and 10 (nodes 1, 3).
    fn closed() -> LedgerMeta {
        let mut meta = LedgerMeta::new(vec![NodeId(1), NodeId(2)], 2, 2);
        meta.fragments.push(Fragment { first_entry: 10, ensemble: vec![NodeId(1), NodeId(3)] });
        meta.state = LedgerState::Closed;
        meta.last_entry_id = Some(29);
        meta.epoch = 2;
        meta
    }

    #[test]
    fn each_fragment_of_a_lost_node_goes_to_a_node_holding_none_of_the_ledger() {
        let live = [node(2, "a"), node(3, "b"), node(4, "a"), node(5, "c")];
        let plan = plan(&closed(), &lost(&[1]), &live).unwrap();
        assert!(!plan.left_to_writer);
        // Fragment 0 survives on 2 (rack a): 5 brings a new rack (c) where 4 would not.
        // Fragment 1 survives on 3 (rack b): 5 is taken by fragment 0, so 4.
        let got: Vec<_> =
            plan.transfers.iter().map(|t| (t.fragment, t.to, t.from.clone(), t.entries)).collect();
        assert_eq!(
            got,
            vec![
                (0, NodeId(5), vec![NodeId(2)], Some((0, 9))),
                (1, NodeId(4), vec![NodeId(3)], Some((10, 29))),
            ]
        );
        let next = plan.apply(&closed()).unwrap();
        assert_eq!(next.fragments[0].ensemble, vec![NodeId(5), NodeId(2)]);
        assert_eq!(next.fragments[1].ensemble, vec![NodeId(4), NodeId(3)]);
        assert_eq!(
            (next.state, next.last_entry_id, next.epoch),
            (LedgerState::Closed, Some(29), 2)
        );
    }

    #[test]
    fn an_open_ledgers_last_fragment_is_its_writers() {
        let mut meta = closed();
        meta.state = LedgerState::Open;
        meta.last_entry_id = None;
        let live = [node(2, "a"), node(3, "b"), node(4, "c")];
        let plan = plan(&meta, &lost(&[1]), &live).unwrap();
        assert!(plan.left_to_writer);
        assert_eq!(plan.transfers.len(), 1);
        assert_eq!((plan.transfers[0].fragment, plan.transfers[0].entries), (0, Some((0, 9))));
        // A node lost only from the last fragment: nothing to copy here.
        let plan = super::plan(&meta, &lost(&[3]), &live).unwrap();
        assert!(plan.left_to_writer && plan.transfers.is_empty());
    }

    #[test]
    fn a_fragment_without_entries_only_changes_its_metadata() {
        let mut meta = LedgerMeta::new(vec![NodeId(1), NodeId(2)], 2, 1);
        meta.state = LedgerState::Closed;
        let plan = plan(&meta, &lost(&[1, 2]), &[node(3, "a"), node(4, "b")]).unwrap();
        assert_eq!(plan.transfers.len(), 2);
        assert!(plan.transfers.iter().all(|t| t.entries.is_none() && t.from.is_empty()));
        let next = plan.apply(&meta).unwrap();
        assert_eq!(next.fragments[0].ensemble, vec![NodeId(3), NodeId(4)]);
    }

    #[test]
    fn a_fragment_with_no_survivor_and_no_free_node_are_errors() {
        let live = [node(3, "b"), node(4, "a")];
        assert_eq!(
            plan(&closed(), &lost(&[1, 2]), &live),
            Err(PlanError::NoSurvivor { fragment: 0, first_entry: 0 })
        );
        // Nodes 2 and 3 hold runs of the ledger: nothing else is alive to take 1's copies.
        assert_eq!(
            plan(&closed(), &lost(&[1]), &[node(2, "a"), node(3, "b")]),
            Err(PlanError::NoReplacement { fragment: 0, lost: NodeId(1) })
        );
    }

    #[test]
    fn a_leaving_node_is_read_from_after_the_others_and_takes_no_copy() {
        let mut leaving = node(1, "x");
        leaving.read_only = true;
        let live = [leaving.clone(), node(2, "a"), node(3, "b"), node(4, "a"), node(5, "c")];
        let plan = plan(&closed(), &lost(&[1]), &live).unwrap();
        let got: Vec<_> =
            plan.transfers.iter().map(|t| (t.fragment, t.to, t.from.clone())).collect();
        assert_eq!(
            got,
            vec![
                (0, NodeId(5), vec![NodeId(2), NodeId(1)]),
                (1, NodeId(4), vec![NodeId(3), NodeId(1)]),
            ]
        );
        // Its only copy (write quorum 1) is still readable: no survivor error.
        let mut single = LedgerMeta::new(vec![NodeId(1)], 1, 1);
        single.state = LedgerState::Closed;
        single.last_entry_id = Some(4);
        let plan = super::plan(&single, &lost(&[1]), &[leaving, node(2, "a")]).unwrap();
        assert_eq!(plan.transfers[0].from, vec![NodeId(1)]);
        assert_eq!(plan.transfers[0].to, NodeId(2));
    }

    #[test]
    fn read_only_nodes_take_no_copy() {
        let mut full = node(5, "c");
        full.read_only = true;
        let plan = plan(&closed(), &lost(&[3]), &[node(1, "x"), node(2, "a"), full, node(6, "d")]);
        assert_eq!(plan.unwrap().transfers[0].to, NodeId(6));
    }
}
