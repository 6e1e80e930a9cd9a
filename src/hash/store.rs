//! [`HashStore`]: the hash tier as a keyspace of a [`Db`](crate::Db) — F2's store
//! ([`F2`]) with its logs in the database directory, its writes through the database's
//! write-ahead log, its state in the database's checkpoints, and a background thread
//! that compacts its logs.
//!
//! # Files
//!
//! ```text
//! <dir>/hs-<id as 8 hex>-hot-<segment as 8 hex>.hlog     the hot log
//! <dir>/hs-<id as 8 hex>-cold-<segment as 8 hex>.hlog    the cold log
//! <dir>/hs-<id as 8 hex>-chunks-<segment as 8 hex>.hlog  the cold index's chunks
//! ```
//!
//! # Durability
//!
//! A write is logged before it reaches the store, under its key's stripe (the journal's
//! order rule); a read-modify-write reads, computes, logs and writes under the stripe
//! held exclusively, and every other write of the key holds the stripe too, so the log
//! orders a key's writes as the store applied them. A checkpoint ([`F2::checkpoint`])
//! flushes and syncs each log and records its extent; recovery rebuilds the store from
//! those extents and replays the log from the checkpoint's position. A log segment that
//! a kept checkpoint needs is never deleted ([`Retaining`]).
//!
//! # Values out of line
//!
//! A value longer than the inline limit goes to the database's value store first
//! (`storage/values.rs`); the logged op is `PutExternal` and the record holds the
//! reference. The store hears `applied` right after the record is linked, before the
//! writer's epoch guard refreshes ([`F2::upsert_value`]), and `free` from compaction
//! when the last record holding a reference is dropped (`F2::report_unreachable`).
//! Reads take the value store's read guard before the lookup and read the value after
//! leaving the epoch. See docs/design.md, "Values out of line in a hash store".
//!
//! Uses: `hash::f2`, `journal`, `storage` (the value store), `error`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::f2::{ColdLayout, F2, F2Devices, F2Extents, F2Options};
use super::hlog::HlogOptions;
use super::hot::Update;
use super::read_cache::ReadCache;
use super::record::LogValue;
use crate::error::{Error, Result};
use crate::journal::{Durability, Journal};
use crate::storage::{BlockDevice, Retaining, SegmentFiles, ValueRef, ValueStore};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::ticker::Ticker;
use crate::wal::LogOpRef;

/// How a hash keyspace is sized, fixed when [`Db::hash_store_with`](crate::Db::hash_store_with)
/// creates it (and recorded in the database's manifest).
///
/// The store's memory comes out of its database's memory budget
/// ([`DbOptions::config`](crate::DbOptions::config)`.memory_budget_bytes`): the tree
/// keyspaces share what the hash stores leave (see [`HashStoreOptions::memory_bytes`]).
///
/// The store's memory is split much as the F2 paper splits its budget at 10% of the
/// data: up to a sixth for the hot index (no more than `expected_keys` need), a third
/// (the paper: a sixth) for the read cache (of which 4-6% is its admission filter: a
/// record read from disk is copied only when its key is read from disk a second time
/// while the filter remembers the first), and the rest for the hot log's pages (with a
/// read cache, a sixty-fourth of them for bits that say which records were read: those
/// still their key's newest get a copy in the read cache when their page leaves
/// memory). The cold tier's records stay on disk:
/// in [`ColdLayout::Runs`] (the default) its runs keep fences (about a quarter of a
/// byte per key) and their deltas' filters in memory, for which the split keeps half a
/// byte per expected key (at most a sixteenth of the memory); in [`ColdLayout::Log`] the split gives a forty-eighth each to
/// the cold log's pages and the cold index's chunk pages, and half a byte per expected
/// key to the chunk table. Each part but the cold tier's index and the hot log can be
/// set instead ([`HashStoreOptions::hot_index_bytes`] and the fields after it). A budget
/// too small for those parts is refused.
///
/// ```
/// use bfdb::HashStoreOptions;
///
/// let options = HashStoreOptions::default()
///     .memory_bytes(256 << 20)
///     .expected_keys(20_000_000)
///     .hot_log_disk_bytes(2 << 30)
///     .read_cache_bytes(0); // no read cache: the hot log gets its share
/// assert_eq!(options.memory_bytes, Some(256 << 20));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HashStoreOptions {
    /// Bytes of memory the store keeps (indexes, the read cache and log pages), taken
    /// out of its database's memory budget when it is created and each time the
    /// database opens. `None` (the default): half of what the budget has left when the
    /// store is created (the budget less the other hash stores' memory and
    /// [`MIN_MEMORY_BUDGET_BYTES`](crate::config::MIN_MEMORY_BUDGET_BYTES) kept for the
    /// trees); the number chosen is recorded. A store that does not fit is refused at
    /// creation; if the database is reopened with a budget too small for the stores it
    /// has, each gets a share of the budget in proportion to its recorded memory
    /// ([`HashStoreStats::memory_budget_bytes`]).
    ///
    /// The hot index's overflow buckets come on top of its share when its keys need
    /// them (more than seven in one home bucket). Those that keys leaving the hot log
    /// leave behind are given back by rebuilding the index at its size
    /// ([`HashStoreStats::hot_index_rebuilds`]), so at most a quarter of the home
    /// buckets' bytes more than the keys need stay: 1.00-1.03× the budget was measured
    /// (5M keys in 52 MiB, 20M in 206 MiB), against 1.14× before rebuilds. The process
    /// around the store (thread stacks, the allocator's free memory) is not counted.
    pub memory_bytes: Option<u64>,
    /// Distinct keys the store expects: bounds the hot index, and sizes the cold tier
    /// (its partitions in [`ColdLayout::Runs`]; its chunk index, under a byte of memory
    /// per cold key, in [`ColdLayout::Log`]). Default 1M.
    pub expected_keys: u64,
    /// Bytes of disk the hot log may use; past 80% of it, its oldest 10% is compacted
    /// into the cold log. Default 1 GiB. (Each log's disk budget bounds its live part:
    /// segments a compaction freed stay on disk until no kept checkpoint of the `Db`
    /// needs them, and a store holding more than a budget of them brings a checkpoint.)
    pub hot_log_disk_bytes: u64,
    /// Bytes of disk the cold tier may use; in [`ColdLayout::Log`], past 80% of it the
    /// cold log's oldest 10% is compacted within it (the runs are merged as their
    /// deltas grow, whatever their size). Default 16 GiB. Writers that find a log past
    /// its whole budget compact before they return (they are slowed, never failed).
    pub cold_log_disk_bytes: u64,
    /// Threads a hot→cold compaction pass runs on. Default 2. In [`ColdLayout::Log`]
    /// each waits on its own disk reads (a cold insert reads its key's chunk of the cold
    /// index), so more threads keep more reads in flight; in [`ColdLayout::Runs`] a pass
    /// reads only the hot log's pages.
    pub compaction_threads: usize,
    /// Bytes for the hot index's home buckets instead of a sixth of the memory (it
    /// takes the largest power of two of 64-byte buckets within them, at least 256,
    /// and no more than `expected_keys` need). `None` by default.
    pub hot_index_bytes: Option<u64>,
    /// Bytes for the read cache instead of a third of the memory; less than three of
    /// the hot log's pages turns it off (its bytes go to the hot log). `None` by
    /// default.
    pub read_cache_bytes: Option<u64>,
    /// Bytes for the cold log's page frames instead of a forty-eighth of the memory
    /// (at least three pages are kept). `None` by default.
    pub cold_log_memory_bytes: Option<u64>,
    /// Bytes for the page frames of the cold index's chunk log instead of a
    /// forty-eighth of the memory (at least three pages are kept). `None` by default.
    pub chunk_log_memory_bytes: Option<u64>,
    /// How the cold tier is laid out. Default [`ColdLayout::Runs`]: there are no cold
    /// and chunk log pages and no chunk table, their shares of the memory go to the hot
    /// log (`cold_log_memory_bytes` and `chunk_log_memory_bytes` are refused), and
    /// `cold_log_disk_bytes` bounds the runs. [`ColdLayout::Log`] is the F2 paper's
    /// cold log and chunk index.
    pub cold_layout: ColdLayout,
}

