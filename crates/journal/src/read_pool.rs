//! Recycled block-aligned buffers for journal reads.
//!
//! `O_DIRECT` reads need aligned memory; and on the VMs we measure on, touching memory the
//! process has not touched before costs more than the read itself (a fresh 1 MiB buffer per
//! read tripled the CPU of a backlog drain). So read spans land in buffers that come back here
//! when the last `Bytes` slicing them is dropped, and are handed out again.

use crate::aligned::AlignedBuf;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Smallest buffer handed out: one block (what `O_DIRECT` needs). It was 64 KiB, so that small
/// reads shared a class; but a topic load reads a few small entries per ledger (deduplication
/// replay), and 20,000 concurrent loads churned 64 KiB per read through the allocator: glibc
/// kept the freed buffers (its mmap threshold rises once a large block is freed), and RSS after
/// a restart grew with every ledger a topic had (1.5 GB for 20,000 topics of 4 ledgers). Sized
/// to the read, the same loads kept 224 MB (docs/benchmarks.md, "Topic load rate").
const MIN_CLASS: usize = crate::record::BLOCK_SIZE;

/// A pool of aligned buffers in power-of-two size classes. Cloning shares the pool.
#[derive(Clone)]
pub struct ReadPool {
    inner: Arc<Mutex<Free>>,
}

struct Free {
    /// Idle buffers by capacity.
    buffers: BTreeMap<usize, Vec<AlignedBuf>>,
    idle_bytes: usize,
    /// Idle bytes kept at most; buffers returned beyond it are freed.
    limit: usize,
}

impl ReadPool {
    /// A pool that keeps at most `limit` bytes of idle buffers.
    pub fn new(limit: usize) -> Self {
        ReadPool {
            inner: Arc::new(Mutex::new(Free { buffers: BTreeMap::new(), idle_bytes: 0, limit })),
        }
    }

    /// A buffer of at least `len` bytes (block-aligned start, zeroed when new).
    pub fn take(&self, len: usize) -> AlignedBuf {
        let class = len.max(MIN_CLASS).next_power_of_two();
        let mut free = self.inner.lock();
        if let Some(buf) = free.buffers.get_mut(&class).and_then(Vec::pop) {
            free.idle_bytes -= class;
            return buf;
        }
        drop(free);
        AlignedBuf::with_capacity(class)
    }

    /// Freezes the first `len` bytes of `buf` into `Bytes`; the buffer returns to the pool
    /// when the last slice of it is dropped.
    pub fn freeze(&self, buf: AlignedBuf, len: usize) -> Bytes {
        assert!(len <= buf.capacity(), "frozen length within the buffer");
        Bytes::from_owner(Pooled { buf: Some(buf), len, pool: self.clone() })
    }

    fn give_back(&self, buf: AlignedBuf) {
        let class = buf.capacity();
        let mut free = self.inner.lock();
        if !class.is_power_of_two() || free.idle_bytes + class > free.limit {
            return;
        }
        free.idle_bytes += class;
        free.buffers.entry(class).or_default().push(buf);
    }

    /// Bytes held by idle buffers.
    pub fn idle_bytes(&self) -> usize {
        self.inner.lock().idle_bytes
    }
}

struct Pooled {
    buf: Option<AlignedBuf>,
    len: usize,
    pool: ReadPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf.as_capacity_slice()[..self.len],
            None => &[],
        }
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give_back(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_slice_drops() {
        let pool = ReadPool::new(4 << 20);
        let mut buf = pool.take(100_000);
        assert_eq!(buf.capacity(), 128 << 10);
        let address = buf.as_capacity_slice().as_ptr() as usize;
        buf.as_capacity_slice_mut()[..3].copy_from_slice(b"abc");
        let bytes = pool.freeze(buf, 3);
        let slice = bytes.slice(1..3);
        drop(bytes);
        assert_eq!(pool.idle_bytes(), 0, "a slice still holds the buffer");
        assert_eq!(&slice[..], b"bc");
        drop(slice);
        assert_eq!(pool.idle_bytes(), 128 << 10);
        let again = pool.take(70_000);
        assert_eq!(again.as_capacity_slice().as_ptr() as usize, address, "the same buffer");
        assert_eq!(pool.idle_bytes(), 0);
    }

    #[test]
    fn idle_bytes_stay_under_the_limit() {
        let pool = ReadPool::new(256 << 10);
        let held: Vec<Bytes> = (0..4).map(|_| pool.freeze(pool.take(128 << 10), 1)).collect();
        drop(held);
        assert_eq!(pool.idle_bytes(), 256 << 10);
    }
}
