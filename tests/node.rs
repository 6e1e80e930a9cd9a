//! Model-based and corruption tests of the shared node layout (`bfdb::tree::node`).
//!
//! The model is a sorted `Vec` of records plus the node's fences; the space a node needs
//! is computed here from the documented layout (16-byte node meta, 8-byte KV metas, key
//! suffixes and values, fence keys in full), not with the module's own arithmetic.

use std::cmp::Ordering;

use bfdb::tree::node::{
    Fence, Fences, NodeKind, NodeMut, NodeRef, RecordType, Upserted, WriteError, build_sorted,
    copy_into, split,
};
use proptest::prelude::*;

type Rec = (Vec<u8>, Vec<u8>, RecordType, bool);

const TYPES: [RecordType; 4] = [
    RecordType::Insert,
    RecordType::Cache,
    RecordType::Tombstone,
    RecordType::Phantom,
];

const PREFIXES: [&[u8]; 3] = [b"", b"user:", b"https://example.com/a/rather/long/path/"];

/// Every record of a node, full keys assembled.
fn contents(n: &NodeRef<'_>) -> Vec<Rec> {
    n.iter()
        .map(|r| (r.key(), r.value().to_vec(), r.record_type(), r.ref_bit()))
        .collect()
}

/// The fences of test case `mode` for prefix `p`, owned.
#[derive(Debug, Clone)]
enum OwnedFences {
    None,
    Prefix(Vec<u8>),
    Range(Option<Vec<u8>>, Option<Vec<u8>>),
}

impl OwnedFences {
    fn of_mode(mode: usize, p: &[u8]) -> OwnedFences {
        let with = |tail: &[u8]| [p, tail].concat();
        match mode {
            0 => OwnedFences::None,
            1 => OwnedFences::Prefix(p.to_vec()),
            2 => OwnedFences::Range(Some(with(b"b")), Some(with(b"q"))),
            3 => OwnedFences::Range(None, Some(with(b"q"))),
            4 => OwnedFences::Range(Some(with(b"b")), None),
            _ => OwnedFences::Range(None, None),
        }
    }

    fn borrow(&self) -> Fences<'_> {
        match self {
            OwnedFences::None => Fences::None,
            OwnedFences::Prefix(p) => Fences::Prefix(p),
            OwnedFences::Range(l, h) => Fences::Range {
                low: l.as_deref(),
                high: h.as_deref(),
            },
        }
    }

    /// The node prefix, computed independently of the module.
    fn prefix(&self) -> Vec<u8> {
        match self {
            OwnedFences::None => vec![],
            OwnedFences::Prefix(p) => p.clone(),
            OwnedFences::Range(Some(l), Some(h)) => {
                let mut n = 0;
                while n < l.len() && n < h.len() && l[n] == h[n] {
                    n += 1;
                }
                l[..n].to_vec()
            }
            OwnedFences::Range(..) => vec![],
        }
    }

    /// Node meta plus fence records: metas and key bytes.
    fn fixed_bytes(&self) -> usize {
        16 + match self {
            OwnedFences::None => 0,
            OwnedFences::Prefix(p) => 8 + p.len(),
            OwnedFences::Range(l, h) => {
                16 + l.as_ref().map_or(0, Vec::len) + h.as_ref().map_or(0, Vec::len)
            }
        }
    }

    fn covers(&self, key: &[u8]) -> bool {
        match self {
            OwnedFences::None => true,
            OwnedFences::Prefix(p) => key.len() >= p.len() && key[..p.len()] == p[..],
            OwnedFences::Range(l, h) => {
                l.as_ref().is_none_or(|l| key >= &l[..]) && h.as_ref().is_none_or(|h| key < &h[..])
            }
        }
    }
}

struct Model {
    size: usize,
    fences: OwnedFences,
    prefix_len: usize,
    recs: Vec<Rec>,
}

impl Model {
    fn record_bytes(&self, key_len: usize, value_len: usize) -> usize {
        8 + key_len - self.prefix_len + value_len
    }

    fn used_bytes(&self) -> usize {
        self.fences.fixed_bytes()
            + self
                .recs
                .iter()
                .map(|(k, v, ..)| self.record_bytes(k.len(), v.len()))
                .sum::<usize>()
    }

    fn search(&self, key: &[u8]) -> Result<usize, usize> {
        self.recs.binary_search_by(|r| r.0.as_slice().cmp(key))
    }
}

/// Checks a node against the model, including its accounting and a full re-parse.
fn check(node: &NodeRef<'_>, m: &Model) {
    assert_eq!(contents(node), m.recs);
    assert_eq!(node.len(), m.recs.len());
    assert_eq!(node.prefix(), m.fences.prefix().as_slice());
    assert_eq!(
        node.free_space_bytes() + node.dead_bytes(),
        m.size - m.used_bytes(),
        "free + dead bytes disagree with the model"
    );
    assert_eq!(
        node.records_size_bytes(),
        m.used_bytes() - m.fences.fixed_bytes()
    );
    let reparsed = NodeRef::parse(node.as_bytes()).expect("node bytes must parse");
    assert_eq!(contents(&reparsed), m.recs);
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u8>, Vec<u8>, RecordType),
    Upsert(Vec<u8>, Vec<u8>, RecordType),
    Remove(usize),
    SetType(usize, RecordType),
    SetRef(usize, bool),
    ClearRefs,
    Compact,
    SetFull(bool),
    Probe(Vec<u8>),
}

