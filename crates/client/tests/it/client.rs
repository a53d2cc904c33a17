//! Round trips against a real Magnetar broker.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{start_broker, WAIT};
use magnetar_client::{
    partition_for_key, Client, Compression, InitialPosition, Message, MessageId, ProducerMessage,
    SubType,
};
use tokio::time::timeout;

const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Lz4,
    Compression::Zlib,
    Compression::Zstd,
    Compression::Snappy,
];

async fn recv(consumer: &mut magnetar_client::Consumer) -> Message {
    timeout(WAIT, consumer.receive()).await.expect("receive timed out").expect("receive")
}

#[tokio::test]
async fn round_trip_every_codec_with_and_without_batching() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    for batching in [false, true] {
        for codec in CODECS {
            let topic = format!("rt-{codec:?}-{batching}").to_lowercase();
            let mut consumer = client
                .consumer(&topic)
                .subscription("s")
                .initial_position(InitialPosition::Earliest)
                .receiver_queue(10)
                .subscribe()
                .await
                .unwrap();
            let mut builder = client.producer(&topic).name(format!("p-{topic}")).compression(codec);
            if batching {
                builder = builder.batching(50, 64 * 1024, Duration::from_millis(20));
            }
            let producer = builder.create().await.unwrap();
            let mut receipts = Vec::new();
            for i in 0..200u32 {
                let payload = format!("{codec:?} message {i} {}", "x".repeat(i as usize % 50));
                let msg = ProducerMessage::new(payload)
                    .key(format!("k{}", i % 7))
                    .property("i", i.to_string())
                    .event_time(1_000 + u64::from(i));
                receipts.push(producer.send_async(msg).await.unwrap());
            }
            let mut ids = Vec::new();
            for r in receipts {
                ids.push(timeout(WAIT, r).await.unwrap().unwrap());
            }
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in order");
            if batching {
                assert!(ids.iter().any(|id| id.batch_size > 1), "batched: {:?}", &ids[..3]);
            } else {
                assert!(ids.iter().all(|id| id.batch_index == -1));
            }
            for i in 0..200u32 {
                let m = recv(&mut consumer).await;
                let expected = format!("{codec:?} message {i} {}", "x".repeat(i as usize % 50));
                assert_eq!(m.text(), Some(expected.as_str()), "{codec:?} batching={batching}");
                assert_eq!(m.key.as_deref(), Some(format!("k{}", i % 7).as_str()));
                assert_eq!(m.properties.get("i"), Some(&i.to_string()));
                assert_eq!(m.event_time, Some(1_000 + u64::from(i)));
                assert_eq!(m.id, ids[i as usize]);
                assert_eq!(m.producer_name, format!("p-{topic}"));
                consumer.ack(&m).await.unwrap();
            }
            producer.close().await.unwrap();
            consumer.close().await.unwrap();
        }
    }
}

#[tokio::test]
async fn ten_thousand_async_sends_complete_in_order() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    for batching in [false, true] {
        let topic = format!("many-{batching}");
        let mut builder = client.producer(&topic).max_pending(500);
        if batching {
            builder = builder.batching(100, 128 * 1024, Duration::from_millis(5));
        }
        let producer = builder.create().await.unwrap();
        let mut receipts = Vec::with_capacity(10_000);
        for i in 0..10_000u32 {
            let f = timeout(WAIT, producer.send_async(i.to_be_bytes().to_vec()))
                .await
                .expect("backpressure wait timed out")
                .unwrap();
            receipts.push(f);
        }
        let mut last: Option<MessageId> = None;
        for r in receipts {
            let id = timeout(WAIT, r).await.unwrap().unwrap();
            if let Some(prev) = last {
                assert!(prev < id, "{prev} then {id}");
            }
            last = Some(id);
        }
        // Everything stored, in order.
        let mut reader = client.reader(&topic).start(MessageId::earliest()).create().await.unwrap();
        for i in 0..10_000u32 {
            let m = timeout(WAIT, reader.next()).await.unwrap().unwrap();
            assert_eq!(&m.payload[..], &i.to_be_bytes());
        }
        reader.close().await.unwrap();
    }
}

