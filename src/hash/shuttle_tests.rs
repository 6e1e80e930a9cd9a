//! Shuttle explores thread interleavings of the real epoch and index code (run with
//! `cargo test --features shuttle --lib hash::`). Under the `shuttle` feature the
//! crate's atomics, mutexes and spin-waits are shuttle's, so every slot load and CAS of
//! the two-phase insert, every epoch-table store and every chunk-pin change is a
//! scheduling point. The modules are crate-private, so these tests live in the crate
//! rather than under `tests/`.
//!
//! A failing random schedule prints its seed; `SHUTTLE_RANDOM_SEED=<seed>` with
//! `BFDB_SHUTTLE_ITERATIONS=1` replays it. Iterations: `BFDB_SHUTTLE_ITERATIONS`
//! (default 300 per test; PCT runs the same number).

use std::collections::{HashMap, HashSet};

use super::bucket::{Entry, KeyHash};
use super::epoch::Epoch;
use super::hlog::HlogOptions;
use super::hot::{HotLog, HotRead};
use super::index::{HashIndex, IndexOptions};
use super::read_cache::{READ_CACHE_BIT, is_cached};
use super::test_support::{Records, check_entries, find_all, upsert};
use crate::storage::MemBlocks;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Arc, thread};

fn iterations() -> usize {
    std::env::var("BFDB_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Runs `f` under shuttle's random scheduler and under PCT (which finds bugs that need a
/// few preemptions at exact places).
fn explore(f: impl Fn() + Send + Sync + 'static) {
    let f = std::sync::Arc::new(f);
    let g = f.clone();
    shuttle::check_random(move || f(), iterations());
    shuttle::check_pct(move || g(), iterations(), 3);
}

struct Version {
    retired: AtomicU64,
    readers: AtomicU64,
}

struct Shared {
    current: AtomicUsize,
    versions: [Version; 3],
    /// Each reader's local epoch as it last saw it after protecting or refreshing;
    /// `MOVING` while it changes it, 0 while unprotected.
    published: [AtomicU64; 2],
}

const MOVING: u64 = u64::MAX;

/// Two readers use the current version under protection while a writer swaps in new
/// ones and retires the old through trigger actions: an action never runs while a
/// reader that saw its version is still inside it, nor while a reader holds a guard at
/// or below the action's epoch; readers never see a retired version; and each action
/// runs exactly once.
#[test]
fn epoch_actions_run_once_after_every_reader_moved_on() {
    explore(|| {
        let epoch = Arc::new(Epoch::new());
        let shared = Arc::new(Shared {
            current: AtomicUsize::new(0),
            versions: std::array::from_fn(|_| Version {
                retired: AtomicU64::new(0),
                readers: AtomicU64::new(0),
            }),
            published: std::array::from_fn(|_| AtomicU64::new(0)),
        });
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (epoch, shared) = (epoch.clone(), shared.clone());
                thread::spawn(move || {
                    let mine = &shared.published[r];
                    let mut handle = epoch.register();
                    let mut guard = handle.protect();
                    mine.store(guard.local_epoch(), Ordering::SeqCst);
                    for _ in 0..2 {
                        let v = &shared.versions[shared.current.load(Ordering::SeqCst)];
                        v.readers.fetch_add(1, Ordering::SeqCst);
                        let retired = v.retired.load(Ordering::SeqCst);
                        assert_eq!(retired, 0, "read a retired version");
                        v.readers.fetch_sub(1, Ordering::SeqCst);
                        mine.store(MOVING, Ordering::SeqCst);
                        guard.refresh();
                        mine.store(guard.local_epoch(), Ordering::SeqCst);
                    }
                    mine.store(0, Ordering::SeqCst);
                })
            })
            .collect();
        let writer = {
            let (epoch, shared) = (epoch.clone(), shared.clone());
            thread::spawn(move || {
                let mut handle = epoch.register();
                let mut guard = handle.protect();
                for next in 1..3 {
                    let old = shared.current.swap(next, Ordering::SeqCst);
                    let shared = shared.clone();
                    // Only this thread bumps, so the action's epoch is the current one.
                    let at = epoch.current();
                    guard.bump_with_action(move || {
                        let v = &shared.versions[old];
                        let inside = v.readers.load(Ordering::SeqCst);
                        assert_eq!(inside, 0, "retired under a reader");
                        for p in &shared.published {
                            let p = p.load(Ordering::SeqCst);
                            assert!(p == 0 || p == MOVING || p > at, "ran under a guard at {p}");
                        }
                        v.retired.fetch_add(1, Ordering::SeqCst);
                    });
                }
            })
        };
        for r in readers {
            r.join().unwrap();
        }
        writer.join().unwrap();
        // Nobody is protected: whatever is still pending is ready.
        epoch.drain();
        assert_eq!(epoch.pending_actions(), 0);
        let retired: Vec<u64> = shared
            .versions
            .iter()
            .map(|v| v.retired.load(Ordering::SeqCst))
            .collect();
        assert_eq!(retired, [1, 1, 0]);
    });
}

