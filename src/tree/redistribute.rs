//! B*-tree redistribution: an overflowing leaf page that has a sibling with room under
//! the same level-1 node gives it records instead of splitting. Write order: the
//! neighbour's new page, then the parent's separator (published under the parent's
//! version lock, computed from one snapshot of it), then the giving page; so a failed
//! write never routes a key to a page that lacks it (docs/design.md, "merge →
//! redistribution").
//!
//! Uses: `descend`, `leaf_io`, `plan`, `mini`, `inner`, `leaf`, `node`, `mapping`,
//! `stats`.

use crossbeam_epoch::{self as epoch, Guard};

use crate::error::Result;
use crate::pool::Block;
use crate::storage::PageNo;
use crate::sync::atomic::Ordering;

use super::inner::{self, InnerSnapshot};
use super::leaf::{self, MiniHeader, RecordList};
use super::leaf_page::LeafPage;
use super::mapping::{self, Location, PageId};
use super::node::{NodeMut, NodeRef, RecordType};
use super::plan::{MergePlan, owned_fence};
use super::stats::bump;
use super::{Core, Op};

/// A neighbour locked for a redistribution (`Core::pick_neighbour`).
pub(super) struct Neighbour<'t> {
    pub(super) page: mapping::WriteGuard<'t>,
    /// Its leaf page and whether its mini-page is a mirror (made up when it has none).
    pub(super) header: MiniHeader,
    /// Its mini-page, if it has one.
    pub(super) block: Option<Block>,
    /// Whether it lies left of the overflowing page.
    pub(super) left: bool,
}

/// What a redistribution writes (`Core::plan_redistribution`), its neighbour still locked.
pub(super) struct Redistribution<'t> {
    pub(super) neighbour: Neighbour<'t>,
    /// The overflowing page, which gives records.
    pub(super) giving_pid: PageId,
    /// A key of the giving page's old range, which finds the two pages' parent.
    pub(super) probe: Vec<u8>,
    /// The neighbour's page as its own merge would write it: written back if the parent
    /// cannot take the new separator.
    pub(super) restore: LeafPage,
    /// The two new pages, left then right.
    pub(super) pages: [LeafPage; 2],
    pub(super) separator: Vec<u8>,
}

impl<'t> Redistribution<'t> {
    /// The overflowing page's new page, once the neighbour's lock may go.
    pub(super) fn into_giving(self) -> LeafPage {
        let [left, right] = self.pages;
        if self.neighbour.left { right } else { left }
    }

    /// The neighbour's lock, leaf page and old page, for writing it back.
    pub(super) fn into_restore(self) -> (mapping::WriteGuard<'t>, PageNo, LeafPage) {
        (
            self.neighbour.page,
            self.neighbour.header.leaf,
            self.restore,
        )
    }

    /// The overflowing page's new page.
    pub(super) fn giving(&mut self) -> &mut LeafPage {
        let i = usize::from(self.neighbour.left);
        &mut self.pages[i]
    }

    /// The neighbour's new page.
    pub(super) fn receiving(&mut self) -> &mut LeafPage {
        let i = usize::from(!self.neighbour.left);
        &mut self.pages[i]
    }
}

/// A leaf page that overflows moves records into a neighbour only if the two then hold
/// at most this share of two pages ([`Config::leaf_redistribution`]). Lower, more splits;
/// higher, the two pages are nearly full and soon overflow again, each time at the cost
/// of the neighbour's IO. A simulation of random inserts (docs/design.md) gave pages
/// 80.8% full at 90%.
pub(super) const REDISTRIBUTE_FILL_PERCENT: usize = 90;

