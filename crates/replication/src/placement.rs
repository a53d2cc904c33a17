//! Where a ledger's copies go: nodes that are alive (registered) and writable (not read-only
//! for lack of disk), not already in the ensemble, on a rack label the ensemble does not use
//! yet when there is one, with the most free disk; ties go to the lower id, so the choice is
//! deterministic.

use crate::NodeId;
use magnetar_model::storage_nodes::StorageNodeRegistration;

/// A live storage node as its registration describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: NodeId,
    pub free_bytes: u64,
    /// Failure domain; `None` when the operator set none.
    pub rack: Option<String>,
    /// Short of disk: serves reads, takes no new copies (BookKeeper's read-only bookie).
    pub read_only: bool,
}

impl NodeInfo {
    /// A registered node as placement sees it; `assigned_rack` (the operator's, by address)
    /// wins over the rack label of the node's own configuration.
    pub fn new(
        id: NodeId,
        registration: &StorageNodeRegistration,
        assigned_rack: Option<&str>,
    ) -> NodeInfo {
        let own_rack = registration.rack.as_deref().map(|r| r.trim_matches('/'));
        NodeInfo {
            id,
            free_bytes: registration.free_bytes,
            rack: assigned_rack.or(own_rack).filter(|r| !r.is_empty()).map(str::to_string),
            read_only: registration.read_only,
        }
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

    fn node(id: u64, free: u64, rack: Option<&str>) -> NodeInfo {
        NodeInfo {
            id: NodeId(id),
            free_bytes: free,
            rack: rack.map(str::to_string),
            read_only: false,
        }
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
        };
        assert_eq!(NodeInfo::new(NodeId(1), &registration, None).rack.as_deref(), Some("own"));
        let assigned = NodeInfo::new(NodeId(1), &registration, Some("r9"));
        assert_eq!(assigned.rack.as_deref(), Some("r9"));
        let unlabelled = StorageNodeRegistration { rack: Some("/".to_string()), ..registration };
        assert_eq!(NodeInfo::new(NodeId(1), &unlabelled, None).rack, None);
    }
}