/// A key tail: bytes chosen to collide in their first two positions often (look-ahead
/// ties), to fall on both sides of the fences "b" and "q", and to include 0x00 and 0xff.
fn tail() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop::sample::select(vec![0u8, 1, b'a', b'b', b'b', b'c', b'c', b'q', 0xff]);
    prop::collection::vec(byte, 0..6)
}

/// A key: usually the case's prefix plus a tail (marked by `true`), sometimes any bytes.
fn key() -> impl Strategy<Value = (bool, Vec<u8>)> {
    prop_oneof![
        9 => tail().prop_map(|t| (true, t)),
        1 => prop::collection::vec(any::<u8>(), 0..4).prop_map(|k| (false, k)),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 0..24),
        1 => prop::collection::vec(any::<u8>(), 100..700),
    ]
}

fn rtype() -> impl Strategy<Value = RecordType> {
    prop::sample::select(TYPES.to_vec())
}

/// An operation whose key still lacks the case's prefix: selector, key, value, type,
/// record index seed, flag.
type RawOp = (u8, (bool, Vec<u8>), Vec<u8>, RecordType, usize, bool);

/// Operations whose keys still lack the case's prefix; `resolve` adds it.
fn op() -> impl Strategy<Value = RawOp> {
    (
        0u8..20,
        key(),
        value(),
        rtype(),
        any::<usize>(),
        any::<bool>(),
    )
}

fn resolve(raw: RawOp, p: &[u8]) -> Op {
    let (which, (prefixed, k), v, t, n, b) = raw;
    let k = if prefixed { [p, &k].concat() } else { k };
    match which {
        0..=6 => Op::Insert(k, v, t),
        7..=11 => Op::Upsert(k, v, t),
        12..=13 => Op::Remove(n),
        14 => Op::SetType(n, t),
        15 => Op::SetRef(n, b),
        16 => Op::ClearRefs,
        17 => Op::Compact,
        18 => Op::SetFull(b),
        _ => Op::Probe(k),
    }
}

fn node_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 64usize..=4080,
        1 => Just(64usize),
        1 => Just(4080usize),
        1 => Just(32 * 1024usize),
    ]
}

fn expected_insert(m: &Model, k: &[u8], v: &[u8]) -> Result<usize, WriteError> {
    if !m.fences.covers(k) {
        return Err(WriteError::OutOfRange);
    }
    match m.search(k) {
        Ok(i) => Err(WriteError::KeyExists(i)),
        Err(i) if m.used_bytes() + m.record_bytes(k.len(), v.len()) <= m.size => Ok(i),
        Err(_) => Err(WriteError::Full),
    }
}

fn expected_upsert(m: &Model, k: &[u8], v: &[u8]) -> Result<Upserted, WriteError> {
    if !m.fences.covers(k) {
        return Err(WriteError::OutOfRange);
    }
    match m.search(k) {
        Ok(i) => {
            let old = m.recs[i].1.len();
            let after = m.used_bytes() - old + v.len();
            if v.len() <= old || after <= m.size {
                Ok(Upserted::Updated(i))
            } else {
                Err(WriteError::Full)
            }
        }
        Err(i) if m.used_bytes() + m.record_bytes(k.len(), v.len()) <= m.size => {
            Ok(Upserted::Inserted(i))
        }
        Err(_) => Err(WriteError::Full),
    }
}

fn run_ops(size: usize, mode: usize, p: &[u8], ops: Vec<Op>) {
    let fences = OwnedFences::of_mode(mode, p);
    let mut buf = vec![0x5au8; size];
    let init = NodeMut::init(&mut buf, NodeKind::Mini, fences.borrow());
    if fences.fixed_bytes() > size {
        assert!(
            init.is_err(),
            "fences of {} bytes cannot fit",
            fences.fixed_bytes()
        );
        return;
    }
    let mut node = init.expect("fences fit");
    let mut m = Model {
        size,
        prefix_len: fences.prefix().len(),
        fences,
        recs: vec![],
    };
    check(&node.as_ref(), &m);
    for op in ops {
        match op {
            Op::Insert(k, v, t) => {
                let want = expected_insert(&m, &k, &v);
                assert_eq!(node.insert(&k, &v, t), want, "insert {k:?}");
                if let Ok(i) = want {
                    m.recs.insert(i, (k, v, t, false));
                }
            }
            Op::Upsert(k, v, t) => {
                let want = expected_upsert(&m, &k, &v);
                assert_eq!(node.upsert(&k, &v, t), want, "upsert {k:?}");
                match want {
                    Ok(Upserted::Inserted(i)) => m.recs.insert(i, (k, v, t, false)),
                    Ok(Upserted::Updated(i)) => {
                        m.recs[i].1 = v;
                        m.recs[i].2 = t;
                    }
                    Err(_) => {}
                }
            }
            Op::Remove(n) if !m.recs.is_empty() => {
                let i = n % m.recs.len();
                node.remove(i);
                m.recs.remove(i);
            }
            Op::SetType(n, t) if !m.recs.is_empty() => {
                let i = n % m.recs.len();
                node.set_record_type(i, t);
                m.recs[i].2 = t;
            }
            Op::SetRef(n, b) if !m.recs.is_empty() => {
                let i = n % m.recs.len();
                node.set_ref_bit(i, b);
                m.recs[i].3 = b;
            }
            Op::ClearRefs => {
                node.clear_ref_bits();
                m.recs.iter_mut().for_each(|r| r.3 = false);
            }
            Op::Compact => {
                node.compact();
                assert_eq!(node.as_ref().dead_bytes(), 0);
                assert_eq!(node.as_ref().free_space_bytes(), size - m.used_bytes());
            }
            Op::SetFull(b) => {
                node.set_full_flag(b);
                assert_eq!(node.as_ref().is_full(), b);
            }
            Op::Probe(k) => {
                assert_eq!(node.as_ref().search(&k), m.search(&k), "search {k:?}");
            }
            Op::Remove(_) | Op::SetType(..) | Op::SetRef(..) => {}
        }
        check(&node.as_ref(), &m);
    }
    // Every stored key is found where the model has it.
    let view = node.as_ref();
    for (i, r) in m.recs.iter().enumerate() {
        assert_eq!(view.search(&r.0), Ok(i));
    }
    assert_eq!(view.fences(), m.fences.borrow());
    // The bytes round-trip through parse on their own.
    let copy = buf.clone();
    let back = NodeRef::parse(&copy).expect("round trip");
    assert_eq!(contents(&back), m.recs);
    assert_eq!(back.kind(), NodeKind::Mini);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn random_ops_match_model(
        size in node_size(),
        mode in 0usize..6,
        p in 0usize..PREFIXES.len(),
        raw in prop::collection::vec(op(), 1..160),
    ) {
        let p = PREFIXES[p];
        let ops = raw.into_iter().map(|r| resolve(r, p)).collect();
        run_ops(size, mode, p, ops);
    }
}

