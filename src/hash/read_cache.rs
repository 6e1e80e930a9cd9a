//! F2's read cache (PVLDB 2025, section 7): an in-memory log of copies of read-hot
//! records whose originals are on disk (in the hot log below HEAD, or in the cold log),
//! or are hot-log records read while in memory whose page is leaving it (below
//! READ_ONLY, so they never change in place; `HotLog::keep_read_records`).
//!
//! **Where copies live.** The read cache is a circular log of page frames in memory
//! with no device behind it. A copy is a record in the format of every hash log
//! (`record.rs`): its header's previous address is the *hot-log* address the key's hot
//! chain continued with when the copy was made. Copies are reached only from the hot
//! index: an entry's address with [`READ_CACHE_BIT`] set names a copy, which then sits
//! at the head of that chain, in front of its hot-log records.
//!
//! ```text
//!  hot index entry ──▶ [copy in the read cache] ──▶ hot-log record ──▶ hot-log record ─▶ …
//!   (bit 47 set)        previous: a hot address     (never a read-cache address)
//! ```
//!
//! Invariants this module and the hot log keep together:
//!
//! - **At most one copy per chain, at its head.** Only an index entry ever holds a
//!   read-cache address; records of the hot log and copies link only to hot-log
//!   addresses. A writer links its new record behind the copy's previous address, so
//!   appending to a chain unlinks its copy.
//! - **A linked, valid copy of a key holds the key's newest value.** A copy is linked by
//!   a compare-and-swap of the entry expecting the word the reader saw *before* it read
//!   the original (and only if the hot log's BEGIN did not move meanwhile: see
//!   `docs/design.md` for why that closes the one way the word can come back), so no
//!   write to the chain happened in between; every later write replaces the entry word.
//! - **Addresses are never reused.** Read-cache addresses only grow (frames are reused,
//!   addresses are not), so an entry that held a copy's address never holds it again
//!   once it changed.
//! - **A frame is reused only after its page was evicted and every thread that could
//!   have loaded one of its addresses has refreshed.** Eviction unlinks every record of
//!   the page from the index by compare-and-swap, then registers an epoch trigger
//!   action that zeroes the frame; a thread that loaded a copy's address reads the copy
//!   until it refreshes.
//! - **A page is evicted only after it was sealed:** when the tail leaves a page, an
//!   epoch trigger action marks it sealed once every thread has refreshed, so every
//!   record allocated in it is written and every attempt to link it has happened before
//!   eviction walks it.
//!
//! **Second chance.** A hit on a copy in the older half of the cache (below the mutable
//! pages) copies it to the tail, as F2 does: the new copy replaces the old one in the
//! entry by compare-and-swap, and the old one is marked invalid. A copy read again
//! while it ages therefore survives the eviction of its page.
//!
//! **Admission** (a departure from F2, off unless asked for): with
//! [`ReadCache::admit_on_second_read`], a record read from disk is copied only when a
//! doorkeeper of key fingerprints remembers an earlier disk read of its key
//! ([`ReadCache::admit`]), so that keys read once in a long while do not push out the
//! copies of keys read again and again.
//!
//! **Never waiting.** Reads that insert copies hold their guard shared (they cannot
//! refresh), so the read cache never waits: a full tail page whose successor's frame is
//! not free yet (its close waits for some thread to refresh) makes the insert give up;
//! the read still answers. Eviction runs one page ahead of need so that the next frame
//! is usually free when the tail gets there.

use std::sync::atomic::AtomicU64 as AtomicU64Std;

use super::bucket::KeyHash;
use super::epoch::{Epoch, EpochGuard};
use super::index::HashIndex;
use super::record::{MemRecord, RECORD_HEADER_BYTES};
use crate::error::{Error, Result};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The bit of a hot index entry's address that says "a copy in the read cache" (FASTER's
/// C++ uses the same bit). The hot log's addresses stay below it.
pub(crate) const READ_CACHE_BIT: u64 = 1 << 47;

/// Whether an index entry's address names a copy in the read cache.
pub(crate) fn is_cached(address: u64) -> bool {
    address & READ_CACHE_BIT != 0
}

