//! Producers: batching, compression, bounded pending messages, receipts
//! matched in order by sequence id, partition routing and reconnection
//! with resend of pending messages.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::{CommandCloseProducer, CommandProducer, KeyValue, MessageMetadata};
use magnetar_protocol::{
    commands, encode_payload_command, metadata_and_payload, BaseCommand, BatchBuilder,
    MessageFields,
};
use prost::Message as _;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::time::Instant;

use crate::client::Client;
use crate::compression::Compression;
use crate::connection::{Connection, ProducerEvent};
use crate::error::{Error, Result};
use crate::hash::partition_for_key;
use crate::message::{MessageId, ProducerMessage};

/// How messages without a key are spread over the partitions of a
/// partitioned topic. Messages with a key always go to partition
/// `(murmur3_32(key) & i32::MAX) % partitions`, like the official clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// Round robin, one message at a time.
    #[default]
    RoundRobin,
    /// Always this partition.
    Single(u32),
}

/// Batching settings: a batch is sent when it holds `max_messages`, when
/// adding a message would exceed `max_bytes`, or `max_delay` after its
/// first message; and at once whenever nothing sent before is waiting for
/// its receipt (so a lone message does not wait for `max_delay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Maximum messages per batch.
    pub max_messages: u32,
    /// Maximum uncompressed payload bytes per batch.
    pub max_bytes: usize,
    /// Maximum time a message waits in a batch.
    pub max_delay: Duration,
}

#[derive(Debug, Clone)]
struct Config {
    name: Option<String>,
    batching: Option<Batching>,
    compression: Compression,
    listener: Option<Listener>,
    /// A message not acknowledged this long after it was sent fails (with every message
    /// pending behind it) with [`Error::Timeout`]; `None`: wait for ever.
    send_timeout: Option<Duration>,
}

/// Pulsar's `sendTimeoutMs` default.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Hears the outcome of messages sent with [`Producer::send_tagged`]: an entry (a whole batch)
/// at a time, in send order, on the producer's task, so keep it short. At millions of messages
/// a second this is the cheapest way to hear back: the caller's tag travels with the message,
/// and nothing is allocated or called per message.
///
/// ```no_run
/// # async fn demo(client: magnetar_client::Client) -> magnetar_client::Result<()> {
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use magnetar_client::{Error, SendListener, StoredIds};
///
/// #[derive(Default)]
/// struct Count(AtomicU64);
///
/// impl SendListener for Count {
///     fn on_stored(&self, tags: &[u64], _ids: StoredIds) {
///         self.0.fetch_add(tags.len() as u64, Ordering::Relaxed);
///     }
///     fn on_failed(&self, tags: &[u64], error: &Error) {
///         eprintln!("{} messages not stored: {error}", tags.len());
///     }
/// }
///
/// let stored = Arc::new(Count::default());
/// let producer = client.producer("events").listener(stored.clone()).create().await?;
/// for i in 0..1_000_000u64 {
///     producer.send_tagged("event", i).await?;
/// }
/// producer.close().await?;
/// assert_eq!(stored.0.load(Ordering::Relaxed), 1_000_000);
/// # Ok(()) }
/// ```
pub trait SendListener: Send + Sync + 'static {
    /// The messages sent with `tags` (in send order) are stored; `ids.get(i)` is the message
    /// id of `tags[i]`.
    fn on_stored(&self, tags: &[u64], ids: StoredIds);
    /// The messages sent with `tags` were not stored.
    fn on_failed(&self, tags: &[u64], error: &Error);
}

/// The message ids of a run of messages stored in one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredIds {
    first: MessageId,
}

impl StoredIds {
    /// The id of the `i`-th message of the run.
    pub fn get(&self, i: usize) -> MessageId {
        let mut id = self.first;
        if id.batch_index >= 0 {
            id.batch_index += i as i32;
        }
        id
    }
}

#[derive(Clone)]
struct Listener(Arc<dyn SendListener>);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SendListener")
    }
}

/// Builds a [`Producer`]; get one from [`Client::producer`].
#[derive(Debug)]
pub struct ProducerBuilder {
    client: Client,
    topic: String,
    config: Config,
    max_pending: usize,
    routing: Routing,
}