/// A hash whose tag is `tag`, in bucket 0 of any table.
fn tagged(tag: u64) -> KeyHash {
    KeyHash(tag << 49)
}

/// Two threads create the entry of one tag at once in a single-bucket index that holds
/// `prefill` entries of other tags, while a third removes one of those (so a free slot
/// opens ahead of the inserters, FASTER's figure 3a). With a full bucket the inserters
/// also race to link the overflow bucket. Both must end with the same slot, and the
/// chain with exactly one entry of the tag, not tentative.
fn two_phase_insert(prefill: u64) {
    explore(move || {
        let epoch = Arc::new(Epoch::new());
        let index = Arc::new(HashIndex::new(
            epoch.clone(),
            IndexOptions {
                buckets: 1,
                grow_chunk_buckets: 1,
            },
        ));
        {
            let mut h = epoch.register();
            let g = h.protect();
            for tag in 2..2 + prefill {
                index
                    .find_or_create(&g, tagged(tag))
                    .try_update(tag)
                    .unwrap();
            }
        }
        let inserters: Vec<_> = (0..2u64)
            .map(|t| {
                let (epoch, index) = (epoch.clone(), index.clone());
                thread::spawn(move || {
                    let mut h = epoch.register();
                    let g = h.protect();
                    let mut slot = index.find_or_create(&g, tagged(1));
                    let at = slot.slot_address();
                    // Either thread may link "its record"; the other then sees it.
                    let _ = slot.try_update(100 + t);
                    at
                })
            })
            .collect();
        let remover = {
            let (epoch, index) = (epoch.clone(), index.clone());
            thread::spawn(move || {
                let mut h = epoch.register();
                let g = h.protect();
                index.find(&g, tagged(2)).unwrap().try_remove().unwrap();
            })
        };
        let at: Vec<usize> = inserters.into_iter().map(|t| t.join().unwrap()).collect();
        remover.join().unwrap();
        assert_eq!(at[0], at[1], "the two inserters got different entries");
        let mut h = epoch.register();
        let g = h.protect();
        let entries = index.entries(&g);
        let of_tag: Vec<Entry> = entries
            .iter()
            .map(|&(_, e)| e)
            .filter(|e| e.tag() == 1)
            .collect();
        assert_eq!(of_tag.len(), 1, "entries of the tag: {of_tag:?}");
        assert!(!of_tag[0].is_tentative());
        assert!(matches!(of_tag[0].address(), 100 | 101));
        assert!(entries.iter().all(|(_, e)| !e.is_tentative()));
        assert_eq!(entries.len() as u64, prefill, "tags 3.. and 1 remain");
    });
}

#[test]
fn two_phase_insert_with_a_free_slot() {
    two_phase_insert(5);
}

#[test]
fn two_phase_insert_racing_for_an_overflow_bucket() {
    two_phase_insert(7);
}

/// Writers upsert keys (some sharing a whole hash, some written by both) while another
/// thread doubles a two-bucket index with one-bucket chunks (or rebuilds it at its size,
/// with `double` false): whichever phase each write lands in, every record stays
/// reachable and the entries stay unique.
fn grow_racing_upserts(writers: usize, double: bool) {
    explore(move || {
        let epoch = Arc::new(Epoch::new());
        let index = Arc::new(HashIndex::new(
            epoch.clone(),
            IndexOptions {
                buckets: 2,
                grow_chunk_buckets: 1,
            },
        ));
        let records = std::sync::Arc::new(Records::new(64));
        let mut written: HashMap<u64, HashSet<u64>> = HashMap::new();
        {
            let mut h = epoch.register();
            let g = h.protect();
            for key in [1000, 1001, 1002, 0] {
                written
                    .entry(key)
                    .or_default()
                    .insert(upsert(&index, &g, &records, key));
            }
        }
        // Keys 0, 1 and 2 share a whole hash; 1000 is written by both writers.
        let plans = [[1000, 1, 1003, 0], [1000, 2, 1004, 1001]];
        let handles: Vec<_> = plans[..writers]
            .iter()
            .map(|&plan| {
                let (epoch, index, records) = (epoch.clone(), index.clone(), records.clone());
                thread::spawn(move || {
                    let mut h = epoch.register();
                    let mut g = h.protect();
                    let mut mine = Vec::new();
                    for key in plan {
                        mine.push((key, upsert(&index, &g, &records, key)));
                        g.refresh();
                    }
                    mine
                })
            })
            .collect();
        let grower = {
            let (epoch, index, records) = (epoch.clone(), index.clone(), records.clone());
            thread::spawn(move || {
                let mut h = epoch.register();
                let mut g = h.protect();
                if double {
                    assert!(index.grow(&mut g, records));
                } else {
                    assert!(index.rebuild(&mut g));
                }
            })
        };
        for handle in handles {
            for (key, address) in handle.join().unwrap() {
                written.entry(key).or_default().insert(address);
            }
        }
        grower.join().unwrap();
        let mut h = epoch.register();
        let g = h.protect();
        assert_eq!(index.buckets(&g), if double { 4 } else { 2 });
        for (key, addresses) in &written {
            let found: HashSet<u64> = find_all(&index, &g, &records, *key).into_iter().collect();
            assert_eq!(&found, addresses, "key {key}");
        }
        check_entries(&index, &g, &records);
    });
}

