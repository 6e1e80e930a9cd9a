//! The Bf-Tree: a concurrent, larger-than-memory range index on mini-pages.
//!
//! ```text
//!  inner nodes (pinned, optimistic latch coupling)      inner.rs, olc.rs
//!         │ last level stores PageIds
//!         ▼
//!  mapping table: PageId → 48-bit location | 16-bit RW lock   mapping.rs
//!         ├──► mini-page in the circular-buffer pool          leaf.rs, crate::pool
//!         └──► 4 KiB leaf page in the page store              crate::storage
//! ```
//!
//! Invariants this module owns:
//! - A key is in at most one of: the mini-page (newest) and the leaf page (older). A read
//!   that finds the key in the mini-page never consults the leaf page.
//! - Mini-pages and leaf pages are read or written only under their `PageId`'s lock. A
//!   thread holding a page lock never *waits* for another page lock: eviction only
//!   try-locks, and an allocation that cannot make room drops every lock and restarts.
//! - After taking a page lock, an operation re-validates the version of the inner node
//!   it came from; a split updates that parent before it releases the leaf's lock, so a
//!   validated parent means the page still covers the key.
//! - Inner-node locks are only taken by upgrading a version seen during a traversal (a
//!   CAS that never waits), so no cycle of waiting can form.

mod admission;
#[cfg(feature = "tokio-uring")]
pub mod aio;
mod background;
pub(crate) mod inner;
mod leaf;
mod mapping;
pub mod node;
mod olc;
mod scan;
mod setup;

use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Guard};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pool::{AllocError, Block, EvictDecision, Evictor, Pool, PoolStats};
use crate::storage::{ActiveBackend, MemoryStore, PAGE_PAYLOAD_SIZE, Page, PageNo, PageStore};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use admission::Doorkeeper;
use inner::InnerNode;
use leaf::{
    MAX_MINI_BLOCK_BYTES, MINI_HEADER_BYTES, MiniHeader, OPEN_END_MIRROR_BYTES, RecordList,
};
use mapping::{Location, MappingTable, PageId};
use node::{Fences, NodeKind, NodeMut, NodeRef, RecordType, WriteError};
use olc::Restart;
use setup::open_file_store;

pub use scan::{Cursor, MAX_READ_AHEAD_PAGES, Range};

/// Why an operation on a locked page did not finish.
enum Op {
    /// State changed under us: drop every lock and start again from the root.
    Restart,
    /// The pool needs eviction the caller blocks: drop locks, help evict, restart.
    WouldBlock,
    /// An operating error to return to the caller.
    Fail(Error),
}

impl From<Error> for Op {
    fn from(e: Error) -> Op {
        Op::Fail(e)
    }
}

impl From<Restart> for Op {
    fn from(_: Restart) -> Op {
        Op::Restart
    }
}

/// Which page a traversal looks for.
#[derive(Clone, Copy)]
enum Target<'k> {
    /// The page whose range holds the key.
    Holding(&'k [u8]),
    /// The page holding the largest keys below the key.
    Below(&'k [u8]),
    /// The last page.
    Last,
}

/// Where a traversal ended: the page and the inner node that routed to it.
struct LeafPath<'t> {
    parent: &'t InnerNode,
    parent_version: u64,
    pid: PageId,
    /// Position of `pid` among the parent's children (scans prefetch its neighbours).
    index: usize,
    /// Length of the key prefix every key of the page shares (from its fences).
    prefix_len: usize,
}

impl<'t> LeafPath<'t> {
    /// The path to child `index` of the level-1 node `node`, whose bytes `n` were read
    /// at `version`; a restart if the node changed since.
    fn at(
        node: &'t InnerNode,
        version: u64,
        n: &NodeRef<'_>,
        index: usize,
    ) -> Result<LeafPath<'t>, Restart> {
        let pid = PageId(inner::child_ref(n, index));
        let prefix_len = child_prefix_len(n, index);
        node.version.validate(version)?;
        Ok(LeafPath {
            parent: node,
            parent_version: version,
            pid,
            index,
            prefix_len,
        })
    }
}

/// Counters describing what the tree has done, from [`Tree::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TreeStats {
    /// Mini-pages created for a page that had none.
    pub mini_pages_created: u64,
    /// Mini-pages grown to a bigger size class (read-copy-update in the pool).
    pub mini_page_growths: u64,
    /// Merges of a mini-page's dirty records into its leaf page.
    pub merges: u64,
    /// Mini-pages evicted from the pool's head.
    pub evictions: u64,
    /// Pool blocks the background evictor reclaimed ([`Config::background_eviction`]):
    /// mini-pages it evicted and freed blocks it passed. Also in the pool's
    /// `reclaimed_blocks`.
    pub background_reclaimed_blocks: u64,
    /// Mini-pages at the merge threshold that the background evictor merged (in batches)
    /// while their writers went on growing them ([`Config::background_eviction`]).
    pub background_merges: u64,
    /// Mini-pages merged instead of grown because the pool had no room for the bigger
    /// block (the block pinning its head may be the growing mini-page itself, which
    /// nobody else can evict while its writer holds the page). Also in `merges`.
    pub merges_without_room: u64,
    /// Mini-pages copied from the copy-on-access region to the tail.
    pub copy_on_access: u64,
    /// Records cached in a mini-page after a read from the leaf page.
    pub records_promoted: u64,
    /// Phantom records cached for reads of absent keys.
    pub phantoms_promoted: u64,
    /// Mini-pages turned into full mirrors of their leaf page by scans.
    pub mirrors_created: u64,
    /// Mirrors kept of the open end of a sorted-order split: the page that the next
    /// records in the same key order land in, so that its next merge reads no leaf page.
    pub open_end_mirrors: u64,
    /// Open-end mirrors turned back into plain mini-pages (or dropped) because newer
    /// open ends replaced them: their streams had moved on.
    pub open_end_demotions: u64,
    /// Leaf-page splits.
    pub leaf_splits: u64,
    /// Overflowing leaf pages that moved records into a neighbour instead of splitting
    /// ([`Config::leaf_redistribution`]).
    pub leaf_redistributions: u64,
    /// Inner-node splits (including the root's).
    pub inner_splits: u64,
    /// Leaf pages read from the page store.
    pub leaf_reads: u64,
    /// Leaf pages written to the page store.
    pub leaf_writes: u64,
    /// Operations restarted from the root after a concurrent change.
    pub restarts: u64,
    /// Leaf pages read in batches of more than one page (one `read_pages` call each):
    /// by [`Tree::get_many`], scan prefetch and batched eviction. Also in `leaf_reads`.
    pub batched_leaf_reads: u64,
    /// Leaf pages written in batches of more than one page (one `write_pages` call each)
    /// by batched eviction. Also in `leaf_writes`.
    pub batched_leaf_writes: u64,
    /// Leaf pages a scan read ahead of need, for the pages after the one it fetched.
    pub prefetched_leaf_pages: u64,
    /// Leaf pages read through a tokio-uring runtime's ring by the async API
    /// (feature `tokio-uring`). Also in `leaf_reads`.
    pub async_leaf_reads: u64,
    /// Leaf pages read without their page lock that a concurrent write made stale before
    /// they were used; the read was then repeated under the lock.
    pub stale_leaf_reads: u64,
    /// Levels of inner nodes above the leaf pages.
    pub height: u32,
    /// Leaf pages in use in the page store.
    pub leaf_pages: u64,
    /// Whether leaf pages bypass the OS page cache (`O_DIRECT` active).
    pub direct_io: bool,
    /// What the page store runs on: `"memory"`, `"std"` (`pread`/`pwrite` through the OS
    /// page cache), `"std_direct"` (`pread`/`pwrite` with `O_DIRECT`), `"io_uring"`, or
    /// `"custom"` for a store given to [`Tree::with_page_store`].
    pub backend: &'static str,
    /// Why the backend differs from what [`Config::backend`] asked for (io_uring refused
    /// by the kernel, `O_DIRECT` refused by the filesystem), if it does.
    pub backend_notice: Option<String>,
    /// The circular-buffer pool's own counters.
    pub pool: PoolStats,
}

/// The tree's counters and per-page leaf-write counters.
#[derive(Default)]
struct Counters {
    mini_pages_created: AtomicU64,
    mini_page_growths: AtomicU64,
    merges: AtomicU64,
    evictions: AtomicU64,
    background_reclaimed_blocks: AtomicU64,
    background_merges: AtomicU64,
    merges_without_room: AtomicU64,
    copy_on_access: AtomicU64,
    records_promoted: AtomicU64,
    phantoms_promoted: AtomicU64,
    mirrors_created: AtomicU64,
    open_end_mirrors: AtomicU64,
    open_end_demotions: AtomicU64,
    leaf_splits: AtomicU64,
    leaf_redistributions: AtomicU64,
    inner_splits: AtomicU64,
    leaf_reads: AtomicU64,
    leaf_writes: AtomicU64,
    restarts: AtomicU64,
    batched_leaf_reads: AtomicU64,
    batched_leaf_writes: AtomicU64,
    prefetched_leaf_pages: AtomicU64,
    async_leaf_reads: AtomicU64,
    stale_leaf_reads: AtomicU64,
    /// Leaf-write counters, striped by `PageId`: a page's counter is bumped under its
    /// write lock whenever its leaf page is written. A leaf page read *without* the page
    /// lock is valid if the counter, read under the lock before and after the read, did
    /// not change (see `Core::ticket_valid`).
    leaf_versions: LeafVersions,
    /// Set to turn batched eviction IO off (`evict_batch` then evicts one by one).
    single_evictions: AtomicBool,
}

/// The leaf-write counters, `LEAF_VERSION_STRIPES` of them.
struct LeafVersions(Box<[AtomicU64]>);

impl Default for LeafVersions {
    fn default() -> Self {
        LeafVersions(
            (0..LEAF_VERSION_STRIPES)
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn bump_by(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

/// Number of leaf-write counters; a page uses the one its `PageId` selects modulo this.
const LEAF_VERSION_STRIPES: usize = 4096;

/// A Bf-Tree: an ordered key-value index over a page store, with a fixed memory budget.
///
/// Every operation takes `&self`; share a `Tree` between threads with `Arc` or scoped
/// threads. Keys are non-empty byte strings of at most [`Config::max_key_bytes`]; values
/// are byte strings of at most [`Config::max_value_bytes`]. Unless
/// [`Config::background_eviction`] is off, each tree runs one thread of its own
/// (`bfdb-evictor`), which dropping the tree stops.
///
/// ```
/// let tree = bfdb::Tree::in_memory(bfdb::Config::default())?;
/// tree.insert(b"apple", b"red")?;
/// tree.insert(b"banana", b"yellow")?;
/// tree.insert(b"cherry", b"dark red")?;
/// tree.delete(b"banana")?;
/// assert_eq!(tree.get(b"apple")?.as_deref(), Some(&b"red"[..]));
/// assert_eq!(tree.get(b"banana")?, None);
///
/// let keys: Vec<Vec<u8>> = tree
///     .range(&b"a"[..]..)
///     .map(|r| r.map(|(k, _)| k))
///     .collect::<Result<_, _>>()?;
/// assert_eq!(keys, vec![b"apple".to_vec(), b"cherry".to_vec()]);
/// # Ok::<(), bfdb::Error>(())
/// ```
pub struct Tree {
    core: Arc<Core>,
    /// The background evictor, if it runs (`Config::background_eviction`).
    background: Option<background::Background>,
}

// Every operation takes `&self`: a `Tree` is shared between threads as it is.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tree>();
};

struct Core {
    config: Config,
    inner_size_bytes: usize,
    root: AtomicPtr<InnerNode>,
    /// Every inner node ever created, freed when the tree drops.
    inner_nodes: Mutex<Vec<usize>>,
    mapping: MappingTable,
    pool: Pool,
    store: Box<dyn PageStore>,
    backend: ActiveBackend,
    counters: Counters,
    /// Set when a write to the page store failed; the tree then refuses writes.
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// Evictions of dirty mini-pages that failed with an operating error, and the last.
    evict_failures: AtomicU64,
    evict_error: Mutex<Option<String>>,
    /// The second-miss filter deciding, with the promotion chance, which point reads
    /// cache what they read.
    doorkeeper: Doorkeeper,
    /// Wakes the background evictor, if it runs.
    background: background::Signal,
    /// Pages given an open-end mirror, oldest first, at most `OPEN_ENDS_MAX`.
    open_ends: Mutex<std::collections::VecDeque<PageId>>,
    /// This tree among every tree of the process, for `LOCATE_HINT`; never reused.
    id: u64,
}

/// The ids of trees (`Core::id`); 0 is no tree.
static NEXT_TREE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

thread_local! {
    /// The level-1 inner node this thread's last descent ended in, with the id of its
    /// tree: where `find_leaf` starts looking for a key before descending from the
    /// root (`Core::locate_from_hint`).
    static LOCATE_HINT: std::cell::Cell<(u64, *const InnerNode)> =
        const { std::cell::Cell::new((0, std::ptr::null())) };
}

/// Most open-end mirrors kept at once (`Core::mirror_open_end`): about as many sorted
/// streams as a tree is loaded with at a time. A stream that moves on (a loader done
/// with its run of keys) leaves its open end behind; past this many, the oldest is
/// demoted to a plain mini-page of its dirty records, so stale 8 KiB mirrors do not
/// fill the pool.
const OPEN_ENDS_MAX: usize = 16;

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("config", &self.core.config)
            .field("store", &self.core.store)
            .finish_non_exhaustive()
    }
}

impl Tree {
    /// Creates a tree whose leaf pages live in memory; the pool still bounds the memory
    /// used by mini-pages.
    pub fn in_memory(config: Config) -> Result<Tree> {
        Tree::with_store(
            config,
            Box::new(MemoryStore::new()),
            ActiveBackend::memory(),
        )
    }

    /// Creates a new file-backed tree at `path`, on the backend [`Config::backend`]
    /// chooses; [`TreeStats::backend`] tells which one runs, and
    /// [`TreeStats::backend_notice`] why it differs from the choice if it does.
    ///
    /// Reopening a file that already holds a tree needs recovery, which arrives with the
    /// durability issue: until then it returns [`Error::Unsupported`] rather than data
    /// that may be stale.
    pub fn open(path: impl AsRef<Path>, config: Config) -> Result<Tree> {
        config.validate()?;
        let (store, backend) = open_file_store(path.as_ref(), &config)?;
        if store.stats().live_pages > 0 {
            return Err(Error::Unsupported(format!(
                "{} already holds a tree; reopening needs recovery, which this release \
                 does not implement",
                path.as_ref().display()
            )));
        }
        Tree::with_store(config, Box::new(store), backend)
    }

    /// Creates a tree over any [`PageStore`] — for example a
    /// [`SimStore`](crate::storage::SimStore) that injects faults. The store must be
    /// empty: the tree allocates its first leaf page in it.
    pub fn with_page_store(config: Config, store: impl PageStore + 'static) -> Result<Tree> {
        if store.stats().live_pages > 0 {
            return Err(Error::Unsupported(
                "the page store already holds pages; opening an existing tree needs recovery"
                    .into(),
            ));
        }
        Tree::with_store(config, Box::new(store), ActiveBackend::custom())
    }

    fn with_store(
        config: Config,
        store: Box<dyn PageStore>,
        backend: ActiveBackend,
    ) -> Result<Tree> {
        config.validate()?;
        let pool = Pool::new(setup::pool_config(&config))?;
        // One empty leaf page covering every key, under a root with one child.
        let leaf_no = store.allocate()?;
        let mut page = Page::boxed();
        NodeMut::init(
            page.payload_mut(),
            NodeKind::Leaf,
            Fences::Range {
                low: None,
                high: None,
            },
        )
        .map_err(|e| Error::Corrupted {
            page: leaf_no.0,
            reason: e.to_string(),
        })?;
        store.write_page(leaf_no, &mut page)?;
        let mapping = MappingTable::new();
        let pid = mapping
            .allocate(Location::Leaf(leaf_no.0))
            .expect("an empty table has ids");
        let inner_size_bytes = setup::inner_node_size_bytes(&config);
        let root_bytes = inner::build(inner_size_bytes, None, None, &[(Vec::new(), pid.0)])
            .expect("one separator fits an inner node");
        let root = Box::into_raw(InnerNode::new(1, root_bytes));
        let doorkeeper = Doorkeeper::new(config.memory_budget_bytes);
        let core = Arc::new(Core {
            config,
            inner_size_bytes,
            root: AtomicPtr::new(root),
            inner_nodes: Mutex::new(vec![root as usize]),
            mapping,
            pool,
            store,
            backend,
            counters: Counters::default(),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            evict_failures: AtomicU64::new(0),
            evict_error: Mutex::new(None),
            doorkeeper,
            background: background::Signal::default(),
            open_ends: Mutex::new(std::collections::VecDeque::new()),
            id: NEXT_TREE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        });
        // Under shuttle every thread must be the scheduler's: no evictor thread there.
        let background = (core.config.background_eviction && !cfg!(feature = "shuttle"))
            .then(|| background::Background::start(&core))
            .flatten();
        Ok(Tree { core, background })
    }

    /// The value stored under `key`, if any.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }

    /// Reads the value under `key` into `out` (cleared first) and tells whether the key
    /// exists. No allocation happens when `out` already has the capacity.
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.core.check_key(key)?;
        out.clear();
        self.core.get(key, out)
    }