impl ProducerBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        Self {
            client,
            topic,
            config: Config {
                name: None,
                batching: None,
                compression: Compression::None,
                listener: None,
                send_timeout: Some(DEFAULT_SEND_TIMEOUT),
            },
            max_pending: 1000,
            routing: Routing::RoundRobin,
        }
    }

    /// Producer name (the broker picks one when unset).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// Enables batching (off by default).
    pub fn batching(mut self, max_messages: u32, max_bytes: usize, max_delay: Duration) -> Self {
        self.config.batching =
            Some(Batching { max_messages: max_messages.max(1), max_bytes, max_delay });
        self
    }

    /// Compression of each entry (a whole batch, or a single message).
    pub fn compression(mut self, compression: Compression) -> Self {
        self.config.compression = compression;
        self
    }

    /// How long a message may wait for the broker's acknowledgement before it fails with
    /// [`Error::Timeout`], and every message pending behind it too, as Pulsar's clients do
    /// (default 30 s; zero: no timeout). A broker that cannot store (a full disk) thus gives
    /// the application an error in bounded time.
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.config.send_timeout = (!timeout.is_zero()).then_some(timeout);
        self
    }

    /// Maximum messages sent but not yet acknowledged by the broker
    /// (default 1000). When reached, [`Producer::send_async`] waits.
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.max_pending = max_pending.max(1);
        self
    }

    /// Where the outcomes of [`Producer::send_tagged`] go (needed to use it).
    pub fn listener(mut self, listener: Arc<dyn SendListener>) -> Self {
        self.config.listener = Some(Listener(listener));
        self
    }

    /// Routing of keyless messages on partitioned topics.
    pub fn routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
        self
    }

    /// Creates the producer (one per partition for a partitioned topic).
    pub async fn create(self) -> Result<Producer> {
        let partitions = self.client.topic_partitions(&self.topic).await?;
        let config = Arc::new(self.config);
        let pending = Arc::new(Semaphore::new(self.max_pending));
        let mut handles = Vec::with_capacity(partitions.len());
        for (topic, partition) in partitions {
            let intake = Arc::new(Intake::default());
            let mut actor = PartitionProducer::new(
                self.client.clone(),
                topic.clone(),
                partition,
                config.clone(),
                pending.clone(),
                intake.clone(),
            );
            let mut retry = crate::error::Retry::new(self.client.operation_timeout());
            while let Err(error) = actor.connect().await {
                retry.after(error).await?;
            }
            tokio::spawn(actor.run());
            handles.push(Handle { topic, intake });
        }
        Ok(Producer {
            topic: crate::client::full_topic_name(&self.topic),
            partitions: handles,
            pending,
            cursor: AtomicUsize::new(start_partition()),
            routing: self.routing,
            batching: config.batching,
            tagged: config.listener.is_some(),
            sticky: std::sync::Mutex::new(Sticky { messages: 0, bytes: 0, since: Instant::now() }),
        })
    }
}

/// From the [`Producer`] handle to a partition's task. A `Send` (a message of a producer
/// without batching) holds one pending-message permit, taken from the semaphore and
/// forgotten; the task returns it (see [`Permits`]).
enum Command {
    Send { message: ProducerMessage, sequence_id: u64, reply: Reply },
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<Result<()>>),
}

/// A batch filled by the senders: messages with consecutive sequence ids from
/// `sequence_id`, encoded as they arrive, and their waiters (one permit each).
struct OpenBatch {
    records: BatchBuilder,
    waiters: Vec<Reply>,
    sequence_id: u64,
    /// Uncompressed payload bytes.
    bytes: usize,
    /// When the first message arrived: the batch leaves `max_delay` later at the latest.
    since: Instant,
}

impl OpenBatch {
    /// An empty batch with room for a full one, and `headroom` for the frame header and
    /// metadata, so that an uncompressed batch is sent without copying it again.
    fn new(sequence_id: u64, batching: Batching, headroom: usize) -> Self {
        // Each record adds its size field and a few metadata bytes to the payload.
        let records = batching.max_bytes.saturating_add(batching.max_messages as usize * 16);
        OpenBatch {
            records: BatchBuilder::with_headroom(headroom, records.min(MAX_BATCH_PREALLOCATION)),
            waiters: Vec::with_capacity((batching.max_messages as usize).min(4096)),
            sequence_id,
            bytes: 0,
            since: Instant::now(),
        }
    }
}

/// Between the [`Producer`] handle and one partition's task. Senders encode their message
/// into the open batch under the lock (or queue a command); the task takes full batches and
/// commands in one swap, and the open batch when nothing is in flight or its delay is up.
/// The task is woken when a batch opens or fills and when a command arrives, not per
/// message. (Moving each message to the task through tokio's mpsc took ~15% of the client's
/// CPU at a million messages a second; a queued command per message and encoding it on the
/// task, another ~15% at three million.)
#[derive(Default)]
struct Intake {
    queue: std::sync::Mutex<IntakeQueue>,
    ready: Notify,
}

#[derive(Default)]
struct IntakeQueue {
    commands: Vec<Command>,
    /// Batches that filled up, oldest first.
    full: Vec<OpenBatch>,
    /// The batch being filled, after the full ones.
    open: Option<OpenBatch>,
    /// Sequence id of the next message (raised by the task to what the broker last stored).
    next_sequence_id: u64,
    /// Headroom of new batches (the task sets it: it depends on the producer name).
    batch_headroom: usize,
    /// The handle was dropped: the task closes the producer after what is queued.
    detached: bool,
    /// The task has finished: nothing more is taken.
    finished: bool,
}

/// What the task took on a wake-up, besides commands and full batches.
struct Taken {
    /// The handle is gone: close after handling what was taken.
    detached: bool,
    /// When the open batch (left in place) started.
    open_since: Option<Instant>,
}

