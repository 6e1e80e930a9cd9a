//! What the hash tier's tests share: [`Records`], a stand-in for the hybrid log (a record
//! is a key, its hash and the address of the previous record of its chain, at addresses
//! 1, 2, 3, ...; records below a movable "head" answer [`ChainLink::NotInMemory`] to a
//! grow, as records on disk will), and helpers that upsert and find through the index and
//! check its invariants. Its atomics are std's even under shuttle: they are the test's
//! bookkeeping, not the code under test.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::bucket::{INVALID_ADDRESS, KeyHash};
use super::epoch::EpochGuard;
use super::index::{ChainLink, HashIndex, RecordHashes};

/// Records at addresses `1..=capacity`.
pub(super) struct Records {
    keys: Vec<AtomicU64>,
    hashes: Vec<AtomicU64>,
    previous: Vec<AtomicU64>,
    pub(super) next: AtomicUsize,
    /// Records below this address are "on disk" to a grow.
    pub(super) head: AtomicU64,
    /// Records below this address are gone ("truncated") to a grow.
    pub(super) begin: AtomicU64,
}

impl Records {
    pub(super) fn new(capacity: usize) -> Self {
        let atomics = || (0..capacity).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Records {
            keys: atomics(),
            hashes: atomics(),
            previous: atomics(),
            next: AtomicUsize::new(0),
            head: AtomicU64::new(0),
            begin: AtomicU64::new(0),
        }
    }

    fn allocate(&self, key: u64, hash: KeyHash, previous: u64) -> u64 {
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        assert!(i < self.keys.len(), "test record capacity exceeded");
        self.keys[i].store(key, Ordering::SeqCst);
        self.hashes[i].store(hash.0, Ordering::SeqCst);
        self.previous[i].store(previous, Ordering::SeqCst);
        i as u64 + 1
    }

    fn set_previous(&self, address: u64, previous: u64) {
        self.previous[address as usize - 1].store(previous, Ordering::SeqCst);
    }

    fn key(&self, address: u64) -> u64 {
        self.keys[address as usize - 1].load(Ordering::SeqCst)
    }

    fn previous(&self, address: u64) -> u64 {
        self.previous[address as usize - 1].load(Ordering::SeqCst)
    }
}

impl RecordHashes for Records {
    fn link(&self, address: u64) -> ChainLink {
        assert_ne!(address, INVALID_ADDRESS);
        if address < self.begin.load(Ordering::SeqCst) {
            return ChainLink::Truncated;
        }
        if address < self.head.load(Ordering::SeqCst) {
            return ChainLink::NotInMemory;
        }
        let i = address as usize - 1;
        ChainLink::Record {
            key_hash: KeyHash(self.hashes[i].load(Ordering::SeqCst)),
            previous: self.previous[i].load(Ordering::SeqCst),
        }
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Keys below 1000 come in groups of four sharing one whole hash (so they share a chain
/// however large the table grows); other keys hash apart.
pub(super) fn hash_of(key: u64) -> KeyHash {
    if key < 1000 {
        KeyHash(splitmix(key / 4))
    } else {
        KeyHash(splitmix(key))
    }
}

/// Links a new record of `key` at the head of its chain, as an upsert will; returns its
/// address.
pub(super) fn upsert(
    index: &HashIndex,
    guard: &EpochGuard<'_, '_>,
    records: &Records,
    key: u64,
) -> u64 {
    let hash = hash_of(key);
    loop {
        let mut slot = index.find_or_create(guard, hash);
        let address = records.allocate(key, hash, slot.address());
        loop {
            match slot.try_update(address) {
                Ok(()) => return address,
                Err(now) if now.is_final_for(hash.tag()) => {
                    records.set_previous(address, now.address());
                }
                // The entry was removed: start over (the record is left unused).
                Err(_) => break,
            }
        }
    }
}

/// The addresses of every record of `key` reachable from the index, newest first.
pub(super) fn find_all(
    index: &HashIndex,
    guard: &EpochGuard<'_, '_>,
    records: &Records,
    key: u64,
) -> Vec<u64> {
    let mut found = Vec::new();
    let Some(slot) = index.find(guard, hash_of(key)) else {
        return found;
    };
    let mut address = slot.address();
    while address != INVALID_ADDRESS {
        if records.key(address) == key {
            found.push(address);
        }
        address = records.previous(address);
    }
    found
}

/// Every home bucket's chain holds at most one entry per tag and no tentative entry, and
/// every entry sits in the bucket its tag's records hash to (when its head is in memory).
pub(super) fn check_entries(index: &HashIndex, guard: &EpochGuard<'_, '_>, records: &Records) {
    let len = index.buckets(guard);
    let mut seen = HashSet::new();
    for (home, entry) in index.entries(guard) {
        assert!(
            !entry.is_tentative(),
            "tentative entry left in bucket {home}: {entry:?}"
        );
        assert!(
            seen.insert((home, entry.tag())),
            "two live entries of tag {} in bucket {home}",
            entry.tag()
        );
        if entry.address() != INVALID_ADDRESS
            && let ChainLink::Record { key_hash, .. } = records.link(entry.address())
        {
            assert_eq!(key_hash.tag(), entry.tag());
            assert_eq!(
                key_hash.bucket(len),
                home,
                "entry {entry:?} in the wrong bucket"
            );
        }
    }
}

/// A small deterministic generator (splitmix64) for the hash tier's random tests.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A skewed pick in `0..n`: small values far more often (about Zipf-like).
    pub(super) fn skewed(&mut self, n: u64) -> u64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((n as f64).powf(u) - 1.0) as u64 % n
    }
}

/// The count store's update: adds 1 to a little-endian `u64` (absent: 0).
pub(super) fn counter(old: Option<&[u8]>) -> Vec<u8> {
    (count(old.map(<[u8]>::to_vec)) + 1).to_le_bytes().to_vec()
}

/// A count store's value as a number (absent: 0).
pub(super) fn count(value: Option<Vec<u8>>) -> u64 {
    value.map_or(0, |v| {
        u64::from_le_bytes(v.try_into().expect("an 8-byte count"))
    })
}

/// The count of key `k` that the threads' own tallies add up to.
pub(super) fn expected_count(tallies: &[std::collections::HashMap<u64, u64>], k: u64) -> u64 {
    tallies
        .iter()
        .map(|m| m.get(&k).copied().unwrap_or(0))
        .sum()
}
