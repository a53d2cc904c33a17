//! How a storage node keeps replicated ledgers in its local ledger store.
//!
//! * A replicated ledger `L` is the local ledger `L`. A node holds one contiguous run of its
//!   entries, `first..next` (a replacement node starts at the fragment it joined), so local
//!   entry 0 is a header naming `first` and local entry `i + 1` is entry `first + i`. An add
//!   that would leave a hole (below `first`, or above `next`) is refused with an I/O error:
//!   the writer or recovery then places that entry on another node. An add of an entry the
//!   node has is answered as stored if its bytes are the same (writers resend after
//!   reconnections, recoveries write back what they found), and refused with `Conflict`
//!   otherwise: an entry is never overwritten.
//! * Each entry is stored after the LAC its writer sent with it (8 bytes: LAC + 1, 0 for
//!   none), as a bookie keeps it in the entry: a restarted node reads its last entry's and
//!   answers LAC reads with it. Without it a restarted node knows no LAC, and a recovery that
//!   asks it first (with Qw = Qa, one answer is enough) reads and writes back the whole last
//!   fragment instead of its unacknowledged tail. Runs written before this (header magic
//!   `MRUN`) hold bare entries and are still read.
//! * Fences go to a local ledger of their own ([`FENCE_LOG`]): `ledger, epoch` records, read
//!   back whole at start. They are appended to the same journal as the entries, so a fence
//!   becomes durable after every add staged before it. A fence log whose append failed (a
//!   full disk) takes no more, like any ledger: the next fence starts a new log, one id
//!   lower (every log is read at start), so fences work again once space is back.
//! * A journal out of disk (ENOSPC preparing its next segment) fails what it had queued and
//!   goes on: those adds are answered with an I/O error (the writers move on to other
//!   nodes), the node turns read-only, and a ledger with a failed add takes no more adds
//!   here (its run would have a hole). A resend of an add still in flight is answered with
//!   that add's outcome, never "stored" on its own: after a failure that would claim an
//!   entry the node does not have. Any other journal error ends the node.
//! * Every record is staged at once and reported to the completion sink by the journal's
//!   completion thread, in staging order (a record refused at once is reported at once, from
//!   the staging call). Entries are written once the node task commits its batch
//!   ([`NodeStorage::commit`]), and a lone one is then written, flushed and reported from the
//!   committing thread itself.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use magnetar_journal::JournalError;
use magnetar_ledger::{Commit, LedgerError, LedgerStore};
use magnetar_replication::message::ErrorCode;
use magnetar_replication::node::{LedgerSummary, Record, Token};
use magnetar_replication::{EntryId, Epoch, LedgerId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Where records' outcomes go: called on the journal's completion thread, or from
/// [`NodeStorage::persist`] itself for a record refused or already stored. Must not block.
pub type CompletionSink = Arc<dyn Fn(Completion) + Send + Sync>;

/// The first local ledger holding fence records; later ones (after a failed append) count
/// down from it. Cluster ledger ids are allocated from 0 upwards, so they never reach them.
pub const FENCE_LOG: LedgerId = u64::MAX - 1;
/// The lowest id a fence log may have (a million failed fence logs: never reached).
const LOWEST_FENCE_LOG: LedgerId = FENCE_LOG - (1 << 20);

/// Whether local ledger `ledger` is a fence log.
pub fn is_fence_log(ledger: LedgerId) -> bool {
    (LOWEST_FENCE_LOG..=FENCE_LOG).contains(&ledger)
}
/// A run's header: this magic and the run's first entry id (u64, big-endian).
const HEADER_MAGIC: &[u8; 4] = b"MRU2";
/// The header of a run written before entries carried their LAC.
const HEADER_MAGIC_BARE: &[u8; 4] = b"MRUN";
/// Bytes before each entry's data in a run with `HEADER_MAGIC`.
const LAC_PREFIX: usize = 8;

/// A record's outcome, sent by the journal's completion thread (or at once when refused).
#[derive(Debug)]
pub struct Completion {
    pub token: Token,
    pub result: Result<(), ErrorCode>,
    /// The log itself failed: the node must stop.
    pub fatal: Option<String>,
    /// The journal ran out of disk (not fatal: the node turns read-only).
    pub disk_full: bool,
}

impl Completion {
    fn now(token: Token, result: Result<(), ErrorCode>) -> Completion {
        Completion { token, result, fatal: None, disk_full: false }
    }

    fn of(token: Token, result: &Result<u64, LedgerError>) -> Completion {
        match result {
            Ok(_) => Completion::now(token, Ok(())),
            Err(LedgerError::Journal(JournalError::DiskFull(_))) => {
                Completion { disk_full: true, ..Completion::now(token, Err(ErrorCode::Io)) }
            }
            // An add after one that failed for want of disk (the ledger stopped at it).
            Err(LedgerError::Failed { .. }) => Completion::now(token, Err(ErrorCode::Io)),
            Err(e) => Completion {
                fatal: Some(e.to_string()),
                ..Completion::now(token, Err(ErrorCode::Io))
            },
        }
    }
}

/// Adds staged and not yet settled: each one's data (a resend is compared with it) and the
/// tokens of resends waiting on it. Shared with the journal's completion thread. (Where a run
/// failed is the store's to know: it refuses appends after a failed one, and counts only
/// durable entries.)
type Unsettled = Mutex<HashMap<(LedgerId, EntryId), (Bytes, Vec<Token>)>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first: EntryId,
    /// One past the last entry staged.
    next: EntryId,
    /// Entries are stored after their LAC (every run but those written before that).
    lac_prefixed: bool,
}

