//! [`CountingStore`]: a thin wrapper that counts the writes (puts and deletes) made through it,
//! for metrics (`magnetar_metadata_writes_total`) and for tests that bound how often a code path
//! writes the metadata store, and times every operation by kind
//! (`magnetar_metadata_operation_seconds{op}`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use magnetar_metrics::{Exposition, Histogram};

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ExpectedVersion, MetadataStore, Result, Versioned, WatchStream};

/// Forwards everything to `inner`, counting every put and delete attempted (successful or not:
/// each is a request the store had to answer).
pub struct CountingStore {
    inner: Arc<dyn MetadataStore>,
    writes: Arc<AtomicU64>,
    latency: Arc<OperationLatency>,
}

/// The operations timed, as the `op` label names them.
const OPERATIONS: [&str; 7] =
    ["get", "put", "delete", "list", "list_children", "watch", "get_many"];

/// Bucket bounds of the operation latency histograms, in microseconds (50 us .. 5 s).
const LATENCY_BUCKETS_US: &[u64] =
    &[50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, 5_000_000];

/// One latency histogram per kind of operation (its count is the number of operations).
#[derive(Debug)]
pub struct OperationLatency {
    by_op: [Histogram; OPERATIONS.len()],
}

impl OperationLatency {
    fn new() -> Self {
        OperationLatency { by_op: std::array::from_fn(|_| Histogram::new(LATENCY_BUCKETS_US)) }
    }

    fn record(&self, op: usize, started: Instant) {
        self.by_op[op].record_duration_us(now().saturating_duration_since(started));
    }

    /// `magnetar_metadata_operations_total{op}` and `magnetar_metadata_operation_seconds{op}`,
    /// with `labels` before `op`.
    pub fn write_metrics(&self, out: &mut Exposition, labels: &[(&str, &str)]) {
        for (op, histogram) in OPERATIONS.iter().zip(&self.by_op) {
            let mut with_op = labels.to_vec();
            with_op.push(("op", op));
            let (cumulative, sum) = histogram.cumulative();
            out.counter(
                "magnetar_metadata_operations",
                "Metadata-store operations made by this process, by kind (failed ones too).",
                &with_op,
                *cumulative.last().unwrap_or(&0),
            );
            out.histogram(
                "magnetar_metadata_operation_seconds",
                "Time metadata-store operations took, by kind.",
                &with_op,
                histogram.bounds(),
                &cumulative,
                sum,
                1e6,
            );
        }
    }
}

/// The time operation latencies are measured with: real time, for metrics only (no decision
/// reads it, so there is nothing for a simulated clock to drive).
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

impl CountingStore {
    pub fn new(inner: Arc<dyn MetadataStore>) -> Self {
        CountingStore { inner, writes: Arc::default(), latency: Arc::new(OperationLatency::new()) }
    }

    /// The operation latencies, to render where the store is not at hand.
    pub fn latency(&self) -> Arc<OperationLatency> {
        self.latency.clone()
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
        let started = now();
        let result = self.inner.get(key).await;
        self.latency.record(0, started);
        result
    }

    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Versioned>>> {
        let started = now();
        let result = self.inner.get_many(keys).await;
        self.latency.record(6, started);
        result
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let started = now();
        let result = self.inner.put(key, value, expected).await;
        self.latency.record(1, started);
        result
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let started = now();
        let result = self.inner.delete(key, expected).await;
        self.latency.record(2, started);
        result
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let started = now();
        let result = self.inner.list(prefix).await;
        self.latency.record(3, started);
        result
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        let started = now();
        let result = self.inner.list_children(path).await;
        self.latency.record(4, started);
        result
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        let started = now();
        let result = self.inner.watch(prefix).await;
        self.latency.record(5, started);
        result
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
