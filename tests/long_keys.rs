//! Keys up to 4 KiB (issue #34): trees with leaf pages of several 4 KiB pages, checked
//! against a `BTreeMap`, on their own and as keyspaces of a `Db` across checkpoints and
//! reopens; hash stores with keys of the same lengths.
//!
//! Keys come from families sharing prefixes of 0, 1000, 2500 and 3900 bytes, so that
//! fences and separators are as long as keys get, and inner nodes hold only a few.

use std::collections::BTreeMap;
use std::ops::Bound;

use bfdb::{Config, Db, DbOptions, Tree};

mod common;
use common::{Rng, in_bounds, mix, seed};

/// The longest key, and the leaf page size that holds three of them and a 2 KiB value.
const MAX_KEY: usize = 4096;
const LEAF_PAGE: usize = 16384;

/// Key `i` of the test's key space: a family's shared prefix, then bytes of `i` up to a
/// length of its own (1 to `MAX_KEY`).
fn key(i: u64) -> Vec<u8> {
    let h = mix(i);
    let prefix = [0usize, 1000, 2500, 3900][(h % 4) as usize];
    let len = (prefix + 1 + (h >> 8) as usize % (MAX_KEY - prefix)).min(MAX_KEY);
    let mut k: Vec<u8> = (0..prefix).map(|j| b'a' + (j % 23) as u8).collect();
    let mut word = mix(i ^ 0xabcd).to_be_bytes().into_iter().cycle();
    k.extend((prefix..len).map(|_| word.next().unwrap()));
    k
}

fn value(i: u64, version: u64, len: usize) -> Vec<u8> {
    let stamp = mix(i).wrapping_add(version);
    (0..len)
        .map(|j| (stamp >> (j % 8 * 8)) as u8 ^ j as u8)
        .collect()
}

fn long_key_config() -> Config {
    Config {
        max_key_bytes: MAX_KEY,
        leaf_page_size_bytes: LEAF_PAGE,
        memory_budget_bytes: 2 << 20,
        ..Config::default()
    }
}

/// Checks every key of `model` through `get`, a forward and a backward full scan, and a
/// range between two random keys.
fn check(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>, rng: &mut Rng) {
    for (k, v) in model {
        assert_eq!(
            tree.get(k).unwrap().as_ref(),
            Some(v),
            "get of a {}-byte key",
            k.len()
        );
    }
    let forward: Vec<(Vec<u8>, Vec<u8>)> = tree.range::<&[u8], _>(..).map(|r| r.unwrap()).collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(forward.len(), want.len());
    assert!(forward == want, "a forward scan differs from the model");
    let backward: Vec<(Vec<u8>, Vec<u8>)> = tree
        .range::<&[u8], _>(..)
        .rev()
        .map(|r| r.unwrap())
        .collect();
    assert!(
        backward.iter().eq(want.iter().rev()),
        "a backward scan differs"
    );
    let (a, b) = (key(rng.below(4000)), key(rng.below(4000)));
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let bounds = (Bound::Included(lo.clone()), Bound::Excluded(hi.clone()));
    let got: Vec<Vec<u8>> = tree
        .range::<Vec<u8>, _>(bounds.clone())
        .map(|r| r.unwrap().0)
        .collect();
    let expected: Vec<Vec<u8>> = model
        .keys()
        .filter(|k| in_bounds(k, &bounds.0, &bounds.1))
        .cloned()
        .collect();
    assert!(got == expected, "a range scan differs from the model");
}

/// Random inserts, overwrites and deletes of keys up to 4 KiB with values up to
/// `max_value`, checked against the model every `every` operations.
fn run(
    tree: &Tree,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    rng: &mut Rng,
    ops: u64,
    max_value: u64,
) {
    for op in 0..ops {
        let i = rng.below(4000);
        let k = key(i);
        match rng.percent() {
            0..70 => {
                let v = value(i, op, rng.below(max_value + 1) as usize);
                tree.insert(&k, &v).unwrap();
                model.insert(k, v);
            }
            70..85 => {
                tree.delete(&k).unwrap();
                model.remove(&k);
            }
            _ => assert_eq!(tree.get(&k).unwrap().as_ref(), model.get(&k)),
        }
        if op % 3000 == 2999 {
            check(tree, model, rng);
        }
    }
    check(tree, model, rng);
}

