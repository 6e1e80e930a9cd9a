//! The cold tier as hash-ordered runs (`runs.rs`) on the cold log's device: the layout
//! of [`super::f2::ColdLayout::Runs`], which replaces F2's cold log, its chunk index and
//! cold→cold compaction.
//!
//! The hash space is cut into `2^partition_bits` **partitions** by the hash's top bits
//! (more for more expected keys, so that a partition's base is tens of MiB). Each has its
//! own runs: deltas, newest first, then at most one base.
//!
//! - **Reads** take the current set and look the key up in each run of its partition
//!   whose filter may hold it: one device read of one unit per run that may, which for a
//!   key in the base and no delta is one read. A batched read asks its [`ReadBatch`] for
//!   the unit, as a log's record is asked for.
//! - **Hot→cold compaction** gathers the live records of the hot log's oldest part (the
//!   lookups in memory that decide liveness are F2's), and [`ColdRuns::add_deltas`]
//!   writes them, sorted, as one delta per partition at the device's tail and puts each
//!   at the front of its partition; only then does the hot log's BEGIN move. No device
//!   read.
//! - **Merging** ([`ColdRuns::merge`]) one partition at a time: its runs (all of them, or
//!   its deltas only, [`MergeOf`]) read sequentially, one run written at the tail with
//!   the newest version of each key: a base without tombstones, or a delta that keeps
//!   them in front of the base. A merge is at most a partition's worth of IO (a 64th of
//!   the tier at 20M keys), so the one compaction a store runs at a time is never held
//!   for long.
//!
//! **Space.** Runs a merge replaced are *dead*. They may still be read by a thread that
//! took the set before, and a kept checkpoint of the database may name them, so each is
//! discarded (a hole punched, [`BlockDevice::discard`]) only once both are past: the
//! epoch action of a discard runs after every thread refreshed, and it is registered
//! only when the oldest kept checkpoint was taken after the run died
//! ([`ColdRuns::release_dead`]). The device is truncated below the oldest live run.
//!
//! **Checkpoints** ([`ColdRuns::checkpoint`]) append a *directory* at the tail: the
//! partition bits and every live run's partition and extent, with a footer of their
//! own. The checkpoint records the tier's extent (the oldest live run's start to the
//! directory's end); recovery reads the directory at its end ([`ColdRuns::recover`]).
//! Runs written after the checkpoint are not in it; recovery's tail is the directory's
//! end, so later writes overwrite them.
//!
//! Reads need no false-absence check (F2 §5.4): a merge replaces the runs it takes with
//! one that answers every key as they did, and a reader keeps the set it took,
//! whose bytes stay until it refreshes; a hot→cold pass publishes its deltas before the
//! hot log's BEGIN moves, and a read looks at the cold tier after its hot walk, so a
//! read that missed a record truncated from the hot log finds it in a delta.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::epoch::{Epoch, EpochGuard};
use super::hlog::LogExtent;
use super::hot::hash_key;
use super::record::LogValue;
use super::runs::{self, Gathered, PAGE_BYTES, Run, RunKind, RunRecord};
use crate::error::Result;
use crate::storage::{AlignedBuf, BlockDevice};
use crate::sync::{Mutex, RwLock};

/// Deltas at which a partition's deltas are merged into one delta, whatever their size:
/// each is a probe of its filter per lookup (and a read for about 1% of absent keys).
const MAX_DELTAS: usize = 8;

/// A partition's runs are merged into a new base once its deltas hold this fraction of
/// its base's data pages: a base merge rewrites the base, so a record moved cold is
/// written about this many times more in base merges (all of it sequentially), and
/// about twice more in merges of deltas into one before that.
const DELTA_FRACTION_DIVISOR: u64 = 4;

/// What a merge of a partition takes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MergeOf {
    /// Its deltas, into one delta in front of its base (tombstones kept, a filter).
    Deltas,
    /// All of its runs, into a new base.
    All,
}

/// The least bytes of dead runs that bring a checkpoint (`dead_past_share`): small
/// stores need none for their few pages.
const MIN_DEAD_TRIGGER_BYTES: u64 = 4 << 20;