#[test]
fn look_ahead_ties_sort_and_search_correctly() {
    let keys: Vec<&[u8]> = vec![
        b"ab",
        b"ab\0",
        b"ab\0\0",
        b"abc",
        b"a",
        b"",
        b"\0",
        b"\0\0",
        b"\xff",
        b"\xff\xff",
        b"\xff\xff\xff",
        b"a\0",
        b"a\xff",
        b"b",
    ];
    for mode in [0usize, 1, 5] {
        let fences = OwnedFences::of_mode(mode, b"");
        // Insert in several orders; the result must be sorted the same way each time.
        for rotate in 0..keys.len() {
            let mut buf = vec![0u8; 512];
            let mut node = NodeMut::init(&mut buf, NodeKind::Leaf, fences.borrow()).unwrap();
            let mut order = keys.clone();
            order.rotate_left(rotate);
            if rotate % 2 == 1 {
                order.reverse();
            }
            for k in &order {
                node.insert(k, k, RecordType::Insert).unwrap();
            }
            let mut sorted = keys.clone();
            sorted.sort();
            let got: Vec<Vec<u8>> = node.as_ref().iter().map(|r| r.key()).collect();
            assert_eq!(got, sorted);
            for (i, k) in sorted.iter().enumerate() {
                assert_eq!(node.as_ref().search(k), Ok(i), "{k:?}");
                assert_eq!(node.as_ref().value(i), *k);
            }
            // Absent keys between the tied ones land between them.
            for probe in [&b"ab\0\x01"[..], b"a\0\0", b"\0\x01", b"\xff\0", b"ab\x01"] {
                let want = sorted.binary_search(&probe);
                assert_eq!(node.as_ref().search(probe), want, "{probe:?}");
            }
            NodeRef::parse(&buf).unwrap();
        }
    }
}

#[test]
fn long_shared_prefix_is_stored_once() {
    let p = b"https://example.com/a/rather/long/path/";
    let low = [&p[..], b"a"].concat();
    let high = [&p[..], b"z"].concat();
    let mut buf = vec![0u8; 4080];
    let mut node = NodeMut::init(
        &mut buf,
        NodeKind::Leaf,
        Fences::Range {
            low: Some(&low),
            high: Some(&high),
        },
    )
    .unwrap();
    assert_eq!(node.as_ref().prefix(), &p[..]);
    let before = node.as_ref().free_space_bytes();
    let key = [&p[..], b"mm"].concat();
    assert_eq!(node.as_ref().space_needed(key.len(), 3), 8 + 2 + 3);
    node.insert(&key, b"val", RecordType::Insert).unwrap();
    // Only the two-byte suffix and the value were stored, plus one KV meta.
    assert_eq!(before - node.as_ref().free_space_bytes(), 8 + 2 + 3);
    assert_eq!(node.as_ref().key_suffix(0), b"mm");
    let mut out = vec![1, 2, 3];
    node.as_ref().key_into(0, &mut out);
    assert_eq!(out, key);
    // Keys outside the prefix are refused and searched as all-less / all-greater.
    assert_eq!(
        node.insert(b"https://example.com/", b"", RecordType::Insert),
        Err(WriteError::OutOfRange)
    );
    assert_eq!(node.as_ref().search(b"http"), Err(0));
    assert_eq!(
        node.as_ref().search(b"https://example.com/a/rathez"),
        Err(1)
    );
    assert_eq!(node.as_ref().search(b"a"), Err(0));
    assert_eq!(node.as_ref().search(b"zzz"), Err(1));
    // Keys under the prefix but outside the fences are refused too.
    let below = [&p[..], b"0"].concat();
    let at_high = high.clone();
    assert_eq!(
        node.insert(&below, b"", RecordType::Insert),
        Err(WriteError::OutOfRange)
    );
    assert_eq!(
        node.upsert(&at_high, b"", RecordType::Insert),
        Err(WriteError::OutOfRange)
    );
    assert_eq!(node.insert(&low, b"", RecordType::Insert), Ok(0));
}

