//! The crash campaign of the database directory over a simulated log device
//! (`SimLog`, which keeps live and durable bytes apart and tears unsynced 512-byte
//! sectors at a crash) and simulated page and hash-log files (`SimPages`): seeded
//! workloads of single writes at every durability level, deletes, read-modify-writes,
//! and batches across three keyspaces — two trees and a hash store whose tiny budget
//! makes its logs flush and compact — crashed
//!
//! - at every sync in turn (the sync fails, the workload stops at the first refused
//!   write, the device crashes),
//! - after every operation (a crash snapshot of the device as it is, mid-flight writes
//!   and all),
//! - and with one bit of the log flipped,
//!
//! then reopened, and compared with the model: the recovered database must be the
//! result of a prefix of the logged writes, in log order, that includes every write
//! acknowledged as durable — so no synced write is lost, no batch appears in part, no
//! record appears that was never written — and each tree's full scan must equal its
//! point reads. Every test prints its seed; replay one with `BFDB_SEED=<seed>`.
//!
//! The sweeps at every sync, every checkpoint step and after every operation also run
//! with long keys (`Keys::Long`, issue #34): a third of the keys up to 4 KiB, many of
//! them sharing prefixes of up to 3900 bytes (so fences and separators are as long), in
//! 16 KiB leaf pages, in the trees and in the hash store alike, batches mixing them with
//! short ones.
//!
//! More seeds: `BFDB_CRASH_SEEDS=50 cargo test --release --test db_crash`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use std::path::Path;

use bfdb::storage::{LogDevice, SimLog, SimPages};
use bfdb::{Db, DbOptions, Durability, HashStoreOptions, WriteBatch};

mod common;
use common::{HASH, KEYS, KEYSPACES, Keys, Rng, env_u64, seed};

fn hash_options() -> HashStoreOptions {
    Keys::Short.hash_options()
}

fn options() -> DbOptions {
    Keys::Short.sim_options()
}

/// One write of a step: keyspace index, key, value (`None` deletes).
type Write = (usize, Vec<u8>, Option<Vec<u8>>);

/// The state of the three keyspaces.
type State = [BTreeMap<Vec<u8>, Vec<u8>>; 3];

/// One call of the workload.
#[derive(Clone, Debug)]
enum Step {
    /// A single write or a batch, at a level; `acked` once the call returned `Ok`.
    Write {
        writes: Vec<Write>,
        level: Durability,
        acked: bool,
    },
    /// `db.persist()`; `acked` once it returned `Ok`.
    Persist { acked: bool },
    /// `db.checkpoint()` or `db.checkpoint_incremental()`; `acked` once it returned
    /// `Ok`.
    Checkpoint { acked: bool },
}

/// A roll of `run_workload` that takes a checkpoint (rolls 5 to 7 do).
const CHECKPOINT_ROLL: u64 = 5;
/// A roll of `run_workload` that puts one key (rolls 55 and up do).
const PUT_ROLL: u64 = 60;

/// Runs up to `ops` seeded steps of `keys` on `db`, stopping after the first that
/// fails, and calls `after_step` after each one.
fn run_workload(
    db: &Db,
    seed: u64,
    ops: usize,
    keys: Keys,
    mut after_step: impl FnMut(&[Step]),
) -> Vec<Step> {
    let trees = [
        db.tree(KEYSPACES[0]).unwrap(),
        db.tree(KEYSPACES[1]).unwrap(),
    ];
    let hash = db
        .hash_store_with(KEYSPACES[HASH], keys.hash_options())
        .unwrap();
    let mut rng = Rng(seed);
    let mut steps = Vec::new();
    let mut counter = 0u64;
    let mut next_value = |rng: &mut Rng, ks: usize| {
        counter += 1;
        // Values of assorted sizes, each unique: a recovered value names its write. The
        // hash store's are larger, so that its few pages fill, flush and compact. One
        // value in eight, of either kind, is longer than the inline limit and goes to
        // the value store; its write number runs through all of it, so a value torn or
        // mixed from two writes matches no write.
        let stamp = format!("{seed}-{counter}-").into_bytes();
        let pad = match ks {
            _ if rng.below(8) == 0 => 2_049 + rng.below(20_000) as usize,
            HASH => 1_200,
            // With long keys, tree records of a KiB or two: more leaf pages of each
            // family of shared prefixes, so that their separators fill inner nodes.
            _ if keys == Keys::Long => 600 + rng.below(1_200) as usize,
            _ => 0,
        };
        common::repeated(&stamp, stamp.len() + pad + rng.below(300) as usize)
    };
    for op in 0..ops {
        // Unlogged writes only in every other run of 100 steps: a background
        // checkpoint merges everything after one, and leaves recently written pages
        // dirty (their writes replayed from the previous checkpoint) only without.
        let level = match rng.below(3) {
            0 if (op / 100) % 2 == 0 => Durability::Unlogged,
            0 | 1 => Durability::Logged,
            _ => Durability::Synced,
        };
        // Every 80th step is a checkpoint, on top of the random 3%: a seed whose rolls
        // gave one checkpoint in 250 steps synced its page files twice, too few for the
        // campaign at every page sync to mean anything.
        // In a run without unlogged writes, background checkpoints at its 40th and 80th
        // steps, the second right after single logged puts: it finds only logged writes
        // since the first began, and leaves a page they dirtied to the log, whatever
        // the rolls.
        let quiet_run = (op / 100) % 2 == 1;
        let leaves_pages = quiet_run && matches!(op % 100, 39 | 79);
        let roll = match rng.percent() {
            _ if op % 80 == 79 || leaves_pages => CHECKPOINT_ROLL,
            _ if quiet_run && (70..79).contains(&(op % 100)) => PUT_ROLL,
            roll => roll,
        };
        let key = |rng: &mut Rng| keys.key(rng.below(KEYS));
        let (writes, ok) = if roll < 5 {
            let ok = db.persist().is_ok();
            steps.push(Step::Persist { acked: ok });
            after_step(&steps);
            if !ok {
                break;
            }
            continue;
        } else if roll < 8 {
            // Mostly the background kind, which leaves recently written pages dirty
            // and replays their writes from the previous checkpoint's position.
            let ok = if rng.below(4) == 0 && !leaves_pages {
                db.checkpoint()
            } else {
                db.checkpoint_incremental()
            }
            .is_ok();
            steps.push(Step::Checkpoint { acked: ok });
            after_step(&steps);
            if !ok {
                break;
            }
            continue;
        } else if roll < 25 {
            let mut batch = WriteBatch::new();
            let mut writes = Vec::new();
            for _ in 0..2 + rng.below(4) {
                let ks = rng.below(3) as usize;
                let k = key(&mut rng);
                if rng.percent() < 20 {
                    match ks {
                        HASH => batch.delete_hash(&hash, &k),
                        _ => batch.delete(&trees[ks], &k),
                    }
                    writes.push((ks, k, None));
                } else {
                    let v = next_value(&mut rng, ks);
                    match ks {
                        HASH => batch.insert_hash(&hash, &k, &v),
                        _ => batch.insert(&trees[ks], &k, &v),
                    }
                    writes.push((ks, k, Some(v)));
                }
            }
            (writes.clone(), db.write_with(batch, level).is_ok())
        } else {
            let ks = rng.below(3) as usize;
            let k = key(&mut rng);
            if roll < 40 {
                let ok = match ks {
                    HASH => hash.delete_with(&k, level).is_ok(),
                    _ => trees[ks].delete_with(&k, level).is_ok(),
                };
                (vec![(ks, k, None)], ok)
            } else if ks == HASH && roll < 55 {
                // A read-modify-write whose result is a fresh value: a put, as the log
                // records it.
                let v = next_value(&mut rng, ks);
                let ok = hash.rmw_with(&k, |_| v.clone(), level).is_ok();
                (vec![(ks, k, Some(v))], ok)
            } else {
                let v = next_value(&mut rng, ks);
                let ok = match ks {
                    HASH => hash.insert_with(&k, &v, level).is_ok(),
                    _ => trees[ks].insert_with(&k, &v, level).is_ok(),
                };
                (vec![(ks, k, Some(v))], ok)
            }
        };
        steps.push(Step::Write {
            writes,
            level,
            acked: ok,
        });
        after_step(&steps);
        if !ok {
            break;
        }
    }
    steps
}

