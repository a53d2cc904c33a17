//! Magnetar's metadata store: a versioned, watchable key-value space for broker metadata
//! (topics and partition counts, managed-ledger ledger lists, cursor state, namespace
//! policies, schemas).
//!
//! The [`MetadataStore`] trait follows etcd / ZooKeeper semantics; [`SessionStore`] adds
//! sessions (ephemeral keys and session events) for cluster mode. Two implementations live
//! here: [`MemoryStore`] (tests) and [`EmbeddedStore`] (durable, crash-safe, for standalone
//! mode); the etcd one is in the `magnetar-metadata-etcd` crate, which keeps the gRPC stack
//! out of this one. [`conformance`] exports the suite every implementation must pass.
//!
//! Semantics shared by every implementation (checked by the conformance suite in
//! `tests/it/conformance.rs`):
//! * **Keys** are absolute '/'-separated paths (`/topics/public/default/persistent/t1`);
//!   see [`validate_key`]. Malformed keys give [`MetadataError::InvalidKey`], never a panic.
//! * **Versions** are per key: the first put of an absent key yields version 1, every later
//!   put yields previous + 1. A delete forgets the key; re-creating it starts at 1 again
//!   (like ZooKeeper's `dataVersion` and etcd's per-key `version`).
//! * **put** with [`ExpectedVersion`] is a compare-and-set; a mismatch returns
//!   [`MetadataError::BadVersion`] and writes nothing.
//! * **delete** of an absent key returns [`MetadataError::NotFound`] whatever the expected
//!   version (NotFound takes precedence); a present key with a mismatching expectation
//!   returns `BadVersion` (so `ExpectedVersion::Absent` on a present key is `BadVersion`).
//! * **list** is plain string-prefix matching (`"/a"` matches `"/ab"`; use `"/a/"` for a
//!   subtree). **list_children** returns immediate child names, including "implicit"
//!   children that only exist because deeper keys do; a path without children gives an
//!   empty list (not NotFound).
//! * **watch** delivers changes committed after the call, in commit order, with explicit
//!   [`WatchEvent::Lagged`] markers if the watcher falls behind (see [`WatchStream`]) or, for
//!   a remote store, if the watch had to resume after a disconnection from a point the store
//!   no longer keeps history for (etcd compaction). Never a silent gap. The in-process stores
//!   queue a write's event before the write returns; a remote store delivers it shortly
//!   after (the conformance suite waits for that with its `settle` hook).
//! * A successful write is visible to every later read on the same store (linearizable
//!   within one process). When a write returns `Io` its outcome is unknown.
//! * Dropping a write future after its first poll does not cancel the write: it may still be
//!   applied (and announced to watchers).
//!
//! Sessions ([`SessionStore`], see the `session` module docs):
//! * Each store client (each `MemoryStore` peer, each open `EmbeddedStore`, each `EtcdStore`,
//!   i.e. each process) has one session at a time, identified by a [`SessionId`].
//! * **put_ephemeral** follows `put`'s version and compare-and-set rules exactly and binds the
//!   key to the current session; a later plain `put` makes the key persistent again.
//! * When the session ends (expiry, revocation, `close`), every key still bound to it is
//!   deleted and watchers see ordinary `Delete` events. A lost session is never reused: the
//!   client publishes [`SessionEvent::SessionLost`], starts a new session and publishes
//!   [`SessionEvent::SessionReestablished`]; re-creating ephemeral keys is up to their owners.
//!   `put_ephemeral` fails with [`MetadataError::SessionExpired`] while there is no session.
//! * [`SessionEvent::ConnectionLost`] / [`SessionEvent::Reconnected`] report contact with a
//!   remote store (etcd) while the session itself survives; the in-process stores never
//!   lose contact.
//! * Ephemeral keys never outlive the process: the embedded store keeps them out of its log
//!   and snapshots, so none exists after a restart.

