//! One memory budget for the whole database: every tree keyspace of a `Db` keeps its
//! mini-pages in one pool of `config.memory_budget_bytes`, less what hash stores take.
//! Memory moves to the keyspace in use, a dropped keyspace gives its share back, and a
//! keyspace poisoned by a failed write does not stall the others.

use std::sync::Arc;

use bfdb::storage::{SimLog, SimPages};
use bfdb::{Config, Db, DbOptions, Durability, Error, HashStoreOptions};

const BUDGET: u64 = 256 << 10;

fn options() -> DbOptions {
    DbOptions::default()
        .checkpoint_log_bytes(0)
        .checkpoint_on_close(false)
        .config(Config {
            memory_budget_bytes: BUDGET,
            huge_pages: false,
            ..Config::default()
        })
}

/// Record `i` of keyspace `ks`; consecutive `i` land on scattered leaf pages, so the
/// writes spread over many mini-pages (in key order they would fill one page at a time).
fn key(ks: u32, i: u32) -> Vec<u8> {
    let scattered = u64::from(i).wrapping_mul(2_654_435_761) % 1_000_003;
    format!("ks{ks:02}-key{scattered:08}-{i}").into_bytes()
}

fn value(ks: u32, i: u32) -> Vec<u8> {
    format!("value of {ks}/{i}, padded to look like a record: ....................").into_bytes()
}

#[test]
fn every_keyspace_shares_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("ks{i}")).collect();
    let trees: Vec<_> = names.iter().map(|n| db.tree(n).unwrap()).collect();
    // Each keyspace alone writes about twice the budget: eight private pools would hold
    // eight budgets' worth of mini-pages.
    let per_keyspace = 3_000;
    for (ks, tree) in trees.iter().enumerate() {
        for i in 0..per_keyspace {
            tree.insert_with(
                &key(ks as u32, i),
                &value(ks as u32, i),
                Durability::Unlogged,
            )
            .unwrap();
        }
        let stats = db.stats();
        assert_eq!(stats.memory_budget_bytes, BUDGET);
        assert!(
            stats.memory_in_use_bytes <= BUDGET,
            "{} bytes in use after keyspace {ks}, budget {BUDGET}",
            stats.memory_in_use_bytes
        );
    }
    // Every keyspace sees the one pool.
    let tails: Vec<u64> = trees.iter().map(|t| t.stats().pool.tail_bytes).collect();
    assert!(tails.windows(2).all(|w| w[0] == w[1]), "{tails:?}");
    for (ks, tree) in trees.iter().enumerate() {
        for i in (0..per_keyspace).step_by(7) {
            assert_eq!(
                tree.get(&key(ks as u32, i)).unwrap(),
                Some(value(ks as u32, i)),
                "keyspace {ks} key {i}"
            );
        }
        assert_eq!(tree.range::<&[u8], _>(..).count(), per_keyspace as usize);
    }
}

#[test]
fn writing_one_keyspace_evicts_the_cold_mini_pages_of_another() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let (cold, hot) = (db.tree("cold").unwrap(), db.tree("hot").unwrap());
    for i in 0..500 {
        cold.insert_with(&key(0, i), &value(0, i), Durability::Unlogged)
            .unwrap();
    }
    let before = cold.stats().evictions;
    // Only `hot` is written now; `cold`'s mini-pages must leave the pool for it.
    for i in 0..20_000 {
        hot.insert_with(&key(1, i), &value(1, i), Durability::Unlogged)
            .unwrap();
    }
    assert!(
        cold.stats().evictions > before,
        "the idle keyspace kept its mini-pages while the other wrote {}x the budget",
        20_000 * 80 / BUDGET
    );
    for i in 0..500 {
        assert_eq!(cold.get(&key(0, i)).unwrap(), Some(value(0, i)));
    }
}

