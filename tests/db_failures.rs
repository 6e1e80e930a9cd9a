//! How a database fails: writes through handles that outlive it, a log that no longer
//! reaches what the checkpoints need, a keyspace or log that fails (the failure state),
//! a batch that fails halfway, and the directory left as it was by a refused open.
//!
//! Each test names how the code before the fix (ed4ebb1) failed it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bfdb::storage::{SimLog, SimPages};
use bfdb::{Config, Db, DbOptions, Durability, Error, WriteBatch};

fn small() -> DbOptions {
    DbOptions::default().config(Config {
        memory_budget_bytes: 256 << 10,
        huge_pages: false,
        ..Config::default()
    })
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:08}").into_bytes()
}

fn remove_log(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with("wal-") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
}

fn is_poisoned(r: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(r, Err(Error::Poisoned { .. }))
}

#[test]
fn logged_writes_through_a_handle_that_outlives_the_db_survive_its_drop() {
    // ed4ebb1: the flusher stopped without a last group write, so with a 200 ms
    // interval none of these 200 writes survived, every run.
    let dir = tempfile::tempdir().unwrap();
    let options = || small().flush_interval(Duration::from_millis(200));
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let tree = db.tree("t").unwrap();
        drop(db);
        for i in 0..200 {
            tree.insert(&key(i), b"after the db").unwrap();
        }
    }
    let db = Db::open(dir.path(), options()).unwrap();
    let tree = db.tree("t").unwrap();
    for i in 0..200 {
        assert_eq!(
            tree.get(&key(i)).unwrap().as_deref(),
            Some(&b"after the db"[..]),
            "key {i}"
        );
    }
}

/// A database whose newest checkpoint left pages dirty to the log: recovery from it
/// needs the log from the previous quiesce on.
fn left_dirty(dir: &Path) {
    let db = Db::open(dir, small().checkpoint_on_close(false)).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..3000 {
        t.insert(&key(i), b"one").unwrap();
    }
    db.checkpoint_incremental().unwrap();
    assert!(
        db.stats().checkpoint_pages_left_dirty > 0,
        "{:?}",
        db.stats()
    );
    db.close().unwrap();
}

#[test]
fn an_open_whose_log_lacks_what_its_checkpoint_needs_fails_naming_the_range() {
    // ed4ebb1: with the log gone after a background checkpoint that left pages dirty,
    // the open returned Ok with writes made before that checkpoint missing, and
    // RecoveryStats said nothing.
    let dir = tempfile::tempdir().unwrap();
    left_dirty(dir.path());
    remove_log(dir.path());
    for _ in 0..2 {
        let err = Db::open(dir.path(), small()).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptFile { reason, .. }
                if reason.contains("needs the write-ahead log's records")
                    && reason.contains("accept_rollback")),
            "{err}"
        );
    }
    // The user may accept the loss, and is told what it was.
    let db = Db::open(dir.path(), small().accept_rollback(true)).unwrap();
    let lost = db.recovery().rolled_back.expect("the rollback is reported");
    assert!(lost.end_seq > lost.first_seq, "{lost:?}");
    assert_eq!(lost.found_end_seq, lost.first_seq, "{lost:?}");
    let t = db.tree("t").unwrap();
    t.insert(b"later", b"x").unwrap();
    drop(t);
    db.close().unwrap();
    // And the next open, which has all the log the new state needs, asks nothing.
    let db = Db::open(dir.path(), small()).unwrap();
    assert_eq!(db.recovery().rolled_back, None);
    assert!(db.tree("t").unwrap().get(b"later").unwrap().is_some());
}

/// A database of 3,000 keys written in two rounds (values `v0`, then `v1`), each
/// round followed by a checkpoint; the newest checkpoint's file then has a bit flipped.
/// Answers the damaged file.
fn two_checkpoints_the_newest_damaged(dir: &Path) -> std::path::PathBuf {
    {
        let db = Db::open(dir, small().checkpoint_on_close(false)).unwrap();
        let t = db.tree("t").unwrap();
        for round in 0..2u32 {
            for i in 0..3000 {
                t.insert(&key(i), format!("v{round}").as_bytes()).unwrap();
            }
            db.checkpoint().unwrap();
        }
        drop(t);
        db.close().unwrap();
    }
    let mut ckpts: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ckpt-")
        })
        .collect();
    ckpts.sort();
    let newest = ckpts.pop().unwrap();
    let mut bytes = std::fs::read(&newest).unwrap();
    bytes[60] ^= 0x01;
    std::fs::write(&newest, &bytes).unwrap();
    newest
}

