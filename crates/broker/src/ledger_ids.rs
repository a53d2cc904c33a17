//! Ledger ids, unique across the cluster: allocated through the metadata store, in blocks, so
//! that a ledger created by any broker on any storage never collides with another.
//!
//! The counter key holds the next unallocated id (decimal). A broker takes a block of
//! [`BLOCK`] ids by compare-and-set and hands them out from memory; ids of a block it never
//! used are skipped, never reused. The counter starts at or above the storage's floor (ids a
//! local store handed out itself before this allocator existed).

use crate::error::BrokerError;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use std::ops::Range;
use std::sync::Arc;

/// Ids taken per metadata write: a rollover every few seconds costs one write in 1,000.
pub const BLOCK: u64 = 1_000;
/// How many times a block allocation retries when other brokers allocate at the same time.
const MAX_ATTEMPTS: usize = 100;

pub struct LedgerIds {
    metadata: Arc<dyn MetadataStore>,
    key: String,
    floor: u64,
    block: tokio::sync::Mutex<Range<u64>>,
}

impl LedgerIds {
    pub fn new(metadata: Arc<dyn MetadataStore>, key: impl Into<String>, floor: u64) -> Self {
        LedgerIds { metadata, key: key.into(), floor, block: tokio::sync::Mutex::new(0..0) }
    }

    /// The next id: from the current block, or a new block taken from the metadata store.
    pub async fn next(&self) -> Result<u64, BrokerError> {
        self.next_after(None).await
    }

    /// The next id greater than `after`. A topic's ledger ids must grow (positions order by
    /// ledger id), and a block this broker took earlier may lie below the ledgers another
    /// broker created for the topic since: such a block is dropped for a fresh one, which lies
    /// above every id handed out so far.
    pub async fn next_after(&self, after: Option<u64>) -> Result<u64, BrokerError> {
        let mut block = self.block.lock().await;
        if block.is_empty() || after.is_some_and(|after| block.start <= after) {
            *block = self.take_block().await?;
        }
        let id = block.start;
        assert!(after.is_none_or(|after| id > after), "a fresh block lies above every id");
        block.start += 1;
        Ok(id)
    }

    async fn take_block(&self) -> Result<Range<u64>, BrokerError> {
        take_range(&*self.metadata, &self.key, self.floor, BLOCK).await
    }
}

/// Takes `size` numbers from the counter at `key` (starting at `floor` or above) by
/// compare-and-set, retrying while other brokers take theirs.
pub async fn take_range(
    metadata: &dyn MetadataStore,
    key: &str,
    floor: u64,
    size: u64,
) -> Result<Range<u64>, BrokerError> {
    {
        for _ in 0..MAX_ATTEMPTS {
            let (start, expected) = match metadata.get(key).await? {
                Some(found) => {
                    let text = std::str::from_utf8(&found.value).unwrap_or_default();
                    let next = text.trim().parse::<u64>().map_err(|_| {
                        BrokerError::Metadata(format!("{key} holds no id: {text:?}"))
                    })?;
                    (next, ExpectedVersion::Exactly(found.version))
                }
                None => (0, ExpectedVersion::Absent),
            };
            let start = start.max(floor);
            let end = start
                .checked_add(size)
                .ok_or_else(|| BrokerError::Metadata(format!("{key} is exhausted")))?;
            match metadata.put(key, end.to_string().into(), expected).await {
                Ok(_) => return Ok(start..end),
                // Another broker took a block meanwhile: read again.
                Err(MetadataError::BadVersion { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(BrokerError::Metadata(format!("too much contention on {key}")))
    }
}

/// Names for producers that bring none, unique across the cluster (Pulsar's
/// `generateUniqueProducerName`): `<cluster>-<instance>-<n>`, where the instance number is taken
/// from a cluster-wide counter once per broker start.
pub struct ProducerNames {
    metadata: Arc<dyn MetadataStore>,
    cluster: String,
    prefix: tokio::sync::OnceCell<String>,
    next: std::sync::atomic::AtomicU64,
}

/// The counter of broker instances that named producers (Pulsar's `/counters/producer-name`).
pub const PRODUCER_NAME_COUNTER: &str = "/counters/producer-name";

impl ProducerNames {
    pub fn new(metadata: Arc<dyn MetadataStore>, cluster: &str) -> Self {
        ProducerNames {
            metadata,
            cluster: cluster.to_string(),
            prefix: tokio::sync::OnceCell::new(),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The next name.
    pub async fn next(&self) -> Result<String, BrokerError> {
        let prefix = self
            .prefix
            .get_or_try_init(|| async {
                let instance = take_range(&*self.metadata, PRODUCER_NAME_COUNTER, 0, 1).await?;
                Ok::<_, BrokerError>(format!("{}-{}", self.cluster, instance.start))
            })
            .await?;
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(format!("{prefix}-{n}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_metadata::MemoryStore;
    use std::collections::HashSet;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn brokers_sharing_a_store_never_hand_out_the_same_id() {
        let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let brokers: Vec<Arc<LedgerIds>> =
            (0..4).map(|_| Arc::new(LedgerIds::new(metadata.clone(), "/ledger-ids", 0))).collect();
        let mut tasks = Vec::new();
        for broker in &brokers {
            let broker = broker.clone();
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..2_500 {
                    ids.push(broker.next().await.unwrap());
                }
                ids
            }));
        }
        let mut seen = HashSet::new();
        for task in tasks {
            for id in task.await.unwrap() {
                assert!(seen.insert(id), "id {id} handed out twice");
            }
        }
        assert_eq!(seen.len(), 10_000);
    }

    #[tokio::test]
    async fn producer_names_differ_between_brokers_and_restarts() {
        let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let first = ProducerNames::new(metadata.clone(), "demo");
        let second = ProducerNames::new(metadata.clone(), "demo");
        assert_eq!(first.next().await.unwrap(), "demo-0-0");
        assert_eq!(first.next().await.unwrap(), "demo-0-1");
        assert_eq!(second.next().await.unwrap(), "demo-1-0");
        let restarted = ProducerNames::new(metadata, "demo");
        assert_eq!(restarted.next().await.unwrap(), "demo-2-0");
    }

    #[tokio::test]
    async fn ids_start_above_the_storage_floor_and_survive_a_restart() {
        let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let first = LedgerIds::new(metadata.clone(), "/ledger-ids", 42);
        assert_eq!(first.next().await.unwrap(), 42);
        assert_eq!(first.next().await.unwrap(), 43);
        // A restarted broker takes the next block: its ids are all new.
        let restarted = LedgerIds::new(metadata.clone(), "/ledger-ids", 0);
        assert_eq!(restarted.next().await.unwrap(), 42 + BLOCK);
        // The first broker's block lies below what the restarted one handed out: a topic moving
        // back to it still gets a greater ledger id.
        assert_eq!(first.next_after(Some(42 + BLOCK)).await.unwrap(), 42 + 2 * BLOCK);
    }
}
