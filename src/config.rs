//! Configuration of a [`Tree`](crate::Tree).
//!
//! The defaults work without tuning; [`Config::validate`] (called by every constructor)
//! rejects combinations that could not work, with an [`Error::InvalidConfig`] that says why.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};
use crate::storage::{FileOptions, FileStore, IoEngine, PAGE_PAYLOAD_SIZE};
use crate::tree::node::{KV_META_SIZE_BYTES, NODE_META_SIZE_BYTES};

/// Where a file-backed tree's pages go and how they are read and written.
///
/// Every choice that asks for `O_DIRECT` falls back to buffered IO where the filesystem
/// refuses it, and says so in [`TreeStats::backend_notice`](crate::TreeStats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Backend {
    /// `pread`/`pwrite` through the OS page cache.
    Std,
    /// `pread`/`pwrite` with `O_DIRECT`: the pool is the only cache of leaf pages, so the
    /// memory budget is honest. [`TreeStats::direct_io`](crate::TreeStats) tells whether
    /// `O_DIRECT` is active.
    StdDirect,
    /// io_uring with `O_DIRECT`, one ring per thread (see
    /// [`storage::uring`](crate::storage::uring)). Opening fails with
    /// [`Error::Unsupported`] where the kernel refuses io_uring (old kernel, seccomp,
    /// `kernel.io_uring_disabled`).
    IoUring,
    /// [`Backend::IoUring`] where the kernel allows it, else [`Backend::StdDirect`]; the
    /// fallback is logged once (`log::warn!`) and reported in
    /// [`TreeStats::backend_notice`](crate::TreeStats).
    #[default]
    Auto,
}

/// What a tree's page store runs on, as decided when it was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ActiveBackend {
    /// `"memory"`, `"std"`, `"io_uring"` or `"custom"` (a caller's page store).
    pub(crate) name: &'static str,
    /// Whether leaf pages bypass the OS page cache.
    pub(crate) direct_io: bool,
    /// Why the backend differs from what the configuration asked for, if it does.
    pub(crate) notice: Option<String>,
}

impl ActiveBackend {
    /// A tree whose leaf pages live in a memory store.
    pub(crate) fn memory() -> ActiveBackend {
        ActiveBackend {
            name: "memory",
            direct_io: false,
            notice: None,
        }
    }

    /// A tree over a page store the caller built.
    pub(crate) fn custom() -> ActiveBackend {
        ActiveBackend {
            name: "custom",
            direct_io: false,
            notice: None,
        }
    }
}

/// Set once the io_uring fallback has been logged, so a process that opens many trees
/// says it once.
static WARNED_IO_URING: AtomicBool = AtomicBool::new(false);
/// Set once the buffered-IO fallback has been logged.
static WARNED_O_DIRECT: AtomicBool = AtomicBool::new(false);

/// Logs `notice` unless `flag` says it was logged before.
fn warn_once(flag: &AtomicBool, notice: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        log::warn!("bfdb: {notice}");
    }
}

/// Opens the file store at `path` on the backend `config` chooses, falling back as
/// [`Backend`] describes.
pub(crate) fn open_file_store(path: &Path, config: &Config) -> Result<(FileStore, ActiveBackend)> {
    let mut notices = Vec::new();
    let (engine, direct_io) = match config.backend {
        Backend::Std => (IoEngine::Pread, false),
        Backend::StdDirect => (IoEngine::Pread, true),
        Backend::IoUring => match crate::storage::uring::probe() {
            Ok(()) => (IoEngine::IoUring, true),
            Err(e) => {
                return Err(Error::Unsupported(format!(
                    "the io_uring backend was asked for, but the kernel refuses it: {e}"
                )));
            }
        },
        Backend::Auto => match crate::storage::uring::probe() {
            Ok(()) => (IoEngine::IoUring, true),
            Err(e) => {
                let notice = format!("io_uring is not available ({e}); using pread/pwrite");
                warn_once(&WARNED_IO_URING, &notice);
                notices.push(notice);
                (IoEngine::Pread, true)
            }
        },
    };
    let options = FileOptions::default()
        .direct_io(direct_io)
        .io_engine(engine)
        .sqpoll(config.io_uring_sqpoll);
    let store = FileStore::open(path, options)?;
    if direct_io && !store.direct_io_active() {
        let notice = format!(
            "the filesystem of {} refuses O_DIRECT; using buffered IO through the OS page \
             cache, which the memory budget does not bound",
            path.display()
        );
        warn_once(&WARNED_O_DIRECT, &notice);
        notices.push(notice);
    }
    let active = ActiveBackend {
        name: match engine {
            IoEngine::IoUring => "io_uring",
            _ => "std",
        },
        direct_io: store.direct_io_active(),
        notice: (!notices.is_empty()).then(|| notices.join("; ")),
    };
    Ok((store, active))
}

