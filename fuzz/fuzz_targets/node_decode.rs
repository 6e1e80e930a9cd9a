//! Decoding untrusted bytes as a node: [`NodeRef::parse`] must answer `Err` or a view
//! every method of which works without panicking or reading out of bounds.
//!
//! Two kinds of input, chosen by the first byte:
//!
//! - raw: the remaining bytes are the node;
//! - mutated: a valid node is built from a recipe (size, kind, fences, records), then
//!   a few bytes are overwritten or flipped. This reaches the deep checks of the
//!   validator that random bytes almost never get past (record overlap, key order,
//!   fences, look-ahead bytes).
//!
//! On `Ok`, the harness checks the invariants the validator promises: keys strictly
//! increase and lie inside the fences and under the prefix, `search` finds every
//! record at its index, iteration works from both ends, the space accounting adds up,
//! and the node can be re-entered for writing (insert, remove, compact) and still
//! parses afterwards with the expected records.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bfdb::tree::node::{
    Fences, MAX_NODE_SIZE_BYTES, MIN_NODE_SIZE_BYTES, NodeKind, NodeMut, NodeRef, RecordType,
    WriteError,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum KindArg {
    Leaf,
    Mini,
    Inner,
}

#[derive(Arbitrary, Debug)]
enum FencesArg {
    None,
    Prefix(Vec<u8>),
    Range {
        low: Option<Vec<u8>>,
        high: Option<Vec<u8>>,
    },
}

#[derive(Arbitrary, Debug)]
enum TypeArg {
    Insert,
    Cache,
    Tombstone,
    Phantom,
}

#[derive(Arbitrary, Debug)]
struct Recipe {
    size: u16,
    kind: KindArg,
    fences: FencesArg,
    records: Vec<(Vec<u8>, Vec<u8>, TypeArg)>,
    /// Byte edits applied after building: (position, xor mask or new value, overwrite).
    edits: Vec<(u16, u8, bool)>,
}

fn kind(k: &KindArg) -> NodeKind {
    match k {
        KindArg::Leaf => NodeKind::Leaf,
        KindArg::Mini => NodeKind::Mini,
        KindArg::Inner => NodeKind::Inner,
    }
}

fn record_type(t: &TypeArg) -> RecordType {
    match t {
        TypeArg::Insert => RecordType::Insert,
        TypeArg::Cache => RecordType::Cache,
        TypeArg::Tombstone => RecordType::Tombstone,
        TypeArg::Phantom => RecordType::Phantom,
    }
}

/// Builds a valid node from `recipe` (records that do not fit are skipped), then
/// applies the edits. Returns `None` if the recipe's fences are not acceptable.
fn build(recipe: &Recipe) -> Option<Vec<u8>> {
    let size = MIN_NODE_SIZE_BYTES
        + usize::from(recipe.size) % (MAX_NODE_SIZE_BYTES.min(4096) - MIN_NODE_SIZE_BYTES + 1);
    let mut buf = vec![0u8; size];
    let fences = match &recipe.fences {
        FencesArg::None => Fences::None,
        FencesArg::Prefix(p) => Fences::Prefix(p),
        FencesArg::Range { low, high } => Fences::Range {
            low: low.as_deref(),
            high: high.as_deref(),
        },
    };
    let prefix = fences.prefix().to_vec();
    let mut node = NodeMut::init(&mut buf, kind(&recipe.kind), fences).ok()?;
    for (suffix, value, t) in &recipe.records {
        // Keys carry the node's prefix so that most of them are accepted.
        let mut key = prefix.clone();
        key.extend_from_slice(suffix);
        let _ = node.upsert(&key, value, record_type(t));
    }
    for &(at, byte, overwrite) in &recipe.edits {
        let at = usize::from(at) % size;
        if overwrite {
            buf[at] = byte;
        } else {
            buf[at] ^= byte;
        }
    }
    Some(buf)
}