#[tokio::test]
async fn key_routing_on_partitioned_topic() {
    let broker = start_broker();
    broker.create_partitioned_topic("parts", 3);
    let client = Client::connect(broker.url()).await.unwrap();
    assert_eq!(client.partitioned_topic_metadata("parts").await.unwrap(), 3);
    let lookup = client.lookup_topic("parts-partition-0").await.unwrap();
    assert_eq!(lookup.broker_url, broker.url());

    let mut consumer = client
        .consumer("parts")
        .subscription("s")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = client.producer("parts").create().await.unwrap();
    assert_eq!(producer.partitions(), 3);
    let keys: Vec<String> = (0..30).map(|i| format!("key-{i}")).collect();
    let mut sent = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        let id = producer.send(ProducerMessage::new(format!("v{i}")).key(key)).await.unwrap();
        let expected = partition_for_key(key.as_bytes(), 3) as i32;
        assert_eq!(id.partition, expected, "{key}");
        sent.insert(format!("v{i}"), expected);
    }
    // Keyless: round robin touches every partition.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..6 {
        let id = producer.send(format!("rr{i}")).await.unwrap();
        seen.insert(id.partition);
        sent.insert(format!("rr{i}"), id.partition);
    }
    assert_eq!(seen.len(), 3);
    for _ in 0..sent.len() {
        let m = recv(&mut consumer).await;
        let text = m.text().unwrap().to_string();
        let partition = sent.remove(&text).expect("unexpected or duplicate message");
        assert_eq!(m.id.partition, partition);
        assert!(m.topic.ends_with(&format!("-partition-{partition}")));
        consumer.ack(&m).await.unwrap();
    }
    assert!(sent.is_empty());
}

#[tokio::test]
async fn ack_and_nack() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    for batching in [false, true] {
        let topic = format!("acks-{batching}");
        let sub = |client: &Client| {
            client
                .consumer(&topic)
                .subscription("s")
                .sub_type(SubType::Shared)
                .initial_position(InitialPosition::Earliest)
        };
        let mut consumer = sub(&client).subscribe().await.unwrap();
        let mut builder = client.producer(&topic);
        if batching {
            builder = builder.batching(5, 1 << 20, Duration::from_millis(10));
        }
        let producer = builder.create().await.unwrap();
        let mut receipts = Vec::new();
        for i in 0..10 {
            receipts.push(producer.send_async(format!("m{i}")).await.unwrap());
        }
        for r in receipts {
            timeout(WAIT, r).await.unwrap().unwrap();
        }

        // Nack m0 (and, when batched, its batch comes back whole).
        let first = recv(&mut consumer).await;
        assert_eq!(first.text(), Some("m0"));
        assert_eq!(first.redelivery_count, 0);
        consumer.nack(&first).unwrap();
        // Receive (acking each) until every message came and the nacked ones came back: m0,
        // or its whole batch m0..m4 when batched. (The copies may come before or after m5..m9,
        // as the broker had dispatched those or not when the nack reached it.)
        let nacked: Vec<String> =
            (0..if batching { 5 } else { 1 }).map(|i| format!("m{i}")).collect();
        let mut got: BTreeMap<String, u32> = BTreeMap::from([("m0".to_string(), 1)]);
        while got.len() < 10 || nacked.iter().any(|name| got.get(name).copied().unwrap_or(0) < 2) {
            let m = recv(&mut consumer).await;
            let text = m.text().unwrap().to_string();
            let seen = got.entry(text.clone()).or_default();
            if *seen > 0 {
                assert!(nacked.contains(&text), "{text} came again without a nack");
                assert!(m.redelivery_count >= 1, "redelivered copy of {text} is counted");
            }
            *seen += 1;
            consumer.ack(&m).await.unwrap();
        }
        assert!(got.values().all(|&n| n <= 2), "{got:?}");
        consumer.close().await.unwrap();

        // Everything was acknowledged: a new consumer gets only new messages.
        let mut consumer = sub(&client).subscribe().await.unwrap();
        producer.send("after").await.unwrap();
        let m = recv(&mut consumer).await;
        assert_eq!(m.text(), Some("after"), "acknowledged messages must not come back");

        consumer.ack(&m).await.unwrap();
        consumer.close().await.unwrap();

        // Exclusive subscription: unacknowledged messages come back after
        // close; a cumulative ack clears them all.
        let exclusive = |client: &Client| {
            client
                .consumer(&topic)
                .subscription("cumulative")
                .sub_type(SubType::Exclusive)
                .initial_position(InitialPosition::Latest)
        };
        let mut consumer = exclusive(&client).subscribe().await.unwrap();
        let id_a = producer.send("a").await.unwrap();
        producer.send("b").await.unwrap();
        producer.send("c").await.unwrap();
        let a = recv(&mut consumer).await;
        assert_eq!(a.id, id_a);
        assert_eq!(recv(&mut consumer).await.text(), Some("b"));
        consumer.close().await.unwrap();
        let mut consumer = exclusive(&client).subscribe().await.unwrap();
        let mut texts = Vec::new();
        for _ in 0..3 {
            texts.push(recv(&mut consumer).await);
        }
        // The broker may dispatch an entry it was reading while the first
        // consumer closed before the redelivered ones: compare as a set.
        texts.sort_by_key(|m| m.id);
        let names: Vec<_> = texts.iter().map(|m| m.text().unwrap().to_string()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        consumer.ack_cumulative(&texts[1]).await.unwrap();
        consumer.close().await.unwrap();
        let mut consumer = exclusive(&client).subscribe().await.unwrap();
        assert_eq!(recv(&mut consumer).await.text(), Some("c"));
        consumer.unsubscribe().await.unwrap();
    }
}

