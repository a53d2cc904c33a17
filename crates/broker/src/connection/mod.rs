//! One client connection: frames in, commands handled, frames out.
//!
//! A reader loop decodes frames and handles each command; a writer task drains the connection's
//! [`Outbox`] (send receipts, messages, replies) into the socket, gathering what is queued into
//! one vectored write (stored entries are sent from their own buffers, never copied). Receipts
//! are sent from the storage completion callback, which runs in append order, so a producer's
//! receipts are in order without any extra queue.
//!
//! Handlers by command family: `producer.rs` (PRODUCER, SEND, CLOSE_PRODUCER), `consumer.rs`
//! (SUBSCRIBE, FLOW, ACK, redelivery, SEEK, UNSUBSCRIBE, CLOSE_CONSUMER, stats), `lookup.rs`
//! (PARTITIONED_METADATA, LOOKUP, GET_TOPICS_OF_NAMESPACE), `schema.rs` (GET_SCHEMA,
//! GET_OR_CREATE_SCHEMA); this file has the loop, handshake and keep-alive. Requests that wait
//! (topic loads, metadata, an exclusive producer's turn) run in tasks of their own and finish on
//! the loop through a [`Completion`]; nothing waits inside the loop.
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
use crate::stats::ClientInfo;
use crate::subscription::{ConsumerHandle, Subscription};
use crate::topic::{ProducerClient, StartAt, Topic};
use bytes::{Bytes, BytesMut};
use magnetar_model::names::{TopicDomain, TopicName};
use magnetar_model::schema::{SchemaData, TYPE_AUTO_CONSUME};
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
use magnetar_security::authorization::{NamespaceOperation, TopicOperation};
use magnetar_security::{Principal, TransportIdentity};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

mod auth;
mod authz;
mod consumer;
mod lookup;
mod producer;
mod schema;

use schema::{consumer_schema, producer_schema};

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
async fn write_frames<W: tokio::io::AsyncWrite + Unpin>(
    mut receiver: mpsc::UnboundedReceiver<OutFrame>,
    mut writer: W,
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
async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
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
    /// Its stats (what it published is counted here and on the topic).
    info: Arc<ClientInfo>,
    /// Set by the topic when the broker closes this producer (`ProducerClient::closed`).
    closed: Arc<AtomicBool>,
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
    info: Arc<ClientInfo>,
    /// The registered version of the producer's schema (shared with the persistent topic of
    /// the same name, as Pulsar keys schemas without the domain).
    schema_version: Option<u64>,
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
    /// Producer ids the broker closed (an unload, a deletion, a backlog quota, a revoked
    /// permission) that the client has not opened again yet: sends still under such an id are
    /// dropped unanswered (see `on_send`).
    closed_by_broker: HashSet<u64>,
    /// Where those tasks send what they must finish on the connection.
    completions: mpsc::UnboundedSender<Completion>,
    peer: String,
    /// The client's version string from CONNECT (stats).
    client_version: String,
    /// A topic's publish rate was exceeded: no frame is read before this instant.
    paused_until: Option<tokio::time::Instant>,
    /// What the listener knows about the peer (TLS, client certificate).
    identity: TransportIdentity,
    /// Who the peer is once CONNECT was authenticated (None while authentication is off).
    principal: Option<Principal>,
    /// Credential refresh state (AUTH_CHALLENGE / AUTH_RESPONSE): see `auth.rs`.
    auth: auth::AuthState,
    /// Permission changes this connection has seen: a PRODUCER or SUBSCRIBE checked before a
    /// change and opened after it is re-checked (see `authz.rs`).
    permission_changes_seen: u64,
}

/// Serves one plain-text connection until the peer leaves, errs, idles out, or `shutdown`
/// fires.
pub async fn serve(
    service: Arc<BrokerService>,
    socket: TcpStream,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let peer = socket.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let _ = socket.set_nodelay(true);
    // The socket's own halves: no lock between reader and writer.
    let (reader, writer) = socket.into_split();
    serve_stream(service, reader, writer, peer, TransportIdentity::default(), shutdown).await
}

