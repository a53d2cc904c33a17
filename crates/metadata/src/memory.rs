//! `MemoryStore`: the in-memory [`MetadataStore`] for tests and embedding.
//!
//! All state lives in one `KvState` (a `BTreeMap` plus watchers) behind a `parking_lot`
//! mutex; every operation takes the lock once, so operations are linearizable and watch
//! events follow mutation order. Nothing is persisted. Invariant: once closed, every
//! operation returns `Closed` and all watch streams have ended.

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use crate::error::{MetadataError, Result};
use crate::key::{validate_key, validate_path, validate_prefix, validate_value};
use crate::state::KvState;
use crate::{ExpectedVersion, MetadataStore, Versioned, WatchStream};

/// Default queue length of each watch stream.
pub const DEFAULT_WATCH_CAPACITY: usize = 1024;

/// In-memory metadata store.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Option<KvState>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store whose watch streams buffer [`DEFAULT_WATCH_CAPACITY`] events.
    pub fn new() -> Self {
        Self::with_watch_capacity(DEFAULT_WATCH_CAPACITY)
    }

    /// An empty store whose watch streams buffer `capacity` events (minimum 2) before
    /// signalling `Lagged`.
    pub fn with_watch_capacity(capacity: usize) -> Self {
        MemoryStore { inner: Mutex::new(Some(KvState::new(capacity))) }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut KvState) -> Result<T>) -> Result<T> {
        let mut guard = self.inner.lock();
        match guard.as_mut() {
            Some(state) => f(state),
            None => Err(MetadataError::Closed),
        }
    }
}

#[async_trait]
impl MetadataStore for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        validate_key(key)?;
        self.with_state(|s| Ok(s.get(key)))
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        validate_key(key)?;
        validate_value(key, value.len())?;
        self.with_state(|s| s.put(key, value, expected))
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        validate_key(key)?;
        self.with_state(|s| s.delete(key, expected))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        self.with_state(|s| Ok(s.list(prefix)))
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        validate_path(path)?;
        self.with_state(|s| Ok(s.list_children(path)))
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        validate_prefix(prefix)?;
        self.with_state(|s| Ok(s.watch(prefix)))
    }

    async fn close(&self) -> Result<()> {
        // Dropping the state drops every watcher's sender, which ends the streams.
        self.inner.lock().take();
        Ok(())
    }
}
