//! One TCP (or TLS, `pulsar+ssl://`) connection to a broker: CONNECT/CONNECTED handshake, a reader
//! task (decodes frames, answers PINGs, routes replies by request id and
//! events by producer/consumer id) and a writer task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::{
    BaseCommand, CommandMessage, CommandSendError, CommandSendReceipt, FeatureFlags,
};
use magnetar_protocol::{commands, encode_command, FrameDecoder, PayloadSection};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

use crate::auth::{Credentials, TOKEN_METHOD};
use crate::error::{Error, Result};

/// Protocol version announced in CONNECT.
pub const PROTOCOL_VERSION: i32 = 19;

/// The client version announced in CONNECT and AUTH_RESPONSE.
const CLIENT_VERSION: &str = concat!("magnetar-client-rust ", env!("CARGO_PKG_VERSION"));

/// Idle time after which the client pings the broker; the connection is
/// closed after two silent intervals.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(30);

/// How long a request waits for its reply.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Events routed to a producer.
#[derive(Debug)]
pub(crate) enum ProducerEvent {
    Receipt(CommandSendReceipt),
    SendError(CommandSendError),
    /// The broker closed the producer or the connection dropped.
    Closed,
}

/// Events routed to a consumer.
#[derive(Debug)]
pub(crate) enum ConsumerEvent {
    Message {
        consumer_id: u64,
        command: Box<CommandMessage>,
        payload: Box<PayloadSection>,
    },
    /// The broker closed the consumer or the connection dropped.
    Closed {
        consumer_id: u64,
    },
}

#[derive(Default)]
struct Routes {
    requests: HashMap<u64, oneshot::Sender<Result<BaseCommand>>>,
    producers: HashMap<u64, mpsc::UnboundedSender<ProducerEvent>>,
    consumers: HashMap<u64, (u64, mpsc::UnboundedSender<ConsumerEvent>)>,
    closed: bool,
}

struct Shared {
    routes: Mutex<Routes>,
    out: mpsc::UnboundedSender<Bytes>,
    /// What AUTH_CHALLENGE is answered with (None: no authentication).
    credentials: Option<Arc<Credentials>>,
}

impl Shared {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the connection closed and tells everyone registered.
    fn close(&self) {
        let mut routes = self.routes();
        if routes.closed {
            return;
        }
        routes.closed = true;
        for (_, tx) in routes.requests.drain() {
            let _ = tx.send(Err(Error::Disconnected));
        }
        for (_, tx) in routes.producers.drain() {
            let _ = tx.send(ProducerEvent::Closed);
        }
        for (id, (_, tx)) in routes.consumers.drain() {
            let _ = tx.send(ConsumerEvent::Closed { consumer_id: id });
        }
    }
}

/// A live connection to one broker.
pub(crate) struct Connection {
    url: String,
    shared: Arc<Shared>,
    next_request_id: AtomicU64,
    max_message_size: usize,
    _shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("url", &self.url).finish_non_exhaustive()
    }
}

/// `pulsar://host:port` or `pulsar+ssl://host:port` → `host:port`.
pub(crate) fn socket_address(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("pulsar://")
        .or_else(|| url.strip_prefix("pulsar+ssl://"))
        .ok_or_else(|| Error::InvalidUrl(url.into()))?;
    let rest = rest.trim_end_matches('/');
    // A service URL may list several hosts; take the first.
    let first = rest.split(',').next().unwrap_or_default();
    if first.is_empty() || !first.contains(':') {
        return Err(Error::InvalidUrl(url.into()));
    }
    Ok(first.to_string())
}

/// Request id of a reply, if the command is one.
fn reply_request_id(command: &BaseCommand) -> Option<u64> {
    match commands::command_type(command)? {
        Type::Success => command.success.as_ref().map(|c| c.request_id),
        Type::Error => command.error.as_ref().map(|c| c.request_id),
        Type::ProducerSuccess => command.producer_success.as_ref().map(|c| c.request_id),
        Type::LookupResponse => command.lookup_topic_response.as_ref().map(|c| c.request_id),
        Type::PartitionedMetadataResponse => {
            command.partition_metadata_response.as_ref().map(|c| c.request_id)
        }
        Type::GetLastMessageIdResponse => {
            command.get_last_message_id_response.as_ref().map(|c| c.request_id)
        }
        Type::AckResponse => command.ack_response.as_ref().and_then(|c| c.request_id),
        Type::ConsumerStatsResponse => {
            command.consumer_stats_response.as_ref().map(|c| c.request_id)
        }
        _ => None,
    }
}

