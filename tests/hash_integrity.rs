//! The hash keyspace's integrity rules: empty keys refused as the Tree refuses them,
//! a write's `Err` meaning it did not apply, and damage to its log files on disk
//! reported as an error naming the file, never served as data.

use std::collections::HashMap;

use bfdb::{Config, Db, DbOptions, Durability, Error, HashStoreOptions, WriteBatch};

mod common;
use common::{Rng, seed};

/// A store of a few pages: its logs flush, compact and reach disk all the time.
fn tiny() -> HashStoreOptions {
    HashStoreOptions::default()
        .memory_bytes(64 << 10)
        .expected_keys(4096)
        .hot_log_disk_bytes(128 << 10)
        .cold_log_disk_bytes(512 << 10)
}

fn options() -> DbOptions {
    DbOptions::default().config(Config {
        memory_budget_bytes: 1 << 20,
        huge_pages: false,
        ..Config::default()
    })
}

fn key(i: u64) -> Vec<u8> {
    format!("key{i:05}").into_bytes()
}

#[test]
fn empty_keys_are_refused_by_every_entry_point_as_the_tree_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let store = db.hash_store_with("h", tiny()).unwrap();
    let tree = db.tree("t").unwrap();
    assert!(matches!(tree.insert(b"", b"v"), Err(Error::EmptyKey)));
    let empty = |what: &str, r: Result<(), Error>| {
        assert!(matches!(r, Err(Error::EmptyKey)), "{what}: {r:?}");
    };
    empty("insert", store.insert(b"", b"v"));
    for level in [Durability::Unlogged, Durability::Logged, Durability::Synced] {
        empty("insert_with", store.insert_with(b"", b"v", level));
        empty("delete_with", store.delete_with(b"", level));
        empty("rmw_with", store.rmw_with(b"", |_| b"v".to_vec(), level).map(drop));
    }
    empty("delete", store.delete(b""));
    empty("rmw", store.rmw(b"", |_| b"v".to_vec()).map(drop));
    empty("get", store.get(b"").map(drop));
    empty("get_many", store.get_many(&[&b"a"[..], b""]).map(drop));
    let mut batch = WriteBatch::new();
    batch.insert_hash(&store, b"", b"v");
    empty("a batch's insert", db.write(batch));
    let mut batch = WriteBatch::new();
    batch.delete_hash(&store, b"");
    empty("a batch's delete", db.write(batch));
    // Nothing was stored under the empty key, and the store still works.
    store.insert(b"a", b"1").unwrap();
    assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
    drop(store);
    drop(tree);
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    let store = db.hash_store_with("h", tiny()).unwrap();
    assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
}
