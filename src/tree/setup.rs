//! What a tree builds from its [`Config`]: its pool's configuration, the size of its
//! inner nodes, and its file store on the backend the configuration chooses.
//!
//! [`Config`] states its limits in plain numbers and knows nothing of the page layout;
//! the assertions below tie those numbers to the layout at compile time, so that
//! [`Config::validate`] accepts exactly what the tree can hold.

use std::path::Path;

use super::leaf::{MAX_MINI_BLOCK_BYTES, OPEN_END_MIRROR_BYTES};
use super::node::{KV_META_SIZE_BYTES, NODE_META_SIZE_BYTES};
use crate::config::{
    Backend, Config, MAX_FENCES_AND_RECORD_BYTES, MEMORY_BUDGET_LIMIT_BYTES,
    MIN_MEMORY_BUDGET_BYTES,
};
use crate::error::{Error, Result};
use crate::pool::{MAX_CAPACITY_BYTES, PoolConfig};
use crate::storage::{
    ActiveBackend, FileStore, IoRequest, IoUringUse, OpenError, PAGE_PAYLOAD_SIZE, PAGE_SIZE,
    open_with_fallback,
};

// A leaf page holds two fence keys and one record of the largest size: its node header
// and three record headers leave `MAX_FENCES_AND_RECORD_BYTES` for the three keys and
// the value. A mini-page block of a full leaf page has the same room.
const _: () = assert!(
    MAX_FENCES_AND_RECORD_BYTES
        == PAGE_PAYLOAD_SIZE - NODE_META_SIZE_BYTES - 3 * KV_META_SIZE_BYTES
);
const _: () = assert!(MAX_MINI_BLOCK_BYTES == PAGE_SIZE);
// The smallest budget holds sixteen mini-pages of a full leaf page, and is more than
// the pool's least capacity (twice its largest block, the open-end mirror, with an
// 8-byte header); the largest fits the pool.
const _: () = assert!(MIN_MEMORY_BUDGET_BYTES >= 16 * MAX_MINI_BLOCK_BYTES as u64);
const _: () = assert!(MIN_MEMORY_BUDGET_BYTES >= 2 * (8 + OPEN_END_MIRROR_BYTES as u64));
const _: () = assert!(MEMORY_BUDGET_LIMIT_BYTES <= MAX_CAPACITY_BYTES);

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
        max_block_size_bytes: OPEN_END_MIRROR_BYTES as u32,
    }
}

/// Bytes of one inner node: room for its two fences and at least eight separators of
/// the largest key, rounded up to a power of two, at least 4 KiB.
pub(crate) fn inner_node_size_bytes(config: &Config) -> usize {
    let separator = KV_META_SIZE_BYTES + config.max_key_bytes + 8;
    let need =
        NODE_META_SIZE_BYTES + 2 * (KV_META_SIZE_BYTES + config.max_key_bytes) + 8 * separator;
    need.next_power_of_two().max(4096)
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