impl Default for HashStoreOptions {
    fn default() -> Self {
        HashStoreOptions {
            memory_bytes: None,
            expected_keys: 1 << 20,
            hot_log_disk_bytes: 1 << 30,
            cold_log_disk_bytes: 16 << 30,
            compaction_threads: 2,
            hot_index_bytes: None,
            read_cache_bytes: None,
            cold_log_memory_bytes: None,
            chunk_log_memory_bytes: None,
            cold_layout: ColdLayout::Runs,
        }
    }
}

impl HashStoreOptions {
    /// Sets [`HashStoreOptions::memory_bytes`].
    pub fn memory_bytes(mut self, bytes: u64) -> Self {
        self.memory_bytes = Some(bytes);
        self
    }

    /// Sets [`HashStoreOptions::expected_keys`].
    pub fn expected_keys(mut self, keys: u64) -> Self {
        self.expected_keys = keys;
        self
    }

    /// Sets [`HashStoreOptions::hot_log_disk_bytes`].
    pub fn hot_log_disk_bytes(mut self, bytes: u64) -> Self {
        self.hot_log_disk_bytes = bytes;
        self
    }

    /// Sets [`HashStoreOptions::cold_log_disk_bytes`].
    pub fn cold_log_disk_bytes(mut self, bytes: u64) -> Self {
        self.cold_log_disk_bytes = bytes;
        self
    }

    /// Sets [`HashStoreOptions::compaction_threads`].
    pub fn compaction_threads(mut self, threads: usize) -> Self {
        self.compaction_threads = threads;
        self
    }

    /// Sets [`HashStoreOptions::hot_index_bytes`].
    pub fn hot_index_bytes(mut self, bytes: u64) -> Self {
        self.hot_index_bytes = Some(bytes);
        self
    }

    /// Sets [`HashStoreOptions::read_cache_bytes`].
    pub fn read_cache_bytes(mut self, bytes: u64) -> Self {
        self.read_cache_bytes = Some(bytes);
        self
    }

    /// Sets [`HashStoreOptions::cold_log_memory_bytes`].
    pub fn cold_log_memory_bytes(mut self, bytes: u64) -> Self {
        self.cold_log_memory_bytes = Some(bytes);
        self
    }

    /// Sets [`HashStoreOptions::chunk_log_memory_bytes`].
    pub fn chunk_log_memory_bytes(mut self, bytes: u64) -> Self {
        self.chunk_log_memory_bytes = Some(bytes);
        self
    }

    /// Sets [`HashStoreOptions::cold_layout`].
    pub fn cold_layout(mut self, layout: ColdLayout) -> Self {
        self.cold_layout = layout;
        self
    }

    /// The parts set instead of the paper's shares, in the order of the fields.
    pub(crate) fn parts(&self) -> [Option<u64>; 4] {
        [
            self.hot_index_bytes,
            self.read_cache_bytes,
            self.cold_log_memory_bytes,
            self.chunk_log_memory_bytes,
        ]
    }

    /// These options with the parts `parts` says.
    pub(crate) fn with_parts(mut self, parts: [Option<u64>; 4]) -> Self {
        [
            self.hot_index_bytes,
            self.read_cache_bytes,
            self.cold_log_memory_bytes,
            self.chunk_log_memory_bytes,
        ] = parts;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidConfig(why));
        if let Some(memory) = self.memory_bytes
            && !(MIN_MEMORY_BYTES..=1 << 44).contains(&memory)
        {
            return bad(format!(
                "a hash store's memory_bytes {memory} must be between 64 KiB and 16 TiB"
            ));
        }
        if let (Some(memory), parts) = (self.memory_bytes, self.parts())
            && parts
                .iter()
                .flatten()
                .try_fold(0u64, |sum, &part| sum.checked_add(part))
                .is_none_or(|sum| sum > memory)
        {
            return bad(format!(
                "a hash store's parts {parts:?} (hot index, read cache, cold log, chunk \
                 log) add up to more than its memory_bytes {memory}"
            ));
        }
        if self.cold_layout == ColdLayout::Runs
            && (self.cold_log_memory_bytes.is_some() || self.chunk_log_memory_bytes.is_some())
        {
            return bad(
                "a hash store in the runs layout has no cold or chunk log pages to size".into(),
            );
        }
        if self.expected_keys == 0 || self.expected_keys > 1 << 40 {
            return bad(format!(
                "expected_keys {} must be between 1 and 2^40",
                self.expected_keys
            ));
        }
        for (what, bytes) in [
            ("hot_log_disk_bytes", self.hot_log_disk_bytes),
            ("cold_log_disk_bytes", self.cold_log_disk_bytes),
        ] {
            if !(64 << 10..=1 << 46).contains(&bytes) {
                return bad(format!("{what} {bytes} must be between 64 KiB and 64 TiB"));
            }
        }
        if !(1..=64).contains(&self.compaction_threads) {
            return bad(format!(
                "compaction_threads {} must be between 1 and 64",
                self.compaction_threads
            ));
        }
        Ok(())
    }
}

/// The least memory a hash store takes.
pub(crate) const MIN_MEMORY_BYTES: u64 = 64 << 10;

/// A hash keyspace's layout: its options and the page sizes of its logs, which its
/// files depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HashLayout {
    pub(crate) options: HashStoreOptions,
    /// log2 of the page size of the hot log, the cold log and the chunk log.
    pub(crate) page_bits: [u8; 3],
    /// The format of the records in the log files: [`RECORD_FORMAT`] for every store
    /// this build creates; a manifest entry of an earlier build (kinds 2 and 3) has
    /// records without checksums, which this build refuses to open
    /// ([`HashLayout::check_record_format`]).
    pub(crate) record_format: u8,
}

/// The record format this build writes: records that end in a CRC-32C (manifest kind
/// 4). Format 1 (kinds 2 and 3) had none.
pub(crate) const RECORD_FORMAT: u8 = 2;

/// Bytes of a log segment file.
const SEGMENT_BYTES: u64 = 64 << 20;

/// The extension of the logs' segment files (`<prefix>-<segment as 8 hex>.hlog`).
const SEGMENT_EXTENSION: &str = "hlog";
/// The largest log page: a segment holds a whole number of them.
const MAX_PAGE_BITS: u32 = 22;

impl HashLayout {
    /// The layout for `options`, whose `memory_bytes` the database has set, with
    /// pages that hold a record of `max_record_bytes`.
    pub(crate) fn new(options: HashStoreOptions, max_record_bytes: u64) -> Result<HashLayout> {
        options.validate()?;
        let memory = recorded_memory(&options)?;
        // `max_record_bytes` counts the header, the key and the value; their padding
        // and the record's checksum add at most 7 + 7 + 4 bytes.
        let least = (max_record_bytes + 18)
            .next_power_of_two()
            .trailing_zeros()
            .max(12);
        // Pages of about a sixteenth of each log's memory, so that most of it can be
        // mutable, between the largest record and 4 MiB.
        let bits = |memory: u64| {
            let fit = (memory / 16).max(1).ilog2();
            fit.clamp(least, MAX_PAGE_BITS.max(least)) as u8
        };
        let split = Split::of(
            memory,
            options.expected_keys,
            options.parts(),
            options.cold_layout,
        );
        if split.hot_log < 4 * (1 << least) {
            return Err(Error::InvalidConfig(format!(
                "a hash store's memory_bytes {memory} leave its hot log {} bytes once the \
                 hot index ({}), the read cache ({}), the cold tier's index in memory for \
                 {} keys ({}) and the cold logs ({}) have theirs: give it more memory or \
                 expect fewer keys",
                split.hot_log,
                split.hot_index,
                split.read_cache,
                options.expected_keys,
                split.cold_index,
                split.cold_log + split.chunk_log
            )));
        }
        let layout = HashLayout {
            record_format: RECORD_FORMAT,
            page_bits: [
                bits(split.hot_log),
                bits(split.cold_log),
                bits(split.chunk_log),
            ],
            options,
        };
        layout.check()?;
        Ok(layout)
    }

