//! Tests of `capture_leaves` and `from_leaves`: captures tile the key space (also while
//! another thread splits pages), a tree rebuilt from a capture reads back what the
//! captured tree held and keeps working, bad lists are errors, and the inner levels
//! built over long keys are what a descent expects.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_epoch::{self as epoch, Guard};

use crate::config::Config;
use crate::error::Error;
use crate::storage::{ActiveBackend, MemoryStore, Page, PageNo, PageStore};
use crate::tree::descend::child_prefix_len;
use crate::tree::inner::{self, InnerNode};
use crate::tree::mapping::{self, Location, MappingTable, PageId};
use crate::tree::node::{self, NodeKind, NodeRef};
use crate::tree::plan::owned_fence;
use crate::tree::{Core, Tree, hooks};

use super::FILL_PERCENT;

/// splitmix64, seeded from `BFDB_SEED` or the clock; the seed is printed so a failure
/// replays.
struct Rng(u64);

impl Rng {
    fn seeded(test: &str) -> Rng {
        let seed = std::env::var("BFDB_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{test}: seed {seed} (replay with BFDB_SEED={seed})");
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A key of 4 to 19 random bytes.
    fn key(&mut self) -> Vec<u8> {
        let len = 4 + self.below(16) as usize;
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// The value stored under `key` in the tests whose writers race a capture: any record
/// found can be checked without knowing when it was written.
fn value_of(key: &[u8]) -> Vec<u8> {
    key.iter().rev().chain(b"-value").copied().collect()
}

/// A small pool, so that pages merge, split and get evicted all the time.
fn small_config() -> Config {
    Config {
        memory_budget_bytes: 128 << 10,
        background_eviction: false,
        ..Config::default()
    }
}

/// A leaf page as `capture_leaves` reported it, with its bytes as copied during the
/// visit (what a checkpoint's copy-on-write keeps).
struct Captured {
    low: Vec<u8>,
    no: PageNo,
    page: Box<Page>,
}

/// Captures `tree`, whose pages live in `store`: the leaf pages and how many times the
/// walk started.
fn capture(tree: &Tree, store: &MemoryStore) -> (Vec<Captured>, usize) {
    let (mut leaves, mut starts) = (Vec::new(), 0);
    tree.capture_leaves(|low, no| {
        if low.is_empty() {
            leaves.clear();
            starts += 1;
        }
        let mut page = Page::boxed();
        store.read_page(no, &mut page)?;
        leaves.push(Captured {
            low: low.to_vec(),
            no,
            page,
        });
        Ok(())
    })
    .unwrap();
    (leaves, starts)
}

/// Checks the contract of a capture: low keys strictly increase from the empty key, and
/// each page's bytes as copied are a leaf page whose fences are exactly its range,
/// `[low, next low)`.
fn check_tiling(leaves: &[Captured]) {
    assert!(leaves[0].low.is_empty(), "the first low key is empty");
    let mut seen = HashSet::new();
    for (i, c) in leaves.iter().enumerate() {
        assert!(seen.insert(c.no), "page {} captured twice", c.no);
        let next = leaves.get(i + 1).map(|n| n.low.as_slice());
        if let Some(next) = next {
            assert!(c.low.as_slice() < next, "low keys increase at {i}");
        }
        let n = NodeRef::parse(c.page.payload()).expect("a captured page parses");
        assert_eq!(n.kind(), NodeKind::Leaf);
        let low = owned_fence(n.low_fence());
        assert_eq!(
            low.is_none(),
            i == 0,
            "only the first page is unbounded below"
        );
        assert_eq!(low.unwrap_or_default(), c.low, "page {}'s low fence", c.no);
        assert_eq!(
            owned_fence(n.high_fence()).as_deref(),
            next,
            "page {}'s high fence",
            c.no
        );
    }
}

/// A tree built with `from_leaves` over a fresh store holding the captured pages at
/// their page numbers.
fn rebuild(config: Config, leaves: &[Captured]) -> Tree {
    let store = MemoryStore::new();
    let top = leaves.iter().map(|c| c.no.0).max().unwrap();
    for no in 0..=top {
        assert_eq!(store.allocate().unwrap(), PageNo(no));
    }
    let used: HashSet<PageNo> = leaves.iter().map(|c| c.no).collect();
    for c in leaves {
        let mut page = Page::boxed();
        page.as_bytes_mut().copy_from_slice(c.page.as_bytes());
        store.write_page(c.no, &mut page).unwrap();
    }
    for no in (0..=top).map(PageNo).filter(|no| !used.contains(no)) {
        store.free(no).unwrap();
    }
    let list = leaves.iter().map(|c| (c.low.clone(), c.no)).collect();
    Tree::from_leaves(config, Box::new(store), ActiveBackend::memory(), list, None).unwrap()
}

/// Checks that `tree` holds exactly `model`, by point reads and by a full scan.
fn check_model(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (k, v) in model {
        assert_eq!(tree.get(k).unwrap().as_ref(), Some(v), "key {k:?}");
    }
    let scanned: Vec<(Vec<u8>, Vec<u8>)> = tree
        .range::<&[u8], _>(..)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(scanned.len(), model.len(), "records scanned");
    assert!(
        scanned.iter().map(|(k, v)| (k, v)).eq(model.iter()),
        "the scan equals the model"
    );
}

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
fn captured_leaves_rebuild_an_equal_tree() {
    let mut rng = Rng::seeded("captured_leaves_rebuild_an_equal_tree");
    let config = small_config();
    let store = Arc::new(MemoryStore::new());
    let tree = Tree::with_page_store(config.clone(), Arc::clone(&store)).unwrap();
    let mut model = BTreeMap::new();
    for _ in 0..4000 {
        let (key, value) = (rng.key(), rng.key().repeat(3));
        tree.insert(&key, &value).unwrap();
        model.insert(key, value);
    }
    let keys: Vec<Vec<u8>> = model.keys().cloned().collect();
    for _ in 0..300 {
        let key = &keys[rng.below(keys.len() as u64) as usize];
        tree.delete(key).unwrap();
        model.remove(key);
    }
    tree.flush().unwrap();
    let (leaves, starts) = capture(&tree, &store);
    assert_eq!(starts, 1, "nothing moved: one walk");
    check_tiling(&leaves);
    assert!(leaves.len() > 20, "{} leaf pages", leaves.len());
    let rebuilt = rebuild(config, &leaves);
    let index = check_index(&rebuilt.core);
    assert!(
        index
            .iter()
            .map(|(low, _)| low)
            .eq(leaves.iter().map(|c| &c.low)),
        "the pages route as captured"
    );
    for (pid, c) in index.iter().map(|&(_, pid)| pid).zip(&leaves) {
        assert_eq!(rebuilt.core.mapping.peek(pid), Location::Leaf(c.no.0));
    }
    check_model(&rebuilt, &model);
    for _ in 0..200 {
        let key = rng.key();
        assert_eq!(rebuilt.get(&key).unwrap().as_ref(), model.get(&key));
    }

    // The rebuilt tree takes writes: its pages split, its inner nodes take separators.
    let splits = rebuilt.stats().leaf_splits;
    for i in 0..4000 {
        let (key, value) = (rng.key(), rng.key());
        rebuilt.insert(&key, &value).unwrap();
        model.insert(key, value);
        if i % 10 == 0 {
            let key = &keys[rng.below(keys.len() as u64) as usize];
            rebuilt.delete(key).unwrap();
            model.remove(key);
        }
    }
    rebuilt.flush().unwrap();
    assert!(
        rebuilt.stats().leaf_splits > splits,
        "the rebuilt tree split pages"
    );
    check_model(&rebuilt, &model);
    check_index(&rebuilt.core);
}

/// Captures race a writer whose random inserts split and redistribute pages: every
/// capture tiles the key space with pages whose bytes, as copied during their visit,
/// have exactly the captured ranges as fences. A tree rebuilt from the last capture
/// holds every record flushed before it and nothing that was never written.
#[test]
fn captures_tile_the_key_space_while_pages_split() {
    let mut rng = Rng::seeded("captures_tile_the_key_space_while_pages_split");
    let config = Config {
        memory_budget_bytes: 256 << 10,
        ..Config::default()
    };
    let store = Arc::new(MemoryStore::new());
    let tree = Tree::with_page_store(config.clone(), Arc::clone(&store)).unwrap();
    let mut flushed = Vec::new();
    for _ in 0..3000 {
        let key = rng.key();
        tree.insert(&key, &value_of(&key)).unwrap();
        flushed.push(key);
    }
    tree.flush().unwrap();
    let before = tree.stats();
    let done = AtomicBool::new(false);
    let mut writer_rng = Rng(rng.next_u64());
    let (written, last, captures, starts) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut written = Vec::new();
            for _ in 0..30_000 {
                let key = writer_rng.key();
                tree.insert(&key, &value_of(&key)).unwrap();
                written.push(key);
            }
            done.store(true, Ordering::Release);
            written
        });
        let (mut captures, mut starts, mut last) = (0, 0, Vec::new());
        while captures == 0 || !done.load(Ordering::Acquire) {
            let (leaves, walks) = capture(&tree, &store);
            check_tiling(&leaves);
            captures += 1;
            starts += walks;
            last = leaves;
        }
        (writer.join().unwrap(), last, captures, starts)
    });
    let after = tree.stats();
    eprintln!(
        "{captures} captures, {} started over; meanwhile {} leaf splits, {} redistributions",
        starts - captures,
        after.leaf_splits - before.leaf_splits,
        after.leaf_redistributions - before.leaf_redistributions,
    );
    assert!(after.leaf_splits > before.leaf_splits, "pages split");

    let rebuilt = rebuild(config, &last);
    check_index(&rebuilt.core);
    for key in &flushed {
        assert_eq!(
            rebuilt.get(key).unwrap(),
            Some(value_of(key)),
            "key {key:?}"
        );
    }
    let ever: HashSet<&Vec<u8>> = flushed.iter().chain(&written).collect();
    let mut count = 0;
    for record in rebuilt.range::<&[u8], _>(..) {
        let (key, value) = record.unwrap();
        assert!(ever.contains(&key), "{key:?} was never written");
        assert_eq!(value, value_of(&key));
        count += 1;
    }
    assert!(count >= flushed.len());
}