/// What a recovery after `steps` may find, from the checkpoint at step index `from`
/// (`None`: no checkpoint): the state at that checkpoint (every write before it, logged
/// or not, since the workload is single-threaded), the logged writes after it in log
/// order, and how many of those must be there (through the last acknowledged synced
/// write or persist).
struct Candidate<'s> {
    base: State,
    log: Vec<&'s [Write]>,
    must_keep: usize,
}

fn candidate(steps: &[Step], from: Option<usize>) -> Candidate<'_> {
    let mut base = State::default();
    let start = from.map_or(0, |i| i + 1);
    for step in &steps[..start] {
        if let Step::Write {
            writes,
            acked,
            level,
            ..
        } = step
        {
            // A write that failed may or may not have applied; the workload stops at
            // the first failure, and a checkpoint step is never after one.
            debug_assert!(*acked || *level != Durability::Unlogged);
            apply(&mut base, writes);
        }
    }
    let mut log = Vec::new();
    let mut must_keep = 0;
    for step in &steps[start..] {
        match step {
            Step::Write {
                writes,
                level,
                acked,
            } => {
                if *level != Durability::Unlogged || writes.len() > 1 {
                    // Batches are logged at every level.
                    log.push(&writes[..]);
                    if *acked && *level == Durability::Synced {
                        must_keep = log.len();
                    }
                }
            }
            Step::Persist { acked: true } => must_keep = log.len(),
            Step::Persist { acked: false } | Step::Checkpoint { .. } => {}
        }
    }
    Candidate {
        base,
        log,
        must_keep,
    }
}

/// The checkpoints a recovery after `steps` may start from: the last acknowledged one
/// (or none), and a later one whose call failed (it may have committed before failing).
fn checkpoint_candidates(steps: &[Step]) -> Vec<Option<usize>> {
    let last_acked = steps
        .iter()
        .rposition(|s| matches!(s, Step::Checkpoint { acked: true }));
    let mut out = vec![last_acked];
    if let Some(i) = steps
        .iter()
        .rposition(|s| matches!(s, Step::Checkpoint { acked: false }))
        && last_acked.is_none_or(|a| i > a)
    {
        out.push(Some(i));
    }
    out
}

fn apply(state: &mut State, writes: &[Write]) {
    for (ks, k, v) in writes {
        match v {
            Some(v) => state[*ks].insert(k.clone(), v.clone()),
            None => state[*ks].remove(k),
        };
    }
}

/// Reads the trees of `db` by full scans, checking each record against a point read,
/// and the hash store by point reads of every key the workload of `keys` writes.
fn read_back(db: &Db, keys: Keys) -> State {
    let mut state = State::default();
    let hash = db
        .hash_store_with(KEYSPACES[HASH], keys.hash_options())
        .unwrap();
    for i in 0..KEYS {
        let k = keys.key(i);
        if let Some(v) = hash.get(&k).unwrap() {
            state[HASH].insert(k, v);
        }
    }
    for (ks, name) in KEYSPACES[..HASH].iter().enumerate() {
        let tree = db.tree(name).unwrap();
        for record in tree.range::<&[u8], _>(..) {
            let (k, v) = record.unwrap();
            assert_eq!(
                tree.get(&k).unwrap().as_ref(),
                Some(&v),
                "scan and get disagree"
            );
            state[ks].insert(k, v);
        }
    }
    state
}

/// Checks that `recovered` is a checkpoint's state plus a prefix of the logged writes
/// after it that keeps every durable one; returns the number of writes replayed.
fn check_prefix(recovered: &State, steps: &[Step], what: &str) -> usize {
    for from in checkpoint_candidates(steps) {
        let c = candidate(steps, from);
        let mut state = c.base.clone();
        for writes in &c.log[..c.must_keep] {
            apply(&mut state, writes);
        }
        for p in c.must_keep..=c.log.len() {
            if p > c.must_keep {
                apply(&mut state, c.log[p - 1]);
            }
            if &state == recovered {
                return p;
            }
        }
    }
    let c = candidate(steps, checkpoint_candidates(steps)[0]);
    panic!(
        "{what}: the recovered state is no checkpoint plus a prefix of the log from {} \
         (durable) to {} (written) records; recovered {} + {} + {} keys",
        c.must_keep,
        c.log.len(),
        recovered[0].len(),
        recovered[1].len(),
        recovered[2].len()
    );
}

