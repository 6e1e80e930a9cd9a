//! Unit tests of the tree's internals.

use std::collections::BTreeMap;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch};

use crate::config::Config;
use crate::error::Error;
use crate::pool::{Block, EvictDecision, Evictor};
use crate::storage::{Page, PageNo, SimStore};

use super::inner::{self};
use super::leaf::MiniHeader;
use super::leaf_page::LeafPage;
use super::mapping::{Location, MappingTable, PageId};
use super::merge::Merged;
use super::node::{NodeRef, RecordType};
use super::plan::{MergePlan, owned_fence};
use super::redistribute::{Neighbour, Redistribution};
use super::{Core, Op, Tree};

/// Regression: `parent_with_separator` read the parent's bytes twice without its
/// version lock, once to find the two pages and once to copy, so a split of the
/// parent published in between (here: the hook replaces the parent by its left
/// half, as an inner split does) made it remove a record index past the end of the
/// new buffer (`record index 131 out of range 0..95`, seen in
/// `tests/tree_file.rs`). A redistribution whose parent changed under it must give
/// up (the caller writes the neighbour back and restarts), never panic or publish.
#[test]
fn redistribution_survives_a_parent_split_between_its_reads() {
    let tree = Tree::in_memory(Config {
        memory_budget_bytes: 1 << 20,
        background_eviction: false,
        ..Config::default()
    })
    .unwrap();
    let value = [7u8; 100];
    let key = |i: u32| format!("key{i:06}").into_bytes();
    for i in 0..4000 {
        tree.insert(&key(i), &value).unwrap();
    }
    tree.flush().unwrap();
    let core: &'static Core = Box::leak(Box::new(Arc::clone(&tree.core)));
    let guard = epoch::pin();
    let path = core.find_path(b"", &guard).unwrap();
    let parent = *path.last().unwrap();
    let original: Box<[u8]> = parent.view().as_bytes().into();
    let n = NodeRef::trusted(&original);
    assert!(n.len() >= 3, "the test needs a parent of three pages");
    // The last page gives to its left neighbour.
    let index = n.len() - 1;
    let (mut probe, mut neighbour_low) = (Vec::new(), Vec::new());
    n.key_into(index, &mut probe);
    n.key_into(index - 1, &mut neighbour_low);
    let mut separator = neighbour_low.clone();
    separator.push(0);
    let other_pid = PageId(inner::child_ref(&n, index - 1));
    let page = core.mapping.try_write(other_pid).unwrap();
    let Location::Leaf(leaf_no) = page.location() else {
        panic!("flushed pages are on disk");
    };
    let r = Redistribution {
        neighbour: Neighbour {
            page,
            header: MiniHeader {
                pid: other_pid,
                leaf: PageNo(leaf_no),
                mirror: false,
                owner: 0,
            },
            block: None,
            left: true,
        },
        giving_pid: PageId(inner::child_ref(&n, index)),
        probe: probe.clone(),
        restore: LeafPage::One(Page::boxed()),
        pages: [LeafPage::One(Page::boxed()), LeafPage::One(Page::boxed())],
        separator,
    };

    // The parent's left half, up to the giving page, as a split leaves it.
    let entries = inner::records(&n);
    let left_half = inner::build(
        original.len(),
        owned_fence(n.low_fence()).as_deref(),
        Some(&probe),
        &entries[..index],
    )
    .unwrap();
    // Publishes `bytes` as the leftmost level-1 node's, under its version lock.
    let replace = move |bytes: Box<[u8]>| {
        let guard = epoch::pin();
        let path = core.find_path(b"", &guard).unwrap();
        let lock = path.last().unwrap().lock().unwrap();
        lock.publish(bytes, &guard);
    };
    super::hooks::on_parent_read(move || replace(left_half));
    assert!(
        !core.link_redistribution(&r),
        "a stale parent must not publish"
    );
    assert_eq!(
        parent.node().snapshot(&guard).unwrap().view().len(),
        index,
        "the split's bytes stay published"
    );
    drop(r);
    replace(original.clone());
    drop(guard);
    for i in 0..4000 {
        assert_eq!(tree.get(&key(i)).unwrap().as_deref(), Some(&value[..]));
    }
    assert_eq!(tree.range::<&[u8], _>(..).count(), 4000);
}

