//! One task per ledger this process writes: it owns the [`Writer`] core and carries out its
//! actions (requests to nodes, metadata compare-and-sets, acknowledgements) in the order the
//! core asks for them.

use crate::nodes::Nodes;
use crate::stats::ClientStats;
use bytes::Bytes;
use magnetar_ledger::{AppendCallback, LedgerError};
use magnetar_metadata::MetadataStore;
use magnetar_replication::message::{RequestId, Response};
use magnetar_replication::meta::{Fragment, LedgerMeta};
use magnetar_replication::writer::{WriteError, Writer, WriterAction};
use magnetar_replication::{EntryId, LedgerId, MetaWrite, NodeId};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

pub(crate) enum Input {
    Add { entry: EntryId, data: Bytes, done: AppendCallback },
    Reply { node: NodeId, request: RequestId, response: Option<Response> },
    MetaWritten(MetaWrite),
    MetaRead(LedgerMeta, u64),
    Close(oneshot::Sender<Result<u64, LedgerError>>),
}

const NO_ENTRY: u64 = u64::MAX;

/// Inputs a writer takes in one go when more are waiting (adds that came together leave in
/// one write per node, answers that came together are acknowledged together).
const BATCH: usize = 256;

/// What the rest of the process sees of an open ledger.
pub(crate) struct OpenLedger {
    pub id: LedgerId,
    pub inputs: mpsc::UnboundedSender<Input>,
    /// The next entry id an append must name (checked when it is staged).
    pub next_entry: AtomicU64,
    /// The last acknowledged entry, `NO_ENTRY` for none.
    lac: AtomicU64,
    /// Recently acknowledged entries, for tailing readers (bounded by `cache_bytes`).
    recent: Mutex<Recent>,
    /// The stored metadata as this writer last wrote it.
    pub meta: Mutex<LedgerMeta>,
}

#[derive(Default)]
struct Recent {
    entries: VecDeque<(EntryId, Bytes)>,
    bytes: usize,
}

impl OpenLedger {
    pub fn last_add_confirmed(&self) -> Option<EntryId> {
        Some(self.lac.load(Ordering::Acquire)).filter(|&l| l != NO_ENTRY)
    }

    pub fn cached(&self, first: EntryId, last: EntryId) -> Option<Vec<Bytes>> {
        let recent = self.recent.lock();
        let oldest = recent.entries.front()?.0;
        if first < oldest || last > recent.entries.back()?.0 || first > last {
            return None;
        }
        let start = (first - oldest) as usize;
        Some(
            recent
                .entries
                .range(start..=start + (last - first) as usize)
                .map(|(_, d)| d.clone())
                .collect(),
        )
    }
}

pub(crate) fn map_error(ledger: LedgerId, error: WriteError) -> LedgerError {
    match error {
        WriteError::Fenced => LedgerError::Fenced(ledger),
        WriteError::Closed => LedgerError::Closed(ledger),
        WriteError::NotEnoughNodes => LedgerError::Unavailable(format!(
            "ledger {ledger}: a storage node failed and no live node can replace it"
        )),
    }
}

pub(crate) struct WriterTask {
    ledger: Arc<OpenLedger>,
    core: Writer,
    nodes: Arc<Nodes>,
    metadata: Arc<dyn MetadataStore>,
    inputs: mpsc::UnboundedSender<Input>,
    waiting: VecDeque<(EntryId, Bytes, AppendCallback)>,
    closers: Vec<oneshot::Sender<Result<u64, LedgerError>>>,
    /// Entry count of the ledger as closed (by this writer or a recovery).
    closed_count: Option<u64>,
    started: Instant,
    cache_bytes: usize,
    stats: Arc<ClientStats>,
    on_done: Box<dyn Fn(LedgerId) + Send>,
    /// Requests of the batch being carried out, sent together at its end.
    outgoing: Vec<(NodeId, magnetar_replication::message::Request, crate::nodes::Reply)>,
    /// [`Nodes::generation`] when the core last got the live nodes.
    nodes_seen: u64,
}

