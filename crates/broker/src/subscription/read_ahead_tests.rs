//! A catching-up subscription (entries no longer in the write cache) reads ahead: everything
//! arrives once and in order, across ledgers, and from the new position after a cursor reset.
//! Reads that fail are retried by the dispatcher itself.

use super::*;
use crate::connection::OutFrame;
use crate::managed_ledger::RolloverPolicy;
use bytes::BytesMut;
use magnetar_journal::sim::SimStorage;
use magnetar_journal::JournalConfig;
use magnetar_ledger::hooked::{Hooked, StorageHooks};
use magnetar_ledger::{LedgerError, LedgerStorage, LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{MemoryStore, MetadataStore};
use magnetar_protocol::encode_metadata_and_payload;
use magnetar_protocol::proto::MessageMetadata;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::mpsc::UnboundedReceiver;

const ENTRIES: usize = 300;
const LIMITS: crate::cursor_ledger::CursorLedgerLimits =
    crate::cursor_ledger::CursorLedgerLimits { max_entries: 1_000, max_bytes: 1 << 20 };
const WAIT: Duration = Duration::from_secs(10);

fn entry(index: usize) -> Bytes {
    let metadata = MessageMetadata { producer_name: "p".into(), ..Default::default() };
    let payload = format!("message-{index}-{}", "x".repeat(500));
    let mut out = BytesMut::new();
    encode_metadata_and_payload(&metadata, payload.as_bytes(), &mut out).expect("encodable");
    out.freeze()
}

/// A topic whose backlog is far larger than the write cache, over several ledgers.
async fn topic_with_backlog() -> (Arc<ManagedLedger>, Arc<dyn MetadataStore>, Vec<Position>) {
    topic_with_backlog_over(|store| store).await
}

/// The same, its ledger store seen through `wrap`.
async fn topic_with_backlog_over(
    wrap: impl FnOnce(Arc<LedgerStore>) -> Arc<dyn LedgerStorage>,
) -> (Arc<ManagedLedger>, Arc<dyn MetadataStore>, Vec<Position>) {
    // Small segments keep the simulated fsyncs (a copy of the segment) cheap.
    let journal = JournalConfig {
        segment_size_bytes: 1 << 20,
        max_group_bytes: 256 << 10,
        ..JournalConfig::default()
    };
    let config =
        LedgerStoreConfig { journal, write_cache_bytes: 4 << 10, ..LedgerStoreConfig::default() };
    let storage = Arc::new(SimStorage::new(11));
    let store = Arc::new(LedgerStore::open_with_storage(config, storage).unwrap().0);
    let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let policy =
        RolloverPolicy { max_entries: 70, max_bytes: u64::MAX, max_age: Duration::from_secs(60) };
    let backend = crate::managed_ledger::LedgerBackend::new(wrap(store), metadata.clone());
    let ml = ManagedLedger::open("t".into(), "/ml/t".into(), &backend, metadata.clone(), policy)
        .await
        .unwrap();
    let mut positions = Vec::new();
    for index in 0..ENTRIES {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        ml.append(entry(index), move |result| {
            let _ = sender.send(result);
        })
        .unwrap();
        let appended = tokio::time::timeout(WAIT, receiver).await.expect("append completes");
        positions.push(appended.unwrap().unwrap());
    }
    let ledgers: HashSet<u64> = positions.iter().map(|p| p.ledger_id).collect();
    assert!(ledgers.len() >= 4, "the backlog spans several ledgers");
    (ml, metadata, positions)
}

/// Receives `count` MESSAGE frames: their positions and payload indexes.
async fn receive(frames: &mut UnboundedReceiver<OutFrame>, count: usize) -> Vec<(Position, usize)> {
    let mut got = Vec::new();
    while got.len() < count {
        let frame = tokio::time::timeout(WAIT, frames.recv())
            .await
            .expect("messages keep coming")
            .expect("outbox open")
            .decode();
        let Some(message) = frame.command.message else { continue };
        let payload = frame.payload.expect("a MESSAGE carries its entry").payload;
        let text = std::str::from_utf8(&payload).unwrap();
        let index: usize = text.split('-').nth(1).unwrap().parse().unwrap();
        let id = message.message_id;
        got.push((Position::new(id.ledger_id, id.entry_id), index));
    }
    got
}

/// An exclusive subscription `sub` of `ml` from its start, its cursor in a cursor ledger.
fn exclusive_subscription(
    ml: &Arc<ManagedLedger>,
    metadata: Arc<dyn MetadataStore>,
) -> Arc<Subscription> {
    Subscription::start(
        "sub".into(),
        SubType::Exclusive,
        -1,
        ml.clone(),
        Some(CursorLedger::for_test(ml, metadata, "/cursors/t/sub", LIMITS)),
        AckState::new(None),
        None,
        DispatchSettings::new(8),
    )
}

/// A consumer (connection key `key`) and the frames sent to it.
fn consumer(key: u64, consumer_id: u64) -> (ConsumerHandle, UnboundedReceiver<OutFrame>) {
    let (outbox, frames) = crate::connection::Outbox::channel();
    let handle = ConsumerHandle {
        key,
        consumer_id,
        name: "c".into(),
        priority: 0,
        outbox,
        info: Default::default(),
        read_compacted: false,
    };
    (handle, frames)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_reads_ahead_and_delivers_everything_once_in_order() {
    let (ml, metadata, positions) = topic_with_backlog().await;
    let subscription = exclusive_subscription(&ml, metadata);
    let (handle, mut frames) = consumer(1, 7);
    subscription.add_consumer(handle, SubType::Exclusive, None).unwrap();

    // Permits in small steps, like a client's FLOW at half its queue: every round after the
    // first can be served from what was read ahead.
    let mut got = Vec::new();
    while got.len() < 200 {
        subscription.flow(1, 10);
        got.extend(receive(&mut frames, 10).await);
    }
    let expected: Vec<(Position, usize)> = positions.iter().copied().zip(0..).take(200).collect();
    assert_eq!(got, expected, "every entry once, in order");

    // Back to entry 50: what was read ahead beyond 200 must not be sent.
    subscription
        .reset_cursor(previous_position(&subscription.managed_ledger.ledgers(), positions[50]))
        .await
        .unwrap();
    let (handle, mut frames) = consumer(2, 8);
    subscription.add_consumer(handle, SubType::Exclusive, None).unwrap();
    let mut got = Vec::new();
    while got.len() < ENTRIES - 50 {
        subscription.flow(2, 25);
        got.extend(receive(&mut frames, 25).await);
    }
    let expected: Vec<(Position, usize)> = positions.iter().copied().zip(0..).skip(50).collect();
    assert_eq!(got, expected, "the stream restarts at the reset position");
}

/// Reads fail while `failing` is set (as with storage nodes frozen or cut off), counted.
#[derive(Default)]
struct FailingReads {
    failing: AtomicBool,
    failed: AtomicU64,
}

impl StorageHooks for FailingReads {
    fn on_read(&self, ledger: u64) -> Result<(), LedgerError> {
        if !self.failing.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.failed.fetch_add(1, Ordering::SeqCst);
        Err(LedgerError::Unavailable(format!("ledger {ledger}: no replica answered (test)")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_is_retried_by_the_dispatcher_without_a_new_flow_or_publish() {
    let hooks = Arc::new(std::sync::OnceLock::new());
    let keep = hooks.clone();
    let (ml, metadata, positions) = topic_with_backlog_over(move |store| {
        let hooked = Hooked::new(store, FailingReads::default());
        let _ = keep.set(hooked.clone());
        hooked
    })
    .await;
    let storage: Arc<Hooked<FailingReads>> = hooks.get().expect("wrapped").clone();
    let subscription = exclusive_subscription(&ml, metadata);
    let (handle, mut frames) = consumer(1, 7);
    storage.hooks.failing.store(true, Ordering::SeqCst);
    subscription.add_consumer(handle, SubType::Exclusive, None).unwrap();
    subscription.flow(1, 20);
    // The dispatcher tries, fails, and tries again by itself (backing off).
    let deadline = tokio::time::Instant::now() + WAIT;
    while storage.hooks.failed.load(Ordering::SeqCst) < 3 {
        assert!(tokio::time::Instant::now() < deadline, "the dispatcher stopped trying");
        // The dispatcher's retries run on their own clock: nothing to await but the count.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while let Ok(frame) = frames.try_recv() {
        assert!(frame.decode().command.message.is_none(), "nothing to send while reads fail");
    }
    // Storage answers again: the permits given before are used, with no FLOW or publish since.
    storage.hooks.failing.store(false, Ordering::SeqCst);
    let got = receive(&mut frames, 20).await;
    let expected: Vec<(Position, usize)> = positions.iter().copied().zip(0..).take(20).collect();
    assert_eq!(got, expected, "delivered once storage answers, in order");
}

#[test]
fn dispatch_retries_back_off_from_100_ms_to_10_s() {
    let waits: Vec<u64> = (1..=10).map(dispatch_retry_backoff).collect();
    assert_eq!(waits, [100, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000, 10_000]);
}
