//! The async read path on tokio-uring (`bfdb::aio`, feature `tokio-uring`), compared with
//! the synchronous API, alone and with writers on other threads.
//!
//! ```text
//! cargo test --features tokio-uring --test aio
//! ```
//!
//! Each randomized test prints its seed; replay one with `BFDB_SEED=<seed>`.
#![cfg(feature = "tokio-uring")]

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bfdb::aio::AsyncTree;
use bfdb::{Backend, Config, Tree};

mod common;
use common::{Rng, check_racing_scan, key, parse_value, seed, value, write_next_version};

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("aio")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// A file-backed tree (O_DIRECT where the filesystem allows) far larger than its pool,
/// loaded with every key of `0..n` but the multiples of 3, and flushed.
fn loaded(
    dir: &tempfile::TempDir,
    n: u64,
    promotion: u8,
) -> (Arc<Tree>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let config = Config {
        memory_budget_bytes: 128 << 10,
        promotion_rate_percent: promotion,
        scan_promotion_rate_percent: promotion,
        backend: Backend::StdDirect,
        huge_pages: false,
        ..Config::default()
    };
    let tree = Tree::open(dir.path().join("tree"), config).unwrap();
    let mut model = BTreeMap::new();
    for i in (0..n).filter(|i| i % 3 != 0) {
        tree.insert(&key(i), &value(i, 0)).unwrap();
        model.insert(key(i), value(i, 0));
    }
    tree.flush().unwrap();
    (Arc::new(tree), model)
}

#[test]
fn async_get_and_scan_match_the_sync_api() {
    let mut rng = Rng(seed("async_get_and_scan_match_the_sync_api"));
    let dir = temp_dir();
    let n = 12_000;
    let (tree, model) = loaded(&dir, n, 20);
    tokio_uring::start(async {
        let reader = AsyncTree::new(Arc::clone(&tree));
        for _ in 0..3000 {
            let k = key(rng.below(n + 100));
            let got = reader.get(&k).await.unwrap();
            assert_eq!(
                got.as_ref(),
                model.get(&k),
                "{}",
                String::from_utf8_lossy(&k)
            );
            assert_eq!(got, tree.get(&k).unwrap());
        }
        for _ in 0..20 {
            let a = rng.below(n);
            let b = a + rng.below(n / 3);
            let limit = rng.below(3000) as usize;
            let got = reader.scan(key(a)..key(b), limit).await.unwrap();
            let expect: Vec<(Vec<u8>, Vec<u8>)> = model
                .range(key(a)..key(b))
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert!(got == expect, "scan {a}..{b} limit {limit}");
            let sync: Vec<_> = tree
                .range(key(a)..key(b))
                .take(limit)
                .map(Result::unwrap)
                .collect();
            assert!(got == sync);
        }
        let all = reader.scan::<&[u8], _>(.., usize::MAX).await.unwrap();
        assert_eq!(all.len(), model.len());
        assert!(reader.get(b"").await.is_err(), "empty keys are rejected");
    });
    let stats = tree.stats();
    eprintln!("{stats:?}");
    assert!(
        stats.async_leaf_reads > 1000,
        "reads went through the ring: {stats:?}"
    );
}

