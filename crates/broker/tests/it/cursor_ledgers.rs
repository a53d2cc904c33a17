//! Durable subscriptions keep their acknowledgement state in cursor ledgers: acks append to the
//! ledger and write no metadata, a restart loads the state (and moves to a fresh ledger), and
//! unsubscribing or deleting the topic leaves no cursor ledger behind.

use bytes::Bytes;
use magnetar_broker::cursor::{CursorRecord, Position};
use magnetar_broker::topic::{StartAt, Topic};
use magnetar_broker::{BrokerConfig, BrokerService};
use magnetar_journal::sim::SimStorage;
use magnetar_journal::JournalConfig;
use magnetar_ledger::{LedgerError, LedgerStorage, LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{CountingStore, MemoryStore, MetadataStore};
use magnetar_protocol::proto::command_ack::AckType;
use magnetar_protocol::proto::command_subscribe::SubType;
use magnetar_protocol::proto::MessageIdData;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);
const CURSOR_KEY: &str = "/cursors/persistent/public/default/acks/s";

async fn publish(topic: &Topic, count: usize) -> Vec<Position> {
    let mut positions = Vec::new();
    for _ in 0..count {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        topic
            .managed_ledger
            .append(Bytes::from_static(b"entry"), move |result| {
                let _ = sender.send(result);
            })
            .unwrap();
        positions.push(tokio::time::timeout(WAIT, receiver).await.unwrap().unwrap().unwrap());
    }
    positions
}

fn id(position: Position) -> MessageIdData {
    MessageIdData {
        ledger_id: position.ledger_id,
        entry_id: position.entry_id,
        ..Default::default()
    }
}

async fn record(metadata: &dyn MetadataStore) -> Option<CursorRecord> {
    let found = metadata.get(CURSOR_KEY).await.unwrap()?;
    Some(CursorRecord::decode(&found.value).unwrap())
}

/// Ledgers on a simulated disk. (Not `MemoryLedgers`: its appends complete inside the call, and
/// the managed ledger appends under a lock its completion takes.)
fn storage(seed: u64) -> Arc<LedgerStore> {
    // Small segments keep the simulated fsyncs (a copy of the segment) cheap.
    let journal = JournalConfig {
        segment_size_bytes: 1 << 20,
        max_group_bytes: 256 << 10,
        ..JournalConfig::default()
    };
    let config = LedgerStoreConfig { journal, ..LedgerStoreConfig::default() };
    let disk = Arc::new(SimStorage::new(seed));
    Arc::new(LedgerStore::open_with_storage(config, disk).unwrap().0)
}

fn exists(storage: &LedgerStore, ledger: u64) -> bool {
    match storage.info(ledger) {
        Ok(_) => true,
        Err(LedgerError::NoSuchLedger(_)) => false,
        Err(error) => panic!("{error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_go_to_the_cursor_ledger_and_survive_a_restart_and_unsubscribe_removes_it() {
    let storage = storage(1);
    let counting = Arc::new(CountingStore::new(Arc::new(MemoryStore::new())));
    let metadata: Arc<dyn MetadataStore> = counting.clone();
    let name = BrokerService::topic_name("persistent://public/default/acks").unwrap();
    let broker = BrokerService::new(BrokerConfig::default(), storage.clone(), metadata.clone());
    let topic = broker.topic(&name, true).await.unwrap();
    let sub = topic.subscription("s", SubType::Shared, true, StartAt::Earliest).await.unwrap();
    let positions = publish(&topic, 200).await;
    let first_ledger = record(&*metadata).await.expect("a new subscription's record").ledger;
    assert!(exists(&storage, first_ledger));

    // Steady state: 100 ack batches (every other entry: holes), each with a receipt.
    let writes = counting.writes();
    for position in positions.iter().step_by(2) {
        let ticket = sub.ack(None, AckType::Individual, &[id(*position)]).unwrap();
        tokio::time::timeout(WAIT, sub.persisted(ticket)).await.unwrap().unwrap();
    }
    assert_eq!(counting.writes(), writes, "acks write no metadata");
    let ticket = sub.ack(None, AckType::Individual, &[id(positions[1])]).unwrap();
    tokio::time::timeout(WAIT, sub.persisted(ticket)).await.unwrap().unwrap();
    assert_eq!(sub.mark_delete(), Some(positions[2]));

    // A restart (another broker on the same storage and store) loads the state from the
    // ledger, fencing it, and moves to a ledger of its own.
    let restarted = BrokerService::new(BrokerConfig::default(), storage.clone(), metadata.clone());
    let reloaded = restarted.topic(&name, true).await.unwrap();
    assert_eq!(reloaded.subscription_names(), vec!["s".to_string()]);
    let sub2 = reloaded.subscription("s", SubType::Shared, true, StartAt::Earliest).await.unwrap();
    assert_eq!(sub2.mark_delete(), Some(positions[2]), "the holes' state came back");
    let second_ledger = record(&*metadata).await.unwrap().ledger;
    assert_ne!(second_ledger, first_ledger);
    assert!(!exists(&storage, first_ledger), "the loaded ledger is deleted");
    // The first broker's next persist is refused: its topic is fenced.
    let late = sub.ack(None, AckType::Individual, &[id(positions[3])]).unwrap();
    assert!(tokio::time::timeout(WAIT, sub.persisted(late)).await.unwrap().is_err());
    assert!(topic.is_fenced());

    reloaded.remove_subscription("s", true).await.unwrap();
    assert!(!exists(&storage, second_ledger), "unsubscribe deletes the cursor ledger");
    assert!(record(&*metadata).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_topic_deletes_its_cursor_ledgers() {
    let storage = storage(2);
    let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let name = BrokerService::topic_name("persistent://public/default/acks").unwrap();
    let broker = BrokerService::new(BrokerConfig::default(), storage.clone(), metadata.clone());
    let topic = broker.topic(&name, true).await.unwrap();
    topic.subscription("s", SubType::Exclusive, true, StartAt::Earliest).await.unwrap();
    let ledger = record(&*metadata).await.unwrap().ledger;
    assert!(broker.delete_topic(&name, true).await.unwrap());
    assert!(!exists(&storage, ledger));
    assert!(record(&*metadata).await.is_none());
}
