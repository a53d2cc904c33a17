//! A topic's compaction, the shell around the deciding core: runs (`topics compact`, and the
//! automatic ones past `compactionThreshold`), the compacted ledger in force, and the reads of
//! a compacted view. The broker gives it a [`CompactionHost`] (the topic's entries, a ledger
//! id, the record's compare-and-set) and the ledger storage.
//!
//! A run:
//! 1. notes the horizon, the topic's last entry now;
//! 2. phase one reads the compacted ledger in force, then the topic after its horizon up to the
//!    new one, and learns each key's latest message;
//! 3. records the ledger it is about to write as pending, creates it and writes what phase two
//!    keeps of the same entries ([`CompactedEntry`]: the topic entry, its position, the kept
//!    messages of a thinned batch), then closes it;
//! 4. **commits**: one record write names the new ledger and its horizon, and the previous
//!    ledger as obsolete; the new view takes over; the previous ledger is deleted.
//!
//! Crash safety: until the commit the record names the previous ledger, which is never written
//! again, so a crash or an error mid-run leaves the previous compacted ledger in force; the
//! record's pending and obsolete ledgers are deleted at the next load.

use crate::entry::{kept_words, shape_of, CompactedEntry, EntryFormatError};
use crate::{Compacted, CompactionRefused, CompactionState, Keep, LatestPerKey};
use async_trait::async_trait;
use bytes::Bytes;
use magnetar_ledger::{LedgerError, LedgerMetadata, LedgerStorage};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A topic position: ledger and entry.
pub type Pos = (u64, u64);

/// Entries read per storage call.
const READ_CHUNK: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Format(#[from] EntryFormatError),
    /// The topic's side: its entries, its record, a ledger id.
    #[error("{0}")]
    Topic(String),
    #[error("compaction record unreadable: {0}")]
    Record(String),
    #[error("shutting down")]
    ShuttingDown,
}

/// What compaction needs of its topic.
#[async_trait]
pub trait CompactionHost: Send + Sync + 'static {
    /// Up to `count` entries after `after` (`None`: from the first), in order. May block.
    fn read_after(
        &self,
        after: Option<Pos>,
        count: usize,
    ) -> Result<Vec<(Pos, Bytes)>, CompactionError>;
    /// The topic's last durable entry.
    fn last_confirmed(&self) -> Option<Pos>;
    /// Bytes of entries after `after` (`None`: all).
    fn size_after(&self, after: Option<Pos>) -> u64;
    /// A fresh ledger id, and how to store that ledger.
    async fn new_ledger(&self) -> Result<(u64, LedgerMetadata), CompactionError>;
    /// The stored record, if any.
    async fn load_record(&self) -> Result<Option<Bytes>, CompactionError>;
    /// Replaces the record (compare-and-set against what this host last read or wrote).
    async fn store_record(&self, value: Bytes) -> Result<(), CompactionError>;
}

/// The record in the metadata store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// The compacted ledger in force and its horizon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon: Option<Pos>,
    /// Ledgers written by a run not committed (yet): deleted at load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<u64>,
    /// Ledgers a commit replaced: deleted once nothing needs them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub obsolete: Vec<u64>,
}

impl CompactionRecord {
    fn committed(&self) -> Option<Compacted> {
        Some(Compacted { ledger: self.ledger?, horizon: self.horizon? })
    }

    fn encode(&self) -> Bytes {
        serde_json::to_vec(self).expect("a record serializes").into()
    }
}

/// A compacted ledger's index: where each of its entries comes from.
pub struct CompactedView {
    storage: Arc<dyn LedgerStorage>,
    pub ledger: u64,
    pub horizon: Pos,
    /// The topic position of each entry (ascending), and its kept messages.
    positions: Vec<Pos>,
    kept: Vec<Option<Vec<u64>>>,
    pub bytes: u64,
}

impl CompactedView {
    pub fn entries(&self) -> u64 {
        self.positions.len() as u64
    }

    /// Up to `count` entries whose topic positions come after `after`. May block.
    pub fn read_after(
        &self,
        after: Option<Pos>,
        count: usize,
    ) -> Result<Vec<CompactedEntry>, CompactionError> {
        let first = match after {
            None => 0,
            Some(after) => self.positions.partition_point(|&p| p <= after),
        };
        self.read_range(first, count)
    }

    fn read_range(
        &self,
        first: usize,
        count: usize,
    ) -> Result<Vec<CompactedEntry>, CompactionError> {
        let last = (first + count).min(self.positions.len());
        if first >= last {
            return Ok(Vec::new());
        }
        let raw = self.storage.read(self.ledger, first as u64, last as u64 - 1)?;
        raw.iter().map(|raw| Ok(CompactedEntry::decode(raw)?)).collect()
    }

