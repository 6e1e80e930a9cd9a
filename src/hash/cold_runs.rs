//! The cold tier as a set of hash-ordered runs (`runs.rs`) on the cold log's device: the
//! layout of [`super::f2::ColdLayout::Runs`], which replaces F2's cold log, its chunk
//! index and cold→cold compaction.
//!
//! - **Reads** take the current set (newest run first) and look the key up in each run
//!   whose filter may hold it: one device read of one unit per run that may, which for
//!   a key in the base and no delta is one read. A batched read asks its
//!   [`ReadBatch`] for the unit, as a log's record is asked for.
//! - **Hot→cold compaction** gathers the live records of the hot log's oldest part (the
//!   lookups in memory that decide liveness are F2's), and [`ColdRuns::add_delta`]
//!   writes them, sorted, as one delta run at the device's tail and puts it at the
//!   front of the set; only then does the hot log's BEGIN move. No device read.
//! - **Merging** ([`ColdRuns::merge`]) reads every run sequentially and writes one base
//!   at the tail: the newest version of each key, tombstones dropped. The set becomes
//!   that base, and the device is truncated below it once every thread that could read
//!   the old runs has refreshed (an epoch action, as a log's truncation).
//!
//! The runs always tile `[BEGIN, TAIL)` of the device: each is written at the tail,
//! and a merge's base is written after every run it replaces, all of which lie below
//! it. So a checkpoint records the tier as that extent, and recovery finds the runs by
//! reading footers down from TAIL ([`ColdRuns::recover`]).
//!
//! Reads need no false-absence check (F2 §5.4): a merge replaces the set whole with runs
//! that answer every key as before, and a reader keeps the set it took, whose bytes a
//! truncation leaves until it refreshes; a hot→cold pass publishes its delta before the
//! hot log's BEGIN moves, and a read looks at the cold tier after its hot walk, so a
//! read that missed a record truncated from the hot log finds it in the delta.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::epoch::EpochGuard;
use super::hlog::LogExtent;
use super::hot::hash_key;
use super::record::LogValue;
use super::runs::{self, Gathered, Run, RunKind, RunRecord};
use crate::error::Result;
use crate::storage::{AlignedBuf, BlockDevice};
use crate::sync::RwLock;

/// Deltas at which the set is merged, whatever their size: each is a read per lookup
/// that its filter lets through (about 1% of absent keys).
const MAX_DELTAS: usize = 8;

/// The set is merged once its deltas hold this fraction of its base's data pages: a
/// merge rewrites the base, so the write amplification of a record moved cold is about
/// the inverse (8), all of it sequential.
const DELTA_FRACTION_DIVISOR: u64 = 8;

/// The cold tier of a store in the runs layout.
pub(crate) struct ColdRuns {
    device: Arc<dyn BlockDevice>,
    /// The runs, newest first. Replaced whole by the one compaction a store runs at a
    /// time; a reader clones the `Arc` and reads its runs under its epoch guard.
    set: RwLock<Arc<Vec<Arc<Run>>>>,
    /// The oldest run's start and the newest's end (where the next run goes).
    begin: AtomicU64,
    tail: AtomicU64,
    /// Units read by lookups (blocking or batched), and lookups a filter answered.
    unit_reads: AtomicU64,
    filter_skips: AtomicU64,
    merges: AtomicU64,
    deltas_added: AtomicU64,
}

impl ColdRuns {
    /// An empty tier on `device`, whose address space is unused.
    pub(crate) fn new(device: Arc<dyn BlockDevice>) -> ColdRuns {
        ColdRuns::with_runs(device, Vec::new(), LogExtent { begin: 0, tail: 0 })
    }

    fn with_runs(device: Arc<dyn BlockDevice>, runs: Vec<Arc<Run>>, extent: LogExtent) -> ColdRuns {
        ColdRuns {
            device,
            set: RwLock::new(Arc::new(runs)),
            begin: AtomicU64::new(extent.begin),
            tail: AtomicU64::new(extent.tail),
            unit_reads: AtomicU64::new(0),
            filter_skips: AtomicU64::new(0),
            merges: AtomicU64::new(0),
            deltas_added: AtomicU64::new(0),
        }
    }

    /// The tier a checkpoint recorded as `extent`: its runs, found by reading their
    /// footers from the extent's end down to its start.
    pub(crate) fn recover(device: Arc<dyn BlockDevice>, extent: LogExtent) -> Result<ColdRuns> {
        let mut runs = Vec::new();
        let mut end = extent.tail;
        while end > extent.begin {
            let run = Run::open_ending_at(device.as_ref(), end, extent.begin)?;
            end = run.extent().0;
            runs.push(Arc::new(run));
        }
        if end != extent.begin {
            return Err(runs::corrupt(
                device.as_ref(),
                end,
                &format!(
                    "the cold runs end at {end}, below the checkpoint's start {}",
                    extent.begin
                ),
            ));
        }
        Ok(ColdRuns::with_runs(device, runs, extent))
    }

    /// Names the tier among the sources of a batch's reads.
    fn id(&self) -> usize {
        self as *const ColdRuns as usize
    }