    /// Checks a layout read back from a manifest.
    pub(crate) fn check(&self) -> Result<()> {
        self.options.validate()?;
        recorded_memory(&self.options)?;
        if self
            .page_bits
            .iter()
            .any(|&b| !(12..=MAX_PAGE_BITS as u8 + 1).contains(&b))
        {
            return Err(Error::InvalidConfig(format!(
                "hash log pages of 2^{:?} bytes",
                self.page_bits
            )));
        }
        Ok(())
    }

    /// Refuses a store whose log files hold records of another format than this build's
    /// (never reading them as this build's records, and never writing to them): an
    /// `Error::Incompatible` naming `files` (the store's files, a pattern) and
    /// the keyspace.
    pub(crate) fn check_record_format(&self, files: &Path, name: &str) -> Result<()> {
        if self.record_format == RECORD_FORMAT {
            return Ok(());
        }
        Err(Error::Incompatible {
            reason: format!(
                "{} (hash keyspace {name:?}) hold log records of format {} (written before \
                 hash log records had checksums); this build reads format {RECORD_FORMAT}",
                files.display(),
                self.record_format
            ),
        })
    }

    /// The memory recorded at creation (`options.memory_bytes`, which `check` found).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.options.memory_bytes.unwrap_or(MIN_MEMORY_BYTES)
    }

    /// The store's options for [`F2`] when its database grants it `memory` bytes: the
    /// recorded memory, or less when the database's budget has shrunk (the parts set
    /// in the options shrink in proportion). An error if the hot log would have less
    /// than three of its pages.
    pub(crate) fn f2_options(&self, memory: u64) -> Result<F2Options> {
        let o = &self.options;
        let recorded = self.memory_bytes();
        let memory = memory.min(recorded);
        let parts = o.parts().map(|part| {
            part.map(|bytes| (u128::from(bytes) * u128::from(memory) / u128::from(recorded)) as u64)
        });
        let split = Split::of(memory, o.expected_keys, parts, o.cold_layout);
        if split.hot_log >> self.page_bits[0] < 3 {
            return Err(Error::InvalidConfig(format!(
                "{memory} bytes of memory leave the hash store's hot log {} bytes once the \
                 hot index ({}), the read cache ({}), the cold tier's index in memory ({}) \
                 and the cold logs ({}) have theirs, less than three of its {}-byte pages: \
                 open the database with a larger memory budget",
                split.hot_log,
                split.hot_index,
                split.read_cache,
                split.cold_index,
                split.cold_log + split.chunk_log,
                1u64 << self.page_bits[0],
            )));
        }
        // The read cache is off when its share is less than three hot-log pages; the
        // hot log has it then.
        let read_cache = if split.read_cache >> self.page_bits[0] >= 3 {
            split.read_cache
        } else {
            0
        };
        let hot_log = split.hot_log + (split.read_cache - read_cache);
        // The admission filter comes out of the read cache's share (a cache too small
        // to spare it copies every read).
        let frames = read_cache.saturating_sub(ReadCache::admission_bytes(read_cache));
        let (read_cache, admission) = if frames >> self.page_bits[0] >= 3 {
            (frames, true)
        } else {
            (read_cache, false)
        };
        // With a read cache the hot log keeps a read bit per 8 bytes of its frames (a
        // sixty-fourth of them), out of its share.
        let hot_log = if read_cache > 0 {
            hot_log / 65 * 64
        } else {
            hot_log
        };
        let log = |memory: u64, bits: u8| {
            let frames = (memory >> bits).max(3);
            HlogOptions {
                page_bits: u32::from(bits),
                frames,
                mutable_pages: (frames * 9 / 10).clamp(1, frames - 2),
            }
        };
        Ok(F2Options {
            hot_keys: split.hot_keys,
            cold_keys: o.expected_keys,
            hot_log: log(hot_log, self.page_bits[0]),
            cold_log: log(split.cold_log, self.page_bits[1]),
            cold_layout: o.cold_layout,
            chunk_log: log(split.chunk_log, self.page_bits[2]),
            hot_log_budget_bytes: o.hot_log_disk_bytes,
            cold_log_budget_bytes: o.cold_log_disk_bytes,
            compact_at_percent: 80,
            compact_percent: 10,
            compaction_threads: o.compaction_threads,
            read_cache_memory_bytes: read_cache,
            read_cache_admission: admission,
        })
    }
}

/// `options.memory_bytes`, which a layout must have (the database sets it).
fn recorded_memory(options: &HashStoreOptions) -> Result<u64> {
    options
        .memory_bytes
        .ok_or_else(|| Error::InvalidConfig("a hash store's layout has no memory_bytes".into()))
}

/// The memory budget split in parts (see [`HashStoreOptions`]), in bytes.
struct Split {
    /// Keys the hot index is sized for, and its home buckets' bytes.
    hot_keys: u64,
    hot_index: u64,
    read_cache: u64,
    /// The cold tier's index in memory, sized by the expected keys: the chunk table in
    /// the log layout; the runs' fences and delta filters in the runs layout (a reserve
    /// of half a byte a key, at most a sixteenth of the memory: fences take about a
    /// quarter for records of 100-odd bytes, the filters 1.25 bytes for each key in a
    /// delta, deltas holding up to a quarter of a partition's base).
    cold_index: u64,
    cold_log: u64,
    chunk_log: u64,
    /// What is left: the hot log's page frames.
    hot_log: u64,
}

impl Split {
    /// The split of `memory`, with the parts `parts` gives (hot index, read cache, cold
    /// log, chunk log) instead of the paper's shares. In the runs layout the cold tier
    /// has no log pages or chunk table: the hot log has their shares, but for the
    /// reserve of the runs' fences and filters.
    fn of(memory: u64, expected_keys: u64, parts: [Option<u64>; 4], layout: ColdLayout) -> Split {
        use super::index::{IndexOptions, KEYS_PER_BUCKET};
        let sixth = memory / 6;
        let small = memory / 48;
        let [hot_index, read_cache, cold_log, chunk_log] = parts;
        // The hot index's home buckets: a power of two within its share (at least 256),
        // and no more than the expected keys need.
        let fits = (hot_index.unwrap_or(sixth) / 64).max(256);
        let buckets = (1u64 << fits.ilog2())
            .min(IndexOptions::for_keys(expected_keys).buckets as u64)
            .max(256);
        // A third, not the paper's sixth: in read-mostly rows the hot log's pages hold
        // what was written lately, and the read cache what is read (docs/design.md).
        let read_cache = read_cache.unwrap_or(memory / 3);
        let (cold_index, cold_log, chunk_log) = match layout {
            ColdLayout::Log => {
                let chunks = super::cold::ColdIndex::chunks_for(expected_keys);
                (
                    IndexOptions::for_keys(chunks).buckets as u64 * 64,
                    cold_log.unwrap_or(small),
                    chunk_log.unwrap_or(small),
                )
            }
            // At most a sixteenth of the memory: the default expected keys (1M) in a
            // small budget.
            ColdLayout::Runs => ((expected_keys / 2).min(memory / 16), 0, 0),
        };
        let fixed = buckets * 64 + read_cache + cold_index + cold_log + chunk_log;
        Split {
            hot_keys: buckets * KEYS_PER_BUCKET,
            hot_index: buckets * 64,
            read_cache,
            cold_index,
            cold_log,
            chunk_log,
            hot_log: memory.saturating_sub(fixed),
        }
    }
}