#[test]
fn keys_up_to_4_kib_in_trees_of_16_kib_leaf_pages_match_a_btreemap() {
    let mut rng = Rng(seed(
        "keys_up_to_4_kib_in_trees_of_16_kib_leaf_pages_match_a_btreemap",
    ));
    let config = Config {
        max_value_bytes: 2048,
        ..long_key_config()
    };
    let tree = Tree::in_memory(config).unwrap();
    let mut model = BTreeMap::new();
    run(&tree, &mut model, &mut rng, 12_000, 2048);
    let stats = tree.stats();
    assert!(stats.leaf_writes > 100, "{stats:?}");
    assert!(stats.inner_splits > 0, "the inner levels split: {stats:?}");
}

#[test]
fn keys_up_to_4_kib_in_a_db_survive_checkpoints_and_reopens() {
    let mut rng = Rng(seed(
        "keys_up_to_4_kib_in_a_db_survive_checkpoints_and_reopens",
    ));
    let dir = tempfile::tempdir().unwrap();
    let options = DbOptions::default().config(long_key_config());
    let mut model = BTreeMap::new();
    for round in 0..3 {
        // Round 1 closes without a checkpoint: the next open replays the log over the
        // last one.
        let db = Db::open(dir.path(), options.clone().checkpoint_on_close(round != 1)).unwrap();
        let tree = db.tree("long").unwrap();
        check(&tree, &model, &mut rng);
        run(&tree, &mut model, &mut rng, 4000, 6000);
        db.checkpoint().unwrap();
        run(&tree, &mut model, &mut rng, 1000, 6000);
        drop(tree);
        db.close().unwrap();
    }
    let db = Db::open(dir.path(), options).unwrap();
    check(&db.tree("long").unwrap(), &model, &mut rng);
}

#[test]
fn a_db_keeps_its_leaf_page_size_and_refuses_another() {
    let dir = tempfile::tempdir().unwrap();
    let options = DbOptions::default().config(long_key_config());
    let db = Db::open(dir.path(), options.clone()).unwrap();
    db.tree("t").unwrap().insert(&key(1), b"v").unwrap();
    db.close().unwrap();
    let other = DbOptions::default().config(Config {
        leaf_page_size_bytes: 32768,
        ..long_key_config()
    });
    let err = Db::open(dir.path(), other).unwrap_err();
    assert!(
        matches!(err, bfdb::Error::Incompatible { .. }),
        "reopened with another leaf page size: {err:?}"
    );
    let db = Db::open(dir.path(), options).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(&key(1)).unwrap().as_deref(),
        Some(&b"v"[..])
    );
}

#[test]
fn hash_stores_take_keys_up_to_4_kib() {
    let dir = tempfile::tempdir().unwrap();
    let options = DbOptions::default().config(long_key_config());
    let mut model = BTreeMap::new();
    {
        let db = Db::open(dir.path(), options.clone()).unwrap();
        let store = db.hash_store("h").unwrap();
        for i in 0..3000u64 {
            let (k, v) = (key(i), value(i, 0, (mix(i) % 6000) as usize));
            store.insert(&k, &v).unwrap();
            model.insert(k, v);
        }
        db.checkpoint().unwrap();
        for i in (0..3000u64).step_by(3) {
            let k = key(i);
            store.delete(&k).unwrap();
            model.remove(&k);
        }
        for (k, v) in &model {
            assert_eq!(store.get(k).unwrap().as_ref(), Some(v));
        }
        let too_long = vec![7u8; MAX_KEY + 1];
        assert!(matches!(
            store.insert(&too_long, b"v"),
            Err(bfdb::Error::KeyTooLarge { .. })
        ));
        drop(store);
        db.close().unwrap();
    }
    let db = Db::open(dir.path(), options).unwrap();
    let store = db.hash_store("h").unwrap();
    for i in 0..3000u64 {
        let k = key(i);
        assert_eq!(store.get(&k).unwrap(), model.get(&k).cloned(), "key {i}");
    }
}
