//! A connection's slow request does not hold up its other requests: a topic that takes 2 s to
//! load must not delay a producer on another topic on the same connection.

use async_trait::async_trait;
use bytes::BytesMut;
use magnetar_broker::connection::run_listener;
use magnetar_broker::{BrokerConfig, BrokerService};
use magnetar_journal::sim::SimStorage;
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{InterceptedStore, Interceptor, MemoryStore, MetadataStore, Operation};
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::{BaseCommand, CommandProducer};
use magnetar_protocol::{commands, encode_command, FrameDecoder};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant; // real time is what this test measures (the clock ban is for broker code)

const SLOW_LOAD: Duration = Duration::from_secs(2);

/// Reads of the ledger list of topics whose name contains the text take [`SLOW_LOAD`]: those
/// topics' loads are slow.
struct SlowTopic(&'static str);

#[async_trait]
impl Interceptor for SlowTopic {
    async fn before(&self, operation: Operation<'_>) -> magnetar_metadata::Result<()> {
        if let Operation::Get(key) = operation {
            if key.starts_with("/managed-ledgers/") && key.contains(self.0) {
                tokio::time::sleep(SLOW_LOAD).await;
            }
        }
        Ok(())
    }
}

fn producer(request_id: u64, producer_id: u64, topic: &str) -> BaseCommand {
    BaseCommand {
        producer: Some(Box::new(CommandProducer {
            topic: topic.into(),
            producer_id,
            request_id,
            ..Default::default()
        })),
        ..commands::base(Type::Producer)
    }
}

async fn send(socket: &mut TcpStream, command: &BaseCommand) {
    let mut buf = BytesMut::new();
    encode_command(command, &mut buf).unwrap();
    socket.write_all(&buf).await.unwrap();
}

/// Reads frames until one answers `request_id`; returns when it came.
async fn answered(
    socket: &mut TcpStream,
    buf: &mut BytesMut,
    pending: &mut Vec<(u64, Instant)>,
    request_id: u64,
) -> Instant {
    let decoder = FrameDecoder::default();
    loop {
        if let Some(&(_, at)) = pending.iter().find(|(id, _)| *id == request_id) {
            return at;
        }
        while let Some(frame) = decoder.decode_buf(buf).unwrap() {
            if let Some(success) = frame.command.producer_success.as_ref() {
                pending.push((success.request_id, Instant::now()));
            } else if let Some(error) = frame.command.error.as_ref() {
                panic!("request {} failed: {}", error.request_id, error.message);
            }
        }
        if pending.iter().any(|(id, _)| *id == request_id) {
            continue;
        }
        let read = tokio::time::timeout(Duration::from_secs(10), socket.read_buf(buf)).await;
        assert!(read.expect("an answer within 10 s").unwrap() > 0, "connection closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_topic_load_does_not_delay_other_producers_on_the_connection() {
    let store =
        LedgerStore::open_with_storage(LedgerStoreConfig::default(), Arc::new(SimStorage::new(11)))
            .unwrap()
            .0;
    let metadata: Arc<dyn MetadataStore> = Arc::new(InterceptedStore {
        inner: MemoryStore::new(),
        interceptor: SlowTopic("slow-topic"),
    });
    let service = BrokerService::new(BrokerConfig::default(), Arc::new(store), metadata);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(run_listener(service, listener, stopped));

    let mut socket = TcpStream::connect(address).await.unwrap();
    let mut buf = BytesMut::new();
    let mut pending = Vec::new();
    send(&mut socket, &commands::connect("test", 19)).await;
    let started = Instant::now();
    send(&mut socket, &producer(1, 1, "persistent://public/default/slow-topic")).await;
    send(&mut socket, &producer(2, 2, "persistent://public/default/fast-topic")).await;

    let fast = answered(&mut socket, &mut buf, &mut pending, 2).await - started;
    let slow = answered(&mut socket, &mut buf, &mut pending, 1).await - started;
    assert!(slow >= SLOW_LOAD, "the slow topic loaded in {slow:?}: the test did not slow it");
    assert!(
        fast < SLOW_LOAD / 2,
        "the producer on the fast topic waited {fast:?} behind the slow topic's load"
    );
}