/// Where a held entry is in the local store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    entry: EntryId,
    local: u64,
    lac_prefixed: bool,
}

pub struct NodeStorage {
    store: Arc<LedgerStore>,
    runs: BTreeMap<LedgerId, Run>,
    /// The fence log fences go to: the lowest that exists, or [`FENCE_LOG`].
    fence_log: LedgerId,
    completions: CompletionSink,
    unsettled: Arc<Unsettled>,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("ledger {ledger}: corrupt run header")]
    BadHeader { ledger: LedgerId },
    #[error("corrupt fence record {entry} in the fence log")]
    BadFence { entry: u64 },
    #[error("ledger {ledger}: entry {entry} is shorter than its LAC prefix")]
    BadEntry { ledger: LedgerId, entry: EntryId },
}

impl NodeStorage {
    /// Opens the node's view of `store` and what its log says about every ledger. Blocking
    /// (reads each ledger's header): call it off the async runtime.
    pub fn open(
        store: Arc<LedgerStore>,
        completions: CompletionSink,
    ) -> Result<(NodeStorage, BTreeMap<LedgerId, LedgerSummary>), StorageError> {
        let mut runs = BTreeMap::new();
        let mut summaries: BTreeMap<LedgerId, LedgerSummary> = BTreeMap::new();
        let mut fence_log = FENCE_LOG;
        for ledger in store.ledgers() {
            let entries = store.ledger_info(ledger)?.entries;
            if is_fence_log(ledger) {
                fence_log = fence_log.min(ledger);
                for entry in 0..entries {
                    let mut record = store.read_entry(ledger, entry)?;
                    if record.len() != 16 {
                        return Err(StorageError::BadFence { entry });
                    }
                    let (fenced, epoch) = (record.get_u64(), record.get_u64());
                    summaries
                        .entry(fenced)
                        .or_default()
                        .apply(&Record::Fence { ledger: fenced, epoch });
                }
                continue;
            }
            if entries == 0 {
                // Created, header never durable: no add on it was ever acknowledged.
                continue;
            }
            let mut header = store.read_entry(ledger, 0)?;
            let lac_prefixed = match header.get(..4) {
                Some(magic) if header.len() == 12 && magic == HEADER_MAGIC => true,
                Some(magic) if header.len() == 12 && magic == HEADER_MAGIC_BARE => false,
                _ => return Err(StorageError::BadHeader { ledger }),
            };
            header.advance(4);
            let first = header.get_u64();
            let run = Run { first, next: first + entries - 1, lac_prefixed };
            runs.insert(ledger, run);
            if run.next > run.first {
                let last = run.next - 1;
                let summary = summaries.entry(ledger).or_default();
                summary.last_entry = Some(last);
                if lac_prefixed {
                    // The writer's LAC only grows: its last entry carries the highest.
                    let stored = store.read_entry(ledger, entries - 1)?;
                    let (lac, _) =
                        split_lac(stored).ok_or(StorageError::BadEntry { ledger, entry: last })?;
                    summary.apply(&Record::Entry {
                        ledger,
                        entry: last,
                        lac,
                        recovery: false,
                        data: Bytes::new(),
                    });
                }
            }
        }
        let unsettled = Arc::default();
        Ok((NodeStorage { store, runs, fence_log, completions, unsettled }, summaries))
    }