/// Where a hash keyspace keeps its logs.
pub(crate) enum HashFiles<'a> {
    /// Segment files in the database directory.
    Dir { dir: &'a Path, direct: bool },
    /// Simulated files (crash tests).
    Sim(&'a crate::storage::SimPages),
}

/// The names of the three logs' files.
const LOGS: [&str; 3] = ["hot", "cold", "chunks"];

/// The file-name prefix of log `log` of keyspace `id`.
pub(crate) fn file_prefix(id: u32, log: &str) -> String {
    format!("hs-{id:08x}-{log}")
}

/// Whether `name` is a file of hash keyspace `id`'s logs.
pub(crate) fn is_file_of(name: &str, id: u32) -> bool {
    name.starts_with(&format!("hs-{id:08x}-"))
}

/// The keyspace id a hash log file's name gives, if it is one.
pub(crate) fn file_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("hs-")?;
    u32::from_str_radix(rest.get(..8)?, 16).ok()
}

/// What a hash keyspace writes through: its database's journal.
pub(crate) struct HashAttached {
    pub(crate) journal: Arc<Journal>,
    pub(crate) keyspace: u32,
    pub(crate) name: String,
    /// The level of `insert`, `delete` and `rmw` (`DbOptions::durability`).
    pub(crate) durability: Durability,
    /// Set when the keyspace is dropped from its database.
    pub(crate) dropped: AtomicBool,
    /// The largest key and value a write may have (`Config::max_key_bytes`,
    /// `Config::max_value_bytes`).
    pub(crate) max_key_bytes: usize,
    pub(crate) max_value_bytes: usize,
    /// The longest value a record keeps itself (`Config::inline_value_limit`, or less
    /// if its log's pages are smaller): longer ones go to `values`.
    pub(crate) inline_value_bytes: usize,
    /// The database's value store.
    pub(crate) values: Arc<ValueStore>,
    /// Set while the database's open replays its log and settles its values: the
    /// compactor thread waits. A compaction that reports a value out of line between
    /// the replay's `mark_live` of it and the replayed write that places its record
    /// would free it under that record (writes compacting as they throttle are safe:
    /// they run in the replay's own order).
    pub(crate) background_paused: AtomicBool,
}

impl Drop for HashAttached {
    fn drop(&mut self) {
        // The store (and its compactor thread) owns its attachment, so the last handle
        // to it is gone: once the keyspace is dropped too, nothing reads or writes its
        // values again (docs/design.md, "Dropped keyspaces").
        if self.dropped.load(Ordering::Acquire) {
            let keyspace = self.keyspace;
            self.values.drop_keyspaces(|k| k == keyspace);
        }
    }
}

impl HashAttached {
    /// `e` with damage named as the issue asks of every file of a database: damage in a
    /// log's file (the log names the file and the address) gets the keyspace's name;
    /// damage on a device without files (simulated ones) names the store's files.
    pub(crate) fn named(&self, e: Error) -> Error {
        let keyspace = &self.name;
        match e {
            Error::CorruptFile { path, reason } => Error::CorruptFile {
                path,
                reason: format!("hash keyspace {keyspace:?}: {reason}"),
            },
            Error::Corrupted { reason, .. } => Error::CorruptFile {
                path: file_prefix(self.keyspace, "*").into(),
                reason: format!("hash keyspace {keyspace:?}: {reason}"),
            },
            other => other,
        }
    }
}

/// What a [`HashStore`] has done since its database was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HashStoreStats {
    /// Hot→cold compactions: the oldest part of the hot log moved to the cold tier (in
    /// [`ColdLayout::Runs`], written as one sorted delta run).
    pub hot_cold_compactions: u64,
    /// Cold→cold compactions: the oldest part of the cold log copied to its tail; in
    /// [`ColdLayout::Runs`], merges of every cold run into one.
    pub cold_cold_compactions: u64,
    /// Compactions of the cold index's chunk log (each cold insert rewrites its key's
    /// chunk at that log's tail; a compaction copies the chunks' newest versions from
    /// its oldest part and drops the rest).
    pub chunk_compactions: u64,
    /// Chunk versions those compactions copied.
    pub chunks_copied: u64,
    /// Records compactions copied (they were their keys' newest).
    pub records_copied: u64,
    /// Records compactions left behind (a newer record of the key existed).
    pub records_dropped: u64,
    /// Writes that found a log past its whole disk budget and compacted before they
    /// returned.
    pub throttled_writes: u64,
    /// Compactions that failed (a device error, a damaged record), a throttled
    /// writer's or the background compactor's. A write never fails because of one: it
    /// had applied when it compacted. Each failure is logged too; the logs may grow past
    /// their budgets until a compaction succeeds.
    pub compaction_failures: u64,
    /// Updates made in place in the hot log's mutable region.
    pub in_place_updates: u64,
    /// Records appended to the hot log.
    pub appended_records: u64,
    /// Records read from disk in the hot log.
    pub hot_disk_reads: u64,
    /// Records read from disk in the cold log; in [`ColdLayout::Runs`], units of cold
    /// runs read by lookups (one per run a lookup could not rule out).
    pub cold_disk_reads: u64,
    /// Cold-index chunks read from disk (none in [`ColdLayout::Runs`]).
    pub chunk_disk_reads: u64,
    /// Disk reads that batched reads ([`HashStore::get_many`] and the async reads of
    /// `bfdb::aio::AsyncHashStore`) made, counted in the three above too.
    pub batched_reads: u64,
    /// Times batched reads waited for the disk, with reads in flight.
    pub batch_waits: u64,
    /// The reads in flight at each of those waits, summed: `batch_in_flight /
    /// batch_waits` is the mean queue depth a batch kept on its thread.
    pub batch_in_flight: u64,
    /// Rebuilds of the hot index at its size, which gave back the overflow buckets its
    /// chains no longer needed (keys that moved to the cold log left them behind).
    pub hot_index_rebuilds: u64,
    /// Reads answered by the read cache (copies of records read from disk).
    pub read_cache_hits: u64,
    /// Copies the read cache took in.
    pub read_cache_inserts: u64,
    /// Records read from disk that the read cache's admission filter kept out: a
    /// record is copied only when its key is read from disk a second time while the
    /// filter remembers the first.
    pub read_cache_not_admitted: u64,
    /// Copies the read cache took of hot-log records that were read while in memory,
    /// as their page left memory (they pass the admission filter: they were read
    /// once already), so that keys only read keep a copy in memory. Counted in
    /// `read_cache_inserts` too.
    pub read_cache_kept: u64,
    /// Device reads compactions read ahead, a batch of them in flight at once (the
    /// cold-index chunks, and for cold→cold copies the cold chains, of up to 128
    /// records a thread copies together), counted in the disk reads above too.
    pub compaction_read_ahead_reads: u64,
    /// Rounds of those batches: `compaction_read_ahead_reads /
    /// compaction_read_ahead_rounds` is their mean queue depth per compaction thread.
    pub compaction_read_ahead_rounds: u64,
    /// Device reads compactions made one at a time: what their read-ahead did not
    /// foresee (a chunk moved to disk meanwhile, a longer chain).
    pub compaction_single_reads: u64,
    /// Wall time compaction passes took, in nanoseconds, from when a pass had the
    /// store's one compaction to its truncation.
    pub compaction_nanos: u64,
    /// Bytes of log compaction passes went over (and truncated):
    /// `compacted_bytes / compaction_nanos` is their throughput.
    pub compacted_bytes: u64,
    /// The most bytes of buffers compaction threads held at once: each thread's copy of
    /// the page it reads and its read-ahead reads. This is compaction's memory outside
    /// [`HashStoreStats::memory_bytes`]; it is bounded by the compaction threads times
    /// a page of the log plus 128 reads.
    pub compaction_buffer_peak_bytes: u64,
    /// Bytes of the hot log (from BEGIN to TAIL).
    pub hot_log_bytes: u64,
    /// Bytes of the cold log (from BEGIN to TAIL); in [`ColdLayout::Runs`], of the cold
    /// runs.
    pub cold_log_bytes: u64,
    /// Bytes of the cold index's chunk log (from BEGIN to TAIL).
    pub chunk_log_bytes: u64,
    /// In [`ColdLayout::Runs`], the cold runs in use (0 in the log layout).
    pub cold_runs: u64,
    /// In [`ColdLayout::Runs`], the bytes of the cold runs in use.
    pub cold_runs_bytes: u64,
    /// In [`ColdLayout::Runs`], the bytes of runs that merges replaced and that are not
    /// given back yet: a kept checkpoint of the database may name them. Once they pass
    /// an eighth of the live runs (and 4 MiB), the database takes checkpoints until they
    /// can go.
    pub cold_runs_dead_bytes: u64,
    /// Bytes of memory of the hot index, the chunk table, the read cache and the three
    /// logs' page frames together (in [`ColdLayout::Runs`], the runs' fences and
    /// filters instead of the cold logs' frames and the chunk table).
    pub memory_bytes: u64,
    /// Bytes of its database's memory budget the store was given when the database
    /// opened (or when it was created): its recorded
    /// [`HashStoreOptions::memory_bytes`], or a proportional share of a smaller budget.
    pub memory_budget_bytes: u64,
}

