//! Where a ledger's copies go: nodes that are alive (registered) and writable (not read-only
//! for lack of disk), not already in the ensemble, on a rack label the ensemble does not use
//! yet when there is one, with the most free disk; ties go to the lower id, so the choice is
//! deterministic.

use crate::NodeId;
use magnetar_model::storage_nodes::{IsolationGroups, StorageNodeRacks, StorageNodeRegistration};
use std::collections::BTreeSet;

/// A live storage node as its registration describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: NodeId,
    pub free_bytes: u64,
    /// Failure domain; `None` when the operator set none.
    pub rack: Option<String>,
    /// The group the operator assigned it to (`set-bookie-rack -g`), for bookie affinity.
    pub group: Option<String>,
    /// Short of disk: serves reads, takes no new copies (BookKeeper's read-only bookie).
    pub read_only: bool,
}

impl NodeInfo {
    /// A registered node as placement sees it: the operator's rack (`racks`, by address)
    /// wins over the rack label of the node's own configuration.
    pub fn new(
        id: NodeId,
        registration: &StorageNodeRegistration,
        racks: &StorageNodeRacks,
    ) -> NodeInfo {
        let address = registration.address.as_str();
        let own_rack = registration.rack.as_deref().map(|r| r.trim_matches('/'));
        NodeInfo {
            id,
            free_bytes: registration.free_bytes,
            rack: racks.rack_of(address).or(own_rack).filter(|r| !r.is_empty()).map(str::to_string),
            group: racks.group_of(address).map(str::to_string),
            read_only: registration.read_only,
        }
    }
}

/// The nodes of `live` that a ledger keeping to `groups` (a namespace's bookie affinity) may be
/// placed on, for a write quorum of `size`: those of the primary groups; when fewer than
/// `size` of them are writable, those of the secondary groups too; when still fewer, those of
/// no group too; never another group's (Pulsar's `IsolatedBookieEnsemblePlacementPolicy`).
/// `*` among the primary groups allows every node.
pub fn isolate(live: &[NodeInfo], groups: &IsolationGroups, size: usize) -> Vec<NodeInfo> {
    if groups.is_unrestricted() {
        return live.to_vec();
    }
    let in_any = |node: &NodeInfo, of: &[&BTreeSet<String>]| {
        node.group.as_ref().is_some_and(|g| of.iter().any(|set| set.contains(g)))
    };
    let writable_in =
        |of: &[&BTreeSet<String>]| live.iter().filter(|n| !n.read_only && in_any(n, of)).count();
    let primary_only = [&groups.primary];
    let with_secondary = [&groups.primary, &groups.secondary];
    let (allowed, ungrouped) = if writable_in(&primary_only) >= size {
        (&primary_only[..], false)
    } else {
        (&with_secondary[..], writable_in(&with_secondary) < size)
    };
    live.iter()
        .filter(|n| in_any(n, allowed) || (ungrouped && n.group.is_none()))
        .cloned()
        .collect()
}

/// The best node of `live` to join `ensemble` of a ledger keeping to `groups` (its bookie
/// affinity; `None`: any node), in place of the nodes in `exclude`. Those failed: they
/// neither count toward their group's size (a primary group left too small by a dead node
/// lets the secondary groups in at once, not only once its registration expires) nor get
/// chosen.
pub fn replacement_within(
    live: &[NodeInfo],
    groups: Option<&IsolationGroups>,
    ensemble: &[NodeId],
    exclude: &[NodeId],
) -> Option<NodeId> {
    let healthy: Vec<NodeInfo> =
        live.iter().filter(|n| !exclude.contains(&n.id)).cloned().collect();
    choose_replacement(&allowed(&healthy, groups, ensemble.len()), ensemble, exclude)
}

/// The nodes of `live` a ledger of write quorum `size` keeping to `groups` may use
/// ([`isolate`]; every node without groups).
pub fn allowed(live: &[NodeInfo], groups: Option<&IsolationGroups>, size: usize) -> Vec<NodeInfo> {
    match groups {
        Some(groups) => isolate(live, groups, size),
        None => live.to_vec(),
    }
}

/// The best node of `live` to join `ensemble` (a node to replace is passed in `exclude`).
pub fn choose_replacement(
    live: &[NodeInfo],
    ensemble: &[NodeId],
    exclude: &[NodeId],
) -> Option<NodeId> {
    let racks_in_use: Vec<&Option<String>> = live
        .iter()
        .filter(|n| ensemble.contains(&n.id) && !exclude.contains(&n.id))
        .map(|n| &n.rack)
        .collect();
    live.iter()
        .filter(|n| !n.read_only && !ensemble.contains(&n.id) && !exclude.contains(&n.id))
        .min_by_key(|n| {
            let new_rack = n.rack.is_some() && !racks_in_use.contains(&&n.rack);
            (!new_rack, std::cmp::Reverse(n.free_bytes), n.id)
        })
        .map(|n| n.id)
}

