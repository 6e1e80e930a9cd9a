//! Shuttle explores thread interleavings of the real Tree code (run with
//! `cargo test --features shuttle --test shuttle_tree`). Under the `shuttle` feature the
//! crate's locks, atomics and spin-waits are shuttle's, so every page lock, version
//! check and pool step is a scheduling point.
//!
//! Sizes are shrunk (a 64 KiB pool, a 256-byte merge threshold, 200-byte values, so a leaf
//! holds about 18 records) so that mini-page growth, merges, evictions and leaf splits
//! happen within a few operations per thread. A failing random schedule prints its seed;
//! `SHUTTLE_RANDOM_SEED=<seed>` with `BFDB_SHUTTLE_ITERATIONS=1` replays it exactly (the
//! tree's promotion coin is shuttle's under the feature), and a seed worth keeping becomes
//! a `check_random_with_seed` test. Iterations: `BFDB_SHUTTLE_ITERATIONS` (default 40).
#![cfg(feature = "shuttle")]

use std::collections::BTreeSet;
// The tests' own counters, outside the schedules: std's atomics, not shuttle's.
use std::sync::atomic::{AtomicU64, Ordering};

use bfdb::{Config, Tree};
use shuttle::sync::Arc;
use shuttle::thread;

fn iterations() -> usize {
    std::env::var("BFDB_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

fn config() -> Config {
    Config {
        memory_budget_bytes: 64 << 10,
        merge_threshold_bytes: 256,
        max_key_bytes: 16,
        max_value_bytes: 200,
        huge_pages: false,
        ..Config::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("k{:05}", i.wrapping_mul(7919) % 10_000).into_bytes()
}

fn value(i: u32, writer: u32) -> Vec<u8> {
    let mut v = vec![writer as u8; 200];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

/// A tree holding keys `0..n`, written by "writer 9".
fn preloaded(n: u32) -> Arc<Tree> {
    let tree = Arc::new(Tree::in_memory(config()).unwrap());
    for i in 0..n {
        tree.insert(&key(i), &value(i, 9)).unwrap();
    }
    tree
}

/// Starts writers 0 and 1, each running `write(tree, writer)`.
fn spawn_two_writers<F>(tree: &Arc<Tree>, write: F) -> Vec<thread::JoinHandle<()>>
where
    F: Fn(&Tree, u32) + Copy + Send + 'static,
{
    (0..2u32)
        .map(|w| {
            let tree = tree.clone();
            thread::spawn(move || write(&tree, w))
        })
        .collect()
}

/// Two writers insert `per_writer` new keys each (writer `w` the keys from
/// `first + 100 * w` on) into a tree holding keys `0..preload`, while a reader reads every
/// preloaded key twice and, with `scan`, then scans for them: no insert is lost, the
/// reader never misses, the scan sees every preloaded key. Returns the tree.
fn inserts_racing_reads(preload: u32, first: u32, per_writer: u32, scan: bool) -> Arc<Tree> {
    let tree = preloaded(preload);
    let writers = spawn_two_writers(&tree, move |tree, w| {
        for i in 0..per_writer {
            let i = first + w * 100 + i;
            tree.insert(&key(i), &value(i, w)).unwrap();
        }
    });
    let reader = {
        let tree = tree.clone();
        thread::spawn(move || {
            for round in 0..2 {
                for i in 0..preload {
                    let got = tree.get(&key(i)).unwrap();
                    assert_eq!(
                        got,
                        Some(value(i, 9)),
                        "round {round}: pre-inserted key {i}"
                    );
                }
            }
            if scan {
                let mut want: BTreeSet<Vec<u8>> = (0..preload).map(key).collect();
                for record in tree.range::<&[u8], _>(..) {
                    want.remove(&record.unwrap().0);
                }
                assert!(want.is_empty(), "the scan missed {want:?}");
            }
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    reader.join().unwrap();
    for w in 0..2u32 {
        for i in 0..per_writer {
            let i = first + w * 100 + i;
            assert_eq!(
                tree.get(&key(i)).unwrap(),
                Some(value(i, w)),
                "lost insert {i}"
            );
        }
    }
    tree
}

/// Two writers insert disjoint keys (forcing splits) while a reader reads keys that
/// were present before it started: no insert is lost, and the reader never misses.
fn splits_racing_reads() {
    let tree = inserts_racing_reads(20, 100, 20, false);
    assert!(
        tree.stats().leaf_splits > 0,
        "the schedule must include splits"
    );
}

/// Writers update the same keys; each final value is the last one some writer wrote.
fn overlapping_writers() {
    let tree = Arc::new(Tree::in_memory(config()).unwrap());
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let tree = tree.clone();
            thread::spawn(move || {
                for round in 0..3u32 {
                    for i in 0..12u32 {
                        let mut v = value(i, w);
                        v[4] = round as u8;
                        tree.insert(&key(i), &v).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for i in 0..12u32 {
        let v = tree.get(&key(i)).unwrap().expect("written by both");
        assert_eq!(v[4], 2, "key {i}: the last round of some writer wins");
        assert!(v[5] < 2, "a writer id");
    }
}

/// A scan races writers inserting and deleting: ordered, duplicate-free, and every key
/// present throughout the scan is seen.
fn scan_racing_writers() {
    let tree = Arc::new(Tree::in_memory(config()).unwrap());
    for i in 0..30 {
        tree.insert(&key(i * 2), &value(i, 9)).unwrap();
    }
    let stable: BTreeSet<Vec<u8>> = (0..30).map(|i| key(i * 2)).collect();
    let writer = {
        let tree = tree.clone();
        thread::spawn(move || {
            for i in 0..30u32 {
                tree.insert(&key(i * 2 + 1), &value(i, 1)).unwrap();
                if i % 3 == 0 {
                    tree.delete(&key(i * 2 + 1)).unwrap();
                }
            }
        })
    };
    let scanner = {
        let tree = tree.clone();
        thread::spawn(move || {
            for reverse in [false, true] {
                let it = tree.range::<&[u8], _>(..);
                let keys: Vec<Vec<u8>> = if reverse {
                    it.rev().map(|r| r.unwrap().0).collect()
                } else {
                    it.map(|r| r.unwrap().0).collect()
                };
                for w in keys.windows(2) {
                    if reverse {
                        assert!(w[0] > w[1], "reverse scan out of order or duplicated");
                    } else {
                        assert!(w[0] < w[1], "scan out of order or duplicated");
                    }
                }
                let seen: BTreeSet<Vec<u8>> = keys.into_iter().collect();
                assert!(
                    stable.is_subset(&seen),
                    "a scan missed a key present throughout"
                );
            }
        })
    };
    writer.join().unwrap();
    scanner.join().unwrap();
}

/// Two writers overflow the 64 KiB pool (so evictions run inside their allocations, racing
/// the other writer's mini-page growth) while a reader re-reads hot keys (reference bits,
/// copy-on-access of mini-pages near the pool's head). No write is lost, every read sees
/// a value some writer wrote for that key, and evictions did happen.
fn eviction_racing_growth_and_copy_on_access() {
    // Mini-pages grow to full size before merging, so they overflow the pool.
    let config = Config {
        merge_threshold_bytes: 4096,
        copy_on_access_percent: 30,
        ..config()
    };
    let tree = Arc::new(Tree::in_memory(config).unwrap());
    // About 30 leaf pages, so the writers' mini-pages spread over more than the pool holds.
    for i in 0..600 {
        tree.insert(&key(i), &value(i, 9)).unwrap();
    }
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let tree = tree.clone();
            thread::spawn(move || {
                for i in 0..180u32 {
                    let i = 1000 + w * 1000 + i;
                    tree.insert(&key(i), &value(i, w)).unwrap();
                }
            })
        })
        .collect();
    let reader = {
        let tree = tree.clone();
        thread::spawn(move || {
            for round in 0..12 {
                let i = round % 8;
                assert_eq!(tree.get(&key(i)).unwrap(), Some(value(i, 9)), "hot key {i}");
            }
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    reader.join().unwrap();
    for w in 0..2u32 {
        for i in (0..180u32).step_by(7) {
            let i = 1000 + w * 1000 + i;
            assert_eq!(
                tree.get(&key(i)).unwrap(),
                Some(value(i, w)),
                "lost insert {i}"
            );
        }
    }
    let s = tree.stats();
    assert!(s.evictions > 0, "the schedule must evict: {s:?}");
    assert!(s.mini_page_growths > 0, "{s:?}");
}

/// Two writers each insert a stream of ascending keys, one just below the other's (as
/// the driver's loaders do), while a reader reads and scans keys present before: the
/// splits keep their open ends as mirrors (a new page's mirror is published while the
/// page is being linked, under its lock), and no insert is lost, no read misses. Adds the
/// open ends mirrored to `mirrored`.
fn sorted_streams_racing_reads(mirrored: &AtomicU64) {
    let stream_key = |w: u32, i: u32| format!("s{w}{i:04}").into_bytes();
    let tree = preloaded(20);
    let writers = spawn_two_writers(&tree, move |tree, w| {
        for i in 0..60u32 {
            tree.insert(&stream_key(w, i), &value(i, w)).unwrap();
        }
    });
    let reader = {
        let tree = tree.clone();
        thread::spawn(move || {
            for i in 0..6 {
                assert_eq!(tree.get(&key(i)).unwrap(), Some(value(i, 9)), "key {i}");
            }
            // The pre-inserted keys sort below the streams' ("k..." < "s..."): a scan of
            // them sees exactly those, in order, whatever the streams do meanwhile.
            let seen: Vec<Vec<u8>> = tree.range(..&b"s"[..]).map(|r| r.unwrap().0).collect();
            let mut want: Vec<Vec<u8>> = (0..20).map(key).collect();
            want.sort();
            assert_eq!(seen, want);
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    reader.join().unwrap();
    for w in 0..2u32 {
        for i in 0..60u32 {
            assert_eq!(
                tree.get(&stream_key(w, i)).unwrap(),
                Some(value(i, w)),
                "lost insert {w}/{i}"
            );
        }
    }
    let all = tree.range::<&[u8], _>(..).count();
    assert_eq!(all, 20 + 2 * 60);
    mirrored.fetch_add(tree.stats().open_end_mirrors, Ordering::Relaxed);
}

/// Two writers insert keys in random order into a tree whose pages have room (a
/// random-order preload leaves them partly full), so overflowing pages move records into
/// a neighbour (redistribution: the neighbour try-locked and written first, the parent's
/// separator then replaced) as well as split; meanwhile a reader reads every preloaded
/// key twice and scans them. No insert is lost, no read misses, a scan sees each key
/// once, in order. Adds the redistributions to `redistributed`.
fn redistribution_racing_reads(redistributed: &AtomicU64) {
    let tree = inserts_racing_reads(40, 1000, 16, true);
    let keys: Vec<Vec<u8>> = tree.range::<&[u8], _>(..).map(|r| r.unwrap().0).collect();
    assert_eq!(keys.len(), 40 + 2 * 16);
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "scan out of order");
    redistributed.fetch_add(tree.stats().leaf_redistributions, Ordering::Relaxed);
}

/// A flush (batched: the first page of a batch locked waiting, the rest with try-locks)
/// races two writers that update and insert keys (growth, merges at the threshold,
/// splits): no schedule deadlocks, no write is lost, and a flush after the writers leaves
/// nothing dirty for a second one.
fn flush_racing_writers() {
    let tree = Arc::new(Tree::in_memory(config()).unwrap());
    for i in 0..60 {
        tree.insert(&key(i), &value(i, 9)).unwrap();
    }
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let tree = tree.clone();
            thread::spawn(move || {
                for n in 0..20u32 {
                    // Alternate updates of loaded keys with inserts of new ones.
                    let i = if n % 2 == 0 {
                        w * 30 + n
                    } else {
                        500 + w * 100 + n
                    };
                    tree.insert(&key(i), &value(i, w)).unwrap();
                }
            })
        })
        .collect();
    let flusher = {
        let tree = tree.clone();
        thread::spawn(move || {
            for _ in 0..2 {
                tree.flush().unwrap();
            }
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    flusher.join().unwrap();
    for w in 0..2u32 {
        for n in 0..20u32 {
            let i = if n % 2 == 0 {
                w * 30 + n
            } else {
                500 + w * 100 + n
            };
            assert_eq!(
                tree.get(&key(i)).unwrap(),
                Some(value(i, w)),
                "lost write {i}"
            );
        }
    }
    tree.flush().unwrap();
    let writes = tree.stats().leaf_writes;
    tree.flush().unwrap();
    assert_eq!(
        tree.stats().leaf_writes,
        writes,
        "a second flush found dirty records"
    );
}

#[test]
fn shuttle_flush_racing_writers_random() {
    shuttle::check_random(flush_racing_writers, iterations());
}

#[test]
fn shuttle_flush_racing_writers_pct() {
    shuttle::check_pct(flush_racing_writers, iterations(), 3);
}

#[test]
fn shuttle_eviction_racing_growth_random() {
    shuttle::check_random(eviction_racing_growth_and_copy_on_access, iterations());
}

/// Regression, a schedule that livelocked: a writer growing page P's mini-page found no
/// pool room because the block pinning the pool's head was P's own mini-page, which no
/// eviction can take while the writer holds P; it gave up and let go of P, the other
/// writer of P took it and met the same wall, and so on in turn. Growth now merges
/// instead when the pool has no room (a merge needs none).
#[test]
fn shuttle_eviction_racing_growth_own_block_at_head() {
    shuttle::check_random_with_seed(
        eviction_racing_growth_and_copy_on_access,
        9_816_307_261_761_311_760,
        1,
    );
}

#[test]
fn shuttle_eviction_racing_growth_pct() {
    shuttle::check_pct(eviction_racing_growth_and_copy_on_access, iterations(), 3);
}

#[test]
fn shuttle_splits_racing_reads_random() {
    shuttle::check_random(splits_racing_reads, iterations());
}

#[test]
fn shuttle_splits_racing_reads_pct() {
    shuttle::check_pct(splits_racing_reads, iterations(), 3);
}

#[test]
fn shuttle_overlapping_writers_random() {
    shuttle::check_random(overlapping_writers, iterations());
}

#[test]
fn shuttle_scan_racing_writers_random() {
    shuttle::check_random(scan_racing_writers, iterations());
}

#[test]
fn shuttle_scan_racing_writers_pct() {
    shuttle::check_pct(scan_racing_writers, iterations(), 3);
}

#[test]
fn shuttle_sorted_streams_racing_reads_random() {
    static MIRRORED: AtomicU64 = AtomicU64::new(0);
    shuttle::check_random(|| sorted_streams_racing_reads(&MIRRORED), iterations());
    let mirrored = MIRRORED.load(Ordering::Relaxed);
    eprintln!("open ends mirrored over the schedules: {mirrored}");
    assert!(mirrored > 0, "no schedule mirrored an open end");
}

#[test]
fn shuttle_sorted_streams_racing_reads_pct() {
    static MIRRORED: AtomicU64 = AtomicU64::new(0);
    shuttle::check_pct(|| sorted_streams_racing_reads(&MIRRORED), iterations(), 3);
}

#[test]
fn shuttle_redistribution_racing_reads_random() {
    static REDISTRIBUTED: AtomicU64 = AtomicU64::new(0);
    shuttle::check_random(|| redistribution_racing_reads(&REDISTRIBUTED), iterations());
    let redistributed = REDISTRIBUTED.load(Ordering::Relaxed);
    eprintln!("redistributions over the schedules: {redistributed}");
    assert!(redistributed > 0, "no schedule redistributed");
}

#[test]
fn shuttle_redistribution_racing_reads_pct() {
    static REDISTRIBUTED: AtomicU64 = AtomicU64::new(0);
    shuttle::check_pct(
        || redistribution_racing_reads(&REDISTRIBUTED),
        iterations(),
        3,
    );
}
