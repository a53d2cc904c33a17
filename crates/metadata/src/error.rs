//! Typed errors of the metadata store.
//!
//! Every fallible operation of [`crate::MetadataStore`] returns [`MetadataError`]. Callers are
//! expected to match on the variants: `BadVersion` drives compare-and-set retry loops,
//! `NotFound` distinguishes "nothing to delete" from real failures, and `Io` / `Poisoned`
//! tell the caller that the outcome of a write is unknown and the store stopped accepting
//! writes. Invariant: no variant is produced by a panic path; bad input always maps to a
//! variant here.

use std::path::PathBuf;

use crate::ExpectedVersion;

/// Result alias used throughout the crate.
pub type Result<T, E = MetadataError> = std::result::Result<T, E>;

/// Errors returned by metadata store operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// The key does not exist (returned by `delete`; `get` returns `Ok(None)` instead).
    #[error("metadata key not found: {key}")]
    NotFound {
        /// The key that was looked up.
        key: String,
    },

    /// A conditional write found a different version than the one the caller expected.
    /// Nothing was written.
    #[error("bad version for {key}: expected {expected}, actual {}", fmt_actual(*.actual))]
    BadVersion {
        /// The key of the conditional write.
        key: String,
        /// What the caller asked for.
        expected: ExpectedVersion,
        /// The version that was found (`None` when the key is absent).
        actual: Option<u64>,
    },

    /// The key, path or prefix is malformed (see [`crate::validate_key`]).
    #[error("invalid metadata key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key (possibly truncated for very long input).
        key: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// The value exceeds [`crate::MAX_VALUE_LEN`].
    #[error("value for {key} is {len} bytes, more than the maximum of {max}")]
    ValueTooLarge {
        /// The key of the rejected write.
        key: String,
        /// Size of the rejected value.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// An I/O operation failed (for etcd: the cluster could not be reached, or did not answer
    /// in time). For a write this means the outcome is unknown: it may or may not have been
    /// applied. The embedded store then refuses further writes (see `Poisoned`); the etcd
    /// store keeps accepting them.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What the store was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// On-disk data failed validation in a way recovery must not silently paper over
    /// (a bad snapshot, a bad log header, a record that passes its checksum but cannot be
    /// decoded).
    #[error("corrupt metadata file {} at offset {offset}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the problem.
        offset: u64,
        /// Description.
        reason: String,
    },

    /// The data directory is already opened by another store (in this or another process).
    #[error("metadata directory {} is locked by another store", dir.display())]
    Locked {
        /// The data directory.
        dir: PathBuf,
    },

    /// A previous write failed at the I/O level, so the store no longer accepts writes
    /// (its durable state is unknown until it is reopened and recovered). Reads still work
    /// and reflect every write that was acknowledged.
    #[error("metadata store refuses writes after an earlier failure: {reason}")]
    Poisoned {
        /// Description of the original failure.
        reason: String,
    },

    /// The store was closed.
    #[error("metadata store is closed")]
    Closed,

    /// An ephemeral write found no live session: the session was lost and no new one exists
    /// yet, or it ended before the write applied. Nothing was written. Wait for
    /// `SessionEvent::SessionReestablished` and try again.
    #[error("metadata session expired: {reason}")]
    SessionExpired {
        /// What happened.
        reason: String,
    },
}

impl MetadataError {
    /// True for [`MetadataError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, MetadataError::NotFound { .. })
    }

    /// True for [`MetadataError::BadVersion`].
    pub fn is_bad_version(&self) -> bool {
        matches!(self, MetadataError::BadVersion { .. })
    }

    /// True for [`MetadataError::SessionExpired`].
    pub fn is_session_expired(&self) -> bool {
        matches!(self, MetadataError::SessionExpired { .. })
    }

    /// Builds an [`MetadataError::Io`] (for store implementations).
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        MetadataError::Io { context: context.into(), source }
    }
}

fn fmt_actual(actual: Option<u64>) -> String {
    match actual {
        Some(v) => format!("version {v}"),
        None => "absent".to_string(),
    }
}
