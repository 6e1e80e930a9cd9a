//! Leaf pages that pass their checksum but hold another key range than their
//! checkpoint routes to them: a page file restored from a backup of another moment than
//! the manifest, or one page slot's bytes copied over another's (the checksum does not
//! cover the slot number). Every call on such a database must answer `Ok` or a
//! `CorruptFile` naming the keyspace's page file, the page and the keyspace; no thread
//! may panic (the background evictor included) and no call may hang; once damage is
//! found, the keyspace refuses writes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bfdb::{Config, Db, DbOptions, Error};

const KEYSPACE: &str = "users";
const PAGE_BYTES: usize = 4096;
/// `PageKind::Data` in a page header's kind field (bytes 6..8).
const DATA_PAGE_KIND: u16 = 1;

/// Panics of any thread of the process (the background evictor's included).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

fn options() -> DbOptions {
    DbOptions::default()
        .config(Config {
            // Small enough that merges, splits and evictions happen all the time.
            memory_budget_bytes: 256 << 10,
            huge_pages: false,
            ..Config::default()
        })
        .checkpoint_on_close(false)
        .checkpoint_interval(None)
}

fn key(i: u32) -> Vec<u8> {
    format!("user{i:08}").into_bytes()
}

fn value(i: u32, round: u32) -> Vec<u8> {
    format!("value-{round}-{i}-{}", "x".repeat(24)).into_bytes()
}

/// Runs `f` on a thread of its own and waits at most `secs` seconds for it: a hang
/// fails the test instead of blocking it forever (the spinning thread is left behind).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("damaged-pages: {what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not finish in {secs} s"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

fn page_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pages"))
        .expect("the keyspace's page file")
}

/// A database whose tree has many leaf pages, checkpointed four times with other keys in
/// scrambled order in between (so leaves split and later checkpoints' pages hold
/// other ranges than the first's), plus (with `replay`) logged writes after the last
/// checkpoint, which recovery replays, merging pages before the open returns. Returns the directory and the page file's bytes at the first
/// checkpoint.
fn build(replay: bool) -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db.tree(KEYSPACE).unwrap();
    for i in (0..6000).step_by(2) {
        t.insert(&key(i), &value(i, 0)).unwrap();
    }
    db.checkpoint().unwrap();
    let first = std::fs::read(page_file(dir.path())).unwrap();
    for n in 0..3000u32 {
        let i = (n * 7919 % 3000) * 2 + 1;
        t.insert(&key(i), &value(i, 1)).unwrap();
    }
    db.checkpoint().unwrap();
    // A third checkpoint lets the first one's page slots go, and the fourth one's
    // pages reuse them.
    for round in 2..4 {
        for n in 0..6000u32 {
            let i = n * 7907 % 6000;
            t.insert(&key(i), &value(i, round)).unwrap();
        }
        db.checkpoint().unwrap();
    }
    for n in 0..if replay { 600 } else { 0 } {
        let i = n * 7901 % 6000;
        t.insert(&key(i), &value(i, 4)).unwrap();
    }
    db.persist().unwrap();
    drop(t);
    drop(db);
    (dir, first)
}

/// Slots of the page file holding data pages (slots 0 and 1 are the superblocks).
fn data_slots(bytes: &[u8]) -> Vec<usize> {
    (2..bytes.len() / PAGE_BYTES)
        .filter(|&s| {
            let kind = &bytes[s * PAGE_BYTES + 6..s * PAGE_BYTES + 8];
            u16::from_le_bytes([kind[0], kind[1]]) == DATA_PAGE_KIND
        })
        .collect()
}

/// Ways to give leaf pages another range than their routing, each checksum-valid.
#[derive(Clone, Copy, Debug)]
enum Damage {
    /// The data pages of the first checkpoint's file written back over the current
    /// file (a backup restored from another moment than the manifest).
    OldFile,
    /// Every data slot gets the bytes of the next data slot.
    Rotate,
    /// Pairs of data slots far apart swap their bytes.
    Swap,
}

