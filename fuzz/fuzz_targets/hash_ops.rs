//! Differential fuzzing of a [`bfdb::HashStore`] against a `HashMap`.
//!
//! The input picks the key and value limits and then a sequence of operations on a hash
//! keyspace of a database in a temporary directory, with a tiny budget (64 KiB of memory,
//! 128 KiB of hot log and 512 KiB of cold log on disk) so that the hot log flushes, and
//! both compactions run, after a few hundred writes: gets, `get_many`, inserts, deletes,
//! read-modify-writes, batches, runs of inserts or deletes over neighbouring keys, each
//! write at any durability; checkpoints; and reopens, with or without a checkpoint first.
//!
//! The model is two maps: `live`, what the store must answer now, and `durable`, what
//! a reopen without a checkpoint must bring back: the last checkpoint with every logged
//! write after it ([`Durability::Unlogged`] writes after the last checkpoint are gone).
//! Checkpoints are only taken by the input (the background trigger and the checkpoint on
//! close are off), so the model knows exactly what each one captured. Every answer must
//! equal the model's, including `EmptyKey` / `KeyTooLarge` / `ValueTooLarge` for bad
//! arguments (a refused write changes nothing, and a refused batch none of its keys), and
//! after each reopen every key ever written is read back.
//!
//! The store's compactor runs in a background thread, so an input's run is not
//! entirely deterministic: a failing input replays the same operations, but the failure
//! may take several replays (the first one found, a record lost from a checkpoint's
//! extent, came back in about one replay of five). `BFDB_FUZZ_TRACE=1` prints the
//! operations as they run and checks every key before each reopen as well.

#![no_main]

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arbitrary::{Arbitrary, Unstructured};
use bfdb::{
    Backend, Config, Db, DbOptions, Durability, Error, HashStore, HashStoreOptions, WriteBatch,
};
use libfuzzer_sys::fuzz_target;

/// `(max_key_bytes, max_value_bytes)` pairs the config accepts: small limits make
/// refused writes common, the default ones put few records in a hot log page, and the
/// last lets values past the inline limit (2048), which the value store keeps.
const LIMITS: [(usize, usize); 4] = [(16, 64), (64, 256), (512, 2048), (64, 8192)];

/// At most this many operations per input, so one input stays fast.
const MAX_OPS: usize = 512;

/// At most this many keys per run of inserts or deletes, and per batch.
const MAX_RUN: usize = 64;

/// Key ids wrap at this: the largest values of so many keys fill about half the cold
/// log's budget, so compactions free space (with more, writers compact all the time).
const KEY_IDS: u16 = 256;

#[derive(Debug)]
struct Input {
    limits: u8,
    ops: Vec<Op>,
}

/// Operations are read one after the other until the input ends, so that every byte
/// of a long input is an operation (a derived `Vec` stops at its first short field).
impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Input> {
        let limits = u.arbitrary()?;
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_OPS {
            ops.push(u.arbitrary()?);
        }
        Ok(Input { limits, ops })
    }
}

/// A key: `k` and its id, then padding up to one byte past the limit (so over-long
/// keys appear now and then); `Empty` is the empty key, which a hash store refuses
/// (`EmptyKey`, as a tree does).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeyArg {
    Id { id: u16, pad: u8 },
    Empty,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct ValArg {
    len: u16,
    fill: u8,
}

/// What a read-modify-write does to the old value (empty if there is none).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Update {
    /// Appends `n` bytes of `fill`: values grow until they pass the limit.
    Append { n: u8, fill: u8 },
    /// Keeps the first half.
    Halve,
    /// Replaces the value with a new one.
    Replace(ValArg),
}

/// A write's durability: mostly logged, a few synced (each waits for the disk).
#[derive(Debug, Clone, Copy)]
enum Level {
    Unlogged,
    Logged,
    Synced,
}

impl<'a> Arbitrary<'a> for Level {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Level> {
        Ok(match u8::arbitrary(u)? % 8 {
            0..=2 => Level::Unlogged,
            3..=6 => Level::Logged,
            _ => Level::Synced,
        })
    }
}

