//! Tests of the storage layer through its public API: model-based random operation
//! sequences (on the memory store and on file stores with each IO engine), corruption and truncation of files on disk, concurrency, poisoning, and
//! bounded file growth under churn.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bfdb::storage::{
    FileOptions, FileStore, IncompatibleFile, IoEngine, MemoryStore, PAGE_PAYLOAD_SIZE, PAGE_SIZE,
    Page, PageNo, PageStore, PathIoError, SimStore, StorePoisoned, SyncCrashPoint,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

/// A small deterministic generator for test data; seeds are printed so failures
/// replay.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A seed from the clock, printed, or the one in `BFDB_TEST_SEED` to replay.
fn test_seed(name: &str) -> u64 {
    let seed = std::env::var("BFDB_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{name}: seed {seed} (replay with BFDB_TEST_SEED={seed})");
    seed
}

/// Fills a page's payload with bytes derived from `seed` and sets its lsn to `seed`.
fn fill(page: &mut Page, seed: u64) {
    let mut rng = SplitMix(seed);
    for chunk in page.payload_mut().chunks_mut(8) {
        let word = rng.next().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    page.set_lsn(seed);
}

/// Asserts that `page` holds what `fill(_, seed)` wrote.
fn assert_filled(page: &Page, seed: u64, no: PageNo) {
    let mut expected = Page::zeroed();
    fill(&mut expected, seed);
    assert_eq!(page.lsn(), seed, "lsn of page {no}");
    assert!(
        page.payload() == expected.payload(),
        "payload of page {no} differs from seed {seed}"
    );
}

fn write_seeded(store: &dyn PageStore, no: PageNo, seed: u64) {
    let mut page = Page::boxed();
    fill(&mut page, seed);
    store.write_page(no, &mut page).expect("write");
}

fn read_back(store: &dyn PageStore, no: PageNo) -> io::Result<Box<Page>> {
    let mut page = Page::boxed();
    store.read_page(no, &mut page)?;
    Ok(page)
}

/// A scratch directory on the work disk, which supports `O_DIRECT` (the default temp
/// directory may be tmpfs).
fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir")
}

fn options(direct_io: bool) -> FileOptions {
    FileOptions::new().direct_io(direct_io)
}

fn open_existing(path: &Path) -> io::Result<FileStore> {
    FileStore::open(path, FileOptions::new().create(false))
}

fn to_bfdb(e: io::Error) -> bfdb::Error {
    bfdb::Error::from(e)
}

fn assert_invalid_input<T: std::fmt::Debug>(r: io::Result<T>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}"),
        Ok(v) => panic!("{what}: expected InvalidInput, got Ok({v:?})"),
    }
}

fn is_poisoned_error(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<StorePoisoned>())
}

/// Flips one byte of the file at `offset`.
fn flip_byte(path: &Path, offset: u64) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    file.write_all_at(&b, offset).unwrap();
}

// ---------------------------------------------------------------------------------
// Model-based tests
// ---------------------------------------------------------------------------------

/// What the model knows about the bytes in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Content {
    /// `fill(_, seed)` was the last write to the slot.
    Written(u64),
    /// Not written in this allocation, or overwritten in ways the model does not track:
    /// reading it may fail or return old bytes, but must not panic.
    Unknown,
}

#[derive(Clone, Debug)]
enum Op {
    Allocate,
    /// Allocates this many pages without writing them (to need many free-list pages).
    AllocateMany(u16),
    Free(usize),
    /// Frees this percentage of the live pages.
    FreeMany(u8),
    Write(usize, u64),
    Read(usize),
    /// Writes up to this many consecutive live pages in one `write_pages` batch.
    WriteMany(usize, u8, u64),
    /// Reads up to this many written pages in one `read_pages` batch.
    ReadMany(usize, u8),
    /// Reads, writes and frees a page number that may not be allocated.
    Bogus(u64),
    Sync,
    Reopen,
    /// Simulates a crash in the middle of a sync (file stores), then reopens.
    CrashInSync(u8),
}

fn op_strategy(bulk: bool) -> impl Strategy<Value = Op> {
    let mut ops: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (6, Just(Op::Allocate).boxed()),
        (3, any::<usize>().prop_map(Op::Free).boxed()),
        (
            6,
            (any::<usize>(), any::<u64>())
                .prop_map(|(i, s)| Op::Write(i, s))
                .boxed(),
        ),
        (4, any::<usize>().prop_map(Op::Read).boxed()),
        (
            2,
            (any::<usize>(), 1u8..40, any::<u64>())
                .prop_map(|(i, n, s)| Op::WriteMany(i, n, s))
                .boxed(),
        ),
        (
            2,
            (any::<usize>(), 1u8..40)
                .prop_map(|(i, n)| Op::ReadMany(i, n))
                .boxed(),
        ),
        (2, (0u64..3000).prop_map(Op::Bogus).boxed()),
        (2, Just(Op::Sync).boxed()),
        (1, Just(Op::Reopen).boxed()),
        (1, (0u8..3).prop_map(Op::CrashInSync).boxed()),
    ];
    // proptest refuses options of weight 0, so bulk operations are left out entirely
    // when not wanted.
    if bulk {
        ops.push((2, (300u16..700).prop_map(Op::AllocateMany).boxed()));
        ops.push((2, (30u8..95).prop_map(Op::FreeMany).boxed()));
    }
    prop::strategy::Union::new_weighted(ops)
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    File { direct_io: bool, engine: IoEngine },
}

/// The store under test, typed so that test hooks are reachable.
enum AnyStore {
    Memory(MemoryStore),
    File(FileStore),
}

/// A store under test plus what is needed to reopen it.
struct Harness {
    backend: Backend,
    _dir: Option<tempfile::TempDir>,
    path: Option<PathBuf>,
    store: Option<AnyStore>,
}