fn encode(command: &BaseCommand) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    encode_command(command, &mut buf)?;
    Ok(buf.freeze())
}

/// Whether `url` asks for TLS (`pulsar+ssl://`).
pub(crate) fn is_tls_url(url: &str) -> bool {
    url.starts_with("pulsar+ssl://")
}

impl Connection {
    /// Connects (TLS for `pulsar+ssl://`, verified with `tls`) and performs the handshake,
    /// authenticating with `credentials` when given (and answering the broker's challenges
    /// with them for as long as the connection lives).
    pub(crate) async fn connect(
        url: &str,
        tls: Option<&Arc<rustls::ClientConfig>>,
        credentials: Option<Arc<Credentials>>,
        proxy_to: Option<String>,
    ) -> Result<Arc<Self>> {
        let address = socket_address(url)?;
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(&address))
            .await
            .map_err(|_| Error::Timeout("TCP connect"))??;
        stream.set_nodelay(true)?;
        if !is_tls_url(url) {
            // The socket's own halves: no lock between reader and writer.
            return Self::start(url, stream, TcpStream::into_split, credentials, proxy_to).await;
        }
        let config = tls.ok_or_else(|| {
            Error::Config(format!("{url} needs a trust store (Client::connect_tls)"))
        })?;
        let host = address.rsplit_once(':').map_or(address.as_str(), |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|_| Error::InvalidUrl(url.into()))?;
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, connector.connect(name, stream))
            .await
            .map_err(|_| Error::Timeout("TLS handshake"))??;
        Self::start(url, stream, tokio::io::split, credentials, proxy_to).await
    }

    /// The CONNECT/CONNECTED handshake on `stream`, then the reader and writer tasks on the
    /// halves `split` makes of it.
    async fn start<S, R, W>(
        url: &str,
        mut stream: S,
        split: fn(S) -> (R, W),
        credentials: Option<Arc<Credentials>>,
        proxy_to: Option<String>,
    ) -> Result<Arc<Self>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut connect = commands::connect(CLIENT_VERSION, PROTOCOL_VERSION);
        if let Some(body) = connect.connect.as_mut() {
            // Through a proxy: the broker it is to reach (`host:port`).
            body.proxy_to_broker_url = proxy_to;
        }
        if let (Some(credentials), Some(body)) = (&credentials, connect.connect.as_mut()) {
            body.auth_method_name = Some(TOKEN_METHOD.to_string());
            body.auth_data = Some(credentials.token()?.into_bytes().into());
            // The broker challenges expired credentials instead of closing the connection.
            body.feature_flags =
                Some(FeatureFlags { supports_auth_refresh: Some(true), ..Default::default() });
        }
        stream.write_all(&encode(&connect)?).await?;

        let decoder = FrameDecoder::default();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let connected = tokio::time::timeout(REQUEST_TIMEOUT, async {
            loop {
                if let Some(frame) =
                    decoder.decode_buf(&mut buf).map_err(|e| Error::Protocol(e.to_string()))?
                {
                    match frame.command_type() {
                        Some(Type::Connected) => {
                            return frame
                                .command
                                .connected
                                .ok_or_else(|| Error::Protocol("CONNECTED without body".into()));
                        }
                        Some(Type::Error) => {
                            let e = frame.command.error.unwrap_or_default();
                            return Err(Error::server(e.error, e.message));
                        }
                        Some(Type::AuthChallenge) if credentials.is_some() => {
                            // A method with more than one round (the token has one, but a
                            // broker may still ask): answer and wait on.
                            let response = auth_response(credentials.as_deref())?;
                            stream.write_all(&encode(&response)?).await?;
                        }
                        other => {
                            return Err(Error::Protocol(format!(
                                "expected CONNECTED, got {other:?}"
                            )))
                        }
                    }
                }
                if stream.read_buf(&mut buf).await? == 0 {
                    return Err(Error::Disconnected);
                }
            }
        })
        .await
        .map_err(|_| Error::Timeout("CONNECTED"))??;

        let max_message_size = connected
            .max_message_size
            .and_then(|s| usize::try_from(s).ok())
            .filter(|&s| s > 0)
            .unwrap_or(magnetar_protocol::constants::DEFAULT_MAX_MESSAGE_SIZE);
        tracing::debug!(url, server = %connected.server_version, "connected");

        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared { routes: Mutex::default(), out: out_tx, credentials });
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (read_half, write_half) = split(stream);
        tokio::spawn(write_loop(write_half, out_rx, shutdown_rx.clone(), shared.clone()));
        tokio::spawn(read_loop(
            read_half,
            buf,
            FrameDecoder::with_max_message_size(max_message_size),
            shared.clone(),
            shutdown_rx,
        ));
        Ok(Arc::new(Self {
            url: url.to_string(),
            shared,
            next_request_id: AtomicU64::new(1),
            max_message_size,
            _shutdown: shutdown_tx,
        }))
    }

    /// Largest message (metadata + payload) the broker accepts.
    pub(crate) fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// Whether the connection is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.routes().closed
    }

    /// A fresh request id.
    pub(crate) fn request_id(&self) -> u64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues an encoded frame.
    pub(crate) fn send_frame(&self, frame: Bytes) -> Result<()> {
        self.shared.out.send(frame).map_err(|_| Error::Disconnected)
    }

    /// Queues a simple command.
    pub(crate) fn send_command(&self, command: &BaseCommand) -> Result<()> {
        self.send_frame(encode(command)?)
    }

    /// Sends a command carrying `request_id` and waits for its reply.
    /// An ERROR reply becomes [`Error::Server`].
    pub(crate) async fn request(
        &self,
        request_id: u64,
        command: &BaseCommand,
        what: &'static str,
    ) -> Result<BaseCommand> {
        let (tx, rx) = oneshot::channel();
        {
            let mut routes = self.shared.routes();
            if routes.closed {
                return Err(Error::Disconnected);
            }
            routes.requests.insert(request_id, tx);
        }
        if let Err(e) = self.send_command(command) {
            self.shared.routes().requests.remove(&request_id);
            return Err(e);
        }
        let reply = match tokio::time::timeout(REQUEST_TIMEOUT, rx).await {
            Ok(Ok(reply)) => reply?,
            Ok(Err(_)) => return Err(Error::Disconnected),
            Err(_) => {
                self.shared.routes().requests.remove(&request_id);
                return Err(Error::Timeout(what));
            }
        };
        if let Some(error) = reply.error.as_ref() {
            return Err(Error::server(error.error, error.message.clone()));
        }
        Ok(reply)
    }

    /// Routes events of `producer_id` to `tx`. Fails if the connection is closed.
    pub(crate) fn register_producer(
        &self,
        producer_id: u64,
        tx: mpsc::UnboundedSender<ProducerEvent>,
    ) -> Result<()> {
        let mut routes = self.shared.routes();
        if routes.closed {
            return Err(Error::Disconnected);
        }
        routes.producers.insert(producer_id, tx);
        Ok(())
    }

    /// Stops routing events of `producer_id`.
    pub(crate) fn unregister_producer(&self, producer_id: u64) {
        self.shared.routes().producers.remove(&producer_id);
    }

    /// Routes events of `consumer_id` to `tx`. Fails if the connection is closed.
    pub(crate) fn register_consumer(
        &self,
        consumer_id: u64,
        tx: mpsc::UnboundedSender<ConsumerEvent>,
    ) -> Result<()> {
        let mut routes = self.shared.routes();
        if routes.closed {
            return Err(Error::Disconnected);
        }
        routes.consumers.insert(consumer_id, (consumer_id, tx));
        Ok(())
    }

    /// Stops routing events of `consumer_id`.
    pub(crate) fn unregister_consumer(&self, consumer_id: u64) {
        self.shared.routes().consumers.remove(&consumer_id);
    }

    /// Closes the socket; everything registered is told.
    pub(crate) fn close(&self) {
        let _ = self._shutdown.send(true);
        self.shared.close();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let _ = self._shutdown.send(true);
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut socket: W,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    mut shutdown: watch::Receiver<bool>,
    shared: Arc<Shared>,
) {
    let mut frames = Vec::with_capacity(MAX_FRAMES_PER_WRITE);
    loop {
        let first = tokio::select! {
            frame = rx.recv() => frame,
            _ = shutdown.changed() => None,
        };
        let Some(first) = first else { break };
        // Whatever else is queued goes in the same (vectored) write.
        let mut queued = first.len();
        frames.push(first);
        while queued < MAX_BYTES_PER_WRITE && frames.len() < MAX_FRAMES_PER_WRITE {
            match rx.try_recv() {
                Ok(frame) => {
                    queued += frame.len();
                    frames.push(frame);
                }
                Err(_) => break,
            }
        }
        if let Err(error) = write_frames(&mut socket, &mut frames).await {
            tracing::debug!(%error, "write failed");
            break;
        }
    }
    let _ = socket.shutdown().await;
    shared.close();
}

