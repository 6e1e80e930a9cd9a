//! The one place leaf pages are read from and written to the page store: the checked
//! reads (`read_leaf`, batched `read_leaves`), the writes (`write_leaf`, batched
//! `write_leaves`) with their leaf-write counters and fill hints, and the tickets a
//! reader uses to read a leaf page without its page lock and check afterwards that no
//! write raced it. A failed write poisons the tree here. The write-ahead log's rule is
//! not checked at these writes: in a `Db` the page store is shadow-paged, so no write
//! here changes a page a committed checkpoint names, and the rule is enforced when a
//! checkpoint commits (docs/design.md, "The database directory").
//!
//! Uses: `mini` (to find a mini-page's leaf page), `leaf`, `mapping`, `stats`.

use crate::error::{Error, Result};
use crate::storage::{PAGE_PAYLOAD_SIZE, Page, PageNo};
use crate::sync::atomic::{AtomicU64, Ordering};

use super::Core;
use super::mapping::{Location, PageId};
use super::mini::PageLock;
use super::node::NodeRef;
use super::stats::{LEAF_VERSION_STRIPES, bump, bump_by};

/// A leaf page a read still needs, noted under the page's lock so that the page can be
/// read later without the lock and validated (`Core::finish_read`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeafTicket {
    pub(crate) pid: PageId,
    /// The leaf page to read.
    pub(crate) leaf: PageNo,
    /// The page's leaf-write counter when the ticket was taken.
    pub(super) version: u64,
    pub(super) prefix_len: usize,
}

/// Bytes of a leaf page's payload in use: what its fill hint records.
pub(super) fn leaf_used_bytes(page: &Page) -> usize {
    PAGE_PAYLOAD_SIZE - NodeRef::trusted(page.payload()).reclaimable_space_bytes()
}

impl Core {
    pub(super) fn read_leaf<'p>(&self, no: PageNo, page: &'p mut Page) -> Result<NodeRef<'p>> {
        self.store.read_page(no, page)?;
        bump(&self.counters.leaf_reads);
        self.parse_leaf(no, page)
    }

    /// Checks the node in a leaf page read from `no`. Every read of a leaf page's
    /// records goes through here, so it also refuses them once eviction dropped records
    /// of a failed tree that the page may lack (`Core::keep_in_memory`).
    pub(super) fn parse_leaf<'p>(&self, no: PageNo, page: &'p Page) -> Result<NodeRef<'p>> {
        if self.dropped_records.load(Ordering::Acquire) {
            return Err(self.poisoned());
        }
        NodeRef::parse(page.payload()).map_err(|e| Error::Corrupted {
            page: no.0,
            reason: e.to_string(),
        })
    }

    /// Writes the leaf page of `pid`, whose write lock the caller holds. A failure
    /// poisons the tree.
    pub(super) fn write_leaf(&self, pid: PageId, no: PageNo, page: &mut Page) -> Result<()> {
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
    pub(super) fn note_leaf_write(&self, pid: PageId) {
        // Relaxed: for `pid` the counter is bumped under its write lock and read under
        // its lock, whose acquire and release order those accesses. The other ids of
        // the stripe bump it under their own locks: that can only show a reader a change
        // that was not its page's (a needless retry), never hide one.
        self.leaf_version(pid).fetch_add(1, Ordering::Relaxed);
    }

    /// The leaf-write counter of `pid` (shared with the other ids of its stripe).
    pub(super) fn leaf_version(&self, pid: PageId) -> &AtomicU64 {
        &self.counters.leaf_versions.0[(pid.0 % LEAF_VERSION_STRIPES as u64) as usize]
    }

    /// Reads leaf pages `nos` into `pages` with one `read_pages` call. The pages are
    /// checked (`parse_leaf`) only once their read is validated.
    pub(super) fn read_leaves(&self, nos: &[PageNo], pages: &mut [Box<Page>]) -> Result<()> {
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

    /// Writes leaf pages with one `write_pages` call: pages of ids whose write locks the
    /// caller holds (and whose leaf-write counters it bumped), or new pages no reader can
    /// reach yet. A failure poisons the tree.
    pub(super) fn write_leaves(&self, reqs: &mut [(PageNo, &mut Page)]) -> Result<()> {
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

    /// The leaf page of the page locked by `page`.
    pub(super) fn leaf_of(&self, page: &impl PageLock) -> PageNo {
        match page.location() {
            Location::Mini(_) => self.mini_page(page).expect("a mini-page").header().leaf,
            Location::Leaf(no) => PageNo(no),
            Location::Empty => unreachable!("a routed page id is in use"),
        }
    }

    /// A ticket for the leaf page of `pid`, locked by `page`.
    pub(super) fn ticket(
        &self,
        pid: PageId,
        page: &impl PageLock,
        prefix_len: usize,
    ) -> LeafTicket {
        LeafTicket {
            pid,
            leaf: self.leaf_of(page),
            version: self.leaf_version(pid).load(Ordering::Relaxed),
            prefix_len,
        }
    }

    /// Whether a leaf page read since `ticket` was taken, without the lock, still holds
    /// the page's current contents, and the page still covers the keys it covered. The
    /// caller holds `ticket.pid`'s lock again (`page`).
    ///
    /// Argument: the counter only grows, and it is bumped under the write lock by every
    /// leaf write of the page (merges, eviction, flush, and the split that rewrites the
    /// left page in place, which is also the only way the page's key range shrinks). The
    /// ticket and this check both read it under the page lock, and the read happened in
    /// between. An unchanged counter therefore means no write lock holder wrote the leaf
    /// page from before the ticket until now, so the bytes read are neither torn nor
    /// stale, and the page's range is what it was.
    pub(super) fn ticket_valid(&self, ticket: &LeafTicket, page: &impl PageLock) -> bool {
        page.location() != Location::Empty
            && self.leaf_version(ticket.pid).load(Ordering::Relaxed) == ticket.version
            && self.leaf_of(page) == ticket.leaf
    }

    /// Whether `ticket` still describes its page's leaf page (no leaf write since). Takes
    /// the page's read lock for the check.
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn ticket_current(&self, ticket: &LeafTicket) -> bool {
        let page = self.mapping.read(ticket.pid);
        self.ticket_valid(ticket, &page)
    }
}
