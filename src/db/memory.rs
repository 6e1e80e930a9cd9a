//! The database's one memory budget (`Config::memory_budget_bytes`) and its three
//! parts: the hash stores' grants (`catalog.rs` decides them), the value cache (the
//! value store's, `storage/values/cache.rs`) and the trees' pool, which has the rest.
//!
//! The value cache and the pool share what the hash stores leave in proportion to the
//! bytes each would cache: the cache's share is the fraction of the stored bytes that
//! live out of line (the value store's live bytes against those plus the trees' leaf
//! pages), at most `Config::value_cache_percent`. A hot record needs its leaf record in
//! the pool and its value in the cache, so splitting by bytes lets the two hold the
//! same records. The split follows the data ([`Budget::set_stored`]: the background
//! checkpointer's every tick, each checkpoint, the open), moving only by a few percent
//! at a time; until the value store first holds a value the cache has nothing, so a
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
    /// The cache's percent of what the hash stores leave, once `values`.
    cache_percent: u8,
}

/// The least move of the cache's share, in percent points, that [`Budget::set_stored`]
/// makes: a smaller one would shrink the pool or the cache for little.
const MIN_MOVE_PERCENT: u8 = 3;

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

    /// The value store holds a value: from now on the cache may have a share, which
    /// [`Budget::set_stored`] sets.
    pub(super) fn values_held(&self) {
        self.split.lock().values = true;
    }

    /// The database stores `value_bytes` out of line and `leaf_bytes` in the trees'
    /// leaf pages: the cache's share follows the first's fraction of the two, within
    /// `Config::value_cache_percent`, if that moved it by [`MIN_MOVE_PERCENT`] or more
    /// (or to a bound). Nothing while the value store never held a value.
    pub(super) fn set_stored(&self, value_bytes: u64, leaf_bytes: u64) {
        let total = u128::from(value_bytes) + u128::from(leaf_bytes);
        let fraction = match total {
            0 => 0,
            total => (u128::from(value_bytes) * 100 / total) as u8,
        };
        let want = fraction.min(self.cache_percent);
        let mut split = self.split.lock();
        let moved = want.abs_diff(split.cache_percent);
        let to_bound = want != split.cache_percent && (want == 0 || want == self.cache_percent);
        if split.values && (moved >= MIN_MOVE_PERCENT || to_bound) {
            split.cache_percent = want;
            self.apply(*split);
        }
    }

    /// Sets the pool's limit and the cache's capacity for `split`: the part that
    /// shrinks first.
    fn apply(&self, split: Split) {
        let room = self.trees.capacity_bytes().saturating_sub(split.hash_bytes);
        let cache = if split.values {
            (u128::from(room) * u128::from(split.cache_percent) / 100) as u64
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
