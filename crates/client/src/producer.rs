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
}

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
            );
            actor.connect().await?;
            tokio::spawn(actor.run(intake.clone()));
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

/// From the [`Producer`] handle to a partition's task. A `Send` holds one
/// pending-message permit, taken from the semaphore and forgotten; the task
/// returns it (see [`Permits`]).
enum Command {
    Send { message: ProducerMessage, reply: Reply },
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<Result<()>>),
}

/// The command queue of one partition's task: a locked `Vec` the task swaps
/// out whole, woken only when the queue goes from empty to non-empty. At a
/// million messages a second that is one lock per message and one wake-up
/// per drained run; tokio's mpsc channel (a linked block list, a wake-up
/// check per send) took about 15% of the client's CPU in the same place.
#[derive(Default)]
struct Intake {
    queue: std::sync::Mutex<IntakeQueue>,
    ready: Notify,
}

#[derive(Default)]
struct IntakeQueue {
    commands: Vec<Command>,
    /// The handle was dropped: the task closes the producer once the queue is empty.
    detached: bool,
    /// The task has finished: nothing more is taken.
    finished: bool,
}

impl Intake {
    fn lock(&self) -> std::sync::MutexGuard<'_, IntakeQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Moves every queued command into `into` (empty); true when the handle is
    /// gone and nothing was queued.
    fn take(&self, into: &mut Vec<Command>) -> bool {
        let mut queue = self.lock();
        std::mem::swap(&mut queue.commands, into);
        into.is_empty() && queue.detached
    }

    fn detach(&self) {
        self.lock().detached = true;
        self.ready.notify_one();
    }

    /// The task is done; returns what was still queued.
    fn finish(&self) -> Vec<Command> {
        let mut queue = self.lock();
        queue.finished = true;
        std::mem::take(&mut queue.commands)
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
        self.partitions[index].intake.push(Command::Send { message, reply }).inspect_err(|_| {
            self.pending.add_permits(1);
        })
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
    next_sequence_id: u64,
    /// Pending-message semaphore shared by the partitions of a producer.
    semaphore: Arc<Semaphore>,
    /// The open batch, encoded as its messages arrive: consecutive sequence ids from
    /// `batch_sequence_id`, and their waiters.
    batch: BatchBuilder,
    batch_waiters: Vec<Reply>,
    batch_sequence_id: u64,
    batch_bytes: usize,
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
            next_sequence_id: 0,
            semaphore,
            batch: BatchBuilder::new(),
            batch_waiters: Vec::new(),
            batch_sequence_id: 0,
            batch_bytes: 0,
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
        if let Some(last) = success.last_sequence_id.filter(|&s| s >= 0) {
            self.next_sequence_id = self.next_sequence_id.max(last as u64 + 1);
        }
        tracing::debug!(topic = %self.topic, name = %self.name, "producer ready");
        self.conn = Some(conn);
        self.events = Some(rx);
        Ok(())
    }

    fn permits(&self, count: usize) -> Permits {
        Permits { semaphore: self.semaphore.clone(), count }
    }

