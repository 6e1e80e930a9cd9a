//! Differential fuzzing of [`bfdb::Tree`] against a `BTreeMap`.
//!
//! The input picks where the tree lives and a tiny configuration (a 64..256 KiB pool, so
//! mini-pages are evicted and merged constantly, and small key and inline value limits,
//! so leaves and inner nodes split after a few dozen records), then a sequence of
//! operations: single and batched inserts and deletes, point reads, reads of parts of
//! values, range scans with arbitrary bounds walked from both ends, prefix scans, and
//! flushes. After every operation the tree must agree with the model exactly: the same
//! values, the same errors for bad arguments, the same scan output in the same order.
//!
//! The tree lives on its own ([`Tree::in_memory`]) or as a keyspace of a [`Db`] in a
//! temporary directory. In a database, values longer than the inline limit (16..=256
//! bytes here) are kept out of line in the database's value store, up to a modest
//! `max_value_bytes` (at most 192 KiB, so that values of more than one 64 KiB chunk
//! appear while one input stays fast); the input may also take checkpoints and reopen
//! the database, after which the whole state must be as before, and at the end of an
//! input three checkpoints must leave the value store holding exactly the model's long
//! values (nothing overwritten or deleted leaks). A tree on its own has no value store:
//! it must refuse every value past its inline limit with `ValueTooLarge`, whatever
//! `max_value_bytes` says, and change nothing. Value lengths are drawn on both sides of
//! the inline limit, exactly at it and one past, at the value store's block and chunk
//! edges, and at the longest accepted value and one past.
//!
//! Three inputs in eight pick a long-key configuration instead (issue #34): leaf pages
//! of 16 or 32 KiB and a key limit of 2 to 4 KiB, with budgets scaled to the leaf size.
//! Keys are then drawn up to the limit (and one past), and two of the key families
//! share prefixes of half and seven eighths of the limit, so that fences and
//! separators are kilobytes long and inner nodes hold only a few.

#![no_main]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arbitrary::Arbitrary;
use bfdb::{Backend, Config, Db, DbOptions, Error, Tree, WriteBatch};
use libfuzzer_sys::fuzz_target;

/// Memory budgets to pick from: all small, so eviction runs all the time.
const BUDGETS_BYTES: [u64; 4] = [64 << 10, 96 << 10, 128 << 10, 256 << 10];

/// `(max_key_bytes, max_inline_value_bytes)` pairs the config accepts with 4 KiB leaf
/// pages; small limits make nodes split early, large ones put few records in a page. In
/// a database only the key limit is taken from here.
const LIMITS: [(usize, usize); 5] = [(16, 64), (64, 256), (128, 1024), (512, 2048), (1000, 1000)];

/// `(max_key_bytes, max_inline_value_bytes, leaf_page_size_bytes)` of the long-key
/// configurations: keys of 4 KiB with small inline values and with the most 16 KiB
/// leaf pages hold, and the same in 32 KiB pages. In a database only the key limit and
/// the leaf page size are taken from here.
const LONG_KEY_LIMITS: [(usize, usize, usize); 5] = [
    (4096, 256, 16384),
    (4096, 3992, 16384),
    (2048, 1024, 16384),
    (4096, 2048, 32768),
    (3000, 12000, 32768),
];

/// `max_value_bytes` above the inline limit to pick from: a few blocks of the value
/// store (4 KiB), one chunk (64 KiB), one byte past it (a chunk table), and three chunks
/// and a bit.
const VALUE_LIMITS_BYTES: [usize; 5] = [4096, 16 << 10, 64 << 10, (64 << 10) + 1, (192 << 10) + 5];

const MERGE_THRESHOLDS_BYTES: [usize; 5] = [64, 256, 1024, 2048, 4096];

/// At most this many operations per input, so one input stays fast.
const MAX_OPS: usize = 256;

/// At most this many keys per batched insert or delete.
const MAX_RUN: usize = 64;

