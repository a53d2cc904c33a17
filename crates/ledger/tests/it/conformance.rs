//! The ledger API's semantics (`api.rs`), checked against every implementation: the local
//! store (over the simulated disk) and the in-memory ledgers.

use bytes::Bytes;
use magnetar_journal::sim::SimStorage;
use magnetar_ledger::{
    LedgerError, LedgerMetadata, LedgerStorage, LedgerStore, LedgerStoreConfig, MemoryLedgers,
};
use std::sync::Arc;
use std::time::Duration;

fn implementations() -> Vec<(&'static str, Arc<dyn LedgerStorage>)> {
    let store =
        LedgerStore::open_with_storage(LedgerStoreConfig::default(), Arc::new(SimStorage::new(5)))
            .unwrap()
            .0;
    vec![("local store", Arc::new(store)), ("memory", MemoryLedgers::new())]
}

/// Appends `entry` and waits until it is durable.
async fn append(storage: &dyn LedgerStorage, ledger: u64, entry: u64, data: &'static [u8]) -> u64 {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    storage
        .append(
            ledger,
            entry,
            Bytes::from_static(data),
            Box::new(move |result| {
                let _ = sender.send(result);
            }),
        )
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), receiver).await.unwrap().unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_the_callers_and_unique() {
    for (name, storage) in implementations() {
        storage.create(1_000, &LedgerMetadata::local()).await.unwrap();
        let again = storage.create(1_000, &LedgerMetadata::local()).await;
        assert!(matches!(again, Err(LedgerError::LedgerExists(1_000))), "{name}: {again:?}");
        storage.create(7, &LedgerMetadata::local()).await.unwrap();
        assert_eq!(storage.info(7).unwrap().entries, 0, "{name}");
        let bad = LedgerMetadata { ack_quorum: 2, ..LedgerMetadata::local() };
        assert!(storage.create(8, &bad).await.is_err(), "{name}: Qa > Qw accepted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_assigned_entry_ids_keep_entries_dense() {
    for (name, storage) in implementations() {
        storage.create(3, &LedgerMetadata::local()).await.unwrap();
        assert_eq!(storage.last_add_confirmed(3).unwrap(), None, "{name}");
        assert_eq!(append(&*storage, 3, 0, b"a").await, 0, "{name}");
        assert_eq!(append(&*storage, 3, 1, b"b").await, 1, "{name}");
        let skip = storage.append(3, 5, Bytes::from_static(b"x"), Box::new(|_| {}));
        assert!(
            matches!(skip, Err(LedgerError::UnexpectedEntryId { expected: 2, given: 5, .. })),
            "{name}: {skip:?}"
        );
        let repeat = storage.append(3, 1, Bytes::from_static(b"x"), Box::new(|_| {}));
        assert!(matches!(repeat, Err(LedgerError::UnexpectedEntryId { .. })), "{name}");
        assert_eq!(storage.last_add_confirmed(3).unwrap(), Some(1), "{name}");
        assert_eq!(storage.read(3, 0, 1).unwrap(), vec![Bytes::from("a"), Bytes::from("b")]);
        let beyond = storage.read(3, 1, 2);
        assert!(matches!(beyond, Err(LedgerError::NoSuchEntry { .. })), "{name}: {beyond:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_and_close_stop_appends_and_report_the_count() {
    for (name, storage) in implementations() {
        storage.create(4, &LedgerMetadata::local()).await.unwrap();
        append(&*storage, 4, 0, b"a").await;
        assert_eq!(storage.fence(4).await.unwrap(), 1, "{name}");
        assert_eq!(storage.fence(4).await.unwrap(), 1, "{name}: fence is idempotent");
        let refused = storage.append(4, 1, Bytes::from_static(b"b"), Box::new(|_| {}));
        assert!(matches!(refused, Err(LedgerError::Fenced(4))), "{name}: {refused:?}");
        assert!(storage.info(4).unwrap().fenced, "{name}");
        assert_eq!(storage.read(4, 0, 0).unwrap(), vec![Bytes::from("a")], "{name}");

        storage.create(5, &LedgerMetadata::local()).await.unwrap();
        append(&*storage, 5, 0, b"a").await;
        append(&*storage, 5, 1, b"b").await;
        assert_eq!(storage.close(5).await.unwrap(), 2, "{name}");
        assert_eq!(storage.close(5).await.unwrap(), 2, "{name}: close is idempotent");
        assert!(storage.info(5).unwrap().closed, "{name}");
        assert!(storage.append(5, 2, Bytes::from_static(b"c"), Box::new(|_| {})).is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_forgets_the_ledger() {
    for (name, storage) in implementations() {
        storage.create(6, &LedgerMetadata::local()).await.unwrap();
        append(&*storage, 6, 0, b"a").await;
        storage.delete(6).await.unwrap();
        assert!(matches!(storage.info(6), Err(LedgerError::NoSuchLedger(6))), "{name}");
        assert!(storage.read(6, 0, 0).is_err(), "{name}");
        assert!(matches!(storage.delete(6).await, Err(LedgerError::NoSuchLedger(6))), "{name}");
    }
}
