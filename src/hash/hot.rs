//! The hot log with its index: FASTER's store (SIGMOD 2018, sections 4-6), which F2
//! keeps as its write-hot tier. Point reads, blind upserts, read-modify-writes and
//! deletes over a [`HashIndex`] whose entries point at the newest record of each hash
//! chain in a [`HybridLog`].
//!
//! **The update scheme** (FASTER's tables 1 and 2). The newest record of the key, found
//! by walking the chain from the index entry, decides:
//!
//! | where the record is | upsert | read-modify-write |
//! |---|---|---|
//! | at or above READ_ONLY | in place (same value length) | in place, under the record's lock |
//! | fuzzy: SAFE_READ_ONLY..READ_ONLY | new record at the tail | retry later (a thread may still update it in place) |
//! | below SAFE_READ_ONLY (memory or disk) | new record at the tail | copy-update to the tail |
//! | no record | new record | new record from the initial value |
//!
//! A new record is linked in front of the chain's head and published with a
//! compare-and-swap of the index entry, expecting the head the operation started from.
//! If the swap fails (another thread linked a record meanwhile), the new record is
//! marked invalid and the operation starts again, so a read-modify-write never misses
//! an update made after it read.
//!
//! **Sealing.** A read-modify-write whose result does not fit the old record in place
//! copies it to the tail while holding the old record's lock, and marks the old record
//! invalid before unlocking: an in-place writer waiting for the lock then finds it
//! invalid and starts again from the index, where the new record is.
//!
//! **The read cache** (`read_cache.rs`, F2's only). An entry may name a copy in the read
//! cache (address bit 47), in front of the chain's hot-log records. Reads answer from a
//! valid copy of their key and copy records they read from disk into the cache; writes
//! mark a copy of their key invalid and link their record past the copy, so their swap
//! of the entry unlinks it; compaction's liveness check starts past it.
//!
//! **Values out of line.** A record may hold the reference of a value the database's
//! value store keeps (`record.rs`). Such a record is never updated in place, whether
//! its value or the new one is out of line: the write appends a new record, and the
//! old one, shadowed, stays in the log until compaction drops it and reports its
//! reference (`f2.rs`). So every reference leaves the log with its record, and
//! compaction is the one place that tells the value store a value is unreachable. A
//! read-modify-write never hands a reference to its update: it answers
//! [`Update::out_of_line`] instead, and its caller reads the value and writes.
//!
//! Every operation runs under an epoch guard and never refreshes it while it holds an
//! index entry slot or a record view: when the tail's page is full, or a record is in
//! the fuzzy region, it drops them, refreshes, and starts again.

use std::sync::Arc;

use super::bucket::{INVALID_ADDRESS, KeyHash};
use super::epoch::{Epoch, EpochGuard};
use super::hlog::{Alloc, Fetched, HlogOptions, HybridLog};
use super::index::{ChainLink, EntrySlot, HashIndex, IndexOptions, RecordHashes};
use super::read_cache::{READ_CACHE_BIT, ReadCache, ReadCacheStats, is_cached};
use super::record::{DiskRecord, Header, LogValue, MemRecord, record_size_bytes};
use crate::error::{Error, Result};
use crate::storage::BlockDevice;

/// The 64-bit hash of a key (a multiply-xorshift over 8-byte words and a final mix:
/// bucket bits from the low end, the tag from the top, both well mixed).
pub(crate) fn hash_key(key: &[u8]) -> KeyHash {
    const M: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (key.len() as u64).wrapping_mul(M) ^ 0x2545_F491_4F6C_DD1D;
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(M).rotate_left(29);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(last)).wrapping_mul(M);
    // Final avalanche (the murmur3 finalizer).
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    KeyHash(h)
}

/// How a store's keys become index hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keying {
    /// Any key, through [`hash_key`].
    Hashed,
    /// Keys that are 8-byte little-endian numbers, each below `2^(bucket_bits + 14)`
    /// (the cold index's chunk numbers). The number's low bits choose the bucket and
    /// its bits from `bucket_bits` up, plus one, are the tag, so at `2^bucket_bits`
    /// buckets or more (an index only grows) no two keys share an entry: an entry's
    /// chain holds one key's records, and its head is that key's newest record.
    Numbered { bucket_bits: u32 },
}

impl Keying {
    /// Numbered keying for an index of `buckets` buckets now.
    pub(crate) fn numbered(buckets: usize) -> Keying {
        Keying::Numbered {
            bucket_bits: buckets.max(1).ilog2(),
        }
    }

    /// The index hash of `key`.
    pub(crate) fn hash(self, key: &[u8]) -> KeyHash {
        self.own_entry(key).unwrap_or_else(|| hash_key(key))
    }

    /// The hash of a key that has an entry of its own (see [`Keying::Numbered`]);
    /// `None` for any other key (hashed, and perhaps sharing an entry).
    fn own_entry(self, key: &[u8]) -> Option<KeyHash> {
        let Keying::Numbered { bucket_bits } = self else {
            return None;
        };
        let n = u64::from_le_bytes(<[u8; 8]>::try_from(key).ok()?);
        let tag = (n >> bucket_bits) + 1;
        (n < 1 << 48 && tag < 1 << super::bucket::TAG_BITS)
            .then_some(KeyHash(n | (tag << (64 - super::bucket::TAG_BITS))))
    }
}

/// What a read-modify-write does with the current value (`None`: no record).
pub(crate) trait Update: Sync {
    fn update(&self, old: Option<&[u8]>) -> Vec<u8>;

    /// Whether `new`, what [`Update::update`] just returned, is refused: the
    /// read-modify-write then writes nothing and answers `new` (the caller knows why it
    /// refused it). So a refused result is never visible, not even for a moment.
    fn refuses(&self, _new: &[u8]) -> bool {
        false
    }

    /// Called in place of [`Update::update`] when the old value is out of line (its
    /// record holds a reference, which an update must never take for the value): the
    /// read-modify-write writes nothing and answers what this returns. Its caller reads
    /// the whole value and writes on its own (`HashStore::rmw_with`).
    fn out_of_line(&self) -> Vec<u8> {
        Vec::new()
    }
}

impl<F: Fn(Option<&[u8]>) -> Vec<u8> + Sync> Update for F {
    fn update(&self, old: Option<&[u8]>) -> Vec<u8> {
        self(old)
    }
}

/// Counters of what the store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HotStats {
    pub(crate) in_place_updates: u64,
    pub(crate) appended_records: u64,
    /// Records its chain walks read from the device ([`HybridLog::record_reads`]).
    pub(crate) disk_reads: u64,
    pub(crate) retries: u64,
}

#[derive(Default)]
struct Counters {
    in_place_updates: std::sync::atomic::AtomicU64,
    appended_records: std::sync::atomic::AtomicU64,
    retries: std::sync::atomic::AtomicU64,
}

