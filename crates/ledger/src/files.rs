//! Formats of the store's side files. Pure encode/decode, checked with CRC32C; a decode error
//! is a typed error, never a panic.
//!
//! `index-<seq>` lists the entry records of one sealed segment, so that a restart loads
//! locations without scanning the segment:
//! `"MGIX" | version u32 | seq u64 | count u64 | count x (ledger u64, entry u64, offset u32,
//! len u32) | crc32c u32`.
//!
//! `checkpoint` holds the state of every ledger once the segments up to `covered` are indexed;
//! a restart replays only the segments after it:
//! `"MGCP" | version u32 | covered u64 | next_ledger_id u64 | count u64 |
//! count x (id u64, flags u8, entry_count u64) | crc32c u32`. Flags: 1 closed, 2 fenced.
//! All integers little-endian.

use crate::error::LedgerError;

const INDEX_MAGIC: &[u8; 4] = b"MGIX";
const CHECKPOINT_MAGIC: &[u8; 4] = b"MGCP";
const VERSION: u32 = 1;
pub const CHECKPOINT_FILE: &str = "checkpoint";
const INDEX_ENTRY_LEN: usize = 24;
const CHECKPOINT_LEDGER_LEN: usize = 17;

pub fn index_file_name(seq: u64) -> String {
    format!("index-{seq:020}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub ledger: u64,
    pub entry: u64,
    pub offset: u32,
    pub len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerMeta {
    pub id: u64,
    pub closed: bool,
    pub fenced: bool,
    /// For a closed ledger, how many entries it was closed with.
    pub entry_count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub covered: u64,
    pub next_ledger_id: u64,
    pub ledgers: Vec<LedgerMeta>,
}

fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks magic, version and checksum; returns the body after the magic and version.
fn unseal<'a>(data: &'a [u8], magic: &[u8; 4], file: &'a str) -> Result<Reader<'a>, LedgerError> {
    let corrupt = |why: &str| LedgerError::Corrupt { file: file.to_string(), why: why.to_string() };
    if data.len() < 12 || &data[..4] != magic {
        return Err(corrupt("bad magic or too short"));
    }
    let (body, crc) = data.split_at(data.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(corrupt("checksum mismatch"));
    }
    let mut reader = Reader { data: &body[4..], file };
    if reader.u32()? != VERSION {
        return Err(corrupt("unknown version"));
    }
    Ok(reader)
}

struct Reader<'a> {
    data: &'a [u8],
    file: &'a str,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], LedgerError> {
        if self.data.len() < N {
            return Err(LedgerError::Corrupt {
                file: self.file.to_string(),
                why: "truncated".into(),
            });
        }
        let (head, rest) = self.data.split_at(N);
        self.data = rest;
        Ok(head.try_into().expect("split at N"))
    }
    fn u8(&mut self) -> Result<u8, LedgerError> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, LedgerError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, LedgerError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    /// A count of items of `item_len` bytes each, checked against what remains.
    fn count(&mut self, item_len: usize) -> Result<usize, LedgerError> {
        let count = self.u64()?;
        if count.checked_mul(item_len as u64) != Some(self.data.len() as u64) {
            return Err(LedgerError::Corrupt {
                file: self.file.to_string(),
                why: "bad count".into(),
            });
        }
        Ok(count as usize)
    }
}

pub fn encode_index(seq: u64, entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + entries.len() * INDEX_ENTRY_LEN);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.ledger.to_le_bytes());
        out.extend_from_slice(&e.entry.to_le_bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
    }
    seal(out)
}

pub fn decode_index(seq: u64, data: &[u8]) -> Result<Vec<IndexEntry>, LedgerError> {
    let file = index_file_name(seq);
    let mut reader = unseal(data, INDEX_MAGIC, &file)?;
    if reader.u64()? != seq {
        return Err(LedgerError::Corrupt { file, why: "segment mismatch".into() });
    }
    let count = reader.count(INDEX_ENTRY_LEN)?;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push(IndexEntry {
            ledger: reader.u64()?,
            entry: reader.u64()?,
            offset: reader.u32()?,
            len: reader.u32()?,
        });
    }
    Ok(entries)
}

pub fn encode_checkpoint(checkpoint: &Checkpoint) -> Vec<u8> {
    let mut out = Vec::with_capacity(36 + checkpoint.ledgers.len() * CHECKPOINT_LEDGER_LEN);
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&checkpoint.covered.to_le_bytes());
    out.extend_from_slice(&checkpoint.next_ledger_id.to_le_bytes());
    out.extend_from_slice(&(checkpoint.ledgers.len() as u64).to_le_bytes());
    for l in &checkpoint.ledgers {
        out.extend_from_slice(&l.id.to_le_bytes());
        out.push(u8::from(l.closed) | (u8::from(l.fenced) << 1));
        out.extend_from_slice(&l.entry_count.to_le_bytes());
    }
    seal(out)
}

pub fn decode_checkpoint(data: &[u8]) -> Result<Checkpoint, LedgerError> {
    let mut reader = unseal(data, CHECKPOINT_MAGIC, CHECKPOINT_FILE)?;
    let covered = reader.u64()?;
    let next_ledger_id = reader.u64()?;
    let count = reader.count(CHECKPOINT_LEDGER_LEN)?;
    let mut ledgers = Vec::with_capacity(count);
    for _ in 0..count {
        let id = reader.u64()?;
        let flags = reader.u8()?;
        let entry_count = reader.u64()?;
        ledgers.push(LedgerMeta {
            id,
            closed: flags & 1 != 0,
            fenced: flags & 2 != 0,
            entry_count,
        });
    }
    Ok(Checkpoint { covered, next_ledger_id, ledgers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_and_checkpoint_round_trip_and_reject_any_damage() {
        let entries: Vec<IndexEntry> = (0..100)
            .map(|i| IndexEntry { ledger: i % 7, entry: i, offset: i as u32 * 100, len: 50 })
            .collect();
        let index = encode_index(9, &entries);
        assert_eq!(decode_index(9, &index).unwrap(), entries);
        assert!(decode_index(8, &index).is_err());
        let checkpoint = Checkpoint {
            covered: 12,
            next_ledger_id: 40,
            ledgers: vec![
                LedgerMeta { id: 3, closed: true, fenced: false, entry_count: 10 },
                LedgerMeta { id: 39, closed: false, fenced: true, entry_count: 0 },
            ],
        };
        let encoded = encode_checkpoint(&checkpoint);
        assert_eq!(decode_checkpoint(&encoded).unwrap(), checkpoint);
        for cut in 0..encoded.len() {
            assert!(decode_checkpoint(&encoded[..cut]).is_err());
        }
        for byte in 0..encoded.len() {
            let mut damaged = encoded.clone();
            damaged[byte] ^= 0x40;
            assert!(decode_checkpoint(&damaged).is_err(), "flip at {byte} unnoticed");
        }
    }
}
