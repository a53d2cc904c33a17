//! The storage node's tokio shell. One task owns the decisions ([`NodeCore`]) and the node's
//! view of its store; each connection has a reader (frames in, to that task) and a writer
//! (encoded replies out, batched into as few writes as possible). Reads from disk run on the
//! blocking pool and reply from there.
//!
//! Short of disk (`space.rs`), the node refuses normal adds here, before the core sees them:
//! the refusal is an error, which never claims durability, so it needs no ordering.
//!
//! A journal write or flush that fails ends the node: it answers nothing more (every add
//! still waiting fails with its connection) and `serve` returns the error, as a journal that
//! failed accepts nothing more. A restart recovers what is durable.

use crate::space::DiskSpace;
use crate::store::{read_local, Completion, NodeStorage};
use bytes::{Bytes, BytesMut};
use magnetar_ledger::LedgerStore;
use magnetar_metadata::MetadataStore;
use magnetar_replication::message::{ErrorCode, Request, RequestId, Response};
use magnetar_replication::node::{NodeAction, NodeCore, Peer, Token};
use magnetar_replication::wire::{self, Message, NodeStatus};
use magnetar_replication::{LedgerId, NodeId};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Replies waiting to be written to one connection; a client that reads none of them for
/// this many is cut off.
const OUTBOX: usize = 65_536;
/// Requests from all connections waiting for the node task.
const INBOX: usize = 16_384;
/// Bytes of replies written in one go.
const WRITE_BATCH: usize = 1 << 20;

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
        outbox: mpsc::Sender<Bytes>,
    },
    Disconnected {
        peer: Peer,
    },
    Frame {
        peer: Peer,
        request: RequestId,
        message: Message,
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

/// Serves the storage protocol on `listener` from `store` until `shutdown` resolves.
pub async fn serve(
    node: NodeId,
    store: Arc<LedgerStore>,
    space: Arc<DiskSpace>,
    listener: TcpListener,
    gc: Option<GarbageCollection>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let (completions_tx, completions) = mpsc::unbounded_channel();
    let opened = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || NodeStorage::open(store, completions_tx))
            .await
            .expect("opening does not panic")?
    };
    let (storage, summaries) = opened;
    tracing::info!(node = %node, ledgers = storage.ledgers(), "storage node serving");
    let core = NodeCore::restore(summaries);
    let (inputs_tx, inputs) = mpsc::channel(INBOX);
    let mut task = NodeTask {
        node,
        space,
        core,
        storage,
        peers: BTreeMap::new(),
        done: BTreeMap::new(),
        next_release: 0,
        actions: Vec::new(),
    };
    if let Some(gc) = gc {
        tokio::spawn(collect_garbage(gc, store.clone(), inputs_tx.clone()));
    }
    let accept = accept_loop(listener, inputs_tx);
    tokio::select! {
        result = task.run(inputs, completions) => result,
        result = accept => result.map_err(ServeError::Io),
        () = shutdown => Ok(()),
    }
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
            if ledger == crate::store::FENCE_LOG || listed.contains(&ledger) {
                continue;
            }
            if inputs.send(Input::Collect { ledger }).await.is_err() {
                return;
            }
        }
    }
}

