//! Tests of the hot index: its operations single-threaded, growth, and many threads
//! inserting and finding distinct and colliding keys while the table doubles.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::bucket::{Entry, INVALID_ADDRESS};
use super::epoch::{Epoch, EpochGuard};
use super::index::{HashIndex, IndexOptions, KEYS_PER_BUCKET};
use super::test_support::{Records, check_entries, find_all, hash_of, upsert};

fn index_with(buckets: usize, chunk: usize) -> HashIndex {
    HashIndex::new(
        Arc::new(Epoch::new()),
        IndexOptions {
            buckets,
            grow_chunk_buckets: chunk,
        },
    )
}

#[test]
fn sizing_from_the_expected_key_count() {
    assert_eq!(IndexOptions::for_keys(0).buckets, 1);
    assert_eq!(IndexOptions::for_keys(4).buckets, 1);
    assert_eq!(IndexOptions::for_keys(5).buckets, 2);
    assert_eq!(IndexOptions::for_keys(1000).buckets, 256);
    assert_eq!(
        IndexOptions::for_keys(1 << 20).buckets as u64,
        (1 << 20) / KEYS_PER_BUCKET
    );
    let epoch = Arc::new(Epoch::new());
    let index = HashIndex::new(epoch.clone(), IndexOptions::for_keys(1000));
    let mut h = epoch.register();
    let g = h.protect();
    assert_eq!(index.buckets(&g), 256);
    assert_eq!(index.size_bytes(&g), 256 * 64);
    assert_eq!(index.overflow_buckets(&g), 0);
}

#[test]
fn find_or_create_then_find() {
    let index = index_with(4, 1);
    let epoch = index.epoch().clone();
    let records = Records::new(10_000);
    let mut h = epoch.register();
    let g = h.protect();
    let hash = hash_of(5000);
    assert!(index.find(&g, hash).is_none());
    {
        let mut slot = index.find_or_create(&g, hash);
        assert_eq!(slot.entry(), Entry::new(INVALID_ADDRESS, hash.tag(), false));
        slot.try_update(42).unwrap();
        assert_eq!(slot.address(), 42);
    }
    let slot = index.find(&g, hash).unwrap();
    let first = slot.slot_address();
    assert_eq!(slot.address(), 42);
    drop(slot);
    // Another find-or-create returns the same entry rather than a second one.
    let again = index.find_or_create(&g, hash);
    assert_eq!(again.address(), 42);
    assert_eq!(again.slot_address(), first);
    drop(again);
    // Another thread's operation changes the entry under this one's slot: the stale
    // swap fails and learns the current entry, and the retry succeeds.
    let in_other_thread = |f: &(dyn Fn(&EpochGuard<'_, '_>) + Sync)| {
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut h = epoch.register();
                f(&h.protect());
            });
        });
    };
    let mut stale = index.find(&g, hash).unwrap();
    in_other_thread(&|g| index.find(g, hash).unwrap().try_update(43).unwrap());
    assert_eq!(stale.try_update(44), Err(Entry::new(43, hash.tag(), false)));
    stale.try_update(44).unwrap();
    // Removal by another thread: the slot cannot resurrect the entry.
    in_other_thread(&|g| index.find(g, hash).unwrap().try_remove().unwrap());
    assert!(stale.try_update(45).is_err());
    assert!(stale.try_update(45).is_err(), "an emptied slot never swaps");
    drop(stale);
    assert!(index.find(&g, hash).is_none());
    // Many keys in four buckets: overflow buckets, all found, no duplicates.
    let keys: Vec<u64> = (1000..1200).collect();
    let mut newest = HashMap::new();
    for &k in &keys {
        newest.insert(k, upsert(&index, &g, &records, k));
    }
    for &k in &keys {
        let found = find_all(&index, &g, &records, k);
        assert_eq!(found, [newest[&k]], "key {k}");
    }
    assert!(index.overflow_buckets(&g) > 0);
    assert!(find_all(&index, &g, &records, 999_999).is_empty());
    check_entries(&index, &g, &records);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "at most one EntrySlot")]
