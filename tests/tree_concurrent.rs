//! Concurrent tests of the Tree (issue 3): disjoint writers, overlapping writers, readers
//! racing splits, scans racing writers, a mixed stress test, and fresh reads (every answer
//! of a read without the page lock is a state its key had during the read), each with at
//! least 8 threads on a pool so small that mini-page growth, merges, evictions, copy-on-access and
//! leaf and inner splits happen all the time while the threads race. Every test asserts
//! afterwards, through `stats()`, that those paths really ran.
//!
//! Each test prints its seed. Replay one with `BFDB_SEED=<seed>`; the thread schedule is
//! not replayable, but the operation sequences are.
//!
//! Heavier variants (16 and 32 threads, four times the operations) are `#[ignore]`d:
//!
//! ```text
//! cargo test --release --test tree_concurrent -- --ignored
//! ```
//!
//! `BFDB_THREADS=<n>` and `BFDB_SCALE=<n>` override the thread count and multiply the
//! operation counts of every test, for shaking out rare interleavings in a shell loop:
//!
//! ```text
//! for i in $(seq 50); do cargo test --test tree_concurrent || break; done
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};

use bfdb::{Config, Tree, TreeStats};

mod common;
use common::{Rng, env_u64, in_bounds, mix, seed};

// ---------------------------------------------------------------------------------------
// Knobs (seeds and the PRNG are in `common`)
// ---------------------------------------------------------------------------------------

fn threads(default: usize) -> usize {
    env_u64("BFDB_THREADS").map_or(default, |n| n.max(8) as usize)
}

fn scaled(ops: usize) -> usize {
    ops * env_u64("BFDB_SCALE").unwrap_or(1).max(1) as usize
}

/// A tiny pool and small records: with 64 KiB of mini-pages for thousands of keys, every
/// path of the buffer pool runs constantly.
fn tiny(memory_budget_bytes: u64) -> Config {
    Config {
        memory_budget_bytes,
        max_key_bytes: 48,
        max_value_bytes: 160,
        copy_on_access_percent: 25,
        merge_threshold_bytes: 1024,
        huge_pages: false,
        ..Config::default()
    }
}

// ---------------------------------------------------------------------------------------
// Keys and self-checking values
// ---------------------------------------------------------------------------------------

/// Key prefixes shared by many keys, so pages and mini-pages use prefix compression.
/// None is a hex digit and none is a prefix of another followed by a hex digit, so keys
/// built from distinct indexes are distinct.
const PREFIXES: [&[u8]; 6] = [
    b"",
    b"user/",
    b"user/profile/",
    b"u",
    b"order:2024:",
    b"\xff\xfe",
];

/// The key of index `i`: a shared prefix, the index scrambled by a bijection (so nearby
/// indexes land on different pages and each thread's keys interleave with the others'),
/// and a tail of varying length. 16 to 37 bytes.
fn key(i: u64) -> Vec<u8> {
    let h = mix(i ^ 0x5151);
    let mut k = PREFIXES[(h % PREFIXES.len() as u64) as usize].to_vec();
    k.extend_from_slice(format!("{:016x}", mix(i)).as_bytes());
    k.extend(std::iter::repeat_n(b'~', ((h >> 8) % 9) as usize));
    k
}

/// A 32-bit fingerprint of a key, stored in its values so a record that shows up under
/// the wrong key (misrouted, half-merged, mixed with a neighbour) is caught.
fn fingerprint(key: &[u8]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ (h >> 32)) as u32
}

/// The writer id of values inserted before the threads start.
const PRELOAD: u16 = u16::MAX;

/// A value for `key` written by thread `tid` as its `seq`-th write: the writer, the
/// sequence number and the key's fingerprint, padded with a derived byte to a length
/// between 10 and 130 bytes, so records of many sizes fill the pages.
fn value(key: &[u8], tid: u16, seq: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(130);
    v.extend_from_slice(&tid.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&fingerprint(key).to_le_bytes());
    let pad = mix(u64::from(seq) << 16 | u64::from(tid)) % 121;
    v.extend(std::iter::repeat_n(pad_byte(tid, seq), pad as usize));
    v
}

fn pad_byte(tid: u16, seq: u32) -> u8 {
    (seq as u8) ^ (tid as u8) ^ 0xa5
}

/// Checks that `v` is a well-formed value written for `key` and returns (writer, seq).
fn decode(key: &[u8], v: &[u8]) -> Result<(u16, u32), String> {
    let show = || format!("key {:?} value {:?}", String::from_utf8_lossy(key), v);
    if v.len() < 10 {
        return Err(format!("value too short: {}", show()));
    }
    let tid = u16::from_le_bytes([v[0], v[1]]);
    let seq = u32::from_le_bytes([v[2], v[3], v[4], v[5]]);
    let fp = u32::from_le_bytes([v[6], v[7], v[8], v[9]]);
    if fp != fingerprint(key) {
        return Err(format!("value belongs to another key: {}", show()));
    }
    if v != value(key, tid, seq).as_slice() {
        return Err(format!("value torn or corrupted: {}", show()));
    }
    Ok((tid, seq))
}

/// Counts a finished thread when dropped, including when the thread panics, so threads
/// that loop "until the writers are done" cannot spin forever behind a failed writer.
struct Finished<'a>(&'a AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------
// Shared checks
// ---------------------------------------------------------------------------------------

/// Asserts that every named counter moved, i.e. that the race really exercised it.
fn assert_happened(s: &TreeStats, wanted: &[&str]) {
    let get = |name: &str| -> u64 {
        match name {
            "mini_pages_created" => s.mini_pages_created,
            "mini_page_growths" => s.mini_page_growths,
            "merges" => s.merges,
            "evictions" => s.evictions,
            "background_reclaimed_blocks" => s.background_reclaimed_blocks,
            "copy_on_access" => s.copy_on_access,
            "records_promoted" => s.records_promoted,
            "phantoms_promoted" => s.phantoms_promoted,
            "mirrors_created" => s.mirrors_created,
            "leaf_splits" => s.leaf_splits,
            "leaf_redistributions" => s.leaf_redistributions,
            "inner_splits" => s.inner_splits,
            "restarts" => s.restarts,
            other => panic!("unknown counter {other}"),
        }
    };
    let missing: Vec<&str> = wanted.iter().copied().filter(|n| get(n) == 0).collect();
    assert!(
        missing.is_empty(),
        "these paths never ran: {missing:?}\n{s:#?}"
    );
}

