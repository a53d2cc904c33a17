//! The ledger store: ledgers of dense entries over one journal (single write: the journal is
//! the entry log; see ARCHITECTURE.md for the measurement behind that choice).
//!
//! A ledger is an id with entries 0..n. It is open until closed (sealed with its entry count)
//! and may be fenced (refusing appends, for recovery by a new writer). Appends to one ledger
//! complete in entry order; once one fails, every later one fails too, so a ledger never has a
//! hole that a reader could see as a missing entry.
//!
//! State lives in memory and in the journal; a background maintenance thread writes, after
//! each sealed segment, an index file for it and a checkpoint of all ledgers, so that a
//! restart reads the index files and replays only the segments written since. The same thread
//! frees segments whose ledgers are all deleted and compacts mostly-dead ones.
//!
//! Invariants:
//! - `LedgerState::locations.len()` is the number of durable entries; entries are readable
//!   only below it.
//! - Journal records of one ledger are staged under that ledger's lock, so the journal holds
//!   them in entry order.
//! - A segment is freed only after a checkpoint covers it and no live ledger has an entry in it.

use crate::cache::{CacheBudget, LedgerCache};
use crate::config::LedgerStoreConfig;
use crate::dir_lock::DirLock;
use crate::error::LedgerError;
use crate::files::{self, Checkpoint, IndexEntry, LedgerMeta, CHECKPOINT_FILE};
use crate::idmap::IdMap;
use crate::reserve::Reserve;
use bytes::Bytes;
use magnetar_clock::{Clock, SystemClock};
use magnetar_journal::storage::{FsStorage, Storage};
use magnetar_journal::{Journal, JournalError, RecordHeader, RecordLocation, SealedSegment};
use magnetar_metrics::{Exposition, Labels};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

/// Journal record kinds written by the ledger store.
pub mod kind {
    pub const ENTRY: u8 = 1;
    pub const CREATE: u8 = 2;
    /// `entry_id` holds the entry count the ledger is closed with.
    pub const CLOSE: u8 = 3;
    pub const FENCE: u8 = 4;
    pub const DELETE: u8 = 5;
}

/// Where an entry lives, packed (12 bytes an entry in memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Location {
    segment: u32,
    offset: u32,
    len: u32,
}

impl Location {
    fn pack(location: RecordLocation) -> Self {
        let segment = u32::try_from(location.segment).expect("segment numbers stay below 2^32");
        let offset = u32::try_from(location.offset).expect("segments are below 4 GiB");
        Location { segment, offset, len: location.len }
    }

    fn unpack(self) -> RecordLocation {
        RecordLocation { segment: self.segment.into(), offset: self.offset.into(), len: self.len }
    }
}

#[derive(Default)]
struct LedgerState {
    /// No more appends: a close was asked for.
    closing: bool,
    /// The entry count a durable close sealed the ledger with.
    closed_count: Option<u64>,
    fenced: bool,
    deleting: bool,
    /// The first entry whose append failed.
    failed_from: Option<u64>,
    next_entry: u64,
    locations: Vec<Location>,
    cache: LedgerCache,
}

struct Ledger {
    id: u64,
    state: Mutex<LedgerState>,
}

/// A ledger's state as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerInfo {
    pub id: u64,
    /// Durable entries: 0..entries are readable.
    pub entries: u64,
    pub closed: bool,
    pub fenced: bool,
}

/// What a restart found.
#[derive(Debug, Clone, Default)]
pub struct StoreRecovery {
    pub journal: magnetar_journal::RecoveryReport,
    pub checkpoint_covered: u64,
    pub segments_from_index: usize,
    pub segments_replayed: usize,
    pub ledgers: usize,
    pub entries: u64,
}

/// Counters for the perf tool and metrics.
#[derive(Debug)]
pub struct StoreStats {
    pub checkpoints: AtomicU64,
    pub segments_freed: AtomicU64,
    pub entries_relocated: AtomicU64,
    pub bytes_relocated: AtomicU64,
    /// Entries a read found in the write cache, and those it had to read from the journal.
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// How long reads from the journal (cache misses) took, in microseconds.
    pub read_us: magnetar_metrics::Histogram,
}

/// Bucket bounds of the read latency histogram, in microseconds (10 us .. 1 s).
pub const READ_BUCKETS_US: &[u64] =
    &[10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000];

impl Default for StoreStats {
    fn default() -> Self {
        StoreStats {
            checkpoints: AtomicU64::new(0),
            segments_freed: AtomicU64::new(0),
            entries_relocated: AtomicU64::new(0),
            bytes_relocated: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            read_us: magnetar_metrics::Histogram::new(READ_BUCKETS_US),
        }
    }
}

/// Bytes per ledger in one checkpointed segment.
#[derive(Default)]
struct SegmentUsage {
    ledgers: IdMap<u64>,
}

impl SegmentUsage {
    fn of(entries: &[IndexEntry]) -> Self {
        let mut usage = SegmentUsage::default();
        for e in entries {
            *usage.ledgers.entry(e.ledger).or_default() += u64::from(e.len);
        }
        usage
    }

    /// Entry bytes written in the segment, live or not.
    fn written(&self) -> u64 {
        self.ledgers.values().sum()
    }
}

/// Who gets an entry written ([`LedgerStore::append_at`]): the journal's writer thread, woken
/// at once, or the caller's own [`LedgerStore::commit`] after its batch (on the caller's thread
/// when the journal is idle, see `Journal::commit`: for a caller that stages everything from
/// one task, like a storage node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    Writer,
    Caller,
}

enum Maintenance {
    Sealed(SealedSegment),
    LedgerDeleted,
    Run(mpsc::Sender<Result<(), LedgerError>>),
    Stop,
}

