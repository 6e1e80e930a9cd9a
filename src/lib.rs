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
//! - `HashStore` — an F2-style hash tier for skewed point workloads. (Later.)
//!
//! ## Example
//!
//! ```
//! use bfdb::{Config, Tree};
//!
//! // A tree on a new file; `Tree::in_memory(config)` keeps the leaf pages in memory.
//! let dir = std::env::temp_dir().join(format!("bfdb-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("example.bfdb");
//! # let _ = std::fs::remove_file(&path);
//! let config = Config {
//!     memory_budget_bytes: 1 << 20, // the pool of mini-pages: 1 MiB
//!     ..Config::default()
//! };
//! let tree = Tree::open(&path, config)?;
//!
//! tree.insert(b"apple", b"red")?;
//! tree.insert(b"cherry", b"dark red")?;
//! tree.delete(b"banana")?; // deleting an absent key is fine
//! assert_eq!(tree.get(b"apple")?.as_deref(), Some(&b"red"[..]));
//!
//! let keys: Vec<Vec<u8>> = tree
//!     .range(&b"a"[..]..&b"d"[..])
//!     .map(|record| record.map(|(key, _value)| key))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(keys, [b"apple".to_vec(), b"cherry".to_vec()]);
//! tree.flush()?; // merge buffered writes into leaf pages and sync the file
//! println!("{:?}", tree.stats().backend); // "io_uring", "std_direct" or "std"
//!
//! drop(tree);
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Config`] holds the knobs (memory budget, promotion rates, key and value limits,
//! backend), [`Error`] every failure that is not a bug, and [`TreeStats`] what a tree
//! did.
//!
//! ## The layers underneath
//!
//! Public for those who build on them, not needed to use a [`Tree`]:
//!
//! - [`storage`]: the [`storage::PageStore`] trait, through which every byte of disk IO
//!   goes, with an in-memory, a file (`pread`/`pwrite` or io_uring, optionally
//!   `O_DIRECT`) and a fault-injecting backend. Every page on disk carries a CRC-32C
//!   checksum that is checked on every read.
//! - [`wal`]: the write-ahead log (checksummed records, group commit, recovery's reading
//!   up to a torn tail) over the [`storage::LogDevice`] segments; the durable `Db` that
//!   will write through it is not built yet.
//! - [`pool`]: the circular-buffer pool that holds mini-pages inside a fixed memory
//!   budget and evicts from its head through a caller-supplied callback.
//! - [`tree::node`]: the one byte layout shared by mini-pages, leaf pages and inner
//!   nodes — fence keys, prefix compression, look-ahead bytes, four record types.
//!
//! ## Layering
//!
//! Dependencies point one way: `tree` (and later `hash`) use `pool`, `storage` and
//! `config`; `wal` uses `storage`; `pool` and `storage` use nothing else of this crate except the `sync` shim
//! (std or, under the `shuttle` feature, shuttle's primitives); `config` uses only
//! `error`. `storage` never knows what a page contains; `pool` never knows what a block
//! holds.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(rust_2018_idioms)]

pub mod config;
mod db;
pub mod error;
mod journal;
pub mod pool;
pub mod storage;
// Public only so that tests can drive the crate's own primitives under shuttle; not
// part of the API.
#[doc(hidden)]
pub mod sync;
pub mod tree;
pub mod wal;

pub use config::{Backend, Config};
pub use db::{CheckpointCrashPoint, Db, DbOptions, DbStats, RecoveryStats, WriteBatch};
pub use error::{Error, Result};
pub use journal::Durability;
#[cfg(feature = "tokio-uring")]
pub use tree::aio;
pub use tree::{Cursor, Range, Tree, TreeStats};

/// The README's code blocks, compiled and run as doctests so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
