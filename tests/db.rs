//! The database directory: reopening, keyspaces, the lock, durability levels, batches,
//! and bad input (directories that are not databases, damaged or foreign files).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bfdb::{Config, Db, DbOptions, Durability, Error, Tree, WriteBatch};

fn small() -> DbOptions {
    DbOptions::default().config(Config {
        memory_budget_bytes: 256 << 10,
        huge_pages: false,
        ..Config::default()
    })
}

/// Every file of `dir` with its bytes, to show that a failed open changed nothing.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:08}").into_bytes()
}

#[test]
fn logged_and_synced_writes_survive_a_reopen_and_unlogged_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    // No checkpoint: what comes back comes from the log alone.
    let small = || small().checkpoint_on_close(false);
    {
        let db = Db::open(dir.path(), small()).unwrap();
        let t = db.tree("t").unwrap();
        for i in 0..3000 {
            let level = [Durability::Logged, Durability::Synced][i as usize % 2];
            t.insert_with(&key(i), format!("v{i}").as_bytes(), level)
                .unwrap();
        }
        for i in (0..3000).step_by(3) {
            t.delete(&key(i)).unwrap();
        }
        t.insert_with(b"unlogged", b"x", Durability::Unlogged)
            .unwrap();
        assert_eq!(t.get(b"unlogged").unwrap().as_deref(), Some(&b"x"[..]));
    }
    let db = Db::open(dir.path(), small()).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..3000 {
        let want = (i % 3 != 0).then(|| format!("v{i}").into_bytes());
        assert_eq!(t.get(&key(i)).unwrap(), want, "key {i}");
    }
    assert_eq!(t.get(b"unlogged").unwrap(), None);
    let r = db.recovery();
    assert_eq!(r.writes_replayed, 4000);
    assert_eq!(r.discarded_bytes, 0);
    // A full scan agrees with the point reads.
    let scanned = t.range::<&[u8], _>(..).count();
    assert_eq!(scanned, 2000);
}

#[test]
fn keyspaces_are_listed_dropped_and_recreated_empty() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), small()).unwrap();
        let a = db.tree("alpha").unwrap();
        let b = db.tree("beta").unwrap();
        a.insert(b"k", b"in alpha").unwrap();
        b.insert(b"k", b"in beta").unwrap();
        assert!(Arc::ptr_eq(&a, &db.tree("alpha").unwrap()));
        assert_eq!(db.keyspaces(), ["alpha", "beta"]);
        assert!(db.drop_tree("beta").unwrap());
        assert!(!db.drop_tree("beta").unwrap());
        assert!(
            matches!(b.insert(b"k2", b"v"), Err(Error::KeyspaceDropped { name }) if name == "beta")
        );
        let b2 = db.tree("beta").unwrap();
        assert_eq!(
            b2.get(b"k").unwrap(),
            None,
            "a recreated keyspace starts empty"
        );
        b2.insert(b"new", b"1").unwrap();
        assert!(db.tree("").is_err());
        assert!(db.tree(&"n".repeat(256)).is_err());
    }
    let db = Db::open(dir.path(), small()).unwrap();
    assert_eq!(db.keyspaces(), ["alpha", "beta"]);
    assert_eq!(
        db.tree("alpha").unwrap().get(b"k").unwrap().as_deref(),
        Some(&b"in alpha"[..])
    );
    let b = db.tree("beta").unwrap();
    assert_eq!(
        b.get(b"k").unwrap(),
        None,
        "the dropped keyspace's writes are not replayed"
    );
    assert_eq!(b.get(b"new").unwrap().as_deref(), Some(&b"1"[..]));
}

#[test]
fn a_second_open_of_one_directory_is_refused_until_the_first_closes() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), small()).unwrap();
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(
        matches!(&err, Error::Locked { path } if path.ends_with("LOCK")),
        "{err:?}"
    );
    assert!(err.to_string().contains("LOCK"), "{err}");
    drop(db);
    Db::open(dir.path(), small()).unwrap();
}