struct Inner {
    config: LedgerStoreConfig,
    /// Times the maintenance thread's ticks (and the journal's group-commit windows).
    clock: Arc<dyn Clock>,
    journal: Journal,
    ledgers: RwLock<IdMap<Arc<Ledger>>>,
    next_ledger_id: AtomicU64,
    cache: CacheBudget,
    /// Entry records of segments not yet indexed on disk, collected as they complete.
    pending_index: Arc<PendingIndex>,
    usage: Mutex<BTreeMap<u64, SegmentUsage>>,
    covered: AtomicU64,
    maintenance: Mutex<mpsc::Sender<Maintenance>>,
    stats: StoreStats,
    /// Free bytes at the last measurement, and whether they were short of
    /// `config.min_free_bytes` (measured by the maintenance thread).
    free: AtomicU64,
    short_of_disk: AtomicBool,
    /// Space held back for the writes that free space (`reserve.rs`); spent: short of disk.
    reserve: Arc<Reserve>,
    /// The journal could not get a segment and there was no reserve left to give: short of
    /// disk until a measurement finds room for two segments.
    journal_full: Arc<AtomicBool>,
}

pub struct LedgerStore {
    inner: Arc<Inner>,
    maintenance_thread: Mutex<Option<JoinHandle<()>>>,
    /// The directory's lock, held while this store is open ([`LedgerStore::open`]).
    _dir_lock: Option<DirLock>,
}

/// A staged append; resolves to the entry id once the entry is durable.
pub struct PendingAppend {
    entry_id: u64,
    receiver: tokio::sync::oneshot::Receiver<Result<u64, LedgerError>>,
}

impl PendingAppend {
    /// The id the entry will have.
    pub fn entry_id(&self) -> u64 {
        self.entry_id
    }
}

impl Future for PendingAppend {
    type Output = Result<u64, LedgerError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receiver).poll(cx).map(|r| r.unwrap_or(Err(LedgerError::ShuttingDown)))
    }
}

type Callback<T> = Box<dyn FnOnce(Result<T, LedgerError>) + Send>;

/// Entry records per segment, gathered as appends complete, so that a sealed segment's index
/// file is written from memory instead of re-reading the segment.
#[derive(Default)]
struct PendingIndex {
    segments: Mutex<IdMap<Vec<IndexEntry>>>,
}

impl PendingIndex {
    fn add(&self, ledger: u64, entry: u64, location: RecordLocation) {
        let record =
            IndexEntry { ledger, entry, offset: location.offset as u32, len: location.len };
        self.segments.lock().entry(location.segment).or_default().push(record);
    }

    fn take(&self, seq: u64) -> Option<Vec<IndexEntry>> {
        self.segments.lock().remove(&seq)
    }
}

impl LedgerStore {
    /// Opens the store in `config.dir` on the real file system, which it locks while open.
    pub fn open(config: LedgerStoreConfig) -> Result<(Self, StoreRecovery), LedgerError> {
        config.validate()?;
        let lock = DirLock::acquire(&config.dir)?;
        let storage = FsStorage::open(&config.dir)
            .map_err(|e| JournalError::io(format!("open {}", config.dir.display()), e))?;
        let (mut store, recovery) = Self::open_with_storage(config, Arc::new(storage))?;
        store._dir_lock = Some(lock);
        // Short of disk from the first append on, not from the first measurement 100 ms later.
        measure_free_space(&store.inner);
        Ok((store, recovery))
    }

    /// Opens the store over any storage (the simulator in tests).
    pub fn open_with_storage(
        config: LedgerStoreConfig,
        storage: Arc<dyn Storage>,
    ) -> Result<(Self, StoreRecovery), LedgerError> {
        Self::open_with_clock(config, storage, Arc::new(SystemClock))
    }