fn bump(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The hot log and its index.
pub(crate) struct HotLog {
    epoch: Arc<Epoch>,
    index: HashIndex,
    log: Arc<HybridLog>,
    /// F2's read cache, whose copies head hot chains (`read_cache.rs`); `None` when off.
    read_cache: Option<Arc<ReadCache>>,
    /// How keys become index hashes.
    keying: Keying,
    counters: Counters,
}

/// Where the hot log's part of a read ended.
pub(crate) enum HotRead {
    /// The answer: a value, or `None` for a tombstone.
    Found(Option<LogValue>),
    /// The hot log has no record of the key (above BEGIN): the older tier answers, and
    /// what it finds may be cached with [`HotLog::cache_older`] and this ticket.
    NotFound(CacheTicket),
}

/// What a read saw of its key's chain before it looked at the record it may cache: a
/// copy is linked only if the chain still looks the same.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CacheTicket {
    /// The entry's address (`None`: no entry).
    entry: Option<u64>,
    /// The hot-log address a copy links to: the entry's, or its copy's previous one.
    hot_head: u64,
    /// The hot log's BEGIN before the entry was read.
    begin: u64,
    /// Whether to cache at all (the cache is on, and no write is replacing the copy of
    /// this key at the head).
    allowed: bool,
}

/// One try of an operation: done, or what must happen (under a refreshed guard) before
/// the next try.
pub(crate) enum Step<T> {
    Done(T),
    /// Drop everything, refresh, start again.
    Retry,
    /// The tail's page is full: open the next one (refreshing), then start again.
    PageFull(u64),
}

/// The newest record of a key, as a chain walk found it.
enum Found {
    /// In memory at this address.
    Memory(u64, MemRecord),
    /// On disk at this address.
    Disk(u64, DiskRecord),
    None,
}

impl HotLog {
    /// An empty store: an index sized for `expected_keys`, a log of `log` over `device`.
    pub(crate) fn new(
        expected_keys: u64,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
    ) -> Result<HotLog> {
        HotLog::with_epoch(expected_keys, log, device, Arc::new(Epoch::new()))
    }

    /// As [`HotLog::new`], on an epoch shared with other parts of a store.
    pub(crate) fn with_epoch(
        expected_keys: u64,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
    ) -> Result<HotLog> {
        HotLog::with_read_cache(expected_keys, log, device, epoch, 0)
    }

    /// As [`HotLog::with_epoch`], with a read cache of `read_cache_memory_bytes` in pages
    /// of the log's size (0: none).
    pub(crate) fn with_read_cache(
        expected_keys: u64,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
        read_cache_memory_bytes: u64,
    ) -> Result<HotLog> {
        let read_cache = Self::new_read_cache(read_cache_memory_bytes, log, &epoch)?;
        let log =
            HybridLog::new(log, device, Arc::clone(&epoch))?.tracking_reads(read_cache.is_some());
        Ok(HotLog {
            index: HashIndex::new(Arc::clone(&epoch), IndexOptions::for_keys(expected_keys)),
            log: Arc::new(log),
            epoch,
            read_cache,
            keying: Keying::Hashed,
            counters: Counters::default(),
        })
    }

    /// This store, its read cache (if any) copying only keys read from disk twice
    /// lately ([`ReadCache::admit`]) if `admission`.
    pub(crate) fn admitting(mut self, admission: bool) -> HotLog {
        if admission && let Some(rc) = self.read_cache.as_mut().and_then(Arc::get_mut) {
            rc.admit_on_second_read();
        }
        self
    }

    /// As [`HotLog::with_epoch`], for keys that are the numbers below `keys` (8 bytes,
    /// little-endian): each key gets an index entry of its own ([`Keying::Numbered`]).
    /// The cold index's chunk store.
    pub(crate) fn numbered(
        keys: u64,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
    ) -> Result<HotLog> {
        let mut store = HotLog::with_epoch(keys, log, device, epoch)?;
        let buckets = IndexOptions::for_keys(keys).buckets;
        store.keying = Keying::numbered(buckets);
        Ok(store)
    }

    /// A read cache of `bytes` (none for 0) beside a log of `log`'s pages.
    fn new_read_cache(
        bytes: u64,
        log: HlogOptions,
        epoch: &Arc<Epoch>,
    ) -> Result<Option<Arc<ReadCache>>> {
        Ok(match bytes {
            0 => None,
            bytes => Some(Arc::new(ReadCache::new(
                bytes,
                log.page_bits,
                Arc::clone(epoch),
            )?)),
        })
    }

    /// The store a checkpoint captured as `extent` of a log over `device` (see
    /// [`HybridLog::recover`]), its index of `buckets` home buckets (the size it had
    /// then) rebuilt from the log: every valid record from BEGIN up, in address order,
    /// becomes the head of its entry's chain.
    ///
    /// Why that gives every key its newest record below the checkpoint's tail: a record
    /// linked to the head its entry had, so a chain holds its entry's records newest
    /// first and a new head has a higher address than the one it links to. With the
    /// index at its size of then (never smaller than any size it had before: it only
    /// doubles), two keys that share an entry now shared one at every earlier size, so
    /// the entry's newest record links, through older records, to each of them.
    pub(crate) fn recover(
        buckets: usize,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
        extent: super::hlog::LogExtent,
        read_cache_memory_bytes: u64,
        keying: Keying,
    ) -> Result<HotLog> {
        if !buckets.is_power_of_two() || buckets > 1 << 40 {
            return Err(Error::Corrupted {
                page: 0,
                reason: format!("a hash index of {buckets} buckets is impossible"),
            });
        }
        let options = IndexOptions {
            buckets,
            ..IndexOptions::for_keys(1)
        };
        let read_cache = Self::new_read_cache(read_cache_memory_bytes, log, &epoch)?;
        let log = HybridLog::recover(log, device, Arc::clone(&epoch), extent)?
            .tracking_reads(read_cache.is_some());
        let store = HotLog {
            index: HashIndex::new(Arc::clone(&epoch), options),
            log: Arc::new(log),
            read_cache,
            epoch,
            keying,
            counters: Counters::default(),
        };
        let mut handle = store.epoch.register();
        let guard = handle.protect();
        let page_bytes = store.log.page_bytes();
        let mut from = extent.begin;
        while from < extent.tail {
            let until = (from - from % page_bytes + page_bytes).min(extent.tail);
            for item in store.log.records_in(&guard, from, until)? {
                let (address, record) = item?;
                if record.header.is_invalid() {
                    continue;
                }
                let mut slot = store
                    .index
                    .find_or_create(&guard, store.keying.hash(&record.key));
                if slot.address() < address && slot.try_update(address).is_err() {
                    return Err(Error::Corrupted {
                        page: address,
                        reason: "a hash index entry changed while recovery rebuilt it".into(),
                    });
                }
            }
            from = until;
        }
        drop(guard);
        drop(handle);
        Ok(store)
    }

