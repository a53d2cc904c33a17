//! The admin operations on a real topic (ledger store on a simulated disk): stats and backlog
//! arithmetic, skip / clear backlog / reset, peek positions, terminate and unload.

use super::*;
use crate::cursor::Position;
use crate::service::BrokerService;
use crate::stats::ClientInfo;
use crate::subscription::ConsumerHandle;
use bytes::Bytes;
use magnetar_journal::sim::SimStorage;
use magnetar_journal::JournalConfig;
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use magnetar_metadata::MemoryStore;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_ack::AckType;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// A stored entry as a producer writes it (metadata, then the payload).
fn entry() -> Bytes {
    let metadata = magnetar_protocol::proto::MessageMetadata {
        producer_name: "p".into(),
        publish_time: 1_000,
        ..Default::default()
    };
    magnetar_protocol::metadata_and_payload(&metadata, b"payload").unwrap()
}

fn size() -> u64 {
    entry().len() as u64
}

fn broker(seed: u64) -> Arc<BrokerService> {
    let journal = JournalConfig {
        segment_size_bytes: 1 << 20,
        max_group_bytes: 256 << 10,
        ..JournalConfig::default()
    };
    let config = LedgerStoreConfig { journal, ..LedgerStoreConfig::default() };
    let store = LedgerStore::open_with_storage(config, Arc::new(SimStorage::new(seed))).unwrap().0;
    BrokerService::new(BrokerConfig::default(), Arc::new(store), Arc::new(MemoryStore::new()))
}

