//! The one place leaf pages are read from and written to the page store: the checked
//! reads (`read_leaf`, batched `read_leaves`), the writes (`write_leaf`, batched
//! `write_leaves`) with their leaf-write counters and fill hints, and the tickets a
//! reader uses to read a leaf page without its page lock and check afterwards that no
//! write raced it. A failed write poisons the tree here. The write-ahead log's rule is
//! not checked at these writes: in a `Db` the page store is shadow-paged, so no write
//! here changes a page a committed checkpoint names, and the rule is enforced when a
//! checkpoint commits (docs/design.md, "The database directory").
//!
//! Leaf pages read from disk are checked before anything relies on them: the checksum
//! (the store), the node layout (`parse_leaf`), and, where the page's records or fences
//! are used, that its fences are the page's routing range in its parent (`check_route`).
//! A page that fails is reported as damage (`Core::damaged`: `CorruptFile` naming the
//! page file, page and keyspace in a `Db`, else `Corrupted`); a page whose bytes passed
//! their checksum but are wrong poisons the tree.
//!
//! Uses: `mini` (to find a mini-page's leaf page), `descend` (the routing range),
//! `leaf`, `mapping`, `stats`.

use std::fmt::Display;

use crossbeam_epoch as epoch;

use crate::error::{Error, Result};
use crate::storage::{Page, PageNo};
use crate::sync::atomic::{AtomicU64, Ordering};

use super::Core;
use super::descend::Target;
use super::leaf_page::LeafPage;
use super::mapping::{Location, PageId};
use super::mini::PageLock;
use super::node::{Fence, NodeKind, NodeRef};
use super::olc::Restart;
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
pub(super) fn leaf_used_bytes(page: &LeafPage) -> usize {
    let node = page.payload();
    node.len() - NodeRef::trusted(node).reclaimable_space_bytes()
}