    /// The values stored under `keys`, in the order of `keys` (duplicates and absent
    /// keys allowed).
    ///
    /// Keys are answered from their mini-pages where possible; the leaf pages the rest
    /// need are read together, one batched [`PageStore::read_pages`] call per up to 128
    /// distinct pages, so a page store that batches (io_uring) keeps them all in flight.
    /// Each answer is the key's value at some moment during the call. Fails on the first
    /// invalid key before reading anything.
    ///
    /// ```
    /// let tree = bfdb::Tree::in_memory(bfdb::Config::default())?;
    /// tree.insert(b"a", b"1")?;
    /// tree.insert(b"c", b"3")?;
    /// let got = tree.get_many(&[&b"c"[..], b"b", b"a"])?;
    /// assert_eq!(got, vec![Some(b"3".to_vec()), None, Some(b"1".to_vec())]);
    /// # Ok::<(), bfdb::Error>(())
    /// ```
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        for key in keys {
            self.core.check_key(key.as_ref())?;
        }
        self.core.get_many(keys)
    }

    /// Inserts `value` under `key`, replacing any previous value (upsert).
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.core.check_key(key)?;
        if value.len() > self.core.config.max_value_bytes {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: self.core.config.max_value_bytes,
            });
        }
        self.core.write(key, Some(value))
    }

    /// Removes `key` if present. Deleting an absent key is not an error.
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.core.check_key(key)?;
        self.core.write(key, None)
    }

    /// Iterates over the records whose keys lie in `range`, in key order; `.rev()` walks
    /// it backwards. The iterator holds no lock between calls to `next`; under concurrent
    /// writes it yields strictly increasing keys (decreasing, reversed) with no
    /// duplicates, each with a value that was current at some moment during the scan.
    ///
    /// ```
    /// let tree = bfdb::Tree::in_memory(bfdb::Config::default())?;
    /// for i in 0..10u8 {
    ///     tree.insert(&[b'k', i], &[i])?;
    /// }
    /// let back: Vec<u8> = tree
    ///     .range(&[b'k', 3][..]..=&[b'k', 6][..])
    ///     .rev()
    ///     .map(|r| r.map(|(_, v)| v[0]))
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(back, vec![6, 5, 4, 3]);
    /// # Ok::<(), bfdb::Error>(())
    /// ```
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Range<'_> {
        let (lower, upper) = owned_bounds(&range);
        Range::new(&self.core, lower, upper)
    }

    /// A forward scan of `range` that lends each record as slices instead of
    /// allocating it: the fastest way to read many records. See [`Cursor`].
    pub fn cursor<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Cursor<'_> {
        let (lower, upper) = owned_bounds(&range);
        Cursor::new(&self.core, lower, upper)
    }

    /// Iterates over the records whose keys start with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Range<'_> {
        let end = match prefix_successor(prefix) {
            Some(s) => Bound::Excluded(s),
            None => Bound::Unbounded,
        };
        Range::new(&self.core, Bound::Included(prefix.to_vec()), end)
    }

    /// Writes the dirty records of every mini-page to its leaf page and syncs the page
    /// store. Cached records stay in memory. Concurrent operations may keep running: every
    /// write acknowledged before the call is included; later ones may or may not be.
    pub fn flush(&self) -> Result<()> {
        self.core.flush()
    }

    /// Counters describing what the tree has done so far.
    pub fn stats(&self) -> TreeStats {
        let c = &self.core.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TreeStats {
            mini_pages_created: load(&c.mini_pages_created),
            mini_page_growths: load(&c.mini_page_growths),
            merges: load(&c.merges),
            evictions: load(&c.evictions),
            background_reclaimed_blocks: load(&c.background_reclaimed_blocks),
            background_merges: load(&c.background_merges),
            merges_without_room: load(&c.merges_without_room),
            copy_on_access: load(&c.copy_on_access),
            records_promoted: load(&c.records_promoted),
            phantoms_promoted: load(&c.phantoms_promoted),
            mirrors_created: load(&c.mirrors_created),
            open_end_mirrors: load(&c.open_end_mirrors),
            open_end_demotions: load(&c.open_end_demotions),
            leaf_splits: load(&c.leaf_splits),
            leaf_redistributions: load(&c.leaf_redistributions),
            inner_splits: load(&c.inner_splits),
            leaf_reads: load(&c.leaf_reads),
            leaf_writes: load(&c.leaf_writes),
            restarts: load(&c.restarts),
            batched_leaf_reads: load(&c.batched_leaf_reads),
            batched_leaf_writes: load(&c.batched_leaf_writes),
            prefetched_leaf_pages: load(&c.prefetched_leaf_pages),
            async_leaf_reads: load(&c.async_leaf_reads),
            stale_leaf_reads: load(&c.stale_leaf_reads),
            height: self.core.root().level,
            leaf_pages: self.core.store.stats().live_pages,
            direct_io: self.core.backend.direct_io,
            backend: self.core.backend.name,
            backend_notice: self.core.backend.notice.clone(),
            pool: self.core.pool.stats(),
        }
    }

    /// Turns batched eviction IO on (the default) or off, for measuring what it gains.
    #[doc(hidden)]
    pub fn set_batched_eviction(&self, on: bool) {
        self.core
            .counters
            .single_evictions
            .store(!on, Ordering::Relaxed);
    }

    /// The configuration the tree runs with.
    pub fn config(&self) -> &Config {
        &self.core.config
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // Best effort: a failure here has nowhere to go, and Drop must not panic. While
        // unwinding from a panic the tree's state is suspect: do not write it.
        // Stop the evictor first, so the flush below is the last writer.
        self.background = None;
        if !std::thread::panicking() {
            let _ = self.core.flush();
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        for &node in self.inner_nodes.lock().iter() {
            // SAFETY: every entry came from `Box::into_raw` of an `InnerNode`, is listed
            // once, and `&mut self` means no traversal can still reach it.
            drop(unsafe { Box::from_raw(node as *mut InnerNode) });
        }
    }
}

/// The smallest byte string greater than every string starting with `prefix`, or `None`
/// if there is none (the prefix is empty or all 0xff).
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut s = prefix.to_vec();
    while let Some(last) = s.pop() {
        if last < 0xff {
            s.push(last + 1);
            return Some(s);
        }
    }
    None
}

#[cfg(not(feature = "shuttle"))]
thread_local! {
    static RNG: std::cell::Cell<u64> = std::cell::Cell::new({
        let addr = &0u8 as *const u8 as u64;
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (addr ^ time.rotate_left(17)) | 1
    });
}

/// The bounds of `range` as owned keys.
fn owned_bounds<K: AsRef<[u8]>, R: RangeBounds<K>>(range: &R) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let own = |b: Bound<&K>| match b {
        Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    };
    (own(range.start_bound()), own(range.end_bound()))
}

/// What a merge brings to a leaf page, as far as the shape of its split goes.
#[derive(Default)]
struct Arrivals {
    /// Records merged in: the mini-page's dirty ones and the write being merged.
    new: usize,
    /// How many of them lie above all of the leaf's records, and how many below.
    above: usize,
    below: usize,
    /// No record of the leaf lies between the lowest and the highest new record.
    contiguous: bool,
    /// The lowest and the highest new key.
    bottom: Vec<u8>,
    top: Vec<u8>,
    /// The write being merged is the highest new record, or the lowest.
    latest_top: bool,
    latest_bottom: bool,
}

/// Fewest new records, with no old record between them, that make a run: a stream of
/// inserts in key order into the middle of a page.
const RUN_MIN_RECORDS: usize = 8;

impl Arrivals {
    /// The records merged into a leaf page: its mini-page's `dirty` ones (which include
    /// `latest`, the write being merged, if any). `None` for an empty leaf.
    fn into_leaf(leaf: &NodeRef<'_>, dirty: &RecordList, latest: Option<&[u8]>) -> Option<Self> {
        let last = leaf.len().checked_sub(1)?;
        let n = dirty.len().checked_sub(1)?;
        let (first, last) = (leaf.record(0), leaf.record(last));
        // The index of the first leaf record at or above `key` (past it: above it).
        let bound = |key: &[u8], past: bool| match leaf.search(key) {
            Ok(i) => i + usize::from(past),
            Err(i) => i,
        };
        let (bottom, top) = (dirty.key(0), dirty.key(n));
        Some(Arrivals {
            new: n + 1,
            above: (0..=n)
                .filter(|&i| last.cmp_key(dirty.key(i)).is_lt())
                .count(),
            below: (0..=n)
                .filter(|&i| first.cmp_key(dirty.key(i)).is_gt())
                .count(),
            contiguous: bound(top, false) <= bound(bottom, true),
            bottom: bottom.to_vec(),
            top: top.to_vec(),
            latest_top: latest == Some(top),
            latest_bottom: latest == Some(bottom),
        })
    }

    /// The records merged by a mirror: its dirty ones and `latest`, the write being
    /// merged; its clean (`Cache`) records are its leaf page's. `None` if it has no
    /// clean or no new records.
    fn into_mirror(mirror: &NodeRef<'_>, latest: Option<&[u8]>) -> Option<Self> {
        let clean =
            |r: &node::RecordView<'_>| !r.record_type().is_dirty() && r.record_type().exists();
        let first_clean = mirror.iter().position(|r| clean(&r))?;
        let last_clean = mirror.len() - 1 - mirror.iter().rev().position(|r| clean(&r))?;
        let mut a = Arrivals::default();
        let mut dirty = None::<(usize, usize)>;
        for (i, r) in mirror.iter().enumerate() {
            if r.record_type().is_dirty() {
                a.new += 1;
                a.above += usize::from(i > last_clean);
                a.below += usize::from(i < first_clean);
                dirty = Some(dirty.map_or((i, i), |(first, _)| (first, i)));
            }
        }
        if let Some((first, last)) = dirty {
            a.bottom = mirror.record(first).key();
            a.top = mirror.record(last).key();
        }
        if let Some(k) = latest {
            a.new += 1;
            a.above += usize::from(mirror.record(last_clean).cmp_key(k).is_lt());
            a.below += usize::from(mirror.record(first_clean).cmp_key(k).is_gt());
            if dirty.is_none() || node::cmp_keys(k, &a.bottom).is_le() {
                a.bottom = k.to_vec();
                a.latest_bottom = true;
            }
            if dirty.is_none() || node::cmp_keys(k, &a.top).is_ge() {
                a.top = k.to_vec();
                a.latest_top = true;
            }
        }
        if a.new == 0 {
            return None;
        }
        a.contiguous = !mirror
            .iter()
            .any(|r| clean(&r) && r.cmp_key(&a.bottom).is_gt() && r.cmp_key(&a.top).is_lt());
        Some(a)
    }

    /// How the leaf should split, and the key whose page is its open end (the page the
    /// next records in the same order land in; `None` for a balanced split).
    ///
    /// When the new records lie above the leaf's (keys arriving in ascending order, as in
    /// a sorted bulk load) the lower pages will take no more inserts, so they are packed
    /// full; likewise below (descending order). At least 7 of 8 new records on one side
    /// do: concurrent loaders of a sorted input insert slightly out of order, and a
    /// straggler must not turn the split balanced, leaving a half-full page that takes no
    /// more records. Random-order inserts land above a leaf of `n` records with chance
    /// 1/(n+1) each, so a split of a leaf holding more than a handful stays balanced. A
    /// run of at least `RUN_MIN_RECORDS` new records with no old one between them is a
    /// stream of inserts into the middle of the page (the driver's loaders each insert
    /// 1,000 consecutive keys, below the other's): ascending if the write being merged
    /// is its highest, descending if its lowest.
    fn shape(self) -> (leaf::Fill, Option<Vec<u8>>) {
        let mostly = |side: usize| side > 0 && side * 8 >= self.new * 7;
        let run = self.contiguous && self.new >= RUN_MIN_RECORDS;
        if mostly(self.above) || (run && self.latest_top) {
            (leaf::Fill::Ascending, Some(self.top))
        } else if mostly(self.below) || (run && self.latest_bottom) {
            (leaf::Fill::Descending, Some(self.bottom))
        } else {
            (leaf::Fill::Balanced, None)
        }
    }
}

/// A cheap per-thread coin with `percent` chance of heads (xorshift64*). Under shuttle
/// the coin is shuttle's, so a failing schedule's seed replays the same tosses.
fn chance(percent: u8) -> bool {
    if percent == 0 {
        return false;
    }
    #[cfg(feature = "shuttle")]
    {
        use shuttle::rand::RngCore;
        shuttle::rand::thread_rng().next_u64() % 100 < u64::from(percent)
    }
    #[cfg(not(feature = "shuttle"))]
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % 100 < u64::from(percent)
    })
}

/// A full mini-page grows to the size class holding this percentage of its size (one
/// class step, as the pool's classes are a quarter apart). Measured at 4M records and a
/// 16 MiB pool (Zipf 0.9, 2 threads, 20-s phases): growing by 125% read 1,476 leaf bytes
/// per get once warm and wrote 174 B per update, 150% 1,548 and 189, doubling 1,696 and
/// 222: the smaller the step, the less of each block is empty tail.
const MINI_GROWTH_PERCENT: usize = 125;

/// A view of the mini-page in `block`.
///
/// # Safety
///
/// The caller holds the owning page's lock (shared or exclusive) for all of `'a`, so the
/// block is live and no one writes it while the view exists.
unsafe fn mini_ref<'a>(block: &Block) -> NodeRef<'a> {
    // SAFETY: the payload is `size_bytes` bytes of live pool memory (the caller's lock
    // keeps the block allocated for `'a`) and nobody writes it meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts(block.payload_ptr(), block.size_bytes()) };
    NodeRef::trusted(&bytes[MINI_HEADER_BYTES..])
}

/// A mutable view of the mini-page in `block`.
///
/// # Safety
///
/// The caller holds the owning page's write lock for all of `'a`, and no other view of
/// the block is alive meanwhile.
unsafe fn mini_mut<'a>(block: &Block) -> NodeMut<'a> {
    // SAFETY: guaranteed by the caller.
    NodeMut::trusted(unsafe { node_bytes_mut(block) })
}

/// The mutable node bytes of a mini-page block, without its header: the evictor may read
/// a published block's header without the page lock, so no `&mut` may cover it.
///
/// # Safety
///
/// The caller holds the owning page's write lock for all of `'a`, and no other view of
/// the node bytes is alive meanwhile.
unsafe fn node_bytes_mut<'a>(block: &Block) -> &'a mut [u8] {
    // SAFETY: the payload is `size_bytes` bytes of pool memory and starts with the
    // 16-byte header; the caller's write lock makes the bytes after it exclusively ours.
    unsafe {
        std::slice::from_raw_parts_mut(
            block.payload_ptr().add(MINI_HEADER_BYTES),
            block.size_bytes() - MINI_HEADER_BYTES,
        )
    }
}

/// The mutable bytes of a freshly allocated, unpublished block (header included).
///
/// # Safety
///
/// The block is Reserved — allocated and not yet published — and owned by the caller for
/// all of `'a`; nobody else, not even the evictor, looks at a Reserved block.
unsafe fn block_bytes<'a>(block: &Block) -> &'a mut [u8] {
    // SAFETY: guaranteed by the caller; the payload is `size_bytes` bytes of pool memory.
    unsafe { std::slice::from_raw_parts_mut(block.payload_ptr(), block.size_bytes()) }
}

/// What the leaf level found for a key under a page lock.
#[derive(Clone, Copy)]
enum Found {
    /// The key's record, from the mini-page or the leaf page.
    Value,
    /// The key is absent (tombstone, phantom, mirror miss or leaf miss).
    Absent,
}

/// A mini-page whose dirty records go to its leaf page in a batched merge; the caller
/// holds its page's write lock.
struct MergeJob {
    block: Block,
    header: MiniHeader,
}

/// A split planned by a batched merge: its job, the records and chunks it writes, and
/// its right-hand pages (numbered, built, not yet reachable).
struct BatchSplit {
    job: usize,
    records: RecordList,
    chunks: Vec<leaf::LeafChunk>,
    right: Vec<(PageNo, Box<Page>)>,
}

/// A neighbour locked for a redistribution (`Core::pick_neighbour`).
struct Neighbour<'t> {
    page: mapping::WriteGuard<'t>,
    /// Its leaf page and whether its mini-page is a mirror (made up when it has none).
    header: MiniHeader,
    /// Its mini-page, if it has one.
    block: Option<Block>,
    /// Whether it lies left of the overflowing page.
    left: bool,
}

/// What a redistribution writes (`Core::plan_redistribution`), its neighbour still locked.
struct Redistribution<'t> {
    neighbour: Neighbour<'t>,
    /// The overflowing page, which gives records.
    giving_pid: PageId,
    /// A key of the giving page's old range, which finds the two pages' parent.
    probe: Vec<u8>,
    /// The neighbour's page as its own merge would write it: written back if the parent
    /// cannot take the new separator.
    restore: Box<Page>,
    /// The two new pages, left then right.
    pages: [Box<Page>; 2],
    separator: Vec<u8>,
}

impl<'t> Redistribution<'t> {
    /// The overflowing page's new page, once the neighbour's lock may go.
    fn into_giving(self) -> Box<Page> {
        let [left, right] = self.pages;
        if self.neighbour.left { right } else { left }
    }

    /// The neighbour's lock, leaf page and old page, for writing it back.
    fn into_restore(self) -> (mapping::WriteGuard<'t>, PageNo, Box<Page>) {
        (
            self.neighbour.page,
            self.neighbour.header.leaf,
            self.restore,
        )
    }