#[test]
fn a_dropped_keyspace_gives_its_memory_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let keep = db.tree("keep").unwrap();
    keep.insert(b"k", b"v").unwrap();
    let baseline = db.stats().memory_in_use_bytes;
    // Far more keyspaces over time than one pool has member slots for at once is not
    // needed to show reuse: each round's memory must come back.
    for round in 0..40 {
        let name = format!("scratch{round}");
        let tree = db.tree(&name).unwrap();
        for i in 0..200 {
            tree.insert_with(&key(round, i), &value(round, i), Durability::Unlogged)
                .unwrap();
        }
        assert!(db.stats().memory_in_use_bytes > baseline);
        db.drop_tree(&name).unwrap();
        drop(tree);
        assert_eq!(
            db.stats().memory_in_use_bytes,
            baseline,
            "round {round}: the dropped keyspace's mini-pages stayed in the pool"
        );
    }
    assert_eq!(keep.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_poisoned_keyspace_does_not_stall_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (log, pages) = (Arc::new(SimLog::new(7)), Arc::new(SimPages::new(7)));
    let db = Db::open_simulated(dir.path(), options(), log.clone(), pages.clone()).unwrap();
    let (bad, good) = (db.tree("bad").unwrap(), db.tree("good").unwrap());
    // The other keyspace holds many budgets' worth, most of it on its leaf pages.
    for i in 0..20_000 {
        good.insert_with(&key(1, i), &value(1, i), Durability::Logged)
            .unwrap();
    }
    // The first keyspace's page file fails every write from now on.
    let names = pages.names();
    assert_eq!(names.len(), 2, "{names:?}");
    pages.store(&names[0]).fail_writes_after(0);
    let mut acked = Vec::new();
    for i in 0..5_000 {
        match bad.insert_with(&key(0, i), &value(0, i), Durability::Logged) {
            Ok(()) => acked.push(i),
            Err(_) => break,
        }
    }
    assert!(
        !acked.is_empty() && acked.len() < 5_000,
        "{} acknowledged",
        acked.len()
    );
    // The database can no longer make writes durable: every keyspace refuses them.
    assert!(matches!(
        good.insert_with(b"k", b"v", Durability::Unlogged),
        Err(Error::Poisoned { .. })
    ));
    // Reads of the other keyspace go on, caching records in the pool as they go: the
    // poisoned keyspace's dirty mini-pages, which can never be merged, must not hold
    // the pool's head.
    for round in 0..4 {
        for i in (round..20_000).step_by(3) {
            assert_eq!(good.get(&key(1, i)).unwrap(), Some(value(1, i)));
        }
    }
    let stats = bad.stats();
    assert!(
        stats.kept_after_failure + stats.dropped_after_failure > 0,
        "the poisoned keyspace's mini-pages never reached the head: read more"
    );
    // The poisoned keyspace answers what it acknowledged, or refuses; never a wrong
    // answer from a leaf page that lacks a dropped record.
    for &i in &acked {
        match bad.get(&key(0, i)) {
            Ok(found) => assert_eq!(found, Some(value(0, i)), "key {i}"),
            Err(e) => assert!(matches!(e, Error::Poisoned { .. }), "{e}"),
        }
    }
    // Reopened by a new process (the disk healthy again), it has every acknowledged
    // write back.
    db.persist().unwrap();
    drop((bad, good, db));
    let (log, pages) = (Arc::new(log.crash()), Arc::new(pages.crash()));
    let db = Db::open_simulated(dir.path(), options(), log, pages).unwrap();
    let (bad, good) = (db.tree("bad").unwrap(), db.tree("good").unwrap());
    for &i in &acked {
        assert_eq!(bad.get(&key(0, i)).unwrap(), Some(value(0, i)), "key {i}");
    }
    for i in (0..20_000).step_by(7) {
        assert_eq!(good.get(&key(1, i)).unwrap(), Some(value(1, i)));
    }
}

/// A keyspace whose leaf pages cannot be read holds dirty mini-pages that no eviction
/// can merge. The writers of another keyspace, whose allocations evict them from the
/// shared pool's head, must hear why there is no room (their own keyspace's evictions
/// never fail), not retry forever; once the disk reads again, every write goes through.
#[test]
fn a_keyspace_that_cannot_read_its_leaf_pages_fails_the_others_writes_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let (log, pages) = (Arc::new(SimLog::new(11)), Arc::new(SimPages::new(11)));
    let options = options().config(Config {
        memory_budget_bytes: BUDGET,
        huge_pages: false,
        background_eviction: false,
        ..Config::default()
    });
    let db = Db::open_simulated(dir.path(), options, log, pages.clone()).unwrap();
    let (unreadable, other) = (db.tree("unreadable").unwrap(), db.tree("other").unwrap());
    // Leaf pages on disk for the first keyspace, then dirty records over them that fill
    // the pool: merging any of them reads a leaf page.
    for i in 0..6_000 {
        unreadable
            .insert_with(&key(0, i), &value(0, i), Durability::Unlogged)
            .unwrap();
    }
    db.checkpoint().unwrap();
    for i in 0..3_000 {
        unreadable
            .insert_with(&key(0, i), &value(1, i), Durability::Unlogged)
            .unwrap();
    }
    let names = pages.names();
    assert_eq!(names.len(), 2, "{names:?}");
    pages.store(&names[0]).fail_reads_after(0);
    let (done, finished) = std::sync::mpsc::channel();
    let writer = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut outcome = (Vec::new(), 0);
            for i in 0..3_000 {
                match other.insert_with(&key(2, i), &value(2, i), Durability::Unlogged) {
                    Ok(()) => outcome.0.push(i),
                    Err(e) => {
                        assert!(
                            matches!(e, Error::Io(_)) && e.to_string().contains("EIO"),
                            "write {i}: {e}"
                        );
                        outcome.1 += 1;
                    }
                }
            }
            done.send(()).unwrap();
            outcome
        });
        // A hang is the failure this test is for: report it rather than wait forever.
        if finished
            .recv_timeout(std::time::Duration::from_secs(300))
            .is_err()
        {
            eprintln!("the other keyspace's writes hung behind unmergeable mini-pages");
            std::process::abort();
        }
        writer.join().unwrap()
    });
    let (acked, refused) = writer;
    assert!(
        refused > 0,
        "no write needed the unreadable keyspace's room"
    );
    pages.store(&names[0]).clear_faults();
    for i in 0..3_000 {
        other
            .insert_with(&key(3, i), &value(3, i), Durability::Unlogged)
            .unwrap();
    }
    for &i in &acked {
        assert_eq!(other.get(&key(2, i)).unwrap(), Some(value(2, i)), "key {i}");
    }
    for i in 0..6_000 {
        let want = if i < 3_000 { value(1, i) } else { value(0, i) };
        assert_eq!(unreadable.get(&key(0, i)).unwrap(), Some(want), "key {i}");
    }
}

