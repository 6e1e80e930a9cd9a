//! The value cache: the bytes of recently read and written values of the value store,
//! in memory, so that a read of a hot value costs a copy instead of a device read.
//!
//! Its memory is part of the database's one memory budget: the database sets its
//! capacity ([`ValueCache::set_capacity`]; zero until the store holds a value) and
//! lowers the trees' pool by as much. Entries are charged what they take — the value's
//! allocation as the allocator rounds it, and [`ENTRY_OVERHEAD_BYTES`] for their slots
//! in the map and the queues — and the charged bytes never exceed the capacity: an
//! insert evicts first, a lower capacity evicts at once.
//!
//! # Policy
//!
//! [`SHARDS`] shards, an extent's by its offset, each with its own mutex, map and
//! queues: a hit takes one shard's lock for a lookup and one copy of the value into the
//! caller's buffer (the bytes are copied under the lock, so no reader holds an entry
//! the cache has dropped, and the charged bytes are all the memory there is). Each
//! shard runs S3-FIFO (Yang et al., SOSP 2023): a new entry goes to a small FIFO queue
//! ([`SMALL_PERCENT`] of the shard); one read while it is there moves it to the main
//! queue when it reaches the small queue's head, otherwise it leaves and its offset is
//! remembered in a ghost queue, and a miss of a remembered offset goes straight to the
//! main queue. The main queue is a CLOCK: an entry read since it last passed the head
//! goes round again (up to three times for three reads). A scan or a load of values
//! read once passes through the small queue and evicts nothing of the main one.
//! An entry above a quarter of a shard is never cached.
//!
//! # Invalidation
//!
//! An entry is keyed by its extent's offset and holds its whole reference (offset,
//! length, checksum); a lookup matches the whole reference. An extent's bytes never
//! change while it is allocated, but its space is reused once it is freed and released
//! (`ValueStore::release`), so the store drops an extent's entry ([`ValueCache::remove`])
//! when it frees the extent (its memory back early) and again when it releases it:
//! after the readers that could have found the extent are gone (`ReadGuard`) and before
//! its space can be allocated. A reader inserts what it read while it holds its guard,
//! so no insert of a released extent's bytes can follow that second drop.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::ValueRef;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU64, Ordering};

/// Shards of the cache. Two threads collide on one with a chance of one in eight, and a
/// shard's lock is held for a lookup and a copy; more shards would make each shard's
/// queues shorter (a smaller small queue), fewer would make collisions likelier.
pub(crate) const SHARDS: usize = 8;

/// Bytes charged per entry beyond its value's allocation: its slot in the shard's map
/// (56 bytes and a control byte, in a table of at most twice the entries and 32 more
/// (`Shard::tidy`), 8/7 of that in buckets: 130 bytes an entry), its queue items (16
/// bytes each; the two queues hold at most twice the entries and 33 more, in at most
/// twice that capacity and 32: 64 bytes an entry), rounded up. The constant parts of
/// those bounds are [`SHARD_BASE_BYTES`]. The unit tests check the structures' real
/// sizes against both.
pub(crate) const ENTRY_OVERHEAD_BYTES: u64 = 256;

/// Bytes charged per ghost (an offset remembered after it left the small queue): its
/// queue item (16 bytes, in twice the capacity: 32) and its map slot (16 bytes and a
/// control byte, at twice the ghosts and 8/7: 39), rounded up.
pub(crate) const GHOST_BYTES: u64 = 96;

/// Bytes a shard keeps for the constant parts of its structures' bounds (about 5.3 KiB:
/// tables and queues tidied down to twice their contents and 32 more), out of its
/// capacity.
pub(crate) const SHARD_BASE_BYTES: u64 = 8 << 10;

/// The small queue's share of a shard, in percent of its capacity (S3-FIFO's 10%).
pub(crate) const SMALL_PERCENT: u64 = 10;

/// The part of a shard the largest entry may take: a quarter.
const MAX_ENTRY_DIVISOR: u64 = 4;

/// The most reads an entry of the main queue is credited with (S3-FIFO's 3).
const MAX_FREQ: u8 = 3;

/// Allocations of at least this many bytes are mappings of their own (glibc's default
/// threshold), which cost whole pages.
const MMAP_THRESHOLD_BYTES: u64 = 128 << 10;

