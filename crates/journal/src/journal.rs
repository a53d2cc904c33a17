//! The journal runtime: appenders stage records into groups; one writer thread writes each group
//! with one write and one flush, then completes every waiter of the group; a preparer thread
//! keeps the next segment file ready so that rolling over costs a rename, not a zero-fill.
//!
//! Group commit, "flush when idle": the writer takes the oldest group as soon as it is free, so a
//! lone append pays one write and one flush and nothing else, while appends that arrive during a
//! flush gather into the next group and share its flush.
//!
//! A caller that stages its own batches ([`Journal::stage`], then [`Journal::commit`]) may write a
//! small group on its own thread when no write is in progress: the write then costs no wake-up of
//! the writer thread (a storage node's one staging task does this; on a replicated add's round
//! trip that wake-up was one of the hand-offs a local add does not pay twice). One write is in
//! progress at a time, whoever does it (`Staging::writing`), so groups still go to disk in order.
//!
//! Invariants:
//! - Every record's segment and offset are fixed when it is staged; groups are written in
//!   staging order, each at a block-aligned offset right after the previous group.
//! - A waiter is completed only after its group's flush returned success (or with an error).
//! - After a failed write or flush the journal is `Failed`: every pending and later append gets
//!   the error. Nothing is retried.
//! - The writer never writes into a segment that existed when the journal opened: after a crash
//!   it starts a new segment, so stale bytes of an interrupted write can never follow new data.

use crate::aligned::AlignedBuf;
use crate::config::{JournalConfig, SyncMode};
use crate::error::{is_out_of_space, JournalError};
use crate::read_pool::ReadPool;
use crate::record::{
    align_up, encode_record, header_gap, pad_to_block, segment_tag, verify_record, EndReason,
    RecordHeader, Sink, BLOCK_SIZE, HEADER_LEN,
};
use crate::scan::{scan_segment, torn_bytes_after, RecordLocation};
use crate::storage::{write_all_at, SegmentFile, Storage, WriteMode};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use magnetar_clock::{Clock, SystemClock};

/// Called once when the record's group is durable, with the record's location (or with the
/// error). Runs on the writer thread: keep it short and never block in it.
pub type Completion = Box<dyn FnOnce(Result<RecordLocation, JournalError>) + Send>;

/// What recovery found when the journal opened.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Segments that hold records, ascending. All are sealed: new writes go to a new segment.
    pub segments: Vec<u64>,
    /// The segment written last before the restart, and where its valid records end.
    pub tail: Option<(u64, u64)>,
    /// Bytes of a torn or corrupt write found after the tail's last valid record and zeroed.
    pub discarded_bytes: u64,
    /// Bytes of the tail segment after its last record given back to the file system (the
    /// segment is truncated: nothing is written there again).
    pub freed_tail_bytes: u64,
    /// Why the scan of the tail stopped.
    pub tail_end: Option<EndReason>,
}

/// A segment the writer has left for good, with the length of its written part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedSegment {
    pub seq: u64,
    pub len: u64,
}

/// Counters for benchmarks and metrics.
#[derive(Debug)]
pub struct JournalStats {
    pub groups: AtomicU64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    /// How long each group's `fdatasync` took (microseconds).
    pub fsync_us: magnetar_metrics::Histogram,
}

/// Bucket bounds of the fsync latency histogram, in microseconds (50 us .. 1 s).
pub const FSYNC_BUCKETS_US: &[u64] =
    &[50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];

impl Default for JournalStats {
    fn default() -> Self {
        JournalStats {
            groups: AtomicU64::new(0),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fsync_us: magnetar_metrics::Histogram::new(FSYNC_BUCKETS_US),
        }
    }
}

struct Group {
    seq: u64,
    offset: u64,
    buf: AlignedBuf,
    /// Each waiter with its record's offset in the group and payload length.
    waiters: Waiters,
    closed: bool,
    opened_at: Instant,
}

enum State {
    Open,
    Failed(JournalError),
    Closing,
}

struct Staging {
    groups: VecDeque<Group>,
    /// Where the next group opens (valid once the last group is closed).
    next_seq: u64,
    next_offset: u64,
    state: State,
    spare_buffers: Vec<AlignedBuf>,
    /// A group is being written (by the writer thread or by a caller in `commit`): nobody else
    /// takes one until it is written and its outcome reported, which keeps groups and their
    /// completions in order.
    writing: bool,
    /// `stage` opened a group without waking the writer and no `commit` has seen it yet: an
    /// `append` that joins it wakes the writer, so a plain appender never waits on a stager's
    /// commit (a storage node awaits a ledger's creation between staging and committing).
    unannounced: bool,
    /// The writer thread has ended: every segment is sealed.
    writer_stopped: bool,
}

#[derive(Default)]
struct Prep {
    requested: Option<u64>,
    ready: Option<u64>,
    failed: Option<(u64, JournalError)>,
    recyclable: VecDeque<u64>,
    shutdown: bool,
}

type Waiters = Vec<(Completion, u32, u32)>;

/// The outcome of a group, waiting for its waiters to be told.
enum Outcome {
    Flushed {
        seq: u64,
        offset: u64,
        waiters: Waiters,
    },
    Failed {
        error: JournalError,
        waiters: Waiters,
    },
    /// Told after every completion of the segment's records.
    Sealed(SealedSegment),
}

/// Outcomes in group order: every waiter is told on the completer thread, in staging order.
#[derive(Default)]
struct Completed {
    outcomes: VecDeque<Outcome>,
    writer_done: bool,
}

