//! Journal configuration: every knob with its default and the reason for it.

use crate::error::JournalError;
use crate::record::{BLOCK_SIZE, HEADER_LEN};
use std::time::Duration;

/// How a group is made durable before its appends are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// One `fdatasync` per group (default), except that with `direct_io` a group of at most
    /// four records is written `O_DIRECT | O_DSYNC` (durable in one call): each the cheapest
    /// for its group size on this disk (ARCHITECTURE.md, "Lone groups").
    Fdatasync,
    /// Segments opened with `O_DSYNC`: the write itself returns once durable.
    Dsync,
    /// No flush at all. Acknowledged data may be lost on power failure: tests and benchmarks only.
    None,
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fdatasync" => Ok(SyncMode::Fdatasync),
            "dsync" | "o_dsync" => Ok(SyncMode::Dsync),
            "none" => Ok(SyncMode::None),
            other => Err(format!("unknown sync mode {other:?} (fdatasync, dsync, none)")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Size of each preallocated segment file. Recovery replays at most the segments written
    /// since the last checkpoint, and a checkpoint follows each segment, so this bounds restart
    /// work. Default 64 MiB (about 0.1 s to scan from page cache).
    pub segment_size_bytes: u64,
    /// Most bytes one group (one write and one flush) may carry. Default 8 MiB: a group of
    /// 256 appends of 16 KiB (the widest benchmark) fits in one.
    pub max_group_bytes: usize,
    /// How long the writer may wait for a group to fill after its first record. Default none:
    /// flush as soon as the writer is idle, so that a lone append pays no timer.
    pub max_wait: Option<Duration>,
    pub sync_mode: SyncMode,
    /// Write segments with `O_DIRECT` from the journal's own aligned buffers. Default on: it
    /// doubled large-entry bandwidth and raised small-entry throughput by half on this machine
    /// (ARCHITECTURE.md, "Direct I/O"). Falls back to buffered writes where the file system
    /// refuses `O_DIRECT` (tmpfs).
    pub direct_io: bool,
    /// With `direct_io` and `Fdatasync`, groups smaller than this still go through the page
    /// cache: copying a few KiB into it costs less than the extra device round trip of a direct
    /// write, which matters for a lone appender's latency. Default 64 KiB. (With `Dsync` every
    /// group is written direct: there the durable direct write is the one round trip.)
    pub direct_io_min_group_bytes: usize,
    /// Freed segment files kept for reuse (rename instead of zero-filling a new one). Default 1.
    pub recycled_segments_kept: usize,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            segment_size_bytes: 64 << 20,
            max_group_bytes: 8 << 20,
            max_wait: None,
            sync_mode: SyncMode::Fdatasync,
            direct_io: true,
            direct_io_min_group_bytes: 64 << 10,
            recycled_segments_kept: 1,
        }
    }
}

impl JournalConfig {
    /// Largest payload of one record.
    pub fn max_payload_bytes(&self) -> usize {
        self.max_group_bytes - HEADER_LEN - BLOCK_SIZE
    }

    pub fn validate(&self) -> Result<(), JournalError> {
        let fail = |why: String| Err(JournalError::Config(why));
        if !self.max_group_bytes.is_multiple_of(BLOCK_SIZE)
            || self.max_group_bytes < 16 * BLOCK_SIZE
        {
            return fail(format!(
                "max_group_bytes ({}) must be a multiple of {BLOCK_SIZE} and at least 64 KiB",
                self.max_group_bytes
            ));
        }
        if !self.segment_size_bytes.is_multiple_of(BLOCK_SIZE as u64)
            || self.segment_size_bytes < 2 * self.max_group_bytes as u64
            || self.segment_size_bytes > u32::MAX as u64
        {
            return fail(format!(
                "segment_size_bytes ({}) must be a multiple of {BLOCK_SIZE}, at least twice \
                 max_group_bytes and below 4 GiB",
                self.segment_size_bytes
            ));
        }
        if self.max_wait.is_some_and(|w| w > Duration::from_secs(1)) {
            return fail("max_wait above one second would stall every append".into());
        }
        Ok(())
    }
}
