//! The storage node's tokio shell. The decisions ([`NodeCore`]) sit behind one mutex, shared
//! by the node task and the journal's completion thread:
//! * the **node task** takes every request from the connections' readers, asks the core, and
//!   stages the records it asks for (the staging, which may create a ledger, stays on this one
//!   task so records reach the journal in token order); after each batch of requests it
//!   commits, which writes a small batch on this task when the journal is idle;
//! * the **journal's completion thread** hands each durable record to the core in token order
//!   and writes the answers straight to the connections ([`DirectWriter`]: from that thread
//!   when the socket is idle), with no hop through the runtime: on a sync add's round trip
//!   that hop was one of the hand-offs that made a replicated add slower than a local one.
//!
//! Reads from disk run on the blocking pool and reply from there.
//!
//! With TLS ([`Listener::tls`]) each connection's handshake runs on its own task, bounded
//! (`magnetar_security::tls::accept`), and its answers are written by its writer task (the
//! session's state is that task's), one hop more than over plain TCP.
//!
//! Short of disk (`space.rs`), the node refuses normal adds here, before the core sees them:
//! the refusal is an error, which never claims durability, so it needs no ordering.
//!
//! A journal write or flush that fails ends the node: it answers nothing more (every add
//! still waiting fails with its connection) and `serve` returns the error, as a journal that
//! failed accepts nothing more. A restart recovers what is durable. A journal out of disk is
//! not a failure: the adds it could not write are answered with an error and the node turns
//! read-only at once (`store.rs` keeps the runs they belonged to from taking more).