/// Tuning knobs of a [`Tree`](crate::Tree).
///
/// ```
/// let config = bfdb::Config {
///     memory_budget_bytes: 16 << 20,
///     ..bfdb::Config::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Bytes of the circular-buffer pool that holds mini-pages: the memory budget for
    /// cached and buffered records. Inner nodes and the mapping table are pinned outside
    /// it (a few bytes per leaf page). Default 64 MiB.
    pub memory_budget_bytes: u64,
    /// Size of a leaf page on disk. Only 4096 is supported in this release.
    pub leaf_page_size_bytes: usize,
    /// Percent chance that a point read served from a leaf page caches the record (or a
    /// phantom for a miss) in the mini-page; a key whose leaf-page read is the second
    /// within a recent window (a small bit array, the "doorkeeper") is cached whatever
    /// the chance says, so hot records are cached on their second read, and while the
    /// pool is under 90% in use every read is cached (that evicts nothing). The paper's
    /// default is 1%; bfdb's is 20%. 0 disables caching point reads, and mirroring leaf
    /// pages while the pool has room.
    pub promotion_rate_percent: u8,
    /// Percent chance that a scan of a leaf page caches the whole page (a mirror) in the
    /// pool. Default 20. 0 disables caching scans.
    pub scan_promotion_rate_percent: u8,
    /// Share of the pool, nearest its head, where an accessed mini-page is copied to the
    /// tail (dropping its clean records not read since its last copy; dirty records are
    /// kept) instead of being updated in place. Default 10.
    pub copy_on_access_percent: u8,
    /// A full mini-page at least this large merges its dirty records into the leaf page
    /// instead of growing again. Default 2048.
    pub merge_threshold_bytes: usize,
    /// Longest key accepted. Default 512.
    pub max_key_bytes: usize,
    /// Longest value accepted. Default 2048.
    pub max_value_bytes: usize,
    /// Storage backend of file-backed trees ([`Tree::open`](crate::Tree::open)).
    /// Default [`Backend::Auto`].
    pub backend: Backend,
    /// With the io_uring backend: use SQPOLL rings, whose kernel thread polls for
    /// submissions so that submitting needs no system call. Off by default: each
    /// thread's ring gets a polling kernel thread that keeps a core busy.
    pub io_uring_sqpoll: bool,
    /// Back the pool with huge pages where the system allows (silent fallback).
    pub huge_pages: bool,
    /// Run a background thread per tree that evicts ahead of writers, keeping 1/64 to
    /// 1/32 of the pool free, so that a writer rarely waits for an eviction's leaf IO
    /// (the paper evicts only in the thread that needs the room; that still happens
    /// whenever the pool is full). Default on.
    pub background_eviction: bool,
    /// A leaf page that overflows in a merge first moves records into a neighbour (a
    /// sibling under the same inner node) that has room, instead of splitting (B*-tree
    /// redistribution). Leaf pages then end about 77% full after inserts in random key
    /// order instead of about 69%, so the data file is about an eighth smaller (1.25
    /// times the raw bytes of 16-byte keys and values instead of 1.42) and scans and
    /// merges read fewer pages, for one more leaf read and write per redistribution. The
    /// neighbour is chosen by a per-page fill hint, so a full one is not read. Default
    /// on.
    pub leaf_redistribution: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            memory_budget_bytes: 64 << 20,
            leaf_page_size_bytes: 4096,
            promotion_rate_percent: 20,
            scan_promotion_rate_percent: 20,
            copy_on_access_percent: 10,
            merge_threshold_bytes: 2048,
            max_key_bytes: 512,
            max_value_bytes: 2048,
            backend: Backend::default(),
            io_uring_sqpoll: false,
            huge_pages: true,
            background_eviction: true,
            leaf_redistribution: true,
        }
    }
}

