//! The crash campaign of the database directory over a simulated log device
//! (`SimLog`, which keeps live and durable bytes apart and tears unsynced 512-byte
//! sectors at a crash): seeded workloads of single writes at every durability level,
//! deletes, and batches across two keyspaces, crashed
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
//! record appears that was never written — and each keyspace's full scan must equal its
//! point reads. Every test prints its seed; replay one with `BFDB_SEED=<seed>`.
//!
//! More seeds: `BFDB_CRASH_SEEDS=50 cargo test --release --test db_crash`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bfdb::storage::{LogDevice, SimLog};
use bfdb::{Config, Db, DbOptions, Durability, WriteBatch};

mod common;
use common::{Rng, env_u64, seed};

const KEYSPACES: [&str; 2] = ["a", "b"];

fn options() -> DbOptions {
    DbOptions::default()
        .config(Config {
            // A small pool, so mini-pages merge and leaves split during the workload.
            memory_budget_bytes: 64 << 10,
            huge_pages: false,
            background_eviction: false,
            ..Config::default()
        })
        // Only the workload's own syncs: the sweep over sync points is deterministic.
        .flush_interval(Duration::from_secs(60))
        .log_segment_bytes(64 << 10)
}

/// One write of a step: keyspace index, key, value (`None` deletes).
type Write = (usize, Vec<u8>, Option<Vec<u8>>);

/// The state of both keyspaces.
type State = [BTreeMap<Vec<u8>, Vec<u8>>; 2];

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
}