async fn accept_loop(listener: TcpListener, inputs: mpsc::Sender<Input>) -> std::io::Result<()> {
    let mut next_peer: Peer = 0;
    loop {
        let (stream, address) = match listener.accept().await {
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
        tokio::spawn(connection(stream, next_peer, inputs.clone()));
    }
}

async fn connection(stream: TcpStream, peer: Peer, inputs: mpsc::Sender<Input>) {
    let (mut reader, mut writer) = stream.into_split();
    let (outbox, mut replies) = mpsc::channel::<Bytes>(OUTBOX);
    if inputs.send(Input::Connected { peer, outbox }).await.is_err() {
        return;
    }
    let write = tokio::spawn(async move {
        let mut batch = BytesMut::new();
        while let Some(first) = replies.recv().await {
            batch.extend_from_slice(&first);
            while batch.len() < WRITE_BATCH {
                match replies.try_recv() {
                    Ok(more) => batch.extend_from_slice(&more),
                    Err(_) => break,
                }
            }
            if writer.write_all(&batch).await.is_err() {
                break;
            }
            batch.clear();
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
                    if inputs.send(Input::Frame { peer, request, message }).await.is_err() {
                        break 'read;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(peer, error = %e, "closing a connection that sent a bad frame");
                    break 'read;
                }
            }
        }
    }
    let _ = inputs.send(Input::Disconnected { peer }).await;
    write.abort();
}

struct NodeTask {
    node: NodeId,
    space: Arc<DiskSpace>,
    core: NodeCore,
    storage: NodeStorage,
    peers: BTreeMap<Peer, mpsc::Sender<Bytes>>,
    /// Completions that arrived ahead of an earlier token's.
    done: BTreeMap<Token, Result<(), ErrorCode>>,
    next_release: Token,
    actions: Vec<NodeAction>,
}

impl NodeTask {
    async fn run(
        &mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut completions: mpsc::UnboundedReceiver<Completion>,
    ) -> Result<(), ServeError> {
        loop {
            tokio::select! {
                biased;
                Some(completion) = completions.recv() => {
                    if let Some(why) = completion.fatal {
                        return Err(ServeError::LogFailed(why));
                    }
                    self.done.insert(completion.token, completion.result);
                    self.release().await;
                }
                input = inputs.recv() => match input {
                    Some(input) => self.input(input).await,
                    None => return Ok(()),
                },
            }
        }
    }

    /// Hands completions to the core in token order (the core asserts it).
    async fn release(&mut self) {
        while let Some(result) = self.done.remove(&self.next_release) {
            let mut actions = std::mem::take(&mut self.actions);
            self.core.persisted(self.next_release, result, &mut actions);
            self.next_release += 1;
            self.execute(&mut actions).await;
            self.actions = actions;
        }
    }

    async fn input(&mut self, input: Input) {
        match input {
            Input::Collect { ledger } => {
                if let Err(e) = self.storage.delete(ledger).await {
                    tracing::warn!(ledger, error = %e, "deleted ledger not freed");
                } else {
                    tracing::info!(ledger, "deleted ledger freed");
                }
            }
            Input::Connected { peer, outbox } => {
                self.peers.insert(peer, outbox);
            }
            Input::Disconnected { peer } => {
                self.peers.remove(&peer);
            }
            Input::Frame {
                peer,
                request,
                message: Message::Request(Request::Add { ledger, recovery: false, .. }),
            } if self.space.is_read_only() => {
                let response = Response::Error { ledger, code: ErrorCode::Io };
                self.send(peer, request, &Message::Response(response));
            }
            Input::Frame { peer, request, message: Message::Request(body) } => {
                let mut actions = std::mem::take(&mut self.actions);
                self.core.handle(peer, request, body, &mut actions);
                self.execute(&mut actions).await;
                self.actions = actions;
            }
            Input::Frame { peer, request, message: Message::StatusRequest } => {
                let status = NodeStatus {
                    node: self.node,
                    free_bytes: self.space.free(),
                    ledgers: self.storage.ledgers() as u64,
                };
                self.send(peer, request, &Message::Status(status));
            }
            Input::Frame { peer, .. } => {
                tracing::warn!(peer, "closing a connection that sent a response to a node");
                self.peers.remove(&peer);
            }
        }
    }

    async fn execute(&mut self, actions: &mut Vec<NodeAction>) {
        for action in actions.drain(..) {
            match action {
                NodeAction::Persist { token, record } => self.storage.persist(token, record).await,
                NodeAction::Reply { peer, request, response } => {
                    self.send(peer, request, &Message::Response(response))
                }
                NodeAction::ReadAndReply { peer, request, ledger, entry, lac } => {
                    let Some(local) = self.storage.locate(ledger, entry) else {
                        let response = Response::NoEntry { ledger, entry, lac };
                        self.send(peer, request, &Message::Response(response));
                        continue;
                    };
                    let Some(outbox) = self.peers.get(&peer).cloned() else { continue };
                    let store = self.storage.store().clone();
                    tokio::task::spawn_blocking(move || {
                        let response = match read_local(&store, ledger, local) {
                            Ok(Some(data)) => Response::Entry { ledger, entry, lac, data },
                            Ok(None) => Response::NoEntry { ledger, entry, lac },
                            Err(e) => {
                                tracing::warn!(ledger, entry, error = %e, "read failed");
                                Response::Error { ledger, code: ErrorCode::Io }
                            }
                        };
                        let mut frame = BytesMut::new();
                        wire::encode(request, &Message::Response(response), &mut frame);
                        let _ = outbox.try_send(frame.freeze());
                    });
                }
            }
        }
    }

    fn send(&mut self, peer: Peer, request: RequestId, message: &Message) {
        let Some(outbox) = self.peers.get(&peer) else { return };
        let mut frame = BytesMut::new();
        wire::encode(request, message, &mut frame);
        if outbox.try_send(frame.freeze()).is_err() {
            tracing::warn!(peer, "cutting off a client that does not read its replies");
            self.peers.remove(&peer);
        }
    }
}
