//! An unload under load stores nothing twice: the sends taken before it get their receipts
//! ahead of CLOSE_PRODUCER, and a send that comes while it waits is neither stored nor
//! answered. (Clients resend whatever is unanswered when their producer is closed, and close the
//! whole connection on a send error, resending everything pending: either way, a receipt that
//! came after the close had its message stored a second time.) A backlog quota's disconnect of
//! the producers keeps the same order.

use bytes::BytesMut;
use magnetar_broker::connection::run_listener;
use magnetar_broker::{BrokerConfig, BrokerService};
use magnetar_journal::sim::SimStorage;
use magnetar_ledger::hooked::{Hooked, StorageHooks};
use magnetar_ledger::{AppendCallback, LedgerError, LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{MemoryStore, MetadataStore};
use magnetar_model::names::TopicName;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::{BaseCommand, CommandProducer, MessageMetadata};
use magnetar_protocol::{commands, encode_command, encode_payload_command, metadata_and_payload};
use magnetar_protocol::{Frame, FrameDecoder};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOPIC: &str = "persistent://public/default/unload-under-load";
/// Bounds every wait for a frame that must come.
const FRAME_WAIT: Duration = Duration::from_secs(10);
/// How long we listen for a frame that must not come.
const QUIET: Duration = Duration::from_millis(300);

/// An append's answer, held back.
type HeldAnswer = (AppendCallback, Result<u64, LedgerError>);

/// Appends' answers wait, while the gate is shut, until `open`.
#[derive(Default)]
struct Gate {
    /// `Some`: shut, with the answers held back so far (in completion order).
    held: Arc<Mutex<Option<Vec<HeldAnswer>>>>,
}

type GatedStorage = Hooked<Gate>;

impl Gate {
    fn shut(&self) {
        *self.held.lock() = Some(Vec::new());
    }

    /// Opens the gate and delivers the held answers, in order (under the lock: a later append's
    /// answer cannot overtake them).
    fn open(&self) -> usize {
        let mut held = self.held.lock();
        let answers = held.take().unwrap_or_default();
        let count = answers.len();
        for (done, result) in answers {
            done(result);
        }
        count
    }

    fn held_count(&self) -> usize {
        self.held.lock().as_ref().map_or(0, Vec::len)
    }
}

impl StorageHooks for Gate {
    fn on_append(
        &self,
        _ledger: u64,
        done: AppendCallback,
    ) -> Result<Option<AppendCallback>, LedgerError> {
        let held = self.held.clone();
        Ok(Some(Box::new(move |result| {
            let mut gate = held.lock();
            if let Some(answers) = gate.as_mut() {
                answers.push((done, result));
                return;
            }
            drop(gate);
            done(result);
        })))
    }
}

struct Client {
    socket: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl Client {
    async fn write(&mut self, command: &BaseCommand) {
        let mut out = BytesMut::new();
        encode_command(command, &mut out).unwrap();
        self.socket.write_all(&out).await.unwrap();
    }

    async fn send_message(&mut self, producer_name: &str, sequence_id: u64) {
        let metadata = MessageMetadata {
            producer_name: producer_name.into(),
            sequence_id,
            publish_time: 1,
            ..Default::default()
        };
        let body = metadata_and_payload(&metadata, b"m").unwrap();
        let mut out = BytesMut::new();
        encode_payload_command(&commands::send(1, sequence_id, 1), None, &body, &mut out).unwrap();
        self.socket.write_all(&out).await.unwrap();
    }

    /// The next frame, or `None` if none comes within `wait`.
    async fn next_frame(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(frame) = self.decoder.decode_buf(&mut self.buf).unwrap() {
                if frame.command_type() == Some(Type::Ping) {
                    self.write(&commands::pong()).await;
                    continue;
                }
                return Some(frame);
            }
            match tokio::time::timeout_at(deadline, self.socket.read_buf(&mut self.buf)).await {
                Err(_) => return None,
                Ok(read) => assert!(read.unwrap() > 0, "the broker closed the connection"),
            }
        }
    }

    async fn expect_frame(&mut self, what: &str) -> Frame {
        match self.next_frame(FRAME_WAIT).await {
            Some(frame) => frame,
            None => panic!("no {what} within {FRAME_WAIT:?}"),
        }
    }
}

/// A broker on gated local storage, and a client connected to it with producer 1 created.
struct Setup {
    service: Arc<BrokerService>,
    storage: Arc<GatedStorage>,
    client: Client,
    /// Producer 1's name.
    name: String,
    _stop: tokio::sync::watch::Sender<bool>,
}

/// A broker service on a simulated local store with `hooks` in front of it.
fn service_on<H: StorageHooks>(hooks: H) -> (Arc<BrokerService>, Arc<Hooked<H>>) {
    let inner =
        LedgerStore::open_with_storage(LedgerStoreConfig::default(), Arc::new(SimStorage::new(5)))
            .unwrap()
            .0;
    let storage = Hooked::new(Arc::new(inner), hooks);
    let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    (BrokerService::new(BrokerConfig::default(), storage.clone(), metadata), storage)
}

async fn broker_with_a_producer() -> Setup {
    let (service, storage) = service_on(Gate::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(run_listener(service.clone(), listener, stopped));

    let mut client = Client {
        socket: TcpStream::connect(address).await.unwrap(),
        buf: BytesMut::new(),
        decoder: FrameDecoder::default(),
    };
    client.write(&commands::connect("test", 19)).await;
    assert!(client.expect_frame("CONNECTED").await.command.connected.is_some());
    let create = CommandProducer {
        topic: TOPIC.into(),
        producer_id: 1,
        request_id: 1,
        ..Default::default()
    };
    client
        .write(&BaseCommand { producer: Some(Box::new(create)), ..commands::base(Type::Producer) })
        .await;
    let created = client.expect_frame("PRODUCER_SUCCESS").await;
    let name = created.command.producer_success.expect("PRODUCER_SUCCESS").producer_name;
    Setup { service, storage, client, name, _stop: stop }
}

/// Shuts the storage's gate, sends message 0 and waits until storage holds its answer.
async fn send_one_and_hold_it(setup: &mut Setup) {
    setup.storage.hooks.shut();
    setup.client.send_message(&setup.name, 0).await;
    let deadline = tokio::time::Instant::now() + FRAME_WAIT;
    while setup.storage.hooks.held_count() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "message 0 never reached storage");
        tokio::task::yield_now().await;
    }
}

