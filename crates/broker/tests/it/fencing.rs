//! Two brokers on one metadata store and one ledger storage: the one that loaded a topic last
//! owns it, and the other's next write (a cursor-ledger append the loader fenced, or a metadata
//! compare-and-set) is refused and fences its copy instead of overwriting.

use bytes::Bytes;
use magnetar_broker::topic::StartAt;
use magnetar_broker::{BrokerConfig, BrokerError, BrokerService};
use magnetar_journal::sim::SimStorage;
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{MemoryStore, MetadataStore};
use magnetar_protocol::proto::command_subscribe::SubType;
use std::sync::Arc;

/// A broker over `storage` and `metadata`: brokers of a cluster share both (the ledgers are on
/// replicated storage), so a new owner can fence the ledgers the old one writes.
fn broker(storage: &Arc<LedgerStore>, metadata: &Arc<dyn MetadataStore>) -> Arc<BrokerService> {
    BrokerService::new(BrokerConfig::default(), storage.clone(), metadata.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_owner_is_fenced_by_the_new_owners_writes() {
    let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let storage = Arc::new(
        LedgerStore::open_with_storage(LedgerStoreConfig::default(), Arc::new(SimStorage::new(1)))
            .unwrap()
            .0,
    );
    let (old, new) = (broker(&storage, &metadata), broker(&storage, &metadata));
    let name = BrokerService::topic_name("persistent://public/default/owned").unwrap();
    let cursor_key = "/cursors/persistent/public/default/owned/s";

    let old_topic = old.topic(&name, true).await.unwrap();
    let old_sub =
        old_topic.subscription("s", SubType::Exclusive, true, StartAt::Earliest).await.unwrap();

    // A second broker takes the topic over: it loads what the first wrote and writes on.
    let new_topic = new.topic(&name, true).await.unwrap();
    let new_sub =
        new_topic.subscription("s", SubType::Exclusive, true, StartAt::Earliest).await.unwrap();
    new_sub.persist_now().await.unwrap();
    let written_by_new = metadata.get(cursor_key).await.unwrap().unwrap();

    // The old owner's next cursor write finds its cursor ledger fenced (or gone: the new owner
    // rolled over to its own and deleted it, and the old owner's rollover then loses the
    // compare-and-set): fenced, nothing overwritten.
    let lost = old_sub.persist_now().await;
    assert!(matches!(lost, Err(BrokerError::Fenced(_))), "{lost:?}");
    assert!(old_topic.is_fenced());
    assert_eq!(metadata.get(cursor_key).await.unwrap().unwrap(), written_by_new);
    // Its appends are refused from now on, and its subscriptions are closed.
    let append = old_topic.managed_ledger.append(Bytes::from_static(b"late"), |_| {});
    assert!(matches!(append, Err(BrokerError::Fenced(_))), "{append:?}");
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !old_topic.subscription_names().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await; // polled: no event says "closed"
        }
    })
    .await;
    assert!(closed.is_ok(), "the fenced topic's subscriptions were not closed");

    // The new owner is not affected, and the old broker reloads the topic on next use.
    assert!(!new_topic.is_fenced());
    let reloaded = old.topic(&name, true).await.unwrap();
    assert!(!Arc::ptr_eq(&reloaded, &old_topic), "a fenced topic must be loaded afresh");
}
