//! Helpers shared by the integration tests, each of which includes this module with
//! `mod common;`: a seeded generator whose seed is printed so a failure replays, range
//! bounds, the numbered keys and versioned values of the tests that race readers against
//! writers (`tree_batch`, `aio`), and the write failure of the fault tests (`tree_faults`,
//! `uring`).
// Every test binary compiles its own copy of this module and uses only part of it.
#![allow(dead_code, reason = "each test binary uses only some of the helpers")]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use bfdb::{Config, DbOptions, Error, HashStoreOptions, Tree};

// ---------------------------------------------------------------------------------------
// Seeds and a small PRNG
// ---------------------------------------------------------------------------------------

/// splitmix64: a tiny, well-mixed PRNG whose whole state is its seed, so a printed seed
/// replays the same operation sequence.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn percent(&mut self) -> u64 {
        self.below(100)
    }
}

/// The splitmix64 finaliser: a bijection on u64 that scatters neighbouring inputs.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The number in the environment variable `name`, if it is set and parses.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
}

/// The test's seed (from `BFDB_SEED` or the clock), printed so a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = env_u64("BFDB_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("{test}: seed {seed} (replay with BFDB_SEED={seed})");
    seed
}

/// Whether `k` lies between the bounds `lo` and `hi`.
pub fn in_bounds(k: &[u8], lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    let above = match lo {
        Bound::Included(l) => k >= l.as_slice(),
        Bound::Excluded(l) => k > l.as_slice(),
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(h) => k <= h.as_slice(),
        Bound::Excluded(h) => k < h.as_slice(),
        Bound::Unbounded => true,
    };
    above && below
}

// ---------------------------------------------------------------------------------------
// Numbered keys and versioned values
// ---------------------------------------------------------------------------------------

/// The key of number `i`: keys sort as their numbers do.
pub fn key(i: u64) -> Vec<u8> {
    format!("key{i:08}").into_bytes()
}

/// The value of key `i` at `version`: both numbers, so a reader can tell which key and
/// which write it came from, padded to 40 to 89 bytes.
pub fn value(i: u64, version: u64) -> Vec<u8> {
    let mut v = format!("{i}:{version}:").into_bytes();
    v.resize(40 + (i % 50) as usize, b'v');
    v
}

/// Parses a value written by `value`: the key number and version it carries.
pub fn parse_value(v: &[u8]) -> (u64, u64) {
    let s = std::str::from_utf8(v).expect("values are ASCII");
    let mut parts = s.split(':');
    let i = parts.next().unwrap().parse().unwrap();
    let version = parts.next().unwrap().parse().unwrap();
    (i, version)
}

/// A writer's next operation on key `i`, which it alone writes: announces the key's next
/// version in `started` (indexed by key number) before writing it, so a reader never sees
/// a version above `started`, then deletes the key or writes that version. Values grow
/// with the version so pages fill and split.
pub fn write_next_version(tree: &Tree, started: &[AtomicU64], i: u64, delete: bool) {
    let version = started[i as usize].load(Ordering::Relaxed) + 1;
    started[i as usize].store(version, Ordering::SeqCst);
    if delete {
        tree.delete(&key(i)).unwrap();
    } else {
        let mut v = value(i, version);
        v.resize(v.len() + (version % 40) as usize, b'w');
        tree.insert(&key(i), &v).unwrap();
    }
}

/// Checks what a scan yielded (in key order) while writers ran `write_next_version`,
/// deleting only odd keys: keys strictly increasing, each value one written for its key
/// and announced in `started`, and the even keys yielded exactly `stable` (ascending: the
/// even key numbers that exist throughout the scan's range).
pub fn check_racing_scan(
    got: &[(Vec<u8>, Vec<u8>)],
    mut stable: impl Iterator<Item = u64>,
    started: &[AtomicU64],
) {
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "ordered, unique");
    for (k, v) in got {
        let (i, version) = parse_value(v);
        assert_eq!(k, &key(i), "a value of another key");
        assert!(
            version <= started[i as usize].load(Ordering::SeqCst),
            "key {i}: v{version} never written"
        );
        if i % 2 == 0 {
            assert_eq!(stable.next(), Some(i), "a stable key is missing");
        }
    }
    assert_eq!(stable.next(), None, "stable keys missing at the end");
}

// ---------------------------------------------------------------------------------------
// Write failures
// ---------------------------------------------------------------------------------------

