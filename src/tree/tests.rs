//! Unit tests of the tree's internals.

use std::sync::Arc;

use crossbeam_epoch::{self as epoch};

use crate::config::Config;
use crate::pool::{Block, EvictDecision, Evictor};
use crate::storage::{Page, PageNo};

use super::inner::{self};
use super::leaf::MiniHeader;
use super::mapping::{Location, PageId};
use super::merge::Merged;
use super::node::NodeRef;
use super::plan::owned_fence;
use super::redistribute::{Neighbour, Redistribution};
use super::{Core, Tree};

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
            },
            block: None,
            left: true,
        },
        giving_pid: PageId(inner::child_ref(&n, index)),
        probe: probe.clone(),
        restore: Page::boxed(),
        pages: [Page::boxed(), Page::boxed()],
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
