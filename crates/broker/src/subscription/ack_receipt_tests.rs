//! An acknowledgement's receipt waits for the cursor write that covers it.

const LIMITS: crate::cursor_ledger::CursorLedgerLimits =
    crate::cursor_ledger::CursorLedgerLimits { max_entries: 1_000, max_bytes: 1 << 20 };

use super::*;
use crate::managed_ledger::RolloverPolicy;
use async_trait::async_trait;
use magnetar_journal::sim::SimStorage;
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{InterceptedStore, Interceptor, MemoryStore, MetadataStore, Operation};
use magnetar_protocol::proto::MessageIdData;
use tokio::sync::Semaphore;

/// Cursor writes wait for a permit: the test decides when they land.
struct CursorGate(Semaphore);

#[async_trait]
impl Interceptor for CursorGate {
    async fn before(&self, operation: Operation<'_>) -> magnetar_metadata::Result<()> {
        if let Operation::Put(key) = operation {
            if key.starts_with("/cursors/") {
                self.0.acquire().await.expect("gate open").forget();
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_receipt_waits_for_the_cursor_write() {
    let storage = SimStorage::new(7);
    let store = Arc::new(
        LedgerStore::open_with_storage(LedgerStoreConfig::default(), Arc::new(storage)).unwrap().0,
    );
    let gated = Arc::new(InterceptedStore {
        inner: MemoryStore::new(),
        interceptor: CursorGate(Semaphore::new(0)),
    });
    let metadata: Arc<dyn MetadataStore> = gated.clone();
    let policy =
        RolloverPolicy { max_entries: 100, max_bytes: u64::MAX, max_age: Duration::from_secs(60) };
    let ml = ManagedLedger::open(
        "t".into(),
        "/managed-ledgers/t".into(),
        &crate::managed_ledger::LedgerBackend::new(store, metadata.clone()),
        metadata.clone(),
        policy,
    )
    .await
    .unwrap();
    let (sender, receiver) = tokio::sync::oneshot::channel();
    ml.append(Bytes::from_static(b"entry"), move |result| {
        let _ = sender.send(result);
    })
    .unwrap();
    let position = tokio::time::timeout(Duration::from_secs(10), receiver)
        .await
        .expect("append completes")
        .unwrap()
        .unwrap();
    let cursor_key = "/cursors/t/sub".to_string();
    let subscription = Subscription::start(
        "sub".into(),
        SubType::Shared,
        -1,
        ml.clone(),
        Some(CursorLedger::for_test(&ml, metadata.clone(), &cursor_key, LIMITS)),
        AckState::new(None),
        None,
        DispatchSettings::new(10),
    );
    let id = MessageIdData {
        ledger_id: position.ledger_id,
        entry_id: position.entry_id,
        ..Default::default()
    };
    let ticket = subscription.ack(None, AckType::Individual, &[id]).unwrap();
    let waiting = tokio::spawn({
        let subscription = subscription.clone();
        async move { subscription.persisted(ticket).await }
    });
    // The cursor write is held at the gate: the receipt must not be ready. (A bounded wait that
    // is expected to run out: nothing can complete it while the gate is shut.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "receipt sent before the cursor was written");
    assert!(metadata.get(&cursor_key).await.unwrap().is_none());

    gated.interceptor.0.add_permits(1);
    let result = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("receipt once the write lands")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    let stored = metadata.get(&cursor_key).await.unwrap().expect("cursor written");
    let record = crate::cursor::CursorRecord::decode(&stored.value).unwrap();
    assert!(record.snapshot().is_acked(position), "the record's snapshot holds the ack");

    // Later acks go to the cursor ledger alone: with the gate shut, their receipts still come.
    let (sender, receiver) = tokio::sync::oneshot::channel();
    subscription
        .managed_ledger
        .append(Bytes::from_static(b"second"), move |result| {
            let _ = sender.send(result);
        })
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), receiver)
        .await
        .expect("append completes")
        .unwrap()
        .unwrap();
    let id = MessageIdData {
        ledger_id: second.ledger_id,
        entry_id: second.entry_id,
        ..Default::default()
    };
    let ticket = subscription.ack(None, AckType::Individual, &[id]).unwrap();
    tokio::time::timeout(Duration::from_secs(10), subscription.persisted(ticket))
        .await
        .expect("no metadata write on the ack path")
        .unwrap();
    assert_eq!(metadata.get(&cursor_key).await.unwrap().unwrap().version, stored.version);
}
