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
//! Underneath, and public for those who build on them:
//!
//! - [`storage`]: the [`storage::PageStore`] trait, through which every byte of disk IO
//!   goes, with an in-memory and a file backend (optionally `O_DIRECT`). Every page on
//!   disk carries a CRC-32C checksum that is checked on every read.
//! - [`tree::node`]: the one byte layout shared by mini-pages, leaf pages and inner
//!   nodes — fence keys, prefix compression, look-ahead bytes, four record types.
//! - [`pool`]: the circular-buffer pool that holds mini-pages inside a fixed memory
//!   budget and evicts from its head through a caller-supplied callback.
//!
//! ## Layering
//!
//! Dependencies point one way: `tree` (and later `hash`) use `pool` and `storage`;
//! `pool` and `storage` use nothing else of this crate except the [`sync`] shim.
//! `storage` never knows what a page contains; `pool` never knows what a block holds.
//!
//! ## Example
//!
//! ```
//! use bfdb::storage::{MemoryStore, Page, PageStore};
//!
//! let store = MemoryStore::new();
//! let no = store.allocate()?;
//! let mut page = Page::zeroed();
//! page.payload_mut()[..5].copy_from_slice(b"hello");
//! store.write_page(no, &mut page)?;
//!
//! let mut back = Page::zeroed();
//! store.read_page(no, &mut back)?;
//! assert_eq!(&back.payload()[..5], b"hello");
//! # Ok::<(), std::io::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(rust_2018_idioms)]

pub mod config;
pub mod error;
pub mod pool;
pub mod storage;
pub mod sync;
pub mod tree;

pub use config::{Backend, Config};
pub use error::{Error, Result};
#[cfg(feature = "tokio-uring")]
pub use tree::aio;
pub use tree::{Cursor, Range, Tree, TreeStats};

/// The README's code blocks, compiled and run as doctests so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
