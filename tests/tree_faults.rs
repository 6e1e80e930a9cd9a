//! IO errors and corrupt pages under a Tree surface as `Err` — never a panic, never a
//! wrong answer — using the seeded fault-injecting `SimStore`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bfdb::storage::{PageNo, PageStore, SimStore};
use bfdb::{Error, Tree};

mod common;
use common::{fault_config, insert_until_refused, load_scattered, scattered_key as key};

/// Loads enough records that most live only in leaf pages (the pool is tiny).
fn loaded(seed: u64) -> (Tree, Arc<SimStore>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let store = Arc::new(SimStore::new(seed));
    let tree = Tree::with_page_store(fault_config(), Arc::clone(&store)).unwrap();
    let model = load_scattered(&tree);
    (tree, store, model)
}

/// Every answer is either an error or the model's answer.
fn check_reads(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>) -> (usize, usize) {
    let (mut ok, mut err) = (0, 0);
    for (k, v) in model {
        match tree.get(k) {
            Ok(got) => {
                assert_eq!(got.as_ref(), Some(v), "wrong answer for {k:?}");
                ok += 1;
            }
            Err(Error::Io(_) | Error::Corrupted { .. }) => err += 1,
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    (ok, err)
}

#[test]
fn failed_reads_are_errors_and_the_tree_recovers_when_they_stop() {
    let (tree, store, model) = loaded(1);
    store.fail_reads_after(0);
    let (_, err) = check_reads(&tree, &model);
    assert!(
        err > model.len() / 2,
        "most records need a leaf read: {err} errors"
    );
    let scan: Vec<_> = tree.range::<&[u8], _>(..).collect();
    assert!(
        matches!(scan.last(), Some(Err(_))),
        "a scan ends with the error"
    );
    store.clear_faults();
    let (ok, err) = check_reads(&tree, &model);
    assert_eq!((ok, err), (model.len(), 0));
}

#[test]
fn failed_writes_poison_writes_but_reads_go_on() {
    let (tree, store, mut model) = loaded(2);
    store.fail_writes_after(3);
    insert_until_refused(&tree, &mut model, "the armed fault hits");
    assert!(matches!(tree.delete(b"more"), Err(Error::Poisoned { .. })));
    assert!(matches!(tree.flush(), Err(Error::Poisoned { .. })));
    // Every acknowledged write is still readable: dirty mini-pages stay in memory.
    let (ok, err) = check_reads(&tree, &model);
    assert_eq!((ok, err), (model.len(), 0));
    // Batched point reads too, as `Error::Poisoned` documents.
    let keys: Vec<&Vec<u8>> = model.keys().collect();
    let values: Vec<Option<Vec<u8>>> = model.values().cloned().map(Some).collect();
    assert!(tree.get_many(&keys).unwrap() == values, "get_many differs");
    // And the message says what still works.
    let message = tree.insert(b"more", b"x").unwrap_err().to_string();
    assert!(message.contains("reads still work"), "{message}");
}

/// A write that fails anywhere in a stretch of merges that redistribute and split
/// poisons the tree, and every acknowledged record still reads back: a redistribution
/// writes the neighbour's page, then publishes the parent's separator, then writes the
/// giving page, so no key is ever routed to a page that lacks it, whichever write fails.
#[test]
fn failed_writes_during_redistributions_lose_no_record() {
    let mut redistributed = 0;
    for n in 0..40 {
        let (tree, store, mut model) = loaded(100 + n);
        let before = tree.stats().leaf_redistributions;
        store.fail_writes_after(n);
        insert_until_refused(&tree, &mut model, "the armed fault hits");
        redistributed += tree.stats().leaf_redistributions - before;
        let (ok, err) = check_reads(&tree, &model);
        assert_eq!((ok, err), (model.len(), 0), "writes failing after {n}");
    }
    assert!(redistributed > 0, "no redistribution ran before a failure");
}

/// After a failed write has poisoned the tree, a full scan returns exactly what point
/// reads do: every acknowledged record, and the refused write if and only if a point
/// read finds it. (It once missed records inserted after the fault: a page whose leaf
/// write failed after a split had published its separator kept its old, wider fences
/// on disk, and the scan resumed from its stale high fence, past the new right-hand
/// page. Scans of a poisoned tree now bound each page by its range in its parent.) It
/// also once tripped, in about one run in twelve, debug assertions in a merge that the
/// inserting thread ran just after the background evictor's batched write failed part
/// way: the merge planned over a page the batch had left narrower than its mini-page,
/// or wider than its range. A poisoned tree now merges nothing.
#[test]
fn scans_after_failed_writes_see_every_record() {
    for n in 0..40 {
        let (tree, store, mut model) = loaded(100 + n);
        store.fail_writes_after(n);
        let (key, value) = insert_until_refused(&tree, &mut model, "the armed fault hits");
        if tree.get(&key).unwrap().is_some_and(|v| v == value) {
            model.insert(key, value);
        }
        let scanned: BTreeMap<Vec<u8>, Vec<u8>> =
            tree.range::<&[u8], _>(..).map(Result::unwrap).collect();
        if scanned != model {
            let show = |keys: Vec<&Vec<u8>>| -> Vec<String> {
                keys.iter()
                    .take(5)
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .collect()
            };
            let missing = show(model.keys().filter(|k| !scanned.contains_key(*k)).collect());
            let extra = show(scanned.keys().filter(|k| !model.contains_key(*k)).collect());
            panic!(
                "writes failing after {n}: the scan differs: missing {missing:?}, extra {extra:?}"
            );
        }
    }
}

#[test]
fn corrupt_leaf_pages_are_reported_not_misread() {
    let (tree, store, model) = loaded(3);
    tree.flush().unwrap();
    // Corrupt every leaf page the tree wrote.
    let pages = store.stats().live_pages;
    for no in 0..pages {
        store.flip_bit(PageNo(no), 8 * 2000 + 5);
    }
    let (_, err) = check_reads(&tree, &model);
    assert!(err > 0);
    match tree.get(&key(5)) {
        Err(Error::Corrupted { .. }) | Ok(Some(_)) => {}
        other => panic!("expected corruption or a cached value, got {other:?}"),
    }
}

/// Regression (review): when dirty mini-pages cannot be evicted because their leaf pages
/// cannot be read, a write that needs pool room reports the error instead of spinning.
#[test]
fn writes_that_need_room_fail_instead_of_spinning_when_eviction_fails() {
    let (tree, store, _) = loaded(4);
    store.fail_reads_after(0);
    let mut saw_error = false;
    for i in 6000..40_000 {
        match tree.insert(&key(i), b"x") {
            Ok(()) => {}
            // Either the write's own merge read fails, or the eviction that would make
            // room for it does; both are reported.
            Err(Error::Io(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("EIO"), "{msg}");
                saw_error = true;
                break;
            }
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    assert!(
        saw_error,
        "the pool fills with dirty mini-pages, so some write must fail"
    );
    // Once reads work again, writes go on.
    store.clear_faults();
    tree.insert(b"after", b"ok").unwrap();
    assert_eq!(tree.get(b"after").unwrap().as_deref(), Some(&b"ok"[..]));
}
