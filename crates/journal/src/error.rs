//! Errors of the journal. Cloneable: one failure is reported to every waiter of a group.

use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// A write or flush failed. The journal accepts no more appends: whether the failed data
    /// reached the disk is unknown, and a flush that failed is never retried as if it had
    /// succeeded. Restarting recovers what is durable.
    #[error("journal stopped after an I/O failure ({0}); restart to recover")]
    Failed(Arc<str>),
    /// No space for a new segment. Nothing acknowledged is harmed; appends succeed again once
    /// space is freed.
    #[error("disk full: cannot prepare a journal segment ({0})")]
    DiskFull(Arc<str>),
    #[error("record payload of {size} bytes exceeds the journal maximum of {max} bytes")]
    RecordTooLarge { size: usize, max: usize },
    #[error("journal is closed")]
    Closed,
    #[error("{context}: {source}")]
    Io { context: String, source: Arc<std::io::Error> },
    #[error("corrupt journal record at segment {segment} offset {offset}")]
    Corrupt { segment: u64, offset: u64 },
    /// The segment was released while it was read (compaction moved its live records): the
    /// caller looks the records up again.
    #[error("journal segment {segment} was released while being read")]
    Released { segment: u64 },
    #[error("invalid journal configuration: {0}")]
    Config(String),
}

impl JournalError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        JournalError::Io { context: context.into(), source: Arc::new(source) }
    }
}

/// Whether an I/O error means "no space left".
pub fn is_out_of_space(error: &std::io::Error) -> bool {
    error.raw_os_error() == Some(libc::ENOSPC) || error.kind() == std::io::ErrorKind::StorageFull
}