#[tokio::test]
async fn redeliver_unacknowledged_brings_back_what_was_not_acked() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    let topic = "redeliver-all";
    let subscribe = || {
        client
            .consumer(topic)
            .subscription("s")
            .sub_type(SubType::Exclusive)
            .initial_position(InitialPosition::Earliest)
            .subscribe()
    };
    let mut consumer = subscribe().await.unwrap();
    let producer = client.producer(topic).create().await.unwrap();
    for i in 0..5 {
        producer.send(format!("m{i}")).await.unwrap();
    }
    let first = recv(&mut consumer).await;
    assert_eq!(first.text(), Some("m0"));
    assert_eq!(first.redelivery_count, 0);
    assert_eq!(recv(&mut consumer).await.text(), Some("m1"));

    consumer.redeliver_unacknowledged().unwrap();
    // m0 and m1 were delivered and not acknowledged: they come back, counted. Messages the
    // broker sent before it took the request may arrive twice; all of them are acknowledged.
    let mut redelivered = BTreeSet::new();
    let mut seen = BTreeSet::new();
    while !(redelivered.contains("m0") && redelivered.contains("m1") && seen.len() == 5) {
        let m = recv(&mut consumer).await;
        let text = m.text().unwrap().to_string();
        if m.redelivery_count >= 1 {
            redelivered.insert(text.clone());
        }
        seen.insert(text);
        consumer.ack(&m).await.unwrap();
    }
    consumer.close().await.unwrap();

    // Everything was acknowledged, duplicates included: a new consumer gets only new messages.
    let mut consumer = subscribe().await.unwrap();
    producer.send("after").await.unwrap();
    let m = recv(&mut consumer).await;
    assert_eq!(m.text(), Some("after"), "acknowledged messages must not come back");
    consumer.unsubscribe().await.unwrap();
}

#[tokio::test]
async fn reader_from_earliest_latest_and_id() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    let producer = client
        .producer("readme")
        .batching(4, 1 << 20, Duration::from_millis(5))
        .compression(Compression::Zstd)
        .create()
        .await
        .unwrap();
    let mut receipts = Vec::new();
    for i in 0..10 {
        receipts.push(producer.send_async(format!("r{i}")).await.unwrap());
    }
    let mut ids = Vec::new();
    for r in receipts {
        ids.push(timeout(WAIT, r).await.unwrap().unwrap());
    }

    let mut reader = client.reader("readme").start(MessageId::earliest()).create().await.unwrap();
    for i in 0..10 {
        let m = timeout(WAIT, reader.next()).await.unwrap().unwrap();
        assert_eq!(m.text(), Some(format!("r{i}").as_str()));
    }
    reader.close().await.unwrap();

    // After a given id (exclusive), including from the middle of a batch.
    let mut reader = client.reader("readme").start(ids[5]).create().await.unwrap();
    for i in 6..10 {
        let m = timeout(WAIT, reader.next()).await.unwrap().unwrap();
        assert_eq!(m.text(), Some(format!("r{i}").as_str()));
    }

    // Latest: only what comes next.
    let mut latest = client.reader("readme").start(MessageId::latest()).create().await.unwrap();
    producer.send("new").await.unwrap();
    let m = timeout(WAIT, latest.next()).await.unwrap().unwrap();
    assert_eq!(m.text(), Some("new"));
    let m = timeout(WAIT, reader.next()).await.unwrap().unwrap();
    assert_eq!(m.text(), Some("new"));
}

