//! Large values in a database's tree keyspaces: values longer than the inline limit are
//! kept out of line in the value store, and every path reads and writes them whole —
//! point reads, `get_many`, scans, batches mixing sizes, checkpoints, the log, reopens —
//! while the space of overwritten and deleted values comes back by itself.

mod common;

use std::collections::BTreeMap;

use bfdb::{Config, Db, DbOptions, DbStats, Durability, Error, HashStoreOptions, WriteBatch};
use common::{LONG_VALUE_SIZES, Rng, check_stamped, long_key, long_value, stamped, with_crc};

/// Held by the tests that make value reads wait (`Db::delay_value_reads_for_test`, which
/// every database of the process obeys), so that one does not set the other's delay.
static READ_DELAY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn options() -> DbOptions {
    DbOptions::default()
        .config(Config {
            memory_budget_bytes: 1 << 20,
            huge_pages: false,
            ..Config::default()
        })
        .checkpoint_on_close(false)
}

#[test]
fn values_of_every_size_read_back_whole_through_every_path_and_after_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let want: BTreeMap<Vec<u8>, Vec<u8>> = LONG_VALUE_SIZES
        .iter()
        .enumerate()
        .map(|(i, &len)| (long_key(i as u64), long_value(i as u64, 1, len)))
        .collect();
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let t = db.tree("t").unwrap();
        for (i, (k, v)) in want.iter().enumerate() {
            let level = [Durability::Unlogged, Durability::Logged, Durability::Synced][i % 3];
            t.insert_with(k, v, level).unwrap();
        }
        check(&t, &want);
        db.checkpoint().unwrap();
        check(&t, &want);
    }
    // Reopened from the checkpoint (and the log after it: nothing).
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db.tree("t").unwrap();
    check(&t, &want);
    // Overwritten at `Synced` and reopened from the log alone.
    let mut want = want;
    for (i, v) in want.values_mut().enumerate() {
        *v = long_value(
            i as u64,
            2,
            LONG_VALUE_SIZES[(i + 5) % LONG_VALUE_SIZES.len()],
        );
    }
    for (k, v) in &want {
        t.insert_with(k, v, Durability::Synced).unwrap();
    }
    drop((t, db));
    let db = Db::open(dir.path(), options()).unwrap();
    assert!(db.recovery().writes_replayed >= LONG_VALUE_SIZES.len() as u64);
    check(&db.tree("t").unwrap(), &want);
}

/// Point reads, `get_many`, a forward and a backward scan and a cursor all agree with
/// `want`.
fn check(t: &bfdb::Tree, want: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (k, v) in want {
        assert_eq!(t.get(k).unwrap().as_ref(), Some(v), "get {k:?}");
    }
    let keys: Vec<&Vec<u8>> = want.keys().collect();
    let got = t.get_many(&keys).unwrap();
    for (k, v) in keys.iter().zip(got) {
        assert_eq!(v.as_ref(), want.get(*k), "get_many {k:?}");
    }
    let forward: Vec<(Vec<u8>, Vec<u8>)> = t.range::<&[u8], _>(..).map(|r| r.unwrap()).collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> =
        want.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(forward == expected, "a forward scan differs");
    let mut backward: Vec<(Vec<u8>, Vec<u8>)> =
        t.range::<&[u8], _>(..).rev().map(|r| r.unwrap()).collect();
    backward.reverse();
    assert!(backward == expected, "a backward scan differs");
    let mut cursor = t.cursor::<&[u8], _>(..);
    let mut lent = Vec::new();
    while let Some(r) = cursor.next() {
        let (k, v) = r.unwrap();
        lent.push((k.to_vec(), v.to_vec()));
    }
    assert!(lent == expected, "a cursor differs");
}