/// The bytes of values longer than the inline limit one input may build; past it,
/// long values are drawn short instead, so an input of runs of 192 KiB values stays
/// fast.
const LONG_VALUE_BUDGET_BYTES: usize = 8 << 20;

/// At most this many checkpoints and reopens an input asks for are taken; later ones
/// are skipped, so that an input of nothing else stays well within the 30 s hang limit
/// with every sync going to a disk (each takes tens of milliseconds there).
const MAX_CHECKPOINTS: u32 = 32;
const MAX_REOPENS: u32 = 8;

/// The tree keyspace's name in a database.
const KEYSPACE: &str = "t";

#[derive(Arbitrary, Debug)]
struct Input {
    budget: u8,
    limits: u8,
    merge_threshold: u8,
    promotion_rate_percent: u8,
    scan_promotion_rate_percent: u8,
    copy_on_access_percent: u8,
    home: Home,
    ops: Vec<Op>,
}

/// Where the tree lives.
#[derive(Arbitrary, Debug)]
enum Home {
    /// On its own, with the key and inline value limits of [`LIMITS`] (or
    /// [`LONG_KEY_LIMITS`]) and a `max_value_bytes` equal to the inline limit
    /// (`max_value` 0) or one of [`VALUE_LIMITS_BYTES`] (at least the inline limit): it
    /// accepts no longer value either way.
    Alone { max_value: u8 },
    /// A keyspace of a database, with the key limit (and leaf page size) of [`LIMITS`]
    /// or [`LONG_KEY_LIMITS`], an inline limit of
    /// `16 + inline % 241` bytes and a `max_value_bytes` of [`VALUE_LIMITS_BYTES`].
    InDb { inline: u8, max_value: u8 },
}

/// A key built from a few families with shared prefixes (so prefix compression, fence
/// prefixes and prefix scans have something to work on), raw bytes, or a key the model
/// holds (so reads and deletes of long values find them).
#[derive(Arbitrary, Debug, Clone)]
enum KeyArg {
    Spec {
        family: u8,
        id: u16,
        pad: u8,
    },
    Raw(Vec<u8>),
    /// The model's key at this index (modulo its length).
    Held(u16),
}