#[tokio::test]
async fn bad_url_and_closed_broker() {
    assert!(Client::connect("http://127.0.0.1:1").await.is_err());
    let broker = start_broker();
    let url = broker.url();
    let client = Client::connect(&url).await.unwrap();
    let producer = client.producer("gone").create().await.unwrap();
    producer.send("one").await.unwrap();
    drop(broker);
    // The producer keeps retrying; the send does not succeed.
    let outcome = timeout(Duration::from_secs(2), producer.send("two")).await;
    assert!(!matches!(outcome, Ok(Ok(_))), "a send to a dead broker cannot succeed");
}

#[tokio::test]
async fn producer_resends_pending_and_consumer_resubscribes_after_broker_restart() {
    let mut broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    let producer = client.producer("restart").name("survivor").create().await.unwrap();
    let mut consumer = client
        .consumer("restart")
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    producer.send("before").await.unwrap();
    let m = recv(&mut consumer).await;
    assert_eq!(m.text(), Some("before"));
    consumer.ack(&m).await.unwrap();

    broker.kill();
    // Queued while the broker is down: pending, then resent on reconnect.
    let mut receipts = Vec::new();
    for i in 0..50 {
        receipts.push(producer.send_async(format!("during-{i}")).await.unwrap());
    }
    broker.restart();
    let mut last = None;
    for r in receipts {
        let id = timeout(Duration::from_secs(60), r).await.unwrap().unwrap();
        assert!(last < Some(id));
        last = Some(id);
    }
    let mut i = 0;
    while i < 50 {
        let m = timeout(Duration::from_secs(60), consumer.receive()).await.unwrap().unwrap();
        consumer.ack(&m).await.unwrap();
        // The broker persists acknowledgements asynchronously: one confirmed
        // just before a SIGKILL may be redelivered (at-least-once).
        if m.text() == Some("before") && i == 0 {
            continue;
        }
        assert_eq!(m.text(), Some(format!("during-{i}").as_str()));
        i += 1;
    }
}

#[tokio::test]
async fn batched_round_robin_on_partitioned_topic() {
    let broker = start_broker();
    broker.create_partitioned_topic("rr-batched", 3);
    let client = Client::connect(broker.url()).await.unwrap();
    let mut consumer = client
        .consumer("rr-batched")
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .receiver_queue(100)
        .subscribe()
        .await
        .unwrap();
    let producer = client
        .producer("rr-batched")
        .batching(20, 1 << 20, Duration::from_secs(1))
        .compression(Compression::Lz4)
        .create()
        .await
        .unwrap();
    let mut receipts = Vec::new();
    for i in 0..300u32 {
        receipts.push(producer.send_async(i.to_string()).await.unwrap());
    }
    let mut partitions = std::collections::BTreeSet::new();
    for r in receipts {
        let id = timeout(WAIT, r).await.unwrap().unwrap();
        assert!(id.batch_size > 1, "batched: {id}");
        partitions.insert(id.partition);
    }
    assert_eq!(partitions.len(), 3, "every partition used");
    let mut last_per_partition: HashMap<i32, u32> = HashMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..300 {
        let m = recv(&mut consumer).await;
        let n: u32 = m.text().unwrap().parse().unwrap();
        assert!(seen.insert(n), "duplicate {n}");
        if let Some(prev) = last_per_partition.insert(m.id.partition, n) {
            assert!(prev < n, "order within partition {}", m.id.partition);
        }
        consumer.ack(&m).await.unwrap();
    }
}

#[tokio::test]
async fn callbacks_complete_in_order() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    let producer = client
        .producer("callbacks")
        .batching(50, 128 * 1024, Duration::from_millis(5))
        .max_pending(200)
        .create()
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..1000u32 {
        let tx = tx.clone();
        producer
            .send_with_callback(i.to_be_bytes().to_vec(), move |result| {
                let _ = tx.send((i, result));
            })
            .await
            .unwrap();
    }
    let mut last: Option<MessageId> = None;
    for expected in 0..1000u32 {
        let (i, result) = timeout(WAIT, rx.recv()).await.expect("callback timed out").unwrap();
        assert_eq!(i, expected, "callbacks run in send order");
        let id = result.expect("stored");
        assert!(last.is_none_or(|prev| prev < id), "{last:?} then {id}");
        last = Some(id);
    }
}