    pub fn store(&self) -> &Arc<LedgerStore> {
        &self.store
    }

    pub fn ledgers(&self) -> usize {
        self.runs.len()
    }

    /// Stages `record`; its outcome goes to the completion sink.
    pub async fn persist(&mut self, token: Token, record: Record) {
        let outcome = match record {
            Record::Entry { ledger, entry, lac, data, .. } => {
                self.stage_entry(token, ledger, entry, lac, data).await
            }
            Record::Fence { ledger, epoch } => self.stage_fence(token, ledger, epoch).await,
        };
        if let Err(code) = outcome {
            (self.completions)(Completion::now(token, Err(code)));
        }
    }

    /// `Ok(())`: staged, its completion comes later; `Err`: fails at once.
    async fn stage_entry(
        &mut self,
        token: Token,
        ledger: LedgerId,
        entry: EntryId,
        lac: Option<EntryId>,
        data: Bytes,
    ) -> Result<(), ErrorCode> {
        let run = match self.runs.get(&ledger).copied() {
            Some(run) => run,
            None => {
                self.create_run(ledger, entry).await?;
                self.runs[&ledger]
            }
        };
        if entry >= run.first && entry < run.next {
            // A resend of an entry staged before: answered with that add's outcome (tokens
            // are released in order, so after what precedes it). Settled, the store says
            // which: it counts only durable entries, and records an outcome before the add's
            // callback takes it out of `unsettled`.
            let mut unsettled = self.unsettled.lock();
            if let Some((staged, waiting)) = unsettled.get_mut(&(ledger, entry)) {
                if *staged != data {
                    return Err(conflict(ledger, entry));
                }
                waiting.push(token);
                return Ok(());
            }
            drop(unsettled);
            let local = entry - run.first + 1;
            let durable = self.store.ledger_info(ledger).map_or(0, |info| info.entries);
            if local >= durable {
                return Err(ErrorCode::Io); // it failed (a full disk)
            }
            // Held: the same bytes again are answered as stored, others refused. (A read of
            // the stored copy, blocking briefly: resends come only after reconnections and
            // from recoveries writing back what they found.)
            let at = Located { entry, local, lac_prefixed: run.lac_prefixed };
            match read_local(&self.store, ledger, at) {
                Ok(Some(held)) if held == data => {}
                Ok(Some(_)) => return Err(conflict(ledger, entry)),
                Ok(None) | Err(_) => return Err(ErrorCode::Io),
            }
            (self.completions)(Completion::now(token, Ok(())));
            return Ok(());
        }
        if entry != run.next {
            tracing::warn!(
                ledger,
                entry,
                first = run.first,
                next = run.next,
                "refused an add that would leave a hole"
            );
            return Err(ErrorCode::Io);
        }
        let local = entry - run.first + 1;
        let stored = match run.lac_prefixed {
            true => with_lac(lac, &data),
            false => data.clone(),
        };
        let completions = self.completions.clone();
        let unsettled = self.unsettled.clone();
        let callback = Box::new(move |result: Result<u64, LedgerError>| {
            // The store has recorded the outcome before this runs, so a resend that finds the
            // add unsettled (under this lock) is answered here.
            let resends =
                unsettled.lock().remove(&(ledger, entry)).map(|(_, r)| r).unwrap_or_default();
            completions(Completion::of(token, &result));
            for resend in resends {
                completions(Completion { fatal: None, ..Completion::of(resend, &result) });
            }
        });
        self.unsettled.lock().insert((ledger, entry), (data, Vec::new()));
        // After a failed add the store refuses the ledger's next ones: no hole after it.
        let staged = self.store.append_at(ledger, local, stored, callback, Commit::Caller);
        if let Err(e) = staged {
            self.unsettled.lock().remove(&(ledger, entry));
            tracing::warn!(ledger, entry, error = %e, "add refused by the ledger store");
            return Err(ErrorCode::Io);
        }
        self.runs.get_mut(&ledger).expect("present").next = entry + 1;
        Ok(())
    }