use crate::space::DiskSpace;
use crate::stats::{NodeStats, Op};
use crate::store::{read_local, Completion, CompletionSink, NodeStorage};
use bytes::BytesMut;
use magnetar_clock::{log_limit::system_ms, warn_limited};
use magnetar_ledger::LedgerStore;
use magnetar_metadata::MetadataStore;
use magnetar_net::{Closed, DirectWriter};
use magnetar_replication::message::{ErrorCode, Request, RequestId, Response};
use magnetar_replication::node::{NodeAction, NodeCore, Peer, Token};
use magnetar_replication::wire::{self, Message, NodeStatus};
use magnetar_replication::{LedgerId, NodeId};
use magnetar_security::tls::{accept, ServerTls, HANDSHAKE_TIMEOUT};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// Bytes of replies waiting for one connection; a client that reads none of them for this
/// long is cut off.
const OUTBOX_BYTES: usize = 256 << 20;
/// Requests from all connections waiting for the node task.
const INBOX: usize = 16_384;
/// Requests the node task stages before it commits them to the journal.
const BATCH: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the node's log failed: {0}")]
    LogFailed(String),
    #[error(transparent)]
    Storage(#[from] crate::store::StorageError),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

enum Input {
    /// Garbage collection found no metadata for this local ledger: the ledger was deleted.
    Collect {
        ledger: LedgerId,
    },
    Connected {
        peer: Peer,
        writer: Arc<DirectWriter>,
    },
    Disconnected {
        peer: Peer,
    },
    /// A storage request (the reader closes a connection that sends anything but requests).
    Request {
        peer: Peer,
        request: RequestId,
        body: Request,
        /// When the reader decoded it (request latency counts the wait for the node task).
        received_at: Instant,
    },
    Status {
        peer: Peer,
        request: RequestId,
    },
}

/// Deleting ledgers whose metadata is gone: every `every`, the local ledgers are compared with
/// one listing of `/ledgers`; a local ledger missing from it is deleted here. Safe because a
/// writer stores a ledger's metadata before it sends the ledger's first entry, and the local
/// ledgers are taken before the listing: a ledger local then had its metadata before the
/// listing began, so it is missing only if it was deleted (an add that arrives after the
/// deletion re-creates a run that the next pass deletes again).
pub struct GarbageCollection {
    pub metadata: Arc<dyn MetadataStore>,
    pub every: Duration,
}

/// Where a node takes connections: a TCP listener, speaking TLS with `tls`, and then plain
/// text as well only with `plain_clients` (told apart by a connection's first byte).
pub struct Listener {
    pub tcp: TcpListener,
    pub tls: Option<Arc<ServerTls>>,
    pub plain_clients: bool,
}

/// Whether a new connection's client opens with a TLS handshake (its first byte is a
/// handshake record's, 0x16; a storage-protocol frame starts with its length, whose first
/// byte is 0 or 1 under the frame limit). `None`: it hung up, or sent nothing within the
/// handshake timeout.
async fn speaks_tls(stream: &tokio::net::TcpStream) -> Option<bool> {
    const TLS_HANDSHAKE_RECORD: u8 = 0x16;
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
    match peeked {
        Ok(Ok(1)) => Some(first[0] == TLS_HANDSHAKE_RECORD),
        _ => None,
    }
}

/// Serves the storage protocol on `listener` from `store` until `shutdown` resolves.
pub async fn serve(
    node: NodeId,
    store: Arc<LedgerStore>,
    space: Arc<DiskSpace>,
    listener: Listener,
    gc: Option<GarbageCollection>,
    stats: Arc<NodeStats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let (failures_tx, mut failures) = mpsc::unbounded_channel();
    let (deferred_tx, deferred) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            core: NodeCore::new(),
            peers: BTreeMap::new(),
            unanswered: HashMap::new(),
            stats: stats.clone(),
            done: BTreeMap::new(),
            next_release: 0,
            failed: false,
        }),
        deferred: deferred_tx,
        failures: failures_tx,
        space: space.clone(),
        unflushed: Mutex::new(Vec::new()),
    });
    {
        // Answers to a run of adds leave in one write per peer (see `Shared::complete`).
        let shared = shared.clone();
        store.set_completions_hook(Box::new(move || shared.flush_replies()));
    }
    let sink: CompletionSink = {
        let shared = shared.clone();
        Arc::new(move |completion| shared.complete(completion))
    };
    let opened = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || NodeStorage::open(store, sink))
            .await
            .expect("opening does not panic")?
    };
    let (storage, summaries) = opened;
    tracing::info!(node = %node, ledgers = storage.ledgers(), "storage node serving");
    shared.state.lock().core = NodeCore::restore(summaries);
    let (inputs_tx, inputs) = mpsc::channel(INBOX);
    let mut task =
        NodeTask { node, space, shared, storage, stats: stats.clone(), actions: Vec::new() };
    if let Some(gc) = gc {
        tokio::spawn(collect_garbage(gc, store.clone(), inputs_tx.clone()));
    }
    // On a worker, not in `serve`'s caller (`block_on` runs that on the process's main
    // thread): a reader task's request then reaches the node task on the same worker instead
    // of waking another thread (a profile showed that wake-up on every add).
    let mut node_task = tokio::spawn(async move { task.run(inputs, deferred).await });
    let accept = accept_loop(listener, inputs_tx, stats);
    let result = tokio::select! {
        _ = &mut node_task => Ok(()),
        Some(why) = failures.recv() => Err(ServeError::LogFailed(why)),
        result = accept => result.map_err(ServeError::Io),
        () = shutdown => Ok(()),
    };
    node_task.abort();
    result
}

async fn collect_garbage(
    gc: GarbageCollection,
    store: Arc<LedgerStore>,
    inputs: mpsc::Sender<Input>,
) {
    let mut ticks = tokio::time::interval(gc.every);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let local = store.ledgers(); // before the listing: see above
        let listed = match gc.metadata.list_children(magnetar_model::keys::LEDGERS_ROOT).await {
            Ok(children) => children,
            Err(e) => {
                tracing::warn!(error = %e, "garbage collection paused: metadata unreadable");
                continue;
            }
        };
        let listed: std::collections::BTreeSet<LedgerId> =
            listed.iter().filter_map(|child| child.parse().ok()).collect();
        for ledger in local {
            if crate::store::is_fence_log(ledger) || listed.contains(&ledger) {
                continue;
            }
            if inputs.send(Input::Collect { ledger }).await.is_err() {
                return;
            }
        }
    }
}

