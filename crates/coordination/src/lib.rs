//! Coordination of several brokers (issue 47), the deciding part, without I/O: the broker and
//! an etcd shell ask it which bundle a topic is in, whether a change of a bundle's ownership
//! record is allowed, and whether a broker may serve a bundle's topics.
//!
//! - [`bundles`]: namespace bundles as Pulsar computes them: the CRC32 (IEEE) of the full topic
//!   name, partition included, in one of the namespace's hash ranges `[lower, upper)` (the last
//!   closed) that cover `0x00000000..=0xffffffff`; `n` even bundles (Pulsar's
//!   `defaultNumberOfNamespaceBundles` = 4); splits at a boundary chosen by range or by topic
//!   count.
//! - [`ownership`]: a bundle's ownership record and PIP-192's service-unit states (Init, Free,
//!   Owned, Assigning, Releasing, Splitting, Deleted) with the transitions Pulsar allows over a
//!   metadata store. A broker serves a bundle's topics only while the record says Owned by it.
//!
//! Invariants (tested here, relied on by the shell):
//! - Every hash is in exactly one bundle of a namespace; a split keeps that true.
//! - A record changes only by an allowed transition (or a takeover of a dead broker's bundle),
//!   and each change has a higher version: the shell writes it by compare-and-set on that
//!   version, so two brokers can never both have theirs accepted.
//! - At most one broker serves a bundle: the one an Owned record names.

pub mod bundles;
mod crc32;
pub mod ownership;

pub use bundles::{topic_hash, BundleError, BundleRange, Bundles, SplitAlgorithm};
pub use ownership::{OwnershipRecord, TransitionError, UnitState};
