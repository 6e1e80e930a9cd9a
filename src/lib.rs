//! # bfdb
//!
//! An embedded, concurrent, larger-than-memory key-value storage engine.
//!
//! bfdb offers two index kinds over one storage layer:
//!
//! - [`Tree`] — a Bf-Tree range index (Hao and Chandramouli, PVLDB 2024): inner nodes
//!   pinned in memory under optimistic latch coupling, a mapping table whose entries
//!   point either at a variable-length *mini-page* in a circular-buffer pool or at a
//!   4 KiB *leaf page* on disk.
//! - [`HashStore`] — an F2-style hash tier for skewed point workloads (Kanellis et al.,
//!   PVLDB 2025): a hot log and hot index in memory over FASTER's HybridLog, a cold log
//!   on disk with a two-level cold index, a read cache, and lookup-based compaction.
//!
//! ## Example
//!
//! ```
//! use bfdb::{Db, DbOptions, Durability, WriteBatch};
//!
//! let dir = std::env::temp_dir().join(format!("bfdb-doc-{}", std::process::id()));
//! # let _ = std::fs::remove_dir_all(&dir);
//! // A database directory: created on first use, recovered on every open.
//! let db = Db::open(&dir, DbOptions::default())?;
//! let fruit = db.tree("fruit")?; // a named ordered keyspace
//!
//! fruit.insert(b"apple", b"red")?; // logged, durable within a few milliseconds
//! fruit.insert_with(b"cherry", b"dark red", Durability::Synced)?; // durable on return
//! fruit.delete(b"banana")?; // deleting an absent key is fine
//!
//! let mut batch = WriteBatch::new(); // all or nothing, even after a crash
//! batch.insert(&fruit, b"damson", b"purple");
//! batch.delete(&fruit, b"apple");
//! db.write(batch)?;
//!
//! let keys: Vec<Vec<u8>> = fruit
//!     .range(&b"a"[..]..&b"e"[..])
//!     .map(|record| record.map(|(key, _value)| key))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(keys, [b"cherry".to_vec(), b"damson".to_vec()]);
//! drop((fruit, db)); // a clean close takes a checkpoint
//!
//! let db = Db::open(&dir, DbOptions::default())?;
//! assert_eq!(db.tree("fruit")?.get(b"damson")?.as_deref(), Some(&b"purple"[..]));
//! drop(db);
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Db`] is the durable front door: named keyspaces, one write-ahead log with the
//! [`Durability`] levels, atomic [`WriteBatch`]es, checkpoints and recovery on open. A
//! [`Tree`] on its own (`Tree::in_memory`) is the same index without a log.
//! [`Config`] holds the knobs (memory budget, promotion rates, key and value limits,
//! backend), [`Error`] every failure that is not a bug, and [`TreeStats`] what a tree
//! did.
//!
//! ## The layers underneath
//!
//! Public for those who build on them, not needed to use a [`Tree`]:
//!
//! - [`storage`]: the layer every byte of disk IO goes through: the
//!   [`storage::PageStore`] trait, with an in-memory, a file (`pread`/`pwrite` or
//!   io_uring, optionally `O_DIRECT`) and a fault-injecting backend; the log devices;
//!   and the block devices the hash tier's logs live on. Every page on disk carries a
//!   CRC-32C checksum that is checked on every read.
//! - [`wal`]: the write-ahead log (checksummed records, group commit, recovery's reading
//!   up to a torn tail, truncation behind checkpoints) over the [`storage::LogDevice`]
//!   segments, which the [`Db`] writes through.
//! - [`pool`]: the circular-buffer pool that holds mini-pages inside a fixed memory
//!   budget and evicts from its head through a caller-supplied callback.
//! - [`tree::node`]: the one byte layout shared by mini-pages, leaf pages and inner
//!   nodes — fence keys, prefix compression, look-ahead bytes, four record types.
//!
//! ## Layering
//!
//! Dependencies point one way: `db` uses `tree`, `journal`, `wal` and `storage`;
//! `tree` (and later `hash`) use `journal`, `pool`, `storage` and `config`; `journal`
//! uses `wal`; `wal` uses `storage`; `pool` and `storage` use nothing else of this crate except the `sync` shim
//! (std or, under the `shuttle` feature, shuttle's primitives) — but the value store
//! (`storage/values.rs`), which also returns the crate's `error`; `config` uses only
//! `error`; `hash` uses `storage` for all its disk IO. `storage` never knows what a page
//! or block contains; `pool` never knows what a block holds.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(rust_2018_idioms)]

pub mod config;
mod db;
pub mod error;
// Some of the hash tier's items serve only its unit and shuttle tests (test
// constructors such as `HlogOptions::with_memory`, inspection such as the epoch's
// `registered_threads`, one-tier compactions): unused in a build without them.
#[cfg_attr(any(not(test), feature = "shuttle"), allow(dead_code))]
mod hash;
mod journal;
pub mod pool;
pub mod storage;
// Public only so that tests can drive the crate's own primitives under shuttle; not
// part of the API.
#[doc(hidden)]
pub mod sync;
mod ticker;
pub mod tree;
pub mod wal;

pub use config::{Backend, Config};
#[doc(hidden)]
pub use db::fuzz_decode_files;
pub use db::{CheckpointCrashPoint, Db, DbOptions, DbStats, LostLog, RecoveryStats, WriteBatch};
pub use error::{Error, Result};
pub use hash::f2::ColdLayout;
pub use hash::store::{HashStore, HashStoreOptions, HashStoreStats};
pub use journal::Durability;
#[cfg(feature = "tokio-uring")]
pub mod aio;
pub use tree::{Cursor, Range, Tree, TreeStats};

/// The README's code blocks, compiled and run as doctests so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
