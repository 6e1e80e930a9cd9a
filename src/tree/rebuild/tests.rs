//! Tests of `from_leaves`: bad lists are errors, and the inner levels built over long
//! keys are what a descent expects.

use crossbeam_epoch::{self as epoch, Guard};

use crate::config::Config;
use crate::error::Error;
use crate::storage::{ActiveBackend, MemoryStore, PageNo};
use crate::tree::descend::child_prefix_len;
use crate::tree::inner::{self, InnerNode};
use crate::tree::mapping::{self, Location, MappingTable, PageId};
use crate::tree::node::{self, NodeKind, NodeRef};
use crate::tree::plan::owned_fence;
use crate::tree::{Core, Tree};

use super::FILL_PERCENT;

/// Walks the inner levels from the root and checks what a descent relies on: levels
/// step down by one; every node parses, has its routing range in its parent as fences,
/// and holds its low fence in record 0 (the empty key when unbounded); every page's
/// `child_prefix_len` is the common prefix of its routing range (0 when unbounded
/// above), as its leaf page's fences give it. Returns the pages with their low keys, in
/// key order.
fn check_index(core: &Core) -> Vec<(Vec<u8>, PageId)> {
    fn walk(
        core: &Core,
        node: &InnerNode,
        (low, high): (Option<&[u8]>, Option<&[u8]>),
        guard: &Guard,
        out: &mut Vec<(Vec<u8>, PageId)>,
    ) {
        let snapshot = node.snapshot(guard).unwrap();
        let n = NodeRef::parse(snapshot.view().as_bytes()).expect("inner nodes parse");
        assert_eq!(n.kind(), NodeKind::Inner);
        assert_eq!(owned_fence(n.low_fence()).as_deref(), low, "low fence");
        assert_eq!(owned_fence(n.high_fence()).as_deref(), high, "high fence");
        let records = inner::records(&n);
        assert_eq!(
            records[0].0,
            low.unwrap_or_default(),
            "record 0 is the low fence"
        );
        for (i, (key, child)) in records.iter().enumerate() {
            let child_low = if i == 0 { low } else { Some(key.as_slice()) };
            let child_high = records.get(i + 1).map(|(k, _)| k.as_slice()).or(high);
            if node.level == 1 {
                let prefix_len = child_high.map_or(0, |h| node::common_prefix_len(key, h));
                assert_eq!(child_prefix_len(&n, i), prefix_len, "page {i}'s prefix");
                out.push((key.clone(), PageId(*child)));
            } else {
                let below = core.inner_at(*child);
                assert_eq!(below.level + 1, node.level, "levels step down by one");
                walk(core, below, (child_low, child_high), guard, out);
            }
        }
    }
    let guard = epoch::pin();
    let mut out = Vec::new();
    walk(core, core.root(), (None, None), &guard, &mut out);
    out
}

#[test]
fn bad_leaf_lists_are_errors() {
    let config = Config {
        memory_budget_bytes: 1 << 20,
        background_eviction: false,
        ..Config::default()
    };
    let max = config.max_key_bytes;
    let build = |leaves: &[(&str, u64)]| {
        let leaves = leaves
            .iter()
            .map(|&(k, no)| (k.as_bytes().to_vec(), PageNo(no)))
            .collect();
        let store = Box::new(MemoryStore::new());
        Tree::from_leaves(config.clone(), store, ActiveBackend::memory(), leaves)
    };
    let corrupt_at = |leaves: &[(&str, u64)], at: u64| match build(leaves) {
        Err(Error::Corrupted { page, reason }) => assert_eq!(page, at, "{reason}"),
        other => panic!("expected Corrupted at {at}, got {other:?}"),
    };
    corrupt_at(&[], 0);
    corrupt_at(&[("a", 4)], 4);
    corrupt_at(&[("", 0), ("", 1)], 1);
    corrupt_at(&[("", 0), ("b", 1), ("a", 2)], 2);
    corrupt_at(&[("", 0), ("b", 1), ("b", 2)], 2);
    corrupt_at(&[("", 0), ("b", 1), ("c", 0)], 0);
    let too_far = mapping::MAX_LEAF_PAGE_NO + 1;
    corrupt_at(&[("", 0), ("b", too_far)], too_far);
    corrupt_at(&[("", u64::MAX)], u64::MAX);
    let long = "k".repeat(max + 1);
    assert!(matches!(
        build(&[("", 0), (&long, 1)]),
        Err(Error::InvalidConfig(_))
    ));
    // The edges that are fine: the longest key, the largest page number.
    let longest = "k".repeat(max);
    let tree = build(&[("", 0), (&longest, mapping::MAX_LEAF_PAGE_NO)]).unwrap();
    assert_eq!(check_index(&tree.core).len(), 2);
}

/// Many leaf pages with low keys of exactly `max_key_bytes` that differ in their first
/// bytes (so inner nodes get no prefix to share): the levels built have 16 KiB nodes
/// filled to about 3/4, route every page's range to it, and give each page its prefix.
/// Reads no page (the store is empty).
#[test]
fn inner_levels_over_the_longest_keys_route_every_page() {
    let config = Config {
        memory_budget_bytes: 1 << 20,
        background_eviction: false,
        max_key_bytes: 1024,
        max_value_bytes: 16,
        ..Config::default()
    };
    let pages = 3000u32;
    let low = |i: u32| -> Vec<u8> {
        if i == 0 {
            return Vec::new();
        }
        let mut key = i.to_be_bytes().to_vec();
        key.resize(1024, b'k');
        key
    };
    let leaves: Vec<(Vec<u8>, PageNo)> = (0..pages)
        .map(|i| (low(i), PageNo(3 * u64::from(i) + 1)))
        .collect();
    let tree = Tree::from_leaves(
        config,
        Box::new(MemoryStore::new()),
        ActiveBackend::memory(),
        leaves.clone(),
    )
    .unwrap();
    let core = &tree.core;
    assert_eq!(core.inner_size_bytes, 16 << 10);
    assert!(tree.stats().height >= 3, "height {}", tree.stats().height);

    let index = check_index(core);
    assert_eq!(index.len(), leaves.len());
    for ((low, pid), (want_low, no)) in index.iter().zip(&leaves) {
        assert_eq!(low, want_low);
        assert_eq!(core.mapping.peek(*pid), Location::Leaf(no.0));
    }
    let guard = epoch::pin();
    let nodes = core.inner_nodes.lock().clone();
    for &node in &nodes {
        // SAFETY: the tree's inner nodes live as long as the tree.
        let node = unsafe { &*(node as *const InnerNode) };
        let n = node.snapshot(&guard).unwrap().view();
        let used = n.node_size_bytes() - n.reclaimable_space_bytes();
        assert!(
            n.len() <= 2 || used <= n.node_size_bytes() * FILL_PERCENT / 100,
            "a node of {} records uses {used} bytes",
            n.len()
        );
        assert!(n.len() >= 2, "every node but a lone root has two records");
    }
    drop(guard);
    // Every range routes to its page, by its low key and by the last key below its
    // high bound.
    for (i, &(_, pid)) in index.iter().enumerate() {
        let mut probes = vec![low(i as u32)];
        if let Some(next) = leaves.get(i + 1) {
            let mut below = next.0.clone();
            *below.last_mut().unwrap() -= 1;
            probes.push(below);
        }
        for probe in probes {
            let (path, page) = core.lock_leaf_of(&probe, MappingTable::read);
            assert_eq!(path.pid, pid, "page {i}");
            drop(page);
        }
    }
}