    async fn run(mut self, intake: Arc<Intake>) {
        // One timer for the batch deadline, re-armed once per batch (not per message).
        let timer = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(timer);
        let mut armed = None;
        let mut commands = Vec::new();
        'run: loop {
            if self.batch_deadline != armed {
                armed = self.batch_deadline;
                if let Some(deadline) = armed {
                    timer.as_mut().reset(deadline);
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
                    let detached = intake.take(&mut commands);
                    let mut drained = commands.drain(..);
                    while let Some(command) = drained.next() {
                        if !self.on_command(command).await {
                            // Closed: the rest of this run fails here, what is still queued below.
                            self.fail_commands(drained);
                            break 'run;
                        }
                    }
                    if detached {
                        let _ = self.close().await;
                        break 'run;
                    }
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
                                for w in p.waiters {
                                    let e = Error::server(error.error, error.message.clone());
                                    w.complete(Err(e), self.config.listener.as_ref());
                                }
                            }
                        }
                    }
                    Some(ProducerEvent::Closed) | None => self.reconnect().await,
                },
                () = &mut timer, if armed.is_some() => self.flush(),
            }
        }
        let rest = intake.finish();
        self.fail_commands(rest);
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
            Command::Send { message, reply } => {
                // After a reconnection gave up: one attempt per message.
                if self.conn.is_none() {
                    match self.connect().await {
                        Ok(()) => self.resend_pending(),
                        Err(e) => {
                            reply.complete(Err(e), self.config.listener.as_ref());
                            self.semaphore.add_permits(1);
                            return true;
                        }
                    }
                }
                self.enqueue(message, reply);
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

    fn enqueue(&mut self, message: ProducerMessage, reply: Reply) {
        let sequence_id = self.next_sequence_id;
        let Some(batching) = self.config.batching else {
            self.next_sequence_id += 1;
            self.send_single(message, sequence_id, reply);
            return;
        };
        let size = message.payload.len();
        if !self.batch.is_empty() && self.batch_bytes + size > batching.max_bytes {
            self.flush();
        }
        if self.batch.is_empty() {
            self.batch = self.new_batch(batching);
            self.batch_deadline = Some(Instant::now() + batching.max_delay);
            self.batch_sequence_id = sequence_id;
        }
        let fields = MessageFields {
            partition_key: message.key.as_deref(),
            event_time: message.event_time,
            sequence_id: Some(sequence_id),
        };
        let properties = message.properties.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        if let Err(e) = self.batch.push_fields(fields, properties, &message.payload) {
            // Only a message over 2 GiB gets here; its sequence id is not used.
            reply.complete(Err(e.into()), self.config.listener.as_ref());
            self.semaphore.add_permits(1);
            return;
        }
        self.next_sequence_id += 1;
        self.batch_bytes += size;
        self.batch_waiters.push(reply);
        if self.batch.len() >= batching.max_messages || self.batch_bytes >= batching.max_bytes {
            self.flush();
        }
    }

    /// An empty batch with room for a full one, and headroom for the frame header and
    /// metadata so that an uncompressed batch is sent without copying it again.
    fn new_batch(&self, batching: Batching) -> BatchBuilder {
        let headroom = if self.config.compression == Compression::None {
            BATCH_HEADROOM + self.name.len()
        } else {
            0
        };
        // Each record adds its size field and a few metadata bytes to the payload.
        let records = batching.max_bytes.saturating_add(batching.max_messages as usize * 16);
        BatchBuilder::with_headroom(headroom, records.min(MAX_BATCH_PREALLOCATION))
    }

    /// Group commit on the client side: a batch goes out at once when nothing is in flight,
    /// and otherwise fills while the previous one is being stored (up to the count, bytes and
    /// delay limits). Low rates get round-trip latency instead of the batching delay; high
    /// rates still get full batches.
    fn flush_if_idle(&mut self) {
        if self.pending.is_empty() && !self.batch.is_empty() {
            self.flush();
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
                _permits,
            }),
            Err(e) => reply.complete(Err(e), self.config.listener.as_ref()),
        }
    }

    /// Sends the current batch.
    fn flush(&mut self) {
        self.batch_deadline = None;
        self.batch_bytes = 0;
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let sequence_id = self.batch_sequence_id;
        let count = batch.len() as i32;
        let highest = sequence_id + batch.len() as u64 - 1;
        let mut metadata = self.metadata(sequence_id, batch.byte_len());
        metadata.num_messages_in_batch = Some(count);
        metadata.highest_sequence_id = Some(highest);
        let built = if self.config.compression == Compression::None {
            self.check_size(METADATA_SIZE_LEN + metadata.encoded_len() + batch.byte_len()).and_then(
                |()| {
                    let command = self.send_command(sequence_id, Some(highest), count);
                    Ok(batch.into_send_frame(&command, &metadata)?)
                },
            )
        } else {
            self.config.compression.compress(&batch.finish()).and_then(|payload| {
                self.frame(&metadata, &payload, sequence_id, Some(highest), count)
            })
        };
        let capacity = self.batch_waiters.len();
        let waiters = std::mem::replace(&mut self.batch_waiters, Vec::with_capacity(capacity));
        let _permits = self.permits(waiters.len());
        match built {
            Ok(frame) => {
                self.transmit(Pending { sequence_id, frame, batched: true, waiters, _permits })
            }
            Err(e) => {
                let text = e.to_string();
                for w in waiters {
                    w.complete(Err(Error::Protocol(text.clone())), self.config.listener.as_ref());
                }
            }
        }
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
        let ids = StoredIds { first };
        // Runs of tags go to the listener in one call; other waiters one by one, in order.
        let listener = self.config.listener.as_ref();
        let tags = &mut self.tags;
        let mut run_start = 0;
        let report_run = |tags: &mut Vec<u64>, run_start: usize| {
            if let (Some(l), false) = (listener, tags.is_empty()) {
                l.0.on_stored(tags, StoredIds { first: ids.get(run_start) });
            }
            tags.clear();
        };
        for (i, waiter) in pending.waiters.into_iter().enumerate() {
            match waiter {
                Reply::Tag(tag) => {
                    if tags.is_empty() {
                        run_start = i;
                    }
                    tags.push(tag);
                }
                other => {
                    report_run(tags, run_start);
                    other.complete(Ok(ids.get(i)), listener);
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
                    for p in self.pending.drain(..) {
                        for w in p.waiters {
                            w.complete(Err(Error::Disconnected), self.config.listener.as_ref());
                        }
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