/// Frames gathered into one write: a batch of a producer is often 128 KiB, so frames are
/// written from where they are (vectored) rather than copied into one buffer first.
const MAX_FRAMES_PER_WRITE: usize = 64;
const MAX_BYTES_PER_WRITE: usize = 1024 * 1024;

/// Writes all of `frames`, in order, and empties it.
async fn write_frames<W: AsyncWrite + Unpin>(
    socket: &mut W,
    frames: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut next = 0;
    while next < frames.len() {
        let mut slices = [std::io::IoSlice::new(&[]); MAX_FRAMES_PER_WRITE];
        let mut n = 0;
        for (slice, frame) in slices.iter_mut().zip(&frames[next..]) {
            *slice = std::io::IoSlice::new(frame);
            n += 1;
        }
        let mut written = socket.write_vectored(&slices[..n]).await?;
        if written == 0 && frames[next..].iter().any(|f| !f.is_empty()) {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        // Skip what went out whole; trim a frame written in part.
        while next < frames.len() && written >= frames[next].len() {
            written -= frames[next].len();
            next += 1;
        }
        if written > 0 {
            frames[next].advance(written);
        }
    }
    frames.clear();
    Ok(())
}

/// AUTH_RESPONSE with the current token (read afresh from its file, if that is its source).
fn auth_response(credentials: Option<&Credentials>) -> Result<BaseCommand> {
    let credentials =
        credentials.ok_or_else(|| Error::Protocol("AUTH_CHALLENGE without credentials".into()))?;
    Ok(commands::auth_response(
        CLIENT_VERSION,
        TOKEN_METHOD,
        credentials.token()?.into_bytes().into(),
        PROTOCOL_VERSION,
    ))
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut socket: R,
    mut buf: BytesMut,
    decoder: FrameDecoder,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ping_outstanding = false;
    'outer: loop {
        loop {
            match decoder.decode_buf(&mut buf) {
                Ok(Some(frame)) => dispatch(&shared, frame.command, frame.payload),
                Ok(None) => break,
                Err(error) if error.is_fatal() => {
                    tracing::warn!(%error, "undecodable frame, closing connection");
                    break 'outer;
                }
                Err(error) => tracing::warn!(%error, "frame dropped"),
            }
        }
        let read = tokio::select! {
            read = tokio::time::timeout(KEEPALIVE, socket.read_buf(&mut buf)) => read,
            _ = shutdown.changed() => break,
        };
        match read {
            // Idle: ping; a second silent interval means the broker is gone.
            Err(_) if !ping_outstanding => {
                ping_outstanding = true;
                if let Ok(ping) = encode(&commands::ping()) {
                    let _ = shared.out.send(ping);
                }
            }
            Err(_) => {
                tracing::warn!("broker silent for two keep-alive intervals, closing connection");
                break;
            }
            Ok(Ok(0)) => break,
            Ok(Ok(_)) => ping_outstanding = false,
            Ok(Err(error)) => {
                tracing::debug!(%error, "read failed");
                break;
            }
        }
    }
    shared.close();
}

