//! Fault injection in the simulated devices of a database: one fault armed at the n-th
//! read, write or sync of the log (`SimLog`), the tree keyspaces' page files
//! (`SimStore`) or the hash store's log files (`SimBlocks`) — transient (that call
//! only), permanent (every later call) or a full device (ENOSPC) — for every n the
//! workload reaches, and faults armed while a crashed database is opened.
//!
//! The workload does not stop at the first error: what the database does after a fault
//! is the point. After every call it checks that
//!
//! - every call returns `Ok` or an error that names its cause, and no thread panics
//!   (a panic hook counts them, the background threads' too);
//! - no half batch is visible: the batch's keys, read back with `get_many`, hold all of
//!   its writes or none (or the reads are refused);
//! - once the database refused a write for its failure state, every later write, at
//!   every level, and every checkpoint fails;
//!
//! and after it the database is closed, its devices crashed, the faults cleared, and
//! the database opened again: it must hold a checkpoint's state plus a prefix of the
//! logged writes that keeps every write acknowledged durable (synced, or followed by an
//! acknowledged persist), with every failed write in it or not and no batch in part,
//! and each tree's scan must equal its point reads.
//!
//! The campaign runs again with long keys (`Keys::Long`, issue #34): half the keys up to
//! 4 KiB, many sharing prefixes of up to 3900 bytes, in 16 KiB leaf pages, in the trees
//! and in the hash store alike, batches mixing them with short ones. By default it arms
//! each target's operation at a few n only, its fault kinds in turn;
//! `BFDB_FAULT_EVERY=1` sweeps it as fully as the first.
//!
//! Every test prints its seed; replay one with `BFDB_SEED=<seed>`. More seeds:
//! `BFDB_FAULT_SEEDS=20 cargo test --release --test db_faults`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use bfdb::storage::{LogDevice, SimFault, SimLog, SimOp, SimPages};
use bfdb::{Db, Durability, Error, WriteBatch};

mod common;
use common::{HASH, KEYS, KEYSPACES, Keys, Rng, env_u64, seed};

/// Steps of the workload of one run.
const OPS: usize = 300;

/// The text of a write refused for the database's failure state (`Journal::failure`):
/// such a write was refused before anything was logged.
const REFUSED: &str = "the database can no longer make writes durable";

// ---------------------------------------------------------------------------------------
// Panics on any thread
// ---------------------------------------------------------------------------------------

static PANICS: AtomicU64 = AtomicU64::new(0);
static PANIC_NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Counts every panic of the process (the background threads' included), keeping the
/// default hook's report.
fn count_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            let thread = std::thread::current().name().unwrap_or("?").to_string();
            PANIC_NOTES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("thread {thread}: {info}"));
            default(info);
        }));
    });
}

fn assert_no_panic(what: &str) {
    let n = PANICS.load(Ordering::SeqCst);
    assert_eq!(
        n,
        0,
        "{what}: {n} panics: {:?}",
        PANIC_NOTES.lock().unwrap_or_else(|e| e.into_inner())
    );
}

// ---------------------------------------------------------------------------------------
// Devices and faults
// ---------------------------------------------------------------------------------------

/// The simulated devices of a database, and the keys its workload writes, which its
/// options follow.
struct Devices {
    log: Arc<SimLog>,
    pages: Arc<SimPages>,
    keys: Keys,
}

impl Devices {
    fn new(seed: u64, keys: Keys) -> Devices {
        Devices {
            log: Arc::new(SimLog::new(seed)),
            pages: Arc::new(SimPages::new(seed)),
            keys,
        }
    }

    fn crash(&self) -> Devices {
        Devices {
            log: Arc::new(self.log.crash()),
            pages: Arc::new(self.pages.crash()),
            keys: self.keys,
        }
    }

    fn open(&self, dir: &Path) -> bfdb::Result<Db> {
        Db::open_simulated(
            dir,
            self.keys.sim_options(),
            self.log.clone() as Arc<dyn LogDevice>,
            self.pages.clone(),
        )
    }

    /// Arms `fault` on the `op` after the next `n` of `target`'s files (each file of a
    /// target counts its own).
    fn arm(&self, target: Target, op: SimOp, n: u64, fault: SimFault) {
        match target {
            Target::Log => self.log.arm(op, n, fault),
            Target::Pages => {
                for name in self.pages.names() {
                    self.pages.store(&name).arm(op, n, fault);
                }
            }
            Target::Hash | Target::Values => {
                let values = matches!(target, Target::Values);
                for name in self.pages.block_names() {
                    if (name == VALUE_FILE) == values {
                        self.pages.blocks(&name).arm(op, n, fault);
                    }
                }
            }
        }
    }