/// What every writer of one [`crate::ReplicatedLedgers`] shares.
#[derive(Clone)]
pub(crate) struct WriterEnv {
    pub nodes: Arc<Nodes>,
    pub metadata: Arc<dyn MetadataStore>,
    pub stats: Arc<ClientStats>,
    /// How often the core is ticked (timeouts, idle LACs, replacements).
    pub tick: Duration,
    /// Bytes of recent entries kept for tailing readers.
    pub cache_bytes: usize,
}

impl WriterTask {
    pub fn spawn(
        id: LedgerId,
        core: Writer,
        env: WriterEnv,
        nodes_seen: u64,
        on_done: Box<dyn Fn(LedgerId) + Send>,
    ) -> Arc<OpenLedger> {
        let (inputs, receiver) = mpsc::unbounded_channel();
        let ledger = Arc::new(OpenLedger {
            id,
            inputs: inputs.clone(),
            next_entry: AtomicU64::new(0),
            lac: AtomicU64::new(NO_ENTRY),
            recent: Mutex::new(Recent::default()),
            meta: Mutex::new(core.meta().clone()),
        });
        let WriterEnv { nodes, metadata, stats, tick, cache_bytes } = env;
        let task = WriterTask {
            ledger: ledger.clone(),
            core,
            nodes,
            metadata,
            inputs,
            waiting: VecDeque::new(),
            closers: Vec::new(),
            closed_count: None,
            started: Instant::now(),
            cache_bytes,
            stats,
            on_done,
            outgoing: Vec::new(),
            nodes_seen,
        };
        tokio::spawn(task.run(receiver, tick));
        ledger
    }