impl Intake {
    fn lock(&self) -> std::sync::MutexGuard<'_, IntakeQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a message: into the open batch when batching, else as a command. On error the
    /// message is not queued and its sequence id not used.
    fn push_message(
        &self,
        message: ProducerMessage,
        reply: Reply,
        batching: Option<Batching>,
    ) -> Result<()> {
        let mut guard = self.lock();
        let queue = &mut *guard;
        if queue.finished {
            return Err(Error::Closed);
        }
        let sequence_id = queue.next_sequence_id;
        let Some(batching) = batching else {
            let wake = queue.commands.is_empty();
            queue.commands.push(Command::Send { message, sequence_id, reply });
            queue.next_sequence_id += 1;
            drop(guard);
            if wake {
                self.ready.notify_one();
            }
            return Ok(());
        };
        let size = message.payload.len();
        let mut wake = false;
        if queue.open.as_ref().is_some_and(|open| open.bytes + size > batching.max_bytes) {
            queue.full.extend(queue.open.take());
            wake = true;
        }
        let open = match &mut queue.open {
            Some(open) => open,
            None => {
                wake = true; // the task sends it at once when idle, else arms its deadline
                queue.open.insert(OpenBatch::new(sequence_id, batching, queue.batch_headroom))
            }
        };
        let fields = MessageFields {
            partition_key: message.key.as_deref(),
            event_time: message.event_time,
            sequence_id: Some(sequence_id),
        };
        let properties = message.properties.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        if let Err(e) = open.records.push_fields(fields, properties, &message.payload) {
            // Only a payload over 2 GiB gets here.
            if open.records.is_empty() {
                queue.open = None;
            }
            return Err(e.into());
        }
        open.waiters.push(reply);
        open.bytes += size;
        queue.next_sequence_id += 1;
        if open.records.len() >= batching.max_messages || open.bytes >= batching.max_bytes {
            queue.full.extend(queue.open.take());
            wake = true;
        }
        drop(guard);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    fn push(&self, command: Command) -> Result<()> {
        let mut queue = self.lock();
        if queue.finished {
            return Err(Error::Closed);
        }
        let wake = queue.commands.is_empty();
        queue.commands.push(command);
        drop(queue);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Moves the queued commands and full batches into `commands` and `full` (both empty).
    fn take(&self, commands: &mut Vec<Command>, full: &mut Vec<OpenBatch>) -> Taken {
        let mut queue = self.lock();
        std::mem::swap(&mut queue.commands, commands);
        std::mem::swap(&mut queue.full, full);
        Taken { detached: queue.detached, open_since: queue.open.as_ref().map(|b| b.since) }
    }

    /// The full batches and, if `due`, the open one: oldest first (the open batch never
    /// leaves before a full one). Also when the open batch left in place started.
    fn take_batches(&self, due: impl Fn(&OpenBatch) -> bool) -> (Vec<OpenBatch>, Option<Instant>) {
        let mut queue = self.lock();
        let mut batches = std::mem::take(&mut queue.full);
        if queue.open.as_ref().is_some_and(due) {
            batches.extend(queue.open.take());
        }
        (batches, queue.open.as_ref().map(|b| b.since))
    }

    /// The producer is (re)registered: sequence ids continue after what the broker last
    /// stored, and new batches leave room for the frame in front.
    fn connected(&self, last_sequence_id: Option<u64>, batch_headroom: usize) {
        let mut queue = self.lock();
        if let Some(last) = last_sequence_id {
            queue.next_sequence_id = queue.next_sequence_id.max(last + 1);
        }
        queue.batch_headroom = batch_headroom;
    }

    fn detach(&self) {
        self.lock().detached = true;
        self.ready.notify_one();
    }

    /// The task is done; returns what was still queued.
    fn finish(&self) -> (Vec<Command>, Vec<OpenBatch>) {
        let mut queue = self.lock();
        queue.finished = true;
        let mut batches = std::mem::take(&mut queue.full);
        batches.extend(queue.open.take());
        (std::mem::take(&mut queue.commands), batches)
    }
}

#[derive(Debug)]
struct Handle {
    topic: String,
    intake: Arc<Intake>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.intake.detach();
    }
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake").finish_non_exhaustive()
    }
}

/// Publishes messages to a topic. Dropping it stops its background tasks
/// once queued messages are sent; call [`Producer::close`] to wait.
#[derive(Debug)]
pub struct Producer {
    topic: String,
    partitions: Vec<Handle>,
    pending: Arc<Semaphore>,
    cursor: AtomicUsize,
    routing: Routing,
    batching: Option<Batching>,
    sticky: std::sync::Mutex<Sticky>,
    /// A [`SendListener`] is set.
    tagged: bool,
}

/// Round-robin state while batching: messages and bytes routed to the
/// current partition since `since`.
#[derive(Debug)]
struct Sticky {
    messages: u32,
    bytes: usize,
    since: Instant,
}

/// Resolves to the [`MessageId`] once the broker has stored the message.
#[derive(Debug)]
pub struct SendFuture(oneshot::Receiver<Result<MessageId>>);

impl Future for SendFuture {
    type Output = Result<MessageId>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.unwrap_or(Err(Error::Closed)))
    }
}

impl Producer {
    /// The topic (full name).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Number of partitions (1 for a non-partitioned topic).
    pub fn partitions(&self) -> usize {
        self.partitions.len()
    }

    /// Sends a message and waits for the broker's receipt.
    pub async fn send(&self, message: impl Into<ProducerMessage>) -> Result<MessageId> {
        self.send_async(message).await?.await
    }