    fn clear_faults(&self) {
        self.log.clear_faults();
        self.pages.clear_faults();
    }

    /// Operations failed by armed faults so far.
    fn injected(&self) -> u64 {
        let pages: u64 = self
            .pages
            .names()
            .iter()
            .map(|n| self.pages.store(n).counts().injected_failures)
            .sum();
        let blocks: u64 = self
            .pages
            .block_names()
            .iter()
            .map(|n| self.pages.blocks(n).injected_failures())
            .sum();
        self.log.injected_failures() + pages + blocks
    }
}

/// Which device a fault is armed on.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// The write-ahead log.
    Log,
    /// The page files of the two tree keyspaces.
    Pages,
    /// The hash store's log files.
    Hash,
    /// The value store's file, which holds the values longer than the inline limit
    /// of both kinds of keyspace.
    Values,
}

/// The name of the value store's simulated file.
const VALUE_FILE: &str = "values";

/// Every (target, operation, fault) the campaign sweeps: a full device only on writes
/// and syncs (a full device reads).
fn fault_kinds() -> Vec<(Target, SimOp, SimFault)> {
    let mut out = Vec::new();
    for target in [Target::Log, Target::Pages, Target::Hash, Target::Values] {
        for op in [SimOp::Read, SimOp::Write, SimOp::Sync] {
            for fault in [SimFault::Transient, SimFault::Permanent, SimFault::Full] {
                if op == SimOp::Read && fault == SimFault::Full {
                    continue;
                }
                out.push((target, op, fault));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------

/// A key of the model: keyspace index times `KEYS` plus key number.
type Slot = usize;

fn slot(ks: usize, i: u64) -> Slot {
    ks * KEYS as usize + i as usize
}

const SLOTS: usize = 3 * KEYS as usize;

/// What the live database may hold for each key: one value, or (after a failed write
/// that could not be read back) any of a few.
type Live = Vec<Vec<Option<Vec<u8>>>>;

/// One write: the key's slot and its value (`None` deletes).
type Write = (Slot, Option<Vec<u8>>);

#[derive(Clone, Debug)]
enum Step {
    Write {
        writes: Vec<Write>,
        batch: bool,
        level: Durability,
        acked: bool,
        /// Failed, but not for the failure state: its record may be in the log.
        maybe_logged: bool,
    },
    Persist {
        acked: bool,
    },
    Checkpoint {
        acked: bool,
        /// What the live database held when it ran.
        live: Live,
    },
}

/// What a run saw.
#[derive(Default)]
struct Counts {
    calls: u64,
    errors: u64,
    refused: u64,
    batches_checked: u64,
}

/// Checks an error names its cause; answers whether it is the failure state's refusal.
fn check_error(e: &Error, what: &str) -> bool {
    let text = e.to_string();
    assert!(!text.is_empty(), "{what}: an error without a message");
    match e {
        Error::Poisoned { cause } => {
            assert!(
                !cause.trim().is_empty(),
                "{what}: Poisoned names no cause: {e}"
            );
            // The cause goes back to the injected fault (the sims' messages say
            // "simulated"), or to a batch or thread the message names.
            cause.contains(REFUSED)
        }
        Error::Io(io) => {
            assert!(
                !io.to_string().trim().is_empty(),
                "{what}: an IO error without a message"
            );
            false
        }
        _ => false,
    }
}

/// Runs the workload, checking the live invariants after each call.
struct Run<'a> {
    db: &'a Db,
    keys: Keys,
    seed: u64,
    what: String,
    live: Live,
    steps: Vec<Step>,
    counts: Counts,
    /// Set once a call was refused for the failure state.
    failed: bool,
    /// Set once reads were refused for the failure state.
    unreadable: bool,
}

impl Run<'_> {
    fn note(&mut self, r: &bfdb::Result<()>, what: &str) -> bool {
        self.counts.calls += 1;
        match r {
            Ok(()) => {
                // A persist is no write: it may succeed in the failure state (the log
                // is fine when a page file failed).
                assert!(
                    !self.failed || what == "persist",
                    "{}: {what} acknowledged after the database refused a write for its \
                     failure state",
                    self.what
                );
                true
            }
            Err(e) => {
                self.counts.errors += 1;
                if check_error(e, &format!("{}: {what}", self.what)) {
                    self.failed = true;
                    self.counts.refused += 1;
                }
                false
            }
        }
    }

    /// Reads the keys of `writes` (with `get_many` per keyspace); `None` if a read was
    /// refused or failed.
    fn read_keys(&mut self, slots: &[Slot]) -> Option<Vec<Option<Vec<u8>>>> {
        let mut out = vec![None; slots.len()];
        for (ks, name) in KEYSPACES.iter().enumerate() {
            let idx: Vec<usize> = (0..slots.len())
                .filter(|&i| slots[i] / KEYS as usize == ks)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let keys: Vec<Vec<u8>> = idx
                .iter()
                .map(|&i| self.keys.key((slots[i] % KEYS as usize) as u64))
                .collect();
            let got = if ks == HASH {
                self.db
                    .hash_store_with(name, self.keys.hash_options())
                    .and_then(|h| h.get_many(&keys))
            } else {
                self.db.tree(name).and_then(|t| t.get_many(&keys))
            };
            match got {
                Ok(values) => {
                    for (&i, v) in idx.iter().zip(values) {
                        out[i] = v;
                    }
                }
                Err(e) => {
                    if check_error(&e, &format!("{}: get_many", self.what)) {
                        self.unreadable = true;
                    }
                    return None;
                }
            }
        }
        Some(out)
    }

    /// After a write step: what the database holds now for its keys. A batch shows all
    /// of its writes or none; an acknowledged write shows.
    fn observe(&mut self, writes: &[Write], batch: bool, acked: bool) {
        // The last write of each key is what the step leaves.
        let mut last: BTreeMap<Slot, Option<Vec<u8>>> = BTreeMap::new();
        for (s, v) in writes {
            last.insert(*s, v.clone());
        }
        let slots: Vec<Slot> = last.keys().copied().collect();
        let Some(seen) = self.read_keys(&slots) else {
            // Unread: each key holds its old value or the new one.
            for (s, v) in &last {
                if acked {
                    self.live[*s] = vec![v.clone()];
                } else if !self.live[*s].contains(v) {
                    self.live[*s].push(v.clone());
                }
            }
            return;
        };
        let (mut new, mut old) = (0, 0);
        let mut status = Vec::new();
        for ((s, v), got) in last.iter().zip(&seen) {
            status.push((*s, got == v, self.live[*s].contains(got)));
            let is_new = got == v;
            let is_old = self.live[*s].contains(got);
            assert!(
                is_new || is_old,
                "{}: key {s} holds {:?}, neither its last value nor the step's",
                self.what,
                got.as_ref()
                    .map(|g| String::from_utf8_lossy(g).into_owned())
            );
            if is_new && !is_old {
                new += 1;
            }
            if is_old && !is_new {
                old += 1;
            }
        }
        if acked {
            assert_eq!(
                old, 0,
                "{}: an acknowledged write is not visible",
                self.what
            );
        }
        if batch {
            assert!(
                new == 0 || old == 0,
                "{}: half a batch is visible ({new} writes of it seen, {old} not), acked \
                 {acked}; (slot, new, old): {status:?}",
                self.what
            );
            self.counts.batches_checked += 1;
        }
        for (s, got) in slots.iter().zip(seen) {
            self.live[*s] = vec![got];
        }
    }

    fn write_step(
        &mut self,
        writes: Vec<Write>,
        batch: bool,
        level: Durability,
        r: bfdb::Result<()>,
    ) {
        if std::env::var("BFDB_FAULT_TRACE").is_ok() {
            let shown: Vec<_> = writes
                .iter()
                .map(|(s, v)| (*s, v.as_ref().map(|v| v.len())))
                .collect();
            eprintln!(
                "step {}: batch {batch} {level:?} {shown:?} -> {r:?}",
                self.steps.len()
            );
        }
        let refused = matches!(&r, Err(Error::Poisoned { cause }) if cause.contains(REFUSED));
        let acked = self.note(&r, "a write");
        self.observe(&writes, batch, acked);
        self.steps.push(Step::Write {
            writes,
            batch,
            level,
            acked,
            maybe_logged: !acked && !refused,
        });
    }
}

/// Runs `ops` seeded steps of `keys` on `db` whatever they answer (see the module
/// docs).
fn run_workload(db: &Db, seed: u64, ops: usize, keys: Keys, what: &str) -> (Vec<Step>, Counts) {
    let trees = [
        db.tree(KEYSPACES[0]).unwrap(),
        db.tree(KEYSPACES[1]).unwrap(),
    ];
    let hash = db
        .hash_store_with(KEYSPACES[HASH], keys.hash_options())
        .unwrap();
    let key_of = |i: u64| keys.key(i);
    let mut run = Run {
        db,
        keys,
        seed,
        what: what.to_string(),
        live: vec![vec![None]; SLOTS],
        steps: Vec::new(),
        counts: Counts::default(),
        failed: false,
        unreadable: false,
    };
    let mut rng = Rng(seed);
    let mut counter = 0u64;
    for op in 0..ops {
        let level = match rng.below(3) {
            0 => Durability::Unlogged,
            1 => Durability::Logged,
            _ => Durability::Synced,
        };
        let mut value = |rng: &mut Rng, ks: usize| {
            counter += 1;
            let stamp = format!("{}-{counter}-", run.seed).into_bytes();
            // One value in six, of either kind, goes to the value store; its write
            // number runs through it, so a torn or mixed value matches no write.
            let pad = match ks {
                _ if rng.below(6) == 0 => 2_049 + rng.below(12_000) as usize,
                HASH => 1_200,
                _ => 0,
            };
            common::repeated(&stamp, stamp.len() + pad + rng.below(300) as usize)
        };
        let roll = if op % 40 == 39 { 5 } else { rng.percent() };
        if roll < 5 {
            let r = db.persist();
            let acked = run.note(&r, "persist");
            // A persist is no write: it may succeed in the failure state (the log is
            // fine when a page file failed).
            run.steps.push(Step::Persist { acked });
            continue;
        }
        if roll < 8 {
            let r = if rng.below(3) == 0 {
                db.checkpoint_incremental()
            } else {
                db.checkpoint()
            };
            let acked = run.note(&r, "a checkpoint");
            run.steps.push(Step::Checkpoint {
                acked,
                live: run.live.clone(),
            });
            continue;
        }
        if roll < 11 {
            // A scan: any answer but a panic (scans are not snapshots).
            let tree = &trees[rng.below(2) as usize];
            for record in tree.range::<&[u8], _>(..) {
                if let Err(e) = record {
                    check_error(&e, &format!("{what}: a scan"));
                    break;
                }
            }
            continue;
        }
        let key = |rng: &mut Rng| rng.below(KEYS);
        if roll < 30 {
            let mut batch = WriteBatch::new();
            let mut writes = Vec::new();
            for _ in 0..2 + rng.below(4) {
                let ks = rng.below(3) as usize;
                let k = key(&mut rng);
                if rng.percent() < 20 {
                    match ks {
                        HASH => batch.delete_hash(&hash, &key_of(k)),
                        _ => batch.delete(&trees[ks], &key_of(k)),
                    }
                    writes.push((slot(ks, k), None));
                } else {
                    let v = value(&mut rng, ks);
                    match ks {
                        HASH => batch.insert_hash(&hash, &key_of(k), &v),
                        _ => batch.insert(&trees[ks], &key_of(k), &v),
                    }
                    writes.push((slot(ks, k), Some(v)));
                }
            }
            let r = db.write_with(batch, level);
            run.write_step(writes, true, level, r);
            continue;
        }
        let ks = rng.below(3) as usize;
        let k = key(&mut rng);
        let (w, r) = if roll < 45 {
            let r = match ks {
                HASH => hash.delete_with(&key_of(k), level),
                _ => trees[ks].delete_with(&key_of(k), level),
            };
            ((slot(ks, k), None), r)
        } else if ks == HASH && roll < 60 {
            let v = value(&mut rng, ks);
            let r = hash.rmw_with(&key_of(k), |_| v.clone(), level).map(|_| ());
            ((slot(ks, k), Some(v)), r)
        } else {
            let v = value(&mut rng, ks);
            let r = match ks {
                HASH => hash.insert_with(&key_of(k), &v, level),
                _ => trees[ks].insert_with(&key_of(k), &v, level),
            };
            ((slot(ks, k), Some(v)), r)
        };
        run.write_step(vec![w], false, level, r);
        // Point reads of a few other keys: any answer but a panic.
        if op % 10 == 0 {
            let slots: Vec<Slot> = (0..4)
                .map(|_| slot(rng.below(3) as usize, key(&mut rng)))
                .collect();
            if let Some(seen) = run.read_keys(&slots) {
                for (s, got) in slots.iter().zip(seen) {
                    assert!(
                        run.live[*s].contains(&got),
                        "{what}: key {s} reads a value it never had"
                    );
                    run.live[*s] = vec![got];
                }
            }
        }
    }
    if run.unreadable {
        assert!(
            run.failed
                || run
                    .steps
                    .iter()
                    .any(|s| matches!(s, Step::Write { acked: false, .. }))
        );
    }
    (run.steps, run.counts)
}

// ---------------------------------------------------------------------------------------
// Recovery check
// ---------------------------------------------------------------------------------------

/// Reads every key of the recovered database, whose workload wrote `keys` (trees by full
/// scans checked against point reads). Faults are cleared, so every read must succeed.
fn read_back(db: &Db, keys: Keys, what: &str) -> Vec<Option<Vec<u8>>> {
    let mut state = vec![None; SLOTS];
    let numbers = keys.numbers();
    let hash = db
        .hash_store_with(KEYSPACES[HASH], keys.hash_options())
        .unwrap();
    for i in 0..KEYS {
        state[slot(HASH, i)] = hash
            .get(&keys.key(i))
            .unwrap_or_else(|e| panic!("{what}: a recovered read failed: {e}"));
    }
    for (ks, name) in KEYSPACES[..HASH].iter().enumerate() {
        let tree = db.tree(name).unwrap();
        let mut scanned = 0;
        for record in tree.range::<&[u8], _>(..) {
            let (k, v) = record.unwrap_or_else(|e| panic!("{what}: a recovered scan failed: {e}"));
            assert_eq!(
                tree.get(&k).unwrap().as_ref(),
                Some(&v),
                "{what}: scan and get disagree"
            );
            let i = *numbers
                .get(&k)
                .unwrap_or_else(|| panic!("{what}: the scan yields a key never written"));
            state[slot(ks, i)] = Some(v);
            scanned += 1;
        }
        let got = (0..KEYS)
            .filter(|&i| tree.get(&keys.key(i)).unwrap().is_some())
            .count();
        assert_eq!(
            got, scanned,
            "{what}: the scan missed keys point reads find"
        );
    }
    state
}

/// One entry of a candidate log.
struct Entry<'s> {
    writes: &'s [Write],
    /// May be absent (a failed write, or one before the checkpoint that the replay
    /// may or may not reach again).
    optional: bool,
}

/// Searches for a way the recovered state is a checkpoint's state plus a prefix of the
/// log: the entries from `base` on, each optional one in or out, stopping anywhere at
/// or after `must_keep`. Answers the entries applied, or `None`.
struct Search<'s> {
    base: &'s Live,
    entries: Vec<Entry<'s>>,
    must_keep: usize,
    recovered: &'s [Option<Vec<u8>>],
    /// Per slot: the last entry writing it.
    last_writer: Vec<Option<usize>>,
    state: Vec<Option<Option<Vec<u8>>>>,
    mismatches: usize,
    budget: u64,
}

