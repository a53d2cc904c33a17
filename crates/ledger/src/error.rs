//! Errors of the ledger store.

use magnetar_journal::JournalError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {0} does not exist")]
    NoSuchLedger(u64),
    #[error("entry {entry} of ledger {ledger} does not exist (or is not yet durable)")]
    NoSuchEntry { ledger: u64, entry: u64 },
    #[error("ledger {0} is closed")]
    Closed(u64),
    #[error("ledger {0} is fenced")]
    Fenced(u64),
    /// An earlier append to this ledger failed: later ones cannot succeed without a hole.
    #[error("ledger {ledger} stopped accepting appends after entry {entry} failed")]
    Failed { ledger: u64, entry: u64 },
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("corrupt ledger store file {file}: {why}")]
    Corrupt { file: String, why: String },
    #[error("invalid ledger store configuration: {0}")]
    Config(String),
    #[error("ledger store is shutting down")]
    ShuttingDown,
    #[error("ledger {0} exists already")]
    LedgerExists(u64),
    /// A writer-assigned entry id that is not the ledger's next: entries stay dense.
    #[error("ledger {ledger} expects entry {expected}, not {given}")]
    UnexpectedEntryId { ledger: u64, expected: u64, given: u64 },
    /// Replicated storage cannot serve the request now: too few live storage nodes, or the
    /// metadata store unreachable. Retrying later may succeed.
    #[error("ledger storage unavailable: {0}")]
    Unavailable(String),
    /// The local disk is short of space: new messages are refused (`min_free_bytes`).
    #[error("disk full: {0}")]
    ShortOfDisk(String),
    /// Another process (or another open store) holds the directory's `LOCK`.
    #[error(
        "ledger store directory {dir} is in use by another process (its LOCK is held): two \
         processes writing one journal would corrupt it; stop the other one first"
    )]
    InUse { dir: String },
    /// The storage cannot give what the ledger's metadata asks (e.g. replicas on a local store).
    #[error("unsupported ledger metadata: {0}")]
    Unsupported(String),
}