    /// The epoch every operation is protected by: register a handle per thread.
    pub(crate) fn epoch(&self) -> &Arc<Epoch> {
        &self.epoch
    }

    /// The log (for its addresses, flushes and tests).
    pub(crate) fn log(&self) -> &HybridLog {
        &self.log
    }

    pub(crate) fn stats(&self) -> HotStats {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        HotStats {
            in_place_updates: load(&self.counters.in_place_updates),
            appended_records: load(&self.counters.appended_records),
            disk_reads: self.log.record_reads(),
            retries: load(&self.counters.retries),
        }
    }

    /// What the read cache did, if it is on.
    pub(crate) fn read_cache_stats(&self) -> Option<ReadCacheStats> {
        self.read_cache.as_ref().map(|rc| rc.stats())
    }

    /// The read cache, if it is on.
    pub(crate) fn read_cache(&self) -> Option<&ReadCache> {
        self.read_cache.as_deref()
    }

    /// The copy an entry's `address` names, if it names one.
    fn copy_at(&self, address: u64) -> Option<(&ReadCache, MemRecord)> {
        let rc = self.read_cache.as_deref()?;
        // SAFETY: callers pass an address they loaded from an entry under the guard they
        // hold and use the view before refreshing it.
        is_cached(address).then(|| (rc, unsafe { rc.record(address) }))
    }

    /// The first hot-log address of the chain whose entry holds `address`: past the copy
    /// at its head, if any.
    fn hot_head(&self, address: u64) -> u64 {
        match self.copy_at(address) {
            Some((_, copy)) => copy.header().previous(),
            None => address,
        }
    }

    /// Walks the chain from `address` to the newest record of `key` at or above BEGIN.
    fn find_record(&self, guard: &EpochGuard<'_, '_>, key: &[u8], address: u64) -> Result<Found> {
        self.find_record_above(guard, key, address, INVALID_ADDRESS)
    }

    /// [`HotLog::find_record`] that stops below `floor` (chains only go down), as if
    /// the chain ended there: a blind upsert wants only a record it can update in place,
    /// and so never reads the device (FASTER's upsert walks the chain in memory only).
    fn find_record_above(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        mut address: u64,
        floor: u64,
    ) -> Result<Found> {
        while address != INVALID_ADDRESS && address >= floor {
            // Below BEGIN (truncated, perhaps while this walk ran) the chain ends.
            let Some(fetched) = self.log.fetch(guard, address)? else {
                break;
            };
            match fetched {
                Fetched::Memory(record) => {
                    let header = record.header();
                    if !header.is_invalid() && record.key_equals(key) {
                        return Ok(Found::Memory(address, record));
                    }
                    address = header.previous();
                }
                Fetched::Disk(record) => {
                    if !record.header.is_invalid() && record.key == key {
                        return Ok(Found::Disk(address, record));
                    }
                    address = record.header.previous();
                }
            }
        }
        Ok(Found::None)
    }

    /// The newest record of `key` in this log: `Some(None)` for a tombstone, `None` if
    /// the log has no record of it (above BEGIN).
    pub(crate) fn lookup(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
    ) -> Result<Option<Option<LogValue>>> {
        Ok(match self.read_inner(guard, key, false)? {
            HotRead::Found(found) => Some(found),
            HotRead::NotFound(_) => None,
        })
    }

    /// F2's read of the hot log with the read cache: a valid copy of the key at its
    /// chain's head answers (and is copied to the cache's tail if it is in the older
    /// half); a record of the key read from disk is copied into the cache. If the hot log
    /// has no record of the key, the answer carries the ticket with which
    /// [`HotLog::cache_older`] caches what the cold log finds.
    pub(crate) fn read(&self, guard: &EpochGuard<'_, '_>, key: &[u8]) -> Result<HotRead> {
        self.read_inner(guard, key, true)
    }

    /// Caches `value`, which the older tier holds for `key` (the hot log has no record
    /// of it, as `ticket` says), unless the key's chain changed since the ticket.
    pub(crate) fn cache_older(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        value: &LogValue,
        ticket: CacheTicket,
    ) {
        if ticket.allowed {
            self.insert_copy(guard, key, value, ticket);
        }
    }

    fn read_inner(&self, guard: &EpochGuard<'_, '_>, key: &[u8], caching: bool) -> Result<HotRead> {
        // BEGIN first, then the entry: see `link_copy`.
        let begin = self.log.addresses().begin;
        let entry = self
            .index
            .find(guard, self.keying.hash(key))
            .map(|slot| slot.address());
        let mut ticket = CacheTicket {
            entry,
            hot_head: entry.unwrap_or(INVALID_ADDRESS),
            begin,
            allowed: caching && self.read_cache.is_some(),
        };
        if let Some((rc, copy)) = entry.and_then(|address| self.copy_at(address)) {
            let header = copy.header();
            ticket.hot_head = header.previous();
            if copy.key_equals(key) {
                if !header.is_invalid() {
                    let (_, value) = copy.read_log_value();
                    let value = value.unwrap_or_default();
                    rc.count_hit();
                    let address = entry.expect("a copy came from the entry");
                    if caching && rc.is_old(address) {
                        self.copy_to_tail(guard, rc, copy, address, key, &value, begin);
                    }
                    return Ok(HotRead::Found(Some(value)));
                }
                // A write of this key is replacing the copy: cache nothing behind it.
                ticket.allowed = false;
            }
        }
        Ok(match self.find_record(guard, key, ticket.hot_head)? {
            Found::Memory(address, record) => {
                if caching {
                    self.log.note_read(address);
                }
                HotRead::Found(record.read_log_value().1)
            }
            Found::Disk(_, record) => match record.log_value() {
                None => HotRead::Found(None),
                Some(value) => {
                    if ticket.allowed {
                        self.insert_copy(guard, key, &value, ticket);
                    }
                    HotRead::Found(Some(value))
                }
            },
            Found::None => HotRead::NotFound(ticket),
        })
    }

    /// Copies `key`'s `value` into the read cache and links the copy at the head of the
    /// key's chain if the chain is still as `ticket` saw it; answers whether it did.
    fn insert_copy(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        value: &LogValue,
        ticket: CacheTicket,
    ) -> bool {
        let Some(rc) = self.read_cache.as_deref() else {
            return false;
        };
        if !rc.admit(self.keying.hash(key)) {
            return false;
        }
        self.insert_admitted_copy(guard, rc, key, value, ticket)
    }

    /// [`HotLog::insert_copy`] past the admission filter.
    fn insert_admitted_copy(
        &self,
        guard: &EpochGuard<'_, '_>,
        rc: &ReadCache,
        key: &[u8],
        value: &LogValue,
        ticket: CacheTicket,
    ) -> bool {
        let Some(copy) = self.new_copy(guard, rc, key, value, ticket.hot_head) else {
            rc.count_insert(false);
            return false;
        };
        let linked = self.link_copy(guard, key, copy.0, ticket);
        if !linked {
            copy.1.invalidate();
        }
        rc.count_insert(linked);
        linked
    }

