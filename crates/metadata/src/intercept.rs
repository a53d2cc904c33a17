//! [`InterceptedStore`]: forwards every operation to an inner store after an [`Interceptor`]
//! has seen it, which may delay it or fail it. For tests that need a store that is slow on one
//! key, holds certain writes until released, or fails the first few watches, without writing
//! a whole `MetadataStore` each time.

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ExpectedVersion, MetadataStore, Result, Versioned, WatchStream};

/// An operation on its way to the inner store, with the key, path or prefix it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation<'a> {
    Get(&'a str),
    Put(&'a str),
    Delete(&'a str),
    List(&'a str),
    ListChildren(&'a str),
    Watch(&'a str),
}

/// What runs before each operation reaches the inner store.
#[async_trait]
pub trait Interceptor: Send + Sync {
    /// Sees `operation` first: returns once it may go on (waiting first, if it should), or
    /// the error it fails with instead.
    async fn before(&self, operation: Operation<'_>) -> Result<()>;
}

/// `inner`, with `interceptor` before each operation (closing is not intercepted).
pub struct InterceptedStore<S, I> {
    pub inner: S,
    pub interceptor: I,
}

#[async_trait]
impl<S: MetadataStore, I: Interceptor> MetadataStore for InterceptedStore<S, I> {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        self.interceptor.before(Operation::Get(key)).await?;
        self.inner.get(key).await
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        self.interceptor.before(Operation::Put(key)).await?;
        self.inner.put(key, value, expected).await
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        self.interceptor.before(Operation::Delete(key)).await?;
        self.inner.delete(key, expected).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.interceptor.before(Operation::List(prefix)).await?;
        self.inner.list(prefix).await
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        self.interceptor.before(Operation::ListChildren(path)).await?;
        self.inner.list_children(path).await
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        self.interceptor.before(Operation::Watch(prefix)).await?;
        self.inner.watch(prefix).await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, MetadataError};

    /// Fails every put under `/locked/`, lets the rest through.
    struct Locked;

    #[async_trait]
    impl Interceptor for Locked {
        async fn before(&self, operation: Operation<'_>) -> Result<()> {
            match operation {
                Operation::Put(key) if key.starts_with("/locked/") => Err(MetadataError::Closed),
                _ => Ok(()),
            }
        }
    }

    #[tokio::test]
    async fn the_interceptor_sees_each_operation_first() {
        let store = InterceptedStore { inner: MemoryStore::new(), interceptor: Locked };
        let refused = store.put("/locked/a", Bytes::from_static(b"x"), ExpectedVersion::Any).await;
        assert!(matches!(refused, Err(MetadataError::Closed)), "{refused:?}");
        assert!(store.get("/locked/a").await.unwrap().is_none(), "nothing reached the store");
        store.put("/open/a", Bytes::from_static(b"x"), ExpectedVersion::Any).await.unwrap();
        assert_eq!(store.get("/open/a").await.unwrap().unwrap().value, Bytes::from_static(b"x"));
        assert_eq!(store.list("/open/").await.unwrap(), vec!["/open/a".to_string()]);
    }
}
