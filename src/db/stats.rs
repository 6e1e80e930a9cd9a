//! What a database reports: [`RecoveryStats`] (what its open did), [`LostLog`] (the
//! log a rollback gave up) and [`DbStats`] (what it has done since).

use std::time::Duration;

// Named by the docs' links only.
#[cfg(doc)]
use super::{Db, DbOptions};

/// What recovery did when the database was opened ([`Db::recovery`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryStats {
    /// The generation of the checkpoint the database was loaded from; 0 if none.
    pub checkpoint: u64,
    /// Checkpoints named by the manifest whose files did not validate, so that recovery
    /// fell back to an older one (and a longer replay). Each is also logged as a
    /// warning, with its file and what is wrong.
    ///
    /// Recovery falls back only on proven damage (a file that is missing, fails its
    /// checksum, or does not decode), and only if the log still holds every record the
    /// older checkpoint needs; an IO error reading a checkpoint fails the open instead,
    /// since the same read may succeed later and the newest checkpoint may hold
    /// unlogged writes nothing else has.
    pub checkpoint_fallbacks: u64,
    /// Why each checkpoint counted in [`RecoveryStats::checkpoint_fallbacks`] (and any
    /// older one that did not validate either) was not used: its file and what is
    /// wrong with it.
    pub damaged_checkpoints: Vec<String>,
    /// Set only when [`DbOptions::accept_rollback`] let a database open whose log did
    /// not hold everything its checkpoints needed: the database is then older than
    /// what was acknowledged, and this says which log records were missing.
    pub rolled_back: Option<LostLog>,
    /// Leaf pages the checkpoint recorded, over all keyspaces.
    pub leaf_pages: u64,
    /// Log records (single writes and batches) replayed.
    pub records_replayed: u64,
    /// Writes of live keyspaces read from the log.
    pub writes_replayed: u64,
    /// Of those, writes followed by a later write of the same key in the replayed log:
    /// recovery applies each key's last write only.
    pub writes_superseded: u64,
    /// Logged writes of keyspaces dropped since: not replayed.
    pub writes_skipped: u64,
    /// Bytes of log read from the checkpoint's position to the end.
    pub log_bytes: u64,
    /// Bytes of the log's torn tail: what a crash left half-written, never acknowledged
    /// as synced, and discarded.
    pub discarded_bytes: u64,
    /// Complete records found in the torn tail's blocks and discarded with it (records
    /// that a crash separated from the log before them).
    pub discarded_records: u64,
    /// Wall time from the start of `Db::open` to the database being ready.
    pub duration: Duration,
}

/// The part of the log a recovery needed and did not find
/// ([`RecoveryStats::rolled_back`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostLog {
    /// The checkpoint recovery loaded.
    pub checkpoint: u64,
    /// The first sequence number of the log records it needed.
    pub first_seq: u64,
    /// One past the last sequence number it needed: every record below was durable
    /// when the newest checkpoint committed.
    pub end_seq: u64,
    /// One past the last sequence number the log still held from `first_seq` on
    /// (`first_seq` if it held none of them).
    pub found_end_seq: u64,
}

/// What a database has done since it was opened ([`Db::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DbStats {
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// The generation of the newest committed checkpoint; 0 if none.
    pub checkpoint_generation: u64,
    /// Wall time of the last checkpoint.
    pub last_checkpoint_duration: Duration,
    /// Leaf pages the last checkpoint recorded.
    pub last_checkpoint_leaf_pages: u64,
    /// Dirty mini-pages the committed checkpoints merged into their leaf pages.
    pub checkpoint_pages_merged: u64,
    /// Dirty mini-pages the committed checkpoints left dirty, because every write they
    /// held was logged since the previous checkpoint began (background checkpoints;
    /// see [`DbOptions::checkpoint_log_bytes`]).
    pub checkpoint_pages_left_dirty: u64,
    /// Log bytes from the newest checkpoint's replay start to the log's end: what a
    /// recovery now would read.
    pub log_bytes_since_checkpoint: u64,
    /// The database's memory budget (`config.memory_budget_bytes`, rounded down to a
    /// multiple of 8): the hash stores' memory, the value cache and the trees' pool
    /// together.
    pub memory_budget_bytes: u64,
    /// The part of the budget the hash stores were given
    /// ([`HashStoreStats::memory_budget_bytes`](crate::HashStoreStats::memory_budget_bytes)
    /// summed).
    pub hash_memory_bytes: u64,
    /// The part of the budget the value cache was given: of what the hash stores leave,
    /// the fraction of the stored bytes kept out of line, up to
    /// [`Config::value_cache_percent`](crate::Config::value_cache_percent), once the
    /// database holds such a value (0 before); it moves with the data.
    pub value_cache_capacity_bytes: u64,
    /// The rest: bytes the tree keyspaces' mini-pages may take in their one pool.
    pub tree_memory_bytes: u64,
    /// Bytes of that pool in use now, by every tree keyspace together.
    pub memory_in_use_bytes: u64,
    /// Bytes of the pool's memory given back to the operating system since the
    /// database opened, because hash stores took part of the budget (the pool gives
    /// back what it no longer spans as it turns over).
    pub tree_memory_released_bytes: u64,
    /// Bytes of the values kept out of line that records reference (their lengths).
    pub value_store_live_bytes: u64,
    /// Values kept out of line that records reference.
    pub value_store_live_values: u64,
    /// Bytes of the value file's extents in use, whatever their state (each value
    /// rounded up to 4 KiB, with a checksum table past 64 KiB).
    pub value_store_allocated_bytes: u64,
    /// Bytes of values overwritten or deleted whose extents are not reusable yet: a
    /// kept checkpoint may still reference them (reusable two checkpoints later).
    pub value_store_deferred_bytes: u64,
    /// Bytes of the value file's address space: the most it takes on disk.
    pub value_store_file_bytes: u64,
    /// Bytes the value cache holds now: its values' allocations and its bookkeeping,
    /// never more than
    /// [`value_cache_capacity_bytes`](DbStats::value_cache_capacity_bytes).
    pub value_cache_bytes: u64,
    /// Values the value cache holds now.
    pub value_cache_values: u64,
    /// Reads of values kept out of line (whole values, or parts of them) that the value
    /// cache answered since the database opened.
    pub value_cache_hits: u64,
    /// Reads of values kept out of line that the value cache could have held but did
    /// not, and so read the value file; reads of values too large for the cache (over
    /// a thirty-second of its capacity) count as neither.
    pub value_cache_misses: u64,
}