async fn accept_loop(
    listener: Listener,
    inputs: mpsc::Sender<Input>,
    stats: Arc<NodeStats>,
) -> std::io::Result<()> {
    let mut next_peer: Peer = 0;
    loop {
        let (stream, address) = match listener.tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait a little, go on serving the others.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        next_peer += 1;
        tracing::debug!(%address, peer = next_peer, "client connected");
        stats.connected();
        let stats = stats.clone();
        let inputs = inputs.clone();
        let tls = listener.tls.clone();
        let plain_clients = listener.plain_clients;
        let peer = next_peer;
        tokio::spawn(async move {
            let tls = match tls {
                Some(tls) if plain_clients => match speaks_tls(&stream).await {
                    Some(true) => Some(tls),
                    Some(false) => None,
                    None => return, // gone, or silent for the whole handshake timeout
                },
                other => other,
            };
            match tls {
                None => {
                    let (reader, writer) = stream.into_split();
                    connection(reader, Outbound::Socket(writer), peer, inputs).await;
                }
                Some(tls) => {
                    // A plain-text client, an untrusted certificate, a peer that hangs up or
                    // stalls (the handshake is bounded): nothing of it reaches the node
                    // (`accept` logs why).
                    if let Some((stream, _identity)) =
                        accept(&tls, stream, &address.to_string()).await
                    {
                        let (reader, writer) = tokio::io::split(stream);
                        connection(reader, Outbound::Tls(writer), peer, inputs).await;
                    }
                }
            }
            stats.disconnected();
        });
    }
}

/// A connection's sending half: a plain socket (answers written from the completing thread
/// when nothing is queued) or a TLS session's (written by the connection's writer task).
enum Outbound {
    Socket(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<TcpStream>>),
}

async fn connection(
    mut reader: impl AsyncRead + Unpin,
    outbound: Outbound,
    peer: Peer,
    inputs: mpsc::Sender<Input>,
) {
    let writer = Arc::new(DirectWriter::new(OUTBOX_BYTES));
    if inputs.send(Input::Connected { peer, writer: writer.clone() }).await.is_err() {
        return;
    }
    let write = tokio::spawn({
        let writer = writer.clone();
        async move {
            match outbound {
                Outbound::Socket(socket) => writer.run(socket).await,
                Outbound::Tls(stream) => writer.run_stream(stream).await,
            }
        }
    });
    let mut buf = BytesMut::with_capacity(64 * 1024);
    'read: loop {
        match reader.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        loop {
            match wire::decode(&mut buf) {
                Ok(Some((request, message))) => {
                    let input = match message {
                        Message::Request(body) => {
                            Input::Request { peer, request, body, received_at: Instant::now() }
                        }
                        Message::StatusRequest => Input::Status { peer, request },
                        Message::Response(_) | Message::Status(_) => {
                            // A node's answer sent to a node: a confused or hostile peer. Closed
                            // here, where both halves of the connection are (the node task holds
                            // only the writer: closing that left the peer on an open socket).
                            warn_limited!(
                                system_ms(),
                                peer,
                                "closing a connection that sent a response to a node"
                            );
                            break 'read;
                        }
                    };
                    if inputs.send(input).await.is_err() {
                        break 'read;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    warn_limited!(
                        system_ms(),
                        peer,
                        error = %e,
                        "closing a connection that sent a bad frame"
                    );
                    break 'read;
                }
            }
        }
    }
    let _ = inputs.send(Input::Disconnected { peer }).await;
    writer.close();
    write.abort();
}

/// What the node task and the journal's completion thread share.
struct Shared {
    state: Mutex<State>,
    /// Actions of a completion that the node task carries out.
    deferred: mpsc::UnboundedSender<NodeAction>,
    /// The journal failed: why (`serve` returns it).
    failures: mpsc::UnboundedSender<String>,
    /// Told when the journal runs out of disk before a measurement sees it.
    space: Arc<DiskSpace>,
    /// Peers with answers queued by completions and not written yet.
    unflushed: Mutex<Vec<Arc<DirectWriter>>>,
}

struct State {
    core: NodeCore,
    peers: BTreeMap<Peer, Arc<DirectWriter>>,
    /// Adds and reads not yet answered, for their latency.
    unanswered: HashMap<(Peer, RequestId), (Op, Instant)>,
    stats: Arc<NodeStats>,
    /// Completions that arrived ahead of an earlier token's.
    done: BTreeMap<Token, Result<(), ErrorCode>>,
    next_release: Token,
    /// The journal failed: nothing more is answered.
    failed: bool,
}

impl State {
    /// `request` is an add or a read whose latency is measured from `received_at`.
    fn received(&mut self, peer: Peer, request: RequestId, op: Op, received_at: Instant) {
        self.stats.started(op);
        if let Some((op, _)) = self.unanswered.insert((peer, request), (op, received_at)) {
            self.stats.abandoned(op); // a request id reused while in flight: time the new one
        }
    }

