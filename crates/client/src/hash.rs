//! Murmur3 32-bit hash (seed 0), as used by the official clients'
//! `Murmur3_32Hash` partition routing.

/// Murmur3_32 of `data` with seed 0 (x86 variant, little-endian blocks).
pub fn murmur3_32(data: &[u8]) -> u32 {
    magnetar_protocol::murmur3_32(data, 0)
}

/// Partition index for `key` among `partitions`, as the official clients'
/// key routing computes it: `(murmur3_32(key) & i32::MAX) % partitions`.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    (murmur3_32(key) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors() {
        // Published MurmurHash3_x86_32 test vectors with seed 0.
        assert_eq!(murmur3_32(b""), 0);
        assert_eq!(murmur3_32(b"hello"), 0x248b_fa47);
        assert_eq!(murmur3_32(b"hello, world"), 0x149b_bb7f);
        assert_eq!(murmur3_32(b"The quick brown fox jumps over the lazy dog"), 0x2e4f_f723);
    }
}