    /// The entries at `positions` that the view holds. May block.
    pub fn read_positions(
        &self,
        positions: &[Pos],
    ) -> Result<Vec<CompactedEntry>, CompactionError> {
        let mut out = Vec::new();
        for position in positions {
            if let Ok(index) = self.positions.binary_search(position) {
                out.extend(self.read_range(index, 1)?);
            }
        }
        Ok(out)
    }

    /// The last message the view holds: its position and, in a thinned batch, its index.
    pub fn last_message(&self) -> Option<(Pos, Option<u32>)> {
        let index = self.positions.len().checked_sub(1)?;
        let position = self.positions[index];
        let last_kept = self.kept[index].as_ref().and_then(|words| {
            let (word, bits) = words.iter().enumerate().rev().find(|(_, w)| **w != 0)?;
            Some(word as u32 * 64 + 63 - bits.leading_zeros())
        });
        Some((position, last_kept))
    }

    /// Builds the index by reading the ledger through. May block.
    fn open(
        storage: Arc<dyn LedgerStorage>,
        committed: Compacted,
    ) -> Result<CompactedView, CompactionError> {
        let entries = storage.info(committed.ledger)?.entries;
        let mut view = CompactedView {
            storage,
            ledger: committed.ledger,
            horizon: committed.horizon,
            positions: Vec::new(),
            kept: Vec::new(),
            bytes: 0,
        };
        let mut next = 0;
        while next < entries {
            let last = (next + READ_CHUNK as u64).min(entries) - 1;
            for raw in view.storage.read(view.ledger, next, last)? {
                let entry = CompactedEntry::decode(&raw)?;
                view.bytes += raw.len() as u64;
                view.positions.push(entry.position);
                view.kept.push(entry.kept);
            }
            next = last + 1;
        }
        Ok(view)
    }
}

/// `GET …/compaction`: Pulsar's `LongRunningProcessStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    NotRun,
    Running,
    Success,
    Error,
}

/// Stats' `compaction` (Pulsar's `CompactionStats` of the topic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactionStats {
    pub last_removed_events: u64,
    pub last_succeed_ms: u64,
    pub last_failed_ms: u64,
    pub last_duration_ms: u64,
}

struct Inner {
    state: CompactionState,
    view: Option<Arc<CompactedView>>,
    record: CompactionRecord,
    status: RunStatus,
    last_error: String,
    stats: CompactionStats,
}

/// A topic's compaction.
pub struct TopicCompaction {
    host: Arc<dyn CompactionHost>,
    storage: Arc<dyn LedgerStorage>,
    inner: Mutex<Inner>,
    /// Wall-clock ms (stats' timestamps).
    now_ms: fn() -> u64,
}

fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl TopicCompaction {
    /// Loads the topic's compaction: the record, the compacted ledger it names (read through
    /// for its index), and the deletion of what a run left pending or a commit obsolete.
    pub async fn load(
        host: Arc<dyn CompactionHost>,
        storage: Arc<dyn LedgerStorage>,
    ) -> Result<Arc<TopicCompaction>, CompactionError> {
        let mut record = match host.load_record().await? {
            Some(raw) => serde_json::from_slice::<CompactionRecord>(&raw)
                .map_err(|e| CompactionError::Record(e.to_string()))?,
            None => CompactionRecord::default(),
        };
        let committed = record.committed();
        let view = match committed {
            Some(committed) => {
                let storage = storage.clone();
                let view =
                    tokio::task::spawn_blocking(move || CompactedView::open(storage, committed))
                        .await
                        .map_err(|_| CompactionError::ShuttingDown)??;
                Some(Arc::new(view))
            }
            None => None,
        };
        if !record.pending.is_empty() || !record.obsolete.is_empty() {
            for ledger in record.pending.drain(..).chain(record.obsolete.drain(..)) {
                delete_ledger(&*storage, ledger).await?;
            }
            host.store_record(record.encode()).await?;
        }
        let status = if committed.is_some() { RunStatus::Success } else { RunStatus::NotRun };
        Ok(Arc::new(TopicCompaction {
            host,
            storage,
            inner: Mutex::new(Inner {
                state: CompactionState::recovered(committed),
                view,
                record,
                status,
                last_error: String::new(),
                stats: CompactionStats::default(),
            }),
            now_ms: wall_clock_ms,
        }))
    }

    /// The compacted view in force, if the topic was ever compacted.
    pub fn view(&self) -> Option<Arc<CompactedView>> {
        self.inner.lock().view.clone()
    }

    /// The horizon of the compacted ledger in force.
    pub fn horizon(&self) -> Option<Pos> {
        self.inner.lock().state.committed.map(|c| c.horizon)
    }

    pub fn status(&self) -> (RunStatus, String) {
        let inner = self.inner.lock();
        (inner.status, inner.last_error.clone())
    }

    pub fn stats(&self) -> CompactionStats {
        self.inner.lock().stats
    }

    /// What retention must keep for compaction: `Some(None)` everything (a first run under
    /// way), `Some(Some(h))` what comes after the horizon `h`, `None` nothing (never compacted).
    pub fn retention_hold(&self) -> Option<Option<Pos>> {
        let inner = self.inner.lock();
        let horizon = inner.state.committed.map(|c| c.horizon);
        (horizon.is_some() || inner.state.is_running()).then_some(horizon)
    }

    /// The topic is deleted: its compacted ledgers go (its record is the caller's to delete).
    pub async fn delete(&self) -> Result<(), CompactionError> {
        let ledgers: Vec<u64> = {
            let mut inner = self.inner.lock();
            inner.view = None;
            let record = &inner.record;
            record.ledger.iter().chain(&record.pending).chain(&record.obsolete).copied().collect()
        };
        for ledger in ledgers {
            delete_ledger(&*self.storage, ledger).await?;
        }
        Ok(())
    }

    /// Bytes not compacted yet (after the horizon): what `compactionThreshold` is compared with.
    pub fn uncompacted_bytes(&self) -> u64 {
        self.host.size_after(self.horizon())
    }

    /// Starts a run in the background (`topics compact`): refused while one is under way.
    pub fn start(self: &Arc<Self>) -> Result<(), CompactionRefused> {
        {
            let mut inner = self.inner.lock();
            inner.state.begin()?;
            inner.status = RunStatus::Running;
            inner.last_error.clear();
        }
        let this = self.clone();
        tokio::spawn(async move { this.run().await });
        Ok(())
    }

    /// Runs a compaction now and waits for it (the background run's body; tests call it).
    pub async fn run(self: &Arc<Self>) {
        let started = (self.now_ms)();
        let outcome = self.compact().await;
        let now = (self.now_ms)();
        let mut inner = self.inner.lock();
        inner.stats.last_duration_ms = now.saturating_sub(started);
        match outcome {
            Ok(removed) => {
                inner.status = RunStatus::Success;
                inner.stats.last_removed_events = removed;
                inner.stats.last_succeed_ms = now;
            }
            Err(error) => {
                tracing::warn!(%error, "compaction failed; the previous compacted ledger stays");
                inner.state.fail();
                inner.status = RunStatus::Error;
                inner.last_error = error.to_string();
                inner.stats.last_failed_ms = now;
            }
        }
    }

    /// One run (see the module doc); the messages it left out.
    async fn compact(self: &Arc<Self>) -> Result<u64, CompactionError> {
        let (previous, mut record) = {
            let inner = self.inner.lock();
            assert!(inner.state.is_running(), "a run began");
            (inner.view.clone(), inner.record.clone())
        };
        let Some(horizon) = self.host.last_confirmed() else {
            return self.commit_unchanged();
        };
        if previous.as_ref().is_some_and(|p| p.horizon >= horizon) {
            return self.commit_unchanged();
        }
        // Phase one.
        let sources = Sources { host: self.host.clone(), previous: previous.clone(), horizon };
        let latest = {
            let sources = sources.clone();
            tokio::task::spawn_blocking(move || {
                let mut latest = LatestPerKey::new();
                sources.each(|position, data, kept, _| {
                    let (shape, _) = shape_of(data, kept);
                    latest.observe(position.0, position.1, &shape);
                    Ok(())
                })?;
                Ok::<_, CompactionError>(latest)
            })
            .await
            .map_err(|_| CompactionError::ShuttingDown)??
        };
        // Phase two, into a ledger recorded as pending first.
        let (ledger, metadata) = self.host.new_ledger().await?;
        record.pending.push(ledger);
        self.host.store_record(record.encode()).await?;
        self.storage.create(ledger, &metadata).await?;
        let written = self.write_kept(ledger, sources, Arc::new(latest)).await;
        let (positions, kept, bytes, removed) = match written {
            Ok(written) => written,
            Err(error) => {
                // Best effort: the next load deletes what the record lists as pending.
                if delete_ledger(&*self.storage, ledger).await.is_ok() {
                    record.pending.retain(|&l| l != ledger);
                    let _ = self.host.store_record(record.encode()).await;
                    self.inner.lock().record = record;
                }
                return Err(error);
            }
        };
        self.storage.close(ledger).await?;
        // The commit.
        let replaced = record.ledger.replace(ledger);
        record.horizon = Some(horizon);
        record.pending.retain(|&l| l != ledger);
        record.obsolete.extend(replaced);
        self.host.store_record(record.encode()).await?;
        let view = CompactedView {
            storage: self.storage.clone(),
            ledger,
            horizon,
            positions,
            kept,
            bytes,
        };
        {
            let mut inner = self.inner.lock();
            inner.state.commit(Compacted { ledger, horizon });
            inner.view = Some(Arc::new(view));
            inner.record = record.clone();
        }
        // The previous ledger: a read of it under way fails and is retried on the new view.
        if !record.obsolete.is_empty() {
            let mut deleted = true;
            for &obsolete in &record.obsolete {
                deleted &= delete_ledger(&*self.storage, obsolete).await.is_ok();
            }
            if deleted {
                record.obsolete.clear();
                if self.host.store_record(record.encode()).await.is_ok() {
                    self.inner.lock().record = record;
                }
            }
        }
        Ok(removed)
    }

    /// A run with nothing new to compact: the compacted ledger in force stays, and the run
    /// succeeds (as Pulsar's does).
    fn commit_unchanged(&self) -> Result<u64, CompactionError> {
        let mut inner = self.inner.lock();
        match inner.state.committed {
            Some(committed) => {
                inner.state.commit(committed);
            }
            None => inner.state.fail(),
        }
        Ok(0)
    }

    /// Phase two: appends what `latest` keeps of each entry; the new view's index.
    async fn write_kept(
        &self,
        ledger: u64,
        sources: Sources,
        latest: Arc<LatestPerKey>,
    ) -> Result<(Vec<Pos>, Vec<Option<Vec<u64>>>, u64, u64), CompactionError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<u64, LedgerError>>();
        let storage = self.storage.clone();
        let removed = latest.removed;
        let index = tokio::task::spawn_blocking(move || {
            let mut positions = Vec::new();
            let mut kept_masks = Vec::new();
            let mut bytes = 0u64;
            sources.each(|position, data, kept, _| {
                let (shape, batch_size) = shape_of(data, kept);
                let kept = match latest.keep(position.0, position.1, &shape) {
                    Keep::Nothing => return Ok(()),
                    Keep::Whole => kept.map(<[u64]>::to_vec),
                    Keep::Messages(indexes) => Some(kept_words(&indexes, batch_size)),
                };
                let entry =
                    CompactedEntry { position, batch_size, kept: kept.clone(), data: data.clone() };
                let encoded = entry.encode();
                bytes += encoded.len() as u64;
                let tx = tx.clone();
                storage.append(
                    ledger,
                    positions.len() as u64,
                    encoded,
                    Box::new(move |result| {
                        let _ = tx.send(result);
                    }),
                )?;
                positions.push(position);
                kept_masks.push(kept);
                Ok(())
            })?;
            Ok::<_, CompactionError>((positions, kept_masks, bytes))
        });
        let (positions, kept, bytes) = index.await.map_err(|_| CompactionError::ShuttingDown)??;
        for _ in 0..positions.len() {
            match rx.recv().await {
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error.into()),
                None => return Err(CompactionError::ShuttingDown),
            }
        }
        Ok((positions, kept, bytes, removed))
    }
}

