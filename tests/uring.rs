//! The io_uring engine of the file store (issue 5): faults come back as errors, batches
//! and single pages agree, many more threads than a shared ring pool would have do IO at
//! once, and a Tree on the engine behaves.
//!
//! The page store's model test (tests/storage.rs) and the Tree's differential test
//! (tests/tree_model.rs) also run on this engine.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use bfdb::storage::{FileOptions, FileStore, IoEngine, PAGE_SIZE, Page, PageNo, PageStore};
use bfdb::{Backend, Config, Error, Tree};

mod common;
use common::{fault_config, insert_until_refused, load_scattered};

/// A scratch directory on the work disk, which supports `O_DIRECT`.
fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir")
}

fn uring(direct_io: bool) -> FileOptions {
    FileOptions::new()
        .direct_io(direct_io)
        .io_engine(IoEngine::IoUring)
}

/// Fills a page's payload with a pattern of `seed` and sets its lsn to `seed`.
fn fill(page: &mut Page, seed: u64) {
    for (i, b) in page.payload_mut().iter_mut().enumerate() {
        *b = (seed as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    page.set_lsn(seed);
}

fn assert_filled(page: &Page, seed: u64, no: PageNo) {
    let mut expected = Page::zeroed();
    fill(&mut expected, seed);
    assert_eq!(page.lsn(), seed, "lsn of page {no}");
    assert!(page.payload() == expected.payload(), "payload of page {no}");
}

/// Writes `seeds[i]` to `nos[i]` in one batch.
fn write_batch(store: &dyn PageStore, nos: &[PageNo], seeds: &[u64]) -> io::Result<()> {
    let mut pages: Vec<Box<Page>> = seeds
        .iter()
        .map(|&s| {
            let mut p = Page::boxed();
            fill(&mut p, s);
            p
        })
        .collect();
    let mut reqs: Vec<(PageNo, &mut Page)> = nos
        .iter()
        .copied()
        .zip(pages.iter_mut().map(|p| &mut **p))
        .collect();
    store.write_pages(&mut reqs)
}

/// Reads `nos` in one batch.
fn read_batch(store: &dyn PageStore, nos: &[PageNo]) -> io::Result<Vec<Box<Page>>> {
    let mut pages: Vec<Box<Page>> = nos.iter().map(|_| Page::boxed()).collect();
    let mut reqs: Vec<(PageNo, &mut Page)> = nos
        .iter()
        .copied()
        .zip(pages.iter_mut().map(|p| &mut **p))
        .collect();
    store.read_pages(&mut reqs)?;
    Ok(pages)
}

/// A synced store at `path` with `n` pages, page `i` holding seed `i`.
fn populated(path: &Path, n: u64) -> Vec<PageNo> {
    let store = FileStore::open(path, uring(true)).unwrap();
    assert!(store.direct_io_active());
    let nos: Vec<PageNo> = (0..n).map(|_| store.allocate().unwrap()).collect();
    let seeds: Vec<u64> = (0..n).collect();
    write_batch(&store, &nos, &seeds).unwrap();
    store.sync().unwrap();
    nos
}

#[test]
fn batches_larger_than_the_ring_round_trip() {
    let dir = scratch_dir();
    let path = dir.path().join("big.bfdb");
    let nos = populated(&path, 300);
    let store = FileStore::open(&path, uring(true).create(false)).unwrap();
    let pages = read_batch(&store, &nos).unwrap();
    for (i, (no, page)) in nos.iter().zip(&pages).enumerate() {
        assert_filled(page, i as u64, *no);
    }
    // Single-page reads see the same bytes.
    let mut page = Page::boxed();
    store.read_page(nos[123], &mut page).unwrap();
    assert_filled(&page, 123, nos[123]);
}

#[test]
fn read_only_descriptor_fails_writes_and_keeps_reads() {
    let dir = scratch_dir();
    let path = dir.path().join("ro.bfdb");
    let nos = populated(&path, 20);
    let ro = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let store = FileStore::from_file(ro, uring(true).create(false)).unwrap();
    assert_eq!(store.io_engine(), IoEngine::IoUring);
    assert!(store.direct_io_active());

    let mut page = Page::boxed();
    fill(&mut page, 99);
    let err = store.write_page(nos[0], &mut page).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{err}");
    assert!(store.is_poisoned());
    let err = write_batch(&store, &nos[1..5], &[1, 2, 3, 4]).unwrap_err();
    let err = bfdb::Error::from(err);
    assert!(
        matches!(&err, Error::Poisoned { .. }) && err.to_string().contains("refused"),
        "a poisoned store refuses batches too: {err}"
    );
    // Reads, single and batched, still work and see the old bytes.
    store.read_page(nos[0], &mut page).unwrap();
    assert_filled(&page, 0, nos[0]);
    for (i, page) in read_batch(&store, &nos).unwrap().iter().enumerate() {
        assert_filled(page, i as u64, nos[i]);
    }
}

#[test]
fn a_corrupt_page_in_a_batch_is_reported_and_the_others_read() {
    let dir = scratch_dir();
    let path = dir.path().join("bad.bfdb");
    let nos = populated(&path, 40);
    // Flip one payload byte of page 17 behind the store's back.
    {
        use std::os::unix::fs::FileExt;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let at = nos[17].0 * PAGE_SIZE as u64 + 100;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
        f.sync_all().unwrap();
    }
    let store = FileStore::open(&path, uring(true).create(false)).unwrap();
    let err = read_batch(&store, &nos).unwrap_err();
    match bfdb::Error::from(err) {
        bfdb::Error::Corrupted { page, reason } => {
            assert_eq!(page, nos[17].0);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupted, got {other}"),
    }
    let mut page = Page::boxed();
    assert!(store.read_page(nos[17], &mut page).is_err());
    // The store is not poisoned by a bad read; the neighbours read fine.
    assert!(!store.is_poisoned());
    let good: Vec<PageNo> = nos.iter().copied().filter(|&n| n != nos[17]).collect();
    assert_eq!(read_batch(&store, &good).unwrap().len(), 39);
}

#[test]
fn truncated_file_reads_are_errors_not_panics() {
    let dir = scratch_dir();
    let path = dir.path().join("trunc.bfdb");
    let nos = populated(&path, 10);
    let store = FileStore::open(&path, uring(true).create(false)).unwrap();
    // Cut the file in the middle of page 5 while the store is open.
    let cut = nos[5].0 * PAGE_SIZE as u64 + 1024;
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let mut page = Page::boxed();
    let err = store.read_page(nos[7], &mut page).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    // The page cut in half reads short; O_DIRECT then fails or reads zeros: an error
    // either way, never half a page handed out as valid.
    assert!(store.read_page(nos[5], &mut page).is_err());
    let err = read_batch(&store, &nos).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData
        ),
        "{err}"
    );
    store.read_page(nos[4], &mut page).unwrap();
    assert_filled(&page, 4, nos[4]);
}

#[test]
fn unallocated_page_in_a_batch_is_invalid_input_before_any_io() {
    let dir = scratch_dir();
    let path = dir.path().join("alloc.bfdb");
    let store = FileStore::open(&path, uring(true)).unwrap();
    let a = store.allocate().unwrap();
    let err = write_batch(&store, &[a, PageNo(1000)], &[1, 2]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(!store.is_poisoned());
    let err = read_batch(&store, &[PageNo(0)]).unwrap_err();
    assert_eq!(
        err.kind(),
        io::ErrorKind::InvalidInput,
        "superblocks are not data"
    );
}

#[test]
fn sqpoll_mode_round_trips() {
    let dir = scratch_dir();
    let path = dir.path().join("sqpoll.bfdb");
    let store = FileStore::open(&path, uring(true).sqpoll(true)).unwrap();
    let nos: Vec<PageNo> = (0..50).map(|_| store.allocate().unwrap()).collect();
    let seeds: Vec<u64> = (100..150).collect();
    write_batch(&store, &nos, &seeds).unwrap();
    for (page, (&no, &seed)) in read_batch(&store, &nos)
        .unwrap()
        .iter()
        .zip(nos.iter().zip(&seeds))
    {
        assert_filled(page, seed, no);
    }
}

/// 48 threads on 2 cores, each with its own ring, writing and reading their own pages
/// in batches and singly, with syncs in between.
#[test]
fn many_more_threads_than_a_ring_pool_would_have() {
    const THREADS: u64 = 48;
    const PAGES: usize = 12;
    const ROUNDS: u64 = 6;
    let dir = scratch_dir();
    let path = dir.path().join("threads.bfdb");
    let store = Arc::new(FileStore::open(&path, uring(true)).unwrap());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let nos: Vec<PageNo> = (0..PAGES).map(|_| store.allocate().unwrap()).collect();
                let mut seeds = vec![0u64; PAGES];
                for round in 0..ROUNDS {
                    for (i, s) in seeds.iter_mut().enumerate() {
                        *s = (t << 32) | (round << 16) | i as u64;
                    }
                    if round % 2 == 0 {
                        write_batch(&*store, &nos, &seeds).unwrap();
                    } else {
                        for (no, s) in nos.iter().zip(&seeds) {
                            write_batch(&*store, &[*no], &[*s]).unwrap();
                        }
                    }
                    for (i, page) in read_batch(&*store, &nos).unwrap().iter().enumerate() {
                        assert_filled(page, seeds[i], nos[i]);
                    }
                    if round == ROUNDS / 2 && t % 8 == 0 {
                        store.sync().unwrap();
                    }
                }
                (nos, seeds)
            })
        })
        .collect();
    let owned: Vec<(Vec<PageNo>, Vec<u64>)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    store.sync().unwrap();
    drop(store);
    // Everything is there after a reopen, read on this thread's ring.
    let store = FileStore::open(&path, uring(true).create(false)).unwrap();
    assert_eq!(store.stats().live_pages, THREADS * PAGES as u64);
    for (nos, seeds) in &owned {
        for (page, (no, s)) in read_batch(&store, nos)
            .unwrap()
            .iter()
            .zip(nos.iter().zip(seeds))
        {
            assert_filled(page, *s, *no);
        }
    }
}