/// The first address of the read cache's page 0 (the first 64 bytes stay unused, as in
/// the hybrid log, so that no copy has address 0).
const FIRST_ADDRESS: u64 = 64;

/// Counters of what the read cache did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReadCacheStats {
    /// Reads answered by a copy.
    pub(crate) hits: u64,
    /// Copies linked at the head of their chain after a read from disk.
    pub(crate) inserts: u64,
    /// Copies made and not linked: the chain changed, BEGIN moved, or no space.
    pub(crate) inserts_abandoned: u64,
    /// Second chances: copies re-read in the older half and copied to the tail.
    pub(crate) copies_to_tail: u64,
    /// Copies unlinked from the index by eviction.
    pub(crate) evictions: u64,
    /// Pages evicted.
    pub(crate) pages_evicted: u64,
    /// Copies marked invalid by a write of their key.
    pub(crate) invalidations: u64,
    /// Records read from disk not copied: the admission filter had not seen them.
    pub(crate) not_admitted: u64,
    /// Copies of hot-log records read while in memory, taken as their page left it.
    pub(crate) kept: u64,
}

#[derive(Default)]
struct Counters {
    hits: std::sync::atomic::AtomicU64,
    inserts: std::sync::atomic::AtomicU64,
    inserts_abandoned: std::sync::atomic::AtomicU64,
    copies_to_tail: std::sync::atomic::AtomicU64,
    evictions: std::sync::atomic::AtomicU64,
    pages_evicted: std::sync::atomic::AtomicU64,
    invalidations: std::sync::atomic::AtomicU64,
    not_admitted: std::sync::atomic::AtomicU64,
    kept: std::sync::atomic::AtomicU64,
}

