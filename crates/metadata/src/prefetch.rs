//! [`Prefetched`]: a store that has read some keys (and one listing) ahead, in one request, and
//! answers them from what it read until [`Prefetched::finish`]; everything else, and every
//! read after `finish`, goes to the inner store. A write through it drops what it holds for
//! that key (and the listing, for a key under the listed path), so a read after a write is the
//! store's.
//!
//! For a code path that reads a known set of keys one after another (a topic's load: its
//! existence, ledger list, compaction and dedup records, policies, cursors): one round trip
//! instead of one per key. Answers are as of the prefetch, as if those reads had all run then;
//! a compare-and-set on a version read that way fails as it would have on a slow path.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use crate::{ExpectedVersion, MetadataStore, Result, Versioned, WatchStream};

/// `inner` with `keys` (and the children of one path) read ahead.
pub struct Prefetched {
    inner: Arc<dyn MetadataStore>,
    ahead: Mutex<Ahead>,
}

#[derive(Default)]
struct Ahead {
    keys: HashMap<String, Option<Versioned>>,
    /// The path listed ahead and its children.
    children: Option<(String, Vec<String>)>,
}

impl Prefetched {
    /// Reads `keys` (one `get_many`) and, with `children`, that path's children (at the same
    /// time).
    pub async fn read(
        inner: Arc<dyn MetadataStore>,
        keys: Vec<String>,
        children: Option<String>,
    ) -> Result<Arc<Prefetched>> {
        let listing = async {
            match &children {
                Some(path) => inner.list_children(path).await.map(Some),
                None => Ok(None),
            }
        };
        let (found, listed) = tokio::join!(inner.get_many(&keys), listing);
        let ahead =
            Ahead { keys: keys.into_iter().zip(found?).collect(), children: children.zip(listed?) };
        Ok(Arc::new(Prefetched { inner, ahead: Mutex::new(ahead) }))
    }

    /// Forgets what was read ahead: from now on every read goes to the inner store.
    pub fn finish(&self) {
        *self.ahead.lock() = Ahead::default();
    }

    fn forget(&self, key: &str) {
        let mut ahead = self.ahead.lock();
        ahead.keys.remove(key);
        if ahead.children.as_ref().is_some_and(|(path, _)| {
            key.strip_prefix(path.as_str()).is_some_and(|rest| rest.starts_with('/'))
        }) {
            ahead.children = None;
        }
    }
}

#[async_trait]
impl MetadataStore for Prefetched {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        if let Some(found) = self.ahead.lock().keys.get(key) {
            return Ok(found.clone());
        }
        self.inner.get(key).await
    }

    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Versioned>>> {
        let known: Option<Vec<Option<Versioned>>> = {
            let ahead = self.ahead.lock();
            keys.iter().map(|k| ahead.keys.get(k).cloned()).collect()
        };
        match known {
            Some(found) => Ok(found),
            None => self.inner.get_many(keys).await,
        }
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        self.forget(key);
        self.inner.put(key, value, expected).await
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        self.forget(key);
        self.inner.delete(key, expected).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.list(prefix).await
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        if let Some((listed, children)) = &self.ahead.lock().children {
            if listed == path {
                return Ok(children.clone());
            }
        }
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
    async fn answers_from_what_it_read_until_a_write_or_finish() {
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        store.put("/a", Bytes::from_static(b"1"), ExpectedVersion::Any).await.unwrap();
        store.put("/c/x", Bytes::from_static(b"x"), ExpectedVersion::Any).await.unwrap();
        let keys = vec!["/a".to_string(), "/b".to_string()];
        let ahead = Prefetched::read(store.clone(), keys, Some("/c".into())).await.unwrap();
        // Changed behind its back: it still answers what it read.
        store.put("/a", Bytes::from_static(b"2"), ExpectedVersion::Any).await.unwrap();
        store.put("/b", Bytes::from_static(b"b"), ExpectedVersion::Any).await.unwrap();
        store.put("/c/y", Bytes::from_static(b"y"), ExpectedVersion::Any).await.unwrap();
        assert_eq!(&ahead.get("/a").await.unwrap().unwrap().value[..], b"1");
        assert!(ahead.get("/b").await.unwrap().is_none());
        assert_eq!(ahead.list_children("/c").await.unwrap(), vec!["x".to_string()]);
        // A key not read ahead, and a write through it: the store's.
        assert!(ahead.get("/c/y").await.unwrap().is_some());
        ahead.put("/c/z", Bytes::from_static(b"z"), ExpectedVersion::Any).await.unwrap();
        assert_eq!(ahead.list_children("/c").await.unwrap().len(), 3);
        ahead.put("/b", Bytes::from_static(b"b2"), ExpectedVersion::Any).await.unwrap();
        assert_eq!(&ahead.get("/b").await.unwrap().unwrap().value[..], b"b2");
        ahead.finish();
        assert_eq!(&ahead.get("/a").await.unwrap().unwrap().value[..], b"2");
    }
}