// ---------------------------------------------------------------------------------
// Backend choice
// ---------------------------------------------------------------------------------

fn tree_config(backend: Backend) -> Config {
    Config {
        backend,
        huge_pages: false,
        ..fault_config()
    }
}

/// Resets this thread's test hooks when dropped, also when an assertion fails.
struct Hooks;

impl Hooks {
    fn set(io_uring_disabled: bool, o_direct_refused: bool) -> Hooks {
        bfdb::storage::uring::simulate_io_uring_disabled_for_test(io_uring_disabled);
        bfdb::storage::simulate_o_direct_refused_for_test(o_direct_refused);
        Hooks
    }
}

impl Drop for Hooks {
    fn drop(&mut self) {
        bfdb::storage::uring::simulate_io_uring_disabled_for_test(false);
        bfdb::storage::simulate_o_direct_refused_for_test(false);
    }
}

#[test]
fn auto_is_the_default_and_picks_io_uring_with_o_direct_here() {
    assert_eq!(Config::default().backend, Backend::Auto);
    let dir = scratch_dir();
    let tree = Tree::open(dir.path().join("auto.bfdb"), tree_config(Backend::Auto)).unwrap();
    let stats = tree.stats();
    assert_eq!(stats.backend, "io_uring");
    assert!(stats.direct_io);
    assert_eq!(stats.backend_notice, None);
    for (backend, name, direct) in [
        (Backend::Std, "std", false),
        (Backend::StdDirect, "std_direct", true),
        (Backend::IoUring, "io_uring", true),
    ] {
        let path = dir.path().join(format!("{backend:?}.bfdb"));
        let stats = Tree::open(&path, tree_config(backend)).unwrap().stats();
        assert_eq!(
            (stats.backend, stats.direct_io),
            (name, direct),
            "{backend:?}"
        );
        assert_eq!(stats.backend_notice, None, "{backend:?}");
    }
    assert_eq!(
        Tree::in_memory(tree_config(Backend::IoUring))
            .unwrap()
            .stats()
            .backend,
        "memory"
    );
}

