//! Merge plans, computed without IO or side effects on the tree: what a mini-page's
//! dirty records (and a write being merged) make of its leaf page — one page rewritten in
//! place, or a split into chunks, packed balanced or around a sorted load's open end
//! (`Arrivals`). The merge, split and redistribution layers above carry plans out.
//!
//! Uses: `leaf_io` (to parse a leaf page read), `leaf`, `mini`, `node`.

use crate::error::Result;
use crate::storage::PAGE_PAYLOAD_SIZE;

use super::leaf::{self, MiniHeader, RecordList};
use super::leaf_page::LeafPage;
use super::mini::apply;
use super::node::{self, NodeMut, NodeRef, RecordType};
use super::values::Replaced;
use super::{Core, Op};

/// What a merge brings to a leaf page, as far as the shape of its split goes.
#[derive(Default)]
pub(super) struct Arrivals {
    /// Records merged in: the mini-page's dirty ones and the write being merged.
    pub(super) new: usize,
    /// How many of them lie above all of the leaf's records, and how many below.
    pub(super) above: usize,
    pub(super) below: usize,
    /// No record of the leaf lies between the lowest and the highest new record.
    pub(super) contiguous: bool,
    /// The lowest and the highest new key.
    pub(super) bottom: Vec<u8>,
    pub(super) top: Vec<u8>,
    /// The write being merged is the highest new record, or the lowest.
    pub(super) latest_top: bool,
    pub(super) latest_bottom: bool,
}

/// Fewest new records, with no old record between them, that make a run: a stream of
/// inserts in key order into the middle of a page.
pub(super) const RUN_MIN_RECORDS: usize = 8;