fn bump(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// What the epoch trigger actions share with the cache.
struct Shared {
    /// The page frames, as words: copies are read and written through `MemRecord`,
    /// whose words are atomics.
    frames: Box<[Box<[AtomicU64Std]>]>,
    /// Every page below this address is sealed: every thread that allocated in it has
    /// refreshed since.
    sealed_until: AtomicU64,
    /// Every frame of a page below this address is zeroed and free.
    closed_until: AtomicU64,
}

impl Shared {
    /// Zeroes the frame of the page starting at `page_start` (evicted; no thread can
    /// still read it) and marks everything below its end closed.
    fn close(&self, page_start: u64, page_bits: u32) {
        let frame = &self.frames[((page_start >> page_bits) % self.frames.len() as u64) as usize];
        for word in frame.iter() {
            word.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        // Release: a thread that sees the frame closed sees it zeroed.
        self.closed_until
            .fetch_max(page_start + (1 << page_bits), Ordering::SeqCst);
    }
}

/// The read cache. Its operations take the hot index (to unlink what they evict) and the
/// hot log's BEGIN from the caller, the hot log, which owns both.
pub(crate) struct ReadCache {
    epoch: Arc<Epoch>,
    shared: Arc<Shared>,
    page_bits: u32,
    page_bytes: u64,
    frames: u64,
    /// Pages below the tail's that are still mutable: a hit below them is a second
    /// chance.
    mutable_pages: u64,
    /// `page << 32 | offset` of the next allocation (the offset may pass the page's end
    /// while the next page is not open yet).
    tail: AtomicU64,
    /// Every page below this address is evicted or being evicted.
    head: AtomicU64,
    /// Held by the thread evicting a page.
    evicting: Mutex<()>,
    counters: Counters,
    /// The admission filter (empty: every read from disk is copied): see
    /// [`ReadCache::admit`].
    recent: Box<[std::sync::atomic::AtomicU16]>,
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCache")
            .field("frames", &self.frames)
            .field("page_bytes", &self.page_bytes)
            .field("tail", &self.tail_address())
            .field("head", &self.head.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ReadCache {
    /// A read cache of `memory_bytes` in pages of `1 << page_bits` bytes (at least three
    /// pages: one being evicted, two holding copies), on `epoch`.
    pub(crate) fn new(memory_bytes: u64, page_bits: u32, epoch: Arc<Epoch>) -> Result<ReadCache> {
        let frames = memory_bytes >> page_bits;
        if !(12..=30).contains(&page_bits) || frames < 3 {
            return Err(Error::InvalidConfig(format!(
                "read cache: at least three pages of 2^12..2^30 bytes; got {memory_bytes} \
                 bytes in pages of 2^{page_bits}"
            )));
        }
        let page_bytes = 1u64 << page_bits;
        let words = (page_bytes / 8) as usize;
        let frame_words = (0..frames)
            .map(|_| (0..words).map(|_| AtomicU64Std::new(0)).collect())
            .collect();
        Ok(ReadCache {
            epoch,
            shared: Arc::new(Shared {
                frames: frame_words,
                sealed_until: AtomicU64::new(0),
                closed_until: AtomicU64::new(0),
            }),
            page_bits,
            page_bytes,
            frames,
            mutable_pages: ((frames - 1) / 2).max(1),
            tail: AtomicU64::new(FIRST_ADDRESS),
            head: AtomicU64::new(0),
            evicting: Mutex::new(()),
            counters: Counters::default(),
            recent: Box::new([]),
        })
    }

    /// Bytes the admission filter of a cache of `memory_bytes` takes: a 2-byte slot for
    /// every 32 bytes of frames (about four per copy of a small record, so that the
    /// filter remembers a key for several times as long as the cache would keep a copy
    /// of every read), a power of two of them: 4-6% of the memory.
    pub(crate) fn admission_bytes(memory_bytes: u64) -> u64 {
        2 * (memory_bytes / 32).max(2).next_power_of_two() / 2
    }

    /// Turns on the admission filter, of [`ReadCache::admission_bytes`] beside the
    /// frames (the caller took them from the cache's share).
    pub(crate) fn admit_on_second_read(&mut self) {
        let slots = Self::admission_bytes(self.frames * self.page_bytes) / 2;
        self.recent = (0..slots)
            .map(|_| std::sync::atomic::AtomicU16::new(0))
            .collect();
    }

    /// Whether a record of `hash` just read from disk may be copied into the cache: with
    /// the admission filter on, only if the same key was read from disk lately (a
    /// doorkeeper, as TinyLFU's). The filter is a direct-mapped table of 16-bit
    /// fingerprints: the first read of a key leaves its fingerprint in its slot and is
    /// not copied; a second read that finds it there is. A slot keeps a key until
    /// another key's read takes it, so "lately" is within about as many disk reads as
    /// the filter has slots. Keys read from disk once — most of a skewed workload's
    /// long tail — no longer push out the copies of keys read again and again. A wrong
    /// answer (two keys with one fingerprint, or a racing read) only admits or refuses
    /// one copy.
    pub(crate) fn admit(&self, hash: KeyHash) -> bool {
        if self.recent.is_empty() {
            return true;
        }
        // The slot from the hash's middle bits, the fingerprint from its top half (the
        // index uses the low bits for buckets); never 0, the empty slot.
        let slot = &self.recent[((hash.0 >> 16) as usize) & (self.recent.len() - 1)];
        let fingerprint = ((hash.0 >> 40) as u16) | 1;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        if slot.load(relaxed) == fingerprint {
            return true;
        }
        slot.store(fingerprint, relaxed);
        bump(&self.counters.not_admitted);
        false
    }

    pub(crate) fn stats(&self) -> ReadCacheStats {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let c = &self.counters;
        ReadCacheStats {
            hits: load(&c.hits),
            inserts: load(&c.inserts),
            inserts_abandoned: load(&c.inserts_abandoned),
            copies_to_tail: load(&c.copies_to_tail),
            evictions: load(&c.evictions),
            pages_evicted: load(&c.pages_evicted),
            invalidations: load(&c.invalidations),
            not_admitted: load(&c.not_admitted),
            kept: load(&c.kept),
        }
    }

    /// Counts a copy of a hot-log record kept as its page left memory.
    pub(crate) fn count_kept(&self) {
        bump(&self.counters.kept);
    }

    pub(crate) fn count_hit(&self) {
        bump(&self.counters.hits);
    }

    pub(crate) fn count_insert(&self, linked: bool) {
        bump(if linked {
            &self.counters.inserts
        } else {
            &self.counters.inserts_abandoned
        });
    }

    pub(crate) fn count_copy_to_tail(&self) {
        bump(&self.counters.copies_to_tail);
    }

    pub(crate) fn count_invalidation(&self) {
        bump(&self.counters.invalidations);
    }

    /// Bytes of one page: the largest copy.
    pub(crate) fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Bytes of memory the frames and the admission filter take.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.page_bytes * self.frames + 2 * self.recent.len() as u64
    }

    fn tail_address(&self) -> u64 {
        let t = self.tail.load(Ordering::SeqCst);
        // A sum: a full page's offset is `page_bytes` (see `HybridLog`'s tail).
        ((t >> 32) << self.page_bits) + (t & 0xffff_ffff).min(self.page_bytes)
    }

    /// The copy at `address` (an entry's address, [`READ_CACHE_BIT`] set).
    ///
    /// # Safety
    ///
    /// The calling thread loaded `address` from a hot index entry (or allocated it) while
    /// protected by the cache's epoch, and uses the view only until it refreshes.
    pub(crate) unsafe fn record(&self, address: u64) -> MemRecord {
        debug_assert!(is_cached(address));
        let address = address & !READ_CACHE_BIT;
        let frame = &self.shared.frames[((address >> self.page_bits) % self.frames) as usize];
        let offset = (address & (self.page_bytes - 1)) as usize;
        // SAFETY: the offset is inside the frame and 8-aligned (copies are); the frame
        // is not zeroed before every thread that could have loaded an address in it has
        // refreshed (the caller's contract and the eviction protocol), and a linked
        // address names a written copy. The frame's words are atomics, so writes through
        // the pointer are allowed.
        unsafe { MemRecord::at(frame.as_ptr().cast::<u8>().cast_mut().add(offset)) }
    }

    /// Whether a hit on the copy at `address` should copy it to the tail: it is in the
    /// older half of the cache, on its way to eviction.
    pub(crate) fn is_old(&self, address: u64) -> bool {
        let page = (address & !READ_CACHE_BIT) >> self.page_bits;
        let tail_page = self.tail.load(Ordering::SeqCst) >> 32;
        page + self.mutable_pages <= tail_page
    }

    /// Reserves `size_bytes` at the tail, opening the next page (and evicting, one page
    /// ahead) as needed; the address has [`READ_CACHE_BIT`] set. `None` if there is no
    /// space now: the next page's frame waits for some thread to refresh. Never waits
    /// and never refreshes. The caller holds no entry slot (eviction takes them), fills
    /// the space before it refreshes, and marks it invalid if it does not link it.
    pub(crate) fn allocate(
        &self,
        guard: &EpochGuard<'_, '_>,
        index: &HashIndex,
        hot_begin: u64,
        size_bytes: u64,
    ) -> Option<u64> {
        assert!(size_bytes.is_multiple_of(8) && size_bytes <= self.page_bytes);
        for _ in 0..3 {
            let mut now = self.tail.load(Ordering::SeqCst);
            // A full page is not added to again: the offset would otherwise grow with
            // every read that finds no space.
            if (now & 0xffff_ffff) < self.page_bytes {
                now = self.tail.fetch_add(size_bytes, Ordering::SeqCst);
                let (page, offset) = (now >> 32, now & 0xffff_ffff);
                if offset + size_bytes <= self.page_bytes {
                    return Some((page << self.page_bits | offset) | READ_CACHE_BIT);
                }
            }
            if !self.open_next_page(guard, index, hot_begin, now >> 32) {
                return None;
            }
        }
        None
    }

    /// Moves the tail from the full page `full` to the next one if that page's frame is
    /// free, then evicts ahead; answers whether the tail has left `full`.
    fn open_next_page(
        &self,
        guard: &EpochGuard<'_, '_>,
        index: &HashIndex,
        hot_begin: u64,
        full: u64,
    ) -> bool {
        let next = full + 1;
        let mut current = self.tail.load(Ordering::SeqCst);
        if current >> 32 != full {
            return true;
        }
        if (next + 1) << self.page_bits > READ_CACHE_BIT {
            // The 47-bit address space is used up: no more copies.
            return false;
        }
        // Frame `next % frames` holds page `next - frames` until that page is closed.
        let needed = (next + 1).saturating_sub(self.frames) << self.page_bits;
        if self.shared.closed_until.load(Ordering::SeqCst) < needed {
            self.evict_ahead(guard, index, hot_begin);
            return false;
        }
        while current >> 32 == full {
            match self.tail.compare_exchange(
                current,
                next << 32,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    // Page `full` is sealed once every thread that may still be writing
                    // a copy in it (or linking one) has refreshed.
                    let shared = Arc::clone(&self.shared);
                    let sealed = next << self.page_bits;
                    self.epoch.bump_with_action(move || {
                        shared.sealed_until.fetch_max(sealed, Ordering::SeqCst);
                    });
                    break;
                }
                Err(now) => current = now,
            }
        }
        self.evict_ahead(guard, index, hot_begin);
        true
    }

    /// Evicts the pages whose frames the tail needs next: with the tail on page `q`,
    /// every page up to `q + 1 - frames`, so that the frame for `q + 1` is closed (once
    /// the threads refresh) by the time the tail fills `q`. Returns at once if another
    /// thread is evicting.
    fn evict_ahead(&self, guard: &EpochGuard<'_, '_>, index: &HashIndex, hot_begin: u64) {
        let tail_page = self.tail.load(Ordering::SeqCst) >> 32;
        let Some(until_page) = (tail_page + 2).checked_sub(self.frames) else {
            return;
        };
        self.evict_before(guard, index, hot_begin, until_page << self.page_bits);
    }

    /// Evicts the sealed pages below `until` (a page start) not evicted yet; returns at
    /// once if another thread is evicting. Evicting a page sets HEAD past it, unlinks each
    /// of its copies that its entry still names (the entry then names the copy's previous
    /// hot-log address, or is removed if that is below the hot log's BEGIN: nothing of
    /// the chain is left), and registers the frame's close.
    pub(crate) fn evict_before(
        &self,
        guard: &EpochGuard<'_, '_>,
        index: &HashIndex,
        hot_begin: u64,
        until: u64,
    ) {
        let Some(_one) = self.evicting.try_lock() else {
            return;
        };
        loop {
            let page_start = self.head.load(Ordering::SeqCst);
            if page_start >= until || self.shared.sealed_until.load(Ordering::SeqCst) <= page_start
            {
                return;
            }
            self.head
                .store(page_start + self.page_bytes, Ordering::SeqCst);
            self.unlink_page(guard, index, hot_begin, page_start);
            bump(&self.counters.pages_evicted);
            let shared = Arc::clone(&self.shared);
            let bits = self.page_bits;
            // Threads that loaded an address of the page before it was unlinked read it
            // until they refresh.
            self.epoch
                .bump_with_action(move || shared.close(page_start, bits));
        }
    }

    /// Unlinks every copy of the sealed page at `page_start` that an entry still names.
    fn unlink_page(
        &self,
        guard: &EpochGuard<'_, '_>,
        index: &HashIndex,
        hot_begin: u64,
        page_start: u64,
    ) {
        let mut offset = if page_start == 0 { FIRST_ADDRESS } else { 0 };
        while offset + RECORD_HEADER_BYTES as u64 <= self.page_bytes {
            let address = (page_start + offset) | READ_CACHE_BIT;
            // SAFETY: this page is sealed and not closed (this thread closes it, later);
            // the address is inside it.
            let record = unsafe { self.record(address) };
            let header = record.header();
            if header.0 == 0 {
                // The unused end of the page: sealed, so nothing is still being written.
                break;
            }
            let size = record.size_bytes() as u64;
            debug_assert!(offset + size <= self.page_bytes, "a copy crosses its page");
            let hash = super::hot::hash_key(&record.key());
            if unlink(guard, index, hash, address, header.previous(), hot_begin) {
                bump(&self.counters.evictions);
            }
            offset += size;
        }
    }

    /// The addresses HEAD and TAIL (tests).
    #[cfg(test)]
    pub(crate) fn head_and_tail(&self) -> (u64, u64) {
        (self.head.load(Ordering::SeqCst), self.tail_address())
    }

    /// Moves the tail to the next page now (tests); false if its frame is not free.
    #[cfg(all(test, feature = "shuttle"))]
    pub(crate) fn turn_page(
        &self,
        guard: &EpochGuard<'_, '_>,
        index: &HashIndex,
        hot_begin: u64,
    ) -> bool {
        let full = self.tail.load(Ordering::SeqCst) >> 32;
        self.open_next_page(guard, index, hot_begin, full)
    }

    /// Evicts the oldest page now if it is sealed (tests); answers whether it did.
    #[cfg(all(test, feature = "shuttle"))]
    pub(crate) fn evict_oldest(
        &self,
        guard: &EpochGuard<'_, '_>,
        index: &HashIndex,
        hot_begin: u64,
    ) -> bool {
        let head = self.head.load(Ordering::SeqCst);
        self.evict_before(guard, index, hot_begin, head + self.page_bytes);
        self.head.load(Ordering::SeqCst) > head
    }
}

/// Makes the entry of `hash` name `previous` (the copy's hot-log successor) instead of
/// the copy at `address`, if it still names the copy; removes the entry instead if
/// `previous` is below the hot log's BEGIN. Answers whether this call changed it.
pub(crate) fn unlink(
    guard: &EpochGuard<'_, '_>,
    index: &HashIndex,
    hash: KeyHash,
    address: u64,
    previous: u64,
    hot_begin: u64,
) -> bool {
    let Some(mut slot) = index.find(guard, hash) else {
        return false;
    };
    if slot.address() != address {
        return false;
    }
    if previous < hot_begin {
        slot.try_remove().is_ok()
    } else {
        slot.try_update(previous).is_ok()
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use std::sync::Arc;

    use crate::hash::epoch::Epoch;
    use crate::hash::hlog::HlogOptions;
    use crate::hash::hot::{HotLog, HotRead};
    use crate::hash::record::LogValue;
    use crate::storage::MemBlocks;

    /// A hot log of four 4 KiB frames with a read cache of `pages` 4 KiB pages.
    fn store(pages: u64) -> HotLog {
        let options = HlogOptions {
            page_bits: 12,
            frames: 4,
            mutable_pages: 2,
        };
        HotLog::with_read_cache(
            256,
            options,
            Arc::new(MemBlocks::new()),
            Arc::new(Epoch::new()),
            pages * 4096,
        )
        .unwrap()
    }

    fn key(i: u64) -> Vec<u8> {
        format!("cold{i}").into_bytes()
    }

    fn value(i: u64) -> Vec<u8> {
        vec![i as u8; 40 + (i % 50) as usize]
    }

    /// Reads `key(i)` as F2 does for a key only the cold log holds (whose value is
    /// `value(i)`): answers whether the read cache did.
    fn read_cold(store: &HotLog, guard: &crate::hash::epoch::EpochGuard<'_, '_>, i: u64) -> bool {
        match store.read(guard, &key(i)).unwrap() {
            HotRead::Found(found) => {
                assert_eq!(found, Some(LogValue::inline(value(i))), "key {i}");
                true
            }
            HotRead::NotFound(ticket) => {
                store.cache_older(guard, &key(i), &LogValue::inline(value(i)), ticket);
                false
            }
        }
    }

    #[test]
    fn with_admission_a_key_is_copied_on_its_second_read_from_disk() {
        // Keys only the cold log has: the first read of each leaves its fingerprint and
        // copies nothing; the second copies it; the third is answered by the copy. A
        // key read once while the filter still remembers another key is not copied.
        let store = store(8).admitting(true);
        let mut handle = store.epoch().register();
        let guard = handle.protect();
        let stats = || store.read_cache_stats().unwrap();
        for i in 0..20 {
            assert!(!read_cold(&store, &guard, i), "first read of {i}");
        }
        assert_eq!((stats().inserts, stats().not_admitted), (0, 20));
        for i in 0..20 {
            assert!(!read_cold(&store, &guard, i), "second read of {i}");
        }
        // Two keys whose slots are one refuse each other (the table is direct-mapped);
        // the rest are copied.
        let (copied, refused) = (stats().inserts, stats().not_admitted - 20);
        assert_eq!(copied + refused, 20);
        assert!(copied >= 15, "{copied} of 20 copied on their second read");
        let hits = (0..20).filter(|&i| read_cold(&store, &guard, i)).count() as u64;
        assert_eq!(hits, copied, "every copy answers the third read");
        assert_eq!(stats().hits, copied);
        // Without the filter, every read from disk is copied.
        let plain = store_plain_reads();
        assert_eq!(plain, (20, 0));
    }

    /// Reads 20 cold keys once through a cache without admission: (copies, refused).
    fn store_plain_reads() -> (u64, u64) {
        let store = store(8);
        let mut handle = store.epoch().register();
        let guard = handle.protect();
        for i in 0..20 {
            read_cold(&store, &guard, i);
        }
        let stats = store.read_cache_stats().unwrap();
        (stats.inserts, stats.not_admitted)
    }

    #[test]
    fn hot_records_read_in_memory_get_a_copy_as_their_page_leaves_memory() {
        // Hot records of 60 keys in the log's first pages; the even keys are read while
        // those pages are in memory, and key 0 is written again after its read. Records
        // of other keys then push the pages out of the log's four frames: each even key
        // but 0 gets a copy as its page leaves (the cache answers it, with its value,
        // past the admission filter); the odd keys do not (their reads go to the
        // device), nor does key 0's old record, which is no longer its newest.
        let store = store(8).admitting(true);
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let hot = |i: u64| format!("hot{i}").into_bytes();
        for i in 0..60 {
            store.upsert(&mut guard, &hot(i), Some(&value(i))).unwrap();
        }
        for i in (0..60).step_by(2) {
            assert!(matches!(
                store.read(&guard, &hot(i)).unwrap(),
                HotRead::Found(_)
            ));
        }
        let first_pages = store.log().addresses().tail;
        store.upsert(&mut guard, &hot(0), Some(b"newer")).unwrap();
        let mut filler = 1_000;
        while store.log().addresses().head < first_pages {
            store
                .upsert(&mut guard, &hot(filler), Some(&value(filler)))
                .unwrap();
            filler += 1;
            guard.refresh();
        }
        let stats = || store.read_cache_stats().unwrap();
        assert_eq!(stats().kept, 29, "{:?}", stats());
        for i in 1..60 {
            let hits = stats().hits;
            match store.read(&guard, &hot(i)).unwrap() {
                HotRead::Found(found) => {
                    assert_eq!(found, Some(LogValue::inline(value(i))), "key {i}");
                }
                HotRead::NotFound(_) => panic!("key {i} is in the hot log"),
            }
            let hit = stats().hits > hits;
            assert_eq!(hit, i % 2 == 0, "key {i}: answered by a copy");
        }
        match store.read(&guard, &hot(0)).unwrap() {
            HotRead::Found(found) => assert_eq!(found, Some(LogValue::inline(b"newer".to_vec()))),
            HotRead::NotFound(_) => panic!("key 0 is in the hot log"),
        }
    }

    #[test]
    fn too_small_a_read_cache_is_refused() {
        let options = HlogOptions {
            page_bits: 12,
            frames: 4,
            mutable_pages: 2,
        };
        let made = HotLog::with_read_cache(
            16,
            options,
            Arc::new(MemBlocks::new()),
            Arc::new(Epoch::new()),
            2 * 4096,
        );
        assert!(matches!(made, Err(crate::error::Error::InvalidConfig(_))));
    }

    #[test]
    fn copies_of_cold_keys_cycle_through_the_pages_and_their_entries_go_with_them() {
        // 3,000 keys only the cold log has, read in turn through a three-page cache: each
        // read caches its key (creating a hot index entry for a copy whose chain has no
        // hot record); evicting the copy removes the entry again, so the hot index does
        // not keep every key ever read.
        let store = store(3);
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        for i in 0..3_000 {
            assert!(!read_cold(&store, &guard, i), "key {i} was cached before");
            guard.refresh();
        }
        let stats = store.read_cache_stats().unwrap();
        assert!(stats.pages_evicted > 20, "{stats:?}");
        assert!(stats.inserts > 2_900, "{stats:?}");
        let entries = store.index_entries(&guard);
        assert!(
            entries < 400,
            "{entries} hot index entries for a cache of three pages"
        );
        // The newest keys are still cached and hit.
        assert!(read_cold(&store, &guard, 2_999));
        let rc = store.read_cache().unwrap();
        assert_eq!(rc.memory_bytes(), 3 * 4096);
        let (head, tail) = rc.head_and_tail();
        assert!(
            head > 0 && tail - head <= 3 * 4096,
            "head {head}, tail {tail}"
        );
    }

    #[test]
    fn a_copy_read_again_in_the_older_half_gets_a_second_chance() {
        // Key 0 is read again every few reads of other keys: each time its copy has aged
        // into the older half it is copied to the tail, so it is never evicted and every
        // read of it after the first hits.
        let store = store(5);
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        assert!(!read_cold(&store, &guard, 0));
        for i in 1..3_000 {
            read_cold(&store, &guard, i);
            if i % 20 == 0 {
                assert!(
                    read_cold(&store, &guard, 0),
                    "key 0 was evicted by read {i}"
                );
            }
            guard.refresh();
        }
        let stats = store.read_cache_stats().unwrap();
        assert!(
            stats.copies_to_tail > 5 && stats.evictions > 1_000,
            "{stats:?}"
        );
    }

    #[test]
    fn writes_replace_copies_and_reads_see_the_writes() {
        let store = store(4);
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        for i in 0..50 {
            read_cold(&store, &guard, i);
        }
        for i in 0..50 {
            assert!(read_cold(&store, &guard, i), "key {i} is cached");
        }
        for i in (0..50).step_by(2) {
            store.upsert(&mut guard, &key(i), Some(b"new")).unwrap();
        }
        for i in (1..50).step_by(4) {
            store.upsert(&mut guard, &key(i), None).unwrap();
        }
        for i in 0..50 {
            let want = match i % 4 {
                0 | 2 => Some(b"new".to_vec()),
                1 => None,
                _ => Some(value(i)),
            };
            match store.read(&guard, &key(i)).unwrap() {
                HotRead::Found(found) => {
                    assert_eq!(found, want.map(LogValue::inline), "key {i}");
                }
                HotRead::NotFound(_) => panic!("key {i}: a copy or a hot record answers"),
            }
        }
        let stats = store.read_cache_stats().unwrap();
        assert_eq!(stats.invalidations, 25 + 13, "{stats:?}");
    }

    #[test]
    fn the_index_doubles_with_copies_at_chain_heads() {
        let store = store(8);
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        // Hot records of some keys, then copies of cold keys in front of them in shared
        // chains (256 expected keys: 64 buckets).
        for i in 0..100u64 {
            store
                .upsert(&mut guard, format!("hot{i}").as_bytes(), Some(&[7; 30]))
                .unwrap();
        }
        for i in 0..200 {
            read_cold(&store, &guard, i);
        }
        let before = store.index_buckets(&guard);
        assert!(store.grow_index(&mut guard));
        assert!(store.grow_index(&mut guard));
        assert_eq!(store.index_buckets(&guard), before * 4);
        let hits = store.read_cache_stats().unwrap().hits;
        for i in 0..200 {
            read_cold(&store, &guard, i);
        }
        for i in 0..100u64 {
            assert_eq!(
                store.get(&guard, format!("hot{i}").as_bytes()).unwrap(),
                Some(vec![7; 30])
            );
        }
        let hits = store.read_cache_stats().unwrap().hits - hits;
        assert!(hits > 100, "{hits} of 200 reads hit after the grows");
    }
}
