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

mod descend;
mod evict;
mod flush;
pub(crate) mod inner;
mod leaf;
mod leaf_io;
mod leaf_page;
mod mapping;
mod members;
mod merge;
mod mini;
mod mirror;
pub mod node;
mod olc;
mod plan;
mod read;
mod rebuild;
mod redistribute;
mod scan;
mod setup;
mod signal;
mod split;
mod stats;
mod values;
pub(crate) use values::{Stored, ValueHost};
mod write;

use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::journal::{Durability, Journal};
use crate::storage::{ActiveBackend, MemoryStore, PageNo, PageStore};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use crate::wal::LogOpRef;

use inner::InnerNode;
use mapping::{Location, MappingTable, PageId};
pub(crate) use members::TreeMemory;
use members::TreePool;
use node::{Fences, NodeKind, NodeMut};
use olc::Restart;
use plan::owned_fence;
pub(crate) use setup::open_file_store;
use stats::Counters;

pub use scan::{Cursor, MAX_READ_AHEAD_PAGES, Range};
pub use stats::TreeStats;

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

/// A Bf-Tree: an ordered key-value index over a page store, with a fixed memory budget.
///
/// Every operation takes `&self`; share a `Tree` between threads with `Arc` or scoped
/// threads. Keys are non-empty byte strings of at most [`Config::max_key_bytes`]; values
/// are byte strings of at most [`Config::max_value_bytes`]. Unless
/// [`Config::background_eviction`] is off, a tree's pool runs one thread of its own
/// (`bfdb-evictor`), which dropping the tree stops. The keyspaces of a
/// [`Db`](crate::Db) share one pool and its thread, which stops once the database and
/// every handle to its trees are gone.
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
    /// The pool the tree's mini-pages live in, and its background evictor if it runs
    /// (`Config::background_eviction`); shared with the other keyspaces of a `Db`.
    memory: TreeMemory,
    /// The database's journal, for a keyspace of a [`Db`](crate::Db); `None` for a tree
    /// on its own, whose writes are not logged.
    journal: Option<Attached>,
    /// Whether dropping the tree writes its dirty mini-pages to its leaf pages: not
    /// while a database's open is recovering it (an open that fails writes nothing a
    /// later open could depend on).
    flush_on_drop: AtomicBool,
}

/// A tree's place in its database: the journal its writes go through, and its keyspace.
pub(crate) struct Attached {
    pub(crate) journal: Arc<Journal>,
    pub(crate) keyspace: u32,
    pub(crate) name: String,
    /// The keyspace's page file, which errors about its damaged leaf pages name.
    pub(crate) pages: std::path::PathBuf,
    /// The durability of `insert` and `delete` (`DbOptions::durability`).
    pub(crate) durability: Durability,
    /// Set when the keyspace is dropped from its database.
    pub(crate) dropped: AtomicBool,
    /// The database's value store, where values longer than the inline limit go.
    pub(crate) values: Arc<dyn ValueHost>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        // The tree owns its attachment, so the last handle to it is gone: once the
        // keyspace is dropped too, nothing reads or writes its values again.
        if self.dropped.load(Ordering::Acquire) {
            self.values.keyspace_dropped();
        }
    }
}

impl Attached {
    /// The database the tree belongs to, as its journal's address.
    pub(crate) fn journal_id(&self) -> usize {
        Arc::as_ptr(&self.journal) as usize
    }
}

// Every operation takes `&self`: a `Tree` is shared between threads as it is.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tree>();
};

