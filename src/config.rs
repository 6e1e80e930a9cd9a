//! Configuration of a [`Tree`](crate::Tree).
//!
//! The defaults work without tuning; [`Config::validate`] (called by every constructor)
//! rejects combinations that could not work, with an [`Error::InvalidConfig`] that says why
//! in terms of the fields set here. A configuration `validate` accepts opens with every
//! constructor.
//!
//! This module depends on nothing of the crate but its error type: the tree turns a
//! `Config` into its parts (`tree::setup`), and checks at compile time that the limits
//! stated here match its page layout.

use crate::error::{Error, Result};

/// The smallest [`Config::memory_budget_bytes`]: 64 KiB, room for sixteen mini-pages of
/// a full leaf page each.
pub const MIN_MEMORY_BUDGET_BYTES: u64 = 64 << 10;

/// The bound [`Config::memory_budget_bytes`] must stay below: 2^47 bytes (128 TiB), as
/// the mapping table keeps pool offsets in 47 bits.
pub const MEMORY_BUDGET_LIMIT_BYTES: u64 = 1 << 47;

/// The most that `3 * max_key_bytes + max_inline_value_bytes` may add up to with 4 KiB
/// leaf pages: a leaf page must hold its two fence keys and one record of the largest
/// size, and of its 4080 payload bytes it spends 16 on its header and 8 on each of those
/// three keys. Larger leaf pages ([`Config::leaf_page_size_bytes`]) have 4080 payload
/// bytes per 4 KiB, so the room is 8120 with 8 KiB pages, 16280 with 16 KiB and 32600
/// with 32 KiB.
pub const MAX_FENCES_AND_RECORD_BYTES: usize = 4040;

/// The largest [`Config::max_key_bytes`]: 4 KiB. An inner node (at most 32 KiB) must
/// hold its two fence keys and several separators of the longest key.
pub const MAX_KEY_LIMIT_BYTES: usize = 4096;

/// The leaf page sizes a tree can have: 4, 8, 16 and 32 KiB.
pub const LEAF_PAGE_SIZES: [usize; 4] = [4096, 8192, 16384, 32768];

/// The room [`MAX_FENCES_AND_RECORD_BYTES`] gives with leaf pages of `leaf_page_size_bytes`.
fn fences_and_record_bytes(leaf_page_size_bytes: usize) -> usize {
    leaf_page_size_bytes / 4096 * 4080 - 40
}

/// The most bytes a leaf record spends on a value kept out of line: its reference into
/// the database's value store.
pub const EXTERNAL_VALUE_RECORD_BYTES: usize = 32;

/// The largest [`Config::max_value_bytes`]: a value's length is a `u32` in its
/// reference.
pub const MAX_VALUE_LIMIT_BYTES: usize = u32::MAX as usize;

