//! [`LedgerStorage`] on storage nodes (`magnetar storage`): what a broker in a cluster writes
//! its topics into. Each ledger's metadata lives at `/ledgers/{id}` in the metadata store;
//! its entries on the nodes of its ensemble, written by this process's writer task (the
//! `magnetar_replication::writer` core) and recovered by the `recovery` core when another
//! process (or this one, after a restart) takes the ledger over.
//!
//! * `create` places the ledger on `write_quorum` live nodes (most free disk, spread over
//!   racks) and stores its metadata (absent → version 1).
//! * `append` is acknowledged once `ack_quorum` nodes have the entry durably, in entry order.
//! * `read` asks one node of the entry's ensemble and, after an error or when that node has
//!   been silent for `speculative_read`, the next; the first copy wins; with no entry found
//!   for `read_timeout` it fails (`read`).
//! * `fence` and `close` of a ledger written elsewhere run a recovery; of one written here,
//!   they close it through its writer.
//! * `delete` removes the metadata. Each node frees the entries when its garbage collection
//!   finds the metadata gone.
//! * `write_metrics` serves the client's own series (`stats`): nodes registered, ensemble
//!   changes, recoveries, reads asked of another replica, requests left unanswered.

/// How long `close` (and `fence`) of a ledger written here waits for its writer to finish
/// (the nemesis found a close that waited for good, and the unload behind it).
const CLOSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

pub mod autorecovery;
mod meta;
mod nodes;
mod read;
mod recovery;
mod stats;
mod writer;

use async_trait::async_trait;
use bytes::Bytes;
use magnetar_ledger::store::LedgerInfo;
use magnetar_ledger::{AppendCallback, LedgerError, LedgerMetadata, LedgerStorage};
use magnetar_metadata::MetadataStore;
use magnetar_replication::message::Request;
use magnetar_replication::meta::{LedgerMeta, LedgerState};
use magnetar_replication::placement::{allowed, choose_ensemble};
use magnetar_replication::recovery::RecoveryConfig;
use magnetar_replication::writer::{Writer, WriterConfig};
use magnetar_replication::{EntryId, LedgerId};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

pub use meta::all_ledgers;
pub use nodes::Nodes;
use read::{Ask, RangeRead, ReadTimes};
use stats::ClientStats;
use writer::{Input, OpenLedger, WriterEnv, WriterTask};

/// How this client replicates (defaults in brackets).
#[derive(Debug, Clone)]
pub struct ReplicatedConfig {
    /// A node that has not answered an add for this long is replaced [5 s]; a failed node that
    /// no live node can replace is waited for this long too before the ledger's adds fail.
    pub add_timeout: Duration,
    /// A read's replica silent this long (no answer to anything since the entry was asked of
    /// it) and the entry is asked of the next replica too [200 ms].
    pub speculative_read: Duration,
    /// A read that finds no entry for this long fails with `Unavailable` [5 s, BookKeeper's
    /// `readEntryTimeoutSec`]: frozen replicas whose connections stay open get an error, not a
    /// wait for ever. Longer than `speculative_read`.
    pub read_timeout: Duration,
    /// Recovery re-asks what went unanswered for this long [1 s].
    pub recovery_retry: Duration,
    /// Longest a recovery may take before `fence`/`close` give up [60 s].
    pub recovery_deadline: Duration,
    /// Time-outs and explicit LAC are checked this often [50 ms].
    pub tick: Duration,
    /// Registrations are re-read this often [1 s].
    pub refresh: Duration,
    /// Recently acknowledged entries kept per ledger for tailing readers [8 MiB].
    pub cache_bytes: usize,
    pub connect_timeout: Duration,
    /// The write quorum new ledgers get where no namespace policy names one [2]: only
    /// reported (`magnetar_ledger_client_default_write_quorum`, for alerts on too few nodes);
    /// `create` is told each ledger's quorums.
    pub default_write_quorum: u32,
    /// TLS to the nodes whose registration says they serve it (verifying their certificates,
    /// presenting this client's when configured); None: those nodes cannot be written to.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for ReplicatedConfig {
    fn default() -> Self {
        ReplicatedConfig {
            add_timeout: Duration::from_secs(5),
            speculative_read: Duration::from_millis(200),
            read_timeout: Duration::from_secs(5),
            recovery_retry: Duration::from_secs(1),
            recovery_deadline: Duration::from_secs(60),
            tick: Duration::from_millis(50),
            refresh: Duration::from_secs(1),
            cache_bytes: 8 << 20,
            connect_timeout: Duration::from_secs(2),
            default_write_quorum: 2,
            tls: None,
        }
    }
}