/// The part of a hash store its compactor thread shares.
struct Inner {
    f2: F2,
    /// The devices of the hot log, the cold log and the chunk log, with their floors.
    floors: [Arc<Retaining>; 3],
    attached: HashAttached,
    /// The bytes of its database's budget the store was given.
    memory_budget_bytes: u64,
}

/// A hash keyspace of a [`Db`](crate::Db): an F2-style store for point reads and writes
/// of skewed workloads larger than memory (Kanellis et al., PVLDB 2025), with no range
/// scans.
///
/// Recently written keys live in a *hot log* in memory and on disk, reached through an
/// in-memory hash index, and are updated in place while they are near its tail;
/// write-cold keys move by compaction to a *cold log* on disk whose index costs under a
/// byte of memory per key. Writes go through the database's write-ahead log at its
/// [`Durability`] levels and may be part of a [`WriteBatch`](crate::WriteBatch); the
/// store is part of the database's checkpoints and is recovered on open. Values may be
/// as long as [`Config::max_value_bytes`](crate::Config::max_value_bytes): one longer
/// than the inline limit is written once to the database's value store and its record
/// holds a reference, as a tree's leaf record does.
///
/// ```
/// use bfdb::{Db, DbOptions};
/// # let dir = tempfile::tempdir()?;
/// let db = Db::open(dir.path(), DbOptions::default())?;
/// let counts = db.hash_store("counts")?;
/// counts.insert(b"apples", &3u64.to_le_bytes())?;
/// // Read-modify-write: adds one, atomically.
/// let add = |old: Option<&[u8]>| {
///     let n = old.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()));
///     (n + 1).to_le_bytes().to_vec()
/// };
/// counts.rmw(b"apples", add)?;
/// counts.rmw(b"pears", add)?;
/// assert_eq!(counts.get(b"apples")?, Some(4u64.to_le_bytes().to_vec()));
/// assert_eq!(counts.get(b"pears")?, Some(1u64.to_le_bytes().to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct HashStore {
    inner: Arc<Inner>,
    /// The background compactor (see [`compactor`]); dropping it stops the thread.
    _compactor: Option<Ticker>,
}

impl std::fmt::Debug for HashStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashStore")
            .field("name", &self.inner.attached.name)
            .finish_non_exhaustive()
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<HashStore>();
};

impl HashStore {
    /// Opens hash keyspace `attached.keyspace` with `layout` and `memory` bytes of its
    /// database's budget on `files`: as `extents`
    /// (a checkpoint's record of it, with `floors` the lowest BEGIN of each log that a
    /// kept checkpoint needs), or empty.
    pub(crate) fn open(
        layout: &HashLayout,
        memory: u64,
        files: HashFiles<'_>,
        extents: Option<(&F2Extents, [u64; 3])>,
        attached: HashAttached,
    ) -> Result<HashStore> {
        layout.check()?;
        let id = attached.keyspace;
        let devices: [Arc<dyn BlockDevice>; 3] = std::array::from_fn(|i| -> Arc<dyn BlockDevice> {
            match &files {
                HashFiles::Dir { dir, direct } => Arc::new(SegmentFiles::new(
                    dir,
                    (&file_prefix(id, LOGS[i]), SEGMENT_EXTENSION),
                    SEGMENT_BYTES,
                    *direct,
                )),
                HashFiles::Sim(sim) => sim.blocks(&file_prefix(id, LOGS[i])),
            }
        });
        let floors_at = extents.map_or([0; 3], |(_, floors)| floors);
        let floors: [Arc<Retaining>; 3] = std::array::from_fn(|i| {
            Arc::new(Retaining::new(Arc::clone(&devices[i]), floors_at[i]))
        });
        let f2_devices = {
            let [hot, cold, chunks] = floors.clone().map(|f| f as Arc<dyn BlockDevice>);
            F2Devices { hot, cold, chunks }
        };
        let options = layout.f2_options(memory)?;
        let f2 = match extents {
            Some((extents, _)) => F2::recover(options, f2_devices, extents),
            None => F2::new(options, f2_devices),
        }
        .map_err(|e| attached.named(e))?;
        let (values, keyspace) = (Arc::clone(&attached.values), attached.keyspace);
        f2.set_on_unreachable(Box::new(move |key, reference| {
            if let Some(r) = ValueRef::decode(reference) {
                values.free(r, keyspace, key);
            }
        }));
        let inner = Arc::new(Inner {
            f2,
            floors,
            attached,
            memory_budget_bytes: memory.min(layout.memory_bytes()),
        });
        let compactor = compactor(&inner);
        Ok(HashStore {
            inner,
            _compactor: compactor,
        })
    }

    /// The bytes of its database's memory budget the store was given.
    pub(crate) fn memory_budget_bytes(&self) -> u64 {
        self.inner.memory_budget_bytes
    }

    /// The store's logs and indexes, for the async reads of [`super::aio`].
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn f2(&self) -> &F2 {
        &self.inner.f2
    }

    /// The keyspace's name.
    pub fn name(&self) -> &str {
        &self.inner.attached.name
    }

