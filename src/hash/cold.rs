//! The cold log and its two-level index (F2, section 6).
//!
//! Write-cold records live in a second HybridLog with little memory: almost all of it
//! is on disk. Its index must not cost memory per key either, so it is two-level:
//!
//! - **Hash chunks** of [`CHUNK_ENTRIES`] 8-byte entries (256 bytes) each hold the chain
//!   heads of the keys whose hash selects them. The chunks live as records of a small
//!   store of their own — a [`HotLog`] keyed by chunk number, with a little memory and
//!   the rest on disk (F2's *hash chunk log*). Finding a cold chain head reads the chunk
//!   (usually one disk read); changing one is a read-modify-write of the chunk.
//! - **The chunk table** in memory is that store's hash index: one 8-byte entry per chunk,
//!   a bucket of seven per 64 bytes. Sized at about 4 chunks per bucket and 32 keys per
//!   chunk, it costs about half a byte per cold key ([`ColdIndex::memory_bytes`]).
//!
//! An entry is a bare 48-bit address (no tag): the keys that select one entry share its
//! chain, and a chain walk compares keys, as in the hot log.
//!
//! Appending to the cold log ([`ColdLog::insert`]) links the record in front of the
//! chain head and swaps the chunk's entry to it, in one read-modify-write of the chunk
//! (one chunk read); a conditional insert swaps it only if the head is still the one
//! its check walked from. If the try fails, the new record is marked invalid and the
//! insert starts again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::bucket::{INVALID_ADDRESS, KeyHash};
use super::epoch::{Epoch, EpochGuard};
use super::hlog::{Alloc, Fetched, HlogOptions, HybridLog, LogExtent};
use super::hot::{HotLog, Keying, Step, hash_key};
use super::record::{Header, LogValue, record_size_bytes};
use crate::error::{Error, Result};
use crate::storage::BlockDevice;
use crate::sync::backoff_wait;

/// Entries per hash chunk.
pub(crate) const CHUNK_ENTRIES: usize = 32;
/// Bytes of a hash chunk.
pub(crate) const CHUNK_BYTES: usize = CHUNK_ENTRIES * 8;
/// No chain head was replaced (entries hold 48-bit addresses, so never this).
const NOT_REPLACED: u64 = u64::MAX;

/// The cold log's index: hash chunks in a small store of their own.
pub(crate) struct ColdIndex {
    chunks: HotLog,
    /// Chunks (a power of two): the low bits of a key's hash choose one.
    chunk_count: u64,
}

impl ColdIndex {
    /// An index for about `expected_keys` cold keys, its chunks in a store with
    /// `log` memory over `device`.
    pub(crate) fn new(
        expected_keys: u64,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
    ) -> Result<ColdIndex> {
        let chunk_count = Self::chunks_for(expected_keys);
        Ok(ColdIndex {
            chunks: HotLog::numbered(chunk_count, log, device, epoch)?,
            chunk_count,
        })
    }

    /// Chunks for about `expected_keys` cold keys: a power of two.
    pub(crate) fn chunks_for(expected_keys: u64) -> u64 {
        expected_keys
            .div_ceil(CHUNK_ENTRIES as u64)
            .max(1)
            .next_power_of_two()
    }

    /// The index a checkpoint captured: its chunk store recovered from `extent` with a
    /// chunk table of `buckets` buckets ([`HotLog::recover`]).
    pub(crate) fn recover(
        expected_keys: u64,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
        extent: LogExtent,
        buckets: usize,
    ) -> Result<ColdIndex> {
        Ok(ColdIndex {
            chunks: HotLog::recover(
                buckets,
                log,
                device,
                epoch,
                extent,
                0,
                Keying::numbered(buckets),
            )?,
            chunk_count: Self::chunks_for(expected_keys),
        })
    }

    /// The store the chunks live in.
    pub(crate) fn chunks(&self) -> &HotLog {
        &self.chunks
    }

    /// (chunk number, entry within it) of a key hash: the low bits choose the chunk,
    /// five bits from the middle the entry.
    fn place(&self, hash: KeyHash) -> (u64, usize) {
        let chunk = hash.0 & (self.chunk_count - 1);
        let entry = ((hash.0 >> 32) as usize) % CHUNK_ENTRIES;
        (chunk, entry)
    }