    /// Queues a message. Waits only while `max_pending` messages are
    /// unacknowledged (backpressure), then returns a [`SendFuture`] for
    /// the receipt. Receipts complete in send order.
    ///
    /// ```no_run
    /// # async fn demo(producer: magnetar_client::Producer) -> magnetar_client::Result<()> {
    /// let mut receipts = Vec::new();
    /// for i in 0..10_000 {
    ///     receipts.push(producer.send_async(format!("msg-{i}")).await?);
    /// }
    /// for receipt in receipts {
    ///     receipt.await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn send_async(&self, message: impl Into<ProducerMessage>) -> Result<SendFuture> {
        let (reply, rx) = oneshot::channel();
        self.queue(message.into(), Reply::Future(reply)).await?;
        Ok(SendFuture(rx))
    }

    /// Queues a message like [`Producer::send_async`], and calls `callback`
    /// with its outcome once the broker has stored it (or it failed).
    /// Callbacks run on the producer's task, in send order: keep them short.
    /// At high rates this is cheaper than a future per message.
    ///
    /// ```no_run
    /// # async fn demo(producer: magnetar_client::Producer) -> magnetar_client::Result<()> {
    /// producer
    ///     .send_with_callback("event", |result| {
    ///         if let Err(e) = result {
    ///             eprintln!("not stored: {e}");
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_with_callback(
        &self,
        message: impl Into<ProducerMessage>,
        callback: impl FnOnce(Result<MessageId>) + Send + 'static,
    ) -> Result<()> {
        self.queue(message.into(), Reply::Callback(Box::new(callback))).await
    }

    /// Queues a message like [`Producer::send_async`]; its outcome goes to the producer's
    /// [`SendListener`] with `tag`, once per entry for a whole batch. Fails at once when the
    /// producer was built without [`ProducerBuilder::listener`].
    pub async fn send_tagged(&self, message: impl Into<ProducerMessage>, tag: u64) -> Result<()> {
        if !self.tagged {
            return Err(Error::Config("send_tagged needs ProducerBuilder::listener".into()));
        }
        self.queue(message.into(), Reply::Tag(tag)).await
    }

    async fn queue(&self, message: ProducerMessage, reply: Reply) -> Result<()> {
        // The task gives the permit back once the message is done (see `Permits`).
        // `try_acquire` first: the common case needs no future. It does not count against
        // tokio's cooperative budget, so count it: a sender that never waits still yields
        // now and then, letting the producer task send what is queued.
        match self.pending.try_acquire() {
            Ok(permit) => {
                permit.forget();
                tokio::task::consume_budget().await;
            }
            Err(_) => self.pending.acquire().await.map_err(|_| Error::Closed)?.forget(),
        }
        let index = self.route(&message);
        self.partitions[index].intake.push_message(message, reply, self.batching).inspect_err(
            |_| {
                self.pending.add_permits(1);
            },
        )
    }

    fn route(&self, message: &ProducerMessage) -> usize {
        let n = self.partitions.len();
        if n == 1 {
            return 0;
        }
        if let Some(key) = &message.key {
            return partition_for_key(key.as_bytes(), n as u32) as usize;
        }
        match self.routing {
            Routing::Single(p) => p as usize % n,
            Routing::RoundRobin => match self.batching {
                None => self.cursor.fetch_add(1, Ordering::Relaxed) % n,
                Some(batching) => {
                    // Stay on one partition for about a batch (count, bytes or
                    // delay), then move on, like the official clients.
                    let mut sticky = self.sticky.lock().unwrap_or_else(|e| e.into_inner());
                    let size = message.payload.len();
                    let now = Instant::now();
                    if sticky.messages >= batching.max_messages
                        || sticky.bytes + size > batching.max_bytes
                        || now.duration_since(sticky.since) >= batching.max_delay
                    {
                        self.cursor.fetch_add(1, Ordering::Relaxed);
                        *sticky = Sticky { messages: 0, bytes: 0, since: now };
                    }
                    sticky.messages += 1;
                    sticky.bytes += size;
                    self.cursor.load(Ordering::Relaxed) % n
                }
            },
        }
    }

    /// Sends the messages waiting in batches now.
    pub async fn flush(&self) -> Result<()> {
        for handle in &self.partitions {
            let (tx, rx) = oneshot::channel();
            handle.intake.push(Command::Flush(tx))?;
            rx.await.map_err(|_| Error::Closed)?;
        }
        Ok(())
    }

    /// Flushes, waits for pending receipts and closes the producer on the broker.
    pub async fn close(self) -> Result<()> {
        let mut result = Ok(());
        for handle in &self.partitions {
            let (tx, rx) = oneshot::channel();
            if handle.intake.push(Command::Close(tx)).is_ok() {
                if let Ok(Err(e)) = rx.await {
                    tracing::debug!(topic = %handle.topic, error = %e, "close failed");
                    result = Err(e);
                }
            }
        }
        result
    }
}

/// Where the outcome of a message goes.
enum Reply {
    Future(oneshot::Sender<Result<MessageId>>),
    Callback(Box<dyn FnOnce(Result<MessageId>) + Send>),
    /// To the producer's [`SendListener`].
    Tag(u64),
}

impl Reply {
    /// Reports the outcome (a tag to `listener`, which `send_tagged` made sure is there).
    fn complete(self, result: Result<MessageId>, listener: Option<&Listener>) {
        match self {
            Reply::Future(tx) => {
                let _ = tx.send(result);
            }
            Reply::Callback(callback) => callback(result),
            Reply::Tag(tag) => match (listener, result) {
                (Some(l), Ok(id)) => l.0.on_stored(&[tag], StoredIds { first: id }),
                (Some(l), Err(e)) => l.0.on_failed(&[tag], &e),
                (None, _) => {}
            },
        }
    }
}

/// Pending-message permits held by messages the task owns, given back to the
/// producer's semaphore in one call when dropped: for a whole entry, after
/// every waiter heard its outcome. (An `OwnedSemaphorePermit` per message
/// cost an `Arc` clone and a semaphore lock per message.)
struct Permits {
    semaphore: Arc<Semaphore>,
    count: usize,
}

