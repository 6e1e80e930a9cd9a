//! The hash keyspace's integrity rules: empty keys refused as the Tree refuses them,
//! a write's `Err` meaning it did not apply, and damage to its log files on disk
//! reported as an error naming the file, never served as data.

use bfdb::{ColdLayout, Config, Db, DbOptions, Durability, Error, HashStoreOptions, WriteBatch};

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
        empty(
            "rmw_with",
            store.rmw_with(b"", |_| b"v".to_vec(), level).map(drop),
        );
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

/// The value of key `i` in the damage tests: it names its key, so a value read for
/// another key, or damaged, is told from the right one.
fn value_of(i: u64) -> Vec<u8> {
    format!("value of key {i:05} ").repeat(4).into_bytes()
}

/// Whether `e` is damage reported as the issue asks: a `CorruptFile` naming a file of
/// log `log` of the store, and in its reason the keyspace and the log address.
fn names_the_damage(e: &Error, log: &str) -> bool {
    match e {
        Error::CorruptFile { path, reason } => {
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
            file.is_some_and(|f| f.starts_with("hs-") && f.contains(&format!("-{log}-")))
                && reason.contains("hash keyspace \"h\"")
                && reason.contains("address")
        }
        _ => false,
    }
}

#[test]
fn flipped_bytes_in_hash_log_files_are_errors_naming_the_file_never_data() {
    flipped_bytes_are_errors_naming_the_file(ColdLayout::Log);
}

#[test]
fn flipped_bytes_in_cold_runs_are_errors_naming_the_file_never_data() {
    flipped_bytes_are_errors_naming_the_file(ColdLayout::Runs);
}

/// Flips a byte of a file of each of the store's logs (in `layout`, whose runs live in
/// the cold log's files) and opens and reads a copy of the database.
fn flipped_bytes_are_errors_naming_the_file(layout: ColdLayout) {
    let seed = seed("flipped_bytes_in_hash_log_files");
    let tiny = || tiny().cold_layout(layout);
    let mut rng = Rng(seed);
    let keys = 3_000;
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let store = db.hash_store_with("h", tiny()).unwrap();
        for i in 0..keys {
            store.insert(&key(i), &value_of(i)).unwrap();
        }
        let stats = store.stats();
        assert!(stats.hot_cold_compactions > 0, "{stats:?}");
        db.checkpoint().unwrap();
    }
    let logs: &[&str] = match layout {
        ColdLayout::Log => &["hot", "cold", "chunks"],
        _ => &["hot", "cold"],
    };
    let mut reads_refused = [0u64; 3];
    let mut opens_refused = [0u64; 3];
    for (l, log) in logs.iter().enumerate() {
        let files: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(&format!("-{log}-")))
            .collect();
        assert!(!files.is_empty(), "no {log} log file");
        for trial in 0..8 {
            // A copy of the database with one byte of a record of this log flipped.
            let copy = tempfile::tempdir().unwrap();
            for e in std::fs::read_dir(dir.path()).unwrap() {
                let p = e.unwrap().path();
                std::fs::copy(&p, copy.path().join(p.file_name().unwrap())).unwrap();
            }
            let file = &files[rng.below(files.len() as u64) as usize];
            let target = copy.path().join(file.file_name().unwrap());
            let mut bytes = std::fs::read(&target).unwrap();
            let nonzero: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] != 0).collect();
            let at = nonzero[rng.below(nonzero.len() as u64) as usize];
            bytes[at] ^= 1 << rng.below(8);
            std::fs::write(&target, &bytes).unwrap();
            let what = format!(
                "{log} log, trial {trial}, byte {at} of {}",
                target.display()
            );
            let db = match Db::open(copy.path(), options()) {
                Ok(db) => db,
                Err(e) => {
                    assert!(names_the_damage(&e, log), "{what}: open failed with {e:?}");
                    opens_refused[l] += 1;
                    continue;
                }
            };
            let store = db.hash_store_with("h", tiny()).unwrap();
            for i in 0..keys {
                match store.get(&key(i)) {
                    Ok(got) => assert_eq!(got, Some(value_of(i)), "{what}: key {i}"),
                    Err(e) => {
                        assert!(names_the_damage(&e, log), "{what}: key {i}: {e:?}");
                        reads_refused[l] += 1;
                    }
                }
            }
            // Batched reads decode the same bytes through their own path.
            let all: Vec<Vec<u8>> = (0..keys).map(key).collect();
            for chunk in all.chunks(64) {
                match store.get_many(chunk) {
                    Ok(got) => {
                        for (k, v) in chunk.iter().zip(got) {
                            let i: u64 = std::str::from_utf8(&k[3..]).unwrap().parse().unwrap();
                            assert_eq!(v, Some(value_of(i)), "{what}: get_many of key {i}");
                        }
                    }
                    Err(e) => assert!(names_the_damage(&e, log), "{what}: get_many: {e:?}"),
                }
            }
        }
    }
    println!("{layout:?}: opens refused {opens_refused:?}, reads refused {reads_refused:?}");
    // The cold log (the runs' data pages) is not read at open: its damage is met by
    // reads.
    assert!(reads_refused[1] > 0, "no read met a damaged cold record");
}

