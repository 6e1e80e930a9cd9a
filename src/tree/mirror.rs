//! Mirrors: mini-pages that hold a whole leaf page's records (Bf-Tree §4.4's cached leaf
//! pages, made by reads while the pool has room, and the open end of a sorted load kept
//! in the pool across its splits), and the room rules that decide when reads may cache.
//! Stale open ends are demoted to plain mini-pages of their dirty records.
//!
//! Uses: `mini`, `leaf`, `node`, `mapping`, `stats`.

use crate::error::Result;
use crate::storage::PageNo;

use super::Core;
use super::leaf::{self, MINI_HEADER_BYTES, MiniHeader};
use super::leaf_page::LeafPage;
use super::mapping::{self, Location, PageId};
use super::mini::FreshBlock;
use super::mini::{mini_block_bytes, mini_fences};
use super::node::{self, NodeRef};
use super::stats::bump;

/// Most open-end mirrors kept at once (`Core::mirror_open_end`): about as many sorted
/// streams as a tree is loaded with at a time. A stream that moves on (a loader done
/// with its run of keys) leaves its open end behind; past this many, the oldest is
/// demoted to a plain mini-page of its dirty records, so stale 8 KiB mirrors do not
/// fill the pool.
pub(super) const OPEN_ENDS_MAX: usize = 16;

/// Why `Core::build_mirror` made no mirror.
pub(super) enum MirrorRefused {
    /// The pool has no unused block (a mirror never evicts).
    NoRoom,
    /// The mini-page's dirty records do not fit next to the leaf page's records.
    TooFull,
}

/// The open end of a sorted-order split when it is the first page, which keeps the
/// split page's id (descending keys, or a run in the page's lower part): it takes the
/// next records of that order while the pages packed full take none. The writer that
/// split keeps it in the pool as a mirror (`Core::mirror_open_end`) once its old
/// mini-page is gone. (An open end among the new right-hand pages is mirrored by
/// `split_leaf` before anyone can reach it.)
pub(super) struct OpenEnd {
    pub(super) leaf: PageNo,
    /// The page as written.
    pub(super) page: LeafPage,
}