#[test]
fn unbounded_fences_are_reported() {
    let mut buf = vec![0u8; 256];
    let node = NodeMut::init(
        &mut buf,
        NodeKind::Inner,
        Fences::Range {
            low: None,
            high: Some(b"m"),
        },
    )
    .unwrap();
    let r = node.as_ref();
    assert_eq!(r.low_fence(), Some(Fence::Unbounded));
    assert_eq!(r.high_fence(), Some(Fence::Key(b"m")));
    assert_eq!(r.kind(), NodeKind::Inner);
    assert!(r.prefix().is_empty());
    let mut buf = vec![0u8; 256];
    let node = NodeMut::init(&mut buf, NodeKind::Mini, Fences::Prefix(b"pre")).unwrap();
    assert_eq!(node.as_ref().low_fence(), None);
    assert_eq!(node.as_ref().prefix(), b"pre");
}

#[test]
fn init_rejects_bad_arguments() {
    let mut small = vec![0u8; 15];
    assert!(NodeMut::init(&mut small, NodeKind::Mini, Fences::None).is_err());
    let mut big = vec![0u8; 32 * 1024 + 1];
    assert!(NodeMut::init(&mut big, NodeKind::Mini, Fences::None).is_err());
    let mut buf = vec![0u8; 64];
    let inverted = Fences::Range {
        low: Some(b"b"),
        high: Some(b"a"),
    };
    assert!(NodeMut::init(&mut buf, NodeKind::Leaf, inverted).is_err());
    let empty = Fences::Range {
        low: Some(b"a"),
        high: Some(b"a"),
    };
    assert!(NodeMut::init(&mut buf, NodeKind::Leaf, empty).is_err());
    // 16 + 8 + 41 bytes do not fit 64.
    assert!(NodeMut::init(&mut buf, NodeKind::Mini, Fences::Prefix(&[7; 41])).is_err());
    // 16 + 8 + 40 fit exactly, leaving no free space.
    let node = NodeMut::init(&mut buf, NodeKind::Mini, Fences::Prefix(&[7; 40])).unwrap();
    assert_eq!(node.as_ref().free_space_bytes(), 0);
    // A 16-byte node is legal and holds nothing.
    let mut tiny = vec![0u8; 16];
    let mut node = NodeMut::init(&mut tiny, NodeKind::Mini, Fences::None).unwrap();
    assert_eq!(
        node.insert(b"", b"", RecordType::Insert),
        Err(WriteError::Full)
    );
}

#[test]
fn too_large_keys_and_values_are_refused_in_big_nodes() {
    let mut buf = vec![0u8; 32 * 1024];
    let mut node = NodeMut::init(&mut buf, NodeKind::Leaf, Fences::None).unwrap();
    let big = vec![1u8; 16 * 1024];
    // Stored keys have 13 bits of length, values 14.
    let long = vec![1u8; 8 * 1024];
    assert_eq!(
        node.insert(&long, b"", RecordType::Insert),
        Err(WriteError::TooLarge)
    );
    assert_eq!(
        node.insert(b"k", &big, RecordType::Insert),
        Err(WriteError::TooLarge)
    );
    let max = vec![1u8; 16 * 1024 - 1];
    assert_eq!(node.insert(b"k", &max, RecordType::Insert), Ok(0));
    // 32752 usable bytes - (8 + 1 + 16383) = 16360 left: exactly one more such record.
    let long_key = vec![b'z'; 8191];
    assert_eq!(
        node.insert(&long_key, &[0; 8161], RecordType::Insert),
        Ok(1)
    );
    assert_eq!(node.as_ref().free_space_bytes(), 0);
    NodeRef::parse(&buf).unwrap();
}

#[test]
fn insert_compacts_when_dead_bytes_make_room() {
    let mut buf = vec![0u8; 64];
    let mut node = NodeMut::init(&mut buf, NodeKind::Mini, Fences::None).unwrap();
    // 48 bytes available: two records of 8 + 1 + 15 = 24 bytes fill it.
    node.insert(b"a", &[1; 15], RecordType::Insert).unwrap();
    node.insert(b"b", &[2; 15], RecordType::Insert).unwrap();
    assert_eq!(node.as_ref().free_space_bytes(), 0);
    // Removing the older record ("a", not at the data boundary) leaves dead bytes.
    node.remove(0);
    assert_eq!(node.as_ref().dead_bytes(), 16);
    assert_eq!(node.as_ref().free_space_bytes(), 8);
    node.insert(b"c", &[3; 15], RecordType::Cache).unwrap();
    assert_eq!(node.as_ref().dead_bytes(), 0);
    assert_eq!(
        contents(&node.as_ref())[1],
        (b"c".to_vec(), vec![3; 15], RecordType::Cache, false)
    );
    assert_eq!(
        node.insert(b"d", b"", RecordType::Insert),
        Err(WriteError::Full)
    );
    // A shorter upsert value is written in place; the slack becomes dead.
    assert_eq!(
        node.upsert(b"b", &[9; 5], RecordType::Tombstone),
        Ok(Upserted::Updated(0))
    );
    assert_eq!(node.as_ref().dead_bytes(), 10);
    // A longer one must move; it fits only because the old slot is reclaimed.
    assert_eq!(
        node.upsert(b"b", &[8; 15], RecordType::Insert),
        Ok(Upserted::Updated(0))
    );
    assert_eq!(node.as_ref().value(0), &[8; 15]);
    assert_eq!(
        node.upsert(b"b", &[8; 16], RecordType::Insert),
        Err(WriteError::Full)
    );
    assert_eq!(
        node.as_ref().value(0),
        &[8; 15],
        "a refused upsert changes nothing"
    );
    NodeRef::parse(&buf).unwrap();
}