/// The two simulated devices of a database: its log and its page files; and the keys
/// its workload writes, which its options follow.
struct Devices {
    log: Arc<SimLog>,
    pages: Arc<SimPages>,
    keys: Keys,
}

impl Devices {
    fn new(seed: u64) -> Devices {
        Devices::with_keys(seed, Keys::Short)
    }

    fn with_keys(seed: u64, keys: Keys) -> Devices {
        Devices {
            log: Arc::new(SimLog::new(seed)),
            pages: Arc::new(SimPages::new(seed)),
            keys,
        }
    }

    /// What a restarted process finds. The caller makes sure no write is running: the
    /// two devices are crashed one after the other.
    fn crash(&self) -> Devices {
        Devices {
            log: Arc::new(self.log.crash()),
            pages: Arc::new(self.pages.crash()),
            keys: self.keys,
        }
    }

    fn open_with(&self, dir: &Path, options: DbOptions) -> bfdb::Result<Db> {
        Db::open_simulated(
            dir,
            options,
            self.log.clone() as Arc<dyn LogDevice>,
            self.pages.clone(),
        )
    }

    fn open(&self, dir: &Path) -> Db {
        self.open_with(dir, self.keys.sim_options()).unwrap()
    }
}

/// Seeds to run: one from `seed()`, and `BFDB_CRASH_SEEDS` more derived from it.
fn seeds(test: &str) -> Vec<u64> {
    let first = seed(test);
    let n = env_u64("BFDB_CRASH_SEEDS").unwrap_or(1);
    (0..n)
        .map(|i| first.wrapping_add(i * 0x9E37_79B9))
        .collect()
}

/// What the runs of `crash_run` of each kind of keys did, in the order of `Keys`:
/// hot→cold compactions of the hash store, and the trees' leaf and inner splits.
static HASH_COMPACTIONS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
/// Cold→cold compactions of the hash store: with short keys, merges of its cold runs.
static HASH_MERGES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static LEAF_SPLITS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static INNER_SPLITS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Runs the workload of `seed` and `keys` on a fresh database with a fault armed by
/// `arm` once its keyspaces exist, crashes it, reopens it, and checks the model;
/// returns the writes replayed and whether the fault fired (a call failed).
fn crash_run(seed: u64, ops: usize, keys: Keys, arm: impl FnOnce(&Db, &Devices)) -> (usize, bool) {
    let dir = tempfile::tempdir().unwrap();
    let devices = Devices::with_keys(seed, keys);
    let db = devices.open(dir.path());
    db.tree(KEYSPACES[0]).unwrap();
    db.tree(KEYSPACES[1]).unwrap();
    db.hash_store_with(KEYSPACES[HASH], keys.hash_options())
        .unwrap();
    arm(&db, &devices);
    let steps = run_workload(&db, seed, ops, keys, |_| {});
    let hash_stats = db
        .hash_store_with(KEYSPACES[HASH], keys.hash_options())
        .unwrap()
        .stats();
    let k = keys as usize;
    HASH_COMPACTIONS[k].fetch_add(hash_stats.hot_cold_compactions, Ordering::Relaxed);
    HASH_MERGES[k].fetch_add(hash_stats.cold_cold_compactions, Ordering::Relaxed);
    for name in &KEYSPACES[..HASH] {
        let stats = db.tree(name).unwrap().stats();
        LEAF_SPLITS[k].fetch_add(stats.leaf_splits, Ordering::Relaxed);
        INNER_SPLITS[k].fetch_add(stats.inner_splits, Ordering::Relaxed);
    }
    let fired = steps.iter().any(|s| {
        matches!(
            s,
            Step::Write { acked: false, .. }
                | Step::Persist { acked: false }
                | Step::Checkpoint { acked: false }
        )
    });
    let crashed = devices.crash();
    drop(db);
    let db = crashed.open(dir.path());
    let recovered = read_back(&db, keys);
    (
        check_prefix(&recovered, &steps, &format!("seed {seed}, {keys:?} keys")),
        fired,
    )
}

#[test]
fn crashing_at_every_sync_loses_no_durable_write_and_no_batch_in_part() {
    crash_at_every_sync("crash_at_every_sync", Keys::Short);
}

#[test]
fn crashing_at_every_sync_with_long_keys_loses_no_durable_write_and_no_batch_in_part() {
    crash_at_every_sync("crash_at_every_sync_long_keys", Keys::Long);
}

/// The workload of `keys` crashed at each of its log syncs and page syncs in turn.
fn crash_at_every_sync(test: &str, keys: Keys) {
    let mut points = 0;
    let mut writes_checked = 0;
    for seed in seeds(test) {
        // Log syncs: the n-th fails, for every n the workload reaches.
        let mut n = 0;
        loop {
            let (checked, fired) = crash_run(seed, 250, keys, |_, d| d.log.fail_syncs_after(n));
            writes_checked += checked;
            points += 1;
            if !fired {
                break;
            }
            n += 1;
        }
        assert!(
            n > 20,
            "seed {seed}: the workload synced its log only {n} times"
        );
        // Page syncs (in checkpoints, which sync every keyspace's page file).
        let mut n = 0;
        loop {
            let (checked, fired) = crash_run(seed, 250, keys, |_, d| d.pages.fail_syncs_after(n));
            writes_checked += checked;
            points += 1;
            if !fired {
                break;
            }
            n += 1;
        }
        assert!(
            n > 3,
            "seed {seed}: the workload synced its pages only {n} times"
        );
    }
    let k = keys as usize;
    let compactions = HASH_COMPACTIONS[k].load(Ordering::Relaxed);
    let leaf_splits = LEAF_SPLITS[k].load(Ordering::Relaxed);
    let merges = HASH_MERGES[k].load(Ordering::Relaxed);
    assert!(compactions > 0, "the hash store never compacted");
    if keys.hash_options().cold_layout == bfdb::ColdLayout::Runs {
        assert!(merges > 0, "the hash store's cold runs were never merged");
    }
    assert!(leaf_splits > 0, "no leaf page split");
    eprintln!(
        "crash at every sync ({keys:?} keys): {points} crash points, {writes_checked} writes \
         replayed and checked, 0 lost; the hash store compacted {compactions} times into \
         its cold tier ({:?}) and {merges} times within it, the trees split {leaf_splits} \
         leaf pages and {} inner nodes",
        keys.hash_options().cold_layout,
        INNER_SPLITS[k].load(Ordering::Relaxed)
    );
}