/// Bytes an entry of a value of `len` bytes is charged: the value's allocation as the
/// allocator rounds it (16 bytes of header and 16-byte granules, or whole pages for a
/// mapping) and [`ENTRY_OVERHEAD_BYTES`].
pub(crate) fn charged_bytes(len: u64) -> u64 {
    let allocation = if len + 16 >= MMAP_THRESHOLD_BYTES {
        (len + 16).next_multiple_of(4096)
    } else {
        (len + 16).next_multiple_of(16)
    };
    allocation + ENTRY_OVERHEAD_BYTES
}

/// The shard of the extent at `offset`: the top bits of its block number, scattered.
fn shard_of(offset: u64) -> usize {
    const _: () = assert!(SHARDS.is_power_of_two());
    let scattered = (offset >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (scattered >> (64 - SHARDS.trailing_zeros())) as usize
}

/// Hashes an offset (a multiple of 4096) for the shard's maps: its block number,
/// scattered, with the high bits folded into the low ones the table indexes by.
#[derive(Default)]
struct OffsetHasher(u64);

impl Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        let h = (self.0 >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type OffsetMap<V> = HashMap<u64, V, BuildHasherDefault<OffsetHasher>>;

/// What the cache holds, in bytes and reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheStats {
    /// The capacity set now.
    pub(crate) capacity_bytes: u64,
    /// Bytes charged for the entries and ghosts held (at most the capacity).
    pub(crate) bytes: u64,
    /// Values held.
    pub(crate) entries: u64,
    /// Reads answered from the cache.
    pub(crate) hits: u64,
    /// Reads that looked and went to the device.
    pub(crate) misses: u64,
}

/// A cached value.
struct Entry {
    r: ValueRef,
    bytes: Box<[u8]>,
    /// The stamp of its one current queue item: items with another stamp are stale.
    stamp: u64,
    /// Reads since it entered its queue or last passed the main queue's head.
    freq: u8,
    /// In the main queue (else the small one).
    main: bool,
}

/// One shard: its entries by offset, the small and main queues of (offset, stamp), and
/// the ghosts.
#[derive(Default)]
struct Shard {
    entries: OffsetMap<Entry>,
    small: VecDeque<(u64, u64)>,
    main: VecDeque<(u64, u64)>,
    /// Offsets that left the small queue unread, oldest first, by (offset, stamp);
    /// `ghost_of` holds the current stamp of each.
    ghosts: VecDeque<(u64, u64)>,
    ghost_of: OffsetMap<u64>,
    /// Charged bytes of the entries in each queue.
    small_bytes: u64,
    main_bytes: u64,
    capacity_bytes: u64,
    next_stamp: u64,
    /// Queue items whose entries were removed (not evicted from the head).
    stale: usize,
    hits: u64,
    misses: u64,
}

impl Shard {
    /// Bytes charged now: entries and ghosts (and [`SHARD_BASE_BYTES`], reserved
    /// whenever the shard has a capacity).
    fn used_bytes(&self) -> u64 {
        self.small_bytes + self.main_bytes + self.ghosts.len() as u64 * GHOST_BYTES
    }

    /// What the entries and ghosts may be charged: the capacity less the base.
    fn room_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(SHARD_BASE_BYTES)
    }

    fn max_entry_bytes(&self) -> u64 {
        (self.capacity_bytes / MAX_ENTRY_DIVISOR).min(self.room_bytes())
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Copies the bytes `from..to` of value `r` into `out` if it is held.
    fn get(&mut self, r: &ValueRef, from: usize, to: usize, out: &mut Vec<u8>) -> bool {
        match self.entries.get_mut(&r.offset) {
            Some(e) if e.r == *r => {
                e.freq = (e.freq + 1).min(MAX_FREQ);
                out.clear();
                out.extend_from_slice(&e.bytes[from..to]);
                self.hits += 1;
                true
            }
            _ => {
                self.misses += 1;
                false
            }
        }
    }

    /// Inserts `bytes` as value `r`, evicting to make room. A reader's entry of exactly
    /// `r` already held is kept (its bytes are the same: an extent does not change
    /// while it is allocated, and its entry is dropped before it can be reused). A
    /// writer's value (`written`) is of a fresh extent: any entry at its offset
    /// outlived its extent.
    fn insert(&mut self, r: &ValueRef, bytes: Box<[u8]>, written: bool) {
        let charge = charged_bytes(bytes.len() as u64);
        if charge > self.max_entry_bytes() {
            return;
        }
        if let Some(e) = self.entries.get(&r.offset) {
            if e.r == *r && !written {
                return;
            }
            // An entry of an earlier extent at the offset: the extent was reused
            // without the store dropping its entry, a bug the tests must see; outside
            // them the newer value wins.
            debug_assert!(
                false,
                "the cache held {:?} at the offset of {r:?}: an entry outlived its extent",
                e.r
            );
            self.remove(r.offset);
        }
        let main = self.ghost_of.remove(&r.offset).is_some();
        while self.used_bytes() + charge > self.room_bytes() {
            if !self.evict_one() {
                return;
            }
        }
        self.tidy();
        let stamp = self.stamp();
        if main {
            self.main.push_back((r.offset, stamp));
            self.main_bytes += charge;
        } else {
            self.small.push_back((r.offset, stamp));
            self.small_bytes += charge;
        }
        self.entries.insert(
            r.offset,
            Entry {
                r: *r,
                bytes,
                stamp,
                freq: 0,
                main,
            },
        );
        self.trim_ghosts();
    }

    /// Drops the entry at `offset`, if any.
    fn remove(&mut self, offset: u64) {
        if let Some(e) = self.entries.remove(&offset) {
            let charge = charged_bytes(e.bytes.len() as u64);
            if e.main {
                self.main_bytes -= charge;
            } else {
                self.small_bytes -= charge;
            }
            self.stale += 1;
            if self.stale > 32 + self.entries.len() {
                self.drop_stale_items();
            }
            self.tidy();
        }
    }

    /// Shrinks the map and the queues that hold more than twice what they need and 32
    /// more (entries removed, the capacity lowered), so that their memory stays within
    /// what the entries and ghosts are charged and [`SHARD_BASE_BYTES`].
    fn tidy(&mut self) {
        self.trim_ghosts();
        // A table shrunk to hold `n + 16` gets a power of two of buckets, so a capacity
        // below `2n + 32`: no shrink follows a shrink.
        let n = self.entries.len();
        if self.entries.capacity() > 2 * n + 32 {
            self.entries.shrink_to(n + 16);
        }
        for queue in [&mut self.small, &mut self.main, &mut self.ghosts] {
            if queue.capacity() > 2 * queue.len() + 32 {
                queue.shrink_to(queue.len() + 16);
            }
        }
        let g = self.ghost_of.len();
        if self.ghost_of.capacity() > 2 * g + 32 {
            self.ghost_of.shrink_to(g + 16);
        }
    }

    /// Rebuilds the queues without their stale items.
    fn drop_stale_items(&mut self) {
        let entries = &self.entries;
        let live =
            |&(offset, stamp): &(u64, u64)| entries.get(&offset).is_some_and(|e| e.stamp == stamp);
        self.small.retain(live);
        self.main.retain(live);
        self.stale = 0;
    }

    /// Evicts one entry (or, with none left, one ghost); false if there is nothing.
    fn evict_one(&mut self) -> bool {
        let small_share = self.capacity_bytes / 100 * SMALL_PERCENT;
        if (self.small_bytes > small_share || self.main_bytes == 0) && self.evict_small() {
            return true;
        }
        self.evict_main() || self.evict_small() || self.ghosts.pop_front().is_some()
    }

    /// Evicts the small queue's oldest entry read no time since it entered, moving
    /// those read on to the main queue; false if the small queue empties first.
    fn evict_small(&mut self) -> bool {
        while let Some((offset, stamp)) = self.small.pop_front() {
            let Some(e) = self.entries.get_mut(&offset).filter(|e| e.stamp == stamp) else {
                self.stale = self.stale.saturating_sub(1);
                continue;
            };
            let charge = charged_bytes(e.bytes.len() as u64);
            if e.freq > 0 {
                self.next_stamp += 1;
                e.stamp = self.next_stamp;
                e.freq = 0;
                e.main = true;
                self.main.push_back((offset, e.stamp));
                self.small_bytes -= charge;
                self.main_bytes += charge;
                continue;
            }
            self.entries.remove(&offset);
            self.small_bytes -= charge;
            let ghost = self.stamp();
            self.ghosts.push_back((offset, ghost));
            self.ghost_of.insert(offset, ghost);
            self.trim_ghosts();
            return true;
        }
        false
    }

    /// Evicts the main queue's oldest entry with no read left to its credit; those
    /// with one go round again, one read less.
    fn evict_main(&mut self) -> bool {
        while let Some((offset, stamp)) = self.main.pop_front() {
            let Some(e) = self.entries.get_mut(&offset).filter(|e| e.stamp == stamp) else {
                self.stale = self.stale.saturating_sub(1);
                continue;
            };
            if e.freq > 0 {
                e.freq -= 1;
                self.next_stamp += 1;
                e.stamp = self.next_stamp;
                self.main.push_back((offset, e.stamp));
                continue;
            }
            let charge = charged_bytes(e.bytes.len() as u64);
            self.entries.remove(&offset);
            self.main_bytes -= charge;
            return true;
        }
        false
    }

    /// Keeps no more ghosts than entries (at least 8), as S3-FIFO keeps as many as the
    /// main queue holds.
    fn trim_ghosts(&mut self) {
        while self.ghosts.len() > self.entries.len().max(8) {
            let (offset, stamp) = self.ghosts.pop_front().expect("more than 8");
            if self.ghost_of.get(&offset) == Some(&stamp) {
                self.ghost_of.remove(&offset);
            }
        }
    }

    /// Sets the capacity and evicts down to it; entries now too large for it go too.
    fn set_capacity(&mut self, bytes: u64) {
        self.capacity_bytes = bytes;
        let max = self.max_entry_bytes();
        let too_large: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| charged_bytes(e.bytes.len() as u64) > max)
            .map(|(&offset, _)| offset)
            .collect();
        for offset in too_large {
            self.remove(offset);
        }
        while self.used_bytes() > self.room_bytes() && self.evict_one() {}
        self.tidy();
        if bytes == 0 {
            *self = Shard {
                hits: self.hits,
                misses: self.misses,
                next_stamp: self.next_stamp,
                ..Shard::default()
            };
        }
    }
}

