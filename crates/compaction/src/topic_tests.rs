//! The compaction shell over an in-memory topic and ledger storage, with injected record-write
//! failures: runs, incremental runs, thinned batches, crash safety, and reloads.

use super::*;
use bytes::BytesMut;
use magnetar_ledger::MemoryLedgers;
use magnetar_protocol::proto::MessageMetadata;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
struct FakeTopic {
    entries: Mutex<Vec<(Pos, Bytes)>>,
    record: Mutex<Option<Bytes>>,
    next_ledger: AtomicU64,
    /// Record writes so far, and the one that fails (0: none), as when the broker lost the
    /// topic or etcd did not answer.
    stores: AtomicU64,
    fail_store: AtomicU64,
}

#[async_trait]
impl CompactionHost for FakeTopic {
    fn read_after(
        &self,
        after: Option<Pos>,
        count: usize,
    ) -> Result<Vec<(Pos, Bytes)>, CompactionError> {
        let entries = self.entries.lock();
        Ok(entries
            .iter()
            .filter(|(p, _)| after.is_none_or(|a| *p > a))
            .take(count)
            .cloned()
            .collect())
    }

    fn last_confirmed(&self) -> Option<Pos> {
        self.entries.lock().last().map(|(p, _)| *p)
    }

    fn size_after(&self, after: Option<Pos>) -> u64 {
        let entries = self.entries.lock();
        entries
            .iter()
            .filter(|(p, _)| after.is_none_or(|a| *p > a))
            .map(|(_, d)| d.len() as u64)
            .sum()
    }

    async fn new_ledger(&self) -> Result<(u64, LedgerMetadata), CompactionError> {
        Ok((1000 + self.next_ledger.fetch_add(1, Ordering::Relaxed), LedgerMetadata::local()))
    }

    async fn load_record(&self) -> Result<Option<Bytes>, CompactionError> {
        Ok(self.record.lock().clone())
    }

    async fn store_record(&self, value: Bytes) -> Result<(), CompactionError> {
        let number = self.stores.fetch_add(1, Ordering::Relaxed) + 1;
        if number == self.fail_store.load(Ordering::Relaxed) {
            return Err(CompactionError::Topic("injected: record write failed".into()));
        }
        *self.record.lock() = Some(value);
        Ok(())
    }
}

fn entry(key: &str, value: &str) -> Bytes {
    let metadata = MessageMetadata {
        partition_key: Some(key.into()),
        null_value: value.is_empty().then_some(true),
        ..Default::default()
    };
    let mut out = BytesMut::new();
    magnetar_protocol::encode_metadata_and_payload(&metadata, value.as_bytes(), &mut out)
        .expect("encodes");
    out.freeze()
}

fn batch(messages: &[(&str, &str)]) -> Bytes {
    let mut builder = magnetar_protocol::BatchBuilder::new();
    for (key, value) in messages {
        let single = magnetar_protocol::proto::SingleMessageMetadata {
            partition_key: Some((*key).into()),
            payload_size: value.len() as i32,
            ..Default::default()
        };
        builder.push(single, value.as_bytes()).expect("fits");
    }
    let metadata = MessageMetadata {
        num_messages_in_batch: Some(messages.len() as i32),
        ..Default::default()
    };
    let mut out = BytesMut::new();
    magnetar_protocol::encode_metadata_and_payload(&metadata, &builder.finish(), &mut out)
        .expect("encodes");
    out.freeze()
}

impl FakeTopic {
    fn publish(&self, data: Bytes) -> Pos {
        let mut entries = self.entries.lock();
        let position = (1, entries.len() as u64);
        entries.push((position, data));
        position
    }
}

async fn setup() -> (Arc<FakeTopic>, Arc<MemoryLedgers>, Arc<TopicCompaction>) {
    let topic = Arc::new(FakeTopic::default());
    let storage = MemoryLedgers::new();
    let compaction = TopicCompaction::load(topic.clone(), storage.clone()).await.expect("loads");
    (topic, storage, compaction)
}

/// What a compacted read from the start returns: (position, kept mask).
fn read_all(compaction: &TopicCompaction) -> Vec<(Pos, Option<Vec<u64>>)> {
    let view = compaction.view().expect("compacted");
    view.read_after(None, 1000).expect("reads").into_iter().map(|e| (e.position, e.kept)).collect()
}

async fn run(compaction: &Arc<TopicCompaction>) -> RunStatus {
    compaction.inner.lock().state.begin().expect("not running");
    compaction.run().await;
    compaction.status().0
}