/// Serves one `pulsar+ssl://` connection: the TLS handshake (bounded by
/// [`magnetar_security::tls::HANDSHAKE_TIMEOUT`], in this connection's task, so a client that
/// never finishes it holds nothing else), then as [`serve`], with the peer's
/// [`TransportIdentity`] (its client certificate's CN, if any).
pub async fn serve_tls(
    service: Arc<BrokerService>,
    socket: TcpStream,
    tls: Arc<magnetar_security::tls::ServerTls>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let peer = socket.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let _ = socket.set_nodelay(true);
    let Some((stream, identity)) = magnetar_security::tls::accept(&tls, socket, &peer).await else {
        // Counted as a connection that failed before CONNECT (created, failed, closed).
        let metrics = &service.ledgers.metrics;
        metrics.connections_created.fetch_add(1, Ordering::Relaxed);
        metrics.connections_failed.fetch_add(1, Ordering::Relaxed);
        metrics.connections_closed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    tracing::debug!(%peer, client_cert_cn = identity.client_cert_common_name.as_deref().unwrap_or("-"),
        "TLS handshake done");
    // tokio-rustls writes vectored (one TLS record per gathered write), so the writer task's
    // batching carries over.
    let (reader, writer) = tokio::io::split(stream);
    serve_stream(service, reader, writer, peer, identity, shutdown).await
}

async fn serve_stream<R, W>(
    service: Arc<BrokerService>,
    mut reader: R,
    writer: W,
    peer: String,
    identity: TransportIdentity,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let metrics = service.ledgers.metrics.clone();
    metrics.connections_created.fetch_add(1, Ordering::Relaxed);
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
        closed_by_broker: HashSet::new(),
        completions,
        peer,
        client_version: String::new(),
        paused_until: None,
        identity,
        principal: None,
        auth: auth::AuthState::default(),
        permission_changes_seen: 0,
    };
    // Permission changes, for the re-check of open producers and consumers (authorization).
    let mut permission_changes = service.authorizer.enabled().then(|| service.authorizer.changes());
    let decoder = FrameDecoder::with_max_message_size(service.config.max_message_size);
    let keepalive = service.config.keepalive();
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut idle_rounds = 0u32;
    let mut auth_check = auth::refresh_timer(&service);
    'connection: loop {
        loop {
            if connection.paused_until.is_some() {
                break; // publish rate: the rest waits in the buffer
            }
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
                        let now_ms = connection.service.ledgers.clock.now_ms();
                        magnetar_clock::warn_limited!(now_ms, peer = %connection.peer, %error,
                            "bad frame; closing connection");
                        break 'connection;
                    }
                }
            }
        }
        if let Some(until) = connection.paused_until {
            // Reading paused (publish rate): completions still run, the socket waits.
            tokio::select! {
                _ = tokio::time::sleep_until(until) => connection.paused_until = None,
                Some(finish) = completed.recv() => finish(&mut connection),
                change = authz::next_change(&mut permission_changes) => {
                    connection.on_permission_change(change);
                }
                _ = shutdown.changed() => break,
            }
            continue;
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
            _ = auth::tick(&mut auth_check) => {
                if let Err(why) = connection.check_credentials() {
                    tracing::info!(peer = %connection.peer, %why, "closing connection");
                    break;
                }
            }
            change = authz::next_change(&mut permission_changes) => {
                connection.on_permission_change(change);
            }
            _ = shutdown.changed() => break,
        }
    }
    connection.cleanup(&mut completed).await;
    if !connection.connected {
        // Closed before its CONNECT was accepted (bad frames, a handshake that never came).
        metrics.connections_failed.fetch_add(1, Ordering::Relaxed);
    }
    metrics.connections_closed.fetch_add(1, Ordering::Relaxed);
    drop(connection);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer_task).await;
}

type Handled = Result<(), String>;

impl Connection {
    fn log_producer_closed(&self, topic: &str, producer: &str, why: &str) {
        tracing::info!(peer = %self.peer, client = %self.client_version, topic, producer, why,
            "producer closed");
    }

    /// Stats for a producer or consumer joining on this connection.
    fn client_info(&self, metadata: &[magnetar_protocol::proto::KeyValue]) -> Arc<ClientInfo> {
        let since = self.service.ledgers.clock.now_ms();
        Arc::new(ClientInfo::new(&self.peer, &self.client_version, since).with_metadata(metadata))
    }

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
            if kind == Type::AuthResponse && self.service.config.authenticator.is_some() {
                self.refuse_auth("AUTH_RESPONSE before CONNECT");
            }
            return Err(format!("{kind:?} before CONNECT"));
        }
        match kind {
            Type::Connect => self.on_connect(&command),
            Type::Ping => {
                self.outbox.send_command(&commands::pong());
                Ok(())
            }
            Type::Pong => Ok(()),
            Type::AuthResponse if self.service.config.authenticator.is_some() => {
                self.on_auth_response(&command)
            }
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
        self.authenticate_connect(connect)?;
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
        self.service.ledgers.metrics.connections_succeeded.fetch_add(1, Ordering::Relaxed);
        self.client_version = connect.client_version.clone();
        tracing::debug!(peer = %self.peer, client = %connect.client_version, version, "connected");
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
        for (_, producer) in std::mem::take(&mut self.producers) {
            producer.topic.remove_producer(&producer.name, producer.key);
            self.log_producer_closed(
                &producer.topic.full_name,
                &producer.name,
                "connection closed",
            );
        }
        for (_, producer) in std::mem::take(&mut self.np_producers) {
            producer.topic.producers.remove(&producer.name, producer.key);
            let topic = producer.topic.name.to_string();
            self.log_producer_closed(&topic, &producer.name, "connection closed");
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

/// The broker's binary-protocol listener: accepts connections until `shutdown` fires.
pub async fn run_listener(
    service: Arc<BrokerService>,
    listener: tokio::net::TcpListener,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    run_listener_with(service, listener, None, shutdown).await
}

/// The broker's `pulsar+ssl://` listener: as [`run_listener`], each connection's TLS handshake
/// in its own task.
pub async fn run_tls_listener(
    service: Arc<BrokerService>,
    listener: tokio::net::TcpListener,
    tls: Arc<magnetar_security::tls::ServerTls>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    run_listener_with(service, listener, Some(tls), shutdown).await
}

async fn run_listener_with(
    service: Arc<BrokerService>,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<magnetar_security::tls::ServerTls>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => match &tls {
                    None => {
                        tokio::spawn(serve(service.clone(), socket, shutdown.clone()));
                    }
                    Some(tls) => {
                        let (service, tls) = (service.clone(), tls.clone());
                        tokio::spawn(serve_tls(service, socket, tls, shutdown.clone()));
                    }
                },
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => return,
        }
    }
}