/// Runs up to `ops` seeded steps on `db`, stopping after the first that fails, and
/// calls `after_step` after each one.
fn run_workload(db: &Db, seed: u64, ops: usize, mut after_step: impl FnMut(&[Step])) -> Vec<Step> {
    let trees = [
        db.tree(KEYSPACES[0]).unwrap(),
        db.tree(KEYSPACES[1]).unwrap(),
    ];
    let mut rng = Rng(seed);
    let mut steps = Vec::new();
    let mut counter = 0u64;
    let mut next_value = |rng: &mut Rng| {
        counter += 1;
        // Values of assorted sizes, each unique: a recovered value names its write.
        let mut v = format!("{seed}-{counter}-").into_bytes();
        v.resize(v.len() + rng.below(300) as usize, b'.');
        v
    };
    for _ in 0..ops {
        let level = match rng.below(3) {
            0 => Durability::Unlogged,
            1 => Durability::Logged,
            _ => Durability::Synced,
        };
        let roll = rng.percent();
        let key = |rng: &mut Rng| format!("key{:04}", rng.below(400)).into_bytes();
        let (writes, ok) = if roll < 5 {
            let ok = db.persist().is_ok();
            steps.push(Step::Persist { acked: ok });
            after_step(&steps);
            if !ok {
                break;
            }
            continue;
        } else if roll < 25 {
            let mut batch = WriteBatch::new();
            let mut writes = Vec::new();
            for _ in 0..2 + rng.below(4) {
                let ks = rng.below(2) as usize;
                let k = key(&mut rng);
                if rng.percent() < 20 {
                    batch.delete(&trees[ks], &k);
                    writes.push((ks, k, None));
                } else {
                    let v = next_value(&mut rng);
                    batch.insert(&trees[ks], &k, &v);
                    writes.push((ks, k, Some(v)));
                }
            }
            (writes.clone(), db.write_with(batch, level).is_ok())
        } else {
            let ks = rng.below(2) as usize;
            let k = key(&mut rng);
            if roll < 40 {
                let ok = trees[ks].delete_with(&k, level).is_ok();
                (vec![(ks, k, None)], ok)
            } else {
                let v = next_value(&mut rng);
                let ok = trees[ks].insert_with(&k, &v, level).is_ok();
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

/// The logged writes of `steps` in log order, and how many of them a recovery must
/// keep: every one up to the last acknowledged synced write or persist.
fn logged(steps: &[Step]) -> (Vec<&[Write]>, usize) {
    let mut log = Vec::new();
    let mut must_keep = 0;
    for step in steps {
        match step {
            Step::Write {
                writes,
                level,
                acked,
            } => {
                if *level != Durability::Unlogged {
                    log.push(&writes[..]);
                    if *acked && *level == Durability::Synced {
                        must_keep = log.len();
                    }
                }
            }
            Step::Persist { acked: true } => must_keep = log.len(),
            Step::Persist { acked: false } => {}
        }
    }
    (log, must_keep)
}

fn apply(state: &mut State, writes: &[Write]) {
    for (ks, k, v) in writes {
        match v {
            Some(v) => state[*ks].insert(k.clone(), v.clone()),
            None => state[*ks].remove(k),
        };
    }
}

/// Reads both keyspaces of `db` by full scans, checking each record against a point read.
fn read_back(db: &Db) -> State {
    let mut state = State::default();
    for (ks, name) in KEYSPACES.iter().enumerate() {
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

/// Checks that `recovered` is the state after a prefix of the logged writes that keeps
/// every durable one; returns the prefix length.
fn check_prefix(recovered: &State, steps: &[Step], what: &str) -> usize {
    let (log, must_keep) = logged(steps);
    let mut state = State::default();
    for writes in &log[..must_keep] {
        apply(&mut state, writes);
    }
    for p in must_keep..=log.len() {
        if p > must_keep {
            apply(&mut state, log[p - 1]);
        }
        if &state == recovered {
            return p;
        }
    }
    panic!(
        "{what}: the recovered state is no prefix of the log from {must_keep} (durable) to {} \
         (written) records; recovered {} + {} keys",
        log.len(),
        recovered[0].len(),
        recovered[1].len()
    );
}

fn open(dir: &std::path::Path, device: Arc<SimLog>) -> Db {
    Db::open_simulated(dir, options(), device as Arc<dyn LogDevice>).unwrap()
}

/// Seeds to run: one from `seed()`, and `BFDB_CRASH_SEEDS` more derived from it.
fn seeds(test: &str) -> Vec<u64> {
    let first = seed(test);
    let n = env_u64("BFDB_CRASH_SEEDS").unwrap_or(1);
    (0..n)
        .map(|i| first.wrapping_add(i * 0x9E37_79B9))
        .collect()
}

#[test]
fn crashing_at_every_sync_loses_no_durable_write_and_no_batch_in_part() {
    let mut points = 0;
    let mut writes_checked = 0;
    for seed in seeds("crash_at_every_sync") {
        // A clean run counts the syncs the workload makes.
        let dir = tempfile::tempdir().unwrap();
        let device = Arc::new(SimLog::new(seed));
        let db = open(dir.path(), device.clone());
        let steps = run_workload(&db, seed, 250, |_| {});
        assert!(
            steps
                .iter()
                .all(|s| !matches!(s, Step::Write { acked: false, .. }))
        );
        drop(db);
        let syncs = count_syncs(seed);
        assert!(syncs > 20, "the workload synced only {syncs} times");
        for n in 0..syncs {
            let dir = tempfile::tempdir().unwrap();
            let device = Arc::new(SimLog::new(seed ^ n));
            let db = open(dir.path(), device.clone());
            // Create the keyspaces before syncs start failing.
            db.tree(KEYSPACES[0]).unwrap();
            db.tree(KEYSPACES[1]).unwrap();
            device.fail_syncs_after(n);
            let steps = run_workload(&db, seed, 250, |_| {});
            let crashed = Arc::new(device.crash());
            drop(db);
            let db = open(dir.path(), crashed);
            let recovered = read_back(&db);
            check_prefix(&recovered, &steps, &format!("seed {seed}, sync {n}"));
            points += 1;
            writes_checked += logged(&steps).0.len();
        }
    }
    eprintln!(
        "crash at every sync: {points} crash points, {writes_checked} logged writes checked, 0 lost"
    );
}

/// The syncs of the workload of `seed`, counted by failing the first sync past a
/// growing limit until the workload no longer reaches it.
fn count_syncs(seed: u64) -> u64 {
    // Binary search for the smallest `n` whose failure point the workload never reaches.
    let reaches = |n: u64| {
        let dir = tempfile::tempdir().unwrap();
        let device = Arc::new(SimLog::new(seed));
        let db = open(dir.path(), device.clone());
        db.tree(KEYSPACES[0]).unwrap();
        db.tree(KEYSPACES[1]).unwrap();
        device.fail_syncs_after(n);
        let steps = run_workload(&db, seed, 250, |_| {});
        steps.iter().any(|s| {
            matches!(
                s,
                Step::Write { acked: false, .. } | Step::Persist { acked: false }
            )
        })
    };
    let (mut lo, mut hi) = (0u64, 1u64);
    while reaches(hi) {
        lo = hi;
        hi *= 2;
    }
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if reaches(mid) { lo = mid } else { hi = mid }
    }
    hi
}

#[test]
fn crashing_after_every_operation_recovers_a_prefix() {
    let mut points = 0;
    let mut writes_checked = 0;
    for seed in seeds("crash_after_every_op") {
        let dir = tempfile::tempdir().unwrap();
        let device = Arc::new(SimLog::new(seed));
        let db = open(dir.path(), device.clone());
        let mut snapshots = Vec::new();
        let steps = run_workload(&db, seed, 300, |steps| {
            snapshots.push((steps.len(), device.crash()));
        });
        drop(db);
        for (len, crashed) in snapshots {
            let db = open(dir.path(), Arc::new(crashed));
            let recovered = read_back(&db);
            let p = check_prefix(
                &recovered,
                &steps[..len],
                &format!("seed {seed}, step {len}"),
            );
            writes_checked += p;
            points += 1;
        }
    }
    eprintln!(
        "crash after every operation: {points} crash points, {writes_checked} recovered writes checked, 0 lost"
    );
}

#[test]
fn a_flipped_log_bit_gives_an_error_or_a_prefix_never_a_wrong_state() {
    for seed in seeds("flipped_log_bit") {
        let dir = tempfile::tempdir().unwrap();
        let device = Arc::new(SimLog::new(seed));
        let db = open(dir.path(), device.clone());
        let steps = run_workload(&db, seed, 200, |_| {});
        db.persist().unwrap();
        drop(db);
        let mut rng = Rng(seed);
        let (mut errors, mut prefixes) = (0, 0);
        for _ in 0..40 {
            let crashed = device.crash();
            let ids = crashed.list().unwrap();
            let id = ids[rng.below(ids.len() as u64) as usize];
            // Bits in the blocks written so far (the segments are preallocated).
            let bit = rng.below(17 * 4096 * 8);
            crashed.flip_bit(id, bit);
            match Db::open_simulated(dir.path(), options(), Arc::new(crashed)) {
                Err(e) => {
                    let text = e.to_string();
                    assert!(!text.is_empty());
                    errors += 1;
                }
                Ok(db) => {
                    // Damage the reader could not tell from a torn tail: any prefix.
                    let recovered = read_back(&db);
                    let (log, _) = logged(&steps);
                    let mut state = State::default();
                    let ok = (0..=log.len()).any(|p| {
                        if p > 0 {
                            apply(&mut state, log[p - 1]);
                        }
                        state == recovered
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

/// Writers on several threads, each batching the same value into its own key of both
/// keyspaces at random levels, while the device is crashed at random moments: each
/// crash recovers every thread's pair equal (no half batch) and at least its last
/// acknowledged durable value.
#[test]
fn concurrent_batches_crash_atomically() {
    const THREADS: usize = 4;
    for seed in seeds("concurrent_batches") {
        let dir = tempfile::tempdir().unwrap();
        let device = Arc::new(SimLog::new(seed));
        let mut opts = options();
        opts.flush_interval = Duration::from_millis(2);
        let db = Arc::new(Db::open_simulated(dir.path(), opts.clone(), device.clone()).unwrap());
        let trees = [db.tree("a").unwrap(), db.tree("b").unwrap()];
        let durable: Arc<Vec<AtomicU64>> =
            Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let tried: Arc<Vec<AtomicU64>> =
            Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (db, trees, durable, tried, stop) = (
                    db.clone(),
                    trees.clone(),
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
        let mut snapshots = Vec::new();
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(1 + rng.below(15)));
            // Acknowledged before the snapshot: must survive it.
            let floor: Vec<u64> = durable.iter().map(|d| d.load(Ordering::SeqCst)).collect();
            let crashed = device.crash();
            let ceiling: Vec<u64> = tried.iter().map(|d| d.load(Ordering::SeqCst)).collect();
            snapshots.push((floor, ceiling, crashed));
        }
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        drop(trees);
        drop(db);
        let mut checked = 0;
        for (floor, ceiling, crashed) in snapshots {
            let db = Db::open_simulated(dir.path(), opts.clone(), Arc::new(crashed)).unwrap();
            let state = read_back(&db);
            for t in 0..THREADS {
                let key = format!("thread{t}").into_bytes();
                let (a, b) = (state[0].get(&key), state[1].get(&key));
                assert_eq!(a, b, "seed {seed}: thread {t}'s batch recovered in part");
                let n = a.map_or(0, |v| {
                    std::str::from_utf8(&v[..12])
                        .unwrap()
                        .parse::<u64>()
                        .unwrap()
                });
                assert!(
                    n >= floor[t],
                    "seed {seed}: thread {t} lost synced batch {} (got {n})",
                    floor[t]
                );
                assert!(
                    n <= ceiling[t],
                    "seed {seed}: thread {t} has batch {n}, never written"
                );
                checked += 1;
            }
        }
        eprintln!("concurrent batches: {checked} thread states checked over 20 crashes, 0 lost");
    }
}