impl Harness {
    fn new(backend: Backend) -> Harness {
        match backend {
            Backend::Memory => Harness {
                backend,
                _dir: None,
                path: None,
                store: Some(AnyStore::Memory(MemoryStore::new())),
            },
            Backend::File { direct_io, engine } => {
                let dir = scratch_dir();
                let path = dir.path().join("store.bfdb");
                let store =
                    FileStore::open(&path, options(direct_io).io_engine(engine)).expect("create");
                assert_eq!(store.io_engine(), engine);
                if direct_io {
                    assert!(store.direct_io_active(), "the work disk supports O_DIRECT");
                }
                Harness {
                    backend,
                    _dir: Some(dir),
                    path: Some(path),
                    store: Some(AnyStore::File(store)),
                }
            }
        }
    }

    fn store(&self) -> &dyn PageStore {
        match self.store.as_ref().expect("open") {
            AnyStore::Memory(s) => s,
            AnyStore::File(s) => s,
        }
    }

    /// Runs a sync that stops at `point` as if the process crashed there, then
    /// reopens. Returns `Some(true)` if it crashed, `Some(false)` if the sync had no
    /// allocation state to write and completed, `None` for backends without crashes.
    fn crash_in_sync(&mut self, point: SyncCrashPoint) -> Option<bool> {
        let Some(AnyStore::File(store)) = self.store.as_ref() else {
            return None;
        };
        store.set_sync_crash_point_for_test(point);
        if store.sync().is_ok() {
            // Only the data was flushed; the protocol with its crash points did not run.
            store.set_sync_crash_point_for_test(SyncCrashPoint::None);
            return Some(false);
        }
        assert!(store.is_poisoned());
        self.reopen();
        Some(true)
    }

    fn reopen(&mut self) {
        let Backend::File { direct_io, engine } = self.backend else {
            return;
        };
        drop(self.store.take());
        let path = self.path.as_ref().expect("file backend has a path");
        let options = options(direct_io).io_engine(engine).create(false);
        let store = FileStore::open(path, options).expect("reopen");
        self.store = Some(AnyStore::File(store));
    }
}

/// The reference model: which pages are allocated and what they hold.
#[derive(Default)]
struct Model {
    allocated: BTreeMap<PageNo, Content>,
    /// The pages allocated at the last sync (the durable allocation state).
    synced: BTreeSet<PageNo>,
    /// The last bytes of pages freed since the last sync. Such slots are never reused
    /// for a free-list page before the next sync, so their bytes are still there.
    freed_since_sync: HashMap<PageNo, Content>,
}

impl Model {
    fn nth(&self, i: usize) -> Option<PageNo> {
        if self.allocated.is_empty() {
            return None;
        }
        self.allocated.keys().nth(i % self.allocated.len()).copied()
    }

    fn free(&mut self, no: PageNo) {
        let content = self
            .allocated
            .remove(&no)
            .expect("model frees allocated pages");
        self.freed_since_sync.insert(no, content);
    }

    /// The state a reopen must show: the allocation state of the last sync, with the
    /// bytes last written to each slot (dropping a store is not a crash).
    fn reopen(&mut self) {
        let mut allocated = BTreeMap::new();
        for &no in &self.synced {
            let content = match self.allocated.get(&no) {
                Some(Content::Written(seed)) => Content::Written(*seed),
                _ => self
                    .freed_since_sync
                    .get(&no)
                    .copied()
                    .unwrap_or(Content::Unknown),
            };
            allocated.insert(no, content);
        }
        self.allocated = allocated;
        self.freed_since_sync.clear();
    }
}

fn check_allocate(h: &Harness, model: &mut Model, write_seed: Option<u64>) {
    let store = h.store();
    let before = store.stats();
    let size_before = store.size_bytes();
    let no = store.allocate().expect("allocate");
    assert!(
        !model.allocated.contains_key(&no),
        "allocate handed out {no:?}, which is already allocated"
    );
    let after = store.stats();
    assert_eq!(after.live_pages, before.live_pages + 1);
    if before.free_pages > 0 {
        // A free slot was available, so it must have been reused rather than the store
        // growing.
        assert_eq!(
            after.free_pages,
            before.free_pages - 1,
            "free slot not reused"
        );
        if matches!(h.backend, Backend::File { .. }) {
            assert_eq!(
                store.size_bytes(),
                size_before,
                "file grew despite free slots"
            );
        }
    }
    // A reused slot that was freed since the last sync still holds its old bytes.
    let content = model
        .freed_since_sync
        .get(&no)
        .copied()
        .unwrap_or(Content::Unknown);
    let content = match h.backend {
        Backend::Memory => Content::Unknown,
        Backend::File { .. } => content,
    };
    model.allocated.insert(no, content);
    if let Some(seed) = write_seed {
        write_seeded(store, no, seed);
        model.allocated.insert(no, Content::Written(seed));
    }
}

fn check_read(h: &Harness, model: &Model, no: PageNo) {
    let result = read_back(h.store(), no);
    match model.allocated.get(&no) {
        Some(Content::Written(seed)) => {
            let page = result.unwrap_or_else(|e| panic!("read of written page {no:?}: {e}"));
            assert_filled(&page, *seed, no);
        }
        Some(Content::Unknown) => {
            if matches!(h.backend, Backend::Memory) {
                assert_invalid_input(result.map(|_| ()), "memory read before first write");
            }
        }
        None => assert_invalid_input(result.map(|_| ()), "read of unallocated page"),
    }
}

fn check_everything(h: &Harness, model: &Model) {
    let stats = h.store().stats();
    assert_eq!(stats.live_pages, model.allocated.len() as u64, "{stats:?}");
    for &no in model.allocated.keys() {
        check_read(h, model, no);
    }
}