fn damage(dir: &Path, first: &[u8], how: Damage) {
    let path = page_file(dir);
    let mut bytes = std::fs::read(&path).unwrap();
    let original = bytes.clone();
    match how {
        Damage::OldFile => {
            for s in data_slots(first) {
                let at = s * PAGE_BYTES..(s + 1) * PAGE_BYTES;
                if at.end <= bytes.len() {
                    bytes[at.clone()].copy_from_slice(&first[at]);
                }
            }
        }
        Damage::Rotate => {
            let slots = data_slots(&original);
            for (i, &s) in slots.iter().enumerate() {
                let from = slots[(i + 1) % slots.len()];
                bytes[s * PAGE_BYTES..(s + 1) * PAGE_BYTES]
                    .copy_from_slice(&original[from * PAGE_BYTES..(from + 1) * PAGE_BYTES]);
            }
        }
        Damage::Swap => {
            // A few pairs far apart: the file also holds slots no checkpoint uses any
            // more, and one pair of those would go unnoticed.
            let slots = data_slots(&original);
            let n = slots.len();
            for k in 1..7 {
                let (a, b) = (slots[n * k / 14], slots[n * k / 14 + n / 2]);
                bytes[a * PAGE_BYTES..(a + 1) * PAGE_BYTES]
                    .copy_from_slice(&original[b * PAGE_BYTES..(b + 1) * PAGE_BYTES]);
                bytes[b * PAGE_BYTES..(b + 1) * PAGE_BYTES]
                    .copy_from_slice(&original[a * PAGE_BYTES..(a + 1) * PAGE_BYTES]);
            }
        }
    }
    let changed = (0..bytes.len() / PAGE_BYTES)
        .filter(|s| {
            bytes[s * PAGE_BYTES..(s + 1) * PAGE_BYTES]
                != original[s * PAGE_BYTES..(s + 1) * PAGE_BYTES]
        })
        .count();
    eprintln!(
        "{how:?}: {changed} of {} slots changed",
        bytes.len() / PAGE_BYTES
    );
    assert!(bytes != original, "{how:?} changed nothing");
    std::fs::write(&path, &bytes).unwrap();
}

/// What the calls on a damaged database answered.
#[derive(Default)]
struct Seen {
    errors: usize,
}

impl Seen {
    /// Checks an answer: `Ok`, or the damage reported as it must be.
    fn check<T>(&mut self, how: Damage, what: &str, pages: &Path, r: bfdb::Result<T>) {
        let Err(e) = r else { return };
        self.errors += 1;
        if self.errors == 1 {
            eprintln!("{how:?}: {what} reported: {e}");
        }
        match &e {
            Error::CorruptFile { path, reason } => {
                assert_eq!(path, pages, "{how:?} {what}: {e}");
                assert!(reason.contains("page "), "{how:?} {what}: {e}");
                assert!(
                    reason.contains(&format!("{KEYSPACE:?}")),
                    "{how:?} {what}: {e}"
                );
            }
            // Writes refused once the keyspace is poisoned name the damage found.
            Error::Poisoned { cause } => {
                let file = pages.file_name().unwrap().to_string_lossy();
                assert!(cause.contains(&*file), "{how:?} {what}: {e}");
            }
            other => panic!("{how:?} {what}: expected CorruptFile, got {other:?}"),
        }
    }
}

