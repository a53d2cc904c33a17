//! [`CountingStore`]: a thin wrapper that counts the writes (puts and deletes) made through it,
//! for metrics (`magnetar_metadata_writes_total`) and for tests that bound how often a code path
//! writes the metadata store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ExpectedVersion, MetadataStore, Result, Versioned, WatchStream};

/// Forwards everything to `inner`, counting every put and delete attempted (successful or not:
/// each is a request the store had to answer).
pub struct CountingStore {
    inner: Arc<dyn MetadataStore>,
    writes: Arc<AtomicU64>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn MetadataStore>) -> Self {
        CountingStore { inner, writes: Arc::default() }
    }

    /// Puts and deletes made through this store so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// The counter itself, to read it where the store is not at hand (a metrics endpoint).
    pub fn write_counter(&self) -> Arc<AtomicU64> {
        self.writes.clone()
    }
}

#[async_trait]
impl MetadataStore for CountingStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        self.inner.get(key).await
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.put(key, value, expected).await
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(key, expected).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.list(prefix).await
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        self.inner.list_children(path).await
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        self.inner.watch(prefix).await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[tokio::test]
    async fn counts_puts_and_deletes_not_reads() {
        let store = CountingStore::new(Arc::new(MemoryStore::new()));
        store.put("/a", Bytes::from_static(b"1"), ExpectedVersion::Any).await.unwrap();
        let lost = store.put("/a", Bytes::from_static(b"2"), ExpectedVersion::Absent).await;
        assert!(lost.is_err());
        store.get("/a").await.unwrap();
        store.list("/").await.unwrap();
        store.delete("/a", ExpectedVersion::Any).await.unwrap();
        assert_eq!(store.writes(), 3);
        assert_eq!(store.write_counter().load(Ordering::Relaxed), 3);
    }
}