/// The value cache (module docs).
pub(crate) struct ValueCache {
    shards: Box<[Mutex<Shard>]>,
    /// The capacity of all shards together: zero, and every read skips the cache.
    capacity_bytes: AtomicU64,
}

impl std::fmt::Debug for ValueCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for ValueCache {
    fn default() -> Self {
        ValueCache::new()
    }
}

impl ValueCache {
    /// An empty cache of no capacity: it holds nothing until
    /// [`ValueCache::set_capacity`].
    pub(crate) fn new() -> ValueCache {
        ValueCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            capacity_bytes: AtomicU64::new(0),
        }
    }

    /// Sets the capacity to `bytes` (a share of each shard), evicting down to it at
    /// once.
    pub(crate) fn set_capacity(&self, bytes: u64) {
        self.capacity_bytes.store(bytes, Ordering::Release);
        for shard in self.shards.iter() {
            shard.lock().set_capacity(bytes / SHARDS as u64);
        }
    }

    /// The capacity set.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes.load(Ordering::Acquire)
    }

    /// Whether it caches a value of `len` bytes at its capacity now.
    pub(crate) fn takes(&self, len: u64) -> bool {
        let shard = self.capacity_bytes() / SHARDS as u64;
        charged_bytes(len)
            <= (shard / MAX_ENTRY_DIVISOR).min(shard.saturating_sub(SHARD_BASE_BYTES))
    }

    /// Copies the whole value `r` into `out` (replacing its contents) if it is held.
    pub(crate) fn get(&self, r: &ValueRef, out: &mut Vec<u8>) -> bool {
        self.get_range(r, 0, r.len as usize, out)
    }

    /// Copies bytes `from..to` of value `r` (a range inside it) into `out` (replacing
    /// its contents) if the whole value is held.
    pub(crate) fn get_range(
        &self,
        r: &ValueRef,
        from: usize,
        to: usize,
        out: &mut Vec<u8>,
    ) -> bool {
        debug_assert!(from <= to && to <= r.len as usize);
        if !self.takes(u64::from(r.len)) {
            return false;
        }
        self.shards[shard_of(r.offset)].lock().get(r, from, to, out)
    }

    /// Caches `bytes`, which a reader read as the whole value `r` while it held the
    /// guard under which it found `r`, if it is small enough.
    pub(crate) fn insert(&self, r: &ValueRef, bytes: &[u8]) {
        self.insert_as(r, bytes, false);
    }

    /// Caches `bytes`, just written as the whole value `r` into a fresh extent, before
    /// `r` is handed out, if it is small enough.
    pub(crate) fn insert_written(&self, r: &ValueRef, bytes: &[u8]) {
        self.insert_as(r, bytes, true);
    }

    fn insert_as(&self, r: &ValueRef, bytes: &[u8], written: bool) {
        debug_assert_eq!(bytes.len(), r.len as usize);
        if !self.takes(u64::from(r.len)) {
            return;
        }
        // The copy before the lock.
        let bytes: Box<[u8]> = bytes.into();
        self.shards[shard_of(r.offset)]
            .lock()
            .insert(r, bytes, written);
    }

    /// Drops the entry of the extent at `offset`, whatever its value: the extent is
    /// freed, or about to be reused.
    pub(crate) fn remove(&self, offset: u64) {
        self.shards[shard_of(offset)].lock().remove(offset);
    }

    /// What the cache holds.
    pub(crate) fn stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            capacity_bytes: self.capacity_bytes(),
            ..CacheStats::default()
        };
        for shard in self.shards.iter() {
            let s = shard.lock();
            if s.capacity_bytes > 0 {
                stats.bytes += s.used_bytes() + SHARD_BASE_BYTES.min(s.capacity_bytes);
            }
            stats.entries += s.entries.len() as u64;
            stats.hits += s.hits;
            stats.misses += s.misses;
        }
        stats
    }

    /// Whether an entry of the extent at `offset` is held, for tests.
    #[cfg(test)]
    #[cfg(all(test, not(feature = "shuttle")))]
    pub(crate) fn holds(&self, offset: u64) -> bool {
        self.shards[shard_of(offset)]
            .lock()
            .entries
            .contains_key(&offset)
    }

    /// Checks every shard's invariants, for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        for shard in self.shards.iter() {
            shard.lock().check();
        }
    }
}

