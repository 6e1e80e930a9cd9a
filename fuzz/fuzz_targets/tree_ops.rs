//! Differential fuzzing of [`bfdb::Tree`] against a `BTreeMap`.
//!
//! The input picks a tiny configuration (a 64..256 KiB pool, so mini-pages are evicted
//! and merged constantly, and small key/value limits, so leaves and inner nodes split
//! after a few dozen records) and then a sequence of operations: single and batched
//! inserts and deletes, point reads, range scans with arbitrary bounds walked from both
//! ends, prefix scans, and flushes. After every operation the tree must agree with the
//! model exactly: the same values, the same errors for bad arguments, the same scan
//! output in the same order.

#![no_main]

use std::collections::BTreeMap;
use std::ops::Bound;

use arbitrary::Arbitrary;
use bfdb::{Config, Error, Tree};
use libfuzzer_sys::fuzz_target;

/// Memory budgets to pick from: all small, so eviction runs all the time.
const BUDGETS_BYTES: [u64; 4] = [64 << 10, 96 << 10, 128 << 10, 256 << 10];

/// `(max_key_bytes, max_value_bytes)` pairs the config accepts; small limits make nodes
/// split early, large ones put few records in a page.
const LIMITS: [(usize, usize); 5] = [(16, 64), (64, 256), (128, 1024), (512, 2048), (1000, 1000)];

const MERGE_THRESHOLDS_BYTES: [usize; 5] = [64, 256, 1024, 2048, 4096];

/// At most this many operations per input, so one input stays fast.
const MAX_OPS: usize = 256;

/// At most this many keys per batched insert or delete.
const MAX_RUN: usize = 64;

#[derive(Arbitrary, Debug)]
struct Input {
    budget: u8,
    limits: u8,
    merge_threshold: u8,
    promotion_rate_percent: u8,
    scan_promotion_rate_percent: u8,
    copy_on_access_percent: u8,
    ops: Vec<Op>,
}

/// A key built from a few families with shared prefixes (so prefix compression, fence
/// prefixes and prefix scans have something to work on), or raw bytes.
#[derive(Arbitrary, Debug, Clone)]
enum KeyArg {
    Spec { family: u8, id: u16, pad: u8 },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone)]
struct ValArg {
    len: u16,
    fill: u8,
}

#[derive(Arbitrary, Debug)]
enum BoundArg {
    Unbounded,
    Included(KeyArg),
    Excluded(KeyArg),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(KeyArg, ValArg),
    Delete(KeyArg),
    Get(KeyArg),
    /// Inserts `count` keys with consecutive ids starting at `id`.
    InsertRun {
        family: u8,
        id: u16,
        pad: u8,
        count: u8,
        value: ValArg,
    },
    /// Deletes `count` keys with consecutive ids starting at `id`.
    DeleteRun {
        family: u8,
        id: u16,
        pad: u8,
        count: u8,
    },
    /// Scans a range; `steps` says, for each step, whether to take from the front
    /// (`true`) or the back, and the rest is then drained from the front.
    Range {
        low: BoundArg,
        high: BoundArg,
        steps: Vec<bool>,
    },
    Prefix {
        prefix: KeyArg,
        cut: u8,
        reverse: bool,
    },
    Flush,
    /// A full forward and backward scan, compared with the model.
    Check,
}

/// Builds the key bytes of a [`KeyArg`]; may be empty or longer than `max_key_bytes` so
/// the argument checks are exercised too.
fn key_bytes(arg: &KeyArg, max_key_bytes: usize) -> Vec<u8> {
    match arg {
        KeyArg::Spec { family, id, pad } => spec_key(*family, *id, *pad, max_key_bytes),
        KeyArg::Raw(bytes) => bytes.clone(),
    }
}

fn spec_key(family: u8, id: u16, pad: u8, max_key_bytes: usize) -> Vec<u8> {
    let mut key: Vec<u8> = match family % 4 {
        0 => Vec::new(),
        1 => b"user:".to_vec(),
        2 => vec![b'p'; 32],
        _ => vec![0xff; 3],
    };
    key.extend_from_slice(&id.to_be_bytes());
    // Padding up to one byte past the limit, so over-long keys appear now and then.
    let pad_len = usize::from(pad) % (max_key_bytes + 2);
    key.extend(std::iter::repeat_n(b'.', pad_len));
    key
}

/// Builds a value: `len` bytes (modulo a bit more than the limit) of `fill`, with a
/// serial number in front so that overwriting a value with an equal-looking one is
/// still noticed.
fn value_bytes(arg: &ValArg, serial: u64, max_value_bytes: usize) -> Vec<u8> {
    let len = usize::from(arg.len) % (max_value_bytes + 2);
    let mut v = vec![arg.fill; len];
    let tag = serial.to_le_bytes();
    let n = len.min(tag.len());
    v[..n].copy_from_slice(&tag[..n]);
    v
}

fn own_bound(b: &BoundArg, max_key_bytes: usize) -> Bound<Vec<u8>> {
    match b {
        BoundArg::Unbounded => Bound::Unbounded,
        BoundArg::Included(k) => Bound::Included(key_bytes(k, max_key_bytes)),
        BoundArg::Excluded(k) => Bound::Excluded(key_bytes(k, max_key_bytes)),
    }
}