    /// Second chance for the hot log's records (a departure from F2): a record read
    /// while in memory whose page is leaving memory (`[from, until)`, HEAD about to
    /// pass it, see [`HybridLog::new_page_leaving`]) gets a copy in the read cache if it
    /// is still its key's newest record (its entry names it), past the admission
    /// filter: it was read once already. Without it the keys only read stay in memory
    /// only while some write keeps their record in the log's memory.
    fn keep_read_records(&self, guard: &EpochGuard<'_, '_>, from: u64, until: u64) {
        let Some(rc) = self.read_cache.as_deref() else {
            return;
        };
        // BEGIN first, then the entries: see `link_copy`.
        let begin = self.log.addresses().begin;
        let page_bytes = self.log.page_bytes();
        let mut page = from - from % page_bytes;
        while page < until {
            // Only the records read: a page of records nobody read costs a scan of its
            // read bits (a five-hundred-twelfth of it), not of its records.
            for at in self.log.read_records_of(page) {
                // SAFETY: at or above HEAD as this protected thread saw it (the hook's
                // contract) and before its next refresh; a read bit marks the start of
                // a record a reader found published in this frame's page.
                let record = unsafe { self.log.record(at) };
                let header = record.header();
                if !header.is_invalid() && !header.is_tombstone() {
                    let key = record.key();
                    let entry = self
                        .index
                        .find(guard, self.keying.hash(&key))
                        .map(|slot| slot.address());
                    if entry == Some(at)
                        && let (_, Some(value)) = record.read_log_value()
                    {
                        let ticket = CacheTicket {
                            entry,
                            hot_head: at,
                            begin,
                            allowed: true,
                        };
                        if self.insert_admitted_copy(guard, rc, &key, &value, ticket) {
                            rc.count_kept();
                        }
                    }
                }
            }
            page += page_bytes;
        }
    }

    /// Second chance: copies a copy that was read again in the older half of the cache to
    /// its tail, in its place at the head of the chain.
    #[allow(clippy::too_many_arguments)]
    fn copy_to_tail(
        &self,
        guard: &EpochGuard<'_, '_>,
        rc: &ReadCache,
        old: MemRecord,
        old_address: u64,
        key: &[u8],
        value: &LogValue,
        begin: u64,
    ) {
        let previous = old.header().previous();
        let Some((address, copy)) = self.new_copy(guard, rc, key, value, previous) else {
            return;
        };
        let ticket = CacheTicket {
            entry: Some(old_address),
            hot_head: previous,
            begin,
            allowed: true,
        };
        if self.link_copy(guard, key, address, ticket) {
            old.invalidate();
            rc.count_copy_to_tail();
        } else {
            copy.invalidate();
        }
    }

    /// A copy of `key` and `value` at the read cache's tail, linked to `previous`, not
    /// yet in the index; `None` if it does not fit or the cache has no space now. A
    /// value out of line is copied as its reference: the copy owns nothing (the record
    /// it copies does), and never reports a value unreachable.
    fn new_copy(
        &self,
        guard: &EpochGuard<'_, '_>,
        rc: &ReadCache,
        key: &[u8],
        value: &LogValue,
        previous: u64,
    ) -> Option<(u64, MemRecord)> {
        let size = record_size_bytes(key.len(), value.bytes.len()) as u64;
        if size > rc.page_bytes() {
            return None;
        }
        let begin = self.log.addresses().begin;
        let address = rc.allocate(guard, &self.index, begin, size)?;
        // SAFETY: just allocated by this thread, which fills it before any refresh.
        let copy = unsafe { rc.record(address) };
        copy.init_value(
            Header::new(previous, false),
            key,
            &value.bytes,
            value.out_of_line,
        );
        Some((address, copy))
    }

    /// Swaps the copy at `address` into `key`'s entry if the entry still holds what
    /// `ticket` saw and the hot log's BEGIN has not moved since.
    ///
    /// The BEGIN check closes the one way an entry can come back to a word a reader saw
    /// after a write: through empty (or address 0). A write's record leaves the index
    /// only when a truncation moves BEGIN past it (the sweep of removed entries, or an
    /// eviction whose copy links below BEGIN); the reader loaded BEGIN before the entry,
    /// the truncation moves BEGIN before it removes anything, and this check comes after
    /// the entry was read again, so it sees BEGIN moved.
    fn link_copy(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        address: u64,
        ticket: CacheTicket,
    ) -> bool {
        let hash = self.keying.hash(key);
        let slot = match ticket.entry {
            None => Some(self.index.find_or_create(guard, hash)),
            Some(_) => self.index.find(guard, hash),
        };
        let Some(mut slot) = slot else {
            return false;
        };
        if slot.address() != ticket.entry.unwrap_or(INVALID_ADDRESS) {
            return false;
        }
        if self.log.addresses().begin != ticket.begin {
            if slot.address() == INVALID_ADDRESS {
                // Perhaps created just now; an entry with no record would never be
                // swept. (A writer holding it starts again.)
                let _ = slot.try_remove();
            }
            return false;
        }
        slot.try_update(address).is_ok()
    }

    /// The address of the newest record of `key`, if the log has one above BEGIN: a
    /// record at another address is not live (compaction's liveness check).
    pub(crate) fn newest_address(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
    ) -> Result<Option<u64>> {
        let Some(slot) = self.index.find(guard, self.keying.hash(key)) else {
            return Ok(None);
        };
        // A copy in the read cache is not a record of the hot log.
        let head = self.hot_head(slot.address());
        drop(slot);
        Ok(match self.find_record(guard, key, head)? {
            Found::Memory(address, _) | Found::Disk(address, _) => Some(address),
            Found::None => None,
        })
    }

    /// Adds to `held` the references of the values out of line that valid records of
    /// `key` at or above `floor` hold: the chain is walked down to `floor` (chains only
    /// go down), past a copy in the read cache (a copy holds nothing: see
    /// `F2::report_unreachable`).
    pub(crate) fn references_held(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        floor: u64,
        held: &mut std::collections::HashSet<Vec<u8>>,
    ) -> Result<()> {
        let Some(slot) = self.index.find(guard, self.keying.hash(key)) else {
            return Ok(());
        };
        let address = self.hot_head(slot.address());
        drop(slot);
        self.log
            .references_on_chain(guard, key, address, floor, held)
    }

    /// Whether the record at `address` is the newest record of `key` (compaction's
    /// liveness check, which holds the record): the chain is walked down to `address`
    /// and no further, and the record there is not read again.
    pub(crate) fn is_newest(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        address: u64,
    ) -> Result<bool> {
        let Some(slot) = self.index.find(guard, self.keying.hash(key)) else {
            return Ok(false);
        };
        // A copy in the read cache is not a record of the hot log.
        let head = self.hot_head(slot.address());
        drop(slot);
        self.reaches_first(guard, key, head, address)
    }