/// The walk's check of each page's low key against the last page's high bound: here a
/// hook moves the boundary between the first and the second page (down, then up) right
/// after the first visit, as a redistribution between them would. The walk must start
/// over, and what it then reports tiles the routing as it now is.
#[test]
fn a_capture_starts_over_when_a_boundary_moves_between_visits() {
    for raise in [false, true] {
        let tree = Tree::in_memory(Config {
            memory_budget_bytes: 1 << 20,
            background_eviction: false,
            ..Config::default()
        })
        .unwrap();
        for i in 0..400 {
            tree.insert(format!("key{i:06}").as_bytes(), &[7; 100])
                .unwrap();
        }
        tree.flush().unwrap();
        assert_eq!(
            tree.stats().height,
            1,
            "one inner node, which the hook rewrites"
        );
        let core: &'static Core = Box::leak(Box::new(Arc::clone(&tree.core)));
        let mut entries = {
            let guard = epoch::pin();
            inner::records(&core.root().snapshot(&guard).unwrap().view())
        };
        assert!(entries.len() >= 3, "three pages at least");
        let old = entries[1].0.clone();
        let moved = if raise {
            [old.as_slice(), &[0]].concat()
        } else {
            old[..old.len() - 1].to_vec()
        };
        assert!(entries[0].0 < moved && moved < entries[2].0 && moved != old);
        entries[1].0 = moved;
        let bytes = inner::build(core.inner_size_bytes, None, None, &entries).unwrap();
        hooks::on_capture_step(move || {
            let guard = epoch::pin();
            let root = core.root().snapshot(&guard).unwrap();
            root.lock().unwrap().publish(bytes, &guard);
        });
        let (mut lows, mut starts) = (Vec::new(), 0);
        tree.capture_leaves(|low, _| {
            if low.is_empty() {
                lows.clear();
                starts += 1;
            }
            lows.push(low.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(starts, 2, "raise {raise}: the walk started over once");
        assert!(
            lows.iter().eq(entries.iter().map(|(k, _)| k)),
            "raise {raise}: the second walk follows the routing"
        );
    }
}

#[test]
fn capture_returns_the_first_error_of_its_callback() {
    let tree = Tree::in_memory(small_config()).unwrap();
    for i in 0..2000u32 {
        tree.insert(&i.to_be_bytes(), &[1; 50]).unwrap();
    }
    let mut calls = 0;
    let result = tree.capture_leaves(|_, _| {
        calls += 1;
        if calls == 3 {
            return Err(Error::Unsupported("stop".into()));
        }
        Ok(())
    });
    assert!(matches!(result, Err(Error::Unsupported(m)) if m == "stop"));
    assert_eq!(calls, 3);
    // The walk released its locks: the tree goes on.
    tree.insert(b"after", b"x").unwrap();
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
        Tree::from_leaves(config.clone(), store, ActiveBackend::memory(), leaves, None)
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
        None,
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
            let (low, high) = path.routing_range().unwrap();
            assert_eq!(low, leaves[i].0);
            assert_eq!(high, leaves.get(i + 1).map(|l| l.0.clone()));
            drop(page);
        }
    }
}

/// Long keys on real pages: groups of keys that share up to 1,022 bytes, so most
/// separators are long (up to `max_key_bytes`, and some keys are that long), and the
/// 16 KiB inner nodes of a rebuilt tree stack at least three levels deep. The rebuilt
/// tree reads back equal, then takes more keys, splitting pages and inner nodes.
#[test]
fn long_keys_rebuild_three_inner_levels() {
    let mut rng = Rng::seeded("long_keys_rebuild_three_inner_levels");
    let config = Config {
        memory_budget_bytes: 256 << 10,
        background_eviction: false,
        max_key_bytes: 1024,
        max_value_bytes: 16,
        ..Config::default()
    };
    // Group `g`'s keys: two bytes of group, a filler of up to 1,020 bytes, two bytes
    // of member.
    let key = |g: u16, member: u16| {
        let fill = 1020 - usize::from(g % 7) * 20;
        let mut key = g.to_be_bytes().to_vec();
        key.resize(2 + fill, b'x');
        key.extend_from_slice(&member.to_be_bytes());
        key
    };
    let mut order: Vec<(u16, u16)> = (0..300).flat_map(|g| (0..6).map(move |m| (g, m))).collect();
    let store = Arc::new(MemoryStore::new());
    let tree = Tree::with_page_store(config.clone(), Arc::clone(&store)).unwrap();
    let mut model = BTreeMap::new();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for &(g, m) in &order {
        let (k, v) = (key(g, m), rng.next_u64().to_le_bytes().to_vec());
        tree.insert(&k, &v).unwrap();
        model.insert(k, v);
    }
    assert!(model.keys().any(|k| k.len() == 1024));
    tree.flush().unwrap();
    let (leaves, _) = capture(&tree, &store);
    check_tiling(&leaves);
    let rebuilt = rebuild(config, &leaves);
    assert!(
        rebuilt.stats().height >= 3,
        "height {} over {} pages",
        rebuilt.stats().height,
        leaves.len()
    );
    check_index(&rebuilt.core);
    check_model(&rebuilt, &model);

    let inner_splits = rebuilt.stats().inner_splits;
    for g in (0..450).rev() {
        for m in [1, 7, 8] {
            let (k, v) = (key(g, m), vec![g as u8; 16]);
            rebuilt.insert(&k, &v).unwrap();
            model.insert(k, v);
        }
    }
    rebuilt.flush().unwrap();
    assert!(
        rebuilt.stats().inner_splits > inner_splits,
        "inner nodes split"
    );
    check_index(&rebuilt.core);
    check_model(&rebuilt, &model);
}