impl Drop for Permits {
    fn drop(&mut self) {
        if self.count > 0 {
            self.semaphore.add_permits(self.count);
        }
    }
}

/// An entry sent and not yet acknowledged.
struct Pending {
    sequence_id: u64,
    frame: Bytes,
    batched: bool,
    waiters: Vec<Reply>,
    /// When it was first sent (the send timeout counts from here).
    sent_at: Instant,
    /// Dropped after the waiters completed.
    _permits: Permits,
}

/// Bytes kept in front of a batch for the SEND frame header and the message metadata, plus
/// the producer name's length (both hold less than 200 bytes besides the name).
const BATCH_HEADROOM: usize = 256;

/// A batch buffer is allocated for a full batch, up to this size (beyond, it grows).
const MAX_BATCH_PREALLOCATION: usize = 8 << 20;

/// `[metadataSize u32]` in front of an entry's metadata.
const METADATA_SIZE_LEN: usize = magnetar_protocol::constants::METADATA_SIZE_FIELD_LEN;

/// The task behind one (partition) producer.
struct PartitionProducer {
    client: Client,
    topic: String,
    partition: i32,
    config: Arc<Config>,
    producer_id: u64,
    name: String,
    conn: Option<Arc<Connection>>,
    events: Option<mpsc::UnboundedReceiver<ProducerEvent>>,
    /// Reconnection gave up: what is sent fails until a connection attempt succeeds.
    gave_up: bool,
    /// Pending-message semaphore shared by the partitions of a producer.
    semaphore: Arc<Semaphore>,
    intake: Arc<Intake>,
    /// When the open batch (in the intake) must leave.
    batch_deadline: Option<Instant>,
    pending: VecDeque<Pending>,
    /// Scratch for a run of tags reported to the listener in one call.
    tags: Vec<u64>,
}

/// A pseudo-random first partition, so that producers do not all start on 0.
fn start_partition() -> usize {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos() as usize).unwrap_or(0)
}

fn now_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn key_values(message: &ProducerMessage) -> Vec<KeyValue> {
    message.properties.iter().map(|(k, v)| KeyValue { key: k.clone(), value: v.clone() }).collect()
}

impl PartitionProducer {
    fn new(
        client: Client,
        topic: String,
        partition: i32,
        config: Arc<Config>,
        semaphore: Arc<Semaphore>,
        intake: Arc<Intake>,
    ) -> Self {
        let producer_id = client.next_id();
        Self {
            client,
            topic,
            partition,
            name: config.name.clone().unwrap_or_default(),
            config,
            producer_id,
            conn: None,
            events: None,
            gave_up: false,
            semaphore,
            intake,
            batch_deadline: None,
            pending: VecDeque::new(),
            tags: Vec::new(),
        }
    }

    /// Looks the topic up, registers the producer on the broker's connection.
    async fn connect(&mut self) -> Result<()> {
        let conn = self.client.topic_connection(&self.topic).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        conn.register_producer(self.producer_id, tx)?;
        let request_id = conn.request_id();
        let command = BaseCommand {
            producer: Some(Box::new(CommandProducer {
                topic: self.topic.clone(),
                producer_id: self.producer_id,
                request_id,
                producer_name: (!self.name.is_empty()).then(|| self.name.clone()),
                user_provided_producer_name: Some(self.config.name.is_some()),
                ..Default::default()
            })),
            ..commands::base(Type::Producer)
        };
        let reply = match conn.request(request_id, &command, "PRODUCER").await {
            Ok(reply) => reply,
            Err(e) => {
                conn.unregister_producer(self.producer_id);
                return Err(e);
            }
        };
        let success = reply
            .producer_success
            .ok_or_else(|| Error::Protocol("unexpected reply to PRODUCER".into()))?;
        self.name = success.producer_name.clone();
        let headroom = if self.config.compression == Compression::None {
            BATCH_HEADROOM + self.name.len()
        } else {
            0
        };
        let last = success.last_sequence_id.filter(|&s| s >= 0).map(|s| s as u64);
        self.intake.connected(last, headroom);
        self.gave_up = false;
        tracing::debug!(topic = %self.topic, name = %self.name, "producer ready");
        self.conn = Some(conn);
        self.events = Some(rx);
        Ok(())
    }

    fn permits(&self, count: usize) -> Permits {
        Permits { semaphore: self.semaphore.clone(), count }
    }