#[test]
fn crashing_at_every_step_of_a_checkpoint_recovers_a_committed_state() {
    crash_in_checkpoints("crash_in_checkpoint", Keys::Short);
}

#[test]
fn crashing_at_every_step_of_a_checkpoint_with_long_keys_recovers_a_committed_state() {
    crash_in_checkpoints("crash_in_checkpoint_long_keys", Keys::Long);
}

/// The workload of `keys` crashed at each step of its checkpoints in turn.
fn crash_in_checkpoints(test: &str, keys: Keys) {
    use bfdb::CheckpointCrashPoint as P;
    let mut points = 0;
    for seed in seeds(test) {
        for point in [
            P::AfterFlush,
            P::AfterCapture,
            P::AfterPageSync,
            P::AfterLogFlush,
            P::AfterCheckpointFile,
            P::AfterCommit,
        ] {
            // The first checkpoint of the workload succeeds; the point is armed for the
            // ones after it, so the crash meets a kept checkpoint and its pins.
            let (_, fired) = crash_run(seed, 400, keys, |db, _| {
                db.checkpoint().unwrap();
                db.fail_checkpoints_at(point);
            });
            assert!(
                fired,
                "seed {seed}: the workload took no checkpoint at {point:?}"
            );
            points += 1;
        }
    }
    eprintln!("crash inside checkpoints ({keys:?} keys): {points} crash points, 0 lost");
}

#[test]
fn crashing_after_every_operation_recovers_a_prefix() {
    crash_after_every_op("crash_after_every_op", Keys::Short);
}

#[test]
fn crashing_after_every_operation_with_long_keys_recovers_a_prefix() {
    crash_after_every_op("crash_after_every_op_long_keys", Keys::Long);
}

/// The workload of `keys`, a copy of it crashed after every step.
fn crash_after_every_op(test: &str, keys: Keys) {
    let mut points = 0;
    let mut writes_checked = 0;
    let mut left_dirty = 0;
    for seed in seeds(test) {
        let (checked, n, left) = check_each_step(seed, 300, keys);
        writes_checked += checked;
        points += n;
        left_dirty += left;
    }
    // The checkpoints that leave pages dirty were among those crashed after.
    assert!(left_dirty > 0, "no checkpoint left a page dirty");
    eprintln!(
        "crash after every operation ({keys:?} keys): {points} crash points, {writes_checked} \
         recovered writes checked, 0 lost; checkpoints left {left_dirty} dirty pages to the log"
    );
}

/// Runs the workload of `seed` and `keys` and, after every step, crashes a copy of the
/// database (its devices and its directory's files) and checks what a reopen finds.
/// Answers the writes checked, the crash points, and the pages the checkpoints left
/// dirty.
fn check_each_step(seed: u64, ops: usize, keys: Keys) -> (usize, usize, u64) {
    let dir = tempfile::tempdir().unwrap();
    let devices = Devices::with_keys(seed, keys);
    let db = devices.open(dir.path());
    let (mut checked, mut points) = (0, 0);
    run_workload(&db, seed, ops, keys, |steps| {
        let copy = tempfile::tempdir().unwrap();
        copy_files(dir.path(), copy.path());
        let crashed = devices.crash();
        let db = crashed.open(copy.path());
        let recovered = read_back(&db, keys);
        checked += check_prefix(
            &recovered,
            steps,
            &format!("seed {seed}, {keys:?} keys, step {}", steps.len()),
        );
        points += 1;
    });
    (checked, points, db.stats().checkpoint_pages_left_dirty)
}

/// Copies the manifest and checkpoint files of `from` into `to` (not the lock).
fn copy_files(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name != "LOCK" {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

#[test]
fn a_flipped_log_bit_gives_an_error_or_a_prefix_never_a_wrong_state() {
    for seed in seeds("flipped_log_bit") {
        let dir = tempfile::tempdir().unwrap();
        let devices = Devices::new(seed);
        let db = devices.open(dir.path());
        let steps = run_workload(&db, seed, 200, Keys::Short, |_| {});
        db.persist().unwrap();
        drop(db);
        let mut rng = Rng(seed);
        let (mut errors, mut prefixes) = (0, 0);
        for _ in 0..40 {
            let crashed = devices.crash();
            let ids = crashed.log.list().unwrap();
            let id = ids[rng.below(ids.len() as u64) as usize];
            // Bits in the blocks of a 64-KiB segment and its header.
            let bit = rng.below(17 * 4096 * 8);
            crashed.log.flip_bit(id, bit);
            let copy = tempfile::tempdir().unwrap();
            copy_files(dir.path(), copy.path());
            match crashed.open_with(copy.path(), options()) {
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    errors += 1;
                }
                Ok(db) => {
                    // Damage the reader could not tell from a torn tail: the newest
                    // checkpoint plus any prefix of the log after it.
                    let recovered = read_back(&db, Keys::Short);
                    let ok = checkpoint_candidates_all(&steps).into_iter().any(|c| {
                        let cand = candidate(&steps, c);
                        let mut state = cand.base.clone();
                        (0..=cand.log.len()).any(|p| {
                            if p > 0 {
                                apply(&mut state, cand.log[p - 1]);
                            }
                            state == recovered
                        })
                    });
                    assert!(
                        ok,
                        "seed {seed}: a flipped bit gave a state no prefix explains"
                    );
                    prefixes += 1;
                }
            }
        }
        eprintln!("flipped bits: {errors} refused opens, {prefixes} prefixes");
    }
}

/// Every checkpoint step of `steps` (and none) as a start for recovery.
fn checkpoint_candidates_all(steps: &[Step]) -> Vec<Option<usize>> {
    std::iter::once(None)
        .chain(
            steps
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s, Step::Checkpoint { acked: true }))
                .map(|(i, _)| Some(i)),
        )
        .collect()
}

/// Writers on several threads, each batching the same value into its own key of both
/// keyspaces at random levels, while a checkpointer runs and the devices are crashed at
/// random moments: each crash recovers every thread's pair equal (no half batch) and at
/// least its last acknowledged durable value.
/// Checks that a writer's last recovered write `n` is at or past its last synced one
/// (`floor`) and at or below its last begun one (`ceiling`).
fn assert_acked_and_made(n: u64, floor: u64, ceiling: u64, who: &str) {
    assert!(
        n >= floor,
        "{who} lost synced write {floor} (recovered up to {n})"
    );
    assert!(n <= ceiling, "{who}: write {n} was never made");
}