#[test]
fn a_directory_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"my notes").unwrap();
    let before = snapshot(dir.path());
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(
        matches!(&err, Error::Incompatible { reason } if reason.contains("not a bfdb database") && reason.contains("notes.txt")),
        "{err:?}"
    );
    let mut after = snapshot(dir.path());
    // The lock file is the one thing an open may leave.
    after.retain(|(name, _)| name != "LOCK");
    assert_eq!(before, after);

    // Without `create`, an empty directory is not a database either.
    let empty = tempfile::tempdir().unwrap();
    let err = Db::open(empty.path(), small().create(false)).unwrap_err();
    assert!(
        matches!(&err, Error::Io(e) if e.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    let missing = empty.path().join("nope");
    assert!(Db::open(&missing, small().create(false)).is_err());
    assert!(!missing.exists());
}

/// A database directory with one keyspace and some writes.
fn populated() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), small()).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..100 {
        t.insert_with(&key(i), b"value", Durability::Synced)
            .unwrap();
    }
    dir
}

#[test]
fn a_damaged_manifest_is_reported_by_name_and_not_overwritten() {
    let dir = populated();
    let path = dir.path().join("MANIFEST");
    let good = std::fs::read(&path).unwrap();
    for (what, bytes) in [
        ("flipped", {
            let mut b = good.clone();
            let last = b.len() - 1;
            b[last] ^= 0x20;
            b
        }),
        ("truncated", good[..good.len() - 3].to_vec()),
        ("empty", Vec::new()),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        let before = snapshot(dir.path());
        let err = Db::open(dir.path(), small()).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptFile { path: p, .. } if p == &path),
            "{what}: {err:?}"
        );
        assert!(err.to_string().contains("MANIFEST"), "{err}");
        let mut after = snapshot(dir.path());
        after.retain(|(n, _)| n != "LOCK");
        let mut before = before;
        before.retain(|(n, _)| n != "LOCK");
        assert_eq!(before, after, "{what}: the failed open changed a file");
    }
    // Another format version is incompatible, not corrupt.
    let mut other = good.clone();
    other[8..12].copy_from_slice(&9u32.to_le_bytes());
    std::fs::write(&path, &other).unwrap();
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(
        matches!(&err, Error::Incompatible { reason } if reason.contains("version 9")),
        "{err:?}"
    );
    // Put right, it opens with everything.
    std::fs::write(&path, &good).unwrap();
    let db = Db::open(dir.path(), small()).unwrap();
    assert_eq!(db.tree("t").unwrap().range::<&[u8], _>(..).count(), 100);
}

#[test]
fn a_log_of_another_format_version_is_refused_and_kept() {
    let dir = populated();
    let segment = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a log segment");
    let mut bytes = std::fs::read(&segment).unwrap();
    // The segment header's version field follows its checksum and magic; the header
    // block is sealed again, as a build of version 99 would have written it.
    bytes[12..16].copy_from_slice(&99u32.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[4..4096]);
    bytes[..4].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&segment, &bytes).unwrap();
    let err = Db::open(dir.path(), small()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("99") || text.contains("version"), "{err:?}");
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        bytes,
        "the foreign segment was changed"
    );
}

#[test]
fn reopening_with_other_options_works_and_tighter_limits_are_refused() {
    let dir = populated();
    {
        let bigger = DbOptions::default().config(Config {
            memory_budget_bytes: 8 << 20,
            ..Config::default()
        });
        let db = Db::open(dir.path(), bigger).unwrap();
        let t = db.tree("t").unwrap();
        assert_eq!(t.range::<&[u8], _>(..).count(), 100);
        t.insert(&[b'x'; 300], b"long key").unwrap();
    }
    let tight = DbOptions::default().config(Config {
        max_key_bytes: 64,
        ..Config::default()
    });
    let err = Db::open(dir.path(), tight).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(why) if why.contains("512") && why.contains("64")),
        "{err:?}"
    );
    Db::open(dir.path(), small()).unwrap();
}

#[test]
fn a_tree_outside_a_database_refuses_durability_it_cannot_give() {
    let tree = Tree::in_memory(Config::default()).unwrap();
    tree.insert(b"k", b"v").unwrap();
    tree.insert_with(b"k", b"v", Durability::Unlogged).unwrap();
    for level in [Durability::Logged, Durability::Synced] {
        let err = tree.insert_with(b"k", b"v", level).unwrap_err();
        assert!(
            matches!(&err, Error::Unsupported(why) if why.contains("Db")),
            "{err:?}"
        );
        assert!(tree.delete_with(b"k", level).is_err());
    }
}

