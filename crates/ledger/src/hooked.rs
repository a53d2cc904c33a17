//! A ledger storage that hands every call to another one, with hooks where a test steps in:
//! refuse, fail or hold an append, hold a creation or a close, fail reads. One fault injected at one
//! point, everything else real. For tests: no shipped code uses it.

use crate::{AppendCallback, LedgerError, LedgerInfo, LedgerMetadata, LedgerStorage};
use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;

/// Where a test steps in. Each hook's default lets the call through unchanged.
#[async_trait]
pub trait StorageHooks: Send + Sync + 'static {
    /// Before ledger `id` is created: wait here to hold the creation.
    async fn before_create(&self, _id: u64) {}

    /// An append to `ledger`. `Ok(Some(done))` hands it on, with `done` or a callback that
    /// wraps it (to hold or watch the outcome); `Ok(None)`: the hook answered `done` itself,
    /// nothing is staged; `Err`: refused, nothing staged.
    fn on_append(
        &self,
        _ledger: u64,
        done: AppendCallback,
    ) -> Result<Option<AppendCallback>, LedgerError> {
        Ok(Some(done))
    }

    /// Before `ledger` is closed: wait here to hold the close.
    async fn before_close(&self, _ledger: u64) {}

    /// A read of `ledger` (cached or not): `Err` fails it, as a storage that cannot answer.
    fn on_read(&self, _ledger: u64) -> Result<(), LedgerError> {
        Ok(())
    }
}

/// `inner` with `hooks` in front of it.
pub struct Hooked<H> {
    pub inner: Arc<dyn LedgerStorage>,
    pub hooks: H,
}

impl<H: StorageHooks> Hooked<H> {
    pub fn new(inner: Arc<dyn LedgerStorage>, hooks: H) -> Arc<Self> {
        Arc::new(Hooked { inner, hooks })
    }
}

#[async_trait]
impl<H: StorageHooks> LedgerStorage for Hooked<H> {
    async fn create(&self, id: u64, metadata: &LedgerMetadata) -> Result<(), LedgerError> {
        self.hooks.before_create(id).await;
        self.inner.create(id, metadata).await
    }

    fn append(
        &self,
        ledger: u64,
        entry_id: u64,
        data: Bytes,
        done: AppendCallback,
    ) -> Result<(), LedgerError> {
        match self.hooks.on_append(ledger, done)? {
            Some(done) => self.inner.append(ledger, entry_id, data, done),
            None => Ok(()),
        }
    }

    fn read(&self, ledger: u64, first: u64, last: u64) -> Result<Vec<Bytes>, LedgerError> {
        self.hooks.on_read(ledger)?;
        self.inner.read(ledger, first, last)
    }

    fn read_cached(&self, ledger: u64, first: u64, last: u64) -> Option<Vec<Bytes>> {
        self.hooks.on_read(ledger).ok()?;
        self.inner.read_cached(ledger, first, last)
    }

    fn last_add_confirmed(&self, ledger: u64) -> Result<Option<u64>, LedgerError> {
        self.inner.last_add_confirmed(ledger)
    }

    async fn fence(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.inner.fence(ledger).await
    }

    async fn close(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.hooks.before_close(ledger).await;
        self.inner.close(ledger).await
    }

    async fn delete(&self, ledger: u64) -> Result<(), LedgerError> {
        self.inner.delete(ledger).await
    }

    fn info(&self, ledger: u64) -> Result<LedgerInfo, LedgerError> {
        self.inner.info(ledger)
    }

    async fn info_async(&self, ledger: u64) -> Result<LedgerInfo, LedgerError> {
        self.inner.info_async(ledger).await
    }

    fn short_of_disk(&self) -> Option<String> {
        self.inner.short_of_disk()
    }
}