    async fn run(mut self) {
        let intake = self.intake.clone();
        let delay = self.config.batching.map_or(Duration::ZERO, |b| b.max_delay);
        // One timer for the batch deadline, re-armed once per batch (not per message).
        let timer = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(timer);
        let mut armed = None;
        // And one for the send timeout of the oldest pending entry.
        let expiry = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(expiry);
        let mut expiry_armed = None;
        let (mut commands, mut full) = (Vec::new(), Vec::new());
        'run: loop {
            if self.batch_deadline != armed {
                armed = self.batch_deadline;
                if let Some(deadline) = armed {
                    timer.as_mut().reset(deadline);
                }
            }
            let oldest_due = self
                .config
                .send_timeout
                .and_then(|timeout| Some(self.pending.front()?.sent_at + timeout));
            if oldest_due != expiry_armed {
                expiry_armed = oldest_due;
                if let Some(due) = expiry_armed {
                    expiry.as_mut().reset(due);
                }
            }
            let events = self.events.as_mut();
            let event = async move {
                match events {
                    Some(ev) => ev.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = intake.ready.notified() => {
                    let taken = intake.take(&mut commands, &mut full);
                    if self.gave_up {
                        self.revive().await;
                    }
                    for batch in full.drain(..) {
                        self.send_batch(batch);
                    }
                    let mut drained = commands.drain(..);
                    while let Some(command) = drained.next() {
                        if !self.on_command(command).await {
                            // Closed: the rest of this run fails here, what is still queued below.
                            self.fail_commands(drained);
                            break 'run;
                        }
                    }
                    if taken.detached {
                        let _ = self.close().await;
                        break 'run;
                    }
                    self.batch_deadline = taken.open_since.map(|since| since + delay);
                    self.flush_if_idle();
                }
                event = event => match event {
                    Some(ProducerEvent::Receipt(receipt)) => {
                        self.on_receipt(&receipt);
                        self.flush_if_idle();
                    }
                    Some(ProducerEvent::SendError(error)) => {
                        tracing::warn!(topic = %self.topic, error = ?error, "send error");
                        // The broker rejected the oldest pending entry: fail it.
                        if self.pending.front().is_some_and(|p| p.sequence_id == error.sequence_id) {
                            if let Some(p) = self.pending.pop_front() {
                                let e = Error::server(error.error, error.message.clone());
                                self.report(p.waiters, Err(&e));
                            }
                        }
                    }
                    Some(ProducerEvent::Closed) | None => self.reconnect().await,
                },
                () = &mut expiry, if expiry_armed.is_some() => {
                    self.fail_timed_out();
                }
                () = &mut timer, if armed.is_some() => {
                    let now = Instant::now();
                    let (due, open_since) = intake.take_batches(|b| b.since + delay <= now);
                    for batch in due {
                        self.send_batch(batch);
                    }
                    self.batch_deadline = open_since.map(|since| since + delay);
                }
            }
        }
        let (commands, batches) = intake.finish();
        self.fail_commands(commands);
        for batch in batches {
            self.fail_batch(batch, &Error::Closed);
        }
    }

    /// The oldest pending entry waited past the send timeout: it fails, and so does every
    /// entry behind it (Pulsar's clients fail the whole pending queue: ordering means none of
    /// them could be acknowledged first). Receipts that still come for them are ignored.
    fn fail_timed_out(&mut self) {
        let Some(timeout) = self.config.send_timeout else { return };
        if self.pending.front().is_none_or(|p| p.sent_at + timeout > Instant::now()) {
            return;
        }
        tracing::warn!(
            topic = %self.topic,
            pending = self.pending.len(),
            ?timeout,
            "send timed out: failing every pending message"
        );
        let error =
            Error::Timeout("send (no acknowledgement from the broker within the send timeout)");
        while let Some(pending) = self.pending.pop_front() {
            self.report(pending.waiters, Err(&error));
        }
    }

    /// After reconnection gave up, one more attempt per wake-up with something to send.
    async fn revive(&mut self) {
        match self.connect().await {
            Ok(()) => self.resend_pending(),
            Err(e) => tracing::debug!(topic = %self.topic, error = %e, "still disconnected"),
        }
    }

    /// Fails commands the task will not handle (it has closed the producer).
    fn fail_commands(&self, commands: impl IntoIterator<Item = Command>) {
        for command in commands {
            if let Command::Send { reply, .. } = command {
                reply.complete(Err(Error::Closed), self.config.listener.as_ref());
                self.semaphore.add_permits(1);
            }
        }
    }

    /// Handles one command; false when the producer is done.
    async fn on_command(&mut self, command: Command) -> bool {
        match command {
            Command::Send { message, sequence_id, reply } => {
                self.send_single(message, sequence_id, reply);
                true
            }
            Command::Flush(done) => {
                self.flush();
                let _ = done.send(());
                true
            }
            Command::Close(done) => {
                let result = self.close().await;
                let _ = done.send(result);
                false
            }
        }
    }

    /// Group commit on the client side: a batch goes out at once when nothing is in flight,
    /// and otherwise fills while the previous one is being stored (up to the count, bytes and
    /// delay limits). Low rates get round-trip latency instead of the batching delay; high
    /// rates still get full batches.
    fn flush_if_idle(&mut self) {
        if self.pending.is_empty() {
            self.flush();
        }
    }

    /// Sends every batch now.
    fn flush(&mut self) {
        let (batches, _) = self.intake.take_batches(|_| true);
        self.batch_deadline = None;
        for batch in batches {
            self.send_batch(batch);
        }
    }

    fn metadata(&self, sequence_id: u64, raw_len: usize) -> MessageMetadata {
        let compression = self.config.compression;
        MessageMetadata {
            producer_name: self.name.clone(),
            sequence_id,
            publish_time: now_millis(),
            compression: (compression != Compression::None).then(|| compression.wire() as i32),
            uncompressed_size: (compression != Compression::None).then_some(raw_len as u32),
            ..Default::default()
        }
    }

    fn send_single(&mut self, message: ProducerMessage, sequence_id: u64, reply: Reply) {
        let built = self.config.compression.compress(&message.payload).and_then(|payload| {
            let mut metadata = self.metadata(sequence_id, message.payload.len());
            metadata.properties = key_values(&message);
            metadata.partition_key = message.key.clone();
            metadata.event_time = message.event_time;
            self.frame(&metadata, &payload, sequence_id, None, 1)
        });
        let _permits = self.permits(1);
        match built {
            Ok(frame) => self.transmit(Pending {
                sequence_id,
                frame,
                batched: false,
                waiters: vec![reply],
                sent_at: Instant::now(),
                _permits,
            }),
            Err(e) => reply.complete(Err(e), self.config.listener.as_ref()),
        }
    }