#[test]
fn value_mut_and_set_kind() {
    let mut buf = vec![0u8; 128];
    let mut node = NodeMut::init(&mut buf, NodeKind::Inner, Fences::None).unwrap();
    node.insert(b"k", &7u64.to_le_bytes(), RecordType::Insert)
        .unwrap();
    node.value_mut(0).copy_from_slice(&9u64.to_le_bytes());
    node.set_kind(NodeKind::Leaf);
    node.insert(b"j", &[1; 8], RecordType::Insert).unwrap();
    node.remove(0);
    assert_eq!(node.len(), 1);
    let r = NodeRef::parse(&buf).unwrap();
    assert_eq!(r.value(0), 9u64.to_le_bytes());
    assert_eq!(r.kind(), NodeKind::Leaf);
    let mut node = NodeMut::trusted(&mut buf);
    node.clear();
    assert!(node.is_empty());
    assert_eq!(node.as_ref().free_space_bytes(), 128 - 16);
    assert_eq!(node.as_ref().dead_bytes(), 0);
}

#[test]
fn iterator_is_double_ended_and_exact() {
    let mut buf = vec![0u8; 512];
    let keys: Vec<Vec<u8>> = (0u8..10).map(|i| vec![b'k', i]).collect();
    let node = build_sorted(
        &mut buf,
        NodeKind::Leaf,
        Fences::None,
        keys.iter().map(|k| (k, k, RecordType::Insert)),
    )
    .unwrap();
    let r = node.as_ref();
    assert_eq!(r.iter().len(), 10);
    let back: Vec<Vec<u8>> = r.iter().rev().map(|x| x.key()).collect();
    let mut want = keys.clone();
    want.reverse();
    assert_eq!(back, want);
    assert_eq!(r.iter().nth(3).unwrap().key(), keys[3]);
    assert_eq!(
        r.iter_from(8).map(|x| x.key()).collect::<Vec<_>>(),
        keys[8..]
    );
    assert_eq!(r.iter_from(99).count(), 0);
    assert_eq!(r.iter().next().unwrap().cmp_key(&keys[0]), Ordering::Equal);
}

// ---------------------------------------------------------------------------------------
// Bulk helpers
// ---------------------------------------------------------------------------------------

fn sorted_records() -> impl Strategy<Value = Vec<Rec>> {
    prop::collection::btree_map(tail(), (value(), rtype(), any::<bool>()), 2..60).prop_map(|m| {
        m.into_iter()
            .map(|(k, (v, t, r))| {
                let mut v = v;
                v.truncate(40);
                (k, v, t, r)
            })
            .collect()
    })
}

/// Builds a 32 KiB node over `recs` (keys prefixed with `p`) with fences of `mode`;
/// records outside the fences are dropped from `recs`.
fn build(mode: usize, p: &[u8], recs: &mut Vec<Rec>, buf: &mut [u8]) -> OwnedFences {
    let fences = OwnedFences::of_mode(mode, p);
    for r in recs.iter_mut() {
        r.0 = [p, &r.0].concat();
    }
    recs.retain(|r| fences.covers(&r.0));
    let mut node = build_sorted(
        buf,
        NodeKind::Leaf,
        fences.borrow(),
        recs.iter().map(|r| (&r.0, &r.1, r.2)),
    )
    .unwrap();
    for (i, r) in recs.iter().enumerate() {
        node.set_ref_bit(i, r.3);
    }
    fences
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn copy_into_keeps_filtered_records(
        mode in 0usize..6,
        p in 0usize..PREFIXES.len(),
        mut recs in sorted_records(),
    ) {
        let p = PREFIXES[p];
        let mut src_buf = vec![0u8; 32 * 1024];
        let fences = build(mode, p, &mut recs, &mut src_buf);
        let src = NodeRef::parse(&src_buf).unwrap();
        prop_assert_eq!(contents(&src), recs.clone());

        // Growth: everything, same fences, into a node of the size it needs.
        let used: usize = fences.fixed_bytes()
            + recs.iter().map(|r| 8 + r.0.len() - fences.prefix().len() + r.1.len()).sum::<usize>();
        let mut exact = vec![0u8; used];
        let grown = copy_into(&src, &mut exact, src.fences(), |_| true).unwrap();
        prop_assert_eq!(contents(&grown.as_ref()), recs.clone());
        prop_assert_eq!(grown.as_ref().free_space_bytes(), 0);
        prop_assert_eq!(grown.as_ref().kind(), NodeKind::Leaf);
        NodeRef::parse(&exact).unwrap();
        // One byte less cannot hold them.
        if !recs.is_empty() {
            let mut short = vec![0u8; used - 1];
            prop_assert_eq!(
                copy_into(&src, &mut short, src.fences(), |_| true).err(),
                Some(WriteError::Full)
            );
        }

        // Copy-on-access: only records with the reference bit set survive.
        let mut hot_buf = vec![0u8; 32 * 1024];
        let hot = copy_into(&src, &mut hot_buf, src.fences(), |r| r.ref_bit()).unwrap();
        let want: Vec<Rec> = recs.iter().filter(|r| r.3).cloned().collect();
        prop_assert_eq!(contents(&hot.as_ref()), want);

        // Into no fences at all (a minimal mini-page) and back under the prefix.
        let mut bare = vec![0u8; 32 * 1024];
        let b = copy_into(&src, &mut bare, Fences::None, |_| true).unwrap();
        prop_assert_eq!(contents(&b.as_ref()), recs.clone());
        prop_assert!(b.as_ref().prefix().is_empty());
    }

    #[test]
    fn split_halves_cover_the_node(
        mode in 0usize..6,
        p in 0usize..PREFIXES.len(),
        mut recs in sorted_records(),
    ) {
        let p = PREFIXES[p];
        let mut src_buf = vec![0u8; 32 * 1024];
        let fences = build(mode, p, &mut recs, &mut src_buf);
        prop_assume!(recs.len() >= 2);
        let src = NodeRef::parse(&src_buf).unwrap();
        let mut left_buf = vec![0u8; 32 * 1024];
        let mut right_buf = vec![0u8; 32 * 1024];
        let sep = split(&src, &mut left_buf, &mut right_buf).unwrap();
        let left = NodeRef::parse(&left_buf).unwrap();
        let right = NodeRef::parse(&right_buf).unwrap();
        let (l, r) = (contents(&left), contents(&right));
        prop_assert!(!l.is_empty() && !r.is_empty());
        prop_assert_eq!(&r[0].0, &sep, "separator is the right half's first key");
        prop_assert!(l.iter().all(|x| x.0 < sep));
        prop_assert!(r.iter().all(|x| x.0 >= sep));
        prop_assert_eq!([l.clone(), r.clone()].concat(), recs.clone());
        // Roughly half the bytes each: neither side exceeds half plus one record.
        // Bytes as the source stores them: meta, key suffix, value.
        let plen = src.prefix().len();
        let one = |x: &Rec| 8 + x.0.len() - plen + x.1.len();
        let cost = |v: &[Rec]| v.iter().map(one).sum::<usize>();
        let biggest = recs.iter().map(one).max().unwrap();
        prop_assert!(cost(&l) <= cost(&recs) / 2 + biggest);
        prop_assert!(cost(&r) <= cost(&recs) / 2 + biggest);
        match fences {
            OwnedFences::Range(low, high) => {
                fn fence(k: &Option<Vec<u8>>) -> Fence<'_> {
                    k.as_deref().map_or(Fence::Unbounded, Fence::Key)
                }
                prop_assert_eq!(left.low_fence(), Some(fence(&low)));
                prop_assert_eq!(left.high_fence(), Some(Fence::Key(&sep)));
                prop_assert_eq!(right.low_fence(), Some(Fence::Key(&sep)));
                prop_assert_eq!(right.high_fence(), Some(fence(&high)));
                // Each half's prefix is the common prefix of its own fences.
                let lf = OwnedFences::Range(low.clone(), Some(sep.clone()));
                let rf = OwnedFences::Range(Some(sep.clone()), high.clone());
                let (lp, rp) = (lf.prefix(), rf.prefix());
                prop_assert_eq!(left.prefix(), lp.as_slice());
                prop_assert_eq!(right.prefix(), rp.as_slice());
                // The halves refuse keys of the other side.
                let mut l2 = left_buf.clone();
                let mut lm = NodeMut::trusted(&mut l2);
                prop_assert_eq!(lm.insert(&sep, b"", RecordType::Insert), Err(WriteError::OutOfRange));
            }
            other => {
                prop_assert_eq!(left.fences(), other.borrow());
                prop_assert_eq!(right.fences(), other.borrow());
            }
        }
    }
}