fn holding_two_slots_is_refused_in_debug_builds() {
    let index = index_with(4, 1);
    let epoch = index.epoch().clone();
    let mut h = epoch.register();
    let g = h.protect();
    let _first = index.find_or_create(&g, hash_of(5000));
    let _second = index.find_or_create(&g, hash_of(6000));
}

#[test]
fn keys_sharing_a_whole_hash_share_one_entry() {
    let index = index_with(2, 1);
    let epoch = index.epoch().clone();
    let records = Records::new(1000);
    let mut h = epoch.register();
    let g = h.protect();
    // Keys 0..4 share a hash; each upsert links behind the previous record.
    let a: Vec<u64> = (0..4).map(|k| upsert(&index, &g, &records, k)).collect();
    for (k, &address) in a.iter().enumerate() {
        assert_eq!(find_all(&index, &g, &records, k as u64), [address]);
    }
    let tag = hash_of(0).tag();
    let live = index
        .entries(&g)
        .into_iter()
        .filter(|(_, e)| e.tag() == tag)
        .count();
    assert_eq!(live, 1);
}

#[test]
fn grow_splits_chains_and_keeps_every_record() {
    let index = index_with(4, 1);
    let epoch = index.epoch().clone();
    let records = Arc::new(Records::new(100_000));
    let mut h = epoch.register();
    let mut g = h.protect();
    let keys: Vec<u64> = (0..300).chain(5000..5500).collect();
    let mut all: HashMap<u64, Vec<u64>> = HashMap::new();
    for round in 0..2 {
        for &k in &keys {
            all.entry(k)
                .or_default()
                .insert(0, upsert(&index, &g, &records, k));
        }
        if round == 0 {
            // The first round's records are "on disk": a grow cannot split their chains
            // further, so both halves point at them.
            records.head.store(
                records.next.load(Ordering::SeqCst) as u64 + 1,
                Ordering::SeqCst,
            );
        }
    }
    let overflow_before = index.overflow_buckets(&g);
    for doubling in 1..=4 {
        assert!(index.grow(&mut g, records.clone()));
        assert!(!index.is_growing());
        assert_eq!(index.buckets(&g), 4 << doubling);
        for &k in &keys {
            assert_eq!(find_all(&index, &g, &records, k), all[&k], "key {k}");
        }
        check_entries(&index, &g, &records);
        g.refresh();
    }
    // Entries whose walk reached a record "on disk" went to both halves, so there are
    // more entries than the keys need.
    let needed = |len: usize| {
        keys.iter()
            .map(|&k| (hash_of(k).bucket(len), hash_of(k).tag()))
            .collect::<HashSet<_>>()
            .len()
    };
    assert!(index.entries(&g).len() > needed(64));
    // Everything in memory again: the next grow splits whole chains, leaving exactly one
    // entry per (bucket, tag) of the keys and fewer overflow buckets.
    records.head.store(0, Ordering::SeqCst);
    assert!(index.grow(&mut g, records.clone()));
    for &k in &keys {
        assert_eq!(find_all(&index, &g, &records, k), all[&k], "key {k}");
    }
    check_entries(&index, &g, &records);
    assert_eq!(index.entries(&g).len(), needed(128));
    assert!(index.overflow_buckets(&g) < overflow_before);
    // The old tables go once this thread refreshes.
    g.refresh();
    assert_eq!(epoch.pending_actions(), 0);
}