    /// Opens the store over any storage with the clock its journal and maintenance use.
    pub fn open_with_clock(
        config: LedgerStoreConfig,
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, StoreRecovery), LedgerError> {
        config.validate()?;
        // Before the journal, which takes its first segment and a spare at once.
        let reserve = Reserve::open(
            storage.clone(),
            config.reserve_bytes,
            2 * config.journal.segment_size_bytes,
        )
        .map_err(|e| JournalError::io("set up the disk reserve", e))?;
        let reserve = Arc::new(reserve);
        let (journal, journal_report) =
            Journal::open_with_clock(config.journal.clone(), storage.clone(), clock.clone())?;
        let giving_up = reserve.clone();
        let journal_full = Arc::new(AtomicBool::new(false));
        let full = journal_full.clone();
        journal.set_out_of_space_hook(Box::new(move || {
            let freed = giving_up.give_up();
            if !freed && !full.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    "the journal is out of disk and no reserve is left: new messages are refused"
                );
            }
            freed
        }));
        let recovered = recover(&journal, &*storage, journal_report)?;
        let (sender, receiver) = mpsc::channel();
        let cache = CacheBudget::new(config.write_cache_bytes);
        let inner = Arc::new(Inner {
            config,
            clock,
            journal,
            ledgers: RwLock::new(recovered.ledgers),
            next_ledger_id: AtomicU64::new(recovered.next_ledger_id),
            cache,
            pending_index: recovered.pending_index,
            usage: Mutex::new(recovered.usage),
            covered: AtomicU64::new(recovered.report.checkpoint_covered),
            maintenance: Mutex::new(sender.clone()),
            stats: StoreStats::default(),
            free: AtomicU64::new(u64::MAX),
            short_of_disk: AtomicBool::new(false),
            reserve,
            journal_full,
        });
        for seq in recovered.to_checkpoint {
            let _ = sender.send(Maintenance::Sealed(SealedSegment { seq, len: 0 }));
        }
        let hook_sender = Mutex::new(sender);
        inner.journal.set_sealed_hook(Box::new(move |sealed| {
            let _ = hook_sender.lock().send(Maintenance::Sealed(sealed));
        }));
        let thread = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("ledger-maintenance".into())
                .spawn(move || maintenance_loop(&inner, receiver))
                .map_err(|e| JournalError::io("spawn ledger maintenance", e))?
        };
        let store =
            LedgerStore { inner, maintenance_thread: Mutex::new(Some(thread)), _dir_lock: None };
        Ok((store, recovered.report))
    }

    /// Creates a ledger with the next local id; resolves once its creation is durable.
    pub async fn create_ledger(&self) -> Result<u64, LedgerError> {
        let id = self.inner.next_ledger_id.fetch_add(1, Ordering::SeqCst);
        self.create_ledger_with_id(id).await.map(|()| id)
    }

    /// Creates ledger `id`, chosen by the caller (ids allocated cluster-wide through the
    /// metadata store); resolves once its creation is durable. `LedgerExists` if it exists.
    pub async fn create_ledger_with_id(&self, id: u64) -> Result<(), LedgerError> {
        {
            let mut ledgers = self.inner.ledgers.write();
            if ledgers.contains_key(&id) {
                return Err(LedgerError::LedgerExists(id));
            }
            let ledger = Arc::new(Ledger { id, state: Mutex::new(LedgerState::default()) });
            ledgers.insert(id, ledger);
        }
        self.inner.next_ledger_id.fetch_max(id + 1, Ordering::SeqCst);
        let result = self.write_meta(id, kind::CREATE, 0).await;
        if result.is_err() {
            self.inner.ledgers.write().remove(&id);
        }
        result
    }

    /// The lowest id [`Self::create_ledger`] could still hand out: every id below it may be
    /// taken (a cluster-wide allocator starts above it).
    pub fn next_local_ledger_id(&self) -> u64 {
        self.inner.next_ledger_id.load(Ordering::SeqCst)
    }

    /// Stages an append; the returned future resolves when it is durable.
    pub fn append(&self, ledger: u64, data: Bytes) -> Result<PendingAppend, LedgerError> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let entry_id = self.append_with(
            ledger,
            data,
            Box::new(move |result| {
                let _ = sender.send(result);
            }),
        )?;
        Ok(PendingAppend { entry_id, receiver })
    }

    /// Stages an append and returns its entry id; `callback` runs (on the journal's writer
    /// thread: keep it short) once it is durable or has failed.
    pub fn append_with(
        &self,
        ledger_id: u64,
        data: Bytes,
        callback: Callback<u64>,
    ) -> Result<u64, LedgerError> {
        self.stage_entry(ledger_id, None, data, callback, Commit::Writer)
    }

    /// As [`Self::append_with`] with the entry id chosen by the writer: it must be the
    /// ledger's next (`UnexpectedEntryId` otherwise), so a ledger's entries stay dense.
    pub fn append_at(
        &self,
        ledger_id: u64,
        entry_id: u64,
        data: Bytes,
        callback: Callback<u64>,
        commit: Commit,
    ) -> Result<(), LedgerError> {
        self.stage_entry(ledger_id, Some(entry_id), data, callback, commit).map(|_| ())
    }

    /// Sets the journal's hook called after each run of append completions (see
    /// [`magnetar_journal::CompletionsHook`]).
    pub fn set_completions_hook(&self, hook: magnetar_journal::CompletionsHook) {
        self.inner.journal.set_completions_hook(hook);
    }

    /// Gets what was appended with [`Commit::Caller`] written; may write and flush on this thread (and
    /// run completions), so it blocks for up to a flush.
    pub fn commit(&self) {
        self.inner.journal.commit();
    }

    fn stage_entry(
        &self,
        ledger_id: u64,
        expected_entry: Option<u64>,
        data: Bytes,
        callback: Callback<u64>,
        commit: Commit,
    ) -> Result<u64, LedgerError> {
        let ledger = self.ledger(ledger_id)?;
        let mut state = ledger.state.lock();
        if state.deleting {
            return Err(LedgerError::NoSuchLedger(ledger_id));
        }
        if state.closing {
            return Err(LedgerError::Closed(ledger_id));
        }
        if state.fenced {
            return Err(LedgerError::Fenced(ledger_id));
        }
        if let Some(entry) = state.failed_from {
            return Err(LedgerError::Failed { ledger: ledger_id, entry });
        }
        let entry = state.next_entry;
        if let Some(given) = expected_entry.filter(|&given| given != entry) {
            return Err(LedgerError::UnexpectedEntryId {
                ledger: ledger_id,
                expected: entry,
                given,
            });
        }
        let header = RecordHeader { kind: kind::ENTRY, ledger_id, entry_id: entry };
        let owner = ledger.clone();
        let index = self.inner.pending_index.clone();
        let completion = Box::new(move |result: Result<RecordLocation, JournalError>| {
            callback(complete_entry(&owner, &index, entry, result));
        });
        match commit {
            Commit::Writer => self.inner.journal.append(header, &data, completion)?,
            Commit::Caller => self.inner.journal.stage(header, &data, completion)?,
        };
        state.next_entry += 1;
        state.cache.push(&self.inner.cache, entry, data);
        Ok(entry)
    }

    /// Closes a ledger: no more appends; resolves with its final entry count once durable.
    pub async fn close_ledger(&self, ledger_id: u64) -> Result<u64, LedgerError> {
        let ledger = self.ledger(ledger_id)?;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        {
            let mut state = ledger.state.lock();
            if let Some(count) = state.closed_count {
                return Ok(count);
            }
            state.closing = true;
            let count = state.failed_from.unwrap_or(state.next_entry);
            let owner = ledger.clone();
            self.stage_meta(ledger_id, kind::CLOSE, count, move |result| {
                let result = result.map(|()| {
                    let mut state = owner.state.lock();
                    let count = count.min(state.locations.len() as u64);
                    state.closed_count = Some(count);
                    count
                });
                let _ = sender.send(result);
            })?;
        }
        receiver.await.unwrap_or(Err(LedgerError::ShuttingDown))
    }

    /// Fences a ledger: appends are refused from now on. Resolves, once durable, with the
    /// number of durable entries (all appends staged before the fence have completed).
    pub async fn fence_ledger(&self, ledger_id: u64) -> Result<u64, LedgerError> {
        let ledger = self.ledger(ledger_id)?;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        {
            let mut state = ledger.state.lock();
            state.fenced = true;
            let owner = ledger.clone();
            self.stage_meta(ledger_id, kind::FENCE, 0, move |result| {
                let _ = sender.send(result.map(|()| owner.state.lock().locations.len() as u64));
            })?;
        }
        receiver.await.unwrap_or(Err(LedgerError::ShuttingDown))
    }

    /// Deletes a ledger; resolves once the deletion is durable. Its disk space is reclaimed in
    /// the background once no live entry shares its segments.
    pub async fn delete_ledger(&self, ledger_id: u64) -> Result<(), LedgerError> {
        let ledger = self.ledger(ledger_id)?;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        {
            let mut state = ledger.state.lock();
            state.deleting = true;
            let inner = self.inner.clone();
            self.stage_meta(ledger_id, kind::DELETE, 0, move |result| {
                if result.is_ok() {
                    if let Some(ledger) = inner.ledgers.write().remove(&ledger_id) {
                        ledger.state.lock().cache.clear(&inner.cache);
                    }
                    let _ = inner.maintenance.lock().send(Maintenance::LedgerDeleted);
                }
                let _ = sender.send(result);
            })?;
        }
        receiver.await.unwrap_or(Err(LedgerError::ShuttingDown))
    }

    pub fn ledger_info(&self, ledger_id: u64) -> Result<LedgerInfo, LedgerError> {
        let ledger = self.ledger(ledger_id)?;
        let state = ledger.state.lock();
        Ok(LedgerInfo {
            id: ledger_id,
            entries: state.locations.len() as u64,
            closed: state.closed_count.is_some(),
            fenced: state.fenced,
        })
    }

    /// The store's Prometheus series (`magnetar_journal_*`, `magnetar_ledger_*`,
    /// `magnetar_storage_*`), each with `labels`.
    pub fn write_metrics(&self, out: &mut Exposition, labels: Labels) {
        let journal = self.inner.journal.stats();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        out.counter(
            "magnetar_journal_groups",
            "Group commits written to the journal (one write and one fdatasync each).",
            labels,
            load(&journal.groups),
        );
        out.counter(
            "magnetar_journal_records",
            "Records (entries and ledger events) written to the journal.",
            labels,
            load(&journal.records),
        );
        out.counter(
            "magnetar_journal_bytes",
            "Bytes written to the journal, padding included.",
            labels,
            load(&journal.bytes),
        );
        let (cumulative, sum) = journal.fsync_us.cumulative();
        out.histogram(
            "magnetar_journal_fsync_seconds",
            "Time each group commit's fdatasync took.",
            labels,
            journal.fsync_us.bounds(),
            &cumulative,
            sum,
            1e6,
        );
        let stats = &self.inner.stats;
        out.counter(
            "magnetar_ledger_read_cache_hits",
            "Entries reads found in the write cache.",
            labels,
            load(&stats.cache_hits),
        );
        out.counter(
            "magnetar_ledger_read_cache_misses",
            "Entries reads had to fetch from the journal on disk.",
            labels,
            load(&stats.cache_misses),
        );
        let (cumulative, sum) = stats.read_us.cumulative();
        out.histogram(
            "magnetar_ledger_read_seconds",
            "Time reads from the journal on disk took (cache misses).",
            labels,
            stats.read_us.bounds(),
            &cumulative,
            sum,
            1e6,
        );
        out.gauge(
            "magnetar_ledger_ledgers",
            "Ledgers in the store (topics' data ledgers and cursor ledgers).",
            labels,
            self.inner.ledgers.read().len() as f64,
        );
        out.counter(
            "magnetar_storage_segments_freed",
            "Journal segments freed because every ledger in them was deleted.",
            labels,
            load(&stats.segments_freed),
        );
        out.counter(
            "magnetar_storage_entries_relocated",
            "Live entries compaction moved out of mostly-dead segments.",
            labels,
            load(&stats.entries_relocated),
        );
        out.counter(
            "magnetar_storage_bytes_relocated",
            "Entry bytes compaction copied out of mostly-dead segments.",
            labels,
            load(&stats.bytes_relocated),
        );
        let dir = &self.inner.config.dir;
        out.gauge(
            "magnetar_storage_disk_used_bytes",
            "Bytes of the files in the storage directory (segments, indexes, checkpoints).",
            labels,
            dir_bytes(dir) as f64,
        );
        if let Some(free) = free_bytes(dir) {
            out.gauge(
                "magnetar_storage_disk_free_bytes",
                "Bytes available to the store on the file system of its directory.",
                labels,
                free as f64,
            );
        }
        let reserve = &self.inner.reserve;
        out.gauge(
            "magnetar_storage_short_of_disk",
            "1 while new messages are refused for want of disk: free disk below the minimum \
             ([storage] min_free_mb) until twice the minimum is free, or the disk filled up and \
             the reserve was given up (or there was none), until there is room again; 0 \
             otherwise.",
            labels,
            f64::from(u8::from(self.short_of_disk().is_some())),
        );
        if reserve.size() > 0 {
            out.gauge(
                "magnetar_storage_reserve_bytes",
                "Bytes held back for the writes that free a full disk (deletes, compaction): \
                 [storage] reserve_mb while held, 0 once given up.",
                labels,
                if reserve.is_spent() { 0.0 } else { reserve.size() as f64 },
            );
        }
    }

    /// Whether ledger `ledger_id` exists (created, not deleted).
    pub fn contains(&self, ledger_id: u64) -> bool {
        self.inner.ledgers.read().contains_key(&ledger_id)
    }

    /// How many ledgers exist.
    pub fn ledger_count(&self) -> usize {
        self.inner.ledgers.read().len()
    }

    /// Ids of all ledgers, ascending (a sort of them all: not for a per-request path).
    pub fn ledgers(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.inner.ledgers.read().keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub fn read_entry(&self, ledger: u64, entry: u64) -> Result<Bytes, LedgerError> {
        Ok(self.read_range(ledger, entry, entry)?.pop().expect("one entry asked for"))
    }

    /// Reads entries `first..=last`, from the write cache where possible and otherwise from
    /// the journal with nearby records coalesced into one read. Blocking on a cache miss.
    /// Entries `first..=last` if every one is in the write cache (no disk I/O, never blocks on
    /// the disk); `None` otherwise. Lets a tailing reader skip a blocking-thread hand-off.
    pub fn read_cached(&self, ledger_id: u64, first: u64, last: u64) -> Option<Vec<Bytes>> {
        let ledger = self.ledger(ledger_id).ok()?;
        let state = ledger.state.lock();
        if first > last || last >= state.locations.len() as u64 {
            return None;
        }
        let hit: Option<Vec<Bytes>> = (first..=last).map(|entry| state.cache.get(entry)).collect();
        if let Some(entries) = &hit {
            self.inner.stats.cache_hits.fetch_add(entries.len() as u64, Ordering::Relaxed);
        }
        hit
    }

    pub fn read_range(
        &self,
        ledger_id: u64,
        first: u64,
        last: u64,
    ) -> Result<Vec<Bytes>, LedgerError> {
        let ledger = self.ledger(ledger_id)?;
        for attempt in 0.. {
            let (locations, mut out): (Vec<Location>, Vec<Option<Bytes>>) = {
                let state = ledger.state.lock();
                if first > last || last >= state.locations.len() as u64 {
                    return Err(LedgerError::NoSuchEntry { ledger: ledger_id, entry: last });
                }
                let locations = state.locations[first as usize..=last as usize].to_vec();
                (locations, (first..=last).map(|entry| state.cache.get(entry)).collect())
            };
            let misses: Vec<(RecordLocation, RecordHeader)> = out
                .iter()
                .zip(first..)
                .zip(&locations)
                .filter(|((cached, _), _)| cached.is_none())
                .map(|((_, entry), location)| {
                    let header = RecordHeader { kind: kind::ENTRY, ledger_id, entry_id: entry };
                    (location.unpack(), header)
                })
                .collect();
            let stats = &self.inner.stats;
            let hits = out.len() - misses.len();
            stats.cache_hits.fetch_add(hits as u64, Ordering::Relaxed);
            if misses.is_empty() {
                return Ok(out.into_iter().map(|e| e.expect("all cached")).collect());
            }
            stats.cache_misses.fetch_add(misses.len() as u64, Ordering::Relaxed);
            let started = self.inner.clock.now();
            let read = self.inner.journal.read_many(&misses);
            let took = self.inner.clock.now().saturating_duration_since(started);
            stats.read_us.record_duration_us(took);
            match read {
                Ok(read) => {
                    let mut read = read.into_iter();
                    for slot in out.iter_mut().filter(|slot| slot.is_none()) {
                        *slot = read.next();
                    }
                    return Ok(out.into_iter().map(|e| e.expect("all read")).collect());
                }
                // Compaction may have moved the entries meanwhile (and released their segment): look
                // them up again.
                Err(JournalError::Corrupt { .. } | JournalError::Released { .. })
                    if attempt < 2 =>
                {
                    continue
                }
                Err(error) => return Err(error.into()),
            }
        }
        unreachable!("the loop returns")
    }

    /// Writes pending checkpoints, frees dead segments and compacts sparse ones, now.
    pub fn run_maintenance(&self) -> Result<(), LedgerError> {
        let (sender, receiver) = mpsc::channel();
        self.inner
            .maintenance
            .lock()
            .send(Maintenance::Run(sender))
            .map_err(|_| LedgerError::ShuttingDown)?;
        receiver.recv().map_err(|_| LedgerError::ShuttingDown)?
    }

    pub fn stats(&self) -> &StoreStats {
        &self.inner.stats
    }

    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// Why new data should be refused, when the disk is short (see
    /// [`LedgerStoreConfig::min_free_bytes`] and [`LedgerStoreConfig::reserve_bytes`]); `None`
    /// otherwise.
    pub fn short_of_disk(&self) -> Option<String> {
        let inner = &self.inner;
        let dir = inner.config.dir.display();
        let min = inner.config.min_free_bytes;
        if inner.short_of_disk.load(Ordering::Acquire) {
            let free = inner.free.load(Ordering::Relaxed);
            Some(format!(
                "{} MiB free on {dir}, below the {} MiB minimum: new messages are refused until {} \
                 MiB are free (cursor writes and deletes go on)",
                free >> 20,
                min >> 20,
                min.saturating_mul(2) >> 20
            ))
        } else if inner.reserve.is_spent() {
            Some(format!(
                "the disk of {dir} filled up and the store gave up its {} MiB reserve so that \
                 deletes and compaction can free space: new messages are refused until {} MiB \
                 are free (cursor writes and deletes go on)",
                inner.reserve.size() >> 20,
                inner.reserve.restore_at(min) >> 20
            ))
        } else if inner.journal_full.load(Ordering::Acquire) {
            Some(format!(
                "the journal in {dir} found no space for a new segment and no reserve was left to \
                 give: new messages are refused until {} MiB are free",
                journal_room(inner) >> 20
            ))
        } else {
            None
        }
    }

    /// Flushes what is staged, writes a final checkpoint and stops the background threads.
    pub fn close(&self) {
        self.inner.journal.close();
        let _ = self.inner.maintenance.lock().send(Maintenance::Stop);
        if let Some(thread) = self.maintenance_thread.lock().take() {
            let _ = thread.join();
        }
    }

    fn ledger(&self, id: u64) -> Result<Arc<Ledger>, LedgerError> {
        self.inner.ledgers.read().get(&id).cloned().ok_or(LedgerError::NoSuchLedger(id))
    }

    fn stage_meta(
        &self,
        ledger_id: u64,
        kind: u8,
        entry_id: u64,
        done: impl FnOnce(Result<(), LedgerError>) + Send + 'static,
    ) -> Result<(), LedgerError> {
        let header = RecordHeader { kind, ledger_id, entry_id };
        self.inner.journal.append(
            header,
            &[],
            Box::new(move |result| done(result.map(|_| ()).map_err(Into::into))),
        )?;
        Ok(())
    }

    async fn write_meta(&self, ledger_id: u64, kind: u8, entry_id: u64) -> Result<(), LedgerError> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.stage_meta(ledger_id, kind, entry_id, move |result| {
            let _ = sender.send(result);
        })?;
        receiver.await.unwrap_or(Err(LedgerError::ShuttingDown))
    }
}

