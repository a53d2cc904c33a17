//! Magnetar's write-ahead journal.
//!
//! Append-only, preallocated segment files of CRC32C-checked records, written by group commit:
//! one writer thread takes everything staged, issues one 4 KiB-aligned write and one flush, and
//! only then completes the waiters. Recovery stops at the first torn or corrupt record of the
//! last segment and zeroes it. All disk access goes through [`storage::Storage`], so the same
//! code runs on real files and on the fault-injecting [`sim::SimStorage`].
//!
//! The journal knows records, not ledgers: `kind`, `ledger_id` and `entry_id` are the caller's.

pub mod aligned;
pub mod config;
pub mod error;
pub mod journal;
pub mod read_pool;
pub mod record;
pub mod scan;
pub mod sim;
pub mod storage;

pub use config::{JournalConfig, SyncMode};
pub use error::JournalError;
pub use journal::{
    Completion, CompletionsHook, Journal, OutOfSpaceHook, RecoveryReport, SealedHook, SealedSegment,
};
pub use record::RecordHeader;
pub use scan::RecordLocation;