/// A value: its length is drawn by [`Harness::value_len`], its bytes by
/// [`value_bytes`].
#[derive(Arbitrary, Debug, Clone, Copy)]
struct ValArg {
    size: u8,
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
    /// Reads part of a value: `offset` and `len` modulo a bit more than the value's
    /// length (or the longest value, if the key is absent); with `wild` 6 the offset is
    /// near `u64::MAX` instead, with 7 the length near `usize::MAX`.
    GetPart {
        key: KeyArg,
        offset: u32,
        len: u32,
        wild: u8,
    },
    /// Reads up to `count` of the model's keys from index `from`, with `extra` among
    /// them.
    GetMany {
        from: u16,
        count: u8,
        extra: KeyArg,
    },
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
    /// `count` writes of keys with consecutive ids from `id`, the 48th on writing the
    /// first ones again (the later write wins): deletes where `deletes` has its bit set,
    /// the rest inserts of values of mixed sizes built from `value`; the write at index
    /// `bad` (if any) has an over-long key. In a database one [`WriteBatch`], refused
    /// whole if a key or value is; on its own, single writes.
    Batch {
        family: u8,
        id: u16,
        count: u8,
        deletes: u64,
        value: ValArg,
        bad: u8,
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
    /// In a database, a checkpoint (a full one, or one as the background triggers take
    /// it), the first [`MAX_CHECKPOINTS`] of an input; nothing on its own.
    Checkpoint {
        incremental: bool,
    },
    /// In a database: drops (or, with `close`, closes) it, with a checkpoint first or
    /// not, opens it again and compares the whole state, the first [`MAX_REOPENS`] of an
    /// input; nothing on its own.
    Reopen {
        checkpoint: bool,
        close: bool,
    },
}

fn spec_key(family: u8, id: u16, pad: u8, max_key_bytes: usize) -> Vec<u8> {
    let mut key: Vec<u8> = match family % 6 {
        0 => Vec::new(),
        1 => b"user:".to_vec(),
        2 => vec![b'p'; 32],
        3 => vec![0xff; 3],
        // Prefixes of a good part of the limit, which every key of the family shares:
        // separators and fences between them are as long (kilobytes under long-key
        // limits).
        4 => vec![b'L'; max_key_bytes - max_key_bytes / 8],
        _ => vec![b'M'; max_key_bytes / 2],
    };
    key.extend_from_slice(&id.to_be_bytes());
    // Padding up to one byte past the limit, so over-long keys appear now and then:
    // exactly to the limit and one past it, and otherwise any length up to one past a
    // limit below 254 or spread over the room a longer limit leaves.
    let room = max_key_bytes.saturating_sub(key.len());
    let pad_len = match pad {
        255 => room + 1,
        254 => room,
        _ if max_key_bytes < 254 => usize::from(pad) % (max_key_bytes + 2),
        _ => usize::from(pad) * room / 253,
    };
    key.extend(std::iter::repeat_n(b'.', pad_len));
    key
}

/// A value of `len` bytes whose every byte depends on its position (so a part read
/// from the wrong offset is noticed) and on `fill`, with the serial number `serial` at
/// the start of every KiB (so a value overwritten with an equal-looking one, or read
/// partly from another version, is noticed).
fn value_bytes(len: usize, fill: u8, serial: u64) -> Vec<u8> {
    let tag = serial.to_le_bytes();
    (0..len)
        .map(|i| {
            if i % 1024 < tag.len() {
                tag[i % 1024]
            } else {
                fill ^ (i as u8)
                    ^ ((i >> 8) as u8).wrapping_mul(29)
                    ^ ((i >> 16) as u8).wrapping_mul(113)
            }
        })
        .collect()
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

/// `value[offset..offset + len]`, clipped at the value's end: what `get_part` answers.
fn part(value: &[u8], offset: u64, len: usize) -> &[u8] {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(value.len());
    let end = start.saturating_add(len).min(value.len());
    &value[start..end]
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// One item of a tree scan.
type ScanItem = Result<(Vec<u8>, Vec<u8>), Error>;

/// The limits an input runs with.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_key_bytes: usize,
    /// The inline value limit ([`Config::inline_value_limit`]).
    inline_bytes: usize,
    /// [`Config::max_value_bytes`].
    max_value_bytes: usize,
    /// The longest value the tree accepts: `max_value_bytes` in a database,
    /// `inline_bytes` on its own.
    accepted_bytes: usize,
}

/// Why the tree must refuse an argument.
#[derive(Clone, Copy, Debug)]
enum Bad {
    EmptyKey,
    KeyTooLarge,
    ValueTooLarge { len: usize },
}

/// A directory of its own under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("bfdb-fuzz-tree-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The database a keyspace tree lives in.
struct Database {
    /// `None` only while it is reopened.
    db: Option<Db>,
    /// Declared after `db`: removed once the database is closed.
    dir: TempDir,
    options: DbOptions,
}

impl Database {
    fn db(&self) -> &Db {
        self.db.as_ref().expect("the database is open")
    }
}

struct Harness {
    /// `None` only while the database is reopened. Declared before `database`: the
    /// handle is dropped before its database.
    tree: Option<Arc<Tree>>,
    /// `None` for a tree on its own.
    database: Option<Database>,
    model: Model,
    limits: Limits,
    serial: u64,
    /// What is left of [`LONG_VALUE_BUDGET_BYTES`].
    long_bytes_left: usize,
    /// A value past the inline limit was written (so the value store has held one).
    wrote_long: bool,
    /// What is left of [`MAX_CHECKPOINTS`] and [`MAX_REOPENS`].
    checkpoints_left: u32,
    reopens_left: u32,
}

impl Harness {
    /// A harness whose tree runs with `config`, in a database in a new temporary
    /// directory if `in_db`.
    fn new(config: Config, limits: Limits, in_db: bool) -> Harness {
        let (tree, database) = if in_db {
            let options = DbOptions::default()
                .config(config)
                .log_segment_bytes(64 << 10)
                // Checkpoints only when the input asks, and none on close: a reopen
                // then replays the log.
                .checkpoint_log_bytes(0)
                .checkpoint_interval(None)
                .checkpoint_on_close(false);
            let dir = TempDir::new();
            let db = Db::open(dir.path(), options.clone())
                .unwrap_or_else(|e| panic!("opening the database: {e}"));
            let tree = db
                .tree(KEYSPACE)
                .unwrap_or_else(|e| panic!("opening the tree keyspace: {e}"));
            let database = Database {
                db: Some(db),
                dir,
                options,
            };
            (tree, Some(database))
        } else {
            (
                Arc::new(Tree::in_memory(config).expect("a valid tiny config")),
                None,
            )
        };
        Harness {
            tree: Some(tree),
            database,
            model: BTreeMap::new(),
            limits,
            serial: 0,
            long_bytes_left: LONG_VALUE_BUDGET_BYTES,
            wrote_long: false,
            checkpoints_left: MAX_CHECKPOINTS,
            reopens_left: MAX_REOPENS,
        }
    }

    fn tree(&self) -> &Tree {
        self.tree.as_deref().expect("the tree is open")
    }

    /// Builds the key bytes of a [`KeyArg`]; may be empty or longer than
    /// `max_key_bytes` so the argument checks are exercised too.
    fn key(&self, arg: &KeyArg) -> Vec<u8> {
        match arg {
            KeyArg::Spec { family, id, pad } => {
                spec_key(*family, *id, *pad, self.limits.max_key_bytes)
            }
            KeyArg::Raw(bytes) => bytes.clone(),
            KeyArg::Held(n) => match self.model.len() {
                0 => spec_key(1, *n, 0, self.limits.max_key_bytes),
                len => self
                    .model
                    .keys()
                    .nth(usize::from(*n) % len)
                    .cloned()
                    .unwrap(),
            },
        }
    }

    fn bound(&self, b: &BoundArg) -> Bound<Vec<u8>> {
        match b {
            BoundArg::Unbounded => Bound::Unbounded,
            BoundArg::Included(k) => Bound::Included(self.key(k)),
            BoundArg::Excluded(k) => Bound::Excluded(self.key(k)),
        }
    }

    /// The length of a value: mostly inline values up to one byte past the inline
    /// limit; exactly at the limit and one past; any length past it up to one byte past
    /// `max_value_bytes`; lengths at the edges of the value store's 4 KiB blocks and
    /// 64 KiB chunks; and exactly `max_value_bytes` and one past. (A tree on its own
    /// must refuse all those past the inline limit.) Once the input has built
    /// [`LONG_VALUE_BUDGET_BYTES`] of values past the inline limit, it gets inline ones
    /// instead.
    fn value_len(&mut self, arg: &ValArg) -> usize {
        let (inline, max) = (self.limits.inline_bytes, self.limits.max_value_bytes);
        let len = usize::from(arg.len);
        let drawn = match arg.size % 8 {
            0..=3 => len % (inline + 2),
            4 => inline,
            5 => inline + 1,
            6 => inline + 1 + len % (max + 1 - inline),
            _ => match len % 4 {
                0 => max,
                1 => max + 1,
                _ => (4096 * (1 + (len >> 2) % 48) + (len >> 8) % 3 - 1).min(max + 1),
            },
        };
        if drawn <= inline {
            return drawn;
        }
        match self.long_bytes_left.checked_sub(drawn) {
            Some(left) => {
                self.long_bytes_left = left;
                drawn
            }
            None => len % (inline + 1),
        }
    }

    /// A new value drawn from `arg`.
    fn value(&mut self, arg: &ValArg) -> Vec<u8> {
        self.serial += 1;
        let len = self.value_len(arg);
        value_bytes(len, arg.fill, self.serial)
    }

    /// Why the tree must refuse `key` (with `value`, for a write), if it must.
    fn bad(&self, key: &[u8], value: Option<&[u8]>) -> Option<Bad> {
        if key.is_empty() {
            Some(Bad::EmptyKey)
        } else if key.len() > self.limits.max_key_bytes {
            Some(Bad::KeyTooLarge)
        } else {
            value
                .filter(|v| v.len() > self.limits.accepted_bytes)
                .map(|v| Bad::ValueTooLarge { len: v.len() })
        }
    }

    fn expect_bad<T: std::fmt::Debug>(
        &self,
        what: &str,
        key: &[u8],
        bad: Bad,
        got: Result<T, Error>,
    ) {
        match (bad, got) {
            (Bad::EmptyKey, Err(Error::EmptyKey)) => {}
            (Bad::KeyTooLarge, Err(Error::KeyTooLarge { len, max }))
                if len == key.len() && max == self.limits.max_key_bytes => {}
            (Bad::ValueTooLarge { len }, Err(Error::ValueTooLarge { len: l, max }))
                if l == len && max == self.limits.accepted_bytes => {}
            (_, got) => panic!("{what} of key {key:?}: expected {bad:?}, got {got:?}"),
        }
    }

    /// A refused write changed nothing: `key` reads as the model has it.
    fn expect_unchanged(&self, what: &str, key: &[u8]) {
        if self.bad(key, None).is_none() {
            let got = self
                .tree()
                .get(key)
                .unwrap_or_else(|e| panic!("get of key {key:?} after a refused {what}: {e}"));
            assert_eq!(
                got.as_deref(),
                self.model.get(key).map(Vec::as_slice),
                "key {key:?} after a refused {what}"
            );
        }
    }

    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) {
        let result = self.tree().insert(&key, &value);
        match self.bad(&key, Some(&value)) {
            Some(bad) => {
                self.expect_bad("insert", &key, bad, result);
                self.expect_unchanged("insert", &key);
            }
            None => {
                result.unwrap_or_else(|e| panic!("insert of key {key:?}: {e}"));
                self.wrote_long |= value.len() > self.limits.inline_bytes;
                self.model.insert(key, value);
            }
        }
    }

    fn delete(&mut self, key: Vec<u8>) {
        let result = self.tree().delete(&key);
        match self.bad(&key, None) {
            Some(bad) => self.expect_bad("delete", &key, bad, result),
            None => {
                result.unwrap_or_else(|e| panic!("delete of key {key:?}: {e}"));
                self.model.remove(&key);
            }
        }
    }

    fn get(&self, key: &[u8]) {
        let result = self.tree().get(key);
        if let Some(bad) = self.bad(key, None) {
            return self.expect_bad("get", key, bad, result);
        }
        let got = result.unwrap_or_else(|e| panic!("get of key {key:?}: {e}"));
        assert_eq!(
            got.as_deref(),
            self.model.get(key).map(Vec::as_slice),
            "get of key {key:?}"
        );
    }

    fn get_part(&self, key: &[u8], offset: u64, len: usize) {
        let result = self.tree().get_part(key, offset, len);
        if let Some(bad) = self.bad(key, None) {
            return self.expect_bad("get_part", key, bad, result);
        }
        let got =
            result.unwrap_or_else(|e| panic!("get_part of key {key:?} at {offset}+{len}: {e}"));
        assert_eq!(
            got.as_deref(),
            self.model.get(key).map(|v| part(v, offset, len)),
            "get_part of key {key:?} at {offset}+{len}"
        );
    }

    fn get_many(&self, keys: &[Vec<u8>]) {
        let result = self.tree().get_many(keys);
        if let Some((key, bad)) = keys.iter().find_map(|k| Some((k, self.bad(k, None)?))) {
            return self.expect_bad("get_many", key, bad, result);
        }
        let got = result.unwrap_or_else(|e| panic!("get_many of {} keys: {e}", keys.len()));
        assert_eq!(got.len(), keys.len(), "get_many's answer count");
        for (key, got) in keys.iter().zip(got) {
            assert_eq!(got.as_ref(), self.model.get(key), "get_many of key {key:?}");
        }
    }

    /// Writes `writes` (inserts of a value, or deletes) as one batch in a database, or
    /// one by one on its own.
    fn batch(&mut self, writes: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
        let Some(database) = &self.database else {
            for (key, value) in writes {
                match value {
                    Some(value) => self.insert(key, value),
                    None => self.delete(key),
                }
            }
            return;
        };
        let mut batch = WriteBatch::new();
        for (key, value) in &writes {
            match value {
                Some(value) => batch.insert(self.tree(), key, value),
                None => batch.delete(self.tree(), key),
            }
        }
        let result = database.db().write(batch);
        // The database checks every write in order before it writes anything: the
        // first bad one is the error.
        if let Some((key, bad)) = writes
            .iter()
            .find_map(|(k, v)| Some((k, self.bad(k, v.as_deref())?)))
        {
            self.expect_bad("a batch's write", key, bad, result);
            for (key, _) in &writes {
                self.expect_unchanged("batch", key);
            }
            return;
        }
        result.unwrap_or_else(|e| panic!("a batch of {} writes: {e}", writes.len()));
        for (key, value) in writes {
            match value {
                Some(value) => {
                    self.wrote_long |= value.len() > self.limits.inline_bytes;
                    self.model.insert(key, value)
                }
                None => self.model.remove(&key),
            };
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
        let iter = self.tree().range((low.clone(), high.clone()));
        Self::compare_scan(&what, iter, &expected, steps);
    }

    fn prefix(&self, prefix: &[u8], reverse: bool) {
        let mut expected: Vec<(&Vec<u8>, &Vec<u8>)> = self
            .model
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect();
        let iter = self.tree().prefix(prefix);
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
        Self::compare_scan(
            "full scan",
            self.tree().range::<&[u8], _>(..),
            &expected,
            &[],
        );
        let back: Vec<(Vec<u8>, Vec<u8>)> = self
            .tree()
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
        let stats = self.tree().stats();
        assert!(
            stats.pool.bytes_in_use <= self.tree().config().memory_budget_bytes,
            "pool uses {} bytes of a {}-byte budget",
            stats.pool.bytes_in_use,
            self.tree().config().memory_budget_bytes
        );
    }

    /// [`Harness::check_all`], and every key of the model read by a point lookup, and
    /// the middle of every value kept out of line by `get_part`.
    fn check_everything(&self) {
        self.check_all();
        for (k, v) in &self.model {
            self.get(k);
            if v.len() > self.limits.inline_bytes {
                self.get_part(k, v.len() as u64 / 3, v.len() / 3 + 1);
            }
        }
    }

    fn checkpoint(&self, incremental: bool) {
        let Some(database) = &self.database else {
            return;
        };
        let db = database.db();
        let result = if incremental {
            db.checkpoint_incremental()
        } else {
            db.checkpoint()
        };
        result.unwrap_or_else(|e| panic!("checkpoint (incremental: {incremental}): {e}"));
    }

    /// Closes the database (every write was logged, so a close keeps them all, with a
    /// checkpoint or without) and opens it again: the tree must hold what it held.
    fn reopen(&mut self, checkpoint: bool, close: bool) {
        if self.database.is_none() || self.reopens_left == 0 {
            return;
        }
        self.reopens_left -= 1;
        if checkpoint {
            self.checkpoint(false);
        }
        self.tree = None;
        let database = self.database.as_mut().expect("in a database");
        let db = database.db.take().expect("the database is open");
        if close {
            db.close()
                .unwrap_or_else(|e| panic!("closing the database: {e}"));
        } else {
            drop(db);
        }
        let db = Db::open(database.dir.path(), database.options.clone())
            .unwrap_or_else(|e| panic!("reopening the database: {e}"));
        self.tree = Some(
            db.tree(KEYSPACE)
                .unwrap_or_else(|e| panic!("the tree keyspace after a reopen: {e}")),
        );
        database.db = Some(db);
        self.check_everything();
    }

    /// In a database: after three checkpoints every value overwritten or deleted is
    /// free again, so the value store holds exactly the model's long values. (Skipped
    /// if the input wrote none: the checkpoints' syncs are most of a short input's time.)
    fn check_value_store(&self) {
        let Some(database) = &self.database else {
            return;
        };
        if !self.wrote_long {
            return;
        }
        for _ in 0..3 {
            self.checkpoint(false);
        }
        let stats = database.db().stats();
        let long = self
            .model
            .values()
            .filter(|v| v.len() > self.limits.inline_bytes);
        let live_bytes: u64 = long.clone().map(|v| v.len() as u64).sum();
        assert_eq!(
            (stats.value_store_live_values, stats.value_store_live_bytes),
            (long.count() as u64, live_bytes),
            "the value store's live values and bytes after three checkpoints"
        );
        assert_eq!(
            stats.value_store_deferred_bytes, 0,
            "values freed and not yet reusable after three checkpoints"
        );
    }
}

fuzz_target!(|input: Input| {
    // Three inputs in eight take a long-key configuration.
    let (max_key_bytes, limit_bytes, leaf_page_bytes) = match input.limits % 8 {
        0..5 => {
            let (key, inline) = LIMITS[usize::from(input.limits / 8) % LIMITS.len()];
            (key, inline, 4096)
        }
        _ => LONG_KEY_LIMITS[usize::from(input.limits / 8) % LONG_KEY_LIMITS.len()],
    };
    let pick_max_value = |n: u8| VALUE_LIMITS_BYTES[usize::from(n) % VALUE_LIMITS_BYTES.len()];
    let (in_db, inline_bytes, max_value_bytes) = match input.home {
        Home::Alone { max_value } => {
            match usize::from(max_value) % (VALUE_LIMITS_BYTES.len() + 1) {
                0 => (false, limit_bytes, limit_bytes),
                // (At least the inline limit, which may be above the smallest.)
                n => (false, limit_bytes, VALUE_LIMITS_BYTES[n - 1].max(limit_bytes)),
            }
        }
        Home::InDb { inline, max_value } => (
            true,
            16 + usize::from(inline) % 241,
            pick_max_value(max_value),
        ),
    };
    let limits = Limits {
        max_key_bytes,
        inline_bytes,
        max_value_bytes,
        accepted_bytes: if in_db { max_value_bytes } else { inline_bytes },
    };
    let config = Config {
        // Budgets in proportion to the leaf page: as many mini-pages of a whole leaf.
        memory_budget_bytes: BUDGETS_BYTES[usize::from(input.budget) % BUDGETS_BYTES.len()]
            * (leaf_page_bytes / 4096) as u64,
        leaf_page_size_bytes: leaf_page_bytes,
        promotion_rate_percent: input.promotion_rate_percent % 101,
        scan_promotion_rate_percent: input.scan_promotion_rate_percent % 101,
        copy_on_access_percent: input.copy_on_access_percent % 101,
        merge_threshold_bytes: MERGE_THRESHOLDS_BYTES
            [usize::from(input.merge_threshold) % MERGE_THRESHOLDS_BYTES.len()],
        max_key_bytes,
        max_value_bytes,
        max_inline_value_bytes: inline_bytes,
        huge_pages: false,
        // No background evictor: with one, an input's run depends on thread timing, and a
        // crash would not replay. The concurrent tests and the model proptests run it.
        background_eviction: false,
        // Buffered IO for a database's files: the page cache answers its reads of leaf
        // pages and values at once (as in `hash_ops`).
        backend: Backend::Std,
        ..Config::default()
    };
    assert_eq!(config.inline_value_limit(), inline_bytes);
    let mut h = Harness::new(config, limits, in_db);
    for op in input.ops.iter().take(MAX_OPS) {
        match op {
            Op::Insert(k, v) => {
                let (key, value) = (h.key(k), h.value(v));
                h.insert(key, value);
            }
            Op::Delete(k) => h.delete(h.key(k)),
            Op::Get(k) => h.get(&h.key(k)),
            &Op::GetPart {
                ref key,
                offset,
                len,
                wild,
            } => {
                let key = h.key(key);
                let reach = h.model.get(&key).map_or(max_value_bytes, Vec::len) as u64 + 2;
                let offset = u64::from(offset) % reach;
                let len = (u64::from(len) % reach) as usize;
                match wild % 8 {
                    6 => h.get_part(&key, u64::MAX - offset, len),
                    7 => h.get_part(&key, offset, usize::MAX - len),
                    _ => h.get_part(&key, offset, len),
                }
            }
            Op::GetMany { from, count, extra } => {
                let count = usize::from(*count) % (MAX_RUN + 1);
                let mut keys: Vec<Vec<u8>> = match h.model.len() {
                    0 => Vec::new(),
                    len => h
                        .model
                        .keys()
                        .cycle()
                        .skip(usize::from(*from) % len)
                        .take(count.min(len))
                        .cloned()
                        .collect(),
                };
                keys.insert(keys.len() / 2, h.key(extra));
                h.get_many(&keys);
            }
            Op::InsertRun {
                family,
                id,
                pad,
                count,
                value,
            } => {
                for i in 0..usize::from(*count) % (MAX_RUN + 1) {
                    let key = spec_key(*family, id.wrapping_add(i as u16), *pad, max_key_bytes);
                    let value = h.value(value);
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
            &Op::Batch {
                family,
                id,
                count,
                deletes,
                value,
                bad,
            } => {
                let writes = (0..usize::from(count) % (MAX_RUN + 1))
                    .map(|i| {
                        let mut key =
                            spec_key(family, id.wrapping_add((i % 48) as u16), 0, max_key_bytes);
                        if usize::from(bad) == i {
                            key.resize(max_key_bytes + 1, b'!');
                        }
                        let arg = ValArg {
                            size: value.size.wrapping_add(i as u8),
                            len: value.len.wrapping_add(i as u16 * 13),
                            fill: value.fill,
                        };
                        let delete = deletes & (1 << (i % 64)) != 0;
                        (key, (!delete).then(|| h.value(&arg)))
                    })
                    .collect();
                h.batch(writes);
            }
            Op::Range { low, high, steps } => h.range(h.bound(low), h.bound(high), steps),
            Op::Prefix {
                prefix,
                cut,
                reverse,
            } => {
                let mut p = h.key(prefix);
                // A cut anywhere in a long key, too.
                let cut = match p.len() {
                    0..256 => usize::from(*cut),
                    len => usize::from(*cut) * len / 255,
                };
                p.truncate(cut);
                h.prefix(&p, *reverse);
            }
            Op::Flush => h.tree().flush().unwrap_or_else(|e| panic!("flush: {e}")),
            Op::Check => h.check_all(),
            Op::Checkpoint { incremental } => {
                if h.checkpoints_left > 0 {
                    h.checkpoints_left -= 1;
                    h.checkpoint(*incremental);
                }
            }
            Op::Reopen { checkpoint, close } => h.reopen(*checkpoint, *close),
        }
    }
    h.check_all();
    if std::env::var_os("BFDB_FUZZ_STATS").is_some() {
        // For judging a corpus: did its inputs reach splits, merges and evictions, and
        // values kept out of line?
        eprintln!(
            "BFDB_FUZZ_STATS {limits:?}, leaf pages of {} bytes, {:?}",
            h.tree().config().leaf_page_size_bytes,
            h.tree().stats()
        );
        if let Some(database) = &h.database {
            let s = database.db().stats();
            eprintln!(
                "BFDB_FUZZ_STATS value store: {} live values of {} bytes, {} bytes allocated",
                s.value_store_live_values, s.value_store_live_bytes, s.value_store_allocated_bytes
            );
        }
    }
    // Every key the model holds must be readable by a point lookup too (bounded, so
    // large inputs stay fast).
    for (k, v) in h.model.iter().take(128) {
        assert_eq!(
            h.tree().get(k).expect("get").as_ref(),
            Some(v),
            "final get {k:?}"
        );
    }
    h.check_value_store();
});
