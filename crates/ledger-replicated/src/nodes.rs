//! The storage nodes as a client sees them: the live ones (their registrations, refreshed from
//! the metadata store) and one pipelined connection to each, opened on first use.
//!
//! A request's answer goes to the callback it was sent with, exactly once: the response, or
//! `None` if the connection failed first (refused, reset, a bad frame, no such node). A
//! connection that failed is dropped; the next request to that node opens a new one.
//!
//! Requests are written from the sender's thread when the connection is idle
//! ([`DirectWriter`]), the requests a writer gathered in one go in one write per node, and
//! answers are handed to their callbacks on the connection's reader task: no writer-task hop
//! on an add's way out.

use crate::stats::ClientStats;
use bytes::BytesMut;
use magnetar_clock::{log_limit::system_ms, warn_limited};
use magnetar_metadata::{Event, EventKind, MetadataError, MetadataStore, WatchEvent, WatchStream};
use magnetar_model::storage_nodes::{StorageNodeRacks, StorageNodeRegistration as Registration};
use magnetar_net::DirectWriter;
use magnetar_replication::message::{Request, Response};
use magnetar_replication::placement::NodeInfo;
use magnetar_replication::wire::{self, Message};
use magnetar_replication::NodeId;
use parking_lot::{Mutex, RwLock};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes of requests queued for one node before its connection is given up on.
const QUEUED_BYTES: usize = 256 << 20;

/// A node's requests gathered by `send_all` are written once they reach this many bytes.
const BATCH_BYTES: usize = 64 << 10;

/// Where an answer goes: `None` when the node failed before answering.
pub type Reply = Box<dyn FnOnce(Option<Response>) + Send>;

pub struct Nodes {
    metadata: Arc<dyn MetadataStore>,
    live: RwLock<BTreeMap<NodeId, Registration>>,
    /// The operator's rack assignments (`pulsar-admin bookies set-bookie-rack`), by address.
    racks: RwLock<StorageNodeRacks>,
    /// Bumped whenever `live` or `racks` is written: a writer rebuilds its view of the nodes
    /// only when this moved (every open ledger ticks every 50 ms).
    generation: AtomicU64,
    connections: Mutex<BTreeMap<NodeId, Arc<Connection>>>,
    connect_timeout: Duration,
    /// TLS to the nodes that serve it (None: such nodes cannot be reached).
    tls: Option<Arc<ClientConfig>>,
    stats: Arc<ClientStats>,
}

impl Nodes {
    pub(crate) fn new(
        metadata: Arc<dyn MetadataStore>,
        connect_timeout: Duration,
        tls: Option<Arc<ClientConfig>>,
        stats: Arc<ClientStats>,
    ) -> Arc<Nodes> {
        Arc::new(Nodes {
            metadata,
            live: RwLock::new(BTreeMap::new()),
            racks: RwLock::new(StorageNodeRacks::default()),
            generation: AtomicU64::new(0),
            connections: Mutex::new(BTreeMap::new()),
            connect_timeout,
            tls,
            stats,
        })
    }