/// Keys per partition the partition count aims at: a base of about 30 MiB of 8 + 100-byte
/// records.
const KEYS_PER_PARTITION: u64 = 256 << 10;

/// The most partitions a tier has.
const MAX_PARTITION_BITS: u32 = 10;

/// The partition bits for a store that expects `keys` keys.
pub(crate) fn partition_bits_for(keys: u64) -> u32 {
    (keys / KEYS_PER_PARTITION)
        .max(1)
        .ilog2()
        .min(MAX_PARTITION_BITS)
}

/// The runs of one partition: deltas newest first, then its base if it has one.
#[derive(Clone, Default)]
struct Partition {
    runs: Vec<Arc<Run>>,
}

impl Partition {
    fn deltas(&self) -> impl Iterator<Item = &Arc<Run>> {
        self.runs.iter().filter(|r| r.kind() == RunKind::Delta)
    }

    fn base_pages(&self) -> u64 {
        self.runs
            .iter()
            .filter(|r| r.kind() == RunKind::Base)
            .map(|r| r.data_pages())
            .sum()
    }

    /// How much a merge is due, and of what: a base merge once the deltas hold their
    /// fraction of the base (or there is no base), else a merge of the deltas into one
    /// once they are many.
    fn merge_due(&self) -> Option<(u64, MergeOf)> {
        let deltas = self.deltas().count();
        let delta_pages: u64 = self.deltas().map(|r| r.data_pages()).sum();
        let base = self.base_pages();
        if deltas > 0 && delta_pages * DELTA_FRACTION_DIVISOR >= base {
            // The most due first: the most delta data beyond the fraction, then the
            // most deltas.
            let beyond = (delta_pages * DELTA_FRACTION_DIVISOR).saturating_sub(base);
            return Some((beyond + deltas as u64, MergeOf::All));
        }
        (deltas >= MAX_DELTAS).then_some((deltas as u64, MergeOf::Deltas))
    }
}

/// The runs of every partition at one moment.
#[derive(Clone, Default)]
pub(crate) struct RunSet {
    bits: u32,
    partitions: Vec<Partition>,
}

impl RunSet {
    fn empty(bits: u32) -> RunSet {
        RunSet {
            bits,
            partitions: vec![Partition::default(); 1 << bits],
        }
    }

    fn partition_of(&self, hash: u64) -> usize {
        partition_of(hash, self.bits)
    }

    fn all(&self) -> impl Iterator<Item = &Arc<Run>> {
        self.partitions.iter().flat_map(|p| p.runs.iter())
    }
}

/// The partition of `hash` among `2^bits`: its top bits.
fn partition_of(hash: u64, bits: u32) -> usize {
    match bits {
        0 => 0,
        b => (hash >> (64 - b)) as usize,
    }
}

/// A run a merge replaced, and the tail when it did: discarded once every kept
/// checkpoint was taken at a later tail.
struct Dead {
    start: u64,
    end: u64,
    died_at: u64,
}

/// The cold tier of a store in the runs layout.
pub(crate) struct ColdRuns {
    device: Arc<dyn BlockDevice>,
    epoch: Arc<Epoch>,
    /// Replaced whole by the one compaction a store runs at a time; a reader clones the
    /// `Arc` and reads its runs under its epoch guard.
    set: RwLock<Arc<RunSet>>,
    /// Where the next run goes.
    tail: AtomicU64,
    /// The start of the oldest live run or of the last directory (the tail if neither):
    /// the tier's BEGIN. Derived from the set and the directory, and kept because every
    /// write reads it (`F2::log_sizes`, which throttling checks): set by `note_begin`
    /// wherever those change.
    begin: AtomicU64,
    /// Runs (and directories) no longer live, not yet discarded.
    dead: Mutex<Vec<Dead>>,
    /// The extent of the directory the last checkpoint (or the recovery) wrote or
    /// read: it dies when the next checkpoint writes its own.
    last_directory: Mutex<Option<(u64, u64)>>,
    /// Units read by lookups (blocking or batched).
    unit_reads: AtomicU64,
    merges: AtomicU64,
    delta_merges: AtomicU64,
    deltas_added: AtomicU64,
    discarded_bytes: AtomicU64,
}

