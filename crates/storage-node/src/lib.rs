//! The storage node: `magnetar storage`. It serves replicated ledgers over the storage protocol
//! (`magnetar_replication::wire`) from the journal and ledger store this machine already uses
//! for standalone (entries written once, fsync'ed before they are acknowledged), with the
//! decisions of `magnetar_replication::node::NodeCore`, and registers itself in the metadata
//! store so that writers can place ledgers on it.

pub mod cookie;
pub mod registration;
pub mod server;
pub mod space;
pub mod stats;
pub mod store;

pub use registration::register;
pub use server::{serve, GarbageCollection, Listener, ServeError};
pub use space::DiskSpace;
pub use stats::NodeStats;
