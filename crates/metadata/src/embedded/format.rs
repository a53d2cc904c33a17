//! On-disk format of the embedded store: log header, log records, snapshot file.
//!
//! All integers are little-endian; CRCs are CRC32C (Castagnoli).
//!
//! ```text
//! log file   = header record*
//! header     = "MGMDLOG1" generation:u64 crc:u32            crc over magic+generation
//! record     = len:u32 crc:u32 payload[len]                  crc over len bytes + payload
//! payload    = op:u8 version:u64 key_len:u32 key value       op 1 = put, 2 = delete
//!                                                             (a delete has an empty value)
//! snapshot   = "MGMDSNP1" generation:u64 count:u64 entry* crc:u32   crc over all before it
//! entry      = key_len:u32 key version:u64 value_len:u32 value
//! ```
//!
//! A snapshot with generation G contains the effect of every log with generation <= G; the
//! live log then has generation G + 1. Invariants: decoding never panics on any input; a
//! torn or checksum-failing record ends the valid prefix of a log (recovery truncates it),
//! while a record that passes its checksum but does not decode, a bad header or a bad
//! snapshot is reported as corruption.

use std::collections::BTreeMap;
use std::io::{self, Write};

use bytes::Bytes;

use crate::key::{validate_key, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::Versioned;

/// Magic of the log header.
pub(crate) const LOG_MAGIC: &[u8; 8] = b"MGMDLOG1";
/// Magic of the snapshot file.
pub(crate) const SNAPSHOT_MAGIC: &[u8; 8] = b"MGMDSNP1";
/// Size of the log header in bytes.
pub(crate) const LOG_HEADER_LEN: u64 = 8 + 8 + 4;
/// Size of a record's frame (len + crc) in bytes.
pub(crate) const RECORD_FRAME_LEN: usize = 8;
/// Fixed part of a payload: op + version + key_len.
const PAYLOAD_FIXED_LEN: usize = 1 + 8 + 4;
/// Largest payload a valid record can have.
pub(crate) const MAX_PAYLOAD_LEN: usize = PAYLOAD_FIXED_LEN + MAX_KEY_LEN + MAX_VALUE_LEN;

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;

/// A decoded log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// `key` now holds `value` at `version`.
    Put { key: String, version: u64, value: Bytes },
    /// `key` (which had `version`) was deleted.
    Delete { key: String, version: u64 },
}

/// Size of a put record on disk.
pub(crate) fn put_record_len(key: &str, value_len: usize) -> usize {
    RECORD_FRAME_LEN + PAYLOAD_FIXED_LEN + key.len() + value_len
}