struct Shared {
    completed: Mutex<Completed>,
    /// Held while callbacks run, by the completer or by the writer completing a small group
    /// inline: callbacks never overlap, so they stay in group order.
    completing: Mutex<()>,
    completed_ready: Condvar,
    config: JournalConfig,
    storage: Arc<dyn Storage>,
    clock: Arc<dyn Clock>,
    staging: Mutex<Staging>,
    data_ready: Condvar,
    readers: RwLock<BTreeMap<u64, SegmentReader>>,
    read_pool: ReadPool,
    prep: Mutex<Prep>,
    prep_changed: Condvar,
    sealed_hook: Mutex<Option<SealedHook>>,
    completions_hook: std::sync::OnceLock<CompletionsHook>,
    out_of_space_hook: std::sync::OnceLock<OutOfSpaceHook>,
    /// Released segments are kept for reuse (up to `recycled_segments_kept`); off while the
    /// disk is short, so that what is freed goes back to the file system.
    recycling: AtomicBool,
    stats: JournalStats,
    /// The segment being written; locked by whoever holds `Staging::writing`.
    active: Mutex<Option<Active>>,
}

/// Told about each segment the writer leaves for good (on the writer thread).
pub type SealedHook = Box<dyn FnMut(SealedSegment) + Send>;

/// Called after each run of completions (a group's, or whatever the completion thread took in
/// one go), on the thread that ran them: completions that each queue a little work (a reply
/// to a peer) can leave it to this and do it once per run (one socket write for many).
pub type CompletionsHook = Box<dyn Fn() + Send + Sync>;

/// Called (on the preparer thread) when a segment cannot be prepared for want of space; true
/// when it freed some (gave up a reserve), and the preparer then tries once more before the
/// groups waiting for that segment fail with `DiskFull`.
pub type OutOfSpaceHook = Box<dyn Fn() -> bool + Send + Sync>;

pub struct Journal {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Journal {
    /// Opens (or creates) the journal: finds the tail, zeroes a torn write after it, gives the
    /// tail segment's unwritten rest back to the file system, and starts the writer on a fresh
    /// segment. Replaying records is the caller's business (`scan`).
    pub fn open(
        config: JournalConfig,
        storage: Arc<dyn Storage>,
    ) -> Result<(Journal, RecoveryReport), JournalError> {
        Journal::open_with_clock(config, storage, Arc::new(SystemClock))
    }

