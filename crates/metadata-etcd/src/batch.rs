//! Concurrent reads and compare-and-set writes coalesced into one etcd request each.
//!
//! A new owner loading thousands of topics at once makes thousands of small requests, and on
//! etcd every request is a gRPC call, a round of its consensus (a write, or a linearizable
//! read's read index) and an HTTP/2 stream on both sides: per request, not per key. So reads
//! and persistent writes queue here, and at most [`MAX_RUNNERS`] requests of each kind are in
//! flight; whatever queued meanwhile goes together in the next one. A lone operation goes out
//! at once, as the request it always was; only operations that would have waited anyway are
//! combined.
//!
//! - Reads: the gets of several callers become one read-only transaction (one snapshot, which
//!   each caller's own gets had anyway).
//! - Writes: each compare-and-set becomes a transaction nested in one outer transaction with no
//!   condition of its own, so each keeps its own compare and its own outcome (one failed
//!   compare fails that operation only). etcd refuses a transaction that writes one key twice,
//!   so two writes of a key never share a request: the later ones go at the same time, each
//!   alone (a hot key's compare-and-set writers race as they did before, instead of taking
//!   turns one request each: 100 writers of one counter fell from hundreds of acknowledged
//!   writes per second to a few that way).
//!   Writes bound to a session's lease are never combined: a lease etcd no longer knows fails
//!   the whole transaction, and the other callers' writes with it.
//!
//! Invariants: an operation whose caller stopped waiting before its request left is dropped,
//! never sent (so only a request that left can have an unknown outcome); each caller gets the
//! outcome of its own operation only; a request holds at most [`MAX_BATCH_OPS`] operations and
//! [`MAX_BATCH_VALUE_BYTES`] of values (etcd's `--max-txn-ops` and `--max-request-bytes`).

use std::collections::{BTreeSet, VecDeque};

use bytes::Bytes;
use etcd_client::Compare;
use magnetar_metadata::{ExpectedVersion, Result, Versioned};
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Requests of one kind in flight at once: enough that etcd's own batching of concurrent
/// proposals still has company, few enough that a burst forms batches.
pub(crate) const MAX_RUNNERS: usize = 4;

/// Operations in one request: the gets of a read transaction, or the nested transactions of a
/// write (etcd's default `--max-txn-ops` is 128, and a nested transaction's operations count
/// against what the outer one leaves).
pub(crate) const MAX_BATCH_OPS: usize = 64;

/// Value bytes in one write request (etcd's default `--max-request-bytes` is 1.5 MiB).
pub(crate) const MAX_BATCH_VALUE_BYTES: usize = 512 << 10;

/// A write with a larger value goes alone.
pub(crate) const MAX_BATCHED_VALUE: usize = 64 << 10;

/// One caller's gets (etcd keys, root included).
pub(crate) struct Read {
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) reply: oneshot::Sender<Result<Vec<Option<Versioned>>>>,
}

/// One caller's persistent compare-and-set put.
pub(crate) struct Write {
    /// The metadata key (for errors) and the etcd key.
    pub(crate) key: String,
    pub(crate) full: String,
    pub(crate) value: Bytes,
    pub(crate) expected: ExpectedVersion,
    pub(crate) compare: Option<Compare>,
    /// The new version and the revision of the write.
    pub(crate) reply: oneshot::Sender<Result<(u64, i64)>>,
}

/// What a runner sends next: `together` in one request, each of `alone` in a request of its
/// own, all at the same time.
pub(crate) struct Taken<T> {
    pub(crate) together: Vec<T>,
    pub(crate) alone: Vec<T>,
}

/// Operations waiting for a request, and how many requests are in flight.
pub(crate) struct Queue<T> {
    state: Mutex<QueueState<T>>,
}

struct QueueState<T> {
    pending: VecDeque<T>,
    runners: usize,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue { state: Mutex::new(QueueState { pending: VecDeque::new(), runners: 0 }) }
    }
}

impl<T> Queue<T> {
    /// Queues `op`. True when the caller is to start a runner (fewer than [`MAX_RUNNERS`] run);
    /// that runner then takes batches until the queue is empty.
    pub(crate) fn push(&self, op: T) -> bool {
        let mut state = self.state.lock();
        state.pending.push_back(op);
        if state.runners < MAX_RUNNERS {
            state.runners += 1;
            true
        } else {
            false
        }
    }

    /// A runner's next batch, chosen by `take`; `None` when nothing is left (the runner ends).
    pub(crate) fn next(&self, take: impl FnOnce(&mut VecDeque<T>) -> Taken<T>) -> Option<Taken<T>> {
        let mut state = self.state.lock();
        let batch = take(&mut state.pending);
        if batch.together.is_empty() && batch.alone.is_empty() {
            assert!(state.pending.is_empty(), "a batch is taken while anything waits");
            state.runners -= 1;
            return None;
        }
        Some(batch)
    }
}

/// The next read batch: callers in order while their gets fit one transaction. Callers that
/// stopped waiting are dropped.
pub(crate) fn take_reads(pending: &mut VecDeque<Read>) -> Taken<Read> {
    let mut batch = Vec::new();
    let mut keys = 0;
    while let Some(read) = pending.front() {
        if read.reply.is_closed() {
            pending.pop_front();
            continue;
        }
        if !batch.is_empty() && keys + read.keys.len() > MAX_BATCH_OPS {
            break;
        }
        keys += read.keys.len();
        batch.extend(pending.pop_front());
    }
    Taken { together: batch, alone: Vec::new() }
}