fn encode_record(buf: &mut Vec<u8>, op: u8, version: u64, key: &str, value: &[u8]) {
    let payload_len = PAYLOAD_FIXED_LEN + key.len() + value.len();
    // Keys and values are validated before they reach the encoder, so this always fits.
    let len = u32::try_from(payload_len).unwrap_or(u32::MAX).to_le_bytes();
    let start = buf.len();
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&[0; 4]); // crc placeholder
    buf.push(op);
    buf.extend_from_slice(&version.to_le_bytes());
    buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
    buf.extend_from_slice(key.as_bytes());
    buf.extend_from_slice(value);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), &buf[start + RECORD_FRAME_LEN..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends an encoded put record to `buf`.
pub(crate) fn encode_put(buf: &mut Vec<u8>, key: &str, version: u64, value: &[u8]) {
    encode_record(buf, OP_PUT, version, key, value);
}

/// Appends an encoded delete record to `buf`.
pub(crate) fn encode_delete(buf: &mut Vec<u8>, key: &str, version: u64) {
    encode_record(buf, OP_DELETE, version, key, &[]);
}

/// Encodes a log header.
pub(crate) fn encode_log_header(generation: u64) -> Vec<u8> {
    let mut buf = Vec::with_capacity(LOG_HEADER_LEN as usize);
    buf.extend_from_slice(LOG_MAGIC);
    buf.extend_from_slice(&generation.to_le_bytes());
    let crc = crc32c::crc32c(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf
}

/// Decodes a log header; `Err` carries a description.
pub(crate) fn decode_log_header(data: &[u8]) -> Result<u64, String> {
    let mut r = Reader::new(data);
    let magic = r.take(8)?;
    if magic != LOG_MAGIC {
        return Err("bad log magic".into());
    }
    let generation = r.u64()?;
    let crc = r.u32()?;
    if crc != crc32c::crc32c(&data[..16]) {
        return Err("log header checksum mismatch".into());
    }
    Ok(generation)
}

/// Result of scanning the record area of a log.
#[derive(Debug)]
pub(crate) struct LogScan {
    /// Complete, checksum-valid records in order.
    pub(crate) records: Vec<Record>,
    /// Offset (within the scanned slice) just past the last valid record.
    pub(crate) valid_len: usize,
}

/// Error for a record that passed its checksum but does not decode.
#[derive(Debug)]
pub(crate) struct UndecodableRecord {
    pub(crate) offset: usize,
    pub(crate) reason: String,
}

/// Scans records from `data` (the log after its header), stopping at the first torn or
/// checksum-failing record.
pub(crate) fn scan_records(data: &[u8]) -> Result<LogScan, UndecodableRecord> {
    let mut records = Vec::new();
    let mut pos = 0usize;
    loop {
        let rest = &data[pos..];
        if rest.len() < RECORD_FRAME_LEN {
            break;
        }
        let len_bytes = [rest[0], rest[1], rest[2], rest[3]];
        let len = u32::from_le_bytes(len_bytes) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if !(PAYLOAD_FIXED_LEN..=MAX_PAYLOAD_LEN).contains(&len)
            || rest.len() - RECORD_FRAME_LEN < len
        {
            break;
        }
        let payload = &rest[RECORD_FRAME_LEN..RECORD_FRAME_LEN + len];
        if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload) != crc {
            break;
        }
        let record =
            decode_payload(payload).map_err(|reason| UndecodableRecord { offset: pos, reason })?;
        records.push(record);
        pos += RECORD_FRAME_LEN + len;
    }
    Ok(LogScan { records, valid_len: pos })
}

fn decode_payload(payload: &[u8]) -> Result<Record, String> {
    let mut r = Reader::new(payload);
    let op = r.u8()?;
    let version = r.u64()?;
    let key_len = r.u32()? as usize;
    let key = r.string(key_len)?;
    let value = r.rest();
    match op {
        OP_PUT => Ok(Record::Put { key, version, value: Bytes::copy_from_slice(value) }),
        OP_DELETE if value.is_empty() => Ok(Record::Delete { key, version }),
        OP_DELETE => Err("delete record carries a value".into()),
        other => Err(format!("unknown record op {other}")),
    }
}

/// Streams a snapshot into `w`, returning the number of bytes written.
pub(crate) fn write_snapshot<W: Write>(
    w: W,
    generation: u64,
    entries: &[(String, Versioned)],
) -> io::Result<u64> {
    let mut w = CrcWriter { inner: w, crc: 0, written: 0 };
    w.write_all(SNAPSHOT_MAGIC)?;
    w.write_all(&generation.to_le_bytes())?;
    w.write_all(&(entries.len() as u64).to_le_bytes())?;
    for (key, v) in entries {
        w.write_all(&(key.len() as u32).to_le_bytes())?;
        w.write_all(key.as_bytes())?;
        w.write_all(&v.version.to_le_bytes())?;
        w.write_all(&(v.value.len() as u32).to_le_bytes())?;
        w.write_all(&v.value)?;
    }
    let crc = w.crc;
    w.inner.write_all(&crc.to_le_bytes())?;
    w.inner.flush()?;
    Ok(w.written + 4)
}

/// A decoded snapshot.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) generation: u64,
    pub(crate) entries: BTreeMap<String, Versioned>,
}