async fn publish(topic: &Topic, count: usize) -> Vec<Position> {
    let mut positions = Vec::new();
    for _ in 0..count {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        topic
            .managed_ledger
            .append(entry(), move |result| {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_the_backlog_from_the_mark_delete_and_the_acked_ranges() {
    let broker = broker(21);
    let name = BrokerService::topic_name("persistent://public/default/stats").unwrap();
    let topic = broker.topic(&name, true).await.unwrap();
    assert!(topic.create_subscription("s", SubscriptionStart::Earliest).await.unwrap());
    assert!(!topic.create_subscription("s", SubscriptionStart::Latest).await.unwrap());
    let positions = publish(&topic, 10).await;
    let sub = topic.existing_subscription("s").unwrap();

    let stats = topic.stats();
    assert_eq!(stats.storage_size, 10 * size());
    assert_eq!(stats.subscriptions["s"].msg_backlog, 10);
    assert_eq!(stats.backlog_size, 10 * size(), "the whole topic is unread");
    let internal = topic.internal_stats();
    assert_eq!((internal.number_of_entries, internal.entries_added_counter), (10, 10));
    assert_eq!(internal.state, "LedgerOpened");
    let last = positions[9];
    assert_eq!(internal.last_confirmed_entry, format!("{}:{}", last.ledger_id, last.entry_id));
    let cursor = &internal.cursors["s"];
    assert_eq!(cursor.mark_delete_position, format!("{}:-1", positions[0].ledger_id));
    assert_eq!(cursor.individually_deleted_messages, "[]");

    // Two holes: entries 2 and 4 acknowledged.
    sub.ack(None, AckType::Individual, &[id(positions[2]), id(positions[4])]).unwrap();
    let stats = sub.stats(&topic.managed_ledger.ledgers(), &topic.managed_ledger.ledger_stats());
    assert_eq!(stats.msg_backlog, 8);
    assert_eq!(stats.non_contiguous_deleted_messages_ranges, 2);
    let l = positions[0].ledger_id;
    let cursor = &topic.internal_stats().cursors["s"];
    assert_eq!(cursor.individually_deleted_messages, format!("[({l}:1..{l}:2], ({l}:3..{l}:4]]"));
    // Peek counts unacknowledged entries only.
    assert_eq!(sub.nth_unacked(1), Some(positions[0]));
    assert_eq!(sub.nth_unacked(3), Some(positions[3]));
    assert_eq!(sub.nth_unacked(9), None);
    assert_eq!(sub.nth_unacked(0), None);

    // Skip 3 unacknowledged: 0, 1, 3 (the mark-delete moves through 4).
    assert_eq!(sub.skip(3).unwrap(), 3);
    assert_eq!(sub.mark_delete(), Some(positions[4]));
    assert_eq!(sub.backlog(&topic.managed_ledger.ledgers()), 5);
    assert_eq!(topic.stats().backlog_size, 5 * size());
    sub.clear_backlog().unwrap();
    assert_eq!(sub.backlog(&topic.managed_ledger.ledgers()), 0);
    assert_eq!(topic.stats().backlog_size, 0);

    // Reset to entry 6: delivered next, so 6..9 are the backlog; excluded: 7..9.
    topic.reset_subscription("s", SubscriptionStart::At(positions[6])).await.unwrap();
    assert_eq!(sub.backlog(&topic.managed_ledger.ledgers()), 4);
    topic.reset_subscription("s", SubscriptionStart::After(positions[6])).await.unwrap();
    assert_eq!(sub.backlog(&topic.managed_ledger.ledgers()), 3);
    topic.reset_subscription("s", SubscriptionStart::Earliest).await.unwrap();
    assert_eq!(sub.backlog(&topic.managed_ledger.ledgers()), 10);
    // A subscription created at an entry starts there.
    topic.create_subscription("mid", SubscriptionStart::At(positions[7])).await.unwrap();
    let mid = topic.existing_subscription("mid").unwrap();
    assert_eq!(mid.backlog(&topic.managed_ledger.ledgers()), 3);

    // Examine counts from either end.
    assert_eq!(topic.examine_position(ExaminePosition::Earliest, 1), Some(positions[0]));
    assert_eq!(topic.examine_position(ExaminePosition::Latest, 1), Some(positions[9]));
    assert_eq!(topic.examine_position(ExaminePosition::Latest, 10), Some(positions[0]));
    assert_eq!(topic.examine_position(ExaminePosition::Latest, 11), None);
    assert_eq!(topic.read_entry(positions[3]).await.unwrap().as_deref(), Some(&entry()[..]));
    assert_eq!(topic.read_entry(Position::new(l, 99)).await.unwrap(), None);

    // Unsubscribe: refused with consumers unless forced.
    let (outbox, _frames) = crate::connection::Outbox::channel();
    let handle = ConsumerHandle {
        key: 1,
        consumer_id: 1,
        name: "c".into(),
        priority: 0,
        outbox,
        info: Default::default(),
        read_compacted: false,
    };
    mid.add_consumer(handle, SubType::Exclusive, None).unwrap();
    assert!(matches!(topic.unsubscribe("mid", false).await, Err(BrokerError::NotAllowed(_))));
    topic.unsubscribe("mid", true).await.unwrap();
    assert!(matches!(
        topic.unsubscribe("mid", false).await,
        Err(BrokerError::SubscriptionNotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_seals_the_topic_tells_consumers_at_the_end_and_survives_an_unload() {
    let broker = broker(22);
    let name = BrokerService::topic_name("persistent://public/default/term").unwrap();
    let topic = broker.topic(&name, true).await.unwrap();
    let sub = topic.subscription("s", SubType::Exclusive, true, StartAt::Earliest).await.unwrap();
    let (outbox, mut frames) = crate::connection::Outbox::channel();
    let info = Arc::new(ClientInfo::new("127.0.0.1:1", "Pulsar-Java-v4.0.8", 0));
    let handle = ConsumerHandle {
        key: 7,
        consumer_id: 70,
        name: "c".into(),
        priority: 0,
        outbox,
        info,
        read_compacted: false,
    };
    sub.add_consumer(handle, SubType::Exclusive, None).unwrap();
    sub.announce(7);
    sub.flow(7, 100);
    let positions = publish(&topic, 3).await;

    assert_eq!(topic.terminate().await.unwrap(), Some(positions[2]));
    assert_eq!(topic.terminate().await.unwrap(), Some(positions[2]), "again: the same");
    let refused = topic.managed_ledger.append(entry(), |_| {});
    assert!(matches!(refused, Err(BrokerError::TopicTerminated(_))), "{refused:?}");
    let client = ProducerClient::new(1, crate::connection::Outbox::channel().0, Default::default());
    let producer =
        topic.add_producer("p".into(), 1, ProducerAccessMode::Shared, None, client, || {}).await;
    assert!(matches!(producer, Err(BrokerError::TopicTerminated(_))), "{producer:?}");
    assert_eq!(topic.internal_stats().state, "Terminated");

    // The consumer gets the three messages, then REACHED_END_OF_TOPIC.
    let mut kinds = Vec::new();
    while !kinds.contains(&Type::ReachedEndOfTopic) {
        let frame = tokio::time::timeout(WAIT, frames.recv()).await.unwrap().unwrap().decode();
        kinds.push(magnetar_protocol::commands::command_type(&frame.command).unwrap());
    }
    let messages = kinds.iter().filter(|k| **k == Type::Message).count();
    assert_eq!(messages, 3, "{kinds:?}");
    assert_eq!(kinds.last(), Some(&Type::ReachedEndOfTopic));
    assert_eq!(topic.stats().subscriptions["s"].msg_out_counter, 3);

    // Unloaded and loaded again: still terminated, the subscription kept.
    assert!(broker.unload_topic(&name).await.unwrap());
    assert!(!broker.unload_topic(&name).await.unwrap(), "not loaded any more");
    let reloaded = broker.topic(&name, false).await.unwrap();
    assert!(!Arc::ptr_eq(&reloaded, &topic));
    assert!(reloaded.managed_ledger.is_terminated());
    assert_eq!(reloaded.last_message_id(), (positions[2].ledger_id, positions[2].entry_id as i64));
    assert_eq!(reloaded.subscription_names(), vec!["s".to_string()]);
    assert!(matches!(
        reloaded.managed_ledger.append(entry(), |_| {}),
        Err(BrokerError::TopicTerminated(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_messages_are_counted_per_topic_and_producer() {
    let broker = broker(23);
    let name = BrokerService::topic_name("persistent://public/default/meters").unwrap();
    let topic = broker.topic(&name, true).await.unwrap();
    let info = Arc::new(ClientInfo::new("10.0.0.1:5000", "Pulsar-Go-v0.19.0", 1_000));
    let client = ProducerClient::new(3, crate::connection::Outbox::channel().0, info);
    topic
        .add_producer("p".into(), 9, ProducerAccessMode::Shared, None, client.clone(), || {})
        .await
        .unwrap();
    // (The connection records each SEND on both meters.)
    client.info.meter.record(4, 400);
    topic.in_meter.record(4, 400);
    let stats = topic.stats();
    assert_eq!((stats.msg_in_counter, stats.bytes_in_counter), (4, 400));
    let publisher = &stats.publishers[0];
    assert_eq!((publisher.producer_name.as_str(), publisher.producer_id), ("p", 3));
    assert_eq!((publisher.msg_in_counter, publisher.access_mode.as_str()), (4, "Shared"));
    assert_eq!(publisher.address, "/10.0.0.1:5000");
    assert_eq!(publisher.client_version, "Pulsar-Go-v0.19.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_history_samples_backlog_storage_and_counters() {
    let broker = broker(31);
    let name = BrokerService::topic_name("persistent://public/default/sampled").unwrap();
    let topic = broker.topic(&name, true).await.unwrap();
    assert!(topic.create_subscription("s", SubscriptionStart::Earliest).await.unwrap());
    publish(&topic, 6).await;
    // (The connection records each SEND on the topic's meter.)
    topic.in_meter.record(6, 6 * size());

    let sample = topic.history_sample();
    assert_eq!(sample.name, "persistent://public/default/sampled");
    assert_eq!((sample.backlog, sample.storage_size), (6, 6 * size()));
    assert_eq!((sample.counters.msg_in, sample.counters.bytes_in), (6, 6 * size()));
    assert_eq!((sample.subscriptions, sample.consumers, sample.producers), (1, 0, 0));

    crate::history::sample(&broker);
    topic.existing_subscription("s").unwrap().clear_backlog().unwrap();
    crate::history::sample(&broker);
    let history = broker.history.lock();
    let backlog: Vec<u64> = history.totals().points.iter().map(|p| p.msg_backlog).collect();
    assert_eq!(backlog, vec![6, 0]);
    assert_eq!(history.topic(&topic.full_name).points.len(), 2);
    assert_eq!(history.totals().points[1].topics, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unload_closes_the_topic_s_ledger_and_each_cursor_ledger() {
    let broker = broker(29);
    let name = BrokerService::topic_name("persistent://public/default/unload-closes").unwrap();
    let topic = broker.topic(&name, true).await.unwrap();
    let sub = topic.subscription("s", SubType::Exclusive, true, StartAt::Earliest).await.unwrap();
    let positions = publish(&topic, 3).await;
    sub.ack(None, AckType::Cumulative, &[id(positions[1])]).unwrap();
    sub.persist_now().await.unwrap();
    // (The stats show -1 while the ack's own persist holds the cursor.)
    let deadline = tokio::time::Instant::now() + WAIT;
    let cursor_ledger = loop {
        if let Ok(id) = u64::try_from(topic.internal_stats().cursors["s"].cursor_ledger) {
            break id;
        }
        assert!(tokio::time::Instant::now() < deadline, "the subscription has a cursor ledger");
        tokio::task::yield_now().await;
    };
    let storage = topic.managed_ledger.backend().storage.clone();
    assert!(!storage.info(cursor_ledger).unwrap().closed);

    assert!(broker.unload_topic(&name).await.unwrap());
    let info = storage.info(positions[0].ledger_id).unwrap();
    assert!(info.closed && info.entries == 3, "the topic's ledger: {info:?}");
    let info = storage.info(cursor_ledger).unwrap();
    assert!(info.closed, "the cursor ledger: {info:?}");

    // Loaded again: the acknowledgement persisted by the unload is there.
    let reloaded = broker.topic(&name, false).await.unwrap();
    let sub =
        reloaded.subscription("s", SubType::Exclusive, true, StartAt::Earliest).await.unwrap();
    assert_eq!(sub.mark_delete(), Some(positions[1]));
}