struct Core {
    config: Config,
    /// The size of the tree's leaf pages (`Config::leaf_page_size_bytes`).
    leaf: leaf_page::LeafGeometry,
    inner_size_bytes: usize,
    root: AtomicPtr<InnerNode>,
    /// Every inner node ever created, freed when the tree drops.
    inner_nodes: Mutex<Vec<usize>>,
    mapping: MappingTable,
    /// The pool, which the keyspaces of a `Db` share.
    pool: Arc<TreePool>,
    /// This tree's slot in the pool (`MiniHeader::owner`).
    owner: u16,
    store: Box<dyn PageStore>,
    backend: ActiveBackend,
    counters: Counters,
    /// Set when a write to the page store failed; the tree then refuses writes.
    failed: AtomicBool,
    /// Whether eviction may drop the unwritten records of a failed tree when the pool
    /// has no room to keep them: set for the keyspaces of a `Db`, which share the pool
    /// and recover from the log.
    drop_when_failed: AtomicBool,
    /// Set once eviction dropped such records: leaf-page reads are refused from then on.
    dropped_records: AtomicBool,
    failure: Mutex<Option<String>>,
    /// Told of the tree's failure when it happens: a keyspace of a `Db` puts the
    /// database in its failure state (`Journal::fail`), since the keyspace can no
    /// longer reach a checkpoint.
    on_failure: std::sync::OnceLock<FailureHook>,
    /// Set by a failed leaf write or sync, which may leave a leaf page's fences apart
    /// from its routing range (docs/design.md, "Failure"): leaf pages read from then on
    /// are not held to their routing range (`Core::check_route`).
    write_failed: AtomicBool,
    /// For a keyspace of a `Db`: its page file and name, which an error about a damaged
    /// leaf page names (`Core::damaged`). Set once, when the tree is attached.
    place: std::sync::OnceLock<(std::path::PathBuf, String)>,
    /// Wakes the background evictor, if it runs.
    background: signal::Signal,
    /// Pages given an open-end mirror, oldest first, at most `OPEN_ENDS_MAX`.
    open_ends: Mutex<std::collections::VecDeque<PageId>>,
    /// This tree among every tree of the process, for `LOCATE_HINT`; never reused.
    id: u64,
    /// Where the tree's out-of-line values live: the database's value store, set when
    /// the tree is attached to a `Db`. A tree without one keeps every value inline.
    values: std::sync::OnceLock<Arc<dyn values::ValueHost>>,
}

/// The error of a page store that cannot keep a tree's leaf pages: one that keeps
/// single pages only (a plain file store) under a tree with leaf pages of several.
fn leaf_store_error(config: &Config, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::Unsupported {
        return Error::InvalidConfig(format!(
            "leaf_page_size_bytes is {}, but this tree's page store keeps 4 KiB pages only: \
             leaf pages larger than 4 KiB need a Db keyspace or an in-memory tree",
            config.leaf_page_size_bytes
        ));
    }
    Error::from(e)
}

/// What a tree calls when it fails (`Core::on_failure`).
type FailureHook = Box<dyn Fn(&str) + Send + Sync>;