#[test]
fn a_batch_is_checked_whole_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let limited = || {
        small().config(Config {
            memory_budget_bytes: 256 << 10,
            huge_pages: false,
            max_value_bytes: 100_000,
            ..Config::default()
        })
    };
    let db = Db::open(dir.path(), limited()).unwrap();
    let t = db.tree("t").unwrap();
    let mut batch = WriteBatch::new();
    batch.insert(&t, b"a", b"1");
    batch.insert(&t, b"b", &vec![0; 100_001]);
    assert!(matches!(db.write(batch), Err(Error::ValueTooLarge { .. })));
    assert_eq!(t.get(b"a").unwrap(), None);

    let other_dir = tempfile::tempdir().unwrap();
    let other = Db::open(other_dir.path(), limited()).unwrap();
    let foreign = other.tree("t").unwrap();
    let mut batch = WriteBatch::new();
    batch.insert(&t, b"a", b"1");
    batch.insert(&foreign, b"a", b"1");
    assert!(matches!(db.write(batch), Err(Error::Unsupported(_))));
    assert_eq!(t.get(b"a").unwrap(), None);

    let standalone = Tree::in_memory(Config::default()).unwrap();
    let mut batch = WriteBatch::new();
    batch.insert(&standalone, b"a", b"1");
    assert!(db.write(batch).is_err());
    assert!(db.write(WriteBatch::new()).is_ok());
}

#[test]
fn replay_applies_each_keys_last_write_across_keyspaces_and_batches() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    let small = || small().checkpoint_on_close(false);
    let mut model: [BTreeMap<Vec<u8>, Vec<u8>>; 2] = Default::default();
    let mut writes = 0u64;
    {
        let db = Db::open(dir.path(), small()).unwrap();
        let trees = [db.tree("a").unwrap(), db.tree("b").unwrap()];
        for round in 0..6u32 {
            // Keys in a scrambled order, so that the log's order is not the keys'.
            for j in 0..1500u32 {
                let i = j.wrapping_mul(7919) % 1500;
                let value = format!("r{round}-{i}").into_bytes();
                let t = (i % 3 == 0) as usize;
                if round == 4 && i % 5 == 0 {
                    trees[t].delete(&key(i)).unwrap();
                    model[t].remove(&key(i));
                } else if round == 5 && i % 4 == 0 {
                    // A batch over both keyspaces, with a write it then undoes.
                    let mut batch = WriteBatch::new();
                    batch.insert(&trees[0], &key(i), &value);
                    batch.insert(&trees[1], &key(i), &value);
                    batch.delete(&trees[1], &key(i));
                    db.write(batch).unwrap();
                    model[0].insert(key(i), value);
                    model[1].remove(&key(i));
                    writes += 2;
                } else {
                    trees[t].insert(&key(i), &value).unwrap();
                    model[t].insert(key(i), value);
                }
                writes += 1;
            }
        }
        db.persist().unwrap();
    }
    let db = Db::open(dir.path(), small()).unwrap();
    let r = db.recovery().clone();
    assert_eq!(r.writes_replayed, writes, "{r:?}");
    // Every key written was written last once: the rest were superseded. Keys of
    // keyspace b that only round 5's batches touched count once there too.
    let distinct: u64 = [
        (0..1500u32).filter(|i| i % 3 != 0 || i % 4 == 0).count(),
        (0..1500u32).filter(|i| i % 3 == 0 || i % 4 == 0).count(),
    ]
    .iter()
    .sum::<usize>() as u64;
    assert_eq!(r.writes_superseded, writes - distinct, "{r:?}");
    for (t, name) in ["a", "b"].iter().enumerate() {
        let tree = db.tree(name).unwrap();
        for i in 0..1500u32 {
            assert_eq!(
                tree.get(&key(i)).unwrap(),
                model[t].get(&key(i)).cloned(),
                "{name} {i}"
            );
        }
        let scanned: Vec<(Vec<u8>, Vec<u8>)> = tree
            .range::<&[u8], _>(..)
            .map(|item| item.unwrap())
            .collect();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = model[t].clone().into_iter().collect();
        assert_eq!(scanned, expected, "{name}: a full scan");
    }
}

