//! F2's two tiers together (PVLDB 2025, sections 4-5): operations across the hot log
//! and the cold log, and lookup-based compaction from the hot log to the cold log and
//! within the cold log.
//!
//! - **Reads** look in the hot log; a key it has no record of is looked up in the cold
//!   log. A tombstone in the hot log answers "absent" without the cold log. With a read
//!   cache (`read_cache_memory_bytes`), a value read from disk — the hot log's or the
//!   cold log's — is copied into it, at the head of the key's hot chain, where the next
//!   read finds it (section 7).
//! - **Upserts and deletes** go to the hot log only (a delete appends a tombstone).
//! - **Read-modify-writes** (algorithm 1): in the hot log if it has a record of the key;
//!   otherwise the old value comes from the cold log, and the result is appended to the
//!   hot log by Conditional-Insert — only if the key's hot chain still has the head it
//!   had when the operation began.
//! - **Hot→cold compaction** copies the live records of the oldest part of the hot log
//!   (below SAFE_READ_ONLY, so nothing there changes in place) to the cold log's tail,
//!   then moves the hot log's BEGIN past them. A record is live if it is its key's
//!   newest in the hot log (a lookup: F2's *lookup-based* compaction, no scan of the
//!   rest of the log). A newer record arriving after the check only makes the copy
//!   superfluous: reads find the newer one first.
//! - **Cold→cold compaction** does the same within the cold log, with Conditional-Insert
//!   (`ColdLog::insert_if_newest`): a copy is linked only while its source is still the
//!   key's newest cold record.
//! - **Chunk-log compaction** (`compact_chunks`, not in the paper): every cold insert
//!   rewrites its key's chunk of the cold index at the chunk log's tail, so that log is
//!   compacted into itself the same way (a chunk version still its chunk's newest is
//!   copied to the tail, the rest dropped), keeping it within four times its live size.
//! - **The cold tier's layout** (`ColdLayout`): the above is the log layout; in the runs
//!   layout (the default, `cold_runs.rs`) hot→cold compaction writes the live records it
//!   finds as sorted deltas, and cold→cold compaction is a merge of one partition's runs.
//! - **False absence** (§5.4): a cold read that walked into a region truncated while it
//!   ran may miss the copy made at the tail. Every cold truncation bumps a counter
//!   *before* moving BEGIN; a cold read that found nothing reads it again and, if it
//!   moved, looks again. (The copy was linked before the bump, so a read that began
//!   after it finds the copy; one that began before sees the counter move.)
//!
//! A compaction runs on `compaction_threads` threads (the caller's among them), one
//! compaction at a time per store, each thread holding one page of records. A writer
//! that finds a log past its whole budget compacts before it returns (it is throttled,
//! never failed). A write's `Err` means it did not apply: a throttling compaction runs
//! after the write became visible, so its failure is not the write's; it is logged and
//! counted (`compaction_failures`), the write answers `Ok`, and the next write past the
//! budget (or the compactor) tries again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::cold::ColdLog;
use super::cold_runs::{ColdRuns, MergeOf, partition_bits_for};
use super::epoch::{Epoch, EpochGuard, EpochHandle};
use super::hlog::{Addresses, HlogOptions, LogExtent};
use super::hot::{HotLog, HotRead, Update};
use super::pending::{ReadBatch, pipelined, read_ahead};
use super::record::{DiskRecord, LogValue};
use super::runs::{Gathered, RunRecord};
use crate::error::Result;
use crate::storage::BlockDevice;
use crate::sync::Mutex;

/// How an [`F2`] store is laid out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct F2Options {
    /// Keys the hot index is sized for.
    pub(crate) hot_keys: u64,
    /// Keys the cold index is sized for.
    pub(crate) cold_keys: u64,
    pub(crate) hot_log: HlogOptions,
    pub(crate) cold_log: HlogOptions,
    /// The cold index's chunk store.
    pub(crate) chunk_log: HlogOptions,
    /// Bytes of log (TAIL - BEGIN) the hot log may keep; past `compact_at_percent` of it,
    /// its oldest `compact_percent` is compacted into the cold log.
    pub(crate) hot_log_budget_bytes: u64,
    /// The same for the cold log (compacted into itself).
    pub(crate) cold_log_budget_bytes: u64,
    /// Default 80.
    pub(crate) compact_at_percent: u64,
    /// Default 10.
    pub(crate) compact_percent: u64,
    /// Threads a compaction runs on (the caller's among them), each with one page of
    /// records in memory at a time. Default 2.
    pub(crate) compaction_threads: usize,
    /// Bytes of memory for the read cache, in pages of the hot log's size (at least
    /// three); 0 turns it off.
    pub(crate) read_cache_memory_bytes: u64,
    /// Copy into the read cache only keys read from disk twice lately
    /// ([`super::read_cache::ReadCache::admit`]); F2 copies every one.
    pub(crate) read_cache_admission: bool,
    /// How the cold tier is laid out.
    pub(crate) cold_layout: ColdLayout,
}

/// How a hash store lays out its cold tier: the records that compaction moves out of
/// the hot log ([`HashStoreOptions::cold_layout`](crate::HashStoreOptions::cold_layout)).
///
/// ```
/// use bfdb::{ColdLayout, HashStoreOptions};
///
/// let options = HashStoreOptions::default().cold_layout(ColdLayout::Runs);
/// assert_eq!(options.cold_layout, ColdLayout::Runs);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ColdLayout {
    /// The F2 paper's: a cold log, an index of hash chunks kept in a log of its own on
    /// disk (under a byte of memory per key), and cold-to-cold compaction. A cold read
    /// reads the key's chunk and then walks a chain of records (about 2.5 device reads
    /// measured), and each record compaction moves cold reads and rewrites its chunk.
    /// Stores created before the runs layout keep it.
    Log,
    /// Runs of records sorted by key hash, with each 4 KiB page's first hash kept in
    /// memory (a quarter of a byte per key of 8 + 100 bytes, plus a 10-bit filter per
    /// key not yet merged): a cold read is one device read, compaction writes the
    /// records it moves as one sorted run, and runs are merged sequentially. No chunk
    /// index; the memory the log layout gives the cold and chunk logs goes to the hot
    /// log instead. The default.
    #[default]
    Runs,
}

/// The cold tier of an [`F2`] store, in its layout (one per store: the size of the
/// larger variant does not matter).
#[allow(clippy::large_enum_variant)]
enum Cold {
    Log(ColdLog),
    Runs(ColdRuns),
}

/// Counters of what compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct F2Stats {
    pub(crate) hot_cold_compactions: u64,
    pub(crate) cold_cold_compactions: u64,
    /// Compactions of the cold index's chunk store into itself, and the chunk versions
    /// they copied (still their chunk's newest).
    pub(crate) chunk_compactions: u64,
    pub(crate) chunks_copied: u64,
    /// Records copied by compactions, and records they found no longer live.
    pub(crate) records_copied: u64,
    pub(crate) records_dropped: u64,
    /// Cold reads that looked again after a truncation (false absence avoided).
    pub(crate) cold_reads_repeated: u64,
    /// Hot index entries removed after hot truncations.
    pub(crate) hot_entries_removed: u64,
    /// Writes that found a log past its whole budget and compacted before returning.
    pub(crate) throttled_writes: u64,
    /// Compaction passes that failed (a device error, a damaged record), whether a
    /// throttled writer or the compactor ran them.
    pub(crate) compaction_failures: u64,
    /// Reads (and read-modify-writes) answered by a copy in the read cache.
    pub(crate) read_cache_hits: u64,
    /// Copies of records read from disk linked into the read cache.
    pub(crate) read_cache_inserts: u64,
    /// Copies made but not linked (the key's chain changed meanwhile, or no space).
    pub(crate) read_cache_inserts_abandoned: u64,
    /// Second chances: copies read again in the cache's older half, copied to its tail.
    pub(crate) read_cache_copies_to_tail: u64,
    /// Copies unlinked from the hot index by the eviction of their page.
    pub(crate) read_cache_evictions: u64,
    /// Read-cache pages evicted.
    pub(crate) read_cache_pages_evicted: u64,
    /// Copies marked invalid by a write of their key.
    pub(crate) read_cache_invalidations: u64,
    /// Records read from disk the admission filter did not let into the read cache.
    pub(crate) read_cache_not_admitted: u64,
    pub(crate) read_cache_kept: u64,
    /// Device reads that batched reads ([`F2::get_many`]) made, the times they waited
    /// for the device, and the reads in flight at those waits, summed.
    pub(crate) batched_reads: u64,
    pub(crate) batch_waits: u64,
    pub(crate) batch_in_flight: u64,
    /// Rebuilds of the hot index at its size, which gave back overflow buckets.
    pub(crate) hot_index_rebuilds: u64,
    /// Device reads compactions read ahead in batches, the rounds that issued them,
    /// and the reads compactions made one at a time after them (not foreseen).
    pub(crate) compaction_read_ahead_reads: u64,
    pub(crate) compaction_read_ahead_rounds: u64,
    pub(crate) compaction_single_reads: u64,
    /// Wall time of compaction passes (from when the pass had the store's one
    /// compaction to its truncation), and the bytes of log they passed over.
    pub(crate) compaction_nanos: u64,
    pub(crate) compacted_bytes: u64,
    /// The most bytes of page copies and read-ahead buffers compaction threads held at
    /// once.
    pub(crate) compaction_buffer_peak_bytes: u64,
}

#[derive(Default)]
struct Counters {
    hot_cold_compactions: AtomicU64,
    cold_cold_compactions: AtomicU64,
    chunk_compactions: AtomicU64,
    chunks_copied: AtomicU64,
    records_copied: AtomicU64,
    records_dropped: AtomicU64,
    cold_reads_repeated: AtomicU64,
    hot_entries_removed: AtomicU64,
    throttled_writes: AtomicU64,
    compaction_failures: AtomicU64,
    batched_reads: AtomicU64,
    batch_waits: AtomicU64,
    batch_in_flight: AtomicU64,
    hot_index_rebuilds: AtomicU64,
    compaction_read_ahead_reads: AtomicU64,
    compaction_read_ahead_rounds: AtomicU64,
    compaction_single_reads: AtomicU64,
    compaction_nanos: AtomicU64,
    compacted_bytes: AtomicU64,
    /// Bytes of page copies and read-ahead buffers compaction threads hold now, and
    /// the most they held.
    compaction_buffer_bytes: AtomicU64,
    compaction_buffer_peak_bytes: AtomicU64,
    /// The hot index's overflow buckets after its last rebuild (or at the start).
    overflow_after_rebuild: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Bytes of buffers a compaction thread holds, counted in the compaction's buffer
/// gauge (and its peak) while this lives.
struct Held<'a> {
    counters: &'a Counters,
    bytes: u64,
}