    /// Whether the chain from `head` reaches `address` before any valid record of `key`
    /// (so the record there, of `key`, is its newest): walks down to `address` and no
    /// further, without reading the record there.
    fn reaches_first(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        head: u64,
        address: u64,
    ) -> Result<bool> {
        if head > address && self.keying.own_entry(key).is_some() {
            // The key's entry holds only its records, and a head is a linked (valid)
            // record: a newer one, found without reading it from the disk.
            return Ok(false);
        }
        let mut at = head;
        // Chains only go down: a record of `key` above `address` is newer.
        while at != INVALID_ADDRESS && at > address {
            let Some(fetched) = self.log.fetch(guard, at)? else {
                return Ok(false);
            };
            let (header, is_key) = match fetched {
                Fetched::Memory(record) => (record.header(), record.key_equals(key)),
                Fetched::Disk(record) => (record.header, record.key == key),
            };
            if is_key && !header.is_invalid() {
                return Ok(false);
            }
            at = header.previous();
        }
        Ok(at == address)
    }

    /// One try of Conditional-Insert within this log, for compacting it into itself (the
    /// cold index's chunk store): appends `key` with `value` (a tombstone for `None`),
    /// the record at `source`'s, in front of the key's chain while `source` is still its newest record, and
    /// answers `Done(false)` once a newer one exists. The check and the link are one
    /// step: the entry is swapped expecting the head the check walked from. Never
    /// refreshes `guard`; settle other steps with [`HotLog::settle`].
    pub(crate) fn try_copy_if_newest(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
        source: u64,
    ) -> Result<Step<bool>> {
        let Some(mut slot) = self.index.find(guard, self.keying.hash(key)) else {
            return Ok(Step::Done(false));
        };
        if !self.reaches_first(guard, key, self.hot_head(slot.address()), source)? {
            return Ok(Step::Done(false));
        }
        let (bytes, tombstone) = (value.unwrap_or(&[]), value.is_none());
        Ok(
            match self.append(guard, &mut slot, key, (bytes, false), tombstone)? {
                Step::Done(()) => Step::Done(true),
                Step::Retry => Step::Retry,
                Step::PageFull(full) => Step::PageFull(full),
            },
        )
    }