fn collect_range(
    tree: &Tree,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    rev: bool,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let it = tree.range::<&[u8], _>((lo, hi));
    let out: Result<Vec<_>, _> = if rev {
        it.rev().collect()
    } else {
        it.collect()
    };
    out.expect("scan failed")
}

/// After the threads joined: point reads, forward and reverse full scans and prefix
/// scans all agree with `model` exactly.
fn check_quiescent(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>, absent: &[Vec<u8>]) {
    for (k, v) in model {
        assert_eq!(
            tree.get(k).unwrap().as_ref(),
            Some(v),
            "get of key {:?}",
            String::from_utf8_lossy(k)
        );
    }
    for k in absent {
        assert_eq!(
            tree.get(k).unwrap(),
            None,
            "deleted key {:?} still readable",
            String::from_utf8_lossy(k)
        );
    }
    let expect: Vec<(Vec<u8>, Vec<u8>)> =
        model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let all = collect_range(tree, Bound::Unbounded, Bound::Unbounded, false);
    assert_scan_eq(&all, &expect, "forward full scan");
    let mut back = collect_range(tree, Bound::Unbounded, Bound::Unbounded, true);
    back.reverse();
    assert_scan_eq(&back, &expect, "reverse full scan");
    for p in PREFIXES.iter().filter(|p| !p.is_empty()) {
        let got: Vec<_> = tree.prefix(p).collect::<Result<_, _>>().unwrap();
        let want: Vec<_> = expect
            .iter()
            .filter(|(k, _)| k.starts_with(p))
            .cloned()
            .collect();
        assert_scan_eq(
            &got,
            &want,
            &format!("prefix {:?}", String::from_utf8_lossy(p)),
        );
    }
}

/// The end of a test: the quiescent checks of `check_quiescent`, then the tree's counters,
/// printed and checked to show that the `wanted` paths ran. Returns the counters.
fn check_end(
    tree: &Tree,
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    absent: &[Vec<u8>],
    wanted: &[&str],
) -> TreeStats {
    check_quiescent(tree, model, absent);
    let s = tree.stats();
    eprintln!("{s:#?}");
    assert_happened(&s, wanted);
    s
}

/// The paths that every race of readers and writers on a tiny pool drives: merges and
/// evictions (the writers' own and the background evictor's), copy-on-access, promotion of records and phantoms read from leaf pages,
/// mirrors made by scans, and leaf splits.
const READ_WRITE_PATHS: &[&str] = &[
    "merges",
    "evictions",
    "background_reclaimed_blocks",
    "copy_on_access",
    "records_promoted",
    "phantoms_promoted",
    "mirrors_created",
    "leaf_splits",
    "leaf_redistributions",
];