/// An evictor that plays the page's owner inside the callback: it takes the page
/// lock, merges the mini-page, points the page at its leaf and frees the block, as a
/// writer does when it wins the page lock between an evictor's claim and its
/// try-lock. Then it runs the real callback.
struct OwnerFreesFirst<'a>(&'a Core);

impl Evictor for OwnerFreesFirst<'_> {
    fn evict(&self, block: &Block) -> EvictDecision {
        let core = self.0;
        // SAFETY: the block is claimed by this evictor and published.
        let header = unsafe { MiniHeader::of(block) };
        {
            let page = core.mapping.write(header.pid);
            let mini = core.mini_page(&page).unwrap().node();
            assert!(matches!(
                core.merge(header.pid, header, Some(mini), None, false),
                Ok(Merged::InPlace)
            ));
            page.set_location(Location::Leaf(header.leaf.0));
            core.retire(*block);
        }
        core.evict(block)
    }
}

/// Regression: the callback asserted that a claimed block is still its page's
/// mini-page, but the owner may free it (`Evicting` → `Dead`) before the callback
/// gets the page lock; found by `tests/tree_concurrent.rs` with 8 threads.
#[test]
fn evicting_a_block_its_page_freed_meanwhile() {
    let tree = Tree::in_memory(Config {
        memory_budget_bytes: 64 << 10,
        ..Config::default()
    })
    .unwrap();
    tree.insert(b"key", b"value").unwrap();
    let core = &tree.core;
    assert!(matches!(core.mapping.peek(PageId(0)), Location::Mini(_)));
    let result = core.pool.evict_one(&OwnerFreesFirst(core));
    assert!(
        matches!(
            result,
            crate::pool::EvictResult::Reclaimed { evicted: false, .. }
        ),
        "{result:?}"
    );
    assert!(matches!(core.mapping.peek(PageId(0)), Location::Leaf(_)));
    assert_eq!(tree.get(b"key").unwrap().as_deref(), Some(&b"value"[..]));
}