    /// [`Journal::open`] with the clock that times group-commit windows (`max_wait`).
    pub fn open_with_clock(
        config: JournalConfig,
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
    ) -> Result<(Journal, RecoveryReport), JournalError> {
        config.validate()?;
        storage.remove_temporaries().map_err(|e| JournalError::io("remove temporary files", e))?;
        let seqs = storage.list_segments().map_err(|e| JournalError::io("list segments", e))?;
        let mut report = RecoveryReport::default();
        let mut readers = BTreeMap::new();
        let mut tail_index = None;
        for (index, &seq) in seqs.iter().enumerate().rev() {
            let file = open_read(&*storage, seq, false)?.file;
            let end = scan_segment(&*file, seq, |_, _, _| {})
                .map_err(|e| JournalError::io(format!("scan segment {seq}"), e))?;
            if end.records > 0 {
                if end.reason == EndReason::Invalid {
                    report.discarded_bytes = zero_torn_tail(&*storage, seq, end.valid_end)?;
                }
                report.freed_tail_bytes = free_unwritten_tail(&*storage, seq, end.valid_end);
                report.tail = Some((seq, end.valid_end));
                report.tail_end = Some(end.reason);
                tail_index = Some(index);
                break;
            }
        }
        let mut prep = Prep::default();
        for (index, &seq) in seqs.iter().enumerate() {
            if tail_index.is_some_and(|tail| index <= tail) {
                readers.insert(seq, open_read(&*storage, seq, config.direct_io)?);
                report.segments.push(seq);
            } else {
                prep.recyclable.push_back(seq);
            }
        }
        let first_seq = seqs.last().map_or(1, |last| last + 1);
        prep.requested = Some(first_seq);
        let shared = Arc::new(Shared {
            completed: Mutex::new(Completed::default()),
            completing: Mutex::new(()),
            completed_ready: Condvar::new(),
            staging: Mutex::new(Staging {
                groups: VecDeque::new(),
                next_seq: first_seq,
                next_offset: 0,
                state: State::Open,
                spare_buffers: Vec::new(),
                writing: false,
                unannounced: false,
                writer_stopped: false,
            }),
            config,
            storage,
            clock,
            data_ready: Condvar::new(),
            readers: RwLock::new(readers),
            read_pool: ReadPool::new(READ_POOL_IDLE_BYTES),
            prep: Mutex::new(prep),
            prep_changed: Condvar::new(),
            sealed_hook: Mutex::new(None),
            completions_hook: std::sync::OnceLock::new(),
            out_of_space_hook: std::sync::OnceLock::new(),
            recycling: AtomicBool::new(true),
            stats: JournalStats::default(),
            active: Mutex::new(None),
        });
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("journal-writer".into())
                .spawn(move || writer_loop(&shared))
                .map_err(|e| JournalError::io("spawn journal writer", e))?
        };
        let preparer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("journal-preparer".into())
                .spawn(move || preparer_loop(&shared))
                .map_err(|e| JournalError::io("spawn journal preparer", e))?
        };
        let completer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("journal-completer".into())
                .spawn(move || completer_loop(&shared))
                .map_err(|e| JournalError::io("spawn journal completer", e))?
        };
        let journal = Journal { shared, threads: Mutex::new(vec![writer, completer, preparer]) };
        Ok((journal, report))
    }

    pub fn config(&self) -> &JournalConfig {
        &self.shared.config
    }

    pub fn stats(&self) -> &JournalStats {
        &self.shared.stats
    }

    /// Sets the hook told about sealed segments (including the last one, on close).
    pub fn set_sealed_hook(&self, hook: SealedHook) {
        *self.shared.sealed_hook.lock() = Some(hook);
    }

    /// Sets the hook called after each run of completions (once; later calls are ignored).
    pub fn set_completions_hook(&self, hook: CompletionsHook) {
        let _ = self.shared.completions_hook.set(hook);
    }

    /// Sets the hook asked for space when a segment cannot be prepared (once; later calls are
    /// ignored).
    pub fn set_out_of_space_hook(&self, hook: OutOfSpaceHook) {
        let _ = self.shared.out_of_space_hook.set(hook);
    }

    /// Stages one record. Returns where it will live; `completion` runs once it is durable.
    /// Records staged by one thread are written in the order they were staged.
    pub fn append(
        &self,
        header: RecordHeader,
        payload: &[u8],
        completion: Completion,
    ) -> Result<RecordLocation, JournalError> {
        let (location, wake) = self.stage_record(header, payload, completion, true)?;
        if wake {
            self.shared.data_ready.notify_one();
        }
        Ok(location)
    }

    /// As [`Journal::append`], without waking the writer: the caller calls [`Journal::commit`]
    /// once it has staged its batch (records of others that join the group wait for it too).
    pub fn stage(
        &self,
        header: RecordHeader,
        payload: &[u8],
        completion: Completion,
    ) -> Result<RecordLocation, JournalError> {
        self.stage_record(header, payload, completion, false).map(|(location, _)| location)
    }

    /// Gets what is staged written. When no write is in progress and only one small group is
    /// waiting (a lone or a few records: latency, not throughput), this thread writes and
    /// flushes it and runs its completions, blocking for as long as that takes; otherwise the
    /// writer thread does, as for [`Journal::append`].
    pub fn commit(&self) {
        let shared = &*self.shared;
        let mut staging = shared.staging.lock();
        // Every way out below gets the staged groups taken: written here, by the writer woken
        // here, or by whoever is writing now (the writer thread loops; a caller wakes it).
        staging.unannounced = false;
        if staging.writing {
            // Whoever writes takes the next group after it (a caller wakes the writer).
            return;
        }
        let Some(front) = staging.groups.front() else { return };
        let here = matches!(staging.state, State::Open)
            && shared.config.max_wait.is_none()
            && staging.groups.len() == 1
            && front.waiters.len() <= INLINE_MAX_WAITERS
            // Only into the open segment: opening the next may wait for the preparer. Nobody
            // holds `active` while nobody writes, so this never waits.
            && shared.active.try_lock().is_some_and(|a| a.as_ref().map(|a| a.seq) == Some(front.seq));
        if !here {
            drop(staging);
            shared.data_ready.notify_one();
            return;
        }
        let front = staging.groups.front_mut().expect("checked above");
        if !front.closed {
            let (seq, end) = close_group(front);
            (staging.next_seq, staging.next_offset) = (seq, end);
        }
        let group = staging.groups.pop_front().expect("checked above");
        staging.writing = true;
        drop(staging);
        write_group(shared, group);
        let mut staging = shared.staging.lock();
        staging.writing = false;
        // The writer thread waits while a caller writes: wake it if it has work (or must stop).
        let wake = !staging.groups.is_empty() || !matches!(staging.state, State::Open);
        drop(staging);
        if wake {
            shared.data_ready.notify_one();
        }
    }

    /// Stages one record; also says whether the writer needs waking (`announce`: for `append`).
    fn stage_record(
        &self,
        header: RecordHeader,
        payload: &[u8],
        completion: Completion,
        announce: bool,
    ) -> Result<(RecordLocation, bool), JournalError> {
        let config = &self.shared.config;
        if payload.len() > config.max_payload_bytes() {
            return Err(JournalError::RecordTooLarge {
                size: payload.len(),
                max: config.max_payload_bytes(),
            });
        }
        let mut staging = self.shared.staging.lock();
        match &staging.state {
            State::Open => {}
            State::Failed(error) => return Err(error.clone()),
            State::Closing => return Err(JournalError::Closed),
        }
        let fits_in_back = staging.groups.back().is_some_and(|group| {
            let start = group.buf.len() + header_gap(group.buf.len());
            let end = start + HEADER_LEN + payload.len();
            !group.closed
                && end <= config.max_group_bytes
                && group.offset + align_up(end) as u64 <= config.segment_size_bytes
        });
        let mut opened_group = false;
        if !fits_in_back {
            if let Some(back) = staging.groups.back_mut().filter(|g| !g.closed) {
                let (seq, end) = close_group(back);
                (staging.next_seq, staging.next_offset) = (seq, end);
            }
            let needed = align_up(HEADER_LEN + payload.len()) as u64;
            if staging.next_offset + needed > config.segment_size_bytes {
                staging.next_seq += 1;
                staging.next_offset = 0;
            }
            let buf = staging
                .spare_buffers
                .pop()
                .unwrap_or_else(|| AlignedBuf::with_capacity(config.max_group_bytes.min(1 << 20)));
            let group = Group {
                seq: staging.next_seq,
                offset: staging.next_offset,
                buf,
                waiters: Vec::new(),
                closed: false,
                opened_at: self.shared.clock.now(),
            };
            staging.groups.push_back(group);
            opened_group = true;
        }
        let group = staging.groups.back_mut().expect("a group is open");
        let at = encode_record(&mut group.buf, segment_tag(group.seq), header, payload);
        group.waiters.push((completion, at as u32, payload.len() as u32));
        let location = RecordLocation {
            segment: group.seq,
            offset: group.offset + at as u64,
            len: payload.len() as u32,
        };
        let wake = if announce {
            std::mem::take(&mut staging.unannounced) || opened_group
        } else {
            staging.unannounced |= opened_group;
            false
        };
        Ok((location, wake))
    }

    /// Reads back one record's payload, verifying its checksum and identity.
    pub fn read(
        &self,
        location: RecordLocation,
        expected: RecordHeader,
    ) -> Result<Bytes, JournalError> {
        Ok(self.read_many(&[(location, expected)])?.pop().expect("one request, one answer"))
    }

    /// Reads many records, coalescing nearby ones in a segment into one read (read-ahead for
    /// catch-up readers: entries of one ledger are interleaved with others in the journal).
    pub fn read_many(
        &self,
        requests: &[(RecordLocation, RecordHeader)],
    ) -> Result<Vec<Bytes>, JournalError> {
        const MAX_GAP: u64 = 256 << 10;
        // Spans stay within an 8 MiB buffer once widened to whole blocks.
        const MAX_SPAN: u64 = (8 << 20) - 2 * BLOCK_SIZE as u64;
        let mut out = Vec::with_capacity(requests.len());
        let mut index = 0;
        while index < requests.len() {
            let first = requests[index].0;
            let mut end = first.offset + HEADER_LEN as u64 + first.len as u64;
            let mut last = index + 1;
            while let Some((next, _)) = requests.get(last) {
                let next_end = next.offset + HEADER_LEN as u64 + next.len as u64;
                if next.segment != first.segment
                    || next.offset < end
                    || next.offset - end > MAX_GAP
                    || next_end - first.offset > MAX_SPAN
                {
                    break;
                }
                end = next_end;
                last += 1;
            }
            let (span, span_start) = self.read_span(first.segment, first.offset, end)?;
            for (location, header) in &requests[index..last] {
                let at = (location.offset - span_start) as usize;
                let record = span.slice(at..at + HEADER_LEN + location.len as usize);
                let payload = verify_record(&record, segment_tag(location.segment), *header)
                    .ok_or(JournalError::Corrupt {
                        segment: location.segment,
                        offset: location.offset,
                    })?;
                out.push(record.slice(payload));
            }
            index = last;
        }
        Ok(out)
    }

    /// Reads the blocks covering `start..end` of a segment into a pooled aligned buffer, with
    /// `O_DIRECT` where the segment has such a reader (journal data is written around the page
    /// cache, so a buffered read would only add a copy). Returns the span and its file offset.
    fn read_span(&self, seq: u64, start: u64, end: u64) -> Result<(Bytes, u64), JournalError> {
        let block = BLOCK_SIZE as u64;
        let aligned_start = start / block * block;
        let aligned_end = end.next_multiple_of(block);
        let len = (aligned_end - aligned_start) as usize;
        let needed = (end - aligned_start) as usize;
        let reader = self.reader(seq)?;
        let mut buf = self.shared.read_pool.take(len);
        let target = &mut buf.as_capacity_slice_mut()[..len];
        let direct =
            reader.direct.as_ref().map(|d| read_at_least(&**d, target, aligned_start, needed));
        let read = match direct {
            // A file system may refuse a direct read it accepted at open.
            Some(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => None,
            other => other,
        }
        .unwrap_or_else(|| read_at_least(&*reader.file, target, aligned_start, needed));
        let filled = read.map_err(|e| {
            // Released meanwhile: the file may be gone (or reused) under the reader.
            if self.shared.readers.read().contains_key(&seq) {
                JournalError::io(format!("read segment {seq} at {start}"), e)
            } else {
                JournalError::Released { segment: seq }
            }
        })?;
        Ok((self.shared.read_pool.freeze(buf, filled), aligned_start))
    }

    /// Visits every valid record of a sealed segment, in order.
    pub fn scan(
        &self,
        seq: u64,
        visit: impl FnMut(RecordHeader, RecordLocation, &[u8]),
    ) -> Result<crate::scan::ScanEnd, JournalError> {
        let file = self.reader(seq)?.file;
        scan_segment(&*file, seq, visit)
            .map_err(|e| JournalError::io(format!("scan segment {seq}"), e))
    }

    /// Segments present for reading, ascending (sealed ones and the one being written).
    pub fn segments(&self) -> Vec<u64> {
        self.shared.readers.read().keys().copied().collect()
    }

    /// Gives up sealed segments whose records are no longer needed: each file is kept for
    /// reuse or removed, so disk usage goes down; the removed files are made durable together
    /// (`Storage::remove_segments`).
    pub fn release_segments(&self, seqs: &[u64]) -> Result<(), JournalError> {
        let (current, stopped) = {
            let staging = self.shared.staging.lock();
            (staging.next_seq, staging.writer_stopped)
        };
        let mut removed = Vec::new();
        for &seq in seqs {
            // Once the writer has ended (closing), its last segment is sealed too.
            assert!(seq < current || stopped, "segment {seq} is not sealed (writer at {current})");
            if self.shared.readers.write().remove(&seq).is_none() {
                continue;
            }
            let mut prep = self.shared.prep.lock();
            let recycling = self.shared.recycling.load(Ordering::Acquire);
            if recycling && prep.recyclable.len() < self.shared.config.recycled_segments_kept {
                prep.recyclable.push_back(seq);
                continue;
            }
            removed.push(seq);
        }
        self.shared
            .storage
            .remove_segments(&removed)
            .map_err(|e| JournalError::io(format!("remove segments {removed:?}"), e))
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.shared.storage
    }

    /// Turns keeping released segments for reuse on or off. Off (a disk short of space), the
    /// segments kept now are removed too: a kept segment saves the next one a zero-fill, but
    /// the file system counts it as used, and a store waiting for free space would wait for
    /// ever if every segment its deletes freed were kept.
    pub fn set_recycling(&self, on: bool) -> Result<(), JournalError> {
        if self.shared.recycling.swap(on, Ordering::AcqRel) == on || on {
            return Ok(());
        }
        // Not yet taken by the preparer (it takes them under this lock): unused files.
        let kept: Vec<u64> = self.shared.prep.lock().recyclable.drain(..).collect();
        self.shared
            .storage
            .remove_segments(&kept)
            .map_err(|e| JournalError::io(format!("remove kept segments {kept:?}"), e))
    }

    /// Writes what is staged, then stops the threads. Later appends fail with `Closed`.
    pub fn close(&self) {
        {
            let mut staging = self.shared.staging.lock();
            if matches!(staging.state, State::Open) {
                staging.state = State::Closing;
            }
        }
        self.shared.data_ready.notify_all();
        self.shared.prep.lock().shutdown = true;
        self.shared.prep_changed.notify_all();
        let threads: Vec<JoinHandle<()>> = self.threads.lock().drain(..).collect();
        let me = std::thread::current().id();
        if threads.iter().any(|thread| thread.thread().id() == me) {
            // Let go inside a completion, on one of its own threads (the last owner of a store
            // dropped there): joining would wait on this very thread (the writer sets what the
            // completer waits for), or panic joining itself. They end by themselves once the
            // completion returns: what is staged is written, as above.
            return;
        }
        for thread in threads {
            let _ = thread.join();
        }
    }

    fn reader(&self, seq: u64) -> Result<SegmentReader, JournalError> {
        self.shared.readers.read().get(&seq).cloned().ok_or(JournalError::Released { segment: seq })
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

/// Idle read buffers kept for reuse (see `read_pool`).
const READ_POOL_IDLE_BYTES: usize = 64 << 20;

/// Read handles of one segment.
#[derive(Clone)]
struct SegmentReader {
    /// Through the page cache: scans and the fallback.
    file: Arc<dyn SegmentFile>,
    /// `O_DIRECT`, when the journal writes direct and the file system allows it.
    direct: Option<Arc<dyn SegmentFile>>,
}

fn open_read(storage: &dyn Storage, seq: u64, direct: bool) -> Result<SegmentReader, JournalError> {
    let context = |e| JournalError::io(format!("open segment {seq}"), e);
    let file = storage.open_segment_for_read(seq).map_err(context)?;
    let direct =
        if direct { storage.open_segment_for_direct_read(seq).map_err(context)? } else { None };
    Ok(SegmentReader { file, direct })
}

/// Reads into `buf` at `offset` until it is full or the file ends, and at least `needed` bytes
/// (`UnexpectedEof` otherwise). Returns the bytes read.
fn read_at_least(
    file: &dyn SegmentFile,
    buf: &mut [u8],
    offset: u64,
    needed: usize,
) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    if done < needed {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(done)
}

/// Zeroes the bytes of a torn write after `valid_end`, durably, so that no later scan can
/// mistake them for records. Returns how many bytes were discarded.
fn zero_torn_tail(storage: &dyn Storage, seq: u64, valid_end: u64) -> Result<u64, JournalError> {
    let context = || format!("zero torn tail of segment {seq}");
    let file = storage
        .open_segment_for_write(seq, WriteMode { direct_io: false, dsync: false })
        .map_err(|e| JournalError::io(context(), e))?;
    let torn = torn_bytes_after(&*file, valid_end).map_err(|e| JournalError::io(context(), e))?;
    write_all_at(&*file, &vec![0u8; torn as usize], valid_end)
        .map_err(|e| JournalError::io(context(), e))?;
    file.sync_data().map_err(|e| JournalError::io(context(), e))?;
    tracing::warn!(
        segment = seq,
        valid_end,
        discarded_bytes = torn,
        "journal tail was torn; discarded"
    );
    Ok(torn)
}

/// Gives the part of segment `seq` after `valid_end` back to the file system: the segment
/// written last before a restart, which the writer will not write again (it starts a new one),
/// so each restart otherwise left up to a segment of zeros (or stale records) on the disk.
/// Truncated to whole blocks, so aligned reads of the last records stay inside the file; such
/// a segment is never reused for writing (the preparer reuses full-size ones only). Best
/// effort: where truncation fails the space is only kept. Returns the bytes freed.
fn free_unwritten_tail(storage: &dyn Storage, seq: u64, valid_end: u64) -> u64 {
    let keep = valid_end.next_multiple_of(BLOCK_SIZE as u64);
    let truncated = storage
        .open_segment_for_write(seq, WriteMode { direct_io: false, dsync: false })
        .and_then(|file| match file.len()? {
            len if len > keep => file.truncate(keep).map(|()| len - keep),
            _ => Ok(0),
        });
    match truncated {
        Ok(freed) => freed,
        Err(e) => {
            tracing::warn!(segment = seq, error = %e, "could not free the unwritten tail of the last segment");
            0
        }
    }
}

/// Pads a group to a block boundary; returns where the next group starts.
fn close_group(group: &mut Group) -> (u64, u64) {
    assert!(!group.closed);
    pad_to_block(&mut group.buf, segment_tag(group.seq));
    group.closed = true;
    (group.seq, group.offset + group.buf.len() as u64)
}

/// Waits for the oldest group, closing it if it is still open. None when closing and drained.
/// Marks the group taken as being written (`Staging::writing`).
fn take_group(shared: &Shared) -> Option<Group> {
    let mut staging = shared.staging.lock();
    loop {
        if staging.writing {
            // A caller is writing a group (`Journal::commit`); it wakes this thread after.
            shared.data_ready.wait(&mut staging);
            continue;
        }
        if let Some(front) = staging.groups.front() {
            if !front.closed {
                if let Some(max_wait) = shared.config.max_wait {
                    let deadline = front.opened_at + max_wait;
                    let closing = matches!(staging.state, State::Closing);
                    if !closing && shared.clock.now() < deadline {
                        shared.data_ready.wait_until(&mut staging, deadline);
                        continue;
                    }
                }
                let front = staging.groups.front_mut().expect("checked above");
                let (seq, end) = close_group(front);
                (staging.next_seq, staging.next_offset) = (seq, end);
            }
            staging.writing = true;
            return staging.groups.pop_front();
        }
        if !matches!(staging.state, State::Open) {
            return None;
        }
        shared.data_ready.wait(&mut staging);
    }
}

/// A segment's write handles (see `Active`).
struct SegmentWriters {
    file: Arc<dyn SegmentFile>,
    small_file: Arc<dyn SegmentFile>,
    lone_file: Option<Arc<dyn SegmentFile>>,
}

struct Active {
    seq: u64,
    /// For groups of at least `direct_io_min_group_bytes` (O_DIRECT when configured).
    file: Arc<dyn SegmentFile>,
    /// For smaller groups: through the page cache, one copy into a page is cheaper than a
    /// device round trip for the write itself.
    small_file: Arc<dyn SegmentFile>,
    /// With `Fdatasync` and `direct_io`, for a group of at most `INLINE_MAX_WAITERS` records
    /// (a lone appender's): `O_DIRECT | O_DSYNC`, durable when the write returns, with no
    /// flush call of its own.
    lone_file: Option<Arc<dyn SegmentFile>>,
    end: u64,
}

fn writer_loop(shared: &Shared) {
    while let Some(group) = take_group(shared) {
        let go_on = write_group(shared, group);
        shared.staging.lock().writing = false;
        if !go_on {
            break;
        }
    }
    shared.staging.lock().writer_stopped = true;
    if let Some(last) = shared.active.lock().take() {
        report(shared, Outcome::Sealed(SealedSegment { seq: last.seq, len: last.end }));
    }
    shared.completed.lock().writer_done = true;
    shared.completed_ready.notify_one();
}

/// Writes and flushes one group taken by `take_group` or `Journal::commit` (the caller holds
/// `Staging::writing`), then completes or reports its waiters. False when the journal stopped
/// (failed, or closed while waiting for a segment).
fn write_group(shared: &Shared, mut group: Group) -> bool {
    let mut active = shared.active.lock();
    if active.as_ref().map(|a| a.seq) != Some(group.seq) {
        let mode = WriteMode {
            direct_io: shared.config.direct_io,
            dsync: shared.config.sync_mode == SyncMode::Dsync,
        };
        match switch_segment(shared, group.seq, mode) {
            Ok(SegmentWriters { file, small_file, lone_file }) => {
                if let Some(old) = active.take() {
                    let sealed = SealedSegment { seq: old.seq, len: old.end };
                    report(shared, Outcome::Sealed(sealed));
                }
                *active = Some(Active { seq: group.seq, file, small_file, lone_file, end: 0 });
            }
            Err(JournalError::DiskFull(why)) => {
                fail_queued_for_disk_full(shared, &mut group, why);
                return true;
            }
            Err(error) => {
                fail_everything(shared, group, error);
                return false;
            }
        }
    }
    let segment = active.as_mut().expect("segment opened above");
    assert_eq!(group.offset % crate::record::BLOCK_SIZE as u64, 0);
    assert!(group.offset >= segment.end, "groups are written in order");
    let lone = segment.lone_file.as_ref().filter(|_| group.waiters.len() <= INLINE_MAX_WAITERS);
    let file = match lone {
        Some(file) => file,
        None if group.buf.len() < shared.config.direct_io_min_group_bytes => &segment.small_file,
        None => &segment.file,
    };
    let started = shared.clock.now();
    let result = write_all_at(&**file, group.buf.as_slice(), group.offset)
        .map_err(|e| format!("write to segment {}: {e}", group.seq))
        .and_then(|()| match shared.config.sync_mode {
            SyncMode::Fdatasync if lone.is_some() => {
                // Durable already (O_DSYNC): the histogram gets the durable write's time.
                let took = shared.clock.now().saturating_duration_since(started);
                shared.stats.fsync_us.record_duration_us(took);
                Ok(())
            }
            SyncMode::Fdatasync => {
                let started = shared.clock.now();
                let synced = file
                    .sync_data()
                    .map_err(|e| format!("fdatasync of segment {}: {e}", group.seq));
                let took = shared.clock.now().saturating_duration_since(started);
                shared.stats.fsync_us.record_duration_us(took);
                synced
            }
            SyncMode::Dsync | SyncMode::None => Ok(()),
        });
    if let Err(why) = result {
        tracing::error!(%why, "journal write failed; refusing further appends");
        fail_everything(shared, group, JournalError::Failed(why.into()));
        return false;
    }
    segment.end = group.offset + group.buf.len() as u64;
    let stats = &shared.stats;
    stats.groups.fetch_add(1, Ordering::Relaxed);
    stats.records.fetch_add(group.waiters.len() as u64, Ordering::Relaxed);
    stats.bytes.fetch_add(group.buf.len() as u64, Ordering::Relaxed);
    let waiters = std::mem::take(&mut group.waiters);
    let (seq, offset) = (group.seq, group.offset);
    complete_or_report(shared, Outcome::Flushed { seq, offset, waiters });
    recycle_buffer(shared, group.buf);
    true
}

/// Tells waiters of finished groups, in group order, so that the writer can start the next
/// write and flush while this thread wakes the appenders of the previous group.
fn completer_loop(shared: &Shared) {
    loop {
        {
            let mut completed = shared.completed.lock();
            while completed.outcomes.is_empty() && !completed.writer_done {
                shared.completed_ready.wait(&mut completed);
            }
            if completed.outcomes.is_empty() {
                return;
            }
        }
        // `completing` first, then the outcomes (the writer's lock order): whenever this
        // thread holds outcomes it holds `completing`, so the writer's inline completion (a
        // successful try_lock and an empty queue) never runs a newer group's waiters before an
        // older group's. Draining first and locking after let it, and a ledger's entries then
        // completed out of order (its "entries complete in order" assertion fired under load).
        let _running = shared.completing.lock();
        let batch: Vec<Outcome> = shared.completed.lock().outcomes.drain(..).collect();
        assert!(!batch.is_empty(), "only this thread takes outcomes off the queue");
        for outcome in batch {
            match outcome {
                Outcome::Flushed { seq, offset, waiters } => {
                    for (waiter, at, len) in waiters {
                        let offset = offset + u64::from(at);
                        waiter(Ok(RecordLocation { segment: seq, offset, len }));
                    }
                }
                Outcome::Failed { error, waiters } => {
                    for (waiter, _, _) in waiters {
                        waiter(Err(error.clone()));
                    }
                }
                Outcome::Sealed(sealed) => notify_sealed(shared, sealed),
            }
        }
        completions_done(shared);
    }
}

fn completions_done(shared: &Shared) {
    if let Some(hook) = shared.completions_hook.get() {
        hook();
    }
}

/// Groups with at most this many waiters (a lone appender's, or a few) are latency's case:
/// completed on the writer thread when the completer is idle (one thread hop less), written by
/// a caller of `Journal::commit` when no write is in progress, and written through the
/// `O_DIRECT | O_DSYNC` handle (`Active::lone_file`).
const INLINE_MAX_WAITERS: usize = 4;

fn complete_or_report(shared: &Shared, outcome: Outcome) {
    if let Outcome::Flushed { seq, offset, waiters } = &outcome {
        if waiters.len() <= INLINE_MAX_WAITERS {
            // Idle completer: nothing queued and nothing running (the queue is checked while
            // holding `completing`, so an outcome taken by the completer has finished).
            if let Some(running) = shared.completing.try_lock() {
                if shared.completed.lock().outcomes.is_empty() {
                    let (seq, offset) = (*seq, *offset);
                    let Outcome::Flushed { waiters, .. } = outcome else { unreachable!() };
                    for (waiter, at, len) in waiters {
                        let offset = offset + u64::from(at);
                        waiter(Ok(RecordLocation { segment: seq, offset, len }));
                    }
                    completions_done(shared);
                    drop(running);
                    return;
                }
            }
        }
    }
    report(shared, outcome);
}

fn report(shared: &Shared, outcome: Outcome) {
    shared.completed.lock().outcomes.push_back(outcome);
    shared.completed_ready.notify_one();
}

fn notify_sealed(shared: &Shared, sealed: SealedSegment) {
    if let Some(hook) = shared.sealed_hook.lock().as_mut() {
        hook(sealed);
    }
}

fn recycle_buffer(shared: &Shared, mut buf: AlignedBuf) {
    buf.clear();
    let mut staging = shared.staging.lock();
    if staging.spare_buffers.len() < 4 && buf.capacity() <= shared.config.max_group_bytes * 2 {
        staging.spare_buffers.push(buf);
    }
}

/// Makes segment `seq` ready (from the preparer) and opens it for writing and reading.
fn switch_segment(
    shared: &Shared,
    seq: u64,
    mode: WriteMode,
) -> Result<SegmentWriters, JournalError> {
    {
        let mut prep = shared.prep.lock();
        loop {
            if prep.ready == Some(seq) {
                prep.ready = None;
                break;
            }
            if let Some((failed_seq, error)) = prep.failed.take() {
                if failed_seq == seq {
                    return Err(error);
                }
            }
            if prep.requested.is_none() && prep.ready.is_none() {
                prep.requested = Some(seq);
                shared.prep_changed.notify_all();
            }
            if prep.shutdown {
                return Err(JournalError::Closed);
            }
            shared.prep_changed.wait(&mut prep);
        }
        prep.requested = Some(seq + 1);
        shared.prep_changed.notify_all();
    }
    let storage = &shared.storage;
    let open = |mode| {
        storage
            .open_segment_for_write(seq, mode)
            .map_err(|e| JournalError::Failed(format!("open segment {seq}: {e}").into()))
    };
    let file = open(mode)?;
    // With `O_DSYNC` a small group goes direct too: one direct durable write beat a page-cache
    // write + fdatasync for a lone 4 KiB group on this disk (ARCHITECTURE, "Sync mode").
    let small_file = if mode.direct_io && !mode.dsync {
        open(WriteMode { direct_io: false, ..mode })?
    } else {
        file.clone()
    };
    // Measured on this machine's disk (ARCHITECTURE, "Lone groups"): a 4 KiB O_DIRECT|O_DSYNC
    // write p50 0.087 ms against 0.100 for a page-cache write + fdatasync, and 0.117 against
    // 0.135-0.151 for two processes doing it at once (two storage nodes on one disk); groups of
    // many small records stay on the page cache path, which had 20% more throughput.
    let lone_file =
        if mode.direct_io && !mode.dsync && shared.config.sync_mode == SyncMode::Fdatasync {
            Some(open(WriteMode { direct_io: true, dsync: true })?)
        } else {
            None
        };
    let reader = open_read(&**storage, seq, shared.config.direct_io)?;
    shared.readers.write().insert(seq, reader);
    Ok(SegmentWriters { file, small_file, lone_file })
}

fn segment_len(storage: &dyn Storage, seq: u64) -> Option<u64> {
    storage.open_segment_for_read(seq).and_then(|file| file.len()).ok()
}

fn preparer_loop(shared: &Shared) {
    // Attempts in a row that found no space: with the disk full every append retries, so only
    // the first is a warning.
    let mut out_of_space = 0u64;
    loop {
        let (seq, recycled) = {
            let mut prep = shared.prep.lock();
            loop {
                if prep.shutdown {
                    return;
                }
                if let (Some(seq), None) = (prep.requested, prep.ready) {
                    break (seq, prep.recyclable.pop_front());
                }
                shared.prep_changed.wait(&mut prep);
            }
        };
        let storage = &shared.storage;
        let size = shared.config.segment_size_bytes;
        let result = match recycled {
            Some(old) if segment_len(&**storage, old) == Some(size) => {
                storage.recycle_segment(old, seq).or_else(|_| storage.create_segment(seq, size))
            }
            Some(old) => {
                // Truncated at a restart (or written under another segment size): writing into
                // it would grow the file, a metadata change every fdatasync would then commit.
                if let Err(e) = storage.remove_segments(&[old]) {
                    tracing::warn!(segment = old, error = %e, "could not remove a short segment");
                }
                storage.create_segment(seq, size)
            }
            None => storage.create_segment(seq, size),
        };
        let result = match result {
            Err(e) if is_out_of_space(&e) && space_freed(shared) => {
                storage.create_segment(seq, size)
            }
            other => other,
        };
        let mut prep = shared.prep.lock();
        prep.requested = None;
        match result {
            Ok(()) => {
                if out_of_space > 0 {
                    tracing::info!(segment = seq, failed_attempts = out_of_space, "space again");
                    out_of_space = 0;
                }
                prep.ready = Some(seq);
            }
            Err(e) if is_out_of_space(&e) => {
                out_of_space += 1;
                if out_of_space == 1 {
                    tracing::warn!(segment = seq, "no space for a new journal segment");
                } else {
                    tracing::debug!(segment = seq, "still no space for a new journal segment");
                }
                prep.failed = Some((seq, JournalError::DiskFull(e.to_string().into())));
            }
            Err(e) => {
                prep.failed =
                    Some((seq, JournalError::Failed(format!("prepare segment {seq}: {e}").into())));
            }
        }
        shared.prep_changed.notify_all();
    }
}

/// Asks the out-of-space hook, if any, to free space.
fn space_freed(shared: &Shared) -> bool {
    shared.out_of_space_hook.get().is_some_and(|hook| hook())
}

/// No segment could be prepared for `group`: fail it and every group queued behind it (they all
/// belong to that segment or later ones), and restart staging at that segment's beginning, so
/// that no gap is ever left inside a segment.
fn fail_queued_for_disk_full(shared: &Shared, group: &mut Group, why: Arc<str>) {
    let error = JournalError::DiskFull(why);
    let mut waiters: Vec<_> = group.waiters.drain(..).collect();
    {
        let mut staging = shared.staging.lock();
        for mut queued in staging.groups.drain(..) {
            waiters.append(&mut queued.waiters);
        }
        staging.next_seq = group.seq;
        staging.next_offset = 0;
    }
    report(shared, Outcome::Failed { error, waiters });
}

/// A write or flush failed: fail everything pending and refuse all later appends.
fn fail_everything(shared: &Shared, group: Group, error: JournalError) {
    let mut waiters = group.waiters;
    {
        let mut staging = shared.staging.lock();
        staging.state = State::Failed(error.clone());
        for mut queued in staging.groups.drain(..) {
            waiters.append(&mut queued.waiters);
        }
    }
    report(shared, Outcome::Failed { error, waiters });
}