/// Decodes and verifies a snapshot file's contents.
pub(crate) fn decode_snapshot(data: &[u8]) -> Result<Snapshot, String> {
    if data.len() < 8 + 8 + 8 + 4 {
        return Err("snapshot too short".into());
    }
    let (body, crc_bytes) = data.split_at(data.len() - 4);
    let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
    if crc32c::crc32c(body) != stored {
        return Err("snapshot checksum mismatch".into());
    }
    let mut r = Reader::new(body);
    if r.take(8)? != SNAPSHOT_MAGIC {
        return Err("bad snapshot magic".into());
    }
    let generation = r.u64()?;
    let count = r.u64()?;
    let mut entries = BTreeMap::new();
    for _ in 0..count {
        let key_len = r.u32()? as usize;
        let key = r.string(key_len)?;
        let version = r.u64()?;
        let value_len = r.u32()? as usize;
        let value = Bytes::copy_from_slice(r.take(value_len)?);
        if version == 0 {
            return Err(format!("entry {key} has version 0"));
        }
        if entries.insert(key, Versioned { value, version }).is_some() {
            return Err("duplicate key in snapshot".into());
        }
    }
    if !r.rest().is_empty() {
        return Err("trailing bytes after snapshot entries".into());
    }
    Ok(Snapshot { generation, entries })
}

struct CrcWriter<W> {
    inner: W,
    crc: u32,
    written: u64,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Bounds-checked little-endian reader; every method fails instead of panicking.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or_else(|| format!("truncated: need {n} bytes at offset {}", self.pos))?;
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self, n: usize) -> Result<String, String> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| "key is not UTF-8".to_string())?;
        validate_key(s).map_err(|e| e.to_string())?;
        Ok(s.to_string())
    }

    fn rest(&mut self) -> &'a [u8] {
        let out = &self.data[self.pos..];
        self.pos = self.data.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_roundtrip_and_torn_prefixes() {
        let mut buf = Vec::new();
        encode_put(&mut buf, "/a/b", 3, b"hello");
        let first_len = buf.len();
        assert_eq!(first_len, put_record_len("/a/b", 5));
        encode_delete(&mut buf, "/a/b", 3);
        let scan = scan_records(&buf).unwrap();
        assert_eq!(scan.valid_len, buf.len());
        assert_eq!(
            scan.records,
            vec![
                Record::Put { key: "/a/b".into(), version: 3, value: Bytes::from_static(b"hello") },
                Record::Delete { key: "/a/b".into(), version: 3 }
            ]
        );
        for cut in first_len..buf.len() {
            let scan = scan_records(&buf[..cut]).unwrap();
            assert_eq!(scan.records.len(), 1, "cut {cut}");
            assert_eq!(scan.valid_len, first_len);
        }
    }

    #[test]
    fn garbage_never_panics() {
        // Deterministic pseudo-random input (xorshift), including plausible small lengths.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for round in 0..2000 {
            let len = round % 97;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x & 0xff) as u8
                })
                .collect();
            let _ = scan_records(&data);
            let _ = decode_snapshot(&data);
            let _ = decode_log_header(&data);
            let _ = decode_payload(&data);
        }
    }

    #[test]
    fn header_roundtrip() {
        let h = encode_log_header(42);
        assert_eq!(h.len() as u64, LOG_HEADER_LEN);
        assert_eq!(decode_log_header(&h).unwrap(), 42);
        let mut bad = h.clone();
        bad[9] ^= 1;
        assert!(decode_log_header(&bad).is_err());
        assert!(decode_log_header(&h[..10]).is_err());
    }

    #[test]
    fn snapshot_roundtrip_and_corruption() {
        let entries = vec![
            ("/a".to_string(), Versioned { value: Bytes::from_static(b"1"), version: 1 }),
            ("/b/c".to_string(), Versioned { value: Bytes::new(), version: 7 }),
        ];
        let mut out = Vec::new();
        let n = write_snapshot(&mut out, 5, &entries).unwrap();
        assert_eq!(n as usize, out.len());
        let snap = decode_snapshot(&out).unwrap();
        assert_eq!(snap.generation, 5);
        assert_eq!(snap.entries.into_iter().collect::<Vec<_>>(), entries);
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            assert!(decode_snapshot(&bad).is_err(), "flip at {i}");
            assert!(decode_snapshot(&out[..i]).is_err(), "cut at {i}");
        }
    }
}