/// The write number a concurrent test's value starts with (12 digits).
fn write_number(value: &[u8]) -> u64 {
    std::str::from_utf8(&value[..12]).unwrap().parse().unwrap()
}

/// Crashes a copy of `db` while its writers run: its directory's files copied and its
/// devices crashed at one moment. The files are real, and the two devices are crashed
/// one after the other: consistent as long as no checkpoint commits meanwhile, since a
/// write between the two only touches slots no kept checkpoint records (and log records
/// past what the pages need). Answers the copy, the crashed devices, and each writer's
/// counters read before (`durable`: its last write acknowledged durable) and after
/// (`tried`: its last write begun).
fn crash_copy(
    db: &Db,
    dir: &Path,
    devices: &Devices,
    durable: &[AtomicU64],
    tried: &[AtomicU64],
) -> (tempfile::TempDir, Devices, Vec<u64>, Vec<u64>) {
    let floor: Vec<u64> = durable.iter().map(|d| d.load(Ordering::SeqCst)).collect();
    let (copy, crashed) = db.with_checkpoints_paused(|| {
        let copy = tempfile::tempdir().unwrap();
        copy_files(dir, copy.path());
        (copy, devices.crash())
    });
    let ceiling: Vec<u64> = tried.iter().map(|d| d.load(Ordering::SeqCst)).collect();
    (copy, crashed, floor, ceiling)
}

/// [`crash_copy`], reopened and read back.
fn crash_during_writes(
    db: &Db,
    dir: &Path,
    devices: &Devices,
    durable: &[AtomicU64],
    tried: &[AtomicU64],
) -> (State, Vec<u64>, Vec<u64>) {
    let (copy, crashed, floor, ceiling) = crash_copy(db, dir, devices, durable, tried);
    let recovered = crashed.open_with(copy.path(), options()).unwrap();
    (read_back(&recovered, Keys::Short), floor, ceiling)
}