/// Many async reads in flight on one runtime thread while writers on other threads
/// update, insert and delete: values are ones written for their key, never older than a
/// value the same task saw before, and scans keep every key that is never deleted.
#[test]
fn async_reads_race_writers_on_other_threads() {
    let seed = seed("async_reads_race_writers_on_other_threads");
    let dir = temp_dir();
    let n: u64 = 9000;
    // Keys not multiples of 3 are loaded; of those, even keys are never deleted.
    let (tree, _) = loaded(&dir, n, 10);
    const WRITERS: u64 = 4;
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (tree, started, stop) =
                (Arc::clone(&tree), Arc::clone(&started), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut rng = Rng(seed ^ ((w + 1) * 0x1000));
                for _ in 0..6000 {
                    let i = rng.below(n / WRITERS) * WRITERS + w;
                    if i.is_multiple_of(3) {
                        continue;
                    }
                    write_next_version(&tree, &started, i, i % 2 == 1 && rng.below(3) == 0);
                }
                stop.store(true, Ordering::SeqCst);
            })
        })
        .collect();
    tokio_uring::start(async {
        let reader = Rc::new(AsyncTree::new(Arc::clone(&tree)));
        let tasks: Vec<_> = (0..16u64)
            .map(|t| {
                let (reader, started, stop) =
                    (Rc::clone(&reader), Arc::clone(&started), Arc::clone(&stop));
                tokio_uring::spawn(async move {
                    let mut rng = Rng(seed ^ ((t + 100) * 0x1_0000));
                    let mut seen = vec![0u64; n as usize];
                    let mut rounds = 0;
                    while !stop.load(Ordering::SeqCst) || rounds < 50 {
                        rounds += 1;
                        if t % 4 == 0 {
                            // A scan.
                            let a = rng.below(n);
                            let b = a + rng.below(600) + 1;
                            let got = reader.scan(key(a)..key(b), usize::MAX).await.unwrap();
                            let stable = (a..b.min(n)).filter(|i| i % 3 != 0 && i % 2 == 0);
                            check_racing_scan(&got, stable, &started);
                        } else {
                            let i = rng.below(n);
                            let got = reader.get(&key(i)).await.unwrap();
                            match got {
                                None => {
                                    assert!(i.is_multiple_of(3) || i % 2 == 1, "key {i} vanished")
                                }
                                Some(v) => {
                                    let (vi, version) = parse_value(&v);
                                    assert_eq!(vi, i);
                                    assert!(version <= started[i as usize].load(Ordering::SeqCst));
                                    assert!(version >= seen[i as usize], "key {i} went back");
                                    seen[i as usize] = version;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    for w in writers {
        w.join().unwrap();
    }
    let stats = tree.stats();
    eprintln!("{stats:?}");
    assert!(stats.async_leaf_reads > 0, "{stats:?}");
    assert!(stats.evictions > 0 && stats.leaf_splits > 0, "{stats:?}");
}

/// A store without a file (memory) falls back to blocking reads: same answers.
#[test]
fn async_api_on_a_memory_tree_reads_blocking() {
    let tree = Arc::new(
        Tree::in_memory(Config {
            memory_budget_bytes: 64 << 10,
            huge_pages: false,
            ..Config::default()
        })
        .unwrap(),
    );
    for i in 0..5000 {
        tree.insert(&key(i), &value(i, 0)).unwrap();
    }
    tokio_uring::start(async {
        let reader = AsyncTree::new(Arc::clone(&tree));
        for i in (0..5100).step_by(7) {
            assert_eq!(
                reader.get(&key(i)).await.unwrap(),
                tree.get(&key(i)).unwrap()
            );
        }
        assert_eq!(
            reader
                .scan(key(100)..key(4000), 10_000)
                .await
                .unwrap()
                .len(),
            3900
        );
    });
    let stats = tree.stats();
    assert_eq!(stats.async_leaf_reads, 0);
    assert!(stats.leaf_reads > 0);
}

/// The storage layer's async reader: a file store's page comes from the ring and is
/// verified there (a flipped byte is corruption, not wrong bytes); a memory store's page
/// comes from the blocking read.
#[test]
fn async_page_reader_reads_on_the_ring_and_verifies() {
    use std::os::unix::fs::FileExt;

    use bfdb::storage::{
        AsyncPageReader, FileOptions, FileStore, MemoryStore, PAGE_SIZE, Page, PageStore, ReadPath,
    };

    let dir = temp_dir();
    let path = dir.path().join("pages.bfdb");
    let store = FileStore::open(&path, FileOptions::new()).unwrap();
    let no = store.allocate().unwrap();
    let mut page = Page::boxed();
    page.payload_mut()[..5].copy_from_slice(b"hello");
    store.write_page(no, &mut page).unwrap();
    let memory = MemoryStore::new();
    let in_memory = memory.allocate().unwrap();
    memory.write_page(in_memory, &mut page).unwrap();

    tokio_uring::start(async {
        let reader = AsyncPageReader::new();
        let (read, via) = reader.read_page(&store, no).await.unwrap();
        assert_eq!(via, ReadPath::Ring);
        assert_eq!(&read.payload()[..5], b"hello");
        let (read, via) = reader.read_page(&memory, in_memory).await.unwrap();
        assert_eq!(via, ReadPath::Blocking);
        assert_eq!(&read.payload()[..5], b"hello");

        // Flip a payload byte behind the store's back: the ring read must refuse it.
        let raw = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        raw.write_all_at(b"J", no.0 * PAGE_SIZE as u64 + 100)
            .unwrap();
        let err = reader.read_page(&store, no).await.unwrap_err();
        match bfdb::Error::from(err) {
            bfdb::Error::Corrupted { page, .. } => assert_eq!(page, no.0),
            other => panic!("expected Corrupted, got {other:?}"),
        }
    });
}

/// A database with one hash keyspace of a few pages of memory, loaded with keys
/// `0..n` at version 0: most records end on disk, in the cold log.
fn loaded_hash(dir: &tempfile::TempDir, n: u64) -> (bfdb::Db, Arc<bfdb::HashStore>) {
    let options = bfdb::DbOptions::default().config(Config {
        memory_budget_bytes: 1 << 20,
        huge_pages: false,
        ..Config::default()
    });
    let db = bfdb::Db::open(dir.path().join("db"), options).unwrap();
    let store_options = bfdb::HashStoreOptions::default()
        .memory_bytes(64 << 10)
        .expected_keys(4096)
        .hot_log_disk_bytes(128 << 10)
        .cold_log_disk_bytes(1 << 20);
    let store = db.hash_store_with("h", store_options).unwrap();
    for i in 0..n {
        store
            .insert_with(&key(i), &value(i, 0), bfdb::Durability::Unlogged)
            .unwrap();
    }
    (db, store)
}

/// Many async hash reads in flight on one runtime thread while a writer on another
/// thread writes new versions: each answer is a value of its key, never older than the
/// version written before the read began; absent keys stay absent; the reads that
/// needed the disk went through the ring.
#[test]
fn async_hash_reads_race_a_writer_and_match_the_sync_api() {
    let seed = seed("async_hash_reads_race_a_writer_and_match_the_sync_api");
    let dir = temp_dir();
    let n: u64 = 4000;
    let (_db, store) = loaded_hash(&dir, n);
    let written: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, written, stop) = (Arc::clone(&store), Arc::clone(&written), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = Rng(seed ^ 0xABCD);
            while !stop.load(Ordering::SeqCst) {
                // Skewed to the low keys, as a hot set.
                let spread = rng.below(n) + 1;
                let i = rng.below(spread);
                let version = written[i as usize].load(Ordering::SeqCst) + 1;
                store
                    .insert_with(&key(i), &value(i, version), bfdb::Durability::Unlogged)
                    .unwrap();
                written[i as usize].store(version, Ordering::SeqCst);
            }
        })
    };
    let before = store.stats();
    tokio_uring::start(async {
        let reader = Rc::new(bfdb::aio::AsyncHashStore::new(Arc::clone(&store)));
        let tasks: Vec<_> = (0..16u64)
            .map(|t| {
                let (reader, written) = (Rc::clone(&reader), Arc::clone(&written));
                tokio_uring::spawn(async move {
                    let mut rng = Rng(seed ^ ((t + 1) * 0x1_0000));
                    for _ in 0..400 {
                        let i = rng.below(n + n / 4);
                        let floor = written.get(i as usize).map(|w| w.load(Ordering::SeqCst));
                        let got = reader.get(&key(i)).await.unwrap();
                        match (floor, got) {
                            (None, got) => assert_eq!(got, None, "key {i} was never written"),
                            (Some(_), None) => panic!("key {i} is missing"),
                            (Some(floor), Some(v)) => {
                                let (owner, version) = parse_value(&v);
                                assert_eq!(owner, i, "a value of another key");
                                assert!(version >= floor, "key {i}: {version} < {floor}");
                            }
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let long = vec![7u8; 64 << 10];
        assert!(
            reader.get(&long).await.is_err(),
            "oversized keys are rejected"
        );
    });
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    for i in (0..n).step_by(7) {
        assert_eq!(
            store.get(&key(i)).unwrap(),
            Some(value(i, written[i as usize].load(Ordering::SeqCst)))
        );
    }
    let stats = store.stats();
    eprintln!("{stats:?}");
    assert!(
        stats.batched_reads > before.batched_reads
            && stats.cold_disk_reads > before.cold_disk_reads,
        "reads went to the disk through the ring: {stats:?}"
    );
}

/// Async reads of a hash store's values kept out of line (longer than the inline
/// limit), of keys whose records are in memory and on disk, answer the whole values.
#[test]
fn async_hash_reads_answer_values_kept_out_of_line() {
    let _reads = VALUE_READS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir();
    let (_db, store) = loaded_hash(&dir, 2000);
    let long = long_value;
    for i in (0..2000).step_by(5) {
        store
            .insert_with(&key(i), &long(i), bfdb::Durability::Unlogged)
            .unwrap();
    }
    // More writes push the long values' records down the logs.
    for i in 2000..3000 {
        store
            .insert_with(&key(i), &value(i, 0), bfdb::Durability::Unlogged)
            .unwrap();
    }
    tokio_uring::start(async {
        let reader = bfdb::aio::AsyncHashStore::new(Arc::clone(&store));
        for i in 0..2000u64 {
            let want = if i % 5 == 0 { long(i) } else { value(i, 0) };
            assert!(reader.get(&key(i)).await.unwrap() == Some(want), "key {i}");
        }
    });
}

/// Held by the tests that read values kept out of line: one of them makes every such
/// read of the process wait (`Db::delay_value_reads_for_test`).
static VALUE_READS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A value longer than the inline limit, of `i`'s own bytes and length.
fn long_value(i: u64) -> Vec<u8> {
    let len = 2049 + (i as usize * 7919) % 200_000;
    (0..len).map(|j| (i as usize * 31 + j / 7) as u8).collect()
}

/// Async point reads of a database tree's values kept out of line, in leaves in memory
/// and on disk, answer the whole values. And a read that found a value's reference
/// before an overwrite freed it answers the old value whole, though three checkpoints
/// and writes of values of its length follow while it waits: its guard, taken before
/// the lookup, keeps the extent from reuse until it has read (with no guard the extent
/// was reused under it, and the read failed its checksum).
#[test]
fn async_tree_reads_answer_values_kept_out_of_line_and_keep_them_from_reuse() {
    let _reads = VALUE_READS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir();
    let options = bfdb::DbOptions::default()
        .config(Config {
            memory_budget_bytes: 1 << 20,
            huge_pages: false,
            // Every read of a long value goes to the device.
            value_cache_percent: 0,
            ..Config::default()
        })
        .checkpoint_on_close(false);
    let db = bfdb::Db::open(dir.path().join("db"), options).unwrap();
    let t = db.tree("t").unwrap();
    let want = |i: u64| {
        if i.is_multiple_of(5) {
            long_value(i)
        } else {
            value(i, 0)
        }
    };
    for i in 0..3000u64 {
        t.insert(&key(i), &want(i)).unwrap();
    }
    db.checkpoint().unwrap();
    tokio_uring::start(async {
        let reader = AsyncTree::new(Arc::clone(&t));
        for i in 0..3000u64 {
            assert!(
                reader.get(&key(i)).await.unwrap() == Some(want(i)),
                "key {i}"
            );
        }
    });

    let old = long_value(0);
    let read_late = std::thread::scope(|s| {
        // The reader finds the reference, then waits 300 ms before reading it.
        bfdb::Db::delay_value_reads_for_test(std::time::Duration::from_millis(300));
        let reader = s.spawn(|| {
            tokio_uring::start(async {
                let reader = AsyncTree::new(Arc::clone(&t));
                reader.get(&key(0)).await.unwrap().unwrap()
            })
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        t.insert(&key(0), &long_value(1)).unwrap();
        for _ in 0..3 {
            db.checkpoint().unwrap();
        }
        // Values of the old one's length, other bytes: the first free extents go to
        // them.
        for j in 0..20u8 {
            let mut other = old.clone();
            other[0] ^= j + 1;
            t.insert(&key(100_000 + u64::from(j)), &other).unwrap();
        }
        let read = reader.join().unwrap();
        bfdb::Db::delay_value_reads_for_test(std::time::Duration::ZERO);
        read
    });
    assert!(
        read_late == old,
        "the reader answers the value it found whole"
    );
}