    /// `response` answers `request`: its latency, if measured, ends now.
    fn answered(&mut self, peer: Peer, request: RequestId, response: &Response) {
        if let Some((op, received_at)) = self.unanswered.remove(&(peer, request)) {
            self.stats.finished(op, received_at, response);
        }
    }

    fn disconnected(&mut self, peer: Peer) {
        self.peers.remove(&peer);
        let stats = &self.stats;
        self.unanswered.retain(|&(of, _), &mut (op, _)| {
            if of == peer {
                stats.abandoned(op);
            }
            of != peer
        });
    }

    /// Writes `message` to `peer` now.
    fn send(&mut self, peer: Peer, request: RequestId, message: &Message) {
        let _ = self.frame(peer, request, message, DirectWriter::send);
    }

    /// Queues `message` to `peer`; returns the peer's writer, to flush once the run of answers
    /// is over.
    fn queue(
        &mut self,
        peer: Peer,
        request: RequestId,
        message: &Message,
    ) -> Option<Arc<DirectWriter>> {
        self.frame(peer, request, message, DirectWriter::queue)
    }

    fn frame(
        &mut self,
        peer: Peer,
        request: RequestId,
        message: &Message,
        write: fn(&DirectWriter, &[u8]) -> Result<(), Closed>,
    ) -> Option<Arc<DirectWriter>> {
        if let Message::Response(response) = message {
            self.answered(peer, request, response);
        }
        let writer = self.peers.get(&peer)?;
        let mut frame = BytesMut::new();
        wire::encode(request, message, &mut frame);
        if write(writer, &frame).is_err() {
            warn_limited!(system_ms(), peer, "cutting off a client that does not read its replies");
            self.peers.remove(&peer);
            return None;
        }
        Some(writer.clone())
    }
}

impl Shared {
    /// A record's outcome (on the journal's completion thread, or the node task's for a record
    /// settled at once): hands completions to the core in token order (the core asserts it)
    /// and sends what it answers.
    fn complete(&self, completion: Completion) {
        let mut state = self.state.lock();
        if state.failed {
            return;
        }
        if let Some(why) = completion.fatal {
            state.failed = true;
            let _ = self.failures.send(why);
            return;
        }
        if completion.disk_full && !self.space.is_read_only() {
            tracing::warn!("the journal is out of disk: adds fail here until space is freed");
            self.space.journal_full();
        }
        state.done.insert(completion.token, completion.result);
        let mut actions = Vec::new();
        loop {
            let token = state.next_release;
            let Some(result) = state.done.remove(&token) else { break };
            state.core.persisted(token, result, &mut actions);
            state.next_release += 1;
        }
        for action in actions {
            match action {
                // Queued: the journal completes adds in runs (a group's), and the run's end
                // (`flush_replies`) writes each peer's answers at once, one write for many.
                NodeAction::Reply { peer, request, response } => {
                    if let Some(writer) = state.queue(peer, request, &Message::Response(response)) {
                        let mut unflushed = self.unflushed.lock();
                        if !unflushed.iter().any(|queued| Arc::ptr_eq(queued, &writer)) {
                            unflushed.push(writer);
                        }
                    }
                }
                // A fencing read (recovery: rare): the node task knows where entries are.
                other => {
                    let _ = self.deferred.send(other);
                }
            }
        }
    }

    /// Writes the answers completions queued (at the end of each run of completions, and of
    /// each batch of the node task, which may complete records itself).
    fn flush_replies(&self) {
        // Under the lock (kept short: a few peers' writes), so the list keeps its buffer.
        for writer in self.unflushed.lock().drain(..) {
            writer.flush();
        }
    }
}

struct NodeTask {
    node: NodeId,
    space: Arc<DiskSpace>,
    shared: Arc<Shared>,
    storage: NodeStorage,
    stats: Arc<NodeStats>,
    actions: Vec<NodeAction>,
}