/// Every file of `dir` with its bytes.
fn snapshot(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

#[test]
fn a_hash_store_of_the_format_before_checksums_is_refused_by_name_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), options()).unwrap();
        // Builds before checksums had the cold log layout only.
        let store = db
            .hash_store_with("h", tiny().cold_layout(ColdLayout::Log))
            .unwrap();
        for i in 0..1_000 {
            store.insert(&key(i), &value_of(i)).unwrap();
        }
        db.checkpoint().unwrap();
        // Written after the checkpoint: the log replays them into the store at open.
        for i in 1_000..1_100 {
            store.insert(&key(i), &value_of(i)).unwrap();
        }
    }
    // Make the manifest say what an earlier build wrote: kind 3, log records without
    // checksums (the header is 20 bytes; the body's four counters precede the
    // keyspace's id and kind).
    let manifest = dir.path().join("MANIFEST");
    let mut bytes = std::fs::read(&manifest).unwrap();
    let kind_at = 20 + 16 + 4;
    assert_eq!(bytes[kind_at], 4, "a hash store of this build is kind 4");
    bytes[kind_at] = 3;
    let crc = crc32c::crc32c(&bytes[20..]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&manifest, &bytes).unwrap();
    let before = snapshot(dir.path());
    for _ in 0..2 {
        match Db::open(dir.path(), options()) {
            Err(Error::Incompatible { reason }) => {
                assert!(
                    reason.contains("hs-00000001-*") && reason.contains("\"h\""),
                    "{reason}"
                );
            }
            other => panic!("expected Incompatible, got {other:?}"),
        }
        assert_eq!(
            snapshot(dir.path()),
            before,
            "a refused open changed the files"
        );
    }
}

#[test]
fn an_unlogged_read_modify_write_refused_for_its_size_writes_nothing() {
    // A result over the value limit is refused: the key keeps its value or its
    // absence, and no record of any value (not even for a moment) reaches the store.
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let store = db.hash_store_with("h", tiny()).unwrap();
    store.insert(b"present", b"old").unwrap();
    let max = Config::default().max_value_bytes;
    let before = store.stats();
    for k in [&b"present"[..], b"absent"] {
        let got = store.rmw_with(k, |_| vec![1u8; max + 1], Durability::Unlogged);
        assert!(
            matches!(got, Err(Error::ValueTooLarge { len, .. }) if len == max + 1),
            "{got:?}"
        );
    }
    let after = store.stats();
    assert_eq!(
        (after.appended_records, after.in_place_updates),
        (before.appended_records, before.in_place_updates),
        "a refused read-modify-write wrote"
    );
    assert_eq!(store.get(b"present").unwrap(), Some(b"old".to_vec()));
    assert_eq!(store.get(b"absent").unwrap(), None);
}