pub struct ReplicatedLedgers {
    metadata: Arc<dyn MetadataStore>,
    nodes: Arc<Nodes>,
    config: ReplicatedConfig,
    open: Arc<Mutex<BTreeMap<LedgerId, Arc<OpenLedger>>>>,
    /// Closed ledgers' metadata (it never changes but by deletion).
    closed: Mutex<BTreeMap<LedgerId, LedgerMeta>>,
    refresher: tokio::task::JoinHandle<()>,
    runtime: tokio::runtime::Handle,
    stats: Arc<ClientStats>,
}

impl Drop for ReplicatedLedgers {
    fn drop(&mut self) {
        self.refresher.abort();
    }
}

impl ReplicatedLedgers {
    /// Reads the live storage nodes once, then keeps them current. Call inside a runtime.
    pub async fn start(
        metadata: Arc<dyn MetadataStore>,
        config: ReplicatedConfig,
    ) -> Result<Arc<Self>, LedgerError> {
        let stats = Arc::new(ClientStats::new(config.default_write_quorum));
        let nodes =
            Nodes::new(metadata.clone(), config.connect_timeout, config.tls.clone(), stats.clone());
        nodes.refresh().await.map_err(meta::unavailable)?;
        let refresher = nodes.refresh_every(config.refresh);
        Ok(Arc::new(ReplicatedLedgers {
            metadata,
            nodes,
            config,
            open: Arc::default(),
            closed: Mutex::new(BTreeMap::new()),
            refresher,
            runtime: tokio::runtime::Handle::current(),
            stats,
        }))
    }

    pub fn nodes(&self) -> &Arc<Nodes> {
        &self.nodes
    }

    fn writer_config(&self) -> WriterConfig {
        let add_timeout_ms = self.config.add_timeout.as_millis() as u64;
        WriterConfig {
            add_timeout_ms,
            explicit_lac_after_ms: 1_000,
            // As long as for a node's answer: a failed node's replacement may register late.
            replacement_wait_ms: add_timeout_ms,
        }
    }

    fn recovery_config(&self) -> RecoveryConfig {
        RecoveryConfig {
            retry_ms: self.config.recovery_retry.as_millis() as u64,
            ..RecoveryConfig::default()
        }
    }