    async fn create_run(&mut self, ledger: LedgerId, first: EntryId) -> Result<(), ErrorCode> {
        if is_fence_log(ledger) {
            return Err(ErrorCode::Io);
        }
        match self.store.create_ledger_with_id(ledger).await {
            Ok(()) => {}
            // An empty leftover of a crash before its header was durable: start it over.
            Err(LedgerError::LedgerExists(_)) => {
                let entries = self.store.ledger_info(ledger).map_err(|_| ErrorCode::Io)?.entries;
                if entries != 0 {
                    return Err(ErrorCode::Io);
                }
                self.store.delete_ledger(ledger).await.map_err(|_| ErrorCode::Io)?;
                self.store.create_ledger_with_id(ledger).await.map_err(|_| ErrorCode::Io)?;
            }
            Err(e) => {
                tracing::warn!(ledger, error = %e, "cannot create a ledger");
                return Err(ErrorCode::Io);
            }
        }
        let mut header = BytesMut::with_capacity(12);
        header.put_slice(HEADER_MAGIC);
        header.put_u64(first);
        // The header needs no completion of its own: the first entry's, staged right after it
        // in the same journal, comes after it.
        self.store
            .append_at(ledger, 0, header.freeze(), Box::new(|_| {}), Commit::Writer)
            .map_err(|_| ErrorCode::Io)?;
        self.runs.insert(ledger, Run { first, next: first, lac_prefixed: true });
        Ok(())
    }

    async fn stage_fence(
        &mut self,
        token: Token,
        ledger: LedgerId,
        epoch: Epoch,
    ) -> Result<(), ErrorCode> {
        // Not `ledgers()`, which sorts every id: once per fence, it made a new owner's
        // recovery of 3,000 topics spend a third of the machine's CPU sorting.
        if !self.store.contains(self.fence_log) {
            self.store.create_ledger_with_id(self.fence_log).await.map_err(|_| ErrorCode::Io)?;
        }
        let mut record = BytesMut::with_capacity(16);
        record.put_u64(ledger);
        record.put_u64(epoch);
        let record = record.freeze();
        let completions = self.completions.clone();
        let callback = Box::new(move |result: Result<u64, LedgerError>| {
            completions(Completion::of(token, &result));
        });
        match self.store.append_with(self.fence_log, record.clone(), callback) {
            Ok(_) => {}
            Err(LedgerError::Failed { .. }) if self.fence_log > LOWEST_FENCE_LOG => {
                // An earlier fence failed to be written there (the disk was full): that log
                // takes nothing more. A new one does; both are read at start.
                let next = self.fence_log - 1;
                tracing::warn!(failed = self.fence_log, next, "fence log failed: starting another");
                self.store.create_ledger_with_id(next).await.map_err(|_| ErrorCode::Io)?;
                self.fence_log = next;
                let completions = self.completions.clone();
                let callback = Box::new(move |result: Result<u64, LedgerError>| {
                    completions(Completion::of(token, &result));
                });
                self.store.append_with(next, record, callback).map_err(|_| ErrorCode::Io)?;
            }
            Err(_) => return Err(ErrorCode::Io),
        }
        Ok(())
    }

    /// Gets the entries staged since the last call written: on this thread, blocking for a
    /// write and a flush, when the journal is idle and they are few (a lone add's latency
    /// then has no wake-up of the journal's writer thread in it); by the writer thread
    /// otherwise. Call it after each batch of requests.
    pub fn commit(&self) {
        self.store.commit();
    }

