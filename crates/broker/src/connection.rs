//! One client connection: frames in, commands handled, frames out.
//!
//! A reader loop decodes frames and handles each command; a writer task drains the connection's
//! [`Outbox`] (send receipts, messages, replies) into the socket, gathering what is queued into
//! one vectored write (stored entries are sent from their own buffers, never copied). Receipts are sent from the storage completion callback, which runs in append
//! order, so a producer's receipts are in order without any extra queue.
//!
//! Bad input: a malformed frame closes this connection (after an ERROR where a request id is
//! known); a bad checksum on SEND answers SEND_ERROR and keeps the connection, as Pulsar does.
//! Nothing a client sends can panic the broker.

use crate::cursor::Position;
use crate::dedup::DupStatus;
use crate::error::BrokerError;
use crate::non_persistent::{NonPersistentTopic, NpConsumer, NpSubscription};
use crate::ownership::LookupAnswer;
use crate::service::BrokerService;
use crate::subscription::{ConsumerHandle, Subscription};
use crate::topic::{ProducerClient, StartAt, Topic};
use bytes::{Bytes, BytesMut};
use magnetar_admin::names::{TopicDomain, TopicName};
use magnetar_admin::schema::{SchemaData, TYPE_AUTO_CONSUME};
use magnetar_protocol::proto::{
    base_command::Type,
    command_ack::AckType,
    command_lookup_topic_response::LookupType,
    command_subscribe::{InitialPosition, SubType},
    BaseCommand, CommandConsumerStatsResponse, CommandProducer, CommandSubscribe,
    ProducerAccessMode, Schema, ServerError,
};
use magnetar_protocol::{
    commands, encode_command, encode_payload_command_header, Frame, FrameDecoder, FrameError,
};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Highest protocol version whose features we implement.
const PROTOCOL_VERSION: i32 = 19;
const SERVER_VERSION: &str = concat!("magnetar-", env!("CARGO_PKG_VERSION"));

/// Encoded frames on their way to one connection's socket.
#[derive(Clone)]
pub struct Outbox {
    sender: mpsc::UnboundedSender<OutFrame>,
}

/// One frame: its encoded head and, for a MESSAGE, the stored entry it carries (shared, not
/// copied). Sent as one item so frames from different tasks never interleave.
pub(crate) struct OutFrame {
    head: Bytes,
    body: Bytes,
}

#[cfg(test)]
impl OutFrame {
    /// The frame as the peer decodes it.
    pub(crate) fn decode(&self) -> magnetar_protocol::Frame {
        let mut bytes = BytesMut::from(&self.head[..]);
        bytes.extend_from_slice(&self.body);
        let (frame, _) =
            FrameDecoder::default().decode(&bytes).expect("a valid frame").expect("a whole frame");
        frame
    }
}

impl Outbox {
    /// An outbox and the receiving end of its frames (tests drive dispatch through it).
    #[cfg(test)]
    pub(crate) fn channel() -> (Outbox, mpsc::UnboundedReceiver<OutFrame>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Outbox { sender }, receiver)
    }

    pub fn send_command(&self, command: &BaseCommand) {
        let mut buf = BytesMut::new();
        match encode_command(command, &mut buf) {
            Ok(()) => {
                let _ = self.sender.send(OutFrame { head: buf.freeze(), body: Bytes::new() });
            }
            Err(error) => tracing::error!(%error, "command not encodable; dropped"),
        }
    }

    pub fn send_payload(&self, command: &BaseCommand, metadata_and_payload: &Bytes) {
        let mut buf = BytesMut::new();
        match encode_payload_command_header(command, None, metadata_and_payload, &mut buf) {
            Ok(()) => {
                let frame = OutFrame { head: buf.freeze(), body: metadata_and_payload.clone() };
                let _ = self.sender.send(frame);
            }
            Err(error) => tracing::error!(%error, "message not encodable; dropped"),
        }
    }
}

/// Most bytes and buffers gathered into one vectored write.
const MAX_WRITE_BYTES: usize = 1 << 20;
const MAX_WRITE_BUFFERS: usize = 512;

/// Drains the outbox into the socket until every sender is gone or the socket fails.
async fn write_frames(
    mut receiver: mpsc::UnboundedReceiver<OutFrame>,
    mut writer: tokio::net::tcp::OwnedWriteHalf,
) {
    let mut queued: VecDeque<Bytes> = VecDeque::new();
    let push = |frame: OutFrame, queued: &mut VecDeque<Bytes>| {
        let len = frame.head.len() + frame.body.len();
        queued.push_back(frame.head);
        if !frame.body.is_empty() {
            queued.push_back(frame.body);
        }
        len
    };
    while let Some(frame) = receiver.recv().await {
        let mut bytes = push(frame, &mut queued);
        while bytes < MAX_WRITE_BYTES && queued.len() < MAX_WRITE_BUFFERS {
            match receiver.try_recv() {
                Ok(more) => bytes += push(more, &mut queued),
                Err(_) => break,
            }
        }
        if write_all_vectored(&mut writer, &mut queued).await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// Writes every queued buffer, in order, with as few syscalls as the socket allows.
async fn write_all_vectored(
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    queued: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    while !queued.is_empty() {
        let slices: Vec<std::io::IoSlice<'_>> =
            queued.iter().map(|b| std::io::IoSlice::new(b)).collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let Some(front) = queued.front_mut() else { break };
            if written >= front.len() {
                written -= front.len();
                queued.pop_front();
            } else {
                let _ = front.split_to(written);
                written = 0;
            }
        }
    }
    Ok(())
}

struct ProducerContext {
    topic: Arc<Topic>,
    /// Shared with every SEND's completion callback (a clone is a reference count).
    name: Arc<str>,
    key: u64,
    partition: i32,
    schema_version: Option<u64>,
}

struct ConsumerContext {
    topic: Arc<Topic>,
    subscription: Arc<Subscription>,
    key: u64,
}

struct NpProducerContext {
    topic: Arc<NonPersistentTopic>,
    name: String,
    key: u64,
}

struct NpConsumerContext {
    topic: Arc<NonPersistentTopic>,
    subscription: Arc<NpSubscription>,
    key: u64,
}

struct Connection {
    service: Arc<BrokerService>,
    outbox: Outbox,
    connected: bool,
    producers: HashMap<u64, ProducerContext>,
    consumers: HashMap<u64, ConsumerContext>,
    /// Producers and consumers of non-persistent topics (ids share the client's id space with
    /// the persistent ones).
    np_producers: HashMap<u64, NpProducerContext>,
    np_consumers: HashMap<u64, NpConsumerContext>,
    /// PRODUCER and SUBSCRIBE requests being served by their own tasks, by producer / consumer
    /// id; a CLOSE meanwhile aborts the task.
    pending_producers: HashMap<u64, JoinHandle<()>>,
    pending_consumers: HashMap<u64, JoinHandle<()>>,
    /// Where those tasks send what they must finish on the connection.
    completions: mpsc::UnboundedSender<Completion>,
    peer: String,
}

static PRODUCER_NAMES: AtomicU64 = AtomicU64::new(0);

/// Serves one connection until the peer leaves, errs, idles out, or `shutdown` fires.
pub async fn serve(
    service: Arc<BrokerService>,
    socket: TcpStream,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let peer = socket.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let _ = socket.set_nodelay(true);
    let (mut reader, writer) = socket.into_split();
    let (sender, receiver) = mpsc::unbounded_channel::<OutFrame>();
    let writer_task = tokio::spawn(write_frames(receiver, writer));
    let (completions, mut completed) = mpsc::unbounded_channel::<Completion>();
    let mut connection = Connection {
        service: service.clone(),
        outbox: Outbox { sender },
        connected: false,
        producers: HashMap::new(),
        consumers: HashMap::new(),
        np_producers: HashMap::new(),
        np_consumers: HashMap::new(),
        pending_producers: HashMap::new(),
        pending_consumers: HashMap::new(),
        completions,
        peer,
    };
    let decoder = FrameDecoder::with_max_message_size(service.config.max_message_size);
    let keepalive = service.config.keepalive();
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut idle_rounds = 0u32;
    'connection: loop {
        loop {
            match decoder.decode_buf(&mut buf) {
                Ok(Some(frame)) => {
                    idle_rounds = 0;
                    if let Err(why) = connection.handle(frame).await {
                        tracing::debug!(peer = %connection.peer, %why, "closing connection");
                        break 'connection;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    if !connection.handle_frame_error(&error) {
                        tracing::info!(peer = %connection.peer, %error, "bad frame; closing connection");
                        break 'connection;
                    }
                }
            }
        }
        tokio::select! {
            read = tokio::time::timeout(keepalive, reader.read_buf(&mut buf)) => match read {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => {}
                Err(_) => {
                    idle_rounds += 1;
                    if idle_rounds >= 2 {
                        tracing::info!(peer = %connection.peer, "keepalive expired; closing connection");
                        break;
                    }
                    connection.outbox.send_command(&commands::ping());
                }
            },
            Some(finish) = completed.recv() => finish(&mut connection),
            _ = shutdown.changed() => break,
        }
    }
    connection.cleanup(&mut completed).await;
    drop(connection);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer_task).await;
}

