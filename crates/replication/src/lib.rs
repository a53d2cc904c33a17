//! Replicated ledgers, BookKeeper's protocol as plain state machines (no I/O, no clock, no
//! async): the tokio shells (storage node process, the broker's ledger client) and the
//! deterministic simulator (`crates/sim`) drive the same code.
//!
//! The parts, each a core that takes inputs and pushes actions:
//! * [`node::NodeCore`]: a storage node's decisions. Adds are answered only once durable; a
//!   fence is persisted before it is answered and, once set, refuses every normal add (and
//!   recovery adds of an older epoch).
//! * [`writer::Writer`]: the single writer of an open ledger. Each entry goes to every node of
//!   the ensemble (E = Qw: no striping) and is acknowledged, strictly in entry order, once Qa
//!   nodes of the ensemble that the stored metadata names for it have it. On a node failure the
//!   writer records a new fragment (ensemble change) by compare-and-set **before** it
//!   acknowledges any later entry, then resends what the replacement lacks.
//! * [`recovery::Recovery`]: opens a ledger whose writer may be gone: marks it IN_RECOVERY
//!   with a new epoch, fences the last ensemble with LAC reads until they cover every write
//!   quorum, reads forward with fencing reads (an entry is absent only when `Qw - Qa + 1`
//!   nodes say so), writes back what it finds with recovery adds, and closes by
//!   compare-and-set.
//! * [`meta::LedgerMeta`]: the ledger's metadata (ensemble history, quorums, state, last
//!   entry, epoch), stored in the metadata store and changed only by compare-and-set.
//!
//! Invariants (checked by the simulator after every step, after Vanlightly's TLA+ model of
//! BookKeeper and the regressions bk#2614, #2615, #1591, #4651):
//! * once CLOSED, no acknowledged entry lies above the ledger's last entry id;
//! * every acknowledged entry is durable on at least Qa nodes of the ensemble the stored
//!   metadata names for it;
//! * the writer's last-add-confirmed never decreases; fragment starts strictly increase and
//!   every ensemble has Qw distinct nodes;
//! * a fenced node stores no normal add.

pub mod message;
pub mod meta;
pub mod node;
pub mod placement;
pub mod recovery;
pub mod wire;
pub mod writer;

pub use message::{ErrorCode, Request, RequestId, Response};
pub use meta::{Fragment, LedgerMeta, LedgerState, MetaError};
pub use placement::NodeInfo;

/// A ledger's id, allocated cluster-wide.
pub type LedgerId = u64;
/// An entry's id within its ledger: dense from 0, assigned by the writer.
pub type EntryId = u64;
/// Raised by every recovery; a node refuses recovery adds of an epoch below its fence's.
pub type Epoch = u64;

/// A storage node's identity, stable across its restarts.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct NodeId(pub u64);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node-{}", self.0)
    }
}

/// How the shell reports the outcome of a metadata compare-and-set the core asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaWrite {
    /// Stored; the new version.
    Written(u64),
    /// Not stored: the key holds another version. What it holds now.
    Conflict { current: Box<LedgerMeta>, version: u64 },
    /// The outcome is unknown (time-out, lost connection): the core asks to read it back.
    Unknown,
}