/// The fault tests' configuration: a 64 KiB pool, so that most of the records
/// `load_scattered` inserts live only in leaf pages, small records, and no promotion of
/// records read from leaf pages.
pub fn fault_config() -> Config {
    Config {
        memory_budget_bytes: 64 << 10,
        max_key_bytes: 32,
        max_value_bytes: 64,
        promotion_rate_percent: 0,
        scan_promotion_rate_percent: 0,
        ..Config::default()
    }
}

/// The key of number `i` in the fault tests: numbers scattered by a multiplicative hash,
/// so consecutive ones land on different leaf pages.
pub fn scattered_key(i: u32) -> Vec<u8> {
    format!("key{:08}", i.wrapping_mul(2_654_435_761) % 100_000_000).into_bytes()
}

/// Inserts the fault tests' first records (`scattered_key(i)` → `v{i}` for `i` below
/// 6000) into `tree` and returns them as the model.
pub fn load_scattered(tree: &Tree) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model = BTreeMap::new();
    for i in 0..6000 {
        let v = format!("v{i}").into_bytes();
        tree.insert(&scattered_key(i), &v).unwrap();
        model.insert(scattered_key(i), v);
    }
    model
}

/// Inserts fresh keys (`scattered_key` of 6000 on) into `tree`, and each acknowledged one
/// into `model`, until an insert fails, as one must once the store under the tree fails
/// writes (`fault` names why, for the message when none does). The failure must be
/// `Poisoned` or `Io`, and the next write `Poisoned`. Returns the refused write: it may
/// or may not have reached the tree (an error does not say it was not applied).
pub fn insert_until_refused(
    tree: &Tree,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    fault: &str,
) -> (Vec<u8>, Vec<u8>) {
    let mut failed = None;
    for i in 6000..20_000 {
        let v = format!("w{i}").into_bytes();
        match tree.insert(&scattered_key(i), &v) {
            Ok(()) => {
                model.insert(scattered_key(i), v);
            }
            Err(e) => {
                assert!(
                    matches!(e, Error::Poisoned { .. } | Error::Io(_)),
                    "unexpected error {e}"
                );
                failed = Some((scattered_key(i), v));
                break;
            }
        }
    }
    let refused = failed.unwrap_or_else(|| panic!("writes must fail once {fault}"));
    assert!(matches!(
        tree.insert(b"more", b"x"),
        Err(Error::Poisoned { .. })
    ));
    refused
}

// ---------------------------------------------------------------------------------------
// The simulated three-keyspace database of the crash and fault campaigns
// ---------------------------------------------------------------------------------------

/// Two trees and, last, a hash store.
pub const KEYSPACES: [&str; 3] = ["a", "b", "h"];
/// The index of the hash store in `KEYSPACES`.
pub const HASH: usize = 2;
/// Keys are `key0000` to `key0399` in each keyspace.
pub const KEYS: u64 = 400;

/// A hash store of a few pages: its hot log flushes and compacts into the cold log.
pub fn small_hash_options() -> HashStoreOptions {
    HashStoreOptions::default()
        .memory_bytes(64 << 10)
        .expected_keys(1024)
        .hot_log_disk_bytes(96 << 10)
        .cold_log_disk_bytes(512 << 10)
}

/// A database whose only syncs and checkpoints are the workload's own (so a sweep over
/// them is deterministic), with a pool small enough that mini-pages merge, leaves split
/// and pages are read back: 64 KiB for the trees once the hash store has its 64 KiB.
pub fn small_sim_options() -> DbOptions {
    sim_options(Config {
        memory_budget_bytes: 128 << 10,
        huge_pages: false,
        background_eviction: false,
        ..Config::default()
    })
}

/// [`small_sim_options`] with `config`.
fn sim_options(config: Config) -> DbOptions {
    DbOptions::default()
        .config(config)
        .flush_interval(std::time::Duration::from_secs(60))
        .checkpoint_log_bytes(0)
        .checkpoint_interval(None)
        .checkpoint_on_close(false)
        .log_segment_bytes(64 << 10)
}

// ---------------------------------------------------------------------------------------
// Long keys in the crash campaign and the fault suite (issue #34)
// ---------------------------------------------------------------------------------------

/// The longest key of the long-key runs, and their leaf page size, the least that holds
/// it.
pub const LONG_KEY_MAX_BYTES: usize = 4096;
pub const LONG_KEY_LEAF_PAGE_BYTES: usize = 16384;

/// The keys a campaign's workload writes, `KEYS` of them per keyspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// `key0000` to `key0399` in 4 KiB leaf pages.
    Short,
    /// A third of the keys long, up to [`LONG_KEY_MAX_BYTES`], in leaf pages of
    /// [`LONG_KEY_LEAF_PAGE_BYTES`]: see [`Keys::key`].
    Long,
}

