//! TODO-DOC split

use crossbeam_epoch::{self as epoch, Guard};

use crate::error::{Error, Result};
use crate::storage::{Page, PageNo};
use crate::sync::atomic::Ordering;

use super::inner::{self, InnerLock, InnerNode, InnerSnapshot};
use super::leaf::{self, RecordList};
use super::leaf_io::leaf_used_bytes;
use super::mapping::{self, Location, PageId};
use super::mirror::OpenEnd;
use super::node::{self, NodeMut, RecordType, WriteError};
use super::olc::Restart;
use super::plan::owned_fence;
use super::stats::bump;
use super::{Core, Op};

impl Core {
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
    pub(super) fn split_leaf(
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
    pub(super) fn split_path<'g>(
        &'g self,
        pid: PageId,
        chunks: &[leaf::LeafChunk],
        guard: &'g Guard,
    ) -> Result<Vec<InnerSnapshot<'g, 'g>>, Op> {
        let probe = chunks[0].low.as_deref().unwrap_or_default();
        let path = self.find_path(probe, guard)?;
        let n = path.last().expect("paths are never empty").view();
        if inner::child_ref(&n, inner::child_for(&n, probe)) != pid.0 {
            return Err(Op::Restart);
        }
        Ok(path)
    }

    /// Step (1) of a split without its IO: a new page number and page for every chunk
    /// but the first, which keeps the old page.
    pub(super) fn build_right_pages(
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
    pub(super) fn free_pages(&self, right: &[(PageNo, Box<Page>)]) {
        for &(no, _) in right {
            let _ = self.store.free(no);
        }
    }

    /// Steps (2) and (3) of a split whose right-hand pages are written: gives each a
    /// page id and publishes their separators. On failure the right-hand pages and ids
    /// are released and nothing was published. With `hold` (an index into `right`),
    /// returns that new page's write lock, taken before the page could be reached.
    pub(super) fn link_split(
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
        let mut plan: Vec<InnerLock<'_, '_>> = Vec::with_capacity(path.len());
        let mut incoming_bytes: usize = children
            .iter()
            .map(|(k, _)| node::KV_META_SIZE_BYTES + k.len() + 8)
            .sum();
        let mut root_splits = true;
        for &node in path.iter().rev() {
            match node.lock() {
                Ok(lock) => plan.push(lock),
                Err(Restart) => {
                    drop(plan);
                    undo(&new_pids);
                    return Err(Op::Restart);
                }
            }
            if node.view().reclaimable_space_bytes() >= incoming_bytes {
                root_splits = false;
                break;
            }
            incoming_bytes = node::KV_META_SIZE_BYTES + self.config.max_key_bytes + 8;
        }

        // (3) Build every new inner buffer bottom-up through the locked nodes, then
        // publish them all: nothing that can fail (or panic) runs between the first
        // publication and the last, so readers never see half a split.
        let mut pending = children;
        let mut publish: Vec<(&InnerLock<'_, '_>, Box<[u8]>)> = Vec::with_capacity(plan.len());
        let mut created: Vec<usize> = Vec::new();
        let mut new_root = None;
        for (depth, node) in plan.iter().enumerate() {
            // Fast path: the separators fit into a copy of the node, one insert each,
            // instead of a rebuild that re-appends every separator the node holds.
            let mut copy: Box<[u8]> = node.bytes().into();
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
            let n = node.view();
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
            let level = node.node().level;
            let right_node = Box::into_raw(InnerNode::new(level, right));
            created.push(right_node as usize);
            publish.push((node, left));
            if last {
                // The root split: a new root above the two halves.
                let root_entries = vec![
                    (Vec::new(), node.node() as *const InnerNode as usize as u64),
                    (sep, right_node as usize as u64),
                ];
                let bytes = inner::build(self.inner_size_bytes, None, None, &root_entries)
                    .expect("two separators fit");
                let root = Box::into_raw(InnerNode::new(level + 1, bytes));
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
        for (lock, bytes) in publish {
            lock.publish(bytes, &guard);
        }
        if let Some(root) = new_root {
            self.root.store(root, Ordering::Release);
        }
        drop(plan);
        bump(&self.counters.leaf_splits);
        Ok(held)
    }
}