/// The ids of trees (`Core::id`); 0 is no tree.
static NEXT_TREE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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

    pub(crate) fn with_store(
        config: Config,
        store: Box<dyn PageStore>,
        backend: ActiveBackend,
    ) -> Result<Tree> {
        config.validate()?;
        let memory = TreeMemory::new(&config)?;
        Tree::with_store_in(config, store, backend, memory)
    }

    /// A new tree over `store` (empty) whose mini-pages live in `memory`, a pool other
    /// trees may share (the keyspaces of a `Db`): `config` must be the one `memory` was
    /// made with, or one with the same memory settings.
    pub(crate) fn with_store_in(
        config: Config,
        store: Box<dyn PageStore>,
        backend: ActiveBackend,
        memory: TreeMemory,
    ) -> Result<Tree> {
        config.validate()?;
        // One empty leaf page covering every key, under a root with one child.
        let geometry = leaf_page::LeafGeometry::new(config.leaf_page_size_bytes);
        let leaf_no = store
            .allocate_run(geometry.pages())
            .map_err(|e| leaf_store_error(&config, e))?;
        let mut page = geometry.page();
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
        page.scatter();
        let mut reqs: Vec<_> = page.requests(leaf_no).collect();
        store.write_pages(&mut reqs)?;
        let index = rebuild::index_leaves(
            setup::inner_node_size_bytes(&config),
            vec![(Vec::new(), leaf_no)],
        );
        Tree::start(config, memory, store, backend, index)
    }

    /// A tree over `store` whose leaf pages are `leaves`: (low routing key, leaf page
    /// number) in strictly increasing key order, the first low key empty — the list
    /// [`Tree::capture_leaves`] produced, with `store` holding those pages as they were
    /// when it visited them. Builds the mapping table (page id `i` for the `i`-th leaf
    /// page) and the inner levels bottom-up, each node filled to about 3/4 so that the
    /// first splits do not split every inner node; reads no leaf page.
    ///
    /// The list comes from a checkpoint on disk and is checked: an empty list, a first
    /// key that is not empty, keys that do not strictly increase, a page listed twice or
    /// a page number the mapping table cannot hold give [`Error::Corrupted`] (naming the
    /// page of the entry at fault; page 0 for an empty list); a key longer than
    /// `config.max_key_bytes` gives [`Error::InvalidConfig`]. That each page's fences
    /// are its range is not checked (it would read every page): a wrong page is found
    /// when it is read or written.
    pub(crate) fn from_leaves(
        config: Config,
        store: Box<dyn PageStore>,
        backend: ActiveBackend,
        leaves: Vec<(Vec<u8>, PageNo)>,
        memory: Option<TreeMemory>,
    ) -> Result<Tree> {
        config.validate()?;
        rebuild::check_leaves(&config, &leaves)?;
        let memory = match memory {
            Some(memory) => memory,
            None => TreeMemory::new(&config)?,
        };
        let index = rebuild::index_leaves(setup::inner_node_size_bytes(&config), leaves);
        Tree::start(config, memory, store, backend, index)
    }

    /// The tree over `index` (its inner nodes now owned by the tree), its mini-pages in
    /// `memory`'s pool.
    fn start(
        config: Config,
        memory: TreeMemory,
        store: Box<dyn PageStore>,
        backend: ActiveBackend,
        index: rebuild::LeafIndex,
    ) -> Result<Tree> {
        let inner_size_bytes = setup::inner_node_size_bytes(&config);
        let owner = match memory.pool.reserve_slot() {
            Ok(owner) => owner,
            Err(e) => {
                for &node in &index.inner_nodes {
                    // SAFETY: each came from `Box::into_raw` of an `InnerNode` built for
                    // this tree, is listed once, and nothing else refers to it.
                    drop(unsafe { Box::from_raw(node as *mut InnerNode) });
                }
                return Err(e);
            }
        };
        let core = Arc::new(Core {
            leaf: leaf_page::LeafGeometry::new(config.leaf_page_size_bytes),
            config,
            inner_size_bytes,
            root: AtomicPtr::new(index.root),
            inner_nodes: Mutex::new(index.inner_nodes),
            mapping: index.mapping,
            pool: Arc::clone(&memory.pool),
            owner,
            store,
            backend,
            counters: Counters::default(),
            failed: AtomicBool::new(false),
            drop_when_failed: AtomicBool::new(false),
            dropped_records: AtomicBool::new(false),
            failure: Mutex::new(None),
            on_failure: std::sync::OnceLock::new(),
            write_failed: AtomicBool::new(false),
            place: std::sync::OnceLock::new(),
            background: signal::Signal::default(),
            open_ends: Mutex::new(std::collections::VecDeque::new()),
            id: NEXT_TREE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            values: std::sync::OnceLock::new(),
        });
        memory.pool.fill_slot(owner, Arc::downgrade(&core));
        Ok(Tree {
            core,
            memory,
            journal: None,
            flush_on_drop: AtomicBool::new(true),
        })
    }

    /// Visits every leaf page of the tree in key order, for a checkpoint: calls
    /// `f(low, leaf)` for each, where `low` is the page's low routing bound (its
    /// separator in its parent; empty for the leftmost page) and `leaf` the leaf page
    /// number its page id maps to at that moment (its mini-page header's leaf, or its
    /// `Location::Leaf`). Returns the first error of `f`; [`Error::Poisoned`] if the
    /// tree is poisoned when the walk starts or ends (a failed write can leave a leaf
    /// page wider than its range).
    ///
    /// `f` runs under the page id's read lock, which keeps out every leaf write of the
    /// page (those need the write lock): the page's bytes on disk stay as they are
    /// while `f` runs, for it to pin or copy. No other page lock is held meanwhile, and
    /// inserts, deletes, splits, merges and evictions of other pages go on. `f` must not
    /// call into the tree (a write waiting for a page lock while `f` holds one could
    /// deadlock).
    ///
    /// **What the caller gets.** If the walk has to start over (below), `f` is called
    /// with an empty `low` again: the caller drops what it collected so far. The calls
    /// since the last one with an empty `low` give pairs `(low_0 = [], leaf_0)`, ...,
    /// `(low_n, leaf_n)` with strictly increasing `low_i`, such that the bytes of page
    /// `leaf_i` *as they were when `f` was called for it* are a leaf page with fences
    /// exactly `[low_i, low_i+1)` (unbounded below for `i = 0`, above for `i = n`)
    /// holding the tree's leaf records of that range at that moment. Records that were then only in the page's
    /// mini-page (written, not yet merged) are not on the page: the caller flushes
    /// before calling, and whatever is written later must reach it some other way (the
    /// log). Pages change after their visit; the caller keeps each visited page's bytes
    /// (copy-on-write) for as long as it needs them.
    ///
    /// **Why the visits tile the key space.** Each step locks the page covering `low`
    /// and validates the parent that routed to it (as every operation does), reads the
    /// page's routing range `[lo, hi)` from that parent, and checks `lo == low`. A
    /// page's range and its leaf page's fences change only under its write lock, and
    /// change together (a split rewrites the left page before it releases it; a
    /// redistribution writes each of its two pages before releasing it), so under the read
    /// lock the leaf page's fences are `[low, hi)`. The walk then continues at `hi`,
    /// read under this page's lock. Consecutive visits therefore share their boundary,
    /// whatever happened in between: a split of a visited page hands `[s, hi)` to a new
    /// page the walk never visits (it goes on at `hi`), and the visited page's captured
    /// bytes still hold that part with the page's old, wider range; a split of a page
    /// not yet visited is seen when the walk gets there. Only a redistribution between
    /// the page visited last and the next, between the two visits, moves a boundary the
    /// walk already relies on (the next page then starts below or above `low`): the
    /// check catches it and the walk starts over from the empty key. That takes a merge
    /// of one of those two pages that redistributes in the short window between the
    /// walk's two page locks: under a random-insert load, a few walks in a hundred.
    pub(crate) fn capture_leaves(&self, f: impl FnMut(&[u8], PageNo) -> Result<()>) -> Result<()> {
        self.core.capture_leaves(f)
    }

    /// This tree as keyspace `attached.keyspace` of a database: its writes go through
    /// the database's journal from now on.
    pub(crate) fn attach(mut self, attached: Attached) -> Tree {
        self.core.drop_when_failed.store(true, Ordering::Release);
        let journal = Arc::downgrade(&attached.journal);
        let name = attached.name.clone();
        let _ = self.core.on_failure.set(Box::new(move |cause| {
            if let Some(journal) = journal.upgrade() {
                journal.fail(&format!("keyspace {name:?}: {cause}"), false);
            }
        }));
        let _ = self
            .core
            .place
            .set((attached.pages.clone(), attached.name.clone()));
        let _ = self.core.values.set(Arc::clone(&attached.values));
        self.journal = Some(attached);
        self
    }

    /// Sets whether dropping the tree flushes it (`Tree::flush_on_drop`).
    pub(crate) fn set_flush_on_drop(&self, on: bool) {
        self.flush_on_drop.store(on, Ordering::Release);
    }

    /// The keyspace's journal attachment, if the tree belongs to a database.
    pub(crate) fn attached(&self) -> Option<&Attached> {
        self.journal.as_ref()
    }

    /// Writes `key` without logging it: recovery's replay of a logged write, and the
    /// writes of a batch whose record the journal appended.
    pub(crate) fn write_unlogged(&self, key: &[u8], value: Option<Stored<'_>>) -> Result<()> {
        self.core
            .write_record(key, value.map(Stored::record), &mut || Ok(None))
    }

    /// Writes `value` to the database's value store, for a write that keeps it out of
    /// line: whether it must (it is longer than the inline limit), and its reference
    /// if so. A tree outside a database has no store, and its `check_record` refused
    /// such values.
    pub(crate) fn store_value(&self, value: &[u8]) -> Result<Option<Vec<u8>>> {
        if value.len() <= self.core.config.inline_value_limit() {
            return Ok(None);
        }
        self.core.host()?.write(value).map(Some)
    }

    /// Looks `key` up as its leaf record stores it, for recovery: the reference of its
    /// value if it keeps one out of line, `None` otherwise (absent or inline).
    pub(crate) fn stored_reference(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok((self.core.get(key, &mut out)? == read::Found::External).then_some(out))
    }

    /// Checks `key` and `value` against the tree's limits.
    pub(crate) fn check_record(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.core.check_key(key)?;
        let Some(v) = value else {
            return Ok(());
        };
        // Without a value store only inline values fit.
        let max = match self.core.values.get() {
            Some(_) => self.core.config.max_value_bytes,
            None => self.core.config.inline_value_limit(),
        };
        if v.len() > max {
            return Err(Error::ValueTooLarge { len: v.len(), max });
        }
        Ok(())
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
        if let Some(a) = &self.journal {
            a.journal.check_readable()?;
        }
        out.clear();
        let _guard = self.core.value_guard();
        let found = self.core.get(key, out)?;
        self.core.resolve(found, out)
    }

    /// Bytes `offset..offset + len` of the value stored under `key`, as far as the value
    /// reaches (fewer bytes, or none, past its end); `None` if the key is absent. A
    /// value kept out of line is read only in the part asked for (and its checksums),
    /// so a part of a value of many MiB costs about its own bytes.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// let db = bfdb::Db::open(dir.path(), bfdb::DbOptions::default())?;
    /// let blobs = db.tree("blobs")?;
    /// let big: Vec<u8> = (0..4_000_000u32).map(|i| i as u8).collect();
    /// blobs.insert(b"video", &big)?;
    /// let part = blobs.get_part(b"video", 1_000_000, 16)?.unwrap();
    /// assert_eq!(part, &big[1_000_000..1_000_016]);
    /// assert_eq!(blobs.get_part(b"video", 3_999_990, 100)?.unwrap().len(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_part(&self, key: &[u8], offset: u64, len: usize) -> Result<Option<Vec<u8>>> {
        self.core.check_key(key)?;
        if let Some(a) = &self.journal {
            a.journal.check_readable()?;
        }
        let _guard = self.core.value_guard();
        let mut stored = Vec::new();
        match self.core.get(key, &mut stored)? {
            read::Found::Absent => Ok(None),
            read::Found::Value => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(stored.len());
                let end = start.saturating_add(len).min(stored.len());
                Ok(Some(stored[start..end].to_vec()))
            }
            read::Found::External => {
                let mut part = Vec::new();
                self.core
                    .host()?
                    .read_part(&stored, offset, len, &mut part)?;
                Ok(Some(part))
            }
        }
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
        match &self.journal {
            // In a database, hold the keys' stripes: the answers see any batch whole.
            Some(a) => a
                .journal
                .read_locked(keys.iter().map(|k| (a.keyspace, k.as_ref())), || {
                    // Under the stripes: a batch that failed halfway made the database
                    // unreadable before it released them.
                    a.journal.check_readable()?;
                    self.core.get_many(keys)
                }),
            None => self.core.get_many(keys),
        }
    }

    /// Inserts `value` under `key`, replacing any previous value (upsert). In a
    /// [`Db`](crate::Db) the write is as durable as
    /// [`DbOptions::durability`](crate::DbOptions::durability) says (by default
    /// [`Durability::Logged`]); a tree on its own logs nothing.
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.insert_with(key, value, self.durability())
    }

    /// Inserts `value` under `key` at the given [`Durability`]. A tree outside a
    /// [`Db`](crate::Db) has no log: any level but [`Durability::Unlogged`] is refused
    /// with [`Error::Unsupported`] rather than quietly not kept.
    ///
    /// ```
    /// use bfdb::{Db, DbOptions, Durability};
    /// # let dir = tempfile::tempdir()?;
    /// let db = Db::open(dir.path(), DbOptions::default())?;
    /// let accounts = db.tree("accounts")?;
    /// // Returns once the write's log record is on stable storage.
    /// accounts.insert_with(b"alice", b"100", Durability::Synced)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn insert_with(&self, key: &[u8], value: &[u8], durability: Durability) -> Result<()> {
        self.check_record(key, Some(value))?;
        self.logged_write(key, Some(value), durability)
    }

    /// Removes `key` if present. Deleting an absent key is not an error. Durable as
    /// [`Tree::insert`] is.
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.delete_with(key, self.durability())
    }

    /// Removes `key` if present, at the given [`Durability`] (as [`Tree::insert_with`]).
    pub fn delete_with(&self, key: &[u8], durability: Durability) -> Result<()> {
        self.check_record(key, None)?;
        self.logged_write(key, None, durability)
    }

    /// The level `insert` and `delete` use: the database's, or `Unlogged` on its own.
    fn durability(&self) -> Durability {
        self.journal
            .as_ref()
            .map_or(Durability::Unlogged, |a| a.durability)
    }

    /// A checked write, through the journal if the tree has one.
    fn logged_write(&self, key: &[u8], value: Option<&[u8]>, durability: Durability) -> Result<()> {
        // A long value goes to the value store first: its bytes are written before any
        // record names them (the log syncs the store before a group that could).
        let reference = match value {
            Some(v) => self.store_value(v)?,
            None => None,
        };
        let stored = match (&reference, value) {
            (Some(r), _) => Some(Stored::External(r)),
            (None, v) => v.map(Stored::Inline),
        };
        let Some(a) = &self.journal else {
            if durability != Durability::Unlogged {
                return Err(Error::Unsupported(format!(
                    "durability {durability:?} needs a log, and this tree is not part of a \
                     Db (open one with Db::open and use db.tree(name))"
                )));
            }
            return self.core.write(key, value);
        };
        // (A write that fails from here on leaves its value pending in the store: its
        // record may be in the log, and only the next open knows. It is not reused
        // before then.)
        if a.dropped.load(Ordering::Acquire) {
            return Err(Error::KeyspaceDropped {
                name: a.name.clone(),
            });
        }
        let op = match stored {
            Some(Stored::External(reference)) => LogOpRef::PutExternal {
                keyspace: a.keyspace,
                key,
                reference,
            },
            _ => LogOpRef::write(a.keyspace, key, value),
        };
        a.journal.commit_ordered_by_index(op, durability, |log| {
            self.core.write_record(key, stored.map(Stored::record), log)
        })
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

    /// A checkpoint's flush: as [`Tree::flush`], but a page whose oldest unmerged write
    /// was logged in checkpoint epoch `keep_from` or later stays dirty, since the log
    /// from that epoch on covers it. `None` merges every dirty page.
    pub(crate) fn flush_for_checkpoint(&self, keep_from: Option<u64>) -> Result<flush::Flushed> {
        self.core.flush_older(keep_from)
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
            background_reclaimed_blocks: load(&self.core.pool.background_reclaimed),
            background_merges: load(&c.background_merges),
            kept_after_failure: load(&c.kept_after_failure),
            dropped_after_failure: load(&c.dropped_after_failure),
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

    /// The 4 KiB store pages each leaf page takes (`Config::leaf_page_size_bytes`): a
    /// leaf page is that many consecutive pages from its page number.
    pub(crate) fn leaf_pages(&self) -> usize {
        self.core.leaf.pages()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // Best effort: a failure here has nowhere to go, and Drop must not panic. While
        // unwinding from a panic the tree's state is suspect: do not write it.
        // Stop the evictor first if no other tree shares it, so the flush below is the
        // last writer. (A shared evictor may still evict this tree's pages meanwhile:
        // the flush locks each page as it goes, and what the evictor merges is written
        // either way.)
        self.memory.background = None;
        if !std::thread::panicking() && self.flush_on_drop.load(Ordering::Acquire) {
            let _ = self.core.flush();
        }
        // The pool's memory goes back now, not when the last `Arc<Core>` goes: an
        // evictor of a shared pool may hold one a while longer (`members.rs`).
        self.core.give_back_blocks();
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
impl Core {
    fn doorkeeper(&self) -> &admission::Doorkeeper {
        &self.pool.doorkeeper
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // Give the pool back every block this tree still maps (a pool shared with other
        // trees lives on), then the slot: `members.rs` says why in this order.
        self.give_back_blocks();
        self.pool.release_slot(self.owner);
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

/// The bounds of `range` as owned keys.
fn owned_bounds<K: AsRef<[u8]>, R: RangeBounds<K>>(range: &R) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let own = |b: Bound<&K>| match b {
        Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    };
    (own(range.start_bound()), own(range.end_bound()))
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
            return Err(self.poisoned());
        }
        Ok(())
    }

    /// The error writes to a poisoned tree get.
    fn poisoned(&self) -> Error {
        let cause = self.failure.lock().clone().unwrap_or_default();
        Error::Poisoned { cause }
    }

    /// Poisons the tree after a failed leaf write or sync.
    fn record_failure(&self, e: &Error) {
        self.write_failed.store(true, Ordering::Release);
        self.record_damage(e);
    }

    /// Poisons the tree: writes are refused with `e` as their cause from now on.
    fn record_damage(&self, e: &Error) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(e.to_string());
        }
        self.failed.store(true, Ordering::Release);
        drop(f);
        if let Some(hook) = self.on_failure.get() {
            hook(&e.to_string());
        }
    }
}

/// Test hooks: points in the code where a test runs its own code, to widen a race's
/// window deterministically.
#[cfg(all(test, not(feature = "shuttle")))]
mod hooks {
    use std::cell::RefCell;

    thread_local! {
        static PARENT_READ: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    /// Runs `f` once, on this thread, right after the next optimistic read of a
    /// redistribution's parent (`Core::parent_with_separator`).
    pub(super) fn on_parent_read(f: impl FnOnce() + 'static) {
        PARENT_READ.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    pub(super) fn fire_parent_read() {
        if let Some(f) = PARENT_READ.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    thread_local! {
        static CAPTURE_STEP: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    /// Runs `f` once, on this thread, right after the next leaf page visit of
    /// `Core::capture_leaves` (its page lock released, the next not yet taken).
    pub(super) fn on_capture_step(f: impl FnOnce() + 'static) {
        CAPTURE_STEP.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    pub(super) fn fire_capture_step() {
        if let Some(f) = CAPTURE_STEP.with(|h| h.borrow_mut().take()) {
            f();
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests;