    /// The value stored under `key`, if any.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_key(key)?;
        self.inner.attached.journal.check_readable()?;
        self.inner.get(key)
    }

    /// Bytes `offset..offset + len` of the value stored under `key`, as far as the value
    /// reaches (fewer bytes, or none, past its end); `None` if the key is absent. A
    /// value kept out of line is read only in the part asked for (and its checksums),
    /// so a part of a value of many MiB costs about its own bytes.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// let db = bfdb::Db::open(dir.path(), bfdb::DbOptions::default())?;
    /// let blobs = db.hash_store("blobs")?;
    /// let big: Vec<u8> = (0..4_000_000u32).map(|i| i as u8).collect();
    /// blobs.insert(b"video", &big)?;
    /// let part = blobs.get_part(b"video", 1_000_000, 16)?.unwrap();
    /// assert_eq!(part, &big[1_000_000..1_000_016]);
    /// assert_eq!(blobs.get_part(b"video", 3_999_990, 100)?.unwrap().len(), 10);
    /// assert_eq!(blobs.get_part(b"nothing", 0, 1)?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_part(&self, key: &[u8], offset: u64, len: usize) -> Result<Option<Vec<u8>>> {
        self.check_key(key)?;
        self.inner.attached.journal.check_readable()?;
        self.inner.get_part(key, offset, len)
    }

    /// The values stored under `keys`, in the order of `keys`. The answers see any
    /// [`WriteBatch`](crate::WriteBatch) that writes some of `keys` whole or not at
    /// all.
    ///
    /// The reads the keys need from disk are in flight together (F2's pending reads):
    /// every key is looked up in memory first, the records and index chunks they lack
    /// go to the disk together on io_uring, and each lookup goes on as soon as its read
    /// completes, its next read joining those still in flight. A batch of a few dozen
    /// keys of which many miss memory keeps about as many reads at the disk, where
    /// [`HashStore::get`] keeps one.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let db = bfdb::Db::open(dir.path(), bfdb::DbOptions::default())?;
    /// let store = db.hash_store("sessions")?;
    /// store.insert(b"ann", b"1")?;
    /// store.insert(b"bob", b"2")?;
    /// let found = store.get_many(&[&b"bob"[..], b"eve", b"ann"])?;
    /// assert_eq!(found, vec![Some(b"2".to_vec()), None, Some(b"1".to_vec())]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        for key in keys {
            self.check_key(key.as_ref())?;
        }
        let a = &self.inner.attached;
        // The lookups under the keys' stripes (a batch is seen whole or not at all);
        // the values out of line read after, the stripes let go: a value's bytes never
        // change, and the guard keeps their extents from reuse until then.
        let _guard = self.inner.value_guard();
        let found = a
            .journal
            .read_locked(keys.iter().map(|k| (a.keyspace, k.as_ref())), || {
                a.journal.check_readable()?;
                self.inner.read_many(keys)
            })?;
        self.inner.resolve_many(found)
    }

    /// Stores `value` under `key`, replacing any previous value, at the database's
    /// default [`Durability`] ([`DbOptions::durability`](crate::DbOptions::durability)).
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.insert_with(key, value, self.inner.attached.durability)
    }

    /// Stores `value` under `key` at `durability`.
    pub fn insert_with(&self, key: &[u8], value: &[u8], durability: Durability) -> Result<()> {
        self.write(key, Some(value), durability)
    }

    /// Removes `key` (a tombstone: deleting an absent key is fine) at the database's
    /// default durability.
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.delete_with(key, self.inner.attached.durability)
    }

    /// Removes `key` at `durability`.
    pub fn delete_with(&self, key: &[u8], durability: Durability) -> Result<()> {
        self.write(key, None, durability)
    }

    /// Replaces the value of `key` with `update(old)` (`old` is `None` if the key has
    /// none) atomically, at the database's default durability, and returns the new
    /// value. `update` may be called more than once (a try that raced with another
    /// writer starts again); the value of its last call is the one stored.
    pub fn rmw(
        &self,
        key: &[u8],
        update: impl Fn(Option<&[u8]>) -> Vec<u8> + Sync,
    ) -> Result<Vec<u8>> {
        self.rmw_with(key, update, self.inner.attached.durability)
    }

    /// [`HashStore::rmw`] at `durability`. At [`Durability::Unlogged`] the update runs
    /// in the store as FASTER's read-modify-write (in place near the hot log's tail);
    /// at the logged levels it reads, computes, logs and writes while holding the key's
    /// stripe of the database's journal.
    pub fn rmw_with(
        &self,
        key: &[u8],
        update: impl Fn(Option<&[u8]>) -> Vec<u8> + Sync,
        durability: Durability,
    ) -> Result<Vec<u8>> {
        self.check_key(key)?;
        self.check_writable()?;
        let a = &self.inner.attached;
        match durability {
            Durability::Unlogged => a.journal.exclusive(a.keyspace, key, || {
                // F2's read-modify-write, refusing a result it cannot keep inline: then
                // nothing is written (the key keeps its value or its absence). It also
                // writes nothing if the old value is out of line (the update must see
                // the value, not its reference).
                let bounded = Bounded {
                    update: &update,
                    max: self.inline_max(key.len()),
                    refused: AtomicUsize::new(0),
                    out_of_line: AtomicBool::new(false),
                };
                let value = self
                    .inner
                    .with_guard(|g| self.inner.f2.rmw(g, key, &bounded))?;
                if bounded.refused.load(Ordering::Relaxed) == 0
                    && !bounded.out_of_line.load(Ordering::Relaxed)
                {
                    return Ok(value);
                }
                // Read the whole value, compute, write: the stripe, held exclusively,
                // keeps every other write of the key out meanwhile. A result over the
                // limit is refused before anything is written.
                let old = self.inner.get(key)?;
                let new = update(old.as_deref());
                self.check_value(&new)?;
                let reference = self.write_value(key, &new)?;
                self.inner
                    .apply(key, Some(stored(&new, reference.as_deref())))?;
                Ok(new)
            }),
            level => a.journal.commit_computed(
                a.keyspace,
                key,
                level,
                || {
                    let old = self.inner.get(key)?;
                    let new = update(old.as_deref());
                    self.check_value(&new)?;
                    let logged = match self.write_value(key, &new)? {
                        Some(reference) => (reference, true),
                        None => (new.clone(), false),
                    };
                    Ok((Some(logged), new))
                },
                |new| self.inner.apply(key, new),
            ),
        }
    }

    /// Compacts all of the hot log into the cold log and all of the cold log into
    /// itself but for each one's tail page (`F2::compact_all`): for tests that check
    /// what compaction leaves, such as the value store's live bytes.
    #[doc(hidden)]
    pub fn compact_all_for_test(&self) -> Result<()> {
        self.inner.with_guard(|g| self.inner.f2.compact_all(g))
    }

    /// What the store has done since the database was opened.
    pub fn stats(&self) -> HashStoreStats {
        let f2 = &self.inner.f2;
        let s = f2.stats();
        let hot = f2.hot().stats();
        let h = f2.hot().log().addresses();
        let (cold_bytes, chunk_bytes) = match f2.cold_log() {
            Some(cold) => {
                let (c, k) = (
                    cold.log().addresses(),
                    cold.index().chunks().log().addresses(),
                );
                (c.tail - c.begin, k.tail - k.begin)
            }
            None => (f2.log_sizes().1, 0),
        };
        let memory = self.inner.with_guard(|g| {
            let cold = match (f2.cold_log(), f2.cold_runs()) {
                (Some(cold), _) => {
                    let (table, chunk_frames) = cold.index().memory_bytes(g);
                    table + chunk_frames + cold.log().memory_bytes()
                }
                (None, Some(runs)) => runs.memory_bytes(),
                (None, None) => 0,
            };
            Ok(f2.hot().index_size_bytes(g) as u64
                + cold
                + f2.hot().log().memory_bytes()
                + f2.hot().read_cache().map_or(0, |c| c.memory_bytes()))
        });
        let runs = f2.cold_runs().map(|r| r.stats()).unwrap_or_default();
        let (cold_disk_reads, chunk_disk_reads) = match f2.cold_log() {
            Some(cold) => (
                cold.log().record_reads(),
                cold.index().chunks().log().record_reads(),
            ),
            None => (runs.unit_reads, 0),
        };
        HashStoreStats {
            hot_cold_compactions: s.hot_cold_compactions,
            cold_cold_compactions: s.cold_cold_compactions,
            chunk_compactions: s.chunk_compactions,
            chunks_copied: s.chunks_copied,
            records_copied: s.records_copied,
            records_dropped: s.records_dropped,
            throttled_writes: s.throttled_writes,
            compaction_failures: s.compaction_failures,
            in_place_updates: hot.in_place_updates,
            appended_records: hot.appended_records,
            hot_disk_reads: hot.disk_reads,
            cold_disk_reads,
            chunk_disk_reads,
            batched_reads: s.batched_reads,
            batch_waits: s.batch_waits,
            batch_in_flight: s.batch_in_flight,
            hot_index_rebuilds: s.hot_index_rebuilds,
            read_cache_hits: s.read_cache_hits,
            read_cache_inserts: s.read_cache_inserts,
            read_cache_not_admitted: s.read_cache_not_admitted,
            read_cache_kept: s.read_cache_kept,
            compaction_read_ahead_reads: s.compaction_read_ahead_reads,
            compaction_read_ahead_rounds: s.compaction_read_ahead_rounds,
            compaction_single_reads: s.compaction_single_reads,
            compaction_nanos: s.compaction_nanos,
            compacted_bytes: s.compacted_bytes,
            compaction_buffer_peak_bytes: s.compaction_buffer_peak_bytes,
            hot_log_bytes: h.tail - h.begin,
            cold_log_bytes: cold_bytes,
            chunk_log_bytes: chunk_bytes,
            cold_runs: runs.runs,
            cold_runs_bytes: runs.live_bytes,
            cold_runs_dead_bytes: runs.dead_bytes,
            memory_bytes: memory.unwrap_or(0),
            memory_budget_bytes: self.inner.memory_budget_bytes,
        }
    }

    /// Checks `key` as a [`Tree`](crate::Tree) checks its keys: not empty, within the
    /// database's limit. Every entry point (reads, writes, batches, async reads) calls
    /// it, so one rule holds for both kinds of keyspace.
    pub(crate) fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let max = self.inner.attached.max_key_bytes;
        if key.len() > max {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max,
            });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        let max = self.inner.attached.max_value_bytes;
        if value.len() > max {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max,
            });
        }
        Ok(())
    }

    /// Checks `key` and `value` against the database's limits.
    pub(crate) fn check_record(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.check_key(key)?;
        value.map_or(Ok(()), |v| self.check_value(v))
    }

    fn check_writable(&self) -> Result<()> {
        let a = &self.inner.attached;
        if a.dropped.load(Ordering::Acquire) {
            return Err(Error::KeyspaceDropped {
                name: a.name.clone(),
            });
        }
        Ok(())
    }

    fn write(&self, key: &[u8], value: Option<&[u8]>, durability: Durability) -> Result<()> {
        self.check_record(key, value)?;
        self.check_writable()?;
        let a = &self.inner.attached;
        // A long value goes to the value store first: its bytes are written before any
        // record names them (the log syncs the store before a group that could). A write
        // that fails from here on leaves the value pending: only the next open knows
        // whether its log record is there.
        let reference = match value {
            Some(v) => self.store_value(key, v)?,
            None => None,
        };
        let value = value.map(|v| stored(v, reference.as_deref()));
        match durability {
            Durability::Unlogged => a
                .journal
                .unlogged(a.keyspace, key, || self.inner.apply(key, value)),
            level => {
                let op = match value {
                    Some((reference, true)) => LogOpRef::PutExternal {
                        keyspace: a.keyspace,
                        key,
                        reference,
                    },
                    other => LogOpRef::write(a.keyspace, key, other.map(|(v, _)| v)),
                };
                a.journal
                    .commit(&[op], level, || self.inner.apply(key, value))
            }
        }
    }

    /// The longest value a record of a key of `key_len` bytes keeps itself: the
    /// database's inline limit, or what the logs' pages hold if that is less.
    fn inline_max(&self, key_len: usize) -> usize {
        let a = &self.inner.attached;
        a.inline_value_bytes
            .min(self.inner.f2.max_inline_value_bytes(key_len))
    }

    /// Writes `value` to the value store if a record of `key` does not keep it itself
    /// (it is longer than [`HashStore::inline_max`]): its reference if so. It may first
    /// wait for room (`ValueStore::make_room`): the caller holds no stripe or epoch.
    pub(crate) fn store_value(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>> {
        if value.len() > self.inline_max(key.len()) {
            self.inner.attached.values.make_room();
        }
        self.write_value(key, value)
    }

    /// [`HashStore::store_value`] without the wait: for a read-modify-write, which
    /// writes its value holding its key's stripe (a checkpoint's quiesce waits for it).
    fn write_value(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>> {
        if value.len() <= self.inline_max(key.len()) {
            return Ok(None);
        }
        let r = self.inner.attached.values.write(value)?;
        Ok(Some(r.encode().to_vec()))
    }

    /// Writes `key` (deletes it for `None`) with no log record: for recovery's replay
    /// and the database's batches, which log on their own. A value `out_of_line` is
    /// the reference of one the value store holds ([`HashStore::store_value`], or
    /// marked live by recovery).
    pub(crate) fn write_unlogged(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        out_of_line: bool,
    ) -> Result<()> {
        self.inner.apply(key, value.map(|v| (v, out_of_line)))
    }

    /// Whether a record of `key` holds the value out of line `reference` (recovery's
    /// settling of the values a checkpoint left uncertain: `F2::holds_reference`).
    pub(crate) fn holds_reference(&self, key: &[u8], reference: &[u8]) -> Result<bool> {
        self.inner
            .with_guard(|g| self.inner.f2.holds_reference(g, key, reference))
    }

    /// The value store's read guard, if it ever held a value: taken before a lookup
    /// that may find a reference, dropped after its value is read.
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn value_guard(&self) -> Option<crate::storage::ReadGuard> {
        self.inner.value_guard()
    }

    /// What a read found, with a value out of line read from the value store on the
    /// runtime's ring ([`ValueStore::read_on_ring`]), under a guard of
    /// [`HashStore::value_guard`] taken before the lookup.
    #[cfg(feature = "tokio-uring")]
    pub(crate) async fn resolve_on_ring(&self, found: Option<LogValue>) -> Result<Option<Vec<u8>>> {
        let Some(found) = found else {
            return Ok(None);
        };
        if !found.out_of_line {
            return Ok(Some(found.bytes));
        }
        let r = self.inner.reference(&found.bytes)?;
        let mut value = Vec::new();
        self.inner
            .attached
            .values
            .read_on_ring(&r, &mut value)
            .await?;
        Ok(Some(value))
    }

    /// The attachment to the database.
    pub(crate) fn attached(&self) -> &HashAttached {
        &self.inner.attached
    }

    /// Captures the store for a checkpoint ([`F2::checkpoint`]).
    pub(crate) fn checkpoint(&self) -> Result<F2Extents> {
        self.inner.with_guard(|g| self.inner.f2.checkpoint(g))
    }

    /// Whether the kept checkpoints hold more of some log on disk, below its BEGIN,
    /// than that log's budget. The `Db`'s checkpointer then takes a checkpoint, whose
    /// floors let that space go: without it a store written only without logging (which
    /// grows no write-ahead log, so neither checkpoint trigger fires) would keep every
    /// segment its compactions freed until the next checkpoint.
    pub(crate) fn holds_past_budget(&self) -> bool {
        let f2 = &self.inner.f2;
        if f2.cold_runs().is_some_and(|r| r.dead_past_share()) {
            return true;
        }
        let (budgets, begins) = (f2.log_budgets(), f2.log_begins());
        self.inner
            .floors
            .iter()
            .zip(budgets.into_iter().zip(begins))
            .any(|(device, (budget, begin))| device.held_below(begin) > budget)
    }

    /// Lets the devices give up what is below `floors` (the lowest BEGIN of each log
    /// that a kept checkpoint needs).
    pub(crate) fn retain_from(&self, floors: [u64; 3]) -> Result<()> {
        for (device, floor) in self.inner.floors.iter().zip(floors) {
            device.retain_from(floor).map_err(Error::Io)?;
        }
        // In the runs layout the third floor is the oldest kept checkpoint's moment
        // (`F2::checkpoint`): runs that died before it are given back.
        self.inner.f2.release_cold(floors[2]);
        Ok(())
    }
}

impl Inner {
    /// Runs `f` under a guard of the store's epoch.
    fn with_guard<T>(
        &self,
        f: impl FnOnce(&mut super::epoch::EpochGuard<'_, '_>) -> Result<T>,
    ) -> Result<T> {
        let mut handle = self.f2.epoch().register();
        let mut guard = handle.protect();
        f(&mut guard).map_err(|e| self.attached.named(e))
    }

    /// The value of `key`. A value out of line is read once the lookup has left the
    /// epoch, under the value store's read guard taken before it: a checkpoint's
    /// release of a freed extent waits for the guard, so the extent is not reused
    /// before the read.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let _guard = self.value_guard();
        let found = self.with_guard(|g| self.f2.read(g, key))?;
        self.resolve(found)
    }

    /// Bytes `offset..offset + len` of `key`'s value, as [`HashStore::get_part`] says:
    /// found as `get` finds it, then cut, or read in part from the value store.
    fn get_part(&self, key: &[u8], offset: u64, len: usize) -> Result<Option<Vec<u8>>> {
        let _guard = self.value_guard();
        let Some(found) = self.with_guard(|g| self.f2.read(g, key))? else {
            return Ok(None);
        };
        // The part's bounds within a value of `total` bytes.
        let bounds = |total: u64| {
            let end = offset.saturating_add(len as u64).min(total);
            (offset.min(end), end)
        };
        if !found.out_of_line {
            let (start, end) = bounds(found.bytes.len() as u64);
            return Ok(Some(found.bytes[start as usize..end as usize].to_vec()));
        }
        let r = self.reference(&found.bytes)?;
        let (start, end) = bounds(u64::from(r.len));
        let mut part = Vec::new();
        self.attached
            .values
            .read_range(&r, start, (end - start) as usize, &mut part)?;
        Ok(Some(part))
    }

    /// What the records of `keys` hold, their device reads in flight together (the
    /// values out of line, read with [`Inner::resolve`] under a guard taken before,
    /// are read one after another).
    fn read_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<LogValue>>> {
        self.f2
            .read_many(&mut self.f2.epoch().register(), keys)
            .map_err(|e| self.attached.named(e))
    }

    fn value_guard(&self) -> Option<crate::storage::ReadGuard> {
        let values = &self.attached.values;
        values.holds_values().then(|| values.read_guard())
    }

    fn resolve(&self, found: Option<LogValue>) -> Result<Option<Vec<u8>>> {
        let Some(found) = found else {
            return Ok(None);
        };
        if !found.out_of_line {
            return Ok(Some(found.bytes));
        }
        let r = self.reference(&found.bytes)?;
        let mut value = Vec::new();
        self.attached.values.read(&r, &mut value)?;
        Ok(Some(value))
    }

    /// `resolve` of every answer of a `get_many`, the values out of line read together
    /// (`ValueStore::read_many`).
    fn resolve_many(&self, found: Vec<Option<LogValue>>) -> Result<Vec<Option<Vec<u8>>>> {
        let mut results = Vec::with_capacity(found.len());
        let (mut at, mut refs) = (Vec::new(), Vec::new());
        for (i, f) in found.into_iter().enumerate() {
            match f {
                Some(f) if f.out_of_line => {
                    refs.push(self.reference(&f.bytes)?);
                    at.push(i);
                    results.push(None);
                }
                f => results.push(f.map(|f| f.bytes)),
            }
        }
        let mut outs = vec![Vec::new(); refs.len()];
        self.attached.values.read_many(&refs, &mut outs)?;
        for (i, out) in at.into_iter().zip(outs) {
            results[i] = Some(out);
        }
        Ok(results)
    }

    /// The reference an out-of-line record holds.
    fn reference(&self, bytes: &[u8]) -> Result<ValueRef> {
        ValueRef::decode(bytes).ok_or_else(|| {
            self.attached.named(Error::Corrupted {
                page: 0,
                reason: format!(
                    "a record's out-of-line value reference does not decode ({} bytes)",
                    bytes.len()
                ),
            })
        })
    }

    /// Writes `key`'s value (`true`: the reference of a value out of line), or deletes
    /// it. The value store hears `applied` right after the record is linked, before
    /// the guard is refreshed: a checkpoint whose capture holds the record flushed the
    /// hot log after every thread refreshed, so after `applied`.
    fn apply(&self, key: &[u8], value: Option<(&[u8], bool)>) -> Result<()> {
        let (bytes, out_of_line) = match value {
            Some((v, out_of_line)) => (Some(v), out_of_line),
            None => (None, false),
        };
        let a = &self.attached;
        let mut placed = || {
            if let Some(r) = bytes.filter(|_| out_of_line).and_then(ValueRef::decode) {
                a.values.applied(r, a.keyspace, key);
            }
        };
        self.with_guard(|g| {
            self.f2
                .upsert_value(g, key, bytes, out_of_line, &mut placed)
        })
    }
}