/// One listener call: its tags, and their ids or the error.
type HeardCall = (Vec<u64>, Result<Vec<MessageId>, String>);

/// Records what a producer's listener hears, one call per entry.
#[derive(Default)]
struct Heard {
    calls: std::sync::Mutex<Vec<HeardCall>>,
    changed: tokio::sync::Notify,
}

impl magnetar_client::SendListener for Heard {
    fn on_stored(&self, tags: &[u64], ids: magnetar_client::StoredIds) {
        let ids = (0..tags.len()).map(|i| ids.get(i)).collect();
        self.calls.lock().unwrap().push((tags.to_vec(), Ok(ids)));
        self.changed.notify_one();
    }

    fn on_failed(&self, tags: &[u64], error: &magnetar_client::Error) {
        self.calls.lock().unwrap().push((tags.to_vec(), Err(error.to_string())));
        self.changed.notify_one();
    }
}

impl Heard {
    /// Waits until `n` tags were heard of; returns the calls.
    async fn wait_for(&self, n: usize) -> Vec<HeardCall> {
        timeout(WAIT, async {
            loop {
                let notified = self.changed.notified();
                {
                    let calls = self.calls.lock().unwrap();
                    if calls.iter().map(|(tags, _)| tags.len()).sum::<usize>() >= n {
                        return calls.clone();
                    }
                }
                notified.await;
            }
        })
        .await
        .expect("listener timed out")
    }
}