impl Core {
    pub(super) fn read_leaf<'p>(&self, no: PageNo, page: &'p mut LeafPage) -> Result<NodeRef<'p>> {
        self.read_leaf_bytes(no, page)?;
        bump(&self.counters.leaf_reads);
        self.parse_leaf(no, page)
    }

    /// Reads the store pages of leaf page `no` into `page`, unchecked but for their
    /// checksums (the caller parses or validates).
    pub(super) fn read_leaf_bytes(&self, no: PageNo, page: &mut LeafPage) -> Result<()> {
        let result = match page {
            LeafPage::One(one) => self.store.read_page(no, one),
            LeafPage::Wide { .. } => {
                let mut reqs: Vec<(PageNo, &mut Page)> = page.requests(no).collect();
                self.store.read_pages(&mut reqs)
            }
        };
        result.map_err(|e| self.read_error(no, e))?;
        page.gather();
        Ok(())
    }

    /// Records `page`'s fill as `pid`'s hint (`MappingTable::fill_hint`), which counts
    /// units of a 4 KiB leaf: a wide leaf's bytes are scaled down to them.
    pub(super) fn note_fill(&self, pid: PageId, page: &LeafPage) {
        self.mapping
            .set_fill_hint(pid, leaf_used_bytes(page) / self.leaf.pages());
    }

    /// The bytes `pid`'s leaf page used when last written (a hint: `note_fill`).
    pub(super) fn fill_hint(&self, pid: PageId) -> usize {
        self.mapping.fill_hint(pid) * self.leaf.pages()
    }

    /// A leaf page of this tree's size, of zero bytes.
    pub(super) fn new_leaf_page(&self) -> LeafPage {
        self.leaf.page()
    }

    /// The error of a failed read of leaf page `no`: a page that fails its checksum is
    /// named as `Core::damaged` names it; other errors stay as they are. Does not poison
    /// the tree (an unlocked read may have met a page being rewritten).
    pub(super) fn read_error(&self, no: PageNo, e: std::io::Error) -> Error {
        match Error::from(e) {
            Error::Corrupted { reason, .. } => self.damaged(no, reason),
            other => other,
        }
    }

    /// The error for leaf page `no` found damaged (`reason`): for a keyspace of a `Db`,
    /// `CorruptFile` naming its page file, the page and the keyspace; for a tree on its
    /// own, `Corrupted` naming the page.
    pub(super) fn damaged(&self, no: PageNo, reason: impl Display) -> Error {
        match self.place.get() {
            Some((path, keyspace)) => Error::CorruptFile {
                path: path.clone(),
                reason: format!("page {} of keyspace {keyspace:?}: {reason}", no.0),
            },
            None => Error::Corrupted {
                page: no.0,
                reason: reason.to_string(),
            },
        }
    }

    /// `damaged`, and the tree is poisoned with it: the page passed its checksum, so
    /// its bytes are what was written, and wrong; no write may build on them.
    pub(super) fn damaged_leaf(&self, no: PageNo, reason: impl Display) -> Error {
        let e = self.damaged(no, reason);
        self.record_damage(&e);
        e
    }

    /// Checks the node in a leaf page read from `no`. Every read of a leaf page's
    /// records goes through here, so it also refuses them once eviction dropped records
    /// of a failed tree that the page may lack (`Core::keep_in_memory`).
    pub(super) fn parse_leaf<'p>(&self, no: PageNo, page: &'p LeafPage) -> Result<NodeRef<'p>> {
        if self.dropped_records.load(Ordering::Acquire) {
            return Err(self.poisoned());
        }
        let leaf = NodeRef::parse(page.payload()).map_err(|e| self.damaged_leaf(no, e))?;
        if leaf.kind() != NodeKind::Leaf || leaf.low_fence().is_none() {
            return Err(self.damaged_leaf(no, "it is not a leaf page with fence keys"));
        }
        Ok(leaf)
    }

    /// Checks that `leaf`, leaf page `no` of page `pid` as read from disk (and parsed),
    /// has `pid`'s routing range as its fences. The caller holds `pid`'s lock and read
    /// the page under it or validated the read with a ticket, so the bytes are the
    /// page's current leaf page.
    ///
    /// Why it never fires on a sound tree: while a page's lock is held its leaf page's
    /// fences are its routing range (docs/design.md, "Capturing and rebuilding the leaf
    /// level"): both change only under the page's write lock, and together. Routing
    /// keys are suffix-truncated separators, and so are the fences, which splits and
    /// redistributions set to the very separators they publish; recovery's leaf list
    /// gives each page its captured range, whose bytes had those fences. A failed write
    /// can leave them apart; from then on (`write_failed`) nothing is checked, and
    /// reads trust only routing, as before.
    ///
    /// Cost: the page's low fence is looked up like a key (usually from the thread's
    /// locate hint: one level-1 node) and the two fences compared with the two
    /// separators around the page; no allocation unless the page is damaged. A page is
    /// damaged if its low fence routes to another page or a fence differs.
    pub(super) fn check_route(&self, pid: PageId, no: PageNo, leaf: &NodeRef<'_>) -> Result<()> {
        if self.write_failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let low: &[u8] = match leaf.low_fence() {
            Some(Fence::Key(k)) => k,
            Some(Fence::Unbounded) => &[],
            None => return Err(self.damaged_leaf(no, "it has no fence keys")),
        };
        loop {
            match self.route_matches(pid, low, leaf) {
                Ok(None) => return Ok(()),
                Ok(Some(reason)) => return Err(self.damaged_leaf(no, reason)),
                Err(Restart) => bump(&self.counters.restarts),
            }
        }
    }

    /// `None` if `leaf`'s fences are `pid`'s routing range, else what is wrong. `low`
    /// is the leaf's low fence (empty if unbounded). A restart if an inner node changed
    /// meanwhile.
    fn route_matches(
        &self,
        pid: PageId,
        low: &[u8],
        leaf: &NodeRef<'_>,
    ) -> Result<Option<String>, Restart> {
        let guard = epoch::pin();
        let Some(path) = self.find_leaf(Target::Holding(low), &guard)? else {
            // Every key has a page; nothing to compare with otherwise.
            return Ok(None);
        };
        let parent = path.parent_snapshot(&guard).ok_or(Restart)?;
        let n = parent.view();
        // The snapshot's version was read before its bytes (`LeafPath::routing_range`).
        if path.index >= n.len() {
            return Err(Restart);
        }
        let i = path.index;
        let prefix = n.prefix();
        let is_key = |j: usize, k: &[u8]| {
            let suffix = n.key_suffix(j);
            k.len() == prefix.len() + suffix.len()
                && k.starts_with(prefix)
                && &k[prefix.len()..] == suffix
        };
        let low_ok = match leaf.low_fence() {
            // Only the leftmost page is unbounded below; its separator is empty.
            Some(Fence::Unbounded) => prefix.is_empty() && n.key_suffix(i).is_empty(),
            Some(Fence::Key(k)) => is_key(i, k),
            None => false,
        };
        let high_ok = match (leaf.high_fence(), i + 1 < n.len()) {
            (Some(Fence::Key(k)), true) => is_key(i + 1, k),
            (Some(Fence::Key(k)), false) => {
                matches!(n.high_fence(), Some(Fence::Key(h)) if h == k)
            }
            (Some(Fence::Unbounded), false) => {
                matches!(n.high_fence(), Some(Fence::Unbounded) | None)
            }
            _ => false,
        };
        let verdict = if path.pid == pid && low_ok && high_ok {
            None
        } else {
            let mut routed_low = Vec::new();
            n.key_into(i, &mut routed_low);
            let routed_high = if i + 1 < n.len() {
                let mut high = Vec::new();
                n.key_into(i + 1, &mut high);
                Some(high)
            } else {
                n.high_fence().and_then(|f| f.key().map(<[u8]>::to_vec))
            };
            let low_fence = if routed_low.is_empty() {
                Fence::Unbounded
            } else {
                Fence::Key(&routed_low)
            };
            let high_fence = routed_high.as_deref().map_or(Fence::Unbounded, Fence::Key);
            let routed = show_range(Some(low_fence), Some(high_fence));
            let own = show_range(leaf.low_fence(), leaf.high_fence());
            Some(if path.pid == pid {
                format!("its key range {own} is not the range {routed} the tree routes to it")
            } else {
                format!("its key range {own} starts in another page's range {routed}")
            })
        };
        parent.validate()?;
        Ok(verdict)
    }

    /// Writes the leaf page of `pid`, whose write lock the caller holds. A failure
    /// poisons the tree.
    pub(super) fn write_leaf(&self, pid: PageId, no: PageNo, page: &mut LeafPage) -> Result<()> {
        self.note_leaf_write(pid);
        debug_assert!(NodeRef::parse(page.payload()).is_ok());
        page.scatter();
        let result = match page {
            LeafPage::One(one) => self.store.write_page(no, one),
            LeafPage::Wide { .. } => {
                let mut reqs: Vec<(PageNo, &mut Page)> = page.requests(no).collect();
                self.store.write_pages(&mut reqs)
            }
        };
        if let Err(e) = result {
            let e = Error::from(e);
            self.record_failure(&e);
            return Err(e);
        }
        self.note_fill(pid, page);
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
    pub(super) fn read_leaves(&self, nos: &[PageNo], pages: &mut [LeafPage]) -> Result<()> {
        debug_assert_eq!(nos.len(), pages.len());
        let mut reqs: Vec<(PageNo, &mut Page)> = nos
            .iter()
            .copied()
            .zip(pages.iter_mut())
            .flat_map(|(no, page)| page.requests(no))
            .collect();
        self.store.read_pages(&mut reqs)?;
        drop(reqs);
        for page in pages.iter_mut() {
            page.gather();
        }
        bump_by(&self.counters.leaf_reads, nos.len());
        if nos.len() > 1 {
            bump_by(&self.counters.batched_leaf_reads, nos.len());
        }
        Ok(())
    }

    /// Writes leaf pages with one `write_pages` call: pages of ids whose write locks the
    /// caller holds (and whose leaf-write counters it bumped), or new pages no reader can
    /// reach yet. A failure poisons the tree.
    pub(super) fn write_leaves(&self, leaves: &mut [(PageNo, &mut LeafPage)]) -> Result<()> {
        for (_, page) in leaves.iter_mut() {
            debug_assert!(NodeRef::parse(page.payload()).is_ok());
            page.scatter();
        }
        let mut reqs: Vec<(PageNo, &mut Page)> = leaves
            .iter_mut()
            .flat_map(|(no, page)| page.requests(*no))
            .collect();
        if let Err(e) = self.store.write_pages(&mut reqs) {
            let e = Error::from(e);
            self.record_failure(&e);
            return Err(e);
        }
        bump_by(&self.counters.leaf_writes, leaves.len());
        if leaves.len() > 1 {
            bump_by(&self.counters.batched_leaf_writes, leaves.len());
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

/// A range of fences for an error message: `[low, high)`, keys escaped, `-inf` and
/// `+inf` for unbounded ends.
fn show_range(low: Option<Fence<'_>>, high: Option<Fence<'_>>) -> String {
    let show = |f: Option<Fence<'_>>, unbounded: &str| match f {
        Some(Fence::Key(k)) => format!("{:?}", k.escape_ascii().to_string()),
        Some(Fence::Unbounded) => unbounded.to_string(),
        None => "none".to_string(),
    };
    format!("[{}, {})", show(low, "-inf"), show(high, "+inf"))
}