    /// Gives the core the nodes it may place on, if they changed since it last got them.
    fn refresh_live_nodes(&mut self) {
        let generation = self.nodes.generation();
        if generation != self.nodes_seen {
            self.nodes_seen = generation;
            // Every live node: the core keeps a replacement to the ledger's groups.
            self.core.set_live_nodes(self.nodes.live());
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn run(mut self, mut receiver: mpsc::UnboundedReceiver<Input>, tick: Duration) {
        let mut ticks = tokio::time::interval(tick);
        let mut out = Vec::new();
        loop {
            tokio::select! {
                input = receiver.recv() => match input {
                    Some(input) => {
                        self.input(input, &mut out);
                        for _ in 1..BATCH {
                            match receiver.try_recv() {
                                Ok(input) => self.input(input, &mut out),
                                Err(_) => break,
                            }
                        }
                    }
                    None => return,
                },
                _ = ticks.tick() => {
                    self.refresh_live_nodes();
                    let now = self.now_ms();
                    self.core.tick(now, &mut out);
                }
            }
            self.execute(&mut out);
            if self.core.is_done() && self.waiting.is_empty() {
                let error = self.core.refusal();
                let count = self.closed_count.unwrap_or_else(|| self.count());
                for closer in self.closers.drain(..) {
                    let _ = closer.send(match error {
                        Some(WriteError::Closed) | None => Ok(count),
                        Some(e) => Err(map_error(self.ledger.id, e)),
                    });
                }
                if matches!(error, Some(WriteError::Closed | WriteError::Fenced)) {
                    if error == Some(WriteError::Fenced) {
                        tracing::warn!(
                            ledger = self.ledger.id,
                            "ledger fenced by another process's recovery: its writer stops"
                        );
                        self.stats.writer_fenced();
                    }
                    (self.on_done)(self.ledger.id);
                    // Late inputs (answers to abandoned requests) are dropped with the receiver.
                    return;
                }
            }
        }
    }

    fn count(&self) -> u64 {
        self.core.last_add_confirmed().map_or(0, |l| l + 1)
    }

    fn input(&mut self, input: Input, out: &mut Vec<WriterAction>) {
        let now = self.now_ms();
        match input {
            Input::Add { entry, data, done } => match self.core.add(data.clone(), now, out) {
                Ok(assigned) => {
                    assert_eq!(assigned, entry, "appends are staged in entry order");
                    self.waiting.push_back((entry, data, done));
                }
                Err(e) => done(Err(map_error(self.ledger.id, e))),
            },
            Input::Reply { node, request, response: Some(response) } => {
                self.core.on_response(node, request, response, now, out)
            }
            Input::Reply { node, response: None, .. } => self.core.on_node_failed(node, now, out),
            // Only these change the core's metadata: publish it after them, not after every ack.
            Input::MetaWritten(result) => {
                let last_before = self.core.meta().last_fragment().clone();
                self.core.on_meta_written(result, now, out);
                self.publish_meta(&last_before);
            }
            Input::MetaRead(meta, version) => {
                let last_before = self.core.meta().last_fragment().clone();
                self.core.on_meta_read(meta, version, now, out);
                self.publish_meta(&last_before);
            }
            Input::Close(done) => {
                self.closers.push(done);
                self.core.close(out);
            }
        }
    }

    /// Shows the core's metadata to the rest of the process. A last fragment other than
    /// `last_before` is an ensemble change the store now holds (a failed node replaced): a new
    /// fragment, or the last one's nodes replaced in place when none of its entries was
    /// acknowledged yet (as a fresh ledger whose node died before its first add).
    fn publish_meta(&mut self, last_before: &Fragment) {
        let meta = self.core.meta().clone();
        if meta.last_fragment() != last_before {
            self.stats.ensemble_changed();
        }
        *self.ledger.meta.lock() = meta;
    }

    fn execute(&mut self, out: &mut Vec<WriterAction>) {
        for action in out.drain(..) {
            match action {
                WriterAction::Send { to, request, body } => {
                    let inputs = self.inputs.clone();
                    self.outgoing.push((
                        to,
                        body,
                        Box::new(move |response| {
                            let _ = inputs.send(Input::Reply { node: to, request, response });
                        }),
                    ));
                }
                WriterAction::WriteMeta { meta, expected_version } => {
                    let inputs = self.inputs.clone();
                    let (metadata, id) = (self.metadata.clone(), self.ledger.id);
                    crate::meta::spawn_write(metadata, id, meta, expected_version, move |result| {
                        let _ = inputs.send(Input::MetaWritten(result));
                    });
                }
                WriterAction::ReadMeta => {
                    let inputs = self.inputs.clone();
                    crate::meta::spawn_read(
                        self.metadata.clone(),
                        self.ledger.id,
                        move |meta, version| {
                            let _ = inputs.send(Input::MetaRead(meta, version));
                        },
                    );
                }
                WriterAction::Acked { entry } => {
                    let (waiting_entry, data, done) =
                        self.waiting.pop_front().expect("an ack for a waiting add");
                    assert_eq!(waiting_entry, entry, "acks in entry order");
                    self.ledger.lac.store(entry, Ordering::Release);
                    self.remember(entry, data);
                    done(Ok(entry));
                }
                WriterAction::Failed { entry, error } => {
                    let (waiting_entry, _, done) =
                        self.waiting.pop_front().expect("a failure for a waiting add");
                    assert_eq!(waiting_entry, entry, "failures in entry order");
                    done(Err(map_error(self.ledger.id, error)));
                }
                WriterAction::Closed { last_entry } => {
                    self.closed_count = Some(last_entry.map_or(0, |l| l + 1));
                }
            }
        }
        if !self.outgoing.is_empty() {
            self.nodes.send_all(&mut self.outgoing);
        }
    }

    fn remember(&self, entry: EntryId, data: Bytes) {
        let mut recent = self.ledger.recent.lock();
        recent.bytes += data.len();
        recent.entries.push_back((entry, data));
        while recent.bytes > self.cache_bytes && recent.entries.len() > 1 {
            let (_, old) = recent.entries.pop_front().expect("more than one");
            recent.bytes -= old.len();
        }
    }
}