#[test]
fn a_value_above_the_limit_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        options().config(Config {
            memory_budget_bytes: 1 << 20,
            huge_pages: false,
            max_value_bytes: 100_000,
            ..Config::default()
        }),
    )
    .unwrap();
    let t = db.tree("t").unwrap();
    let err = t.insert(b"k", &vec![1; 100_001]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ValueTooLarge {
                len: 100_001,
                max: 100_000
            }
        ),
        "{err}"
    );
    assert_eq!(t.get(b"k").unwrap(), None);
    t.insert(b"k", &vec![2; 100_000]).unwrap();
    assert_eq!(t.get(b"k").unwrap().map(|v| v.len()), Some(100_000));
    // A batch holding one value too long writes none of its values.
    let mut batch = WriteBatch::new();
    batch.insert(&t, b"a", &vec![3; 50_000]);
    batch.insert(&t, b"b", &vec![3; 100_001]);
    assert!(db.write(batch).is_err());
    assert_eq!(t.get(b"a").unwrap(), None);
    assert_eq!(db.stats().value_store_live_bytes, 100_000);
}

#[test]
fn a_tree_outside_a_database_refuses_values_above_the_inline_limit() {
    let tree = bfdb::Tree::in_memory(Config::default()).unwrap();
    let inline = Config::default().max_inline_value_bytes;
    tree.insert(b"k", &vec![0; inline]).unwrap();
    let err = tree.insert(b"k", &vec![0; inline + 1]).unwrap_err();
    assert!(
        matches!(err, Error::ValueTooLarge { max, .. } if max == inline),
        "{err}"
    );
}

/// A differential run against a `BTreeMap`: random puts of values from empty to a few
/// MiB, deletes, batches mixing sizes, both kinds of checkpoint and reopens. At every
/// reopen the database equals the model, and once three checkpoints have passed the value
/// store holds exactly the live values' extents: nothing overwritten or deleted leaks.
#[test]
fn random_large_and_small_values_match_a_model_across_checkpoints_and_reopens() {
    let seed = common::seed("random_large_and_small_values");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut version = 0;
    for round in 0..4 {
        let db = Db::open(dir.path(), options()).unwrap();
        let t = db.tree("t").unwrap();
        check(&t, &model);
        for step in 0..300 {
            version += 1;
            let k = rng.below(60);
            let len = match rng.below(10) {
                0..=3 => rng.below(2048) as usize,
                4..=7 => 2049 + rng.below(70_000) as usize,
                8 => rng.below(1 << 20) as usize,
                _ => rng.below(3 << 20) as usize,
            };
            match rng.below(10) {
                0 => {
                    t.delete(&long_key(k)).unwrap();
                    model.remove(&long_key(k));
                }
                1 => {
                    let mut batch = WriteBatch::new();
                    for j in 0..3 {
                        let (bk, bv) = (
                            long_key((k + j * 7) % 60),
                            long_value(k + j, version, len / (j as usize + 1)),
                        );
                        batch.insert(&t, &bk, &bv);
                        model.insert(bk, bv);
                    }
                    db.write(batch).unwrap();
                }
                _ => {
                    let v = long_value(k, version, len);
                    t.insert(&long_key(k), &v).unwrap();
                    model.insert(long_key(k), v);
                }
            }
            match step % 50 {
                17 => db.checkpoint().unwrap(),
                34 => db.checkpoint_incremental().unwrap(),
                _ => {}
            }
        }
        check(&t, &model);
        // Three checkpoints free what the writes made unreachable: the first's merges
        // find the last leaf versions shadowed, and a free is reusable once the oldest
        // checkpoint kept began after it.
        for _ in 0..3 {
            db.checkpoint().unwrap();
        }
        let stats = db.stats();
        let live: u64 = model
            .values()
            .filter(|v| v.len() > Config::default().max_inline_value_bytes)
            .map(|v| v.len() as u64)
            .sum();
        assert_eq!(
            stats.value_store_live_bytes, live,
            "round {round}: live bytes"
        );
        assert_eq!(
            stats.value_store_deferred_bytes, 0,
            "round {round}: values freed and not yet reusable after two checkpoints"
        );
        if round % 2 == 1 {
            db.close().unwrap();
        }
    }
}