impl Search<'_> {
    fn matches(&self, s: Slot) -> bool {
        match &self.state[s] {
            None => self.base[s].contains(&self.recovered[s]),
            Some(v) => *v == self.recovered[s],
        }
    }

    fn set(&mut self, s: Slot, v: Option<Option<Vec<u8>>>) -> Option<Option<Vec<u8>>> {
        let before = self.matches(s);
        let old = std::mem::replace(&mut self.state[s], v);
        let after = self.matches(s);
        match (before, after) {
            (true, false) => self.mismatches += 1,
            (false, true) => self.mismatches -= 1,
            _ => {}
        }
        old
    }

    /// Whether every slot entry `i` is the last writer of matches (nothing later can
    /// change them).
    fn finals_match(&self, i: usize) -> bool {
        self.entries[i]
            .writes
            .iter()
            .all(|(s, _)| self.last_writer[*s] != Some(i) || self.matches(*s))
    }

    fn dfs(&mut self, i: usize, applied: usize) -> Option<usize> {
        if self.budget == 0 {
            return None;
        }
        self.budget -= 1;
        if i >= self.must_keep && self.mismatches == 0 {
            return Some(applied);
        }
        if i == self.entries.len() {
            return None;
        }
        // In.
        let writes = self.entries[i].writes;
        let undo: Vec<_> = writes
            .iter()
            .map(|(s, v)| (*s, self.set(*s, Some(v.clone()))))
            .collect();
        let found = if self.finals_match(i) {
            self.dfs(i + 1, applied + 1)
        } else {
            None
        };
        for (s, old) in undo.into_iter().rev() {
            self.set(s, old);
        }
        if found.is_some() {
            return found;
        }
        // Out: an optional entry, or a certain one before `must_keep` never (it is in
        // the log before a durable record).
        if self.entries[i].optional && self.finals_match(i) {
            return self.dfs(i + 1, applied);
        }
        None
    }
}