#[test]
fn a_fallback_without_the_log_it_needs_fails_instead_of_opening_an_older_database() {
    // ed4ebb1: with the newest checkpoint damaged and the log gone, the open fell back
    // and returned Ok with the older checkpoint's state only.
    let dir = tempfile::tempdir().unwrap();
    two_checkpoints_the_newest_damaged(dir.path());
    remove_log(dir.path());
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(
        matches!(&err, Error::CorruptFile { reason, .. } if reason.contains("write-ahead log")),
        "{err}"
    );
    let db = Db::open(dir.path(), small().accept_rollback(true)).unwrap();
    let r = db.recovery();
    assert_eq!(r.checkpoint_fallbacks, 1, "{r:?}");
    assert_eq!(r.damaged_checkpoints.len(), 1, "{r:?}");
    assert!(r.rolled_back.is_some(), "{r:?}");
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let newest = two_checkpoints_the_newest_damaged(dir.path());
    let db = Db::open(dir.path(), small()).unwrap();
    let r = db.recovery().clone();
    assert_eq!(r.checkpoint_fallbacks, 1);
    assert!(
        r.damaged_checkpoints
            .first()
            .is_some_and(|why| why.contains(&*newest.file_name().unwrap().to_string_lossy())),
        "{r:?}"
    );
    assert_eq!(r.rolled_back, None);
    let t = db.tree("t").unwrap();
    for i in 0..3000 {
        assert_eq!(t.get(&key(i)).unwrap().as_deref(), Some(&b"v1"[..]), "{i}");
    }
}

/// A simulated database with two tree keyspaces, `a` and `b`, each holding `n` logged
/// and persisted keys.
fn simulated(n: u32) -> (tempfile::TempDir, Arc<SimLog>, Arc<SimPages>, Db) {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SimLog::new(5));
    let pages = Arc::new(SimPages::new(6));
    let db = Db::open_simulated(
        dir.path(),
        small().checkpoint_interval(None).checkpoint_log_bytes(0),
        log.clone(),
        pages.clone(),
    )
    .unwrap();
    for name in ["a", "b"] {
        let t = db.tree(name).unwrap();
        for i in 0..n {
            t.insert(&key(i), &[1; 100]).unwrap();
        }
    }
    db.persist().unwrap();
    (dir, log, pages, db)
}

/// Crashes both devices and opens the database on what they kept.
fn reopen(dir: &Path, log: &SimLog, pages: &SimPages) -> (Arc<SimLog>, Arc<SimPages>, Db) {
    let (log, pages) = (Arc::new(log.crash()), Arc::new(pages.crash()));
    let db = Db::open_simulated(
        dir,
        small().checkpoint_interval(None).checkpoint_log_bytes(0),
        log.clone(),
        pages.clone(),
    )
    .unwrap();
    (log, pages, db)
}

#[test]
fn once_a_keyspace_cannot_write_its_pages_every_write_of_the_database_fails() {
    // ed4ebb1: after keyspace a was poisoned, unlogged writes to b kept returning Ok,
    // every checkpoint failed, and those writes were gone after the reopen.
    let (dir, log, pages, db) = simulated(2000);
    let (a, b) = (db.tree("a").unwrap(), db.tree("b").unwrap());
    pages.store("ks-00000001.pages").fail_writes_after(0);
    assert!(db.checkpoint().is_err());
    for level in [Durability::Unlogged, Durability::Logged, Durability::Synced] {
        let r = b.insert_with(b"new", b"x", level);
        assert!(is_poisoned(&r), "{level:?}: {r:?}");
        assert!(is_poisoned(&a.insert_with(b"new", b"x", level)));
    }
    let mut batch = WriteBatch::new();
    batch.insert(&b, b"batched", b"x");
    assert!(is_poisoned(&db.write(batch)));
    assert!(is_poisoned(&db.checkpoint()));
    // Reads go on.
    assert_eq!(b.get(&key(7)).unwrap().as_deref(), Some(&[1; 100][..]));
    let closed = db.close();
    assert!(
        matches!(&closed, Err(Error::Poisoned { cause }) if cause.contains("\"a\"")),
        "close says what failed: {closed:?}"
    );
    drop((a, b));
    let (_, _, db) = reopen(dir.path(), &log, &pages);
    for name in ["a", "b"] {
        let t = db.tree(name).unwrap();
        for i in 0..2000 {
            assert_eq!(t.get(&key(i)).unwrap().as_deref(), Some(&[1; 100][..]));
        }
        assert_eq!(t.get(b"new").unwrap(), None);
    }
}

#[test]
fn once_the_log_fails_every_write_fails_and_close_says_so() {
    let (dir, log, pages, db) = simulated(500);
    let b = db.tree("b").unwrap();
    log.fail_syncs_after(0);
    let r = b.insert_with(b"synced", b"x", Durability::Synced);
    assert!(r.is_err(), "{r:?}");
    for level in [Durability::Unlogged, Durability::Logged, Durability::Synced] {
        let r = b.insert_with(b"after", b"x", level);
        assert!(is_poisoned(&r), "{level:?}: {r:?}");
    }
    assert!(db.close().is_err());
    drop(b);
    let (_, _, db) = reopen(dir.path(), &log, &pages);
    let b = db.tree("b").unwrap();
    for i in 0..500 {
        assert!(b.get(&key(i)).unwrap().is_some(), "{i}");
    }
    assert_eq!(b.get(b"after").unwrap(), None);
}