/// Single logged and synced tree writes from several threads while background
/// checkpoints, which leave recently written pages to the log, run every few
/// milliseconds; the devices are crashed at moments in between. Each thread writes its
/// own keys round robin, so what it recovers must be one prefix of its writes: every
/// key at its last write up to some point, at or past the last synced one.
#[test]
fn concurrent_single_writes_recover_a_prefix_under_background_checkpoints() {
    const THREADS: usize = 4;
    const KEYS_PER_THREAD: u64 = 40;
    let mut left_dirty = 0;
    for seed in seeds("concurrent_single_writes") {
        let dir = tempfile::tempdir().unwrap();
        let devices = Devices::new(seed);
        let opts = options()
            .flush_interval(Duration::from_millis(2))
            .checkpoint_interval(Some(Duration::from_millis(15)));
        let db = Arc::new(devices.open_with(dir.path(), opts).unwrap());
        let tree = db.tree(KEYSPACES[0]).unwrap();
        let durable: Arc<Vec<AtomicU64>> =
            Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let tried: Arc<Vec<AtomicU64>> =
            Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let key = |t: usize, n: u64| format!("t{t}-{:03}", n % KEYS_PER_THREAD).into_bytes();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (tree, durable, tried, stop) =
                    (tree.clone(), durable.clone(), tried.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(seed ^ (t as u64 + 1));
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let level = match rng.below(4) {
                            0 => Durability::Synced,
                            _ => Durability::Logged,
                        };
                        // Values of assorted sizes, so that leaves split.
                        let value = format!("{n:012}-{}", "v".repeat(rng.below(120) as usize));
                        tried[t].store(n, Ordering::SeqCst);
                        tree.insert_with(&key(t, n), value.as_bytes(), level)
                            .unwrap();
                        if level == Durability::Synced {
                            durable[t].store(n, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        let mut rng = Rng(seed);
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(5 + rng.below(40)));
            let (state, floor, ceiling) =
                crash_during_writes(&db, dir.path(), &devices, &durable, &tried);
            for t in 0..THREADS {
                let n_of = |k: u64| state[0].get(&key(t, k)).map(|v| write_number(v));
                // The prefix: the thread's last write that came back.
                let p = (0..KEYS_PER_THREAD).filter_map(n_of).max().unwrap_or(0);
                assert_acked_and_made(p, floor[t], ceiling[t], &format!("seed {seed}: thread {t}"));
                for k in 0..KEYS_PER_THREAD {
                    // The last write of key k at or before p.
                    let want = (p >= k.max(1)).then(|| p - (p - k) % KEYS_PER_THREAD);
                    let want = want.filter(|&w| w >= 1);
                    assert_eq!(
                        n_of(k),
                        want,
                        "seed {seed}: thread {t}'s key {k} is not at its last write up to {p}"
                    );
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        left_dirty += db.stats().checkpoint_pages_left_dirty;
        assert!(
            db.stats().checkpoints > 0,
            "no checkpoint ran during the test"
        );
    }
    assert!(left_dirty > 0, "no background checkpoint left a page dirty");
    eprintln!(
        "concurrent single writes: checkpoints left {left_dirty} dirty pages to the log, 0 lost"
    );
}

#[test]
fn concurrent_batches_crash_atomically() {
    const THREADS: usize = 4;
    for seed in seeds("concurrent_batches") {
        let dir = tempfile::tempdir().unwrap();
        let devices = Devices::new(seed);
        let opts = options()
            .flush_interval(Duration::from_millis(2))
            .checkpoint_interval(Some(Duration::from_millis(20)));
        let db = Arc::new(devices.open_with(dir.path(), opts.clone()).unwrap());
        let trees = [db.tree("a").unwrap(), db.tree("b").unwrap()];
        let hash = db.hash_store_with(KEYSPACES[HASH], hash_options()).unwrap();
        let durable: Arc<Vec<AtomicU64>> =
            Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let tried: Arc<Vec<AtomicU64>> =
            Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (db, trees, hash, durable, tried, stop) = (
                    db.clone(),
                    trees.clone(),
                    hash.clone(),
                    durable.clone(),
                    tried.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng(seed ^ t as u64);
                    let key = format!("thread{t}").into_bytes();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let level = match rng.below(3) {
                            0 => Durability::Logged,
                            _ => Durability::Synced,
                        };
                        let mut batch = WriteBatch::new();
                        let value = format!("{n:012}-{}", "x".repeat(rng.below(200) as usize));
                        batch.insert(&trees[0], &key, value.as_bytes());
                        batch.insert(&trees[1], &key, value.as_bytes());
                        batch.insert_hash(&hash, &key, value.as_bytes());
                        // Noise that splits leaves: other keys of the thread.
                        let noise = format!("noise{t}-{}", rng.below(300)).into_bytes();
                        batch.insert(&trees[(n % 2) as usize], &noise, value.as_bytes());
                        tried[t].store(n, Ordering::SeqCst);
                        db.write_with(batch, level).unwrap();
                        if level == Durability::Synced {
                            durable[t].store(n, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        let mut rng = Rng(seed);
        let mut checked = 0;
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(1 + rng.below(30)));
            let (copy, crashed, floor, ceiling) =
                crash_copy(&db, dir.path(), &devices, &durable, &tried);
            let db = crashed.open_with(copy.path(), options()).unwrap();
            let state = read_back(&db, Keys::Short);
            for t in 0..THREADS {
                let key = format!("thread{t}").into_bytes();
                let (a, b) = (state[0].get(&key), state[1].get(&key));
                assert_eq!(a, b, "seed {seed}: thread {t}'s batch recovered in part");
                let h = db
                    .hash_store_with(KEYSPACES[HASH], hash_options())
                    .unwrap()
                    .get(&key)
                    .unwrap();
                assert_eq!(
                    a,
                    h.as_ref(),
                    "seed {seed}: thread {t}'s batch recovered in part (hash store)"
                );
                let n = a.map_or(0, |v| write_number(v));
                assert_acked_and_made(n, floor[t], ceiling[t], &format!("seed {seed}: thread {t}"));
                checked += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        assert!(
            db.stats().checkpoints > 0,
            "no checkpoint ran during the test"
        );
        eprintln!(
            "concurrent batches: {checked} thread states checked over 12 crashes, {} checkpoints, 0 lost",
            db.stats().checkpoints
        );
    }
}

/// Pins are one bit per checkpoint generation modulo eight. Eight failed checkpoints
/// used to use up eight generations, so the ninth and tenth had the kept checkpoints'
/// bits: unpinning a failed one cleared the kept ones' pins, and a split then rewrote a
/// kept checkpoint's leaf page in place (its right half out of the checkpoint's reach).
#[test]
fn failed_checkpoints_never_release_the_pages_of_the_kept_ones() {
    use bfdb::CheckpointCrashPoint as P;
    let dir = tempfile::tempdir().unwrap();
    let devices = Devices::new(11);
    let db = devices.open(dir.path());
    let t = db.tree("a").unwrap();
    let key = |i: u32| format!("key{i:06}").into_bytes();
    for i in 0..2000 {
        t.insert_with(&key(i), &[1; 40], Durability::Logged)
            .unwrap();
    }
    db.checkpoint().unwrap();
    db.checkpoint().unwrap();
    db.fail_checkpoints_at(P::AfterCapture);
    for _ in 0..8 {
        assert!(db.checkpoint().is_err());
    }
    db.fail_checkpoints_at(P::None);
    // New keys between the old ones: the leaves split.
    for i in 0..2000 {
        let mut k = key(i);
        k.push(b'x');
        t.insert_with(&k, &[2; 40], Durability::Logged).unwrap();
    }
    t.flush().unwrap();
    db.persist().unwrap();
    let crashed = devices.crash();
    drop((t, db));
    let db = crashed.open(dir.path());
    let t = db.tree("a").unwrap();
    for i in 0..2000 {
        assert_eq!(
            t.get(&key(i)).unwrap().as_deref(),
            Some(&[1; 40][..]),
            "key {i}"
        );
        let mut k = key(i);
        k.push(b'x');
        assert_eq!(
            t.get(&k).unwrap().as_deref(),
            Some(&[2; 40][..]),
            "new key {i}"
        );
    }
    assert_eq!(t.range::<&[u8], _>(..).count(), 4000);
}

/// Rounds of threads writing the same few keys at once, single writes at `Logged`
/// with leaves splitting and mini-pages evicted under them (so some writes restart);
/// after each round a crash with no checkpoint taken: the replay of the whole log must
/// end every key at the value the index held. It fails if two writers of one key can
/// reach the log in one order and the index in the other (the journal's order rule).
#[test]
fn writers_of_one_key_reach_the_log_in_the_order_they_reach_the_index() {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 30;
    const WRITES: u64 = 60;
    for seed in seeds("writers_of_one_key") {
        let dir = tempfile::tempdir().unwrap();
        let devices = Devices::new(seed);
        let db = devices.open(dir.path());
        let tree = db.tree(KEYSPACES[0]).unwrap();
        let mut checked = 0;
        for round in 0..ROUNDS {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let tree = tree.clone();
                    std::thread::spawn(move || {
                        let mut rng =
                            Rng(seed ^ (round * THREADS + t + 1).wrapping_mul(0x9E37_79B9));
                        for n in 0..WRITES {
                            let value =
                                format!("{round}-{t}-{n}-{}", "v".repeat(rng.below(60) as usize));
                            // Most writes go to eight hot keys, the rest spread over the
                            // key range so that leaves split.
                            let key = if rng.below(4) != 0 {
                                format!("key{:04}", rng.below(8) * 37)
                            } else {
                                format!("key{:04}", rng.below(KEYS))
                            };
                            if rng.below(16) == 0 {
                                tree.delete_with(key.as_bytes(), Durability::Logged)
                                    .unwrap();
                            } else {
                                tree.insert_with(
                                    key.as_bytes(),
                                    value.as_bytes(),
                                    Durability::Logged,
                                )
                                .unwrap();
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            db.persist().unwrap();
            let live = read_back(&db, Keys::Short);
            let copy = tempfile::tempdir().unwrap();
            copy_files(dir.path(), copy.path());
            let recovered_db = devices.crash().open(copy.path());
            // No checkpoint was taken: the whole log was replayed.
            assert_eq!(
                recovered_db.recovery().writes_replayed,
                (round + 1) * THREADS * WRITES,
                "seed {seed}"
            );
            let recovered = read_back(&recovered_db, Keys::Short);
            assert_eq!(
                recovered[0], live[0],
                "seed {seed}, round {round}: the replayed log ends some key at a value the \
                 index did not hold last"
            );
            checked += live[0].len();
        }
        eprintln!(
            "writers of one key: {checked} key states checked over {ROUNDS} crashes, {} restarts",
            tree.stats().restarts
        );
    }
}

/// How the newest checkpoint file looks to the open that a crash interrupts.
#[derive(Clone, Copy, Debug)]
enum Newest {
    /// As written.
    Intact,
    /// A flipped byte: proven damage, so the open falls back to the older checkpoint.
    Damaged,
    /// A directory in its place: an IO error (EISDIR), which must fail the open.
    Unreadable,
}

/// Which of the open's IO calls fails (its n-th), as a crash there would stop it.
#[derive(Clone, Copy, Debug)]
enum OpenFault {
    LogSync,
    PageSync,
    PageWrite,
}

/// The newest checkpoint file of `dir`, if any.
fn newest_checkpoint(dir: &Path) -> Option<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("ckpt-") && !name.ends_with(".tmp")
        })
        .collect();
    files.sort();
    files.pop()
}

/// A crash during recovery: the workload of each seed is crashed, and then the open
/// that recovers it is crashed at its every log sync, page sync and page write — with
/// the newest checkpoint intact, damaged (the open falls back), or unreadable for a
/// moment (the open must fail) — and opened once more with the newest checkpoint
/// readable again (the worst case for a fallback: a file whose read succeeds later).
/// Every open answers `Ok` or `Err`, never panics; the last one must recover a
/// checkpoint's state plus a prefix of the log that keeps every durable write.
#[test]
fn crashing_during_recovery_loses_nothing() {
    let mut points = 0;
    let mut fallbacks = 0;
    for seed in seeds("crash_during_recovery") {
        let dir = tempfile::tempdir().unwrap();
        let devices = Devices::new(seed);
        let db = devices.open(dir.path());
        db.tree(KEYSPACES[0]).unwrap();
        db.tree(KEYSPACES[1]).unwrap();
        db.hash_store_with(KEYSPACES[HASH], hash_options()).unwrap();
        // Two checkpoints at least, so that the damaged newest one has one to fall
        // back to.
        let mut steps = run_workload(&db, seed, 200, Keys::Short, |_| {});
        db.checkpoint().unwrap();
        steps.push(Step::Checkpoint { acked: true });
        steps.extend(run_workload(&db, seed ^ 0x5555, 100, Keys::Short, |_| {}));
        let crashed = devices.crash();
        drop(db);
        for newest in [Newest::Intact, Newest::Damaged, Newest::Unreadable] {
            for fault in [
                OpenFault::LogSync,
                OpenFault::PageSync,
                OpenFault::PageWrite,
            ] {
                let mut n = 0;
                loop {
                    let run = tempfile::tempdir().unwrap();
                    copy_files(dir.path(), run.path());
                    let file = newest_checkpoint(run.path()).expect("a checkpoint");
                    let original = std::fs::read(&file).unwrap();
                    match newest {
                        Newest::Intact => {}
                        Newest::Damaged => {
                            let mut bytes = original.clone();
                            bytes[40] ^= 0x20;
                            std::fs::write(&file, &bytes).unwrap();
                        }
                        Newest::Unreadable => {
                            std::fs::remove_file(&file).unwrap();
                            std::fs::create_dir(&file).unwrap();
                        }
                    }
                    let d = crashed.crash();
                    match fault {
                        OpenFault::LogSync => d.log.fail_syncs_after(n),
                        OpenFault::PageSync => d.pages.fail_syncs_after(n),
                        OpenFault::PageWrite => d.pages.fail_writes_after(n),
                    }
                    let what = format!("seed {seed}, {newest:?}, {fault:?} {n}");
                    let clean = match d.open_with(run.path(), options()) {
                        Ok(db) => {
                            if db.recovery().checkpoint_fallbacks > 0 {
                                fallbacks += 1;
                            }
                            assert!(
                                !matches!(newest, Newest::Unreadable),
                                "{what}: an unreadable checkpoint was given up"
                            );
                            assert_eq!(db.recovery().rolled_back, None, "{what}");
                            db.close().is_ok()
                        }
                        Err(e) => {
                            if matches!(newest, Newest::Unreadable) {
                                assert!(matches!(e, bfdb::Error::Io(_)), "{what}: {e:?}");
                            }
                            assert!(!e.to_string().is_empty());
                            false
                        }
                    };
                    // The newest checkpoint reads again, as it was written.
                    if matches!(newest, Newest::Unreadable) {
                        std::fs::remove_dir(&file).unwrap();
                    }
                    if !matches!(newest, Newest::Intact) {
                        std::fs::write(&file, &original).unwrap();
                    }
                    let again = d.crash();
                    let db = again
                        .open_with(run.path(), options())
                        .unwrap_or_else(|e| panic!("{what}: the next open failed: {e}"));
                    let recovered = read_back(&db, Keys::Short);
                    match newest {
                        Newest::Damaged => {
                            // Recovery fell back (or later opens found the newest again
                            // if the fallback never rewrote the manifest): any acked
                            // checkpoint plus a prefix keeping every durable write.
                            let ok = checkpoint_candidates_all(&steps).into_iter().any(|c| {
                                let cand = candidate(&steps, c);
                                let mut state = cand.base.clone();
                                (0..=cand.log.len()).any(|p| {
                                    if p > 0 {
                                        apply(&mut state, cand.log[p - 1]);
                                    }
                                    p >= cand.must_keep && state == recovered
                                })
                            });
                            assert!(ok, "{what}: no checkpoint and prefix explain the state");
                        }
                        _ => {
                            check_prefix(&recovered, &steps, &what);
                        }
                    }
                    points += 1;
                    // An unreadable checkpoint fails the open before any write or sync.
                    if clean || n >= 400 || matches!(newest, Newest::Unreadable) {
                        break;
                    }
                    n += 1;
                }
            }
        }
    }
    assert!(fallbacks > 0, "no open fell back");
    eprintln!(
        "crash during recovery: {points} crash points, {fallbacks} opens that fell back, \
         0 lost"
    );
}

/// The kept keyspaces of `drop_and_crash`: tree `a` and hash store `h`, as the writes
/// acknowledged left them.
type Kept = (BTreeMap<Vec<u8>, Vec<u8>>, BTreeMap<Vec<u8>, Vec<u8>>);

/// Checks that `db` holds exactly the kept keyspaces of `kept` (every write was synced)
/// and, once three checkpoints have passed, that the value store holds exactly their
/// long values: none of a dropped keyspace, none waiting to be reused.
fn check_kept_after_drops(db: &Db, kept: &Kept, what: &str) {
    assert_eq!(db.keyspaces(), ["a", "h"], "{what}");
    let a = db.tree("a").unwrap();
    for (k, v) in &kept.0 {
        assert_eq!(a.get(k).unwrap().as_ref(), Some(v), "{what}: a {k:?}");
    }
    assert_eq!(a.range::<&[u8], _>(..).count(), kept.0.len(), "{what}");
    let h = db.hash_store_with("h", hash_options()).unwrap();
    for (k, v) in &kept.1 {
        assert_eq!(h.get(k).unwrap().as_ref(), Some(v), "{what}: h {k:?}");
    }
    for _ in 0..3 {
        db.checkpoint().unwrap();
    }
    let long: u64 = kept
        .0
        .values()
        .chain(kept.1.values())
        .filter(|v| v.len() > bfdb::Config::default().max_inline_value_bytes)
        .map(|v| v.len() as u64)
        .sum();
    let stats = db.stats();
    assert_eq!(
        stats.value_store_live_bytes, long,
        "{what}: live value bytes"
    );
    assert_eq!(stats.value_store_deferred_bytes, 0, "{what}: deferred");
}

/// A tree and a hash store holding long values are dropped, the other two keyspaces
/// written on, and the database crashes before a checkpoint commits the drop: before any
/// checkpoint, or at each step of one (failed there, as a crash would stop it; after
/// its commit too), with the dropped keyspaces' handles gone or still held. The first
/// recovery is itself crashed at each of its page syncs in turn and opened again.
/// Every recovery keeps every acknowledged write of the kept keyspaces (all synced),
/// and once three checkpoints have passed the value store holds exactly their live
/// values: a dropped keyspace's values neither leak nor take a kept one's with them.
#[test]
fn values_of_keyspaces_dropped_before_a_crash_come_back_and_no_kept_write_is_lost() {
    use bfdb::CheckpointCrashPoint as P;
    let seed = seed("drop_then_crash");
    let mut options = options();
    // Room for two hash stores' 64 KiB beside the trees'.
    options.config.memory_budget_bytes = 256 << 10;
    let mut recoveries = 0;
    for (i, point) in [
        None,
        Some(P::AfterFlush),
        Some(P::AfterCapture),
        Some(P::AfterPageSync),
        Some(P::AfterLogFlush),
        Some(P::AfterCheckpointFile),
        Some(P::AfterCommit),
    ]
    .into_iter()
    .enumerate()
    {
        for hold_handles in [false, true] {
            let seed = seed.wrapping_add(i as u64 * 2 + u64::from(hold_handles));
            let what = format!("seed {seed}, crash {point:?}, handles held {hold_handles}");
            let dir = tempfile::tempdir().unwrap();
            let devices = Devices::new(seed);
            let db = devices.open_with(dir.path(), options.clone()).unwrap();
            let (a, b) = (db.tree("a").unwrap(), db.tree("b").unwrap());
            let h = db.hash_store_with("h", hash_options()).unwrap();
            let h2 = db.hash_store_with("h2", hash_options()).unwrap();
            let mut rng = Rng(seed);
            let mut kept: Kept = Default::default();
            let mut n = 0u64;
            let mut value = |rng: &mut Rng| {
                n += 1;
                let len = match rng.below(3) {
                    0 => 2_049 + rng.below(30_000) as usize,
                    _ => 20 + rng.below(200) as usize,
                };
                common::repeated(format!("{seed}-{n}-").as_bytes(), len)
            };
            let synced = Durability::Synced;
            let mut round =
                |rng: &mut Rng,
                 kept: &mut Kept,
                 others: Option<(&bfdb::Tree, &bfdb::HashStore)>| {
                    for _ in 0..40 {
                        let k = format!("key{:03}", rng.below(30)).into_bytes();
                        let v = value(rng);
                        a.insert_with(&k, &v, synced).unwrap();
                        kept.0.insert(k, v);
                        // The hash store's keys are new each time: nothing of it waits for
                        // a compaction to be freed.
                        let v = value(rng);
                        let k = format!("key{:05}", kept.1.len()).into_bytes();
                        h.insert_with(&k, &v, synced).unwrap();
                        kept.1.insert(k, v);
                        if let Some((b, h2)) = others {
                            let k = format!("key{:03}", rng.below(30)).into_bytes();
                            b.insert_with(&k, &value(rng), synced).unwrap();
                            h2.insert_with(&k, &value(rng), synced).unwrap();
                        }
                    }
                };
            round(&mut rng, &mut kept, Some((&b, &h2)));
            db.checkpoint().unwrap();
            round(&mut rng, &mut kept, Some((&b, &h2)));
            assert!(db.drop_tree("b").unwrap());
            assert!(db.drop_hash_store("h2").unwrap());
            let held = hold_handles.then_some((b, h2));
            round(&mut rng, &mut kept, None);
            if let Some(point) = point {
                db.fail_checkpoints_at(point);
                assert!(db.checkpoint().is_err(), "{what}");
            }
            let crashed = devices.crash();
            drop((a, h, held, db));
            // The first recovery crashed at each of its page syncs in turn, until one
            // opens cleanly.
            for fail_at in 0.. {
                let run = tempfile::tempdir().unwrap();
                copy_files(dir.path(), run.path());
                let d = crashed.crash();
                d.pages.fail_syncs_after(fail_at);
                let clean = match d.open_with(run.path(), options.clone()) {
                    Ok(db) => db.close().is_ok(),
                    Err(_) => false,
                };
                let again = d.crash();
                let db = again
                    .open_with(run.path(), options.clone())
                    .unwrap_or_else(|e| panic!("{what}, sync {fail_at}: {e}"));
                check_kept_after_drops(&db, &kept, &format!("{what}, sync {fail_at}"));
                recoveries += 1;
                if clean {
                    break;
                }
                assert!(fail_at < 100, "{what}: the open never succeeded");
            }
        }
    }
    eprintln!("drop then crash: {recoveries} recoveries checked");
}