impl Keys {
    /// Key number `i` (below `KEYS`). Short keys are `key` and four digits. With
    /// `Keys::Long` every other key is long instead: a family's shared prefix of 0,
    /// 1000, 2500 or (half of them) 3900 bytes, so that separators and fences between
    /// keys of a family are that long and the trees' inner nodes, which hold five
    /// separators of 4 KiB, split; then `key` and four digits; then filler to a length
    /// of its own, a quarter of them exactly [`LONG_KEY_MAX_BYTES`].
    pub fn key(self, i: u64) -> Vec<u8> {
        let name = format!("key{i:04}").into_bytes();
        let h = mix(i ^ 0x4c4f_4e47);
        if self == Keys::Short || !h.is_multiple_of(2) {
            return name;
        }
        long_named_key(&name, h >> 1)
    }

    /// Each key's number, to read a scan's keys back.
    pub fn numbers(self) -> std::collections::HashMap<Vec<u8>, u64> {
        (0..KEYS).map(|i| (self.key(i), i)).collect()
    }

    /// The database of the runs: [`small_sim_options`], or for long keys a tree pool of
    /// 256 KiB (the least for 16 KiB leaf pages: sixteen mini-pages of a whole leaf)
    /// beside the hash store's memory, with the key limit at 4 KiB.
    pub fn sim_options(self) -> DbOptions {
        match self {
            Keys::Short => small_sim_options(),
            Keys::Long => sim_options(Config {
                memory_budget_bytes: (256 << 10) + LONG_KEY_HASH_MEMORY_BYTES,
                max_key_bytes: LONG_KEY_MAX_BYTES,
                leaf_page_size_bytes: LONG_KEY_LEAF_PAGE_BYTES,
                huge_pages: false,
                background_eviction: false,
                ..Config::default()
            }),
        }
    }

    /// The hash store of the runs: [`small_hash_options`], or for long keys twice its
    /// memory and hot log and a cold log that holds what the keys take (half of 400
    /// keys of 2.5 KiB on average, each with a value of 1.2 KiB or more). Short keys
    /// keep their cold records in cold runs (`ColdLayout::Runs`, the default), long
    /// keys in the cold log (`ColdLayout::Log`), so that each campaign covers both
    /// layouts.
    pub fn hash_options(self) -> HashStoreOptions {
        match self {
            Keys::Short => small_hash_options(),
            Keys::Long => HashStoreOptions::default()
                .memory_bytes(LONG_KEY_HASH_MEMORY_BYTES)
                .expected_keys(1024)
                .hot_log_disk_bytes(256 << 10)
                .cold_log_disk_bytes(4 << 20)
                .cold_layout(bfdb::ColdLayout::Log),
        }
    }
}

/// A long key that holds `name` (unique, at most 196 bytes), drawn by `h`: a family's
/// shared prefix of 0, 1000, 2500 or (half of them) 3900 bytes, `name`, then filler to
/// a length of its own up to [`LONG_KEY_MAX_BYTES`], a quarter of them exactly that.
pub fn long_named_key(name: &[u8], h: u64) -> Vec<u8> {
    let family = (h % 6).min(3);
    let prefix = [0, 1000, 2500, 3900][family as usize];
    let mut k: Vec<u8> = (0..prefix)
        .map(|j| b"family"[j % 6] ^ family as u8)
        .collect();
    k.extend_from_slice(name);
    let len = if (h >> 8).is_multiple_of(4) {
        LONG_KEY_MAX_BYTES
    } else {
        k.len() + (h >> 16) as usize % (LONG_KEY_MAX_BYTES - k.len() + 1)
    };
    let mut filler = mix(h).to_le_bytes().into_iter().cycle();
    k.resize_with(len, || filler.next().unwrap());
    k
}

/// The hash store's memory in the long-key runs.
const LONG_KEY_HASH_MEMORY_BYTES: u64 = 128 << 10;

// ---------------------------------------------------------------------------------------
// Long values (tests/db_values.rs, tests/hash_values.rs)
// ---------------------------------------------------------------------------------------

/// A long value's key: `key` and six digits.
pub fn long_key(i: u64) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

/// A value of `len` bytes that says which key and version it is everywhere in it, so
/// that a value torn or mixed from two versions is told apart.
pub fn long_value(key: u64, version: u64, len: usize) -> Vec<u8> {
    let stamp = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version;
    (0..len)
        .map(|i| (stamp.rotate_left((i % 64) as u32) as u8) ^ (i / 64) as u8)
        .collect()
}