impl ColdRuns {
    /// An empty tier on `device`, whose address space is unused, of `2^partition_bits`
    /// partitions.
    pub(crate) fn new(
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
        partition_bits: u32,
    ) -> ColdRuns {
        ColdRuns::with_set(
            device,
            epoch,
            RunSet::empty(partition_bits),
            0,
            Vec::new(),
            None,
        )
    }

    fn with_set(
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
        set: RunSet,
        tail: u64,
        dead: Vec<Dead>,
        last_directory: Option<(u64, u64)>,
    ) -> ColdRuns {
        let runs = ColdRuns {
            device,
            epoch,
            set: RwLock::new(Arc::new(set)),
            tail: AtomicU64::new(tail),
            begin: AtomicU64::new(0),
            dead: Mutex::new(dead),
            last_directory: Mutex::new(last_directory),
            unit_reads: AtomicU64::new(0),
            merges: AtomicU64::new(0),
            delta_merges: AtomicU64::new(0),
            deltas_added: AtomicU64::new(0),
            discarded_bytes: AtomicU64::new(0),
        };
        runs.note_begin();
        runs
    }

    /// The tier a checkpoint recorded as `extent`: the runs its directory, which ends
    /// the extent, names. An empty extent is an empty tier of `partition_bits`.
    pub(crate) fn recover(
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
        extent: LogExtent,
        partition_bits: u32,
    ) -> Result<ColdRuns> {
        if extent.tail == 0 {
            return Ok(ColdRuns::new(device, epoch, partition_bits));
        }
        let directory = Directory::read(device.as_ref(), extent.tail)?;
        let mut set = RunSet::empty(directory.bits);
        let mut live: Vec<(u64, u64)> = vec![(directory.start, extent.tail)];
        for entry in &directory.entries {
            if entry.start < extent.begin || entry.partition >= set.partitions.len() {
                return Err(runs::corrupt(
                    device.as_ref(),
                    directory.start,
                    &format!(
                        "the cold runs' directory names a run at {} of partition {} \
                         (extent from {}, {} partitions)",
                        entry.start,
                        entry.partition,
                        extent.begin,
                        set.partitions.len()
                    ),
                ));
            }
            let run = Run::open(device.as_ref(), entry.start, entry.end)?;
            live.push(run.extent());
            set.partitions[entry.partition].runs.push(Arc::new(run));
        }
        // The directory lists each partition's runs newest first already. What lies
        // between the live runs is dead (runs replaced since the checkpoint before):
        // discarded once a checkpoint after this recovery is the oldest kept.
        live.sort_unstable();
        let mut dead = Vec::new();
        let mut at = extent.begin;
        for (start, end) in live {
            if start > at {
                dead.push(Dead {
                    start: at,
                    end: start,
                    died_at: extent.tail,
                });
            }
            at = at.max(end);
        }
        let last = Some((directory.start, extent.tail));
        Ok(ColdRuns::with_set(
            device,
            epoch,
            set,
            extent.tail,
            dead,
            last,
        ))
    }

    /// Names the tier among the sources of a batch's reads.
    fn id(&self) -> usize {
        self as *const ColdRuns as usize
    }

    /// The runs now.
    pub(crate) fn runs(&self) -> Arc<RunSet> {
        Arc::clone(&self.set.read())
    }