type Handled = Result<(), String>;

impl Connection {
    /// Reacts to a frame that failed to decode. Returns whether the connection may go on.
    fn handle_frame_error(&mut self, error: &FrameError) -> bool {
        if let FrameError::ChecksumMismatch { command, .. } = error {
            if let Some(send) = command.send.as_ref() {
                let reply = commands::send_error(
                    send.producer_id,
                    send.sequence_id,
                    ServerError::ChecksumError,
                    "checksum mismatch",
                );
                self.outbox.send_command(&reply);
                return true;
            }
        }
        !error.is_fatal()
    }

    /// Runs a request's slow part (topic loads, metadata, waits) on a task of its own; what it
    /// returns is then run on the connection, in the connection's loop.
    fn spawn_request(
        &self,
        work: impl std::future::Future<Output = Completion> + Send + 'static,
    ) -> JoinHandle<()> {
        let done = self.completions.clone();
        tokio::spawn(async move {
            let _ = done.send(work.await);
        })
    }

    fn reply_error(&self, request_id: u64, error: &BrokerError) {
        self.outbox.send_command(&commands::error(
            request_id,
            error.server_error(),
            error.to_string(),
        ));
    }

    async fn handle(&mut self, frame: Frame) -> Handled {
        let Frame { command, payload } = frame;
        let Some(kind) = commands::command_type(&command) else {
            return Err(format!("unknown command type {}", command.r#type));
        };
        if !self.connected && kind != Type::Connect {
            return Err(format!("{kind:?} before CONNECT"));
        }
        match kind {
            Type::Connect => self.on_connect(&command),
            Type::Ping => {
                self.outbox.send_command(&commands::pong());
                Ok(())
            }
            Type::Pong => Ok(()),
            Type::PartitionedMetadata => self.on_partitioned_metadata(&command).await,
            Type::Lookup => self.on_lookup(&command),
            Type::Producer => self.on_producer(&command),
            Type::Send => self.on_send(&command, payload.map(|p| p.metadata_and_payload)),
            Type::CloseProducer => self.on_close_producer(&command),
            Type::Subscribe => self.on_subscribe(&command),
            Type::Flow => self.on_flow(&command),
            Type::Ack => self.on_ack(&command),
            Type::RedeliverUnacknowledgedMessages => self.on_redeliver(&command),
            Type::CloseConsumer => self.on_close_consumer(&command).await,
            Type::Unsubscribe => self.on_unsubscribe(&command).await,
            Type::GetLastMessageId => self.on_get_last_message_id(&command),
            Type::ConsumerStats => self.on_consumer_stats(&command),
            Type::Seek => self.on_seek(&command).await,
            Type::GetTopicsOfNamespace => self.on_get_topics_of_namespace(&command).await,
            Type::GetSchema => self.on_get_schema(&command).await,
            Type::GetOrCreateSchema => self.on_get_or_create_schema(&command).await,
            other => {
                self.on_unsupported(&command, other);
                Ok(())
            }
        }
    }

    /// A command this broker does not serve (transactions, topic-list watchers, responses a
    /// client has no business sending): a request gets an ERROR naming it, as Pulsar answers
    /// with transactions disabled; the connection goes on either way.
    fn on_unsupported(&self, command: &BaseCommand, kind: Type) {
        let request_id = match kind {
            Type::NewTxn => command.new_txn.as_ref().map(|c| c.request_id),
            Type::AddPartitionToTxn => command.add_partition_to_txn.as_ref().map(|c| c.request_id),
            Type::AddSubscriptionToTxn => {
                command.add_subscription_to_txn.as_ref().map(|c| c.request_id)
            }
            Type::EndTxn => command.end_txn.as_ref().map(|c| c.request_id),
            Type::EndTxnOnPartition => command.end_txn_on_partition.as_ref().map(|c| c.request_id),
            Type::EndTxnOnSubscription => {
                command.end_txn_on_subscription.as_ref().map(|c| c.request_id)
            }
            Type::TcClientConnectRequest => {
                command.tc_client_connect_request.as_ref().map(|c| c.request_id)
            }
            Type::WatchTopicList => command.watch_topic_list.as_ref().map(|c| c.request_id),
            Type::WatchTopicListClose => {
                command.watch_topic_list_close.as_ref().map(|c| c.request_id)
            }
            _ => None,
        };
        let why = match kind {
            Type::NewTxn
            | Type::AddPartitionToTxn
            | Type::AddSubscriptionToTxn
            | Type::EndTxn
            | Type::EndTxnOnPartition
            | Type::EndTxnOnSubscription
            | Type::TcClientConnectRequest => "Transactions are not enabled.".to_string(),
            other => format!("{} is not supported by this broker", other.as_str_name()),
        };
        match request_id {
            Some(request_id) => {
                let error = commands::error(request_id, ServerError::NotAllowedError, &why);
                self.outbox.send_command(&error);
            }
            None => tracing::debug!(peer = %self.peer, ?kind, "ignored a command we do not serve"),
        }
    }

    fn on_connect(&mut self, command: &BaseCommand) -> Handled {
        let connect = command.connect.as_ref().ok_or("CONNECT without body")?;
        if self.connected {
            return Err("second CONNECT".into());
        }
        let client_version = connect.protocol_version.unwrap_or(0);
        let version = client_version.clamp(0, PROTOCOL_VERSION);
        let max_message_size = i32::try_from(self.service.config.max_message_size).ok();
        self.outbox.send_command(&commands::connected(
            SERVER_VERSION,
            version,
            max_message_size,
            None,
        ));
        self.connected = true;
        tracing::debug!(peer = %self.peer, client = %connect.client_version, version, "connected");
        Ok(())
    }

    async fn on_partitioned_metadata(&mut self, command: &BaseCommand) -> Handled {
        let request =
            command.partition_metadata.as_ref().ok_or("PARTITIONED_METADATA without body")?;
        let request_id = request.request_id;
        let result = async {
            let name = BrokerService::topic_name(&request.topic)?;
            let partitions = self.service.partitions(&name).await?;
            let may_create = request.metadata_auto_creation_enabled.unwrap_or(true)
                && self.service.config.allow_auto_topic_creation;
            if partitions == 0 && !may_create && !self.service.topic_exists(&name).await? {
                return Err(BrokerError::TopicNotFound(name.to_string()));
            }
            Ok(partitions)
        }
        .await;
        let reply = match result {
            Ok(partitions) => commands::partitioned_metadata_response(request_id, partitions),
            Err(error) => commands::partitioned_metadata_failed(
                request_id,
                error.server_error(),
                error.to_string(),
            ),
        };
        self.outbox.send_command(&reply);
        Ok(())
    }

    /// LOOKUP: answered by the broker's [`crate::ownership::Ownership`], from a task of its own
    /// (a cluster's answer may take a metadata round trip).
    fn on_lookup(&mut self, command: &BaseCommand) -> Handled {
        let request = command.lookup_topic.as_ref().ok_or("LOOKUP without body")?;
        let (request_id, authoritative) = (request.request_id, request.authoritative());
        let topic = request.topic.clone();
        let (service, outbox) = (self.service.clone(), self.outbox.clone());
        tokio::spawn(async move {
            let answer = match BrokerService::topic_name(&topic) {
                Ok(name) => service.ownership.lookup(&name, authoritative).await,
                Err(error) => Err(error),
            };
            let reply = match answer {
                Ok(LookupAnswer::Connect { broker_url }) => commands::lookup_response(
                    request_id,
                    LookupType::Connect,
                    broker_url,
                    None,
                    true,
                    false,
                ),
                Ok(LookupAnswer::Redirect { broker_url, authoritative }) => {
                    commands::lookup_response(
                        request_id,
                        LookupType::Redirect,
                        broker_url,
                        None,
                        authoritative,
                        false,
                    )
                }
                Err(error) => {
                    commands::lookup_failed(request_id, error.server_error(), error.to_string())
                }
            };
            outbox.send_command(&reply);
        });
        Ok(())
    }

    /// PRODUCER: answered from a task of its own (a topic load, a schema check or a
    /// WaitForExclusive producer's wait never holds up this connection's other commands); the
    /// producer joins the connection when the task reports back.
    fn on_producer(&mut self, command: &BaseCommand) -> Handled {
        let request = command.producer.as_ref().ok_or("PRODUCER without body")?;
        let (request_id, producer_id) = (request.request_id, request.producer_id);
        if self.producers.get(&producer_id).is_some_and(|p| p.topic.is_deleted()) {
            // Closed by the broker (topic deleted): the client re-creates it under its id.
            self.producers.remove(&producer_id);
        }
        if let Some(existing) = self.producers.get(&producer_id) {
            // A client retrying a create it already got: answer the same.
            let version = existing.schema_version.map(commands::schema_version_bytes);
            let last = existing.topic.last_sequence_id(&existing.name);
            let reply =
                commands::producer_success(request_id, existing.name.to_string(), last, version);
            self.outbox.send_command(&reply);
            return Ok(());
        }
        if let Some(existing) = self.np_producers.get(&producer_id) {
            let reply = commands::producer_success(request_id, existing.name.clone(), -1, None);
            self.outbox.send_command(&reply);
            return Ok(());
        }
        if self.pending_producers.contains_key(&producer_id) {
            // As Pulsar: the earlier request for this id is still being served.
            let error = BrokerError::ServiceNotReady(
                "Producer is already present on the connection".into(),
            );
            self.reply_error(request_id, &error);
            return Ok(());
        }
        let request = (**request).clone();
        let (service, outbox) = (self.service.clone(), self.outbox.clone());
        let task = self.spawn_request(async move {
            let created = create_producer(&service, &outbox, &request).await;
            let finish: Completion = Box::new(move |connection: &mut Connection| {
                connection.producer_created(&request, created)
            });
            finish
        });
        self.pending_producers.insert(producer_id, task);
        Ok(())
    }

    /// A PRODUCER request's outcome, back on the connection: the producer joins it and the
    /// client hears PRODUCER_SUCCESS, or the error. One closed in the meantime is undone.
    fn producer_created(
        &mut self,
        request: &CommandProducer,
        created: Result<CreatedProducer, BrokerError>,
    ) {
        let request_id = request.request_id;
        let still_wanted = self.pending_producers.remove(&request.producer_id).is_some();
        let created = match created {
            Ok(created) if !still_wanted => {
                created.release();
                return;
            }
            Ok(created) => created,
            Err(_) if !still_wanted => return,
            Err(error) => {
                self.reply_error(request_id, &error);
                return;
            }
        };
        let mode = access_mode(request);
        let (name, epoch) = (created.name().to_string(), created.epoch());
        let mut reply = match created {
            CreatedProducer::Persistent(context, _) => {
                let version_bytes = context.schema_version.map(commands::schema_version_bytes);
                // A reconnecting producer resumes after its last stored sequence id.
                let last_sequence_id = context.topic.last_sequence_id(&context.name);
                self.producers.insert(request.producer_id, context);
                commands::producer_success(request_id, name, last_sequence_id, version_bytes)
            }
            CreatedProducer::NonPersistent(context, _) => {
                // No deduplication on non-persistent topics: last_sequence_id is -1.
                let version = request.schema.as_ref().map(|_| Bytes::from_static(&[0; 8]));
                self.np_producers.insert(request.producer_id, context);
                commands::producer_success(request_id, name, -1, version)
            }
        };
        if mode != ProducerAccessMode::Shared {
            if let Some(success) = reply.producer_success.as_mut() {
                success.topic_epoch = Some(epoch);
            }
        }
        self.outbox.send_command(&reply);
    }

    fn on_send(&mut self, command: &BaseCommand, entry: Option<Bytes>) -> Handled {
        let send = command.send.as_ref().ok_or("SEND without body")?;
        let entry = entry.ok_or("SEND without payload")?;
        let (producer_id, sequence_id) = (send.producer_id, send.sequence_id);
        if let Some(producer) = self.np_producers.get(&producer_id) {
            // At most once: acknowledged at once with 0:0, as Pulsar's NonPersistentTopic,
            // then handed to the consumers that have permits.
            let highest = send.highest_sequence_id.unwrap_or(0).max(sequence_id);
            let partition = (producer.topic.partition >= 0).then_some(producer.topic.partition);
            let id = crate::non_persistent::message_id(partition);
            self.outbox.send_command(&commands::send_receipt(
                producer_id,
                sequence_id,
                id,
                highest,
            ));
            producer.topic.publish(&entry);
            return Ok(());
        }
        let Some(producer) = self.producers.get(&producer_id) else {
            let reply = commands::send_error(
                producer_id,
                sequence_id,
                ServerError::ProducerBusy,
                "unknown producer",
            );
            self.outbox.send_command(&reply);
            return Ok(());
        };
        let highest = send.highest_sequence_id.unwrap_or(0).max(sequence_id);
        let partition = (producer.partition >= 0).then_some(producer.partition);
        // Chunks before a message's last share its sequence id: only the last one is checked
        // and recorded (metadata parsed only where deduplication is on).
        let counts = !(producer.topic.deduplication_enabled()
            && magnetar_protocol::parse_metadata_and_payload(&entry)
                .is_ok_and(|(metadata, _)| crate::dedup::is_intermediate_chunk(&metadata)));
        let status = if counts {
            producer.topic.check_duplicate(&producer.name, sequence_id, highest)
        } else {
            DupStatus::NotDup
        };
        match status {
            DupStatus::NotDup => {}
            DupStatus::Dup => {
                // Stored before: acknowledged at once with message id -1:-1, as Pulsar does.
                let id = commands::message_id(u64::MAX, u64::MAX, partition);
                let reply = commands::send_receipt(producer_id, sequence_id, id, highest);
                self.outbox.send_command(&reply);
                return Ok(());
            }
            DupStatus::Unknown => {
                // The original is still being written: Pulsar answers PersistenceError and the
                // client resends after reconnecting, when the outcome is known.
                let reply = commands::send_error(
                    producer_id,
                    highest,
                    ServerError::PersistenceError,
                    "Cannot determine whether the message is a duplicate at this time",
                );
                self.outbox.send_command(&reply);
                return Ok(());
            }
        }
        let outbox = self.outbox.clone();
        let topic = producer.topic.clone();
        let producer_name = producer.name.clone();
        let staged = producer.topic.managed_ledger.append(
            entry,
            move |result: Result<Position, BrokerError>| {
                let reply = match result {
                    Ok(position) => {
                        if counts {
                            topic.entry_persisted(&producer_name, highest, position);
                        }
                        let id =
                            commands::message_id(position.ledger_id, position.entry_id, partition);
                        commands::send_receipt(producer_id, sequence_id, id, highest)
                    }
                    Err(error) => {
                        topic.entry_failed();
                        commands::send_error(
                            producer_id,
                            sequence_id,
                            error.server_error(),
                            error.to_string(),
                        )
                    }
                };
                outbox.send_command(&reply);
            },
        );
        if let Err(error) = staged {
            producer.topic.entry_failed();
            let reply = commands::send_error(
                producer_id,
                sequence_id,
                error.server_error(),
                error.to_string(),
            );
            self.outbox.send_command(&reply);
        }
        Ok(())
    }

    fn on_close_producer(&mut self, command: &BaseCommand) -> Handled {
        let request = command.close_producer.as_ref().ok_or("CLOSE_PRODUCER without body")?;
        if let Some(task) = self.pending_producers.remove(&request.producer_id) {
            // Still being created (a WaitForExclusive producer in line, say): stop it; if it
            // had already finished, its completion finds it unwanted and gives the topic back.
            task.abort();
        }
        if let Some(producer) = self.producers.remove(&request.producer_id) {
            producer.topic.remove_producer(&producer.name, producer.key);
        }
        if let Some(producer) = self.np_producers.remove(&request.producer_id) {
            producer.topic.producers.remove(&producer.name, producer.key);
        }
        self.outbox.send_command(&commands::success(request.request_id));
        Ok(())
    }

    /// SUBSCRIBE: served from a task of its own, like PRODUCER; the consumer joins the
    /// connection, hears SUCCESS, and only then its first ACTIVE_CONSUMER_CHANGE (clients
    /// ignore events for a consumer they have not been told exists).
    fn on_subscribe(&mut self, command: &BaseCommand) -> Handled {
        let request = command.subscribe.as_ref().ok_or("SUBSCRIBE without body")?;
        let (request_id, consumer_id) = (request.request_id, request.consumer_id);
        if let Some(existing) = self.consumers.get(&consumer_id) {
            if existing.subscription.has_consumer(existing.key) {
                self.outbox.send_command(&commands::success(request_id));
                return Ok(());
            }
            // Detached by the broker (seek): the client subscribes again under the same id.
            self.consumers.remove(&consumer_id);
        }
        if self.np_consumers.contains_key(&consumer_id) {
            self.outbox.send_command(&commands::success(request_id));
            return Ok(());
        }
        if self.pending_consumers.contains_key(&consumer_id) {
            let error = BrokerError::ServiceNotReady(
                "Consumer is already present on the connection".into(),
            );
            self.reply_error(request_id, &error);
            return Ok(());
        }
        let request = (**request).clone();
        let (service, outbox) = (self.service.clone(), self.outbox.clone());
        let task = self.spawn_request(async move {
            let created = create_consumer(&service, &outbox, &request).await;
            let finish: Completion = Box::new(move |connection: &mut Connection| {
                connection.consumer_created(&request, created)
            });
            finish
        });
        self.pending_consumers.insert(consumer_id, task);
        Ok(())
    }

    fn consumer_created(
        &mut self,
        request: &CommandSubscribe,
        created: Result<CreatedConsumer, BrokerError>,
    ) {
        let (request_id, consumer_id) = (request.request_id, request.consumer_id);
        let still_wanted = self.pending_consumers.remove(&consumer_id).is_some();
        match created {
            Ok(created) if !still_wanted => {
                tokio::spawn(created.release());
            }
            Err(_) if !still_wanted => {}
            Err(error) => self.reply_error(request_id, &error),
            Ok(CreatedConsumer::NonPersistent(context)) => {
                self.np_consumers.insert(consumer_id, context);
                self.outbox.send_command(&commands::success(request_id));
            }
            Ok(CreatedConsumer::Persistent(context)) => {
                let (subscription, key) = (context.subscription.clone(), context.key);
                self.consumers.insert(consumer_id, context);
                self.outbox.send_command(&commands::success(request_id));
                subscription.announce(key);
            }
        }
    }

    fn on_flow(&mut self, command: &BaseCommand) -> Handled {
        let flow = command.flow.as_ref().ok_or("FLOW without body")?;
        if let Some(consumer) = self.np_consumers.get(&flow.consumer_id) {
            consumer.subscription.flow(consumer.key, flow.message_permits);
            return Ok(());
        }
        if let Some(consumer) = self.consumers.get(&flow.consumer_id) {
            consumer.subscription.flow(consumer.key, flow.message_permits);
        }
        Ok(())
    }

    fn on_ack(&mut self, command: &BaseCommand) -> Handled {
        let ack = command.ack.as_ref().ok_or("ACK without body")?;
        let ack_type = AckType::try_from(ack.ack_type).unwrap_or(AckType::Individual);
        if self.np_consumers.contains_key(&ack.consumer_id) {
            // Non-persistent: nothing to acknowledge; accepted and ignored.
            if let Some(request_id) = ack.request_id {
                let reply = commands::ack_response(ack.consumer_id, request_id, None);
                self.outbox.send_command(&reply);
            }
            return Ok(());
        }
        let result = match self.consumers.get(&ack.consumer_id) {
            // A consumer detached by a seek: its late acks would undo the reset (Pulsar drops
            // them too, the consumer being closed).
            Some(consumer) if !consumer.subscription.has_consumer(consumer.key) => {
                Err(BrokerError::InvalidRequest("consumer is closed".into()))
            }
            Some(consumer) => consumer
                .subscription
                .ack(ack_type, &ack.message_id)
                .map(|ticket| (consumer.subscription.clone(), ticket)),
            None => Err(BrokerError::InvalidRequest("unknown consumer".into())),
        };
        let Some(request_id) = ack.request_id else { return Ok(()) };
        let (consumer_id, outbox) = (ack.consumer_id, self.outbox.clone());
        match result {
            // The receipt promises durability: it waits for the cursor write.
            Ok((subscription, ticket)) => {
                tokio::spawn(async move {
                    let error = subscription
                        .persisted(ticket)
                        .await
                        .err()
                        .map(|e| (e.server_error(), e.to_string()));
                    outbox.send_command(&commands::ack_response(consumer_id, request_id, error));
                });
            }
            Err(e) => {
                let error = Some((e.server_error(), e.to_string()));
                outbox.send_command(&commands::ack_response(consumer_id, request_id, error));
            }
        }
        Ok(())
    }

    fn on_redeliver(&mut self, command: &BaseCommand) -> Handled {
        let request = command
            .redeliver_unacknowledged_messages
            .as_ref()
            .ok_or("REDELIVER_UNACKNOWLEDGED_MESSAGES without body")?;
        if let Some(consumer) = self.consumers.get(&request.consumer_id) {
            consumer.subscription.redeliver(consumer.key, &request.message_ids);
        }
        Ok(())
    }

    /// GET_TOPICS_OF_NAMESPACE: the namespace's topics in the requested domains, filtered by the
    /// optional pattern, with their hash (the list is left out when the client's hash matches),
    /// as Pulsar's `ServerCnx.handleGetTopicsOfNamespace`.
    async fn on_get_topics_of_namespace(&mut self, command: &BaseCommand) -> Handled {
        use magnetar_admin::names::NamespaceName;
        use magnetar_protocol::proto::command_get_topics_of_namespace::Mode;
        let request = command
            .get_topics_of_namespace
            .as_ref()
            .ok_or("GET_TOPICS_OF_NAMESPACE without body")?;
        let request_id = request.request_id;
        let Ok(ns) = NamespaceName::parse(&request.namespace) else {
            let error = BrokerError::InvalidRequest(format!(
                "invalid namespace name '{}'",
                request.namespace
            ));
            self.reply_error(request_id, &error);
            return Ok(());
        };
        let domains: &[TopicDomain] =
            match request.mode.and_then(|m| Mode::try_from(m).ok()).unwrap_or(Mode::Persistent) {
                Mode::Persistent => &[TopicDomain::Persistent],
                Mode::NonPersistent => &[TopicDomain::NonPersistent],
                Mode::All => &TopicDomain::ALL,
            };
        let topics = match self.service.topics_of_namespace(&ns, domains).await {
            Ok(topics) => topics,
            Err(error) => {
                self.reply_error(request_id, &error);
                return Ok(());
            }
        };
        let (topics, filtered) = match request.topics_pattern.as_deref() {
            Some(pattern) => match crate::service::filter_topics(&topics, pattern) {
                Some(matched) => (matched, true),
                None => (topics, false),
            },
            None => (topics, false),
        };
        let hash = crate::service::topics_hash(&topics);
        let unchanged = request.topics_hash.as_deref() == Some(hash.as_str());
        let reply = commands::get_topics_of_namespace_response(
            request_id,
            (!unchanged).then_some(topics),
            filtered,
            hash,
        );
        self.outbox.send_command(&reply);
        Ok(())
    }

    /// SEEK: resets the consumer's subscription to a message id or a publish time.
    async fn on_seek(&mut self, command: &BaseCommand) -> Handled {
        let seek = command.seek.as_ref().ok_or("SEEK without body")?;
        let request_id = seek.request_id;
        // Error codes as Pulsar's handleSeek sends them.
        if seek.message_id.is_none() && seek.message_publish_time.is_none() {
            self.outbox.send_command(&commands::error(
                request_id,
                ServerError::MetadataError,
                "Message id and message publish time were not present",
            ));
            return Ok(());
        }
        if self.np_consumers.contains_key(&seek.consumer_id) {
            let reply = commands::error(
                request_id,
                ServerError::NotAllowedError,
                "Seek is not supported on non-persistent topics",
            );
            self.outbox.send_command(&reply);
            return Ok(());
        }
        let Some(consumer) = self.consumers.get(&seek.consumer_id) else {
            let reply =
                commands::error(request_id, ServerError::MetadataError, "Consumer not found");
            self.outbox.send_command(&reply);
            return Ok(());
        };
        let (topic, subscription) = (consumer.topic.clone(), consumer.subscription.clone());
        let managed_ledger = topic.managed_ledger.clone();
        let ledgers = managed_ledger.ledgers();
        let last_confirmed = managed_ledger.last_confirmed();
        // The entry to deliver first, or `None` for "after the last entry".
        let target: Result<Option<Position>, BrokerError> =
            match (&seek.message_id, seek.message_publish_time) {
                (Some(id), _) if id.ledger_id == u64::MAX => {
                    // MessageId.earliest (-1, -1).
                    Ok(crate::cursor::next_position(&ledgers, None))
                }
                (Some(id), _) if id.ledger_id >= i64::MAX as u64 => Ok(None), // latest
                (Some(id), _) => {
                    let position = Position::new(id.ledger_id, id.entry_id);
                    Ok(last_confirmed.filter(|last| position <= *last).map(|_| position))
                }
                // A publish time (one of the two is present, checked above).
                (None, time) => {
                    let time = time.unwrap_or(0);
                    tokio::task::spawn_blocking(move || {
                        managed_ledger.first_published_at_or_after(time)
                    })
                    .await
                    .unwrap_or(Err(BrokerError::ShuttingDown))
                }
            };
        let result = match target {
            Ok(target) => {
                let mark_delete = match target {
                    Some(position) => crate::subscription::previous_position(&ledgers, position),
                    None => last_confirmed,
                };
                subscription.reset_cursor(mark_delete).await
            }
            Err(error) => Err(error),
        };
        match result {
            Ok(detached) => {
                // This connection's detached consumers are closed; the client subscribes again.
                self.consumers.retain(|_, c| {
                    !(Arc::ptr_eq(&c.subscription, &subscription) && detached.contains(&c.key))
                });
                tracing::info!(topic = %topic.full_name, subscription = %subscription.name,
                    message_id = ?seek.message_id.as_ref().map(|m| (m.ledger_id, m.entry_id)),
                    publish_time = ?seek.message_publish_time, "cursor reset by seek");
                self.outbox.send_command(&commands::success(request_id));
            }
            Err(error) => self.outbox.send_command(&commands::error(
                request_id,
                ServerError::UnknownError,
                format!("Error when resetting subscription: {error}"),
            )),
        }
        Ok(())
    }

    /// GET_SCHEMA: the topic's schema at the requested version (latest when none is given).
    async fn on_get_schema(&mut self, command: &BaseCommand) -> Handled {
        let request = command.get_schema.as_ref().ok_or("GET_SCHEMA without body")?;
        let request_id = request.request_id;
        let not_found = || {
            commands::get_schema_error(
                request_id,
                ServerError::TopicNotFound,
                format!("Topic not found or no-schema {}", request.topic),
            )
        };
        let name = match BrokerService::topic_name(&request.topic) {
            Ok(name) => name,
            Err(error) => {
                let reply =
                    commands::get_schema_error(request_id, error.server_error(), error.to_string());
                self.outbox.send_command(&reply);
                return Ok(());
            }
        };
        let reply = match self.service.schemas.history(&name).await {
            Err(error) => {
                let error = BrokerError::from(error);
                commands::get_schema_error(request_id, error.server_error(), error.to_string())
            }
            Ok((history, _)) => {
                let wanted = match request.schema_version.as_deref() {
                    None | Some([]) => history.versions.last(),
                    Some(bytes) => {
                        commands::parse_schema_version(bytes).and_then(|v| history.get_live(v))
                    }
                };
                match wanted.filter(|s| !s.deleted) {
                    None => not_found(),
                    Some(stored) => {
                        let base = name.partitioned_topic();
                        let schema = Schema {
                            name: format!(
                                "{}/{}/{}",
                                base.tenant(),
                                base.namespace().namespace(),
                                base.local_name()
                            ),
                            schema_data: stored.data.clone().into(),
                            r#type: stored.schema_type,
                            properties: stored
                                .properties
                                .iter()
                                .map(|(key, value)| magnetar_protocol::proto::KeyValue {
                                    key: key.clone(),
                                    value: value.clone(),
                                })
                                .collect(),
                        };
                        commands::get_schema_response(request_id, schema, stored.version)
                    }
                }
            }
        };
        self.outbox.send_command(&reply);
        Ok(())
    }

    /// GET_OR_CREATE_SCHEMA: the version of the schema on an existing topic, registered as a
    /// producer's would be.
    async fn on_get_or_create_schema(&mut self, command: &BaseCommand) -> Handled {
        let request =
            command.get_or_create_schema.as_ref().ok_or("GET_OR_CREATE_SCHEMA without body")?;
        let result = async {
            let name = BrokerService::topic_name(&request.topic)?;
            self.service.topic(&name, false).await?;
            let version = producer_schema(&self.service, &name, Some(&request.schema)).await?;
            Ok::<_, BrokerError>(version.unwrap_or(0))
        }
        .await;
        let result = result.map_err(|error| (error.server_error(), error.to_string()));
        let reply = commands::get_or_create_schema_response(request.request_id, result);
        self.outbox.send_command(&reply);
        Ok(())
    }

    async fn detach_consumer(&mut self, consumer_id: u64) {
        if let Some(consumer) = self.np_consumers.remove(&consumer_id) {
            consumer.detach();
        }
        if let Some(consumer) = self.consumers.remove(&consumer_id) {
            consumer.detach().await;
        }
    }

    async fn on_close_consumer(&mut self, command: &BaseCommand) -> Handled {
        let request = command.close_consumer.as_ref().ok_or("CLOSE_CONSUMER without body")?;
        if let Some(task) = self.pending_consumers.remove(&request.consumer_id) {
            task.abort();
        }
        self.detach_consumer(request.consumer_id).await;
        self.outbox.send_command(&commands::success(request.request_id));
        Ok(())
    }

    async fn on_unsubscribe(&mut self, command: &BaseCommand) -> Handled {
        let request = command.unsubscribe.as_ref().ok_or("UNSUBSCRIBE without body")?;
        if let Some(consumer) = self.np_consumers.get(&request.consumer_id) {
            if consumer.subscription.consumer_count() > 1 && !request.force.unwrap_or(false) {
                let error =
                    BrokerError::NotAllowed("subscription has other connected consumers".into());
                self.reply_error(request.request_id, &error);
                return Ok(());
            }
            self.detach_consumer(request.consumer_id).await;
            self.outbox.send_command(&commands::success(request.request_id));
            return Ok(());
        }
        let Some(consumer) = self.consumers.get(&request.consumer_id) else {
            self.reply_error(
                request.request_id,
                &BrokerError::InvalidRequest("unknown consumer".into()),
            );
            return Ok(());
        };
        if consumer.subscription.consumer_count() > 1 && !request.force.unwrap_or(false) {
            let error =
                BrokerError::NotAllowed("subscription has other connected consumers".into());
            self.reply_error(request.request_id, &error);
            return Ok(());
        }
        let (topic, name) = (consumer.topic.clone(), consumer.subscription.name.clone());
        self.detach_consumer(request.consumer_id).await;
        match topic.remove_subscription(&name, true).await {
            Ok(()) => self.outbox.send_command(&commands::success(request.request_id)),
            Err(error) => self.reply_error(request.request_id, &error),
        }
        Ok(())
    }

    fn on_get_last_message_id(&mut self, command: &BaseCommand) -> Handled {
        let request =
            command.get_last_message_id.as_ref().ok_or("GET_LAST_MESSAGE_ID without body")?;
        if let Some(consumer) = self.np_consumers.get(&request.consumer_id) {
            // Nothing is stored: the "last" id is the one every message carries.
            let partition = (consumer.topic.partition >= 0).then_some(consumer.topic.partition);
            let last = crate::non_persistent::message_id(partition);
            let reply = commands::get_last_message_id_response(request.request_id, last, None);
            self.outbox.send_command(&reply);
            return Ok(());
        }
        let Some(consumer) = self.consumers.get(&request.consumer_id) else {
            self.reply_error(
                request.request_id,
                &BrokerError::InvalidRequest("unknown consumer".into()),
            );
            return Ok(());
        };
        let managed_ledger = &consumer.topic.managed_ledger;
        let partition = (consumer.topic.partition >= 0).then_some(consumer.topic.partition);
        let last = match managed_ledger.last_confirmed() {
            Some(p) => commands::message_id(p.ledger_id, p.entry_id, partition),
            None => commands::message_id(managed_ledger.current_ledger(), u64::MAX, partition),
        };
        let mark_delete = consumer
            .subscription
            .mark_delete()
            .map(|p| commands::message_id(p.ledger_id, p.entry_id, partition));
        let reply = commands::get_last_message_id_response(request.request_id, last, mark_delete);
        self.outbox.send_command(&reply);
        Ok(())
    }

    fn on_consumer_stats(&mut self, command: &BaseCommand) -> Handled {
        let request = command.consumer_stats.as_ref().ok_or("CONSUMER_STATS without body")?;
        let mut response =
            CommandConsumerStatsResponse { request_id: request.request_id, ..Default::default() };
        match self.consumers.get(&request.consumer_id) {
            Some(consumer) => {
                response.r#type = Some(format!("{:?}", consumer.subscription.sub_type()));
            }
            None if self.np_consumers.contains_key(&request.consumer_id) => {
                let consumer = &self.np_consumers[&request.consumer_id];
                response.r#type = Some(format!("{:?}", consumer.subscription.sub_type()));
            }
            None => {
                response.error_code = Some(ServerError::ConsumerNotFound as i32);
                response.error_message = Some("unknown consumer".into());
            }
        }
        let reply = BaseCommand {
            consumer_stats_response: Some(Box::new(response)),
            ..commands::base(Type::ConsumerStatsResponse)
        };
        self.outbox.send_command(&reply);
        Ok(())
    }

    /// The connection is gone: its producers and consumers leave their topics.
    async fn cleanup(&mut self, completed: &mut mpsc::UnboundedReceiver<Completion>) {
        // Requests still in their tasks: stopped, then whatever they finished is undone (their
        // ids are no longer pending, so each completion gives back what it took).
        let tasks: Vec<JoinHandle<()>> = self
            .pending_producers
            .drain()
            .chain(self.pending_consumers.drain())
            .map(|(_, task)| task)
            .collect();
        for task in tasks {
            task.abort();
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        while let Ok(finish) = completed.try_recv() {
            finish(self);
        }
        for (_, producer) in self.producers.drain() {
            producer.topic.remove_producer(&producer.name, producer.key);
        }
        for (_, producer) in self.np_producers.drain() {
            producer.topic.producers.remove(&producer.name, producer.key);
        }
        let ids: Vec<u64> =
            self.consumers.keys().chain(self.np_consumers.keys()).copied().collect();
        for id in ids {
            self.detach_consumer(id).await;
        }
    }
}

/// Work a request does away from the connection's loop, and what it then does on the
/// connection (on the loop, with `&mut Connection`).
type Completion = Box<dyn FnOnce(&mut Connection) + Send>;

fn access_mode(request: &CommandProducer) -> ProducerAccessMode {
    request
        .producer_access_mode
        .and_then(|m| ProducerAccessMode::try_from(m).ok())
        .unwrap_or(ProducerAccessMode::Shared)
}

/// A producer registered on its topic, not yet on the connection.
enum CreatedProducer {
    Persistent(ProducerContext, u64),
    NonPersistent(NpProducerContext, u64),
}

impl CreatedProducer {
    fn name(&self) -> &str {
        match self {
            CreatedProducer::Persistent(context, _) => &context.name,
            CreatedProducer::NonPersistent(context, _) => &context.name,
        }
    }

    fn epoch(&self) -> u64 {
        match self {
            CreatedProducer::Persistent(_, epoch) | CreatedProducer::NonPersistent(_, epoch) => {
                *epoch
            }
        }
    }

    /// Gives the topic back (the client closed the producer while it was being created).
    fn release(self) {
        match self {
            CreatedProducer::Persistent(context, _) => {
                context.topic.remove_producer(&context.name, context.key)
            }
            CreatedProducer::NonPersistent(context, _) => {
                context.topic.producers.remove(&context.name, context.key)
            }
        }
    }
}

/// Everything a PRODUCER request needs before the producer may publish: the topic (loaded or
/// created), the schema, the dead-letter producer's initial subscription, and a place in the
/// topic's producers under its access mode. A WaitForExclusive producer that must wait is told
/// so at once (PRODUCER_SUCCESS with producer_ready=false, as Pulsar's `ServerCnx`) and waits
/// here.
async fn create_producer(
    service: &Arc<BrokerService>,
    outbox: &Outbox,
    request: &CommandProducer,
) -> Result<CreatedProducer, BrokerError> {
    let mode = access_mode(request);
    let name = BrokerService::topic_name(&request.topic)?;
    let producer_name = match request.producer_name.clone().filter(|n| !n.is_empty()) {
        Some(name) => name,
        None => format!("standalone-{}", PRODUCER_NAMES.fetch_add(1, Ordering::Relaxed)),
    };
    let key = service.next_key();
    let client = ProducerClient { producer_id: request.producer_id, outbox: outbox.clone() };
    let queued = || {
        let mut waiting = commands::producer_success(request.request_id, &producer_name, -1, None);
        if let Some(success) = waiting.producer_success.as_mut() {
            success.producer_ready = Some(false);
        }
        outbox.send_command(&waiting);
    };
    if name.domain() == TopicDomain::NonPersistent {
        let topic = service.non_persistent_topic(&name, true).await?;
        let epoch = topic
            .producers
            .add(producer_name.clone(), key, mode, request.topic_epoch, client, queued)
            .await?;
        let context = NpProducerContext { topic, name: producer_name, key };
        return Ok(CreatedProducer::NonPersistent(context, epoch));
    }
    let topic = service.topic(&name, true).await?;
    // The schema first: an incompatible one fails the producer (Pulsar's tryAddSchema).
    let schema_version = producer_schema(service, &name, request.schema.as_ref()).await?;
    // The initial subscription (dead-letter producers): created at the earliest position before
    // the producer may publish, as Pulsar's handleProducer does.
    if let Some(initial) = request.initial_subscription_name.as_deref().filter(|n| !n.is_empty()) {
        topic.subscription(initial, SubType::Exclusive, true, StartAt::Earliest).await?;
    }
    // Policies may have changed since the topic was loaded (another broker's admin API in
    // cluster mode; here a cheap re-read keeps this path obviously right).
    topic.refresh_policies().await?;
    let epoch = topic
        .add_producer(producer_name.clone(), key, mode, request.topic_epoch, client, queued)
        .await?;
    let partition = topic.partition;
    let context =
        ProducerContext { topic, name: producer_name.into(), key, partition, schema_version };
    Ok(CreatedProducer::Persistent(context, epoch))
}

/// A consumer attached to its subscription, not yet on the connection.
enum CreatedConsumer {
    Persistent(ConsumerContext),
    NonPersistent(NpConsumerContext),
}

impl CreatedConsumer {
    /// Detaches it again (the client closed it while it was being created).
    async fn release(self) {
        match self {
            CreatedConsumer::Persistent(context) => context.detach().await,
            CreatedConsumer::NonPersistent(context) => context.detach(),
        }
    }
}

impl ConsumerContext {
    /// Takes the consumer off its subscription; a non-durable subscription (a reader's) goes
    /// with its last consumer.
    async fn detach(self) {
        let left = self.subscription.remove_consumer(self.key);
        if left == 0 && !self.subscription.durable {
            let _ = self.topic.remove_subscription(&self.subscription.name, true).await;
        }
    }
}

impl NpConsumerContext {
    fn detach(self) {
        self.topic.unsubscribe_consumer(&self.subscription, self.key);
    }
}

/// Everything a SUBSCRIBE needs: the topic (loaded or created), the consumer's schema check,
/// the subscription (created at its start position if new) and the consumer attached to it.
async fn create_consumer(
    service: &Arc<BrokerService>,
    outbox: &Outbox,
    request: &CommandSubscribe,
) -> Result<CreatedConsumer, BrokerError> {
    let consumer_id = request.consumer_id;
    let sub_type = SubType::try_from(request.sub_type).unwrap_or(SubType::Exclusive);
    let name = BrokerService::topic_name(&request.topic)?;
    let create = request.force_topic_creation.unwrap_or(true);
    let key = service.next_key();
    if name.domain() == TopicDomain::NonPersistent {
        let topic = service.non_persistent_topic(&name, create).await?;
        let consumer = NpConsumer::new(
            key,
            consumer_id,
            request.consumer_name.clone().unwrap_or_default(),
            request.priority_level.unwrap_or(0),
            outbox.clone(),
        );
        let subscription = topic.subscribe(&request.subscription, sub_type, consumer)?;
        return Ok(CreatedConsumer::NonPersistent(NpConsumerContext { topic, subscription, key }));
    }
    let durable = request.durable.unwrap_or(true);
    let start = match (&request.start_message_id, durable) {
        (Some(id), false) => StartAt::MessageId(id.clone()),
        _ => match request.initial_position.and_then(|p| InitialPosition::try_from(p).ok()) {
            Some(InitialPosition::Earliest) => StartAt::Earliest,
            _ => StartAt::Latest,
        },
    };
    let topic = service.topic(&name, create).await?;
    if let Some(schema) = request.schema.as_ref().filter(|s| s.r#type != TYPE_AUTO_CONSUME) {
        consumer_schema(service, &name, &topic, schema).await?;
    }
    let subscription = topic.subscription(&request.subscription, sub_type, durable, start).await?;
    let handle = ConsumerHandle {
        key,
        consumer_id,
        name: request.consumer_name.clone().unwrap_or_default(),
        priority: request.priority_level.unwrap_or(0),
        outbox: outbox.clone(),
    };
    subscription.add_consumer(handle, sub_type, request.key_shared_meta.as_ref())?;
    Ok(CreatedConsumer::Persistent(ConsumerContext { topic, subscription, key }))
}

/// The schema version a producer gets (Pulsar's `tryAddSchema`): its schema registered
/// (or found) when it has one; without one, nothing, unless the namespace enforces schema
/// validation and the topic has a schema.
async fn producer_schema(
    service: &BrokerService,
    topic: &TopicName,
    schema: Option<&Schema>,
) -> Result<Option<u64>, BrokerError> {
    let registry = &service.schemas;
    let policies = registry.policies(topic).await?;
    match schema {
        Some(schema) => {
            Ok(Some(registry.put_if_absent(topic, &schema_data(schema), policies).await?))
        }
        None if policies.validation_enforced => {
            if registry.history(topic).await?.0.latest().is_some() {
                return Err(BrokerError::IncompatibleSchema(
                    "Producers cannot connect without a schema to topics with a schema \
                     when schema validation is enforced"
                        .into(),
                ));
            }
            Ok(None)
        }
        None => Ok(None),
    }
}

/// A consumer's schema (Pulsar's `addSchemaIfIdleOrCheckCompatible`): it becomes the
/// topic's schema when the topic has none and is idle (no producer, consumer or data);
/// otherwise it must be able to read the topic's schema.
async fn consumer_schema(
    service: &BrokerService,
    name: &TopicName,
    topic: &Topic,
    schema: &Schema,
) -> Result<(), BrokerError> {
    let registry = &service.schemas;
    let policies = registry.policies(name).await?;
    let data = schema_data(schema);
    let (history, _) = registry.history(name).await?;
    if history.latest().is_some() || !topic.is_idle() {
        history.check_consumer(&data, policies.strategy)?;
    } else {
        registry.put_if_absent(name, &data, policies).await?;
    }
    Ok(())
}

/// A schema as the registry sees it.
fn schema_data(schema: &Schema) -> SchemaData {
    SchemaData {
        schema_type: schema.r#type,
        data: schema.schema_data.to_vec(),
        properties: schema.properties.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect(),
    }
}

/// The broker's binary-protocol listener: accepts connections until `shutdown` fires.
pub async fn run_listener(
    service: Arc<BrokerService>,
    listener: tokio::net::TcpListener,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    tokio::spawn(serve(service.clone(), socket, shutdown.clone()));
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => return,
        }
    }
}