#[test]
fn batches_span_keyspaces_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), small()).unwrap();
        let (a, b) = (db.tree("a").unwrap(), db.tree("b").unwrap());
        for i in 0..200u32 {
            let mut batch = WriteBatch::new();
            batch.insert(&a, &key(i), b"A");
            batch.insert(&b, &key(i), b"B");
            if i % 2 == 0 {
                batch.delete(&a, &key(i));
            }
            db.write(batch).unwrap();
        }
    }
    let db = Db::open(dir.path(), small()).unwrap();
    let (a, b) = (db.tree("a").unwrap(), db.tree("b").unwrap());
    for i in 0..200u32 {
        let want_a = (i % 2 == 1).then(|| b"A".to_vec());
        assert_eq!(a.get(&key(i)).unwrap(), want_a);
        assert_eq!(b.get(&key(i)).unwrap().as_deref(), Some(&b"B"[..]));
    }
    // The close took a checkpoint: nothing was left to replay.
    assert_eq!(db.recovery().records_replayed, 0);
    assert!(db.recovery().checkpoint > 0);
}

/// Readers of a batch's keys with `get_many` never see half of it: a writer sets eight
/// keys to one value per batch; readers check that the eight always agree.
#[test]
fn get_many_never_sees_half_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Db::open(dir.path(), small()).unwrap());
    let t = db.tree("t").unwrap();
    let keys: Vec<Vec<u8>> = (0..8).map(key).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, t, keys, stop) = (db.clone(), t.clone(), keys.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut batch = WriteBatch::new();
                for k in &keys {
                    batch.insert(&t, k, &n.to_be_bytes());
                }
                db.write_with(batch, Durability::Unlogged).unwrap();
                n += 1;
            }
            n
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (t, keys) = (t.clone(), keys.clone());
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    let got = t.get_many(&keys).unwrap();
                    assert!(
                        got.windows(2).all(|w| w[0] == w[1]),
                        "get_many saw half a batch: {got:?}"
                    );
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let batches = writer.join().unwrap();
    assert!(batches > 0);
}

#[test]
fn persist_makes_logged_writes_durable() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        small().flush_interval(std::time::Duration::from_secs(60)),
    )
    .unwrap();
    let t = db.tree("t").unwrap();
    t.insert(b"k", b"v").unwrap();
    let (last, durable) = db.log_position();
    assert!(durable < last, "with a 60-s flush interval the write waits");
    db.persist().unwrap();
    let (last, durable) = db.log_position();
    assert_eq!(durable, last);
}

/// A database with `n` keys written over `rounds` checkpoints, closed without a final
/// checkpoint so the log holds the writes after the last one.
fn checkpointed(n: u32, rounds: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), small().checkpoint_on_close(false)).unwrap();
    let t = db.tree("t").unwrap();
    for round in 0..rounds {
        for i in 0..n {
            t.insert(&key(i), format!("v{round}-{i}").as_bytes())
                .unwrap();
        }
        db.checkpoint().unwrap();
    }
    for i in 0..n / 10 {
        t.insert(&key(i), b"after").unwrap();
    }
    db.persist().unwrap();
    dir
}

fn expect_checkpointed(db: &Db, n: u32, rounds: u32) {
    let t = db.tree("t").unwrap();
    for i in 0..n {
        let want = if i < n / 10 {
            b"after".to_vec()
        } else {
            format!("v{}-{i}", rounds - 1).into_bytes()
        };
        assert_eq!(t.get(&key(i)).unwrap(), Some(want), "key {i}");
    }
    assert_eq!(t.range::<&[u8], _>(..).count(), n as usize);
}

fn checkpoint_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ckpt-")
        })
        .collect();
    files.sort();
    files
}