fn in_bounds(key: &[u8], low: &Bound<Vec<u8>>, high: &Bound<Vec<u8>>) -> bool {
    let above = match low {
        Bound::Unbounded => true,
        Bound::Included(l) => key >= l.as_slice(),
        Bound::Excluded(l) => key > l.as_slice(),
    };
    let below = match high {
        Bound::Unbounded => true,
        Bound::Included(h) => key <= h.as_slice(),
        Bound::Excluded(h) => key < h.as_slice(),
    };
    above && below
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// One item of a tree scan.
type ScanItem = Result<(Vec<u8>, Vec<u8>), Error>;

struct Harness {
    tree: Tree,
    model: Model,
    max_key_bytes: usize,
    max_value_bytes: usize,
    serial: u64,
}

impl Harness {
    /// The error the tree must return for `key`, if any.
    fn key_error(&self, key: &[u8]) -> Option<&'static str> {
        if key.is_empty() {
            Some("EmptyKey")
        } else if key.len() > self.max_key_bytes {
            Some("KeyTooLarge")
        } else {
            None
        }
    }

    fn expect_arg_error(&self, what: &str, key: &[u8], expected: &str, got: Result<(), Error>) {
        match (expected, got) {
            ("EmptyKey", Err(Error::EmptyKey)) => {}
            ("KeyTooLarge", Err(Error::KeyTooLarge { len, max }))
                if len == key.len() && max == self.max_key_bytes => {}
            ("ValueTooLarge", Err(Error::ValueTooLarge { max, .. }))
                if max == self.max_value_bytes => {}
            (_, got) => panic!("{what} of key {key:?}: expected {expected}, got {got:?}"),
        }
    }

    fn insert(&mut self, key: Vec<u8>, value_arg: &ValArg) {
        self.serial += 1;
        let value = value_bytes(value_arg, self.serial, self.max_value_bytes);
        let result = self.tree.insert(&key, &value);
        if let Some(expected) = self.key_error(&key) {
            self.expect_arg_error("insert", &key, expected, result);
        } else if value.len() > self.max_value_bytes {
            self.expect_arg_error("insert", &key, "ValueTooLarge", result);
        } else {
            result.unwrap_or_else(|e| panic!("insert of key {key:?}: {e}"));
            self.model.insert(key, value);
        }
    }

    fn delete(&mut self, key: Vec<u8>) {
        let result = self.tree.delete(&key);
        if let Some(expected) = self.key_error(&key) {
            self.expect_arg_error("delete", &key, expected, result);
        } else {
            result.unwrap_or_else(|e| panic!("delete of key {key:?}: {e}"));
            self.model.remove(&key);
        }
    }

    fn get(&self, key: &[u8]) {
        let result = self.tree.get(key);
        if let Some(expected) = self.key_error(key) {
            self.expect_arg_error("get", key, expected, result.map(|_| ()));
        } else {
            let got = result.unwrap_or_else(|e| panic!("get of key {key:?}: {e}"));
            assert_eq!(
                got.as_deref(),
                self.model.get(key).map(Vec::as_slice),
                "get of key {key:?}"
            );
        }
    }

    /// Walks `iter` as `steps` says and compares every item with `expected`.
    fn compare_scan(
        what: &str,
        mut iter: bfdb::Range<'_>,
        expected: &[(&Vec<u8>, &Vec<u8>)],
        steps: &[bool],
    ) {
        let (mut front, mut back) = (0, expected.len());
        let unwrap = |item: Option<ScanItem>| {
            item.map(|r| r.unwrap_or_else(|e| panic!("{what}: scan error {e}")))
        };
        for (n, &from_front) in steps.iter().enumerate() {
            let got = if from_front {
                unwrap(iter.next())
            } else {
                unwrap(iter.next_back())
            };
            let want = if front == back {
                None
            } else if from_front {
                front += 1;
                Some(expected[front - 1])
            } else {
                back -= 1;
                Some(expected[back])
            };
            assert_eq!(
                got.as_ref().map(|(k, v)| (k, v)),
                want,
                "{what}: step {n} (front: {from_front})"
            );
        }
        let rest: Vec<(Vec<u8>, Vec<u8>)> = iter
            .map(|r| r.unwrap_or_else(|e| panic!("{what}: scan error {e}")))
            .collect();
        let rest_refs: Vec<(&Vec<u8>, &Vec<u8>)> = rest.iter().map(|(k, v)| (k, v)).collect();
        assert_eq!(
            rest_refs,
            &expected[front..back],
            "{what}: the rest of the scan"
        );
    }

    fn range(&self, low: Bound<Vec<u8>>, high: Bound<Vec<u8>>, steps: &[bool]) {
        let expected: Vec<(&Vec<u8>, &Vec<u8>)> = self
            .model
            .iter()
            .filter(|(k, _)| in_bounds(k, &low, &high))
            .collect();
        let what = format!("range {low:?}..{high:?}");
        let iter = self.tree.range((low.clone(), high.clone()));
        Self::compare_scan(&what, iter, &expected, steps);
    }

    fn prefix(&self, prefix: &[u8], reverse: bool) {
        let mut expected: Vec<(&Vec<u8>, &Vec<u8>)> = self
            .model
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect();
        let iter = self.tree.prefix(prefix);
        let what = format!("prefix {prefix:?} (reverse: {reverse})");
        if reverse {
            let got: Vec<(Vec<u8>, Vec<u8>)> = iter
                .rev()
                .map(|r| r.unwrap_or_else(|e| panic!("{what}: scan error {e}")))
                .collect();
            expected.reverse();
            let got_refs: Vec<(&Vec<u8>, &Vec<u8>)> = got.iter().map(|(k, v)| (k, v)).collect();
            assert_eq!(got_refs, expected, "{what}");
        } else {
            Self::compare_scan(&what, iter, &expected, &[]);
        }
    }

    fn check_all(&self) {
        let expected: Vec<(&Vec<u8>, &Vec<u8>)> = self.model.iter().collect();
        Self::compare_scan("full scan", self.tree.range::<&[u8], _>(..), &expected, &[]);
        let back: Vec<(Vec<u8>, Vec<u8>)> = self
            .tree
            .range::<&[u8], _>(..)
            .rev()
            .map(|r| r.unwrap_or_else(|e| panic!("reverse full scan: {e}")))
            .collect();
        assert!(
            back.iter()
                .rev()
                .map(|(k, v)| (k, v))
                .eq(expected.iter().copied()),
            "reverse full scan differs from the model"
        );
        let stats = self.tree.stats();
        assert!(
            stats.pool.bytes_in_use <= self.tree.config().memory_budget_bytes,
            "pool uses {} bytes of a {}-byte budget",
            stats.pool.bytes_in_use,
            self.tree.config().memory_budget_bytes
        );
    }
}