    /// Reads the registrations and the rack assignments now.
    pub async fn refresh(&self) -> Result<(), magnetar_metadata::MetadataError> {
        self.refresh_racks().await?;
        let root = magnetar_model::keys::STORAGE_NODES_ROOT;
        let mut live = BTreeMap::new();
        for child in self.metadata.list_children(root).await? {
            let Ok(id) = child.parse::<u64>() else { continue };
            let Some(value) = self.metadata.get(&magnetar_model::keys::storage_node(id)).await?
            else {
                continue; // gone since the listing
            };
            if let Some(registration) = parse_registration(id, &value.value) {
                live.insert(NodeId(id), registration);
            }
        }
        *self.live.write() = live;
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Reads the operator's rack assignments now (none stored: none assigned). A document
    /// that does not parse is reported and the previous assignments kept.
    async fn refresh_racks(&self) -> Result<(), magnetar_metadata::MetadataError> {
        let stored = self.metadata.get(magnetar_model::keys::STORAGE_NODE_RACKS).await?;
        let racks = match stored {
            None => StorageNodeRacks::default(),
            Some(value) => match serde_json::from_slice(&value.value) {
                Ok(racks) => racks,
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable rack assignments; keeping the last");
                    return Ok(());
                }
            },
        };
        *self.racks.write() = racks;
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Applies one change of a registration (a node registered, re-registered with new free
    /// space or read-only, or its key went with its lease).
    async fn apply(&self, event: &Event) -> Result<(), magnetar_metadata::MetadataError> {
        let id = event
            .key
            .strip_prefix(magnetar_model::keys::STORAGE_NODES_ROOT)
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|id| id.parse::<u64>().ok());
        let Some(id) = id else { return Ok(()) };
        let registration = match event.kind {
            EventKind::Delete => None,
            EventKind::Put { .. } => match self.metadata.get(&event.key).await? {
                Some(value) => parse_registration(id, &value.value),
                None => None, // deleted since
            },
        };
        let mut live = self.live.write();
        match registration {
            Some(registration) => live.insert(NodeId(id), registration),
            None => live.remove(&NodeId(id)),
        };
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Keeps the registrations and rack assignments current until the returned task is
    /// aborted: a change is applied as soon as a watch reports it (a node registering to
    /// replace a failed or full one is placed at once, not at the next period: writers that
    /// need a replacement then find it; a rack the operator assigns counts for the next
    /// placement), and everything is re-read every `period` anyway and after a lagging or lost
    /// watch.
    pub fn refresh_every(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        let nodes = Arc::downgrade(self);
        let metadata = self.metadata.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            let registrations = format!("{}/", magnetar_model::keys::STORAGE_NODES_ROOT);
            let mut watch: Option<WatchStream> = None;
            let mut racks_watch: Option<WatchStream> = None;
            let mut polling = false; // warned that a watch is down: once per streak
            loop {
                for (stream, prefix) in [
                    (&mut watch, registrations.as_str()),
                    (&mut racks_watch, magnetar_model::keys::STORAGE_NODE_RACKS),
                ] {
                    if stream.is_some() {
                        continue;
                    }
                    match metadata.watch(prefix).await {
                        Ok(opened) => *stream = Some(opened),
                        Err(MetadataError::Closed) => return, // shutting down
                        Err(e) if !polling => {
                            polling = true;
                            tracing::warn!(error = %e, "no watch on storage nodes; polling");
                        }
                        Err(_) => {}
                    }
                }
                if watch.is_some() && racks_watch.is_some() {
                    polling = false;
                }
                let change = tokio::select! {
                    _ = ticks.tick() => Change::All,
                    event = next_event(&mut watch) => match event {
                        Some(WatchEvent::Changed(event)) => Change::Registration(event),
                        Some(WatchEvent::Lagged) => Change::All, // re-read everything
                        None => {
                            watch = None; // the stream ended: set up another, re-read now
                            Change::All
                        }
                    },
                    event = next_event(&mut racks_watch) => match event {
                        Some(WatchEvent::Changed(_)) | Some(WatchEvent::Lagged) => Change::Racks,
                        None => {
                            racks_watch = None;
                            Change::All
                        }
                    },
                };
                let Some(nodes) = nodes.upgrade() else { return };
                let refreshed = match &change {
                    Change::Registration(event) => nodes.apply(event).await,
                    Change::Racks => nodes.refresh_racks().await,
                    Change::All => nodes.refresh().await,
                };
                match refreshed {
                    Ok(()) | Err(MetadataError::Closed) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "storage node registrations not refreshed")
                    }
                }
            }
        })
    }

    /// The registered nodes this client can write to (a node that serves TLS only with a
    /// trust file), for placing ledgers and replacing failed nodes.
    pub fn live(&self) -> Vec<NodeInfo> {
        let reachable = |r: &Registration| !r.tls || r.plain_clients || self.tls.is_some();
        let racks = self.racks.read();
        self.live
            .read()
            .iter()
            .filter(|(_, r)| reachable(r))
            .map(|(&id, r)| NodeInfo::new(id, r, &racks))
            .collect()
    }

    /// Moves whenever what [`Nodes::live`] answers may have changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Sends `request` to `node`; `reply` gets the answer or `None`.
    pub fn send(&self, node: NodeId, request: &Request, reply: Reply) {
        match self.connection(node) {
            Some(connection) => {
                let mut frames = Frames::default();
                connection.encode(request, reply, &mut frames);
                connection.write(frames);
            }
            None => unanswered(&self.stats, reply),
        }
    }

    /// Sends every request of `sends` (drained), in order per node, with one write per node:
    /// each node's requests are encoded into one buffer, written from it when the connection
    /// is idle (no copy beyond the encoding, as for a lone request).
    pub fn send_all(&self, sends: &mut Vec<(NodeId, Request, Reply)>) {
        let mut batches: Vec<(NodeId, Option<Arc<Connection>>, Frames)> = Vec::new();
        for (node, request, reply) in sends.drain(..) {
            let index = match batches.iter().position(|(n, _, _)| *n == node) {
                Some(index) => index,
                None => {
                    batches.push((node, self.connection(node), Frames::default()));
                    batches.len() - 1
                }
            };
            match &mut batches[index] {
                (_, Some(connection), frames) => {
                    connection.encode(&request, reply, frames);
                    if frames.bytes.len() >= BATCH_BYTES {
                        // Large entries leave at once, one write each (no growing buffer).
                        connection.write(std::mem::take(frames));
                    }
                }
                (_, None, _) => unanswered(&self.stats, reply),
            }
        }
        for (_, connection, frames) in batches {
            if let Some(connection) = connection {
                connection.write(frames);
            }
        }
    }

    fn connection(&self, node: NodeId) -> Option<Arc<Connection>> {
        let mut connections = self.connections.lock();
        if let Some(connection) = connections.get(&node) {
            if !connection.dead.load(Ordering::Acquire) {
                return Some(connection.clone());
            }
        }
        let (address, node_tls, node_plain) = {
            let live = self.live.read();
            let registration = live.get(&node)?;
            (registration.address.clone(), registration.tls, registration.plain_clients)
        };
        // A client with a trust file speaks TLS to every node that serves it.
        let tls = match (node_tls, &self.tls) {
            (false, _) => Tls::Off,
            (true, Some(config)) => Tls::On(config.clone()),
            (true, None) if node_plain => Tls::Off,
            (true, None) => Tls::Missing,
        };
        let connection =
            Connection::open(node, address, tls, self.connect_timeout, self.stats.clone());
        connections.insert(node, connection.clone());
        Some(connection)
    }
}