#[tokio::test]
async fn a_run_keeps_the_latest_value_per_key_and_a_second_run_builds_on_the_first() {
    let (topic, storage, compaction) = setup().await;
    assert_eq!(compaction.status().0, RunStatus::NotRun);
    assert!(compaction.retention_hold().is_none(), "never compacted: holds nothing");
    topic.publish(entry("a", "1"));
    let b1 = topic.publish(entry("b", "1"));
    let a2 = topic.publish(entry("a", "2"));
    assert_eq!(run(&compaction).await, RunStatus::Success);
    assert_eq!(read_all(&compaction), vec![(b1, None), (a2, None)]);
    assert_eq!(compaction.horizon(), Some(a2));
    assert_eq!(compaction.stats().last_removed_events, 1);
    let first = compaction.view().unwrap().ledger;

    topic.publish(entry("b", "")); // deletes b
    let c1 = topic.publish(entry("c", "1"));
    assert_eq!(compaction.uncompacted_bytes(), topic.size_after(Some(a2)));
    assert_eq!(run(&compaction).await, RunStatus::Success);
    assert_eq!(read_all(&compaction), vec![(a2, None), (c1, None)]);
    assert_eq!(compaction.retention_hold(), Some(Some(c1)));
    // The first ledger went once the second took over.
    assert!(matches!(storage.info(first), Err(LedgerError::NoSuchLedger(_))));
    let record: CompactionRecord =
        serde_json::from_slice(topic.record.lock().as_ref().unwrap()).unwrap();
    assert_eq!(record.horizon, Some(c1));
    assert!(record.pending.is_empty() && record.obsolete.is_empty(), "{record:?}");
}

#[tokio::test]
async fn a_batch_is_thinned_to_its_latest_messages_and_rethinned_by_the_next_run() {
    let (topic, _storage, compaction) = setup().await;
    let first = topic.publish(batch(&[("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")]));
    assert_eq!(run(&compaction).await, RunStatus::Success);
    // Messages 1 (b), 2 (a) and 3 (c) are kept: bits 1, 2, 3.
    assert_eq!(read_all(&compaction), vec![(first, Some(vec![0b1110]))]);
    assert_eq!(compaction.view().unwrap().last_message(), Some((first, Some(3))));
    let later = topic.publish(entry("c", "2"));
    assert_eq!(run(&compaction).await, RunStatus::Success);
    assert_eq!(read_all(&compaction), vec![(first, Some(vec![0b0110])), (later, None)]);
}

#[tokio::test]
async fn a_run_that_fails_at_its_commit_leaves_the_previous_ledger_in_force() {
    let (topic, storage, compaction) = setup().await;
    let a1 = topic.publish(entry("a", "1"));
    assert_eq!(run(&compaction).await, RunStatus::Success);
    let before = compaction.view().unwrap().ledger;
    topic.publish(entry("a", "2"));
    // The run's first record write names its ledger as pending; the second, its commit, fails.
    topic.fail_store.store(topic.stores.load(Ordering::Relaxed) + 2, Ordering::Relaxed);
    assert_eq!(run(&compaction).await, RunStatus::Error);
    assert!(compaction.status().1.contains("injected"), "{:?}", compaction.status());
    assert_eq!(compaction.view().unwrap().ledger, before);
    assert_eq!(read_all(&compaction), vec![(a1, None)]);
    assert_eq!(compaction.horizon(), Some(a1));
    assert!(storage.info(before).is_ok());
    // The record still names the previous ledger; a reload serves it.
    let reloaded = TopicCompaction::load(topic.clone(), storage.clone()).await.expect("loads");
    assert_eq!(reloaded.view().unwrap().ledger, before);
    assert_eq!(read_all(&reloaded), vec![(a1, None)]);
    // And the next run succeeds.
    assert_eq!(run(&compaction).await, RunStatus::Success);
    assert_eq!(compaction.stats().last_removed_events, 1);
}

#[tokio::test]
async fn a_crash_after_the_pending_record_leaves_a_ledger_the_next_load_deletes() {
    let (topic, storage, compaction) = setup().await;
    let a1 = topic.publish(entry("a", "1"));
    assert_eq!(run(&compaction).await, RunStatus::Success);
    let committed = compaction.view().unwrap().ledger;
    // A crash mid-run: the record lists a pending ledger that holds a partial write.
    let mut record: CompactionRecord =
        serde_json::from_slice(topic.record.lock().as_ref().unwrap()).unwrap();
    storage.create(4242, &LedgerMetadata::local()).await.unwrap();
    record.pending.push(4242);
    *topic.record.lock() = Some(record.encode());

    let reloaded = TopicCompaction::load(topic.clone(), storage.clone()).await.expect("loads");
    assert_eq!(reloaded.status().0, RunStatus::Success);
    assert_eq!(reloaded.view().unwrap().ledger, committed);
    assert_eq!(read_all(&reloaded), vec![(a1, None)]);
    assert!(matches!(storage.info(4242), Err(LedgerError::NoSuchLedger(_))));
    let record: CompactionRecord =
        serde_json::from_slice(topic.record.lock().as_ref().unwrap()).unwrap();
    assert!(record.pending.is_empty(), "{record:?}");
}

#[tokio::test]
async fn one_run_at_a_time_and_an_empty_topic_compacts_to_nothing() {
    let (_topic, _storage, compaction) = setup().await;
    compaction.inner.lock().state.begin().unwrap();
    assert!(compaction.start().is_err(), "a second run is refused while one is under way");
    compaction.run().await;
    assert_eq!(compaction.status().0, RunStatus::Success);
    assert!(compaction.view().is_none());
    assert!(compaction.retention_hold().is_none());
}