    /// Frees a deleted ledger's entries (garbage collection).
    pub async fn delete(&mut self, ledger: LedgerId) -> Result<(), LedgerError> {
        assert!(!is_fence_log(ledger), "fence logs are never collected");
        self.runs.remove(&ledger);
        match self.store.delete_ledger(ledger).await {
            Ok(()) | Err(LedgerError::NoSuchLedger(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Where entry `entry` of `ledger` is in the local store, if this node holds it.
    pub fn locate(&self, ledger: LedgerId, entry: EntryId) -> Option<Located> {
        let run = self.runs.get(&ledger)?;
        (entry >= run.first && entry < run.next).then(|| Located {
            entry,
            local: entry - run.first + 1,
            lac_prefixed: run.lac_prefixed,
        })
    }
}

/// `data` stored after `lac` (a copy: the journal takes one contiguous payload).
fn with_lac(lac: Option<EntryId>, data: &[u8]) -> Bytes {
    let mut stored = BytesMut::with_capacity(LAC_PREFIX + data.len());
    stored.put_u64(lac.map_or(0, |l| l + 1));
    stored.put_slice(data);
    stored.freeze()
}

/// A stored entry's LAC and data; `None` when it is too short to hold a LAC.
fn split_lac(mut stored: Bytes) -> Option<(Option<EntryId>, Bytes)> {
    if stored.len() < LAC_PREFIX {
        return None;
    }
    let lac = stored.get_u64().checked_sub(1);
    Some((lac, stored))
}

/// An add of an entry this node holds (or has staged) with other bytes: never overwritten,
/// refused with `Conflict` (the writer or recovery takes it for a failed node). Only a bug or
/// a damaged copy sends different bytes for one entry id.
fn conflict(ledger: LedgerId, entry: EntryId) -> ErrorCode {
    tracing::error!(ledger, entry, "an add of an entry held with other bytes: refused");
    ErrorCode::Conflict
}

/// Reads a located entry's data; `None` when it is not durable yet. Blocking.
pub fn read_local(
    store: &LedgerStore,
    ledger: LedgerId,
    at: Located,
) -> Result<Option<Bytes>, StorageError> {
    let stored = match store.read_entry(ledger, at.local) {
        Ok(stored) => stored,
        Err(LedgerError::NoSuchEntry { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !at.lac_prefixed {
        return Ok(Some(stored));
    }
    match split_lac(stored) {
        Some((_, data)) => Ok(Some(data)),
        None => Err(StorageError::BadEntry { ledger, entry: at.entry }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_ledger::LedgerStoreConfig;
    use std::sync::mpsc;
    use std::time::Duration;

    fn open(
        dir: &std::path::Path,
        sink: CompletionSink,
    ) -> (NodeStorage, BTreeMap<LedgerId, LedgerSummary>) {
        let config = LedgerStoreConfig { dir: dir.to_path_buf(), ..LedgerStoreConfig::default() };
        let (store, _) = LedgerStore::open(config).expect("store opens");
        NodeStorage::open(Arc::new(store), sink).expect("node storage opens")
    }

    fn entry(ledger: LedgerId, entry: EntryId, lac: Option<EntryId>) -> Record {
        Record::Entry {
            ledger,
            entry,
            lac,
            recovery: false,
            data: Bytes::from(vec![entry as u8; 3]),
        }
    }

    #[tokio::test]
    async fn a_restarted_node_knows_the_lac_its_last_entry_carried_and_reads_bare_data() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (done, durable) = mpsc::channel();
            let sink: CompletionSink = Arc::new(move |c: Completion| {
                let _ = done.send(c.result);
            });
            let (mut storage, _) = open(dir.path(), sink);
            // A replacement node's run: it joined the ledger at entry 10.
            for (token, (e, lac)) in
                [(10, None), (11, Some(10)), (12, Some(10))].into_iter().enumerate()
            {
                storage.persist(token as Token, entry(7, e, lac)).await;
            }
            storage.commit();
            for _ in 0..3 {
                let result = durable.recv_timeout(Duration::from_secs(10)).expect("completed");
                assert_eq!(result, Ok(()));
            }
        }
        let (storage, summaries) = open(dir.path(), Arc::new(|_| {}));
        assert_eq!(summaries[&7].lac, Some(10), "the LAC entry 12 carried");
        assert_eq!(summaries[&7].last_entry, Some(12));
        assert!(storage.locate(7, 9).is_none(), "below the run");
        let at = storage.locate(7, 11).expect("held");
        let data = read_local(storage.store(), 7, at).expect("read").expect("durable");
        assert_eq!(&data[..], &[11, 11, 11], "the data as sent, without its LAC");
    }

    /// A resend with the same bytes is answered as stored, staged or durable; with other bytes
    /// it is refused with `Conflict` and the entry keeps its first bytes.
    #[tokio::test]
    async fn a_resend_is_stored_once_and_other_bytes_are_a_conflict() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (sink, seen) = recorder();
        let (mut storage, _) = open(dir.path(), sink);
        let other = |e: EntryId| Record::Entry {
            ledger: 7,
            entry: e,
            lac: None,
            recovery: true,
            data: Bytes::from_static(b"other bytes"),
        };
        storage.persist(0, entry(7, 0, None)).await;
        // Staged (not durable yet, unless the run's header took it along): the same bytes get
        // its outcome, others are refused.
        storage.persist(1, entry(7, 0, None)).await;
        storage.persist(2, other(0)).await;
        storage.commit();
        let mut settled = [next(&seen), next(&seen), next(&seen)];
        settled.sort_by_key(|s| s.0);
        let expected = [(0, Ok(())), (1, Ok(())), (2, Err(ErrorCode::Conflict))];
        assert_eq!(settled, expected.map(|(token, result)| (token, result, false, false)));
        // Durable: the same again (its LAC may differ), then other bytes.
        storage.persist(3, entry(7, 0, Some(0))).await;
        assert_eq!(next(&seen), (3, Ok(()), false, false));
        storage.persist(4, other(0)).await;
        assert_eq!(next(&seen), (4, Err(ErrorCode::Conflict), false, false));
        let at = storage.locate(7, 0).expect("held");
        let data = read_local(storage.store(), 7, at).expect("read").expect("durable");
        assert_eq!(&data[..], &[0, 0, 0], "never overwritten");
    }

    /// What the completion sink saw of one record.
    type Seen = (Token, Result<(), ErrorCode>, bool, bool);

    fn recorder() -> (CompletionSink, mpsc::Receiver<Seen>) {
        let (done, seen) = mpsc::channel();
        let sink: CompletionSink = Arc::new(move |c: Completion| {
            let _ = done.send((c.token, c.result, c.fatal.is_some(), c.disk_full));
        });
        (sink, seen)
    }

    fn next(seen: &mpsc::Receiver<Seen>) -> Seen {
        seen.recv_timeout(Duration::from_secs(10)).expect("every record is reported")
    }

    fn page(ledger: LedgerId, entry: EntryId) -> Record {
        let data = Bytes::from(vec![entry as u8; 4096]);
        Record::Entry { ledger, entry, lac: None, recovery: false, data }
    }

    /// Small segments, so that a simulated disk fills after a few.
    fn small_segments() -> LedgerStoreConfig {
        LedgerStoreConfig {
            journal: magnetar_journal::JournalConfig {
                segment_size_bytes: 256 << 10,
                max_group_bytes: 64 << 10,
                ..Default::default()
            },
            ..LedgerStoreConfig::default()
        }
    }

    #[tokio::test]
    async fn a_full_disk_fails_adds_without_stopping_the_node_and_their_run_takes_no_more() {
        use magnetar_journal::sim::{Faults, SimStorage};
        let storage = SimStorage::new(11);
        let store = LedgerStore::open_with_storage(small_segments(), Arc::new(storage.clone()));
        let store = store.unwrap().0;
        let (sink, seen) = recorder();
        let (mut node, _) = NodeStorage::open(Arc::new(store), sink).expect("opens");
        node.persist(0, page(7, 0)).await;
        node.persist(1, Record::Fence { ledger: 6, epoch: 1 }).await;
        node.commit();
        assert_eq!(next(&seen), (0, Ok(()), false, false), "the run and a segment exist");
        assert_eq!(next(&seen), (1, Ok(()), false, false), "and the fence log");
        // The disk fills: the journal's next segment cannot be created.
        storage.set_faults(Faults {
            capacity_bytes: Some(storage.used_bytes() + 4096),
            ..Faults::default()
        });
        // Each add is sent twice before it is written (a writer resending after reconnecting):
        // the resend is answered with the add's outcome.
        let mut token = 2;
        let mut failed = None;
        for entry in 1..1_000 {
            node.persist(token, page(7, entry)).await;
            node.persist(token + 1, page(7, entry)).await;
            node.commit();
            let (first, resend) = (next(&seen), next(&seen));
            assert_eq!((first.0, resend.0), (token, token + 1), "in token order");
            token += 2;
            match first.1 {
                Ok(()) => assert_eq!(resend.1, Ok(()), "entry {entry}: durable, so is its resend"),
                Err(code) => {
                    assert_eq!(code, ErrorCode::Io);
                    assert!(!first.2 && first.3, "entry {entry}: disk full, not fatal: {first:?}");
                    assert_eq!(resend.1, Err(ErrorCode::Io), "a resend is not stored on its own");
                    failed = Some(entry);
                    break;
                }
            }
        }
        let failed = failed.expect("the disk filled up");
        assert!(failed > 0, "entries were written before the disk filled");
        // A fence while the disk is full fails to be written, and its log takes no more.
        node.persist(token, Record::Fence { ledger: 9, epoch: 1 }).await;
        node.commit();
        let fence = next(&seen);
        assert_eq!((fence.0, fence.1), (token, Err(ErrorCode::Io)), "{fence:?}");
        token += 1;
        // Space comes back. The failed ledger takes nothing more here (no hole after the
        // failure), neither the failed entry again nor the next; what was durable reads back.
        storage.set_faults(Faults::default());
        for (t, entry) in [(token, failed), (token + 1, failed + 1)] {
            node.persist(t, page(7, entry)).await;
            node.commit();
            assert_eq!(next(&seen).1, Err(ErrorCode::Io), "entry {entry} refused");
        }
        let before = node.locate(7, failed - 1).expect("held");
        let data = read_local(node.store(), 7, before).unwrap().expect("durable");
        assert_eq!(data[0], (failed - 1) as u8);
        if let Some(at) = node.locate(7, failed) {
            assert_eq!(read_local(node.store(), 7, at).unwrap(), None, "not durable");
        }
        // Another ledger is written: the node goes on.
        node.persist(token + 2, page(8, 0)).await;
        node.commit();
        assert_eq!(next(&seen), (token + 2, Ok(()), false, false));
        // So do fences, in a new fence log; a restart reads it.
        node.persist(token + 3, Record::Fence { ledger: 8, epoch: 2 }).await;
        node.commit();
        assert_eq!(next(&seen), (token + 3, Ok(()), false, false), "fenced without a restart");
        drop(node);
        let store = LedgerStore::open_with_storage(small_segments(), Arc::new(storage.clone()));
        let store = store.unwrap().0;
        let (_, summaries) = NodeStorage::open(Arc::new(store), Arc::new(|_| {})).expect("opens");
        assert_eq!(summaries[&8].fence_epoch, Some(2), "the new fence log is read at start");
        assert_eq!(summaries[&6].fence_epoch, Some(1), "and the first");
    }

    #[test]
    fn a_stored_entry_too_short_for_its_lac_is_corrupt() {
        assert_eq!(split_lac(Bytes::from_static(&[0, 0, 1])), None);
        let (lac, data) = split_lac(with_lac(Some(4), b"x")).expect("long enough");
        assert_eq!((lac, &data[..]), (Some(4), &b"x"[..]));
        let (lac, data) = split_lac(with_lac(None, b"")).expect("long enough");
        assert_eq!((lac, data.len()), (None, 0));
    }
}
