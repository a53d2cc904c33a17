//! The proxy's connections to brokers: the handshake both modes share, and a link that carries a
//! lookup connection's forwarded requests (numbered by the proxy, answered by id).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use magnetar_protocol::proto::{BaseCommand, CommandConnected, ServerError};
use magnetar_protocol::{commands, encode_command, FrameDecoder};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::{request_ids, ProxyError};

/// Connects to `broker` (`host:port`), sends `connect` and waits for CONNECTED, all within
/// `limit`. Returns the stream, the broker's CONNECTED and whatever the broker sent after it.
pub async fn open(
    broker: &str,
    connect: &BaseCommand,
    limit: Duration,
) -> Result<(TcpStream, CommandConnected, BytesMut), ProxyError> {
    let attempt = async {
        let unreachable = |e: std::io::Error| ProxyError::BrokerUnreachable {
            broker: broker.to_string(),
            cause: e.to_string(),
        };
        let mut stream = TcpStream::connect(broker).await.map_err(unreachable)?;
        let _ = stream.set_nodelay(true);
        stream.write_all(&encode(connect)?).await.map_err(unreachable)?;
        let mut buffer = BytesMut::with_capacity(4096);
        let decoder = FrameDecoder::default();
        loop {
            while let Some(frame) =
                decoder.decode_buf(&mut buffer).map_err(|e| ProxyError::Frame(e.to_string()))?
            {
                let command = frame.command;
                if let Some(connected) = command.connected {
                    return Ok((stream, *connected, buffer));
                }
                if let Some(error) = command.error {
                    return Err(ProxyError::BrokerRefused {
                        broker: broker.into(),
                        error: error.error(),
                        message: error.message,
                    });
                }
                if command.auth_challenge.is_some() {
                    return Err(ProxyError::BrokerRefused {
                        broker: broker.into(),
                        error: ServerError::AuthenticationError,
                        message: "asked for another authentication round, which the proxy \
                                  cannot answer"
                            .into(),
                    });
                }
            }
            if stream.read_buf(&mut buffer).await.map_err(unreachable)? == 0 {
                return Err(ProxyError::BrokerClosed(broker.to_string()));
            }
        }
    };
    tokio::time::timeout(limit, attempt)
        .await
        .unwrap_or_else(|_| Err(ProxyError::BrokerTimeout(broker.to_string())))
}

pub fn encode(command: &BaseCommand) -> Result<Bytes, ProxyError> {
    let mut out = BytesMut::new();
    encode_command(command, &mut out).map_err(|e| ProxyError::Frame(e.to_string()))?;
    Ok(out.freeze())
}

type Pending = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<BaseCommand>>>>>;

/// A broker connection that forwarded requests share.
pub struct Link {
    broker: String,
    out: mpsc::UnboundedSender<Bytes>,
    /// Requests waiting for their answers by the proxy's id; None once the connection closed.
    pending: Pending,
    next_id: AtomicU64,
}

impl Link {
    /// Opens a link to `broker` (see [`open`]); its tasks end when the broker closes the
    /// connection or the link is dropped.
    pub async fn connect(
        broker: &str,
        connect: &BaseCommand,
        limit: Duration,
    ) -> Result<Arc<Link>, ProxyError> {
        let (stream, _, leftover) = open(broker, connect, limit).await?;
        let (mut read, mut write) = stream.into_split();
        let (out, mut outgoing) = mpsc::unbounded_channel::<Bytes>();
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let link = Arc::new(Link {
            broker: broker.to_string(),
            out: out.clone(),
            pending: pending.clone(),
            next_id: AtomicU64::new(1),
        });
        tokio::spawn(async move {
            while let Some(bytes) = outgoing.recv().await {
                if write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
        let name = broker.to_string();
        tokio::spawn(async move {
            let mut buffer = leftover;
            let decoder = FrameDecoder::default();
            'read: loop {
                loop {
                    let frame = match decoder.decode_buf(&mut buffer) {
                        Ok(Some(frame)) => frame,
                        Ok(None) => break,
                        Err(error) => {
                            tracing::warn!(broker = %name, %error, "proxy: malformed frame from a broker");
                            break 'read;
                        }
                    };
                    let command = frame.command;
                    if command.ping.is_some() {
                        let _ = encode(&commands::pong()).map(|pong| out.send(pong));
                        continue;
                    }
                    let Some(id) = request_ids::of_response(&command) else { continue };
                    let waiter = pending.lock().as_mut().and_then(|p| p.remove(&id));
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(command);
                    }
                }
                match read.read_buf(&mut buffer).await {
                    Ok(n) if n > 0 => {}
                    _ => break,
                }
            }
            // Every request still waiting learns that the connection is gone.
            pending.lock().take();
        });
        Ok(link)
    }

    pub fn is_closed(&self) -> bool {
        self.pending.lock().is_none() || self.out.is_closed()
    }

    /// Sends `command` (a forwarded request) under an id of the link's and waits at most
    /// `limit` for its answer, which keeps the link's id (the caller gives the client's back).
    pub async fn request(
        &self,
        mut command: BaseCommand,
        limit: Duration,
    ) -> Result<BaseCommand, ProxyError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (done, answer) = oneshot::channel();
        if request_ids::replace_in_request(&mut command, id).is_none() {
            return Err(ProxyError::Frame("not a request the proxy forwards".into()));
        }
        match self.pending.lock().as_mut() {
            Some(pending) => pending.insert(id, done),
            None => return Err(ProxyError::BrokerClosed(self.broker.clone())),
        };
        let sent = self.out.send(encode(&command)?);
        if sent.is_err() {
            return Err(ProxyError::BrokerClosed(self.broker.clone()));
        }
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(ProxyError::BrokerClosed(self.broker.clone())),
            Err(_) => {
                if let Some(pending) = self.pending.lock().as_mut() {
                    pending.remove(&id);
                }
                Err(ProxyError::BrokerTimeout(self.broker.clone()))
            }
        }
    }
}