    /// The chain head for `hash` ([`INVALID_ADDRESS`] if none).
    pub(crate) fn find(&self, guard: &EpochGuard<'_, '_>, hash: KeyHash) -> Result<u64> {
        let (chunk, entry) = self.place(hash);
        Ok(match self.chunks.get(guard, &chunk.to_le_bytes())? {
            Some(bytes) => entry_of(&bytes, entry)?,
            None => INVALID_ADDRESS,
        })
    }

    /// One try at replacing the chain head for `hash` with `update(head)` (`None`
    /// leaves it): `Done(the head it replaced)`, or what must happen before the next try
    /// ([`HotLog::settle`] through [`ColdIndex::settle`]). Never refreshes `guard`.
    ///
    /// One read-modify-write of the chunk: `update` sees the head as the chunk holds it
    /// when the change is made, so a caller that links a record in front of it reads the
    /// chunk once. `update` runs at most once per try, and its result is in the index
    /// only if the try is `Done`.
    pub(crate) fn try_update_entry(
        &self,
        guard: &EpochGuard<'_, '_>,
        hash: KeyHash,
        update: &(dyn Fn(u64) -> Option<u64> + Sync),
    ) -> Result<Step<Option<u64>>> {
        let (chunk, entry) = self.place(hash);
        let replaced = AtomicU64::new(NOT_REPLACED);
        let corrupt = AtomicBool::new(false);
        let rmw = |old: Option<&[u8]>| {
            let mut bytes = old.map_or_else(|| vec![0u8; CHUNK_BYTES], <[u8]>::to_vec);
            if bytes.len() != CHUNK_BYTES {
                // Not a chunk: leave it as it is; reported below.
                corrupt.store(true, Ordering::Relaxed);
                return bytes;
            }
            let at = entry * 8;
            let current = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            match update(current) {
                Some(new) => {
                    bytes[at..at + 8].copy_from_slice(&new.to_le_bytes());
                    replaced.store(current, Ordering::Relaxed);
                }
                None => replaced.store(NOT_REPLACED, Ordering::Relaxed),
            }
            bytes
        };
        let step = self.chunks.rmw_once(guard, &chunk.to_le_bytes(), &rmw)?;
        if corrupt.load(Ordering::Relaxed) {
            return Err(Error::Corrupted {
                page: chunk,
                reason: "a cold index chunk of the wrong size".into(),
            });
        }
        Ok(match step {
            Step::Done(_) => {
                let replaced = replaced.load(Ordering::Relaxed);
                Step::Done((replaced != NOT_REPLACED).then_some(replaced))
            }
            Step::Retry => Step::Retry,
            Step::PageFull(full) => Step::PageFull(full),
        })
    }

    /// Copies the chunk record at `source` of the chunk store (its key and value as
    /// read there) to the store's tail if it is still that chunk's newest version;
    /// answers whether it was (chunk-log compaction). The caller holds nothing from
    /// under `guard`.
    pub(crate) fn copy_if_newest(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
        source: u64,
    ) -> Result<bool> {
        loop {
            match self.chunks.try_copy_if_newest(guard, key, value, source)? {
                Step::Done(copied) => return Ok(copied),
                step => self.chunks.settle(guard, &step)?,
            }
        }
    }

    /// Bytes of the chunk store's log the index may keep: four times what every
    /// chunk's newest version takes (so that a compaction of its oldest part finds
    /// most chunks rewritten since and copies few), at least 16 of its pages.
    pub(crate) fn log_budget_bytes(&self) -> u64 {
        let live = self.chunk_count * record_size_bytes(8, CHUNK_BYTES) as u64;
        (4 * live).max(16 * self.chunks.log().page_bytes())
    }

    /// Does what a try asked for before the next one (the caller holds nothing).
    pub(crate) fn settle<T>(&self, guard: &mut EpochGuard<'_, '_>, step: &Step<T>) -> Result<()> {
        self.chunks.settle(guard, step)
    }

    /// Bytes of memory the index takes: the chunk table (the chunk store's hash index)
    /// and the chunk store's page frames.
    pub(crate) fn memory_bytes(&self, guard: &EpochGuard<'_, '_>) -> (u64, u64) {
        (
            self.chunks.index_size_bytes(guard) as u64,
            self.chunks.log().memory_bytes(),
        )
    }

    /// Chunks the index was sized for.
    pub(crate) fn chunk_count(&self) -> u64 {
        self.chunk_count
    }
}