    /// The value of `key`, if it has one.
    pub(crate) fn get(&self, guard: &EpochGuard<'_, '_>, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.lookup(guard, key)?.flatten().map(LogValue::into_bytes))
    }

    /// Sets `key` to `value` (or deletes it, for `None`).
    pub(crate) fn upsert(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<()> {
        self.upsert_value(guard, key, value, false)
    }

    /// [`HotLog::upsert`] of a value out of line (`value` is its reference) if
    /// `out_of_line`. Returns without refreshing `guard` after the record is linked.
    pub(crate) fn upsert_value(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
        out_of_line: bool,
    ) -> Result<()> {
        self.run(guard, |this, guard| {
            this.try_upsert(guard, key, value, out_of_line)
        })
    }

    /// Replaces the value of `key` with `update(old)` atomically; returns the new value.
    pub(crate) fn rmw(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        update: &dyn Update,
    ) -> Result<Vec<u8>> {
        self.run(guard, |this, guard| this.try_rmw(guard, key, update, None))
    }

    /// As [`HotLog::rmw`], but a key with no record in this log takes its old value from
    /// `older` (F2's read of the cold log, algorithm 1): the result is appended only if
    /// no record of the key's chain arrived since the chain head was read first
    /// (Conditional-Insert); otherwise the operation starts again.
    pub(crate) fn rmw_with_older(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        update: &dyn Update,
        older: &dyn Fn(&EpochGuard<'_, '_>) -> Result<Option<LogValue>>,
    ) -> Result<Vec<u8>> {
        self.run(guard, |this, guard| {
            this.try_rmw(guard, key, update, Some(older))
        })
    }

    /// One try of a read-modify-write that never refreshes `guard`: for callers that
    /// must act (with their own records still in memory) before any refresh. Settle a
    /// `Retry` or `PageFull` with [`HotLog::settle`] and try again.
    pub(crate) fn rmw_once(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        update: &dyn Update,
    ) -> Result<Step<Vec<u8>>> {
        self.try_rmw(guard, key, update, None)
    }

    /// Does what a `Retry` or `PageFull` asks before the next try: refreshes, or opens
    /// the next page (refreshing between tries). The caller holds nothing from under
    /// `guard`.
    pub(crate) fn settle<T>(&self, guard: &mut EpochGuard<'_, '_>, step: &Step<T>) -> Result<()> {
        match *step {
            Step::Done(_) => Ok(()),
            Step::Retry => {
                bump(&self.counters.retries);
                guard.refresh();
                Ok(())
            }
            Step::PageFull(full) => {
                let mut spins = 0;
                let leaving = |guard: &EpochGuard<'_, '_>, from: u64, until: u64| {
                    self.keep_read_records(guard, from, until)
                };
                while !self.log.new_page_leaving(guard, full, &leaving)? {
                    guard.refresh();
                    spins += 1;
                    crate::sync::backoff_wait(spins);
                }
                Ok(())
            }
        }
    }

    /// Runs `step` until it is done, refreshing between tries as it asks.
    fn run<T>(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        step: impl Fn(&Self, &EpochGuard<'_, '_>) -> Result<Step<T>>,
    ) -> Result<T> {
        loop {
            match step(self, guard)? {
                Step::Done(out) => return Ok(out),
                other => self.settle(guard, &other)?,
            }
        }
    }

    fn check_key(key: &[u8]) -> Result<()> {
        if key.len() > super::record::MAX_KEY_BYTES {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: super::record::MAX_KEY_BYTES,
            });
        }
        Ok(())
    }

    fn try_upsert(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
        out_of_line: bool,
    ) -> Result<Step<()>> {
        Self::check_key(key)?;
        let mut slot = self.index.find_or_create(guard, self.keying.hash(key));
        // A value out of line never goes in place (nor over one: `update_in_place`
        // refuses those records): see the module's docs.
        if let Some(v) = value.filter(|_| !out_of_line) {
            let read_only = self.log.addresses().read_only;
            let head = self.hot_head(slot.address());
            if let Found::Memory(address, record) =
                self.find_record_above(guard, key, head, read_only)?
                && address >= read_only
                && !record.header().is_tombstone()
                && record.update_in_place(v)
            {
                bump(&self.counters.in_place_updates);
                return Ok(Step::Done(()));
            }
        }
        let (bytes, tombstone) = (value.unwrap_or(&[]), value.is_none());
        self.append(guard, &mut slot, key, (bytes, out_of_line), tombstone)
    }

    /// Appends a record in front of `slot`'s chain and swaps it in: `value`'s bytes,
    /// and whether they are the reference of a value out of line.
    fn append(
        &self,
        guard: &EpochGuard<'_, '_>,
        slot: &mut EntrySlot<'_>,
        key: &[u8],
        (value, out_of_line): (&[u8], bool),
        tombstone: bool,
    ) -> Result<Step<()>> {
        let _ = guard;
        let size = record_size_bytes(key.len(), value.len()) as u64;
        if size > self.log.page_bytes() {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: self.max_value_bytes(key.len()),
            });
        }
        let address = match self.log.allocate(size)? {
            Alloc::At(address) => address,
            Alloc::PageFull(full) => return Ok(Step::PageFull(full)),
        };
        if self.read_cache.is_some() && address >= READ_CACHE_BIT {
            // Entries tell copies from hot-log records by this bit.
            return Err(Error::Poisoned {
                cause: "the hot log's 47-bit address space (with a read cache) is exhausted".into(),
            });
        }
        let previous = self.bypass_copy(slot.address(), key);
        // SAFETY: just allocated at the tail (above HEAD), filled before any refresh.
        let record = unsafe { self.log.record(address) };
        record.init_value(Header::new(previous, tombstone), key, value, out_of_line);
        bump(&self.counters.appended_records);
        match slot.try_update(address) {
            Ok(()) => Ok(Step::Done(())),
            Err(_) => {
                record.invalidate();
                Ok(Step::Retry)
            }
        }
    }

    /// The address a new record of `key` links to when the entry holds `address`: past
    /// the copy at the chain's head, if any, which is marked invalid if it is a copy of
    /// `key` (F2's invalidation of the read cache by a write). The swap of the entry then
    /// unlinks the copy whatever its key: a chain keeps at most one copy, at its head.
    fn bypass_copy(&self, address: u64, key: &[u8]) -> u64 {
        let Some((rc, copy)) = self.copy_at(address) else {
            return address;
        };
        if !copy.header().is_invalid() && copy.key_equals(key) {
            copy.invalidate();
            rc.count_invalidation();
        }
        copy.header().previous()
    }

    /// The largest value a record with a key of `key_len` bytes holds.
    pub(crate) fn max_value_bytes(&self, key_len: usize) -> usize {
        (self.log.page_bytes() as usize).saturating_sub(record_size_bytes(key_len, 0))
    }

    #[allow(clippy::type_complexity)]
    fn try_rmw(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        update: &dyn Update,
        older: Option<&dyn Fn(&EpochGuard<'_, '_>) -> Result<Option<LogValue>>>,
    ) -> Result<Step<Vec<u8>>> {
        Self::check_key(key)?;
        let mut slot = self.index.find_or_create(guard, self.keying.hash(key));
        let head = slot.address();
        if let Some((rc, copy)) = self.copy_at(head)
            && !copy.header().is_invalid()
            && copy.key_equals(key)
        {
            // A valid copy at the head holds the newest value (the key's newest hot
            // record, if any, is on disk or below READ_ONLY, never to change in place):
            // copy-update from it, swapping out the copy.
            let (_, value) = copy.read_log_value();
            rc.count_hit();
            return self.copy_update(guard, &mut slot, key, value, update);
        }
        let addresses = self.log.addresses();
        match self.find_record(guard, key, self.hot_head(head))? {
            Found::Memory(address, record) if address >= addresses.safe_read_only => {
                if address < addresses.read_only {
                    // The fuzzy region: a thread that has not seen READ_ONLY move may
                    // still update this record in place; a copy now could lose that.
                    return Ok(Step::Retry);
                }
                let Some(mut locked) = record.lock() else {
                    return Ok(Step::Retry);
                };
                if locked.is_out_of_line() && !locked.header().is_tombstone() {
                    // Unlocked unchanged when `locked` drops.
                    return Ok(Step::Done(update.out_of_line()));
                }
                let old = (!locked.header().is_tombstone()).then(|| locked.value());
                let new = update.update(old.as_deref());
                if update.refuses(&new) {
                    // Unlocked unchanged when `locked` drops.
                    return Ok(Step::Done(new));
                }
                if old.as_ref().is_some_and(|o| o.len() == new.len()) {
                    locked.write_value(&new);
                    bump(&self.counters.in_place_updates);
                    return Ok(Step::Done(new));
                }
                // Does not fit in place: copy to the tail while the old record stays
                // locked, then seal it.
                match self.append(guard, &mut slot, key, (&new, false), false)? {
                    Step::Done(()) => {
                        locked.seal();
                        Ok(Step::Done(new))
                    }
                    Step::Retry => Ok(Step::Retry),
                    Step::PageFull(full) => Ok(Step::PageFull(full)),
                }
            }
            Found::Memory(_, record) => {
                // Read-only in memory: nobody updates it in place any more.
                let (_, old) = record.read_log_value();
                self.copy_update(guard, &mut slot, key, old, update)
            }
            Found::Disk(_, record) => {
                self.copy_update(guard, &mut slot, key, record.log_value(), update)
            }
            Found::None => {
                let Some(older) = older else {
                    return self.copy_update(guard, &mut slot, key, None, update);
                };
                // Read the older tier without holding the entry slot (a thread holds one
                // at a time), then take it again: the chain head must be the one read
                // first, or a record of this key may have arrived meanwhile.
                drop(slot);
                let old = older(guard)?;
                let mut slot = self.index.find_or_create(guard, self.keying.hash(key));
                if slot.address() != head {
                    return Ok(Step::Retry);
                }
                self.copy_update(guard, &mut slot, key, old, update)
            }
        }
    }

    fn copy_update(
        &self,
        guard: &EpochGuard<'_, '_>,
        slot: &mut EntrySlot<'_>,
        key: &[u8],
        old: Option<LogValue>,
        update: &dyn Update,
    ) -> Result<Step<Vec<u8>>> {
        if old.as_ref().is_some_and(|o| o.out_of_line) {
            return Ok(Step::Done(update.out_of_line()));
        }
        let new = update.update(old.as_ref().map(|o| &o.bytes[..]));
        if update.refuses(&new) {
            return Ok(Step::Done(new));
        }
        Ok(match self.append(guard, slot, key, (&new, false), false)? {
            Step::Done(()) => Step::Done(new),
            Step::Retry => Step::Retry,
            Step::PageFull(full) => Step::PageFull(full),
        })
    }
}

/// The hot log's side of an index grow: the key hash and previous address of a record
/// (or of a copy in the read cache at a chain's head).
struct LogHashes(Arc<HybridLog>, Option<Arc<ReadCache>>, Keying);

