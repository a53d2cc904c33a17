//! On-disk record format of the journal. Pure functions, no I/O.
//!
//! A segment is a sequence of 4 KiB blocks. Every write (one group commit) starts on a block
//! boundary and is a whole number of blocks. Inside a group, records follow each other back to
//! back and may straddle blocks:
//!
//! ```text
//! offset  size  field
//!      0     4  crc32c      over bytes 4..32 of the header, then the payload (padding: header only)
//!      4     4  payload_len
//!      8     4  segment_tag low 32 bits of the segment's sequence number: a record left over in a
//!                           recycled segment file carries another tag and ends the scan
//!     12     1  kind        PADDING, or a kind chosen by the layer above (ledger entries, ...)
//!     13     3  reserved    zero
//!     16     8  ledger_id
//!     24     8  entry_id
//!     32     n  payload
//! ```
//!
//! A header never straddles a block: when fewer than `HEADER_LEN` bytes remain in a block, the
//! writer zero-fills them and the reader skips to the next block. The tail of a group is filled
//! with one PADDING record (or zeros when less than a header remains).
//! All integers are little-endian.

/// Size of a journal block; every write is aligned to it and a multiple of it.
pub const BLOCK_SIZE: usize = 4096;
/// Size of a record header.
pub const HEADER_LEN: usize = 32;
/// Kind reserved by the journal for the filler at the end of a group.
pub const KIND_PADDING: u8 = 0xFF;

const _: () = assert!(BLOCK_SIZE.is_multiple_of(HEADER_LEN));
const _: () = assert!(BLOCK_SIZE.is_power_of_two());

/// The identifying fields of a record, as given by the layer above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: u8,
    pub ledger_id: u64,
    pub entry_id: u64,
}

/// Bytes to skip before a header may start at `offset` (zero unless the block is nearly full).
pub fn header_gap(offset: usize) -> usize {
    let in_block = offset % BLOCK_SIZE;
    if BLOCK_SIZE - in_block < HEADER_LEN {
        BLOCK_SIZE - in_block
    } else {
        0
    }
}

/// Rounds `len` up to a whole number of blocks.
pub fn align_up(len: usize) -> usize {
    len.div_ceil(BLOCK_SIZE) * BLOCK_SIZE
}

/// The segment tag stored in every record.
pub fn segment_tag(segment_seq: u64) -> u32 {
    segment_seq as u32
}

fn header_bytes(tag: u32, header: RecordHeader, payload_len: u32) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[4..8].copy_from_slice(&payload_len.to_le_bytes());
    out[8..12].copy_from_slice(&tag.to_le_bytes());
    out[12] = header.kind;
    out[16..24].copy_from_slice(&header.ledger_id.to_le_bytes());
    out[24..32].copy_from_slice(&header.entry_id.to_le_bytes());
    out
}

/// Checksum of a record: header fields after the crc, then the payload.
pub fn record_crc(header_after_crc: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header_after_crc), payload)
}

/// A growable byte buffer records are encoded into (`Vec<u8>` or the journal's aligned buffer).
pub trait Sink {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn extend_from_slice(&mut self, bytes: &[u8]);
    /// Appends `count` zero bytes.
    fn extend_zeros(&mut self, count: usize);
}

impl Sink for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
    fn extend_zeros(&mut self, count: usize) {
        self.resize(Vec::len(self) + count, 0);
    }
}

/// Appends one record (preceded by a block-tail gap when needed) to `out`, whose length must be
/// the record's offset from a block-aligned origin. Returns the offset of the record header.
pub fn encode_record(out: &mut impl Sink, tag: u32, header: RecordHeader, payload: &[u8]) -> usize {
    assert_ne!(header.kind, KIND_PADDING, "padding is written by the journal only");
    let payload_len = u32::try_from(payload.len()).expect("payload length checked by caller");
    let crc_input = header_bytes(tag, header, payload_len);
    let crc = record_crc(&crc_input[4..], payload);
    out.extend_zeros(header_gap(out.len()));
    let start = out.len();
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&crc_input[4..]);
    out.extend_from_slice(payload);
    start
}