fn dispatch(shared: &Shared, mut command: BaseCommand, payload: Option<PayloadSection>) {
    let Some(kind) = commands::command_type(&command) else {
        tracing::debug!(kind = command.r#type, "unknown command ignored");
        return;
    };
    match kind {
        Type::Ping => {
            if let Ok(pong) = encode(&commands::pong()) {
                let _ = shared.out.send(pong);
            }
        }
        Type::Pong => {}
        Type::AuthChallenge => {
            match auth_response(shared.credentials.as_deref()).and_then(|c| encode(&c)) {
                Ok(response) => {
                    let _ = shared.out.send(response);
                }
                // Unanswered, the broker closes the connection; the next one reads the token again.
                Err(error) => tracing::warn!(%error, "cannot answer the broker's AUTH_CHALLENGE"),
            }
        }
        Type::SendReceipt => {
            if let Some(receipt) = command.send_receipt.take() {
                if let Some(tx) = shared.routes().producers.get(&receipt.producer_id) {
                    let _ = tx.send(ProducerEvent::Receipt(*receipt));
                }
            }
        }
        Type::SendError => {
            if let Some(error) = command.send_error.take() {
                if let Some(tx) = shared.routes().producers.get(&error.producer_id) {
                    let _ = tx.send(ProducerEvent::SendError(*error));
                }
            }
        }
        Type::Message => {
            let (Some(message), Some(payload)) = (command.message.take(), payload) else {
                return;
            };
            let consumer_id = message.consumer_id;
            if let Some((_, tx)) = shared.routes().consumers.get(&consumer_id) {
                let _ = tx.send(ConsumerEvent::Message {
                    consumer_id,
                    command: message,
                    payload: Box::new(payload),
                });
            }
        }
        Type::CloseProducer => {
            if let Some(close) = command.close_producer.as_ref() {
                if let Some(tx) = shared.routes().producers.remove(&close.producer_id) {
                    let _ = tx.send(ProducerEvent::Closed);
                }
            }
        }
        Type::CloseConsumer => {
            if let Some(close) = command.close_consumer.as_ref() {
                let consumer_id = close.consumer_id;
                if let Some((_, tx)) = shared.routes().consumers.remove(&consumer_id) {
                    let _ = tx.send(ConsumerEvent::Closed { consumer_id });
                }
            }
        }
        _ => match reply_request_id(&command) {
            Some(request_id) => {
                if let Some(tx) = shared.routes().requests.remove(&request_id) {
                    let _ = tx.send(Ok(command));
                }
            }
            None => tracing::debug!(?kind, "command ignored"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(socket_address("pulsar://127.0.0.1:6650").unwrap(), "127.0.0.1:6650");
        assert_eq!(socket_address("pulsar://a:1,b:2/").unwrap(), "a:1");
        assert_eq!(socket_address("pulsar+ssl://localhost:6651").unwrap(), "localhost:6651");
        assert!(is_tls_url("pulsar+ssl://localhost:6651") && !is_tls_url("pulsar://a:1"));
        assert!(socket_address("http://a:1").is_err());
        assert!(socket_address("pulsar://nohost").is_err());
    }

    #[tokio::test]
    async fn vectored_writes_deliver_every_frame_whole_and_in_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (_, mut write) = client.unwrap().into_split();
        let mut read = accepted.unwrap().0;
        // Frames of many sizes (and empty ones), more than one write's worth and more than a
        // socket buffer holds, so that writes end inside frames.
        let frames: Vec<Bytes> = (0..300u32)
            .map(|i| {
                let len = [0, 1, 7, 4096, 128 * 1024, 300_001][i as usize % 6];
                Bytes::from((0..len).map(|b| (b as u32 ^ i) as u8).collect::<Vec<u8>>())
            })
            .collect();
        let expected: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            read.read_to_end(&mut got).await.map(|_| got)
        });
        for chunk in frames.chunks(MAX_FRAMES_PER_WRITE) {
            let mut batch = chunk.to_vec();
            write_frames(&mut write, &mut batch).await.unwrap();
            assert!(batch.is_empty());
        }
        write.shutdown().await.unwrap();
        drop(write);
        let got = tokio::time::timeout(Duration::from_secs(30), reader).await.unwrap().unwrap();
        let got = got.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bytes differ");
    }
}