fn run_model(backend: Backend, ops: Vec<Op>) {
    let mut h = Harness::new(backend);
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Allocate => check_allocate(&h, &mut model, None),
            Op::AllocateMany(n) => {
                for _ in 0..n {
                    check_allocate(&h, &mut model, None);
                }
            }
            Op::Free(i) => {
                if let Some(no) = model.nth(i) {
                    h.store().free(no).expect("free");
                    model.free(no);
                    assert_invalid_input(h.store().free(no), "double free");
                }
            }
            Op::FreeMany(percent) => {
                let victims: Vec<PageNo> = model
                    .allocated
                    .keys()
                    .copied()
                    .enumerate()
                    .filter(|(i, _)| (i * 37 % 100) < usize::from(percent))
                    .map(|(_, no)| no)
                    .collect();
                for no in victims {
                    h.store().free(no).expect("free");
                    model.free(no);
                }
            }
            Op::Write(i, seed) => {
                if let Some(no) = model.nth(i) {
                    write_seeded(h.store(), no, seed);
                    model.allocated.insert(no, Content::Written(seed));
                }
            }
            Op::Read(i) => {
                if let Some(no) = model.nth(i) {
                    check_read(&h, &model, no);
                }
            }
            Op::WriteMany(i, n, seed) => {
                // Distinct pages: writes of one batch are not ordered among themselves.
                let nos: Vec<PageNo> = (0..usize::from(n))
                    .filter_map(|j| model.nth(i.wrapping_add(j)))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let mut pages: Vec<Box<Page>> = nos.iter().map(|_| Page::boxed()).collect();
                for (j, page) in pages.iter_mut().enumerate() {
                    fill(page, seed.wrapping_add(j as u64));
                }
                let mut reqs: Vec<(PageNo, &mut Page)> = nos
                    .iter()
                    .copied()
                    .zip(pages.iter_mut().map(|p| &mut **p))
                    .collect();
                h.store().write_pages(&mut reqs).expect("write_pages");
                for (j, no) in nos.iter().enumerate() {
                    let content = Content::Written(seed.wrapping_add(j as u64));
                    model.allocated.insert(*no, content);
                }
            }
            Op::ReadMany(i, n) => {
                let written: Vec<(PageNo, u64)> = model
                    .allocated
                    .iter()
                    .filter_map(|(no, c)| match c {
                        Content::Written(seed) => Some((*no, *seed)),
                        Content::Unknown => None,
                    })
                    .collect();
                if !written.is_empty() {
                    let picked: Vec<(PageNo, u64)> = (0..usize::from(n))
                        .map(|j| written[i.wrapping_add(j * 7) % written.len()])
                        .collect();
                    let mut pages: Vec<Box<Page>> = picked.iter().map(|_| Page::boxed()).collect();
                    let mut reqs: Vec<(PageNo, &mut Page)> = picked
                        .iter()
                        .map(|(no, _)| *no)
                        .zip(pages.iter_mut().map(|p| &mut **p))
                        .collect();
                    h.store().read_pages(&mut reqs).expect("read_pages");
                    for ((no, seed), page) in picked.iter().zip(&pages) {
                        assert_filled(page, *seed, *no);
                    }
                }
            }
            Op::Bogus(n) => {
                let no = PageNo(n);
                if !model.allocated.contains_key(&no) {
                    let mut page = Page::boxed();
                    assert_invalid_input(h.store().read_page(no, &mut page), "bogus read");
                    assert_invalid_input(h.store().write_page(no, &mut page), "bogus write");
                    assert_invalid_input(h.store().free(no), "bogus free");
                }
            }
            Op::Sync => {
                h.store().sync().expect("sync");
                model.synced = model.allocated.keys().copied().collect();
                model.freed_since_sync.clear();
            }
            Op::Reopen => {
                if matches!(backend, Backend::File { .. }) {
                    h.reopen();
                    model.reopen();
                    check_everything(&h, &model);
                }
            }
            Op::CrashInSync(point) => {
                let point = match point {
                    0 => SyncCrashPoint::AfterFreeList,
                    1 => SyncCrashPoint::BeforeSuperblock,
                    _ => SyncCrashPoint::TornSuperblock,
                };
                match h.crash_in_sync(point) {
                    // The durable state is that of the last completed sync, with every
                    // page it calls allocated holding its last written bytes.
                    Some(true) => {
                        model.reopen();
                        check_everything(&h, &model);
                    }
                    Some(false) => {
                        model.synced = model.allocated.keys().copied().collect();
                        model.freed_since_sync.clear();
                    }
                    None => {}
                }
            }
        }
        assert_eq!(h.store().stats().live_pages, model.allocated.len() as u64);
    }
    check_everything(&h, &model);
    // Finally: everything synced survives a reopen.
    if matches!(backend, Backend::File { .. }) {
        h.store().sync().expect("final sync");
        model.synced = model.allocated.keys().copied().collect();
        model.freed_since_sync.clear();
        h.reopen();
        model.reopen();
        check_everything(&h, &model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn model_memory(ops in prop::collection::vec(op_strategy(true), 1..120)) {
        run_model(Backend::Memory, ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn model_file_buffered(ops in prop::collection::vec(op_strategy(false), 1..100)) {
        run_model(Backend::File { direct_io: false, engine: IoEngine::Pread }, ops);
    }

    #[test]
    fn model_file_direct(ops in prop::collection::vec(op_strategy(false), 1..100)) {
        run_model(Backend::File { direct_io: true, engine: IoEngine::Pread }, ops);
    }

    #[test]
    fn model_file_uring_buffered(ops in prop::collection::vec(op_strategy(false), 1..100)) {
        run_model(Backend::File { direct_io: false, engine: IoEngine::IoUring }, ops);
    }

    #[test]
    fn model_file_uring_direct(ops in prop::collection::vec(op_strategy(false), 1..100)) {
        run_model(Backend::File { direct_io: true, engine: IoEngine::IoUring }, ops);
    }
}

proptest! {
    // Bulk mode: hundreds of pages allocated and freed at once, so the persisted free
    // list spans several free-list pages.
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn model_file_bulk_buffered(ops in prop::collection::vec(op_strategy(true), 1..40)) {
        run_model(Backend::File { direct_io: false, engine: IoEngine::Pread }, ops);
    }

    #[test]
    fn model_file_bulk_direct(ops in prop::collection::vec(op_strategy(true), 1..40)) {
        run_model(Backend::File { direct_io: true, engine: IoEngine::Pread }, ops);
    }

    #[test]
    fn model_file_bulk_uring_direct(ops in prop::collection::vec(op_strategy(true), 1..40)) {
        run_model(Backend::File { direct_io: true, engine: IoEngine::IoUring }, ops);
    }
}

// ---------------------------------------------------------------------------------
// Free list across reopen
// ---------------------------------------------------------------------------------

#[test]
fn free_list_of_many_pages_survives_reopen_and_is_reused() {
    for direct_io in [false, true] {
        let dir = scratch_dir();
        let path = dir.path().join("free.bfdb");
        let store = FileStore::open(&path, options(direct_io)).unwrap();
        let pages: Vec<PageNo> = (0..1500).map(|_| store.allocate().unwrap()).collect();
        for (i, &no) in pages.iter().enumerate() {
            if i % 5 == 0 {
                write_seeded(&store, no, i as u64);
            }
        }
        store.sync().unwrap();
        // Free 1200 pages: the persisted list needs three free-list pages of 508.
        let freed: BTreeSet<PageNo> = pages.iter().copied().skip(300).collect();
        for &no in &freed {
            store.free(no).unwrap();
        }
        store.sync().unwrap();
        let stats = store.stats();
        assert_eq!(stats.live_pages, 300);
        assert_eq!(stats.free_pages, 1200);
        assert_eq!(stats.free_list_pages, 3);
        drop(store);

        let store = FileStore::open(&path, options(direct_io).create(false)).unwrap();
        let stats = store.stats();
        assert_eq!(stats.live_pages, 300);
        assert_eq!(stats.free_pages, 1200);
        assert_eq!(stats.free_list_pages, 3);
        for (i, &no) in pages.iter().enumerate().take(300) {
            if i % 5 == 0 {
                assert_filled(&read_back(&store, no).unwrap(), i as u64, no);
            }
        }
        let size = store.size_bytes();
        let again: BTreeSet<PageNo> = (0..1200).map(|_| store.allocate().unwrap()).collect();
        assert_eq!(again, freed, "exactly the freed slots are handed out again");
        assert_eq!(
            store.size_bytes(),
            size,
            "reusing free slots does not grow the file"
        );
        // The free-list pages are withheld until the next sync replaces the list.
        let fresh = store.allocate().unwrap();
        assert_eq!(
            fresh.0 * PAGE_SIZE as u64,
            size,
            "next slot comes from the end"
        );
        store.sync().unwrap();
        drop(store);
        let store = open_existing(&path).unwrap();
        assert_eq!(store.stats().live_pages, 1501);
    }
}

#[test]
fn pages_allocated_after_the_last_sync_are_free_after_reopen() {
    let dir = scratch_dir();
    let path = dir.path().join("late.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let a = store.allocate().unwrap();
    write_seeded(&store, a, 1);
    store.sync().unwrap();
    let b = store.allocate().unwrap();
    let c = store.allocate().unwrap();
    write_seeded(&store, b, 2);
    write_seeded(&store, c, 3);
    drop(store);
    let store = open_existing(&path).unwrap();
    let stats = store.stats();
    assert_eq!(stats.live_pages, 1);
    assert_eq!(stats.free_pages, 2);
    assert_invalid_input(read_back(&store, b).map(|_| ()), "unsynced allocation");
    assert_filled(&read_back(&store, a).unwrap(), 1, a);
    let reused: BTreeSet<PageNo> = [store.allocate().unwrap(), store.allocate().unwrap()].into();
    assert_eq!(reused, BTreeSet::from([b, c]));
}

/// Growing the file reserves disk blocks ahead of its end (so direct writes to new slots
/// need not allocate them) without changing its length: a new slot is still the one at
/// the end, the length covers exactly the slots handed out, and a reopen sees no more.
#[test]
fn growth_reserves_blocks_past_the_end_without_changing_the_length() {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch_dir();
    let path = dir.path().join("reserve.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let mut pages = Vec::new();
    for i in 0..40u64 {
        let size = store.size_bytes();
        let no = store.allocate().unwrap();
        assert_eq!(
            no.0 * PAGE_SIZE as u64,
            size,
            "a new slot is the one at the end"
        );
        assert_eq!(store.size_bytes(), size + PAGE_SIZE as u64);
        write_seeded(&store, no, i);
        pages.push(no);
    }
    let meta = std::fs::metadata(&path).unwrap();
    // Where the filesystem reserves (ext4, xfs, tmpfs do), the first growth reserved a
    // MiB past the end, which 40 slots have not used up; elsewhere the store works as
    // before, which the rest of this test checks.
    let reserved_bytes = meta.blocks() * 512;
    eprintln!(
        "length {} bytes, {} bytes of blocks",
        meta.len(),
        reserved_bytes
    );
    if reserved_bytes > meta.len() {
        assert!(
            reserved_bytes >= 1 << 20,
            "{reserved_bytes} bytes of blocks"
        );
    }
    store.sync().unwrap();
    let len = meta.len();
    drop(store);
    let store = open_existing(&path).unwrap();
    assert_eq!(store.size_bytes(), len);
    assert_eq!(store.stats().live_pages, 40);
    assert_eq!(store.stats().free_pages, 0);
    for (i, &no) in pages.iter().enumerate() {
        assert_filled(&read_back(&store, no).unwrap(), i as u64, no);
    }
    let next = store.allocate().unwrap();
    assert_eq!(next.0 * PAGE_SIZE as u64, len);
}

#[test]
fn allocated_but_unwritten_page_is_an_error_not_a_panic() {
    let dir = scratch_dir();
    let path = dir.path().join("unwritten.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let a = store.allocate().unwrap();
    let err = read_back(&store, a).unwrap_err();
    assert!(matches!(to_bfdb(err), bfdb::Error::Corrupted { .. }));
    store.sync().unwrap();
    drop(store);
    let store = open_existing(&path).unwrap();
    assert_eq!(store.stats().live_pages, 1);
    assert!(read_back(&store, a).is_err());
}

#[test]
fn second_store_on_the_same_file_is_refused() {
    let dir = scratch_dir();
    let path = dir.path().join("locked.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let err = open_existing(&path).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    drop(store);
    open_existing(&path).unwrap();
}

// ---------------------------------------------------------------------------------
// Corruption, truncation, foreign files
// ---------------------------------------------------------------------------------

/// A store file with data pages written and synced twice, so that both superblock
/// copies are valid: generation 2 (slot 0) knows page `a`, generation 3 (slot 1) also
/// knows page `b`.
fn two_generation_file(dir: &Path) -> (PathBuf, PageNo, PageNo) {
    let path = dir.join("gen.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let a = store.allocate().unwrap();
    write_seeded(&store, a, 10);
    store.sync().unwrap();
    let b = store.allocate().unwrap();
    write_seeded(&store, b, 11);
    store.sync().unwrap();
    (path, a, b)
}

#[test]
fn flipped_data_byte_reads_as_corrupted() {
    // Offsets inside the page: the checksum, the version, the lsn and the payload.
    for offset_in_page in [0u64, 2, 5, 9, 16, 2000, PAGE_SIZE as u64 - 1] {
        let dir = scratch_dir();
        let (path, a, b) = two_generation_file(dir.path());
        flip_byte(&path, b.0 * PAGE_SIZE as u64 + offset_in_page);
        let store = open_existing(&path).unwrap();
        assert_filled(&read_back(&store, a).unwrap(), 10, a);
        let err = read_back(&store, b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        match to_bfdb(err) {
            bfdb::Error::Corrupted { page, .. } => assert_eq!(page, b.0),
            other => panic!("offset {offset_in_page}: expected Corrupted, got {other:?}"),
        }
    }
}

#[test]
fn flipped_data_byte_in_memory_store_reads_as_corrupted() {
    let store = MemoryStore::new();
    let a = store.allocate().unwrap();
    write_seeded(&store, a, 5);
    assert!(store.corrupt_for_test(a, 3000));
    match to_bfdb(read_back(&store, a).unwrap_err()) {
        bfdb::Error::Corrupted { page, .. } => assert_eq!(page, a.0),
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn os_errors_of_a_store_opened_by_path_name_the_path() {
    let dir = scratch_dir();
    let path = dir.path().join("missing").join("store.bfdb");
    let err = FileStore::open(&path, options(false)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    let detail = err.get_ref().and_then(|e| e.downcast_ref::<PathIoError>());
    let detail = detail.unwrap_or_else(|| panic!("expected PathIoError, got {err:?}"));
    assert_eq!(detail.path, path);
    assert_eq!(detail.source.raw_os_error(), Some(libc::ENOENT));

    // The lock refusing a second store names the file too, and keeps its kind.
    let path = dir.path().join("store.bfdb");
    let store = FileStore::open(&path, options(false)).unwrap();
    let no = store.allocate().unwrap();
    write_seeded(&store, no, 1);
    store.sync().unwrap();
    let err = open_existing(&path).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    drop(store);

    // Typed storage errors keep their type, so `bfdb::Error` still lifts them.
    flip_byte(&path, no.0 * PAGE_SIZE as u64 + 100);
    let store = open_existing(&path).unwrap();
    match to_bfdb(read_back(&store, no).unwrap_err()) {
        bfdb::Error::Corrupted { page, .. } => assert_eq!(page, no.0),
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn flipped_bit_in_sim_store_reads_as_corrupted() {
    let store = SimStore::new(3);
    let a = store.allocate().unwrap();
    write_seeded(&store, a, 9);
    assert!(store.flip_bit(a, 8 * 1000 + 3));
    match to_bfdb(read_back(&store, a).unwrap_err()) {
        bfdb::Error::Corrupted { page, .. } => assert_eq!(page, a.0),
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn one_damaged_superblock_copy_falls_back_to_the_other() {
    // Damage the newer copy (slot 1, generation 3): the file opens at generation 2,
    // where page `b` was not yet allocated.
    let dir = scratch_dir();
    let (path, a, b) = two_generation_file(dir.path());
    flip_byte(&path, PAGE_SIZE as u64 + 40);
    let store = open_existing(&path).unwrap();
    assert_eq!(store.stats().live_pages, 1);
    assert_filled(&read_back(&store, a).unwrap(), 10, a);
    assert_invalid_input(
        read_back(&store, b).map(|_| ()),
        "page of the lost generation",
    );
    // The store keeps working: the next sync overwrites the damaged copy.
    let c = store.allocate().unwrap();
    write_seeded(&store, c, 12);
    store.sync().unwrap();
    drop(store);
    let store = open_existing(&path).unwrap();
    assert_eq!(store.stats().live_pages, 2);
    assert_filled(&read_back(&store, c).unwrap(), 12, c);

    // Damage the older copy (slot 0): the newest generation still opens.
    let dir = scratch_dir();
    let (path, a, b) = two_generation_file(dir.path());
    flip_byte(&path, 100);
    let store = open_existing(&path).unwrap();
    assert_eq!(store.stats().live_pages, 2);
    assert_filled(&read_back(&store, a).unwrap(), 10, a);
    assert_filled(&read_back(&store, b).unwrap(), 11, b);
}

#[test]
fn both_superblocks_damaged_is_corrupted() {
    let dir = scratch_dir();
    let (path, _, _) = two_generation_file(dir.path());
    flip_byte(&path, 100);
    flip_byte(&path, PAGE_SIZE as u64 + 100);
    match to_bfdb(open_existing(&path).unwrap_err()) {
        bfdb::Error::Corrupted { reason, .. } => {
            assert!(reason.contains("both superblock"), "{reason}")
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn damaged_free_list_page_is_corrupted() {
    let dir = scratch_dir();
    let path = dir.path().join("fl.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let pages: Vec<PageNo> = (0..20).map(|_| store.allocate().unwrap()).collect();
    store.sync().unwrap();
    for &no in &pages[..10] {
        store.free(no).unwrap();
    }
    store.sync().unwrap();
    assert_eq!(store.stats().free_list_pages, 1);
    drop(store);
    // Find the chain head in the newest superblock (generation 3, slot 1; payload
    // offset 32 after the 16-byte header).
    let file = std::fs::File::open(&path).unwrap();
    let mut head = [0u8; 8];
    file.read_exact_at(&mut head, PAGE_SIZE as u64 + 16 + 32)
        .unwrap();
    let head = u64::from_le_bytes(head);
    assert!(head >= 2);
    let pristine = std::fs::read(&path).unwrap();
    flip_byte(&path, head * PAGE_SIZE as u64 + 16 + 40);
    match to_bfdb(open_existing(&path).unwrap_err()) {
        bfdb::Error::Corrupted { page, .. } => assert_eq!(page, head),
        other => panic!("expected Corrupted, got {other:?}"),
    }
    // A checksum-valid free-list page of another generation (a reused slot) is
    // refused too. The lsn of free-list pages is the superblock generation.
    std::fs::write(&path, &pristine).unwrap();
    open_existing(&path).expect("pristine file opens");
    rewrite_with_crc(&path, head, |p| {
        p[8..16].copy_from_slice(&7u64.to_le_bytes())
    });
    match to_bfdb(open_existing(&path).unwrap_err()) {
        bfdb::Error::Corrupted { page, reason } => {
            assert_eq!(page, head);
            assert!(reason.contains("generation"), "{reason}");
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn truncated_file_is_refused() {
    for cut_bytes in [1u64, 100, PAGE_SIZE as u64, 3 * PAGE_SIZE as u64 - 7] {
        let dir = scratch_dir();
        let (path, _, _) = two_generation_file(dir.path());
        let len = std::fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - cut_bytes).unwrap();
        drop(file);
        match to_bfdb(open_existing(&path).unwrap_err()) {
            bfdb::Error::Corrupted { reason, .. } => {
                assert!(reason.contains("truncated"), "{reason}")
            }
            other => panic!("cut {cut_bytes}: expected Corrupted, got {other:?}"),
        }
    }
}

#[test]
fn file_too_short_for_superblocks() {
    let dir = scratch_dir();
    let (path, _, _) = two_generation_file(dir.path());
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(PAGE_SIZE as u64 + 10).unwrap();
    drop(file);
    assert!(matches!(
        to_bfdb(open_existing(&path).unwrap_err()),
        bfdb::Error::Corrupted { .. }
    ));
    let other = dir.path().join("short");
    std::fs::write(&other, b"hello").unwrap();
    assert!(matches!(
        to_bfdb(open_existing(&other).unwrap_err()),
        bfdb::Error::Incompatible { .. }
    ));
}

#[test]
fn partial_page_past_the_high_water_mark_is_a_free_slot() {
    // A short write at the end of the file (the disk filled up) leaves a length that
    // is not a multiple of the page size, past everything the superblock covers. The
    // durable state is intact, so the file opens and the partial slot is free.
    let dir = scratch_dir();
    let (path, a, b) = two_generation_file(dir.path());
    let len = std::fs::metadata(&path).unwrap().len();
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[7u8; 1000], len).unwrap();
    drop(file);
    let store = open_existing(&path).unwrap();
    assert_eq!(store.stats().live_pages, 2);
    assert_eq!(store.stats().free_pages, 1);
    assert_filled(&read_back(&store, a).unwrap(), 10, a);
    assert_filled(&read_back(&store, b).unwrap(), 11, b);
    let c = store.allocate().unwrap();
    assert_eq!(c.0 * PAGE_SIZE as u64, len);
    write_seeded(&store, c, 12);
    store.sync().unwrap();
    assert_eq!(store.size_bytes(), len + PAGE_SIZE as u64);
    drop(store);
    let store = open_existing(&path).unwrap();
    assert_filled(&read_back(&store, c).unwrap(), 12, c);
}

#[test]
fn random_bytes_are_incompatible() {
    let seed = test_seed("random_bytes_are_incompatible");
    let mut rng = SplitMix(seed);
    let dir = scratch_dir();
    for (i, pages) in [2usize, 3, 16].into_iter().enumerate() {
        let path = dir.path().join(format!("random{i}"));
        let bytes: Vec<u8> = (0..pages * PAGE_SIZE).map(|_| rng.next() as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let err = open_existing(&path).unwrap_err();
        assert!(
            err.get_ref().is_some_and(|e| e.is::<IncompatibleFile>()),
            "{err}"
        );
        assert!(matches!(to_bfdb(err), bfdb::Error::Incompatible { .. }));
    }
}

/// Rewrites both superblock copies with `edit` applied to their bytes and, if
/// `fix_crc`, a recomputed checksum.
fn edit_superblocks(path: &Path, fix_crc: bool, edit: impl Fn(&mut [u8])) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    for slot in 0..2u64 {
        let mut page = vec![0u8; PAGE_SIZE];
        file.read_exact_at(&mut page, slot * PAGE_SIZE as u64)
            .unwrap();
        edit(&mut page);
        if fix_crc {
            let crc = crc32c::crc32c(&page[4..]);
            page[..4].copy_from_slice(&crc.to_le_bytes());
        }
        file.write_all_at(&page, slot * PAGE_SIZE as u64).unwrap();
    }
}

#[test]
fn other_magic_or_version_is_incompatible() {
    type Edit = fn(&mut [u8]);
    let edits: [(&str, bool, Edit); 5] = [
        ("magic", true, |p| p[16..24].copy_from_slice(b"NOTBFDB!")),
        ("magic, stale crc", false, |p| p[16] ^= 1),
        ("header version", true, |p| {
            p[4..6].copy_from_slice(&2u16.to_le_bytes())
        }),
        ("payload version", true, |p| {
            p[24..26].copy_from_slice(&9u16.to_le_bytes())
        }),
        ("page size", true, |p| {
            p[28..32].copy_from_slice(&8192u32.to_le_bytes())
        }),
    ];
    for (what, fix_crc, edit) in edits {
        let dir = scratch_dir();
        let (path, _, _) = two_generation_file(dir.path());
        edit_superblocks(&path, fix_crc, edit);
        match to_bfdb(open_existing(&path).unwrap_err()) {
            bfdb::Error::Incompatible { .. } => {}
            other => panic!("{what}: expected Incompatible, got {other:?}"),
        }
    }
}

#[test]
fn empty_file_without_create_is_refused() {
    let dir = scratch_dir();
    let path = dir.path().join("empty");
    std::fs::write(&path, b"").unwrap();
    match to_bfdb(open_existing(&path).unwrap_err()) {
        bfdb::Error::Incompatible { reason } => assert!(reason.contains("empty"), "{reason}"),
        other => panic!("expected Incompatible, got {other:?}"),
    }
    // With `create`, an empty file is initialized.
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    assert_eq!(store.size_bytes(), 2 * PAGE_SIZE as u64);
    // A missing file without `create` is the OS's NotFound.
    let missing = open_existing(&dir.path().join("missing")).unwrap_err();
    assert_eq!(missing.kind(), io::ErrorKind::NotFound);
}

// ---------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------

fn concurrent_distinct_pages(store: Arc<dyn PageStore>, syncs: bool) {
    const THREADS: u64 = 4;
    const PAGES_PER_THREAD: usize = 24;
    const ROUNDS: u64 = 12;
    let seed = test_seed("concurrent_distinct_pages");
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let store = Arc::clone(&store);
        handles.push(std::thread::spawn(move || {
            let mut rng = SplitMix(seed ^ t);
            let mut mine: Vec<(PageNo, u64)> = Vec::new();
            for i in 0..PAGES_PER_THREAD {
                let no = store.allocate().unwrap();
                let s = (t << 48) | i as u64;
                write_seeded(&*store, no, s);
                mine.push((no, s));
            }
            for _ in 0..ROUNDS {
                for entry in mine.iter_mut() {
                    let (no, s) = *entry;
                    assert_filled(&read_back(&*store, no).unwrap(), s, no);
                    let next = rng.next();
                    write_seeded(&*store, no, next);
                    entry.1 = next;
                }
                // Churn: give one page back and take another, racing the other
                // threads' allocations.
                let (old, _) = mine.remove(0);
                store.free(old).unwrap();
                let no = store.allocate().unwrap();
                let s = rng.next();
                write_seeded(&*store, no, s);
                mine.push((no, s));
                if syncs && t == 0 {
                    store.sync().unwrap();
                }
            }
            mine
        }));
    }
    let mut seen = BTreeSet::new();
    let results: Vec<Vec<(PageNo, u64)>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for mine in &results {
        for &(no, s) in mine {
            assert!(seen.insert(no), "page {no:?} owned by two threads");
            assert_filled(&read_back(&*store, no).unwrap(), s, no);
        }
    }
    assert_eq!(store.stats().live_pages, THREADS * PAGES_PER_THREAD as u64);
}

#[test]
fn concurrent_memory_store() {
    concurrent_distinct_pages(Arc::new(MemoryStore::new()), false);
}

#[test]
fn concurrent_file_store() {
    let engines = [IoEngine::Pread, IoEngine::IoUring];
    for (direct_io, engine) in [false, true]
        .into_iter()
        .flat_map(|d| engines.map(|e| (d, e)))
    {
        let dir = scratch_dir();
        let path = dir.path().join("conc.bfdb");
        let options = options(direct_io).io_engine(engine);
        let store = Arc::new(FileStore::open(&path, options).unwrap());
        concurrent_distinct_pages(store.clone(), true);
        store.sync().unwrap();
        let live = store.stats().live_pages;
        drop(store);
        assert_eq!(open_existing(&path).unwrap().stats().live_pages, live);
    }
}

// ---------------------------------------------------------------------------------
// Poisoning
// ---------------------------------------------------------------------------------

#[test]
fn failed_write_poisons_file_store() {
    let dir = scratch_dir();
    let path = dir.path().join("ro.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let a = store.allocate().unwrap();
    let b = store.allocate().unwrap();
    write_seeded(&store, a, 1);
    write_seeded(&store, b, 2);
    store.sync().unwrap();
    drop(store);

    // A read-only descriptor: the store opens and reads, but its first write fails.
    let ro = std::fs::File::open(&path).unwrap();
    let store = FileStore::from_file(ro, FileOptions::new().create(false)).unwrap();
    assert!(!store.is_poisoned());
    assert_filled(&read_back(&store, a).unwrap(), 1, a);
    let mut page = Page::boxed();
    fill(&mut page, 3);
    let err = store.write_page(a, &mut page).unwrap_err();
    assert!(
        !is_poisoned_error(&err),
        "the first error is the OS's: {err}"
    );
    assert!(store.is_poisoned());

    let err = store.write_page(b, &mut page).unwrap_err();
    assert!(is_poisoned_error(&err), "{err}");
    assert!(is_poisoned_error(&store.allocate().unwrap_err()));
    assert!(is_poisoned_error(&store.free(a).unwrap_err()));
    assert!(is_poisoned_error(&store.sync().unwrap_err()));
    // Reads still work.
    assert_filled(&read_back(&store, a).unwrap(), 1, a);
    assert_filled(&read_back(&store, b).unwrap(), 2, b);
    drop(store);
    // Reopening read-write clears the poison; nothing was lost.
    let store = open_existing(&path).unwrap();
    assert_filled(&read_back(&store, a).unwrap(), 1, a);
    write_seeded(&store, a, 4);
}

#[test]
fn failed_write_poisons_memory_store() {
    let store = MemoryStore::new();
    let a = store.allocate().unwrap();
    write_seeded(&store, a, 1);
    store.fail_next_write_for_test();
    let mut page = Page::boxed();
    assert!(store.write_page(a, &mut page).is_err());
    assert!(store.is_poisoned());
    assert!(is_poisoned_error(
        &store.write_page(a, &mut page).unwrap_err()
    ));
    assert!(is_poisoned_error(&store.allocate().unwrap_err()));
    assert!(is_poisoned_error(&store.sync().unwrap_err()));
    assert_filled(&read_back(&store, a).unwrap(), 1, a);
}

// ---------------------------------------------------------------------------------
// Bounded growth
// ---------------------------------------------------------------------------------

#[test]
fn file_stops_growing_under_free_allocate_churn() {
    const LIVE: usize = 300;
    const CHURN: usize = 40;
    const ROUNDS: usize = 60;
    let seed = test_seed("file_stops_growing_under_free_allocate_churn");
    let mut rng = SplitMix(seed);
    let dir = scratch_dir();
    let path = dir.path().join("churn.bfdb");
    let store = FileStore::open(&path, FileOptions::default()).unwrap();
    let mut live: Vec<PageNo> = (0..LIVE).map(|_| store.allocate().unwrap()).collect();
    for &no in &live {
        write_seeded(&store, no, no.0);
    }
    store.sync().unwrap();
    let mut sizes = Vec::new();
    for round in 0..ROUNDS {
        // Alternate the order, so that both reuse of just-freed slots and allocation
        // from durably free slots are exercised.
        let free_first = round % 2 == 0;
        let mut fresh = Vec::new();
        if !free_first {
            fresh.extend((0..CHURN).map(|_| store.allocate().unwrap()));
        }
        for _ in 0..CHURN {
            let i = (rng.next() % live.len() as u64) as usize;
            store.free(live.swap_remove(i)).unwrap();
        }
        if free_first {
            fresh.extend((0..CHURN).map(|_| store.allocate().unwrap()));
        }
        for &no in &fresh {
            write_seeded(&store, no, no.0 ^ round as u64);
        }
        live.extend(fresh);
        store.sync().unwrap();
        sizes.push(store.size_bytes());
    }
    let pages = |bytes: u64| bytes / PAGE_SIZE as u64;
    let settled = sizes[ROUNDS / 2];
    assert!(
        sizes[ROUNDS / 2..].iter().all(|&s| s == settled),
        "file kept growing: {:?} pages",
        sizes.iter().map(|&s| pages(s)).collect::<Vec<_>>()
    );
    // Superblocks, live pages, one round of churn and a free-list page or two.
    assert!(
        pages(settled) <= (2 + LIVE + CHURN + 4) as u64,
        "{} pages",
        pages(settled)
    );
    assert_eq!(store.stats().live_pages, LIVE as u64);
}

#[test]
fn payload_size_is_what_clients_may_use() {
    let store = MemoryStore::new();
    let a = store.allocate().unwrap();
    let mut page = Page::boxed();
    page.payload_mut().fill(0xee);
    assert_eq!(page.payload().len(), PAGE_PAYLOAD_SIZE);
    store.write_page(a, &mut page).unwrap();
    let back = read_back(&store, a).unwrap();
    assert!(back.payload().iter().all(|&b| b == 0xee));
}

// ---------------------------------------------------------------------------------
// Arbitrary metadata with valid checksums never panics
// ---------------------------------------------------------------------------------

fn small_or_any() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..48, 1 => any::<u64>()]
}

/// Rewrites page `no` of the file with `edit` applied and a recomputed checksum, so
/// that only the store's own validation stands between the bytes and a panic.
fn rewrite_with_crc(path: &Path, no: u64, edit: impl FnOnce(&mut [u8])) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut page = vec![0u8; PAGE_SIZE];
    file.read_exact_at(&mut page, no * PAGE_SIZE as u64)
        .unwrap();
    edit(&mut page);
    let crc = crc32c::crc32c(&page[4..]);
    page[..4].copy_from_slice(&crc.to_le_bytes());
    file.write_all_at(&page, no * PAGE_SIZE as u64).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Both superblocks and the first free-list page get arbitrary (mostly small)
    /// field values with valid checksums. Opening must return an error or a store
    /// whose operations work; it must never panic.
    #[test]
    fn arbitrary_checksummed_metadata_never_panics(
        sb_fields in prop::collection::vec(small_or_any(), 10),
        fl_next in small_or_any(),
        fl_count in prop_oneof![0u32..8, any::<u32>()],
        fl_entries in prop::collection::vec(small_or_any(), 8),
    ) {
        let dir = scratch_dir();
        let path = dir.path().join("fuzz.bfdb");
        let store = FileStore::open(&path, FileOptions::default()).unwrap();
        let pages: Vec<PageNo> = (0..30).map(|_| store.allocate().unwrap()).collect();
        for &no in &pages {
            write_seeded(&store, no, no.0);
        }
        store.sync().unwrap();
        for &no in &pages[..12] {
            store.free(no).unwrap();
        }
        store.sync().unwrap();
        drop(store);
        // The chain head of generation 3 (slot 1).
        let file = std::fs::File::open(&path).unwrap();
        let mut head = [0u8; 8];
        file.read_exact_at(&mut head, PAGE_SIZE as u64 + 16 + 32).unwrap();
        let head = u64::from_le_bytes(head);
        rewrite_with_crc(&path, head, |p| {
            p[16..24].copy_from_slice(&fl_next.to_le_bytes());
            p[24..28].copy_from_slice(&fl_count.to_le_bytes());
            for (j, e) in fl_entries.iter().enumerate() {
                p[32 + 8 * j..40 + 8 * j].copy_from_slice(&e.to_le_bytes());
            }
        });
        for slot in 0..2u64 {
            let fields = &sb_fields[slot as usize * 5..slot as usize * 5 + 5];
            rewrite_with_crc(&path, slot, |p| {
                for (k, v) in fields.iter().enumerate() {
                    // Generation, high-water mark, free head, free count, list pages.
                    p[32 + 8 * k..40 + 8 * k].copy_from_slice(&v.to_le_bytes());
                }
            });
        }
        if let Ok(store) = open_existing(&path) {
            let stats = store.stats();
            let mut page = Page::boxed();
            for no in 0..48 {
                let _ = store.read_page(PageNo(no), &mut page);
            }
            let no = store.allocate().unwrap();
            write_seeded(&store, no, 99);
            assert_filled(&read_back(&store, no).unwrap(), 99, no);
            store.sync().unwrap();
            drop(store);
            let store = open_existing(&path).unwrap();
            assert_eq!(store.stats().live_pages, stats.live_pages + 1);
        }
    }
}