/// Opens the damaged database and uses it every way that reads leaf pages. Returns
/// how many calls reported damage.
fn exercise(dir: PathBuf, how: Damage) -> usize {
    let pages = page_file(&dir);
    let mut seen = Seen::default();
    let db = {
        let dir = dir.clone();
        within(60, "open", move || Db::open(&dir, options()))
    };
    let db = match db {
        Ok(db) => std::sync::Arc::new(db),
        Err(e) => {
            seen.check(how, "open", &pages, Err::<(), _>(e));
            return seen.errors;
        }
    };
    let t = db.tree(KEYSPACE).unwrap();
    let run = |secs, what: &str, f: Box<dyn FnOnce() -> Vec<bfdb::Result<()>> + Send>| {
        within(secs, what, f)
    };
    let answers = {
        let t = t.clone();
        run(
            60,
            "gets",
            Box::new(move || (0..6000).map(|i| t.get(&key(i)).map(drop)).collect()),
        )
    };
    for r in answers {
        seen.check(how, "get", &pages, r);
    }
    let answers = {
        let t = t.clone();
        run(
            60,
            "get_many",
            Box::new(move || {
                let keys: Vec<Vec<u8>> = (0..6000).map(key).collect();
                vec![t.get_many(&keys).map(drop)]
            }),
        )
    };
    for r in answers {
        seen.check(how, "get_many", &pages, r);
    }
    for reverse in [false, true] {
        let t = t.clone();
        let answers = run(
            60,
            if reverse { "reverse scan" } else { "scan" },
            Box::new(move || {
                let range = t.range::<&[u8], _>(..);
                let all: bfdb::Result<Vec<_>> = if reverse {
                    range.rev().collect()
                } else {
                    range.collect()
                };
                vec![all.map(drop)]
            }),
        );
        for r in answers {
            seen.check(how, "scan", &pages, r);
        }
    }
    let answers = {
        let t = t.clone();
        run(
            60,
            "cursor",
            Box::new(move || {
                let mut c = t.cursor::<&[u8], _>(..);
                let mut out = Vec::new();
                loop {
                    match c.next() {
                        None => break,
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            out.push(Err(e));
                            break;
                        }
                    }
                }
                out
            }),
        )
    };
    for r in answers {
        seen.check(how, "cursor", &pages, r);
    }
    // Writes in scrambled order: mini-pages fill, merge, split and get evicted.
    let answers = {
        let t = t.clone();
        run(
            60,
            "writes",
            Box::new(move || {
                (0..6000u32)
                    .map(|n| {
                        let i = n * 7907 % 6000;
                        t.insert(&key(i), &value(i, 5))
                    })
                    .collect()
            }),
        )
    };
    let before = seen.errors;
    for r in answers {
        seen.check(how, "insert", &pages, r);
    }
    let answers = {
        let db = db.clone();
        run(60, "checkpoint", Box::new(move || vec![db.checkpoint()]))
    };
    for r in answers {
        seen.check(how, "checkpoint", &pages, r);
    }
    if seen.errors > 0 {
        // Damage found: the keyspace takes no more writes.
        let r = t.insert(b"after damage", b"x");
        assert!(
            r.is_err(),
            "{how:?}: a write after damage was found succeeded"
        );
        seen.check(how, "insert after damage", &pages, r);
    } else {
        assert_eq!(before, 0);
    }
    drop(t);
    within(60, "close", move || drop(db));
    seen.errors
}

/// Builds a database, damages it `how`, and uses it: no panic, no hang, and the damage
/// is reported; with and without writes for recovery to replay (which merge pages
/// before the open returns).
fn case(how: Damage) {
    // One case at a time, so that the panic count is this case's.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    count_panics();
    for replay in [true, false] {
        PANICS.store(0, Ordering::SeqCst);
        let (dir, first) = build(replay);
        damage(dir.path(), &first, how);
        let errors = exercise(dir.path().to_path_buf(), how);
        assert_eq!(
            PANICS.load(Ordering::SeqCst),
            0,
            "{how:?} (replay {replay}): a thread panicked"
        );
        assert!(
            errors > 0,
            "{how:?} (replay {replay}): the damage went unnoticed"
        );
    }
}

#[test]
fn two_leaf_pages_that_swapped_slots_are_reported_never_panic_or_hang() {
    case(Damage::Swap);
}

#[test]
fn leaf_pages_each_in_another_pages_slot_are_reported_never_panic_or_hang() {
    case(Damage::Rotate);
}

#[test]
fn a_page_file_restored_from_an_older_checkpoint_is_reported_never_panic_or_hang() {
    case(Damage::OldFile);
}
