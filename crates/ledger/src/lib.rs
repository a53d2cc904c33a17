//! Magnetar's ledger store: the storage engine brokers write topics into.
//!
//! Ledgers hold dense entries `0..n`, appended durably through the journal (group commit,
//! fdatasync before acknowledgement), read back from a write cache or from the journal's
//! segments, closed, fenced and deleted. See [`store`] for the design and its invariants.

pub mod api;
pub mod cache;
pub mod config;
pub mod dir_lock;
pub mod error;
pub mod files;
pub mod hooked;
pub mod idmap;
pub mod reserve;
pub mod space;
pub mod store;

pub use api::{AppendCallback, LedgerMetadata, LedgerStorage, MemoryLedgers};
pub use config::LedgerStoreConfig;
pub use dir_lock::DirLock;
pub use error::LedgerError;
pub use store::{Commit, LedgerInfo, LedgerStore, PendingAppend, StoreRecovery, StoreStats};