#[test]
fn recovery_loads_the_checkpoint_and_replays_only_the_log_after_it() {
    let dir = checkpointed(5000, 3);
    assert_eq!(
        checkpoint_files(dir.path()).len(),
        2,
        "two checkpoints are kept"
    );
    let db = Db::open(dir.path(), small()).unwrap();
    let r = db.recovery().clone();
    assert_eq!(r.checkpoint_fallbacks, 0);
    assert!(r.checkpoint > 0 && r.leaf_pages > 10, "{r:?}");
    assert_eq!(
        r.writes_replayed, 500,
        "only the writes after the checkpoint: {r:?}"
    );
    expect_checkpointed(&db, 5000, 3);
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_older_one_and_a_longer_replay() {
    for damage in ["flip", "truncate"] {
        let dir = checkpointed(5000, 3);
        let files = checkpoint_files(dir.path());
        let newest = files.last().unwrap();
        let mut bytes = std::fs::read(newest).unwrap();
        match damage {
            "flip" => bytes[100] ^= 0x04,
            _ => bytes.truncate(bytes.len() / 2),
        }
        std::fs::write(newest, &bytes).unwrap();
        let db = Db::open(dir.path(), small()).unwrap();
        let r = db.recovery().clone();
        assert_eq!(r.checkpoint_fallbacks, 1, "{damage}: {r:?}");
        assert_eq!(
            r.writes_replayed, 5500,
            "{damage}: the newest round and the tail: {r:?}"
        );
        expect_checkpointed(&db, 5000, 3);
        drop(db);
        // The damaged file is left for its owner; the database goes on past it.
        assert_eq!(
            std::fs::read(newest).unwrap(),
            bytes,
            "{damage}: the damaged file was changed"
        );
        let db = Db::open(dir.path(), small()).unwrap();
        expect_checkpointed(&db, 5000, 3);
    }
}

#[test]
fn with_every_checkpoint_damaged_the_open_fails_naming_it_and_changes_nothing() {
    let dir = checkpointed(2000, 2);
    for file in checkpoint_files(dir.path()) {
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[60] ^= 0x10;
        std::fs::write(&file, &bytes).unwrap();
    }
    let before = snapshot(dir.path());
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(
        matches!(&err, Error::CorruptFile { path, .. } if path.to_string_lossy().contains("ckpt-")),
        "{err:?}"
    );
    let mut after = snapshot(dir.path());
    after.retain(|(n, _)| n != "LOCK");
    let mut before = before;
    before.retain(|(n, _)| n != "LOCK");
    assert_eq!(before, after, "a failed open changed a file");
}

#[test]
fn a_checkpoint_of_another_format_version_is_refused() {
    let dir = checkpointed(500, 1);
    let file = checkpoint_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    // The version follows the 8-byte magic; the trailer's checksum is made right, as a
    // build of that version would have written it.
    bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
    let body = bytes.len() - 12;
    let crc = crc32c::crc32c(&bytes[..body]);
    bytes[body + 8..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(
        matches!(&err, Error::Incompatible { reason } if reason.contains("version 7")),
        "{err:?}"
    );
}

#[test]
fn damage_to_a_page_file_is_reported_never_read_as_an_empty_database() {
    let dir = checkpointed(3000, 1);
    let pages = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pages"))
        .unwrap();
    let mut bytes = std::fs::read(&pages).unwrap();
    // The file store's superblock copies (slots 0 and 1) are not what the database
    // trusts for its contents: damage to one changes nothing.
    bytes[4096 + 200] ^= 0xff;
    std::fs::write(&pages, &bytes).unwrap();
    {
        let db = Db::open(dir.path(), small().checkpoint_on_close(false)).unwrap();
        assert_eq!(db.tree("t").unwrap().range::<&[u8], _>(..).count(), 3000);
    }
    // Damage to every data page is an error on read, not missing records.
    let mut bytes = std::fs::read(&pages).unwrap();
    for slot in 2..bytes.len() / 4096 {
        bytes[slot * 4096 + 1000] ^= 0x01;
    }
    std::fs::write(&pages, &bytes).unwrap();
    let db = Db::open(dir.path(), small().checkpoint_on_close(false)).unwrap();
    let t = db.tree("t").unwrap();
    let scanned: Result<Vec<_>, _> = t.range::<&[u8], _>(..).collect();
    assert!(
        matches!(&scanned, Err(Error::CorruptFile { path, reason })
            if path == &pages && reason.contains("keyspace \"t\"")),
        "{scanned:?}"
    );
}

#[test]
fn checkpoints_truncate_the_log_and_free_the_pages_they_no_longer_need() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        small()
            .log_segment_bytes(64 << 10)
            .checkpoint_on_close(false),
    )
    .unwrap();
    let t = db.tree("t").unwrap();
    let count = |ext: &str| {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == ext)
            })
            .count()
    };
    let mut sizes = Vec::new();
    for round in 0..12u32 {
        for i in 0..2000 {
            t.insert(&key(i), format!("round {round} value {i}").as_bytes())
                .unwrap();
        }
        db.checkpoint().unwrap();
        let pages_len = std::fs::metadata(dir.path().join("ks-00000001.pages"))
            .unwrap()
            .len();
        sizes.push(pages_len);
        // The log keeps what the older of the two kept checkpoints needs, and no more.
        assert!(
            count("log") <= 6,
            "round {round}: {} log segments",
            count("log")
        );
    }
    assert_eq!(db.stats().checkpoints, 12);
    // The same keys rewritten: freed slots are reused, so the page file stops growing
    // (three generations of pages at most: two kept checkpoints and the live one).
    assert!(
        sizes[11] <= sizes[3] * 3 / 2,
        "the page file grows with every checkpoint: sizes by round {sizes:?}"
    );
    // A handle to a tree holds the directory too.
    drop(db);
    assert!(matches!(
        Db::open(dir.path(), small()),
        Err(Error::Locked { .. })
    ));
    drop(t);
    let db = Db::open(dir.path(), small()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(&key(7)).unwrap().as_deref(),
        Some(&b"round 11 value 7"[..])
    );
}