/// The next write batch: writes in order while they fit one request; one of a key the batch
/// writes already goes alone. Writes whose callers stopped waiting are dropped.
pub(crate) fn take_writes(pending: &mut VecDeque<Write>) -> Taken<Write> {
    let mut batch = Vec::new();
    let mut alone = Vec::new();
    let mut keys = BTreeSet::new();
    let mut bytes = 0;
    while let Some(write) = pending.pop_front() {
        if write.reply.is_closed() {
            continue;
        }
        let fits = batch.len() < MAX_BATCH_OPS
            && (batch.is_empty() || bytes + write.value.len() <= MAX_BATCH_VALUE_BYTES);
        if !fits {
            pending.push_front(write); // the next batch's first
            break;
        }
        if !keys.insert(write.full.clone()) {
            alone.push(write);
            continue;
        }
        bytes += write.value.len();
        batch.push(write);
    }
    Taken { together: batch, alone }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &str, len: usize) -> (Write, oneshot::Receiver<Result<(u64, i64)>>) {
        let (reply, receiver) = oneshot::channel();
        let op = Write {
            key: key.to_string(),
            full: format!("/root{key}"),
            value: Bytes::from(vec![0u8; len]),
            expected: ExpectedVersion::Any,
            compare: None,
            reply,
        };
        (op, receiver)
    }

    fn read(keys: usize) -> (Read, oneshot::Receiver<Result<Vec<Option<Versioned>>>>) {
        let (reply, receiver) = oneshot::channel();
        (Read { keys: vec![b"/k".to_vec(); keys], reply }, receiver)
    }

    #[test]
    fn a_key_written_twice_in_a_batch_goes_alone_at_the_same_time() {
        let mut pending = VecDeque::new();
        let mut receivers = Vec::new();
        for key in ["/a", "/b", "/a", "/c", "/a"] {
            let (op, receiver) = write(key, 10);
            pending.push_back(op);
            receivers.push(receiver);
        }
        let keys = |batch: &[Write]| batch.iter().map(|w| w.key.clone()).collect::<Vec<_>>();
        let taken = take_writes(&mut pending);
        assert_eq!(keys(&taken.together), ["/a", "/b", "/c"]);
        assert_eq!(keys(&taken.alone), ["/a", "/a"]);
        assert!(pending.is_empty());
    }

    #[test]
    fn write_batches_are_bounded_by_count_and_bytes_and_a_big_value_goes_alone() {
        let mut pending = VecDeque::new();
        let mut receivers = Vec::new();
        for i in 0..(MAX_BATCH_OPS + 3) {
            let (op, receiver) = write(&format!("/k{i}"), 10);
            pending.push_back(op);
            receivers.push(receiver);
        }
        assert_eq!(take_writes(&mut pending).together.len(), MAX_BATCH_OPS);
        assert_eq!(take_writes(&mut pending).together.len(), 3);
        let per = MAX_BATCH_VALUE_BYTES / 3;
        for i in 0..4 {
            let (op, receiver) = write(&format!("/big{i}"), per);
            pending.push_back(op);
            receivers.push(receiver);
        }
        assert_eq!(take_writes(&mut pending).together.len(), 3, "a fourth passes the bound");
        assert_eq!(take_writes(&mut pending).together.len(), 1);
        let (op, _receiver) = write("/huge", MAX_BATCH_VALUE_BYTES * 2);
        pending.push_back(op);
        assert_eq!(take_writes(&mut pending).together.len(), 1, "alone, not refused");
    }

    #[test]
    fn operations_whose_callers_gave_up_are_never_sent() {
        let mut pending = VecDeque::new();
        let (gone, receiver) = write("/gone", 1);
        drop(receiver);
        pending.push_back(gone);
        let (kept, _receiver) = write("/kept", 1);
        pending.push_back(kept);
        let batch = take_writes(&mut pending).together;
        assert_eq!(batch.iter().map(|w| w.key.as_str()).collect::<Vec<_>>(), ["/kept"]);

        let mut reads = VecDeque::new();
        let (gone, receiver) = read(1);
        drop(receiver);
        reads.push_back(gone);
        assert!(take_reads(&mut reads).together.is_empty());
        assert!(reads.is_empty());
    }

    #[test]
    fn read_batches_fill_one_transaction_and_a_large_caller_goes_alone() {
        let mut pending = VecDeque::new();
        let mut receivers = Vec::new();
        for keys in [30, 30, 10, MAX_BATCH_OPS * 2, 1] {
            let (op, receiver) = read(keys);
            pending.push_back(op);
            receivers.push(receiver);
        }
        let sizes =
            |batch: Taken<Read>| batch.together.iter().map(|r| r.keys.len()).collect::<Vec<_>>();
        assert_eq!(sizes(take_reads(&mut pending)), [30, 30]);
        assert_eq!(sizes(take_reads(&mut pending)), [10]);
        assert_eq!(sizes(take_reads(&mut pending)), [MAX_BATCH_OPS * 2]);
        assert_eq!(sizes(take_reads(&mut pending)), [1]);
    }

    #[test]
    fn a_runner_is_started_only_below_the_limit_and_ends_when_the_queue_is_empty() {
        let queue: Queue<u32> = Queue::default();
        let started: Vec<bool> = (0..MAX_RUNNERS as u32 + 2).map(|i| queue.push(i)).collect();
        assert_eq!(started.iter().filter(|s| **s).count(), MAX_RUNNERS);
        let take_two = |p: &mut VecDeque<u32>| Taken {
            together: p.drain(..p.len().min(2)).collect(),
            alone: Vec::new(),
        };
        let mut taken = 0;
        while let Some(batch) = queue.next(take_two) {
            taken += batch.together.len();
        }
        assert_eq!(taken, MAX_RUNNERS + 2);
        // One runner ended; the others end on their next call.
        for _ in 1..MAX_RUNNERS {
            assert!(queue.next(take_two).is_none());
        }
        assert!(queue.push(9), "no runner left: the next operation starts one");
    }
}
