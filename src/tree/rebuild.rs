//! The leaf level as a list, for checkpoints: `Core::capture_leaves` walks the leaf
//! pages in key order and reports each with its low routing key; `check_leaves` and
//! `index_leaves` turn such a list back into a mapping table and the inner levels above
//! it, built bottom-up without reading a leaf page. A new tree's one empty leaf page is
//! indexed the same way (`Tree::with_store`).
//!
//! Invariant relied on (the tests check it under concurrent splits and
//! redistributions): while a page id's lock is held and the tree is not poisoned, the
//! fences of its leaf page are its routing range in its parent. Both change only under
//! the page's write lock — a split rewrites the left page before releasing it, a
//! redistribution writes each of its two pages before releasing it — and a failed
//! write, which can leave them apart, poisons the tree.
//!
//! Uses: `descend`, `leaf_io`, `inner`, `mapping`, `leaf` (record costs), `node`,
//! `stats`.

use std::collections::HashSet;
use std::ops::Range;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::storage::PageNo;

use super::Core;
use super::inner::{self, InnerNode};
use super::leaf;
use super::mapping::{self, Location, MappingTable};
use super::node::{Fences, NodeRef};
use super::stats::bump;

/// Bytes of an inner node's child reference.
const CHILD_BYTES: usize = 8;

/// `index_leaves` fills an inner node to about this share of its bytes, so that the
/// separators of the first splits after a rebuild fit without splitting every node.
const FILL_PERCENT: usize = 75;

/// The mapping table and the inner levels over a list of leaf pages (`index_leaves`):
/// what a `Core` starts with.
pub(super) struct LeafIndex {
    pub(super) mapping: MappingTable,
    /// The root, one of `inner_nodes`.
    pub(super) root: *mut InnerNode,
    /// Every inner node built, as the addresses `Box::into_raw` gave (`Core::inner_nodes`
    /// frees them when the tree drops).
    pub(super) inner_nodes: Vec<usize>,
}

/// Checks a list of leaf pages for `index_leaves`: at least one page; the first low key
/// empty; low keys strictly increasing and at most `config.max_key_bytes` long; page
/// numbers distinct and within what the mapping table can hold. The list comes from a
/// checkpoint on disk, so a bad one is an error, never a panic: [`Error::Corrupted`]
/// naming the leaf page of the entry at fault (page 0 for an empty list, which names
/// none), or [`Error::InvalidConfig`] for a key longer than `max_key_bytes` (the tree
/// was written under a larger limit).
pub(super) fn check_leaves(config: &Config, leaves: &[(Vec<u8>, PageNo)]) -> Result<()> {
    let corrupt = |no: PageNo, reason: String| Error::Corrupted { page: no.0, reason };
    let Some((first_low, first_no)) = leaves.first() else {
        return Err(Error::Corrupted {
            page: 0,
            reason: "the list of leaf pages is empty; a tree has at least one".into(),
        });
    };
    if !first_low.is_empty() {
        return Err(corrupt(
            *first_no,
            format!(
                "the first leaf page's low key has {} bytes; it must be empty",
                first_low.len()
            ),
        ));
    }
    if leaves.len() > mapping::MAX_PAGE_IDS {
        return Err(Error::Unsupported(format!(
            "{} leaf pages, more than the {} page ids of the mapping table",
            leaves.len(),
            mapping::MAX_PAGE_IDS
        )));
    }
    let mut seen = HashSet::with_capacity(leaves.len());
    let mut previous: Option<&[u8]> = None;
    for (low, no) in leaves {
        if low.len() > config.max_key_bytes {
            return Err(Error::InvalidConfig(format!(
                "leaf page {no} has a low key of {} bytes, more than max_key_bytes ({}): \
                 the tree was written with a larger max_key_bytes",
                low.len(),
                config.max_key_bytes
            )));
        }
        if no.0 > mapping::MAX_LEAF_PAGE_NO {
            return Err(corrupt(
                *no,
                format!(
                    "leaf page number above the largest the mapping table holds ({})",
                    mapping::MAX_LEAF_PAGE_NO
                ),
            ));
        }
        if !seen.insert(*no) {
            return Err(corrupt(*no, "the leaf page is listed twice".into()));
        }
        if previous.is_some_and(|p| p >= low.as_slice()) {
            return Err(corrupt(
                *no,
                "the leaf page's low key is not above the previous page's".into(),
            ));
        }
        previous = Some(low);
    }
    Ok(())
}