/// Fills `out` up to the next block boundary with padding. Returns the bytes added.
pub fn pad_to_block(out: &mut impl Sink, tag: u32) -> usize {
    let rem = (BLOCK_SIZE - out.len() % BLOCK_SIZE) % BLOCK_SIZE;
    if rem >= HEADER_LEN {
        let header = RecordHeader { kind: KIND_PADDING, ledger_id: 0, entry_id: 0 };
        let len = (rem - HEADER_LEN) as u32;
        let crc_input = header_bytes(tag, header, len);
        let crc = record_crc(&crc_input[4..], &[]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&crc_input[4..]);
        out.extend_zeros(rem - HEADER_LEN);
    } else {
        out.extend_zeros(rem);
    }
    rem
}

/// What lies at a position of a segment being scanned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A valid record: its header starts at the given offset (after any block-tail gap),
    /// its payload follows, and the next record may start at `next`.
    Record { header: RecordHeader, header_offset: usize, payload_len: usize, next: usize },
    /// Valid padding up to `next`.
    Padding { next: usize },
    /// The buffer ends before the record does: `need` bytes from `from` must be available.
    NeedMore { from: usize, need: usize },
    /// No valid record here: the end of the log in this segment (zeros, a torn or corrupt
    /// record, or a stale record of an earlier use of the file).
    End { offset: usize, reason: EndReason },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The header is all zeros: never written.
    Zeros,
    /// The header carries another segment's tag: left over from a recycled file.
    Stale,
    /// Length out of range or checksum mismatch: torn or corrupt.
    Invalid,
    /// The segment ends.
    EndOfSegment,
}