#[test]
fn refused_io_uring_is_an_error_when_asked_for_and_a_notice_under_auto() {
    let dir = scratch_dir();
    let _hooks = Hooks::set(true, false);
    match Tree::open(
        dir.path().join("explicit.bfdb"),
        tree_config(Backend::IoUring),
    ) {
        Err(Error::Unsupported(why)) => assert!(why.contains("io_uring"), "{why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let tree = Tree::open(dir.path().join("auto.bfdb"), tree_config(Backend::Auto)).unwrap();
    let stats = tree.stats();
    assert_eq!(stats.backend, "std_direct");
    assert!(stats.direct_io, "the fallback keeps O_DIRECT");
    let notice = stats.backend_notice.expect("a fallback notice");
    assert!(notice.contains("io_uring is not available"), "{notice}");
    // The fallback tree works.
    tree.insert(b"k", b"v").unwrap();
    assert_eq!(tree.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn refused_o_direct_falls_back_to_buffered_io_with_a_notice() {
    let dir = scratch_dir();
    let _hooks = Hooks::set(false, true);
    for backend in [Backend::Auto, Backend::IoUring, Backend::StdDirect] {
        let path = dir.path().join(format!("{backend:?}.bfdb"));
        let stats = Tree::open(&path, tree_config(backend)).unwrap().stats();
        assert!(!stats.direct_io, "{backend:?}");
        let notice = stats.backend_notice.expect("a fallback notice");
        assert!(notice.contains("refuses O_DIRECT"), "{backend:?}: {notice}");
    }
    // Buffered IO does not need O_DIRECT, so nothing to report.
    let stats = Tree::open(dir.path().join("std.bfdb"), tree_config(Backend::Std))
        .unwrap()
        .stats();
    assert_eq!(stats.backend_notice, None);
}

/// /dev/shm is tmpfs. Kernels before 6.6 refuse `O_DIRECT` there, newer ones accept it:
/// either way the tree opens, works, and reports what it does.
#[test]
fn tmpfs_opens_with_or_without_o_direct_and_says_which() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm here; skipping");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let path = dir.path().join("tmpfs.bfdb");
    let o_direct_works = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(dir.path().join("probe"))
        .is_ok();
    let tree = Tree::open(&path, tree_config(Backend::Auto)).unwrap();
    for i in 0..2000u32 {
        tree.insert(format!("k{i:06}").as_bytes(), &i.to_le_bytes())
            .unwrap();
    }
    for i in (0..2000u32).step_by(7) {
        let got = tree.get(format!("k{i:06}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(&i.to_le_bytes()[..]));
    }
    let stats = tree.stats();
    eprintln!("tmpfs: O_DIRECT accepted: {o_direct_works}; {stats:?}");
    assert_eq!(stats.backend, "io_uring");
    assert_eq!(stats.direct_io, o_direct_works);
    assert_eq!(stats.backend_notice.is_some(), !o_direct_works);
}

// ---------------------------------------------------------------------------------
// Trees on the io_uring engine
// ---------------------------------------------------------------------------------

/// Every answer is the model's.
fn check_reads(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (k, v) in model {
        let got = tree.get(k).unwrap_or_else(|e| panic!("get {k:?}: {e}"));
        assert_eq!(got.as_ref(), Some(v), "wrong answer for {k:?}");
    }
}

/// The store's descriptor is swapped for a read-only one under a running tree: every
/// write from then on fails with `EBADF` in the kernel, reads keep working.
#[test]
fn tree_whose_io_uring_store_fails_writes_stays_readable() {
    let dir = scratch_dir();
    let path = dir.path().join("ro-tree.bfdb");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let fd = file.as_raw_fd();
    let store = FileStore::from_file(file, uring(true)).unwrap();
    let tree = Tree::with_page_store(tree_config(Backend::IoUring), store).unwrap();
    let mut model = load_scattered(&tree);
    tree.flush().unwrap();
    let before = tree.stats();
    assert!(before.leaf_writes > 0 && before.evictions > 0, "{before:?}");

    let ro = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    // SAFETY: both descriptors are open and owned by this test; `dup2` makes `fd` (owned
    // by the store) refer to the read-only open file, and `ro` stays the owner of its
    // own descriptor number.
    let r = unsafe { libc::dup2(ro.as_raw_fd(), fd) };
    assert_eq!(r, fd, "dup2: {}", io::Error::last_os_error());
    drop(ro);

    insert_until_refused(&tree, &mut model, "the descriptor is read-only");
    // Every acknowledged write reads back: from leaf pages through the read-only
    // descriptor, or from dirty mini-pages that stayed in memory.
    check_reads(&tree, &model);
    assert!(tree.stats().leaf_reads > before.leaf_reads);
    // Dropping the tree tries to flush; the failure has nowhere to go and must not
    // panic.
    drop(tree);
}

/// 40 threads on 2 cores share one tree on the io_uring engine: each inserts its own
/// keys, reads them back and reads other threads' finished keys, all while the tiny
/// pool evicts constantly.
#[test]
fn tree_on_io_uring_with_many_threads() {
    const THREADS: u32 = 40;
    const KEYS: u32 = 300;
    let dir = scratch_dir();
    let config = Config {
        max_value_bytes: 200,
        ..tree_config(Backend::IoUring)
    };
    let tree = Tree::open(dir.path().join("threads.bfdb"), config).unwrap();
    assert_eq!(tree.stats().backend, "io_uring");
    let value = |t: u32, i: u32, round: u32| {
        let mut v = format!("t{t}-i{i}-r{round}-").into_bytes();
        v.resize(40 + (i % 150) as usize, b'x');
        v
    };
    let tkey = |t: u32, i: u32| format!("t{t:03}/{:08}", i.wrapping_mul(7919)).into_bytes();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let tree = &tree;
            s.spawn(move || {
                for round in 0..2 {
                    for i in 0..KEYS {
                        tree.insert(&tkey(t, i), &value(t, i, round)).unwrap();
                    }
                    for i in (0..KEYS).rev() {
                        let got = tree.get(&tkey(t, i)).unwrap();
                        assert_eq!(got, Some(value(t, i, round)), "t{t} i{i} r{round}");
                    }
                }
                // Other threads' keys are either absent or one of their values.
                let other = (t + 1) % THREADS;
                for i in (0..KEYS).step_by(13) {
                    if let Some(v) = tree.get(&tkey(other, i)).unwrap() {
                        assert!(v == value(other, i, 0) || v == value(other, i, 1));
                    }
                }
            });
        }
    });
    let stats = tree.stats();
    assert!(stats.evictions > 0 && stats.leaf_reads > 0, "{stats:?}");
    for t in 0..THREADS {
        for i in 0..KEYS {
            assert_eq!(tree.get(&tkey(t, i)).unwrap(), Some(value(t, i, 1)));
        }
    }
    let n = tree.range::<&[u8], _>(..).count();
    assert_eq!(n, (THREADS * KEYS) as usize);
}
