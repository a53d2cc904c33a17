//! Entries as compaction sees them: a stored topic entry's [`EntryShape`], and the format of a
//! compacted ledger's entries.
//!
//! A compacted ledger entry is the topic entry unchanged behind a small header that says which
//! topic position it is and, for a batch compaction thinned, which of its messages are kept:
//!
//! ```text
//! | magic 0xC0 | version 1 | ledger u64 | entry u64 | batch size u32 | words u16 | kept u64 * words | topic entry |
//! ```
//!
//! (big-endian). `words == 0`: the whole entry is kept. Otherwise `kept` is a bitset, bit `i`
//! of word `i / 64` set when message `i` is kept: the same words as a MESSAGE command's
//! `ack_set` (set: still to be delivered), which is how every official client skips the other
//! messages of a batch. The entry itself is never rewritten (a compressed batch stays
//! compressed, an encrypted one stays opaque), so message ids and bytes stay the topic's.

use crate::{EntryShape, MessageShape};
use bytes::{BufMut, Bytes, BytesMut};
use magnetar_client::Compression;
use magnetar_protocol::parse_metadata_and_payload;

const MAGIC: u8 = 0xC0;
const VERSION: u8 = 1;
const FIXED_HEADER: usize = 2 + 8 + 8 + 4 + 2;

/// One entry of a compacted ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactedEntry {
    /// The topic position it was read from.
    pub position: (u64, u64),
    /// Messages in the entry (1 unless a batch).
    pub batch_size: u32,
    /// The kept messages of a thinned batch (`ack_set` words); `None`: all of them.
    pub kept: Option<Vec<u64>>,
    /// The topic entry, as stored.
    pub data: Bytes,
}

/// Why a compacted ledger entry does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("compacted ledger entry unreadable: {0}")]
pub struct EntryFormatError(pub String);

impl CompactedEntry {
    pub fn encode(&self) -> Bytes {
        let words = self.kept.as_deref().unwrap_or_default();
        let mut out = BytesMut::with_capacity(FIXED_HEADER + words.len() * 8 + self.data.len());
        out.put_u8(MAGIC);
        out.put_u8(VERSION);
        out.put_u64(self.position.0);
        out.put_u64(self.position.1);
        out.put_u32(self.batch_size);
        let count = u16::try_from(words.len()).expect("a batch has at most 65,535 words");
        out.put_u16(count);
        for word in words {
            out.put_u64(*word);
        }
        out.extend_from_slice(&self.data);
        out.freeze()
    }

    pub fn decode(raw: &Bytes) -> Result<Self, EntryFormatError> {
        let fail = |why: &str| EntryFormatError(why.to_string());
        if raw.len() < FIXED_HEADER {
            return Err(fail("shorter than its header"));
        }
        if raw[0] != MAGIC || raw[1] != VERSION {
            return Err(fail("unknown magic or version"));
        }
        let u64_at = |at: usize| u64::from_be_bytes(raw[at..at + 8].try_into().unwrap_or_default());
        let ledger = u64_at(2);
        let entry = u64_at(10);
        let batch_size = u32::from_be_bytes(raw[18..22].try_into().unwrap_or_default());
        let words = usize::from(u16::from_be_bytes(raw[22..24].try_into().unwrap_or_default()));
        let data_at = FIXED_HEADER + words * 8;
        if raw.len() < data_at {
            return Err(fail("shorter than its kept-message bitset"));
        }
        let kept = (words > 0)
            .then(|| (0..words).map(|i| u64_at(FIXED_HEADER + i * 8)).collect::<Vec<_>>());
        Ok(CompactedEntry {
            position: (ledger, entry),
            batch_size,
            kept,
            data: raw.slice(data_at..),
        })
    }

    /// Whether message `index` of the entry is kept.
    pub fn keeps(&self, index: u32) -> bool {
        match &self.kept {
            None => true,
            Some(words) => bit(words, index),
        }
    }
}

fn bit(words: &[u64], index: u32) -> bool {
    let word = usize::try_from(index / 64).unwrap_or(usize::MAX);
    words.get(word).is_some_and(|w| w & (1u64 << (index % 64)) != 0)
}

/// The `ack_set` words with exactly `indexes` set.
pub fn kept_words(indexes: &[u32], batch_size: u32) -> Vec<u64> {
    let mut words = vec![0u64; batch_size.div_ceil(64) as usize];
    for &index in indexes {
        if let Some(word) = words.get_mut((index / 64) as usize) {
            *word |= 1u64 << (index % 64);
        }
    }
    words
}

/// What compaction sees of a stored topic entry, and its message count. `kept`: a compacted
/// ledger's mask (messages outside it count as compacted out).
pub fn shape_of(data: &Bytes, kept: Option<&[u64]>) -> (EntryShape, u32) {
    let Ok((metadata, payload)) = parse_metadata_and_payload(data) else {
        return (EntryShape::Opaque, 1);
    };
    if metadata.marker_type.is_some() {
        return (EntryShape::Marker, 1);
    }
    let chunked = metadata.num_chunks_from_msg.is_some_and(|n| n > 1);
    if !metadata.encryption_keys.is_empty() || chunked {
        let count = metadata.num_messages_in_batch.map_or(1, |n| n.max(1) as u32);
        return (EntryShape::Opaque, count);
    }
    let compression = Compression::from_wire(metadata.compression.unwrap_or(0));
    let uncompressed = |payload: &Bytes| -> Option<Bytes> {
        match compression? {
            Compression::None => Some(payload.clone()),
            codec => {
                let size = usize::try_from(metadata.uncompressed_size.unwrap_or(0)).ok()?;
                codec.decompress(payload, size).ok().map(Bytes::from)
            }
        }
    };
    let Some(batch_size) = metadata.num_messages_in_batch else {
        let payload_len = match compression {
            Some(Compression::None) => payload.len(),
            _ => metadata.uncompressed_size.unwrap_or(0) as usize,
        };
        let message = MessageShape {
            key: metadata.partition_key.clone(),
            payload_len,
            null_value: metadata.null_value.unwrap_or(false),
            compacted_out: kept.is_some_and(|words| !bit(words, 0)),
        };
        return (EntryShape::Single(message), 1);
    };
    let batch_size = u32::try_from(batch_size.max(1)).unwrap_or(1);
    let Some(raw) = uncompressed(&payload) else {
        return (EntryShape::Opaque, batch_size);
    };
    let Ok(messages) = magnetar_protocol::collect_batch(raw, batch_size) else {
        return (EntryShape::Opaque, batch_size);
    };
    let shapes = (0u32..)
        .zip(messages)
        .map(|(index, message)| MessageShape {
            key: message.metadata.partition_key.clone(),
            payload_len: message.payload.len(),
            null_value: message.metadata.null_value.unwrap_or(false),
            compacted_out: message.metadata.compacted_out.unwrap_or(false)
                || kept.is_some_and(|words| !bit(words, index)),
        })
        .collect();
    (EntryShape::Batch(shapes), batch_size)
}