    /// The newest record of `key` in the tier: `None` if it has none, `Some(None)` a
    /// tombstone. Under a batched guard a unit not read yet is asked of its batch (the
    /// pending signal).
    pub(crate) fn read(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
    ) -> Result<Option<Option<LogValue>>> {
        let hash = hash_key(key).0;
        let set = self.runs();
        for run in &set.partitions[set.partition_of(hash)].runs {
            if let Some(found) = self.read_run(guard, run, hash, key)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// What `run` holds for `key`.
    fn read_run(
        &self,
        guard: &EpochGuard<'_, '_>,
        run: &Run,
        hash: u64,
        key: &[u8],
    ) -> Result<Option<Option<LogValue>>> {
        if !run.may_contain(hash) {
            return Ok(None);
        }
        let Some(unit) = run.locate(hash) else {
            return Ok(None);
        };
        let device = self.device.as_ref();
        let found = match guard.read_batch() {
            // A unit across two segments (a long record's, rarely) is read on the spot.
            Some(batch) if runs::within_segment(device, unit.address, unit.len) => batch
                .bytes_at(self.id(), &self.device, unit.address, unit.len, |bytes| {
                    runs::find_in_unit(bytes, hash, key)
                })?
                .map_err(|why| runs::corrupt(device, unit.address, &why)),
            _ => runs::read_unit(device, unit, hash, key),
        };
        // Counted once the unit is read (a batch's pending signal returned above).
        self.unit_reads.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Adds to `held` the references of the values out of line that records of `key`
    /// in any run hold (not only the newest: compaction's "last holder reports" rule).
    pub(crate) fn references_held(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        held: &mut HashSet<Vec<u8>>,
    ) -> Result<()> {
        let hash = hash_key(key).0;
        let set = self.runs();
        for run in &set.partitions[set.partition_of(hash)].runs {
            if let Some(Some(value)) = self.read_run(guard, run, hash, key)?
                && value.out_of_line
            {
                held.insert(value.bytes);
            }
        }
        Ok(())
    }

    /// Writes the `gathered` records (live records leaving the hot log; of two of one
    /// key the newer) as one delta per partition at the tail and puts each at the front
    /// of its partition. Returns the records written. The caller runs the store's one
    /// compaction.
    pub(crate) fn add_deltas(&self, gathered: Gathered) -> Result<u64> {
        if gathered.len() == 0 {
            return Ok(0);
        }
        let at = self.tail.load(Ordering::Acquire);
        let bits = self.runs().bits;
        let (deltas, written) =
            gathered.write_runs(self.device.as_ref(), at, RunKind::Delta, |h| {
                partition_of(h, bits)
            })?;
        let mut set = self.set.write();
        let mut next = RunSet::clone(&set);
        for (partition, run) in deltas {
            self.tail.fetch_max(run.extent().1, Ordering::AcqRel);
            next.partitions[partition].runs.insert(0, Arc::new(run));
            self.deltas_added.fetch_add(1, Ordering::Relaxed);
        }
        *set = Arc::new(next);
        drop(set);
        self.note_begin();
        Ok(written)
    }

    /// The partition most due for a merge, if any is, and what to merge of it.
    pub(crate) fn next_merge(&self) -> Option<(usize, MergeOf)> {
        let set = self.runs();
        set.partitions
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.merge_due().map(|(due, of)| (due, i, of)))
            .max_by_key(|&(due, i, _)| (due, i))
            .map(|(_, i, of)| (i, of))
    }

    /// The partitions that have a delta: those a merge of everything merges.
    pub(crate) fn partitions_with_deltas(&self) -> Vec<usize> {
        let set = self.runs();
        (0..set.partitions.len())
            .filter(|&i| set.partitions[i].deltas().next().is_some())
            .collect()
    }

    /// The start of the oldest live run (or of the last directory, or the tail): the
    /// tier's BEGIN, below which nothing is needed.
    pub(crate) fn lowest(&self) -> u64 {
        self.begin.load(Ordering::Acquire)
    }

    /// Recomputes the tier's BEGIN ([`ColdRuns::lowest`]) after the set, the tail or
    /// the last directory changed (under the store's one compaction, or before the
    /// tier is shared).
    fn note_begin(&self) {
        let directory = self.last_directory.lock().map(|(start, _)| start);
        let begin = self
            .runs()
            .all()
            .map(|r| r.extent().0)
            .chain(directory)
            .min()
            .unwrap_or_else(|| self.tail.load(Ordering::Acquire));
        self.begin.store(begin, Ordering::Release);
    }

    /// Merges the runs `of` says of `partition` into one run written at the tail (a
    /// base of all of them, or a delta of its deltas, put in front of its base), hands
    /// each record version it drops as superseded to `superseded`, puts the new run in
    /// their place, and notes the old runs dead (see the module docs for when their
    /// space goes). The caller runs the store's one compaction (so nothing else changes
    /// the partition meanwhile); `guard` is its own.
    pub(crate) fn merge(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        partition: usize,
        of: MergeOf,
        superseded: &mut dyn FnMut(RunRecord),
    ) -> Result<()> {
        let runs = self.runs().partitions[partition].runs.clone();
        let (old, kept, kind): (Vec<_>, Vec<_>, _) = match of {
            MergeOf::All => (runs, Vec::new(), RunKind::Base),
            MergeOf::Deltas => {
                let (deltas, base) = runs.into_iter().partition(|r| r.kind() == RunKind::Delta);
                (deltas, base, RunKind::Delta)
            }
        };
        if old.is_empty() {
            return Ok(());
        }
        let at = self.tail.load(Ordering::Acquire);
        let merged = runs::merge(self.device.as_ref(), &old, at, kind, superseded)?;
        let end = merged.extent().1;
        self.tail.store(end, Ordering::Release);
        {
            let mut set = self.set.write();
            let mut next = RunSet::clone(&set);
            // A run of no records (a base of keys all deleted) is left out.
            let empty = merged.records() == 0;
            next.partitions[partition].runs = (!empty)
                .then(|| Arc::new(merged))
                .into_iter()
                .chain(kept)
                .collect();
            if empty {
                self.dead.lock().push(Dead {
                    start: at,
                    end,
                    died_at: end,
                });
            }
            *set = Arc::new(next);
        }
        self.dead.lock().extend(old.iter().map(|r| {
            let (start, end_of_run) = r.extent();
            Dead {
                start,
                end: end_of_run,
                died_at: end,
            }
        }));
        self.note_begin();
        self.truncate_below_live(guard);
        self.merges.fetch_add(1, Ordering::Relaxed);
        if of == MergeOf::Deltas {
            self.delta_merges.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Truncates the device below the oldest live run (a floor of the database's kept
    /// checkpoints may hold it back: `Retaining`), once every thread has refreshed.
    fn truncate_below_live(&self, guard: &mut EpochGuard<'_, '_>) {
        let lowest = self.lowest();
        self.dead.lock().retain(|d| d.end > lowest);
        let device = Arc::clone(&self.device);
        guard.bump_with_action(move || {
            if let Err(e) = device.truncate_before(lowest) {
                log::warn!("bfdb: giving back cold runs below {lowest}: {e}");
            }
        });
    }

    /// Discards the dead runs that no kept checkpoint can name: those that died at or
    /// below `floor`, the lowest tail of the kept checkpoints' records of this tier
    /// (`F2Extents::chunks.begin` in this layout), once every thread has refreshed.
    pub(crate) fn release_dead(&self, floor: u64) {
        let released: Vec<Dead> = {
            let mut dead = self.dead.lock();
            let (go, stay): (Vec<Dead>, Vec<Dead>) =
                dead.drain(..).partition(|d| d.died_at <= floor);
            *dead = stay;
            go
        };
        if released.is_empty() {
            return;
        }
        let bytes: u64 = released.iter().map(|d| d.end - d.start).sum();
        self.discarded_bytes.fetch_add(bytes, Ordering::Relaxed);
        let device = Arc::clone(&self.device);
        self.epoch.bump_with_action(move || {
            for d in released {
                if let Err(e) = device.discard(d.start, d.end - d.start) {
                    log::warn!(
                        "bfdb: giving back cold runs at [{}, {}): {e}",
                        d.start,
                        d.end
                    );
                }
            }
        });
    }

    /// Appends a directory of the live runs at the tail and syncs the device: what a
    /// checkpoint records is the returned extent (the oldest live run's start, or the
    /// directory's, to the directory's end). The directory before it dies now. The
    /// caller runs the store's one compaction.
    pub(crate) fn checkpoint(&self) -> Result<LogExtent> {
        let set = self.runs();
        let at = self.tail.load(Ordering::Acquire);
        let directory = Directory {
            bits: set.bits,
            start: at,
            entries: set
                .partitions
                .iter()
                .enumerate()
                .flat_map(|(partition, p)| {
                    p.runs.iter().map(move |r| DirectoryEntry {
                        partition,
                        start: r.extent().0,
                        end: r.extent().1,
                    })
                })
                .collect(),
        };
        let end = directory.write(self.device.as_ref())?;
        self.device.sync()?;
        self.tail.store(end, Ordering::Release);
        if let Some((start, old_end)) = self.last_directory.lock().replace((at, end)) {
            self.dead.lock().push(Dead {
                start,
                end: old_end,
                died_at: end,
            });
        }
        let begin = set.all().map(|r| r.extent().0).min().unwrap_or(at);
        self.note_begin();
        Ok(LogExtent { begin, tail: end })
    }

    /// Bytes of the device from the oldest live run to the tail.
    pub(crate) fn size_bytes(&self) -> u64 {
        // BEGIN first: it is stored after the tail it was taken below (a compaction
        // running meanwhile only raises both).
        let lowest = self.lowest();
        self.tail.load(Ordering::Acquire).saturating_sub(lowest)
    }

    /// The memory the runs' fences and filters take.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.runs().all().map(|r| r.memory_bytes()).sum()
    }

    /// Whether the dead runs not given back yet take more than an eighth of the live
    /// runs' bytes (and at least [`MIN_DEAD_TRIGGER_BYTES`]): the database then takes
    /// checkpoints, after which they can go (`release_dead`).
    pub(crate) fn dead_past_share(&self) -> bool {
        let s = self.stats();
        s.dead_bytes > (s.live_bytes / 8).max(MIN_DEAD_TRIGGER_BYTES)
    }

    pub(crate) fn stats(&self) -> ColdRunsStats {
        let set = self.runs();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ColdRunsStats {
            live_bytes: set.all().map(|r| r.extent().1 - r.extent().0).sum(),
            dead_bytes: self.dead.lock().iter().map(|d| d.end - d.start).sum(),
            runs: set.all().count() as u64,
            records: set.all().map(|r| r.records()).sum(),
            unit_reads: load(&self.unit_reads),
            merges: load(&self.merges),
            delta_merges: load(&self.delta_merges),
            deltas_added: load(&self.deltas_added),
            discarded_bytes: load(&self.discarded_bytes),
        }
    }
}

/// What the runs layout's cold tier holds and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ColdRunsStats {
    /// Runs in the set now, and their records (versions, tombstones included).
    pub(crate) runs: u64,
    pub(crate) records: u64,
    /// Units read by lookups.
    pub(crate) unit_reads: u64,
    /// Merges (of a partition into a base, or of its deltas into one), those of deltas
    /// only, and deltas written by hot→cold passes.
    pub(crate) merges: u64,
    pub(crate) delta_merges: u64,
    pub(crate) deltas_added: u64,
    /// Bytes of dead runs given back (holes punched).
    pub(crate) discarded_bytes: u64,
    /// Bytes of the live runs, and of the dead ones not given back yet.
    pub(crate) live_bytes: u64,
    pub(crate) dead_bytes: u64,
}

// ---------------------------------------------------------------------------------------
// The directory a checkpoint appends
// ---------------------------------------------------------------------------------------

/// The live runs at a checkpoint: entries of 24 bytes (start, end, partition as `u32`,
/// four zero bytes), in pages, then a footer page: magic, version, partition bits, entry
/// count, the CRC-32C of the entry pages and its own.
struct Directory {
    bits: u32,
    /// Where it starts on the device.
    start: u64,
    /// Each partition's runs in its order (newest first).
    entries: Vec<DirectoryEntry>,
}

struct DirectoryEntry {
    partition: usize,
    start: u64,
    end: u64,
}

const DIRECTORY_MAGIC: u64 = u64::from_le_bytes(*b"bfdbRDIR");
const DIRECTORY_VERSION: u32 = 1;
const DIRECTORY_ENTRY_BYTES: usize = 24;

impl Directory {
    /// Writes the directory at `self.start`; returns its end.
    fn write(&self, device: &dyn BlockDevice) -> Result<u64> {
        let entry_bytes = self.entries.len() * DIRECTORY_ENTRY_BYTES;
        let entry_pages = entry_bytes.div_ceil(PAGE_BYTES);
        let mut buf = AlignedBuf::new((entry_pages + 1) * PAGE_BYTES);
        let bytes = buf.as_mut();
        for (i, e) in self.entries.iter().enumerate() {
            let at = i * DIRECTORY_ENTRY_BYTES;
            bytes[at..at + 8].copy_from_slice(&e.start.to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&e.end.to_le_bytes());
            bytes[at + 16..at + 20].copy_from_slice(&(e.partition as u32).to_le_bytes());
        }
        let entries_crc = crc32c::crc32c(&bytes[..entry_pages * PAGE_BYTES]);
        let footer = &mut bytes[entry_pages * PAGE_BYTES..];
        footer[0..8].copy_from_slice(&DIRECTORY_MAGIC.to_le_bytes());
        footer[8..12].copy_from_slice(&DIRECTORY_VERSION.to_le_bytes());
        footer[12..16].copy_from_slice(&self.bits.to_le_bytes());
        footer[16..24].copy_from_slice(&(self.entries.len() as u64).to_le_bytes());
        footer[24..28].copy_from_slice(&entries_crc.to_le_bytes());
        let crc = crc32c::crc32c(&footer[..28]);
        footer[28..32].copy_from_slice(&crc.to_le_bytes());
        runs::write_split(device, self.start, buf.as_ref())?;
        Ok(self.start + buf.as_ref().len() as u64)
    }

    /// Reads the directory that ends at `end`, checked.
    fn read(device: &dyn BlockDevice, end: u64) -> Result<Directory> {
        let page = PAGE_BYTES as u64;
        let bad = |at: u64, why: &str| runs::corrupt(device, at, why);
        if end < page || !end.is_multiple_of(page) {
            return Err(bad(end, "no cold runs' directory can end here"));
        }
        let footer_at = end - page;
        let mut footer = AlignedBuf::new(PAGE_BYTES);
        runs::read_split(device, footer_at, footer.as_mut())?;
        let f = footer.as_ref();
        let u64_at = |at| runs::le_u64(f, at);
        let u32_at = |at| runs::le_u32(f, at);
        if u64_at(0) != DIRECTORY_MAGIC {
            return Err(bad(
                footer_at,
                "no cold runs' directory where the extent ends",
            ));
        }
        if u32_at(28) != crc32c::crc32c(&f[..28]) {
            return Err(bad(
                footer_at,
                "the cold runs' directory failed its checksum",
            ));
        }
        if u32_at(8) != DIRECTORY_VERSION {
            return Err(bad(
                footer_at,
                &format!("a cold runs' directory of version {}", u32_at(8)),
            ));
        }
        let bits = u32_at(12);
        let count = u64_at(16);
        if bits > MAX_PARTITION_BITS || count > (1 << 32) {
            return Err(bad(footer_at, "a cold runs' directory out of range"));
        }
        let entry_pages = (count * DIRECTORY_ENTRY_BYTES as u64).div_ceil(page);
        let start = footer_at
            .checked_sub(entry_pages * page)
            .ok_or_else(|| bad(footer_at, "a cold runs' directory starts below 0"))?;
        let mut entries_buf = AlignedBuf::new((entry_pages * page).max(page) as usize);
        let entry_bytes = &mut entries_buf.as_mut()[..(entry_pages * page) as usize];
        runs::read_split(device, start, entry_bytes)?;
        if crc32c::crc32c(entry_bytes) != u32_at(24) {
            return Err(bad(
                start,
                "the cold runs' directory entries failed their checksum",
            ));
        }
        let entries = entry_bytes
            .chunks_exact(DIRECTORY_ENTRY_BYTES)
            .take(count as usize)
            .map(|e| DirectoryEntry {
                start: runs::le_u64(e, 0),
                end: runs::le_u64(e, 8),
                partition: runs::le_u32(e, 16) as usize,
            })
            .collect();
        Ok(Directory {
            bits,
            start,
            entries,
        })
    }
}