/// The key of number `i` in the tests of failed batched writes.
fn numbered(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

/// The page whose routing range holds `key`, and that range.
fn page_of(core: &Core, key: &[u8]) -> (PageId, Vec<u8>, Option<Vec<u8>>) {
    loop {
        let (path, page) = core.lock_leaf_of(key, MappingTable::read);
        if let Ok((low, high)) = path.routing_range() {
            return (path.pid, low, high);
        }
        drop(page);
    }
}

/// Whether merging `pid`'s mini-page now would split its leaf page.
fn merge_would_split(core: &Core, pid: PageId) -> bool {
    let page = core.mapping.write(pid);
    let Some(mini) = core.mini_page(&page) else {
        return false;
    };
    let mut leaf = LeafPage::One(Page::boxed());
    core.read_leaf(mini.header().leaf, &mut leaf).unwrap();
    matches!(
        core.plan_merge(mini.header(), Some(mini.node()), None, Some(leaf)),
        Ok(MergePlan::Split { open: None, .. })
    )
}

/// Inserts odd keys between the even ones of the page holding `numbered(at)`, spread
/// over its range, until a merge of its mini-page would split its leaf page, balanced.
/// Returns the page.
fn overflow_page(tree: &Tree, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, at: u32) -> PageId {
    let (pid, low, high) = page_of(&tree.core, &numbered(at));
    let evens: Vec<u32> = model
        .keys()
        .filter(|k| k.as_slice() >= low.as_slice() && high.as_ref().is_none_or(|h| k < &h))
        .map(|k| std::str::from_utf8(&k[3..]).unwrap().parse().unwrap())
        .collect();
    // The first lands in the page's upper half, which its split moves right.
    let (start, stride) = (evens.len() * 7 / 8, evens.len() / 4);
    for i in (0..evens.len()).map(|j| evens[(start + j * stride) % evens.len()] + 1) {
        let value = b"dirty".repeat(8);
        tree.insert(&numbered(i), &value).unwrap();
        model.insert(numbered(i), value);
        if merge_would_split(&tree.core, pid) {
            return pid;
        }
    }
    panic!("the page of {at} does not overflow");
}

/// Every record of `model` reads back, with point reads and with a full scan.
fn assert_reads(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (k, v) in model {
        assert_eq!(tree.get(k).unwrap().as_ref(), Some(v), "{k:?}");
    }
    let scanned: BTreeMap<Vec<u8>, Vec<u8>> =
        tree.range::<&[u8], _>(..).map(Result::unwrap).collect();
    assert!(scanned == *model, "the scan differs from the model");
}

/// A tree on a `SimStore` after a batched merge of two pages whose leaf pages both
/// split failed at its last write, as the background evictor's did in
/// `tests/tree_faults.rs`: the batch wrote both right-hand pages, linked both splits,
/// wrote the first left page and failed on the second. It answered the failure for
/// both pages, so both keep their mini-pages. Returns the tree, the model of its
/// records and the two pages: `narrowed`, whose leaf page now ends at its new
/// separator while its mini-page still holds records of the right-hand part, and
/// `stale`, whose leaf page keeps its old, wider range.
fn batch_failed_between_left_pages() -> (Tree, BTreeMap<Vec<u8>, Vec<u8>>, PageId, PageId) {
    let store = Arc::new(SimStore::new(7));
    let config = Config {
        memory_budget_bytes: 1 << 20,
        background_eviction: false,
        promotion_rate_percent: 0,
        scan_promotion_rate_percent: 0,
        ..Config::default()
    };
    let tree = Tree::with_page_store(config, Arc::clone(&store)).unwrap();
    let mut model = BTreeMap::new();
    for i in (0..3000).step_by(2) {
        tree.insert(&numbered(i), b"value").unwrap();
        model.insert(numbered(i), b"value".to_vec());
    }
    tree.flush().unwrap();
    let narrowed = overflow_page(&tree, &mut model, 1000);
    let stale = overflow_page(&tree, &mut model, 2000);
    assert_ne!(narrowed, stale);
    let (_, stale_low, stale_high) = page_of(&tree.core, &numbered(2000));
    let core = &tree.core;
    {
        let pages = [core.mapping.write(narrowed), core.mapping.write(stale)];
        let jobs: Vec<_> = pages.iter().map(|p| core.dirty_mini(p).unwrap()).collect();
        // The two right-hand pages, then the left pages in job order: the fourth fails.
        store.fail_writes_after(3);
        let results = core.merge_batch(&jobs);
        assert!(results.iter().all(Result::is_err), "the batch failed");
    }
    // The state the test is about.
    let leaf_of = |pid: PageId| {
        let page = core.mapping.read(pid);
        let mini = core
            .mini_page(&page)
            .expect("a failed merge keeps the mini-page");
        let mut leaf = LeafPage::One(Page::boxed());
        core.read_leaf(mini.header().leaf, &mut leaf).unwrap();
        let n = NodeRef::trusted(leaf.payload());
        let outside = mini.node().iter().any(|r| !n.covers(&r.key()));
        (owned_fence(n.high_fence()), outside)
    };
    let (_, outside) = leaf_of(narrowed);
    assert!(
        outside,
        "the narrowed page's mini-page holds keys beyond its leaf page"
    );
    let (stale_pid, _, high) = page_of(core, &stale_low);
    assert_eq!(stale_pid, stale);
    assert!(high < stale_high, "the stale page's split is linked");
    assert_eq!(
        leaf_of(stale).0,
        stale_high,
        "the stale page keeps its old leaf page"
    );
    (tree, model, narrowed, stale)
}

/// Regression: a merge that ran after a failed batched write planned over a page the
/// batch left inconsistent, and tripped a debug assertion in `plan_merge` (a dirty key
/// outside its leaf page's fences; in a release build, `apply`'s `unreachable!`). A
/// page whose left half the batch wrote before failing keeps its whole mini-page, as
/// the batch answered the failure for it. A writer that passed its `check_writable`
/// before the failure merges it next (`merge_full`), and so do the background
/// evictor's queued merges; both must refuse, the tree being poisoned.
#[test]
fn merges_after_a_failed_batch_write_refuse_a_page_it_narrowed() {
    let (tree, model, narrowed, _) = batch_failed_between_left_pages();
    let core = &tree.core;
    {
        let page = core.mapping.write(narrowed);
        let job = core.dirty_mini(&page).unwrap();
        let merged = core.merge(narrowed, job.header, Some(job.mini.node()), None, false);
        assert!(matches!(merged, Err(Op::Fail(Error::Poisoned { .. }))));
        let merged = core.merge_batch(&[job]);
        assert!(matches!(
            merged[..],
            [Err(Op::Fail(Error::Poisoned { .. }))]
        ));
    }
    assert_reads(&tree, &model);
}

/// Regression: a merge after a failed batched write of a page whose left half the
/// batch did not write (its leaf page keeps the old, wider range, with stale copies
/// of the records now routed to its right-hand page) overflows again, and gave records
/// to that right-hand page: the two pages' records overlapped and tripped
/// `RecordList::push_view`'s debug assertion (in a release build, `packed to fit`).
/// The merge must refuse, and so must a redistribution of a merge that checked before
/// the failure: it takes no neighbour once the tree is poisoned.
#[test]
fn merges_after_a_failed_batch_write_refuse_a_page_it_left_stale() {
    let (tree, model, _, stale) = batch_failed_between_left_pages();
    let core = &tree.core;
    {
        let page = core.mapping.write(stale);
        let job = core.dirty_mini(&page).unwrap();
        let (header, mini) = (job.header, job.mini.node());
        let mut leaf = LeafPage::One(Page::boxed());
        core.read_leaf(header.leaf, &mut leaf).unwrap();
        // A writer's record for the stale page, as `merge_full` merges it: just above
        // the page's low fence, which the split left in place.
        let low = owned_fence(NodeRef::trusted(leaf.payload()).low_fence()).unwrap();
        let key = [low.as_slice(), b"+"].concat();
        let extra = Some((&key[..], &b"late"[..], RecordType::Insert));
        let merged = core.merge(stale, header, Some(mini), extra, true);
        assert!(matches!(merged, Err(Op::Fail(Error::Poisoned { .. }))));
        // The same merge had it checked before the failure: planned, it overflows and
        // would give records to a neighbour.
        let Ok(MergePlan::Split {
            records,
            chunks,
            open: None,
        }) = core.plan_merge(header, Some(mini), extra, Some(leaf))
        else {
            panic!("the stale page overflows, balanced");
        };
        let given = core.redistribute(stale, header.leaf, &records, &chunks);
        assert!(matches!(given, Ok(false)), "no neighbour once poisoned");
    }
    assert_reads(&tree, &model);
}

/// A tree sharing `memory` with others, over a store of its own in memory.
fn tree_in(config: &Config, memory: &super::TreeMemory) -> Tree {
    Tree::with_store_in(
        config.clone(),
        Box::new(crate::storage::MemoryStore::new()),
        crate::storage::ActiveBackend::memory(),
        memory.clone(),
    )
    .unwrap()
}

/// A pool shared by several trees, with no background thread (the tests play it).
fn shared_memory() -> (Config, super::TreeMemory) {
    let config = Config {
        memory_budget_bytes: 256 << 10,
        background_eviction: false,
        huge_pages: false,
        ..Config::default()
    };
    let memory = super::TreeMemory::new(&config).unwrap();
    (config, memory)
}

/// Regression: a dropped tree gave its blocks back only in `Core::drop`, which runs
/// where the last `Arc<Core>` goes. An evictor of the shared pool holds members'
/// `Arc`s while it works (the background evictor over a whole pass of `merge_queued`,
/// a writer of another tree for its eviction batch), so the blocks of a tree whose
/// last handle was gone stayed in the pool until that evictor let go, and the freeing
/// (a lock and a free per page) then ran on the evictor's thread or inside another
/// tree's allocation. The tree gives them back as its handle drops.
#[test]
fn a_dropped_tree_gives_its_blocks_back_while_an_evictor_holds_it() {
    let (config, memory) = shared_memory();
    let keep = tree_in(&config, &memory);
    keep.insert(b"k", b"v").unwrap();
    let baseline = memory.bytes_in_use();
    let scratch = tree_in(&config, &memory);
    // Few enough records for one mini-page, which the drop's flush merges in place
    // and keeps (as clean records).
    for i in 0..20 {
        scratch.insert(&numbered(i), &[1u8; 60]).unwrap();
    }
    assert!(memory.bytes_in_use() > baseline);
    // What the background evictor holds during a pass over the members.
    let held = memory.pool.members();
    assert_eq!(held.len(), 2);
    drop(scratch);
    assert_eq!(
        memory.bytes_in_use(),
        baseline,
        "the dropped tree's mini-pages stayed while an evictor held its core"
    );
    drop(held);
    assert_eq!(memory.bytes_in_use(), baseline);
    assert_eq!(keep.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}

/// Replays the slot-reuse race of `members.rs` deterministically: an evictor claims a
/// block of tree `old` (now `Evicting`); before it looks up the block's owner, `old` is
/// dropped (freeing the block: `Dead`) and a new tree takes `old`'s member slot. The
/// owner lookup then finds the new tree, which must not take the block for its own
/// (its page does not map it) and answers `Busy`, after which the pool reclaims the dead
/// block; nothing leaks and both trees stay whole.
#[test]
fn a_claimed_block_whose_slot_was_reused_is_reclaimed() {
    use std::cell::RefCell;

    let (config, memory) = shared_memory();
    let old = tree_in(&config, &memory);
    let keep = tree_in(&config, &memory);
    old.insert(b"old key", b"old value").unwrap();
    keep.insert(b"k", b"v").unwrap();
    let old_slot = old.core.owner;
    let baseline_with_old = memory.bytes_in_use();
    // The first block of the pool is `old`'s mini-page.
    struct DropThenDispatch<'a> {
        pool: &'a super::members::TreePool,
        old: RefCell<Option<Tree>>,
        new: RefCell<Option<Tree>>,
        make_new: &'a dyn Fn() -> Tree,
    }
    impl Evictor for DropThenDispatch<'_> {
        fn evict(&self, block: &Block) -> EvictDecision {
            drop(self.old.borrow_mut().take());
            let new = (self.make_new)();
            new.insert(b"new key", b"new value").unwrap();
            *self.new.borrow_mut() = Some(new);
            self.pool.evict(block)
        }
    }
    let make_new = || tree_in(&config, &memory);
    let evictor = DropThenDispatch {
        pool: &memory.pool,
        old: RefCell::new(Some(old)),
        new: RefCell::new(None),
        make_new: &make_new,
    };
    let result = memory.pool.evict_one(&evictor);
    assert!(
        matches!(
            result,
            crate::pool::EvictResult::Reclaimed { evicted: false, .. }
        ),
        "{result:?}"
    );
    let new = evictor.new.borrow_mut().take().unwrap();
    assert_eq!(
        new.core.owner, old_slot,
        "the new tree took the old one's slot"
    );
    assert_eq!(
        new.get(b"new key").unwrap().as_deref(),
        Some(&b"new value"[..])
    );
    assert_eq!(new.get(b"old key").unwrap(), None);
    assert_eq!(keep.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    drop(new);
    assert!(memory.bytes_in_use() < baseline_with_old);
}

/// Regression: every tree kept a second-miss filter of its own, sized by the memory
/// budget (`budget / 128` bytes, outside the pool), so a `Db` of many keyspaces sharing
/// one budget still spent that much more per keyspace. The filter belongs to the pool,
/// which sizes it. A key read through one tree is not a second read of the same key of
/// another tree.
#[test]
fn trees_sharing_a_pool_share_its_second_miss_filter() {
    let (config, memory) = shared_memory();
    let (a, b) = (tree_in(&config, &memory), tree_in(&config, &memory));
    assert!(std::ptr::eq(a.core.doorkeeper(), b.core.doorkeeper()));
    assert!(!a.core.doorkeeper().seen_again(a.core.owner, b"key"));
    assert!(!b.core.doorkeeper().seen_again(b.core.owner, b"key"));
    assert!(a.core.doorkeeper().seen_again(a.core.owner, b"key"));
    assert!(b.core.doorkeeper().seen_again(b.core.owner, b"key"));
}

/// A tree on its own whose two leaf pages swapped bytes (each checksum-valid, each
/// holding the other's range): reads, scans and merges answer `Corrupted` naming a
/// page, never a panic or a scan that loops, and the tree then refuses writes.
#[test]
fn leaf_pages_holding_each_others_ranges_are_corrupted_not_a_panic() {
    let tree = Tree::in_memory(Config {
        memory_budget_bytes: 256 << 10,
        background_eviction: false,
        ..Config::default()
    })
    .unwrap();
    for i in 0..3000 {
        tree.insert(&numbered(i), &[7; 40]).unwrap();
    }
    tree.flush().unwrap();
    let core = &tree.core;
    let leaf_of = |key: &[u8]| {
        let (_, page) = core.lock_leaf_of(key, MappingTable::read);
        core.leaf_of(&page)
    };
    let (a, b) = (leaf_of(&numbered(100)), leaf_of(&numbered(2500)));
    assert_ne!(a, b, "the keys lie in different pages");
    let (mut page_a, mut page_b) = (Page::boxed(), Page::boxed());
    core.store.read_page(a, &mut page_a).unwrap();
    core.store.read_page(b, &mut page_b).unwrap();
    core.store.write_page(a, &mut page_b).unwrap();
    core.store.write_page(b, &mut page_a).unwrap();
    let corrupted = |r: Result<(), Error>, what: &str| match r {
        Err(Error::Corrupted { page, reason }) => {
            assert!(page == a.0 || page == b.0, "{what}: page {page}: {reason}");
            assert!(reason.contains("range"), "{what}: {reason}");
        }
        other => panic!("{what}: expected Corrupted, got {other:?}"),
    };
    // Only the leaf pages know the keys now: the flush left clean mini-pages, which
    // may answer; a read that reaches a swapped page must not.
    let got: Result<(), Error> = (0..3000).try_for_each(|i| tree.get(&numbered(i)).map(drop));
    corrupted(got, "get");
    let scanned: Result<Vec<_>, Error> = tree.range::<&[u8], _>(..).collect();
    assert!(scanned.is_err(), "a scan over both pages fails");
    let back: Result<Vec<_>, Error> = tree.range::<&[u8], _>(..).rev().collect();
    assert!(back.is_err(), "a reverse scan over both pages fails");
    assert!(matches!(
        tree.insert(&numbered(100), b"x"),
        Err(Error::Poisoned { cause }) if cause.contains("range")
    ));
}

/// The longest key, and the leaf page size that holds it, of the k-way split tests.
const LONG_KEY_BYTES: usize = 4096;

/// Key `i` of the k-way split test: 4000 bytes every key shares, `i` in five digits,
/// and filler to 4 KiB, so that the separator between two neighbours is about 4005
/// bytes: a node with an unbounded fence holds no more than six of them.
fn long_numbered(i: u32) -> Vec<u8> {
    let mut k = vec![b'k'; 4000];
    k.extend_from_slice(format!("{i:05}").as_bytes());
    k.resize(LONG_KEY_BYTES, b'.');
    k
}

/// Inner splits into more than two parts (issue #34). A tree of 4 KiB keys in 16 KiB
/// leaf pages whose only leaf page splits into seventeen pages at once (the records of
/// a split, as a merge hands them over, packed by `pack_leaves`: with unbounded fences
/// it costs every key whole, and a page of two fences of 4 KiB holds one record of
/// 6 KiB, the last page, of one fence, two): its root gets sixteen separators of about
/// 4 KiB, more than two nodes of 32 KiB with an unbounded fence hold, so it splits
/// into three (the middle part's
/// fences share the 4000-byte prefix, and it stores its separators without it), and a
/// new root above them routes to all three. (A merge sends up five or six separators
/// at most: a leaf page and a mini-page hold three such records each. So this split is
/// built by hand.) Then the tree must match a model: point reads and scans in both
/// directions, and again after more writes of long keys between the ones it holds,
/// which split its leaves and inner nodes as writers do.
#[test]
fn a_root_parts_into_three_when_a_split_sends_up_sixteen_separators_of_4_kib() {
    let tree = Tree::in_memory(Config {
        max_key_bytes: LONG_KEY_BYTES,
        leaf_page_size_bytes: 16384,
        memory_budget_bytes: 4 << 20,
        background_eviction: false,
        ..Config::default()
    })
    .unwrap();
    let core = &tree.core;
    let value = |i: u32, version: u32| {
        let mut v = format!("{i}:{version}:").into_bytes();
        v.resize(2000, b'v');
        v
    };
    // Every tenth number: room between them for the writes after the split.
    let mut model = BTreeMap::new();
    let mut records = super::leaf::RecordList::with_capacity(18, 18 * 6200);
    for i in (0..180).step_by(10) {
        records.push(&long_numbered(i), &value(i, 0), RecordType::Insert);
        model.insert(long_numbered(i), value(i, 0));
    }
    let chunks = super::leaf::pack_leaves(
        &records,
        None,
        None,
        super::leaf::Fill::Balanced,
        core.leaf.node_bytes(),
    );
    assert_eq!(chunks.len(), 17, "a page for each record but the last two");
    let (pid, low, high) = page_of(core, &long_numbered(0));
    assert_eq!((low.as_slice(), high), (&b""[..], None), "the only page");
    {
        let page = core.mapping.write(pid);
        let Location::Leaf(no) = page.location() else {
            panic!("a new tree's page is its empty leaf page");
        };
        core.split_leaf(pid, PageNo(no), records, chunks, None)
            .unwrap_or_else(|_| panic!("the split failed"));
    }
    assert_eq!(tree.stats().inner_splits, 1);
    let guard = epoch::pin();
    let path = core.find_path(&long_numbered(70), &guard).unwrap();
    assert_eq!(path.len(), 2, "a new root above the parts");
    assert_eq!(path[0].view().len(), 3, "the root has three children");
    drop(guard);
    assert_reads(&tree, &model);
    let backward: Vec<Vec<u8>> = tree
        .range::<&[u8], _>(..)
        .rev()
        .map(|r| r.unwrap().0)
        .collect();
    assert!(backward.iter().rev().eq(model.keys()), "a backward scan");

    // Writers between the keys: leaf splits, and inner splits of their own.
    let mut rng = 0x5eed_u64;
    for version in 1..600 {
        rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let i = (rng >> 33) as u32 % 180;
        if (rng >> 20).is_multiple_of(5) {
            tree.delete(&long_numbered(i)).unwrap();
            model.remove(&long_numbered(i));
        } else {
            tree.insert(&long_numbered(i), &value(i, version)).unwrap();
            model.insert(long_numbered(i), value(i, version));
        }
    }
    tree.flush().unwrap();
    assert_reads(&tree, &model);
    let stats = tree.stats();
    assert!(stats.inner_splits > 1, "{stats:?}");
}