/// Tells `reply` its request failed unanswered, and counts it.
fn unanswered(stats: &ClientStats, reply: Reply) {
    stats.unanswered();
    reply(None);
}

/// How a connection to one node is secured, as its registration and this client's
/// configuration say.
enum Tls {
    /// The node serves plain TCP.
    Off,
    /// The node serves TLS and this client has no trust file for it: nothing is sent.
    Missing,
    On(Arc<ClientConfig>),
}

/// Requests encoded for one connection, written together.
#[derive(Default)]
struct Frames {
    bytes: BytesMut,
    ids: Vec<u64>,
}

struct Connection {
    node: NodeId,
    out: DirectWriter,
    pending: Mutex<BTreeMap<u64, Reply>>,
    next: AtomicU64,
    dead: AtomicBool,
    stats: Arc<ClientStats>,
}

impl Connection {
    fn open(
        node: NodeId,
        address: String,
        tls: Tls,
        connect_timeout: Duration,
        stats: Arc<ClientStats>,
    ) -> Arc<Connection> {
        let connection = Arc::new(Connection {
            node,
            out: DirectWriter::new(QUEUED_BYTES),
            pending: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            stats,
        });
        tokio::spawn(connection.clone().run(address, connect_timeout, tls));
        connection
    }

    /// Registers `request`'s reply and encodes it into `frames`.
    fn encode(&self, request: &Request, reply: Reply, frames: &mut Frames) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(id, reply);
        wire::encode(id, &Message::Request(request.clone()), &mut frames.bytes);
        frames.ids.push(id);
    }

    /// Writes `frames`; if the connection is gone, their replies get `None`.
    fn write(&self, frames: Frames) {
        if frames.ids.is_empty() {
            return;
        }
        if self.dead.load(Ordering::Acquire) || self.out.send(&frames.bytes).is_err() {
            for id in frames.ids {
                if let Some(reply) = self.pending.lock().remove(&id) {
                    unanswered(&self.stats, reply);
                }
            }
        }
    }

    /// Marks the connection dead and fails everything still waiting.
    fn fail(&self, why: &str) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            tracing::debug!(node = %self.node, why, "storage node connection lost");
        }
        self.out.close();
        let pending = std::mem::take(&mut *self.pending.lock());
        for (_, reply) in pending {
            unanswered(&self.stats, reply);
        }
    }

    async fn run(self: Arc<Self>, address: String, timeout: Duration, tls: Tls) {
        let tls = match tls {
            Tls::Missing => {
                // Not placed on (see `Nodes::live`): only a ledger placed by another broker
                // leads here, to read it. Every read retries: a line a second at most.
                warn_limited!(
                    system_ms(),
                    node = %self.node,
                    "the storage node serves TLS: set [ledgers] tls_trust_certs_file to reach it"
                );
                return self.fail("the node serves TLS and no trust file is configured");
            }
            Tls::Off => None,
            Tls::On(config) => Some(config),
        };
        let stream =
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&address)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return self.fail(&format!("connect to {address}: {e}")),
                Err(_) => return self.fail(&format!("connect to {address}: timed out")),
            };
        let _ = stream.set_nodelay(true);
        let Some(config) = tls else {
            let (reader, writer) = stream.into_split();
            let me = self.clone();
            let write = tokio::spawn(async move {
                if let Err(e) = me.out.run(writer).await {
                    me.fail(&format!("write: {e}"));
                }
            });
            return self.serve(reader, write).await;
        };
        let host = address.rsplit_once(':').map_or(address.as_str(), |(host, _)| host);
        let name = match ServerName::try_from(host.trim_matches(['[', ']']).to_string()) {
            Ok(name) => name,
            Err(e) => return self.fail(&format!("TLS to {address}: bad host name: {e}")),
        };
        let connector = tokio_rustls::TlsConnector::from(config);
        let stream = match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                warn_limited!(
                    system_ms(),
                    node = %self.node,
                    %address,
                    error = %e,
                    "TLS handshake failed"
                );
                return self.fail(&format!("TLS handshake with {address}: {e}"));
            }
            Err(_) => return self.fail(&format!("TLS handshake with {address}: timed out")),
        };
        let (reader, writer) = tokio::io::split(stream);
        let me = self.clone();
        let write = tokio::spawn(async move {
            if let Err(e) = me.out.run_stream(writer).await {
                me.fail(&format!("write: {e}"));
            }
        });
        self.serve(reader, write).await
    }

    /// Reads the node's answers until the connection ends, then stops the writer task `write`
    /// and fails what is left.
    async fn serve(
        self: Arc<Self>,
        mut reader: impl AsyncRead + Unpin,
        write: tokio::task::JoinHandle<()>,
    ) {
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let why = 'read: loop {
            match reader.read_buf(&mut buf).await {
                Ok(0) => break 'read "closed by the node".to_string(),
                Err(e) => break 'read format!("read: {e}"),
                Ok(_) => {}
            }
            loop {
                match wire::decode(&mut buf) {
                    Ok(Some((id, Message::Response(response)))) => {
                        let reply = self.pending.lock().remove(&id);
                        if let Some(reply) = reply {
                            reply(Some(response));
                        }
                    }
                    Ok(Some((_, other))) => break 'read format!("unexpected {other:?}"),
                    Ok(None) => break,
                    Err(e) => break 'read format!("bad frame: {e}"),
                }
            }
        };
        write.abort();
        self.fail(&why);
    }
}

/// A registration's value, or None (warned) when unreadable.
fn parse_registration(id: u64, value: &[u8]) -> Option<Registration> {
    match serde_json::from_slice::<Registration>(value) {
        Ok(registration) => Some(registration),
        Err(e) => {
            tracing::warn!(node = id, error = %e, "unreadable storage node registration");
            None
        }
    }
}

/// What the refresher re-reads.
enum Change {
    Registration(Event),
    Racks,
    All,
}

/// The next item of `watch`; never, without one (the period's tick drives the loop then).
async fn next_event(watch: &mut Option<WatchStream>) -> Option<WatchEvent> {
    match watch {
        Some(stream) => stream.recv().await,
        None => std::future::pending().await,
    }
}