/// Where a file-backed tree's pages go and how they are read and written.
///
/// Every choice that asks for `O_DIRECT` falls back to buffered IO where the filesystem
/// refuses it, and says so in [`TreeStats::backend_notice`](crate::TreeStats).
/// [`TreeStats::backend`](crate::TreeStats) names what runs: `"std"`, `"std_direct"` or
/// `"io_uring"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Backend {
    /// `pread`/`pwrite` through the OS page cache (runs as `"std"`).
    Std,
    /// `pread`/`pwrite` with `O_DIRECT`: the pool is the only cache of leaf pages, so the
    /// memory budget is honest. Runs as `"std_direct"`, or as `"std"` with a notice where
    /// the filesystem refuses `O_DIRECT`; [`TreeStats::direct_io`](crate::TreeStats)
    /// tells whether `O_DIRECT` is active.
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
    ///
    /// At least [`MIN_MEMORY_BUDGET_BYTES`] (64 KiB) and below
    /// [`MEMORY_BUDGET_LIMIT_BYTES`] (2^47); any value in between works, so a budget
    /// computed from the memory available needs no rounding. The pool carves its
    /// memory in 8-byte units, so the tree uses the budget rounded down to a multiple of
    /// 8 (at most 7 bytes fewer) and never more than the budget. For a
    /// [`Db`](crate::Db) it is the whole database's: every tree keyspace keeps its
    /// mini-pages in one pool of this size.
    pub memory_budget_bytes: u64,
    /// Size of a leaf page on disk: 4096 (the default), 8192, 16384 or 32768. A leaf
    /// page larger than 4 KiB is kept in that many consecutive 4 KiB pages, read and
    /// written together; it is what keys longer than 1336 bytes need (see
    /// [`max_key_bytes`](Config::max_key_bytes)). Trees of a [`Db`](crate::Db) and
    /// in-memory trees take every size; a tree on its own file
    /// ([`Tree::open`](crate::Tree::open)) 4096 only. A database keeps the size its
    /// keyspaces were created with: reopening it with another is refused.
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
    /// Longest key accepted, at least 1. Default 512.
    ///
    /// Keys share one limit with inline values in leaf pages: a leaf page must hold
    /// two fence keys and one record of the largest size, so `3 * max_key_bytes +
    /// max_inline_value_bytes` may be at most [`MAX_FENCES_AND_RECORD_BYTES`] (4040) with
    /// 4 KiB leaf pages. The defaults use 3584 of it, so they are not the ceilings: with
    /// inline values of 2048 bytes keys may reach 664 bytes, with keys of 512 bytes
    /// inline values may reach 2504, and the longest key is 1336 bytes. Longer keys, up
    /// to [`MAX_KEY_LIMIT_BYTES`] (4096), need larger leaf pages
    /// ([`leaf_page_size_bytes`](Config::leaf_page_size_bytes)): keys of 2048 bytes fit
    /// 8 KiB pages with inline values up to 1976 bytes, keys of 4096 bytes 16 KiB pages
    /// with inline values up to 3992.
    ///
    /// ```
    /// use bfdb::Config;
    ///
    /// let long_keys = Config {
    ///     max_key_bytes: 4096,
    ///     leaf_page_size_bytes: 16384,
    ///     ..Config::default()
    /// };
    /// long_keys.validate()?;
    /// # Ok::<(), bfdb::Error>(())
    /// ```
    pub max_key_bytes: usize,
    /// Longest value accepted. Default 1 GiB, at most [`MAX_VALUE_LIMIT_BYTES`]
    /// (4 GiB - 1). A value longer than
    /// [`max_inline_value_bytes`](Config::max_inline_value_bytes) is kept out of line,
    /// in the [`Db`](crate::Db)'s value store, with a reference in the leaf; a tree
    /// outside a `Db` has no value store and refuses such values with
    /// [`Error::ValueTooLarge`].
    pub max_value_bytes: usize,
    /// Longest value kept in the leaf page itself. Default 2048. Shares its limit with
    /// [`max_key_bytes`](Config::max_key_bytes): `3 * max_key_bytes +
    /// max_inline_value_bytes` may be at most [`MAX_FENCES_AND_RECORD_BYTES`] (4040)
    /// (counting at least [`EXTERNAL_VALUE_RECORD_BYTES`] for the value when
    /// `max_value_bytes` is larger, for a reference).
    pub max_inline_value_bytes: usize,
    /// Storage backend of file-backed trees ([`Tree::open`](crate::Tree::open)).
    /// Default [`Backend::Auto`].
    pub backend: Backend,
    /// With the io_uring backend: use SQPOLL rings, whose kernel thread polls for
    /// submissions so that submitting needs no system call. Off by default: each
    /// thread's ring gets a polling kernel thread that keeps a core busy.
    pub io_uring_sqpoll: bool,
    /// Back the pool with huge pages where the system allows (silent fallback).
    pub huge_pages: bool,
    /// Run a background thread per pool (a tree's own, or the one the keyspaces of a
    /// [`Db`](crate::Db) share) that evicts ahead of writers, keeping 1/64 to 1/32 of
    /// the pool free, so that a writer rarely waits for an eviction's leaf IO
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
    /// For a [`Db`](crate::Db): the most of its memory budget, in percent (of what its
    /// hash stores leave), that caches the bytes of values kept out of line; the trees'
    /// pool gets the rest. Reads of a cached value copy it from memory instead of
    /// reading the value file. The cache's share follows the data: the fraction of the
    /// stored bytes kept out of line (against the trees' leaf pages), up to this, so a
    /// database of a few long values among many short records keeps most of its pool,
    /// and one of large values gives most of the budget to their bytes. Until the
    /// database holds a value longer than
    /// [`max_inline_value_bytes`](Config::max_inline_value_bytes) the cache takes
    /// nothing. Default 80; 0 turns the cache off; at most 90.
    pub value_cache_percent: u8,
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
            max_value_bytes: 1 << 30,
            max_inline_value_bytes: 2048,
            backend: Backend::default(),
            io_uring_sqpoll: false,
            huge_pages: true,
            background_eviction: true,
            leaf_redistribution: true,
            value_cache_percent: 80,
        }
    }
}

