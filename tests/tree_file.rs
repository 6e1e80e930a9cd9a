//! File-backed trees (issue 3): a tree holding more than ten times its memory budget is
//! read back completely and correctly, by point reads and by full scans both ways, on
//! both backends. The files live under the crate's `target/tmp` (a real filesystem, so
//! `O_DIRECT` can work; tmpfs may refuse it).

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use bfdb::{Backend, Config, Error, Tree};

const BUDGET_BYTES: u64 = 64 << 10;

fn config(backend: Backend) -> Config {
    Config {
        memory_budget_bytes: BUDGET_BYTES,
        max_key_bytes: 32,
        max_value_bytes: 512,
        backend,
        huge_pages: false,
        ..Config::default()
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tree_file")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Whether the filesystem holding `dir` accepts `O_DIRECT`.
fn o_direct_works(dir: &Path) -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(dir.join("probe"))
        .is_ok()
}

fn key(i: u64) -> Vec<u8> {
    // Scattered so inserts land all over the tree, not only at its right edge.
    format!("k{:010}", i.wrapping_mul(0x9E37_79B9) % 4_000_000_007).into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    let len = 100 + (i * 37 % 300) as usize;
    (0..len).map(|j| (i as u8).wrapping_add(j as u8)).collect()
}

/// Loads ~20x the budget, overwrites and deletes some, then checks everything.
fn load_and_read_back(backend: Backend) {
    let dir = temp_dir();
    let path = dir.path().join("tree.bfdb");
    let tree = Tree::open(&path, config(backend)).unwrap();
    let expect_direct = matches!(backend, Backend::StdDirect) && o_direct_works(dir.path());
    assert_eq!(
        tree.stats().direct_io,
        expect_direct,
        "direct_io for {backend:?}"
    );

    let mut model = BTreeMap::new();
    let mut bytes = 0u64;
    let mut i = 0u64;
    while bytes < 20 * BUDGET_BYTES {
        let (k, v) = (key(i), value(i));
        bytes += (k.len() + v.len()) as u64;
        tree.insert(&k, &v).unwrap();
        model.insert(k, v);
        if i % 10 == 5 {
            // Overwrite an older key with a different value.
            let (k, v) = (key(i / 2), value(i + 1_000_000));
            tree.insert(&k, &v).unwrap();
            model.insert(k, v);
        }
        if i % 13 == 7 {
            let k = key(i / 3);
            tree.delete(&k).unwrap();
            model.remove(&k);
        }
        i += 1;
    }
    let live_bytes: u64 = model.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
    assert!(
        live_bytes >= 10 * BUDGET_BYTES,
        "only {live_bytes} live bytes"
    );

    // Every key by point read, in an order unrelated to the insert order.
    let mut out = Vec::new();
    for (k, v) in model.iter().rev() {
        assert!(tree.get_into(k, &mut out).unwrap(), "missing {k:?}");
        assert!(out == *v, "wrong value for {k:?}");
    }
    for j in (0..i).step_by(97) {
        let mut absent = key(j);
        absent.push(b'!');
        assert_eq!(tree.get(&absent).unwrap(), None);
    }

    // Full scans, both ways.
    let mut n = 0;
    for (got, want) in tree.range::<&[u8], _>(..).zip(&model) {
        let (k, v) = got.unwrap();
        assert!(k == *want.0 && v == *want.1, "forward scan at {n}");
        n += 1;
    }
    assert_eq!(n, model.len(), "forward scan length");
    let mut n = 0;
    for (got, want) in tree.range::<&[u8], _>(..).rev().zip(model.iter().rev()) {
        let (k, v) = got.unwrap();
        assert!(k == *want.0 && v == *want.1, "backward scan at {n}");
        n += 1;
    }
    assert_eq!(n, model.len(), "backward scan length");
    assert_eq!(tree.range::<&[u8], _>(..).count(), model.len());

    let s = tree.stats();
    eprintln!(
        "{backend:?}: {} records, {live_bytes} bytes, {s:#?}",
        model.len()
    );
    assert!(s.leaf_reads > 0, "leaf pages were read from the file");
    assert!(s.leaf_writes > 0 && s.evictions > 0 && s.leaf_splits > 0);

    // Flush writes back every dirty mini-page; nothing changes for readers.
    tree.flush().unwrap();
    let writes_after_flush = tree.stats().leaf_writes;
    tree.flush().unwrap();
    assert_eq!(
        tree.stats().leaf_writes,
        writes_after_flush,
        "a second flush has nothing dirty to write"
    );
    for (k, v) in model.iter().step_by(7) {
        assert_eq!(tree.get(k).unwrap().as_ref(), Some(v));
    }
    let file_bytes = std::fs::metadata(&path).unwrap().len();
    assert!(
        file_bytes >= 10 * BUDGET_BYTES,
        "the file holds the data: {file_bytes} bytes"
    );
    drop(tree);

    // Reopening needs recovery, which this release refuses rather than serve stale data.
    match Tree::open(&path, config(backend)) {
        Err(Error::Unsupported(_)) => {}
        other => panic!("reopen gave {other:?}"),
    }
}

#[test]
fn std_backend_holds_twenty_times_its_budget() {
    load_and_read_back(Backend::Std);
}

#[test]
fn direct_backend_holds_twenty_times_its_budget() {
    load_and_read_back(Backend::StdDirect);
}

/// A file-backed tree used only for writes and flushed with dirty mini-pages in the pool:
/// dropping it (which flushes) and reopening still gives `Unsupported`, and an unflushed
/// empty tree's file does too (its first leaf page is written at creation).
#[test]
fn reopen_is_unsupported_even_for_small_trees() {
    let dir = temp_dir();
    for backend in [Backend::Std, Backend::StdDirect] {
        let path = dir.path().join(format!("{backend:?}.bfdb"));
        drop(Tree::open(&path, config(backend)).unwrap());
        assert!(matches!(
            Tree::open(&path, config(backend)),
            Err(Error::Unsupported(_))
        ));
        let path = dir.path().join(format!("{backend:?}-small.bfdb"));
        let tree = Tree::open(&path, config(backend)).unwrap();
        tree.insert(b"a", b"1").unwrap();
        tree.flush().unwrap();
        tree.insert(b"b", b"2").unwrap();
        assert_eq!(tree.get(b"a").unwrap(), Some(b"1".to_vec()));
        drop(tree);
        assert!(matches!(
            Tree::open(&path, config(backend)),
            Err(Error::Unsupported(_))
        ));
    }
}

/// Resets the simulated `O_DIRECT` refusal of this thread when dropped, also when an
/// assertion fails.
struct RefuseODirect;

impl RefuseODirect {
    fn set() -> RefuseODirect {
        bfdb::storage::simulate_o_direct_refused_for_test(true);
        RefuseODirect
    }
}

impl Drop for RefuseODirect {
    fn drop(&mut self) {
        bfdb::storage::simulate_o_direct_refused_for_test(false);
    }
}

/// What `TreeStats` says of a new tree at `path` on `backend`: name, whether `O_DIRECT`
/// is active, and the notice.
fn backend_stats(path: &Path, backend: Backend) -> (&'static str, bool, Option<String>) {
    let stats = Tree::open(path, config(backend)).unwrap().stats();
    (stats.backend, stats.direct_io, stats.backend_notice)
}

/// `TreeStats::backend` tells `pread`/`pwrite` with `O_DIRECT` from buffered: `Std` runs
/// as "std" with no notice; `StdDirect` runs as "std_direct", or, where the filesystem
/// refuses `O_DIRECT` (the documented fallback), as "std" with a notice that says so.
/// The refusal is also simulated, so both outcomes are checked on every filesystem.
#[test]
fn stats_tell_direct_from_buffered_pread() {
    let dir = temp_dir();
    let std = backend_stats(&dir.path().join("std.bfdb"), Backend::Std);
    assert_eq!(std, ("std", false, None));
    let direct = backend_stats(&dir.path().join("direct.bfdb"), Backend::StdDirect);
    if o_direct_works(dir.path()) {
        assert_eq!(direct, ("std_direct", true, None));
    } else {
        assert_eq!((direct.0, direct.1), ("std", false));
        let notice = direct.2.clone().expect("a fallback notice");
        assert!(notice.contains("refuses O_DIRECT"), "{notice}");
    }
    assert_ne!(std, direct, "Std and StdDirect look the same");

    let _refused = RefuseODirect::set();
    let (name, direct_io, notice) =
        backend_stats(&dir.path().join("refused.bfdb"), Backend::StdDirect);
    assert_eq!((name, direct_io), ("std", false));
    let notice = notice.expect("a fallback notice");
    assert!(notice.contains("refuses O_DIRECT"), "{notice}");
    // Buffered IO asks nothing of the filesystem, so there is nothing to report.
    assert_eq!(
        backend_stats(&dir.path().join("std-refused.bfdb"), Backend::Std),
        ("std", false, None)
    );
}

#[test]
fn opening_in_a_missing_directory_names_the_path() {
    let dir = temp_dir();
    let path = dir.path().join("no-such-dir").join("tree.bfdb");
    let err = Tree::open(&path, config(Backend::Std)).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains(&path.display().to_string()),
        "the message should name {}: {shown}",
        path.display()
    );
    match err {
        Error::Io(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}"),
        other => panic!("expected Io, got {other:?}"),
    }
}