/// Readers race writers that overwrite long values and a thread that takes checkpoints
/// back to back, so that freed extents are reused while reads of them may be in flight:
/// every read returns one whole value of its key (a reader that found a reference
/// before its value was freed holds the extent until it has read it), never older than
/// a version the reader saw before, and the value file stays far smaller than what was
/// written (extents are reused).
#[test]
fn reads_racing_overwrites_and_checkpoints_see_whole_values_while_extents_are_reused() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db.tree("t").unwrap();
    // Each read holds its reference for 2 ms before reading: a few checkpoints, enough
    // for the extent to be freed and reused were the reader not guarded.
    let _delay = READ_DELAY.lock().unwrap_or_else(|e| e.into_inner());
    Db::delay_value_reads_for_test(std::time::Duration::from_millis(2));
    const KEYS: u64 = 12;
    for k in 0..KEYS {
        t.insert(&long_key(k), &stamped(k, 0, 4096)).unwrap();
    }
    let stop = AtomicBool::new(false);
    let written = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let checkpoints = AtomicU64::new(0);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (t, written, checkpoints) = (&t, &written, &checkpoints);
                s.spawn(move || {
                    let mut rng = Rng(common::seed("racing writer") ^ w);
                    // Until 30 checkpoints have passed: many reuse cycles.
                    for i in 1..=20_000u64 {
                        if checkpoints.load(Ordering::Relaxed) >= 30 {
                            break;
                        }
                        let k = rng.below(KEYS);
                        let len = 2049 + rng.below(30_000) as usize;
                        // Versions grow per key across both writers: i * 2 + w.
                        t.insert(&long_key(k), &stamped(k, i * 2 + w, len)).unwrap();
                        written.fetch_add(len as u64, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if checkpoints.load(Ordering::Relaxed).is_multiple_of(2) {
                    db.checkpoint().unwrap();
                } else {
                    db.checkpoint_incremental().unwrap();
                }
                checkpoints.fetch_add(1, Ordering::Relaxed);
            }
        });
        for r in 0..2u64 {
            let (t, stop, reads) = (&t, &stop, &reads);
            s.spawn(move || {
                let mut rng = Rng(common::seed("racing reader") ^ r);
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.below(KEYS);
                    match rng.below(4) {
                        0 => {
                            let keys: Vec<Vec<u8>> = (0..KEYS).map(long_key).collect();
                            for (k, v) in t.get_many(&keys).unwrap().into_iter().enumerate() {
                                check_stamped(k as u64, &v.unwrap()).unwrap();
                            }
                        }
                        1 => {
                            for (k, v) in t.range::<&[u8], _>(..).map(|r| r.unwrap()) {
                                let k: u64 = std::str::from_utf8(&k[3..]).unwrap().parse().unwrap();
                                check_stamped(k, &v).unwrap();
                            }
                        }
                        2 => {
                            let p = t.get_part(&long_key(k), 0, 4096).unwrap().unwrap();
                            check_stamped(k, &p).unwrap();
                        }
                        _ => {
                            check_stamped(k, &t.get(&long_key(k)).unwrap().unwrap()).unwrap();
                        }
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    Db::delay_value_reads_for_test(std::time::Duration::ZERO);
    let stats = db.stats();
    let written = written.load(Ordering::Relaxed);
    eprintln!(
        "racing reads: {} reads, {} checkpoints, {} MB written, value file {} MB",
        reads.load(Ordering::Relaxed),
        checkpoints.load(Ordering::Relaxed),
        written >> 20,
        stats.value_store_file_bytes >> 20
    );
    assert!(checkpoints.load(Ordering::Relaxed) >= 3);
    assert!(
        stats.value_store_file_bytes < written / 3,
        "extents were not reused: a {}-byte file for {written} bytes written",
        stats.value_store_file_bytes
    );
}

/// A database of 16 MiB: a quarter of what its hash store leaves caches long values.
fn cached_options() -> DbOptions {
    options().config(Config {
        memory_budget_bytes: 16 << 20,
        huge_pages: false,
        ..Config::default()
    })
}

/// The value cache within its capacity, and the budget's parts within the budget.
fn check_memory(stats: &DbStats) {
    assert!(
        stats.value_cache_bytes <= stats.value_cache_capacity_bytes,
        "the value cache holds {} bytes, over its {}",
        stats.value_cache_bytes,
        stats.value_cache_capacity_bytes
    );
    assert!(
        stats.value_cache_capacity_bytes + stats.tree_memory_bytes + stats.hash_memory_bytes
            <= stats.memory_budget_bytes,
        "{stats:?}"
    );
}

/// Reads of tree and hash keyspaces, whole (point reads, `get_many`, scans, cursors)
/// and in parts, answered by the value cache after the first, return each key's
/// current value through rounds of overwrites and both kinds of checkpoint, and after a
/// reopen (which starts with an empty cache).
#[test]
fn cached_reads_return_the_current_bytes_across_overwrites_checkpoints_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let hash_options = HashStoreOptions::default().memory_bytes(2 << 20);
    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let check_hash = |h: &bfdb::HashStore, want: &BTreeMap<Vec<u8>, Vec<u8>>| {
        for (k, v) in want {
            assert_eq!(h.get(k).unwrap().as_ref(), Some(v), "hash get {k:?}");
        }
        let keys: Vec<&Vec<u8>> = want.keys().collect();
        for (k, v) in keys.iter().zip(h.get_many(&keys).unwrap()) {
            assert_eq!(v.as_ref(), want.get(*k), "hash get_many {k:?}");
        }
    };
    let check_parts = |t: &bfdb::Tree, want: &BTreeMap<Vec<u8>, Vec<u8>>| {
        for (k, v) in want {
            let part = t.get_part(k, 1000, 1500).unwrap().unwrap();
            assert_eq!(part, v[1000..2500], "get_part {k:?}");
        }
    };
    {
        let db = Db::open(dir.path(), cached_options()).unwrap();
        let t = db.tree("t").unwrap();
        let h = db.hash_store_with("h", hash_options.clone()).unwrap();
        for round in 0..4u64 {
            for k in 0..40u64 {
                let len = [3000, 8192, 20_000, 100_000][(k + round) as usize % 4];
                let v = long_value(k, round, len);
                t.insert(&long_key(k), &v).unwrap();
                h.insert(&long_key(k), &v).unwrap();
                want.insert(long_key(k), v);
            }
            // (A checkpoint sets the cache's share by what is stored, as the background
            // checkpointer's ticks do.)
            if round % 2 == 0 {
                db.checkpoint().unwrap();
            } else {
                db.checkpoint_incremental().unwrap();
            }
            // Twice: the second time from the cache.
            for _ in 0..2 {
                check(&t, &want);
                check_parts(&t, &want);
                check_hash(&h, &want);
            }
            check_memory(&db.stats());
        }
        let stats = db.stats();
        assert!(stats.value_cache_capacity_bytes > 0);
        assert!(
            stats.value_cache_hits > stats.value_cache_misses,
            "the second reads hit: {stats:?}"
        );
    }
    let db = Db::open(dir.path(), cached_options()).unwrap();
    let stats = db.stats();
    assert_eq!((stats.value_cache_hits, stats.value_cache_values), (0, 0));
    assert!(
        stats.value_cache_capacity_bytes > 0,
        "a database that holds long values gives the cache its share at the open"
    );
    let (t, h) = (
        db.tree("t").unwrap(),
        db.hash_store_with("h", hash_options).unwrap(),
    );
    for _ in 0..2 {
        check(&t, &want);
        check_parts(&t, &want);
        check_hash(&h, &want);
    }
    let stats = db.stats();
    assert!(stats.value_cache_hits > 0, "{stats:?}");
    check_memory(&stats);
}

/// The invalidation rule through the database: a reader that found a value's reference
/// before an overwrite freed the value reads it late (after the free dropped its entry)
/// and caches it again; the release of its extent, after that reader is done, drops
/// that entry, so the value written next into the extent — of the same length and
/// checksum, hence the same reference, other bytes — is answered with its own bytes.
/// Without the release's drop, the cache would answer it with the old value's (and
/// builds with debug assertions stop at its write).
#[test]
fn a_value_cached_by_a_reader_racing_its_overwrite_is_dropped_before_its_extent_is_reused() {
    let _delay = READ_DELAY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), cached_options()).unwrap();
    let t = db.tree("t").unwrap();
    let old = long_value(1, 1, 8000);
    t.insert(b"a", &old).unwrap();
    assert_eq!(t.get(b"a").unwrap().unwrap(), old);
    let newer = long_value(1, 2, 20_000);
    let read_late = std::thread::scope(|s| {
        // The reader finds the old reference, then waits 300 ms before reading it.
        Db::delay_value_reads_for_test(std::time::Duration::from_millis(300));
        let reader = s.spawn(|| t.get(b"a").unwrap().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(100));
        // Overwritten (the old value freed) while the reader waits; the third
        // checkpoint releases the old extent once the reader has read and cached it.
        t.insert(b"a", &newer).unwrap();
        for _ in 0..3 {
            db.checkpoint().unwrap();
        }
        let read = reader.join().unwrap();
        Db::delay_value_reads_for_test(std::time::Duration::ZERO);
        read
    });
    assert!(
        read_late == old,
        "the reader found the old reference before the overwrite (100 ms before it)"
    );
    let stats = db.stats();
    assert_eq!(
        stats.value_store_deferred_bytes, 0,
        "the old extent is free"
    );
    assert_eq!(
        stats.value_cache_values, 1,
        "the cache holds the newer value only: the release dropped the old one"
    );
    // The old extent is the only free space: a value of its length and checksum takes
    // it (the address space does not grow), with the old value's reference.
    let file_bytes = stats.value_store_file_bytes;
    let reused = with_crc(long_value(2, 1, 8000), crc32c::crc32c(&old));
    t.insert(b"b", &reused).unwrap();
    assert_eq!(db.stats().value_store_file_bytes, file_bytes);
    assert!(
        t.get(b"b").unwrap().unwrap() == reused,
        "the old bytes answered"
    );
    assert!(t.get(b"a").unwrap().unwrap() == newer);
    check_memory(&db.stats());
}

/// The cache's memory comes out of the budget only once the database holds a long
/// value, and then in proportion to the bytes stored out of line against the trees'
/// leaf pages, up to `value_cache_percent`: a few long values among many short records
/// take little of the pool; megabytes of them take the most; deleting them gives the
/// pool its memory back. A hash store created and dropped moves the split, always
/// within the budget; a reopen sets the share at once; `value_cache_percent: 0` turns
/// the cache off.
#[test]
fn the_value_caches_share_of_the_budget_follows_the_bytes_stored_out_of_line() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 8u64 << 20;
    let config = Config {
        memory_budget_bytes: budget,
        huge_pages: false,
        ..Config::default()
    };
    let most = u64::from(config.value_cache_percent);
    let opts = options().config(config.clone());
    {
        let db = Db::open(dir.path(), opts.clone()).unwrap();
        let t = db.tree("t").unwrap();
        for i in 0..20_000u64 {
            t.insert(&i.to_be_bytes(), &[7; 100]).unwrap();
        }
        db.checkpoint().unwrap();
        let stats = db.stats();
        assert_eq!(stats.value_cache_capacity_bytes, 0, "no long value yet");
        assert_eq!(stats.tree_memory_bytes, budget, "the trees keep it all");
        // One long value beside megabytes of leaves: a sliver at most.
        t.insert(b"long", &vec![1; 5000]).unwrap();
        db.checkpoint().unwrap();
        let stats = db.stats();
        assert!(stats.value_cache_capacity_bytes < budget / 20, "{stats:?}");
        check_memory(&stats);
        // 16 MiB of values, eight times the leaves' bytes and twice the budget, each
        // read twice: the cache gets the most it may.
        for k in 0..2000u64 {
            t.insert(&long_key(k), &long_value(k, 1, 8192)).unwrap();
            check_memory(&db.stats());
        }
        db.checkpoint().unwrap();
        let stats = db.stats();
        assert_eq!(stats.value_cache_capacity_bytes, budget * most / 100);
        assert_eq!(stats.tree_memory_bytes, budget - budget * most / 100);
        for _ in 0..2 {
            for k in 0..2000u64 {
                assert!(t.get(&long_key(k)).unwrap().unwrap() == long_value(k, 1, 8192));
            }
            check_memory(&db.stats());
        }
        assert!(db.stats().value_cache_bytes > budget / 2, "the cache fills");
        // A hash store's memory comes out of what the cache and the trees share.
        db.hash_store_with("h", HashStoreOptions::default().memory_bytes(2 << 20))
            .unwrap();
        let stats = db.stats();
        assert_eq!(
            stats.value_cache_capacity_bytes,
            (budget - (2 << 20)) * most / 100
        );
        check_memory(&stats);
        db.drop_hash_store("h").unwrap();
        let stats = db.stats();
        assert_eq!(stats.value_cache_capacity_bytes, budget * most / 100);
        check_memory(&stats);
        db.close().unwrap();
    }
    let db = Db::open(dir.path(), opts.clone()).unwrap();
    assert_eq!(
        db.stats().value_cache_capacity_bytes,
        budget * most / 100,
        "the open sets the share"
    );
    // The long values deleted: once their space is free, the pool gets its memory
    // back.
    let t = db.tree("t").unwrap();
    for k in 0..2000u64 {
        t.delete(&long_key(k)).unwrap();
    }
    for _ in 0..3 {
        db.checkpoint().unwrap();
    }
    let stats = db.stats();
    assert!(stats.value_cache_capacity_bytes < budget / 20, "{stats:?}");
    assert!(stats.tree_memory_bytes > budget - budget / 20);
    check_memory(&stats);
    drop((t, db));
    let off = options().config(Config {
        value_cache_percent: 0,
        ..config
    });
    let db = Db::open(dir.path(), off).unwrap();
    let t = db.tree("t").unwrap();
    for _ in 0..2 {
        assert!(t.get(b"long").unwrap().unwrap() == vec![1; 5000]);
    }
    db.checkpoint().unwrap();
    let stats = db.stats();
    assert_eq!(stats.value_cache_capacity_bytes, 0);
    assert_eq!(stats.tree_memory_bytes, budget);
    assert_eq!((stats.value_cache_hits, stats.value_cache_values), (0, 0));
}

