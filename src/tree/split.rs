//! Leaf splits: the one protocol ([`PlannedSplit`]) shared by a single merge and a
//! batched one — plan and build the right-hand pages, write them, link them into the
//! parent (splitting inner nodes up to the root as needed), rewrite the left page.
//!
//! Invariant: nothing can reach a right-hand page before its separator is published,
//! and every inner node that changes is locked (from a snapshot taken on the way down)
//! before the first publication; nothing that can fail runs between the first
//! publication and the last, so readers never see half a split.
//!
//! Uses: `descend`, `leaf_io`, `mirror` (open ends), `plan`, `inner`, `leaf`, `node`,
//! `mapping`, `stats`.

use crossbeam_epoch::{self as epoch, Guard};

use crate::error::{Error, Result};
use crate::storage::PageNo;
use crate::sync::atomic::Ordering;

use super::inner::{self, InnerLock, InnerNode, InnerSnapshot};
use super::leaf::{self, RecordList};
use super::leaf_page::{LeafGeometry, LeafPage};
use super::mapping::{self, Location, PageId};
use super::mirror::OpenEnd;
use super::node::{self, NodeMut, RecordType, WriteError};
use super::plan::owned_fence;
use super::stats::bump;
use super::{Core, Op};

/// An inner node split by `Core::split_inner`: the first part's bytes, then each other
/// part's separator and bytes.
type InnerParts = (Box<[u8]>, Vec<(Vec<u8>, Box<[u8]>)>);

/// A split of page `pid` planned and built but not yet reachable: the records and the
/// chunks they pack into, and a numbered, built page for every chunk but the first
/// (which keeps the old page). The one protocol of a split, for a single merge
/// (`Core::split_leaf`) and a batched one (`Core::merge_batch`), which batches each
/// step's IO across its splits:
///
/// 1. [`Core::plan_split`] checks the parent still routes to `pid` (a split that would
///    restart does so before any IO) and builds the right-hand pages;
/// 2. the caller writes [`PlannedSplit::right_writes`] (or gives the plan up with
///    [`Core::abandon_split`] if that fails);
/// 3. [`Core::link_split`] gives the new pages ids and publishes their separators;
/// 4. the caller rewrites the old page with [`PlannedSplit::left_page`].
///
/// Until (3) nobody can reach the new pages; from (3) on, keys of the right ranges route
/// to them. The caller holds the left page's write lock throughout, so nobody reads the
/// left page between (3) and (4).
pub(super) struct PlannedSplit {
    pid: PageId,
    records: RecordList,
    chunks: Vec<leaf::LeafChunk>,
    right: Vec<(PageNo, LeafPage)>,
    /// The size of the tree's leaf pages.
    geometry: LeafGeometry,
}

impl PlannedSplit {
    /// Step (1)'s writes: the right-hand pages, each at its new page number.
    pub(super) fn right_writes(&mut self) -> impl Iterator<Item = (PageNo, &mut LeafPage)> + '_ {
        self.right.iter_mut().map(|(no, p)| (*no, p))
    }

    /// Step (4)'s page: the first chunk, which keeps the old page number.
    pub(super) fn left_page(&self) -> LeafPage {
        let mut page = self.geometry.page();
        leaf::build_leaf(page.payload_mut(), &self.chunks[0], &self.records)
            .expect("packed to fit");
        page
    }
}

/// New inner-node bytes for a split's step (3), built under the locks and not yet
/// published: an index into the locked nodes with its new bytes, the inner nodes created
/// (right halves, and a new root), and the new root if the root split.
struct InnerUpdates {
    publish: Vec<(usize, Box<[u8]>)>,
    created: Vec<usize>,
    new_root: Option<*mut InnerNode>,
}