#[test]
fn grow_drops_what_truncation_removed() {
    let index = index_with(1, 1);
    let epoch = index.epoch().clone();
    let records = Arc::new(Records::new(1000));
    let mut h = epoch.register();
    let mut g = h.protect();
    // Keys 1000..1100: the first 50 records are then truncated.
    let keys: Vec<u64> = (1000..1100).collect();
    let addresses: Vec<u64> = keys
        .iter()
        .map(|&k| upsert(&index, &g, &records, k))
        .collect();
    records.begin.store(addresses[50], Ordering::SeqCst);
    assert!(index.grow(&mut g, records.clone()));
    for (i, &k) in keys.iter().enumerate() {
        let found = find_all(&index, &g, &records, k);
        if i >= 50 {
            assert_eq!(found, [addresses[i]], "key {k}");
        } else {
            // Either the entry is gone or its chain holds only the truncated record,
            // which the log (not the index) will stop at.
            assert!(found.is_empty() || found == [addresses[i]], "key {k}");
        }
    }
    // An entry survives only if its chain reaches a record that is not truncated.
    for (_, entry) in index.entries(&g) {
        assert!(
            entry.address() >= addresses[50],
            "{entry:?} kept a truncated chain"
        );
    }
    check_entries(&index, &g, &records);
}

#[test]
fn a_grow_waits_for_protected_threads_to_refresh() {
    // A thread protected before the grow began may still be working in the old table
    // unpinned: the grow may not migrate anything until it has refreshed.
    let epoch = Arc::new(Epoch::new());
    let records = Arc::new(Records::new(10));
    let index = Arc::new(HashIndex::new(
        epoch.clone(),
        IndexOptions {
            buckets: 2,
            grow_chunk_buckets: 1,
        },
    ));
    let mut other = epoch.register();
    let mut stalled = other.protect();
    std::thread::scope(|s| {
        let grower = {
            let (index, epoch, records) = (index.clone(), epoch.clone(), records.clone());
            s.spawn(move || {
                let mut h = epoch.register();
                let mut g = h.protect();
                index.grow(&mut g, records)
            })
        };
        while !index.is_growing() {
            std::thread::yield_now();
        }
        // The grower is stuck in its prepare phase behind this thread: its phase change
        // is pending and the old table is still the active one.
        for _ in 0..100 {
            std::thread::yield_now();
            assert!(index.is_growing());
            assert_eq!(index.buckets(&stalled), 2);
        }
        assert!(epoch.pending_actions() >= 1);
        // A second grow is refused while one is under way.
        assert!(!index.grow(&mut stalled, records.clone()));
        stalled.refresh();
        assert!(grower.join().unwrap());
    });
    assert_eq!(index.buckets(&stalled), 4);
    drop(stalled);
    drop(other);
    let mut h = epoch.register();
    drop(h.protect());
    assert_eq!(epoch.pending_actions(), 0);
}

/// Workers upsert distinct and shared (colliding) keys and check every key they wrote is
/// found, while a grower doubles the table several times. Afterwards every record any
/// worker linked is reachable from the index, and the entries are unique per tag.
#[test]
fn concurrent_inserts_and_finds_across_grows() {
    concurrent(4, 3_000, 4, 1, 4);
    concurrent(3, 2_000, 64, 8, 3);
}

/// The same, longer: eight threads, ten doublings from two buckets.
#[test]
#[ignore = "a soak: cargo test --release --lib hash::tests::soak -- --ignored"]
fn soak_concurrent_inserts_and_finds_across_many_grows() {
    concurrent(8, 20_000, 2, 1, 10);
}

