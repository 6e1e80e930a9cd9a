//! The database's one memory budget (`Config::memory_budget_bytes`) and its three
//! parts: the hash stores' grants (`catalog.rs` decides them), the value cache (the
//! value store's, `storage/values/cache.rs`) and the trees' pool, which has the rest.
//!
//! The value cache takes `Config::value_cache_percent` of what the hash stores leave,
//! from the moment the value store first holds a value; until then it has nothing, so a
//! database that never stores a long value keeps its whole pool. The pool's limit
//! ([`TreeMemory::set_limit_bytes`]) and the cache's capacity are set together, under
//! one lock, and always add up to at most what the hash stores leave: a part that
//! shrinks is shrunk before the other grows (the cache evicts at once; the pool gives
//! its memory back as its head passes it).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::storage::ValueCache;
use crate::tree::TreeMemory;

/// The budget's split (module docs).
pub(super) struct Budget {
    trees: TreeMemory,
    cache: Arc<ValueCache>,
    cache_percent: u8,
    split: Mutex<Split>,
}

/// What the split depends on.
#[derive(Clone, Copy, Debug, Default)]
struct Split {
    /// Bytes the hash stores were granted.
    hash_bytes: u64,
    /// Whether the value store ever held a value.
    values: bool,
}

impl Budget {
    /// The budget of `trees`' pool (its capacity), with no hash store and no value yet:
    /// all of it the trees'.
    pub(super) fn new(trees: TreeMemory, cache: Arc<ValueCache>, cache_percent: u8) -> Budget {
        Budget {
            trees,
            cache,
            cache_percent,
            split: Mutex::new(Split::default()),
        }
    }

    /// The hash stores hold `bytes` of the budget now: the cache and the trees share
    /// the rest.
    pub(super) fn set_hash_bytes(&self, bytes: u64) {
        let mut split = self.split.lock();
        split.hash_bytes = bytes;
        self.apply(*split);
    }

    /// The value store holds a value: the cache takes its share (once).
    pub(super) fn values_held(&self) {
        let mut split = self.split.lock();
        if !split.values {
            split.values = true;
            self.apply(*split);
        }
    }

    /// Sets the pool's limit and the cache's capacity for `split`: the part that
    /// shrinks first.
    fn apply(&self, split: Split) {
        let room = self.trees.capacity_bytes().saturating_sub(split.hash_bytes);
        let cache = if split.values {
            (u128::from(room) * u128::from(self.cache_percent) / 100) as u64
        } else {
            0
        };
        if cache < self.cache.capacity_bytes() {
            self.cache.set_capacity(cache);
        }
        // The pool keeps at least its floor (twice its largest block): the cache gets
        // no more than what is left above the limit the pool took.
        let limit = self.trees.set_limit_bytes(room - cache);
        self.cache
            .set_capacity(cache.min(room.saturating_sub(limit)));
    }
}