/// `size` nodes for a new ledger, or `None` if fewer are alive.
pub fn choose_ensemble(live: &[NodeInfo], size: usize) -> Option<Vec<NodeId>> {
    let mut ensemble = Vec::with_capacity(size);
    while ensemble.len() < size {
        ensemble.push(choose_replacement(live, &ensemble, &[])?);
    }
    Some(ensemble)
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_model::storage_nodes::RackInfo;

    fn node(id: u64, free: u64, rack: Option<&str>) -> NodeInfo {
        NodeInfo {
            id: NodeId(id),
            free_bytes: free,
            rack: rack.map(str::to_string),
            group: None,
            read_only: false,
        }
    }

    fn in_group(id: u64, group: Option<&str>) -> NodeInfo {
        NodeInfo { group: group.map(str::to_string), ..node(id, 100, None) }
    }

    fn ids(nodes: &[NodeInfo]) -> Vec<u64> {
        nodes.iter().map(|n| n.id.0).collect()
    }

    #[test]
    fn bookie_affinity_keeps_to_the_primary_then_secondary_then_ungrouped_nodes() {
        let live = [
            in_group(1, Some("a")),
            in_group(2, Some("a")),
            in_group(3, Some("b")),
            in_group(4, Some("c")),
            in_group(5, None),
        ];
        let groups = |p: &str, s: Option<&str>| IsolationGroups::parse(p, s).expect("groups");
        // Enough in the primary group: only those; other groups and ungrouped nodes never.
        assert_eq!(ids(&isolate(&live, &groups("a", Some("b")), 2)), [1, 2]);
        // Too few: the secondary groups join.
        assert_eq!(ids(&isolate(&live, &groups("a", Some("b")), 3)), [1, 2, 3]);
        // Still too few: ungrouped nodes join, another group's never.
        assert_eq!(ids(&isolate(&live, &groups("a", Some("b")), 4)), [1, 2, 3, 5]);
        assert_eq!(ids(&isolate(&live, &groups("b", None), 2)), [3, 5]);
        assert_eq!(ids(&isolate(&live, &groups("a,c", None), 3)), [1, 2, 4]);
        assert_eq!(ids(&isolate(&live, &groups("*", None), 2)), [1, 2, 3, 4, 5]);
        // A read-only node of the primary group does not count towards its size.
        let mut short = live.clone();
        short[1].read_only = true;
        assert_eq!(ids(&isolate(&short, &groups("a", Some("b")), 2)), [1, 2, 3]);
        // Nobody grouped: the fallbacks reach every node.
        let plain = [in_group(1, None), in_group(2, None)];
        assert_eq!(ids(&isolate(&plain, &groups("a", None), 2)), [1, 2]);
    }

    #[test]
    fn a_replacement_keeps_to_the_groups_and_a_failed_node_does_not_count_toward_its_group() {
        let live = [
            in_group(1, Some("a")),
            in_group(2, Some("a")),
            in_group(3, Some("a")),
            in_group(4, Some("b")),
            NodeInfo { free_bytes: 900, ..in_group(5, Some("c")) },
        ];
        let groups = IsolationGroups::parse("a", Some("b"));
        let ensemble = [NodeId(1), NodeId(2)];
        // Without groups the node with the most free disk; with them, the primary group's.
        assert_eq!(replacement_within(&live, None, &ensemble, &[NodeId(2)]), Some(NodeId(5)));
        assert_eq!(
            replacement_within(&live, groups.as_ref(), &ensemble, &[NodeId(2)]),
            Some(NodeId(3))
        );
        // Two of the primary group's three failed: it is too small, the secondary joins.
        let failed = [NodeId(2), NodeId(3)];
        assert_eq!(replacement_within(&live, groups.as_ref(), &ensemble, &failed), Some(NodeId(4)));
        // No secondary group: another group's node never, so nobody.
        let strict = IsolationGroups::parse("a", None);
        assert_eq!(replacement_within(&live, strict.as_ref(), &ensemble, &failed), None);
    }

    #[test]
    fn most_free_disk_on_a_new_rack_first() {
        let live = [
            node(1, 100, Some("a")),
            node(2, 500, Some("a")),
            node(3, 50, Some("b")),
            node(4, 900, None),
        ];
        // Ensemble {2} on rack a: rack b beats more free disk on rack a or no rack.
        assert_eq!(choose_replacement(&live, &[NodeId(2)], &[]), Some(NodeId(3)));
        // Without labels that differ, most free disk wins.
        assert_eq!(choose_replacement(&live, &[NodeId(2), NodeId(3)], &[]), Some(NodeId(4)));
        assert_eq!(choose_ensemble(&live, 2), Some(vec![NodeId(2), NodeId(3)]));
        assert_eq!(choose_ensemble(&live, 5), None);
        // Excluded and present nodes are never chosen.
        let all: Vec<NodeId> = live.iter().map(|n| n.id).collect();
        assert_eq!(choose_replacement(&live, &all[..3], &[NodeId(4)]), None);
    }

    #[test]
    fn a_read_only_node_takes_no_new_copy() {
        let mut live = [node(1, 100, None), node(2, 900, None), node(3, 500, None)];
        live[1].read_only = true;
        assert_eq!(choose_ensemble(&live, 2), Some(vec![NodeId(3), NodeId(1)]));
        assert_eq!(choose_replacement(&live, &[NodeId(3)], &[NodeId(1)]), None);
        assert_eq!(choose_ensemble(&live, 3), None);
    }

    #[test]
    fn the_operators_rack_wins_over_the_nodes_own() {
        let registration = StorageNodeRegistration {
            address: "h:1".to_string(),
            free_bytes: 5,
            rack: Some("/own/".to_string()),
            read_only: false,
            tls: false,
            plain_clients: false,
        };
        let none = StorageNodeRacks::default();
        let own = NodeInfo::new(NodeId(1), &registration, &none);
        assert_eq!((own.rack.as_deref(), own.group), (Some("own"), None));
        let mut racks = StorageNodeRacks::default();
        let info = RackInfo { rack: Some("/r9".to_string()), hostname: None };
        racks.set("h:1", "g", info);
        let assigned = NodeInfo::new(NodeId(1), &registration, &racks);
        assert_eq!((assigned.rack.as_deref(), assigned.group.as_deref()), (Some("r9"), Some("g")));
        let unlabelled = StorageNodeRegistration { rack: Some("/".to_string()), ..registration };
        assert_eq!(NodeInfo::new(NodeId(1), &unlabelled, &none).rack, None);
    }
}