#[tokio::test]
async fn tagged_sends_are_heard_an_entry_at_a_time_in_order() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    let heard = Arc::new(Heard::default());
    let producer = client
        .producer("tagged")
        .batching(100, 128 * 1024, Duration::from_millis(5))
        .listener(heard.clone())
        .create()
        .await
        .unwrap();
    // Tags 0..1000, with a future-waited message in the middle of the run.
    let mut middle = None;
    for i in 0..1000u64 {
        if i == 500 {
            middle = Some(producer.send_async("not tagged").await.unwrap());
        }
        producer.send_tagged(i.to_be_bytes().to_vec(), i).await.unwrap();
    }
    let calls = heard.wait_for(1000).await;
    let middle = timeout(WAIT, middle.unwrap()).await.unwrap().unwrap();
    let tags: Vec<u64> = calls.iter().flat_map(|(tags, _)| tags.clone()).collect();
    assert_eq!(tags, (0..1000).collect::<Vec<_>>(), "every tag once, in send order");
    assert!(calls.len() < 1000, "batches are reported whole: {} calls", calls.len());
    let ids: Vec<MessageId> = calls.into_iter().flat_map(|(_, ids)| ids.expect("stored")).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase");
    assert!(ids[499] < middle && middle < ids[500], "the untagged message sits between");

    // The ids are the consumers' ids.
    let mut reader = client.reader("tagged").start(MessageId::earliest()).create().await.unwrap();
    for (i, id) in ids.iter().enumerate().take(500) {
        let m = timeout(WAIT, reader.next()).await.unwrap().unwrap();
        assert_eq!((&m.payload[..], m.id), (&(i as u64).to_be_bytes()[..], *id));
    }

    // What the broker refuses is reported with its tag.
    let too_big = vec![0u8; 6 * 1024 * 1024];
    producer.send_tagged(too_big, 7777).await.unwrap();
    let calls = heard.wait_for(1001).await;
    let (tags, outcome) = calls.last().unwrap();
    assert_eq!(tags, &[7777]);
    assert!(outcome.as_ref().is_err_and(|e| e.contains("exceeds")), "{outcome:?}");

    // Without a listener, tagged sends are refused at once.
    let plain = client.producer("tagged").create().await.unwrap();
    assert!(matches!(plain.send_tagged("x", 1).await, Err(magnetar_client::Error::Config(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_fill_batches_in_order() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    // Small batches: senders on two threads keep filling, handing over and opening batches
    // while the task takes them.
    let producer = Arc::new(
        client
            .producer("concurrent")
            .batching(37, 4096, Duration::from_millis(1))
            .max_pending(300)
            .create()
            .await
            .unwrap(),
    );
    let mut senders = Vec::new();
    for sender in 0..4u32 {
        let producer = producer.clone();
        senders.push(tokio::spawn(async move {
            let mut receipts = Vec::new();
            for i in 0..2000u32 {
                let key = sender << 16 | i;
                let payload = [&key.to_be_bytes()[..], &[0u8; 60]].concat();
                receipts.push((key, producer.send_async(payload).await.unwrap()));
            }
            let mut ids = Vec::new();
            for (key, receipt) in receipts {
                ids.push((key, timeout(WAIT, receipt).await.unwrap().expect("stored")));
            }
            ids
        }));
    }
    let mut id_of = HashMap::new();
    for sender in senders {
        let ids = sender.await.unwrap();
        assert!(ids.windows(2).all(|w| w[0].1 < w[1].1), "one sender's messages stay in order");
        id_of.extend(ids);
    }
    assert_eq!(id_of.len(), 8000);
    let mut reader =
        client.reader("concurrent").start(MessageId::earliest()).create().await.unwrap();
    for _ in 0..8000 {
        let m = timeout(WAIT, reader.next()).await.unwrap().unwrap();
        let key = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
        assert_eq!(id_of.remove(&key), Some(m.id), "stored once, where its receipt said");
    }
}

#[tokio::test]
async fn dropping_a_producer_still_sends_what_was_queued() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    let producer = client
        .producer("dropped")
        .batching(1000, 128 * 1024, Duration::from_secs(60))
        .create()
        .await
        .unwrap();
    let mut receipts = Vec::new();
    for i in 0..300u32 {
        receipts.push(producer.send_async(i.to_be_bytes().to_vec()).await.unwrap());
    }
    drop(producer);
    for r in receipts {
        timeout(WAIT, r).await.expect("receipt after drop timed out").expect("stored");
    }
    let mut reader = client.reader("dropped").start(MessageId::earliest()).create().await.unwrap();
    for i in 0..300u32 {
        let m = timeout(WAIT, reader.next()).await.unwrap().unwrap();
        assert_eq!(&m.payload[..], &i.to_be_bytes());
    }

    // Dropped while idle (its queue drained long ago), it still closes on the broker: the
    // name is free again.
    let named = client.producer("dropped").name("only-one").create().await.unwrap();
    timeout(WAIT, named.send("x")).await.unwrap().unwrap();
    drop(named);
    let retake = async {
        loop {
            match client.producer("dropped").name("only-one").create().await {
                Ok(p) => return p,
                // The broker has not seen the close yet; this is a bounded retry, not a wait
                // for an event we could observe.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    };
    timeout(WAIT, retake).await.expect("a dropped producer must close on the broker");
}

#[tokio::test]
async fn grouped_acks_are_sent_and_kept() {
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    let topic = "grouped-acks";
    let sub = |client: &Client| {
        client
            .consumer(topic)
            .subscription("g")
            .sub_type(SubType::Shared)
            .initial_position(InitialPosition::Earliest)
    };
    let mut consumer = sub(&client).subscribe().await.unwrap();
    // No batching: a partly acknowledged batch would come back whole.
    let producer = client.producer(topic).max_pending(200).create().await.unwrap();
    let mut receipts = Vec::new();
    for i in 0..1000u32 {
        receipts.push(producer.send_async(i.to_be_bytes().to_vec()).await.unwrap());
    }
    for r in receipts {
        timeout(WAIT, r).await.unwrap().unwrap();
    }
    // Grouped acks for the first 600; the rest left unacknowledged.
    for i in 0..1000u32 {
        let m = recv(&mut consumer).await;
        assert_eq!(&m.payload[..], &i.to_be_bytes());
        if i < 600 {
            consumer.ack_grouped(&m).unwrap();
        }
    }
    consumer.close().await.unwrap(); // close sends what is grouped

    // A new consumer gets exactly the 400 that were not acknowledged.
    let mut consumer = sub(&client).subscribe().await.unwrap();
    let mut again = Vec::new();
    for _ in 0..400 {
        let m = recv(&mut consumer).await;
        again.push(u32::from_be_bytes(m.payload[..4].try_into().unwrap()));
        consumer.ack_grouped(&m).unwrap();
    }
    again.sort_unstable();
    assert_eq!(again, (600..1000).collect::<Vec<_>>());
    // Nothing else is redelivered: the next message is a new one.
    producer.send("after").await.unwrap();
    assert_eq!(recv(&mut consumer).await.text(), Some("after"));
    consumer.close().await.unwrap();
}