#[test]
fn keyspaces_written_dropped_and_created_concurrently_keep_their_records() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let per_thread = 6_000;
    std::thread::scope(|s| {
        for ks in 0..3u32 {
            let db = &db;
            s.spawn(move || {
                let tree = db.tree(&format!("writer{ks}")).unwrap();
                for i in 0..per_thread {
                    tree.insert_with(&key(ks, i), &value(ks, i), Durability::Unlogged)
                        .unwrap();
                    if i % 500 == 0 {
                        // Reads of older records, which may have left the pool.
                        let j = i / 2;
                        assert_eq!(tree.get(&key(ks, j)).unwrap(), Some(value(ks, j)));
                    }
                }
            });
        }
        let db = &db;
        s.spawn(move || {
            // Keyspaces come and go while the writers evict each other's mini-pages:
            // member slots are freed and reused under running evictions.
            for round in 0..30u32 {
                let name = format!("scratch{}", round % 3);
                let tree = db.tree(&name).unwrap();
                for i in 0..300 {
                    tree.insert_with(&key(10 + round, i), &value(round, i), Durability::Unlogged)
                        .unwrap();
                }
                db.drop_tree(&name).unwrap();
            }
        });
    });
    for ks in 0..3u32 {
        let tree = db.tree(&format!("writer{ks}")).unwrap();
        assert_eq!(tree.range::<&[u8], _>(..).count(), per_thread as usize);
        for i in (0..per_thread).step_by(11) {
            assert_eq!(tree.get(&key(ks, i)).unwrap(), Some(value(ks, i)));
        }
    }
    assert!(db.stats().memory_in_use_bytes <= BUDGET);
}

/// Options of a database with a budget of `mib` MiB.
fn with_budget(mib: u64) -> DbOptions {
    DbOptions::default()
        .checkpoint_on_close(false)
        .config(Config {
            memory_budget_bytes: mib << 20,
            huge_pages: false,
            ..Config::default()
        })
}

fn hash_options(memory: u64) -> HashStoreOptions {
    HashStoreOptions::default()
        .memory_bytes(memory)
        .expected_keys(20_000)
}