#[test]
fn a_batch_that_fails_halfway_is_never_seen_in_part() {
    // ed4ebb1: the batch returned an error with its first writes applied and nothing
    // poisoned: readers saw half of it.
    let (dir, log, pages, db) = simulated(300);
    db.checkpoint().unwrap();
    db.close().unwrap();
    let (log, pages, db) = reopen(dir.path(), &log, &pages);
    let a = db.tree("a").unwrap();
    // Large values into one leaf: its mini-page fills after a few, and the merge that
    // must follow reads the leaf page, which fails for good.
    let mut batch = WriteBatch::new();
    for i in 100..140 {
        batch.insert(&a, &key(i), &[2; 900]);
    }
    pages.store("ks-00000001.pages").fail_reads_after(0);
    let r = db.write(batch);
    assert!(r.is_err(), "{r:?}");
    for i in 100..140 {
        let got = a.get(&key(i));
        assert!(is_poisoned(&got), "key {i}: {got:?}");
    }
    assert!(is_poisoned(&a.get_many(&[key(100), key(139)])));
    assert!(is_poisoned(&a.insert(b"x", b"y")));
    assert!(db.close().is_err());
    drop(a);
    pages.store("ks-00000001.pages").clear_faults();
    let (_, _, db) = reopen(dir.path(), &log, &pages);
    let a = db.tree("a").unwrap();
    let new: Vec<bool> = (100..140)
        .map(|i| a.get(&key(i)).unwrap().as_deref() == Some(&[2; 900][..]))
        .collect();
    assert!(
        new.iter().all(|&n| n) || new.iter().all(|&n| !n),
        "after the reopen the batch is whole or absent: {new:?}"
    );
}

#[test]
fn a_refused_open_leaves_the_directory_as_it_was() {
    // ed4ebb1: the refused open left a LOCK file behind.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    let err = Db::open(dir.path(), small()).unwrap_err();
    assert!(matches!(err, Error::Incompatible { .. }), "{err:?}");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["notes.txt".to_string()]);
    let empty = tempfile::tempdir().unwrap();
    let err = Db::open(empty.path(), small().create(false)).unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err:?}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
    // ed4ebb1 said "not a directory" for a directory that is not there.
    let missing = empty.path().join("missing");
    let err = Db::open(&missing, small().create(false)).unwrap_err();
    assert!(
        err.to_string().contains("no such database directory"),
        "{err}"
    );
}

#[test]
fn a_panic_in_the_background_checkpointer_fails_the_database() {
    // ed4ebb1: the checkpointer's thread died silently (`let _ = h.join()`), and the
    // database went on with no checkpoints: unbounded log growth, no error.
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        small()
            .checkpoint_interval(Some(Duration::from_millis(20)))
            .checkpoint_on_close(false),
    )
    .unwrap();
    let t = db.tree("t").unwrap();
    t.insert(b"before", b"x").unwrap();
    db.fail_checkpoints_at(bfdb::CheckpointCrashPoint::PanicAfterFlush);
    let mut refused = None;
    for i in 0..2000 {
        // Each write makes a checkpoint due; the next background one panics.
        match t.insert(&key(i), b"v") {
            Ok(()) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("the checkpointer's panic never reached the writers");
    assert!(
        matches!(&e, Error::Poisoned { cause } if cause.contains("checkpointer panicked")),
        "{e}"
    );
    let closed = db.close();
    assert!(closed.is_err(), "{closed:?}");
}

#[test]
fn a_zeroed_page_file_is_an_error_naming_it_and_its_keyspace() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), small()).unwrap();
        let t = db.tree("users").unwrap();
        for i in 0..3000 {
            t.insert(&key(i), &[5; 100]).unwrap();
        }
    }
    let file = dir.path().join("ks-00000001.pages");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::write(&file, vec![0u8; len as usize]).unwrap();
    let outcome = Db::open(dir.path(), small()).and_then(|db| {
        let t = db.tree("users")?;
        for i in 0..3000 {
            t.get(&key(i))?;
        }
        Ok(())
    });
    // ed4ebb1: "incompatible file: not a bfdb file: neither superblock slot carries
    // the magic bytes", naming neither the file nor the keyspace.
    let err = outcome.expect_err("a zeroed page file read as data");
    assert!(
        matches!(&err, Error::CorruptFile { path, reason }
            if path.ends_with("ks-00000001.pages") && reason.contains("\"users\"")),
        "{err}"
    );
}

#[test]
fn a_failed_manifest_write_names_the_file_it_failed_on() {
    // ed4ebb1 named MANIFEST when writing MANIFEST.tmp failed.
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), small()).unwrap();
    std::fs::create_dir(dir.path().join("MANIFEST.tmp")).unwrap();
    let err = db.tree("new").unwrap_err();
    assert!(err.to_string().contains("MANIFEST.tmp"), "{err}");
    std::fs::remove_dir(dir.path().join("MANIFEST.tmp")).unwrap();
    db.tree("new").unwrap();
}