#[test]
fn build_sorted_reports_full() {
    let mut buf = vec![0u8; 64];
    let recs = (0u8..10).map(|i| ([i], [0u8; 4], RecordType::Insert));
    // Each record takes 8 + 1 + 4 = 13 bytes; 48 free bytes hold three.
    assert_eq!(
        build_sorted(&mut buf, NodeKind::Mini, Fences::None, recs).err(),
        Some(WriteError::Full)
    );
    let recs = (0u8..3).map(|i| ([i], [0u8; 4], RecordType::Insert));
    let node = build_sorted(&mut buf, NodeKind::Mini, Fences::None, recs).unwrap();
    assert_eq!(node.as_ref().free_space_bytes(), 48 - 39);
}

#[test]
#[should_panic(expected = "strictly increasing")]
fn build_sorted_panics_on_unsorted_input() {
    let mut buf = vec![0u8; 256];
    let recs = [
        (b"b", b"", RecordType::Insert),
        (b"a", b"", RecordType::Insert),
    ];
    let _ = build_sorted(&mut buf, NodeKind::Mini, Fences::None, recs);
}

#[test]
fn mini_page_grows_by_doubling() {
    // The path a mini-page takes: 64 bytes, full, copy into twice the size, continue.
    let mut size = 64;
    let mut buf = vec![0u8; size];
    NodeMut::init(&mut buf, NodeKind::Mini, Fences::Prefix(b"t:")).unwrap();
    let mut model = Vec::new();
    for i in 0u16..300 {
        let key = [&b"t:"[..], &(i.wrapping_mul(7919) % 1000).to_be_bytes()].concat();
        loop {
            let mut node = NodeMut::trusted(&mut buf);
            match node.upsert(&key, &i.to_le_bytes(), RecordType::Insert) {
                Ok(_) => break,
                Err(WriteError::Full) => {
                    let mut bigger = vec![0u8; size * 2];
                    let src = NodeRef::trusted(&buf);
                    copy_into(&src, &mut bigger, src.fences(), |_| true).unwrap();
                    size *= 2;
                    buf = bigger;
                }
                Err(e) => panic!("{e}"),
            }
        }
        match model.binary_search_by(|(k, _): &(Vec<u8>, u16)| k.cmp(&key)) {
            Ok(j) => model[j].1 = i,
            Err(j) => model.insert(j, (key, i)),
        }
    }
    let node = NodeRef::parse(&buf).unwrap();
    assert!(size <= 8192, "grew to {size}");
    let got: Vec<(Vec<u8>, u16)> = node
        .iter()
        .map(|r| (r.key(), u16::from_le_bytes([r.value()[0], r.value()[1]])))
        .collect();
    assert_eq!(got, model);
}