/// Sizes around every edge of values kept out of line: the inline limit, a block, a
/// chunk of the chunk table, and values of MiBs.
pub const LONG_VALUE_SIZES: [usize; 12] = [
    0,
    1,
    2048,
    2049,
    4095,
    4096,
    4097,
    65535,
    65536,
    65537,
    1 << 20,
    (5 << 20) + 3,
];

/// A value that names its key and version in every 16 bytes, `len` long (at least 16).
pub fn stamped(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut word = [0u8; 16];
    word[..8].copy_from_slice(&key.to_le_bytes());
    word[8..].copy_from_slice(&version.to_le_bytes());
    word.iter().copied().cycle().take(len.max(16)).collect()
}

/// Whether `v` is one whole value `stamped(key, ..)` wrote: every 16 bytes the same key
/// and version. Answers the version.
pub fn check_stamped(key: u64, v: &[u8]) -> Result<u64, String> {
    let head: [u8; 16] = v
        .get(..16)
        .and_then(|h| h.try_into().ok())
        .ok_or(format!("key {key}: a value of {} bytes", v.len()))?;
    let found = u64::from_le_bytes(head[..8].try_into().unwrap());
    if found != key {
        return Err(format!("key {key}: a value of key {found}"));
    }
    if v.chunks(16).any(|c| c != &head[..c.len()]) {
        return Err(format!(
            "key {key}: a value mixed from two writes (torn or reused)"
        ));
    }
    Ok(u64::from_le_bytes(head[8..].try_into().unwrap()))
}

/// `stamp` repeated to `len` bytes (cut short at the end): a value whose every part names
/// the write that made it, as the crash campaign and the fault suite write them.
pub fn repeated(stamp: &[u8], len: usize) -> Vec<u8> {
    stamp
        .iter()
        .copied()
        .cycle()
        .take(len.max(stamp.len()))
        .collect()
}

/// `value` with its last 4 bytes set so that its crc32c is `crc`: a value of another's
/// length and checksum, and so of its value-store reference if written into its extent,
/// but other bytes (the value cache's invalidation tests). A crc32c is an affine
/// function of the message bits and the last 32 bits reach all of it: they are solved
/// for over GF(2). (The crate's unit tests have the same helper: `storage::values`.)
pub fn with_crc(mut value: Vec<u8>, crc: u32) -> Vec<u8> {
    let at = value.len().checked_sub(4).expect("at least 4 bytes");
    let mut crc_with = |tail: u32| {
        value[at..].copy_from_slice(&tail.to_le_bytes());
        crc32c::crc32c(&value)
    };
    let base = crc_with(0);
    // A reduced basis of the tail bits' effects, by highest bit: (effect, tail bits).
    let mut basis = [(0u32, 0u32); 32];
    for i in 0..32 {
        let (mut effect, mut bits) = (crc_with(1 << i) ^ base, 1u32 << i);
        for bit in (0..32).rev() {
            if effect >> bit & 1 == 0 {
                continue;
            }
            if basis[bit].0 == 0 {
                basis[bit] = (effect, bits);
                break;
            }
            effect ^= basis[bit].0;
            bits ^= basis[bit].1;
        }
    }
    let (mut want, mut tail) = (crc ^ base, 0);
    for bit in (0..32).rev() {
        if want >> bit & 1 == 1 {
            want ^= basis[bit].0;
            tail ^= basis[bit].1;
        }
    }
    assert_eq!(crc_with(tail), crc);
    value
}

/// Bytes of the value store's extent for a value of `len` bytes: the value, a crc32c
/// per 64 KiB chunk if it has more than one, rounded up to whole 4 KiB blocks.
pub fn extent_bytes(len: usize) -> u64 {
    let len = len as u64;
    let table = if len > 65_536 {
        4 * len.div_ceil(65_536)
    } else {
        0
    };
    (len + table).max(1).next_multiple_of(4096)
}

/// Bytes the files of `dir` whose names start with `prefix` hold on disk: their
/// allocated blocks, as `du` counts them (holes punched and space never written are not
/// counted; space reserved with `fallocate` is).
pub fn allocated_bytes(dir: &std::path::Path, prefix: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        // A file removed meanwhile (a log segment retired) holds nothing.
        .map(|e| e.metadata().map_or(0, |m| m.blocks() * 512))
        .sum()
}