    /// The overflowing page's new page.
    fn giving(&mut self) -> &mut Page {
        let i = usize::from(self.neighbour.left);
        &mut self.pages[i]
    }

    /// The neighbour's new page.
    fn receiving(&mut self) -> &mut Page {
        let i = usize::from(!self.neighbour.left);
        &mut self.pages[i]
    }
}

/// Answers a failed batched write for every job in `jobs`: the first gets the store's
/// error, the rest the poisoning it caused (the write poisoned the tree).
fn fail_all(e: Error, jobs: impl Iterator<Item = usize>, results: &mut [Result<bool, Op>]) {
    let cause = e.to_string();
    let mut first = Some(e);
    for i in jobs {
        let e = first.take().unwrap_or_else(|| Error::Poisoned {
            cause: cause.clone(),
        });
        results[i] = Err(Op::Fail(e));
    }
}

/// What a merge writes: one leaf page, or the records of a leaf that must split and how
/// they pack into pages.
enum MergePlan {
    Write(Box<Page>),
    Split {
        records: RecordList,
        chunks: Vec<leaf::LeafChunk>,
        /// The chunk the next records in the split's key order land in (sorted-order
        /// splits only).
        open: Option<usize>,
    },
}

/// Why `Core::build_mirror` made no mirror.
enum MirrorRefused {
    /// The pool has no unused block (a mirror never evicts).
    NoRoom,
    /// The mini-page's dirty records do not fit next to the leaf page's records.
    TooFull,
}

/// What `merge` did to the leaf page.
enum Merged {
    /// Rewrote it in place.
    InPlace,
    /// Split it; for a sorted-order split, with the page the next records land in.
    Split(Option<OpenEnd>),
}

impl Merged {
    fn split(&self) -> bool {
        matches!(self, Merged::Split(_))
    }
}

/// The open end of a sorted-order split when it is the first page, which keeps the
/// split page's id (descending keys, or a run in the page's lower part): it takes the
/// next records of that order while the pages packed full take none. The writer that
/// split keeps it in the pool as a mirror (`Core::mirror_open_end`) once its old
/// mini-page is gone. (An open end among the new right-hand pages is mirrored by
/// `split_leaf` before anyone can reach it.)
struct OpenEnd {
    leaf: PageNo,
    /// The page as written.
    page: Box<Page>,
}

/// Pages whose dirty mini-pages `flush` merges with one batched read and write.
const FLUSH_BATCH_PAGES: usize = 32;

/// A leaf page that overflows moves records into a neighbour only if the two then hold
/// at most this share of two pages ([`Config::leaf_redistribution`]). Lower, more splits;
/// higher, the two pages are nearly full and soon overflow again, each time at the cost
/// of the neighbour's IO. A simulation of random inserts (docs/design.md) gave pages
/// 80.8% full at 90%.
const REDISTRIBUTE_FILL_PERCENT: usize = 90;

/// Distinct leaf pages `get_many` reads in one batch (bounds its buffers to 512 KiB).
const GET_MANY_BATCH_PAGES: usize = 128;

/// A leaf page a read still needs, noted under the page's lock so that the page can be
/// read later without the lock and validated (`Core::finish_read`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeafTicket {
    pub(crate) pid: PageId,
    /// The leaf page to read.
    pub(crate) leaf: PageNo,
    /// The page's leaf-write counter when the ticket was taken.
    version: u64,
    prefix_len: usize,
}

/// What a probe of the mini-pages found.
pub(crate) enum Probe {
    /// Answered without the leaf page: whether the key exists (its value is in `out`).
    Done(bool),
    /// The leaf page must be read.
    Leaf(LeafTicket),
}

/// Looks `key` up in a leaf node, appending its value to `out` if present.
fn search_leaf(leaf: &NodeRef<'_>, key: &[u8], out: &mut Vec<u8>) -> Found {
    match leaf.search(key) {
        Ok(i) => {
            out.extend_from_slice(leaf.value(i));
            Found::Value
        }
        Err(_) => Found::Absent,
    }
}