#[cfg(test)]
impl Shard {
    /// Asserts the shard's invariants: within its room; the queues' bytes are their
    /// entries' charges; every entry has one live item in its queue; and the memory of
    /// the map and the queues is within what the entries and ghosts are charged and
    /// the base.
    fn check(&self) {
        assert!(
            self.used_bytes() <= self.room_bytes(),
            "{} bytes charged in a room of {}",
            self.used_bytes(),
            self.room_bytes()
        );
        let (mut small, mut main) = (0, 0);
        for (&offset, e) in &self.entries {
            assert_eq!(offset, e.r.offset);
            assert_eq!(e.bytes.len(), e.r.len as usize);
            let charge = charged_bytes(e.bytes.len() as u64);
            assert!(charge <= self.max_entry_bytes());
            let queue = if e.main {
                main += charge;
                &self.main
            } else {
                small += charge;
                &self.small
            };
            assert_eq!(
                queue
                    .iter()
                    .filter(|&&item| item == (offset, e.stamp))
                    .count(),
                1,
                "one live queue item per entry"
            );
        }
        assert_eq!((small, main), (self.small_bytes, self.main_bytes));
        let n = self.entries.len();
        assert!(
            self.small.len() + self.main.len() <= 2 * n + 33,
            "stale items"
        );
        assert!(self.ghosts.len() <= n.max(8));
        let table = |capacity: usize, slot: usize| {
            if capacity == 0 {
                0
            } else {
                (capacity * 8 / 7).next_power_of_two() * (slot + 1) + 16
            }
        };
        let structures = table(self.entries.capacity(), size_of::<(u64, Entry)>())
            + (self.small.capacity() + self.main.capacity() + self.ghosts.capacity()) * 16
            + table(self.ghost_of.capacity(), 16);
        let charged = n as u64 * ENTRY_OVERHEAD_BYTES
            + self.ghosts.len() as u64 * GHOST_BYTES
            + SHARD_BASE_BYTES;
        assert!(
            structures as u64 <= charged,
            "the map and the queues take {structures} bytes, more than the {charged} charged \
             for {n} entries and {} ghosts",
            self.ghosts.len()
        );
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests;