/// Bytes a mini-page block spends before its node: page id, leaf page and flags.
pub(crate) const MINI_HEADER_BYTES: usize = 16;
/// The largest mini-page block payload: a full mirror of a leaf page plus the header.
pub(crate) const MAX_MINI_BLOCK_BYTES: usize = 4096;
/// The block of the mirror a writer keeps of the open end of a sorted-order split
/// (the largest pool block): two leaf pages' worth, so that the pages split off it are
/// packed full even when the open end is unbounded and so stores its keys whole.
pub(crate) const OPEN_END_MIRROR_BYTES: usize = 2 * MAX_MINI_BLOCK_BYTES;

impl Config {
    /// Checks that the values can work together.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidConfig(what));
        if self.leaf_page_size_bytes != 4096 {
            return bad(format!(
                "leaf_page_size_bytes is {}, but only 4096 is supported",
                self.leaf_page_size_bytes
            ));
        }
        if self.promotion_rate_percent > 100
            || self.scan_promotion_rate_percent > 100
            || self.copy_on_access_percent > 100
        {
            return bad("percentages must be at most 100".into());
        }
        if self.max_key_bytes == 0 {
            return bad("max_key_bytes must be at least 1".into());
        }
        // A leaf page must hold its two fence keys and one record of the largest size.
        let leaf_need = NODE_META_SIZE_BYTES
            + 3 * KV_META_SIZE_BYTES
            + 3 * self.max_key_bytes
            + self.max_value_bytes;
        if leaf_need > PAGE_PAYLOAD_SIZE {
            return bad(format!(
                "a leaf page of {PAGE_PAYLOAD_SIZE} payload bytes cannot hold two fence keys \
                 and a record at max_key_bytes {} and max_value_bytes {} ({leaf_need} bytes)",
                self.max_key_bytes, self.max_value_bytes
            ));
        }
        // The mapping table keeps pool offsets in 47 bits.
        if self.memory_budget_bytes >= 1 << 47 {
            return bad("memory_budget_bytes must be below 2^47 (128 TiB)".into());
        }
        let min_budget = 16 * MAX_MINI_BLOCK_BYTES as u64;
        if self.memory_budget_bytes < min_budget {
            return bad(format!(
                "memory_budget_bytes must be at least {min_budget} (16 full mini-pages)"
            ));
        }
        if !(64..=MAX_MINI_BLOCK_BYTES).contains(&self.merge_threshold_bytes) {
            return bad(format!(
                "merge_threshold_bytes must be between 64 and {MAX_MINI_BLOCK_BYTES}"
            ));
        }
        Ok(())
    }

    /// Bytes of one inner node: room for its two fences and at least eight separators
    /// of the largest key, rounded up to a power of two, at least 4 KiB.
    pub(crate) fn inner_node_size_bytes(&self) -> usize {
        let separator = KV_META_SIZE_BYTES + self.max_key_bytes + 8;
        let need =
            NODE_META_SIZE_BYTES + 2 * (KV_META_SIZE_BYTES + self.max_key_bytes) + 8 * separator;
        need.next_power_of_two().max(4096)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
        assert_eq!(Config::default().inner_node_size_bytes(), 8192);
    }

    #[test]
    fn impossible_combinations_are_rejected() {
        let too_big = Config {
            max_key_bytes: 1024,
            max_value_bytes: 2048,
            ..Config::default()
        };
        assert!(matches!(too_big.validate(), Err(Error::InvalidConfig(_))));
        let page = Config {
            leaf_page_size_bytes: 8192,
            ..Config::default()
        };
        assert!(page.validate().is_err());
        let tiny = Config {
            memory_budget_bytes: 4096,
            ..Config::default()
        };
        assert!(tiny.validate().is_err());
        let pct = Config {
            promotion_rate_percent: 101,
            ..Config::default()
        };
        assert!(pct.validate().is_err());
        let scan_pct = Config {
            scan_promotion_rate_percent: 101,
            ..Config::default()
        };
        assert!(scan_pct.validate().is_err());
    }
}