    /// The runs now, newest first.
    pub(crate) fn runs(&self) -> Arc<Vec<Arc<Run>>> {
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
        for run in self.runs().iter() {
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
            self.filter_skips.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let Some(unit) = run.locate(hash) else {
            return Ok(None);
        };
        let device = self.device.as_ref();
        let whole = runs::within_segment(device, unit.address, unit.len);
        let found = match guard.read_batch() {
            Some(batch) if whole => {
                batch.bytes_at(self.id(), &self.device, unit.address, unit.len, |bytes| {
                    runs::find_in_unit(bytes, hash, key)
                })?
            }
            _ => {
                let mut buf = AlignedBuf::new(unit.len);
                runs::read_split(device, unit.address, buf.as_mut())?;
                runs::find_in_unit(buf.as_ref(), hash, key)
            }
        };
        self.unit_reads.fetch_add(1, Ordering::Relaxed);
        found.map_err(|why| runs::corrupt(device, unit.address, &why))
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
        for run in self.runs().iter() {
            if let Some(Some(value)) = self.read_run(guard, run, hash, key)?
                && value.out_of_line
            {
                held.insert(value.bytes);
            }
        }
        Ok(())
    }

    /// Writes the `gathered` records (live records leaving the hot log; of two of one
    /// key the newer) as a delta run at the tail and puts it at the front of the set.
    /// Returns the records written. The caller runs the store's one compaction.
    pub(crate) fn add_delta(&self, gathered: Gathered) -> Result<u64> {
        if gathered.len() == 0 {
            return Ok(0);
        }
        let at = self.tail.load(Ordering::Acquire);
        let (run, written) = gathered.write_run(self.device.as_ref(), at, RunKind::Delta)?;
        let run = Arc::new(run);
        self.tail.store(run.extent().1, Ordering::Release);
        let mut set = self.set.write();
        let mut runs = Vec::with_capacity(set.len() + 1);
        runs.push(run);
        runs.extend(set.iter().cloned());
        *set = Arc::new(runs);
        self.deltas_added.fetch_add(1, Ordering::Relaxed);
        Ok(written)
    }

    /// Whether the deltas are many enough, or large enough beside the base, to merge.
    pub(crate) fn wants_merge(&self) -> bool {
        let runs = self.runs();
        let deltas: Vec<&Arc<Run>> = runs.iter().filter(|r| r.kind() == RunKind::Delta).collect();
        let base_pages: u64 = runs
            .iter()
            .filter(|r| r.kind() == RunKind::Base)
            .map(|r| r.data_pages())
            .sum();
        let delta_pages: u64 = deltas.iter().map(|r| r.data_pages()).sum();
        deltas.len() >= MAX_DELTAS
            || (!deltas.is_empty() && delta_pages * DELTA_FRACTION_DIVISOR >= base_pages)
    }

    /// Merges every run into one base written at the tail, hands each record version it
    /// drops as superseded to `superseded`, makes the base the set, and gives the old
    /// runs' space back once no thread can still read them. The caller runs the store's
    /// one compaction; `guard` is its own.
    pub(crate) fn merge(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        superseded: &mut dyn FnMut(RunRecord),
    ) -> Result<()> {
        let old = self.runs();
        if old.is_empty() {
            return Ok(());
        }
        let at = self.tail.load(Ordering::Acquire);
        let base = Arc::new(runs::merge(
            self.device.as_ref(),
            &old,
            at,
            RunKind::Base,
            superseded,
        )?);
        let (start, end) = base.extent();
        self.tail.store(end, Ordering::Release);
        *self.set.write() = Arc::new(vec![base]);
        self.begin.store(start, Ordering::Release);
        let device = Arc::clone(&self.device);
        guard.bump_with_action(move || {
            if let Err(e) = device.truncate_before(start) {
                log::warn!("bfdb: giving back merged cold runs below {start}: {e}");
            }
        });
        self.merges.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The tier's extent on its device, as a checkpoint records it.
    pub(crate) fn extent(&self) -> LogExtent {
        LogExtent {
            begin: self.begin.load(Ordering::Acquire),
            tail: self.tail.load(Ordering::Acquire),
        }
    }

    /// Bytes of the device the runs take.
    pub(crate) fn size_bytes(&self) -> u64 {
        let e = self.extent();
        e.tail - e.begin
    }

    /// Makes every run written so far durable.
    pub(crate) fn sync(&self) -> Result<()> {
        Ok(self.device.sync()?)
    }

    /// The memory the runs' fences and filters take.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.runs().iter().map(|r| r.memory_bytes()).sum()
    }

    pub(crate) fn stats(&self) -> ColdRunsStats {
        let runs = self.runs();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ColdRunsStats {
            runs: runs.len() as u64,
            records: runs.iter().map(|r| r.records()).sum(),
            unit_reads: load(&self.unit_reads),
            filter_skips: load(&self.filter_skips),
            merges: load(&self.merges),
            deltas_added: load(&self.deltas_added),
        }
    }
}

/// What the runs layout's cold tier holds and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ColdRunsStats {
    /// Runs in the set now, and their records (versions, tombstones included).
    pub(crate) runs: u64,
    pub(crate) records: u64,
    /// Units read by lookups, and run lookups a delta's filter answered without a read.
    pub(crate) unit_reads: u64,
    pub(crate) filter_skips: u64,
    /// Merges into a base, and deltas written by hot→cold passes.
    pub(crate) merges: u64,
    pub(crate) deltas_added: u64,
}
