//! Coordination of several brokers (issue 47). The deciding modules have no I/O: which bundle a
//! topic is in, whether a change of a bundle's ownership record is allowed, whether a broker may
//! serve a bundle's topics, which broker a free bundle goes to, when a silent broker counts as
//! dead. [`cluster`] is the thin shell over the metadata store the broker asks "may I serve this
//! topic" and "who owns this".
//!
//! - [`bundles`]: namespace bundles as Pulsar computes them: the CRC32 (IEEE) of the full topic
//!   name, partition included, in one of the namespace's hash ranges `[lower, upper)` (the last
//!   closed) that cover `0x00000000..=0xffffffff`; `n` even bundles (Pulsar's
//!   `defaultNumberOfNamespaceBundles` = 4); splits at a boundary chosen by range or by topic
//!   count.
//! - [`ownership`]: a bundle's ownership record and PIP-192's service-unit states (Init, Free,
//!   Owned, Assigning, Releasing, Splitting, Deleted) with the transitions Pulsar allows over a
//!   metadata store. A broker serves a bundle's topics only while the record says Owned by it.
//! - [`placement`]: the least-loaded eligible broker, ties broken by rendezvous hashing.
//! - [`isolation`]: namespace isolation policies: which brokers may own which namespaces'
//!   bundles (primary, secondary on too few primaries, shared for the rest).
//! - [`liveness`]: the failure detector fed by probes (refusals count faster than timeouts).
//! - [`shedder`]: which bundles the leader moves, from the brokers' load reports (Pulsar's
//!   `TransferShedder`).
//! - [`splitter`]: which bundles the leader splits, from the same reports (Pulsar's automatic
//!   bundle split past topic, message-rate and bandwidth thresholds).
//! - [`cluster`]: records in the store (`/namespace/{tenant}/{ns}/{range}`, ephemeral, written
//!   by their owner by compare-and-set), lookups, takeover of a dead owner's bundles, release.
//!
//! Invariants (tested here, relied on by the shell):
//! - Every hash is in exactly one bundle of a namespace; a split keeps that true.
//! - A record changes only by an allowed transition (or a takeover of a dead broker's bundle),
//!   and each change has a higher version: the shell writes it by compare-and-set on that
//!   version, so two brokers can never both have theirs accepted.
//! - At most one broker serves a bundle: the one an Owned record names.

pub mod bundles;
pub mod cluster;
mod crc32;
pub mod isolation;
pub mod liveness;
pub mod ownership;
pub mod placement;
pub mod shedder;
pub mod splitter;

pub use bundles::{topic_hash, BundleError, BundleRange, Bundles, SplitAlgorithm};
pub use cluster::{
    BrokerUrls, ClusterOwnership, CoordinationConfig, CoordinationError, LoadManagerConfig, Lookup,
    TopicLoad, TopicLoads,
};
pub use liveness::LivenessConfig;
pub use ownership::{OwnershipRecord, TransitionError, UnitState};