fn concurrent(threads: u64, per_thread: u64, buckets: usize, chunk: usize, grows: u32) {
    let epoch = Arc::new(Epoch::new());
    let index = HashIndex::new(
        epoch.clone(),
        IndexOptions {
            buckets,
            grow_chunk_buckets: chunk,
        },
    );
    let records = Arc::new(Records::new((threads * per_thread * 2 + 10_000) as usize));
    let done = AtomicUsize::new(0);
    let linked: Vec<(u64, u64)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (index, epoch, records, done) = (&index, &epoch, &records, &done);
                s.spawn(move || {
                    let mut h = epoch.register();
                    let mut g = h.protect();
                    let mut linked = Vec::new();
                    for i in 0..per_thread {
                        // Every third write goes to one of 64 keys all threads share
                        // (groups of four of them share a whole hash).
                        let key = if i % 3 == 0 {
                            (i / 3 + t) % 64
                        } else {
                            1000 + t * 1_000_000 + i
                        };
                        let address = upsert(index, &g, records, key);
                        linked.push((key, address));
                        let found = find_all(index, &g, records, key);
                        assert!(found.contains(&address), "key {key}: lost {address}");
                        if i % 4 == 0 {
                            g.refresh();
                        }
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    linked
                })
            })
            .collect();
        let grower = {
            let (index, epoch, records) = (&index, &epoch, &records);
            s.spawn(move || {
                let mut h = epoch.register();
                let mut g = h.protect();
                // Spread the grows over the run: grow `round` waits for its share of
                // the writes to land (they all do, so none waits forever).
                let writes = (threads * per_thread) as usize;
                for round in 0..grows as usize {
                    let due = (round + 1) * writes / (grows as usize + 1);
                    while records.next.load(Ordering::SeqCst) < due {
                        std::thread::yield_now();
                        g.refresh();
                    }
                    assert!(index.grow(&mut g, records.clone()));
                    g.refresh();
                }
            })
        };
        grower.join().unwrap();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(done.load(Ordering::SeqCst), threads as usize);
    let mut h = epoch.register();
    let g = h.protect();
    assert_eq!(index.buckets(&g), buckets << grows);
    check_entries(&index, &g, &records);
    let mut by_key: HashMap<u64, HashSet<u64>> = HashMap::new();
    for (key, address) in linked {
        by_key.entry(key).or_default().insert(address);
    }
    for (key, addresses) in by_key {
        let found: HashSet<u64> = find_all(&index, &g, &records, key).into_iter().collect();
        assert_eq!(found, addresses, "key {key}: records lost or foreign");
    }
}

/// Threads released together each create the entry of the same new hash, round after
/// round: every thread must get the same slot, and no bucket may end with two live
/// entries of a tag. Other threads meanwhile remove entries of other tags in the same
/// buckets, so free slots open up ahead of the inserters (FASTER's figure 3a).
#[test]
fn racing_creates_of_one_tag_make_one_entry() {
    // Two threads on this class of machine (two cores) can run truly at once.
    const THREADS: usize = 2;
    const ROUNDS: usize = 5000;
    let index = index_with(16, 4);
    let epoch = index.epoch().clone();
    let records = Records::new(10);
    let slots: Vec<[AtomicUsize; THREADS]> = (0..ROUNDS)
        .map(|_| std::array::from_fn(|_| AtomicUsize::new(0)))
        .collect();
    let arrived = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (index, epoch, slots, arrived) = (&index, &epoch, &slots, &arrived);
            s.spawn(move || {
                let mut h = epoch.register();
                let mut g = h.protect();
                for (round, slots) in slots.iter().enumerate() {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    let mut spins = 0u32;
                    while arrived.load(Ordering::SeqCst) < THREADS * (round + 1) {
                        // Spin a little (to start together), then let the others run.
                        spins += 1;
                        if spins < 10_000 {
                            std::hint::spin_loop();
                        } else {
                            std::thread::yield_now();
                        }
                    }
                    let hash = hash_of(2_000_000 + round as u64);
                    let slot = index.find_or_create(&g, hash);
                    slots[t].store(slot.slot_address(), Ordering::SeqCst);
                    drop(slot);
                    // The last thread removes an entry of two rounds ago, of another tag.
                    if t == THREADS - 1
                        && round >= 2
                        && let Some(old) = index.find(&g, hash_of(2_000_000 + round as u64 - 2))
                    {
                        old.try_remove().unwrap();
                    }
                    g.refresh();
                }
            });
        }
    });
    for (round, slots) in slots.iter().enumerate() {
        let first = slots[0].load(Ordering::SeqCst);
        for slot in slots {
            assert_eq!(
                slot.load(Ordering::SeqCst),
                first,
                "round {round}: two entries"
            );
        }
    }
    let mut h = epoch.register();
    let g = h.protect();
    check_entries(&index, &g, &records);
}