/// Entry `entry` of a chunk read back (from memory or disk).
fn entry_of(bytes: &[u8], entry: usize) -> Result<u64> {
    let at = entry * 8;
    match bytes.get(at..at + 8) {
        Some(b) if bytes.len() == CHUNK_BYTES => {
            Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        }
        _ => Err(Error::Corrupted {
            page: 0,
            reason: format!("a cold index chunk of {} bytes", bytes.len()),
        }),
    }
}

/// The cold log: a HybridLog of write-cold records and its two-level index.
pub(crate) struct ColdLog {
    log: HybridLog,
    index: ColdIndex,
    /// Runs in `get` between reading the chain head and walking the chain: tests widen
    /// the window of the false-absence anomaly with it.
    #[cfg(test)]
    pub(crate) after_find_hook: crate::sync::Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl ColdLog {
    /// A cold log of `log` memory over `device`, indexed for `expected_keys` by an index
    /// whose chunk store has `index_log` memory over `index_device`; all on `epoch`.
    pub(crate) fn new(
        expected_keys: u64,
        log: HlogOptions,
        device: Arc<dyn BlockDevice>,
        index_log: HlogOptions,
        index_device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
    ) -> Result<ColdLog> {
        Ok(ColdLog {
            log: HybridLog::new(log, device, Arc::clone(&epoch))?,
            index: ColdIndex::new(expected_keys, index_log, index_device, epoch)?,
            #[cfg(test)]
            after_find_hook: crate::sync::Mutex::new(None),
        })
    }

    /// The cold log a checkpoint captured: the log as `extent`, its index as
    /// `index_extent` with a chunk table of `buckets` buckets.
    pub(crate) fn recover(
        expected_keys: u64,
        (log, device, extent): (HlogOptions, Arc<dyn BlockDevice>, LogExtent),
        (index_log, index_device, index_extent): (HlogOptions, Arc<dyn BlockDevice>, LogExtent),
        buckets: usize,
        epoch: Arc<Epoch>,
    ) -> Result<ColdLog> {
        Ok(ColdLog {
            log: HybridLog::recover(log, device, Arc::clone(&epoch), extent)?,
            index: ColdIndex::recover(
                expected_keys,
                index_log,
                index_device,
                epoch,
                index_extent,
                buckets,
            )?,
            #[cfg(test)]
            after_find_hook: crate::sync::Mutex::new(None),
        })
    }

    pub(crate) fn log(&self) -> &HybridLog {
        &self.log
    }

    pub(crate) fn index(&self) -> &ColdIndex {
        &self.index
    }

    /// The newest record of `key` in the cold log: `Some(None)` for a tombstone, `None`
    /// if it has no record.
    #[cfg(test)]
    pub(crate) fn get(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
    ) -> Result<Option<Option<Vec<u8>>>> {
        Ok(self
            .read(guard, key)?
            .map(|found| found.map(LogValue::into_bytes)))
    }

    /// [`ColdLog::get`] with the value as the record holds it (a value out of line as
    /// its reference).
    pub(crate) fn read(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
    ) -> Result<Option<Option<LogValue>>> {
        let head = self.index.find(guard, hash_key(key))?;
        #[cfg(test)]
        if let Some(hook) = self.after_find_hook.lock().as_ref() {
            hook();
        }
        Ok(self.newest(guard, key, head)?.map(|(_, value)| value))
    }

    /// The reads an insert of `key` makes before it links its record, for
    /// [`super::pending::read_ahead`]: the key's chunk, and with `chain` (a conditional
    /// insert, which walks the chain to check its source) the records of the chain down
    /// to the key's newest.
    pub(crate) fn look_ahead(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        chain: bool,
    ) -> Result<()> {
        let head = self.index.find(guard, hash_key(key))?;
        if chain {
            self.newest(guard, key, head)?;
        }
        Ok(())
    }

    /// Walks the chain from `address` to the newest record of `key`: its address and
    /// value (`None` for a tombstone).
    #[allow(clippy::type_complexity)]
    fn newest(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        mut address: u64,
    ) -> Result<Option<(u64, Option<LogValue>)>> {
        while address != INVALID_ADDRESS {
            let Some(fetched) = self.log.fetch(guard, address)? else {
                break;
            };
            let (header, found) = match fetched {
                Fetched::Memory(record) => {
                    let header = record.header();
                    let found = (!header.is_invalid() && record.key_equals(key))
                        .then(|| record.read_log_value().1);
                    (header, found)
                }
                Fetched::Disk(record) => {
                    let found = (!record.header.is_invalid() && record.key == key)
                        .then(|| record.log_value());
                    (record.header, found)
                }
            };
            if let Some(value) = found {
                return Ok(Some((address, value)));
            }
            address = header.previous();
        }
        Ok(None)
    }

    /// Adds to `held` the references of the values out of line that valid records of
    /// `key` at or above `floor` hold: the chain is walked down to `floor`.
    pub(crate) fn references_held(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        floor: u64,
        held: &mut std::collections::HashSet<Vec<u8>>,
    ) -> Result<()> {
        let address = self.index.find(guard, hash_key(key))?;
        self.log
            .references_on_chain(guard, key, address, floor, held)
    }

    /// Appends `key`'s record (a tombstone for `None`) at the cold log's tail and makes it
    /// the head of its chain. The caller holds nothing from under `guard`.
    #[cfg(test)]
    pub(crate) fn insert(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<u64> {
        let value = value.map(|v| LogValue::inline(v.to_vec()));
        self.insert_value(guard, key, value.as_ref())
    }

    /// [`ColdLog::insert`] of a value as a record holds it (out of line, as its
    /// reference): what compaction copies.
    pub(crate) fn insert_value(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&LogValue>,
    ) -> Result<u64> {
        Ok(self
            .insert_if(guard, key, value, None)?
            .expect("an unconditional insert happens"))
    }

    /// Conditional-Insert (F2 §5.1) within the cold log: appends a copy of the record of
    /// `key` at `source` only while that record is still the key's newest, and answers
    /// `None` (a no-op) once a newer one exists. The check and the link are one step:
    /// the entry is swapped expecting the chain head the check walked from, and if it
    /// moved, the check runs again.
    pub(crate) fn insert_if_newest(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&LogValue>,
        source: u64,
    ) -> Result<Option<u64>> {
        self.insert_if(guard, key, value, Some(source))
    }

    fn insert_if(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        key: &[u8],
        value: Option<&LogValue>,
        newest: Option<u64>,
    ) -> Result<Option<u64>> {
        let hash = hash_key(key);
        let bytes = value.map_or(&[][..], |v| &v.bytes[..]);
        let out_of_line = value.is_some_and(|v| v.out_of_line);
        let size = record_size_bytes(key.len(), bytes.len()) as u64;
        if size > self.log.page_bytes() {
            return Err(Error::ValueTooLarge {
                len: bytes.len(),
                max: (self.log.page_bytes() as usize)
                    .saturating_sub(record_size_bytes(key.len(), 0)),
            });
        }
        let mut spins = 0;
        loop {
            // A conditional insert reads the chain head first, to check the source is
            // the newest; an unconditional one takes it from the chunk as it swaps it.
            let checked_head = match newest {
                Some(source) => {
                    let head = self.index.find(guard, hash)?;
                    if self.newest(guard, key, head)?.map(|(a, _)| a) != Some(source) {
                        return Ok(None);
                    }
                    Some(head)
                }
                None => None,
            };
            let address = match self.log.allocate(size)? {
                Alloc::At(address) => address,
                Alloc::PageFull(full) => {
                    while !self.log.new_page(guard, full)? {
                        guard.refresh();
                        spins += 1;
                        backoff_wait(spins);
                    }
                    continue;
                }
            };
            // SAFETY: just allocated at the tail (above HEAD); this thread does not
            // refresh before it is filled and, if it loses, marked invalid: its page is
            // not flushed before then, so the disk never holds it looking valid.
            let record = unsafe { self.log.record(address) };
            let tombstone = value.is_none();
            // Filled now even when `link` fills it again with the head it sees: a try
            // that fails before the chunk's update runs must leave a whole record (its
            // lengths say where the next one starts) to mark invalid.
            record.init_value(
                Header::new(checked_head.unwrap_or(INVALID_ADDRESS), tombstone),
                key,
                bytes,
                out_of_line,
            );
            let log = &self.log;
            let link = |head: u64| {
                if let Some(expected) = checked_head {
                    return (head == expected).then_some(address);
                }
                // Linked in front of the head the chunk holds now; rewritten before the
                // chunk that publishes it.
                // SAFETY: the record allocated above, not yet published or refreshed past.
                let record = unsafe { log.record(address) };
                record.init_value(Header::new(head, tombstone), key, bytes, out_of_line);
                Some(address)
            };
            let step = match self.index.try_update_entry(guard, hash, &link) {
                Ok(Step::Done(Some(_))) => return Ok(Some(address)),
                Ok(step) => step,
                Err(e) => {
                    record.invalidate();
                    return Err(e);
                }
            };
            // Another record became the chain's head first, or the chunk store must
            // open a page or wait: this record is not linked; try again.
            record.invalidate();
            self.index.settle(guard, &step)?;
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::storage::MemBlocks;

    fn small_log() -> HlogOptions {
        HlogOptions {
            page_bits: 12,
            frames: 4,
            mutable_pages: 2,
        }
    }

    fn cold(expected_keys: u64) -> ColdLog {
        ColdLog::new(
            expected_keys,
            small_log(),
            Arc::new(MemBlocks::new()),
            small_log(),
            Arc::new(MemBlocks::new()),
            Arc::new(Epoch::new()),
        )
        .unwrap()
    }

    fn key(i: u64) -> Vec<u8> {
        format!("cold-key-{i}").into_bytes()
    }

    #[test]
    fn cold_records_are_found_through_chunks_mostly_on_disk() {
        let store = cold(4_000);
        let epoch = Arc::clone(store.log().epoch());
        let mut handle = epoch.register();
        let mut guard = handle.protect();
        let mut model = HashMap::new();
        for round in 0..3u64 {
            for i in 0..4_000u64 {
                if (i + round) % 7 == 0 {
                    store.insert(&mut guard, &key(i), None).unwrap();
                    model.insert(i, None);
                } else {
                    let v = format!("value {i} of round {round}").into_bytes();
                    store.insert(&mut guard, &key(i), Some(&v)).unwrap();
                    model.insert(i, Some(v));
                }
                guard.refresh();
            }
        }
        for i in 0..4_000u64 {
            assert_eq!(
                store.get(&guard, &key(i)).unwrap(),
                Some(model[&i].clone()),
                "{i}"
            );
        }
        assert_eq!(store.get(&guard, b"never written").unwrap(), None);
        // Both the cold log and the chunk store left memory.
        assert!(store.log().addresses().head > 50 * 4096);
        assert!(store.index().chunks.log().addresses().head > 0);
    }

    #[test]
    fn threads_inserting_at_once_keep_every_key() {
        let store = cold(8_000);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let store = &store;
                s.spawn(move || {
                    let mut handle = store.log().epoch().register();
                    let mut guard = handle.protect();
                    for i in 0..2_000u64 {
                        // Own keys, and keys every thread writes.
                        let own = t * 2_000 + i;
                        store
                            .insert(&mut guard, &key(own), Some(&own.to_le_bytes()))
                            .unwrap();
                        let shared = 100_000 + i % 50;
                        store
                            .insert(&mut guard, &key(shared), Some(&t.to_le_bytes()))
                            .unwrap();
                        guard.refresh();
                    }
                });
            }
        });
        let mut handle = store.log().epoch().register();
        let guard = handle.protect();
        for own in 0..8_000u64 {
            assert_eq!(
                store.get(&guard, &key(own)).unwrap(),
                Some(Some(own.to_le_bytes().to_vec())),
                "{own}"
            );
        }
        for i in 0..50u64 {
            let v = store
                .get(&guard, &key(100_000 + i))
                .unwrap()
                .unwrap()
                .unwrap();
            assert!(u64::from_le_bytes(v.try_into().unwrap()) < 4);
        }
    }

    #[test]
    fn the_chunk_table_costs_under_one_byte_per_cold_key() {
        for keys in [100_000u64, 1_000_000, 20_000_000] {
            let index = ColdIndex::new(
                keys,
                small_log(),
                Arc::new(MemBlocks::new()),
                Arc::new(Epoch::new()),
            )
            .unwrap();
            let epoch = Arc::clone(index.chunks.epoch());
            let mut handle = epoch.register();
            let guard = handle.protect();
            let (table, frames) = index.memory_bytes(&guard);
            let per_key = table as f64 / keys as f64;
            eprintln!("{keys} cold keys: chunk table {table} bytes, {per_key:.3} bytes per key");
            assert!(
                per_key < 1.0,
                "{keys} keys: {table} bytes of chunk table, {per_key:.2} per key"
            );
            assert!(index.chunk_count() * CHUNK_ENTRIES as u64 >= keys);
            assert_eq!(frames, 4 * 4096);
        }
    }
}
