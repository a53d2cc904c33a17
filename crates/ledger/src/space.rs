//! Short of disk, with a margin: the rule a storage node's read-only mode and a broker's
//! refusal of new messages share (BookKeeper's read-only bookie).

/// Whether a store that is `short` now should be after measuring `free` bytes free, with a
/// threshold of `min_free` (0: never short). Once short, it stays so until twice the
/// threshold is free, so that it does not flap around the threshold.
pub fn next_short(short: bool, free: u64, min_free: u64) -> bool {
    if min_free == 0 {
        return false;
    }
    if short {
        free < min_free.saturating_mul(2)
    } else {
        free < min_free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_below_the_threshold_and_again_at_twice_it() {
        let gib = 1u64 << 30;
        assert!(!next_short(false, gib, gib));
        assert!(next_short(false, gib - 1, gib));
        // Once short, a little freed space is not enough.
        assert!(next_short(true, gib + 1, gib));
        assert!(next_short(true, 2 * gib - 1, gib));
        assert!(!next_short(true, 2 * gib, gib));
        // 0 turns it off.
        assert!(!next_short(false, 0, 0));
        assert!(!next_short(true, 0, 0));
        assert!(next_short(true, u64::MAX - 1, u64::MAX), "twice the threshold saturates");
    }
}