impl<'a> Held<'a> {
    fn new(counters: &'a Counters, bytes: u64) -> Held<'a> {
        let now = counters
            .compaction_buffer_bytes
            .fetch_add(bytes, Ordering::Relaxed)
            + bytes;
        counters
            .compaction_buffer_peak_bytes
            .fetch_max(now, Ordering::Relaxed);
        Held { counters, bytes }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.counters
            .compaction_buffer_bytes
            .fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// The hot and cold logs of one store, on one epoch.
pub(crate) struct F2 {
    epoch: Arc<Epoch>,
    hot: HotLog,
    cold: Cold,
    options: F2Options,
    /// Cold truncations so far (the false-absence check).
    cold_truncations: AtomicU64,
    /// One compaction at a time.
    compacting: Mutex<()>,
    /// Per log (hot, cold, chunks): its size after the last compaction if that freed
    /// nothing, else 0 (see `maybe_compact`).
    futile_at: [AtomicU64; 3],
    counters: Counters,
    /// The records holding a value out of line that the running compaction pass drops:
    /// (key, reference). Reported once the pass has copied what it copies
    /// (`report_unreachable`).
    dropped_references: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Told of each value out of line that a compaction made unreachable: (key,
    /// reference). Unset outside a database (no record holds a reference then).
    on_unreachable: std::sync::OnceLock<Unreachable>,
    /// Whether two records may hold one reference outside a running pass: set for a
    /// store recovered from a checkpoint (its replay may write a record again) and
    /// after a compaction pass failed (it may have copied records it did not
    /// truncate). Until then a dropped record is its reference's only holder.
    shared_references: std::sync::atomic::AtomicBool,
    /// In the runs layout, the live records the running hot→cold pass found, with
    /// their hot-log addresses: written as one delta when the pass has them all.
    pass_records: Mutex<Gathered>,
}

/// What a store does with a value out of line that no record holds any more: the
/// database's value store frees it.
pub(crate) type Unreachable = Box<dyn Fn(&[u8], &[u8]) + Send + Sync>;

/// The devices of an [`F2`] store.
pub(crate) struct F2Devices {
    pub(crate) hot: Arc<dyn BlockDevice>,
    pub(crate) cold: Arc<dyn BlockDevice>,
    pub(crate) chunks: Arc<dyn BlockDevice>,
}

/// What a checkpoint of an [`F2`] store holds: the extent of each of its logs on their
/// devices, and the sizes of the indexes recovery rebuilds from them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct F2Extents {
    pub(crate) hot: LogExtent,
    /// Home buckets of the hot index.
    pub(crate) hot_buckets: u64,
    pub(crate) cold: LogExtent,
    pub(crate) chunks: LogExtent,
    /// Home buckets of the chunk table (the chunk store's index).
    pub(crate) chunk_buckets: u64,
}

impl F2 {
    /// The store a checkpoint captured as `extents` on `devices` (see
    /// [`HotLog::recover`]).
    pub(crate) fn recover(
        options: F2Options,
        devices: F2Devices,
        extents: &F2Extents,
    ) -> Result<F2> {
        let epoch = Arc::new(Epoch::new());
        let buckets = |b: u64| {
            usize::try_from(b).map_err(|_| crate::error::Error::Corrupted {
                page: 0,
                reason: format!("a hash index of {b} buckets"),
            })
        };
        Ok(F2 {
            hot: HotLog::recover(
                buckets(extents.hot_buckets)?,
                options.hot_log,
                devices.hot,
                Arc::clone(&epoch),
                extents.hot,
                options.read_cache_memory_bytes,
                super::hot::Keying::Hashed,
            )?
            .admitting(options.read_cache_admission),
            cold: match options.cold_layout {
                ColdLayout::Log => Cold::Log(ColdLog::recover(
                    options.cold_keys,
                    (options.cold_log, devices.cold, extents.cold),
                    (options.chunk_log, devices.chunks, extents.chunks),
                    buckets(extents.chunk_buckets)?,
                    Arc::clone(&epoch),
                )?),
                ColdLayout::Runs => Cold::Runs(ColdRuns::recover(
                    devices.cold,
                    Arc::clone(&epoch),
                    extents.cold,
                    partition_bits_for(options.cold_keys),
                )?),
            },
            epoch,
            options,
            cold_truncations: AtomicU64::new(0),
            compacting: Mutex::new(()),
            futile_at: Default::default(),
            counters: Counters::default(),
            dropped_references: Mutex::new(Vec::new()),
            on_unreachable: std::sync::OnceLock::new(),
            shared_references: std::sync::atomic::AtomicBool::new(true),
            pass_records: Mutex::new(Gathered::default()),
        })
    }

    /// Captures the store for a checkpoint: every record of each log flushed and synced,
    /// and the extents recovery needs. While it runs no compaction does (so the cold log
    /// and its index, which only compaction writes, stand still, and no log's BEGIN
    /// moves); operations go on, and those that append to the hot log after its flush
    /// are not captured (the write-ahead log replays them).
    pub(crate) fn checkpoint(&self, guard: &mut EpochGuard<'_, '_>) -> Result<F2Extents> {
        let _one = self.one_compaction(guard);
        let (cold, chunks, chunk_buckets) = match &self.cold {
            Cold::Log(cold) => {
                let chunks = cold.index().chunks();
                let cold_tail = cold.log().flush_all(guard)?;
                let chunks_tail = chunks.log().flush_all(guard)?;
                cold.log().sync()?;
                chunks.log().sync()?;
                let extent = |log: &super::hlog::HybridLog, tail| LogExtent {
                    begin: log.addresses().begin,
                    tail,
                };
                (
                    extent(cold.log(), cold_tail),
                    extent(chunks.log(), chunks_tail),
                    chunks.index_buckets(guard) as u64,
                )
            }
            Cold::Runs(runs) => {
                // The directory's end is also the moment `release_dead` compares with:
                // recorded as the chunk log's extent, which this layout has no use for.
                let cold = runs.checkpoint()?;
                let moment = LogExtent {
                    begin: cold.tail,
                    tail: cold.tail,
                };
                (cold, moment, 0)
            }
        };
        let hot_tail = self.hot.log().flush_all(guard)?;
        self.hot.log().sync()?;
        // Every record below the hot tail was linked at an index size no larger than
        // the size once a grow under way has finished (`HotLog::recover`).
        let mut spins = 0;
        while self.hot.index_is_growing() {
            guard.refresh();
            spins += 1;
            crate::sync::backoff_wait(spins);
        }
        Ok(F2Extents {
            hot: LogExtent {
                begin: self.hot.log().addresses().begin,
                tail: hot_tail,
            },
            hot_buckets: self.hot.index_buckets(guard) as u64,
            cold,
            chunks,
            chunk_buckets,
        })
    }

    pub(crate) fn new(options: F2Options, devices: F2Devices) -> Result<F2> {
        let epoch = Arc::new(Epoch::new());
        Ok(F2 {
            hot: HotLog::with_read_cache(
                options.hot_keys,
                options.hot_log,
                devices.hot,
                Arc::clone(&epoch),
                options.read_cache_memory_bytes,
            )?
            .admitting(options.read_cache_admission),
            cold: match options.cold_layout {
                ColdLayout::Log => Cold::Log(ColdLog::new(
                    options.cold_keys,
                    options.cold_log,
                    devices.cold,
                    options.chunk_log,
                    devices.chunks,
                    Arc::clone(&epoch),
                )?),
                ColdLayout::Runs => Cold::Runs(ColdRuns::new(
                    devices.cold,
                    Arc::clone(&epoch),
                    partition_bits_for(options.cold_keys),
                )),
            },
            epoch,
            options,
            cold_truncations: AtomicU64::new(0),
            compacting: Mutex::new(()),
            futile_at: Default::default(),
            counters: Counters::default(),
            dropped_references: Mutex::new(Vec::new()),
            on_unreachable: std::sync::OnceLock::new(),
            shared_references: std::sync::atomic::AtomicBool::new(false),
            pass_records: Mutex::new(Gathered::default()),
        })
    }

    pub(crate) fn epoch(&self) -> &Arc<Epoch> {
        &self.epoch
    }

    pub(crate) fn hot(&self) -> &HotLog {
        &self.hot
    }

    /// The cold log and its index, in the log layout.
    pub(crate) fn cold_log(&self) -> Option<&ColdLog> {
        match &self.cold {
            Cold::Log(cold) => Some(cold),
            Cold::Runs(_) => None,
        }
    }

    /// The cold runs, in the runs layout.
    pub(crate) fn cold_runs(&self) -> Option<&ColdRuns> {
        match &self.cold {
            Cold::Log(_) => None,
            Cold::Runs(runs) => Some(runs),
        }
    }

    /// The cold log, in the log layout (tests of that layout).
    #[cfg(test)]
    pub(crate) fn cold(&self) -> &ColdLog {
        self.cold_log().expect("a store in the cold log layout")
    }

    pub(crate) fn stats(&self) -> F2Stats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rc = self.hot.read_cache_stats().unwrap_or_default();
        F2Stats {
            read_cache_hits: rc.hits,
            read_cache_inserts: rc.inserts,
            read_cache_inserts_abandoned: rc.inserts_abandoned,
            read_cache_copies_to_tail: rc.copies_to_tail,
            read_cache_evictions: rc.evictions,
            read_cache_pages_evicted: rc.pages_evicted,
            read_cache_invalidations: rc.invalidations,
            read_cache_not_admitted: rc.not_admitted,
            read_cache_kept: rc.kept,
            hot_cold_compactions: load(&c.hot_cold_compactions),
            cold_cold_compactions: load(&c.cold_cold_compactions),
            chunk_compactions: load(&c.chunk_compactions),
            chunks_copied: load(&c.chunks_copied),
            records_copied: load(&c.records_copied),
            records_dropped: load(&c.records_dropped),
            cold_reads_repeated: load(&c.cold_reads_repeated),
            hot_entries_removed: load(&c.hot_entries_removed),
            throttled_writes: load(&c.throttled_writes),
            compaction_failures: load(&c.compaction_failures),
            batched_reads: load(&c.batched_reads),
            batch_waits: load(&c.batch_waits),
            batch_in_flight: load(&c.batch_in_flight),
            hot_index_rebuilds: load(&c.hot_index_rebuilds),
            compaction_read_ahead_reads: load(&c.compaction_read_ahead_reads),
            compaction_read_ahead_rounds: load(&c.compaction_read_ahead_rounds),
            compaction_single_reads: load(&c.compaction_single_reads),
            compaction_nanos: load(&c.compaction_nanos),
            compacted_bytes: load(&c.compacted_bytes),
            compaction_buffer_peak_bytes: load(&c.compaction_buffer_peak_bytes),
        }
    }

    /// Sets what the store does with a value out of line that no record holds any more
    /// (once, when its database attaches it).
    pub(crate) fn set_on_unreachable(&self, on_unreachable: Unreachable) {
        let _ = self.on_unreachable.set(on_unreachable);
    }

    /// The value of `key`, if it has one. A value read from disk (the hot log's or the
    /// cold log's) is copied into the read cache. (A value out of line comes back as
    /// its reference: [`F2::read`] tells.)
    pub(crate) fn get(&self, guard: &EpochGuard<'_, '_>, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.read(guard, key)?.map(LogValue::into_bytes))
    }

    /// The value of `key` as its newest record holds it, if it has one: its bytes, or
    /// the reference of a value out of line. A value read from disk (the hot log's or
    /// the cold log's) is copied into the read cache (a reference as a reference).
    pub(crate) fn read(&self, guard: &EpochGuard<'_, '_>, key: &[u8]) -> Result<Option<LogValue>> {
        let ticket = match self.hot.read(guard, key)? {
            HotRead::Found(found) => return Ok(found),
            HotRead::NotFound(ticket) => ticket,
        };
        let found = self.cold_get(guard, key)?;
        if let Some(value) = &found {
            self.hot.cache_older(guard, key, value, ticket);
        }
        Ok(found)
    }

    /// [`F2::get`] of every key of `keys` (see [`F2::read_many`]).
    pub(crate) fn get_many<K: AsRef<[u8]>>(
        &self,
        handle: &mut EpochHandle<'_>,
        keys: &[K],
    ) -> Result<Vec<Option<Vec<u8>>>> {
        Ok(self
            .read_many(handle, keys)?
            .into_iter()
            .map(|v| v.map(LogValue::into_bytes))
            .collect())
    }

    /// [`F2::read`] of every key of `keys` on guards of `handle`'s epoch, with the
    /// device reads of all of them in flight together in this thread's read window
    /// ([`pipelined`]; read where they are, on devices without files).
    pub(crate) fn read_many<K: AsRef<[u8]>>(
        &self,
        handle: &mut EpochHandle<'_>,
        keys: &[K],
    ) -> Result<Vec<Option<LogValue>>> {
        let (answers, done) = pipelined(handle, keys, |g, key| self.read(g, key))?;
        bump(&self.counters.batched_reads, done.reads);
        bump(&self.counters.batch_waits, done.waits);
        bump(&self.counters.batch_in_flight, done.in_flight);
        Ok(answers)
    }

    /// Counts a round of the async form that put `reads` device reads in flight and
    /// waited for them.
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn count_batch_round(&self, reads: usize) {
        bump(&self.counters.batch_waits, 1);
        bump(&self.counters.batched_reads, reads as u64);
        bump(&self.counters.batch_in_flight, reads as u64);
    }

    /// The cold log's answer for `key`, looked up again if a cold truncation ran
    /// meanwhile and it found nothing (the false-absence anomaly).
    fn cold_get(&self, guard: &EpochGuard<'_, '_>, key: &[u8]) -> Result<Option<LogValue>> {
        let cold = match &self.cold {
            Cold::Log(cold) => cold,
            // No false absence to guard against (`cold_runs.rs`).
            Cold::Runs(runs) => return Ok(runs.read(guard, key)?.flatten()),
        };
        loop {
            let truncations = self.cold_truncations.load(Ordering::SeqCst);
            match cold.read(guard, key)? {
                Some(found) => return Ok(found),
                None if self.cold_truncations.load(Ordering::SeqCst) == truncations => {
                    return Ok(None);
                }
                None => bump(&self.counters.cold_reads_repeated, 1),
            }
        }
    }

    /// Sets `key` to `value`, or deletes it for `None`.
    pub(crate) fn upsert(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<()> {
        self.upsert_value(guard, key, value, false, &mut || {})
    }

    /// [`F2::upsert`] of a value out of line (`value` is its reference) if
    /// `out_of_line`; `placed` runs once the record is linked, before `guard` is
    /// refreshed. So a checkpoint that captures the record (its flush waits for every
    /// thread to refresh) comes after `placed` ran.
    pub(crate) fn upsert_value(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
        out_of_line: bool,
        placed: &mut dyn FnMut(),
    ) -> Result<()> {
        self.hot.upsert_value(guard, key, value, out_of_line)?;
        placed();
        // Applied: from here on nothing may fail the write.
        self.throttle(guard);
        Ok(())
    }

    /// Replaces the value of `key` with `update(old)` atomically; returns the new value.
    pub(crate) fn rmw(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        update: &dyn Update,
    ) -> Result<Vec<u8>> {
        let older = |guard: &EpochGuard<'_, '_>| self.cold_get(guard, key);
        let value = self.hot.rmw_with_older(guard, key, update, &older)?;
        // Applied: from here on nothing may fail the write.
        self.throttle(guard);
        Ok(value)
    }

    /// The longest value a record of a key of `key_len` bytes holds in both logs (a
    /// compaction copies hot records to the cold log).
    pub(crate) fn max_inline_value_bytes(&self, key_len: usize) -> usize {
        let page = match &self.cold {
            Cold::Log(cold) => self.hot.log().page_bytes().min(cold.log().page_bytes()),
            // A run unit holds any record a hot page does.
            Cold::Runs(_) => self.hot.log().page_bytes(),
        };
        (page as usize).saturating_sub(super::record::record_size_bytes(key_len, 0))
    }

    /// Bytes of the hot log and of the cold log (TAIL - BEGIN).
    pub(crate) fn log_sizes(&self) -> (u64, u64) {
        let hot = self.hot.log().addresses();
        let cold = match &self.cold {
            Cold::Log(cold) => {
                let a = cold.log().addresses();
                a.tail - a.begin
            }
            Cold::Runs(runs) => runs.size_bytes(),
        };
        (hot.tail - hot.begin, cold)
    }

    /// Compacts each log that is past its budget's threshold (the hot log first, into
    /// the cold log; then the cold log into itself); returns whether any was. The
    /// caller holds nothing from under `guard`.
    pub(crate) fn maybe_compact(&self, guard: &mut EpochGuard<'_, '_>) -> Result<bool> {
        let mut compacted = false;
        if let Cold::Runs(runs) = &self.cold {
            // The runs are merged when their deltas call for it, not by size.
            compacted = self.maybe_compact_tier(guard, Tier::Hot)?;
            if runs.next_merge().is_some() {
                self.compact(guard, Tier::Cold, 0, 0)?;
                compacted = true;
            }
            return Ok(compacted);
        }
        for tier in [Tier::Hot, Tier::Cold, Tier::Chunks] {
            compacted |= self.maybe_compact_tier(guard, tier)?;
        }
        Ok(compacted)
    }

    /// Compacts `tier`'s log if it is past its budget's threshold, unless the last pass
    /// freed nothing and the log has not grown since (below).
    fn maybe_compact_tier(&self, guard: &mut EpochGuard<'_, '_>, tier: Tier) -> Result<bool> {
        let o = &self.options;
        {
            let budget = self.budget_of(tier);
            let a = self.log_of(tier).addresses();
            let size = a.tail - a.begin;
            if size <= budget * o.compact_at_percent / 100 {
                return Ok(false);
            }
            // A log whose live records fill its threshold cannot shrink: after a pass
            // that freed nothing, the next waits until the log has grown by another
            // `compact_percent` of its budget (or shrunk), so that neither the
            // compactor nor throttled writers copy the same records round and round.
            let futile = &self.futile_at[tier as usize];
            let at = futile.load(Ordering::Relaxed);
            if at > 0 && size >= at && size < at + budget * o.compact_percent / 100 {
                return Ok(false);
            }
            let until = a.begin + (budget * o.compact_percent / 100).max(1);
            // Past its whole budget a log holds writers back: its pass reads ahead as
            // far as it can. Between the threshold and the budget the pass is background
            // work, and reads ahead a little only, leaving the disk to the reads of
            // operations.
            let group = match size > budget {
                true => READ_AHEAD_RECORDS,
                false => BACKGROUND_READ_AHEAD_RECORDS,
            };
            self.compact(guard, tier, until, group)?;
            let after = self.log_of(tier).addresses();
            let after = after.tail - after.begin;
            futile.store(if after >= size { after } else { 0 }, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Compacts all of the hot log into the cold log, then all of the cold log into
    /// itself, but for each one's tail page: READ_ONLY is moved to each tail first (as a
    /// checkpoint's flush does), so that nothing below the tail's page is left out as
    /// mutable. For tests that count what compaction leaves.
    pub(crate) fn compact_all(&self, guard: &mut EpochGuard<'_, '_>) -> Result<()> {
        let hot_tail = {
            let _one = self.one_compaction(guard);
            self.hot.log().flush_all(guard)?
        };
        self.compact_hot(guard, hot_tail)?;
        let cold_tail = match &self.cold {
            Cold::Log(cold) => {
                let _one = self.one_compaction(guard);
                cold.log().flush_all(guard)?
            }
            Cold::Runs(runs) => {
                for partition in runs.partitions_with_deltas() {
                    let _one = self.one_compaction(guard);
                    self.merge_runs(guard, runs, partition, MergeOf::All)?;
                }
                return Ok(());
            }
        };
        self.compact_cold(guard, cold_tail)?;
        Ok(())
    }

    /// Gives back the space of cold runs that died before every kept checkpoint
    /// (`floor`: the lowest `chunks.begin` of their records of this store, which the
    /// runs layout sets to the cold tier's tail at the checkpoint). The log layout
    /// gives its space back by truncation alone.
    pub(crate) fn release_cold(&self, floor: u64) {
        if let Cold::Runs(runs) = &self.cold {
            runs.release_dead(floor);
        }
    }

    /// The disk budgets of the hot log, the cold log and the chunk log.
    pub(crate) fn log_budgets(&self) -> [u64; 3] {
        [Tier::Hot, Tier::Cold, Tier::Chunks].map(|t| self.budget_of(t))
    }

    /// The BEGIN of the hot log, the cold log and the chunk log.
    pub(crate) fn log_begins(&self) -> [u64; 3] {
        match &self.cold {
            Cold::Log(_) => {
                [Tier::Hot, Tier::Cold, Tier::Chunks].map(|t| self.log_of(t).addresses().begin)
            }
            Cold::Runs(runs) => [self.hot.log().addresses().begin, runs.lowest(), 0],
        }
    }

    /// The disk budget of `tier`'s log.
    fn budget_of(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Hot => self.options.hot_log_budget_bytes,
            Tier::Cold => self.options.cold_log_budget_bytes,
            Tier::Chunks => match &self.cold {
                Cold::Log(cold) => cold.index().log_budget_bytes(),
                Cold::Runs(_) => 0,
            },
        }
    }

    /// The end of a compaction of `[BEGIN, until)` of a log whose addresses are `a`:
    /// `until` rounded up to a page, but never past SAFE_READ_ONLY's page (records above
    /// may still change in place) and never below BEGIN.
    fn compaction_end(a: Addresses, until: u64, page_bytes: u64) -> u64 {
        let up = until.div_ceil(page_bytes) * page_bytes;
        let safe = a.safe_read_only - a.safe_read_only % page_bytes;
        up.min(safe).max(a.begin)
    }

    /// Hot→cold compaction of the hot log below `until` (rounded up to a page, at most
    /// SAFE_READ_ONLY's page). Returns the new BEGIN.
    pub(crate) fn compact_hot(&self, guard: &mut EpochGuard<'_, '_>, until: u64) -> Result<u64> {
        self.compact(guard, Tier::Hot, until, READ_AHEAD_RECORDS)
    }

    /// Cold→cold compaction of the cold log below `until` (as for `compact_hot`); in the
    /// runs layout, a merge of every run into one (`until` does not matter).
    pub(crate) fn compact_cold(&self, guard: &mut EpochGuard<'_, '_>, until: u64) -> Result<u64> {
        self.compact(guard, Tier::Cold, until, READ_AHEAD_RECORDS)
    }

    /// Compaction of the cold index's chunk store below `until` (as for
    /// `compact_hot`): every cold insert rewrites a chunk at the store's tail, so
    /// without it the chunk log would grow without end. A chunk version still its
    /// chunk's newest is copied to the tail (Conditional-Insert within the store), the
    /// rest is dropped. No cold insert runs meanwhile (they happen only in compactions,
    /// one at a time); a cold read that walked into the truncated part is repeated
    /// through the cold truncation counter, as for a cold-log truncation.
    pub(crate) fn compact_chunks(&self, guard: &mut EpochGuard<'_, '_>, until: u64) -> Result<u64> {
        self.compact(guard, Tier::Chunks, until, READ_AHEAD_RECORDS)
    }

    /// One compaction pass of `tier`'s log below `until`: its live records copied
    /// (`copy_live`, reading ahead for `group` records at a time), then BEGIN moved
    /// past them. Returns the new BEGIN.
    fn compact(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        tier: Tier,
        until: u64,
        group: usize,
    ) -> Result<u64> {
        let _one = self.one_compaction(guard);
        let started = std::time::Instant::now();
        if let (Cold::Runs(runs), Tier::Cold | Tier::Chunks) = (&self.cold, tier) {
            if let Some((partition, of)) = runs.next_merge() {
                self.merge_runs(guard, runs, partition, of)?;
            }
            bump(
                &self.counters.compaction_nanos,
                started.elapsed().as_nanos() as u64,
            );
            return Ok(0);
        }
        let log = self.log_of(tier);
        let a = log.addresses();
        let end = Self::compaction_end(a, until, log.page_bytes());
        self.dropped_references.lock().clear();
        *self.pass_records.lock() = Gathered::default();
        let copied = self
            .copy_live(guard, tier, a.begin, end, group)
            .and_then(|()| match &self.cold {
                Cold::Runs(runs) => self.write_delta(runs),
                Cold::Log(_) => Ok(()),
            });
        if let Err(e) = copied {
            // Records it copied stay at their sources too, until a pass truncates them.
            self.shared_references.store(true, Ordering::SeqCst);
            *self.pass_records.lock() = Gathered::default();
            return Err(e);
        }
        if end <= a.begin {
            return Ok(end);
        }
        // Before the truncation, and under the compaction lock a checkpoint takes too:
        // no checkpoint captures the logs between the two.
        if let Err(e) = self.report_unreachable(guard, tier, a.begin..end) {
            self.shared_references.store(true, Ordering::SeqCst);
            return Err(e);
        }
        bump(&self.counters.compacted_bytes, end - a.begin);
        if !matches!(tier, Tier::Hot) {
            // A cold read may walk into either cold-tier log: the counter moves before
            // BEGIN does (see the module docs).
            self.cold_truncations.fetch_add(1, Ordering::SeqCst);
        }
        log.truncate_before(guard, end);
        match tier {
            Tier::Hot => {
                // Keys whose hot records are all gone lose their hot index entries, so
                // the hot index holds only the hot set (F2 §5.2).
                let removed = self.hot.remove_entries_below(guard, end);
                bump(&self.counters.hot_entries_removed, removed as u64);
                bump(&self.counters.hot_cold_compactions, 1);
                self.maybe_rebuild_hot_index(guard);
            }
            Tier::Cold => bump(&self.counters.cold_cold_compactions, 1),
            Tier::Chunks => bump(&self.counters.chunk_compactions, 1),
        }
        bump(
            &self.counters.compaction_nanos,
            started.elapsed().as_nanos() as u64,
        );
        Ok(end)
    }

    /// In the runs layout, writes the live records the hot→cold pass gathered as one
    /// delta run (each key once: of two records of a key, the newer) and publishes it,
    /// before the pass moves the hot log's BEGIN.
    fn write_delta(&self, runs: &ColdRuns) -> Result<()> {
        let gathered = std::mem::take(&mut *self.pass_records.lock());
        let _held = Held::new(&self.counters, gathered.memory_bytes());
        let written = runs.add_deltas(gathered)?;
        bump(&self.counters.records_copied, written);
        Ok(())
    }

    /// A merge of a partition's cold runs (the runs layout's cold→cold compaction): all
    /// of them into a base, or its deltas into one (`of`). The versions it drops that
    /// hold a value out of line are reported once the new run is in the set, if no
    /// other record holds their value.
    fn merge_runs(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        runs: &ColdRuns,
        partition: usize,
        of: MergeOf,
    ) -> Result<()> {
        self.dropped_references.lock().clear();
        let mut dropped = 0;
        let merged = runs.merge(guard, partition, of, &mut |old: RunRecord| {
            dropped += 1;
            if let Some(value) = old.value
                && value.out_of_line
            {
                self.dropped_references.lock().push((old.key, value.bytes));
            }
        });
        if let Err(e) = merged {
            self.dropped_references.lock().clear();
            return Err(e);
        }
        bump(&self.counters.records_dropped, dropped);
        bump(&self.counters.cold_cold_compactions, 1);
        // The old runs are out of the set: only the hot log and the partition's runs now
        // can hold a reference.
        self.report_unreachable(guard, Tier::Cold, 0..0)
    }

    /// Rebuilds the hot index at its size if its overflow buckets grew by more than a
    /// quarter of its home buckets since its last rebuild. Keys churn through the hot
    /// index (a hot→cold compaction removes the entries of keys that left the hot log):
    /// a chain that once held more than seven keys keeps its overflow bucket after they
    /// leave, so in time most home buckets own one, past the hot index's share of the
    /// memory budget. A rebuild gives back all but those the live entries need, which
    /// the baseline then holds, so the index stays within a quarter of its home buckets
    /// of what its keys need, and a table whose keys do need the buckets is not rebuilt
    /// over and over.
    fn maybe_rebuild_hot_index(&self, guard: &mut EpochGuard<'_, '_>) {
        let c = &self.counters;
        let home = self.hot.index_buckets(guard) as u64;
        let overflow = self.hot.index_overflow_buckets(guard) as u64;
        if overflow <= c.overflow_after_rebuild.load(Ordering::Relaxed) + home / 4 {
            return;
        }
        if self.hot.rebuild_index(guard) {
            bump(&c.hot_index_rebuilds, 1);
            let now = self.hot.index_overflow_buckets(guard) as u64;
            c.overflow_after_rebuild.store(now, Ordering::Relaxed);
        }
    }

    /// Waits for a running compaction to end, refreshing: a protected thread must never
    /// block (the compaction's page opens may wait for its refresh).
    fn one_compaction(&self, guard: &mut EpochGuard<'_, '_>) -> crate::sync::MutexGuard<'_, ()> {
        let mut spins = 0;
        loop {
            if let Some(one) = self.compacting.try_lock() {
                return one;
            }
            guard.refresh();
            spins += 1;
            crate::sync::backoff_wait(spins);
        }
    }

    /// Throttles a writer while a log is past its whole budget: it compacts (or waits
    /// for the running compaction) while that shrinks the logs. It stops once they are
    /// back under their budgets, or once a compaction shrank nothing (what is left is in
    /// the mutable region, or live: a budget below the live data cannot be met, and the
    /// writer is not held forever).
    ///
    /// It runs after the writer's write applied, so it answers nothing: a compaction
    /// that fails is noted ([`F2::note_compaction_failure`]) and the writer goes on.
    /// Returning the error would tell the caller a visible write failed — a batch would
    /// stop half applied, and a logged write's caller would retry or give up on a write
    /// that readers (and a later checkpoint) already hold.
    fn throttle(&self, guard: &mut EpochGuard<'_, '_>) {
        let o = &self.options;
        loop {
            let (hot, cold) = self.log_sizes();
            if hot <= o.hot_log_budget_bytes && cold <= o.cold_log_budget_bytes {
                return;
            }
            bump(&self.counters.throttled_writes, 1);
            if let Err(e) = self.maybe_compact(guard) {
                self.note_compaction_failure("a throttled write's", &e);
                return;
            }
            let (hot_after, cold_after) = self.log_sizes();
            if hot_after + cold_after >= hot + cold {
                return;
            }
        }
    }

    /// Counts and logs a compaction that failed: it is no operation's failure (a
    /// compaction only copies records and truncates what it copied), and the next one
    /// tries again; a log that cannot be compacted grows past its budget meanwhile.
    pub(crate) fn note_compaction_failure(&self, whose: &str, e: &crate::error::Error) {
        bump(&self.counters.compaction_failures, 1);
        log::warn!("bfdb: {whose} compaction of a hash store failed: {e}");
    }

    /// Notes a record the running pass drops (it is not its key's newest): if it holds
    /// a value out of line, the value may be unreachable (`report_unreachable`).
    fn note_dropped(&self, record: &DiskRecord) {
        if record.out_of_line && !record.header.is_tombstone() {
            self.dropped_references
                .lock()
                .push((record.key.clone(), record.value.clone()));
        }
    }

    /// Reports the values out of line of the records this pass drops from `region` of
    /// `tier`'s log (from its BEGIN) that no record outside the region holds: after the
    /// pass's copies, before its truncation. Until two records may share a reference
    /// (`shared_references`) no walk is needed: a dropped record is the only holder.
    ///
    /// Why the last holder reports, and only it: several records may hold one
    /// reference — a compaction's copy and its source (a pass that failed after
    /// copying leaves both, and the next copies again), a record recovery's replay wrote
    /// again. Reporting at each would report one value at passes far apart, and a late
    /// report could free a reused extent of the same reference (the store tells
    /// extents apart by offset, length and checksum, which the same bytes written again
    /// to a reused extent repeat). With the rule, once a pass reports a reference no
    /// record holds it (the pass truncates what it dropped), and no record takes it up
    /// again (writes reference fresh extents; compaction copies only records that hold
    /// it): every report of a value comes from one pass, between two checkpoints.
    fn report_unreachable(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        tier: Tier,
        region: std::ops::Range<u64>,
    ) -> Result<()> {
        let dropped = std::mem::take(&mut *self.dropped_references.lock());
        let Some(on_unreachable) = self.on_unreachable.get() else {
            return Ok(());
        };
        if !self.shared_references.load(Ordering::SeqCst) {
            // Each dropped record is its reference's only holder.
            for (key, reference) in dropped {
                on_unreachable(&key, &reference);
            }
            return Ok(());
        }
        // One walk of each key's chains, whatever the number of its dropped records;
        // every walk before any report, so that a pass that fails here reports nothing
        // (its records stay, and a later pass decides again). A reference that several
        // dropped records hold is reported once.
        let mut by_key: std::collections::HashMap<Vec<u8>, std::collections::HashSet<Vec<u8>>> =
            std::collections::HashMap::new();
        for (key, reference) in dropped {
            by_key.entry(key).or_default().insert(reference);
        }
        let mut unreachable = Vec::new();
        for (key, references) in by_key {
            let held = self.references_held(guard, &key, Some((tier, region.end)))?;
            for reference in references {
                if !held.contains(&reference) {
                    unreachable.push((key.clone(), reference));
                }
            }
            guard.refresh();
        }
        for (key, reference) in unreachable {
            on_unreachable(&key, &reference);
        }
        Ok(())
    }

    /// The references of the values out of line that valid records of `key` in the hot
    /// log and the cold log hold, but for the records below `above` in the log of
    /// `tier` (a region from its BEGIN that a compaction truncates). Both chains are
    /// walked (the compacted one down to `above`), reading from the disk what is
    /// there. Copies in the read cache hold nothing (they copy a record that does).
    fn references_held(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        above: Option<(Tier, u64)>,
    ) -> Result<std::collections::HashSet<Vec<u8>>> {
        let (hot_floor, cold_floor) = match above {
            Some((Tier::Hot, end)) => (end, 0),
            Some((Tier::Cold, end)) => (0, end),
            _ => (0, 0),
        };
        let mut held = std::collections::HashSet::new();
        self.hot.references_held(guard, key, hot_floor, &mut held)?;
        match &self.cold {
            Cold::Log(cold) => cold.references_held(guard, key, cold_floor, &mut held)?,
            Cold::Runs(runs) => runs.references_held(guard, key, &mut held)?,
        }
        Ok(held)
    }

    /// Whether a valid record of `key` in the hot log or the cold log holds the value
    /// out of line `reference`: recovery asks it of the values a checkpoint left
    /// uncertain (see `report_unreachable` for why any record, not only the newest).
    pub(crate) fn holds_reference(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        reference: &[u8],
    ) -> Result<bool> {
        Ok(self.references_held(guard, key, None)?.contains(reference))
    }

    /// Copies the live records of `[begin, end)` of `tier`'s log to the cold log's tail,
    /// a page at a time, on `compaction_threads` threads (the caller's among them): each
    /// takes the next page, reads its records (its one page of buffer) and copies the
    /// live ones. The caller's thread refreshes while it waits for the others, which may
    /// need every protected thread to refresh before their next page opens.
    fn copy_live(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        tier: Tier,
        begin: u64,
        end: u64,
        group: usize,
    ) -> Result<()> {
        if end <= begin {
            return Ok(());
        }
        let log = self.log_of(tier);
        let page_bytes = log.page_bytes();
        let first_page = begin - begin % page_bytes;
        let pages = (end - first_page).div_ceil(page_bytes);
        let next = AtomicU64::new(0);
        let failure: Mutex<Option<crate::error::Error>> = Mutex::new(None);
        let finished = AtomicU64::new(0);
        let work = |guard: &mut EpochGuard<'_, '_>| {
            loop {
                if failure.lock().is_some() {
                    return;
                }
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= pages {
                    return;
                }
                let from = (first_page + i * page_bytes).max(begin);
                let until = (first_page + (i + 1) * page_bytes).min(end);
                if let Err(e) = self.copy_page(guard, tier, from, until, group) {
                    failure.lock().get_or_insert(e);
                    return;
                }
            }
        };
        let helpers = self.options.compaction_threads.max(1) - 1;
        std::thread::scope(|s| {
            for _ in 0..helpers {
                s.spawn(|| {
                    let mut handle = self.epoch.register();
                    let mut guard = handle.protect();
                    work(&mut guard);
                    finished.fetch_add(1, Ordering::SeqCst);
                });
            }
            work(guard);
            let mut spins = 0;
            while finished.load(Ordering::SeqCst) < helpers as u64 {
                guard.refresh();
                spins += 1;
                crate::sync::backoff_wait(spins);
            }
        });
        match failure.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The log `tier` compacts: in the runs layout, only the hot log has one.
    fn log_of(&self, tier: Tier) -> &super::hlog::HybridLog {
        match (tier, &self.cold) {
            (Tier::Hot, _) => self.hot.log(),
            (Tier::Cold, Cold::Log(cold)) => cold.log(),
            (Tier::Chunks, Cold::Log(cold)) => cold.index().chunks().log(),
            (_, Cold::Runs(_)) => unreachable!("the runs layout has no cold logs"),
        }
    }

    /// Copies the live records of `[from, until)` (within one page) of `tier`'s log:
    /// chunk versions one at a time, records of the hot and cold logs in groups of
    /// `group` (`copy_records`).
    fn copy_page(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        tier: Tier,
        from: u64,
        until: u64,
        group_records: usize,
    ) -> Result<()> {
        let log = self.log_of(tier);
        let mut group = Vec::with_capacity(group_records);
        let records = log.records_in(guard, from, until)?;
        let _page = Held::new(&self.counters, log.page_bytes());
        for item in records {
            let (address, record) = item?;
            if record.header.is_invalid() {
                continue;
            }
            if !matches!(tier, Tier::Chunks) {
                group.push((address, record));
                if group.len() >= group_records {
                    self.copy_records(guard, tier, &mut group)?;
                }
                continue;
            }
            let value = (!record.header.is_tombstone()).then_some(record.value.as_slice());
            debug_assert!(!record.out_of_line, "a chunk is never out of line");
            let Cold::Log(cold) = &self.cold else {
                unreachable!("the runs layout has no chunk log");
            };
            if cold
                .index()
                .copy_if_newest(guard, &record.key, value, address)?
            {
                bump(&self.counters.chunks_copied, 1);
            }
            guard.refresh();
        }
        self.copy_records(guard, tier, &mut group)
    }

    /// Copies the records of `group` (from the hot or the cold log, with their
    /// addresses) that are live to the cold log's tail, and empties it.
    ///
    /// Each copy reads its key's cold-index chunk (and a cold→cold copy the key's cold
    /// chain), nearly always from disk: one at a time, those reads made compaction (and
    /// a load, which is mostly compaction) wait for the disk once per record. So the
    /// group's reads are read ahead as one io_uring batch per round
    /// ([`read_ahead`]), and the copies then take them from there.
    fn copy_records(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        tier: Tier,
        group: &mut Vec<(u64, DiskRecord)>,
    ) -> Result<()> {
        if matches!(tier, Tier::Hot) {
            // Live if it is its key's newest hot record (a lookup in memory, mostly); a
            // newer one arriving after this check makes the copy superfluous, not
            // wrong: reads find the newer one first.
            let mut dropped = 0;
            let mut failure = None;
            group.retain(|(address, record)| {
                if failure.is_some() {
                    // The pass fails: no more lookups.
                    return true;
                }
                match self.hot.is_newest(guard, &record.key, *address) {
                    Ok(live) => {
                        dropped += u64::from(!live);
                        if !live {
                            self.note_dropped(record);
                        }
                        live
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                        true
                    }
                }
            });
            bump(&self.counters.records_dropped, dropped);
            if let Some(e) = failure {
                return Err(e);
            }
        }
        if group.is_empty() {
            return Ok(());
        }
        let cold = match &self.cold {
            Cold::Log(cold) => cold,
            Cold::Runs(_) => {
                // Gathered for the pass's delta: no device read.
                let mut pass = self.pass_records.lock();
                for (address, record) in group.drain(..) {
                    let hash = super::hot::hash_key(&record.key).0;
                    pass.push(hash, &record.key, record.log_value().as_ref(), address);
                }
                return Ok(());
            }
        };
        let batch = ReadBatch::default();
        let conditional = matches!(tier, Tier::Cold);
        let ahead = read_ahead(guard, &batch, group.len(), |g, i| {
            cold.look_ahead(g, &group[i].1.key, conditional)
        });
        let c = &self.counters;
        bump(&c.compaction_read_ahead_reads, ahead.reads);
        bump(&c.compaction_read_ahead_rounds, ahead.rounds);
        let _reads = Held::new(c, batch.bytes_held());
        let mut batched = guard.batched(&batch);
        for (address, record) in group.drain(..) {
            let value = record.log_value();
            let copied = if conditional {
                cold.insert_if_newest(&mut batched, &record.key, value.as_ref(), address)?
                    .is_some()
            } else {
                cold.insert_value(&mut batched, &record.key, value.as_ref())?;
                true
            };
            if !copied {
                self.note_dropped(&record);
            }
            let counter = match copied {
                true => &self.counters.records_copied,
                false => &self.counters.records_dropped,
            };
            bump(counter, 1);
            batched.refresh();
        }
        drop(batched);
        bump(&c.compaction_single_reads, batch.misses());
        Ok(())
    }
}

/// Records of the hot or cold log a compaction thread copies together: their chunk
/// (and chain) reads go to the disk as one batch. Each read keeps a sector or so, so a
/// thread holds at most about this many times 512 bytes of them besides its page.
const READ_AHEAD_RECORDS: usize = 128;

/// The same for a background pass (its log between its threshold and its whole
/// budget): a few reads in flight per thread, so that the operations' reads are not
/// queued behind hundreds of compaction reads.
const BACKGROUND_READ_AHEAD_RECORDS: usize = 8;

/// Which log a compaction reads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Tier {
    Hot = 0,
    Cold = 1,
    /// The cold index's chunk store.
    Chunks = 2,
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::hash::test_support::{Rng, count, counter, expected_count};
    use crate::storage::{MemBlocks, Retaining};

    fn pages(frames: u64) -> HlogOptions {
        HlogOptions {
            page_bits: 12,
            frames,
            mutable_pages: frames - 2,
        }
    }

    std::thread_local! {
        /// The cold layout of the stores this thread's tests make (`tiny_options`).
        static LAYOUT: std::cell::Cell<ColdLayout> = const { std::cell::Cell::new(ColdLayout::Log) };
    }

    /// Runs `test` with its stores in the runs layout.
    fn in_runs_layout<T>(test: impl FnOnce() -> T) -> T {
        LAYOUT.set(ColdLayout::Runs);
        let answer = test();
        LAYOUT.set(ColdLayout::Log);
        answer
    }

    /// A store whose logs keep a few pages each, and a read cache of four: compaction
    /// and eviction run all the time.
    fn tiny() -> F2 {
        tiny_with(64 * 4096, 4 * 4096)
    }

    fn tiny_with(cold_log_budget_bytes: u64, read_cache_memory_bytes: u64) -> F2 {
        tiny_admitting(cold_log_budget_bytes, read_cache_memory_bytes, false)
    }

    /// [`tiny_with`], with the read cache's admission filter on if `admission`.
    fn tiny_admitting(
        cold_log_budget_bytes: u64,
        read_cache_memory_bytes: u64,
        admission: bool,
    ) -> F2 {
        on_memory(tiny_options(
            cold_log_budget_bytes,
            read_cache_memory_bytes,
            admission,
        ))
    }

    fn tiny_options(
        cold_log_budget_bytes: u64,
        read_cache_memory_bytes: u64,
        admission: bool,
    ) -> F2Options {
        F2Options {
            hot_keys: 512,
            // In the runs layout the expected keys set the partitions only: sixteen here.
            cold_keys: match LAYOUT.get() {
                ColdLayout::Log => 4096,
                ColdLayout::Runs => 16 << 18,
            },
            hot_log: pages(4),
            cold_log: pages(3),
            chunk_log: pages(3),
            cold_layout: LAYOUT.get(),
            hot_log_budget_bytes: 16 * 4096,
            cold_log_budget_bytes,
            compact_at_percent: 80,
            compact_percent: 10,
            compaction_threads: 2,
            read_cache_memory_bytes,
            read_cache_admission: admission,
        }
    }

    /// A store laid out as `options` on devices in memory.
    fn on_memory(options: F2Options) -> F2 {
        let devices = F2Devices {
            hot: Arc::new(MemBlocks::new()),
            cold: Arc::new(MemBlocks::new()),
            chunks: Arc::new(MemBlocks::new()),
        };
        F2::new(options, devices).unwrap()
    }

    fn key(i: u64) -> Vec<u8> {
        format!("key{i}").into_bytes()
    }

    /// Compacts both logs a page at a time, as far as each allows, until `done`.
    fn compact_until(store: &F2, done: &std::sync::atomic::AtomicBool) {
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            let hot = store.hot().log().addresses().begin;
            store.compact_hot(&mut guard, hot + 4096).unwrap();
            if let Some(cold) = store.cold_log() {
                let begin = cold.log().addresses().begin;
                store.compact_cold(&mut guard, begin + 4096).unwrap();
                let chunks = cold.index().chunks().log().addresses().begin;
                store.compact_chunks(&mut guard, chunks + 4096).unwrap();
            } else if store.cold_runs().is_some_and(|r| r.next_merge().is_some()) {
                store.compact_cold(&mut guard, 0).unwrap();
            }
            guard.refresh();
            std::thread::yield_now();
        }
    }

    /// Checks every key's count against the threads' tallies.
    fn check_counts(store: &F2, expected: &[HashMap<u64, u64>], keys: u64, round: u64) {
        let mut handle = store.epoch().register();
        let guard = handle.protect();
        for k in 0..keys {
            assert_eq!(
                count(store.get(&guard, &key(k)).unwrap()),
                expected_count(expected, k),
                "round {round}, key {k}"
            );
        }
    }

    /// A store whose devices survive it, so that it can be recovered from them.
    struct Durable {
        devices: [Arc<MemBlocks>; 3],
        floors: [Arc<Retaining>; 3],
    }

    impl Durable {
        fn new() -> Durable {
            let devices = [(); 3].map(|()| Arc::new(MemBlocks::new()));
            Durable {
                floors: devices
                    .clone()
                    .map(|d| Arc::new(Retaining::new(d as Arc<dyn BlockDevice>, 0))),
                devices,
            }
        }

        fn options() -> F2Options {
            let mut options = tiny().options;
            options.hot_log_budget_bytes = 24 * 4096;
            options.cold_log_budget_bytes = 24 * 4096;
            options
        }

        fn devices(&self) -> F2Devices {
            let [hot, cold, chunks] = self.floors.clone().map(|f| f as Arc<dyn BlockDevice>);
            F2Devices { hot, cold, chunks }
        }

        /// The devices again, with the floors of `extents` (a restart).
        fn reopen(&mut self, extents: &F2Extents) {
            let floors = [extents.hot.begin, extents.cold.begin, extents.chunks.begin];
            self.floors = std::array::from_fn(|i| {
                Arc::new(Retaining::new(
                    Arc::clone(&self.devices[i]) as Arc<dyn BlockDevice>,
                    floors[i],
                ))
            });
        }
    }

    #[test]
    fn a_checkpoint_recovers_what_it_captured_while_compactions_go_on() {
        checkpoint_recovers_what_it_captured();
    }

    #[test]
    fn a_checkpoint_of_cold_runs_recovers_what_it_captured_while_compactions_go_on() {
        in_runs_layout(checkpoint_recovers_what_it_captured);
    }

    fn checkpoint_recovers_what_it_captured() {
        let mut disk = Durable::new();
        let mut store = F2::new(Durable::options(), disk.devices()).unwrap();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rng = Rng(5);
        let keys = 1_500;
        let (mut recoveries, mut cold_cold, mut chunk) = (0, 0, 0);
        for round in 0..6u64 {
            let (extents, captured, stats) = {
                let mut handle = store.epoch().register();
                let mut guard = handle.protect();
                let mut write = |guard: &mut EpochGuard<'_, '_>,
                                 model: &mut HashMap<Vec<u8>, Vec<u8>>,
                                 n: u64| {
                    for step in 0..n {
                        let k = key(rng.skewed(keys));
                        if step % 13 == 0 {
                            store.upsert(guard, &k, None).unwrap();
                            model.remove(&k);
                        } else {
                            let v = format!("{round}-{step}-{}", rng.below(1 << 20)).into_bytes();
                            store.upsert(guard, &k, Some(&v)).unwrap();
                            model.insert(k, v);
                        }
                        if step % 64 == 0 {
                            store.maybe_compact(guard).unwrap();
                        }
                    }
                };
                write(&mut guard, &mut model, 6_000);
                let extents = store.checkpoint(&mut guard).unwrap();
                let captured = model.clone();
                // Writes after the checkpoint (and the compactions they cause) must not
                // disturb what it captured.
                write(&mut guard, &mut model, 6_000);
                (extents, captured, store.stats())
            };
            assert!(stats.hot_cold_compactions > 0, "{stats:?}");
            cold_cold += stats.cold_cold_compactions;
            chunk += stats.chunk_compactions;
            drop(store);
            disk.reopen(&extents);
            store = F2::recover(Durable::options(), disk.devices(), &extents).unwrap();
            recoveries += 1;
            model = captured;
            let mut handle = store.epoch().register();
            let guard = handle.protect();
            for i in 0..keys {
                let k = key(i);
                assert_eq!(
                    store.get(&guard, &k).unwrap(),
                    model.get(&k).cloned(),
                    "round {round}: key {i}"
                );
            }
        }
        assert_eq!(recoveries, 6);
        assert!(cold_cold > 0);
        if store.cold_log().is_some() {
            assert!(chunk > 0, "the chunk log never compacted");
        }
    }

    /// Small deltas over large bases (a hundred keys written again at a time over 8,000
    /// merged cold, 40 pages a partition): a partition's deltas are merged into one delta at eight, and into its base
    /// only once they hold a quarter of it. Every key reads as a map says throughout, and
    /// no partition holds more than eight deltas and its base.
    #[test]
    fn small_deltas_are_merged_into_one_before_their_base_is_rewritten() {
        in_runs_layout(|| {
            let store = tiny_with(64 << 20, 0);
            // 300-byte values: a partition's base spans about 40 pages.
            let value = |round: u64, i: u64| {
                let mut v = format!("round {round} of {i} ").into_bytes();
                v.resize(300, b'.');
                v
            };
            let mut handle = store.epoch().register();
            let mut guard = handle.protect();
            let mut model = HashMap::new();
            for i in 0..8_000u64 {
                let v = value(0, i);
                store.upsert(&mut guard, &key(i), Some(&v)).unwrap();
                model.insert(key(i), v);
            }
            store.compact_all(&mut guard).unwrap();
            let runs = store.cold_runs().unwrap();
            let bases = runs.stats().merges;
            let mut rng = Rng(7);
            for round in 0..60u64 {
                for _ in 0..100 {
                    let i = rng.below(8_000);
                    if rng.below(10) == 0 {
                        // A tombstone: a merge of deltas keeps it over the base's record.
                        store.upsert(&mut guard, &key(i), None).unwrap();
                        model.remove(&key(i));
                        continue;
                    }
                    let v = value(round + 1, i);
                    store.upsert(&mut guard, &key(i), Some(&v)).unwrap();
                    model.insert(key(i), v);
                }
                let hot_tail = {
                    let _one = store.one_compaction(&mut guard);
                    store.hot().log().flush_all(&mut guard).unwrap()
                };
                store.compact_hot(&mut guard, hot_tail).unwrap();
                while let Some((partition, of)) = runs.next_merge() {
                    let _one = store.one_compaction(&mut guard);
                    store.merge_runs(&mut guard, runs, partition, of).unwrap();
                }
                assert!(runs.stats().runs <= 16 * 9, "{:?}", runs.stats());
                for i in (round % 7..8_000).step_by(7) {
                    assert_eq!(
                        store.get(&guard, &key(i)).unwrap().as_ref(),
                        model.get(&key(i))
                    );
                }
                guard.refresh();
            }
            for i in 0..8_000 {
                assert_eq!(
                    store.get(&guard, &key(i)).unwrap().as_ref(),
                    model.get(&key(i))
                );
            }
            let r = runs.stats();
            assert!(r.delta_merges > 16, "{r:?}");
            // Base merges too, but fewer than the deltas' merges into one.
            assert!(r.merges - bases > r.delta_merges, "{r:?}");
            assert!(r.merges - bases - r.delta_merges < r.delta_merges, "{r:?}");
        })
    }

    /// The runs a merge replaced are discarded once no kept checkpoint names them, and
    /// only then: with the database's rule (the two newest checkpoints kept, each
    /// retire giving the floors of those two), a recovery from the older kept one finds
    /// every run its directory names whole, after merges discarded many others.
    #[test]
    fn dead_cold_runs_are_discarded_only_once_no_kept_checkpoint_names_them() {
        in_runs_layout(|| {
            let mut disk = Durable::new();
            let store = F2::new(Durable::options(), disk.devices()).unwrap();
            let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            // The kept checkpoints, with what each captured.
            type Captured = HashMap<Vec<u8>, Vec<u8>>;
            let mut kept: Vec<(F2Extents, Captured)> = Vec::new();
            let mut rng = Rng(31);
            for round in 0..8u64 {
                let mut handle = store.epoch().register();
                let mut guard = handle.protect();
                for step in 0..4_000u64 {
                    let k = key(rng.skewed(1_500));
                    // After the first round one partition's keys are left alone, so its
                    // base stays low on the device and the runs that die above it are
                    // given back by discarding, not by truncation.
                    if round > 0 && super::super::hot::hash_key(&k).0 >> 60 == 0 {
                        continue;
                    }
                    let v = format!("{round}-{step}").into_bytes();
                    store.upsert(&mut guard, &k, Some(&v)).unwrap();
                    model.insert(k, v);
                    store.maybe_compact(&mut guard).unwrap();
                }
                let extents = store.checkpoint(&mut guard).unwrap();
                kept.push((extents, model.clone()));
                if kept.len() > 2 {
                    kept.remove(0);
                }
                let recorded: Vec<&F2Extents> = kept.iter().map(|(e, _)| e).collect();
                let floors = crate::hash::checkpoint::floors(&recorded);
                for (device, floor) in disk.floors.iter().zip(floors) {
                    device.retain_from(floor).unwrap();
                }
                store.release_cold(floors[2]);
                guard.refresh();
            }
            let runs = store.cold_runs().unwrap().stats();
            assert!(runs.merges > 10 && runs.discarded_bytes > 0, "{runs:?}");
            drop(store);
            let (extents, captured) = &kept[0];
            disk.reopen(extents);
            let store = F2::recover(Durable::options(), disk.devices(), extents).unwrap();
            let mut handle = store.epoch().register();
            let guard = handle.protect();
            for i in 0..1_500 {
                let k = key(i);
                assert_eq!(
                    store.get(&guard, &k).unwrap(),
                    captured.get(&k).cloned(),
                    "key {i}"
                );
            }
        });
    }

    #[test]
    fn random_operations_match_a_hash_map_through_both_compactions() {
        random_operations_match_a_hash_map();
    }

    #[test]
    fn random_operations_match_a_hash_map_through_deltas_and_merges_of_cold_runs() {
        in_runs_layout(random_operations_match_a_hash_map);
    }

    fn random_operations_match_a_hash_map() {
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rng = Rng(11);
        let keys = 2_000;
        let grow = |old: Option<&[u8]>| {
            let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
            v.push(v.len() as u8);
            v.truncate(120);
            v
        };
        for step in 0..40_000u64 {
            let k = key(rng.skewed(keys));
            match rng.below(10) {
                0..=3 => {
                    let got = store.get(&guard, &k).unwrap();
                    assert_eq!(got.as_ref(), model.get(&k), "step {step}: get {k:?}");
                }
                4..=6 => {
                    let len = if rng.below(2) == 0 {
                        24
                    } else {
                        rng.below(100) as usize
                    };
                    let v: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    store.upsert(&mut guard, &k, Some(&v)).unwrap();
                    model.insert(k, v);
                }
                7..=8 => {
                    let want = grow(model.get(&k).map(Vec::as_slice));
                    assert_eq!(
                        store.rmw(&mut guard, &k, &grow).unwrap(),
                        want,
                        "step {step}"
                    );
                    model.insert(k, want);
                }
                _ => {
                    store.upsert(&mut guard, &k, None).unwrap();
                    model.remove(&k);
                }
            }
            store.maybe_compact(&mut guard).unwrap();
            guard.refresh();
        }
        for i in 0..keys {
            let k = key(i);
            assert_eq!(
                store.get(&guard, &k).unwrap().as_ref(),
                model.get(&k),
                "{k:?}"
            );
        }
        let stats = store.stats();
        assert!(stats.hot_cold_compactions > 10, "{stats:?}");
        assert!(stats.cold_cold_compactions > 3, "{stats:?}");
        assert!(
            stats.records_copied > 0 && stats.records_dropped > 0,
            "{stats:?}"
        );
        assert!(store.hot().stats().disk_reads > 0);
        if let Some(runs) = store.cold_runs() {
            let r = runs.stats();
            assert!(
                r.deltas_added > 10 && r.merges > 3 && r.unit_reads > 0,
                "{r:?}"
            );
            // Sixteen partitions, each a base and its deltas (merged at eight).
            assert!(r.runs <= 16 * 9, "{r:?}");
            return;
        }
        // Every cold insert rewrote a chunk; the chunk log stays within its budget
        // (plus the pass that runs past its threshold) by compacting into itself.
        assert!(stats.chunk_compactions > 3, "{stats:?}");
        assert!(stats.chunks_copied > 0, "{stats:?}");
        let chunks = store.cold().index().chunks().log().addresses();
        let budget = store.cold().index().log_budget_bytes();
        assert!(
            chunks.tail - chunks.begin <= budget + 4 * 4096,
            "chunk log of {} bytes, budget {budget}",
            chunks.tail - chunks.begin
        );
    }

    #[test]
    fn random_reads_and_writes_match_a_hash_map_through_a_tiny_read_cache() {
        reads_and_writes_through_a_tiny_read_cache(false);
    }

    #[test]
    fn random_reads_and_writes_match_a_hash_map_through_a_read_cache_that_admits_second_reads() {
        reads_and_writes_through_a_tiny_read_cache(true);
    }

    fn reads_and_writes_through_a_tiny_read_cache(admission: bool) {
        // Mostly reads, on skewed keys: the keys read often but written rarely end up on
        // disk (hot or cold) and are cached (with `admission`, once read from disk a
        // second time); the pages of copies fill and evict all the time, re-read copies
        // get second chances, and writes replace copies. Every read is checked against
        // the model.
        let seed = 23;
        println!("seed {seed}");
        let store = tiny_admitting(64 * 4096, 4 * 4096, admission);
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rng = Rng(seed);
        let keys = 2_000;
        let grow = |old: Option<&[u8]>| {
            let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
            v.push(v.len() as u8);
            v.truncate(60);
            v
        };
        for step in 0..60_000u64 {
            let k = key(rng.skewed(keys));
            match rng.below(20) {
                0..=12 => {
                    let got = store.get(&guard, &k).unwrap();
                    assert_eq!(got.as_ref(), model.get(&k), "step {step}: get {k:?}");
                }
                13..=15 => {
                    let len = 8 + rng.below(40) as usize;
                    let v: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    store.upsert(&mut guard, &k, Some(&v)).unwrap();
                    model.insert(k, v);
                }
                16..=18 => {
                    let want = grow(model.get(&k).map(Vec::as_slice));
                    assert_eq!(
                        store.rmw(&mut guard, &k, &grow).unwrap(),
                        want,
                        "step {step}: rmw {k:?}"
                    );
                    model.insert(k, want);
                }
                _ => {
                    store.upsert(&mut guard, &k, None).unwrap();
                    model.remove(&k);
                }
            }
            store.maybe_compact(&mut guard).unwrap();
            guard.refresh();
        }
        for i in 0..keys {
            let k = key(i);
            assert_eq!(
                store.get(&guard, &k).unwrap().as_ref(),
                model.get(&k),
                "{k:?}"
            );
        }
        let stats = store.stats();
        println!("{stats:?}");
        assert!(
            stats.read_cache_hits > 1_000
                && stats.read_cache_inserts > 1_000
                && stats.read_cache_evictions > if admission { 50 } else { 500 }
                && stats.read_cache_pages_evicted > 10
                && stats.read_cache_copies_to_tail > 10
                && stats.read_cache_invalidations > 10,
            "{stats:?}"
        );
        assert!(
            stats.hot_cold_compactions > 5 && stats.cold_cold_compactions > 0,
            "{stats:?}"
        );
        assert_eq!(stats.read_cache_not_admitted > 0, admission, "{stats:?}");
    }

    #[test]
    fn writers_past_the_budget_are_throttled_by_compacting_not_failed() {
        // Nobody compacts but the writers themselves: once a log passes its whole budget,
        // each write compacts before it returns, and the logs stay within their budgets.
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let budget = 16 * 4096;
        for i in 0..6_000u64 {
            store
                .upsert(&mut guard, &key(i % 1_500), Some(&i.to_le_bytes()))
                .unwrap();
            let a = store.hot().log().addresses();
            assert!(
                a.tail - a.begin <= budget + 4096,
                "write {i}: the hot log holds {a:?}"
            );
            guard.refresh();
        }
        let stats = store.stats();
        assert!(
            stats.throttled_writes > 0 && stats.hot_cold_compactions > 0,
            "{stats:?}"
        );
        for i in (0..1_500u64).step_by(11) {
            let newest = (0..6_000u64).filter(|j| j % 1_500 == i).max().unwrap();
            assert_eq!(
                store.get(&guard, &key(i)).unwrap(),
                Some(newest.to_le_bytes().to_vec())
            );
        }
    }

    /// Runs random writes of values out of line (unique 16-byte references standing for
    /// the value store's), inline values, deletes and read-modify-writes through both
    /// compactions, some of them failed by device reads that fail, and (if
    /// `duplicates`) writes of a key's reference again, as recovery's replay makes them;
    /// checks every reference compaction reports: never one that a record of its key
    /// still holds, never one twice, and once everything is compacted, every reference
    /// no record holds.
    fn references_are_reported_once_when_their_last_record_goes(duplicates: bool) {
        let devices = [(); 3].map(|()| Arc::new(MemBlocks::new()));
        let store = F2::new(
            tiny_options(64 * 4096, 4 * 4096, false),
            F2Devices {
                hot: devices[0].clone(),
                cold: devices[1].clone(),
                chunks: devices[2].clone(),
            },
        )
        .unwrap();
        if duplicates {
            // As for a store recovered from a checkpoint.
            store.shared_references.store(true, Ordering::SeqCst);
        }
        // (key, reference) as the store heard them.
        type Reports = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>)>>>;
        let reported: Reports = Arc::default();
        let sink = Arc::clone(&reported);
        store.set_on_unreachable(Box::new(move |key, reference| {
            sink.lock().push((key.to_vec(), reference.to_vec()));
        }));
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let mut rng = Rng(if duplicates { 29 } else { 23 });
        // The model: each key's value (`true`: out of line) and every reference written.
        let mut model: HashMap<Vec<u8>, (Vec<u8>, bool)> = HashMap::new();
        let mut written: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut seen: std::collections::HashSet<Vec<u8>> = Default::default();
        let mut next_ref = 0u64;
        let mut failed_passes = 0;
        let check_reports =
            |guard: &EpochGuard<'_, '_>,
             model: &HashMap<Vec<u8>, (Vec<u8>, bool)>,
             seen: &mut std::collections::HashSet<Vec<u8>>| {
                for (key, reference) in reported.lock().drain(..) {
                    assert!(
                        seen.insert(reference.clone()),
                        "{reference:?} reported twice"
                    );
                    assert!(
                        model.get(&key) != Some(&(reference.clone(), true)),
                        "{key:?}'s current value reported"
                    );
                    let held = store.references_held(guard, &key, None).unwrap();
                    assert!(
                        !held.contains(&reference),
                        "a record of {key:?} holds {reference:?}"
                    );
                }
            };
        for step in 0..12_000u64 {
            let k = key(rng.skewed(300));
            match rng.below(20) {
                0..=9 => {
                    next_ref += 1;
                    let r = [next_ref.to_le_bytes(), (!next_ref).to_le_bytes()].concat();
                    store
                        .upsert_value(&mut guard, &k, Some(&r), true, &mut || {})
                        .unwrap();
                    written.insert(r.clone(), k.clone());
                    model.insert(k, (r, true));
                }
                10..=12 => {
                    let v = vec![rng.below(256) as u8; 16];
                    store.upsert(&mut guard, &k, Some(&v)).unwrap();
                    model.insert(k, (v, false));
                }
                13..=14 => {
                    store.upsert(&mut guard, &k, None).unwrap();
                    model.remove(&k);
                }
                15..=16 => {
                    // An update never sees a reference: it writes nothing over one.
                    let bump = |old: Option<&[u8]>| {
                        let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
                        v.truncate(15);
                        v.push(7);
                        v
                    };
                    let got = store.rmw(&mut guard, &k, &bump).unwrap();
                    match model.get(&k) {
                        Some((_, true)) => assert!(got.is_empty(), "step {step}"),
                        old => {
                            let new = bump(old.map(|(v, _)| &v[..]));
                            assert_eq!(got, new, "step {step}");
                            model.insert(k, (new, false));
                        }
                    }
                }
                17 if duplicates => {
                    if let Some((r, true)) = model.get(&k).cloned() {
                        store
                            .upsert_value(&mut guard, &k, Some(&r), true, &mut || {})
                            .unwrap();
                    }
                }
                _ => {
                    // A compaction pass whose reads fail after a while: it may have
                    // copied records it does not truncate.
                    devices[1 + (step % 2) as usize].fail_reads(u64::MAX);
                    let a = store.hot().log().addresses();
                    failed_passes +=
                        u64::from(store.compact_hot(&mut guard, a.begin + 4 * 4096).is_err());
                    devices.iter().for_each(|d| d.fail_reads(0));
                }
            }
            if let Err(e) = store.maybe_compact(&mut guard) {
                panic!("step {step}: {e}");
            }
            guard.refresh();
            check_reports(&guard, &model, &mut seen);
        }
        // Filler of its own keys moves the tails on; then everything else is compacted.
        for round in 0..2 {
            for i in 0..2_000u64 {
                let filler = format!("filler{round}-{i}").into_bytes();
                store.upsert(&mut guard, &filler, Some(&[1; 24])).unwrap();
            }
            store.compact_all(&mut guard).unwrap();
            guard.refresh();
            check_reports(&guard, &model, &mut seen);
        }
        for (r, k) in &written {
            let current = model.get(k) == Some(&(r.clone(), true));
            assert_eq!(
                seen.contains(r),
                !current,
                "{r:?} of {k:?}, current: {current}"
            );
        }
        assert!(
            store.stats().cold_cold_compactions > 3,
            "{:?}",
            store.stats()
        );
        assert!(failed_passes > 0 || !duplicates, "no pass failed");
        assert!(store.shared_references.load(Ordering::SeqCst) || failed_passes == 0);
    }

    #[test]
    fn references_are_reported_once_when_their_last_record_goes_in_a_fresh_store() {
        references_are_reported_once_when_their_last_record_goes(false);
    }

    #[test]
    fn references_are_reported_once_when_their_last_record_goes_with_records_sharing_them() {
        references_are_reported_once_when_their_last_record_goes(true);
    }

    #[test]
    fn references_in_cold_runs_are_reported_once_when_their_last_record_goes() {
        in_runs_layout(|| references_are_reported_once_when_their_last_record_goes(false));
    }

    #[test]
    fn references_in_cold_runs_are_reported_once_with_records_sharing_them() {
        in_runs_layout(|| references_are_reported_once_when_their_last_record_goes(true));
    }

    #[test]
    fn a_write_that_fails_did_not_apply_even_when_its_throttling_compaction_fails() {
        // A writer past the budget compacts; make every device read fail meanwhile, so
        // that compaction fails. Each write (of a key never written before) must then
        // either fail and leave nothing behind, or succeed: never fail after its record
        // became visible.
        let devices = [(); 3].map(|()| Arc::new(MemBlocks::new()));
        let store = F2::new(
            tiny_options(64 * 4096, 0, false),
            F2Devices {
                hot: devices[0].clone(),
                cold: devices[1].clone(),
                chunks: devices[2].clone(),
            },
        )
        .unwrap();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let fail = |n: u64| devices.iter().for_each(|d| d.fail_reads(n));
        let mut failed = 0;
        for i in 0..6_000u64 {
            let (k, v, r) = (key(i), i.to_le_bytes(), format!("rmw{i}").into_bytes());
            fail(u64::MAX);
            let upserted = store.upsert(&mut guard, &k, Some(&v));
            let bumped = store.rmw(&mut guard, &r, &|_: Option<&[u8]>| b"r".to_vec());
            fail(0);
            guard.refresh();
            failed += u64::from(upserted.is_err()) + u64::from(bumped.is_err());
            assert_eq!(
                store.get(&guard, &k).unwrap(),
                upserted.is_ok().then(|| v.to_vec()),
                "write {i}: an upsert that answered {upserted:?}"
            );
            assert_eq!(
                store.get(&guard, &r).unwrap(),
                bumped.as_ref().ok().cloned(),
                "write {i}: a read-modify-write that answered {bumped:?}"
            );
        }
        assert!(failed > 0, "no write met a failing device");
        let stats = store.stats();
        assert!(
            stats.compaction_failures > 0 && stats.throttled_writes > 0,
            "no throttled write met a failing compaction: {stats:?}"
        );
    }

    #[test]
    fn flipped_bits_on_the_devices_are_errors_of_reads_batches_and_compaction_never_data() {
        // Records of the hot log, the cold log and the chunk log on devices in memory;
        // then bits flipped on each device. Every read, single or batched, answers the
        // right value or `Corrupted` naming the address; a compaction that meets the
        // damage fails (and the write it throttles does not).
        let devices = [(); 3].map(|()| Arc::new(MemBlocks::new()));
        let store = F2::new(
            tiny_options(1 << 30, 0, false),
            F2Devices {
                hot: devices[0].clone(),
                cold: devices[1].clone(),
                chunks: devices[2].clone(),
            },
        )
        .unwrap();
        let mut handle = store.epoch().register();
        let value = |i: u64| format!("value {i:05} ").repeat(5).into_bytes();
        let keys = 3_000u64;
        {
            let mut guard = handle.protect();
            for i in 0..keys {
                store.upsert(&mut guard, &key(i), Some(&value(i))).unwrap();
                guard.refresh();
            }
            // Half the keys into the cold log (with their chunks on the chunk log).
            let hot = store.hot().log().addresses();
            store
                .compact_hot(&mut guard, hot.begin + (hot.tail - hot.begin) / 2)
                .unwrap();
        }
        let mut rng = Rng(41);
        let mut flipped = 0;
        for (d, device) in devices.iter().enumerate() {
            let log = match d {
                0 => store.hot().log(),
                1 => store.cold().log(),
                _ => store.cold().index().chunks().log(),
            };
            let a = log.addresses();
            for _ in 0..20 {
                let at = a.begin + rng.below(a.flushed_until.saturating_sub(a.begin).max(1));
                flipped += u64::from(device.flip_bit(at, rng.below(8) as u32));
            }
        }
        assert!(flipped > 30, "only {flipped} bits flipped");
        let mut refused = 0;
        let check = |i: u64, got: Result<Option<Vec<u8>>>, refused: &mut u64| match got {
            Ok(got) => assert_eq!(got, Some(value(i)), "key {i}"),
            Err(crate::Error::Corrupted { reason, .. }) => {
                assert!(reason.contains("address"), "{reason}");
                *refused += 1;
            }
            Err(e) => panic!("key {i}: {e:?}"),
        };
        {
            let guard = handle.protect();
            for i in 0..keys {
                check(i, store.get(&guard, &key(i)), &mut refused);
            }
        }
        for first in (0..keys).step_by(32) {
            let batch: Vec<Vec<u8>> = (first..(first + 32).min(keys)).map(key).collect();
            match store.get_many(&mut handle, &batch) {
                Ok(got) => {
                    for (i, got) in (first..).zip(got) {
                        check(i, Ok(got), &mut refused);
                    }
                }
                Err(e) => check(first, Err(e), &mut refused),
            }
        }
        assert!(refused > 0, "no read met a flipped bit");
        // Compacting over the damage fails, or copies only what reads back right.
        let mut guard = handle.protect();
        let hot = store.hot().log().addresses();
        let compacted = store.compact_hot(&mut guard, hot.safe_read_only);
        assert!(
            matches!(compacted, Ok(_) | Err(crate::Error::Corrupted { .. })),
            "{compacted:?}"
        );
    }

    #[test]
    fn chunk_log_compaction_keeps_every_cold_key_and_reads_no_dead_chunk() {
        let store = tiny_with(1 << 30, 0);
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let keys = 3_000u64;
        for i in 0..keys {
            store
                .cold()
                .insert(&mut guard, &key(i), Some(&i.to_le_bytes()))
                .unwrap();
            guard.refresh();
        }
        let chunks = store.cold().index().chunks();
        let before = chunks.stats().disk_reads;
        let a = chunks.log().addresses();
        let end = store.compact_chunks(&mut guard, a.safe_read_only).unwrap();
        assert!(end > a.begin, "nothing to compact: {a:?}");
        let stats = store.stats();
        assert!(
            stats.chunk_compactions == 1 && stats.chunks_copied > 0,
            "{stats:?}"
        );
        // Most versions below `end` were rewritten since: their chunk's entry holds a
        // newer one, which says so without a read.
        assert_eq!(chunks.stats().disk_reads, before, "{stats:?}");
        assert_eq!(chunks.log().addresses().begin, end);
        for i in 0..keys {
            assert_eq!(
                store.get(&guard, &key(i)).unwrap(),
                Some(i.to_le_bytes().to_vec()),
                "key {i}"
            );
        }
    }

    #[test]
    fn a_hot_compaction_reads_its_chunks_ahead_in_batches() {
        // 8,192 chunks, few of them in memory: the second pass's copies need their
        // chunks (written by the first) read back, and copies within a group of records
        // rarely share one.
        let store = on_memory(F2Options {
            cold_keys: 256 * 1024,
            hot_log_budget_bytes: 1 << 30,
            chunk_log: pages(6),
            ..tiny_options(1 << 30, 0, false)
        });
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let keys = 2_000u64;
        let first_begin = store.hot().log().addresses().begin;
        let mut before = store.stats();
        for round in 0..2u64 {
            for i in 0..keys {
                let value = (i + round * keys).to_le_bytes();
                store.upsert(&mut guard, &key(i), Some(&value)).unwrap();
                guard.refresh();
            }
            let a = store.hot().log().addresses();
            let chunk_reads = store.cold().index().chunks().log().record_reads();
            let end = store.compact_hot(&mut guard, a.safe_read_only).unwrap();
            assert!(end > a.begin, "nothing to compact: {a:?}");
            let chunk_reads = store.cold().index().chunks().log().record_reads() - chunk_reads;
            let s = store.stats();
            let ahead = s.compaction_read_ahead_reads - before.compaction_read_ahead_reads;
            let rounds = s.compaction_read_ahead_rounds - before.compaction_read_ahead_rounds;
            let single = s.compaction_single_reads - before.compaction_single_reads;
            before = s;
            for i in 0..keys {
                let value = (i + round * keys).to_le_bytes().to_vec();
                assert_eq!(store.get(&guard, &key(i)).unwrap(), Some(value), "key {i}");
            }
            if round == 0 {
                continue;
            }
            // Every chunk read of the pass went ahead or, where the look did not
            // foresee it, one at a time; nearly all went ahead, many at once.
            assert!(chunk_reads > keys / 2, "{chunk_reads} chunk reads: {s:?}");
            assert!(
                ahead + single >= chunk_reads,
                "{chunk_reads} chunk reads: {s:?}"
            );
            assert!(single * 20 <= ahead, "{s:?}");
            assert!(ahead >= 32 * rounds, "{s:?}");
            assert!(s.compaction_nanos > 0, "{s:?}");
            assert!(s.compaction_buffer_peak_bytes >= 4096 + 64 * 512, "{s:?}");
        }
        let begin = store.hot().log().addresses().begin;
        assert_eq!(store.stats().compacted_bytes, begin - first_begin);
    }

    #[test]
    fn the_hot_index_keeps_only_keys_with_hot_records() {
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        for i in 0..3_000u64 {
            store.upsert(&mut guard, &key(i), Some(&[1; 40])).unwrap();
            store.maybe_compact(&mut guard).unwrap();
            guard.refresh();
        }
        let entries = store.hot().index_entries(&guard);
        // The hot log holds at most its budget: about 16 pages of 64-byte records.
        assert!(
            entries < 1_200,
            "{entries} hot index entries for a hot log of 16 pages"
        );
        assert!(
            store.stats().hot_entries_removed > 1_000,
            "{:?}",
            store.stats()
        );
        for i in (0..3_000u64).step_by(7) {
            assert_eq!(
                store.get(&guard, &key(i)).unwrap(),
                Some(vec![1; 40]),
                "{i}"
            );
        }
    }

    #[test]
    fn counts_stay_exact_while_hot_to_cold_passes_and_merges_of_cold_runs_run() {
        in_runs_layout(counts_stay_exact_while_both_compactions_run);
    }

    #[test]
    fn counts_stay_exact_while_both_compactions_run() {
        // FASTER's count store under F2: read-modify-writes of skewed keys from three
        // threads while a fourth keeps compacting both logs; no increment is lost or
        // counted twice, whether its key was hot, on the hot log's disk part, or cold.
        for round in 0..3u64 {
            let store = tiny();
            let done = std::sync::atomic::AtomicBool::new(false);
            let keys = 3_000u64;
            let expected: Vec<HashMap<u64, u64>> = std::thread::scope(|s| {
                let workers: Vec<_> = (0..3u64)
                    .map(|t| {
                        let store = &store;
                        s.spawn(move || {
                            let mut handle = store.epoch().register();
                            let mut guard = handle.protect();
                            let mut rng = Rng(round * 10 + t);
                            let mut mine = HashMap::new();
                            for n in 0..8_000 {
                                let k = rng.skewed(keys);
                                store.rmw(&mut guard, &key(k), &counter).unwrap();
                                *mine.entry(k).or_insert(0) += 1;
                                guard.refresh();
                                if n % 1_000 == 999 {
                                    // Let the compactor get a pass in while we work.
                                    let seen = store.stats();
                                    for _ in 0..10_000 {
                                        let now = store.stats();
                                        if now.hot_cold_compactions > seen.hot_cold_compactions
                                            && now.cold_cold_compactions
                                                > seen.cold_cold_compactions
                                        {
                                            break;
                                        }
                                        guard.refresh();
                                        std::thread::yield_now();
                                    }
                                }
                            }
                            mine
                        })
                    })
                    .collect();
                let (store, done) = (&store, &done);
                s.spawn(move || compact_until(store, done));
                // The compactor stops even if a worker panicked (else the scope waits
                // for it forever).
                let joined: Vec<_> = workers.into_iter().map(|h| h.join()).collect();
                done.store(true, std::sync::atomic::Ordering::Release);
                joined.into_iter().map(|r| r.unwrap()).collect()
            });
            check_counts(&store, &expected, keys, round);
            let stats = store.stats();
            assert!(
                stats.hot_cold_compactions > 0 && stats.cold_cold_compactions > 0,
                "{stats:?}"
            );
        }
    }

    /// Cold reads racing merges of the cold runs and the hot→cold passes that feed them:
    /// 2,000 keys, every one present throughout, are read one by one and in batches by
    /// two threads while a third rewrites them (each write keeps its key present, with
    /// a value naming the key) and compacts, so that the set of runs a read takes is
    /// replaced under it again and again. A read never answers "absent", nor another
    /// key's value.
    #[test]
    fn cold_reads_racing_merges_of_cold_runs_never_miss_a_present_key() {
        in_runs_layout(|| {
            let store = tiny();
            let keys = 2_000u64;
            let value = |k: u64, n: u64| format!("{k}:{n}").into_bytes();
            {
                let mut handle = store.epoch().register();
                let mut guard = handle.protect();
                for k in 0..keys {
                    store
                        .upsert(&mut guard, &key(k), Some(&value(k, 0)))
                        .unwrap();
                    store.maybe_compact(&mut guard).unwrap();
                }
            }
            let done = std::sync::atomic::AtomicBool::new(false);
            let check = |k: u64, got: Option<Vec<u8>>| {
                let got = got.unwrap_or_else(|| panic!("key {k} answered absent"));
                let text = String::from_utf8(got).unwrap();
                assert!(text.starts_with(&format!("{k}:")), "key {k} read {text:?}");
            };
            std::thread::scope(|s| {
                for t in 0..2u64 {
                    let (store, done, check) = (&store, &done, &check);
                    s.spawn(move || {
                        let mut handle = store.epoch().register();
                        let mut batches = store.epoch().register();
                        let mut rng = Rng(100 + t);
                        while !done.load(std::sync::atomic::Ordering::Acquire) {
                            let k = rng.below(keys);
                            let got = {
                                let guard = handle.protect();
                                store.get(&guard, &key(k)).unwrap()
                            };
                            check(k, got);
                            let ks: Vec<u64> = (0..16).map(|_| rng.below(keys)).collect();
                            let names: Vec<Vec<u8>> = ks.iter().map(|&k| key(k)).collect();
                            let got = store.get_many(&mut batches, &names).unwrap();
                            for (&k, v) in ks.iter().zip(got) {
                                check(k, v);
                            }
                        }
                    });
                }
                let mut handle = store.epoch().register();
                let mut guard = handle.protect();
                let mut rng = Rng(7);
                for n in 1..=30_000u64 {
                    let k = rng.skewed(keys);
                    store
                        .upsert(&mut guard, &key(k), Some(&value(k, n)))
                        .unwrap();
                    store.maybe_compact(&mut guard).unwrap();
                    guard.refresh();
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            });
            let runs = store.cold_runs().expect("the runs layout").stats();
            assert!(runs.merges > 5 && runs.unit_reads > 1_000, "{runs:?}");
        });
    }

    #[test]
    fn counts_stay_exact_and_reads_never_go_back_with_the_read_cache() {
        // The count store with reads: three threads add 1 to skewed keys or read them,
        // one key at a time or six in a batch (`get_many`, whose operations run again
        // round after round), while a fourth compacts both logs. A thread never reads a
        // count below one it saw or made before (a stale copy in the read cache, or a
        // batch answering from an old round, would show as one), and the counts end
        // exact.
        for round in 0..3u64 {
            let store = tiny();
            let done = std::sync::atomic::AtomicBool::new(false);
            let keys = 3_000u64;
            let expected: Vec<HashMap<u64, u64>> = std::thread::scope(|s| {
                let workers: Vec<_> = (0..3u64)
                    .map(|t| {
                        let store = &store;
                        s.spawn(move || {
                            let mut handle = store.epoch().register();
                            let mut guard = handle.protect();
                            let seed = 1_000 + round * 10 + t;
                            let mut rng = Rng(seed);
                            let mut mine = HashMap::new();
                            let mut seen: HashMap<u64, u64> = HashMap::new();
                            let mut batches = store.epoch().register();
                            for n in 0..12_000 {
                                // Reads one key, or six in a batch.
                                let ks: Vec<u64> = match rng.below(6) {
                                    0 => (0..6).map(|_| rng.skewed(keys)).collect(),
                                    _ => vec![rng.skewed(keys)],
                                };
                                let nows: Vec<u64> = if ks.len() > 1 {
                                    let names: Vec<Vec<u8>> = ks.iter().map(|&k| key(k)).collect();
                                    let got = store.get_many(&mut batches, &names).unwrap();
                                    got.into_iter().map(count).collect()
                                } else if rng.below(2) == 0 {
                                    *mine.entry(ks[0]).or_insert(0) += 1;
                                    let new = store.rmw(&mut guard, &key(ks[0]), &counter).unwrap();
                                    vec![count(Some(new))]
                                } else {
                                    vec![count(store.get(&guard, &key(ks[0])).unwrap())]
                                };
                                for (&k, &now) in ks.iter().zip(&nows) {
                                    let last = seen.get(&k).copied().unwrap_or(0);
                                    assert!(
                                        now >= last,
                                        "seed {seed}, op {n}: key {k} went back from {last} to {now}"
                                    );
                                    seen.insert(k, now);
                                }
                                guard.refresh();
                            }
                            mine
                        })
                    })
                    .collect();
                let (store, done) = (&store, &done);
                s.spawn(move || compact_until(store, done));
                // The compactor stops even if a worker panicked (else the scope waits
                // for it forever).
                let joined: Vec<_> = workers.into_iter().map(|h| h.join()).collect();
                done.store(true, std::sync::atomic::Ordering::Release);
                joined.into_iter().map(|r| r.unwrap()).collect()
            });
            check_counts(&store, &expected, keys, round);
            let stats = store.stats();
            assert!(
                stats.read_cache_hits > 0
                    && stats.read_cache_inserts > 0
                    && stats.read_cache_evictions > 0,
                "{stats:?}"
            );
            assert!(stats.batched_reads > 0, "{stats:?}");
        }
    }

    #[test]
    fn batched_reads_match_a_hash_map_through_deltas_and_merges_of_cold_runs() {
        in_runs_layout(batched_reads_match_a_hash_map_through_both_compactions);
    }

    #[test]
    fn batched_reads_match_a_hash_map_through_both_compactions() {
        // Skewed writes and deletes, compacting as they go, so that most keys end up on
        // disk in the hot or the cold log; every so often a batch of up to 24 keys,
        // chosen uniformly (most are cold), is read with `get_many` and checked.
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut batches = store.epoch().register();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rng = Rng(23);
        let keys = 2_000;
        for step in 0..30_000u64 {
            {
                let mut guard = handle.protect();
                let k = key(rng.skewed(keys));
                if rng.below(5) == 0 {
                    store.upsert(&mut guard, &k, None).unwrap();
                    model.remove(&k);
                } else {
                    let v: Vec<u8> = (0..rng.below(90)).map(|_| rng.next() as u8).collect();
                    store.upsert(&mut guard, &k, Some(&v)).unwrap();
                    model.insert(k, v);
                }
                store.maybe_compact(&mut guard).unwrap();
            }
            if step % 16 == 0 {
                let ks: Vec<Vec<u8>> = (0..1 + rng.below(24))
                    .map(|_| key(rng.below(keys)))
                    .collect();
                let got = store.get_many(&mut batches, &ks).unwrap();
                for (k, v) in ks.iter().zip(&got) {
                    assert_eq!(v.as_ref(), model.get(k), "step {step}: {k:?}");
                }
            }
        }
        let stats = store.stats();
        assert!(
            stats.hot_cold_compactions > 10 && stats.cold_cold_compactions > 3,
            "{stats:?}"
        );
        match (store.cold_log(), store.cold_runs()) {
            (Some(cold), _) => {
                assert!(cold.log().record_reads() > 0, "{stats:?}");
                assert!(cold.index().chunks().log().record_reads() > 0, "{stats:?}");
            }
            (None, Some(runs)) => assert!(runs.stats().unit_reads > 0, "{:?}", runs.stats()),
            (None, None) => unreachable!(),
        }
        // Memory devices read where they are asked: the reads went through the batches,
        // none waited in flight (tests/hash_store.rs measures the depth on files).
        assert!(
            stats.batched_reads > 0 && stats.batch_waits == 0,
            "{stats:?}"
        );
    }

    #[test]
    fn the_hot_index_gives_back_the_overflow_buckets_churning_keys_left() {
        // Distinct keys churn through the hot log: each is written, then compaction
        // moves it to the cold log and removes its hot entry. Every chain that once held
        // more than seven keys would keep its overflow bucket; rebuilds of the index at
        // its size give them back, so its overflow stays within a quarter of its home
        // buckets of what its entries need. Every key stays readable through them.
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let keys = 30_000u64;
        let mut most = 0;
        for i in 0..keys {
            store
                .upsert(&mut guard, &key(i), Some(&i.to_le_bytes()))
                .unwrap();
            store.maybe_compact(&mut guard).unwrap();
            if i % 500 == 0 {
                guard.refresh();
                let hot = store.hot();
                let (home, overflow) = (
                    hot.index_buckets(&guard),
                    hot.index_overflow_buckets(&guard),
                );
                let needed = hot.index_overflow_needed(&guard);
                most = most.max(overflow);
                assert!(
                    overflow <= needed + home / 4 + home / 8,
                    "key {i}: {overflow} overflow buckets for {home} home, {needed} needed"
                );
            }
        }
        let stats = store.stats();
        assert!(stats.hot_index_rebuilds > 0, "{stats:?}");
        assert!(most > 0, "no chain ever overflowed");
        for i in (0..keys).step_by(7) {
            assert_eq!(
                store.get(&guard, &key(i)).unwrap(),
                Some(i.to_le_bytes().to_vec()),
                "key {i}"
            );
        }
    }

    #[test]
    fn failed_batched_reads_are_asked_again_and_a_lasting_failure_is_an_error() {
        let devices = [(); 3].map(|()| Arc::new(MemBlocks::new()));
        let store = {
            let [hot, cold, chunks] = devices.clone().map(|d| d as Arc<dyn BlockDevice>);
            F2::new(tiny().options, F2Devices { hot, cold, chunks }).unwrap()
        };
        let mut handle = store.epoch().register();
        let keys = 3_000u64;
        {
            let mut guard = handle.protect();
            for i in 0..keys {
                store
                    .upsert(&mut guard, &key(i), Some(&i.to_le_bytes()))
                    .unwrap();
                store.maybe_compact(&mut guard).unwrap();
            }
        }
        // Each batch reads keys of its own: a key read once is in the read cache.
        let batch = |b: u64| -> (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>) {
            let ids: Vec<u64> = (0..64).map(|i| (i * 41 + b * 5) % keys).collect();
            let values = ids.iter().map(|i| Some(i.to_le_bytes().to_vec())).collect();
            (ids.into_iter().map(key).collect(), values)
        };
        let (names, want) = batch(0);
        let before = store.cold().log().record_reads();
        assert_eq!(store.get_many(&mut handle, &names).unwrap(), want);
        assert!(
            store.cold().log().record_reads() > before,
            "the keys are not cold"
        );
        // A few failed reads: their operations ask again in a later round.
        for d in &devices {
            d.fail_reads(3);
        }
        let (names, want) = batch(1);
        assert_eq!(store.get_many(&mut handle, &names).unwrap(), want);
        // Reads that keep failing: after its rounds the batch reads as `get` does, and
        // reports the device's error (not the internal pending signal).
        devices[1].fail_reads(u64::MAX);
        let (names, want) = batch(2);
        let e = store.get_many(&mut handle, &names).unwrap_err();
        assert!(e.to_string().contains("simulated EIO"), "{e}");
        devices[1].fail_reads(0);
        assert_eq!(store.get_many(&mut handle, &names).unwrap(), want);
    }

    #[test]
    fn no_copy_is_linked_after_its_key_was_written_and_compacted_away_meanwhile() {
        // A read finds no hot record of a key and reads the cold log's value; before it
        // links its copy, the key is written, the write is compacted into the cold log
        // and the key's hot entry swept away — the entry is back to what the read saw
        // (none). The link must see that the hot log's BEGIN moved and give up, or the
        // old value would answer from then on.
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        store
            .cold()
            .insert(&mut guard, &key(0), Some(b"old"))
            .unwrap();
        let HotRead::NotFound(ticket) = store.hot().read(&guard, &key(0)).unwrap() else {
            panic!("the hot log has no record of the key");
        };
        store.upsert(&mut guard, &key(0), Some(b"new")).unwrap();
        let mut i = 1;
        while store
            .hot()
            .newest_address(&guard, &key(0))
            .unwrap()
            .is_some()
        {
            store.upsert(&mut guard, &key(i), Some(&[1; 40])).unwrap();
            store.maybe_compact(&mut guard).unwrap();
            guard.refresh();
            i += 1;
            assert!(i < 10_000, "the write never left the hot log");
        }
        assert!(store.stats().hot_entries_removed > 0);
        let old = crate::hash::record::LogValue::inline(b"old".to_vec());
        store.hot().cache_older(&guard, &key(0), &old, ticket);
        assert_eq!(
            store.get(&guard, &key(0)).unwrap().as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(store.stats().read_cache_inserts_abandoned, 1);
    }

    #[test]
    fn a_cold_read_racing_a_cold_compaction_and_truncation_finds_the_copy() {
        // F2's false-absence anomaly (section 5.4), made certain by a hook: a cold read
        // has read its key's chain head (a record of another key, in front of the key's
        // own record at the start of the cold log) and pauses; a cold→cold compaction
        // copies the key's record to the tail and truncates the start; the read then
        // walks into the truncated region. Without the truncation counter it answers
        // "absent".
        let roomy = HlogOptions {
            page_bits: 12,
            frames: 32,
            mutable_pages: 2,
        };
        let options = F2Options {
            hot_keys: 64,
            cold_keys: 32,
            hot_log: roomy,
            cold_log: roomy,
            chunk_log: roomy,
            hot_log_budget_bytes: 1 << 30,
            cold_log_budget_bytes: 1 << 30,
            compact_at_percent: 80,
            compact_percent: 10,
            compaction_threads: 2,
            read_cache_memory_bytes: 0,
            read_cache_admission: false,
            cold_layout: ColdLayout::Log,
        };
        let devices = F2Devices {
            hot: Arc::new(MemBlocks::new()),
            cold: Arc::new(MemBlocks::new()),
            chunks: Arc::new(MemBlocks::new()),
        };
        let store = F2::new(options, devices).unwrap();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        // Two keys of one cold chain: with one chunk of 32 entries, keys whose hashes
        // pick the same entry share a chain. Find such a pair.
        let entry = |k: &[u8]| (crate::hash::hot::hash_key(k).0 >> 32) % 32;
        let target = key(0);
        let other = (1..10_000)
            .map(key)
            .find(|k| entry(k) == entry(&target))
            .unwrap();
        store
            .cold()
            .insert(&mut guard, &target, Some(b"the value"))
            .unwrap();
        store
            .cold()
            .insert(&mut guard, &other, Some(b"another"))
            .unwrap();
        // Fill a few pages behind them so that the first page becomes read-only.
        for i in 0..200u64 {
            let filler = format!("filler{i}").into_bytes();
            store
                .cold()
                .insert(&mut guard, &filler, Some(&[7; 64]))
                .unwrap();
            guard.refresh();
        }
        assert!(store.cold().log().addresses().safe_read_only >= 4096);
        drop(guard);

        let (paused_tx, paused_rx) = std::sync::mpsc::channel::<()>();
        let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
        let resume_rx = std::sync::Mutex::new(resume_rx);
        let paused_tx = std::sync::Mutex::new(Some(paused_tx));
        *store.cold().after_find_hook.lock() = Some(Box::new(move || {
            if let Some(tx) = paused_tx.lock().unwrap().take() {
                tx.send(()).unwrap();
                resume_rx.lock().unwrap().recv().unwrap();
            }
        }));
        std::thread::scope(|s| {
            let store = &store;
            let target = &target;
            let reader = s.spawn(move || {
                let mut handle = store.epoch().register();
                let guard = handle.protect();
                store.get(&guard, target).unwrap()
            });
            paused_rx.recv().unwrap();
            // The reader holds the chain head (`other`'s record). Compact the first page.
            let mut guard = handle.protect();
            let end = store.compact_cold(&mut guard, 4096).unwrap();
            assert_eq!(end, 4096);
            drop(guard);
            resume_tx.send(()).unwrap();
            assert_eq!(
                reader.join().unwrap().as_deref(),
                Some(&b"the value"[..]),
                "the read reported a present key absent"
            );
        });
        assert_eq!(store.stats().cold_reads_repeated, 1);
    }
}