// ---------------------------------------------------------------------------------------
// Corruption
// ---------------------------------------------------------------------------------------

/// A compact leaf node with fences and a prefix, and a few records.
fn sample_node() -> Vec<u8> {
    let mut buf = vec![0u8; 4080];
    let mut node = NodeMut::init(
        &mut buf,
        NodeKind::Leaf,
        Fences::Range {
            low: Some(b"key:a"),
            high: Some(b"key:z"),
        },
    )
    .unwrap();
    for (i, k) in [&b"key:b"[..], b"key:bb", b"key:c\0", b"key:cd", b"key:m"]
        .iter()
        .enumerate()
    {
        node.insert(k, &[i as u8; 6], TYPES[i % 4]).unwrap();
    }
    buf
}

fn meta_at(m: usize) -> usize {
    16 + 8 * m
}

fn read_meta(buf: &[u8], m: usize) -> u64 {
    u64::from_le_bytes(buf[meta_at(m)..meta_at(m) + 8].try_into().unwrap())
}

fn write_meta(buf: &mut [u8], m: usize, v: u64) {
    buf[meta_at(m)..meta_at(m) + 8].copy_from_slice(&v.to_le_bytes());
}

/// Reads every part of a parsed node, and writes to a copy; none of it may panic.
fn exercise(buf: &[u8]) {
    let Ok(node) = NodeRef::parse(buf) else {
        return;
    };
    let mut key = Vec::new();
    let _ = (
        node.kind(),
        node.free_space_bytes(),
        node.dead_bytes(),
        node.is_full(),
    );
    let _ = (
        node.prefix(),
        node.low_fence(),
        node.high_fence(),
        node.fences(),
    );
    for (i, r) in node.iter().enumerate() {
        r.key_into(&mut key);
        assert_eq!(
            node.search(&key),
            Ok(i),
            "a parsed node must find its own keys"
        );
        let _ = (
            node.value(i),
            node.key_suffix(i),
            node.record_type(i),
            node.ref_bit(i),
        );
    }
    for probe in [&b""[..], b"key:", b"key:c", b"\xff\xff"] {
        let _ = node.search(probe);
    }
    let mut copy = buf.to_vec();
    let mut m = NodeMut::trusted(&mut copy);
    let _ = m.upsert(b"key:q", b"v", RecordType::Insert);
    if !m.is_empty() {
        m.remove(0);
    }
    m.compact();
    NodeRef::parse(&copy).expect("writes keep a parsed node valid");
}

#[test]
fn sample_node_is_valid() {
    let buf = sample_node();
    let node = NodeRef::parse(&buf).unwrap();
    assert_eq!(node.len(), 5);
    assert_eq!(node.prefix(), b"key:");
    exercise(&buf);
}

#[test]
fn targeted_corruptions_are_rejected() {
    let good = sample_node();
    let count = 7; // two fences and five records
    let mut cases: Vec<(&str, Vec<u8>)> = vec![];
    let mut b = good.clone();
    b[0] ^= 1;
    cases.push(("node size", b));
    let mut b = good.clone();
    b[2] = 3;
    cases.push(("kind", b));
    let mut b = good.clone();
    b[3] |= 1 << 5;
    cases.push(("unknown flag", b));
    let mut b = good.clone();
    b[3] |= 1 << 2;
    cases.push(("both fence flags", b));
    let mut b = good.clone();
    b[3] &= !(1 << 1);
    cases.push(("fence flag cleared", b));
    let mut b = good.clone();
    b[4..6].copy_from_slice(&u16::MAX.to_le_bytes());
    cases.push(("count huge", b));
    let mut b = good.clone();
    b[4..6].copy_from_slice(&1u16.to_le_bytes());
    cases.push(("count below fences", b));
    let mut b = good.clone();
    b[6..8].copy_from_slice(&20u16.to_le_bytes());
    cases.push(("data start inside metas", b));
    let mut b = good.clone();
    b[6..8].copy_from_slice(&5000u16.to_le_bytes());
    cases.push(("data start past end", b));
    let mut b = good.clone();
    b[8] += 1;
    cases.push(("prefix length", b));
    let mut b = good.clone();
    b[10] = 1;
    cases.push(("dead bytes", b));
    let mut b = good.clone();
    b[13] = 1;
    cases.push(("reserved", b));
    for m in 0..count {
        let v = read_meta(&good, m);
        let mut b = good.clone();
        write_meta(&mut b, m, v + (1 << 16));
        cases.push(("key length bumped", b));
        let mut b = good.clone();
        write_meta(&mut b, m, v + (1 << 30));
        cases.push(("value length bumped", b));
        let mut b = good.clone();
        write_meta(&mut b, m, (v & !0xffff) | 4080);
        cases.push(("offset at the end", b));
        let mut b = good.clone();
        write_meta(&mut b, m, (v & !0xffff) | 30);
        cases.push(("offset inside metas", b));
        let mut b = good.clone();
        write_meta(&mut b, m, v ^ (1 << 48));
        cases.push(("look-ahead", b));
        let mut b = good.clone();
        write_meta(&mut b, m, v ^ (1 << 46));
        cases.push(("fence flag", b));
    }
    // Overlapping records: two metas pointing at the same bytes.
    let mut b = good.clone();
    let (m3, m4) = (read_meta(&good, 3), read_meta(&good, 4));
    write_meta(&mut b, 4, (m4 & !0xffff) | (m3 & 0xffff));
    cases.push(("overlap", b));
    // Unsorted: swap two records' metas.
    let mut b = good.clone();
    write_meta(&mut b, 3, m4);
    write_meta(&mut b, 4, m3);
    cases.push(("unsorted", b));
    // Fence roles swapped (high fence first).
    let mut b = good.clone();
    let (f0, f1) = (read_meta(&good, 0), read_meta(&good, 1));
    write_meta(&mut b, 0, f1);
    write_meta(&mut b, 1, f0);
    cases.push(("fences swapped", b));
    // A low fence marked unbounded while it still stores a key.
    let mut b = good.clone();
    write_meta(&mut b, 0, f0 | (1 << 47));
    cases.push(("unbounded with key", b));
    // A record moved below the low fence: "key:b" -> "key:!" (look-ahead kept right).
    let mut b = good.clone();
    let r0 = read_meta(&good, 2);
    let off = (r0 & 0xffff) as usize;
    b[off] = b'!';
    write_meta(
        &mut b,
        2,
        (r0 & !(0xffff << 48)) | (u64::from(u16::from_be_bytes([b'!', 0])) << 48),
    );
    cases.push(("below low fence", b));
    // The last record at the high fence: "key:m" -> "key:z".
    let mut b = good.clone();
    let r4 = read_meta(&good, 6);
    let off = (r4 & 0xffff) as usize;
    b[off] = b'z';
    write_meta(
        &mut b,
        6,
        (r4 & !(0xffff << 48)) | (u64::from(u16::from_be_bytes([b'z', 0])) << 48),
    );
    cases.push(("at high fence", b));
    // Truncated and extended buffers.
    cases.push(("truncated", good[..4000].to_vec()));
    cases.push(("too short", good[..10].to_vec()));

    for (what, bytes) in &cases {
        let r = NodeRef::parse(bytes);
        assert!(r.is_err(), "{what}: corrupted node parsed");
        // The error explains itself.
        assert!(!r.unwrap_err().to_string().is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..700), fix in any::<bool>()) {
        if fix && bytes.len() >= 16 {
            // Make the size field right so parsing gets past the first check.
            let n = bytes.len() as u16;
            bytes[0..2].copy_from_slice(&n.to_le_bytes());
            bytes[12..16].fill(0);
        }
        exercise(&bytes);
    }

    #[test]
    fn flipped_bytes_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        header_only in any::<bool>(),
    ) {
        let mut buf = sample_node();
        // Aim half of the cases at the header and metas, where flips matter most.
        let span = if header_only { 16 + 8 * 7 } else { buf.len() };
        for (at, x) in flips {
            let i = at.index(span);
            buf[i] ^= x.max(1);
        }
        exercise(&buf);
    }
}