    /// Runs `future` to its end from synchronous code: a blocking thread or a worker of the
    /// multi-threaded runtime (which hands its other tasks off meanwhile).
    fn block_on<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        tokio::task::block_in_place(|| self.runtime.block_on(future))
    }

    fn open_ledger(&self, id: LedgerId) -> Option<Arc<OpenLedger>> {
        self.open.lock().get(&id).cloned()
    }

    /// The metadata of `id` as far as this process knows it: its writer's, a closed one's, or
    /// the store's.
    async fn meta(&self, id: LedgerId) -> Result<LedgerMeta, LedgerError> {
        if let Some(open) = self.open_ledger(id) {
            return Ok(open.meta.lock().clone());
        }
        if let Some(meta) = self.closed.lock().get(&id) {
            return Ok(meta.clone());
        }
        let (meta, _) =
            meta::read_meta(&*self.metadata, id).await?.ok_or(LedgerError::NoSuchLedger(id))?;
        if meta.state == LedgerState::Closed {
            self.closed.lock().insert(id, meta.clone());
        }
        Ok(meta)
    }

    async fn recover(&self, id: LedgerId) -> Result<LedgerMeta, LedgerError> {
        let started = std::time::Instant::now();
        let result = recovery::recover(
            id,
            self.metadata.clone(),
            self.nodes.clone(),
            self.recovery_config(),
            self.config.tick,
            self.config.recovery_deadline,
        )
        .await;
        let (outcome, written_back) = match &result {
            Ok(recovered) => (recovered.outcome, recovered.written_back),
            Err(_) => (stats::RecoveryOutcome::Failed, 0),
        };
        self.stats.recovered(outcome, started.elapsed(), written_back);
        let meta = result?.meta;
        self.closed.lock().insert(id, meta.clone());
        Ok(meta)
    }

    /// Closes a ledger written here through its writer, or recovers one written elsewhere;
    /// the entry count.
    async fn finish(&self, id: LedgerId) -> Result<u64, LedgerError> {
        if let Some(open) = self.open_ledger(id) {
            let (done, result) = oneshot::channel();
            if open.inputs.send(Input::Close(done)).is_ok() {
                match tokio::time::timeout(CLOSE_LIMIT, result).await {
                    Ok(Ok(result)) => return result,
                    Ok(Err(_)) => {} // the writer ended: recover the ledger instead
                    Err(_) => {
                        // Its writer could not finish (adds that reach no quorum, metadata
                        // that cannot be written): the ledger stays open, and whoever loads
                        // it next recovers it, fencing this writer out.
                        tracing::warn!(ledger = id, limit = ?CLOSE_LIMIT, "ledger close timed out: left open for recovery");
                        return Err(LedgerError::Unavailable(format!(
                            "ledger {id}: close not finished within {CLOSE_LIMIT:?}"
                        )));
                    }
                }
            }
        }
        let meta = self.recover(id).await?;
        Ok(meta.last_entry_id.map_or(0, |l| l + 1))
    }

    /// Entries `first..=last` from the replicas of their ensembles (the `read` core decides
    /// whom to ask: one replica per entry, the next after an error or a silence, an error
    /// after `read_timeout` without progress). The first asks leave in one write per node.
    async fn read_range(
        &self,
        meta: &LedgerMeta,
        id: LedgerId,
        first: EntryId,
        last: EntryId,
    ) -> Result<Vec<Bytes>, LedgerError> {
        let times = ReadTimes {
            speculative: self.config.speculative_read,
            timeout: self.config.read_timeout,
        };
        let (answers, mut replies) = tokio::sync::mpsc::unbounded_channel();
        let request = |ask: Ask| {
            let answers = answers.clone();
            let entry = first + ask.index as u64;
            let reply: nodes::Reply =
                Box::new(move |response| drop(answers.send((ask.index, ask.node, response))));
            (ask.node, Request::Read { ledger: id, entry, fence: None }, reply)
        };
        let mut asks = Vec::new();
        let mut read = RangeRead::new(id, meta.clone(), first, last, times, &mut asks);
        let mut sends: Vec<_> = asks.drain(..).map(request).collect();
        self.nodes.send_all(&mut sends);
        let started = tokio::time::Instant::now();
        // Silences are noticed within a quarter of the speculative wait.
        let mut ticks =
            tokio::time::interval((times.speculative / 4).max(Duration::from_millis(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome = loop {
            tokio::select! {
                reply = replies.recv() => {
                    let (index, node, response) = reply.expect("a sender is held here");
                    read.on_reply(index, node, response, started.elapsed(), &mut asks);
                }
                _ = ticks.tick() => read.on_tick(started.elapsed(), &mut asks),
            }
            if let Some(outcome) = read.outcome() {
                break outcome;
            }
            if !asks.is_empty() {
                sends.extend(asks.drain(..).map(request));
                self.nodes.send_all(&mut sends);
            }
        };
        self.stats.speculative_reads(read.speculative);
        self.stats.read_retries(read.retries);
        if read.timed_out {
            self.stats.read_timed_out();
        }
        outcome
    }
}

impl ReplicatedLedgers {
    /// [`LedgerStorage::info`] of a ledger open here or known closed: no metadata read.
    fn info_without_io(&self, ledger: u64) -> Option<LedgerInfo> {
        if let Some(open) = self.open_ledger(ledger) {
            let entries = open.last_add_confirmed().map_or(0, |l| l + 1);
            return Some(LedgerInfo { id: ledger, entries, closed: false, fenced: false });
        }
        // Not inside a `match` on the lock: the guard would live through the arms.
        let known = self.closed.lock().get(&ledger).cloned();
        known.map(|meta| info_of(ledger, &meta))
    }
}

/// What [`LedgerStorage::info`] says of a ledger from its metadata.
fn info_of(ledger: u64, meta: &LedgerMeta) -> LedgerInfo {
    let entries = meta.last_entry_id.map_or(0, |l| l + 1);
    let closed = meta.state == LedgerState::Closed;
    LedgerInfo { id: ledger, entries, closed, fenced: meta.state != LedgerState::Open }
}

#[async_trait]
impl LedgerStorage for ReplicatedLedgers {
    async fn create(&self, id: u64, metadata: &LedgerMetadata) -> Result<(), LedgerError> {
        metadata.validate()?;
        // An ensemble larger than the write quorum (Pulsar's striping, e.g. a namespace's
        // 3/2/2 persistence) is placed on write-quorum nodes: every node holds every entry of
        // its fragment. Same durability, no striping (not built).
        let size = metadata.write_quorum as usize;
        let nodes_seen = self.nodes.generation(); // before the read: a change since shows
        let all = self.nodes.live();
        let live = allowed(&all, metadata.isolation.as_ref(), size);
        let ensemble = choose_ensemble(&live, size).ok_or_else(|| {
            let read_only = live.iter().filter(|n| n.read_only).count();
            let affinity = match &metadata.isolation {
                Some(groups) => format!(
                    " that the bookie affinity allows (primary groups {:?}, secondary {:?})",
                    groups.primary, groups.secondary
                ),
                None => String::new(),
            };
            LedgerError::Unavailable(format!(
                "{} writable storage nodes{affinity} ({read_only} more read-only, short of disk), \
                 a write quorum of {} needs as many",
                live.len() - read_only,
                metadata.write_quorum
            ))
        })?;
        let meta = LedgerMeta::new(ensemble, metadata.write_quorum, metadata.ack_quorum)
            .with_isolation(metadata.isolation.clone());
        let version = meta::create_meta(&*self.metadata, id, &meta).await?;
        let mut core = Writer::new(id, meta, version, self.writer_config());
        // Every live node, not only those allowed now: when a node fails, the core
        // re-applies the groups without it (a group too small lets the secondary in).
        core.set_live_nodes(all);
        let open = self.open.clone();
        let env = WriterEnv {
            nodes: self.nodes.clone(),
            metadata: self.metadata.clone(),
            stats: self.stats.clone(),
            tick: self.config.tick,
            cache_bytes: self.config.cache_bytes,
        };
        let ledger = WriterTask::spawn(
            id,
            core,
            env,
            nodes_seen,
            Box::new(move |id| {
                open.lock().remove(&id);
            }),
        );
        self.open.lock().insert(id, ledger);
        Ok(())
    }

    fn append(
        &self,
        ledger: u64,
        entry_id: u64,
        data: Bytes,
        done: AppendCallback,
    ) -> Result<(), LedgerError> {
        let Some(open) = self.open_ledger(ledger) else {
            return Err(match self.closed.lock().contains_key(&ledger) {
                true => LedgerError::Closed(ledger),
                false => LedgerError::NoSuchLedger(ledger),
            });
        };
        if let Err(expected) = open.next_entry.compare_exchange(
            entry_id,
            entry_id + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            return Err(LedgerError::UnexpectedEntryId { ledger, expected, given: entry_id });
        }
        open.inputs
            .send(Input::Add { entry: entry_id, data, done })
            .map_err(|_| LedgerError::Closed(ledger))
    }

    fn read(&self, ledger: u64, first: u64, last: u64) -> Result<Vec<Bytes>, LedgerError> {
        if let Some(cached) = self.read_cached(ledger, first, last) {
            return Ok(cached);
        }
        self.block_on(async {
            let meta = self.meta(ledger).await?;
            let readable = match meta.state {
                LedgerState::Closed => meta.last_entry_id,
                _ => self.open_ledger(ledger).and_then(|o| o.last_add_confirmed()),
            };
            if first > last || readable.is_none_or(|r| last > r) {
                return Err(LedgerError::NoSuchEntry { ledger, entry: last });
            }
            match self.read_range(&meta, ledger, first, last).await {
                Err(LedgerError::Unavailable(why)) if meta.state == LedgerState::Closed => {
                    // Auto-recovery may have moved the copies the cached metadata names (the
                    // only change a closed ledger's metadata sees): read it again, and if the
                    // ensembles moved, the read goes to where the copies are now.
                    self.closed.lock().remove(&ledger);
                    let stored = self.meta(ledger).await?;
                    if stored.fragments == meta.fragments {
                        return Err(LedgerError::Unavailable(why));
                    }
                    tracing::info!(
                        ledger,
                        "closed ledger's copies moved: read from the new ensemble"
                    );
                    self.read_range(&stored, ledger, first, last).await
                }
                other => other,
            }
        })
    }

    fn read_cached(&self, ledger: u64, first: u64, last: u64) -> Option<Vec<Bytes>> {
        self.open_ledger(ledger)?.cached(first, last)
    }

    fn last_add_confirmed(&self, ledger: u64) -> Result<Option<u64>, LedgerError> {
        if let Some(open) = self.open_ledger(ledger) {
            return Ok(open.last_add_confirmed());
        }
        if let Some(meta) = self.closed.lock().get(&ledger) {
            return Ok(meta.last_entry_id);
        }
        let meta = self.block_on(self.meta(ledger))?;
        Ok(meta.last_entry_id)
    }

    async fn fence(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.finish(ledger).await
    }

    async fn close(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.finish(ledger).await
    }

    async fn delete(&self, ledger: u64) -> Result<(), LedgerError> {
        let key = magnetar_model::keys::ledger(ledger);
        match self.metadata.delete(&key, magnetar_metadata::ExpectedVersion::Any).await {
            Ok(()) => {}
            Err(magnetar_metadata::MetadataError::NotFound { .. }) => {
                return Err(LedgerError::NoSuchLedger(ledger))
            }
            Err(e) => return Err(meta::unavailable(e)),
        }
        self.closed.lock().remove(&ledger);
        self.open.lock().remove(&ledger);
        Ok(())
    }

    fn info(&self, ledger: u64) -> Result<LedgerInfo, LedgerError> {
        if let Some(known) = self.info_without_io(ledger) {
            return Ok(known);
        }
        Ok(info_of(ledger, &self.block_on(self.meta(ledger))?))
    }

    async fn info_async(&self, ledger: u64) -> Result<LedgerInfo, LedgerError> {
        if let Some(known) = self.info_without_io(ledger) {
            return Ok(known);
        }
        Ok(info_of(ledger, &self.meta(ledger).await?))
    }

    fn write_metrics(
        &self,
        out: &mut magnetar_metrics::Exposition,
        labels: magnetar_metrics::Labels,
    ) {
        let open = self.open.lock().len();
        self.stats.write_metrics(out, labels, &self.nodes.live(), open);
    }
}