impl Drop for LedgerStore {
    fn drop(&mut self) {
        self.close();
    }
}

/// Runs on the journal's completer thread when an entry's group is durable or failed.
fn complete_entry(
    ledger: &Ledger,
    index: &PendingIndex,
    entry: u64,
    result: Result<RecordLocation, JournalError>,
) -> Result<u64, LedgerError> {
    let mut state = ledger.state.lock();
    match result {
        Ok(location) => {
            if let Some(failed) = state.failed_from.filter(|&failed| failed <= entry) {
                return Err(LedgerError::Failed { ledger: ledger.id, entry: failed });
            }
            assert_eq!(state.locations.len() as u64, entry, "entries complete in order");
            state.locations.push(Location::pack(location));
            drop(state);
            index.add(ledger.id, entry, location);
            Ok(entry)
        }
        Err(error) => {
            state.failed_from = Some(state.failed_from.map_or(entry, |f| f.min(entry)));
            Err(error.into())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Recovery

struct Recovered {
    ledgers: IdMap<Arc<Ledger>>,
    pending_index: Arc<PendingIndex>,
    next_ledger_id: u64,
    usage: BTreeMap<u64, SegmentUsage>,
    to_checkpoint: Vec<u64>,
    report: StoreRecovery,
}

#[derive(Default)]
struct RecoveringLedger {
    closed_count: Option<u64>,
    fenced: bool,
    /// Later records win: an id reused after an unacknowledged write replaces it.
    locations: Vec<Option<Location>>,
}

impl RecoveringLedger {
    fn put(&mut self, entry: u64, location: Location) {
        let index = entry as usize;
        if self.locations.len() <= index {
            self.locations.resize(index + 1, None);
        }
        self.locations[index] = Some(location);
    }
}

fn recover(
    journal: &Journal,
    storage: &dyn Storage,
    journal_report: magnetar_journal::RecoveryReport,
) -> Result<Recovered, LedgerError> {
    let checkpoint = match storage
        .read_file(CHECKPOINT_FILE)
        .map_err(|e| JournalError::io("read checkpoint", e))?
    {
        Some(data) => files::decode_checkpoint(&data)?,
        None => Checkpoint { covered: 0, next_ledger_id: 1, ledgers: Vec::new() },
    };
    let mut ledgers: IdMap<RecoveringLedger> = checkpoint
        .ledgers
        .iter()
        .map(|meta| {
            let closed_count = meta.closed.then_some(meta.entry_count);
            (meta.id, RecoveringLedger { closed_count, fenced: meta.fenced, locations: Vec::new() })
        })
        .collect();
    let mut next_ledger_id = checkpoint.next_ledger_id;
    let mut usage = BTreeMap::new();
    let mut to_checkpoint = Vec::new();
    let pending_index = Arc::new(PendingIndex::default());
    let mut report = StoreRecovery { checkpoint_covered: checkpoint.covered, ..Default::default() };
    for &seq in &journal_report.segments {
        if seq <= checkpoint.covered {
            let entries = match load_index(storage, seq) {
                Some(entries) => {
                    report.segments_from_index += 1;
                    entries
                }
                None => {
                    report.segments_replayed += 1;
                    index_segment(journal, seq)?
                }
            };
            let segment_usage = SegmentUsage::of(&entries);
            for e in entries {
                if let Some(ledger) = ledgers.get_mut(&e.ledger) {
                    ledger.put(
                        e.entry,
                        Location { segment: seq as u32, offset: e.offset, len: e.len },
                    );
                }
            }
            usage.insert(seq, segment_usage);
        } else {
            report.segments_replayed += 1;
            to_checkpoint.push(seq);
            journal.scan(seq, |header, location, _| {
                let id = header.ledger_id;
                match header.kind {
                    kind::CREATE => {
                        ledgers.entry(id).or_default();
                        next_ledger_id = next_ledger_id.max(id + 1);
                    }
                    kind::ENTRY => {
                        pending_index.add(id, header.entry_id, location);
                        if let Some(ledger) = ledgers.get_mut(&id) {
                            ledger.put(header.entry_id, Location::pack(location));
                        }
                    }
                    kind::CLOSE => {
                        if let Some(ledger) = ledgers.get_mut(&id) {
                            ledger.closed_count = Some(header.entry_id);
                        }
                    }
                    kind::FENCE => {
                        if let Some(ledger) = ledgers.get_mut(&id) {
                            ledger.fenced = true;
                        }
                    }
                    kind::DELETE => {
                        ledgers.remove(&id);
                    }
                    other => tracing::warn!(kind = other, "unknown journal record kind; skipped"),
                }
            })?;
        }
    }
    let mut live = IdMap::default();
    for (id, recovering) in ledgers {
        next_ledger_id = next_ledger_id.max(id + 1);
        // Only the dense prefix is real: anything after a gap was never acknowledged.
        let mut locations: Vec<Location> =
            recovering.locations.into_iter().map_while(|l| l).collect();
        let closed_count = recovering.closed_count.map(|count| count.min(locations.len() as u64));
        if let Some(count) = closed_count {
            locations.truncate(count as usize);
        }
        report.entries += locations.len() as u64;
        let state = LedgerState {
            closing: closed_count.is_some(),
            closed_count,
            fenced: recovering.fenced,
            next_entry: locations.len() as u64,
            locations,
            ..LedgerState::default()
        };
        live.insert(id, Arc::new(Ledger { id, state: Mutex::new(state) }));
    }
    report.ledgers = live.len();
    report.journal = journal_report;
    Ok(Recovered { ledgers: live, pending_index, next_ledger_id, usage, to_checkpoint, report })
}

fn load_index(storage: &dyn Storage, seq: u64) -> Option<Vec<IndexEntry>> {
    let data = storage.read_file(&files::index_file_name(seq)).ok()??;
    match files::decode_index(seq, &data) {
        Ok(entries) => Some(entries),
        Err(error) => {
            tracing::warn!(%error, segment = seq, "index file unusable; scanning the segment");
            None
        }
    }
}

/// The entry records of one segment.
fn index_segment(journal: &Journal, seq: u64) -> Result<Vec<IndexEntry>, LedgerError> {
    let mut entries = Vec::new();
    journal.scan(seq, |header, location, _| {
        if header.kind == kind::ENTRY {
            entries.push(IndexEntry {
                ledger: header.ledger_id,
                entry: header.entry_id,
                offset: location.offset as u32,
                len: location.len,
            });
        }
    })?;
    Ok(entries)
}

// ---------------------------------------------------------------------------------------------
// Maintenance: checkpoints, freeing segments, compaction

/// How often the maintenance thread frees stale write-cache entries (see `cache.rs`).
const CACHE_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

fn maintenance_loop(inner: &Inner, receiver: mpsc::Receiver<Maintenance>) {
    let mut sealed = Vec::new();
    let mut next_sweep = inner.clock.now() + CACHE_SWEEP_INTERVAL;
    loop {
        let wait = next_sweep.saturating_duration_since(inner.clock.now());
        let message = match receiver.recv_timeout(wait) {
            Ok(message) => Some(message),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if inner.clock.now() >= next_sweep {
            sweep_caches(inner);
            measure_free_space(inner);
            next_sweep = inner.clock.now() + CACHE_SWEEP_INTERVAL;
        }
        let Some(message) = message else { continue };
        let mut reply = None;
        let mut stop = false;
        match message {
            Maintenance::Sealed(segment) => sealed.push(segment.seq),
            Maintenance::LedgerDeleted => {}
            Maintenance::Run(sender) => {
                measure_free_space(inner);
                reply = Some(sender);
            }
            Maintenance::Stop => stop = true,
        }
        // Take everything queued, so a burst of seals costs one checkpoint.
        while let Ok(message) = receiver.try_recv() {
            match message {
                Maintenance::Sealed(segment) => sealed.push(segment.seq),
                Maintenance::LedgerDeleted => {}
                Maintenance::Run(sender) => reply = Some(sender),
                Maintenance::Stop => stop = true,
            }
        }
        let pass = |sealed: &mut Vec<u64>| {
            checkpoint(inner, sealed).and_then(|()| free_dead_segments(inner)).and_then(|()| {
                if stop {
                    Ok(())
                } else {
                    compact(inner, reply.is_some())
                }
            })
        };
        let mut result = pass(&mut sealed);
        // A checkpoint or index file (or compaction's segment) that found the disk full: the
        // space the reserve gives is what lets this pass free more.
        if result.as_ref().is_err_and(is_disk_full) && inner.reserve.give_up() {
            result = pass(&mut sealed);
        }
        match &result {
            Err(LedgerError::Journal(JournalError::Closed)) => {}
            Err(error) => tracing::error!(%error, "ledger store maintenance failed"),
            Ok(()) => {}
        }
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
        if stop {
            return;
        }
    }
}

/// Whether an error says the disk is full.
fn is_disk_full(error: &LedgerError) -> bool {
    match error {
        LedgerError::Journal(JournalError::DiskFull(_)) => true,
        LedgerError::Journal(JournalError::Io { source, .. }) => {
            magnetar_journal::error::is_out_of_space(source)
        }
        _ => false,
    }
}

/// Measures the directory's free space (one `statvfs`) when a minimum or a reserve is set,
/// creates a spent reserve again when there is room, and flips the short-of-disk state with
/// the margin of [`crate::space::next_short`].
fn measure_free_space(inner: &Inner) {
    let min_free = inner.config.min_free_bytes;
    let journal_full = inner.journal_full.load(Ordering::Acquire);
    if min_free == 0 && inner.reserve.size() == 0 && !journal_full {
        return;
    }
    let Some(mut free) = inner.journal.storage().free_bytes() else { return };
    if journal_full && free >= journal_room(inner) {
        inner.journal_full.store(false, Ordering::Release);
        tracing::info!(free, "the journal has room again: new messages taken");
    }
    if inner.reserve.restore(free, min_free) {
        free = free.saturating_sub(inner.reserve.size());
    }
    inner.free.store(free, Ordering::Relaxed);
    let was = inner.short_of_disk.load(Ordering::Relaxed);
    let now = crate::space::next_short(was, free, min_free);
    // Short of disk in any way: what deletes free goes back to the file system, not to the
    // journal's pool of segments kept for reuse, which the file system counts as used.
    let short = now || inner.reserve.is_spent() || inner.journal_full.load(Ordering::Acquire);
    if let Err(error) = inner.journal.set_recycling(!short) {
        tracing::warn!(%error, "could not remove the journal's kept segments");
    }
    if now != was {
        inner.short_of_disk.store(now, Ordering::Release);
        if now {
            tracing::warn!(free, min_free, "ledger store short of disk: new messages refused");
        } else {
            tracing::info!(free, "ledger store has disk again: new messages taken");
        }
    }
}

/// Free bytes at which a journal that found no space takes messages again: two segments (the
/// one it could not get and the spare the preparer makes next).
fn journal_room(inner: &Inner) -> u64 {
    2 * inner.config.journal.segment_size_bytes
}

/// Frees every ledger's stale write-cache entries: what ledgers that stopped appending hold.
fn sweep_caches(inner: &Inner) {
    if inner.cache.used() == 0 {
        return;
    }
    // Not under the map's lock: appenders take a ledger's lock first.
    let ledgers: Vec<Arc<Ledger>> = inner.ledgers.read().values().cloned().collect();
    for ledger in ledgers {
        ledger.state.lock().cache.evict_stale(&inner.cache);
    }
}

/// Indexes newly sealed segments and writes a checkpoint covering them.
fn checkpoint(inner: &Inner, sealed: &mut Vec<u64>) -> Result<(), LedgerError> {
    if sealed.is_empty() {
        return Ok(());
    }
    sealed.sort_unstable();
    sealed.dedup();
    let storage = inner.journal.storage();
    for &seq in sealed.iter() {
        let entries = match inner.pending_index.take(seq) {
            Some(entries) => entries,
            None => index_segment(&inner.journal, seq)?,
        };
        storage
            .write_file_atomic(&files::index_file_name(seq), &files::encode_index(seq, &entries))
            .map_err(|e| JournalError::io(format!("write index of segment {seq}"), e))?;
        inner.usage.lock().insert(seq, SegmentUsage::of(&entries));
    }
    let covered = *sealed.last().expect("not empty");
    let ledgers = {
        let map = inner.ledgers.read();
        let mut metas: Vec<LedgerMeta> = map
            .values()
            .map(|ledger| {
                let state = ledger.state.lock();
                LedgerMeta {
                    id: ledger.id,
                    closed: state.closed_count.is_some(),
                    fenced: state.fenced,
                    entry_count: state.closed_count.unwrap_or(0),
                }
            })
            .collect();
        metas.sort_unstable_by_key(|m| m.id);
        metas
    };
    let next_ledger_id = inner.next_ledger_id.load(Ordering::SeqCst);
    let encoded = files::encode_checkpoint(&Checkpoint { covered, next_ledger_id, ledgers });
    storage
        .write_file_atomic(CHECKPOINT_FILE, &encoded)
        .map_err(|e| JournalError::io("write checkpoint", e))?;
    inner.covered.store(covered, Ordering::SeqCst);
    inner.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
    sealed.clear();
    Ok(())
}

fn live_bytes(inner: &Inner, usage: &SegmentUsage) -> u64 {
    let ledgers = inner.ledgers.read();
    usage.ledgers.iter().filter(|(id, _)| ledgers.contains_key(id)).map(|(_, bytes)| bytes).sum()
}

/// Frees checkpointed segments that hold no entry of a live ledger.
fn free_dead_segments(inner: &Inner) -> Result<(), LedgerError> {
    let covered = inner.covered.load(Ordering::SeqCst);
    let dead: Vec<u64> = {
        let usage = inner.usage.lock();
        usage
            .range(..=covered)
            .filter(|(_, segment)| live_bytes(inner, segment) == 0)
            .map(|(&seq, _)| seq)
            .collect()
    };
    release(inner, &dead)
}

/// Frees `segments` (index files, then the segment files). A deleted ledger frees dozens of
/// segments at once: their files go together, with one directory sync.
fn release(inner: &Inner, segments: &[u64]) -> Result<(), LedgerError> {
    if segments.is_empty() {
        return Ok(());
    }
    for &seq in segments {
        inner.usage.lock().remove(&seq);
        inner
            .journal
            .storage()
            .remove_file(&files::index_file_name(seq))
            .map_err(|e| JournalError::io(format!("remove index of segment {seq}"), e))?;
    }
    inner.journal.release_segments(segments)?;
    inner.stats.segments_freed.fetch_add(segments.len() as u64, Ordering::Relaxed);
    tracing::debug!(?segments, "journal segments freed");
    Ok(())
}

/// Copies the live entries of the sparsest checkpointed segment whose live share of the entry
/// bytes written in it is below the threshold to the head of the journal, then frees it. One segment per call (all when
/// `all` is set) keeps the work per pass bounded.
fn compact(inner: &Inner, all: bool) -> Result<(), LedgerError> {
    let ratio = inner.config.compaction_live_ratio;
    if ratio <= 0.0 {
        return Ok(());
    }
    let covered = inner.covered.load(Ordering::SeqCst);
    let candidates: Vec<u64> = {
        let usage = inner.usage.lock();
        let mut sparse: Vec<(u64, u64)> = usage
            .range(..=covered)
            .map(|(&seq, segment)| (seq, live_bytes(inner, segment), segment.written()))
            .filter(|&(_, live, written)| (live as f64) < ratio * written as f64)
            .map(|(seq, live, _)| (seq, live))
            .collect();
        sparse.sort_unstable_by_key(|&(_, live)| live);
        sparse.into_iter().map(|(seq, _)| seq).take(if all { usize::MAX } else { 1 }).collect()
    };
    for seq in candidates {
        relocate_segment(inner, seq)?;
    }
    Ok(())
}

/// Most entry bytes compaction keeps staged in the journal at once.
const RELOCATION_WINDOW_BYTES: u64 = 256 << 10;

fn relocate_segment(inner: &Inner, seq: u64) -> Result<(), LedgerError> {
    // The index file written at the checkpoint, not a scan: scanning read the whole segment
    // (64 MiB) from the disk for a handful of live entries, competing with the appends' writes.
    let entries = match load_index(&**inner.journal.storage(), seq) {
        Some(entries) => entries,
        None => index_segment(&inner.journal, seq)?,
    };
    let (done_sender, done_receiver) = mpsc::channel::<(Result<(), LedgerError>, u64)>();
    let (mut pending, mut bytes) = (0usize, 0u64);
    // Entries staged and not completed yet, and their bytes.
    let mut in_flight = (0usize, 0u64);
    let wait_one = |in_flight: &mut (usize, u64)| -> Result<(), LedgerError> {
        let (outcome, len) = done_receiver.recv().map_err(|_| LedgerError::ShuttingDown)?;
        in_flight.0 -= 1;
        in_flight.1 -= len;
        outcome
    };
    for e in entries {
        // A window, not the whole segment's live entries at once: staged in one burst they made
        // one group megabytes larger, and every append flushed with it waited for its write.
        while in_flight.1 >= RELOCATION_WINDOW_BYTES {
            wait_one(&mut in_flight)?;
        }
        let Some(ledger) = inner.ledgers.read().get(&e.ledger).cloned() else {
            continue;
        };
        let old = Location { segment: seq as u32, offset: e.offset, len: e.len };
        let still_here = |state: &LedgerState| state.locations.get(e.entry as usize) == Some(&old);
        if !still_here(&ledger.state.lock()) {
            continue;
        }
        // Read without the ledger's lock: the journal's completion thread takes it for every
        // append of this ledger, and a disk read under it would stall every append of the store.
        let header = RecordHeader { kind: kind::ENTRY, ledger_id: e.ledger, entry_id: e.entry };
        let data = inner.journal.read(old.unpack(), header)?;
        let state = ledger.state.lock();
        if !still_here(&state) {
            continue; // moved or deleted meanwhile
        }
        let owner = ledger.clone();
        let index = inner.pending_index.clone();
        let done = done_sender.clone();
        // Staged under the ledger lock, like appends, so later appends land after it.
        inner.journal.append(
            header,
            &data,
            Box::new(move |result| {
                let outcome = result.map_err(LedgerError::from).map(|location| {
                    let mut state = owner.state.lock();
                    if let Some(slot) = state.locations.get_mut(e.entry as usize) {
                        if *slot == old {
                            *slot = Location::pack(location);
                            index.add(e.ledger, e.entry, location);
                        }
                    }
                });
                let _ = done.send((outcome, u64::from(e.len)));
            }),
        )?;
        drop(state);
        pending += 1;
        bytes += u64::from(e.len);
        in_flight.0 += 1;
        in_flight.1 += u64::from(e.len);
    }
    drop(done_sender);
    while in_flight.0 > 0 {
        wait_one(&mut in_flight)?;
    }
    inner.stats.entries_relocated.fetch_add(pending as u64, Ordering::Relaxed);
    inner.stats.bytes_relocated.fetch_add(bytes, Ordering::Relaxed);
    release(inner, &[seq])
}

/// Bytes of the files under `dir` (what the store occupies; 0 for an in-memory store).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0, // freed while we looked
        })
        .sum()
}

pub use magnetar_journal::storage::free_bytes;