impl Core {
    /// Picks and locks the neighbour that an overflowing page `pid` (split by `chunks` of
    /// `records`, its write lock held by the caller) could give records to instead of
    /// splitting ([`Config::leaf_redistribution`]): the emptier sibling under the same
    /// level-1 inner node by its fill hint, if the two pages would fill at most
    /// `REDISTRIBUTE_FILL_PERCENT` of two pages. Only a try-lock (the caller holds page
    /// locks); `None` for a split, and always once the tree is poisoned. A page never
    /// written has a hint of 0 and may be picked wrongly: `plan_redistribution` checks
    /// the real bytes.
    pub(super) fn pick_neighbour(
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
        let n = path.last().expect("paths are never empty").view();
        let index = inner::child_for(&n, probe);
        if inner::child_ref(&n, index) != pid.0 {
            return None;
        }
        let own_bytes = records.cost_bytes(leaf::fences_prefix_len(
            chunks[0].low.as_deref(),
            chunks[1].high.as_deref(),
        ));
        let limit = 2 * self.leaf.node_bytes() * REDISTRIBUTE_FILL_PERCENT / 100;
        let (other, other_pid) = [index.checked_sub(1), Some(index + 1)]
            .into_iter()
            .flatten()
            .filter(|&i| i < n.len())
            .map(|i| (i, PageId(inner::child_ref(&n, i))))
            .filter(|&(_, p)| self.fill_hint(p) + own_bytes <= limit)
            .min_by_key(|&(_, p)| self.fill_hint(p))?;
        let page = self.mapping.try_write(other_pid)?;
        // A failed write may have left the neighbour's leaf page wider than its range,
        // overlapping the records this page gives: a poisoned tree takes no neighbour.
        // The failing operation recorded the failure before it released this lock.
        if self.failed.load(Ordering::Acquire) {
            return None;
        }
        let (header, block) = match page.location() {
            Location::Leaf(no) => {
                let header = MiniHeader {
                    pid: other_pid,
                    leaf: PageNo(no),
                    mirror: false,
                    owner: self.owner,
                };
                (header, None)
            }
            Location::Mini(_) => {
                let mini = self.mini_page(&page)?;
                (mini.header(), Some(mini.block()))
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
    pub(super) fn plan_redistribution<'t>(
        &self,
        pid: PageId,
        neighbour: Neighbour<'t>,
        leaf: Option<LeafPage>,
        records: &RecordList,
        chunks: &[leaf::LeafChunk],
    ) -> Option<Redistribution<'t>> {
        let mini = self.mini_page(&neighbour.page).map(|m| m.node());
        let Ok(MergePlan::Write(restore)) = self.plan_merge(neighbour.header, mini, None, leaf)
        else {
            return None;
        };
        let theirs = NodeRef::trusted(restore.payload());
        let mut all =
            RecordList::with_capacity(records.len() + theirs.len(), 2 * self.leaf.node_bytes());
        let push_theirs = |all: &mut RecordList| {
            for r in theirs.iter() {
                all.push_view(&r, r.record_type().dirty());
            }
        };
        let (low, high) = if neighbour.left {
            push_theirs(&mut all);
            for (k, v, t) in records.iter() {
                all.push(k, v, t.dirty());
            }
            (owned_fence(theirs.low_fence()), chunks[1].high.clone())
        } else {
            for (k, v, t) in records.iter() {
                all.push(k, v, t.dirty());
            }
            push_theirs(&mut all);
            (chunks[0].low.clone(), owned_fence(theirs.high_fence()))
        };
        let packed = leaf::pack_leaves(
            &all,
            low.as_deref(),
            high.as_deref(),
            leaf::Fill::Balanced,
            self.leaf.node_bytes(),
        );
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
        let mut pages = [self.new_leaf_page(), self.new_leaf_page()];
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
    /// old one between it and its neighbour: the parent as read, and the new bytes.
    /// `None` if the parent no longer holds the two pages side by side (found afresh
    /// with `r.probe`, a key of the giving page's old range) or has no room for a longer
    /// separator. Everything is computed from one snapshot of the parent: a split
    /// published meanwhile fails the caller's lock, never an index.
    pub(super) fn parent_with_separator<'g>(
        &'g self,
        r: &Redistribution<'_>,
        guard: &'g Guard,
    ) -> Option<(InnerSnapshot<'g, 'g>, Box<[u8]>)> {
        let path = self.find_path(&r.probe, guard).ok()?;
        let parent = *path.last().expect("paths are never empty");
        #[cfg(all(test, not(feature = "shuttle")))]
        super::hooks::fire_parent_read();
        let n = parent.view();
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
        let mut bytes: Box<[u8]> = n.as_bytes().into();
        let mut copy = NodeMut::trusted(&mut bytes);
        copy.remove(right_index);
        (copy.insert(&r.separator, &child, RecordType::Insert) == Ok(right_index))
            .then_some((parent, bytes))
    }

    /// Publishes a redistribution's new separator, once the neighbour's new page is
    /// written: only then may keys be routed to it. The parent's version lock is held
    /// only to publish. Returns whether it published; if not, the parent changed since
    /// `plan_redistribution` checked it (a concurrent split or redistribution under it),
    /// and the caller writes the neighbour's page back as it was (`restore`) and
    /// restarts. On success the neighbour's mini-page is dropped: its records are in its
    /// new page, and its prefix may not be the new page's.
    pub(super) fn link_redistribution(&self, r: &Redistribution<'_>) -> bool {
        let guard = epoch::pin();
        let Some((parent, bytes)) = self.parent_with_separator(r, &guard) else {
            return false;
        };
        let Ok(lock) = parent.lock() else {
            return false;
        };
        lock.publish(bytes, &guard);
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
    pub(super) fn redistribute(
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
            let mut page = self.new_leaf_page();
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
}
