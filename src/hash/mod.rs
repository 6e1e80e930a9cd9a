//! The hash tier: an F2-style store for skewed point workloads (Kanellis et al., PVLDB
//! 2025), built on FASTER's hybrid log and hash index (Chandramouli et al., SIGMOD 2018).
//!
//! A `HashStore` keeps hot records in a *hot log* (a HybridLog: one
//! address space over in-memory pages and disk, updated in place near the tail), reached
//! through the *hot index* below; write-cold records move by lookup-based compaction to a
//! mostly-on-disk *cold log* with a two-level cold index; a *read cache* holds copies of
//! read-hot records from disk. Threads coordinate page flushes, page closes, index growth
//! and memory reclamation through *epoch protection with trigger actions*.
//!
//! The modules:
//!
//! - [`epoch`]: the epoch framework (per-thread slots, protect / refresh / bump with a
//!   trigger action / unprotect, the drain list, the safe-to-reclaim epoch).
//! - [`bucket`]: the hot index's layout (8-byte entries of address, tag and tentative
//!   bit; 64-byte buckets of seven entries and an overflow pointer; the overflow-bucket
//!   allocator; one table).
//! - [`index`]: the hot index's protocols: find, the latch-free two-phase
//!   find-or-create, the entry slot an operation compare-and-swaps its record address
//!   into, and doubling while operations continue.
//! - [`record`], [`hlog`]: the HybridLog's records and the log itself (tail
//!   allocation, the regions, flush and close through trigger actions); its disk is a
//!   storage-layer block device (`storage::BlockDevice`: segment files, memory, the
//!   simulated one).
//! - [`hot`]: the hot log with its index, FASTER's store (get, upsert, delete,
//!   read-modify-write).
//! - [`cold`]: the cold log and its two-level index of hash chunks.
//! - [`f2`]: F2's operations across both logs, and lookup-based compaction from the hot
//!   log to the cold log, within the cold log and within the chunk log.
//! - [`read_cache`]: F2's read cache: copies of records read from disk in a log of page
//!   frames of their own, each at the head of its hot chain (an entry names a copy by
//!   address bit 47; at most one per chain), linked only if no write came since the
//!   original was read, unlinked by every write of the chain, re-copied to the tail when
//!   read again in the older half, and evicted page by page by compare-and-swap.
//! - [`pending`]: pending reads: a batch's lookups in rounds, each round's disk reads in
//!   flight together.
//! - [`checkpoint`]: a store's record in a database checkpoint, and its bytes.
//! - [`store`]: the public `HashStore`, a keyspace of the `Db` (options and the memory
//!   split, files, writes through the journal, checkpoints and recovery, the background
//!   compactor); `aio` (feature `tokio-uring`): its async reads.
//!
//! Dependencies: `hash` uses `sync`, `error`, `journal` and `storage`; nothing below it
//! uses `hash`.

#[cfg(feature = "tokio-uring")]
pub(crate) mod aio;
pub(crate) mod bucket;
pub(crate) mod checkpoint;
pub(crate) mod cold;
pub(crate) mod cold_runs;
pub(crate) mod epoch;
pub(crate) mod f2;
pub(crate) mod hlog;
pub(crate) mod hot;
pub(crate) mod index;
pub(crate) mod pending;
pub(crate) mod read_cache;
pub(crate) mod record;
pub(crate) mod runs;
pub(crate) mod store;

#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests;
#[cfg(test)]
mod test_support;
#[cfg(all(test, not(feature = "shuttle")))]
mod tests;