impl RecordHashes for LogHashes {
    fn link(&self, address: u64) -> ChainLink {
        if let Some(rc) = &self.1
            && is_cached(address)
        {
            // SAFETY: a grow reads the entries it splits under its guard, and a copy's
            // frame outlives every thread that loaded its address before refreshing.
            let copy = unsafe { rc.record(address) };
            return ChainLink::Record {
                key_hash: self.2.hash(&copy.key()),
                previous: copy.header().previous(),
            };
        }
        // A grow walks chains under its own guard; records at or above HEAD are in
        // memory while it holds it.
        let addresses = self.0.addresses();
        if address < addresses.begin {
            return ChainLink::Truncated;
        }
        if address < addresses.head {
            return ChainLink::NotInMemory;
        }
        // SAFETY: at or above HEAD as loaded just now by a protected thread (the grow's),
        // and an address the index holds is a published record.
        let record = unsafe { self.0.record(address) };
        ChainLink::Record {
            key_hash: self.2.hash(&record.key()),
            previous: record.header().previous(),
        }
    }
}

impl HotLog {
    /// Doubles the index while operations go on; false if another grow runs. The
    /// caller holds nothing from under `guard`, which this refreshes while it waits for
    /// the other threads (which must keep refreshing).
    pub(crate) fn grow_index(&self, guard: &mut EpochGuard<'_, '_>) -> bool {
        self.index.grow(
            guard,
            Arc::new(LogHashes(
                Arc::clone(&self.log),
                self.read_cache.clone(),
                self.keying,
            )),
        )
    }

    /// Rebuilds the index at its size while operations go on, giving back the overflow
    /// buckets its chains no longer need ([`HashIndex::rebuild`]); false if a grow or
    /// rebuild runs. As for [`HotLog::grow_index`].
    pub(crate) fn rebuild_index(&self, guard: &mut EpochGuard<'_, '_>) -> bool {
        self.index.rebuild(guard)
    }

    /// Overflow buckets the index's table has allocated (in chains, or free).
    pub(crate) fn index_overflow_buckets(&self, guard: &EpochGuard<'_, '_>) -> usize {
        self.index.overflow_buckets(guard)
    }

    /// Whether the index is doubling now.
    pub(crate) fn index_is_growing(&self) -> bool {
        self.index.is_growing()
    }

    /// Bytes of the index's memory (home and overflow buckets).
    pub(crate) fn index_size_bytes(&self, guard: &EpochGuard<'_, '_>) -> usize {
        self.index.size_bytes(guard)
    }

    /// Removes the index entries whose chains lie wholly below `begin` (after a
    /// truncation); returns how many.
    pub(crate) fn remove_entries_below(&self, guard: &EpochGuard<'_, '_>, begin: u64) -> usize {
        self.index.remove_entries_below(guard, begin)
    }

    /// Moves the read cache's tail to its next page now (tests).
    #[cfg(all(test, feature = "shuttle"))]
    pub(crate) fn read_cache_turn_page(&self, guard: &EpochGuard<'_, '_>) -> bool {
        let rc = self.read_cache.as_ref().expect("a read cache");
        rc.turn_page(guard, &self.index, self.log.addresses().begin)
    }

    /// Evicts the read cache's oldest page now, if sealed (tests).
    #[cfg(all(test, feature = "shuttle"))]
    pub(crate) fn read_cache_evict_oldest(&self, guard: &EpochGuard<'_, '_>) -> bool {
        let rc = self.read_cache.as_ref().expect("a read cache");
        rc.evict_oldest(guard, &self.index, self.log.addresses().begin)
    }

    /// The address in `key`'s index entry, if it has one (tests).
    #[cfg(all(test, feature = "shuttle"))]
    pub(crate) fn entry_address(&self, guard: &EpochGuard<'_, '_>, key: &[u8]) -> Option<u64> {
        self.index
            .find(guard, self.keying.hash(key))
            .map(|slot| slot.address())
    }

    /// Live entries of the index (tests).
    #[cfg(test)]
    pub(crate) fn index_entries(&self, guard: &EpochGuard<'_, '_>) -> usize {
        self.index.entries(guard).len()
    }

    /// The overflow buckets the index's live entries need, packed (tests): for each
    /// home bucket holding `n > 7` entries, `(n - 7) / 7` rounded up.
    #[cfg(test)]
    pub(crate) fn index_overflow_needed(&self, guard: &EpochGuard<'_, '_>) -> usize {
        let mut per_bucket: std::collections::HashMap<usize, usize> = Default::default();
        for (bucket, _) in self.index.entries(guard) {
            *per_bucket.entry(bucket).or_default() += 1;
        }
        per_bucket
            .values()
            .map(|&n| n.saturating_sub(7).div_ceil(7))
            .sum()
    }