/// Checks `recovered` against `steps`; answers the writes the explanation replays.
fn check_recovered(recovered: &[Option<Vec<u8>>], steps: &[Step], what: &str) -> usize {
    let empty: Live = vec![vec![None]; SLOTS];
    let last_acked = steps
        .iter()
        .rposition(|s| matches!(s, Step::Checkpoint { acked: true, .. }));
    // Candidates: the last acknowledged checkpoint (or none), and any later one that
    // failed (it may have committed before failing).
    let mut candidates = vec![last_acked];
    for (i, s) in steps.iter().enumerate() {
        if matches!(s, Step::Checkpoint { acked: false, .. }) && last_acked.is_none_or(|a| i > a) {
            candidates.push(Some(i));
        }
    }
    let mut budget_out = false;
    for from in candidates {
        let (base, start, ckpt) = match from {
            None => (&empty, 0, 0),
            Some(c) => {
                let Step::Checkpoint { live, .. } = &steps[c] else {
                    unreachable!()
                };
                // A background checkpoint replays from the previous checkpoint's
                // quiesce: the writes between may be replayed again on its state.
                let prev = steps[..c]
                    .iter()
                    .rposition(|s| matches!(s, Step::Checkpoint { .. }))
                    .map_or(0, |p| p + 1);
                (live, prev, c)
            }
        };
        let mut entries = Vec::new();
        let mut must_keep = 0;
        for (i, step) in steps.iter().enumerate().skip(start) {
            match step {
                Step::Write {
                    writes,
                    batch,
                    level,
                    acked,
                    maybe_logged,
                } => {
                    let logged = *batch || *level != Durability::Unlogged;
                    if !logged || !(*acked || *maybe_logged) {
                        continue;
                    }
                    entries.push(Entry {
                        writes,
                        optional: i < ckpt || !acked,
                    });
                    if *acked && *level == Durability::Synced {
                        must_keep = entries.len();
                    }
                }
                Step::Persist { acked: true } => must_keep = entries.len(),
                Step::Checkpoint { .. } if Some(i) == from => must_keep = entries.len(),
                _ => {}
            }
        }
        let mut last_writer = vec![None; SLOTS];
        for (i, e) in entries.iter().enumerate() {
            for (s, _) in e.writes {
                last_writer[*s] = Some(i);
            }
        }
        let mut search = Search {
            base,
            entries,
            must_keep,
            recovered,
            last_writer,
            state: vec![None; SLOTS],
            mismatches: 0,
            budget: 2_000_000,
        };
        search.mismatches = (0..SLOTS).filter(|&s| !search.matches(s)).count();
        // Slots no entry writes must match the base already.
        if let Some(n) = search.dfs(0, 0) {
            return n;
        }
        budget_out |= search.budget == 0;
    }
    let lost: Vec<String> = (0..SLOTS)
        .filter(|&s| recovered[s].is_none() && steps.iter().any(|st| matches!(st, Step::Write { writes, acked: true, level: Durability::Synced, .. } if writes.iter().any(|w| w.0 == s && w.1.is_some()))))
        .map(|s| s.to_string())
        .take(10)
        .collect();
    panic!(
        "{what}: the recovered state is no checkpoint plus a prefix of the log keeping \
         every durable write (search budget exhausted: {budget_out}); absent keys once \
         written synced: {lost:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The campaign
// ---------------------------------------------------------------------------------------

fn seeds(test: &str) -> Vec<u64> {
    let first = seed(test);
    let n = env_u64("BFDB_FAULT_SEEDS").unwrap_or(1);
    (0..n)
        .map(|i| first.wrapping_add(i * 0x9E37_79B9))
        .collect()
}

#[derive(Default)]
struct Totals {
    points: u64,
    fired: u64,
    calls: u64,
    errors: u64,
    refused: u64,
    batches_checked: u64,
    replayed: u64,
    failed_closes: u64,
}

/// One run: a fresh database, the fault armed once its keyspaces exist, the workload of
/// `keys`, close, crash, reopen without faults, check. Answers whether the fault fired.
fn fault_run(
    seed: u64,
    keys: Keys,
    (target, op, fault): (Target, SimOp, SimFault),
    n: u64,
    totals: &mut Totals,
) -> bool {
    let what =
        format!("seed {seed}, {keys:?} keys, {fault:?} {op:?} fault on {target:?} after {n}");
    let dir = tempfile::tempdir().unwrap();
    let devices = Devices::new(seed, keys);
    let db = devices.open(dir.path()).unwrap();
    db.tree(KEYSPACES[0]).unwrap();
    db.tree(KEYSPACES[1]).unwrap();
    db.hash_store_with(KEYSPACES[HASH], keys.hash_options())
        .unwrap();
    devices.arm(target, op, n, fault);
    let (steps, counts) = run_workload(&db, seed, OPS, keys, &what);
    let fired = devices.injected() > 0;
    let closed = db.close();
    if let Err(e) = &closed {
        check_error(e, &format!("{what}: close"));
        totals.failed_closes += 1;
    }
    let crashed = devices.crash();
    crashed.clear_faults();
    let db = crashed
        .open(dir.path())
        .unwrap_or_else(|e| panic!("{what}: the reopen failed: {e}"));
    let recovered = read_back(&db, keys, &what);
    totals.replayed += check_recovered(&recovered, &steps, &what) as u64;
    db.close().unwrap();
    assert_no_panic(&what);
    totals.points += 1;
    totals.fired += fired as u64;
    totals.calls += counts.calls;
    totals.errors += counts.errors;
    totals.refused += counts.refused;
    totals.batches_checked += counts.batches_checked;
    fired
}

/// How a campaign chooses where to arm its faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    /// Every fault kind at every n up to 16, then at steps of an eighth (every n with
    /// `BFDB_FAULT_EVERY=1`).
    Full,
    /// Each target's operation at n = 0, 1, 3, 7, 15, ... (twice the last and one),
    /// its fault kinds in turn; a full sweep with `BFDB_FAULT_EVERY=1`.
    Sparse,
}

impl Sweep {
    /// The sweep `self` asks for, full if `BFDB_FAULT_EVERY=1` asks for every n.
    fn chosen(self) -> Sweep {
        match env_u64("BFDB_FAULT_EVERY") {
            Some(1) => Sweep::Full,
            _ => self,
        }
    }

    /// The n after `n` to arm a fault at: every n up to 16, then every n in a sweep of
    /// `BFDB_FAULT_EVERY=1`, else a step of an eighth (the long tails of page reads);
    /// or in a sparse sweep twice `n` and one.
    fn next_n(self, n: u64) -> u64 {
        match self {
            Sweep::Sparse => 2 * n + 1,
            Sweep::Full if n < 16 || env_u64("BFDB_FAULT_EVERY") == Some(1) => n + 1,
            Sweep::Full => n + n / 8,
        }
    }

    /// Each (target, operation, fault kinds) to sweep, with the kinds to take in turn:
    /// one run of n per kind in a full sweep, one per target and operation in a sparse
    /// one.
    fn kinds(self) -> Vec<Vec<(Target, SimOp, SimFault)>> {
        let kinds = fault_kinds();
        match self {
            Sweep::Full => kinds.into_iter().map(|k| vec![k]).collect(),
            Sweep::Sparse => {
                let mut grouped: Vec<Vec<(Target, SimOp, SimFault)>> = Vec::new();
                for k in kinds {
                    match grouped.last_mut() {
                        Some(g) if (g[0].0 as u8, g[0].1) == (k.0 as u8, k.1) => g.push(k),
                        _ => grouped.push(vec![k]),
                    }
                }
                grouped
            }
        }
    }
}

#[test]
fn faults_at_every_call_lose_no_acknowledged_write_and_show_no_half_batch() {
    faults_at_every_call("faults_at_every_call", Keys::Short, Sweep::Full);
}

#[test]
fn faults_with_long_keys_lose_no_acknowledged_write_and_show_no_half_batch() {
    faults_at_every_call("faults_with_long_keys", Keys::Long, Sweep::Sparse);
}

/// The campaign of faults armed in the workload of `keys`, at the calls `sweep` picks.
fn faults_at_every_call(test: &str, keys: Keys, sweep: Sweep) {
    count_panics();
    let sweep = sweep.chosen();
    let mut totals = Totals::default();
    let mut per_kind = Vec::new();
    for seed in seeds(test) {
        for kinds in sweep.kinds() {
            let mut n = 0;
            let mut points = 0;
            while fault_run(seed, keys, kinds[points % kinds.len()], n, &mut totals) {
                points += 1;
                n = sweep.next_n(n);
            }
            let (target, op, _) = kinds[0];
            let faults: Vec<String> = kinds.iter().map(|k| format!("{:?}", k.2)).collect();
            per_kind.push(format!("{} {op:?} {target:?}: {points}", faults.join("/")));
        }
    }
    eprintln!(
        "faults at every call ({keys:?} keys, {sweep:?} sweep): {} runs ({} with the fault \
         fired: {}), {} calls, {} errors \
         ({} refused for the failure state), {} batches checked whole or absent, {} closes \
         that failed, {} writes replayed and checked, 0 lost, 0 panics",
        totals.points,
        totals.fired,
        per_kind.join(", "),
        totals.calls,
        totals.errors,
        totals.refused,
        totals.batches_checked,
        totals.failed_closes,
        totals.replayed
    );
    let least = match sweep {
        Sweep::Full => 50,
        Sweep::Sparse => 30,
    };
    assert!(
        totals.fired > least,
        "faults fired in {} runs only",
        totals.fired
    );
}

/// Faults armed while a crashed database is opened (recovery reads the log, replays
/// into the trees and the hash store, and checkpoints): each open answers `Ok` or an
/// error naming its cause, never panics; an open that answered `Ok` holds what the
/// workload made durable; and once the faults are cleared, a crash and another open
/// recover it too.
#[test]
fn faults_during_an_open_fail_it_or_leave_it_whole() {
    faults_during_an_open("faults_during_an_open", Keys::Short, Sweep::Full);
}

#[test]
fn faults_during_an_open_with_long_keys_fail_it_or_leave_it_whole() {
    faults_during_an_open("faults_during_an_open_long_keys", Keys::Long, Sweep::Sparse);
}

/// Faults armed while a crashed database of `keys` is opened, at the calls `sweep`
/// picks.
fn faults_during_an_open(test: &str, keys: Keys, sweep: Sweep) {
    count_panics();
    let sweep = sweep.chosen();
    let (mut points, mut refused, mut opened) = (0u64, 0u64, 0u64);
    for seed in seeds(test) {
        let dir = tempfile::tempdir().unwrap();
        let devices = Devices::new(seed, keys);
        let db = devices.open(dir.path()).unwrap();
        let (steps, _) = run_workload(&db, seed, OPS, keys, &format!("seed {seed}"));
        let crashed = devices.crash();
        drop(db);
        for kinds in sweep.kinds() {
            let mut n = 0;
            let mut tries = 0;
            loop {
                let (target, op, fault) = kinds[tries % kinds.len()];
                tries += 1;
                let what = format!(
                    "seed {seed}, {keys:?} keys, open with a {fault:?} {op:?} fault on \
                     {target:?} after {n}"
                );
                let run = tempfile::tempdir().unwrap();
                copy_files(dir.path(), run.path());
                let d = crashed.crash();
                d.arm(target, op, n, fault);
                match d.open(run.path()) {
                    Ok(db) => {
                        opened += 1;
                        d.clear_faults();
                        // What the open answered must be right, if it can be read.
                        let readable = db
                            .tree(KEYSPACES[0])
                            .and_then(|t| t.get(&keys.key(0)))
                            .is_ok();
                        if readable && d.injected() == 0 {
                            check_recovered(&read_back(&db, keys, &what), &steps, &what);
                        }
                        if let Err(e) = db.close() {
                            check_error(&e, &format!("{what}: close"));
                        }
                    }
                    Err(e) => {
                        refused += 1;
                        check_error(&e, &what);
                    }
                }
                let fired = d.injected() > 0;
                let again = d.crash();
                let db = again
                    .open(run.path())
                    .unwrap_or_else(|e| panic!("{what}: the next open failed: {e}"));
                check_recovered(&read_back(&db, keys, &what), &steps, &what);
                db.close().unwrap();
                assert_no_panic(&what);
                points += 1;
                if !fired || n >= 400 {
                    break;
                }
                n = sweep.next_n(n);
            }
        }
    }
    eprintln!(
        "faults during an open ({keys:?} keys, {sweep:?} sweep): {points} opens with a fault \
         armed, {refused} refused, \
         {opened} opened; every next open recovered every durable write, 0 panics"
    );
}

/// Copies the files of `from` into `to` (not the lock).
fn copy_files(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}