#[test]
fn a_checkpoint_file_left_by_a_crash_before_its_retirement_is_removed_on_open() {
    let dir = checkpointed(300, 4);
    let mut named = checkpoint_files(dir.path());
    assert_eq!(named.len(), 2, "{named:?}");
    named.sort();
    // What a crash between a commit and the retirement of the third-oldest leaves: a
    // checkpoint file older than both kept ones.
    let leaked = dir.path().join("ckpt-0000000000000001");
    assert!(!named.contains(&leaked), "{named:?}");
    std::fs::copy(&named[0], &leaked).unwrap();
    let db = Db::open(dir.path(), small()).unwrap();
    expect_checkpointed(&db, 300, 4);
    assert!(
        !leaked.exists(),
        "the superseded checkpoint file is still there"
    );
    // (The open replayed the writes after the newest checkpoint and checkpointed them,
    // which retired the older of the two.)
    assert!(named[1].exists());
    assert_eq!(checkpoint_files(dir.path()).len(), 2);
}

#[test]
fn a_background_checkpoint_runs_when_the_log_grows() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        small()
            .checkpoint_log_bytes(256 << 10)
            .checkpoint_interval(None)
            .checkpoint_on_close(false),
    )
    .unwrap();
    let t = db.tree("t").unwrap();
    let mut i = 0u32;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while db.stats().checkpoints == 0 {
        t.insert(&key(i % 5000), &[7; 100]).unwrap();
        i += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "no background checkpoint after {i} writes"
        );
    }
    assert!(db.stats().checkpoint_generation > 0);
}

#[test]
fn the_checkpoint_interval_captures_unlogged_writes_alone() {
    // Nothing is logged, so only the interval trigger's notice of unlogged writes
    // brings a checkpoint; the database is then dropped without one, as a crash would.
    let dir = tempfile::tempdir().unwrap();
    let options = || {
        small()
            .durability(Durability::Unlogged)
            .checkpoint_log_bytes(0)
            .checkpoint_interval(Some(std::time::Duration::from_millis(50)))
            .checkpoint_on_close(false)
    };
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let t = db.tree("t").unwrap();
        // A fresh database with nothing written takes no checkpoint.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(db.stats().checkpoints, 0);
        // So the first checkpoint takes its position after this write: it captures it.
        t.insert(b"k", b"unlogged").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while db.stats().checkpoints == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint captured the unlogged write"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            db.stats().log_bytes_since_checkpoint,
            0,
            "nothing was logged"
        );
    }
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db.tree("t").unwrap();
    assert_eq!(t.get(b"k").unwrap().as_deref(), Some(&b"unlogged"[..]));
}

#[test]
fn a_missing_or_truncated_page_file_is_an_error_not_an_empty_keyspace() {
    for damage in ["remove", "truncate"] {
        let dir = checkpointed(3000, 1);
        let pages = dir.path().join("ks-00000001.pages");
        match damage {
            "remove" => std::fs::remove_file(&pages).unwrap(),
            _ => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&pages)
                    .unwrap();
                f.set_len(3 * 4096).unwrap();
            }
        }
        let err = Db::open(dir.path(), small()).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptFile { path, .. } if path == &pages),
            "{damage}: {err:?}"
        );
    }
}