/// Message 1, sent while message 0 waits in storage and `closing` (an unload, a disconnect)
/// waits for it: neither stored nor answered (the client resends it on its new producer).
async fn send_while_closing<T>(setup: &mut Setup, closing: &tokio::task::JoinHandle<T>) {
    let name = setup.name.clone();
    setup.client.send_message(&name, 1).await;
    if let Some(frame) = setup.client.next_frame(QUIET).await {
        panic!("while a taken send waits, the broker sent {:?}", frame.command_type());
    }
    assert!(!closing.is_finished(), "the producers were closed with a send unanswered");
}

/// Opens the gate: the receipt of message 0 must come first, then CLOSE_PRODUCER.
async fn expect_receipt_then_close(setup: &mut Setup) {
    assert_eq!(setup.storage.hooks.open(), 1, "only message 0 was handed to storage");
    let first = setup.client.expect_frame("SEND_RECEIPT").await;
    let kind = first.command_type();
    let receipt = first
        .command
        .send_receipt
        .unwrap_or_else(|| panic!("expected the receipt of message 0 first, got {kind:?}"));
    assert_eq!(receipt.sequence_id, 0);
    let closed = setup.client.expect_frame("CLOSE_PRODUCER").await;
    assert_eq!(closed.command_type(), Some(Type::CloseProducer), "{:?}", closed.command);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unload_answers_the_sends_it_took_before_closing_their_producer() {
    let mut setup = broker_with_a_producer().await;
    let (service, name) = (setup.service.clone(), setup.name.clone());

    // Message 0 is taken and its answer held in storage; then the unload starts.
    send_one_and_hold_it(&mut setup).await;
    let deadline = tokio::time::Instant::now() + FRAME_WAIT;
    let topic = TopicName::parse(TOPIC).unwrap();
    let loaded = service.topic(&topic, false).await.expect("the topic is loaded");
    let unload = tokio::spawn({
        let service = service.clone();
        async move { service.unload_topic(&topic).await }
    });
    while !loaded.is_closed() {
        assert!(tokio::time::Instant::now() < deadline, "the unload never started");
        tokio::task::yield_now().await;
    }

    // While message 0 waits, its producer stays open, and a send that comes now (message 1) is
    // neither stored nor answered.
    send_while_closing(&mut setup, &unload).await;

    // Storage answers: the receipt of message 0 comes first, then CLOSE_PRODUCER, nothing else.
    expect_receipt_then_close(&mut setup).await;
    assert!(tokio::time::timeout(FRAME_WAIT, unload).await.expect("unload done").unwrap().unwrap());
    if let Some(frame) = setup.client.next_frame(QUIET).await {
        panic!("after CLOSE_PRODUCER: {:?} (message 1 must not be answered)", frame.command);
    }

    // The client re-creates producer 1 and, before it hears PRODUCER_SUCCESS, a send under
    // that id still arrives (the Go client writes sends and commands through separate queues):
    // dropped unanswered like the ones during the unload, not refused (a send error makes
    // clients drop the whole connection).
    let again = CommandProducer {
        topic: TOPIC.into(),
        producer_id: 1,
        request_id: 2,
        ..Default::default()
    };
    let mut both = BytesMut::new();
    encode_command(
        &BaseCommand { producer: Some(Box::new(again)), ..commands::base(Type::Producer) },
        &mut both,
    )
    .unwrap();
    let metadata = MessageMetadata {
        producer_name: name.clone(),
        sequence_id: 1,
        publish_time: 1,
        ..Default::default()
    };
    let body = metadata_and_payload(&metadata, b"m").unwrap();
    encode_payload_command(&commands::send(1, 1, 1), None, &body, &mut both).unwrap();
    setup.client.socket.write_all(&both).await.unwrap();
    let created = setup.client.expect_frame("PRODUCER_SUCCESS").await;
    assert!(created.command.producer_success.is_some(), "{:?}", created.command);
    if let Some(frame) = setup.client.next_frame(QUIET).await {
        panic!("the send written before PRODUCER_SUCCESS was answered: {:?}", frame.command);
    }

    // The topic, loaded afresh, holds message 0 once and not message 1; its ledger from before
    // the unload was closed by it (not left for the load to recover).
    let topic = TopicName::parse(TOPIC).unwrap();
    let loaded = service.topic(&topic, false).await.expect("the topic is loaded");
    let ledgers = loaded.managed_ledger.closed_ledgers();
    let stored: u64 = ledgers.values().map(|ledger| ledger.entries).sum();
    assert_eq!(stored, 1, "message 0 stored once, message 1 not at all: {ledgers:?}");
    assert_eq!(loaded.managed_ledger.last_confirmed().map(|p| p.entry_id), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_quota_answers_the_sends_it_took_before_closing_their_producer() {
    let mut setup = broker_with_a_producer().await;
    let topic_name = TopicName::parse(TOPIC).unwrap();
    let topic = setup.service.topic(&topic_name, false).await.expect("the topic is loaded");

    // Message 0 is taken and its answer held; then the quota's check, finding the backlog over
    // it, disconnects the producers (Pulsar's `disconnectProducers`).
    send_one_and_hold_it(&mut setup).await;
    let disconnect = tokio::spawn({
        let topic = topic.clone();
        async move { topic.disconnect_producers().await }
    });
    let deadline = tokio::time::Instant::now() + FRAME_WAIT;
    while topic.producer_count() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the disconnect never started");
        tokio::task::yield_now().await;
    }

    // A send under the closed producer while message 0 waits: neither stored nor answered.
    send_while_closing(&mut setup, &disconnect).await;

    expect_receipt_then_close(&mut setup).await;
    tokio::time::timeout(FRAME_WAIT, disconnect).await.expect("disconnect done").unwrap();
    if let Some(frame) = setup.client.next_frame(QUIET).await {
        panic!("after CLOSE_PRODUCER: {:?} (message 1 must not be answered)", frame.command);
    }
    assert_eq!(
        topic.managed_ledger.last_confirmed().map(|p| p.entry_id),
        Some(0),
        "message 0 stored, message 1 not"
    );
}

/// Closes of ledgers wait for good while `held` is set (storage that never answers a close).
#[derive(Default)]
struct HeldCloses {
    held: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl StorageHooks for HeldCloses {
    async fn before_close(&self, _ledger: u64) {
        if self.held.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unload_whose_ledger_close_never_finishes_ends_within_its_bound() {
    // The nemesis found an unload that waited for good on a close, and every bundle hand-over
    // queued behind it with it: the storage steps are bounded (30 s), and the ledger left open
    // is recovered by the next load.
    let (service, storage) = service_on(HeldCloses::default());
    let topic = TopicName::parse(TOPIC).unwrap();
    service.topic(&topic, true).await.expect("the topic is created");

    storage.hooks.held.store(true, std::sync::atomic::Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let unloaded = tokio::time::timeout(Duration::from_secs(60), service.unload_topic(&topic))
        .await
        .expect("the unload ends within its bound")
        .expect("the unload succeeds");
    assert!(unloaded, "the topic was loaded");
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(29), "the close was waited for: {took:?}");

    storage.hooks.held.store(false, std::sync::atomic::Ordering::SeqCst);
    let again = tokio::time::timeout(FRAME_WAIT, service.topic(&topic, false))
        .await
        .expect("the topic loads again")
        .expect("its open ledger recovered");
    assert!(!again.is_closed());
}