    /// Frames a batch (compressing it, or in its own headroom) and sends it.
    fn send_batch(&mut self, batch: OpenBatch) {
        let OpenBatch { records, waiters, sequence_id, .. } = batch;
        let count = records.len() as i32;
        let highest = sequence_id + u64::from(records.len()) - 1;
        let mut metadata = self.metadata(sequence_id, records.byte_len());
        metadata.num_messages_in_batch = Some(count);
        metadata.highest_sequence_id = Some(highest);
        let built = if self.config.compression == Compression::None {
            self.check_size(METADATA_SIZE_LEN + metadata.encoded_len() + records.byte_len())
                .and_then(|()| {
                    let command = self.send_command(sequence_id, Some(highest), count);
                    Ok(records.into_send_frame(&command, &metadata)?)
                })
        } else {
            self.config.compression.compress(&records.finish()).and_then(|payload| {
                self.frame(&metadata, &payload, sequence_id, Some(highest), count)
            })
        };
        let _permits = self.permits(waiters.len());
        match built {
            Ok(frame) => {
                let sent_at = Instant::now();
                self.transmit(Pending {
                    sequence_id,
                    frame,
                    batched: true,
                    waiters,
                    sent_at,
                    _permits,
                })
            }
            Err(e) => self.report(waiters, Err(&e)),
        }
    }

    /// Fails a batch that will not be sent.
    fn fail_batch(&mut self, batch: OpenBatch, error: &Error) {
        let _permits = self.permits(batch.waiters.len());
        self.report(batch.waiters, Err(error));
    }

    fn frame(
        &self,
        metadata: &MessageMetadata,
        payload: &[u8],
        sequence_id: u64,
        highest: Option<u64>,
        num_messages: i32,
    ) -> Result<Bytes> {
        let entry = metadata_and_payload(metadata, payload)?;
        self.check_size(entry.len())?;
        let command = self.send_command(sequence_id, highest, num_messages);
        let mut out = BytesMut::new();
        encode_payload_command(&command, None, &entry, &mut out)?;
        Ok(out.freeze())
    }

    /// An entry of `size` bytes fits the broker's limit.
    fn check_size(&self, size: usize) -> Result<()> {
        let max = self
            .conn
            .as_ref()
            .map_or(magnetar_protocol::constants::DEFAULT_MAX_MESSAGE_SIZE, |c| {
                c.max_message_size()
            });
        if size > max {
            return Err(Error::MessageTooLarge { size, max });
        }
        Ok(())
    }

    fn send_command(
        &self,
        sequence_id: u64,
        highest: Option<u64>,
        num_messages: i32,
    ) -> BaseCommand {
        let mut command = commands::send(self.producer_id, sequence_id, num_messages);
        if let Some(send) = command.send.as_mut() {
            send.highest_sequence_id = highest;
        }
        command
    }

    fn transmit(&mut self, pending: Pending) {
        if self.gave_up {
            let _permits = pending._permits;
            self.report(pending.waiters, Err(&Error::Disconnected));
            return;
        }
        if let Some(conn) = &self.conn {
            // On failure the connection is closing: the resend after
            // reconnection covers this entry.
            let _ = conn.send_frame(pending.frame.clone());
        }
        self.pending.push_back(pending);
    }

    fn on_receipt(&mut self, receipt: &magnetar_protocol::proto::CommandSendReceipt) {
        let Some(front) = self.pending.front() else {
            tracing::debug!(seq = receipt.sequence_id, "receipt with nothing pending");
            return;
        };
        if receipt.sequence_id < front.sequence_id {
            tracing::debug!(seq = receipt.sequence_id, "duplicate receipt ignored");
            return;
        }
        if receipt.sequence_id > front.sequence_id {
            // Out of order: the broker lost something. Resend from scratch.
            tracing::warn!(
                got = receipt.sequence_id,
                expected = front.sequence_id,
                "receipt out of order"
            );
            if let Some(conn) = &self.conn {
                conn.close();
            }
            return;
        }
        let Some(pending) = self.pending.pop_front() else { return };
        let wire = receipt.message_id.clone().unwrap_or_default();
        let partition = if self.partition >= 0 { self.partition } else { wire.partition() };
        let mut first = MessageId::new(wire.ledger_id, wire.entry_id, partition);
        if pending.batched {
            first.batch_index = 0;
            first.batch_size = pending.waiters.len() as i32;
        }
        self.report(pending.waiters, Ok(StoredIds { first }));
    }

    /// Reports one entry's outcome to its waiters, in order: runs of tags to the listener in
    /// one call, futures and callbacks one by one.
    fn report(&mut self, waiters: Vec<Reply>, outcome: Result<StoredIds, &Error>) {
        let listener = self.config.listener.as_ref();
        let tags = &mut self.tags;
        let mut run_start = 0;
        let report_run = |tags: &mut Vec<u64>, run_start: usize| {
            match (listener, &outcome) {
                (_, _) if tags.is_empty() => {}
                (Some(l), Ok(ids)) => l.0.on_stored(tags, StoredIds { first: ids.get(run_start) }),
                (Some(l), Err(e)) => l.0.on_failed(tags, e),
                (None, _) => {}
            }
            tags.clear();
        };
        for (i, waiter) in waiters.into_iter().enumerate() {
            match waiter {
                Reply::Tag(tag) => {
                    if tags.is_empty() {
                        run_start = i;
                    }
                    tags.push(tag);
                }
                other => {
                    report_run(tags, run_start);
                    let result = match &outcome {
                        Ok(ids) => Ok(ids.get(i)),
                        Err(e) => Err(e.duplicate()),
                    };
                    other.complete(result, listener);
                }
            }
        }
        report_run(tags, run_start);
    }

