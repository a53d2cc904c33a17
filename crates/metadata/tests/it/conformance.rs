//! Runs the conformance suite (`magnetar_metadata::conformance`) against `MemoryStore` and
//! `EmbeddedStore`. The cases live in the library (feature `conformance`) so that
//! `magnetar-metadata-etcd` runs the very same ones against etcd.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use magnetar_metadata::conformance::{Hooks, Subject, WATCH_CAPACITY};
use magnetar_metadata::{EmbeddedStore, EmbeddedStoreConfig, MemoryStore, MetadataStore};

struct MemoryHooks {
    store: Arc<MemoryStore>,
    /// A second client of the same key space, created up front (the subject may be closed).
    peer: Arc<MemoryStore>,
}

#[async_trait]
impl Hooks for MemoryHooks {
    async fn expire_session(&self) {
        self.store.expire_session().expect("expire the memory session");
    }

    async fn observer(&self) -> Arc<dyn MetadataStore> {
        self.peer.clone()
    }
}

fn memory_factory() -> Pin<Box<dyn Future<Output = Option<Subject>>>> {
    Box::pin(async {
        let store = Arc::new(MemoryStore::with_watch_capacity(WATCH_CAPACITY));
        let peer = Arc::new(store.peer());
        Some(Subject { store: store.clone(), hooks: Box::new(MemoryHooks { store, peer }) })
    })
}

struct EmbeddedHooks {
    store: Arc<EmbeddedStore>,
    dir: PathBuf,
    _guard: tempfile::TempDir,
}

#[async_trait]
impl Hooks for EmbeddedHooks {
    async fn expire_session(&self) {
        self.store.expire_session().await.expect("expire the embedded session");
    }

    /// Reopens the directory: what a restarted process would see.
    async fn observer(&self) -> Arc<dyn MetadataStore> {
        Arc::new(EmbeddedStore::open(config(&self.dir)).await.expect("reopen embedded store"))
    }
}

fn config(dir: &std::path::Path) -> EmbeddedStoreConfig {
    let mut config = EmbeddedStoreConfig::new(dir);
    config.watch_capacity = WATCH_CAPACITY;
    config
}

fn embedded_factory() -> Pin<Box<dyn Future<Output = Option<Subject>>>> {
    Box::pin(async {
        let guard = tempfile::tempdir().expect("tempdir");
        let dir = guard.path().join("meta");
        let store = Arc::new(EmbeddedStore::open(config(&dir)).await.expect("open embedded"));
        let hooks = EmbeddedHooks { store: store.clone(), dir, _guard: guard };
        Some(Subject { store, hooks: Box::new(hooks) })
    })
}

magnetar_metadata::conformance_tests!(memory, super::memory_factory);
magnetar_metadata::conformance_tests!(embedded, super::embedded_factory);
