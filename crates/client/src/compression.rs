//! Payload compression, framed exactly as the official Pulsar clients do:
//! LZ4 raw block (no size prefix, no frame), ZLIB stream (RFC 1950, with
//! header and Adler-32), ZSTD frame, Snappy raw block (no framing format).
//! The uncompressed size travels in `MessageMetadata.uncompressed_size`.

use std::io::{Read, Write};

use crate::error::{Error, Result};
use magnetar_protocol::proto::CompressionType as WireCompression;

/// Largest uncompressed entry accepted when decompressing (256 MiB).
pub const MAX_UNCOMPRESSED_SIZE: usize = 256 * 1024 * 1024;

/// Compression applied by a producer to each entry (a whole batch or a
/// single message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Compression {
    /// No compression.
    #[default]
    None,
    /// LZ4 raw block.
    Lz4,
    /// zlib stream.
    Zlib,
    /// Zstandard frame.
    Zstd,
    /// Snappy raw block.
    Snappy,
}

impl Compression {
    /// The wire value of `MessageMetadata.compression`.
    pub fn wire(self) -> WireCompression {
        match self {
            Compression::None => WireCompression::None,
            Compression::Lz4 => WireCompression::Lz4,
            Compression::Zlib => WireCompression::Zlib,
            Compression::Zstd => WireCompression::Zstd,
            Compression::Snappy => WireCompression::Snappy,
        }
    }

    /// From the wire value; `None` for an unknown number.
    pub fn from_wire(value: i32) -> Option<Self> {
        Some(match WireCompression::try_from(value).ok()? {
            WireCompression::None => Compression::None,
            WireCompression::Lz4 => Compression::Lz4,
            WireCompression::Zlib => Compression::Zlib,
            WireCompression::Zstd => Compression::Zstd,
            WireCompression::Snappy => Compression::Snappy,
        })
    }

    /// Compresses `raw`.
    pub fn compress(self, raw: &[u8]) -> Result<Vec<u8>> {
        let fail = |e: &dyn std::fmt::Display| Error::Compression(format!("{self:?}: {e}"));
        match self {
            Compression::None => Ok(raw.to_vec()),
            Compression::Lz4 => Ok(lz4_flex::block::compress(raw)),
            Compression::Zlib => {
                let mut enc =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                enc.write_all(raw).map_err(|e| fail(&e))?;
                enc.finish().map_err(|e| fail(&e))
            }
            Compression::Zstd => zstd::bulk::compress(raw, 3).map_err(|e| fail(&e)),
            Compression::Snappy => {
                snap::raw::Encoder::new().compress_vec(raw).map_err(|e| fail(&e))
            }
        }
    }

    /// Decompresses `data` into exactly `uncompressed_size` bytes.
    ///
    /// Sizes above [`MAX_UNCOMPRESSED_SIZE`] are refused before anything is
    /// allocated.
    pub fn decompress(self, data: &[u8], uncompressed_size: usize) -> Result<Vec<u8>> {
        if uncompressed_size > MAX_UNCOMPRESSED_SIZE {
            return Err(Error::Compression(format!(
                "uncompressed size {uncompressed_size} exceeds {MAX_UNCOMPRESSED_SIZE}"
            )));
        }
        let fail = |e: &dyn std::fmt::Display| Error::Compression(format!("{self:?}: {e}"));
        let out = match self {
            Compression::None => data.to_vec(),
            Compression::Lz4 => {
                lz4_flex::block::decompress(data, uncompressed_size).map_err(|e| fail(&e))?
            }
            Compression::Zlib => {
                let mut out = Vec::with_capacity(uncompressed_size);
                flate2::read::ZlibDecoder::new(data)
                    .take(uncompressed_size as u64)
                    .read_to_end(&mut out)
                    .map_err(|e| fail(&e))?;
                out
            }
            Compression::Zstd => {
                zstd::bulk::decompress(data, uncompressed_size).map_err(|e| fail(&e))?
            }
            Compression::Snappy => {
                snap::raw::Decoder::new().decompress_vec(data).map_err(|e| fail(&e))?
            }
        };
        if self != Compression::None && out.len() != uncompressed_size {
            return Err(Error::Compression(format!(
                "{self:?}: got {} bytes, expected {uncompressed_size}",
                out.len()
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let raw: Vec<u8> = (0..10_000u32).flat_map(|i| (i % 97).to_le_bytes()).collect();
        for c in [
            Compression::None,
            Compression::Lz4,
            Compression::Zlib,
            Compression::Zstd,
            Compression::Snappy,
        ] {
            let packed = c.compress(&raw).unwrap();
            if c != Compression::None {
                assert!(packed.len() < raw.len(), "{c:?}");
            }
            assert_eq!(c.decompress(&packed, raw.len()).unwrap(), raw, "{c:?}");
            assert_eq!(Compression::from_wire(c.wire() as i32), Some(c));
        }
    }

    #[test]
    fn framing_matches_official_clients() {
        // zlib stream header (CMF 0x78), zstd frame magic, LZ4 raw block
        // starts with a token (no frame magic 0x184D2204).
        let raw = b"hello hello hello hello hello";
        assert_eq!(Compression::Zlib.compress(raw).unwrap()[0], 0x78);
        assert_eq!(&Compression::Zstd.compress(raw).unwrap()[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
        assert_ne!(&Compression::Lz4.compress(raw).unwrap()[..4], &[0x04, 0x22, 0x4d, 0x18]);
        // Snappy raw: varint of the uncompressed length first.
        assert_eq!(Compression::Snappy.compress(raw).unwrap()[0], raw.len() as u8);
    }
}