/// Parses the record at `offset` of `buf`, where `buf[0]` is at segment offset `base`
/// (a block boundary) and `segment_len` bounds every record. Never panics on any input.
pub fn parse_at(buf: &[u8], base: usize, offset: usize, tag: u32, segment_len: usize) -> Parsed {
    debug_assert_eq!(base % BLOCK_SIZE, 0);
    let start = offset + header_gap(offset);
    if start + HEADER_LEN > segment_len {
        return Parsed::End { offset, reason: EndReason::EndOfSegment };
    }
    let Some(rel) = start.checked_sub(base) else {
        return Parsed::NeedMore { from: start, need: HEADER_LEN };
    };
    let Some(head) = buf.get(rel..rel + HEADER_LEN) else {
        return Parsed::NeedMore { from: start, need: HEADER_LEN };
    };
    if head.iter().all(|&b| b == 0) {
        return Parsed::End { offset: start, reason: EndReason::Zeros };
    }
    let field =
        |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let word = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&head[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let (crc, payload_len, record_tag, kind) = (field(0), field(4) as usize, field(8), head[12]);
    if record_tag != tag {
        return Parsed::End { offset: start, reason: EndReason::Stale };
    }
    let end = start + HEADER_LEN + payload_len;
    if end > segment_len || head[13..16] != [0, 0, 0] {
        return Parsed::End { offset: start, reason: EndReason::Invalid };
    }
    if kind == KIND_PADDING {
        if record_crc(&head[4..], &[]) != crc || !end.is_multiple_of(BLOCK_SIZE) {
            return Parsed::End { offset: start, reason: EndReason::Invalid };
        }
        return Parsed::Padding { next: end };
    }
    let Some(payload) = buf.get(rel + HEADER_LEN..rel + HEADER_LEN + payload_len) else {
        return Parsed::NeedMore { from: start, need: HEADER_LEN + payload_len };
    };
    if record_crc(&head[4..], payload) != crc {
        return Parsed::End { offset: start, reason: EndReason::Invalid };
    }
    let header = RecordHeader { kind, ledger_id: word(16), entry_id: word(24) };
    Parsed::Record { header, header_offset: start, payload_len, next: end }
}

/// Verifies a record read back from disk at a known location; returns its payload range.
pub fn verify_record(
    buf: &[u8],
    tag: u32,
    expected: RecordHeader,
) -> Option<std::ops::Range<usize>> {
    match parse_at(buf, 0, 0, tag, buf.len()) {
        Parsed::Record { header, payload_len, .. } if header == expected => {
            Some(HEADER_LEN..HEADER_LEN + payload_len)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(entry: u64) -> RecordHeader {
        RecordHeader { kind: 1, ledger_id: 7, entry_id: entry }
    }

    fn parse_all(buf: &[u8], tag: u32) -> (Vec<(RecordHeader, Vec<u8>)>, Parsed) {
        let mut offset = 0;
        let mut out = Vec::new();
        loop {
            match parse_at(buf, 0, offset, tag, buf.len()) {
                Parsed::Record { header, header_offset, payload_len, next } => {
                    let p = header_offset + HEADER_LEN;
                    out.push((header, buf[p..p + payload_len].to_vec()));
                    offset = next;
                }
                Parsed::Padding { next } => offset = next,
                other => return (out, other),
            }
        }
    }

    #[test]
    fn records_round_trip_across_blocks_and_padding() {
        let mut buf = Vec::new();
        let payloads: Vec<Vec<u8>> = (0..50).map(|i| vec![i as u8; (i * 397) % 9000]).collect();
        for (i, p) in payloads.iter().enumerate() {
            encode_record(&mut buf, 3, header(i as u64), p);
        }
        pad_to_block(&mut buf, 3);
        assert_eq!(buf.len() % BLOCK_SIZE, 0);
        buf.resize(buf.len() + BLOCK_SIZE, 0);
        let (records, end) = parse_all(&buf, 3);
        assert_eq!(records.len(), payloads.len());
        for (i, (h, p)) in records.iter().enumerate() {
            assert_eq!(*h, header(i as u64));
            assert_eq!(p, &payloads[i]);
        }
        assert!(matches!(end, Parsed::End { reason: EndReason::Zeros, .. }));
    }

    #[test]
    fn headers_never_straddle_a_block() {
        for first in 0..200usize {
            let mut buf = Vec::new();
            encode_record(&mut buf, 1, header(0), &vec![1; BLOCK_SIZE - HEADER_LEN - first]);
            let at = encode_record(&mut buf, 1, header(1), b"x");
            assert!(at % BLOCK_SIZE + HEADER_LEN <= BLOCK_SIZE, "first={first} at={at}");
            pad_to_block(&mut buf, 1);
            assert_eq!(parse_all(&buf, 1).0.len(), 2);
        }
    }

    #[test]
    fn every_single_bit_flip_ends_the_scan_at_that_record() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 9, header(0), b"first record");
        let second = encode_record(&mut buf, 9, header(1), b"second record payload");
        let end = buf.len();
        for bit in second * 8..end * 8 {
            let mut copy = buf.clone();
            copy[bit / 8] ^= 1 << (bit % 8);
            let (records, _) = parse_all(&copy, 9);
            assert_eq!(records.len(), 1, "bit {bit} flipped went unnoticed");
        }
    }

    #[test]
    fn truncated_buffers_ask_for_more_and_stale_tags_end_the_scan() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 5, header(0), &[7; 100]);
        for cut in 0..buf.len() {
            let parsed = parse_at(&buf[..cut], 0, 0, 5, 1 << 20);
            assert!(matches!(parsed, Parsed::NeedMore { .. }), "cut {cut}: {parsed:?}");
        }
        assert!(matches!(
            parse_at(&buf, 0, 0, 6, 1 << 20),
            Parsed::End { reason: EndReason::Stale, .. }
        ));
    }

    #[test]
    fn random_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let seed = rand::random::<u64>();
        println!("seed {seed}");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for _ in 0..2000 {
            let len = rng.gen_range(0..300);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if len > 12 && rng.gen_bool(0.5) {
                buf[8..12].copy_from_slice(&4u32.to_le_bytes());
            }
            let _ = parse_at(&buf, 0, 0, 4, rng.gen_range(0..400));
        }
    }
}
