//! What a tree builds from its [`Config`]: its pool's configuration, the size of its
//! inner nodes, and its file store on the backend the configuration chooses.
//!
//! [`Config`] states its limits in plain numbers and knows nothing of the page layout;
//! the assertions below tie those numbers to the layout at compile time, so that
//! [`Config::validate`] accepts exactly what the tree can hold.

use std::path::Path;

use super::leaf_page::LeafGeometry;
use super::node::{KV_META_SIZE_BYTES, MAX_NODE_SIZE_BYTES, NODE_META_SIZE_BYTES};
use crate::config::{
    Backend, Config, LEAF_PAGE_SIZES, MAX_FENCES_AND_RECORD_BYTES, MAX_KEY_LIMIT_BYTES,
    MEMORY_BUDGET_LIMIT_BYTES, MIN_MEMORY_BUDGET_BYTES,
};
use crate::error::{Error, Result};
use crate::pool::{MAX_CAPACITY_BYTES, PoolConfig};
use crate::storage::{
    ActiveBackend, FileStore, IoRequest, IoUringUse, OpenError, PAGE_PAYLOAD_SIZE, PAGE_SIZE,
    open_with_fallback,
};

// A leaf page holds two fence keys and one record of the largest size: its node header
// and three record headers leave `MAX_FENCES_AND_RECORD_BYTES` for the three keys and
// the value (with 4 KiB pages; `Config` scales it by 4080 bytes per 4 KiB). A mini-page
// block of a full leaf page has the same room.
const _: () = assert!(
    MAX_FENCES_AND_RECORD_BYTES
        == PAGE_PAYLOAD_SIZE - NODE_META_SIZE_BYTES - 3 * KV_META_SIZE_BYTES
);
// The largest leaf page's node fits the node layout, and its mini-page block (with the
// 16-byte mini-page header) is the page itself: 16 bytes of header per 4 KiB page.
const _: () = assert!(LEAF_PAGE_SIZES[3] / PAGE_SIZE * PAGE_PAYLOAD_SIZE <= MAX_NODE_SIZE_BYTES);
const _: () = assert!(PAGE_SIZE - PAGE_PAYLOAD_SIZE == 16);
// The smallest budget holds sixteen mini-pages of a full 4 KiB leaf page, and is more
// than the pool's least capacity (twice its largest block, the open-end mirror, with an
// 8-byte header); `Config` asks 64 KiB per 4 KiB of leaf page. The largest fits the
// pool.
const _: () = assert!(MIN_MEMORY_BUDGET_BYTES >= 16 * PAGE_SIZE as u64);
const _: () = assert!(MIN_MEMORY_BUDGET_BYTES >= 2 * (8 + 2 * PAGE_SIZE as u64));
const _: () = assert!(MEMORY_BUDGET_LIMIT_BYTES <= MAX_CAPACITY_BYTES);
// An inner node of the largest size holds its fences and at least five separators of
// the longest key.
const _: () = assert!(
    NODE_META_SIZE_BYTES
        + 2 * (KV_META_SIZE_BYTES + MAX_KEY_LIMIT_BYTES)
        + 5 * (KV_META_SIZE_BYTES + MAX_KEY_LIMIT_BYTES + 8)
        <= MAX_NODE_SIZE_BYTES
);

/// The pool's capacity must be a multiple of this many bytes (blocks and their headers
/// are 8-byte aligned).
const POOL_GRANULARITY_BYTES: u64 = 8;

/// The pool of a tree with `config` (which [`Config::validate`] accepted): the memory
/// budget rounded down to the pool's granularity, so any budget in range works and the
/// pool never exceeds it.
pub(crate) fn pool_config(config: &Config) -> PoolConfig {
    let budget = config.memory_budget_bytes;
    PoolConfig {
        capacity_bytes: budget - budget % POOL_GRANULARITY_BYTES,
        copy_on_access_percent: config.copy_on_access_percent,
        huge_pages: config.huge_pages,
        // The pool wants a power of two; for 4 KiB leaf pages the mirror is one (8 KiB).
        max_block_size_bytes: LeafGeometry::new(config.leaf_page_size_bytes)
            .open_end_mirror_bytes()
            .next_power_of_two() as u32,
    }
}

/// Bytes of one inner node: room for its two fences and at least eight separators of
/// the largest key, rounded up to a power of two, at least 4 KiB and at most the node
/// layout's 32 KiB (which holds five separators of the longest key a `Config` allows:
/// keys over 2 KiB get fewer than eight).
pub(crate) fn inner_node_size_bytes(config: &Config) -> usize {
    let separator = KV_META_SIZE_BYTES + config.max_key_bytes + 8;
    let need =
        NODE_META_SIZE_BYTES + 2 * (KV_META_SIZE_BYTES + config.max_key_bytes) + 8 * separator;
    need.next_power_of_two().clamp(4096, MAX_NODE_SIZE_BYTES)
}

/// Opens the file store at `path` on the backend `config` chooses, falling back as
/// [`Backend`] describes.
pub(crate) fn open_file_store(path: &Path, config: &Config) -> Result<(FileStore, ActiveBackend)> {
    let (io_uring, direct_io) = match config.backend {
        Backend::Std => (IoUringUse::Never, false),
        Backend::StdDirect => (IoUringUse::Never, true),
        Backend::IoUring => (IoUringUse::Required, true),
        Backend::Auto => (IoUringUse::Preferred, true),
    };
    let request = IoRequest {
        io_uring,
        direct_io,
        sqpoll: config.io_uring_sqpoll,
    };
    open_with_fallback(path, request).map_err(|e| match e {
        OpenError::IoUringRefused(e) => Error::Unsupported(format!(
            "the io_uring backend was asked for, but the kernel refuses it: {e}"
        )),
        OpenError::Io(e) => Error::from(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_inner_nodes_hold_eight_separators_of_the_longest_key() {
        assert_eq!(inner_node_size_bytes(&Config::default()), 8192);
    }

    #[test]
    fn the_pool_never_exceeds_the_budget() {
        for budget in [MIN_MEMORY_BUDGET_BYTES, 65_537, 65_543, 65_544, 100_003] {
            let config = Config {
                memory_budget_bytes: budget,
                ..Config::default()
            };
            let pool = pool_config(&config);
            assert!(pool.capacity_bytes <= budget && budget - pool.capacity_bytes < 8);
            assert!(pool.validate().is_ok(), "{budget}");
        }
    }
}
