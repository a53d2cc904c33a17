//! Self-healing storage (issue 48): after a storage node is lost, every ledger that had copies on
//! it is brought back to its write quorum, without an operator, as BookKeeper's auditor and
//! replication workers do. The decisions, as plain state machines (no I/O, no clock, no async;
//! the tokio shell and the simulator drive the same code):
//!
//! * [`audit::Auditor`]: which nodes are lost (named by ledgers, unregistered for longer than
//!   `lost_node_recovery_delay`, or back with a wiped disk) and which ledgers they leave
//!   under-replicated.
//! * [`plan::plan`]: for one under-replicated ledger, which fragment's copies go to which node
//!   (the placement rules: racks, the ledger's node groups, free disk), copied from which
//!   survivors; an OPEN ledger's last fragment is its writer's.
//! * [`copy::FragmentCopy`]: one fragment copied entry by entry: read from a survivor, written
//!   to the replacement with recovery adds, strictly in entry order (a node holds one run of
//!   entries per ledger). Once every copy is done, [`plan::Plan::apply`] gives the metadata to
//!   store by compare-and-set, which [`magnetar_replication::LedgerMeta::validate_replacement`]
//!   accepts.
//! * [`decommission::Drain`]: how far the drain of a node the operator decommissions has come
//!   (the ledgers still naming it), and whether it can be removed.
//!
//! Invariants: a copy is swapped into the metadata only after every entry of its range is
//! durable on the replacement; a replacement never already holds entries of the ledger (one run
//! per ledger and node); a fragment whose every copy is lost is reported, never "repaired" from
//! nothing.

pub mod audit;
pub mod copy;
pub mod decommission;
pub mod plan;

pub use audit::Auditor;
pub use copy::{CopyAction, FragmentCopy};
pub use decommission::{Drain, DrainState};
pub use plan::{plan, Plan, PlanError, Transfer};