/// The out-of-line flag (bit 29 of a KV meta) travels with the record type, survives a
/// parse, and is refused where no value can be out of line: on a tombstone, on a fence
/// record and in an inner node.
#[test]
fn external_record_types_round_trip_and_are_refused_where_they_mean_nothing() {
    let set_ext_bit = |buf: &mut [u8], meta: usize| {
        let at = 16 + 8 * meta;
        let m = u64::from_le_bytes(buf[at..at + 8].try_into().unwrap()) | (1 << 29);
        buf[at..at + 8].copy_from_slice(&m.to_le_bytes());
    };
    let mut buf = vec![0u8; 256];
    let fences = Fences::Range {
        low: Some(b"a"),
        high: Some(b"z"),
    };
    let mut node = NodeMut::init(&mut buf, NodeKind::Leaf, fences).unwrap();
    node.insert(b"b", &[7; 24], RecordType::InsertExternal)
        .unwrap();
    node.insert(b"c", b"inline", RecordType::Insert).unwrap();
    node.insert(b"d", &[8; 24], RecordType::CacheExternal)
        .unwrap();
    let view = NodeRef::parse(&buf).unwrap();
    let types: Vec<RecordType> = view.iter().map(|r| r.record_type()).collect();
    assert_eq!(
        types,
        [
            RecordType::InsertExternal,
            RecordType::Insert,
            RecordType::CacheExternal
        ]
    );
    assert!(types[0].is_external() && types[0].is_dirty() && types[0].exists());
    assert_eq!(types[2].dirty(), RecordType::InsertExternal);
    assert_eq!(types[0].clean(), RecordType::CacheExternal);
    // An upsert to an inline value clears the flag.
    let mut node = NodeMut::trusted(&mut buf);
    node.upsert(b"b", b"now inline", RecordType::Insert)
        .unwrap();
    assert_eq!(
        NodeRef::parse(&buf).unwrap().record_type(0),
        RecordType::Insert
    );

    // A tombstone with the flag.
    let mut tomb = vec![0u8; 128];
    NodeMut::init(&mut tomb, NodeKind::Mini, Fences::None)
        .unwrap()
        .insert(b"k", b"", RecordType::Tombstone)
        .unwrap();
    set_ext_bit(&mut tomb, 0);
    assert!(NodeRef::parse(&tomb).is_err());
    // A fence record with the flag (meta 0 is the low fence).
    let mut fenced = vec![0u8; 128];
    NodeMut::init(&mut fenced, NodeKind::Leaf, fences).unwrap();
    set_ext_bit(&mut fenced, 0);
    assert!(NodeRef::parse(&fenced).is_err());
    // An inner node's record with the flag.
    let mut inner = vec![0u8; 128];
    NodeMut::init(&mut inner, NodeKind::Inner, Fences::None)
        .unwrap()
        .insert(b"k", &[1; 8], RecordType::Insert)
        .unwrap();
    set_ext_bit(&mut inner, 0);
    assert!(NodeRef::parse(&inner).is_err());
}