    /// Re-creates the producer (possibly on another broker) and resends
    /// every pending entry in order. Gives up after about a minute, failing
    /// what is pending.
    async fn reconnect(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.unregister_producer(self.producer_id);
        }
        self.events = None;
        let mut backoff = Duration::from_millis(50);
        let give_up = Instant::now() + Duration::from_secs(60);
        loop {
            match self.connect().await {
                Ok(()) => break,
                Err(error) if Instant::now() < give_up => {
                    tracing::debug!(topic = %self.topic, %error, "reconnect failed, retrying");
                    // Backoff between attempts, not synchronisation.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(error) => {
                    tracing::warn!(topic = %self.topic, %error, "producer reconnect gave up");
                    self.gave_up = true;
                    for p in std::mem::take(&mut self.pending) {
                        let _permits = p._permits;
                        self.report(p.waiters, Err(&Error::Disconnected));
                    }
                    return;
                }
            }
        }
        self.resend_pending();
    }

    fn resend_pending(&self) {
        if let Some(conn) = &self.conn {
            for p in &self.pending {
                let _ = conn.send_frame(p.frame.clone());
            }
        }
    }

    async fn close(&mut self) -> Result<()> {
        self.flush();
        // Wait for the receipts of what is pending.
        while !self.pending.is_empty() {
            let Some(events) = self.events.as_mut() else { break };
            match tokio::time::timeout(crate::connection::REQUEST_TIMEOUT, events.recv()).await {
                Ok(Some(ProducerEvent::Receipt(r))) => self.on_receipt(&r),
                Ok(Some(ProducerEvent::SendError(_)))
                | Ok(Some(ProducerEvent::Closed))
                | Ok(None) => {
                    self.reconnect().await;
                }
                Err(_) => return Err(Error::Timeout("pending receipts")),
            }
        }
        let Some(conn) = self.conn.take() else { return Ok(()) };
        conn.unregister_producer(self.producer_id);
        let request_id = conn.request_id();
        let command = BaseCommand {
            close_producer: Some(Box::new(CommandCloseProducer {
                producer_id: self.producer_id,
                request_id,
                ..Default::default()
            })),
            ..commands::base(Type::CloseProducer)
        };
        conn.request(request_id, &command, "CLOSE_PRODUCER").await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batching(max_messages: u32, max_bytes: usize) -> Option<Batching> {
        Some(Batching { max_messages, max_bytes, max_delay: Duration::from_millis(1) })
    }

    fn push(intake: &Intake, payload: &'static [u8], batching: Option<Batching>) {
        intake.push_message(ProducerMessage::new(payload), Reply::Tag(0), batching).unwrap();
    }

    /// (first sequence id, messages) of each batch.
    fn shape(batches: &[OpenBatch]) -> Vec<(u64, u32)> {
        batches.iter().map(|b| (b.sequence_id, b.records.len())).collect()
    }

    #[test]
    fn batches_fill_by_count_and_bytes_and_leave_oldest_first() {
        let intake = Intake::default();
        intake.connected(Some(9), 0);
        for _ in 0..5 {
            push(&intake, b"abc", batching(2, 1000));
        }
        // Bytes: a message that would overflow the open batch starts the next one.
        push(&intake, &[1; 600], batching(100, 1000));
        push(&intake, &[2; 600], batching(100, 1000));
        let (mut commands, mut full) = (Vec::new(), Vec::new());
        let taken = intake.take(&mut commands, &mut full);
        assert!(commands.is_empty() && !taken.detached);
        assert_eq!(shape(&full), [(10, 2), (12, 2), (14, 2)]);
        assert!(taken.open_since.is_some(), "the last message is still open");

        push(&intake, b"x", batching(100, 1000));
        push(&intake, &[3; 500], batching(100, 1000));
        // Not due: the full batch leaves, the open one stays.
        let (due, open_since) = intake.take_batches(|_| false);
        assert_eq!(shape(&due), [(16, 2)]);
        assert!(open_since.is_some());
        let (due, open_since) = intake.take_batches(|_| true);
        assert_eq!(shape(&due), [(18, 1)]);
        assert_eq!(open_since, None);
    }

    #[test]
    fn without_batching_messages_are_commands_with_their_sequence_ids() {
        let intake = Intake::default();
        push(&intake, b"a", None);
        push(&intake, b"b", None);
        let (mut commands, mut full) = (Vec::new(), Vec::new());
        intake.take(&mut commands, &mut full);
        let ids: Vec<u64> = commands
            .iter()
            .map(|c| match c {
                Command::Send { sequence_id, .. } => *sequence_id,
                _ => u64::MAX,
            })
            .collect();
        assert_eq!(ids, [0, 1]);
        assert!(full.is_empty());
        let (commands, batches) = intake.finish();
        assert!(commands.is_empty() && batches.is_empty());
        assert!(matches!(
            intake.push_message(ProducerMessage::new("late"), Reply::Tag(0), None),
            Err(Error::Closed)
        ));
    }
}