/// A value as a write stores it: its bytes, or (`true`) its `reference` if it has one.
fn stored<'a>(value: &'a [u8], reference: Option<&'a [u8]>) -> (&'a [u8], bool) {
    match reference {
        Some(r) => (r, true),
        None => (value, false),
    }
}

/// An unlogged read-modify-write's update as F2 runs it: a result longer than a record
/// keeps inline is refused (F2 writes nothing), and its length kept; an old value out
/// of line is not handed to the update. Either way the caller goes on without F2.
struct Bounded<'a, F> {
    update: &'a F,
    max: usize,
    /// The length of the last result if it was refused, else 0.
    refused: AtomicUsize,
    /// Whether the last try met an old value out of line.
    out_of_line: AtomicBool,
}

impl<F: Fn(Option<&[u8]>) -> Vec<u8> + Sync> Update for Bounded<'_, F> {
    fn update(&self, old: Option<&[u8]>) -> Vec<u8> {
        self.out_of_line.store(false, Ordering::Relaxed);
        (self.update)(old)
    }

    fn out_of_line(&self) -> Vec<u8> {
        self.out_of_line.store(true, Ordering::Relaxed);
        self.refused.store(0, Ordering::Relaxed);
        Vec::new()
    }

    fn refuses(&self, new: &[u8]) -> bool {
        // The last try's result decides: a try that raced and started again refused or
        // stored nothing.
        let over = new.len() > self.max;
        self.refused
            .store(if over { new.len() } else { 0 }, Ordering::Relaxed);
        over
    }
}