/// Checks everything a parsed node promises; panics on any violation.
fn check_view(view: &NodeRef<'_>) {
    let n = view.len();
    assert_eq!(view.is_empty(), n == 0);
    assert_eq!(view.node_size_bytes(), view.as_bytes().len());
    let _ = (view.kind(), view.is_full(), view.dead_bytes());
    let _ = format!("{view:?}");
    assert!(view.free_space_bytes() <= view.node_size_bytes());
    assert!(view.reclaimable_space_bytes() >= view.free_space_bytes());
    let records_bytes = view.records_size_bytes();
    assert!(records_bytes <= view.node_size_bytes());
    let fences = view.fences();
    let prefix = view.prefix();
    assert_eq!(
        fences.prefix(),
        prefix,
        "fences and the node disagree on the prefix"
    );
    match (view.low_fence(), view.high_fence()) {
        (Some(low), Some(high)) => {
            if let (Some(l), Some(h)) = (low.key(), high.key()) {
                assert!(l < h, "fences out of order");
            }
        }
        (None, None) => {}
        other => panic!("only one fence: {other:?}"),
    }

    let mut previous: Option<Vec<u8>> = None;
    let mut key = Vec::new();
    let mut data_bytes = 0;
    for (i, r) in view.iter().enumerate() {
        let full = r.key();
        assert_eq!(r.prefix(), prefix);
        assert_eq!(&full[..prefix.len()], prefix);
        assert_eq!(&full[prefix.len()..], r.suffix());
        assert_eq!(r.key_len(), full.len());
        assert_eq!(r.suffix(), view.key_suffix(i));
        assert_eq!(r.value(), view.value(i));
        assert_eq!(r.record_type(), view.record_type(i));
        assert_eq!(r.ref_bit(), view.ref_bit(i));
        view.key_into(i, &mut key);
        assert_eq!(key, full);
        assert_eq!(r.cmp_key(&full), std::cmp::Ordering::Equal);
        assert!(
            view.covers(&full),
            "record {i} lies outside the node's fences"
        );
        assert_eq!(view.search(&full), Ok(i), "search for record {i}");
        if let Some(p) = &previous {
            assert!(p < &full, "records {} and {i} are not in order", i - 1);
            assert_eq!(r.cmp_key(p), std::cmp::Ordering::Greater);
        }
        data_bytes += 8 + r.suffix().len() + r.value().len();
        previous = Some(full);
    }
    assert_eq!(
        data_bytes, records_bytes,
        "records_size_bytes disagrees with the records"
    );
    assert_eq!(view.iter().len(), n);
    assert_eq!(view.iter().rev().count(), n);
    if n > 0 {
        assert_eq!(view.iter().nth(n - 1).map(|r| r.key()), previous);
        assert!(view.iter_from(n + 5).next().is_none());
        // A key just past the last record sorts after every record.
        let mut past = previous.clone().unwrap();
        past.push(0);
        assert_eq!(view.search(&past), Err(n));
    }
}

/// Re-enters a parsed node for writing, as the tree does with a leaf page it has read,
/// and checks that writes keep it valid.
fn check_writable(bytes: &[u8], probe: &[u8]) {
    let mut buf = bytes.to_vec();
    let before: Vec<(Vec<u8>, Vec<u8>)> = NodeRef::parse(&buf)
        .unwrap()
        .iter()
        .map(|r| (r.key(), r.value().to_vec()))
        .collect();
    let mut node = NodeMut::trusted(&mut buf);
    node.compact();
    let mut key = node.as_ref().prefix().to_vec();
    key.extend_from_slice(probe);
    // What the write did: inserted at an index, removed an existing key, or nothing.
    let outcome = match node.insert(&key, probe, RecordType::Insert) {
        Ok(i) => Some(Ok(i)),
        Err(WriteError::KeyExists(i)) => {
            node.remove(i);
            Some(Err(i))
        }
        Err(_) => None,
    };
    let view = NodeRef::parse(&buf).expect("a node stays valid after compact and a write");
    let after: Vec<(Vec<u8>, Vec<u8>)> =
        view.iter().map(|r| (r.key(), r.value().to_vec())).collect();
    let mut expected = before;
    match outcome {
        Some(Ok(i)) => {
            assert_eq!(view.search(&key), Ok(i));
            expected.insert(i, (key.clone(), probe.to_vec()));
        }
        Some(Err(i)) => {
            assert_eq!(expected[i].0, key, "KeyExists named the wrong index");
            expected.remove(i);
        }
        None => {}
    }
    assert_eq!(after, expected, "records after compact and a write");
    check_view(&view);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (bytes, probe): (Vec<u8>, Vec<u8>) = if mode & 1 == 0 {
        (rest.to_vec(), rest.iter().take(3).copied().collect())
    } else {
        let mut u = Unstructured::new(rest);
        let Ok(recipe) = Recipe::arbitrary(&mut u) else {
            return;
        };
        let Some(bytes) = build(&recipe) else {
            return;
        };
        let probe = recipe
            .records
            .first()
            .map(|r| r.0.clone())
            .unwrap_or_default();
        (bytes, probe)
    };
    if let Ok(view) = NodeRef::parse(&bytes) {
        check_view(&view);
        check_writable(&bytes, &probe);
    }
});