impl Core {
    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if key.len() > self.config.max_key_bytes {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: self.config.max_key_bytes,
            });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            let cause = self.failure.lock().clone().unwrap_or_default();
            return Err(Error::Poisoned { cause });
        }
        Ok(())
    }

    fn record_failure(&self, e: &Error) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(e.to_string());
        }
        self.failed.store(true, Ordering::Release);
    }

    fn root(&self) -> &InnerNode {
        // SAFETY: the root pointer always holds a live inner node, and inner nodes are
        // freed only when the tree drops.
        unsafe { &*self.root.load(Ordering::Acquire) }
    }

    /// Follows a child reference of a level-2+ inner node.
    fn inner_at(&self, child: u64) -> &InnerNode {
        // SAFETY: child references above level 1 are addresses of `InnerNode`s created by
        // this tree and freed only when it drops.
        unsafe { &*(child as usize as *const InnerNode) }
    }

    // ----------------------------------------------------------------------------------
    // Traversal
    // ----------------------------------------------------------------------------------

    /// Traverses to the page chosen by `target`, pinning an epoch only for the traversal:
    /// the returned path refers to inner nodes, which live as long as the tree, so no pin
    /// is held while the caller waits for a page lock or does IO.
    fn locate(&self, target: Target<'_>) -> Result<Option<LeafPath<'_>>, Restart> {
        let guard = epoch::pin();
        self.find_leaf(target, &guard)
    }

    /// Traverses to the page holding `target`, takes its lock with `lock` (the mapping
    /// table's `read` or `write`) and then validates the parent's version: a split
    /// changes the parent before it releases the leaf's lock, so a validated parent
    /// proves the page still covers `target`. Restarts from the root until both hold.
    /// `None`: no page holds `target` (a `Below` or `Last` target at the edge of the key
    /// space; a `Holding` target always has a page).
    fn lock_leaf<'t, G>(
        &'t self,
        target: Target<'_>,
        lock: impl Fn(&'t MappingTable, PageId) -> G,
    ) -> Option<(LeafPath<'t>, G)> {
        loop {
            let path = match self.locate(target) {
                Ok(Some(path)) => path,
                Ok(None) => return None,
                Err(Restart) => {
                    bump(&self.counters.restarts);
                    continue;
                }
            };
            let page = lock(&self.mapping, path.pid);
            if path.parent.version.validate(path.parent_version).is_err() {
                bump(&self.counters.restarts);
                continue;
            }
            return Some((path, page));
        }
    }

    /// `lock_leaf` for the page holding `key`, which always exists.
    fn lock_leaf_of<'t, G>(
        &'t self,
        key: &[u8],
        lock: impl Fn(&'t MappingTable, PageId) -> G,
    ) -> (LeafPath<'t>, G) {
        self.lock_leaf(Target::Holding(key), lock)
            .expect("the root covers every key, so a key always has a page")
    }

    /// Traverses to the page chosen by `target`. `Ok(None)` means no page qualifies
    /// (only for [`Target::Below`] when no key lies below the given one).
    fn find_leaf<'t>(
        &'t self,
        target: Target<'_>,
        guard: &Guard,
    ) -> Result<Option<LeafPath<'t>>, Restart> {
        if let Target::Holding(key) = target
            && let Some(path) = self.locate_from_hint(key, guard)
        {
            return Ok(Some(path));
        }
        let mut node = self.root();
        let mut version = node.version.read_begin()?;
        loop {
            let bytes = node.bytes(guard);
            let n = NodeRef::trusted(bytes);
            // The root may have been split (it then no longer covers everything), and a
            // reader may hold a stale root pointer: fences tell.
            let index = match target {
                Target::Holding(key) => {
                    if !n.covers(key) {
                        return Err(Restart);
                    }
                    Some(inner::child_for(&n, key))
                }
                Target::Below(key) => {
                    if !covers_below(&n, key) {
                        return Err(Restart);
                    }
                    inner::child_before(&n, key)
                }
                Target::Last => {
                    if !matches!(n.high_fence(), Some(node::Fence::Unbounded) | None) {
                        return Err(Restart);
                    }
                    n.len().checked_sub(1)
                }
            };
            let Some(index) = index else {
                node.version.validate(version)?;
                return Ok(None);
            };
            if node.level == 1 {
                let path = LeafPath::at(node, version, &n, index)?;
                LOCATE_HINT.set((self.id, node));
                return Ok(Some(path));
            }
            let next = self.inner_at(inner::child_ref(&n, index));
            let next_version = next.version.read_begin()?;
            node.version.validate(version)?;
            node = next;
            version = next_version;
        }
    }

    /// The page holding `key` found from the level-1 inner node this thread's last
    /// descent of this tree ended in, without descending from the root; `None` when that
    /// node no longer covers `key` (or is being changed), and the caller descends.
    ///
    /// Any level-1 node whose fences cover `key` routes it to the right page: inner nodes
    /// are never freed or merged while the tree lives, a split narrows a node's fences
    /// in the same publication that hands the rest to its new sibling, and a node's bytes
    /// are authoritative for the range its fences give (the argument that lets a
    /// descent start from a stale root pointer). The page is then validated with this
    /// node's version exactly as after a descent (`lock_leaf`). A sorted load or a scan
    /// of neighbouring keys stays under one level-1 node for many operations and skips
    /// the searches above it; a random key misses at the cost of one fence check.
    fn locate_from_hint<'t>(&'t self, key: &[u8], guard: &Guard) -> Option<LeafPath<'t>> {
        let (tree, node) = LOCATE_HINT.get();
        if tree != self.id {
            return None;
        }
        // SAFETY: the hint was set by a descent of this tree (tree ids are never
        // reused) to one of its inner nodes, and inner nodes are freed only when the tree
        // drops, which it cannot have done while `self` is borrowed.
        let node: &'t InnerNode = unsafe { &*node };
        let version = node.version.read_begin().ok()?;
        let n = NodeRef::trusted(node.bytes(guard));
        if !n.covers(key) {
            return None;
        }
        LeafPath::at(node, version, &n, inner::child_for(&n, key)).ok()
    }

    /// The inner nodes from the root down to the level-1 node routing `key`, with the
    /// versions seen. Used by splits, which then upgrade what they change.
    fn find_path<'g>(
        &'g self,
        key: &[u8],
        guard: &'g Guard,
    ) -> Result<Vec<(&'g InnerNode, u64)>, Restart> {
        let mut path = Vec::with_capacity(8);
        let mut node = self.root();
        let mut version = node.version.read_begin()?;
        loop {
            let n = NodeRef::trusted(node.bytes(guard));
            if !n.covers(key) {
                return Err(Restart);
            }
            let child = inner::child_ref(&n, inner::child_for(&n, key));
            path.push((node, version));
            if node.level == 1 {
                node.version.validate(version)?;
                return Ok(path);
            }
            let next = self.inner_at(child);
            let next_version = next.version.read_begin()?;
            node.version.validate(version)?;
            node = next;
            version = next_version;
        }
    }

    // ----------------------------------------------------------------------------------
    // Reads
    // ----------------------------------------------------------------------------------

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        // No lock is held across the leaf page's IO: the mini-page is probed under the
        // page's read lock, the leaf page read without it, and the answer (and the
        // record cached from it) validated by the page's leaf-write counter under the
        // lock again. Other reads and writes of a hot page go on during the IO.
        let ticket = match self.probe(key, out)? {
            Probe::Done(exists) => return Ok(exists),
            Probe::Leaf(ticket) => ticket,
        };
        let promote = self.promote_point_read(key);
        let mut page = Page::zeroed();
        // A failed read may have met a page being rewritten (a torn page fails its
        // checksum): the locked read below reports real errors.
        if self.store.read_page(ticket.leaf, &mut page).is_ok() {
            bump(&self.counters.leaf_reads);
            if let Some(exists) = self.finish_read(key, &ticket, &page, out, promote)? {
                return Ok(exists);
            }
            bump(&self.counters.stale_leaf_reads);
        }
        out.clear();
        self.get_under_lock(key, out, promote)
    }

    /// Reads `key` holding its page's lock across the leaf page's IO: the fallback when
    /// a read without the lock went stale. A read that caches what the leaf page says
    /// takes the page's write lock *before* reading the leaf page, so the leaf cannot
    /// change between the read and the insertion of the cached record.
    fn get_under_lock(&self, key: &[u8], out: &mut Vec<u8>, promote: bool) -> Result<bool> {
        loop {
            // The read lock is released before the write lock is taken.
            let (path, shared) = {
                let (path, page) = self.lock_leaf_of(key, MappingTable::read);
                let shared = self.get_locked(page.location(), key, out, !promote)?;
                (path, shared)
            };
            let (found, touched) = match shared {
                Some(result) => result,
                None => {
                    let page = self.mapping.write(path.pid);
                    if path.parent.version.validate(path.parent_version).is_err() {
                        bump(&self.counters.restarts);
                        continue;
                    }
                    self.get_promoting(&page, path.prefix_len, key, out)?
                }
            };
            if let Some(block) = touched {
                self.touch(path.pid, block, key);
            }
            return Ok(matches!(found, Found::Value));
        }
    }

    /// Reads `key` under a page lock. Also returns the mini-page block when the hit
    /// there needs maintenance (reference bit, copy-on-access) after unlocking.
    /// `Ok(None)`: the mini-page does not know the key and `read_leaf` is false.
    fn get_locked(
        &self,
        location: Location,
        key: &[u8],
        out: &mut Vec<u8>,
        read_leaf: bool,
    ) -> Result<Option<(Found, Option<Block>)>> {
        let leaf_no = match location {
            Location::Mini(offset) => {
                let block = self.block(offset);
                // SAFETY: we hold the page's lock, so the block is live and unchanged.
                let header = unsafe { MiniHeader::of(&block) };
                // SAFETY: as above.
                let mini = unsafe { mini_ref(&block) };
                match mini.search(key) {
                    Ok(i) => {
                        let r = mini.record(i);
                        let found = if r.record_type().exists() {
                            out.extend_from_slice(r.value());
                            Found::Value
                        } else {
                            Found::Absent
                        };
                        let maintain = !r.ref_bit() || self.pool.in_copy_on_access_region(&block);
                        return Ok(Some((found, maintain.then_some(block))));
                    }
                    Err(_) if header.mirror => return Ok(Some((Found::Absent, None))),
                    Err(_) => header.leaf,
                }
            }
            Location::Leaf(no) => PageNo(no),
            Location::Empty => unreachable!("a routed page id is in use"),
        };
        if !read_leaf {
            return Ok(None);
        }
        let mut page = Page::zeroed();
        let leaf = self.read_leaf(leaf_no, &mut page)?;
        Ok(Some((search_leaf(&leaf, key, out), None)))
    }

    /// Reads `key` under the page's write lock and caches what the leaf page said (the
    /// record, or a phantom for a miss) in the mini-page.
    fn get_promoting(
        &self,
        page: &mapping::WriteGuard<'_>,
        prefix_len: usize,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(Found, Option<Block>)> {
        let location = page.location();
        if let Some(hit) = self.get_locked(location, key, out, false)? {
            return Ok(hit);
        }
        let mut leaf_page = Page::boxed();
        let leaf_no = self.leaf_of(location);
        let leaf = self.read_leaf(leaf_no, &mut leaf_page)?;
        let found = search_leaf(&leaf, key, out);
        if !self.mirror_read(page, location, leaf_no, &leaf) {
            self.cache_read(page, prefix_len, key, found, out)?;
        }
        Ok((found, None))
    }

    /// Whether a scan that reaches a leaf page should cache it: always while the pool
    /// has mirror room, else by the scan promotion chance.
    fn promote_scan(&self) -> bool {
        self.config.scan_promotion_rate_percent > 0
            && (self.mirror_room() || chance(self.config.scan_promotion_rate_percent))
    }

    /// Whether a point read of `key` that reaches its leaf page should cache what it
    /// reads: always while the pool has mirror room or room for records; else when the
    /// key's leaf-page read is the second in the doorkeeper's window (`admission`), or by
    /// the promotion chance. Call it once per leaf-page read: it records the read (unless
    /// the pool's room already decided).
    pub(crate) fn promote_point_read(&self, key: &[u8]) -> bool {
        if self.config.promotion_rate_percent == 0 {
            return false;
        }
        self.mirror_room()
            || self.record_room()
            || self.doorkeeper.seen_again(key)
            || chance(self.config.promotion_rate_percent)
    }

    /// Merges the dirty records of the page's mini-page `old` into its leaf page
    /// `leaf_no` and drops the mini-page, as eviction would (splitting the leaf if
    /// needed), because they do not fit in a mirror next to the leaf's records: the next
    /// read or scan of the page then finds none and mirrors it. Returns whether it
    /// merged; a failed merge leaves the page as it was, for eviction to retry. The
    /// caller holds the page's write lock.
    fn merge_for_mirror(
        &self,
        page: &mapping::WriteGuard<'_>,
        old: Block,
        leaf_no: PageNo,
    ) -> bool {
        // SAFETY: the caller holds the page's write lock, so the block is live and
        // unchanged while we read it.
        let (header, mini) = unsafe { (MiniHeader::of(&old), mini_ref(&old)) };
        if !mini.iter().any(|r| r.record_type().is_dirty()) {
            return false;
        }
        if self
            .merge(page.id(), header, Some(mini), None, false)
            .is_err()
        {
            return false;
        }
        page.set_location(Location::Leaf(leaf_no.0));
        self.retire(old);
        true
    }

    /// Whether the pool is still on its first lap with room to spare, so that caching a
    /// whole leaf page costs no eviction.
    ///
    /// Departure from the paper, which caches single records on reads (and whole pages
    /// only from scans): while the data fits in the budget, record-by-record caching
    /// makes every read of a not-yet-cached record pay a leaf-page read and check, and a
    /// page reaches the pool one record at a time. bfdb mirrors the whole leaf page
    /// instead while the pool is on its first lap (its tail has not reached its
    /// capacity) and the bytes in use are below `MIRROR_ROOM_PERCENT` of it. Once the
    /// tail has wrapped, it never is on its first lap again (the tail only grows), and
    /// reads go back to the paper's record caching, which is what a budget smaller than
    /// the data needs; the mirrors made early age out through the head like any clean
    /// mini-page. (The room was the tail's position alone until session 8: a sorted load
    /// frees most of what it allocates, and the open ends it kept in the pool moved the
    /// tail to 67% of the first lap where it had been at 41%, which left reads right
    /// after it a third of the mirrors.)
    fn mirror_room(&self) -> bool {
        const MIRROR_ROOM_PERCENT: u64 = 80;
        self.config.promotion_rate_percent > 0
            && self.pool.addresses().tail + MAX_MINI_BLOCK_BYTES as u64
                <= self.pool.capacity_bytes()
            && self.pool_in_use_below(MIRROR_ROOM_PERCENT)
    }

    /// Whether the pool's bytes in use, with one more block of the largest class, stay
    /// below `percent` of its capacity.
    fn pool_in_use_below(&self, percent: u64) -> bool {
        self.pool.bytes_in_use() + MAX_MINI_BLOCK_BYTES as u64
            <= self.pool.capacity_bytes() / 100 * percent
    }

    /// Whether the pool has room to spare for a read's record, so that caching it needs
    /// no eviction: its bytes in use are below `RECORD_ROOM_PERCENT` of the capacity,
    /// whatever the lap.
    ///
    /// Departure from the paper and from the doorkeeper's rule alone: both decide which
    /// records may push others out, and apply the same filter when nothing would be
    /// pushed out. After a load and its flush the pool was 62% in use (clean copies of
    /// the last records written), and reads cached only the 26-28% of their leaf-page
    /// reads that the doorkeeper or the chance let through, while the rest of the pool
    /// stayed empty for 30 s and more (docs/benchmarks.md, session 9). The mark sits
    /// below where a full pool settles (93-94% in use in read phases with this mark, 97%
    /// during a load: free-list blocks of other classes and the evictor's reserve are
    /// not in use), so that in steady state the filter decides again. At 95% the pool
    /// settled at 90-92%, every read was cached, and a uniform 50/50 mix wrote 43% more
    /// bytes per operation.
    fn record_room(&self) -> bool {
        const RECORD_ROOM_PERCENT: u64 = 90;
        self.pool_in_use_below(RECORD_ROOM_PERCENT)
    }

    /// Replaces the page's mini-page (if any) by a mirror of `leaf`, the leaf page just
    /// read under the page's write lock, when the pool has mirror room; best effort,
    /// never evicts. Returns true when the read must cache nothing more: the page is a
    /// mirror now, or its mini-page was merged to make room for one.
    fn mirror_read(
        &self,
        page: &mapping::WriteGuard<'_>,
        location: Location,
        leaf_no: PageNo,
        leaf: &NodeRef<'_>,
    ) -> bool {
        if !self.mirror_room() || self.check_writable().is_err() {
            return false;
        }
        let old = match location {
            Location::Mini(offset) => Some(self.block(offset)),
            Location::Leaf(_) => None,
            Location::Empty => return false,
        };
        // SAFETY: we hold the page's write lock, so the old mini-page is live and
        // unchanged while we read it.
        let mini = old.map(|b| unsafe { mini_ref(&b) });
        let block =
            match self.build_mirror(page, leaf_no, leaf, mini.as_ref(), MAX_MINI_BLOCK_BYTES) {
                Ok(block) => block,
                Err(MirrorRefused::NoRoom) => return false,
                // The dirty records do not fit next to the leaf's. Merge them into the leaf
                // page now, as eviction would (splitting it if needed), so that the next
                // read of the page finds no dirty records and mirrors it. A failed merge
                // leaves the page as it was; eviction retries it later.
                // A split may have moved the key to another page: caching it here could put
                // it in the wrong one, so after a merge the read caches nothing.
                Err(MirrorRefused::TooFull) => {
                    return old.is_some_and(|old| self.merge_for_mirror(page, old, leaf_no));
                }
            };
        self.publish(page, block);
        if let Some(old) = old {
            self.retire(old);
        }
        bump(&self.counters.mirrors_created);
        true
    }

    /// A new, unpublished mirror of page `page`'s leaf page `leaf` (number `leaf_no`)
    /// and the dirty records of its mini-page `mini`, in a block of `block_bytes`
    /// (`leaf::build_mirror`). Never evicts: `NoRoom` if the pool has no unused block;
    /// `TooFull` if the dirty records do not fit next to the leaf's.
    fn build_mirror(
        &self,
        page: &mapping::WriteGuard<'_>,
        leaf_no: PageNo,
        leaf: &NodeRef<'_>,
        mini: Option<&NodeRef<'_>>,
        block_bytes: usize,
    ) -> Result<Block, MirrorRefused> {
        let block = self
            .pool
            .try_alloc(block_bytes)
            .map_err(|_| MirrorRefused::NoRoom)?;
        // SAFETY: a fresh, unpublished block: ours alone.
        let bytes = unsafe { self::block_bytes(&block) };
        MiniHeader {
            pid: page.id(),
            leaf: leaf_no,
            mirror: true,
        }
        .write(bytes);
        if leaf::build_mirror(&mut bytes[MINI_HEADER_BYTES..], leaf, mini).is_err() {
            // SAFETY: never published, so nobody else knows the block.
            unsafe { self.pool.free(block) };
            return Err(MirrorRefused::TooFull);
        }
        Ok(block)
    }

    /// Caches what the leaf page said about `key` (the record in `out`, or a phantom for
    /// a miss) in the mini-page. The caller holds the page's write lock and read the leaf
    /// page under it, or validated a read made without it. Best effort: if the pool
    /// cannot make room without blocking, nothing is cached.
    fn cache_read(
        &self,
        page: &mapping::WriteGuard<'_>,
        prefix_len: usize,
        key: &[u8],
        found: Found,
        out: &[u8],
    ) -> Result<()> {
        if self.check_writable().is_err() {
            return Ok(());
        }
        let (value, record_type) = match found {
            Found::Value => (out, RecordType::Cache),
            Found::Absent => (&[][..], RecordType::Phantom),
        };
        match self.put_in_mini(page, prefix_len, key, value, record_type) {
            Ok(()) => bump(if matches!(found, Found::Value) {
                &self.counters.records_promoted
            } else {
                &self.counters.phantoms_promoted
            }),
            Err(Op::Fail(e)) => return Err(e),
            Err(Op::Restart | Op::WouldBlock) => {}
        }
        Ok(())
    }

    /// The leaf page behind a location. The caller holds the page's lock.
    fn leaf_of(&self, location: Location) -> PageNo {
        match location {
            Location::Mini(offset) => {
                let block = self.block(offset);
                // SAFETY: the caller holds the page's lock, so the block is live.
                unsafe { MiniHeader::of(&block) }.leaf
            }
            Location::Leaf(no) => PageNo(no),
            Location::Empty => unreachable!("a routed page id is in use"),
        }
    }

    // ----------------------------------------------------------------------------------
    // Reads whose leaf page is read without the page lock (get_many, prefetch, async)
    // ----------------------------------------------------------------------------------

    /// Answers `key` from its mini-page if it can, under the page's read lock; otherwise
    /// returns a ticket for reading the leaf page later without the lock.
    pub(crate) fn probe(&self, key: &[u8], out: &mut Vec<u8>) -> Result<Probe> {
        let (path, page) = self.lock_leaf_of(key, MappingTable::read);
        let location = page.location();
        Ok(match self.get_locked(location, key, out, false)? {
            Some((found, touched)) => {
                drop(page);
                if let Some(block) = touched {
                    self.touch(path.pid, block, key);
                }
                Probe::Done(matches!(found, Found::Value))
            }
            None => Probe::Leaf(self.ticket(path.pid, location, path.prefix_len)),
        })
    }

    /// A ticket for the leaf page of `pid` at `location`. The caller holds `pid`'s lock.
    fn ticket(&self, pid: PageId, location: Location, prefix_len: usize) -> LeafTicket {
        LeafTicket {
            pid,
            leaf: self.leaf_of(location),
            version: self.leaf_version(pid).load(Ordering::Relaxed),
            prefix_len,
        }
    }

    /// Whether a leaf page read since `ticket` was taken, without the lock, still holds
    /// the page's current contents, and the page still covers the keys it covered. The
    /// caller holds `ticket.pid`'s lock again and passes its location.
    ///
    /// Argument: the counter only grows, and it is bumped under the write lock by every
    /// leaf write of the page (merges, eviction, flush, and the split that rewrites the
    /// left page in place, which is also the only way the page's key range shrinks). The
    /// ticket and this check both read it under the page lock, and the read happened in
    /// between. An unchanged counter therefore means no write lock holder wrote the leaf
    /// page from before the ticket until now, so the bytes read are neither torn nor
    /// stale, and the page's range is what it was.
    fn ticket_valid(&self, ticket: &LeafTicket, location: Location) -> bool {
        location != Location::Empty
            && self.leaf_version(ticket.pid).load(Ordering::Relaxed) == ticket.version
            && self.leaf_of(location) == ticket.leaf
    }

    /// Whether `ticket` still describes its page's leaf page (no leaf write since). Takes
    /// the page's read lock for the check.
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn ticket_current(&self, ticket: &LeafTicket) -> bool {
        let page = self.mapping.read(ticket.pid);
        self.ticket_valid(ticket, page.location())
    }

    /// Finishes a read of `key` that `probe` sent to the leaf page, with `leaf_page` as
    /// read (without the lock) after the ticket was taken. `Ok(None)`: the read is stale,
    /// do it again under the lock. With `promote`, caches what the leaf said under the
    /// write lock, as [`Core::get`] does.
    pub(crate) fn finish_read(
        &self,
        key: &[u8],
        ticket: &LeafTicket,
        leaf_page: &Page,
        out: &mut Vec<u8>,
        promote: bool,
    ) -> Result<Option<bool>> {
        out.clear();
        if promote && self.check_writable().is_ok() {
            let page = self.mapping.write(ticket.pid);
            let location = page.location();
            if !self.ticket_valid(ticket, location) {
                return Ok(None);
            }
            // The mini-page may have learnt the key since the probe: it is newer.
            if let Some((found, touched)) = self.get_locked(location, key, out, false)? {
                drop(page);
                if let Some(block) = touched {
                    self.touch(ticket.pid, block, key);
                }
                return Ok(Some(matches!(found, Found::Value)));
            }
            let leaf = self.parse_leaf(ticket.leaf, leaf_page)?;
            let found = search_leaf(&leaf, key, out);
            if !self.mirror_read(&page, location, ticket.leaf, &leaf) {
                self.cache_read(&page, ticket.prefix_len, key, found, out)?;
            }
            return Ok(Some(matches!(found, Found::Value)));
        }
        let page = self.mapping.read(ticket.pid);
        let location = page.location();
        if !self.ticket_valid(ticket, location) {
            return Ok(None);
        }
        if let Some((found, touched)) = self.get_locked(location, key, out, false)? {
            drop(page);
            if let Some(block) = touched {
                self.touch(ticket.pid, block, key);
            }
            return Ok(Some(matches!(found, Found::Value)));
        }
        let found = search_leaf(&self.parse_leaf(ticket.leaf, leaf_page)?, key, out);
        Ok(Some(matches!(found, Found::Value)))
    }

    /// Point reads of many keys: mini-pages first, then every leaf page still needed in
    /// one batched read per `GET_MANY_BATCH_PAGES` distinct pages.
    fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut results: Vec<Option<Vec<u8>>> = Vec::with_capacity(keys.len());
        // Keys waiting for a leaf page: index, ticket, promotion coin.
        let mut pending: Vec<(usize, LeafTicket, bool)> = Vec::new();
        let mut leaves: Vec<PageNo> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let mut out = Vec::new();
            match self.probe(key.as_ref(), &mut out)? {
                Probe::Done(exists) => results.push(exists.then_some(out)),
                Probe::Leaf(ticket) => {
                    let promote = self.promote_point_read(key.as_ref());
                    results.push(None);
                    if !leaves.contains(&ticket.leaf) {
                        leaves.push(ticket.leaf);
                    }
                    pending.push((i, ticket, promote));
                }
            }
            if leaves.len() == GET_MANY_BATCH_PAGES {
                self.finish_many(keys, &mut pending, &mut leaves, &mut results)?;
            }
        }
        self.finish_many(keys, &mut pending, &mut leaves, &mut results)?;
        Ok(results)
    }

    /// Reads the leaf pages `leaves` in one batch and answers the `pending` keys from
    /// them; a key whose page changed meanwhile is read again under its lock.
    fn finish_many<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        pending: &mut Vec<(usize, LeafTicket, bool)>,
        leaves: &mut Vec<PageNo>,
        results: &mut [Option<Vec<u8>>],
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        leaves.sort_unstable();
        let mut pages: Vec<Box<Page>> = leaves.iter().map(|_| Page::boxed()).collect();
        // A failed batch may have failed on a page read while a writer rewrote it (a
        // torn page fails its checksum): every key then goes the locked way, which
        // reports a real error.
        let read_ok = self.read_leaves(leaves, &mut pages).is_ok();
        for (i, ticket, promote) in pending.drain(..) {
            let key = keys[i].as_ref();
            let mut out = Vec::new();
            let mut found = None;
            if read_ok {
                let slot = leaves
                    .binary_search(&ticket.leaf)
                    .expect("every pending leaf was read");
                found = self.finish_read(key, &ticket, &pages[slot], &mut out, promote)?;
                if found.is_none() {
                    bump(&self.counters.stale_leaf_reads);
                }
            }
            let exists = match found {
                Some(exists) => exists,
                None => {
                    out.clear();
                    self.get_under_lock(key, &mut out, promote)?
                }
            };
            results[i] = exists.then_some(out);
        }
        leaves.clear();
        Ok(())
    }

    /// Reads leaf pages `nos` into `pages` with one `read_pages` call. The pages are
    /// checked (`parse_leaf`) only once their read is validated.
    fn read_leaves(&self, nos: &[PageNo], pages: &mut [Box<Page>]) -> Result<()> {
        debug_assert_eq!(nos.len(), pages.len());
        let mut reqs: Vec<(PageNo, &mut Page)> = nos
            .iter()
            .copied()
            .zip(pages.iter_mut().map(|p| &mut **p))
            .collect();
        self.store.read_pages(&mut reqs)?;
        bump_by(&self.counters.leaf_reads, nos.len());
        if nos.len() > 1 {
            bump_by(&self.counters.batched_leaf_reads, nos.len());
        }
        Ok(())
    }

    /// After a mini-page hit: set the record's reference bit, and copy the mini-page to
    /// the tail if it sits in the copy-on-access region. Best effort, never waits.
    fn touch(&self, pid: PageId, block: Block, key: &[u8]) {
        let Some(page) = self.mapping.try_write(pid) else {
            return;
        };
        // The same offset is not enough: after the pool wraps a lap, another block (of
        // another size) may sit there. The block at the offset must be this one.
        if page.location() != Location::Mini(block.offset()) || self.block(block.offset()) != block
        {
            return;
        }
        // SAFETY: we hold the page's write lock; no other view of the block is alive.
        let mut mini = unsafe { mini_mut(&block) };
        if let Ok(i) = mini.as_ref().search(key) {
            mini.set_ref_bit(i, true);
        }
        if self.pool.in_copy_on_access_region(&block) {
            let _ = self.copy_to_tail(&page, block);
        }
    }

    fn read_leaf<'p>(&self, no: PageNo, page: &'p mut Page) -> Result<NodeRef<'p>> {
        self.store.read_page(no, page)?;
        bump(&self.counters.leaf_reads);
        self.parse_leaf(no, page)
    }

    /// Checks the node in a leaf page read from `no`.
    fn parse_leaf<'p>(&self, no: PageNo, page: &'p Page) -> Result<NodeRef<'p>> {
        NodeRef::parse(page.payload()).map_err(|e| Error::Corrupted {
            page: no.0,
            reason: e.to_string(),
        })
    }

    /// Writes the leaf page of `pid`, whose write lock the caller holds. A failure
    /// poisons the tree.
    fn write_leaf(&self, pid: PageId, no: PageNo, page: &mut Page) -> Result<()> {
        self.note_leaf_write(pid);
        debug_assert!(NodeRef::parse(page.payload()).is_ok());
        if let Err(e) = self.store.write_page(no, page) {
            let e = Error::from(e);
            self.record_failure(&e);
            return Err(e);
        }
        self.mapping.set_fill_hint(pid, leaf_used_bytes(page));
        bump(&self.counters.leaf_writes);
        Ok(())
    }

    /// Bumps `pid`'s leaf-write counter. The caller holds `pid`'s write lock and is
    /// about to write its leaf page: a reader that read the page without the lock then
    /// sees the counter move and discards what it read.
    fn note_leaf_write(&self, pid: PageId) {
        // Relaxed: for `pid` the counter is bumped under its write lock and read under
        // its lock, whose acquire and release order those accesses. The other ids of
        // the stripe bump it under their own locks: that can only show a reader a change
        // that was not its page's (a needless retry), never hide one.
        self.leaf_version(pid).fetch_add(1, Ordering::Relaxed);
    }

    /// The leaf-write counter of `pid` (shared with the other ids of its stripe).
    fn leaf_version(&self, pid: PageId) -> &AtomicU64 {
        &self.counters.leaf_versions.0[(pid.0 % LEAF_VERSION_STRIPES as u64) as usize]
    }

    /// The block at a mapping-table offset. The caller holds the page's lock.
    fn block(&self, offset: u64) -> Block {
        // SAFETY: the mapping table holds only offsets of published mini-page blocks,
        // which stay allocated while their page lock (held by the caller) is held.
        unsafe { self.pool.block_at(offset) }.expect("a mapped mini-page is a live block")
    }

    // ----------------------------------------------------------------------------------
    // Writes
    // ----------------------------------------------------------------------------------

    /// Upserts (`Some(value)`) or deletes (`None`) `key`.
    fn write(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        let (value, record_type) = match value {
            Some(v) => (v, RecordType::Insert),
            None => (&[][..], RecordType::Tombstone),
        };
        let evict_failures = self.evict_failures.load(Ordering::Acquire);
        loop {
            self.check_writable()?;
            let (path, page) = self.lock_leaf_of(key, MappingTable::write);
            match self.put_in_mini(&page, path.prefix_len, key, value, record_type) {
                Ok(()) => return Ok(()),
                Err(Op::Fail(e)) => return Err(e),
                Err(Op::Restart) => {
                    drop(page);
                    bump(&self.counters.restarts);
                }
                Err(Op::WouldBlock) => {
                    drop(page);
                    bump(&self.counters.restarts);
                    self.help_evict();
                    // Room cannot be made while evicting dirty mini-pages fails (say, their
                    // leaf pages cannot be read): report it instead of spinning.
                    if self.evict_failures.load(Ordering::Acquire) != evict_failures {
                        let why = self.evict_error.lock().clone().unwrap_or_default();
                        return Err(Error::Io(std::io::Error::other(format!(
                            "no room for the write: evicting a dirty mini-page failed: {why}"
                        ))));
                    }
                }
            }
        }
    }

    /// Evicts from the pool's head while holding no page lock: the block that blocked an
    /// allocation may be the caller's own mini-page.
    fn help_evict(&self) {
        if !self.pool.evict_until(MAX_MINI_BLOCK_BYTES as u64 * 2, self) {
            crate::sync::thread::yield_now();
        }
    }

    /// Puts one record into the page's mini-page, creating, copying, growing or merging
    /// it as needed (Bf-Tree §5.2). The caller holds the page's write lock.
    fn put_in_mini(
        &self,
        page: &mapping::WriteGuard<'_>,
        prefix_len: usize,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        let block = match page.location() {
            Location::Leaf(no) => {
                return self.create_mini(page, prefix_len, PageNo(no), key, value, record_type);
            }
            Location::Mini(offset) => self.block(offset),
            Location::Empty => unreachable!("a routed page id is in use"),
        };
        let block = if self.pool.in_copy_on_access_region(&block) {
            match self.copy_to_tail(page, block) {
                Some(moved) => moved,
                None => return self.put_in_mini(page, prefix_len, key, value, record_type),
            }
        } else {
            block
        };
        // SAFETY: we hold the page's write lock; this is the only view of the block.
        let header = unsafe { MiniHeader::of(&block) };
        // SAFETY: as above.
        let mut mini = unsafe { mini_mut(&block) };
        if record_type == RecordType::Tombstone
            && header.mirror
            && mini.as_ref().search(key).is_err()
        {
            // A mirror holds every record of its leaf: the key is absent already.
            return Ok(());
        }
        if place(&mut mini, key, value, record_type) {
            return Ok(());
        }
        let node_size = block.size_bytes() - MINI_HEADER_BYTES;
        let can_grow = !header.mirror && block.size_bytes() < MAX_MINI_BLOCK_BYTES;
        if can_grow && node_size < self.config.merge_threshold_bytes {
            return self.grow_mini(page, block, header, key, value, record_type);
        }
        // At the merge threshold. For a write, clean records not read since the last pass
        // go first: dropping them costs no IO (a merge leaves the records it wrote as
        // clean copies, so without this the next new key merged again, for that one
        // record). A read being cached does not displace them; `merge_full` drops it.
        if !header.mirror
            && record_type.is_dirty()
            && drop_cold_clean(&mut mini)
            && place(&mut mini, key, value, record_type)
        {
            return Ok(());
        }
        // At the merge threshold. With a background evictor, a write grows the mini-page
        // on and leaves the merge to it (batched, and the writer does not wait for the
        // leaf IO); at full size, or without one, the writer merges now.
        if can_grow && record_type.is_dirty() && self.queue_merge(page.id()) {
            return self.grow_mini(page, block, header, key, value, record_type);
        }
        self.merge_full(page, block, header, key, value, record_type)
    }

    /// Allocates a block of at least `size` payload bytes; `WouldBlock` passes up.
    fn alloc(&self, size: usize) -> Result<Block, Op> {
        match self.pool.alloc(size, self) {
            Ok(b) => {
                self.after_alloc();
                Ok(b)
            }
            Err(AllocError::WouldBlock) => Err(Op::WouldBlock),
            Err(e) => Err(Op::Fail(Error::InvalidConfig(format!(
                "mini-page allocation failed: {e}"
            )))),
        }
    }

    fn create_mini(
        &self,
        page: &mapping::WriteGuard<'_>,
        prefix_len: usize,
        leaf_no: PageNo,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        let fences = mini_fences(key, prefix_len);
        let need = MINI_HEADER_BYTES
            + leaf::empty_node_bytes(&fences)
            + leaf::record_cost(key.len() - prefix_len, value.len());
        let block = self.alloc(need)?;
        // SAFETY: the block is freshly allocated and not yet published: ours alone.
        let bytes = unsafe { block_bytes(&block) };
        MiniHeader {
            pid: page.id(),
            leaf: leaf_no,
            mirror: false,
        }
        .write(bytes);
        let mut mini = NodeMut::init(&mut bytes[MINI_HEADER_BYTES..], NodeKind::Mini, fences)
            .expect("the block was sized for an empty node");
        let i = mini
            .insert(key, value, record_type)
            .expect("the block was sized for the record");
        mini.set_ref_bit(i, record_type.is_dirty());
        self.publish(page, block);
        bump(&self.counters.mini_pages_created);
        Ok(())
    }

    /// Makes `block` the page's mini-page.
    fn publish(&self, page: &mapping::WriteGuard<'_>, block: Block) {
        // SAFETY: the block is initialised, and we hold the page's write lock, which
        // the evictor must take before it can look at the block.
        unsafe { self.pool.publish(&block) };
        page.set_location(Location::Mini(block.offset()));
    }

    /// Frees a mini-page block that the mapping table no longer points to.
    fn retire(&self, block: Block) {
        // SAFETY: the caller holds the page's write lock and has pointed the mapping table
        // elsewhere, so the block is unreachable; pool blocks are only ever read under the
        // page lock, so no reader can still be copying from it.
        unsafe { self.pool.free(block) };
    }

    fn grow_mini(
        &self,
        page: &mapping::WriteGuard<'_>,
        block: Block,
        header: MiniHeader,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        // SAFETY: we hold the page's write lock: nobody changes the old block.
        let old = unsafe { mini_ref(&block) };
        let live_bytes = old.node_size_bytes() - old.reclaimable_space_bytes();
        // Room for the new record for sure (its full key bounds its stored suffix), and
        // otherwise a fixed step up: small steps keep the block's empty tail small.
        let need = MINI_HEADER_BYTES + live_bytes + leaf::record_cost(key.len(), value.len());
        let stepped = block.size_bytes() * MINI_GROWTH_PERCENT / 100;
        let bigger = match self.alloc(need.max(stepped).min(MAX_MINI_BLOCK_BYTES)) {
            Ok(b) => b,
            // No room: the block pinning the pool's head may be this very mini-page, which
            // nobody can evict while we hold its page. A merge needs no pool room.
            Err(Op::WouldBlock) if record_type.is_dirty() => {
                bump(&self.counters.merges_without_room);
                return self.merge_full(page, block, header, key, value, record_type);
            }
            Err(e) => return Err(e),
        };
        // SAFETY: the new block is unpublished: ours alone.
        let new = unsafe { block_bytes(&bigger) };
        header.write(new);
        let mut mini = node::copy_into(&old, &mut new[MINI_HEADER_BYTES..], old.fences(), |_| true)
            .expect("a bigger block holds the old node's live records");
        let placed = match mini.upsert(key, value, record_type) {
            Ok(up) => {
                mini.set_ref_bit(up.index(), record_type.is_dirty());
                true
            }
            Err(_) => false,
        };
        self.publish(page, bigger);
        self.retire(block);
        bump(&self.counters.mini_page_growths);
        if placed {
            Ok(())
        } else if bigger.size_bytes() < MAX_MINI_BLOCK_BYTES {
            // Still no room (a large record): keep growing from the bigger block.
            self.grow_mini(page, bigger, header, key, value, record_type)
        } else {
            // Full size and still no room: merge now. (Leaving it to the next attempt
            // could loop: in the copy-on-access region that attempt copies the block,
            // which can shrink it below full size, so it would grow again instead.)
            self.merge_full(page, bigger, header, key, value, record_type)
        }
    }

    /// The mini-page is full at the merge threshold (or is a full mirror, or cannot grow
    /// for want of pool room): merge its dirty records and the new record into the leaf
    /// page, then keep only its hot clean records (§5.5). A clean new record (a read being cached) is dropped instead: not
    /// worth a merge.
    fn merge_full(
        &self,
        page: &mapping::WriteGuard<'_>,
        block: Block,
        header: MiniHeader,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        if !record_type.is_dirty() {
            return Ok(());
        }
        // SAFETY: we hold the page's write lock.
        let mini = unsafe { mini_ref(&block) };
        let merged = self.merge(
            page.id(),
            header,
            Some(mini),
            Some((key, value, record_type)),
            true,
        )?;
        if let Merged::Split(open) = merged {
            page.set_location(Location::Leaf(header.leaf.0));
            self.retire(block);
            if let Some(open) = open {
                self.mirror_open_end(page, open.leaf, &open.page);
            }
            return Ok(());
        }
        let mirror = header.mirror;
        let mut scratch = clean_after_merge(&mini, mirror, Some(key));
        let mut rebuilt = NodeMut::trusted(&mut scratch);
        if mirror && record_type.exists() {
            // The new record is in the leaf page; the mirror must hold it too.
            if rebuilt.upsert(key, value, RecordType::Cache).is_err() {
                // The mirror cannot hold the leaf's records any more: drop it.
                page.set_location(Location::Leaf(header.leaf.0));
                self.retire(block);
                return Ok(());
            }
        } else if mirror && let Ok(i) = rebuilt.as_ref().search(key) {
            rebuilt.remove(i);
        }
        // SAFETY: we hold the page's write lock; `mini` is no longer used.
        unsafe { node_bytes_mut(&block) }.copy_from_slice(&scratch);
        Ok(())
    }

    /// Keeps the open end of a sorted-order split (`page`, whose write lock the caller
    /// holds and which maps to its leaf page `leaf_no`, just written as `written`) as a
    /// mirror, so that the next records of that key order land in a mirror and the next
    /// merge reads no leaf page. Best effort, never evicts: without an unused block the
    /// page stays as it is.
    ///
    /// Departure: the paper turns a mini-page past 2 KiB into a mirror on any write;
    /// bfdb does it only for the open end of a sorted-order split, the one page such a
    /// load keeps writing (the "Tree departures" table).
    fn mirror_open_end(&self, page: &mapping::WriteGuard<'_>, leaf_no: PageNo, written: &Page) {
        debug_assert_eq!(page.location(), Location::Leaf(leaf_no.0));
        let leaf = NodeRef::trusted(written.payload());
        let Ok(block) = self.build_mirror(page, leaf_no, &leaf, None, OPEN_END_MIRROR_BYTES) else {
            return;
        };
        self.publish(page, block);
        bump(&self.counters.open_end_mirrors);
        let stale = {
            // A descending stream's open end keeps its page id from split to split.
            let mut open_ends = self.open_ends.lock();
            open_ends.retain(|&pid| pid != page.id());
            open_ends.push_back(page.id());
            (open_ends.len() > OPEN_ENDS_MAX)
                .then(|| open_ends.pop_front())
                .flatten()
        };
        if let Some(pid) = stale {
            self.demote_open_end(pid);
        }
    }

    /// Turns the open-end mirror of page `pid`, if it still has one, into a plain
    /// mini-page of its dirty records (its clean ones are its leaf page's), or drops it
    /// if it has none; no IO. Best effort: only a try-lock (the caller holds page locks)
    /// and `try_alloc`; a busy page or a full pool leaves the mirror to age out through
    /// the pool's head like any mini-page.
    fn demote_open_end(&self, pid: PageId) {
        let Some(page) = self.mapping.try_write(pid) else {
            return;
        };
        let Location::Mini(offset) = page.location() else {
            return;
        };
        let block = self.block(offset);
        // SAFETY: we hold the page's write lock.
        let header = unsafe { MiniHeader::of(&block) };
        // Only an open-end mirror has a block this large (copy-on-access may have moved
        // it to a smaller one: then it is an ordinary mirror, and stays).
        if !header.mirror || block.size_bytes() < OPEN_END_MIRROR_BYTES {
            return;
        }
        // SAFETY: as above.
        let mirror = unsafe { mini_ref(&block) };
        let dirty = |r: &node::RecordView<'_>| r.record_type().is_dirty();
        if !mirror.iter().any(|r| dirty(&r)) {
            page.set_location(Location::Leaf(header.leaf.0));
            self.retire(block);
            bump(&self.counters.open_end_demotions);
            return;
        }
        let fences = mini_fences(mirror.prefix(), mirror.prefix().len());
        let Ok(small) = self
            .pool
            .try_alloc(mini_block_bytes(&mirror, &fences, dirty))
        else {
            return;
        };
        // SAFETY: a fresh, unpublished block: ours alone.
        let bytes = unsafe { block_bytes(&small) };
        MiniHeader {
            mirror: false,
            ..header
        }
        .write(bytes);
        node::copy_into(&mirror, &mut bytes[MINI_HEADER_BYTES..], fences, |r| {
            dirty(r)
        })
        .expect("sized for the dirty records");
        self.publish(&page, small);
        self.retire(block);
        bump(&self.counters.open_end_demotions);
    }

    /// Copies a mini-page out of the copy-on-access region to the tail (§5.5), keeping its
    /// dirty records and the clean ones referenced since the last copy. Returns the new
    /// block, or `None` when nothing was worth keeping (the page now maps to its leaf
    /// page). Never merges: dirty records wait for eviction, which batches its leaf IO,
    /// or for the mini-page to fill, so a write that lands here does no leaf IO.
    fn copy_to_tail(&self, page: &mapping::WriteGuard<'_>, block: Block) -> Option<Block> {
        // SAFETY: we hold the page's write lock.
        let header = unsafe { MiniHeader::of(&block) };
        // SAFETY: as above.
        let mini = unsafe { mini_ref(&block) };
        let worth = |r: &node::RecordView<'_>| r.ref_bit() || r.record_type().is_dirty();
        // A mirror must stay complete: whole if any record is worth keeping, else dropped.
        let whole = header.mirror && mini.iter().any(|r| worth(&r));
        let keep = |r: &node::RecordView<'_>| whole || worth(r);
        if !mini.iter().any(|r| keep(&r)) {
            page.set_location(Location::Leaf(header.leaf.0));
            self.retire(block);
            bump(&self.counters.copy_on_access);
            return None;
        }
        let need = mini_block_bytes(&mini, &mini.fences(), keep);
        // An eighth of room to spare, so the next cached record does not force a growth
        // at once (the class rounding may leave none), but never more than the old block.
        let target = need.max(block.size_bytes().min(need + need / 8));
        let moved = match self.pool.alloc(target, self) {
            Ok(b) => {
                self.after_alloc();
                b
            }
            // Best effort: the block stays where it is.
            Err(_) => return Some(block),
        };
        // SAFETY: new block unpublished, old under our write lock.
        let new = unsafe { block_bytes(&moved) };
        header.write(new);
        let mut node = node::copy_into(&mini, &mut new[MINI_HEADER_BYTES..], mini.fences(), |r| {
            keep(r)
        })
        .expect("sized for the kept records");
        node.clear_ref_bits();
        self.publish(page, moved);
        self.retire(block);
        bump(&self.counters.copy_on_access);
        Some(moved)
    }

    /// Merges the dirty records of `mini` (and `extra`, a record not yet placed anywhere)
    /// into the page's leaf page, splitting it when they do not fit. Returns whether the
    /// leaf split (the caller must then drop the mini-page: its records may now belong to
    /// other pages). The caller holds the page's write lock.
    ///
    /// A mirror's live records *are* the leaf's, so it is written without reading the leaf.
    fn merge(
        &self,
        pid: PageId,
        header: MiniHeader,
        mini: Option<NodeRef<'_>>,
        extra: Option<(&[u8], &[u8], RecordType)>,
        keep_open: bool,
    ) -> Result<Merged, Op> {
        let leaf = if header.mirror && mini.is_some() {
            None
        } else {
            let mut page = Page::boxed();
            self.read_leaf(header.leaf, &mut page)?;
            Some(page)
        };
        bump(&self.counters.merges);
        match self.plan_merge(header, mini, extra, leaf)? {
            MergePlan::Write(mut page) => {
                self.write_leaf(pid, header.leaf, &mut page)?;
                Ok(Merged::InPlace)
            }
            MergePlan::Split {
                records,
                chunks,
                open,
            } => {
                if open.is_none() && self.redistribute(pid, header.leaf, &records, &chunks)? {
                    return Ok(Merged::Split(None));
                }
                let open = keep_open.then_some(open).flatten();
                let open = self.split_leaf(pid, header.leaf, &records, &chunks, open)?;
                Ok(Merged::Split(open))
            }
        }
    }

    /// Computes what `merge` writes: the new leaf page, or the records and chunks of a
    /// split. `leaf` is the leaf page as read under the page's write lock (`None` for a
    /// mirror, whose live records are the leaf's). The callers count the merge; a
    /// redistribution's plan for its neighbour is not one.
    fn plan_merge(
        &self,
        header: MiniHeader,
        mini: Option<NodeRef<'_>>,
        extra: Option<(&[u8], &[u8], RecordType)>,
        leaf: Option<Box<Page>>,
    ) -> Result<MergePlan, Op> {
        let mut page = leaf.unwrap_or_else(Page::boxed);
        let mut merged: RecordList;
        let (low, high): (Option<Vec<u8>>, Option<Vec<u8>>);
        let shape;
        let mirror = header.mirror && mini.is_some();
        if mirror {
            let m = mini.expect("checked");
            shape = Arrivals::into_mirror(&m, extra.map(|(k, _, _)| k)).map(Arrivals::shape);
            let fence = owned_fence;
            low = fence(m.low_fence());
            high = fence(m.high_fence());
            merged = RecordList::with_capacity(m.len() + 1, m.node_size_bytes());
            for r in m.iter().filter(|r| r.record_type().exists()) {
                merged.push_view(&r, RecordType::Insert);
            }
            if let Some((k, v, t)) = extra {
                if t.exists() {
                    merged.upsert(k, v, RecordType::Insert);
                } else if let Ok(i) = merged.search(k) {
                    merged.remove(i);
                }
            }
        } else {
            let leaf = self.parse_leaf(header.leaf, &page)?;
            let fence = owned_fence;
            low = fence(leaf.low_fence());
            high = fence(leaf.high_fence());
            let mut dirty = match mini {
                Some(m) => RecordList::with_capacity(m.len() + 1, m.node_size_bytes()),
                None => RecordList::with_capacity(1, 64),
            };
            for r in mini.iter().flat_map(|m| m.iter()) {
                if r.record_type().is_dirty() {
                    dirty.push_view(&r, r.record_type());
                }
            }
            // The new record replaces the mini-page's version of its key, in key order.
            if let Some((k, v, t)) = extra {
                dirty.upsert(k, v, t);
            }
            #[cfg(debug_assertions)]
            for (k, _, _) in dirty.iter() {
                let leaf = NodeRef::trusted(page.payload());
                assert!(
                    leaf.covers(k),
                    "pid {:?} leaf {:?}: key {:?} outside [{:?}, {:?}) extra={:?}",
                    header.pid,
                    header.leaf,
                    String::from_utf8_lossy(k),
                    low.as_ref()
                        .map(|l| String::from_utf8_lossy(l).into_owned()),
                    high.as_ref()
                        .map(|l| String::from_utf8_lossy(l).into_owned()),
                    extra.map(|e| String::from_utf8_lossy(e.0).into_owned()),
                );
            }
            // Fast path: apply in place on a copy when everything fits, then write a
            // compact copy: records placed in place sit out of offset order, and every
            // later read of such a page must prove their bytes disjoint with a bitmap
            // (a leaf page is read far more often than merged).
            let mut work = [0u8; PAGE_PAYLOAD_SIZE];
            work.copy_from_slice(page.payload());
            let mut node = NodeMut::trusted(&mut work);
            if dirty.iter().all(|(k, v, t)| apply(&mut node, k, v, t)) {
                let applied = NodeRef::trusted(&work);
                node::copy_into(&applied, page.payload_mut(), applied.fences(), |_| true)
                    .expect("a node's records fit a node of its size");
                return Ok(MergePlan::Write(page));
            }
            let leaf = NodeRef::trusted(page.payload());
            shape =
                Arrivals::into_leaf(&leaf, &dirty, extra.map(|(k, _, _)| k)).map(Arrivals::shape);
            merged = merge_records(&leaf, &dirty);
        }
        let (fill, open_key) = shape.unwrap_or((leaf::Fill::Balanced, None));
        // Balanced first: it finds cheaply whether one page holds everything. A sorted
        // split is then packed around its open end's key (or its place, if it is a
        // tombstone's), with a page boundary right past it.
        let mut chunks = leaf::pack_leaves(
            &merged,
            low.as_deref(),
            high.as_deref(),
            leaf::Fill::Balanced,
        );
        let mut open = None;
        if let (Some(k), true) = (open_key, chunks.len() > 1) {
            let (Ok(i) | Err(i)) = merged.search(&k);
            let at = i.min(merged.len() - 1);
            let (sorted, at) = leaf::pack_open(&merged, low.as_deref(), high.as_deref(), fill, at);
            (chunks, open) = (sorted, Some(at));
        }
        if chunks.len() == 1 {
            leaf::build_leaf(page.payload_mut(), &chunks[0], &merged)
                .expect("packing checked the size");
            return Ok(MergePlan::Write(page));
        }
        Ok(MergePlan::Split {
            records: merged,
            chunks,
            open,
        })
    }

    /// Writes the chunks of a split leaf (the first keeps `leaf_no` and `pid`) and inserts
    /// the new pages' separators into the parent, splitting inner nodes up to the root
    /// as needed.
    ///
    /// Order: (1) write the new right-hand leaf pages; (2) upgrade the version locks of
    /// every inner node that must change — if any upgrade fails, free the new pages and
    /// restart; (3) publish the new inner bytes, and unlock; (4) rewrite the left page in
    /// place. Until (3) nobody can reach the new pages; from (3) on, keys of the right
    /// ranges route to them. The caller holds the left page's write lock throughout, so
    /// nobody reads the left page between (3) and (4). `merge_batch` runs the same steps
    /// for several splits, each step's IO batched across them.
    ///
    /// `open` (a writer's merge) is the chunk of a sorted-order split that the next
    /// records of that order land in, kept in the pool as a mirror: a new right-hand page
    /// is mirrored as it is linked, before anyone can reach it; the first page, which
    /// keeps `pid`, is returned, for the caller to mirror once it has dropped the page's
    /// old mini-page.
    fn split_leaf(
        &self,
        pid: PageId,
        leaf_no: PageNo,
        records: &RecordList,
        chunks: &[leaf::LeafChunk],
        open: Option<usize>,
    ) -> Result<Option<OpenEnd>, Op> {
        // A split that would restart does so before any IO.
        self.split_path(pid, chunks, &epoch::pin())?;
        // (1)
        let mut right = self.build_right_pages(records, chunks)?;
        let mut reqs: Vec<(PageNo, &mut Page)> =
            right.iter_mut().map(|(no, p)| (*no, &mut **p)).collect();
        if let Err(e) = self.write_leaves(&mut reqs) {
            self.free_pages(&right);
            return Err(Op::Fail(e));
        }
        // (2), (3)
        let hold = open.and_then(|j| j.checked_sub(1));
        if let Some((j, guard)) = hold.zip(self.link_split(pid, chunks, &right, hold)?) {
            let (no, page) = &right[j];
            self.mirror_open_end(&guard, *no, page);
        }
        // (4)
        let mut page = Page::boxed();
        leaf::build_leaf(page.payload_mut(), &chunks[0], records).expect("packed to fit");
        self.write_leaf(pid, leaf_no, &mut page)?;
        Ok((open == Some(0)).then_some(OpenEnd {
            leaf: leaf_no,
            page,
        }))
    }

    /// The inner nodes from the root to the parent of `pid`, found with the first
    /// chunk's low fence (any key of the page routes to it), with their versions; a
    /// restart if the parent no longer routes that key to `pid`.
    fn split_path<'g>(
        &'g self,
        pid: PageId,
        chunks: &[leaf::LeafChunk],
        guard: &'g Guard,
    ) -> Result<Vec<(&'g InnerNode, u64)>, Op> {
        let probe = chunks[0].low.as_deref().unwrap_or_default();
        let path = self.find_path(probe, guard)?;
        let (parent, _) = path.last().expect("paths are never empty");
        let n = NodeRef::trusted(parent.bytes(guard));
        if inner::child_ref(&n, inner::child_for(&n, probe)) != pid.0 {
            return Err(Op::Restart);
        }
        Ok(path)
    }

    /// Step (1) of a split without its IO: a new page number and page for every chunk
    /// but the first, which keeps the old page.
    fn build_right_pages(
        &self,
        records: &RecordList,
        chunks: &[leaf::LeafChunk],
    ) -> Result<Vec<(PageNo, Box<Page>)>, Op> {
        let mut right = Vec::with_capacity(chunks.len() - 1);
        for chunk in &chunks[1..] {
            let no = match self.store.allocate() {
                Ok(no) => no,
                Err(e) => {
                    self.free_pages(&right);
                    let e = Error::from(e);
                    self.record_failure(&e);
                    return Err(Op::Fail(e));
                }
            };
            let mut page = Page::boxed();
            leaf::build_leaf(page.payload_mut(), chunk, records).expect("packed to fit");
            right.push((no, page));
        }
        Ok(right)
    }

    /// Gives right-hand pages that no separator points to back to the page store.
    fn free_pages(&self, right: &[(PageNo, Box<Page>)]) {
        for &(no, _) in right {
            let _ = self.store.free(no);
        }
    }

    /// Steps (2) and (3) of a split whose right-hand pages are written: gives each a
    /// page id and publishes their separators. On failure the right-hand pages and ids
    /// are released and nothing was published. With `hold` (an index into `right`),
    /// returns that new page's write lock, taken before the page could be reached.
    fn link_split(
        &self,
        pid: PageId,
        chunks: &[leaf::LeafChunk],
        right: &[(PageNo, Box<Page>)],
        hold: Option<usize>,
    ) -> Result<Option<mapping::WriteGuard<'_>>, Op> {
        let guard = epoch::pin();
        let mut children: Vec<(Vec<u8>, u64)> = Vec::with_capacity(right.len());
        let mut new_pids = Vec::with_capacity(right.len());
        let undo = |new_pids: &[PageId]| {
            for &new_pid in new_pids {
                self.mapping.release(self.mapping.write(new_pid));
            }
            self.free_pages(right);
        };
        for ((no, _), chunk) in right.iter().zip(&chunks[1..]) {
            let Some(new_pid) = self.mapping.allocate(Location::Leaf(no.0)) else {
                undo(&new_pids);
                return Err(Op::Fail(Error::Unsupported(
                    "page id space exhausted".into(),
                )));
            };
            new_pids.push(new_pid);
            self.mapping
                .set_fill_hint(new_pid, leaf_used_bytes(&right[new_pids.len() - 1].1));
            children.push((
                chunk.low.clone().expect("split chunks have a low fence"),
                new_pid.0,
            ));
        }
        let path = match self.split_path(pid, chunks, &guard) {
            Ok(path) => path,
            Err(e) => {
                undo(&new_pids);
                return Err(e);
            }
        };

        // (2) Lock bottom-up the inner nodes that may change. A node surely absorbs what
        // comes up if the bytes it could reclaim cover the incoming separators at their
        // worst (meta, full key, 8-byte child); otherwise its parent is locked too, since
        // it may split and send one separator of at most `max_key_bytes` further up.
        let mut locks = Vec::with_capacity(path.len());
        let mut plan: Vec<&InnerNode> = Vec::with_capacity(path.len());
        let mut incoming_bytes: usize = children
            .iter()
            .map(|(k, _)| node::KV_META_SIZE_BYTES + k.len() + 8)
            .sum();
        let mut root_splits = true;
        for &(node, version) in path.iter().rev() {
            match node.version.upgrade(version) {
                Ok(g) => locks.push(g),
                Err(Restart) => {
                    drop(locks);
                    undo(&new_pids);
                    return Err(Op::Restart);
                }
            }
            plan.push(node);
            let n = NodeRef::trusted(node.bytes(&guard));
            if n.reclaimable_space_bytes() >= incoming_bytes {
                root_splits = false;
                break;
            }
            incoming_bytes = node::KV_META_SIZE_BYTES + self.config.max_key_bytes + 8;
        }

        // (3) Build every new inner buffer bottom-up through the locked nodes, then
        // publish them all: nothing that can fail (or panic) runs between the first
        // publication and the last, so readers never see half a split.
        let mut pending = children;
        let mut publish: Vec<(&InnerNode, Box<[u8]>)> = Vec::with_capacity(plan.len());
        let mut created: Vec<usize> = Vec::new();
        let mut new_root = None;
        for (depth, node) in plan.iter().enumerate() {
            // Fast path: the separators fit into a copy of the node, one insert each,
            // instead of a rebuild that re-appends every separator the node holds.
            let mut copy: Box<[u8]> = node.bytes(&guard).into();
            let mut into_copy = NodeMut::trusted(&mut copy);
            let fits = pending.iter().all(|(k, child)| {
                match into_copy.insert(k, &child.to_le_bytes(), RecordType::Insert) {
                    Ok(_) => true,
                    Err(WriteError::Full) => false,
                    Err(e) => unreachable!("a separator routed here is new and in range: {e:?}"),
                }
            });
            if fits {
                publish.push((node, copy));
                break;
            }
            let n = NodeRef::trusted(node.bytes(&guard));
            let mut entries = inner::records(&n);
            for (k, child) in pending.drain(..) {
                match entries.binary_search_by(|(rk, _)| rk.as_slice().cmp(&k)) {
                    Ok(_) => unreachable!("separators are unique"),
                    Err(i) => entries.insert(i, (k, child)),
                }
            }
            let fence = owned_fence;
            let low = fence(n.low_fence());
            let high = fence(n.high_fence());
            let last = depth + 1 == plan.len();
            if let Some(bytes) = inner::build(
                self.inner_size_bytes,
                low.as_deref(),
                high.as_deref(),
                &entries,
            ) {
                // The separators fit. The room check charges each separator at its full
                // length (and above level 1 at `max_key_bytes`), but a node stores keys
                // after its fences' shared prefix: a node planned to split may absorb,
                // and the nodes above are released unchanged.
                publish.push((node, bytes));
                break;
            }
            assert!(
                !last || root_splits,
                "the room check guarantees the topmost planned node absorbs"
            );
            // Split this inner node in two halves of about equal bytes. Halving by
            // record count can put every long separator in one half, which then does
            // not fit.
            bump(&self.counters.inner_splits);
            let cost = |(k, _): &(Vec<u8>, u64)| node::KV_META_SIZE_BYTES + k.len() + 8;
            let half_bytes = entries.iter().map(cost).sum::<usize>() / 2;
            let (mut mid, mut left_bytes) = (0, 0);
            while mid + 1 < entries.len() && left_bytes + cost(&entries[mid]) <= half_bytes {
                left_bytes += cost(&entries[mid]);
                mid += 1;
            }
            let mid = mid.max(1);
            let sep = entries[mid].0.clone();
            let right_entries = entries.split_off(mid);
            let left = inner::build(self.inner_size_bytes, low.as_deref(), Some(&sep), &entries)
                .expect("half a node fits");
            let right = inner::build(
                self.inner_size_bytes,
                Some(&sep),
                high.as_deref(),
                &right_entries,
            )
            .expect("half a node fits");
            let right_node = Box::into_raw(InnerNode::new(node.level, right));
            created.push(right_node as usize);
            publish.push((node, left));
            if last {
                // The root split: a new root above the two halves.
                let root_entries = vec![
                    (Vec::new(), *node as *const InnerNode as usize as u64),
                    (sep, right_node as usize as u64),
                ];
                let bytes = inner::build(self.inner_size_bytes, None, None, &root_entries)
                    .expect("two separators fit");
                let root = Box::into_raw(InnerNode::new(node.level + 1, bytes));
                created.push(root as usize);
                new_root = Some(root);
            } else {
                pending.push((sep, right_node as usize as u64));
            }
        }
        self.inner_nodes.lock().extend(created);
        // Nothing can fail from here on, so no `undo` (which locks the new ids) follows.
        // Until the publication below no thread knows the new ids: the lock is free.
        let held = hold
            .and_then(|j| new_pids.get(j))
            .and_then(|&new_pid| self.mapping.try_write(new_pid));
        for (node, bytes) in publish {
            node.replace(bytes, &guard);
        }
        if let Some(root) = new_root {
            self.root.store(root, Ordering::Release);
        }
        drop(locks);
        bump(&self.counters.leaf_splits);
        Ok(held)
    }

    /// Picks and locks the neighbour that an overflowing page `pid` (split by `chunks` of
    /// `records`, its write lock held by the caller) could give records to instead of
    /// splitting ([`Config::leaf_redistribution`]): the emptier sibling under the same
    /// level-1 inner node by its fill hint, if the two pages would fill at most
    /// `REDISTRIBUTE_FILL_PERCENT` of two pages. Only a try-lock (the caller holds page
    /// locks); `None` for a split. A page never written has a hint of 0 and may be picked
    /// wrongly: `plan_redistribution` checks the real bytes.
    fn pick_neighbour(
        &self,
        pid: PageId,
        records: &RecordList,
        chunks: &[leaf::LeafChunk],
    ) -> Option<Neighbour<'_>> {
        if !self.config.leaf_redistribution || chunks.len() != 2 {
            return None;
        }
        let guard = epoch::pin();
        let probe = chunks[0].low.as_deref().unwrap_or_default();
        let path = self.find_path(probe, &guard).ok()?;
        let (parent, _) = path.last().expect("paths are never empty");
        let n = NodeRef::trusted(parent.bytes(&guard));
        let index = inner::child_for(&n, probe);
        if inner::child_ref(&n, index) != pid.0 {
            return None;
        }
        let own_bytes = records.cost_bytes(leaf::fences_prefix_len(
            chunks[0].low.as_deref(),
            chunks[1].high.as_deref(),
        ));
        let limit = 2 * PAGE_PAYLOAD_SIZE * REDISTRIBUTE_FILL_PERCENT / 100;
        let (other, other_pid) = [index.checked_sub(1), Some(index + 1)]
            .into_iter()
            .flatten()
            .filter(|&i| i < n.len())
            .map(|i| (i, PageId(inner::child_ref(&n, i))))
            .filter(|&(_, p)| self.mapping.fill_hint(p) + own_bytes <= limit)
            .min_by_key(|&(_, p)| self.mapping.fill_hint(p))?;
        let page = self.mapping.try_write(other_pid)?;
        let (header, block) = match page.location() {
            Location::Leaf(no) => {
                let header = MiniHeader {
                    pid: other_pid,
                    leaf: PageNo(no),
                    mirror: false,
                };
                (header, None)
            }
            Location::Mini(offset) => {
                let block = self.block(offset);
                // SAFETY: we hold the neighbour's write lock.
                (unsafe { MiniHeader::of(&block) }, Some(block))
            }
            Location::Empty => return None,
        };
        Some(Neighbour {
            page,
            header,
            block,
            left: other < index,
        })
    }

    /// With the neighbour's leaf page as read (`None` for a mirror, whose live records
    /// are its leaf's), packs both pages' live records, balanced, into two new pages;
    /// `None` (releasing the neighbour) if they do not make two pages or if records
    /// would move towards the overflowing page (its neighbour held more than its hint
    /// said): only the neighbour receives, which the write order relies on.
    fn plan_redistribution<'t>(
        &self,
        pid: PageId,
        neighbour: Neighbour<'t>,
        leaf: Option<Box<Page>>,
        records: &RecordList,
        chunks: &[leaf::LeafChunk],
    ) -> Option<Redistribution<'t>> {
        // SAFETY: we hold the neighbour's write lock.
        let mini = neighbour.block.as_ref().map(|b| unsafe { mini_ref(b) });
        let Ok(MergePlan::Write(restore)) = self.plan_merge(neighbour.header, mini, None, leaf)
        else {
            return None;
        };
        let theirs = NodeRef::trusted(restore.payload());
        let mut all =
            RecordList::with_capacity(records.len() + theirs.len(), 2 * PAGE_PAYLOAD_SIZE);
        let push_theirs = |all: &mut RecordList| {
            for r in theirs.iter() {
                all.push_view(&r, RecordType::Insert);
            }
        };
        let (low, high) = if neighbour.left {
            push_theirs(&mut all);
            for (k, v, _) in records.iter() {
                all.push(k, v, RecordType::Insert);
            }
            (owned_fence(theirs.low_fence()), chunks[1].high.clone())
        } else {
            for (k, v, _) in records.iter() {
                all.push(k, v, RecordType::Insert);
            }
            push_theirs(&mut all);
            (chunks[0].low.clone(), owned_fence(theirs.high_fence()))
        };
        let packed = leaf::pack_leaves(&all, low.as_deref(), high.as_deref(), leaf::Fill::Balanced);
        let [left, right] = &packed[..] else {
            return None;
        };
        let separator = right.low.clone().expect("a second chunk has a low fence");
        // The old separator between the two pages: records move to the neighbour only if
        // the new one lies on the overflowing page's side of it.
        let towards_neighbour = if neighbour.left {
            chunks[0]
                .low
                .as_deref()
                .is_some_and(|old| separator.as_slice() > old)
        } else {
            chunks[1]
                .high
                .as_deref()
                .is_some_and(|old| separator.as_slice() < old)
        };
        if !towards_neighbour {
            return None;
        }
        let mut pages = [Page::boxed(), Page::boxed()];
        for (page, chunk) in pages.iter_mut().zip([left, right]) {
            leaf::build_leaf(page.payload_mut(), chunk, &all).expect("packed to fit");
        }
        let r = Redistribution {
            neighbour,
            giving_pid: pid,
            probe: chunks[0].low.clone().unwrap_or_default(),
            restore,
            pages,
            separator,
        };
        // Before any IO: the parent must hold the two pages side by side and have room
        // for the new separator. (A parent too full for it would otherwise make every
        // retry write the neighbour and write it back: an eviction retrying its head
        // block did so forever.)
        self.parent_with_separator(&r, &epoch::pin())?;
        Some(r)
    }

    /// The parent of the giving page `r.giving_pid` with `r`'s separator in place of the
    /// old one between it and its neighbour: the parent, the version its bytes were read
    /// at, and the new bytes. `None` if the parent no longer holds the two pages side by
    /// side (found afresh with `r.probe`, a key of the giving page's old range) or has no
    /// room for a longer separator.
    fn parent_with_separator<'g>(
        &'g self,
        r: &Redistribution<'_>,
        guard: &'g Guard,
    ) -> Option<(&'g InnerNode, u64, Box<[u8]>)> {
        let path = self.find_path(&r.probe, guard).ok()?;
        let &(parent, version) = path.last().expect("paths are never empty");
        let n = NodeRef::trusted(parent.bytes(guard));
        let index = inner::child_for(&n, &r.probe);
        let other = if r.neighbour.left {
            index.checked_sub(1)?
        } else {
            Some(index + 1).filter(|&i| i < n.len())?
        };
        let other_pid = r.neighbour.page.id();
        if inner::child_ref(&n, index) != r.giving_pid.0
            || inner::child_ref(&n, other) != other_pid.0
        {
            return None;
        }
        // The right page's separator is replaced; it keeps its place among the others,
        // which lie outside the two pages' range.
        let right_index = index.max(other);
        let child = inner::child_ref(&n, right_index).to_le_bytes();
        let mut bytes: Box<[u8]> = parent.bytes(guard).into();
        let mut copy = NodeMut::trusted(&mut bytes);
        copy.remove(right_index);
        (copy.insert(&r.separator, &child, RecordType::Insert) == Ok(right_index))
            .then_some((parent, version, bytes))
    }

    /// Publishes a redistribution's new separator, once the neighbour's new page is
    /// written: only then may keys be routed to it. The parent's version lock is held
    /// only to publish. Returns whether it published; if not, the parent changed since
    /// `plan_redistribution` checked it (a concurrent split or redistribution under it),
    /// and the caller writes the neighbour's page back as it was (`restore`) and
    /// restarts. On success the neighbour's mini-page is dropped: its records are in its
    /// new page, and its prefix may not be the new page's.
    fn link_redistribution(&self, r: &Redistribution<'_>) -> bool {
        let guard = epoch::pin();
        let Some((parent, version, bytes)) = self.parent_with_separator(r, &guard) else {
            return false;
        };
        let Ok(lock) = parent.version.upgrade(version) else {
            return false;
        };
        parent.replace(bytes, &guard);
        drop(lock);
        if let Some(block) = r.neighbour.block {
            let page = &r.neighbour.page;
            page.set_location(Location::Leaf(r.neighbour.header.leaf.0));
            self.retire(block);
        }
        bump(&self.counters.leaf_redistributions);
        true
    }

    /// A single merge's redistribution (`merge`; `merge_batch` runs the same steps with
    /// batched IO): returns whether it redistributed, `Err(Op::Restart)` if it wrote the
    /// neighbour but could not publish (the neighbour is written back as it was).
    ///
    /// Write order: the neighbour's page first, then the parent, then the giving page.
    /// Until the parent is published every record moves only into the neighbour's page
    /// (a copy: the giving page still has it and keys still route there); after it, the
    /// neighbour's page has them. So a failed write (which poisons the tree) never
    /// leaves a key routed to a page that lacks it. Both page locks are held throughout:
    /// a reader routed by the old separator restarts when it finds the parent's version
    /// moved, and one that read a leaf page without its lock finds its leaf-write
    /// counter moved.
    fn redistribute(
        &self,
        pid: PageId,
        leaf_no: PageNo,
        records: &RecordList,
        chunks: &[leaf::LeafChunk],
    ) -> Result<bool, Op> {
        let Some(neighbour) = self.pick_neighbour(pid, records, chunks) else {
            return Ok(false);
        };
        let leaf = if neighbour.header.mirror {
            None
        } else {
            let mut page = Page::boxed();
            // A failed read splits instead; the neighbour's next merge reports it.
            if self.read_leaf(neighbour.header.leaf, &mut page).is_err() {
                return Ok(false);
            }
            Some(page)
        };
        let Some(mut r) = self.plan_redistribution(pid, neighbour, leaf, records, chunks) else {
            return Ok(false);
        };
        let (other_pid, other_no) = (r.neighbour.page.id(), r.neighbour.header.leaf);
        self.write_leaf(other_pid, other_no, r.receiving())?;
        if !self.link_redistribution(&r) {
            self.write_leaf(other_pid, other_no, &mut r.restore)?;
            return Err(Op::Restart);
        }
        self.write_leaf(pid, leaf_no, r.giving())?;
        Ok(true)
    }

    // ----------------------------------------------------------------------------------
    // Eviction and flushing
    // ----------------------------------------------------------------------------------

    fn flush(&self) -> Result<()> {
        self.check_writable()?;
        // Visit every page in id order and merge the dirty records of its mini-page into
        // its leaf page, up to `FLUSH_BATCH_PAGES` pages per batched read and write. The
        // first page of a batch is locked waiting (flush then holds no other lock, so
        // this cannot deadlock), the others with try-locks: a page locked elsewhere ends
        // the batch, and the next batch waits for it. Mini-pages stay cached; their
        // merged records become clean copies.
        let high_water = self.mapping.high_water();
        let mut next = 0;
        let mut failure = None;
        while next < high_water && failure.is_none() {
            let mut locked = Vec::new();
            let mut jobs = Vec::new();
            while next < high_water && jobs.len() < FLUSH_BATCH_PAGES {
                let pid = PageId(next);
                let page = if jobs.is_empty() {
                    self.mapping.write(pid)
                } else {
                    match self.mapping.try_write(pid) {
                        Some(page) => page,
                        None => break,
                    }
                };
                next += 1;
                if let Some(job) = self.dirty_mini(&page) {
                    locked.push(page);
                    jobs.push(job);
                }
            }
            let merged = self.merge_batch(&jobs);
            let mut again = Vec::new();
            // Every answer is acted on before an error is returned: a page whose leaf
            // split must stop mapping its mini-page.
            for ((page, job), merged) in locked.into_iter().zip(&jobs).zip(merged) {
                match merged {
                    Ok(split) => self.after_flush_merge(&page, job, split),
                    // The split could not lock its inner nodes: try again alone.
                    Err(Op::Restart | Op::WouldBlock) => again.push(page.id()),
                    Err(Op::Fail(e)) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            for pid in again {
                if failure.is_none()
                    && let Err(e) = self.flush_page(pid)
                {
                    failure = Some(e);
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        self.check_writable()?;
        self.store.sync().map_err(|e| {
            let e = Error::from(e);
            self.record_failure(&e);
            e
        })
    }
}

impl Core {
    /// The page's mini-page as a merge job, if it holds dirty records. The caller holds
    /// the page's write lock.
    fn dirty_mini(&self, page: &mapping::WriteGuard<'_>) -> Option<MergeJob> {
        let Location::Mini(offset) = page.location() else {
            return None;
        };
        let block = self.block(offset);
        // SAFETY: the caller holds the page's write lock.
        let mini = unsafe { mini_ref(&block) };
        if !mini.iter().any(|r| r.record_type().is_dirty()) {
            return None;
        }
        // SAFETY: as above.
        let header = unsafe { MiniHeader::of(&block) };
        Some(MergeJob { block, header })
    }

    /// After flush merged a mini-page's dirty records: if the leaf split, the mini-page
    /// is dropped (its records may belong to other pages now); otherwise its records
    /// become clean copies. The caller holds the page's write lock.
    fn after_flush_merge(&self, page: &mapping::WriteGuard<'_>, job: &MergeJob, split: bool) {
        if split {
            page.set_location(Location::Leaf(job.header.leaf.0));
            self.retire(job.block);
        } else {
            // SAFETY: the caller holds the page's write lock.
            mark_clean(&mut unsafe { mini_mut(&job.block) });
        }
    }

    /// Merges one page's dirty records into its leaf page for flush, waiting for its
    /// lock and retrying while a split cannot lock its inner nodes.
    fn flush_page(&self, pid: PageId) -> Result<()> {
        loop {
            let page = self.mapping.write(pid);
            let Some(job) = self.dirty_mini(&page) else {
                return Ok(());
            };
            // SAFETY: we hold the page's write lock.
            let mini = unsafe { mini_ref(&job.block) };
            match self.merge(pid, job.header, Some(mini), None, false) {
                Ok(merged) => {
                    self.after_flush_merge(&page, &job, merged.split());
                    return Ok(());
                }
                Err(Op::Restart | Op::WouldBlock) => {
                    drop(page);
                    crate::sync::thread::yield_now();
                }
                Err(Op::Fail(e)) => return Err(e),
            }
        }
    }
}

impl Evictor for Core {
    /// Merges a mini-page at the pool's head into its leaf page and points the mapping
    /// table back at the leaf. Only try-locks: the evicting thread may hold page locks.
    fn evict(&self, block: &Block) -> EvictDecision {
        // SAFETY: the block is `Evicting`: published, and if its page frees it meanwhile
        // it only becomes `Dead`, whose memory is not reused before we return.
        let header = unsafe { MiniHeader::of(block) };
        let Some(page) = self.mapping.try_write(header.pid) else {
            return EvictDecision::Busy;
        };
        if page.location() != Location::Mini(block.offset()) {
            // Between our claim and the lock, the page's owner moved its mini-page
            // (growth, copy-on-access, mirror) or dropped it, and freed this block,
            // which is now `Dead`: the pool reclaims it when we answer `Busy`.
            return EvictDecision::Busy;
        }
        // SAFETY: we hold the page's write lock.
        let mini = unsafe { mini_ref(block) };
        if !mini.iter().any(|r| r.record_type().is_dirty()) {
            return self.finish_eviction(&page, header, Ok(false));
        }
        if self.failed.load(Ordering::Acquire) {
            return EvictDecision::Busy;
        }
        let merged = self.merge(header.pid, header, Some(mini), None, false);
        self.finish_eviction(&page, header, merged.map(|m| m.split()))
    }

    /// Evicts several mini-pages with batched IO: the leaf pages their dirty records
    /// merge into are read with one `read_pages` call, and the merged pages written with
    /// one `write_pages` call. A page that must split is written on its own (the split
    /// also changes inner nodes). Only try-locks, like `evict`; the page locks it gets
    /// are held until the batch is written, which delays only readers of those pages.
    fn evict_batch(&self, blocks: &[Block]) -> Vec<EvictDecision> {
        if blocks.len() < 2 || self.counters.single_evictions.load(Ordering::Relaxed) {
            return blocks.iter().map(|b| self.evict(b)).collect();
        }
        let mut decisions = vec![EvictDecision::Busy; blocks.len()];
        // Locked pages whose dirty records must be merged.
        let mut jobs: Vec<(usize, mapping::WriteGuard<'_>, MiniHeader)> = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            // SAFETY: as in `evict`, the block is `Evicting`.
            let header = unsafe { MiniHeader::of(block) };
            // Two blocks of one page cannot both be its mini-page: the second try-lock
            // fails (we hold the first) and answers `Busy`, as it would alone.
            let Some(page) = self.mapping.try_write(header.pid) else {
                continue;
            };
            if page.location() != Location::Mini(block.offset()) {
                continue;
            }
            // SAFETY: we hold the page's write lock.
            let mini = unsafe { mini_ref(block) };
            if !mini.iter().any(|r| r.record_type().is_dirty()) {
                decisions[i] = self.finish_eviction(&page, header, Ok(false));
            } else if !self.failed.load(Ordering::Acquire) {
                jobs.push((i, page, header));
            }
        }
        let batch: Vec<MergeJob> = jobs
            .iter()
            .map(|&(i, _, header)| MergeJob {
                block: blocks[i],
                header,
            })
            .collect();
        let merged = self.merge_batch(&batch);
        for ((i, page, header), merged) in jobs.into_iter().zip(merged) {
            decisions[i] = self.finish_eviction(&page, header, merged);
        }
        decisions
    }
}

impl Core {
    /// Ends the eviction of a mini-page whose dirty records `merged` went (or failed to
    /// go) to the leaf page: on success points the page at its leaf page and answers
    /// `Evicted`; on failure records an operating error and answers `Busy`, so the dirty
    /// records stay in memory. The caller holds the page's write lock.
    fn finish_eviction(
        &self,
        page: &mapping::WriteGuard<'_>,
        header: MiniHeader,
        merged: Result<bool, Op>,
    ) -> EvictDecision {
        match merged {
            Ok(_) => {
                page.set_location(Location::Leaf(header.leaf.0));
                bump(&self.counters.evictions);
                EvictDecision::Evicted
            }
            Err(Op::Fail(e)) => {
                // The dirty records stay in memory; writers that need room learn why.
                *self.evict_error.lock() = Some(e.to_string());
                self.evict_failures.fetch_add(1, Ordering::Release);
                EvictDecision::Busy
            }
            Err(Op::Restart) | Err(Op::WouldBlock) => EvictDecision::Busy,
        }
    }

    /// Merges the dirty records of several mini-pages into their leaf pages with batched
    /// IO: the leaf pages are read with one `read_pages` call; the new right-hand pages
    /// of every split with one `write_pages` call; then each split links its pages into
    /// the inner nodes; and finally the merged pages and the splits' left pages are
    /// written with one `write_pages` call. So a batch waits for at most three IO round
    /// trips however many of its pages split (`split_leaf` alone takes three per split,
    /// after the read). Answers, per job in order, what `merge` would: whether the leaf
    /// split, or why the merge failed. The caller
    /// holds every job's page write lock, and took the locks after the first with
    /// try-locks only (or holds just one), so no thread waits for it while it waits.
    ///
    /// If the batch read fails, the pages are merged one by one, which finds and records
    /// the page that fails. If the batch write fails, the tree is poisoned as for a
    /// single failed write and every written job answers the failure (the first with the
    /// store's error), so the dirty records stay in memory.
    fn merge_batch(&self, jobs: &[MergeJob]) -> Vec<Result<bool, Op>> {
        let nos: Vec<PageNo> = jobs
            .iter()
            .filter(|j| !j.header.mirror)
            .map(|j| j.header.leaf)
            .collect();
        let mut pages: Vec<Box<Page>> = nos.iter().map(|_| Page::boxed()).collect();
        if !nos.is_empty() && self.read_leaves(&nos, &mut pages).is_err() {
            return jobs
                .iter()
                .map(|j| {
                    // SAFETY: the caller holds the job's page write lock.
                    let mini = unsafe { mini_ref(&j.block) };
                    self.merge(j.header.pid, j.header, Some(mini), None, false)
                        .map(|m| m.split())
                })
                .collect();
        }
        let mut pages = pages.into_iter();
        let mut results: Vec<Result<bool, Op>> = Vec::with_capacity(jobs.len());
        // Pages to rewrite in place (merged pages, and the left pages of splits).
        let mut writes: Vec<(usize, Box<Page>)> = Vec::with_capacity(jobs.len());
        let mut splits: Vec<BatchSplit> = Vec::new();
        // Overflowing pages with a neighbour locked to take records instead of a split.
        let mut pending: Vec<(usize, Neighbour<'_>, RecordList, Vec<leaf::LeafChunk>)> = Vec::new();
        let split = |i: usize,
                     records: RecordList,
                     chunks: Vec<leaf::LeafChunk>,
                     splits: &mut Vec<BatchSplit>|
         -> Result<bool, Op> {
            self.split_path(jobs[i].header.pid, &chunks, &epoch::pin())?;
            let right = self.build_right_pages(&records, &chunks)?;
            splits.push(BatchSplit {
                job: i,
                records,
                chunks,
                right,
            });
            Ok(true)
        };
        for (i, job) in jobs.iter().enumerate() {
            // SAFETY: the caller holds the job's page write lock.
            let mini = unsafe { mini_ref(&job.block) };
            let leaf = (!job.header.mirror).then(|| pages.next().expect("one page per job"));
            bump(&self.counters.merges);
            results.push(match self.plan_merge(job.header, Some(mini), None, leaf) {
                Ok(MergePlan::Write(new)) => {
                    writes.push((i, new));
                    Ok(false)
                }
                Ok(MergePlan::Split {
                    records,
                    chunks,
                    open,
                }) => match open
                    .is_none()
                    .then(|| self.pick_neighbour(job.header.pid, &records, &chunks))
                    .flatten()
                {
                    Some(neighbour) => {
                        pending.push((i, neighbour, records, chunks));
                        Ok(true)
                    }
                    None => split(i, records, chunks, &mut splits),
                },
                Err(e) => Err(e),
            });
        }
        // The neighbours' leaf pages in one batched read; a redistribution that does not
        // work out splits after all.
        let mut redistributions: Vec<(usize, Redistribution<'_>)> = Vec::new();
        if !pending.is_empty() {
            let nos: Vec<PageNo> = pending
                .iter()
                .filter(|(_, n, _, _)| !n.header.mirror)
                .map(|(_, n, _, _)| n.header.leaf)
                .collect();
            let mut leaves: Vec<Box<Page>> = nos.iter().map(|_| Page::boxed()).collect();
            let read = nos.is_empty() || self.read_leaves(&nos, &mut leaves).is_ok();
            let mut leaves = leaves.into_iter();
            for (i, neighbour, records, chunks) in pending {
                let leaf = (!neighbour.header.mirror).then(|| leaves.next().expect("one each"));
                let pid = jobs[i].header.pid;
                let planned = read
                    .then(|| self.plan_redistribution(pid, neighbour, leaf, &records, &chunks))
                    .flatten();
                match planned {
                    Some(r) => redistributions.push((i, r)),
                    None => results[i] = split(i, records, chunks, &mut splits),
                }
            }
        }
        // The splits' steps (1) and the neighbours' new pages with one `write_pages`;
        // then the splits' steps (2) and (3) and the redistributions' parents one by one;
        // the left pages of splits and the giving pages of redistributions join the
        // in-place writes, step (4).
        if !splits.is_empty() || !redistributions.is_empty() {
            for (_, r) in &redistributions {
                self.note_leaf_write(r.neighbour.page.id());
            }
            let mut reqs: Vec<(PageNo, &mut Page)> = splits
                .iter_mut()
                .flat_map(|s| s.right.iter_mut().map(|(no, p)| (*no, &mut **p)))
                .chain(redistributions.iter_mut().map(|(_, r)| {
                    let no = r.neighbour.header.leaf;
                    (no, r.receiving())
                }))
                .collect();
            let written = self.write_leaves(&mut reqs);
            drop(reqs);
            if let Err(e) = written {
                for split in &splits {
                    self.free_pages(&split.right);
                }
                let failed = splits.iter().map(|s| s.job);
                let failed = failed.chain(redistributions.iter().map(|(i, _)| *i));
                fail_all(e, failed, &mut results);
                splits.clear();
                redistributions.clear();
            }
        }
        for split in splits {
            let pid = jobs[split.job].header.pid;
            match self.link_split(pid, &split.chunks, &split.right, None) {
                Ok(_) => {
                    let mut left = Page::boxed();
                    leaf::build_leaf(left.payload_mut(), &split.chunks[0], &split.records)
                        .expect("packed to fit");
                    writes.push((split.job, left));
                }
                Err(e) => results[split.job] = Err(e),
            }
        }
        // Neighbours written back as they were, their locks held until then.
        let mut restores: Vec<(mapping::WriteGuard<'_>, PageNo, Box<Page>)> = Vec::new();
        for (i, mut r) in redistributions {
            self.mapping
                .set_fill_hint(r.neighbour.page.id(), leaf_used_bytes(r.receiving()));
            if self.link_redistribution(&r) {
                writes.push((i, r.into_giving()));
            } else {
                results[i] = Err(Op::Restart);
                restores.push(r.into_restore());
            }
        }
        if writes.is_empty() && restores.is_empty() {
            return results;
        }
        for &(i, _) in &writes {
            self.note_leaf_write(jobs[i].header.pid);
        }
        for (page, _, _) in &restores {
            self.note_leaf_write(page.id());
        }
        let mut reqs: Vec<(PageNo, &mut Page)> = writes
            .iter_mut()
            .map(|(i, new)| (jobs[*i].header.leaf, &mut **new))
            .chain(restores.iter_mut().map(|(_, no, p)| (*no, &mut **p)))
            .collect();
        if let Err(e) = self.write_leaves(&mut reqs) {
            fail_all(e, writes.iter().map(|&(i, _)| i), &mut results);
            return results;
        }
        for (i, page) in &writes {
            self.mapping
                .set_fill_hint(jobs[*i].header.pid, leaf_used_bytes(page));
        }
        for (page, _, restored) in &restores {
            self.mapping
                .set_fill_hint(page.id(), leaf_used_bytes(restored));
        }
        results
    }

    /// Writes leaf pages with one `write_pages` call: pages of ids whose write locks the
    /// caller holds (and whose leaf-write counters it bumped), or new pages no reader can
    /// reach yet. A failure poisons the tree.
    fn write_leaves(&self, reqs: &mut [(PageNo, &mut Page)]) -> Result<()> {
        for (_, page) in reqs.iter() {
            debug_assert!(NodeRef::parse(page.payload()).is_ok());
        }
        if let Err(e) = self.store.write_pages(reqs) {
            let e = Error::from(e);
            self.record_failure(&e);
            return Err(e);
        }
        bump_by(&self.counters.leaf_writes, reqs.len());
        if reqs.len() > 1 {
            bump_by(&self.counters.batched_leaf_writes, reqs.len());
        }
        Ok(())
    }
}

/// Bytes of a leaf page's payload in use: what its fill hint records.
fn leaf_used_bytes(page: &Page) -> usize {
    PAGE_PAYLOAD_SIZE - NodeRef::trusted(page.payload()).reclaimable_space_bytes()
}

/// Turns every record into its clean form once the leaf page holds it: `Insert` becomes
/// `Cache`, `Tombstone` becomes `Phantom`.
fn mark_clean(node: &mut NodeMut<'_>) {
    for i in 0..node.len() {
        let clean = if node.as_ref().record_type(i).exists() {
            RecordType::Cache
        } else {
            RecordType::Phantom
        };
        node.set_record_type(i, clean);
    }
}

/// Puts a record into a mini-page if it has room (a write's reference bit set, a cached
/// read's clear); false if the mini-page is full.
fn place(mini: &mut NodeMut<'_>, key: &[u8], value: &[u8], record_type: RecordType) -> bool {
    match mini.upsert(key, value, record_type) {
        Ok(up) => {
            mini.set_ref_bit(up.index(), record_type.is_dirty());
            true
        }
        Err(WriteError::Full) => false,
        Err(e) => unreachable!("a checked key fits its mini-page: {e:?}"),
    }
}

/// Drops the clean records of a regular mini-page whose reference bit is clear (cached
/// reads and merged writes not touched since the last pass); returns whether it dropped
/// any. Dirty records and referenced clean ones stay, in place.
fn drop_cold_clean(mini: &mut NodeMut<'_>) -> bool {
    mini.retain(|r| r.record_type().is_dirty() || r.ref_bit())
}

/// A mini-page's node once its dirty records are in the leaf page: a mirror keeps every
/// live record (it still mirrors the leaf); a regular mini-page keeps only the records
/// read since the last pass, other than `except` (the record just merged), as clean
/// copies with their reference bits cleared.
fn clean_after_merge(mini: &NodeRef<'_>, mirror: bool, except: Option<&[u8]>) -> Vec<u8> {
    let mut scratch = vec![0u8; mini.node_size_bytes()];
    node::copy_into(mini, &mut scratch, mini.fences(), |r| {
        if mirror {
            r.record_type().exists()
        } else {
            r.ref_bit() && except.is_none_or(|k| r.cmp_key(k) != std::cmp::Ordering::Equal)
        }
    })
    .expect("a subset of a node fits the same size");
    let mut rebuilt = NodeMut::trusted(&mut scratch);
    mark_clean(&mut rebuilt);
    rebuilt.clear_ref_bits();
    scratch
}

/// A fence as an owned key, `None` when unbounded or absent.
fn owned_fence(f: Option<node::Fence<'_>>) -> Option<Vec<u8>> {
    f.and_then(|f| f.key().map(<[u8]>::to_vec))
}

/// Applies one dirty record to a leaf node in place; `false` if it does not fit.
fn apply(node: &mut NodeMut<'_>, key: &[u8], value: &[u8], t: RecordType) -> bool {
    if t.exists() {
        match node.upsert(key, value, RecordType::Insert) {
            Ok(_) => true,
            Err(WriteError::Full) => false,
            Err(e) => unreachable!("a routed key fits its leaf's range: {e:?}"),
        }
    } else {
        if let Ok(i) = node.as_ref().search(key) {
            node.remove(i);
        }
        true
    }
}

/// The leaf's records with the dirty records applied, as one sorted list.
fn merge_records(leaf: &NodeRef<'_>, dirty: &RecordList) -> RecordList {
    let mut out = RecordList::with_capacity(leaf.len() + dirty.len(), leaf.node_size_bytes());
    let mut d = 0;
    for r in leaf.iter() {
        // Dirty records below this leaf record: new keys (tombstones of absent keys drop).
        while d < dirty.len() && r.cmp_key(dirty.key(d)).is_gt() {
            if dirty.record_type(d).exists() {
                out.push(dirty.key(d), dirty.value(d), RecordType::Insert);
            }
            d += 1;
        }
        if d < dirty.len() && r.cmp_key(dirty.key(d)).is_eq() {
            if dirty.record_type(d).exists() {
                out.push(dirty.key(d), dirty.value(d), RecordType::Insert);
            }
            d += 1;
        } else {
            out.push_view(&r, RecordType::Insert);
        }
    }
    for (k, v, t) in dirty.iter_range(d..dirty.len()) {
        if t.exists() {
            out.push(k, v, RecordType::Insert);
        }
    }
    out
}

/// The block size a mini-page needs for the records of `mini` that `keep` keeps, under
/// `fences` that give the same prefix as `mini`'s (the stored suffixes do not change).
fn mini_block_bytes(
    mini: &NodeRef<'_>,
    fences: &Fences<'_>,
    keep: impl Fn(&node::RecordView<'_>) -> bool,
) -> usize {
    let records: usize = mini
        .iter()
        .filter(|r| keep(r))
        .map(|r| leaf::record_cost(r.suffix().len(), r.value().len()))
        .sum();
    MINI_HEADER_BYTES + leaf::empty_node_bytes(fences) + records
}

/// Fences for a new regular mini-page: the leaf's key prefix, if it has one.
fn mini_fences(key: &[u8], prefix_len: usize) -> Fences<'_> {
    if prefix_len > 0 {
        Fences::Prefix(&key[..prefix_len])
    } else {
        Fences::None
    }
}

/// Whether an inner node's range holds keys just below `key`: low < key ≤ high.
fn covers_below(n: &NodeRef<'_>, key: &[u8]) -> bool {
    let above_low = match n.low_fence() {
        Some(node::Fence::Key(low)) => low < key,
        _ => true,
    };
    let below_high = match n.high_fence() {
        Some(node::Fence::Key(high)) => key <= high,
        _ => true,
    };
    above_low && below_high
}

/// Length of the prefix shared by every key of child `i`: the common prefix of its two
/// fences (the separators around it), 0 when its high end is unbounded.
fn child_prefix_len(n: &NodeRef<'_>, i: usize) -> usize {
    let prefix = n.prefix().len();
    let low = n.key_suffix(i);
    if i + 1 < n.len() {
        prefix + node::common_prefix_len(low, n.key_suffix(i + 1))
    } else {
        match n.high_fence() {
            Some(node::Fence::Key(high)) => {
                let high = &high[prefix.min(high.len())..];
                prefix + node::common_prefix_len(low, high)
            }
            _ => 0,
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    /// An evictor that plays the page's owner inside the callback: it takes the page
    /// lock, merges the mini-page, points the page at its leaf and frees the block, as a
    /// writer does when it wins the page lock between an evictor's claim and its
    /// try-lock. Then it runs the real callback.
    struct OwnerFreesFirst<'a>(&'a Core);

    impl Evictor for OwnerFreesFirst<'_> {
        fn evict(&self, block: &Block) -> EvictDecision {
            let core = self.0;
            // SAFETY: the block is claimed by this evictor and published.
            let header = unsafe { MiniHeader::of(block) };
            {
                let page = core.mapping.write(header.pid);
                // SAFETY: we hold the page's write lock.
                let mini = unsafe { mini_ref(block) };
                assert!(matches!(
                    core.merge(header.pid, header, Some(mini), None, false),
                    Ok(Merged::InPlace)
                ));
                page.set_location(Location::Leaf(header.leaf.0));
                core.retire(*block);
            }
            core.evict(block)
        }
    }

    /// Regression: the callback asserted that a claimed block is still its page's
    /// mini-page, but the owner may free it (`Evicting` → `Dead`) before the callback
    /// gets the page lock; found by `tests/tree_concurrent.rs` with 8 threads.
    #[test]
    fn evicting_a_block_its_page_freed_meanwhile() {
        let tree = Tree::in_memory(Config {
            memory_budget_bytes: 64 << 10,
            ..Config::default()
        })
        .unwrap();
        tree.insert(b"key", b"value").unwrap();
        let core = &tree.core;
        assert!(matches!(core.mapping.peek(PageId(0)), Location::Mini(_)));
        let result = core.pool.evict_one(&OwnerFreesFirst(core));
        assert!(
            matches!(
                result,
                crate::pool::EvictResult::Reclaimed { evicted: false, .. }
            ),
            "{result:?}"
        );
        assert!(matches!(core.mapping.peek(PageId(0)), Location::Leaf(_)));
        assert_eq!(tree.get(b"key").unwrap().as_deref(), Some(&b"value"[..]));
    }
}