fuzz_target!(|input: Input| {
    let (max_key_bytes, max_value_bytes) = LIMITS[usize::from(input.limits) % LIMITS.len()];
    let config = Config {
        memory_budget_bytes: BUDGETS_BYTES[usize::from(input.budget) % BUDGETS_BYTES.len()],
        promotion_rate_percent: input.promotion_rate_percent % 101,
        scan_promotion_rate_percent: input.scan_promotion_rate_percent % 101,
        copy_on_access_percent: input.copy_on_access_percent % 101,
        merge_threshold_bytes: MERGE_THRESHOLDS_BYTES
            [usize::from(input.merge_threshold) % MERGE_THRESHOLDS_BYTES.len()],
        max_key_bytes,
        max_value_bytes,
        huge_pages: false,
        // No background evictor: with one, an input's run depends on thread timing, and a
        // crash would not replay. The concurrent tests and the model proptests run it.
        background_eviction: false,
        ..Config::default()
    };
    let tree = Tree::in_memory(config).expect("a valid tiny config");
    let mut h = Harness {
        tree,
        model: BTreeMap::new(),
        max_key_bytes,
        max_value_bytes,
        serial: 0,
    };
    for op in input.ops.iter().take(MAX_OPS) {
        match op {
            Op::Insert(k, v) => h.insert(key_bytes(k, max_key_bytes), v),
            Op::Delete(k) => h.delete(key_bytes(k, max_key_bytes)),
            Op::Get(k) => h.get(&key_bytes(k, max_key_bytes)),
            Op::InsertRun {
                family,
                id,
                pad,
                count,
                value,
            } => {
                for i in 0..usize::from(*count) % (MAX_RUN + 1) {
                    let key = spec_key(*family, id.wrapping_add(i as u16), *pad, max_key_bytes);
                    h.insert(key, value);
                }
            }
            Op::DeleteRun {
                family,
                id,
                pad,
                count,
            } => {
                for i in 0..usize::from(*count) % (MAX_RUN + 1) {
                    let key = spec_key(*family, id.wrapping_add(i as u16), *pad, max_key_bytes);
                    h.delete(key);
                }
            }
            Op::Range { low, high, steps } => h.range(
                own_bound(low, max_key_bytes),
                own_bound(high, max_key_bytes),
                steps,
            ),
            Op::Prefix {
                prefix,
                cut,
                reverse,
            } => {
                let mut p = key_bytes(prefix, max_key_bytes);
                p.truncate(usize::from(*cut));
                h.prefix(&p, *reverse);
            }
            Op::Flush => h.tree.flush().expect("flush of an in-memory tree"),
            Op::Check => h.check_all(),
        }
    }
    h.check_all();
    if std::env::var_os("BFDB_FUZZ_STATS").is_some() {
        // For judging a corpus: did its inputs reach splits, merges and evictions?
        eprintln!("BFDB_FUZZ_STATS {:?}", h.tree.stats());
    }
    // Every key the model holds must be readable by a point lookup too (bounded, so
    // large inputs stay fast).
    for (k, v) in h.model.iter().take(128) {
        assert_eq!(
            h.tree.get(k).expect("get").as_ref(),
            Some(v),
            "final get {k:?}"
        );
    }
});