impl Level {
    fn durability(self) -> Durability {
        match self {
            Level::Unlogged => Durability::Unlogged,
            Level::Logged => Durability::Logged,
            Level::Synced => Durability::Synced,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Get(KeyArg),
    /// Reads `count` keys with consecutive ids starting at `id`, each padded by `pad`.
    GetMany {
        id: u16,
        count: u8,
        pad: u8,
    },
    Insert(KeyArg, ValArg, Level),
    Delete(KeyArg, Level),
    Rmw(KeyArg, Update, Level),
    /// Inserts `count` keys with consecutive ids starting at `id`.
    InsertRun {
        id: u16,
        count: u8,
        value: ValArg,
        level: Level,
    },
    /// Deletes `count` keys with consecutive ids starting at `id`.
    DeleteRun {
        id: u16,
        count: u8,
        level: Level,
    },
    /// One batch of `count` writes of keys with consecutive ids from `id`, the 48th on
    /// writing the first ones again (the later write wins): deletes where `deletes` has its bit set, the rest inserts
    /// of values built from `value`; the write at index `bad` (if any) has an
    /// over-long key, so the whole batch is refused.
    Batch {
        id: u16,
        count: u8,
        deletes: u64,
        value: ValArg,
        bad: u8,
        level: Level,
    },
    /// Reads `len` bytes of the key's value from `offset` (from `u64::MAX - offset` when
    /// `far`).
    GetPart {
        key: KeyArg,
        offset: u16,
        len: u16,
        far: bool,
    },
    Checkpoint,
    /// Drops the database and opens it again; with `checkpoint`, a checkpoint is taken
    /// first, so that nothing is lost.
    Reopen {
        checkpoint: bool,
    },
}

fn key_bytes(arg: KeyArg, max_key_bytes: usize) -> Vec<u8> {
    match arg {
        KeyArg::Id { id, pad } => id_key(id, pad, max_key_bytes),
        KeyArg::Empty => Vec::new(),
    }
}

fn id_key(id: u16, pad: u8, max_key_bytes: usize) -> Vec<u8> {
    let mut key = format!("k{}", id % KEY_IDS).into_bytes();
    let pad_len = usize::from(pad) % (max_key_bytes + 2);
    key.extend(std::iter::repeat_n(b'.', pad_len));
    key
}

/// A value: `len` bytes (modulo a bit more than the limit) of `fill`, with a serial
/// number in front so that a value overwritten with an equal-looking one is noticed.
fn value_bytes(arg: ValArg, serial: u64, max_value_bytes: usize) -> Vec<u8> {
    let len = usize::from(arg.len) % (max_value_bytes + 2);
    let mut v = vec![arg.fill; len];
    let tag = serial.to_le_bytes();
    let n = len.min(tag.len());
    v[..n].copy_from_slice(&tag[..n]);
    v
}

fn apply_update(
    update: Update,
    serial: u64,
    max_value_bytes: usize,
    old: Option<&[u8]>,
) -> Vec<u8> {
    let old = old.unwrap_or_default();
    match update {
        Update::Append { n, fill } => {
            let mut v = old.to_vec();
            v.extend(std::iter::repeat_n(fill, usize::from(n)));
            v
        }
        Update::Halve => old[..old.len() / 2].to_vec(),
        Update::Replace(arg) => value_bytes(arg, serial, max_value_bytes),
    }
}

/// A directory of its own under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("bfdb-fuzz-hash-{}-{n}", std::process::id()));
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

type Model = HashMap<Vec<u8>, Vec<u8>>;

/// The open database and its hash keyspace.
struct Open {
    /// Declared before `db`: the handle is dropped before its database.
    store: Arc<HashStore>,
    db: Db,
}

struct Harness {
    max_key_bytes: usize,
    max_value_bytes: usize,
    /// `None` only while it is reopened.
    open: Option<Open>,
    /// Declared after `open`: removed once the database is closed.
    dir: TempDir,
    /// What the store must answer now.
    live: Model,
    /// What a reopen without a checkpoint must find: the last checkpoint and every
    /// logged write since.
    durable: Model,
    /// Every key a write named, for the checks after a reopen.
    written: BTreeSet<Vec<u8>>,
    serial: u64,
    /// What the store did in the databases closed so far (its stats count from an
    /// open): hot→cold and cold→cold compactions, throttled writes, appended records.
    done: [u64; 4],
}

impl Harness {
    fn options(max_key_bytes: usize, max_value_bytes: usize) -> DbOptions {
        DbOptions::default()
            .config(Config {
                memory_budget_bytes: 1 << 20,
                // Buffered IO: the page cache answers the many reads of records on
                // disk (with `O_DIRECT` each waits for the device, and an input's
                // reads after its reopens took tens of seconds).
                backend: Backend::Std,
                max_key_bytes,
                max_value_bytes,
                huge_pages: false,
                ..Config::default()
            })
            .log_segment_bytes(64 << 10)
            // Checkpoints only when the input asks: the model knows what each holds.
            .checkpoint_log_bytes(0)
            .checkpoint_interval(None)
            .checkpoint_on_close(false)
    }

    fn hash_options() -> HashStoreOptions {
        HashStoreOptions::default()
            .memory_bytes(64 << 10)
            .expected_keys(u64::from(KEY_IDS))
            .hot_log_disk_bytes(128 << 10)
            .cold_log_disk_bytes(512 << 10)
            .compaction_threads(1)
    }

    fn open(dir: &Path, max_key_bytes: usize, max_value_bytes: usize) -> Open {
        let db = Db::open(dir, Self::options(max_key_bytes, max_value_bytes))
            .unwrap_or_else(|e| panic!("opening the database: {e}"));
        let store = db
            .hash_store_with("h", Self::hash_options())
            .unwrap_or_else(|e| panic!("opening the hash store: {e}"));
        Open { store, db }
    }

    fn new(max_key_bytes: usize, max_value_bytes: usize) -> Harness {
        let dir = TempDir::new();
        let open = Self::open(dir.path(), max_key_bytes, max_value_bytes);
        Harness {
            max_key_bytes,
            max_value_bytes,
            open: Some(open),
            dir,
            live: Model::new(),
            durable: Model::new(),
            written: BTreeSet::new(),
            serial: 0,
            done: [0; 4],
        }
    }

    fn store(&self) -> &HashStore {
        &self.open.as_ref().expect("the database is open").store
    }

    fn db(&self) -> &Db {
        &self.open.as_ref().expect("the database is open").db
    }

    fn key_ok(&self, key: &[u8]) -> bool {
        !key.is_empty() && key.len() <= self.max_key_bytes
    }

    fn expect_bad_key<T: std::fmt::Debug>(&self, what: &str, key: &[u8], got: Result<T, Error>) {
        match got {
            Err(Error::EmptyKey) if key.is_empty() => {}
            Err(Error::KeyTooLarge { len, max })
                if len == key.len() && max == self.max_key_bytes => {}
            got => panic!(
                "{what} of a {}-byte key: expected EmptyKey or KeyTooLarge, got {got:?}",
                key.len()
            ),
        }
    }

    fn expect_value_too_large<T: std::fmt::Debug>(
        &self,
        what: &str,
        key: &[u8],
        len: usize,
        got: Result<T, Error>,
    ) {
        match got {
            Err(Error::ValueTooLarge { len: l, max })
                if l == len && max == self.max_value_bytes => {}
            got => panic!(
                "{what} of key {key:?}, a {len}-byte value: expected ValueTooLarge, got {got:?}"
            ),
        }
    }

    /// Applies a write the store acknowledged to the model.
    fn model_write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>, logged: bool) {
        if logged {
            match &value {
                Some(v) => self.durable.insert(key.clone(), v.clone()),
                None => self.durable.remove(&key),
            };
        }
        match value {
            Some(v) => self.live.insert(key.clone(), v),
            None => self.live.remove(&key),
        };
        self.written.insert(key);
    }

    fn get(&self, key: &[u8]) {
        let got = self.store().get(key);
        if !self.key_ok(key) {
            return self.expect_bad_key("get", key, got);
        }
        let got = got.unwrap_or_else(|e| panic!("get of key {key:?}: {e}"));
        assert_eq!(got.as_ref(), self.live.get(key), "get of key {key:?}");
    }

    fn get_part(&self, key: &[u8], offset: u64, len: usize) {
        let got = self.store().get_part(key, offset, len);
        if !self.key_ok(key) {
            return self.expect_bad_key("get_part", key, got);
        }
        let got = got.unwrap_or_else(|e| panic!("get_part of key {key:?}: {e}"));
        let want = self.live.get(key).map(|v| {
            let from = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
            v[from..from.saturating_add(len).min(v.len())].to_vec()
        });
        assert_eq!(got, want, "get_part of key {key:?}, {len} bytes from {offset}");
    }

    fn get_many(&self, keys: &[Vec<u8>]) {
        let got = self.store().get_many(keys);
        if let Some(bad) = keys.iter().find(|k| !self.key_ok(k)) {
            return self.expect_bad_key("get_many", bad, got);
        }
        let got = got.unwrap_or_else(|e| panic!("get_many of {keys:?}: {e}"));
        let want: Vec<Option<Vec<u8>>> = keys.iter().map(|k| self.live.get(k).cloned()).collect();
        assert_eq!(got, want, "get_many of {keys:?}");
    }

    fn insert(&mut self, key: Vec<u8>, arg: ValArg, level: Level) {
        self.serial += 1;
        let value = value_bytes(arg, self.serial, self.max_value_bytes);
        let got = self.store().insert_with(&key, &value, level.durability());
        if !self.key_ok(&key) {
            self.expect_bad_key("insert", &key, got);
        } else if value.len() > self.max_value_bytes {
            self.expect_value_too_large("insert", &key, value.len(), got);
        } else {
            got.unwrap_or_else(|e| panic!("insert of key {key:?}: {e}"));
            self.model_write(key, Some(value), !matches!(level, Level::Unlogged));
        }
    }

    fn delete(&mut self, key: Vec<u8>, level: Level) {
        let got = self.store().delete_with(&key, level.durability());
        if !self.key_ok(&key) {
            self.expect_bad_key("delete", &key, got);
        } else {
            got.unwrap_or_else(|e| panic!("delete of key {key:?}: {e}"));
            self.model_write(key, None, !matches!(level, Level::Unlogged));
        }
    }

    fn rmw(&mut self, key: Vec<u8>, update: Update, level: Level) {
        self.serial += 1;
        let (serial, max) = (self.serial, self.max_value_bytes);
        let got = self.store().rmw_with(
            &key,
            |old| apply_update(update, serial, max, old),
            level.durability(),
        );
        if !self.key_ok(&key) {
            return self.expect_bad_key("rmw", &key, got);
        }
        let want = apply_update(update, serial, max, self.live.get(&key).map(Vec::as_slice));
        if want.len() > max {
            // Refused: the key keeps its value (or its absence).
            return self.expect_value_too_large("rmw", &key, want.len(), got);
        }
        let got = got.unwrap_or_else(|e| panic!("rmw of key {key:?}: {e}"));
        assert_eq!(got, want, "rmw of key {key:?} returned another value");
        self.model_write(key, Some(want), !matches!(level, Level::Unlogged));
    }

    fn batch(&mut self, writes: &[(Vec<u8>, Option<ValArg>)], level: Level) {
        let mut batch = WriteBatch::new();
        let mut planned = Vec::new();
        let mut refused = false;
        for (key, v) in writes {
            let (key, v) = (key.clone(), *v);
            let value = v.map(|v| {
                self.serial += 1;
                value_bytes(v, self.serial, self.max_value_bytes)
            });
            match &value {
                Some(value) => batch.insert_hash(self.store(), &key, value),
                None => batch.delete_hash(self.store(), &key),
            }
            refused |= !self.key_ok(&key)
                || value
                    .as_ref()
                    .is_some_and(|v| v.len() > self.max_value_bytes);
            planned.push((key, value));
        }
        let got = self.db().write_with(batch, level.durability());
        if refused {
            match got {
                Err(Error::EmptyKey | Error::KeyTooLarge { .. } | Error::ValueTooLarge { .. }) => {}
                got => panic!("a batch with a bad key or value: {got:?}"),
            }
            return;
        }
        got.unwrap_or_else(|e| panic!("a batch of {} writes: {e}", planned.len()));
        // A batch is logged at every level.
        for (key, value) in planned {
            self.model_write(key, value, true);
        }
    }

    fn checkpoint(&mut self) {
        self.db()
            .checkpoint()
            .unwrap_or_else(|e| panic!("checkpoint: {e}"));
        self.durable = self.live.clone();
    }

    fn reopen(&mut self, checkpoint: bool) {
        if std::env::var_os("BFDB_FUZZ_TRACE").is_some() {
            self.check_all("before a reopen");
        }
        if checkpoint {
            self.checkpoint();
            if std::env::var_os("BFDB_FUZZ_TRACE").is_some() {
                self.check_all("after the checkpoint before a reopen");
            }
        }
        // Closing makes every logged write durable; without a checkpoint, the unlogged
        // writes since the last one are lost.
        self.done = self.stats();
        self.open = None;
        self.open = Some(Self::open(
            self.dir.path(),
            self.max_key_bytes,
            self.max_value_bytes,
        ));
        self.live = self.durable.clone();
        self.check_all(if checkpoint {
            "after a reopen with a checkpoint"
        } else {
            "after a reopen without a checkpoint"
        });
    }

    /// [`Harness::done`] with what the open store did.
    fn stats(&self) -> [u64; 4] {
        let s = self.store().stats();
        let now = [
            s.hot_cold_compactions,
            s.cold_cold_compactions,
            s.throttled_writes,
            s.appended_records,
        ];
        std::array::from_fn(|i| self.done[i] + now[i])
    }

    /// Every key written agrees with the model.
    fn check_all(&self, what: &str) {
        for key in &self.written {
            let got = self
                .store()
                .get(key)
                .unwrap_or_else(|e| panic!("{what}: get of key {key:?}: {e}"));
            assert_eq!(got.as_ref(), self.live.get(key), "{what}: key {key:?}");
        }
    }
}

fuzz_target!(|input: Input| {
    let (max_key_bytes, max_value_bytes) = LIMITS[usize::from(input.limits) % LIMITS.len()];
    let mut h = Harness::new(max_key_bytes, max_value_bytes);
    let trace = std::env::var_os("BFDB_FUZZ_TRACE").is_some();
    for (i, op) in input.ops.iter().take(MAX_OPS).enumerate() {
        if trace {
            eprintln!("BFDB_FUZZ_TRACE op {i}: {op:?}");
        }
        match op {
            Op::Get(k) => h.get(&key_bytes(*k, max_key_bytes)),
            Op::GetMany { id, count, pad } => {
                let keys: Vec<Vec<u8>> = (0..usize::from(*count) % (MAX_RUN + 1))
                    .map(|i| id_key(id.wrapping_add(i as u16), *pad, max_key_bytes))
                    .collect();
                h.get_many(&keys);
            }
            Op::Insert(k, v, level) => h.insert(key_bytes(*k, max_key_bytes), *v, *level),
            Op::Delete(k, level) => h.delete(key_bytes(*k, max_key_bytes), *level),
            Op::Rmw(k, update, level) => h.rmw(key_bytes(*k, max_key_bytes), *update, *level),
            Op::InsertRun {
                id,
                count,
                value,
                level,
            } => {
                for i in 0..usize::from(*count) % (MAX_RUN + 1) {
                    let key = id_key(id.wrapping_add(i as u16), 0, max_key_bytes);
                    h.insert(key, *value, *level);
                }
            }
            Op::DeleteRun { id, count, level } => {
                for i in 0..usize::from(*count) % (MAX_RUN + 1) {
                    h.delete(id_key(id.wrapping_add(i as u16), 0, max_key_bytes), *level);
                }
            }
            &Op::Batch {
                id,
                count,
                deletes,
                value,
                bad,
                level,
            } => {
                let writes: Vec<(Vec<u8>, Option<ValArg>)> = (0..usize::from(count)
                    % (MAX_RUN + 1))
                    .map(|i| {
                        let mut key = id_key(id.wrapping_add((i % 48) as u16), 0, max_key_bytes);
                        if usize::from(bad) == i {
                            // Past the limit: the batch is refused.
                            key.resize(max_key_bytes + 1, b'!');
                        }
                        let value = ValArg {
                            len: value.len.wrapping_add(i as u16 * 13),
                            fill: value.fill,
                        };
                        let delete = deletes & (1 << (i % 64)) != 0;
                        (key, (!delete).then_some(value))
                    })
                    .collect();
                h.batch(&writes, level);
            }
            &Op::GetPart {
                key,
                offset,
                len,
                far,
            } => {
                let offset = match far {
                    true => u64::MAX - u64::from(offset),
                    false => u64::from(offset),
                };
                h.get_part(&key_bytes(key, max_key_bytes), offset, usize::from(len));
            }
            Op::Checkpoint => h.checkpoint(),
            Op::Reopen { checkpoint } => h.reopen(*checkpoint),
        }
    }
    h.check_all("at the end");
    if std::env::var_os("BFDB_FUZZ_STATS").is_some() {
        let [hot_cold, cold_cold, throttled, appended] = h.stats();
        eprintln!(
            "BFDB_FUZZ_STATS limits {max_key_bytes}/{max_value_bytes}: {hot_cold} hot→cold and \
             {cold_cold} cold→cold compactions, {throttled} throttled writes, {appended} \
             records appended, {} keys written",
            h.written.len()
        );
    }
});