// Always built (not behind a feature): a feature enabled only by dev-dependencies makes
// `cargo test --workspace` build this crate and every crate above it a second time for the
// shipped binary. Unused in shipped code, so the linker drops it.
#[doc(hidden)]
pub mod conformance;
mod counting;
mod embedded;
mod error;
mod intercept;
mod key;
mod memory;
mod prefetch;
mod session;
mod state;
mod watch;

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;

pub use counting::{CountingStore, OperationLatency};
pub use embedded::{
    EmbeddedStats, EmbeddedStore, EmbeddedStoreConfig, FileLogIo, LogIo, LogIoWrapper,
    RecoveryReport,
};
pub use error::{MetadataError, Result};
pub use intercept::{InterceptedStore, Interceptor, Operation};
pub use key::{validate_key, validate_path, validate_prefix, MAX_KEY_LEN, MAX_VALUE_LEN};
pub use memory::{MemoryStore, DEFAULT_WATCH_CAPACITY};
pub use prefetch::Prefetched;
pub use session::{
    SessionEvent, SessionEvents, SessionId, SessionNotifier, SessionState, SessionStore,
    SESSION_EVENTS_CAPACITY,
};
pub use watch::{watch_channel, Event, EventKind, WatchEvent, WatchSender, WatchStream};

/// A value together with its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The stored bytes.
    pub value: Bytes,
    /// Per-key version, >= 1 (see the crate docs).
    pub version: u64,
}

/// The condition a write places on the key's current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpectedVersion {
    /// No condition.
    Any,
    /// The key must not exist (create).
    Absent,
    /// The key must exist with exactly this version.
    Exactly(u64),
}

impl ExpectedVersion {
    /// Whether a key whose current version is `current` (`None` = absent) satisfies this.
    pub fn matches(self, current: Option<u64>) -> bool {
        match self {
            ExpectedVersion::Any => true,
            ExpectedVersion::Absent => current.is_none(),
            ExpectedVersion::Exactly(v) => current == Some(v),
        }
    }
}

impl fmt::Display for ExpectedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpectedVersion::Any => f.write_str("any"),
            ExpectedVersion::Absent => f.write_str("absent"),
            ExpectedVersion::Exactly(v) => write!(f, "version {v}"),
        }
    }
}

/// A versioned, watchable key-value store for broker metadata.
///
/// Object safe: the broker holds an `Arc<dyn MetadataStore>`. See the crate docs for the
/// exact semantics every implementation follows.
#[async_trait]
pub trait MetadataStore: Send + Sync {
    /// Reads a key. `Ok(None)` when it does not exist.
    async fn get(&self, key: &str) -> Result<Option<Versioned>>;

    /// Reads several keys, one answer per key in order (`None`: absent), in one request where
    /// the store can (etcd: one read-only transaction, so the answers are one snapshot); the
    /// default reads them one after another.
    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Versioned>>> {
        let mut found = Vec::with_capacity(keys.len());
        for key in keys {
            found.push(self.get(key).await?);
        }
        Ok(found)
    }

    /// Writes `value` if the key's current version satisfies `expected`; returns the new
    /// version. Errors: `BadVersion`, `InvalidKey`, `ValueTooLarge`, `Io`, `Poisoned`,
    /// `Closed`.
    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64>;

    /// Deletes a key if its current version satisfies `expected`. Errors: `NotFound` when the
    /// key is absent (whatever `expected` is), `BadVersion`, `InvalidKey`, `Io`, `Poisoned`,
    /// `Closed`.
    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()>;

    /// All keys that start with `prefix` (plain string prefix, must start with '/'), sorted.
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;

    /// Immediate child names of `path` ("/" or a valid key), sorted, like ZooKeeper's
    /// `getChildren`. Empty when nothing lies under `path`.
    async fn list_children(&self, path: &str) -> Result<Vec<String>>;

    /// Watches every key starting with `prefix` (plain string prefix). The stream carries
    /// changes committed after this call returns.
    async fn watch(&self, prefix: &str) -> Result<WatchStream>;

    /// Closes the store: writes already submitted finish, later calls return `Closed`, and
    /// watch streams end. Idempotent.
    async fn close(&self) -> Result<()>;
}
