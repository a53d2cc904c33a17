//! One client connection to the proxy: its CONNECT read and authenticated, then either lookups
//! answered here (a lookup connection) or the connection forwarded to its broker (a direct one).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use magnetar_protocol::proto::command_lookup_topic_response::LookupType;
use magnetar_protocol::proto::{BaseCommand, CommandConnect, ServerError};
use magnetar_protocol::{commands, FrameDecoder};
use magnetar_security::{Principal, TransportIdentity};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::directory::host_port;
use crate::handshake::{self, Mode, Refusal};
use crate::link::{self, encode, Link};
use crate::{request_ids, Proxy, ProxyError};

/// The request id of an ERROR that answers no request (Pulsar's -1).
const NO_REQUEST: u64 = u64::MAX;
/// Redirects a lookup follows before it gives up (Pulsar's proxy: 10).
const MAX_REDIRECTS: usize = 10;

pub(crate) async fn serve<S>(
    proxy: Arc<Proxy>,
    mut stream: S,
    peer: String,
    identity: TransportIdentity,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut buffer = BytesMut::with_capacity(4096);
    let limit = proxy.config.handshake_timeout;
    let connect = match tokio::time::timeout(limit, read_connect(&mut stream, &mut buffer)).await {
        Ok(Ok(connect)) => connect,
        Ok(Err(why)) => {
            tracing::debug!(%peer, why, "proxy: connection closed before CONNECT");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "proxy: no CONNECT in time");
            return;
        }
    };
    let mode = match handshake::mode_of(&connect) {
        Ok(mode) => mode,
        Err(Refusal::OldProtocol(version)) => {
            let why = format!("protocol version {version} is too old for the proxy (10 or newer)");
            refuse(&mut stream, ServerError::UnsupportedVersionError, why).await;
            return;
        }
    };
    let principal = match &proxy.authenticator {
        None => None,
        Some(authenticator) => {
            let method = connect.auth_method_name.as_deref().filter(|m| !m.is_empty());
            let data = connect.auth_data.as_deref().unwrap_or_default();
            match authenticator.authenticate(method, data, &identity, now_ms()) {
                Ok(principal) => Some(principal),
                Err(error) => {
                    tracing::warn!(%peer, %error, "proxy: authentication failed");
                    let why = format!("Unable to authenticate: {error}");
                    refuse(&mut stream, ServerError::AuthenticationError, why).await;
                    return;
                }
            }
        }
    };
    match mode {
        Mode::Direct(target) => {
            direct(proxy, stream, buffer, target, connect, principal, peer).await;
        }
        Mode::Lookup => {
            let session = Arc::new(LookupSession {
                proxy,
                connect,
                principal,
                links: tokio::sync::Mutex::new(HashMap::new()),
            });
            session.run(stream, buffer, peer).await;
        }
    }
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