impl Config {
    /// The longest value kept inline: `max_inline_value_bytes`, or `max_value_bytes`
    /// if that is less.
    pub fn inline_value_limit(&self) -> usize {
        self.max_inline_value_bytes.min(self.max_value_bytes)
    }

    /// The most bytes a leaf record spends on its value: the inline limit, and at least
    /// a reference's when longer values are kept out of line.
    fn leaf_value_bytes(&self) -> usize {
        let inline = self.inline_value_limit();
        if self.max_value_bytes > inline {
            inline.max(EXTERNAL_VALUE_RECORD_BYTES)
        } else {
            inline
        }
    }

    /// Checks that the values can work together. Every constructor of
    /// [`Tree`](crate::Tree) calls it, and accepts every configuration it accepts.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidConfig(what));
        if !LEAF_PAGE_SIZES.contains(&self.leaf_page_size_bytes) {
            return bad(format!(
                "leaf_page_size_bytes is {}, but must be one of {LEAF_PAGE_SIZES:?}",
                self.leaf_page_size_bytes
            ));
        }
        if self.promotion_rate_percent > 100
            || self.scan_promotion_rate_percent > 100
            || self.copy_on_access_percent > 100
        {
            return bad("percentages must be at most 100".into());
        }
        if self.value_cache_percent > 90 {
            return bad(format!(
                "value_cache_percent is {}, but must be at most 90 (the trees keep a tenth \
                 of the budget)",
                self.value_cache_percent
            ));
        }
        if self.max_key_bytes == 0 || self.max_key_bytes > MAX_KEY_LIMIT_BYTES {
            return bad(format!(
                "max_key_bytes is {}, but must be between 1 and {MAX_KEY_LIMIT_BYTES}",
                self.max_key_bytes
            ));
        }
        if self.max_value_bytes > MAX_VALUE_LIMIT_BYTES {
            return bad(format!(
                "max_value_bytes is {}, but must be at most {MAX_VALUE_LIMIT_BYTES}",
                self.max_value_bytes
            ));
        }
        // A leaf page must hold its two fence keys and one record of the largest size.
        let room = fences_and_record_bytes(self.leaf_page_size_bytes);
        let need = self
            .max_key_bytes
            .checked_mul(3)
            .and_then(|keys| keys.checked_add(self.leaf_value_bytes()));
        if need.is_none_or(|need| need > room) {
            let larger = LEAF_PAGE_SIZES
                .iter()
                .find(|&&size| need.is_some_and(|need| need <= fences_and_record_bytes(size)))
                .map_or(String::new(), |size| {
                    format!("; leaf_page_size_bytes = {size} would hold it")
                });
            return bad(format!(
                "3 * max_key_bytes + max_inline_value_bytes must be at most {room} (a leaf \
                 page of {} bytes holds two fence keys and one record), but max_key_bytes is \
                 {} and max_inline_value_bytes {} (counted as {}: the least of it and \
                 max_value_bytes, and at least {EXTERNAL_VALUE_RECORD_BYTES} for a reference \
                 if values may be longer){larger}",
                self.leaf_page_size_bytes,
                self.max_key_bytes,
                self.max_inline_value_bytes,
                self.leaf_value_bytes()
            ));
        }
        let budget = self.memory_budget_bytes;
        // Sixteen mini-pages of a full leaf page, as MIN_MEMORY_BUDGET_BYTES is for 4 KiB.
        let least = MIN_MEMORY_BUDGET_BYTES * (self.leaf_page_size_bytes / 4096) as u64;
        if budget < least {
            return bad(format!(
                "memory_budget_bytes is {budget}, but must be at least {least} (64 KiB per \
                 4 KiB of leaf page)"
            ));
        }
        if budget >= MEMORY_BUDGET_LIMIT_BYTES || usize::try_from(budget).is_err() {
            return bad(format!(
                "memory_budget_bytes is {budget}, but must be below 2^47 (128 TiB) and fit \
                 this machine's address space"
            ));
        }
        if !(64..=self.leaf_page_size_bytes).contains(&self.merge_threshold_bytes) {
            return bad(format!(
                "merge_threshold_bytes is {}, but must be between 64 and {}",
                self.merge_threshold_bytes, self.leaf_page_size_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
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
            leaf_page_size_bytes: 12288,
            ..Config::default()
        };
        assert!(page.validate().is_err());
        let long = Config {
            max_key_bytes: 4096,
            ..Config::default()
        };
        let Err(Error::InvalidConfig(why)) = long.validate() else {
            panic!("4 KiB keys in 4 KiB pages");
        };
        assert!(why.contains("leaf_page_size_bytes = 16384"), "{why}");
        Config {
            leaf_page_size_bytes: 16384,
            ..long
        }
        .validate()
        .unwrap();
        let longer = Config {
            max_key_bytes: 4097,
            leaf_page_size_bytes: 32768,
            ..Config::default()
        };
        assert!(longer.validate().is_err());
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
        let cache = Config {
            value_cache_percent: 91,
            ..Config::default()
        };
        assert!(cache.validate().is_err());
        let merge = Config {
            merge_threshold_bytes: 4097,
            ..Config::default()
        };
        assert!(merge.validate().is_err());
        let overflow = Config {
            max_key_bytes: usize::MAX / 2,
            ..Config::default()
        };
        assert!(overflow.validate().is_err());
    }

    #[test]
    fn key_and_inline_value_limits_share_the_leaf_page() {
        // Values no longer than the inline limit: all of them in the leaf.
        let inline_only = |max_key_bytes, max_value_bytes| Config {
            max_key_bytes,
            max_value_bytes,
            ..Config::default()
        };
        for (key, value) in [(512, 2048), (664, 2048), (1346, 2), (1, 2048)] {
            assert!(inline_only(key, value).validate().is_ok(), "{key} {value}");
        }
        for (key, value) in [(665, 2048), (1347, 0)] {
            assert!(inline_only(key, value).validate().is_err(), "{key} {value}");
        }
        // Longer values allowed: the inline limit counts, and at least a reference.
        let inline = |max_key_bytes, max_inline_value_bytes| Config {
            max_key_bytes,
            max_inline_value_bytes,
            ..Config::default()
        };
        for (key, inline_max) in [(512, 2504), (1, 4037), (1336, 0), (1336, 32)] {
            assert!(
                inline(key, inline_max).validate().is_ok(),
                "{key} {inline_max}"
            );
        }
        for (key, inline_max) in [(512, 2505), (1, 4038), (1337, 0)] {
            assert!(
                inline(key, inline_max).validate().is_err(),
                "{key} {inline_max}"
            );
        }
        // A value limit past a reference's length is refused.
        let huge = Config {
            max_value_bytes: MAX_VALUE_LIMIT_BYTES + 1,
            ..Config::default()
        };
        assert!(huge.validate().is_err());
    }
}