async fn delete_ledger(storage: &dyn LedgerStorage, ledger: u64) -> Result<(), CompactionError> {
    match storage.delete(ledger).await {
        Ok(()) | Err(LedgerError::NoSuchLedger(_)) => Ok(()),
        Err(error) => {
            tracing::warn!(ledger, %error, "compacted ledger not deleted");
            Err(error.into())
        }
    }
}

/// What a run reads, twice: the compacted ledger in force, then the topic after its horizon
/// up to the run's.
#[derive(Clone)]
struct Sources {
    host: Arc<dyn CompactionHost>,
    previous: Option<Arc<CompactedView>>,
    horizon: Pos,
}

impl Sources {
    /// Calls `f(position, entry, kept, batch_size)` for each entry in order. Blocks.
    fn each(
        &self,
        mut f: impl FnMut(Pos, &Bytes, Option<&[u64]>, u32) -> Result<(), CompactionError>,
    ) -> Result<(), CompactionError> {
        let mut after = None;
        if let Some(previous) = &self.previous {
            let mut next = 0;
            loop {
                let chunk = previous.read_range(next, READ_CHUNK)?;
                if chunk.is_empty() {
                    break;
                }
                next += chunk.len();
                for entry in chunk {
                    f(entry.position, &entry.data, entry.kept.as_deref(), entry.batch_size)?;
                }
            }
            after = Some(previous.horizon);
        }
        loop {
            let chunk = self.host.read_after(after, READ_CHUNK)?;
            let Some(&(last, _)) = chunk.last() else { break };
            for (position, data) in &chunk {
                if *position > self.horizon {
                    return Ok(());
                }
                f(*position, data, None, 1)?;
            }
            after = Some(last);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "topic_tests.rs"]
mod tests;