/// Writes `count` long values of `len` bytes (version 1) under keys from `first`;
/// returns their bytes and their extents' bytes.
fn fill(put: impl Fn(&[u8], &[u8]), first: u64, count: u64, len: usize) -> (u64, u64) {
    for k in first..first + count {
        put(&long_key(k), &long_value(k, 1, len));
    }
    (count * len as u64, count * common::extent_bytes(len))
}

/// Dropping a keyspace gives its values back, a tree's and a hash store's alike. While
/// a handle to the dropped keyspace lives it still reads them; once it is gone the
/// store's live bytes fall by exactly the keyspace's values, and two checkpoints later
/// their extents are free and the value files (and the directory) hold that much less.
/// Then the same with a database closed right after the drop, before any checkpoint
/// saw it: the open frees what the last checkpoint's snapshot still held for the
/// dropped keyspace.
#[test]
fn a_dropped_keyspaces_values_come_back_and_the_directory_shrinks() {
    use common::allocated_bytes;
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let keep = db.tree("keep").unwrap();
    let kept = fill(|k, v| keep.insert(k, v).unwrap(), 0, 12, 200_001);
    let gone = db.tree("gone").unwrap();
    let tree_values = fill(|k, v| gone.insert(k, v).unwrap(), 0, 40, 300_000);
    for k in 0..50 {
        gone.insert(&long_key(1000 + k), b"short").unwrap();
    }
    let gone_hash = db
        .hash_store_with("gone-hash", common::small_hash_options())
        .unwrap();
    let hash_values = fill(|k, v| gone_hash.insert(k, v).unwrap(), 0, 30, 400_003);
    db.checkpoint().unwrap();
    let before = db.stats();
    assert_eq!(
        before.value_store_live_bytes,
        kept.0 + tree_values.0 + hash_values.0
    );
    let (dir_before, values_before) = (
        allocated_bytes(dir.path(), ""),
        allocated_bytes(dir.path(), "values-"),
    );

    assert!(db.drop_tree("gone").unwrap());
    // The handle still reads what the tree held: its values stay until it goes.
    assert_eq!(
        gone.get(&long_key(7)).unwrap(),
        Some(long_value(7, 1, 300_000))
    );
    assert_eq!(
        db.stats().value_store_live_bytes,
        before.value_store_live_bytes
    );
    drop(gone);
    assert_eq!(
        db.stats().value_store_live_bytes,
        kept.0 + hash_values.0,
        "the tree's values are freed once its last handle is gone"
    );
    drop(gone_hash);
    assert!(db.drop_hash_store("gone-hash").unwrap());
    let after_drops = db.stats();
    assert_eq!(after_drops.value_store_live_bytes, kept.0);
    assert_eq!(
        after_drops.value_store_deferred_bytes,
        tree_values.1 + hash_values.1
    );
    for _ in 0..2 {
        db.checkpoint().unwrap();
    }
    let after = db.stats();
    assert_eq!(after.value_store_deferred_bytes, 0);
    assert_eq!(after.value_store_live_bytes, kept.0);
    assert_eq!(after.value_store_allocated_bytes, kept.1);
    let (dir_after, values_after) = (
        allocated_bytes(dir.path(), ""),
        allocated_bytes(dir.path(), "values-"),
    );
    let freed = tree_values.1 + hash_values.1;
    eprintln!(
        "drop: value files {values_before} -> {values_after} bytes, directory \
         {dir_before} -> {dir_after} bytes, {freed} bytes of extents freed"
    );
    assert!(
        values_after + freed <= values_before,
        "the value files hold {values_after} bytes, {values_before} before the drops of \
         {freed} bytes of extents"
    );
    assert!(dir_after + freed <= dir_before);
    for k in 0..12 {
        assert_eq!(
            keep.get(&long_key(k)).unwrap(),
            Some(long_value(k, 1, 200_001))
        );
    }

    // Dropped, and closed before a checkpoint saw the drop.
    let gone = db.tree("gone-again").unwrap();
    let again = fill(|k, v| gone.insert(k, v).unwrap(), 0, 40, 500_000);
    db.checkpoint().unwrap();
    let values_before = allocated_bytes(dir.path(), "values-");
    assert!(db.drop_tree("gone-again").unwrap());
    drop((gone, keep));
    db.close().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(db.keyspaces(), ["keep"]);
    let reopened = db.stats();
    assert_eq!(reopened.value_store_live_bytes, kept.0);
    assert_eq!(reopened.value_store_deferred_bytes, again.1);
    for _ in 0..2 {
        db.checkpoint().unwrap();
    }
    let after = db.stats();
    assert_eq!(after.value_store_deferred_bytes, 0);
    assert_eq!(after.value_store_allocated_bytes, kept.1);
    let values_after = allocated_bytes(dir.path(), "values-");
    eprintln!(
        "drop, close, reopen: value files {values_before} -> {values_after} bytes, {} bytes \
         of extents freed",
        again.1
    );
    assert!(values_after + again.1 <= values_before);
    let keep = db.tree("keep").unwrap();
    for k in 0..12 {
        assert_eq!(
            keep.get(&long_key(k)).unwrap(),
            Some(long_value(k, 1, 200_001))
        );
    }
}