/// The mapping table and inner levels over `leaves`, a list `check_leaves` accepted:
/// page id `i` maps to the `i`-th leaf page, and each level is packed from the left
/// into nodes filled to about `FILL_PERCENT` of `inner_size_bytes`, with the fences a
/// split gives: a node's record 0 holds its low fence (the empty key for a level's first
/// node, whose low fence is unbounded) and its high fence is the next node's low fence
/// (unbounded for a level's last). So `child_prefix_len` gives every page the prefix of
/// its routing range, as after splits. Reads no leaf page; fill hints start at 0 (a
/// redistribution that picks a neighbour by a hint of 0 reads its real bytes first).
pub(super) fn index_leaves(inner_size_bytes: usize, leaves: Vec<(Vec<u8>, PageNo)>) -> LeafIndex {
    let mapping = MappingTable::new();
    let mut entries: Vec<(Vec<u8>, u64)> = leaves
        .into_iter()
        .map(|(low, no)| {
            let pid = mapping
                .allocate(Location::Leaf(no.0))
                .expect("check_leaves: the table has an id per leaf page");
            (low, pid.0)
        })
        .collect();
    let mut inner_nodes = Vec::new();
    let mut level = 1;
    loop {
        let mut above = Vec::new();
        for range in pack_level(&entries, inner_size_bytes) {
            let (low, high) = fences(&entries, &range);
            let bytes = inner::build(inner_size_bytes, low, high, &entries[range.clone()])
                .expect("pack_level: the records fit");
            debug_assert_eq!(
                inner_size_bytes - NodeRef::trusted(&bytes).reclaimable_space_bytes(),
                node_bytes(&entries, range.clone()),
                "pack_level's cost is exact"
            );
            let node = Box::into_raw(InnerNode::new(level, bytes));
            inner_nodes.push(node as usize);
            above.push((entries[range.start].0.clone(), node as usize as u64));
        }
        if let [(_, root)] = above[..] {
            return LeafIndex {
                mapping,
                root: root as usize as *mut InnerNode,
                inner_nodes,
            };
        }
        entries = above;
        level += 1;
    }
}

/// The fences of the node holding `entries[range]`: its first key (unbounded for the
/// level's first node) and the next node's first key (unbounded for the level's last).
fn fences<'e>(
    entries: &'e [(Vec<u8>, u64)],
    range: &Range<usize>,
) -> (Option<&'e [u8]>, Option<&'e [u8]>) {
    let low = (range.start > 0).then(|| entries[range.start].0.as_slice());
    let high = entries.get(range.end).map(|(k, _)| k.as_slice());
    (low, high)
}

/// Bytes of the inner node holding `entries[range]`, built as `index_leaves` builds it:
/// its header, its fence records (full keys), and per record a meta, the key after the
/// prefix its fences share and the child reference.
fn node_bytes(entries: &[(Vec<u8>, u64)], range: Range<usize>) -> usize {
    let (low, high) = fences(entries, &range);
    let prefix_len = leaf::fences_prefix_len(low, high);
    let records: usize = entries[range]
        .iter()
        .map(|(k, _)| leaf::record_cost(k.len() - prefix_len, CHILD_BYTES))
        .sum();
    leaf::empty_node_bytes(&Fences::Range { low, high }) + records
}

/// Splits a level's entries into the ranges of its nodes, from the left: a node takes
/// entries while its bytes stay within `FILL_PERCENT` of `size_bytes`, and at least two
/// if two fit at all (every node of one or two records fits: the inner node size holds
/// two fences and eight separators of the longest key). A level's last node left with
/// one entry takes one from the node before it if that keeps two or more (which only
/// shrinks that node: its high fence moves down, so its prefix can only grow). Every
/// level but the top one has fewer nodes than entries, so the levels end in one root.
fn pack_level(entries: &[(Vec<u8>, u64)], size_bytes: usize) -> Vec<Range<usize>> {
    let target_bytes = size_bytes * FILL_PERCENT / 100;
    let mut nodes: Vec<Range<usize>> = Vec::new();
    let mut start = 0;
    while start < entries.len() {
        let mut end = start + 1;
        while end < entries.len() {
            let bytes = node_bytes(entries, start..end + 1);
            let wanted = bytes <= target_bytes || (end - start < 2 && bytes <= size_bytes);
            if !wanted {
                break;
            }
            end += 1;
        }
        nodes.push(start..end);
        start = end;
    }
    if let [.., before, last] = &mut nodes[..]
        && last.len() == 1
        && before.len() >= 3
    {
        before.end -= 1;
        last.start -= 1;
    }
    nodes
}

impl Core {
    /// Visits every leaf page in key order (`Tree::capture_leaves`, which states the
    /// contract and why the visits tile the key space). Each step locks the page
    /// covering `low` (the high bound of the page visited last, read under that page's
    /// lock) with its parent validated, reads the page's routing range from that parent,
    /// and checks the range starts at `low`; if not, a redistribution moved the boundary
    /// between the two pages after the last visit, and the walk starts over.
    pub(super) fn capture_leaves(
        &self,
        mut f: impl FnMut(&[u8], PageNo) -> Result<()>,
    ) -> Result<()> {
        // A poisoned tree may have a leaf page wider than its routing range.
        self.check_writable()?;
        'walk: loop {
            let mut low: Vec<u8> = Vec::new();
            loop {
                let (path, page) = self.lock_leaf_of(&low, MappingTable::read);
                let Ok((page_low, high)) = path.routing_range() else {
                    bump(&self.counters.restarts);
                    continue;
                };
                if page_low != low {
                    bump(&self.counters.restarts);
                    continue 'walk;
                }
                f(&low, self.leaf_of(&page))?;
                drop(page);
                #[cfg(all(test, not(feature = "shuttle")))]
                super::hooks::fire_capture_step();
                match high {
                    Some(high) => low = high,
                    None => break 'walk,
                }
            }
        }
        // A write that failed during the walk may have left a visited page wider than
        // its range.
        self.check_writable()
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests;