#[test]
fn grow_racing_one_writer_loses_nothing() {
    grow_racing_upserts(1, true);
}

#[test]
fn grow_racing_two_writers_loses_nothing() {
    grow_racing_upserts(2, true);
}

#[test]
fn rebuild_racing_two_writers_loses_nothing() {
    grow_racing_upserts(2, false);
}

/// A hot log of four 4 KiB frames with a read cache of three 4 KiB pages.
fn store_with_read_cache() -> Arc<HotLog> {
    let options = HlogOptions {
        page_bits: 12,
        frames: 4,
        mutable_pages: 2,
    };
    let store = HotLog::with_read_cache(
        16,
        options,
        std::sync::Arc::new(MemBlocks::new()),
        std::sync::Arc::new(Epoch::new()),
        3 * 4096,
    )
    .unwrap();
    Arc::new(store)
}

/// The value a read of `key` answers, as F2 would with `older` in the cold log.
fn read_value(store: &HotLog, key: &[u8], older: &[u8]) -> Vec<u8> {
    let mut h = store.epoch().register();
    let g = h.protect();
    match store.read(&g, key).unwrap() {
        HotRead::Found(found) => found.expect("no tombstones here").into_bytes(),
        HotRead::NotFound(ticket) => {
            let older = crate::hash::record::LogValue::inline(older.to_vec());
            store.cache_older(&g, key, &older, ticket);
            older.into_bytes()
        }
    }
}

/// The eviction of a read-cache page races a write of a key whose copy is on that page
/// (and a read of the key, which gives the copy a second chance at the cache's tail):
/// the write is never lost, and no entry names the evicted page afterwards.
#[test]
fn read_cache_eviction_racing_a_writer_of_the_same_key() {
    explore(|| {
        let store = store_with_read_cache();
        {
            // Key k's copy (of a value "the cold log" holds) on page 0; the tail then
            // moves to page 1 so that page 0 can be evicted once sealed.
            assert_eq!(read_value(&store, b"k", b"old"), b"old");
            let mut h = store.epoch().register();
            let g = h.protect();
            let address = store.entry_address(&g, b"k").unwrap();
            assert!(is_cached(address) && address < READ_CACHE_BIT + 4096);
            assert!(store.read_cache_turn_page(&g));
        }
        let evictor = {
            let store = store.clone();
            thread::spawn(move || {
                let mut h = store.epoch().register();
                let g = h.protect();
                assert!(store.read_cache_evict_oldest(&g), "page 0 is sealed");
            })
        };
        let writer = {
            let store = store.clone();
            thread::spawn(move || {
                let mut h = store.epoch().register();
                let mut g = h.protect();
                store.upsert(&mut g, b"k", Some(b"new")).unwrap();
            })
        };
        let reader = {
            let store = store.clone();
            thread::spawn(move || {
                let v = read_value(&store, b"k", b"old");
                assert!(v == b"old" || v == b"new", "read {v:?}");
            })
        };
        evictor.join().unwrap();
        writer.join().unwrap();
        reader.join().unwrap();
        assert_eq!(
            read_value(&store, b"k", b"old"),
            b"new",
            "the write was lost"
        );
        let mut h = store.epoch().register();
        let g = h.protect();
        let address = store.entry_address(&g, b"k").unwrap();
        assert!(
            !is_cached(address),
            "a write's record heads the chain: {address:#x}"
        );
        let stats = store.read_cache_stats().unwrap();
        assert_eq!(stats.pages_evicted, 1);
    });
}

/// A read that found a key only in the older tier caches its value while a write of the
/// key races it: the copy is linked only if no write came in between, so the write is
/// what every later read sees.
#[test]
fn read_cache_insert_racing_a_writer_of_the_same_key() {
    explore(|| {
        let store = store_with_read_cache();
        let reader = {
            let store = store.clone();
            thread::spawn(move || {
                let v = read_value(&store, b"k", b"old");
                assert!(v == b"old" || v == b"new", "read {v:?}");
            })
        };
        let writer = {
            let store = store.clone();
            thread::spawn(move || {
                let mut h = store.epoch().register();
                let mut g = h.protect();
                store.upsert(&mut g, b"k", Some(b"new")).unwrap();
            })
        };
        reader.join().unwrap();
        writer.join().unwrap();
        assert_eq!(
            read_value(&store, b"k", b"old"),
            b"new",
            "a stale copy answered"
        );
    });
}