/// Equality of two scans, reporting the first difference instead of two huge vectors.
fn assert_scan_eq(got: &[(Vec<u8>, Vec<u8>)], want: &[(Vec<u8>, Vec<u8>)], what: &str) {
    if got == want {
        return;
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let show = |r: Option<&(Vec<u8>, Vec<u8>)>| {
        r.map(|(k, v)| format!("{:?} ({} value bytes)", String::from_utf8_lossy(k), v.len()))
    };
    panic!(
        "{what}: {} records, expected {}; first difference at {first}: got {:?}, expected {:?}",
        got.len(),
        want.len(),
        show(got.get(first)),
        show(want.get(first)),
    );
}

/// Random bounds over `keys` (sorted), of every kind, sometimes between keys.
fn random_bounds(rng: &mut Rng, keys: &[Vec<u8>]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let pick = |rng: &mut Rng| -> Vec<u8> {
        let mut k = keys[rng.below(keys.len() as u64) as usize].clone();
        match rng.below(4) {
            0 => k.push(0),
            1 => {
                k.pop();
            }
            _ => {}
        }
        if k.is_empty() { vec![0] } else { k }
    };
    let mut a = pick(rng);
    let mut b = pick(rng);
    if a > b {
        std::mem::swap(&mut a, &mut b);
    }
    let bound = |rng: &mut Rng, k: Vec<u8>| match rng.below(5) {
        0 => Bound::Unbounded,
        1 | 2 => Bound::Included(k),
        _ => Bound::Excluded(k),
    };
    (bound(rng, a), bound(rng, b))
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// How a scan walks its range.
#[derive(Clone, Copy, Debug)]
enum Walk {
    Forward,
    Backward,
    /// Alternating `next` and `next_back` until the two ends meet.
    BothEnds,
}

/// Scans with `walk` and returns the records in ascending key order, asserting on the way
/// that each end moves strictly monotonically and never yields a key twice.
fn scan_checked(
    tree: &Tree,
    lo: &Bound<Vec<u8>>,
    hi: &Bound<Vec<u8>>,
    walk: Walk,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut it = tree.range::<&[u8], _>((as_ref(lo), as_ref(hi)));
    let mut front: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut back: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut turn = 0u64;
    loop {
        let from_back = match walk {
            Walk::Forward => false,
            Walk::Backward => true,
            Walk::BothEnds => {
                turn += 1;
                turn.is_multiple_of(3)
            }
        };
        let item = if from_back { it.next_back() } else { it.next() };
        let Some(item) = item else { break };
        let (k, v) = item.expect("scan failed");
        assert!(
            in_bounds(&k, lo, hi),
            "{walk:?} scan of ({lo:?}, {hi:?}) yielded out-of-range key {:?}",
            String::from_utf8_lossy(&k)
        );
        if from_back {
            if let Some((prev, _)) = back.last() {
                assert!(
                    k < *prev,
                    "{walk:?} scan: key {:?} after {:?} going backwards",
                    String::from_utf8_lossy(&k),
                    String::from_utf8_lossy(prev)
                );
            }
            back.push((k, v));
        } else {
            if let Some((prev, _)) = front.last() {
                assert!(
                    k > *prev,
                    "{walk:?} scan: key {:?} after {:?} going forwards",
                    String::from_utf8_lossy(&k),
                    String::from_utf8_lossy(prev)
                );
            }
            front.push((k, v));
        }
    }
    if let (Some((f, _)), Some((b, _))) = (front.last(), back.last()) {
        assert!(
            f < b,
            "both-ends scan: the ends crossed ({:?} from the front, {:?} from the back)",
            String::from_utf8_lossy(f),
            String::from_utf8_lossy(b)
        );
    }
    back.reverse();
    front.extend(back);
    front
}

// ---------------------------------------------------------------------------------------
// 1. Disjoint writers
// ---------------------------------------------------------------------------------------

/// Each thread inserts, updates and deletes its own keys (interleaved in key order with
/// every other thread's) and checks its own model as it goes: since nobody else writes
/// its keys, its point reads, and the part of any scan that falls on its keys, must be
/// exact even while the others split and merge the same pages. Afterwards the tree must
/// equal the merged model exactly.
fn disjoint_writers(n_threads: usize, ops: usize) {
    let seed = seed("disjoint_writers");
    let tree = Tree::in_memory(tiny(64 << 10)).unwrap();
    let keys_per_thread = 1400u64;
    let start = Barrier::new(n_threads);
    let models: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n_threads)
            .map(|t| {
                let tree = &tree;
                let start = &start;
                s.spawn(move || {
                    let mut rng = Rng(seed ^ mix(t as u64 + 1));
                    let own = |j: u64| key(j * 64 + t as u64);
                    let mut model = BTreeMap::new();
                    let mut buf = Vec::new();
                    start.wait();
                    for seq in 0..ops as u32 {
                        let k = own(rng.below(keys_per_thread));
                        match rng.percent() {
                            0..55 => {
                                let v = value(&k, t as u16, seq);
                                tree.insert(&k, &v).unwrap();
                                model.insert(k, v);
                            }
                            55..75 => {
                                tree.delete(&k).unwrap();
                                model.remove(&k);
                            }
                            75..97 => {
                                let found = tree.get_into(&k, &mut buf).unwrap();
                                assert_eq!(
                                    found.then_some(&buf),
                                    model.get(&k),
                                    "thread {t} seq {seq}: own key {:?}",
                                    String::from_utf8_lossy(&k)
                                );
                            }
                            _ => {
                                // A bounded scan: the records of this thread's keys must
                                // be exactly its model's, in order.
                                let a = own(rng.below(keys_per_thread));
                                let (lo, hi) = if a < k { (a, k) } else { (k, a) };
                                let (lo, hi) = (Bound::Included(lo), Bound::Excluded(hi));
                                let walk = [Walk::Forward, Walk::Backward, Walk::BothEnds]
                                    [rng.below(3) as usize];
                                let got: Vec<_> = scan_checked(tree, &lo, &hi, walk)
                                    .into_iter()
                                    .filter(|(k, v)| decode(k, v).unwrap().0 == t as u16)
                                    .collect();
                                let want: Vec<_> = model
                                    .range((lo.clone(), hi.clone()))
                                    .map(|(k, v)| (k.clone(), v.clone()))
                                    .collect();
                                assert_scan_eq(
                                    &got,
                                    &want,
                                    &format!("thread {t} seq {seq}: {walk:?} scan of own keys"),
                                );
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut merged = BTreeMap::new();
    let mut absent = Vec::new();
    for (t, model) in models.into_iter().enumerate() {
        for j in 0..keys_per_thread {
            let k = key(j * 64 + t as u64);
            if !model.contains_key(&k) {
                absent.push(k);
            }
        }
        merged.extend(model);
    }
    check_end(
        &tree,
        &merged,
        &absent,
        &[
            "mini_pages_created",
            "mini_page_growths",
            "merges",
            "evictions",
            "copy_on_access",
            "leaf_splits",
            "leaf_redistributions",
            "inner_splits",
        ],
    );
}

#[test]
fn disjoint_writers_8_threads() {
    disjoint_writers(threads(8), scaled(2500));
}

/// Heavier: `cargo test --release --test tree_concurrent -- --ignored`.
#[test]
#[ignore = "heavy; run with --release -- --ignored"]
fn disjoint_writers_32_threads() {
    disjoint_writers(32, scaled(10_000));
}

// ---------------------------------------------------------------------------------------
// 2. Overlapping writers
// ---------------------------------------------------------------------------------------

/// Each thread's last operation on a key, and the highest sequence number it has issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Last {
    Put(u32),
    Delete,
}

/// Every thread writes values encoding (thread, sequence) to one shared key set, and
/// deletes some. Afterwards each key's value (t, s) must be the last value thread t wrote
/// to that key, and an absent key must be one whose last operation by some thread was a
/// delete (or that nobody wrote). Reads during the race must decode, belong to their key
/// and carry a sequence number its writer had already issued.
fn overlapping_writers(n_threads: usize, ops: usize) {
    let seed = seed("overlapping_writers");
    let tree = Tree::in_memory(tiny(64 << 10)).unwrap();
    let n_keys = 1500u64;
    let keys: Vec<Vec<u8>> = (0..n_keys).map(key).collect();
    // Highest sequence number each thread has started writing (stored before the write).
    let issued: Vec<AtomicU32> = (0..n_threads).map(|_| AtomicU32::new(0)).collect();
    let start = Barrier::new(n_threads);
    let lasts: Vec<HashMap<u64, Last>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n_threads)
            .map(|t| {
                let (tree, keys, issued, start) = (&tree, &keys, &issued, &start);
                s.spawn(move || {
                    let mut rng = Rng(seed ^ mix(t as u64 + 100));
                    let mut last = HashMap::new();
                    start.wait();
                    for seq in 1..=ops as u32 {
                        // Skewed: a hot tenth of the keys gets half the operations, so
                        // threads collide on the same keys and pages.
                        let i = if rng.below(2) == 0 {
                            rng.below(n_keys / 10)
                        } else {
                            rng.below(n_keys)
                        };
                        let k = &keys[i as usize];
                        match rng.percent() {
                            0..65 => {
                                issued[t].store(seq, Ordering::Release);
                                tree.insert(k, &value(k, t as u16, seq)).unwrap();
                                last.insert(i, Last::Put(seq));
                            }
                            65..80 => {
                                tree.delete(k).unwrap();
                                last.insert(i, Last::Delete);
                            }
                            _ => {
                                if let Some(v) = tree.get(k).unwrap() {
                                    let (w, s) = decode(k, &v).unwrap();
                                    assert!((w as usize) < n_threads, "writer {w}");
                                    let max = issued[w as usize].load(Ordering::Acquire);
                                    assert!(
                                        s >= 1 && s <= max,
                                        "read ({w}, {s}) but thread {w} had issued only {max}"
                                    );
                                }
                            }
                        }
                    }
                    last
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut model = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        let i = i as u64;
        match tree.get(k).unwrap() {
            Some(v) => {
                let (w, s) = decode(k, &v).unwrap();
                assert_eq!(
                    lasts[w as usize].get(&i),
                    Some(&Last::Put(s)),
                    "key {:?} holds ({w}, {s}), which is not thread {w}'s last write to it",
                    String::from_utf8_lossy(k)
                );
                model.insert(k.clone(), v);
            }
            None => assert!(
                lasts.iter().all(|l| !l.contains_key(&i))
                    || lasts.iter().any(|l| l.get(&i) == Some(&Last::Delete)),
                "key {:?} is absent but every thread's last operation on it was an insert: {:?}",
                String::from_utf8_lossy(k),
                lasts.iter().map(|l| l.get(&i)).collect::<Vec<_>>()
            ),
        }
    }
    check_end(
        &tree,
        &model,
        &[],
        &[
            "mini_page_growths",
            "merges",
            "evictions",
            "copy_on_access",
            "leaf_splits",
            "leaf_redistributions",
        ],
    );
}

#[test]
fn overlapping_writers_8_threads() {
    overlapping_writers(threads(8), scaled(2500));
}

/// Heavier: `cargo test --release --test tree_concurrent -- --ignored`.
#[test]
#[ignore = "heavy; run with --release -- --ignored"]
fn overlapping_writers_32_threads() {
    overlapping_writers(32, scaled(10_000));
}

// ---------------------------------------------------------------------------------------
// 3. Readers concurrent with splits
// ---------------------------------------------------------------------------------------

/// Preloads a key set, then writers insert many new keys between the preloaded ones
/// (splitting leaves and inner nodes, the root included) and rewrite preloaded keys with
/// their same value (so their mini-pages are dirty and get merged), while readers
/// repeatedly read preloaded keys, keys a writer has finished inserting, and keys nobody
/// inserts. A preloaded or finished key must never read as absent or with another value,
/// and a never-inserted key must never appear.
fn readers_during_splits(n_readers: usize, n_writers: usize, per_writer: usize) {
    let seed = seed("readers_during_splits");
    let tree = Tree::in_memory(Config {
        // Reads take the promoting path often: cached records and phantoms.
        promotion_rate_percent: 40,
        scan_promotion_rate_percent: 40,
        ..tiny(128 << 10)
    })
    .unwrap();
    // Index space: preloaded keys are multiples of 8; writer w owns 8j + 1 + w (w < 7);
    // indexes >= 1 << 40 are never inserted.
    let n_pre = 1500u64;
    assert!(n_writers <= 7);
    for j in 0..n_pre {
        let k = key(8 * j);
        tree.insert(&k, &value(&k, PRELOAD, 0)).unwrap();
    }
    let before = tree.stats();
    let progress: Vec<AtomicUsize> = (0..n_writers).map(|_| AtomicUsize::new(0)).collect();
    let writers_done = AtomicUsize::new(0);
    let start = Barrier::new(n_readers + n_writers);
    let writer_key = |w: usize, j: usize| key(8 * j as u64 + 1 + w as u64);
    std::thread::scope(|s| {
        for w in 0..n_writers {
            let (tree, progress, writers_done, start) = (&tree, &progress, &writers_done, &start);
            s.spawn(move || {
                let _finished = Finished(writers_done);
                let mut rng = Rng(seed ^ mix(w as u64 + 200));
                start.wait();
                for j in 0..per_writer {
                    let k = writer_key(w, j);
                    tree.insert(&k, &value(&k, w as u16, j as u32)).unwrap();
                    progress[w].store(j + 1, Ordering::Release);
                    if rng.below(4) == 0 {
                        let p = key(8 * rng.below(n_pre));
                        tree.insert(&p, &value(&p, PRELOAD, 0)).unwrap();
                    }
                }
            });
        }
        for r in 0..n_readers {
            let (tree, progress, writers_done, start) = (&tree, &progress, &writers_done, &start);
            s.spawn(move || {
                let mut rng = Rng(seed ^ mix(r as u64 + 300));
                let mut buf = Vec::new();
                start.wait();
                let mut reads = 0u64;
                // Keep reading until every writer finished, and at least a few thousand.
                while writers_done.load(Ordering::Acquire) < n_writers || reads < 3000 {
                    reads += 1;
                    match rng.percent() {
                        0..60 => {
                            let k = key(8 * rng.below(n_pre));
                            let found = tree.get_into(&k, &mut buf).unwrap();
                            assert!(
                                found,
                                "reader {r}: preloaded key {:?} missing (read {reads})",
                                String::from_utf8_lossy(&k)
                            );
                            assert_eq!(decode(&k, &buf).unwrap(), (PRELOAD, 0));
                        }
                        60..90 => {
                            let w = rng.below(n_writers as u64) as usize;
                            // Everything below `done` was inserted before this read began.
                            let done = progress[w].load(Ordering::Acquire);
                            if done == 0 {
                                continue;
                            }
                            let j = done - 1 - rng.below(done.min(200) as u64) as usize;
                            let k = writer_key(w, j);
                            let v = tree.get(&k).unwrap().unwrap_or_else(|| {
                                panic!(
                                    "reader {r}: key {:?} of writer {w} (#{j}, {done} done) missing",
                                    String::from_utf8_lossy(&k)
                                )
                            });
                            assert_eq!(decode(&k, &v).unwrap(), (w as u16, j as u32));
                        }
                        _ => {
                            let k = key((1 << 40) + rng.below(5000));
                            assert_eq!(
                                tree.get(&k).unwrap(),
                                None,
                                "reader {r}: never-inserted key {:?} found",
                                String::from_utf8_lossy(&k)
                            );
                        }
                    }
                }
            });
        }
    });
    let mut model = BTreeMap::new();
    for j in 0..n_pre {
        let k = key(8 * j);
        model.insert(k.clone(), value(&k, PRELOAD, 0));
    }
    for w in 0..n_writers {
        for j in 0..per_writer {
            let k = writer_key(w, j);
            model.insert(k.clone(), value(&k, w as u16, j as u32));
        }
    }
    let s = check_end(
        &tree,
        &model,
        &[],
        &[
            "records_promoted",
            "phantoms_promoted",
            "merges",
            "evictions",
            "copy_on_access",
        ],
    );
    assert!(
        s.inner_splits > before.inner_splits && s.leaf_splits > before.leaf_splits,
        "no splits while the readers ran: before {before:#?}, after {s:#?}"
    );
}

#[test]
fn readers_during_splits_8_threads() {
    let n = threads(8);
    readers_during_splits(n - n / 2, (n / 2).min(7), scaled(2500));
}

/// Heavier: `cargo test --release --test tree_concurrent -- --ignored`.
#[test]
#[ignore = "heavy; run with --release -- --ignored"]
fn readers_during_splits_32_threads() {
    readers_during_splits(25, 7, scaled(10_000));
}

// ---------------------------------------------------------------------------------------
// 4. Scans concurrent with writers
// ---------------------------------------------------------------------------------------

/// Stable keys (every third index) are preloaded and never deleted, only overwritten;
/// the other keys come and go. Scanners run forward, backward and from both ends, over
/// full and bounded ranges and prefixes, and check: keys strictly ordered, no duplicates,
/// every key in range, every stable key in range present, every key one that writers
/// use, every value a well-formed value that its writer had already issued.
fn scans_during_writes(n_scanners: usize, n_writers: usize, ops: usize) {
    let seed = seed("scans_during_writes");
    let tree = Tree::in_memory(Config {
        promotion_rate_percent: 30,
        scan_promotion_rate_percent: 30,
        ..tiny(64 << 10)
    })
    .unwrap();
    let n_keys = 3000u64;
    let universe: HashMap<Vec<u8>, u64> = (0..n_keys).map(|i| (key(i), i)).collect();
    let stable = |i: u64| i.is_multiple_of(3);
    let mut sorted_keys: Vec<Vec<u8>> = universe.keys().cloned().collect();
    sorted_keys.sort();
    let stable_sorted: Vec<Vec<u8>> = sorted_keys
        .iter()
        .filter(|k| stable(universe[*k]))
        .cloned()
        .collect();
    for i in (0..n_keys).filter(|&i| stable(i) || i % 3 == 1) {
        let k = key(i);
        tree.insert(&k, &value(&k, PRELOAD, 0)).unwrap();
    }
    let issued: Vec<AtomicU32> = (0..n_writers).map(|_| AtomicU32::new(0)).collect();
    let writers_done = AtomicUsize::new(0);
    let start = Barrier::new(n_scanners + n_writers);
    let scans = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..n_writers {
            let (tree, issued, start, writers_done) = (&tree, &issued, &start, &writers_done);
            s.spawn(move || {
                let _finished = Finished(writers_done);
                let mut rng = Rng(seed ^ mix(w as u64 + 400));
                start.wait();
                for seq in 1..=ops as u32 {
                    let i = rng.below(n_keys);
                    let k = key(i);
                    if stable(i) || rng.percent() < 60 {
                        issued[w].store(seq, Ordering::Release);
                        tree.insert(&k, &value(&k, w as u16, seq)).unwrap();
                    } else {
                        tree.delete(&k).unwrap();
                    }
                }
            });
        }
        for r in 0..n_scanners {
            let (tree, issued, start, writers_done, scans) =
                (&tree, &issued, &start, &writers_done, &scans);
            let (universe, sorted_keys, stable_sorted) = (&universe, &sorted_keys, &stable_sorted);
            s.spawn(move || {
                let mut rng = Rng(seed ^ mix(r as u64 + 500));
                start.wait();
                let mut n = 0u64;
                while writers_done.load(Ordering::Acquire) < n_writers || n < 20 {
                    n += 1;
                    let (lo, hi) = match rng.below(6) {
                        0 => (Bound::Unbounded, Bound::Unbounded),
                        1 => {
                            let p = PREFIXES[1 + rng.below(PREFIXES.len() as u64 - 1) as usize];
                            let mut end = p.to_vec();
                            *end.last_mut().unwrap() += 1;
                            (Bound::Included(p.to_vec()), Bound::Excluded(end))
                        }
                        _ => random_bounds(&mut rng, sorted_keys),
                    };
                    let walk = [Walk::Forward, Walk::Backward, Walk::BothEnds][rng.below(3) as usize];
                    let got = scan_checked(tree, &lo, &hi, walk);
                    for (k, v) in &got {
                        assert!(
                            universe.contains_key(k),
                            "scanner {r}: unknown key {:?}",
                            String::from_utf8_lossy(k)
                        );
                        let (w, s) = decode(k, v).unwrap();
                        if w != PRELOAD {
                            let max = issued[w as usize].load(Ordering::Acquire);
                            assert!(s <= max, "scanner {r}: ({w}, {s}) not issued yet ({max})");
                        }
                    }
                    let got_keys: BTreeSet<&[u8]> = got.iter().map(|(k, _)| k.as_slice()).collect();
                    for k in stable_sorted.iter().filter(|k| in_bounds(k, &lo, &hi)) {
                        assert!(
                            got_keys.contains(k.as_slice()),
                            "scanner {r}: {walk:?} scan of ({lo:?}, {hi:?}) skipped stable key {:?} ({} records)",
                            String::from_utf8_lossy(k),
                            got.len()
                        );
                    }
                    scans.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    eprintln!("{} scans", scans.load(Ordering::Relaxed));
    // Quiescent: the scan equals what point reads say, and every stable key is there.
    let model: BTreeMap<Vec<u8>, Vec<u8>> = sorted_keys
        .iter()
        .filter_map(|k| tree.get(k).unwrap().map(|v| (k.clone(), v)))
        .collect();
    for k in &stable_sorted {
        assert!(
            model.contains_key(k),
            "stable key {:?} lost",
            String::from_utf8_lossy(k)
        );
    }
    check_end(
        &tree,
        &model,
        &[],
        &[
            "mini_page_growths",
            "merges",
            "evictions",
            "copy_on_access",
            "mirrors_created",
            "leaf_splits",
            "leaf_redistributions",
        ],
    );
}

#[test]
fn scans_during_writes_8_threads() {
    let n = threads(8);
    scans_during_writes(n / 2, n - n / 2, scaled(4000));
}

/// Heavier: `cargo test --release --test tree_concurrent -- --ignored`.
#[test]
#[ignore = "heavy; run with --release -- --ignored"]
fn scans_during_writes_32_threads() {
    scans_during_writes(16, 16, scaled(10_000));
}

// ---------------------------------------------------------------------------------------
// Mixed stress
// ---------------------------------------------------------------------------------------

/// Every thread runs a random mix of all operations on one shared key set, on a
/// file-backed tree, with occasional flushes. Afterwards: each present key holds the last
/// value its writer wrote to it, each absent key was last deleted by someone, full scans
/// both ways and prefix scans agree with point reads, and a flush leaves it unchanged.
fn mixed_stress(n_threads: usize, ops: usize) {
    let seed = seed("mixed_stress");
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::open(dir.path().join("tree"), tiny(64 << 10)).unwrap();
    let n_keys = 2500u64;
    let keys: Vec<Vec<u8>> = (0..n_keys).map(key).collect();
    let mut sorted_keys = keys.clone();
    sorted_keys.sort();
    let issued: Vec<AtomicU32> = (0..n_threads).map(|_| AtomicU32::new(0)).collect();
    let start = Barrier::new(n_threads);
    let flush_errors = Mutex::new(Vec::new());
    let lasts: Vec<HashMap<u64, Last>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n_threads)
            .map(|t| {
                let (tree, keys, sorted_keys, issued, start, flush_errors) =
                    (&tree, &keys, &sorted_keys, &issued, &start, &flush_errors);
                s.spawn(move || {
                    let mut rng = Rng(seed ^ mix(t as u64 + 600));
                    let mut last = HashMap::new();
                    let check = |k: &[u8], v: &[u8]| {
                        let (w, s) = decode(k, v).unwrap();
                        assert!((w as usize) < n_threads);
                        assert!(s <= issued[w as usize].load(Ordering::Acquire));
                    };
                    start.wait();
                    for seq in 1..=ops as u32 {
                        let i = rng.below(n_keys);
                        let k = &keys[i as usize];
                        match rng.below(1000) {
                            0..450 => {
                                issued[t].store(seq, Ordering::Release);
                                tree.insert(k, &value(k, t as u16, seq)).unwrap();
                                last.insert(i, Last::Put(seq));
                            }
                            450..600 => {
                                tree.delete(k).unwrap();
                                last.insert(i, Last::Delete);
                            }
                            600..950 => {
                                if let Some(v) = tree.get(k).unwrap() {
                                    check(k, &v);
                                }
                            }
                            950..997 => {
                                let (lo, hi) = random_bounds(&mut rng, sorted_keys);
                                let walk = [Walk::Forward, Walk::Backward, Walk::BothEnds]
                                    [rng.below(3) as usize];
                                // Short scans: take at most a few pages' worth.
                                for (k, v) in scan_checked(tree, &lo, &hi, walk).iter().take(200) {
                                    check(k, v);
                                }
                            }
                            _ => {
                                if let Err(e) = tree.flush() {
                                    flush_errors.lock().unwrap().push(e.to_string());
                                }
                            }
                        }
                    }
                    last
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let errors = flush_errors.into_inner().unwrap();
    assert!(errors.is_empty(), "flush failed: {errors:?}");
    let mut model = BTreeMap::new();
    let mut absent = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let i = i as u64;
        match tree.get(k).unwrap() {
            Some(v) => {
                let (w, s) = decode(k, &v).unwrap();
                assert_eq!(lasts[w as usize].get(&i), Some(&Last::Put(s)));
                model.insert(k.clone(), v);
            }
            None => {
                assert!(
                    lasts.iter().all(|l| !l.contains_key(&i))
                        || lasts.iter().any(|l| l.get(&i) == Some(&Last::Delete)),
                    "key {:?} absent, but no thread deleted it last",
                    String::from_utf8_lossy(k)
                );
                absent.push(k.clone());
            }
        }
    }
    check_quiescent(&tree, &model, &absent);
    tree.flush().unwrap();
    let s = check_end(&tree, &model, &absent, READ_WRITE_PATHS);
    assert_happened(&s, &["mini_page_growths"]);
}

#[test]
fn mixed_stress_8_threads() {
    mixed_stress(threads(8), scaled(3000));
}

/// Heavier: `cargo test --release --test tree_concurrent -- --ignored`.
#[test]
#[ignore = "heavy; run with --release -- --ignored"]
fn mixed_stress_16_threads() {
    mixed_stress(16, scaled(20_000));
}

// ---------------------------------------------------------------------------------------
// 6. Fresh reads: leaf pages read without the page lock, racing merges, splits, evictions
// ---------------------------------------------------------------------------------------

/// A key's state as its only writer left it: the writer's sequence number of the last
/// operation on it, and whether that operation was an insert.
fn key_state(seq: u32, present: bool) -> u64 {
    u64::from(seq) << 1 | u64::from(present)
}

/// Per-key bookkeeping of the writers in `fresh_reads`, indexed like the keys.
struct Windows {
    /// The state of each key after its writer's last *finished* operation.
    done: Vec<std::sync::atomic::AtomicU64>,
    /// The sequence number of each key's last *begun* operation.
    begun: Vec<AtomicU32>,
    /// The sequence number of each key's last begun delete (0: none).
    delete_begun: Vec<AtomicU32>,
}

impl Windows {
    fn new(states: impl Iterator<Item = u64>) -> Windows {
        let done: Vec<_> = states.map(std::sync::atomic::AtomicU64::new).collect();
        let n = done.len();
        Windows {
            done,
            begun: (0..n).map(|_| AtomicU32::new(0)).collect(),
            delete_begun: (0..n).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn done(&self, i: usize) -> u64 {
        self.done[i].load(Ordering::SeqCst)
    }

    /// Checks that `got`, read for key `k` (index `i`, written only by `owner`) by a read
    /// that began after the key's state was `before`, is a state the key had at some
    /// moment of the read: not older than `before` (a stale leaf page accepted as
    /// current) and not from an operation that had not begun when the read ended.
    fn check(&self, i: usize, k: &[u8], owner: u16, before: u64, got: Option<&[u8]>, what: &str) {
        let (before_seq, before_present) = ((before >> 1) as u32, before & 1 == 1);
        let begun = self.begun[i].load(Ordering::SeqCst);
        let show = String::from_utf8_lossy(k);
        match got {
            Some(v) => {
                let (w, s) = decode(k, v).unwrap_or_else(|e| panic!("{what}: {e}"));
                if w == PRELOAD {
                    assert!(
                        s == 0 && before == key_state(0, true),
                        "{what}: key {show:?} read its preloaded value, but its writer had \
                         finished op {before_seq} (present: {before_present}) before the read"
                    );
                } else {
                    assert_eq!(
                        w, owner,
                        "{what}: key {show:?} holds another writer's value"
                    );
                    assert!(
                        s >= before_seq,
                        "{what}: stale read of key {show:?}: value of op {s}, but op \
                         {before_seq} (present: {before_present}) had finished before the read"
                    );
                    assert!(
                        s <= begun.max(before_seq),
                        "{what}: key {show:?} read the value of op {s}, which had not begun \
                         (last begun {begun})"
                    );
                }
            }
            None => {
                let deleted = self.delete_begun[i].load(Ordering::SeqCst);
                assert!(
                    !before_present || deleted > before_seq,
                    "{what}: key {show:?} read as absent, but op {before_seq} had inserted it \
                     before the read and no delete began since (last delete {deleted})"
                );
            }
        }
    }
}

/// Writers own disjoint keys (key `i` belongs to writer `i % n_writers`) and publish, per
/// key, the last operation they began and the last they finished; readers check that
/// every answer is a state its key had *during* the read: `get`, `get_many`, `range`
/// (both ways) and `cursor` scans, on a pool so small that the leaf pages they read
/// without the page lock are rewritten all the time by merges, evictions (batched or
/// single), splits and flushes. A leaf page read before such a rewrite and accepted
/// afterwards shows up as a stale value, a lost key or a resurrected one. Scans must
/// also yield strictly ordered keys.
fn fresh_reads(n_writers: usize, n_readers: usize, ops: usize, file_backed: bool) {
    let seed = seed("fresh_reads");
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        // Both sides of every read: validated under the read lock, and promoting (the
        // write lock, mirrors, cached records and phantoms).
        promotion_rate_percent: 50,
        scan_promotion_rate_percent: 50,
        ..tiny(64 << 10)
    };
    let tree = if file_backed {
        Tree::open(dir.path().join("tree"), config).unwrap()
    } else {
        Tree::in_memory(config).unwrap()
    };
    // Batched eviction is the default; the file-backed run evicts one page at a time.
    tree.set_batched_eviction(!file_backed);
    let n_keys = 4800usize;
    let keys: Vec<Vec<u8>> = (0..n_keys as u64).map(key).collect();
    let mut sorted: Vec<(Vec<u8>, usize)> = keys.iter().cloned().zip(0..).collect();
    sorted.sort();
    let sorted_keys: Vec<Vec<u8>> = sorted.iter().map(|(k, _)| k.clone()).collect();
    // A quarter is preloaded; the rest arrive during the run and split pages.
    let preloaded = |i: usize| i.is_multiple_of(4);
    for (_, k) in keys.iter().enumerate().filter(|(i, _)| preloaded(*i)) {
        tree.insert(k, &value(k, PRELOAD, 0)).unwrap();
    }
    let windows = Windows::new((0..n_keys).map(|i| key_state(0, preloaded(i))));
    let owner = |i: usize| (i % n_writers) as u16;
    let writers_done = AtomicUsize::new(0);
    let start = Barrier::new(n_writers + n_readers);
    let reads = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..n_writers {
            let (tree, keys, windows, writers_done, start) =
                (&tree, &keys, &windows, &writers_done, &start);
            s.spawn(move || {
                let _finished = Finished(writers_done);
                let mut rng = Rng(seed ^ mix(w as u64 + 700));
                let own = n_keys / n_writers;
                start.wait();
                for seq in 1..=ops as u32 {
                    let i = rng.below(own as u64) as usize * n_writers + w;
                    let k = &keys[i];
                    windows.begun[i].store(seq, Ordering::SeqCst);
                    let present = rng.percent() < 70;
                    if present {
                        tree.insert(k, &value(k, w as u16, seq)).unwrap();
                    } else {
                        windows.delete_begun[i].store(seq, Ordering::SeqCst);
                        tree.delete(k).unwrap();
                    }
                    windows.done[i].store(key_state(seq, present), Ordering::SeqCst);
                    if w == 0 && rng.below(400) == 0 {
                        tree.flush().unwrap();
                    }
                }
            });
        }
        for r in 0..n_readers {
            let (tree, keys, sorted, sorted_keys, windows, writers_done, start, reads) = (
                &tree,
                &keys,
                &sorted,
                &sorted_keys,
                &windows,
                &writers_done,
                &start,
                &reads,
            );
            s.spawn(move || {
                let mut rng = Rng(seed ^ mix(r as u64 + 800));
                let mut buf = Vec::new();
                start.wait();
                let mut n = 0u64;
                while writers_done.load(Ordering::Acquire) < n_writers || n < 400 {
                    n += 1;
                    match rng.percent() {
                        0..50 => {
                            let i = rng.below(n_keys as u64) as usize;
                            let before = windows.done(i);
                            let found = tree.get_into(&keys[i], &mut buf).unwrap();
                            let what = format!("reader {r} get #{n}");
                            let got = found.then_some(buf.as_slice());
                            windows.check(i, &keys[i], owner(i), before, got, &what);
                        }
                        50..70 => {
                            let batch: Vec<usize> = (0..1 + rng.below(24))
                                .map(|_| rng.below(n_keys as u64) as usize)
                                .collect();
                            let before: Vec<u64> = batch.iter().map(|&i| windows.done(i)).collect();
                            let ks: Vec<&[u8]> =
                                batch.iter().map(|&i| keys[i].as_slice()).collect();
                            let got = tree.get_many(&ks).unwrap();
                            let what = format!("reader {r} get_many #{n}");
                            for ((&i, b), v) in batch.iter().zip(before).zip(&got) {
                                windows.check(i, &keys[i], owner(i), b, v.as_deref(), &what);
                            }
                        }
                        p => {
                            // A scan: every key's state before it began, then the scan,
                            // then each key of the range checked against its window.
                            let (lo, hi) = random_bounds(&mut rng, sorted_keys);
                            let before: Vec<u64> = (0..n_keys).map(|i| windows.done(i)).collect();
                            let (got, what) = if p < 85 {
                                let walk = [Walk::Forward, Walk::Backward, Walk::BothEnds]
                                    [rng.below(3) as usize];
                                let what =
                                    format!("reader {r} {walk:?} range #{n} ({lo:?}, {hi:?})");
                                (scan_checked(tree, &lo, &hi, walk), what)
                            } else {
                                let mut got: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                                let mut c = tree.cursor::<&[u8], _>((as_ref(&lo), as_ref(&hi)));
                                while let Some(item) = c.next() {
                                    let (k, v) = item.expect("cursor failed");
                                    if let Some((prev, _)) = got.last() {
                                        assert!(
                                            k > prev.as_slice(),
                                            "reader {r}: cursor yielded {:?} after {:?}",
                                            String::from_utf8_lossy(k),
                                            String::from_utf8_lossy(prev)
                                        );
                                    }
                                    got.push((k.to_vec(), v.to_vec()));
                                }
                                (got, format!("reader {r} cursor #{n} ({lo:?}, {hi:?})"))
                            };
                            let mut got = got.into_iter().peekable();
                            for (k, i) in sorted.iter().filter(|(k, _)| in_bounds(k, &lo, &hi)) {
                                let v = got.next_if(|(gk, _)| gk == k).map(|(_, v)| v);
                                windows.check(*i, k, owner(*i), before[*i], v.as_deref(), &what);
                            }
                            if let Some((k, _)) = got.next() {
                                panic!(
                                    "{what}: yielded key {:?} out of range or unknown",
                                    String::from_utf8_lossy(&k)
                                );
                            }
                        }
                    }
                }
                reads.fetch_add(n as usize, Ordering::Relaxed);
            });
        }
    });
    eprintln!("{} reads", reads.load(Ordering::Relaxed));
    let mut model = BTreeMap::new();
    let mut absent = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let before = windows.done(i);
        windows.check(
            i,
            k,
            owner(i),
            before,
            tree.get(k).unwrap().as_deref(),
            "quiescent",
        );
        if before & 1 == 1 {
            let v = if before >> 1 == 0 {
                value(k, PRELOAD, 0)
            } else {
                value(k, owner(i), (before >> 1) as u32)
            };
            model.insert(k.clone(), v);
        } else {
            absent.push(k.clone());
        }
    }
    check_end(&tree, &model, &absent, READ_WRITE_PATHS);
}

#[test]
fn fresh_reads_in_memory_8_threads() {
    let n = threads(8);
    fresh_reads(n / 2, n - n / 2, scaled(5000), false);
}

#[test]
fn fresh_reads_file_backed_8_threads() {
    let n = threads(8);
    fresh_reads(n / 2, n - n / 2, scaled(5000), true);
}

/// Heavier: `cargo test --release --test tree_concurrent -- --ignored`.
#[test]
#[ignore = "heavy; run with --release -- --ignored"]
fn fresh_reads_16_threads() {
    fresh_reads(8, 8, scaled(20_000), false);
    fresh_reads(8, 8, scaled(20_000), true);
}

// ---------------------------------------------------------------------------------------
// Regressions found by the tests above, shrunk to deterministic single-threaded runs
// ---------------------------------------------------------------------------------------

/// Found by `readers_during_splits`: a leaf split whose level-1 parent failed the
/// conservative room check (it counts whole keys, but the node stores them after its
/// prefix) but could in fact absorb the separator hit `assert!(last, "only the topmost
/// planned node absorbs")`, and the Tree's drop then hit it again while unwinding and
/// aborted the process. Keys with a long shared prefix, inserted in scrambled order, make
/// middle inner nodes prefix-compress, which opens that window on the second level.
#[test]
fn split_absorbed_below_the_topmost_planned_node() {
    let tree = Tree::in_memory(Config {
        max_key_bytes: 64,
        ..tiny(64 << 10)
    })
    .unwrap();
    let k = |i: u64| format!("tenant/0000000000000000000000000000/{:016x}", mix(i)).into_bytes();
    let n = 20_000;
    for i in 0..n {
        tree.insert(&k(i), &[i as u8; 100]).unwrap();
    }
    let s = tree.stats();
    assert!(s.height >= 2 && s.inner_splits > 1, "{s:#?}");
    for i in 0..n {
        assert_eq!(tree.get(&k(i)).unwrap(), Some(vec![i as u8; 100]));
    }
    assert_eq!(tree.range::<&[u8], _>(..).count(), n as usize);
}
