//! What the tree counts: [`TreeStats`] (public, a snapshot from [`Tree::stats`]) and the
//! relaxed counters behind it, with the striped leaf-write counters (`LeafVersions`) that
//! let a reader which read a leaf page without its page lock tell whether a write raced
//! it. The bottom layer: every other file may bump a counter; this one uses nothing of
//! the tree.
//!
//! [`Tree::stats`]: super::Tree::stats

#[cfg(doc)]
use super::Tree;
#[cfg(doc)]
use crate::config::Config;
use crate::pool::PoolStats;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    /// `reclaimed_blocks`. Like `pool`, this counts for the whole pool, which the
    /// keyspaces of a [`Db`](crate::Db) share.
    pub background_reclaimed_blocks: u64,
    /// Mini-pages at the merge threshold that the background evictor merged (in batches)
    /// while their writers went on growing them ([`Config::background_eviction`]).
    pub background_merges: u64,
    /// Mini-pages of dirty records that eviction moved to the pool's tail instead of
    /// merging, because a failed write had poisoned the tree (its records can no longer
    /// reach their leaf pages, and a pool shared with other keyspaces must not stall
    /// behind them).
    pub kept_after_failure: u64,
    /// Mini-pages of dirty records that eviction dropped from memory in a poisoned
    /// keyspace of a [`Db`](crate::Db), because the pool had no room to keep them (see
    /// [`Error::Poisoned`](crate::Error::Poisoned)); the tree's leaf-page reads are
    /// refused from the first.
    pub dropped_after_failure: u64,
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
    /// The circular-buffer pool's own counters: the whole pool's, which the keyspaces of a
    /// [`Db`](crate::Db) share.
    pub pool: PoolStats,
}

/// The tree's counters and per-page leaf-write counters.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) mini_pages_created: AtomicU64,
    pub(super) mini_page_growths: AtomicU64,
    pub(super) merges: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) background_merges: AtomicU64,
    pub(super) kept_after_failure: AtomicU64,
    pub(super) dropped_after_failure: AtomicU64,
    pub(super) merges_without_room: AtomicU64,
    pub(super) copy_on_access: AtomicU64,
    pub(super) records_promoted: AtomicU64,
    pub(super) phantoms_promoted: AtomicU64,
    pub(super) mirrors_created: AtomicU64,
    pub(super) open_end_mirrors: AtomicU64,
    pub(super) open_end_demotions: AtomicU64,
    pub(super) leaf_splits: AtomicU64,
    pub(super) leaf_redistributions: AtomicU64,
    pub(super) inner_splits: AtomicU64,
    pub(super) leaf_reads: AtomicU64,
    pub(super) leaf_writes: AtomicU64,
    pub(super) restarts: AtomicU64,
    pub(super) batched_leaf_reads: AtomicU64,
    pub(super) batched_leaf_writes: AtomicU64,
    pub(super) prefetched_leaf_pages: AtomicU64,
    pub(super) async_leaf_reads: AtomicU64,
    pub(super) stale_leaf_reads: AtomicU64,
    /// Leaf-write counters, striped by `PageId`: a page's counter is bumped under its
    /// write lock whenever its leaf page is written. A leaf page read *without* the page
    /// lock is valid if the counter, read under the lock before and after the read, did
    /// not change (see `Core::ticket_valid`).
    pub(super) leaf_versions: LeafVersions,
    /// Set to turn batched eviction IO off (`evict_batch` then evicts one by one).
    pub(super) single_evictions: AtomicBool,
}

/// The leaf-write counters, `LEAF_VERSION_STRIPES` of them.
pub(super) struct LeafVersions(pub(super) Box<[AtomicU64]>);

impl Default for LeafVersions {
    fn default() -> Self {
        LeafVersions(
            (0..LEAF_VERSION_STRIPES)
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn bump_by(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

/// Number of leaf-write counters; a page uses the one its `PageId` selects modulo this.
pub(super) const LEAF_VERSION_STRIPES: usize = 4096;