#[test]
fn hash_stores_take_their_memory_out_of_the_budget_and_the_trees_keep_the_rest() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), with_budget(16)).unwrap();
    let stats = db.stats();
    assert_eq!(
        (
            stats.memory_budget_bytes,
            stats.tree_memory_bytes,
            stats.hash_memory_bytes
        ),
        (16 * MIB, 16 * MIB, 0)
    );
    let h1 = db.hash_store_with("h1", hash_options(6 * MIB)).unwrap();
    assert_eq!(h1.stats().memory_budget_bytes, 6 * MIB);
    let stats = db.stats();
    assert_eq!(
        (stats.tree_memory_bytes, stats.hash_memory_bytes),
        (10 * MIB, 6 * MIB)
    );
    // A store that does not say takes half of what is left; the trees keep at least
    // the smallest budget.
    let least = bfdb::config::MIN_MEMORY_BUDGET_BYTES;
    let h2 = db
        .hash_store_with("h2", HashStoreOptions::default().expected_keys(20_000))
        .unwrap();
    let half = (10 * MIB - least) / 2;
    assert_eq!(h2.stats().memory_budget_bytes, half);
    assert_eq!(db.stats().tree_memory_bytes, 10 * MIB - half);
    // One that does not fit is refused, and takes nothing.
    match db.hash_store_with("h3", hash_options(6 * MIB)) {
        Err(Error::InvalidConfig(why)) => {
            assert!(why.contains("memory_budget_bytes"), "{why}")
        }
        other => panic!("a store past the budget: {other:?}"),
    }
    assert_eq!(db.stats().hash_memory_bytes, 6 * MIB + half);
    assert!(!db.keyspaces().contains(&"h3".to_string()));
    // The trees write far more than their share: their pool stays within it, and
    // gives back the memory it no longer spans as it turns over.
    let tree = db.tree("t").unwrap();
    let tree_memory = db.stats().tree_memory_bytes;
    let mut written = 0;
    while written < 1_000_000 && db.stats().tree_memory_released_bytes < 4 * MIB {
        for i in written..written + 10_000 {
            tree.insert_with(&key(0, i), &value(0, i), Durability::Unlogged)
                .unwrap();
        }
        written += 10_000;
        let in_use = db.stats().memory_in_use_bytes;
        assert!(
            in_use <= tree_memory,
            "{in_use} bytes in use, share {tree_memory}"
        );
    }
    assert!(
        db.stats().tree_memory_released_bytes >= 4 * MIB,
        "{:?} after {written} records",
        db.stats()
    );
    for i in (0..written).step_by(997) {
        assert_eq!(tree.get(&key(0, i)).unwrap(), Some(value(0, i)), "key {i}");
    }
    // A dropped store's memory goes back to the trees.
    assert!(db.drop_hash_store("h1").unwrap());
    assert_eq!(db.stats().tree_memory_bytes, 16 * MIB - half);
    h2.insert(b"k", b"v").unwrap();
    db.checkpoint().unwrap();
}

#[test]
fn a_smaller_budget_on_reopen_shrinks_the_hash_stores_in_proportion_or_is_refused() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), with_budget(32)).unwrap();
        let a = db.hash_store_with("a", hash_options(12 * MIB)).unwrap();
        let b = db.hash_store_with("b", hash_options(4 * MIB)).unwrap();
        for i in 0..5_000u32 {
            a.insert(&key(1, i), &value(1, i)).unwrap();
            b.insert(&key(2, i), &value(2, i)).unwrap();
        }
        db.checkpoint().unwrap();
    }
    // 8 MiB: the stores asked for 16 and get 8 MiB less what the trees keep, 3 to 1.
    {
        let db = Db::open(dir.path(), with_budget(8)).unwrap();
        let least = bfdb::config::MIN_MEMORY_BUDGET_BYTES;
        let (a, b) = (db.hash_store("a").unwrap(), db.hash_store("b").unwrap());
        let room = 8 * MIB - least;
        assert_eq!(a.stats().memory_budget_bytes, room * 3 / 4);
        assert_eq!(b.stats().memory_budget_bytes, room / 4);
        assert_eq!(
            db.stats().tree_memory_bytes,
            8 * MIB - room * 3 / 4 - room / 4
        );
        for i in (0..5_000u32).step_by(7) {
            assert_eq!(a.get(&key(1, i)).unwrap(), Some(value(1, i)), "a {i}");
            assert_eq!(b.get(&key(2, i)).unwrap(), Some(value(2, i)), "b {i}");
        }
        assert!(a.stats().memory_bytes <= room * 3 / 4, "{:?}", a.stats());
    }
    // 1 MiB is too little for their pages: a clear error that names a store, and
    // nothing is changed (the next open with room finds every record).
    let manifest = std::fs::read(dir.path().join("MANIFEST")).unwrap();
    match Db::open(dir.path(), with_budget(1)) {
        Err(Error::InvalidConfig(why)) => {
            assert!(
                why.contains("hash store") && why.contains("memory budget"),
                "{why}"
            )
        }
        other => panic!("opening with too little memory: {other:?}"),
    }
    assert_eq!(
        std::fs::read(dir.path().join("MANIFEST")).unwrap(),
        manifest
    );
    let db = Db::open(dir.path(), with_budget(32)).unwrap();
    let a = db.hash_store("a").unwrap();
    assert_eq!(a.stats().memory_budget_bytes, 12 * MIB);
    for i in (0..5_000u32).step_by(7) {
        assert_eq!(a.get(&key(1, i)).unwrap(), Some(value(1, i)), "a {i}");
    }
}
