//! Finding a key's page: the descent through the inner nodes under optimistic latch
//! coupling (Bf-Tree §3.4), the per-thread locate hint that starts at the level-1 node
//! the thread's last descent ended in, and taking the page's lock with the parent's
//! version validated afterwards (`lock_leaf`).
//!
//! Every inner node is read through one [`InnerSnapshot`](super::inner::InnerSnapshot),
//! so an index found in its bytes always refers to those bytes. Invariant: a
//! [`LeafPath`] names a page and the parent version that routed to it; a page lock taken
//! on it is trusted only once that version still validates (a split updates the parent
//! before it releases the page's lock).
//!
//! Uses: `inner`, `olc`, `mapping`, `stats`.

use crossbeam_epoch::{self as epoch, Guard};

use crate::error::Result;
use crate::sync::atomic::Ordering;

use super::Core;
use super::inner::{self, InnerNode, InnerSnapshot};
use super::mapping::{MappingTable, PageId};
use super::node::{self, NodeRef};
use super::olc::Restart;
use super::stats::bump;

/// Which page a traversal looks for.
#[derive(Clone, Copy)]
pub(super) enum Target<'k> {
    /// The page whose range holds the key.
    Holding(&'k [u8]),
    /// The page holding the largest keys below the key.
    Below(&'k [u8]),
    /// The last page.
    Last,
}

/// Where a traversal ended: the page and the inner node that routed to it.
pub(super) struct LeafPath<'t> {
    pub(super) parent: &'t InnerNode,
    pub(super) parent_version: u64,
    pub(super) pid: PageId,
    /// Position of `pid` among the parent's children (scans prefetch its neighbours).
    pub(super) index: usize,
    /// Length of the key prefix every key of the page shares (from its fences).
    pub(super) prefix_len: usize,
}

impl<'t> LeafPath<'t> {
    /// The path to child `index` of the level-1 node read as `parent`; a restart if the
    /// node changed since.
    pub(super) fn at(
        parent: &InnerSnapshot<'t, '_>,
        index: usize,
    ) -> Result<LeafPath<'t>, Restart> {
        let n = parent.view();
        let pid = PageId(inner::child_ref(&n, index));
        let prefix_len = child_prefix_len(&n, index);
        parent.validate()?;
        Ok(LeafPath {
            parent: parent.node(),
            parent_version: parent.version(),
            pid,
            index,
            prefix_len,
        })
    }

    /// `Ok` if the parent did not change since the traversal: the page it routed to
    /// still covers the traversal's key.
    pub(super) fn validate(&self) -> Result<(), Restart> {
        self.parent.validate(self.parent_version)
    }

    /// The page's routing range `[low, high)` in its parent (`high` `None`: unbounded),
    /// read from the parent at the version the traversal saw; a restart if the parent
    /// changed since. While the caller holds the page's lock (taken after the traversal,
    /// the parent validated after it, as `lock_leaf` does) the range stays the page's:
    /// only a split or a redistribution of the page changes it, and both hold the page's
    /// write lock.
    pub(super) fn routing_range(&self) -> Result<(Vec<u8>, Option<Vec<u8>>), Restart> {
        let guard = epoch::pin();
        let parent = self.parent_snapshot(&guard).ok_or(Restart)?;
        let n = parent.view();
        // The snapshot's version was read before its bytes: a writer may have published
        // newer bytes in between, where `index` may not exist. Validation below tells.
        if self.index >= n.len() {
            return Err(Restart);
        }
        let mut low = Vec::new();
        n.key_into(self.index, &mut low);
        let high = if self.index + 1 < n.len() {
            let mut high = Vec::new();
            n.key_into(self.index + 1, &mut high);
            Some(high)
        } else {
            n.high_fence().and_then(|f| f.key().map(<[u8]>::to_vec))
        };
        parent.validate()?;
        Ok((low, high))
    }

    /// The parent as the traversal saw it, if it has not changed since: `index` is then
    /// still `pid`'s position in it.
    pub(super) fn parent_snapshot<'g>(&self, guard: &'g Guard) -> Option<InnerSnapshot<'t, 'g>>
    where
        't: 'g,
    {
        let snapshot = self.parent.snapshot(guard).ok()?;
        (snapshot.version() == self.parent_version).then_some(snapshot)
    }
}

thread_local! {
    /// The level-1 inner node this thread's last descent ended in, with the id of its
    /// tree: where `find_leaf` starts looking for a key before descending from the
    /// root (`Core::locate_from_hint`).
    pub(super) static LOCATE_HINT: std::cell::Cell<(u64, *const InnerNode)> =
        const { std::cell::Cell::new((0, std::ptr::null())) };
}

