//! Interoperability with the official client (pulsar-client for Python,
//! built on the C++ client): what we produce it reads, and the reverse,
//! for every compression codec, batched and not.
//!
//! Skipped (with a message) when `/work/main/.venv` has no pulsar-client.

use std::time::Duration;

use crate::common::{python, run_python, start_broker, WAIT};
use magnetar_client::{Client, Compression, InitialPosition, ProducerMessage};
use tokio::time::timeout;

const CODECS: [(Compression, &str); 5] = [
    (Compression::None, "NONE"),
    (Compression::Lz4, "LZ4"),
    (Compression::Zlib, "ZLib"),
    (Compression::Zstd, "ZSTD"),
    (Compression::Snappy, "SNAPPY"),
];

const COUNT: usize = 120;

/// Prints one line per message: hex(payload) key prop(i) event_time.
const PY_CONSUME: &str = r#"
import sys, pulsar
url, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = pulsar.Client(url, operation_timeout_seconds=20)
consumer = client.subscribe(topic, "py-sub",
    initial_position=pulsar.InitialPosition.Earliest)
for _ in range(count):
    m = consumer.receive(timeout_millis=30000)
    props = m.properties()
    print("MSG", m.data().hex(), m.partition_key() or "-", props.get("i", "-"), m.event_timestamp())
    consumer.acknowledge(m)
client.close()
"#;

const PY_PRODUCE: &str = r#"
import sys, pulsar
url, topic, codec, batching, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
client = pulsar.Client(url, operation_timeout_seconds=20)
producer = client.create_producer(topic,
    compression_type=getattr(pulsar.CompressionType, codec),
    batching_enabled=batching, batching_max_messages=25,
    batching_max_publish_delay_ms=50)
for i in range(count):
    payload = ("py %s %d " % (codec, i)).encode() + bytes([i % 256]) * (i % 40)
    producer.send_async(payload, None, partition_key="k%d" % (i % 5),
        properties={"i": str(i)}, event_timestamp=1000 + i)
producer.flush()
client.close()
print("done")
"#;

fn payload(tag: &str, i: usize) -> Vec<u8> {
    let mut p = format!("{tag} {i} ").into_bytes();
    p.extend(std::iter::repeat_n((i % 256) as u8, i % 40));
    p
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_client_reads_what_we_produce() {
    let Some(py) = python() else { return };
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    for batching in [true, false] {
        for (codec, name) in CODECS {
            let topic = format!("to-py-{name}-{batching}").to_lowercase();
            let mut builder = client.producer(&topic).compression(codec);
            if batching {
                builder = builder.batching(25, 128 * 1024, Duration::from_millis(20));
            }
            let producer = builder.create().await.unwrap();
            let tag = format!("rs {name}");
            let mut receipts = Vec::new();
            for i in 0..COUNT {
                let msg = ProducerMessage::new(payload(&tag, i))
                    .key(format!("k{}", i % 5))
                    .property("i", i.to_string())
                    .event_time(1000 + i as u64);
                receipts.push(producer.send_async(msg).await.unwrap());
            }
            for r in receipts {
                let id = timeout(WAIT, r).await.unwrap().unwrap();
                assert_eq!(id.batch_index >= 0, batching);
            }
            producer.close().await.unwrap();

            let args = [broker.url(), topic.clone(), COUNT.to_string()];
            let out = tokio::task::spawn_blocking({
                let py = py.clone();
                move || run_python(&py, PY_CONSUME, &args)
            })
            .await
            .unwrap();
            let lines: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("MSG ")).collect();
            assert_eq!(lines.len(), COUNT, "{name} batching={batching}: {out}");
            for (i, line) in lines.iter().enumerate() {
                let fields: Vec<&str> = line.split(' ').collect();
                assert_eq!(fields[0], hex(&payload(&tag, i)), "{name} batching={batching} #{i}");
                assert_eq!(fields[1], format!("k{}", i % 5));
                assert_eq!(fields[2], i.to_string());
                assert_eq!(fields[3], (1000 + i).to_string());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_read_what_the_official_client_produces() {
    let Some(py) = python() else { return };
    let broker = start_broker();
    let client = Client::connect(broker.url()).await.unwrap();
    for batching in [true, false] {
        for (_, name) in CODECS {
            let topic = format!("from-py-{name}-{batching}").to_lowercase();
            let mut consumer = client
                .consumer(&topic)
                .subscription("rs-sub")
                .initial_position(InitialPosition::Earliest)
                .receiver_queue(50)
                .subscribe()
                .await
                .unwrap();
            let args = [
                broker.url(),
                topic.clone(),
                name.to_string(),
                if batching { "1" } else { "0" }.to_string(),
                COUNT.to_string(),
            ];
            let out = tokio::task::spawn_blocking({
                let py = py.clone();
                move || run_python(&py, PY_PRODUCE, &args)
            })
            .await
            .unwrap();
            assert!(out.lines().any(|l| l == "done"), "{out}");
            let tag = format!("py {name}");
            let mut saw_batch = false;
            for i in 0..COUNT {
                let m = timeout(WAIT, consumer.receive()).await.unwrap().unwrap();
                assert_eq!(
                    &m.payload[..],
                    &payload(&tag, i)[..],
                    "{name} batching={batching} #{i}"
                );
                assert_eq!(m.key.as_deref(), Some(format!("k{}", i % 5).as_str()));
                assert_eq!(m.properties.get("i"), Some(&i.to_string()));
                assert_eq!(m.event_time, Some(1000 + i as u64));
                saw_batch |= m.id.batch_size > 1;
                consumer.ack(&m).await.unwrap();
            }
            assert_eq!(saw_batch, batching, "{name}: batching visible in ids");
            consumer.close().await.unwrap();
        }
    }
}
