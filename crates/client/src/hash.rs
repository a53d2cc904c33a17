//! Murmur3 32-bit hash (seed 0), as used by the official clients'
//! `Murmur3_32Hash` partition routing.

/// Murmur3_32 of `data` with seed 0 (x86 variant, little-endian blocks).
pub fn murmur3_32(data: &[u8]) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mix_k1 = |k: u32| k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    let mut h1: u32 = 0;
    let mut chunks = data.chunks_exact(4);
    for block in &mut chunks {
        let k1 = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        h1 ^= mix_k1(k1);
        h1 = h1.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = chunks.remainder();
    let mut k1: u32 = 0;
    for (i, &b) in tail.iter().enumerate() {
        k1 ^= u32::from(b) << (8 * i);
    }
    h1 ^= mix_k1(k1);
    h1 ^= data.len() as u32;
    h1 ^= h1 >> 16;
    h1 = h1.wrapping_mul(0x85eb_ca6b);
    h1 ^= h1 >> 13;
    h1 = h1.wrapping_mul(0xc2b2_ae35);
    h1 ^= h1 >> 16;
    h1
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