impl NodeTask {
    async fn run(
        &mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut deferred: mpsc::UnboundedReceiver<NodeAction>,
    ) {
        loop {
            tokio::select! {
                biased;
                Some(action) = deferred.recv() => {
                    let mut actions = std::mem::take(&mut self.actions);
                    actions.push(action);
                    self.execute(&mut actions).await;
                    self.actions = actions;
                }
                input = inputs.recv() => match input {
                    Some(input) => self.input(input).await,
                    None => return,
                },
            }
            // The batch: what else is already waiting, staged before the journal is asked to
            // write (so requests that arrived together share a flush).
            for _ in 1..BATCH {
                match inputs.try_recv() {
                    Ok(input) => self.input(input).await,
                    Err(_) => break,
                }
            }
            // Blocks this worker for a write and a flush when the journal is idle and the
            // batch small: a lone add is then answered from here, with no wake-up of the
            // journal's writer thread (the other worker goes on reading connections).
            self.storage.commit();
            self.shared.flush_replies();
        }
    }

    async fn input(&mut self, input: Input) {
        match input {
            Input::Collect { ledger } => {
                if let Err(e) = self.storage.delete(ledger).await {
                    tracing::warn!(ledger, error = %e, "deleted ledger not freed");
                } else {
                    self.shared.state.lock().core.collect(ledger);
                    self.stats.ledger_deleted();
                    tracing::info!(ledger, "deleted ledger freed");
                }
            }
            Input::Connected { peer, writer } => {
                self.shared.state.lock().peers.insert(peer, writer);
            }
            Input::Disconnected { peer } => {
                self.shared.state.lock().disconnected(peer);
            }
            Input::Request {
                peer,
                request,
                body: Request::Add { ledger, recovery: false, .. },
                received_at,
            } if self.space.is_read_only() => {
                self.stats.refused_add();
                let response = Response::Error { ledger, code: ErrorCode::Io };
                let mut state = self.shared.state.lock();
                state.received(peer, request, Op::Add, received_at);
                state.send(peer, request, &Message::Response(response));
            }
            Input::Request { peer, request, body, received_at } => {
                self.stats.request(&body);
                let mut actions = std::mem::take(&mut self.actions);
                {
                    let mut state = self.shared.state.lock();
                    if let Some(op) = Op::of(&body) {
                        state.received(peer, request, op, received_at);
                    }
                    state.core.handle(peer, request, body, &mut actions);
                }
                self.execute(&mut actions).await;
                self.actions = actions;
            }
            Input::Status { peer, request } => {
                let status = NodeStatus {
                    node: self.node,
                    free_bytes: self.space.free(),
                    ledgers: self.storage.ledgers() as u64,
                };
                self.shared.state.lock().send(peer, request, &Message::Status(status));
            }
        }
    }

    /// Carries out the core's actions. Never with the shared state locked while staging: a
    /// record settled at once reports its completion from inside `persist`.
    async fn execute(&mut self, actions: &mut Vec<NodeAction>) {
        for action in actions.drain(..) {
            match action {
                NodeAction::Persist { token, record } => self.storage.persist(token, record).await,
                NodeAction::Reply { peer, request, response } => {
                    let mut state = self.shared.state.lock();
                    if !state.failed {
                        state.send(peer, request, &Message::Response(response));
                    }
                }
                NodeAction::ReadAndReply { peer, request, ledger, entry, lac } => {
                    let Some(local) = self.storage.locate(ledger, entry) else {
                        let response = Response::NoEntry { ledger, entry, lac };
                        self.shared.state.lock().send(peer, request, &Message::Response(response));
                        continue;
                    };
                    let (writer, timed) = {
                        let mut state = self.shared.state.lock();
                        let timed = state.unanswered.remove(&(peer, request));
                        (state.peers.get(&peer).cloned(), timed)
                    };
                    let Some(writer) = writer else {
                        if let Some((op, _)) = timed {
                            self.stats.abandoned(op);
                        }
                        continue;
                    };
                    let store = self.storage.store().clone();
                    let stats = self.stats.clone();
                    tokio::task::spawn_blocking(move || {
                        let response = match read_local(&store, ledger, local) {
                            Ok(Some(data)) => Response::Entry { ledger, entry, lac, data },
                            Ok(None) => Response::NoEntry { ledger, entry, lac },
                            Err(e) => {
                                tracing::warn!(ledger, entry, error = %e, "read failed");
                                Response::Error { ledger, code: ErrorCode::Io }
                            }
                        };
                        let message = Message::Response(response);
                        let mut frame = BytesMut::new();
                        wire::encode(request, &message, &mut frame);
                        let _ = writer.send(&frame);
                        if let (Some((op, received_at)), Message::Response(response)) =
                            (timed, &message)
                        {
                            stats.finished(op, received_at, response);
                        }
                    });
                }
            }
        }
    }
}
