//! Reading a segment front to back: used by recovery, replay and checkpointing. The decisions
//! (where a record ends, whether it is valid) are `record::parse_at`; this file only feeds it
//! bytes from a [`SegmentFile`] in chunks.

use crate::record::{
    parse_at, segment_tag, EndReason, Parsed, RecordHeader, BLOCK_SIZE, HEADER_LEN,
};
use crate::storage::SegmentFile;
use std::io;

const CHUNK: usize = 1 << 20;

/// Where a record lives: segment, offset of its header, payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordLocation {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

/// How a scan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanEnd {
    /// Offset just past the last valid record or padding.
    pub valid_end: u64,
    /// Offset where the scan stopped (a header position, possibly after a block-tail gap).
    pub stop_offset: u64,
    pub reason: EndReason,
    pub records: u64,
}

/// Calls `visit` for every valid record of segment `seq`, in order, until the log ends.
pub fn scan_segment(
    file: &dyn SegmentFile,
    seq: u64,
    mut visit: impl FnMut(RecordHeader, RecordLocation, &[u8]),
) -> io::Result<ScanEnd> {
    let segment_len = file.len()? as usize;
    let tag = segment_tag(seq);
    let mut base = 0usize;
    let mut buf = read_chunk(file, 0, CHUNK.min(segment_len))?;
    let mut offset = 0usize;
    let mut records = 0;
    loop {
        match parse_at(&buf, base, offset, tag, segment_len) {
            Parsed::Record { header, header_offset, payload_len, next } => {
                let at = header_offset - base + HEADER_LEN;
                let location = RecordLocation {
                    segment: seq,
                    offset: header_offset as u64,
                    len: payload_len as u32,
                };
                visit(header, location, &buf[at..at + payload_len]);
                records += 1;
                offset = next;
            }
            Parsed::Padding { next } => offset = next,
            Parsed::NeedMore { from, need } => {
                let new_base = from - from % BLOCK_SIZE;
                let want = (from - new_base + need).max(CHUNK).min(segment_len - new_base);
                let chunk = read_chunk(file, new_base as u64, want)?;
                if new_base == base && chunk.len() <= buf.len() {
                    let end = ScanEnd {
                        valid_end: offset as u64,
                        stop_offset: from as u64,
                        reason: EndReason::EndOfSegment,
                        records,
                    };
                    return Ok(end);
                }
                base = new_base;
                buf = chunk;
            }
            Parsed::End { offset: stop, reason } => {
                let end =
                    ScanEnd { valid_end: offset as u64, stop_offset: stop as u64, reason, records };
                return Ok(end);
            }
        }
    }
}

fn read_chunk(file: &dyn SegmentFile, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Bytes after a torn tail at `stop` that belong to the failed write, counted up to the first
/// all-zero block (in a recycled segment file this may include older, stale blocks).
pub fn torn_bytes_after(file: &dyn SegmentFile, stop: u64) -> io::Result<u64> {
    let segment_len = file.len()?;
    let mut block = stop - stop % BLOCK_SIZE as u64;
    let mut buf = vec![0u8; BLOCK_SIZE];
    while block < segment_len {
        let n = file.read_at(&mut buf, block)?;
        if n == 0 || (block >= stop && buf[..n].iter().all(|&b| b == 0)) {
            break;
        }
        block += BLOCK_SIZE as u64;
    }
    Ok(block.max(stop) - stop)
}