/// Whether an inner node's range holds keys just below `key`: low < key ≤ high.
pub(super) fn covers_below(n: &NodeRef<'_>, key: &[u8]) -> bool {
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
pub(super) fn child_prefix_len(n: &NodeRef<'_>, i: usize) -> usize {
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

impl Core {
    pub(super) fn root(&self) -> &InnerNode {
        // SAFETY: the root pointer always holds a live inner node, and inner nodes are
        // freed only when the tree drops.
        unsafe { &*self.root.load(Ordering::Acquire) }
    }

    /// Follows a child reference of a level-2+ inner node.
    pub(super) fn inner_at(&self, child: u64) -> &InnerNode {
        // SAFETY: child references above level 1 are addresses of `InnerNode`s created by
        // this tree and freed only when it drops.
        unsafe { &*(child as usize as *const InnerNode) }
    }

    /// Traverses to the page chosen by `target`, pinning an epoch only for the traversal:
    /// the returned path refers to inner nodes, which live as long as the tree, so no pin
    /// is held while the caller waits for a page lock or does IO.
    pub(super) fn locate(&self, target: Target<'_>) -> Result<Option<LeafPath<'_>>, Restart> {
        let guard = epoch::pin();
        self.find_leaf(target, &guard)
    }

    /// Traverses to the page holding `target`, takes its lock with `lock` (the mapping
    /// table's `read` or `write`) and then validates the parent's version: a split
    /// changes the parent before it releases the leaf's lock, so a validated parent
    /// proves the page still covers `target`. Restarts from the root until both hold.
    /// `None`: no page holds `target` (a `Below` or `Last` target at the edge of the key
    /// space; a `Holding` target always has a page).
    pub(super) fn lock_leaf<'t, G>(
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
            if path.validate().is_err() {
                bump(&self.counters.restarts);
                continue;
            }
            return Some((path, page));
        }
    }

    /// `lock_leaf` for the page holding `key`, which always exists.
    pub(super) fn lock_leaf_of<'t, G>(
        &'t self,
        key: &[u8],
        lock: impl Fn(&'t MappingTable, PageId) -> G,
    ) -> (LeafPath<'t>, G) {
        self.lock_leaf(Target::Holding(key), lock)
            .expect("the root covers every key, so a key always has a page")
    }

    /// Traverses to the page chosen by `target`. `Ok(None)` means no page qualifies
    /// (only for [`Target::Below`] when no key lies below the given one).
    pub(super) fn find_leaf<'t>(
        &'t self,
        target: Target<'_>,
        guard: &Guard,
    ) -> Result<Option<LeafPath<'t>>, Restart> {
        if let Target::Holding(key) = target
            && let Some(path) = self.locate_from_hint(key, guard)
        {
            return Ok(Some(path));
        }
        let mut node = self.root().snapshot(guard)?;
        loop {
            let n = node.view();
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
                node.validate()?;
                return Ok(None);
            };
            if node.node().level == 1 {
                let path = LeafPath::at(&node, index)?;
                LOCATE_HINT.set((self.id, node.node()));
                return Ok(Some(path));
            }
            let next = self.inner_at(inner::child_ref(&n, index)).snapshot(guard)?;
            node.validate()?;
            node = next;
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
    pub(super) fn locate_from_hint<'t>(
        &'t self,
        key: &[u8],
        guard: &Guard,
    ) -> Option<LeafPath<'t>> {
        let (tree, node) = LOCATE_HINT.get();
        if tree != self.id {
            return None;
        }
        // SAFETY: the hint was set by a descent of this tree (tree ids are never
        // reused) to one of its inner nodes, and inner nodes are freed only when the tree
        // drops, which it cannot have done while `self` is borrowed.
        let node: &'t InnerNode = unsafe { &*node };
        let snapshot = node.snapshot(guard).ok()?;
        let n = snapshot.view();
        if !n.covers(key) {
            return None;
        }
        LeafPath::at(&snapshot, inner::child_for(&n, key)).ok()
    }

    /// Snapshots of the inner nodes from the root down to the level-1 node routing
    /// `key`. Used by splits and redistributions, which then lock what they change.
    pub(super) fn find_path<'g>(
        &'g self,
        key: &[u8],
        guard: &'g Guard,
    ) -> Result<Vec<InnerSnapshot<'g, 'g>>, Restart> {
        let mut path = Vec::with_capacity(8);
        let mut node = self.root().snapshot(guard)?;
        loop {
            let n = node.view();
            if !n.covers(key) {
                return Err(Restart);
            }
            let child = inner::child_ref(&n, inner::child_for(&n, key));
            path.push(node);
            if node.node().level == 1 {
                node.validate()?;
                return Ok(path);
            }
            let next = self.inner_at(child).snapshot(guard)?;
            node.validate()?;
            node = next;
        }
    }
}