/// After recovery fell back past a damaged newest checkpoint, the manifest must name
/// the checkpoint recovery used (whose pages stay pinned) as the fallback, not the
/// damaged one: the post-recovery checkpoint used to commit [new, damaged], so a
/// damaged new one then had nothing to fall back to although the older one was intact.
#[test]
fn after_a_fallback_the_older_intact_checkpoint_is_still_the_fallback() {
    let dir = checkpointed(5000, 3);
    let damage = |file: &Path| {
        let mut bytes = std::fs::read(file).unwrap();
        bytes[100] ^= 0x04;
        std::fs::write(file, &bytes).unwrap();
    };
    damage(checkpoint_files(dir.path()).last().unwrap());
    {
        let db = Db::open(dir.path(), small().checkpoint_on_close(false)).unwrap();
        assert_eq!(db.recovery().checkpoint_fallbacks, 1);
        expect_checkpointed(&db, 5000, 3);
        assert!(db.stats().checkpoints > 0, "no checkpoint after recovery");
    }
    // The post-recovery checkpoint's file is damaged too.
    damage(checkpoint_files(dir.path()).last().unwrap());
    let db = Db::open(dir.path(), small()).unwrap();
    assert_eq!(db.recovery().checkpoint_fallbacks, 1);
    expect_checkpointed(&db, 5000, 3);
}

/// A newest checkpoint that could not be read at one open (here: its path is a
/// directory for a moment) is not pinned by that open, so its slots are reused; a later
/// open must never load it again. The manifest used to keep naming it.
#[test]
fn a_checkpoint_that_cannot_be_read_fails_the_open_and_is_kept() {
    // ed4ebb1 fell back to the older checkpoint on any error, an EISDIR here; the
    // open's writes then reused the newest one's page slots while the manifest still
    // named it, and a later open whose read succeeded loaded overwritten pages (its
    // unlogged writes read as absent, or the open panicked).
    let dir = tempfile::tempdir().unwrap();
    let small = || small().checkpoint_on_close(false);
    {
        let db = Db::open(dir.path(), small()).unwrap();
        let t = db.tree("t").unwrap();
        for i in 0..3000 {
            t.insert(&key(i), b"logged").unwrap();
        }
        db.checkpoint().unwrap();
        // Unlogged: only the newest checkpoint has them.
        for i in 0..3000 {
            let mut k = key(i);
            k.push(b'u');
            t.insert_with(&k, &[7; 60], Durability::Unlogged).unwrap();
        }
        db.checkpoint().unwrap();
    }
    let newest = checkpoint_files(dir.path()).pop().unwrap();
    let aside = dir.path().join("aside");
    std::fs::rename(&newest, &aside).unwrap();
    std::fs::create_dir(&newest).unwrap();
    let mut before = snapshot(dir.path());
    before.retain(|(n, _)| n != "LOCK");
    for _ in 0..2 {
        let err = Db::open(dir.path(), small()).unwrap_err();
        assert!(
            matches!(&err, Error::Io(e) if e.to_string().contains("ckpt-")),
            "an unreadable checkpoint is an IO error naming it: {err:?}"
        );
    }
    let mut after = snapshot(dir.path());
    after.retain(|(n, _)| n != "LOCK");
    assert_eq!(before, after, "a failed open changed a file");
    std::fs::remove_dir(&newest).unwrap();
    std::fs::rename(&aside, &newest).unwrap();
    let db = Db::open(dir.path(), small()).unwrap();
    assert_eq!(db.recovery().checkpoint_fallbacks, 0);
    let t = db.tree("t").unwrap();
    for i in 0..3000 {
        assert_eq!(
            t.get(&key(i)).unwrap().as_deref(),
            Some(&b"logged"[..]),
            "key {i}"
        );
        let mut k = key(i);
        k.push(b'u');
        assert_eq!(
            t.get(&k).unwrap().as_deref(),
            Some(&[7; 60][..]),
            "key {i}u"
        );
    }
    assert_eq!(t.range::<&[u8], _>(..).count(), 6000);
}

/// A checkpoint whose page slot is out of any range (checksum made right, as a bug or
/// a crafted file could write it) is an error naming a file, never a panic.
#[test]
fn a_checkpoint_naming_an_impossible_page_slot_is_an_error() {
    for slot in [u64::MAX, u64::MAX / 4096, 1 << 40] {
        let dir = checkpointed(500, 1);
        let file = checkpoint_files(dir.path()).pop().unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        // magic, version, generation, position, keyspace count, id, leaf count: the
        // first leaf's slot follows.
        bytes[52..60].copy_from_slice(&slot.to_le_bytes());
        let body = bytes.len() - 12;
        let crc = crc32c::crc32c(&bytes[..body]);
        bytes[body + 8..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&file, &bytes).unwrap();
        let err = Db::open(dir.path(), small()).unwrap_err();
        assert!(
            matches!(err, Error::CorruptFile { .. }),
            "slot {slot}: {err:?}"
        );
    }
}