    /// Home buckets of the index now.
    pub(crate) fn index_buckets(&self, guard: &EpochGuard<'_, '_>) -> usize {
        self.index.buckets(guard)
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::hash::test_support::{Rng, count, counter, expected_count};
    use crate::storage::MemBlocks;

    fn tiny() -> HotLog {
        let options = HlogOptions {
            page_bits: 12,
            frames: 4,
            mutable_pages: 2,
        };
        HotLog::new(256, options, Arc::new(MemBlocks::new())).unwrap()
    }

    fn key(i: u64) -> Vec<u8> {
        format!("k{i}").into_bytes()
    }

    #[test]
    fn random_operations_match_a_hash_map_through_flushes_and_disk_reads() {
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rng = Rng(7);
        let append_byte = |old: Option<&[u8]>| {
            let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
            v.push(v.len() as u8);
            v.truncate(300);
            v
        };
        for step in 0..30_000u64 {
            let k = key(rng.skewed(3_000));
            match rng.below(10) {
                0..=3 => {
                    let got = store.get(&guard, &k).unwrap();
                    assert_eq!(got.as_ref(), model.get(&k), "step {step}: get {k:?}");
                }
                4..=6 => {
                    // Same-length overwrites (in place when mutable) and length changes.
                    let len = if rng.below(2) == 0 {
                        16
                    } else {
                        rng.below(200) as usize
                    };
                    let v: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    store.upsert(&mut guard, &k, Some(&v)).unwrap();
                    model.insert(k, v);
                }
                7..=8 => {
                    let want = append_byte(model.get(&k).map(Vec::as_slice));
                    let got = store.rmw(&mut guard, &k, &append_byte).unwrap();
                    assert_eq!(got, want, "step {step}: rmw {k:?}");
                    model.insert(k, want);
                }
                _ => {
                    store.upsert(&mut guard, &k, None).unwrap();
                    model.remove(&k);
                }
            }
            if step % 64 == 0 {
                guard.refresh();
            }
        }
        for i in 0..3_000 {
            let k = key(i);
            assert_eq!(
                store.get(&guard, &k).unwrap().as_ref(),
                model.get(&k),
                "{k:?}"
            );
        }
        let stats = store.stats();
        let a = store.log().addresses();
        assert!(a.head > 100 * 4096, "the log never left memory: {a:?}");
        assert!(
            stats.disk_reads > 0 && stats.in_place_updates > 0,
            "{stats:?}"
        );
    }

    #[test]
    fn blind_upserts_of_records_on_disk_read_nothing_from_the_device() {
        // Only a record at or above READ_ONLY is updated in place, so an upsert walks its
        // chain no lower; walking on read the device for every key written since the
        // tiny index's chains reached disk.
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        for i in 0..2_000 {
            store.upsert(&mut guard, &key(i), Some(b"old")).unwrap();
        }
        let a = store.log().addresses();
        assert!(a.head > 8 * 4096, "the records stayed in memory: {a:?}");
        let before = store.stats().disk_reads;
        for i in 0..500 {
            store.upsert(&mut guard, &key(i), Some(b"new")).unwrap();
        }
        assert_eq!(store.stats().disk_reads, before, "upserts read the device");
        for i in 0..2_000 {
            let want: &[u8] = if i < 500 { b"new" } else { b"old" };
            assert_eq!(store.get(&guard, &key(i)).unwrap().as_deref(), Some(want));
        }
    }

    #[test]
    fn liveness_checks_do_not_read_the_record_they_check() {
        // An index with room for every key, so that each chain holds one key's records.
        let options = HlogOptions {
            page_bits: 12,
            frames: 4,
            mutable_pages: 2,
        };
        let store = HotLog::new(1 << 16, options, Arc::new(MemBlocks::new())).unwrap();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        for i in 0..2_000 {
            store.upsert(&mut guard, &key(i), Some(b"v")).unwrap();
        }
        let head = store.log().addresses().head;
        let on_disk: Vec<(Vec<u8>, u64)> = (0..2_000)
            .map(|i| {
                (
                    key(i),
                    store.newest_address(&guard, &key(i)).unwrap().unwrap(),
                )
            })
            .filter(|&(_, address)| address < head)
            .collect();
        assert!(on_disk.len() > 1_000, "{} records on disk", on_disk.len());
        let before = store.stats().disk_reads;
        for (k, address) in &on_disk {
            assert!(store.is_newest(&guard, k, *address).unwrap());
        }
        assert_eq!(
            store.stats().disk_reads,
            before,
            "the checks read the device"
        );
        // An address the chain does not hold is not live (the walk reads the record
        // above it).
        for (k, address) in &on_disk {
            assert!(!store.is_newest(&guard, k, address - 8).unwrap());
        }
        // A newer record makes the old one dead, and the answer agrees with a lookup.
        let (k, address) = &on_disk[0];
        store.upsert(&mut guard, k, Some(b"w")).unwrap();
        assert!(!store.is_newest(&guard, k, *address).unwrap());
        let newest = store.newest_address(&guard, k).unwrap().unwrap();
        assert!(store.is_newest(&guard, k, newest).unwrap());
    }

    #[test]
    fn counts_from_threads_racing_read_modify_writes_are_exact() {
        // FASTER's count store: threads add 1 to skewed keys; no increment may be lost,
        // whether it lands in place, in the fuzzy region, on a copy or on disk. (Copying
        // a record from the fuzzy region instead of retrying loses increments in about
        // one round in six.)
        for round in 0..8 {
            count_round(round);
        }
    }

    fn count_round(round: u64) {
        let store = tiny();
        let threads = 4u64;
        let per_thread = 20_000u64;
        let keys = 500u64;
        let expected: Vec<HashMap<u64, u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        let mut handle = store.epoch().register();
                        let mut guard = handle.protect();
                        let mut rng = Rng(100 * round + t);
                        let mut mine = HashMap::new();
                        for n in 0..per_thread {
                            let k = rng.skewed(keys);
                            store.rmw(&mut guard, &key(k), &counter).unwrap();
                            *mine.entry(k).or_insert(0) += 1;
                            if n % 16 == 0 {
                                guard.refresh();
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut handle = store.epoch().register();
        let guard = handle.protect();
        let mut total = 0;
        for k in 0..keys {
            let want = expected_count(&expected, k);
            let got = count(store.get(&guard, &key(k)).unwrap());
            assert_eq!(got, want, "round {round}, key {k}");
            total += got;
        }
        assert_eq!(total, threads * per_thread);
        let stats = store.stats();
        assert!(
            stats.in_place_updates > 0 && stats.appended_records > keys,
            "{stats:?}"
        );
        assert!(store.log().addresses().head > 0, "nothing left memory");
    }

    #[test]
    fn the_index_doubles_while_threads_count_and_no_count_is_lost() {
        let store = tiny();
        let keys = 2_000u64;
        let per_thread = 15_000u64;
        let expected: Vec<HashMap<u64, u64>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..3u64)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        let mut handle = store.epoch().register();
                        let mut guard = handle.protect();
                        let mut rng = Rng(7_000 + t);
                        let mut mine = HashMap::new();
                        for _ in 0..per_thread {
                            let k = rng.below(keys);
                            store.rmw(&mut guard, &key(k), &counter).unwrap();
                            *mine.entry(k).or_insert(0) += 1;
                            guard.refresh();
                        }
                        mine
                    })
                })
                .collect();
            let store = &store;
            s.spawn(move || {
                let mut handle = store.epoch().register();
                let mut guard = handle.protect();
                let before = store.index_buckets(&guard);
                for _ in 0..3 {
                    while !store.grow_index(&mut guard) {
                        guard.refresh();
                    }
                    guard.refresh();
                }
                assert_eq!(store.index_buckets(&guard), before * 8);
            });
            workers.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut handle = store.epoch().register();
        let guard = handle.protect();
        for k in 0..keys {
            let want = expected_count(&expected, k);
            let got = count(store.get(&guard, &key(k)).unwrap());
            assert_eq!(got, want, "key {k}");
        }
    }

    #[test]
    fn numbered_keys_each_get_an_entry_of_their_own() {
        let keys = 1u64 << 14;
        let buckets = IndexOptions::for_keys(keys).buckets;
        let keying = Keying::numbered(buckets);
        for size in [buckets, 2 * buckets, 8 * buckets] {
            let mut seen = std::collections::HashSet::new();
            for n in 0..keys {
                let h = keying.hash(&n.to_le_bytes());
                assert!(seen.insert((h.bucket(size), h.tag())), "{n} at {size}");
            }
        }
        // Any other key is hashed.
        assert_eq!(keying.hash(b"seven b"), hash_key(b"seven b"));
        assert_eq!(
            Keying::Hashed.hash(&5u64.to_le_bytes()),
            hash_key(&5u64.to_le_bytes())
        );
    }

    #[test]
    fn oversized_records_are_errors() {
        let store = tiny();
        let mut handle = store.epoch().register();
        let mut guard = handle.protect();
        let big = vec![0u8; 5000];
        assert!(matches!(
            store.upsert(&mut guard, b"k", Some(&big)),
            Err(Error::ValueTooLarge { .. })
        ));
        let long_key = vec![1u8; 70_000];
        assert!(matches!(
            store.upsert(&mut guard, &long_key, Some(b"v")),
            Err(Error::KeyTooLarge { .. })
        ));
        assert_eq!(store.get(&guard, b"k").unwrap(), None);
    }
}