impl Core {
    /// Merges the dirty records of the page's mini-page `old` into its leaf page
    /// `leaf_no` and drops the mini-page, as eviction would (splitting the leaf if
    /// needed), because they do not fit in a mirror next to the leaf's records: the next
    /// read or scan of the page then finds none and mirrors it. Returns whether it
    /// merged; a failed merge leaves the page as it was, for eviction to retry. The
    /// caller holds the page's write lock.
    pub(super) fn merge_for_mirror(&self, page: &mapping::WriteGuard<'_>, leaf_no: PageNo) -> bool {
        let Some(old) = self.mini_page(page) else {
            return false;
        };
        let mini = old.node();
        if !mini.iter().any(|r| r.record_type().is_dirty()) {
            return false;
        }
        if self
            .merge(page.id(), old.header(), Some(mini), None, false)
            .is_err()
        {
            return false;
        }
        let old = old.block();
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
    /// mini-page. (The room was once the tail's position alone (before 61825c4): a sorted load
    /// frees most of what it allocates, and the open ends it kept in the pool moved the
    /// tail to 67% of the first lap where it had been at 41%, which left reads right
    /// after it a third of the mirrors.)
    pub(super) fn mirror_room(&self) -> bool {
        const MIRROR_ROOM_PERCENT: u64 = 80;
        self.config.promotion_rate_percent > 0
            && self.pool.addresses().tail + self.leaf.max_mini_block_bytes() as u64
                <= self.pool.limit_bytes()
            && self.pool_in_use_below(MIRROR_ROOM_PERCENT)
    }

    /// Whether the pool's bytes in use, with one more block of the largest class, stay
    /// below `percent` of its limit (the capacity, unless hash keyspaces of the
    /// database took some).
    pub(super) fn pool_in_use_below(&self, percent: u64) -> bool {
        self.pool.bytes_in_use() + self.leaf.max_mini_block_bytes() as u64
            <= self.pool.limit_bytes() / 100 * percent
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
    /// stayed empty for 30 s and more (docs/benchmarks-history.md, 3ebdc76). The mark sits
    /// below where a full pool settles (93-94% in use in read phases with this mark, 97%
    /// during a load: free-list blocks of other classes and the evictor's reserve are
    /// not in use), so that in steady state the filter decides again. At 95% the pool
    /// settled at 90-92%, every read was cached, and a uniform 50/50 mix wrote 43% more
    /// bytes per operation.
    pub(super) fn record_room(&self) -> bool {
        const RECORD_ROOM_PERCENT: u64 = 90;
        self.pool_in_use_below(RECORD_ROOM_PERCENT)
    }

    /// A new, unpublished mirror of page `page`'s leaf page `leaf` (number `leaf_no`)
    /// and the dirty records of its mini-page `mini`, in a block of `block_bytes`
    /// (`leaf::build_mirror`). Never evicts: `NoRoom` if the pool has no unused block;
    /// `TooFull` if the dirty records do not fit next to the leaf's.
    pub(super) fn build_mirror(
        &self,
        page: &mapping::WriteGuard<'_>,
        leaf_no: PageNo,
        leaf: &NodeRef<'_>,
        mini: Option<&NodeRef<'_>>,
        block_bytes: usize,
    ) -> Result<FreshBlock, MirrorRefused> {
        let mut block = self.try_alloc(block_bytes).ok_or(MirrorRefused::NoRoom)?;
        let bytes = block.bytes_mut();
        MiniHeader {
            pid: page.id(),
            leaf: leaf_no,
            mirror: true,
            owner: self.owner,
        }
        .write(bytes);
        // The leaf versions the dirty records shadow leave the page's records here: a
        // mirror is merged without reading the leaf page again.
        let mut replaced = super::values::Replaced::default();
        let built = leaf::build_mirror(&mut bytes[MINI_HEADER_BYTES..], leaf, mini, &mut replaced);
        self.release_replaced(replaced);
        if built.is_err() {
            self.discard(block);
            return Err(MirrorRefused::TooFull);
        }
        Ok(block)
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
    pub(super) fn mirror_open_end(
        &self,
        page: &mapping::WriteGuard<'_>,
        leaf_no: PageNo,
        written: &LeafPage,
    ) {
        debug_assert_eq!(page.location(), Location::Leaf(leaf_no.0));
        let leaf = NodeRef::trusted(written.payload());
        let Ok(block) = self.build_mirror(
            page,
            leaf_no,
            &leaf,
            None,
            self.leaf.open_end_mirror_bytes(),
        ) else {
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
    pub(super) fn demote_open_end(&self, pid: PageId) {
        let Some(page) = self.mapping.try_write(pid) else {
            return;
        };
        let Some(old) = self.mini_page(&page) else {
            return;
        };
        let (block, header) = (old.block(), old.header());
        // Only an open-end mirror has a block this large (copy-on-access may have moved
        // it to a smaller one: then it is an ordinary mirror, and stays).
        if !header.mirror || block.size_bytes() < self.leaf.open_end_mirror_bytes() {
            return;
        }
        let mirror = old.node();
        let dirty = |r: &node::RecordView<'_>| r.record_type().is_dirty();
        if !mirror.iter().any(|r| dirty(&r)) {
            page.set_location(Location::Leaf(header.leaf.0));
            self.retire(block);
            bump(&self.counters.open_end_demotions);
            return;
        }
        let fences = mini_fences(mirror.prefix(), mirror.prefix().len());
        let Some(mut small) = self.try_alloc(mini_block_bytes(&mirror, &fences, dirty)) else {
            return;
        };
        let bytes = small.bytes_mut();
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
}