/// A manifest and checkpoint of the largest generation (checksums right) are refused as
/// corrupt, never a panic computing the next generation.
#[test]
fn a_checkpoint_generation_at_the_end_of_the_range_is_an_error() {
    let dir = checkpointed(500, 1);
    let file = checkpoint_files(dir.path()).pop().unwrap();
    let generation = u64::MAX;
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[12..20].copy_from_slice(&generation.to_le_bytes());
    let body = bytes.len() - 12;
    let crc = crc32c::crc32c(&bytes[..body]);
    bytes[body + 8..].copy_from_slice(&crc.to_le_bytes());
    std::fs::remove_file(&file).unwrap();
    std::fs::write(dir.path().join(format!("ckpt-{generation:016x}")), &bytes).unwrap();
    let manifest = dir.path().join("MANIFEST");
    let mut bytes = std::fs::read(&manifest).unwrap();
    // Header (20), next id, limits, keyspace count (16), keyspace "t" (8), checkpoint
    // count (1): the newest checkpoint's generation follows.
    assert_eq!(bytes[44], 1, "one checkpoint named");
    bytes[45..53].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[20..]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&manifest, &bytes).unwrap();
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(matches!(err, Error::CorruptFile { .. }), "{err:?}");
}

/// A batch is logged even at `Unlogged` (`Db::write_with`), a batch of one write too:
/// the journal's shortcut for single unlogged writes used to skip its record.
#[test]
fn a_batch_of_one_write_is_logged_even_at_unlogged() {
    let dir = tempfile::tempdir().unwrap();
    let small = || small().checkpoint_on_close(false);
    {
        let db = Db::open(dir.path(), small()).unwrap();
        let t = db.tree("t").unwrap();
        let mut batch = WriteBatch::new();
        batch.insert(&t, b"one", b"1");
        db.write_with(batch, Durability::Unlogged).unwrap();
        let mut batch = WriteBatch::new();
        batch.insert(&t, b"two", b"2");
        batch.insert(&t, b"three", b"3");
        db.write_with(batch, Durability::Unlogged).unwrap();
    }
    let db = Db::open(dir.path(), small()).unwrap();
    let t = db.tree("t").unwrap();
    assert_eq!(t.get(b"two").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(t.get(b"one").unwrap().as_deref(), Some(&b"1"[..]));
}

#[test]
fn a_background_checkpoint_leaves_recent_pages_to_the_log_and_merges_older_ones() {
    let dir = tempfile::tempdir().unwrap();
    let options = || {
        small()
            .checkpoint_log_bytes(0)
            .checkpoint_interval(None)
            .checkpoint_on_close(false)
    };
    let write_all = |t: &Tree, round: u32| {
        for i in 0..2000 {
            t.insert(&key(i), format!("r{round}-{i}").as_bytes())
                .unwrap();
        }
    };
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let t = db.tree("t").unwrap();
        write_all(&t, 0);
        // Every dirty page was written since the open: logged, and left to the log.
        db.checkpoint_incremental().unwrap();
        let first = db.stats();
        assert_eq!(first.checkpoint_pages_merged, 0, "{first:?}");
        assert!(first.checkpoint_pages_left_dirty > 0, "{first:?}");
        // Written before the previous checkpoint began and dirty still: merged now.
        db.checkpoint_incremental().unwrap();
        let second = db.stats();
        assert!(second.checkpoint_pages_merged > 0, "{second:?}");
        // An unlogged write since the last checkpoint: everything is merged, so that
        // no older logged write replays over it.
        write_all(&t, 1);
        t.insert_with(&key(5), b"unlogged", Durability::Unlogged)
            .unwrap();
        let left = db.stats().checkpoint_pages_left_dirty;
        db.checkpoint_incremental().unwrap();
        assert_eq!(db.stats().checkpoint_pages_left_dirty, left);
        // Logged writes again, left dirty by the next one; then the process stops
        // without a checkpoint on close.
        write_all(&t, 2);
        db.checkpoint_incremental().unwrap();
        assert!(db.stats().checkpoint_pages_left_dirty > left);
        db.persist().unwrap();
    }
    // Recovery replays the left pages' writes from the previous checkpoint's position.
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..2000 {
        assert_eq!(
            t.get(&key(i)).unwrap(),
            Some(format!("r2-{i}").into_bytes()),
            "key {i}"
        );
    }
    assert!(db.recovery().records_replayed > 0);
}