/// Reads until the first frame, which must be CONNECT.
async fn read_connect<S>(stream: &mut S, buffer: &mut BytesMut) -> Result<CommandConnect, String>
where
    S: AsyncRead + Unpin,
{
    let decoder = FrameDecoder::default();
    loop {
        match decoder.decode_buf(buffer) {
            Ok(Some(frame)) => {
                let kind = frame.command_type();
                return frame
                    .command
                    .connect
                    .map(|c| *c)
                    .ok_or_else(|| format!("the first command was {kind:?}, not CONNECT"));
            }
            Ok(None) => {}
            Err(error) => return Err(format!("malformed frame: {error}")),
        }
        match stream.read_buf(buffer).await {
            Ok(0) => return Err("closed".into()),
            Ok(_) => {}
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// Answers an ERROR that ends the connection.
async fn refuse<S>(stream: &mut S, error: ServerError, message: String)
where
    S: AsyncWrite + Unpin,
{
    if let Ok(frame) = encode(&commands::error(NO_REQUEST, error, message)) {
        let _ = stream.write_all(&frame).await;
        let _ = stream.shutdown().await;
    }
}

/// The error a client gets when its broker cannot be reached through the proxy.
fn error_of(error: &ProxyError) -> ServerError {
    match error {
        ProxyError::BrokerRefused { error, .. } => *error,
        _ => ServerError::ServiceNotReady,
    }
}

/// A direct connection: the proxy connects to `target` on the client's behalf, gives the client
/// the broker's CONNECTED, then copies bytes both ways until either side closes.
async fn direct<S>(
    proxy: Arc<Proxy>,
    mut client: S,
    leftover: BytesMut,
    target: String,
    connect: CommandConnect,
    principal: Option<Principal>,
    peer: String,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match proxy.brokers.is_broker(&target).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(%peer, %target, "proxy: a client asked for a broker that is not registered");
            let why = format!(
                "Target broker cannot be validated: {target} is not a broker of the cluster"
            );
            refuse(&mut client, ServerError::ServiceNotReady, why).await;
            return;
        }
        Err(error) => {
            refuse(&mut client, ServerError::ServiceNotReady, error.to_string()).await;
            return;
        }
    }
    let request = handshake::broker_connect(&connect, principal.as_ref(), &proxy.credentials);
    let limit = proxy.config.broker_connect_timeout;
    let (mut broker, connected, from_broker) = match link::open(&target, &request, limit).await {
        Ok(opened) => opened,
        Err(error) => {
            tracing::warn!(%peer, %target, %error, "proxy: broker connection failed");
            refuse(&mut client, error_of(&error), error.to_string()).await;
            return;
        }
    };
    let Ok(connected) = encode(&handshake::client_connected(&connected)) else { return };
    if client.write_all(&connected).await.is_err() || client.write_all(&from_broker).await.is_err()
    {
        return;
    }
    if broker.write_all(&leftover).await.is_err() {
        return;
    }
    tracing::debug!(%peer, %target, "proxy: connection forwarded");
    match tokio::io::copy_bidirectional(&mut client, &mut broker).await {
        Ok((up, down)) => tracing::debug!(%peer, %target, up, down, "proxy: connection closed"),
        Err(error) => tracing::debug!(%peer, %target, %error, "proxy: connection ended"),
    }
}

/// A lookup connection: lookups and metadata requests answered through links to brokers.
struct LookupSession {
    proxy: Arc<Proxy>,
    connect: CommandConnect,
    principal: Option<Principal>,
    links: tokio::sync::Mutex<HashMap<String, Arc<Link>>>,
}

impl LookupSession {
    async fn run<S>(self: Arc<Self>, stream: S, mut buffer: BytesMut, peer: String)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut read, mut write) = tokio::io::split(stream);
        let (out, mut outgoing) = mpsc::unbounded_channel::<Bytes>();
        let writer = tokio::spawn(async move {
            while let Some(frame) = outgoing.recv().await {
                if write.write_all(&frame).await.is_err() {
                    return;
                }
            }
        });
        if let Ok(connected) = encode(&handshake::lookup_connected(&self.connect)) {
            let _ = out.send(connected);
        }
        let decoder = FrameDecoder::default();
        'read: loop {
            loop {
                let frame = match decoder.decode_buf(&mut buffer) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(error) => {
                        tracing::debug!(%peer, %error, "proxy: malformed frame; closing");
                        break 'read;
                    }
                };
                let command = frame.command;
                if command.ping.is_some() {
                    let _ = encode(&commands::pong()).map(|pong| out.send(pong));
                } else if command.pong.is_some() {
                } else if request_ids::replace_in_request(&mut command.clone(), 0).is_some() {
                    let (this, out) = (self.clone(), out.clone());
                    tokio::spawn(async move {
                        let answer = this.answer(command).await;
                        let _ = encode(&answer).map(|frame| out.send(frame));
                    });
                } else {
                    // Pulsar's proxy closes too: producers and consumers connect through the
                    // proxy to their broker (`proxy_to_broker_url`), never on this connection.
                    let why = format!(
                        "{:?} on a lookup connection: the proxy serves lookups here",
                        frame_type(&command)
                    );
                    tracing::debug!(%peer, why, "proxy: closing");
                    let error = commands::error(NO_REQUEST, ServerError::NotAllowedError, why);
                    let _ = encode(&error).map(|frame| out.send(frame));
                    break 'read;
                }
            }
            match read.read_buf(&mut buffer).await {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        drop(out);
        let _ = writer.await;
    }

    /// The answer to a forwarded request, under the client's request id.
    async fn answer(&self, mut request: BaseCommand) -> BaseCommand {
        let client_id = request_ids::replace_in_request(&mut request, 0).unwrap_or(NO_REQUEST);
        let answered = if request.lookup_topic.is_some() {
            self.lookup(request.clone()).await
        } else {
            match self.proxy.brokers.pick().await {
                Ok(broker) => self.forward(&broker.service, request.clone()).await,
                Err(error) => Err(error),
            }
        };
        let mut answer = answered.unwrap_or_else(|error| failed(&request, &error));
        request_ids::set_in_response(&mut answer, client_id);
        answer
    }

    async fn forward(&self, broker: &str, request: BaseCommand) -> Result<BaseCommand, ProxyError> {
        let link = self.link(broker).await?;
        link.request(request, self.proxy.config.request_timeout).await
    }

    /// LOOKUP: a broker is asked, its redirects followed to the owner, and the client told to
    /// reach the owner through the proxy.
    async fn lookup(&self, request: BaseCommand) -> Result<BaseCommand, ProxyError> {
        let mut broker = self.proxy.brokers.pick().await?.service;
        let mut authoritative = false;
        for _ in 0..MAX_REDIRECTS {
            let mut ask = request.clone();
            if let Some(lookup) = ask.lookup_topic.as_mut() {
                lookup.authoritative = Some(authoritative);
            }
            let answer = self.forward(&broker, ask).await?;
            let Some(response) = answer.lookup_topic_response.as_ref() else {
                return Ok(answer); // an ERROR: relayed
            };
            let url = response.broker_service_url.clone().unwrap_or_default();
            match LookupType::try_from(response.response.unwrap_or(-1)) {
                Ok(LookupType::Connect) => {
                    // Both URLs the owner's plain one: the client names it to the proxy, which
                    // reaches brokers in plain text.
                    let connect = LookupType::Connect;
                    return Ok(commands::lookup_response(
                        0,
                        connect,
                        url.clone(),
                        Some(url),
                        true,
                        true,
                    ));
                }
                Ok(LookupType::Redirect) if !url.is_empty() => {
                    broker = host_port(&url).to_string();
                    authoritative = response.authoritative.unwrap_or(false);
                }
                _ => return Ok(answer), // Failed: relayed
            }
        }
        Ok(commands::lookup_failed(
            0,
            ServerError::ServiceNotReady,
            "Reached max number of redirections",
        ))
    }

    /// The link to `broker`, opened on first use (and again after it closed).
    async fn link(&self, broker: &str) -> Result<Arc<Link>, ProxyError> {
        let mut links = self.links.lock().await;
        if let Some(link) = links.get(broker).filter(|l| !l.is_closed()) {
            return Ok(link.clone());
        }
        let connect = handshake::broker_connect(
            &self.connect,
            self.principal.as_ref(),
            &self.proxy.credentials,
        );
        let link =
            Link::connect(broker, &connect, self.proxy.config.broker_connect_timeout).await?;
        links.insert(broker.to_string(), link.clone());
        Ok(link)
    }
}

fn frame_type(command: &BaseCommand) -> Option<magnetar_protocol::proto::base_command::Type> {
    commands::command_type(command)
}

/// The failure answer to `request` (the command type its client waits for).
fn failed(request: &BaseCommand, error: &ProxyError) -> BaseCommand {
    let (code, message) = (error_of(error), error.to_string());
    if request.lookup_topic.is_some() {
        commands::lookup_failed(0, code, message)
    } else if request.partition_metadata.is_some() {
        commands::partitioned_metadata_failed(0, code, message)
    } else if request.get_schema.is_some() {
        commands::get_schema_error(0, code, message)
    } else {
        commands::error(0, code, message)
    }
}