impl Arrivals {
    /// The records merged into a leaf page: its mini-page's `dirty` ones (which include
    /// `latest`, the write being merged, if any). `None` for an empty leaf.
    pub(super) fn into_leaf(
        leaf: &NodeRef<'_>,
        dirty: &RecordList,
        latest: Option<&[u8]>,
    ) -> Option<Self> {
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
    pub(super) fn into_mirror(mirror: &NodeRef<'_>, latest: Option<&[u8]>) -> Option<Self> {
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
    pub(super) fn shape(self) -> (leaf::Fill, Option<Vec<u8>>) {
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

/// What a merge writes: one leaf page, or the records of a leaf that must split and how
/// they pack into pages.
pub(super) enum MergePlan {
    Write(LeafPage),
    Split {
        records: RecordList,
        chunks: Vec<leaf::LeafChunk>,
        /// The chunk the next records in the split's key order land in (sorted-order
        /// splits only).
        open: Option<usize>,
    },
}

/// The leaf's records with the dirty records applied, as one sorted list.
///
/// Notes in `replaced` the leaf versions the dirty records shadow.
pub(super) fn merge_records(
    leaf: &NodeRef<'_>,
    dirty: &RecordList,
    replaced: &mut Replaced,
) -> RecordList {
    let mut out = RecordList::with_capacity(leaf.len() + dirty.len(), leaf.node_size_bytes());
    let mut d = 0;
    for r in leaf.iter() {
        // Dirty records below this leaf record: new keys (tombstones of absent keys drop).
        while d < dirty.len() && r.cmp_key(dirty.key(d)).is_gt() {
            if dirty.record_type(d).exists() {
                out.push(dirty.key(d), dirty.value(d), dirty.record_type(d).dirty());
            }
            d += 1;
        }
        if d < dirty.len() && r.cmp_key(dirty.key(d)).is_eq() {
            let newer = (dirty.record_type(d), dirty.value(d));
            replaced.note(dirty.key(d), (r.record_type(), r.value()), newer);
            if dirty.record_type(d).exists() {
                out.push(dirty.key(d), dirty.value(d), dirty.record_type(d).dirty());
            }
            d += 1;
        } else {
            out.push_view(&r, r.record_type().dirty());
        }
    }
    for (k, v, t) in dirty.iter_range(d..dirty.len()) {
        if t.exists() {
            out.push(k, v, t.dirty());
        }
    }
    out
}

/// A fence as an owned key, `None` when unbounded or absent.
pub(super) fn owned_fence(f: Option<node::Fence<'_>>) -> Option<Vec<u8>> {
    f.and_then(|f| f.key().map(<[u8]>::to_vec))
}

impl Core {
    /// Computes what `merge` writes: the new leaf page, or the records and chunks of a
    /// split. `leaf` is the leaf page as read under the page's write lock (`None` for a
    /// mirror, whose live records are the leaf's). The callers count the merge; a
    /// redistribution's plan for its neighbour is not one. (About 110 lines: the merge of
    /// the two record sources and the choice of packing read best in one place.)
    pub(super) fn plan_merge(
        &self,
        header: MiniHeader,
        mini: Option<NodeRef<'_>>,
        extra: Option<(&[u8], &[u8], RecordType)>,
        leaf: Option<LeafPage>,
    ) -> Result<MergePlan, Op> {
        // The leaf versions the dirty records shadow go to the value store whatever the
        // plan: they are unreachable since the writes that shadowed them.
        let mut replaced = Replaced::default();
        let plan = self.plan_merge_noting(header, mini, extra, leaf, &mut replaced);
        self.release_replaced(replaced);
        plan
    }

    /// [`Core::plan_merge`], noting in `replaced` the leaf versions the dirty records
    /// shadow.
    fn plan_merge_noting(
        &self,
        header: MiniHeader,
        mini: Option<NodeRef<'_>>,
        extra: Option<(&[u8], &[u8], RecordType)>,
        leaf: Option<LeafPage>,
        replaced: &mut Replaced,
    ) -> Result<MergePlan, Op> {
        let mut page = leaf.unwrap_or_else(|| self.new_leaf_page());
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
                merged.push_view(&r, r.record_type().dirty());
            }
            if let Some((k, v, t)) = extra {
                if t.exists() {
                    merged.upsert(k, v, t.dirty());
                } else if let Ok(i) = merged.search(k) {
                    merged.remove(i);
                }
            }
        } else {
            let leaf = self.parse_leaf(header.leaf, &page)?;
            // The plan builds on the leaf's fences, and a split publishes them as
            // separators: they must be the page's routing range.
            self.check_route(header.pid, header.leaf, &leaf)?;
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
            // Routed keys lie in the routing range, which the check above found to be
            // the leaf's fences; the dirty records are sorted, so the ends tell. (Not a
            // bug to assert: `check_route` checks nothing once a write failed, and a
            // poisoned tree merges nothing, but this keeps bytes from disk away from
            // the packing's assumptions whatever happens.)
            if let Some(last) = dirty.len().checked_sub(1) {
                for k in [dirty.key(0), dirty.key(last)] {
                    if !leaf.covers(k) {
                        return Err(Op::Fail(self.damaged_leaf(
                            header.leaf,
                            format!(
                                "its key range does not hold the key {:?} routed to it",
                                k.escape_ascii().to_string()
                            ),
                        )));
                    }
                }
            }
            // Fast path: apply in place on a copy when everything fits, then write a
            // compact copy: records placed in place sit out of offset order, and every
            // later read of such a page must prove their bytes disjoint with a bitmap
            // (a leaf page is read far more often than merged).
            let mut one = [0u8; PAGE_PAYLOAD_SIZE];
            let mut wide = Vec::new();
            let work: &mut [u8] = if page.payload().len() == one.len() {
                &mut one
            } else {
                wide.resize(page.payload().len(), 0);
                &mut wide
            };
            work.copy_from_slice(page.payload());
            let mut node = NodeMut::trusted(work);
            let mut fits = true;
            let external = self.may_hold_external();
            for (k, v, t) in dirty.iter() {
                if external && let Ok(i) = node.as_ref().search(k) {
                    let r = node.as_ref().record(i);
                    replaced.note(k, (r.record_type(), r.value()), (t, v));
                }
                match apply(&mut node, k, v, t) {
                    Ok(true) => {}
                    Ok(false) => {
                        fits = false;
                        break;
                    }
                    Err(e) => {
                        let reason = format!("a record routed to it does not fit it: {e:?}");
                        return Err(Op::Fail(self.damaged_leaf(header.leaf, reason)));
                    }
                }
            }
            if fits {
                let applied = NodeRef::trusted(work);
                node::copy_into(&applied, page.payload_mut(), applied.fences(), |_| true)
                    .expect("a node's records fit a node of its size");
                return Ok(MergePlan::Write(page));
            }
            let leaf = NodeRef::trusted(page.payload());
            shape =
                Arrivals::into_leaf(&leaf, &dirty, extra.map(|(k, _, _)| k)).map(Arrivals::shape);
            // The fast path may have noted the same versions: noting twice is harmless.
            merged = merge_records(&leaf, &dirty, replaced);
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
            self.leaf.node_bytes(),
        );
        let mut open = None;
        if let (Some(k), true) = (open_key, chunks.len() > 1) {
            let (Ok(i) | Err(i)) = merged.search(&k);
            let at = i.min(merged.len() - 1);
            let (sorted, at) = leaf::pack_open(
                &merged,
                low.as_deref(),
                high.as_deref(),
                fill,
                at,
                self.leaf.node_bytes(),
            );
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
}
