//! Which records a point read that reached a leaf page caches: the second-miss filter.
//!
//! The paper caches a record read from a leaf page with a fixed chance (its read
//! promotion rate). Under a skewed workload a hot record then stays on disk for several
//! reads (five on average at 20%) before it is cached; caching every read fixes that
//! but, under a uniform workload, churns the pool for records that are not read again
//! before they age out (measured in docs/benchmarks-history.md: +22-38% reads/s under Zipf,
//! -8-15% under uniform keys). bfdb keeps the chance and adds a "doorkeeper", as in
//! TinyLFU's admission: a record whose leaf-page read is the *second* within a window is
//! cached whatever the coin says. The first read of a key sets two bits of a small bit
//! array; the second finds them set. The array is cleared once a window of first reads
//! has been recorded, which keeps it mostly empty and its false positives rare.
//!
//! The filter only decides which records may push others out: while the pool is under
//! 90% in use, every read that reaches a leaf page caches its record (`record_room` in
//! the tree), since doing so evicts nothing.
//!
//! The array has 8 bits per 128 bytes of pool (`budget / 128` bytes, allocated outside
//! the pool next to the mapping table: 128 KiB for a 16 MiB budget), one array per pool
//! (the trees of a `Db` share it as they share the pool, each key's bits chosen with its
//! tree's member slot, so it does not grow with the number of keyspaces), about the room of
//! three cached records per 8 bits, and its window is an eighth of its bits, so at most
//! a fifth of the bits are ever set (two hash functions: about 5% false positives at the
//! end of a window, 2% on average).

use crate::sync::atomic::{AtomicU64, Ordering};

/// The second-miss filter of one pool, for every tree that keeps mini-pages in it.
pub(crate) struct Doorkeeper {
    words: Box<[AtomicU64]>,
    /// Keys recorded since the last clear.
    recorded: AtomicU64,
    /// Keys recorded before the array is cleared.
    window: u64,
}

impl Doorkeeper {
    /// A filter for a pool of `budget_bytes`.
    pub(crate) fn new(budget_bytes: u64) -> Doorkeeper {
        let bits = (budget_bytes / 128 * 8).clamp(1 << 12, 1 << 32);
        let words = bits.div_ceil(64);
        Doorkeeper {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            recorded: AtomicU64::new(0),
            window: words * 64 / 8,
        }
    }

    /// Whether `key` of the tree in member slot `owner` was recorded before in this
    /// window; if not, records it.
    pub(crate) fn seen_again(&self, owner: u16, key: &[u8]) -> bool {
        let h = hash(key) ^ u64::from(owner).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let bits = self.words.len() as u64 * 64;
        let (a, b) = (h % bits, (h >> 32 ^ h << 17) % bits);
        let word = |bit: u64| &self.words[(bit / 64) as usize];
        let mask = |bit: u64| 1u64 << (bit % 64);
        // Relaxed throughout: the filter is a heuristic; a lost or stale bit only delays
        // or hastens one record's caching, never changes an answer.
        if word(a).load(Ordering::Relaxed) & mask(a) != 0
            && word(b).load(Ordering::Relaxed) & mask(b) != 0
        {
            return true;
        }
        word(a).fetch_or(mask(a), Ordering::Relaxed);
        word(b).fetch_or(mask(b), Ordering::Relaxed);
        if self.recorded.fetch_add(1, Ordering::Relaxed) + 1 == self.window {
            // One thread clears; keys recorded meanwhile may be lost, which only delays
            // their caching to their next read.
            for w in self.words.iter() {
                w.store(0, Ordering::Relaxed);
            }
            self.recorded.store(0, Ordering::Relaxed);
        }
        false
    }
}

/// A 64-bit hash of `key`: eight bytes at a time, each folded in by a multiply and a
/// shift (the splitmix64 finalizer's constants), then finalized.
fn hash(key: &[u8]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ key.len() as u64;
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().expect("eight bytes"));
        h = (h ^ v).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(last)).wrapping_mul(0x94d0_49bb_1331_11eb);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn admits_a_key_on_its_second_read() {
        let d = Doorkeeper::new(16 << 20);
        assert!(!d.seen_again(0, b"user0000aaaaaaaa"));
        assert!(d.seen_again(0, b"user0000aaaaaaaa"));
        assert!(!d.seen_again(0, b"user0000aaaaaaab"));
        assert!(!d.seen_again(0, b""));
        assert!(d.seen_again(0, b""));
    }

    #[test]
    fn false_positives_stay_rare_across_windows() {
        let d = Doorkeeper::new(1 << 20);
        let n = d.window * 5;
        let false_positives = (0..n).filter(|i| d.seen_again(0, &i.to_be_bytes())).count();
        // Two probes into an array at most a fifth full: 2% on average, 5% at worst.
        assert!(
            (false_positives as u64) < n / 20,
            "{false_positives} of {n}"
        );
    }

    #[test]
    fn the_end_of_a_window_forgets_first_reads() {
        let d = Doorkeeper::new(1 << 20);
        assert!(!d.seen_again(0, b"key"));
        for i in 0..2 * d.window {
            d.seen_again(0, &(i + 1_000_000).to_be_bytes());
        }
        assert!(!d.seen_again(0, b"key"), "the first read is forgotten");
    }
}