/// How often the compactor looks at the logs' sizes.
const COMPACTOR_TICK: Duration = Duration::from_millis(20);

/// Starts the store's compactor: every tick it compacts whichever log is past its
/// threshold, while that helps (see `F2::maybe_compact`).
fn compactor(inner: &Arc<Inner>) -> Option<Ticker> {
    let journal = Arc::downgrade(&inner.attached.journal);
    let name = inner.attached.name.clone();
    let on_panic = move |why: String| {
        if let Some(journal) = journal.upgrade() {
            journal.fail(
                &format!("hash keyspace {name:?}'s compactor panicked: {why}"),
                false,
            );
        }
    };
    let inner = Arc::clone(inner);
    Ticker::start(
        "bfdb-hash-compactor",
        COMPACTOR_TICK,
        on_panic,
        move |stopping| {
            // A dropped keyspace's files are gone: nothing to compact.
            if inner.attached.dropped.load(Ordering::Acquire) {
                return false;
            }
            if inner.attached.background_paused.load(Ordering::Acquire) {
                return true;
            }
            loop {
                match inner.with_guard(|g| inner.f2.maybe_compact(g)) {
                    Ok(true) if !stopping() => {}
                    Ok(_) => return true,
                    Err(e) => {
                        let whose = format!("the compactor's (keyspace {:?})", inner.attached.name);
                        inner.f2.note_compaction_failure(&whose, &e);
                        return true;
                    }
                }
            }
        },
    )
}
