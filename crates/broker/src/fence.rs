//! Fencing of a topic whose metadata someone else changed.
//!
//! Everything a topic's owner writes that a second owner could also write (the ledger list,
//! cursor records, the deduplication snapshot) is written by compare-and-set against the version
//! this owner last saw; cursor states go to cursor ledgers, which a new owner fences when it
//! loads them (`cursor_ledger`), so the old owner's next append fails and fences it the same way. A lost compare-and-set means another broker owns the topic now: the writer
//! never retries over it. It fences the topic instead: appends fail, producers and consumers are
//! closed (clients reconnect, and a lookup sends them to the owner), and the next use of the
//! topic on this broker loads it afresh from the metadata store.

use crate::error::BrokerError;
use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

pub struct Fence {
    topic: String,
    fenced: AtomicBool,
    fenced_now: Notify,
}

impl Fence {
    pub fn new(topic: String) -> Arc<Self> {
        Arc::new(Fence { topic, fenced: AtomicBool::new(false), fenced_now: Notify::new() })
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Fences the topic (once); `key` is the write that found someone else's version.
    pub fn fence(&self, key: &str) -> BrokerError {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::error!(topic = %self.topic, %key, "another writer took over (a lost compare-and-set or a fenced cursor ledger): topic fenced");
            // Every waiter (the topic's fence task, ack receipts waiting on a persist).
            self.fenced_now.notify_waiters();
        }
        self.error()
    }

    pub fn error(&self) -> BrokerError {
        BrokerError::Fenced(format!("topic {} is fenced: another broker owns it", self.topic))
    }

    /// Returns once the topic is fenced.
    pub async fn fenced(&self) {
        loop {
            let notified = self.fenced_now.notified();
            if self.is_fenced() {
                return;
            }
            notified.await;
        }
    }

    /// Writes `value` at `key` by compare-and-set against `*version` (this writer's last known
    /// version, `None`: absent) and records the new version. A conflict fences the topic.
    pub async fn put(
        &self,
        metadata: &dyn MetadataStore,
        key: &str,
        value: Bytes,
        version: &mut Option<u64>,
    ) -> Result<(), BrokerError> {
        if self.is_fenced() {
            return Err(self.error());
        }
        let expected = version.map_or(ExpectedVersion::Absent, ExpectedVersion::Exactly);
        match metadata.put(key, value, expected).await {
            Ok(new_version) => {
                *version = Some(new_version);
                Ok(())
            }
            Err(MetadataError::BadVersion { .. }) => Err(self.fence(key)),
            Err(error) => Err(error.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_metadata::MemoryStore;

    #[tokio::test]
    async fn a_lost_compare_and_set_fences_and_nothing_is_overwritten() {
        let store = MemoryStore::new();
        let (old, new) = (Fence::new("t".into()), Fence::new("t".into()));
        let (mut old_version, mut new_version) = (None, None);
        old.put(&store, "/c", Bytes::from_static(b"1"), &mut old_version).await.unwrap();
        // The new owner reads what is there and writes on top of it.
        new_version = store.get("/c").await.unwrap().map(|v| v.version).or(new_version);
        new.put(&store, "/c", Bytes::from_static(b"2"), &mut new_version).await.unwrap();
        // The old owner's next write loses and fences it, once and for good.
        let lost = old.put(&store, "/c", Bytes::from_static(b"3"), &mut old_version).await;
        assert!(matches!(lost, Err(BrokerError::Fenced(_))), "{lost:?}");
        assert!(old.is_fenced());
        tokio::time::timeout(std::time::Duration::from_secs(1), old.fenced()).await.unwrap();
        assert_eq!(store.get("/c").await.unwrap().unwrap().value, Bytes::from_static(b"2"));
        let again = old.put(&store, "/c", Bytes::from_static(b"4"), &mut Some(2)).await;
        assert!(matches!(again, Err(BrokerError::Fenced(_))), "a fenced writer writes nothing");
        assert!(!new.is_fenced());
    }
}