impl Core {
    /// A whole split of page `pid` (steps (1) to (4) of [`PlannedSplit`]), its IO one
    /// page at a time.
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
        records: RecordList,
        chunks: Vec<leaf::LeafChunk>,
        open: Option<usize>,
    ) -> Result<Option<OpenEnd>, Op> {
        let mut split = self.plan_split(pid, records, chunks)?;
        let mut reqs: Vec<(PageNo, &mut LeafPage)> = split.right_writes().collect();
        if let Err(e) = self.write_leaves(&mut reqs) {
            self.abandon_split(&split);
            return Err(Op::Fail(e));
        }
        let hold = open.and_then(|j| j.checked_sub(1));
        if let Some((j, guard)) = hold.zip(self.link_split(&split, hold)?) {
            let (no, page) = &split.right[j];
            self.mirror_open_end(&guard, *no, page);
        }
        let mut page = split.left_page();
        self.write_leaf(pid, leaf_no, &mut page)?;
        Ok((open == Some(0)).then_some(OpenEnd {
            leaf: leaf_no,
            page,
        }))
    }

    /// Step (1) of a split without its IO: checks that the parent still routes to `pid`
    /// (else a restart, before any IO) and builds a numbered page for every chunk but the
    /// first.
    pub(super) fn plan_split(
        &self,
        pid: PageId,
        records: RecordList,
        chunks: Vec<leaf::LeafChunk>,
    ) -> Result<PlannedSplit, Op> {
        self.split_path(pid, &chunks, &epoch::pin())?;
        let mut split = PlannedSplit {
            pid,
            records,
            chunks,
            right: Vec::new(),
            geometry: self.leaf,
        };
        for chunk in &split.chunks[1..] {
            let no = match self.store.allocate_run(self.leaf.pages()) {
                Ok(no) => no,
                Err(e) => {
                    self.abandon_split(&split);
                    let e = Error::from(e);
                    self.record_failure(&e);
                    return Err(Op::Fail(e));
                }
            };
            let mut page = self.new_leaf_page();
            leaf::build_leaf(page.payload_mut(), chunk, &split.records).expect("packed to fit");
            split.right.push((no, page));
        }
        Ok(split)
    }

    /// Gives a split's right-hand pages, which no separator points to, back to the page
    /// store.
    pub(super) fn abandon_split(&self, split: &PlannedSplit) {
        for &(no, _) in &split.right {
            let _ = self.store.free_run(no, self.leaf.pages());
        }
    }

    /// The inner nodes from the root to the parent of `pid`, found with the first
    /// chunk's low fence (any key of the page routes to it); a restart if the parent no
    /// longer routes that key to `pid`.
    fn split_path<'g>(
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

    /// Steps (2) and (3) of a split whose right-hand pages are written: gives each a
    /// page id and publishes their separators. On failure the right-hand pages and ids
    /// are released and nothing was published. With `hold` (an index into the right-hand
    /// pages), returns that new page's write lock, taken before the page could be
    /// reached.
    pub(super) fn link_split(
        &self,
        split: &PlannedSplit,
        hold: Option<usize>,
    ) -> Result<Option<mapping::WriteGuard<'_>>, Op> {
        let guard = epoch::pin();
        let mut children: Vec<(Vec<u8>, u64)> = Vec::with_capacity(split.right.len());
        let mut new_pids = Vec::with_capacity(split.right.len());
        let undo = |new_pids: &[PageId]| {
            for &new_pid in new_pids {
                self.mapping.release(self.mapping.write(new_pid));
            }
            self.abandon_split(split);
        };
        for ((no, page), chunk) in split.right.iter().zip(&split.chunks[1..]) {
            let Some(new_pid) = self.mapping.allocate(Location::Leaf(no.0)) else {
                undo(&new_pids);
                return Err(Op::Fail(Error::Unsupported(
                    "page id space exhausted".into(),
                )));
            };
            new_pids.push(new_pid);
            self.note_fill(new_pid, page);
            children.push((
                chunk.low.clone().expect("split chunks have a low fence"),
                new_pid.0,
            ));
        }
        let path = match self.split_path(split.pid, &split.chunks, &guard) {
            Ok(path) => path,
            Err(e) => {
                undo(&new_pids);
                return Err(e);
            }
        };
        // (2)
        let Some((plan, root_splits)) = self.lock_for_split(&path, &children) else {
            undo(&new_pids);
            return Err(Op::Restart);
        };
        // (3) Build every new inner buffer bottom-up through the locked nodes, then
        // publish them all: nothing that can fail (or panic) runs between the first
        // publication and the last, so readers never see half a split.
        let updates = self.inner_updates(&plan, children, root_splits);
        self.inner_nodes.lock().extend(updates.created);
        // Nothing can fail from here on, so no `undo` (which locks the new ids) follows.
        // Until the publication below no thread knows the new ids: the lock is free.
        let held = hold
            .and_then(|j| new_pids.get(j))
            .and_then(|&new_pid| self.mapping.try_write(new_pid));
        for (i, bytes) in updates.publish {
            plan[i].publish(bytes, &guard);
        }
        if let Some(root) = updates.new_root {
            self.root.store(root, Ordering::Release);
        }
        drop(plan);
        bump(&self.counters.leaf_splits);
        Ok(held)
    }

    /// Step (2): locks bottom-up the inner nodes of `path` that may change, and says
    /// whether the root may split. A node surely absorbs what comes up if the bytes it
    /// could reclaim cover the incoming separators at their worst (meta, full key, 8-byte
    /// child); otherwise its parent is locked too, since it may split and send one
    /// separator of at most `max_key_bytes` further up. `None` (a restart) if a node
    /// changed since the snapshot.
    fn lock_for_split<'n, 'g>(
        &self,
        path: &[InnerSnapshot<'n, 'g>],
        children: &[(Vec<u8>, u64)],
    ) -> Option<(Vec<InnerLock<'n, 'g>>, bool)> {
        let mut plan = Vec::with_capacity(path.len());
        let mut incoming_bytes: usize = children
            .iter()
            .map(|(k, _)| node::KV_META_SIZE_BYTES + k.len() + 8)
            .sum();
        for &node in path.iter().rev() {
            plan.push(node.lock().ok()?);
            if node.view().reclaimable_space_bytes() >= incoming_bytes {
                return Some((plan, false));
            }
            // It may split, into at most `parts` nodes: their separators go up.
            let parts = self.inner_parts_bound(self.inner_size_bytes + incoming_bytes);
            incoming_bytes =
                (parts - 1) * (node::KV_META_SIZE_BYTES + self.config.max_key_bytes + 8);
        }
        Some((plan, true))
    }

    /// The most nodes `split_inner` parts entries of `bytes` (metas, keys and children)
    /// into: the fewest parts of which each, at most its share and one more separator
    /// of the longest key, fits a node beside two fences of the longest key. Two unless
    /// keys are kilobytes long.
    fn inner_parts_bound(&self, bytes: usize) -> usize {
        let separator = node::KV_META_SIZE_BYTES + self.config.max_key_bytes + 8;
        let fences = 2 * (node::KV_META_SIZE_BYTES + self.config.max_key_bytes);
        let room = self
            .inner_size_bytes
            .saturating_sub(node::NODE_META_SIZE_BYTES + fences + separator)
            .max(1);
        bytes.div_ceil(room).max(2)
    }

    /// Step (3) without publication: the new bytes of the locked nodes `plan` (bottom
    /// up) once `pending` separators arrive at the first, splitting nodes that overflow
    /// and sending their new separators up.
    fn inner_updates(
        &self,
        plan: &[InnerLock<'_, '_>],
        mut pending: Vec<(Vec<u8>, u64)>,
        root_splits: bool,
    ) -> InnerUpdates {
        let mut updates = InnerUpdates {
            publish: Vec::with_capacity(plan.len()),
            created: Vec::new(),
            new_root: None,
        };
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
                updates.publish.push((depth, copy));
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
            let low = owned_fence(n.low_fence());
            let high = owned_fence(n.high_fence());
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
                updates.publish.push((depth, bytes));
                break;
            }
            let last = depth + 1 == plan.len();
            assert!(
                !last || root_splits,
                "the room check guarantees the topmost planned node absorbs"
            );
            bump(&self.counters.inner_splits);
            let (first, rest) = self.split_inner(entries, low.as_deref(), high.as_deref());
            let level = node.node().level;
            updates.publish.push((depth, first));
            let mut separators = Vec::with_capacity(rest.len());
            for (sep, bytes) in rest {
                let part = Box::into_raw(InnerNode::new(level, bytes));
                updates.created.push(part as usize);
                separators.push((sep, part as usize as u64));
            }
            if last {
                // The root split: a new root above the parts.
                let mut root_entries =
                    vec![(Vec::new(), node.node() as *const InnerNode as usize as u64)];
                root_entries.extend(separators);
                let bytes = inner::build(self.inner_size_bytes, None, None, &root_entries)
                    .expect("the parts' separators fit a node");
                let root = Box::into_raw(InnerNode::new(level + 1, bytes));
                updates.created.push(root as usize);
                updates.new_root = Some(root);
            } else {
                pending.extend(separators);
            }
        }
        updates
    }

    /// Splits an inner node's `entries` (between fences `low` and `high`) into the fewest
    /// parts of about equal bytes that each fit a node — two, unless separators of
    /// kilobytes arrived — and at most [`Core::inner_parts_bound`]: the first part's
    /// bytes, then each other part's separator (its lowest key) and bytes. Parting by
    /// record count could put every long separator in one part, which then does not fit.
    fn split_inner(
        &self,
        entries: Vec<(Vec<u8>, u64)>,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> InnerParts {
        // Each key costs what the node stores of it: no more than its bytes past the
        // prefix of the node's fences, which every part's fences share too. (Costing
        // whole keys balanced parts by count where keys share kilobytes of prefix, and
        // a part of the keys with the longest suffixes did not fit.)
        let prefix = leaf::fences_prefix_len(low, high);
        let cost = |(k, _): &(Vec<u8>, u64)| node::KV_META_SIZE_BYTES + k.len() - prefix + 8;
        let total: usize = entries.iter().map(cost).sum();
        for parts in 2..=entries.len() {
            // Part j starts at the first entry with at least j / parts of the bytes
            // before it.
            let mut starts = vec![0];
            let mut before = 0;
            for (i, e) in entries.iter().enumerate() {
                if starts.len() < parts
                    && i > starts[starts.len() - 1]
                    && before * parts >= starts.len() * total
                {
                    starts.push(i);
                }
                before += cost(e);
            }
            let mut built = Vec::with_capacity(starts.len());
            for (j, &start) in starts.iter().enumerate() {
                let end = starts.get(j + 1).copied().unwrap_or(entries.len());
                let lo = if j == 0 {
                    low
                } else {
                    Some(&entries[start].0[..])
                };
                let hi = if end < entries.len() {
                    Some(&entries[end].0[..])
                } else {
                    high
                };
                match inner::build(self.inner_size_bytes, lo, hi, &entries[start..end]) {
                    Some(bytes) => built.push((entries[start].0.clone(), bytes)),
                    None => break,
                }
            }
            if built.len() == starts.len() {
                let mut built = built.into_iter();
                let (_, first) = built.next().expect("a part");
                return (first, built.collect());
            }
        }
        unreachable!("a node holds its fences and one separator of the longest key")
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::tree::Tree;
    use crate::tree::node::NodeRef;

    /// A tree of 4 KiB keys in 16 KiB leaves (inner nodes of 32 KiB), 1 MiB of pool.
    fn long_key_tree() -> Tree {
        Tree::in_memory(Config {
            max_key_bytes: 4096,
            leaf_page_size_bytes: 16384,
            memory_budget_bytes: 1 << 20,
            background_eviction: false,
            ..Config::default()
        })
        .unwrap()
    }

    /// `split_inner` parts by bytes, into as many nodes as fit (issue #34): thirty
    /// short separators and then fourteen of 4 KiB sharing no prefix, between
    /// unbounded fences. Two parts would each hold seven long separators and a fence
    /// of 4 KiB, more than a node of 32 KiB; parting by count would put every long one
    /// in the second. Three parts, each a node that holds its share between its fences,
    /// the next part's separator its lowest key, within `inner_parts_bound`.
    #[test]
    fn split_inner_parts_separators_of_kilobytes_into_more_than_two_nodes() {
        let tree = long_key_tree();
        let core = &tree.core;
        assert_eq!(core.inner_size_bytes, 32768);
        let mut entries: Vec<(Vec<u8>, u64)> = vec![(Vec::new(), 1)];
        entries.extend((0..30).map(|i| (format!("a{i:02}").into_bytes(), 2 + i)));
        entries.extend((0..14u8).map(|i| (vec![b'b' + i; 4096], 100 + u64::from(i))));
        let bytes: usize = entries
            .iter()
            .map(|(k, _)| node::KV_META_SIZE_BYTES + k.len() + 8)
            .sum();
        let (first, rest) = core.split_inner(entries.clone(), None, None);
        assert_eq!(rest.len() + 1, 3, "three parts");
        assert!(rest.len() < core.inner_parts_bound(bytes));
        let mut parts = vec![(Vec::new(), first)];
        parts.extend(rest);
        let mut seen = Vec::new();
        for (j, (separator, part)) in parts.iter().enumerate() {
            let n = NodeRef::parse(part).expect("each part is a valid inner node");
            let records = inner::records(&n);
            assert_eq!(records[0].0, *separator, "part {j} starts at its separator");
            let low = owned_fence(n.low_fence());
            let high = owned_fence(n.high_fence());
            assert_eq!(
                low,
                (j > 0).then(|| separator.clone()),
                "part {j}'s low fence"
            );
            let next = parts.get(j + 1).map(|(s, _)| s.clone());
            assert_eq!(high, next, "part {j}'s high fence");
            for (k, child) in &records {
                assert_eq!(inner::child_ref(&n, inner::child_for(&n, k)), *child);
            }
            seen.extend(records);
        }
        assert_eq!(
            seen, entries,
            "the parts hold every separator once, in order"
        );
    }

    /// Separators that share kilobytes of prefix with their node's fences are costed by
    /// what the node stores of them, their bytes past that prefix: sixty short suffixes
    /// then thirty of 1.5 KiB, all behind a common 2,500-byte prefix. By suffix bytes
    /// two parts fit; costed by whole keys the parts balanced by count, the second got
    /// the long suffixes and did not fit, and the split made more parts than the
    /// evictor's room check had allowed for (a panic found by `tests/long_keys.rs`).
    #[test]
    fn split_inner_balances_separators_by_their_bytes_past_the_fence_prefix() {
        let tree = long_key_tree();
        let core = &tree.core;
        let prefix = vec![b'p'; 2500];
        let key = |tail: &[u8]| [&prefix[..], tail].concat();
        let (low, high) = (key(b"a"), key(b"z"));
        let mut entries: Vec<(Vec<u8>, u64)> = vec![(low.clone(), 1)];
        entries.extend((0..60).map(|i| (key(format!("b{i:02}").as_bytes()), 2 + i)));
        entries.extend((0..30u8).map(|i| {
            let mut tail = vec![b'c', b'a' + i];
            tail.resize(1500, b'x');
            (key(&tail), 100 + u64::from(i))
        }));
        let stored: usize = entries
            .iter()
            .map(|(k, _)| node::KV_META_SIZE_BYTES + k.len() - prefix.len() + 8)
            .sum();
        assert!(stored > core.inner_size_bytes && stored < 2 * core.inner_size_bytes);
        let (first, rest) = core.split_inner(entries.clone(), Some(&low), Some(&high));
        assert_eq!(rest.len(), 1, "two parts, as the suffix bytes need");
        let mut seen = inner::records(&NodeRef::parse(&first).unwrap());
        seen.extend(inner::records(&NodeRef::parse(&rest[0].1).unwrap()));
        assert_eq!(
            seen, entries,
            "the parts hold every separator once, in order"
        );
    }
}
