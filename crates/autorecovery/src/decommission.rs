//! Draining a storage node before the operator removes it (a decommission; BookKeeper's
//! `decommissionbookie`, but with the node still up). While the node's decommission record
//! exists it is read-only, so placement gives it nothing and writers replace it in their open
//! ledgers (as for a full node), and the auditor marks every ledger naming it for re-replication
//! at once, the node itself being read from among the others ([`crate::plan`]). Once no ledger
//! names it, it holds nothing anyone needs: stopped, it can be removed (its cookie deleted).

use std::collections::BTreeMap;

use magnetar_replication::{LedgerId, LedgerMeta, LedgerState, NodeId};

/// How far a drain has come: the ledgers that still name the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drain {
    /// Closed ledgers with a copy on the node: re-replication moves them.
    pub closed_ledgers: u64,
    /// Ledgers still being written with a fragment on the node: their writers replace the node
    /// in the fragment they write; earlier fragments are copied once the ledger is closed
    /// (rolled over, or its topic unloaded).
    pub open_ledgers: u64,
}

/// Where a decommissioned node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainState {
    /// Some ledger still names the node.
    Draining,
    /// No ledger names it, and it still runs: stop it, then remove it.
    Drained,
    /// No ledger names it and it is not registered: it can be removed.
    Removable,
}

impl DrainState {
    /// The name the admin API and the command line show.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainState::Draining => "draining",
            DrainState::Drained => "drained",
            DrainState::Removable => "removable",
        }
    }
}

impl Drain {
    /// The drain of `node` over every ledger's metadata.
    pub fn of(ledgers: &BTreeMap<LedgerId, LedgerMeta>, node: NodeId) -> Drain {
        let mut drain = Drain::default();
        let names = |meta: &LedgerMeta| meta.fragments.iter().any(|f| f.ensemble.contains(&node));
        for meta in ledgers.values().filter(|meta| names(meta)) {
            match meta.state {
                LedgerState::Closed => drain.closed_ledgers += 1,
                _ => drain.open_ledgers += 1,
            }
        }
        drain
    }

    /// Where the node stands, `registered` or not.
    pub fn state(&self, registered: bool) -> DrainState {
        match (self.closed_ledgers + self.open_ledgers, registered) {
            (0, false) => DrainState::Removable,
            (0, true) => DrainState::Drained,
            _ => DrainState::Draining,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_replication::Fragment;

    #[test]
    fn a_drain_counts_closed_and_open_ledgers_naming_the_node_in_any_fragment() {
        let mut closed = LedgerMeta::new(vec![NodeId(1), NodeId(2)], 2, 2);
        closed.fragments.push(Fragment { first_entry: 5, ensemble: vec![NodeId(3), NodeId(2)] });
        closed.state = LedgerState::Closed;
        let open = LedgerMeta::new(vec![NodeId(3), NodeId(4)], 2, 2);
        let mut recovering = LedgerMeta::new(vec![NodeId(3), NodeId(2)], 2, 2);
        recovering.state = LedgerState::InRecovery;
        let ledgers = BTreeMap::from([(1, closed), (2, open), (3, recovering)]);
        let of = |node| Drain::of(&ledgers, NodeId(node));
        assert_eq!(of(3), Drain { closed_ledgers: 1, open_ledgers: 2 });
        assert_eq!(of(1), Drain { closed_ledgers: 1, open_ledgers: 0 });
        assert_eq!(of(9), Drain::default());
        assert_eq!(of(3).state(true), DrainState::Draining);
        assert_eq!(of(3).state(false), DrainState::Draining, "stopped too early: not removable");
        assert_eq!(of(9).state(true), DrainState::Drained);
        assert_eq!(of(9).state(false), DrainState::Removable);
    }
}
