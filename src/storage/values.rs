//! The value store: the home of large values (issue #34). A value above the index's
//! threshold (about 2 KiB) is written once into an *extent* of its own in the database's
//! value file, a [`BlockDevice`] (`values-<segment as 8 hex>.vlog` segment files of
//! [`SEGMENT_BYTES`]), and the index (a tree leaf, a hash log record) keeps its 16-byte
//! [`ValueRef`] instead of the bytes.
//!
//! # Extents
//!
//! An extent starts at a multiple of [`IO_ALIGN_BYTES`] and holds, little-endian:
//!
//! ```text
//! offset                      offset + len
//! | the value's bytes          | chunk table (len > CHUNK_BYTES only) | zeros to 4 KiB |
//!                               crc32c (u32) of each CHUNK_BYTES chunk of the value,
//!                               the last one possibly short
//! ```
//!
//! Its size is `round_up(len + table bytes, 4096)`, one block for an empty value. The
//! reference's `crc` is the crc32c of the whole value when it is one chunk or less, else
//! the crc32c of the chunk table: a whole read checks every byte, and a read of part of
//! a big value reads the table (checked against `crc`) and only the chunks it needs
//! (each checked against the table). Damaged bytes are an [`Error::CorruptFile`] naming
//! the file and the address; no wrong byte is ever returned.
//!
//! # What it owns
//!
//! The allocation of the value file's address space, in one [`Mutex`]: each extent is
//! *pending* (written by [`ValueStore::write`], not yet referenced by a record), *live*
//! (referenced), *deferred* (freed by a record, not reusable before the checkpoints that
//! may still reference it are gone: its `free_gen`), or in *grace* (reusable by that
//! rule, waiting for readers that may have found it in the index before it was freed).
//! Every other byte below the end of the address space is *free*: ranges coalesced and
//! allocated best fit, the end growing when none fits and shrinking (the device giving
//! the space back) when the top range is freed.
//! A live extent also records its *owner*, the keyspace whose records reference it, so
//! that a dropped keyspace's values can be freed without reading its index
//! ([`ValueStore::drop_keyspaces`]).
//!
//! # Space
//!
//! The device holds the live and freed extents, the free space a release keeps written
//! for reuse (the *slack*: a release punches holes in what is past it, and the store
//! knows which free ranges are holes), and what is reserved ahead of the end. Freed
//! extents wait for two checkpoints; a writer that outruns them waits for room
//! ([`ValueStore::make_room`]).
//!
//! Invariants:
//! - Extents never overlap, and every byte below the end is in exactly one extent or
//!   one free range. Free ranges never touch each other nor the end.
//! - An extent is reused only after a [`ValueStore::release`] saw its `free_gen` at or
//!   below the oldest checkpoint kept (no checkpoint, hence no recovery, can reference
//!   it) and no reader that started before its free is still reading ([`ReadGuard`]).
//! - A record referencing a value is made durable only after the value's bytes: the
//!   log's group write calls [`ValueStore::sync`] first (which returns at once when
//!   nothing was written since the last). A failed sync fails the store (later writes and syncs are refused, as the
//!   other stores do): Linux may have dropped the failed pages, and a retry's success
//!   would prove nothing.
//! - No device access straddles a segment ([`BlockDevice::segment_bytes`]), and IO goes
//!   in pieces of at most [`IO_PIECE_BYTES`] through one [`AlignedBuf`], so a value of
//!   1 GiB costs its own bytes and a 1 MiB buffer, not a second copy.
//!
//! # Checkpoints
//!
//! A checkpoint of generation `G` calls [`ValueStore::open_window`] before it quiesces
//! and [`ValueStore::snapshot`] after it captured the indexes, and stores the snapshot
//! (format in [`snapshot`]) in its file; [`ValueStore::restore`] rebuilds the store from
//! it. Records applied or freed inside that window may or may not be in the captured
//! indexes, so the snapshot marks those extents *uncertain* with their (keyspace, key)
//! — the only time the store keeps keys — and recovery settles each by looking the key
//! up: [`ValueStore::mark_live`] if the index references it, [`ValueStore::free`] if
//! not. Frees get `free_gen` = the generation of the next checkpoint that surely misses
//! the reference: `G + 1` from the window of `G` on (the one in the window is
//! uncertain), the generation `open`/`restore` was given before any window.
//!
//! Errors are the crate's ([`crate::error::Error`]), so this module is the one part of
//! the storage layer that uses `error`: its callers (the trees, the hash tier, the
//! database) all speak it, and its corruption is of a file, not of a page.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{AlignedBuf, BlockDevice, IO_ALIGN_BYTES, SegmentFiles, name_path};
use crate::error::{Error, Result};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU64, Ordering};

mod cache;
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests;
mod snapshot;
#[cfg(not(feature = "shuttle"))]
mod stage;
#[cfg(all(test, not(feature = "shuttle")))]
mod tests;

pub(crate) use cache::ValueCache;
pub(crate) use snapshot::Uncertain;

/// The least space reserved ahead of the writes at a time (`ValueStore::reserve_step`).
const RESERVE_STEP_BYTES: u64 = 2 << 20;
/// The least free space a release keeps written for reuse (`ValueStore::slack`).
const SLACK_FLOOR_BYTES: u64 = 8 << 20;
/// The most holes a release punches under the store's lock (`punch_unpunched`).
const PUNCHES_PER_RELEASE: usize = 256;
/// Freed extents this long or longer are always punched by their release
/// (`ValueStore::release`): writing into their hole again costs one block allocation
/// for at least this many bytes. (The write-behind's longest extent too.)
const PUNCHED_EXTENT_BYTES: u64 = 256 << 10;

/// Bytes of an encoded [`ValueRef`].
pub(crate) const REF_BYTES: usize = 16;
/// Bytes of a chunk: a value longer than this has a table of one crc32c per chunk.
pub(crate) const CHUNK_BYTES: u64 = 64 * 1024;
/// The most bytes one device read or write of the store moves (and the size of its
/// buffer).
pub(crate) const IO_PIECE_BYTES: u64 = 1 << 20;
/// The most bytes of one value's device reads or writes in flight together: pieces of
/// up to [`IO_PIECE_BYTES`] submitted in one io_uring batch (a 1 MiB value and its
/// chunk table go to the device at once; a longer value in groups of this many bytes).
/// The thread keeps one buffer this large for them (`io_buffer`).
pub(crate) const IN_FLIGHT_BYTES: u64 = 4 << 20;
/// Bytes of a value file's segment: large enough that a database holds few files,
/// small enough that a shrinking end gives whole files back.
pub(crate) const SEGMENT_BYTES: u64 = 256 << 20;
/// The value file's name: `values-<segment as 8 hex digits>.vlog`.
pub(crate) const FILE_NAME: (&str, &str) = ("values", "vlog");
/// What errors name as the file when the device has none (memory, simulation).
const NO_FILE: &str = "<value store device>";

const _: () = assert!(CHUNK_BYTES.is_multiple_of(IO_ALIGN_BYTES));
const _: () = assert!(IO_PIECE_BYTES.is_multiple_of(CHUNK_BYTES));
const _: () = assert!(SEGMENT_BYTES.is_multiple_of(IO_PIECE_BYTES));
const _: () = assert!(IN_FLIGHT_BYTES.is_multiple_of(IO_PIECE_BYTES));

/// Where a value lives: what an index keeps instead of the value's bytes.
///
/// Encoded in [`REF_BYTES`], little-endian: offset (u64), len (u32), crc (u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ValueRef {
    /// The extent's address in the value file (a multiple of [`IO_ALIGN_BYTES`]).
    pub(crate) offset: u64,
    /// The value's length in bytes.
    pub(crate) len: u32,
    /// crc32c of the value if it is at most [`CHUNK_BYTES`], else of its chunk table.
    pub(crate) crc: u32,
}

const _: () = assert!(8 + 4 + 4 == REF_BYTES);

impl ValueRef {
    /// The reference's bytes.
    pub(crate) fn encode(&self) -> [u8; REF_BYTES] {
        let mut bytes = [0; REF_BYTES];
        bytes[..8].copy_from_slice(&self.offset.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.len.to_le_bytes());
        bytes[12..].copy_from_slice(&self.crc.to_le_bytes());
        bytes
    }

    /// The reference `bytes` encode: `None` unless they are exactly [`REF_BYTES`] and
    /// the offset is aligned.
    pub(crate) fn decode(bytes: &[u8]) -> Option<ValueRef> {
        let bytes: &[u8; REF_BYTES] = bytes.try_into().ok()?;
        let (offset, rest) = bytes.split_first_chunk::<8>()?;
        let (len, crc) = rest.split_first_chunk::<4>()?;
        let r = ValueRef {
            offset: u64::from_le_bytes(*offset),
            len: u32::from_le_bytes(*len),
            crc: u32::from_le_bytes(crc.try_into().ok()?),
        };
        r.offset.is_multiple_of(IO_ALIGN_BYTES).then_some(r)
    }

    /// Bytes of its extent.
    pub(crate) fn extent_bytes(&self) -> u64 {
        extent_bytes(self.len)
    }

    /// The end of its extent, if the address space reaches it.
    fn extent_end(&self) -> Option<u64> {
        self.offset.checked_add(self.extent_bytes())
    }
}

/// Space reserved ahead of the end at a time for a store whose address space ends at
/// `end`: a 128th of it, at least [`RESERVE_STEP_BYTES`]. A write past a file's end
/// allocates blocks under the file's exclusive lock; a step amortizes that over many
/// writes (2 MiB: 256 values of 8 KiB), and what is reserved and not yet written counts
/// in the directory's size, so steps stay small beside the file.
fn reserve_step(end: u64) -> u64 {
    (end / 128).max(RESERVE_STEP_BYTES)
}

/// Chunks of a value of `len` bytes that has a chunk table (0 if it has none).
fn table_chunks(len: u32) -> u64 {
    if u64::from(len) > CHUNK_BYTES {
        u64::from(len).div_ceil(CHUNK_BYTES)
    } else {
        0
    }
}

/// Bytes of the extent of a value of `len` bytes (module docs).
pub(crate) fn extent_bytes(len: u32) -> u64 {
    let used = u64::from(len) + 4 * table_chunks(len);
    used.max(1).next_multiple_of(IO_ALIGN_BYTES)
}

/// Microseconds every whole read of a value ([`ValueStore::read`]) waits before it reads
/// (`Db::delay_value_reads_for_test`): a test hook that widens the window between a
/// reader finding a reference and reading its bytes, in which a concurrent overwrite,
/// checkpoints and a release could reuse the extent were the reader not guarded. Zero
/// (no wait) outside those tests.
pub(crate) static READ_DELAY_MICROS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// The value file of a database directory: segment files [`FILE_NAME`] of
/// [`SEGMENT_BYTES`] in `dir`, with `O_DIRECT` if `direct` and the filesystem allows it.
pub(crate) fn value_files(dir: &Path, direct: bool) -> SegmentFiles {
    SegmentFiles::new(dir, FILE_NAME, SEGMENT_BYTES, direct)
}

/// What an extent is doing (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Extent {
    /// Written (or being written), not referenced yet.
    Pending,
    /// Referenced by a record.
    Live,
    /// Freed; reusable once no kept checkpoint is older than `free_gen`.
    Deferred { free_gen: u64 },
    /// Reusable by the checkpoint rule; waiting for readers.
    Grace { free_gen: u64 },
}

/// An extent's entry: its reference, its state, the keyspace whose records reference
/// it, and — while a checkpoint's window is open, for the extents applied or freed in
/// it — the key of the record.
#[derive(Debug)]
struct Entry {
    r: ValueRef,
    state: Extent,
    /// The keyspace of the records that reference the extent: set when it becomes live
    /// ([`ValueStore::applied`], [`ValueStore::mark_live`]), [`NO_OWNER`] until then
    /// or if a snapshot of format 1 did not say. Kept after a free (no one reads it
    /// then).
    owner: u32,
    uncertain: Option<Box<Key>>,
}

/// The owner of an extent that no record has claimed (pending), or whose keyspace a
/// snapshot of format 1 did not record: no keyspace has this id (`Db` keyspace ids
/// stop one below it).
pub(crate) const NO_OWNER: u32 = u32::MAX;

/// The record's key of an uncertain extent.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    keyspace: u32,
    key: Box<[u8]>,
}

/// The free ranges: each by its start, and an index by (length, start) for best fit.
#[derive(Debug, Default)]
struct FreeRanges {
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    bytes: u64,
}

impl FreeRanges {
    /// Adds `[start, start + len)`, merging it with the ranges it touches; returns the
    /// merged range.
    fn insert(&mut self, mut start: u64, mut len: u64) -> (u64, u64) {
        debug_assert!(len > 0);
        if let Some((&s, &l)) = self.by_start.range(..start).next_back()
            && s + l == start
        {
            self.remove(s);
            (start, len) = (s, l + len);
        }
        if let Some(&l) = self.by_start.get(&(start + len)) {
            self.remove(start + len);
            len += l;
        }
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
        self.bytes += len;
        (start, len)
    }

    /// Removes the range starting at `start`; its length.
    fn remove(&mut self, start: u64) -> Option<u64> {
        let len = self.by_start.remove(&start)?;
        self.by_len.remove(&(len, start));
        self.bytes -= len;
        Some(len)
    }

    /// The smallest range of at least `len` bytes (the lowest of equals).
    fn best_fit(&self, len: u64) -> Option<(u64, u64)> {
        self.by_len.range((len, 0)..).next().map(|&(l, s)| (s, l))
    }

    /// The range holding `at`, if `at` is free.
    fn holding(&self, at: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.by_start.range(..=at).next_back()?;
        (at < s + l).then_some((s, l))
    }
}

/// The free space below the end that holds no blocks on the device: ranges punched
/// (a release's, recovery's `discard_free`) and not allocated since. Disjoint ranges
/// that never touch, each inside one free range. What it does not know (space freed
/// without a punch, gaps a restore or `claim` left) it counts as holding blocks, so
/// the store may punch a range twice but never counts one as empty that is not.
#[derive(Debug, Default)]
struct Holes {
    by_start: BTreeMap<u64, u64>,
    bytes: u64,
}

impl Holes {
    /// Adds `[start, start + len)`, merging it with the holes it touches or overlaps.
    fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut stop = start + len;
        self.remove(start, stop);
        let mut start = start;
        if let Some((&s, &l)) = self.by_start.range(..start).next_back()
            && s + l == start
        {
            self.by_start.remove(&s);
            self.bytes -= l;
            start = s;
        }
        if let Some(l) = self.by_start.remove(&stop) {
            self.bytes -= l;
            stop += l;
        }
        self.by_start.insert(start, stop - start);
        self.bytes += stop - start;
    }

    /// Removes every byte of `[start, stop)` from the holes.
    fn remove(&mut self, start: u64, stop: u64) {
        if start >= stop {
            return;
        }
        let first = match self.by_start.range(..start).next_back() {
            Some((&s, &l)) if s + l > start => s,
            _ => start,
        };
        let overlapping: Vec<(u64, u64)> = self
            .by_start
            .range(first..stop)
            .map(|(&s, &l)| (s, l))
            .collect();
        for (s, l) in overlapping {
            self.by_start.remove(&s);
            self.bytes -= l;
            if s < start {
                self.by_start.insert(s, start - s);
                self.bytes += start - s;
            }
            if s + l > stop {
                self.by_start.insert(stop, s + l - stop);
                self.bytes += s + l - stop;
            }
        }
    }

    /// The parts of `[start, stop)` that are not holes, in order.
    fn gaps(&self, start: u64, stop: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut at = start;
        let first = match self.by_start.range(..start).next_back() {
            Some((&s, &l)) if s + l > start => s,
            _ => start,
        };
        for (&s, &l) in self.by_start.range(first..stop) {
            if s > at {
                gaps.push((at, s - at));
            }
            at = at.max(s + l);
        }
        if at < stop {
            gaps.push((at, stop - at));
        }
        gaps
    }
}

/// Extent bytes per state (deferred counts grace too), and value bytes of live extents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    pending: u64,
    live: u64,
    deferred: u64,
    live_value: u64,
    live_extents: u64,
}

impl Totals {
    fn count(&mut self, r: &ValueRef, state: Extent, add: bool) {
        let (bytes, value) = (r.extent_bytes(), u64::from(r.len));
        let apply = |n: &mut u64, by: u64| *n = if add { *n + by } else { *n - by };
        match state {
            Extent::Pending => apply(&mut self.pending, bytes),
            Extent::Live => {
                apply(&mut self.live, bytes);
                apply(&mut self.live_value, value);
                apply(&mut self.live_extents, 1);
            }
            Extent::Deferred { .. } | Extent::Grace { .. } => apply(&mut self.deferred, bytes),
        }
    }
}

/// What a [`ValueStore`] holds, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ValueStoreStats {
    /// Bytes of the live values (their lengths, not their extents).
    pub(crate) live_bytes: u64,
    /// Live values.
    pub(crate) live_values: u64,
    /// Bytes of every extent, whatever its state: the address space less the free
    /// ranges.
    pub(crate) allocated_bytes: u64,
    /// Bytes of extents written and not yet referenced.
    pub(crate) pending_bytes: u64,
    /// Bytes of extents freed and not yet reusable (deferred or in grace).
    pub(crate) deferred_bytes: u64,
    /// Bytes of the free ranges below the end.
    pub(crate) free_bytes: u64,
    /// The end of the address space: what the device holds at most.
    pub(crate) end_bytes: u64,
}

/// The allocation state (module docs).
#[derive(Debug)]
struct State {
    /// Every extent, by offset.
    extents: BTreeMap<u64, Entry>,
    /// Deferred extents by (free_gen, offset), for `release`.
    deferred: BTreeSet<(u64, u64)>,
    free: FreeRanges,
    /// The free ranges' parts known to hold no blocks (`Holes`): the rest of the free
    /// space is what the device still stores for nothing, which the slack bounds.
    holes: Holes,
    /// The end of the address space.
    end: u64,
    /// Above this the device holds no bytes of ours (`u64::MAX`: not known, as after an
    /// open); a release cuts the device to the end when the end is lower by more than
    /// the reserve slack (`ValueStore::slack`).
    device_end: u64,
    /// Below this the device has its space allocated ahead of the writes
    /// ([`BlockDevice::reserve`]): a write there overwrites allocated blocks instead of
    /// extending a file (which ext4 does under the inode's exclusive lock, with block
    /// allocation journaled per write).
    reserved: u64,
    /// The `free_gen` of a free now.
    next_gen: u64,
    /// The generation of the checkpoint whose window is open.
    window: Option<u64>,
    totals: Totals,
    /// Why the store refuses writes and syncs: a sync failed.
    failed: Option<String>,
}

impl State {
    fn new(next_gen: u64) -> State {
        State {
            extents: BTreeMap::new(),
            deferred: BTreeSet::new(),
            free: FreeRanges::default(),
            holes: Holes::default(),
            end: 0,
            device_end: u64::MAX,
            reserved: 0,
            next_gen,
            window: None,
            totals: Totals::default(),
            failed: None,
        }
    }

    /// An address for an extent of `bytes`: the best-fitting free range's start, else
    /// the top free range extended past the end, else the end.
    fn allocate(&mut self, bytes: u64) -> u64 {
        if let Some((start, len)) = self.free.best_fit(bytes) {
            self.free.remove(start);
            if len > bytes {
                self.free.insert(start + bytes, len - bytes);
            }
            // The write allocates whatever blocks a punch took.
            self.holes.remove(start, start + bytes);
            return start;
        }
        // The top range never touches the end (it would have been given back), so
        // there is none to extend: grow at the end.
        let start = self.end;
        self.end += bytes;
        if self.device_end != u64::MAX {
            self.device_end = self.device_end.max(self.end);
        }
        start
    }

    /// Makes `[start, start + len)` free, lowering the end if it reaches it.
    fn give_back(&mut self, start: u64, len: u64) {
        let (start, len) = self.free.insert(start, len);
        if start + len == self.end {
            self.free.remove(start);
            self.end = start;
            self.holes.remove(start, u64::MAX);
        }
    }

    /// Free bytes below the end that the device still holds blocks for: free ranges
    /// not known to be holes.
    fn unpunched_bytes(&self) -> u64 {
        self.free.bytes - self.holes.bytes
    }

    /// Takes `[start, start + len)` out of the free ranges and the space above the end
    /// (growing the end over it); false, changing nothing, if a byte of it is in an
    /// extent.
    fn claim(&mut self, start: u64, len: u64) -> bool {
        let stop = start + len;
        let below = stop.min(self.end);
        if start < below {
            let Some((s, l)) = self.free.holding(start) else {
                return false;
            };
            if s + l < below {
                return false;
            }
            self.free.remove(s);
            if s < start {
                self.free.insert(s, start - s);
            }
            if below < s + l {
                self.free.insert(below, s + l - below);
            }
            self.holes.remove(start, below);
        }
        if stop > self.end {
            if start > self.end {
                self.free.insert(self.end, start - self.end);
            }
            self.end = stop;
            if self.device_end != u64::MAX {
                self.device_end = self.device_end.max(stop);
            }
        }
        true
    }

    fn insert(&mut self, entry: Entry) {
        self.totals.count(&entry.r, entry.state, true);
        if let Extent::Deferred { free_gen } = entry.state {
            self.deferred.insert((free_gen, entry.r.offset));
        }
        let old = self.extents.insert(entry.r.offset, entry);
        debug_assert!(old.is_none(), "two extents at one offset");
    }

    fn remove(&mut self, offset: u64) -> Option<Entry> {
        let entry = self.extents.remove(&offset)?;
        self.totals.count(&entry.r, entry.state, false);
        if let Extent::Deferred { free_gen } = entry.state {
            self.deferred.remove(&(free_gen, offset));
        }
        Some(entry)
    }

    /// Moves the extent at `offset` to `state`.
    fn set_state(&mut self, offset: u64, state: Extent) {
        let mut entry = self.remove(offset).expect("an extent at the offset");
        entry.state = state;
        self.insert(entry);
    }

    /// The extent at `r.offset` if it is exactly `r`.
    fn entry_of(&self, r: &ValueRef) -> Option<&Entry> {
        self.extents.get(&r.offset).filter(|e| e.r == *r)
    }

    /// Records `key` on the extent at `offset` if a window is open.
    fn note_key(&mut self, offset: u64, keyspace: u32, key: &[u8]) {
        if self.window.is_some()
            && let Some(entry) = self.extents.get_mut(&offset)
        {
            entry.uncertain = Some(Box::new(Key {
                keyspace,
                key: key.into(),
            }));
        }
    }

    /// Makes `r` a live extent whatever the store thought of its bytes: extents it
    /// overlaps that are freed (deferred or in grace) are dropped — their space was
    /// released and reused before a crash — and its range is taken from the free
    /// ranges and the space above the end. An overlapped pending or live extent of
    /// another reference is an error, and nothing changes.
    fn adopt(
        &mut self,
        r: &ValueRef,
        owner: u32,
        cache: &ValueCache,
    ) -> std::result::Result<(), String> {
        let stop = r
            .extent_end()
            .ok_or_else(|| format!("{r:?} ends past 2^64"))?;
        if let Some(entry) = self.entry_of(r) {
            if entry.state != Extent::Live {
                self.set_state(r.offset, Extent::Live);
            }
            self.claim_owner(r.offset, owner);
            return Ok(());
        }
        let first = match self.extents.range(..=r.offset).next_back() {
            Some((&at, e)) if at + e.r.extent_bytes() > r.offset => at,
            _ => r.offset,
        };
        let overlapped: Vec<(u64, Extent)> = self
            .extents
            .range(first..stop)
            .map(|(&at, e)| (at, e.state))
            .collect();
        if let Some((at, state)) = overlapped
            .iter()
            .find(|(_, s)| matches!(s, Extent::Pending | Extent::Live))
        {
            let other = self.extents[at].r;
            return Err(format!("{r:?} overlaps the {state:?} extent of {other:?}"));
        }
        for (at, _) in overlapped {
            let entry = self.remove(at).expect("listed above");
            cache.remove(at);
            self.give_back(at, entry.r.extent_bytes());
        }
        let claimed = self.claim(r.offset, r.extent_bytes());
        assert!(
            claimed,
            "{r:?} overlaps no extent, yet its range is not free"
        );
        self.insert(Entry {
            r: *r,
            state: Extent::Live,
            owner,
            uncertain: None,
        });
        Ok(())
    }

    /// Records `owner` as the keyspace of the extent at `offset` if it has none yet.
    fn claim_owner(&mut self, offset: u64, owner: u32) {
        if let Some(entry) = self.extents.get_mut(&offset)
            && entry.owner == NO_OWNER
        {
            entry.owner = owner;
        }
    }

    fn stats(&self) -> ValueStoreStats {
        let t = &self.totals;
        ValueStoreStats {
            live_bytes: t.live_value,
            live_values: t.live_extents,
            allocated_bytes: t.pending + t.live + t.deferred,
            pending_bytes: t.pending,
            deferred_bytes: t.deferred,
            free_bytes: self.free.bytes,
            end_bytes: self.end,
        }
    }
}

/// The readers' side of reuse: who might still read an extent that was freed.
///
/// Two counters of readers and an era. A reader adds itself to the counter of the
/// current era (and checks the era did not move meanwhile, else it retries); a release
/// moves extents to grace, then advances the era and waits for the previous era's
/// counter to drain. Why that is enough: a reader that could read an extent found it in
/// the index, so it entered before the extent's free, before the move to grace, and so
/// before the era advanced: it is counted in the previous era (or in an older one,
/// which the previous release already drained: releases run one at a time and each
/// waits for its drain). A reader counted in the new era entered after the free and
/// cannot find the extent. The era only goes up, so a reader that loaded an old era
/// and checks it again after its increment sees the move.
#[derive(Debug, Default)]
struct Readers {
    era: AtomicU64,
    active: [AtomicU64; 2],
}

impl Readers {
    fn enter(self: &Arc<Self>) -> ReadGuard {
        loop {
            let era = self.era.load(Ordering::SeqCst);
            let slot = (era & 1) as usize;
            self.active[slot].fetch_add(1, Ordering::SeqCst);
            if self.era.load(Ordering::SeqCst) == era {
                return ReadGuard {
                    readers: Arc::clone(self),
                    slot,
                };
            }
            self.active[slot].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Waits until every reader that entered before this call has left.
    fn wait_for_earlier(&self) {
        let old = self.era.fetch_add(1, Ordering::SeqCst);
        let slot = (old & 1) as usize;
        let mut i = 0;
        while self.active[slot].load(Ordering::SeqCst) > 0 {
            crate::sync::backoff_wait(i);
            i = i.saturating_add(1);
        }
    }
}

/// A reader's claim on the extents it may find in an index: while it lives, no extent
/// freed after it was taken is reused. Take it before looking the reference up and
/// drop it after the read. It belongs to no thread: async code may hold it across
/// awaits, and it keeps nothing borrowed.
#[derive(Debug)]
#[must_use = "a guard protects the reads made while it lives"]
pub(crate) struct ReadGuard {
    readers: Arc<Readers>,
    slot: usize,
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        self.readers.active[self.slot].fetch_sub(1, Ordering::SeqCst);
    }
}

/// The value store (module docs).
pub(crate) struct ValueStore {
    device: Arc<dyn BlockDevice>,
    segment_bytes: Option<u64>,
    state: Mutex<State>,
    readers: Arc<Readers>,
    /// Writes completed, and of them those a sync covered.
    written: AtomicU64,
    synced: AtomicU64,
    /// One sync at a time: a sync that found nothing to do must not return while
    /// another is still making earlier writes durable.
    syncing: Mutex<()>,
    /// One release at a time (module docs of [`Readers`]).
    releasing: Mutex<()>,
    /// Set once the store held a value (written, restored or recovered): until then no
    /// index holds a reference, and readers need no guard ([`ValueStore::holds_values`]).
    held: std::sync::atomic::AtomicBool,
    /// The least slack (`ValueStore::slack`): [`SLACK_FLOOR_BYTES`], or less in tests
    /// that watch space come back block by block.
    slack_floor: u64,
    /// Write-behind of short extents (`stage.rs`), once started
    /// ([`ValueStore::write_behind`]); without it every write waits for its device write.
    #[cfg(not(feature = "shuttle"))]
    stager: Option<stage::Stager>,
    /// How writers of new values are held back while freed extents wait for
    /// checkpoints ([`ValueStore::make_room`]), once set
    /// ([`ValueStore::with_backpressure`]).
    #[cfg(not(feature = "shuttle"))]
    room: Option<Room>,
    /// The bytes of recently read and written values (`cache.rs`): every whole read
    /// looks there first. Its capacity is the database's to set.
    cache: Arc<ValueCache>,
    /// Called once, when the store first holds a value ([`ValueStore::on_first_value`]).
    first_value: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

/// When writers of new values wait for freed extents to become reusable
/// ([`ValueStore::make_room`]); under shuttle nothing waits and the policy goes unread.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "shuttle", allow(dead_code))]
pub(crate) struct Backpressure {
    /// A writer waits while the freed extents not yet reusable (deferred or in grace)
    /// exceed the live bytes over this, or `floor_bytes` if that is more.
    pub(crate) live_divisor: u64,
    pub(crate) floor_bytes: u64,
    /// The longest a writer waits: past it, it writes anyway (checkpoints that fail or
    /// stopped must not stop the writers with them).
    pub(crate) max_wait: std::time::Duration,
}

#[cfg_attr(feature = "shuttle", allow(dead_code))]
impl Backpressure {
    /// The freed bytes past which a writer waits, for `live_bytes` of live values.
    pub(crate) fn limit_bytes(&self, live_bytes: u64) -> u64 {
        (live_bytes / self.live_divisor).max(self.floor_bytes)
    }
}

/// Writers waiting for room: a release wakes them.
#[cfg(not(feature = "shuttle"))]
struct Room {
    policy: Backpressure,
    /// Held while a writer checks the state and goes to sleep, and by a release that
    /// wakes the writers, so no wake-up falls between the two.
    waiting: parking_lot::Mutex<Releases>,
    released: parking_lot::Condvar,
}

/// What writers waiting for room know of the releases.
#[cfg(not(feature = "shuttle"))]
#[derive(Default)]
struct Releases {
    /// Releases so far.
    count: u64,
    /// The count when a writer last waited its longest in vain: until the next release
    /// no writer waits (checkpoints are failing or stopped; each writer waiting its
    /// longest would make every write that slow).
    gave_up_at: Option<u64>,
}

impl std::fmt::Debug for ValueStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueStore")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl ValueStore {
    /// An empty store on `device`; frees before any checkpoint window get `free_gen`
    /// `next_gen` (the generation of the database's next checkpoint).
    pub(crate) fn open(device: Arc<dyn BlockDevice>, next_gen: u64) -> ValueStore {
        ValueStore::with_state(device, State::new(next_gen))
    }

    fn with_state(device: Arc<dyn BlockDevice>, state: State) -> ValueStore {
        let segment_bytes = device.segment_bytes();
        if let Some(segment) = segment_bytes {
            assert!(segment.is_multiple_of(IO_ALIGN_BYTES));
        }
        let held = std::sync::atomic::AtomicBool::new(state.end > 0);
        ValueStore {
            held,
            slack_floor: SLACK_FLOOR_BYTES,
            #[cfg(not(feature = "shuttle"))]
            stager: None,
            #[cfg(not(feature = "shuttle"))]
            room: None,
            device,
            segment_bytes,
            cache: Arc::new(ValueCache::new()),
            first_value: std::sync::OnceLock::new(),
            state: Mutex::new(state),
            readers: Arc::new(Readers::default()),
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            syncing: Mutex::new(()),
            releasing: Mutex::new(()),
        }
    }

    /// The store a checkpoint's [`ValueStore::snapshot`] describes, on `device`, and the
    /// snapshot's uncertain extents, which recovery settles with
    /// [`ValueStore::mark_live`] or [`ValueStore::free`] (module docs). `source` is the
    /// file the snapshot came from, for errors: damaged bytes are
    /// [`Error::CorruptFile`], an unknown format version [`Error::Incompatible`].
    ///
    /// Every byte below the snapshot's end outside its extents is free; none is given
    /// back to the device until [`ValueStore::discard_free`], since a free range may
    /// hold a value written after the snapshot whose record recovery replays.
    pub(crate) fn restore(
        device: Arc<dyn BlockDevice>,
        source: &Path,
        snapshot: &[u8],
    ) -> Result<(ValueStore, Vec<Uncertain>)> {
        let decoded = snapshot::decode(source, snapshot)?;
        let mut state = State::new(decoded.next_gen);
        let mut at = 0;
        for (r, extent, owner) in decoded.extents {
            if r.offset > at {
                state.free.insert(at, r.offset - at);
            }
            at = r
                .extent_end()
                .expect("decode checks the extent ends below the end");
            state.insert(Entry {
                r,
                state: extent,
                owner,
                uncertain: None,
            });
        }
        state.end = at;
        Ok((ValueStore::with_state(device, state), decoded.uncertain))
    }

    /// Writes `value` into a new extent and returns its reference; the extent is
    /// pending until [`ValueStore::applied`] or [`ValueStore::abort`]. The bytes are
    /// durable after the next [`ValueStore::sync`]. On an IO error the extent is free
    /// again and the error names the file. Once a sync failed, refused
    /// ([`Error::Poisoned`]); a value longer than `u32::MAX` is [`Error::ValueTooLarge`].
    pub(crate) fn write(&self, value: &[u8]) -> Result<ValueRef> {
        let len = u32::try_from(value.len()).map_err(|_| Error::ValueTooLarge {
            len: value.len(),
            max: u32::MAX as usize,
        })?;
        let table = chunk_table(value);
        let crc = if table.is_empty() {
            crc32c::crc32c(value)
        } else {
            crc32c::crc32c(&table)
        };
        self.note_held();
        let r = {
            let mut state = self.state.lock();
            if let Some(cause) = &state.failed {
                return Err(Error::Poisoned {
                    cause: cause.clone(),
                });
            }
            let offset = state.allocate(extent_bytes(len));
            let r = ValueRef { offset, len, crc };
            let stop = offset + extent_bytes(len);
            if stop > state.reserved {
                // Space ahead of the writes, in steps (`reserve_step`): reserved under
                // the lock, which allocations above it wait for.
                let to = stop
                    .max(state.reserved + reserve_step(state.end))
                    .next_multiple_of(IO_ALIGN_BYTES);
                let from = state.reserved;
                if let Err(e) = self.device.reserve(from, to - from) {
                    state.give_back(offset, extent_bytes(len));
                    return Err(self.io_error(from, e));
                }
                state.reserved = to;
                if state.device_end != u64::MAX {
                    state.device_end = state.device_end.max(to);
                }
            }
            state.insert(Entry {
                r,
                state: Extent::Pending,
                owner: NO_OWNER,
                uncertain: None,
            });
            r
        };
        if let Err(e) = self.stage_or_write(&r, value, &table) {
            let mut state = self.state.lock();
            state.remove(r.offset);
            state.give_back(r.offset, r.extent_bytes());
            return Err(e);
        }
        self.written.fetch_add(1, Ordering::Release);
        // A value written is often read soon (an update of a hot key); the cache's
        // small queue keeps a written value only if it is read before it leaves.
        self.cache.insert_written(&r, value);
        Ok(r)
    }

    /// The record referencing `r` was placed in its index: the extent is live. An
    /// extent the store does not know is made live (as by [`ValueStore::mark_live`]);
    /// one already freed stays freed. Inside a checkpoint's window the extent becomes
    /// uncertain, with the record's key.
    pub(crate) fn applied(&self, r: ValueRef, keyspace: u32, key: &[u8]) {
        let mut state = self.state.lock();
        match state.entry_of(&r).map(|e| e.state) {
            Some(Extent::Pending) => state.set_state(r.offset, Extent::Live),
            Some(Extent::Live) => {}
            Some(Extent::Deferred { .. } | Extent::Grace { .. }) => return,
            None => {
                if let Err(why) = state.adopt(&r, keyspace, &self.cache) {
                    log::warn!("value store: a record applied with an unknown value: {why}");
                    return;
                }
            }
        }
        state.claim_owner(r.offset, keyspace);
        state.note_key(r.offset, keyspace, key);
    }

    /// The record referencing `r` was never logged nor placed: its extent is free at
    /// once (no one can have read it). Ignored unless `r` is exactly a pending extent.
    #[cfg(all(test, not(feature = "shuttle")))]
    pub(crate) fn abort(&self, r: ValueRef) {
        let mut state = self.state.lock();
        if state.entry_of(&r).map(|e| e.state) == Some(Extent::Pending) {
            state.remove(r.offset);
            self.cache.remove(r.offset);
            state.give_back(r.offset, r.extent_bytes());
        }
    }

    /// A record that no longer references `r` (a delete, an overwrite) was applied:
    /// the extent is deferred until a [`ValueStore::release`] frees it. Ignored unless
    /// the store's extent at `r.offset` is exactly `r` and live or pending, so a
    /// repeated free, or a free of a reference whose extent was since reused, changes
    /// nothing. Inside a checkpoint's window the extent becomes uncertain, with `key`.
    pub(crate) fn free(&self, r: ValueRef, keyspace: u32, key: &[u8]) {
        let mut state = self.state.lock();
        if matches!(
            state.entry_of(&r).map(|e| e.state),
            Some(Extent::Live | Extent::Pending)
        ) {
            let free_gen = state.next_gen;
            state.set_state(r.offset, Extent::Deferred { free_gen });
            state.note_key(r.offset, keyspace, key);
            // No later read finds it: its memory goes back now. (A reader that found
            // it before may cache it again; the release drops that.)
            self.cache.remove(r.offset);
        }
    }

    /// Recovery replayed a record of `keyspace` referencing `r` (or found one that
    /// references it): whatever the store thought, the extent is live, owned by
    /// `keyspace` (taken out of the free ranges, or the address space grown to it).
    /// Freed extents it overlaps are dropped (the space was reused before the crash).
    /// Not to run beside a [`ValueStore::release`].
    ///
    /// A pending or live extent of another reference in its way means the log and the
    /// snapshot disagree: an [`Error::CorruptFile`] naming the value file, and nothing
    /// changes.
    pub(crate) fn mark_live(&self, r: ValueRef, keyspace: u32) -> Result<()> {
        self.note_held();
        let result = self.state.lock().adopt(&r, keyspace, &self.cache);
        result.map_err(|why| Error::CorruptFile {
            path: self.file_of(r.offset),
            reason: format!("a recovered value reference does not fit the value file: {why}"),
        })
    }

    /// Frees every live extent whose keyspace `dropped` names, as [`ValueStore::free`]
    /// would (deferred until a release, `free_gen` the next checkpoint's); returns the
    /// value bytes freed. The database calls it once a dropped keyspace's last handle
    /// is gone (no reader or writer of it is left, and the durable manifest no longer
    /// names it, so no recovery reads its records), and recovery calls it for the
    /// keyspaces its manifest does not name: their extents in the restored snapshot.
    /// Extents of no known keyspace ([`NO_OWNER`]) are never freed here. Walks every
    /// extent under the lock: a drop is rare, and an owner index would cost every
    /// extent more memory.
    pub(crate) fn drop_keyspaces(&self, dropped: impl Fn(u32) -> bool) -> u64 {
        let mut state = self.state.lock();
        let owned: Vec<u64> = state
            .extents
            .values()
            .filter(|e| e.state == Extent::Live && e.owner != NO_OWNER && dropped(e.owner))
            .map(|e| e.r.offset)
            .collect();
        let free_gen = state.next_gen;
        let mut bytes = 0;
        for offset in owned {
            bytes += u64::from(state.extents[&offset].r.len);
            state.set_state(offset, Extent::Deferred { free_gen });
            // As at a free: no later read finds it.
            self.cache.remove(offset);
        }
        bytes
    }

    /// A checkpoint of `generation` is about to quiesce: from now on frees are for the
    /// next one (`free_gen` = `generation + 1`), and until [`ValueStore::snapshot`]
    /// the extents applied or freed are uncertain.
    pub(crate) fn open_window(&self, generation: u64) {
        let mut state = self.state.lock();
        state.window = Some(generation);
        state.next_gen = generation + 1;
    }

    /// Closes the window and encodes the store for the checkpoint ([`snapshot`]):
    /// every live, deferred and grace extent (not the pending ones: their records are
    /// either in the log after the checkpoint's position or never acknowledged), the
    /// uncertain ones with their keys. About 17 bytes an extent (a million large
    /// values: 17-25 MB), built under the store's lock.
    pub(crate) fn snapshot(&self) -> Vec<u8> {
        let mut state = self.state.lock();
        state.window = None;
        snapshot::encode(&mut state)
    }

    /// A checkpoint committed, and `oldest_kept_generation` is the oldest one kept:
    /// deferred extents freed for it or an older one can no longer be referenced by a
    /// recovery. They wait in grace until every reader that began before now has
    /// finished, then their space is given back to the device and is free (the end
    /// lowered, the device cut short, if they were on top).
    ///
    /// Writers and readers go on meanwhile: the lock is not held while readers drain
    /// nor while the device punches holes. The extents are free even if the device
    /// fails to give their space back; that error is returned.
    pub(crate) fn release(&self, oldest_kept_generation: u64) -> Result<()> {
        let _one = self.releasing.lock();
        let mut graced: Vec<(u64, u64)> = {
            let mut state = self.state.lock();
            let due: Vec<(u64, u64)> = state
                .deferred
                .range(..=(oldest_kept_generation, u64::MAX))
                .copied()
                .collect();
            due.into_iter()
                .map(|(free_gen, offset)| {
                    state.set_state(offset, Extent::Grace { free_gen });
                    (offset, state.extents[&offset].r.extent_bytes())
                })
                .collect()
        };
        // Released space is given back to the device (holes punched) only past a slack
        // of free space kept written for reuse: a write into a hole allocates blocks
        // again (ext4 journals that, under the file's exclusive lock), while a write
        // over freed bytes is a plain overwrite. That matters per write, so only short
        // extents are kept: an extent of PUNCHED_EXTENT_BYTES or more is always
        // punched (its next writer allocates once for that many bytes, a write of its
        // own). So the file holds the live bytes, what waits for checkpoints, at most
        // the slack of short extents' space and what is reserved ahead.
        let slack = self.slack(self.state.lock().totals.live_value);
        let mut failure = None;
        let mut punched = Vec::new();
        if !graced.is_empty() {
            self.readers.wait_for_earlier();
            // In grace the extents cannot be allocated: their holes are punched
            // outside the lock, neighbours merged into one call: the long ones, and
            // short ones as far as they do not fit in the slack.
            graced.sort_unstable();
            let mut kept = self.state.lock().unpunched_bytes();
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for &(start, len) in &graced {
                if len < PUNCHED_EXTENT_BYTES && kept + len <= slack {
                    kept += len;
                    continue;
                }
                match runs.last_mut() {
                    Some((s, l)) if *s + *l == start => *l += len,
                    _ => runs.push((start, len)),
                }
            }
            for (start, len) in runs {
                match self.device.discard(start, len) {
                    Ok(()) => punched.push((start, len)),
                    Err(e) => {
                        failure.get_or_insert_with(|| self.io_error(start, e));
                    }
                }
            }
        }
        let mut state = self.state.lock();
        for (offset, len) in graced {
            if matches!(
                state.extents.get(&offset).map(|e| e.state),
                Some(Extent::Grace { .. })
            ) {
                state.remove(offset);
                // The readers that could have found it are gone, and so are their
                // inserts: once its entry is dropped here, under the lock its space is
                // allocated under, no entry holds bytes of the extent reused.
                self.cache.remove(offset);
                state.give_back(offset, len);
            }
        }
        let end = state.end;
        for (start, len) in punched.into_iter().filter(|&(start, _)| start < end) {
            state.holes.insert(start, len.min(end - start));
        }
        // Free space past the slack that earlier releases kept written (for a store
        // that since shrank, or that grew past its end while checkpoints lagged) is
        // punched too: under the lock, since free ranges may be allocated, the highest
        // first.
        if failure.is_none()
            && let Err((at, e)) = self.punch_unpunched(&mut state, slack)
        {
            failure = Some(self.io_error(at, e));
        }
        // Cut under the lock: nothing is allocated above the end meanwhile. Space
        // reserved ahead stays while it is within the slack.
        if state.end.saturating_add(self.slack(state.end)) < state.device_end {
            match self.device.truncate_from(state.end) {
                Ok(()) => {
                    state.device_end = state.end;
                    state.reserved = state.end;
                }
                Err(e) => {
                    failure.get_or_insert_with(|| self.io_error(state.end, e));
                }
            }
        }
        drop(state);
        #[cfg(not(feature = "shuttle"))]
        if let Some(room) = &self.room {
            room.waiting.lock().count += 1;
            room.released.notify_all();
        }
        failure.map_or(Ok(()), Err)
    }

    /// Punches free space the device still holds until at most `keep` bytes of it are
    /// left, from the highest free range down, in at most [`PUNCHES_PER_RELEASE`]
    /// calls (it runs under the lock, which writers wait for: the rest waits for the
    /// next release); the punched ranges become holes.
    fn punch_unpunched(
        &self,
        state: &mut State,
        keep: u64,
    ) -> std::result::Result<(), (u64, io::Error)> {
        let mut over = state.unpunched_bytes().saturating_sub(keep);
        if over == 0 {
            return Ok(());
        }
        let mut gaps = Vec::new();
        for (&start, &len) in state.free.by_start.iter().rev() {
            for (gap, gap_len) in state.holes.gaps(start, start + len).into_iter().rev() {
                if over == 0 || gaps.len() == PUNCHES_PER_RELEASE {
                    break;
                }
                let n = gap_len.min(over.next_multiple_of(IO_ALIGN_BYTES));
                gaps.push((gap + gap_len - n, n));
                over = over.saturating_sub(n);
            }
            if over == 0 || gaps.len() == PUNCHES_PER_RELEASE {
                break;
            }
        }
        for (start, len) in gaps {
            self.device.discard(start, len).map_err(|e| (start, e))?;
            state.holes.insert(start, len);
        }
        Ok(())
    }

    /// Gives the space of every free range, and everything above the end, back to the
    /// device: recovery calls it once it has marked every replayed reference live, as
    /// a free range may still hold a value written after the snapshot whose record was
    /// lost. It holds the lock throughout (nothing else runs during recovery).
    pub(crate) fn discard_free(&self) -> Result<()> {
        let mut state = self.state.lock();
        let free: Vec<(u64, u64)> = state.free.by_start.iter().map(|(&s, &l)| (s, l)).collect();
        for (start, len) in free {
            self.device
                .discard(start, len)
                .map_err(|e| self.io_error(start, e))?;
            state.holes.insert(start, len);
        }
        self.device
            .truncate_from(state.end)
            .map_err(|e| self.io_error(state.end, e))?;
        state.device_end = state.end;
        state.reserved = state.end;
        Ok(())
    }

    /// Free space of short extents kept written for reuse in a store of `bytes` live:
    /// an eighth of it, at least the floor (8 MiB). Kept among the free ranges, it
    /// saves writes from allocating blocks (ext4 allocates under the file's exclusive
    /// lock and journals it); a release punches what is past it, and every long extent
    /// (`ValueStore::release`).
    fn slack(&self, bytes: u64) -> u64 {
        (bytes / 8).max(self.slack_floor)
    }

    /// Starts writing short values behind their writers (`stage.rs`), with at most
    /// `limit` bytes of them in memory at once: a write then returns once its bytes are
    /// queued, reads of them are served from memory until they are on the device, and
    /// [`ValueStore::sync`] waits for them first. Under shuttle there is no such thread
    /// and writes stay synchronous.
    pub(crate) fn write_behind(self, limit: u64) -> Result<ValueStore> {
        #[cfg(not(feature = "shuttle"))]
        {
            let mut store = self;
            store.stager = Some(stage::Stager::start(Arc::clone(&store.device), limit)?);
            Ok(store)
        }
        #[cfg(feature = "shuttle")]
        {
            let _ = limit;
            Ok(self)
        }
    }

    /// Holds writers back by `policy` ([`ValueStore::make_room`]); under shuttle
    /// nothing waits.
    pub(crate) fn with_backpressure(self, policy: Backpressure) -> ValueStore {
        #[cfg(not(feature = "shuttle"))]
        {
            let mut store = self;
            store.room = Some(Room {
                policy,
                waiting: parking_lot::Mutex::new(Releases::default()),
                released: parking_lot::Condvar::new(),
            });
            store
        }
        #[cfg(feature = "shuttle")]
        {
            let _ = policy;
            self
        }
    }

    /// Waits (up to the policy's longest wait) while the extents freed and not yet
    /// reusable exceed the policy's limit: a writer of new values that outruns the
    /// checkpoints that make freed space reusable would otherwise grow the value file
    /// by what it writes meanwhile (a freed extent waits for two checkpoints). Call it
    /// before [`ValueStore::write`] where the caller holds nothing a checkpoint needs
    /// (no stripe, page lock or epoch guard): the wait is for a checkpoint's release.
    /// A store that failed, or without a policy, does not wait, nor does anyone after
    /// a writer waited its longest in vain, until the next release.
    pub(crate) fn make_room(&self) {
        #[cfg(not(feature = "shuttle"))]
        if let Some(room) = &self.room {
            let deadline = std::time::Instant::now() + room.policy.max_wait;
            let mut waiting = room.waiting.lock();
            loop {
                let over = {
                    let state = self.state.lock();
                    state.failed.is_none()
                        && state.totals.deferred > room.policy.limit_bytes(state.totals.live_value)
                };
                if !over || waiting.gave_up_at == Some(waiting.count) {
                    return;
                }
                if room.released.wait_until(&mut waiting, deadline).timed_out() {
                    waiting.gave_up_at = Some(waiting.count);
                    return;
                }
            }
        }
    }

    /// This store with a slack floor of `floor` bytes instead of 16 MiB.
    #[cfg(all(test, not(feature = "shuttle")))]
    pub(crate) fn with_slack_floor(mut self, floor: u64) -> ValueStore {
        self.slack_floor = floor;
        self
    }

    /// Whether the store ever held a value in this process (or its restored state
    /// holds one): until it does, no index can hold a reference into it, and a reader
    /// may skip [`ValueStore::read_guard`]. Set before a written value's reference is
    /// handed out, so a reader that finds one finds it set.
    pub(crate) fn holds_values(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Marks the store as holding values ([`ValueStore::holds_values`]); the first time,
    /// calls the hook [`ValueStore::on_first_value`] set.
    fn note_held(&self) {
        if !self.held.load(Ordering::Acquire)
            && !self.held.swap(true, Ordering::SeqCst)
            && let Some(hook) = self.first_value.get()
        {
            hook();
        }
    }

    /// Sets what runs when the store first holds a value (written, or marked live by
    /// recovery): the database gives the value cache its share of the memory budget
    /// then, so a database of short values never gives its trees' memory to it. The
    /// hook runs on the writer's thread, outside the store's locks. A store that held
    /// values before the hook was set does not call it: check
    /// [`ValueStore::holds_values`] after setting it. Set once; later calls are
    /// ignored.
    pub(crate) fn on_first_value(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.first_value.set(hook);
    }

    /// The value cache, whose capacity the database sets.
    pub(crate) fn cache(&self) -> &Arc<ValueCache> {
        &self.cache
    }

    /// A reader's guard ([`ReadGuard`]): take it before looking a reference up in an
    /// index, drop it after reading the value.
    pub(crate) fn read_guard(&self) -> ReadGuard {
        self.readers.enter()
    }

    /// Reads the whole value `r` into `out` (replacing its contents): from the cache if
    /// it holds it, else from the device (or the write-behind queue), checking every
    /// checksum, and caches it. Call it under a [`ReadGuard`] taken before `r` was
    /// looked up: the cache relies on it (module docs of `cache.rs`).
    pub(crate) fn read(&self, r: &ValueRef, out: &mut Vec<u8>) -> Result<()> {
        let delay = READ_DELAY_MICROS.load(std::sync::atomic::Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        if self.cache.get(r, out) {
            return Ok(());
        }
        self.read_uncached(r, 0, r.len as usize, out)?;
        self.cache.insert(r, out);
        Ok(())
    }

    /// Reads the whole values `refs` into `outs` (one each, replacing their contents),
    /// as [`ValueStore::read`] reads each, with the device reads of the values not
    /// cached in flight together on io_uring: those of one chunk or less (up to 64 KiB)
    /// not waiting to be written, where the store's files allow it. A failed batch is
    /// read again one value at a time, which reports a real error. Call it under a
    /// [`ReadGuard`], as `read`.
    pub(crate) fn read_many(&self, refs: &[ValueRef], outs: &mut [Vec<u8>]) -> Result<()> {
        debug_assert_eq!(refs.len(), outs.len());
        // The values to read in one batch: index, file, offset in it, buffer.
        let mut batch = Vec::new();
        for (i, (r, out)) in refs.iter().zip(outs.iter_mut()).enumerate() {
            if self.cache.get(r, out) {
                continue;
            }
            match self.batch_target(r) {
                Some((file, offset)) => {
                    batch.push((i, file, offset, AlignedBuf::new(r.extent_bytes() as usize)));
                }
                None => self.read(r, out)?,
            }
        }
        if batch.len() < 2 {
            for &(i, ..) in &batch {
                self.read(&refs[i], &mut outs[i])?;
            }
            return Ok(());
        }
        let delay = READ_DELAY_MICROS.load(std::sync::atomic::Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        let mut reads: Vec<super::uring::ReadAt<'_>> = batch
            .iter_mut()
            .map(|(_, file, offset, buf)| super::uring::ReadAt {
                fd: std::os::fd::AsRawFd::as_raw_fd(&**file),
                offset: *offset,
                buf: buf.as_mut(),
            })
            .collect();
        let read = super::uring::submit_reads(false, &mut reads);
        drop(reads);
        for (i, _, _, buf) in &batch {
            let (r, out) = (&refs[*i], &mut outs[*i]);
            let bytes = &buf.as_ref()[..r.len as usize];
            if read.is_err() || crc32c::crc32c(bytes) != r.crc {
                // Read again alone: a real failure is reported, with its file.
                self.read(r, out)?;
                continue;
            }
            out.clear();
            out.extend_from_slice(bytes);
            self.cache.insert(r, out);
        }
        Ok(())
    }

    /// Reads the whole value `r` into `out` as [`ValueStore::read`] does, with the
    /// device reads awaited on the tokio-uring runtime's ring: the pieces of its extent
    /// (up to [`IN_FLIGHT_BYTES`]) in flight together, each on a duplicate of its
    /// segment file's descriptor, so the thread runs other tasks meanwhile. A value
    /// waiting to be written, longer than that or on a device without files is read
    /// with `read`, blocking; so is one whose ring read failed or does not check, which
    /// reports the real error. Call it under a [`ReadGuard`], as `read`; must be
    /// awaited inside a tokio-uring runtime.
    #[cfg(feature = "tokio-uring")]
    pub(crate) async fn read_on_ring(&self, r: &ValueRef, out: &mut Vec<u8>) -> Result<()> {
        let Some(pieces) = self.ring_pieces(r) else {
            return self.read(r, out);
        };
        // (The test hook blocks the thread, as it does in `read`.)
        let delay = READ_DELAY_MICROS.load(std::sync::atomic::Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        if self.cache.get(r, out) {
            return Ok(());
        }
        let reads: Vec<_> = pieces
            .into_iter()
            .map(|(file, offset, len)| {
                tokio_uring::spawn(async move { super::read_on_ring(&file, offset, len).await })
            })
            .collect();
        out.clear();
        let mut failed = false;
        for read in reads {
            match read.await {
                Ok(Ok(bytes)) if !failed => out.extend_from_slice(bytes.as_ref()),
                _ => failed = true,
            }
        }
        if failed || out.len() < r.len as usize || self.check_extent(r, out).is_err() {
            return self.read(r, out);
        }
        out.truncate(r.len as usize);
        self.cache.insert(r, out);
        Ok(())
    }

    /// The files, offsets and lengths of the pieces of value `r`'s extent, for
    /// [`ValueStore::read_on_ring`]: `None` unless the extent is one group on the
    /// device's files and not waiting to be written.
    #[cfg(feature = "tokio-uring")]
    fn ring_pieces(&self, r: &ValueRef) -> Option<Vec<(Arc<std::fs::File>, u64, usize)>> {
        let size = r.extent_bytes();
        if size > IN_FLIGHT_BYTES {
            return None;
        }
        #[cfg(not(feature = "shuttle"))]
        if let Some(stager) = &self.stager
            && stager.find(r.offset, size).is_some()
        {
            return None;
        }
        let group = self.group(r.offset, size);
        group
            .pieces
            .iter()
            .map(|&(at, n)| {
                let (file, offset) = self.device.read_target(at, n as usize)?;
                Some((file, offset, n as usize))
            })
            .collect()
    }

    /// Where value `r` can be read whole by a batch of [`ValueStore::read_many`]: its
    /// file and offset, if it is one chunk or less and not waiting to be written.
    fn batch_target(&self, r: &ValueRef) -> Option<(Arc<std::fs::File>, u64)> {
        if table_chunks(r.len) != 0 {
            return None;
        }
        #[cfg(not(feature = "shuttle"))]
        if let Some(stager) = &self.stager
            && stager.find(r.offset, r.extent_bytes()).is_some()
        {
            return None;
        }
        self.device.read_target(r.offset, r.extent_bytes() as usize)
    }

    /// Reads `len` bytes of value `r` from byte `offset` of it into `out` (replacing
    /// its contents): from the cache if it holds the whole value, else from the device,
    /// caching nothing. A value of more than one chunk costs its chunk table and the
    /// chunks the range touches; a smaller one is read and checked whole. A range past
    /// the value's end is an [`io::ErrorKind::InvalidInput`] error. On any error `out`
    /// is empty. Call it under a [`ReadGuard`], as [`ValueStore::read`].
    pub(crate) fn read_range(
        &self,
        r: &ValueRef,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if let Some(stop) = offset.checked_add(len as u64)
            && stop <= u64::from(r.len)
            && self.cache.get_range(r, offset as usize, stop as usize, out)
        {
            return Ok(());
        }
        self.read_uncached(r, offset, len, out)
    }

    /// [`ValueStore::read_range`] from the device (or the write-behind queue).
    fn read_uncached(
        &self,
        r: &ValueRef,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        out.clear();
        let stop = offset
            .checked_add(len as u64)
            .filter(|&stop| stop <= u64::from(r.len))
            .ok_or_else(|| {
                Error::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "bytes {offset}..+{len} of a value of {} bytes are out of bounds",
                        r.len
                    ),
                ))
            })?;
        if len == 0 {
            return Ok(());
        }
        let read = if table_chunks(r.len) == 0 {
            self.read_small(r, offset, stop, out)
        } else {
            self.read_chunks(r, offset, stop, out)
        };
        if read.is_err() {
            out.clear();
        }
        read
    }

    /// Makes every value written so far durable; nothing to do if nothing was written
    /// since the last sync. A failure fails the store (module docs).
    pub(crate) fn sync(&self) -> Result<()> {
        let _one = self.syncing.lock();
        let written = self.written.load(Ordering::Acquire);
        if written == self.synced.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(cause) = &self.state.lock().failed {
            return Err(Error::Poisoned {
                cause: cause.clone(),
            });
        }
        // The writes behind first: every write counted in `written` is staged by now,
        // and the wait covers everything staged before it.
        #[cfg(not(feature = "shuttle"))]
        if let Some(stager) = &self.stager
            && let Err(cause) = stager.wait_written()
        {
            self.state
                .lock()
                .failed
                .get_or_insert_with(|| cause.clone());
            return Err(Error::Poisoned { cause });
        }
        match self.device.sync() {
            Ok(()) => {
                self.synced.store(written, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                let mut state = self.state.lock();
                state
                    .failed
                    .get_or_insert_with(|| format!("a sync of the value file failed: {e}"));
                Err(Error::from(e))
            }
        }
    }

    /// Whether a value was written since the last successful sync.
    #[cfg(all(test, not(feature = "shuttle")))]
    pub(crate) fn needs_sync(&self) -> bool {
        self.written.load(Ordering::Acquire) != self.synced.load(Ordering::Acquire)
    }

    /// What the store holds.
    pub(crate) fn stats(&self) -> ValueStoreStats {
        self.state.lock().stats()
    }

    /// Writes the extent of `r`: `value`, `table`, zeros to the end, a piece at a time.
    /// Queues the extent of `r` for write-behind if it is short enough and a stager
    /// runs, else writes it now.
    fn stage_or_write(&self, r: &ValueRef, value: &[u8], table: &[u8]) -> Result<()> {
        #[cfg(not(feature = "shuttle"))]
        if let Some(stager) = &self.stager
            && stager.takes(r.extent_bytes())
        {
            let mut image = AlignedBuf::new(r.extent_bytes() as usize);
            fill_piece(image.as_mut(), 0, value, table);
            return stager
                .stage(r.offset, image)
                .map_err(|cause| Error::Poisoned { cause });
        }
        self.write_extent(r, value, table)
    }

    /// Writes value `r`'s extent (the value, its chunk table, zeros to the block) to
    /// the device, [`IN_FLIGHT_BYTES`] in flight at a time.
    fn write_extent(&self, r: &ValueRef, value: &[u8], table: &[u8]) -> Result<()> {
        let size = r.extent_bytes();
        let mut buf = io_buffer(size.min(IN_FLIGHT_BYTES) as usize);
        let mut at = 0;
        while at < size {
            let group = self.group(r.offset + at, size - at);
            let bytes = &mut buf.as_mut()[..group.bytes as usize];
            fill_piece(bytes, at, value, table);
            self.write_group(&group, bytes)?;
            at += group.bytes;
        }
        Ok(())
    }

    /// The pieces of the next group of device accesses at `address`, of at most
    /// `remaining` bytes: up to [`IN_FLIGHT_BYTES`], each piece as
    /// [`ValueStore::piece_bytes`] allows.
    fn group(&self, address: u64, remaining: u64) -> Group {
        let stop = address + remaining.min(IN_FLIGHT_BYTES);
        let mut pieces = Vec::new();
        let mut at = address;
        while at < stop {
            let n = self.piece_bytes(at, stop - at);
            pieces.push((at, n));
            at += n;
        }
        Group {
            address,
            bytes: stop - address,
            pieces,
        }
    }

    /// Reads `group` into `bytes` (its length): its pieces in one io_uring batch where
    /// the device gives their files, else (or if the batch fails) one at a time, which
    /// reports a real failure with its file.
    fn read_group(&self, group: &Group, bytes: &mut [u8]) -> Result<()> {
        if let Some(targets) = self.targets(group, |a, n| self.device.read_target(a, n)) {
            let mut reads = Vec::with_capacity(targets.len());
            let mut rest = &mut *bytes;
            for ((file, offset), &(_, n)) in targets.iter().zip(&group.pieces) {
                let (piece, tail) = rest.split_at_mut(n as usize);
                reads.push(super::uring::ReadAt {
                    fd: std::os::fd::AsRawFd::as_raw_fd(&**file),
                    offset: *offset,
                    buf: piece,
                });
                rest = tail;
            }
            if super::uring::submit_reads(false, &mut reads).is_ok() {
                return Ok(());
            }
        }
        for &(at, n) in &group.pieces {
            let from = (at - group.address) as usize;
            self.device
                .read(at, &mut bytes[from..from + n as usize])
                .map_err(|e| self.io_error(at, e))?;
        }
        Ok(())
    }

    /// Writes `bytes` (the group's length) as `group`: as [`ValueStore::read_group`]
    /// reads. Writing a piece again after a failed batch is harmless: nothing refers to
    /// the extent until the write returns.
    fn write_group(&self, group: &Group, bytes: &[u8]) -> Result<()> {
        #[cfg(not(feature = "shuttle"))]
        if let Some(targets) = self.targets(group, |a, n| self.device.write_target(a, n)) {
            let writes: Vec<super::uring::WriteAt<'_>> = targets
                .iter()
                .zip(&group.pieces)
                .map(|((file, offset), &(at, n))| {
                    let from = (at - group.address) as usize;
                    super::uring::WriteAt {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&**file),
                        offset: *offset,
                        buf: &bytes[from..from + n as usize],
                    }
                })
                .collect();
            if super::uring::submit_writes(false, &writes).is_ok() {
                return Ok(());
            }
        }
        for &(at, n) in &group.pieces {
            let from = (at - group.address) as usize;
            self.device
                .write(at, &bytes[from..from + n as usize])
                .map_err(|e| self.io_error(at, e))?;
        }
        Ok(())
    }

    /// The files and offsets of `group`'s pieces by `target`, if it has more than one
    /// piece and the device gives every one: a single piece goes through the device.
    fn targets(
        &self,
        group: &Group,
        target: impl Fn(u64, usize) -> Option<(Arc<std::fs::File>, u64)>,
    ) -> Option<Vec<(Arc<std::fs::File>, u64)>> {
        if group.pieces.len() < 2 {
            return None;
        }
        group
            .pieces
            .iter()
            .map(|&(at, n)| target(at, n as usize))
            .collect()
    }

    /// Reads `[offset, stop)` of the one-chunk value `r`: all of it, checked.
    fn read_small(&self, r: &ValueRef, offset: u64, stop: u64, out: &mut Vec<u8>) -> Result<()> {
        out.reserve(r.len as usize);
        self.read_span(r.offset, u64::from(r.len), |bytes| {
            out.extend_from_slice(bytes);
            Ok(())
        })?;
        if crc32c::crc32c(out) != r.crc {
            return Err(self.corrupt(r, r.offset, "the value fails its checksum"));
        }
        out.copy_within(offset as usize..stop as usize, 0);
        out.truncate((stop - offset) as usize);
        Ok(())
    }

    /// Reads `[offset, stop)` of the chunked value `r`: its table, then each chunk the
    /// range touches, each checked before any of its bytes go to `out`.
    fn read_chunks(&self, r: &ValueRef, offset: u64, stop: u64, out: &mut Vec<u8>) -> Result<()> {
        let len = u64::from(r.len);
        let table_bytes = 4 * table_chunks(r.len);
        if offset == 0 && stop == len && len + table_bytes <= IN_FLIGHT_BYTES {
            return self.read_whole_chunked(r, out);
        }
        let table = self.read_table(r)?;
        let first = offset / CHUNK_BYTES;
        let span = (
            first * CHUNK_BYTES,
            stop.next_multiple_of(CHUNK_BYTES).min(len),
        );
        let chunk_stop = |i: u64| ((i + 1) * CHUNK_BYTES).min(len);
        out.reserve((stop - offset) as usize);
        // A chunk split between two pieces (at a segment boundary) is gathered here.
        let mut partial = Vec::new();
        let mut chunk = first;
        let take = |bytes: &[u8], chunk: u64, out: &mut Vec<u8>| -> Result<()> {
            let start = chunk * CHUNK_BYTES;
            if crc32c::crc32c(bytes) != table[chunk as usize] {
                let why = format!("chunk {chunk} fails its checksum");
                return Err(self.corrupt(r, r.offset + start, &why));
            }
            let (from, to) = (offset.max(start), stop.min(chunk_stop(chunk)));
            out.extend_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
            Ok(())
        };
        self.read_span(r.offset + span.0, span.1 - span.0, |mut bytes| {
            while !bytes.is_empty() {
                let need = (chunk_stop(chunk) - chunk * CHUNK_BYTES) as usize;
                if partial.is_empty() && bytes.len() >= need {
                    take(&bytes[..need], chunk, out)?;
                    bytes = &bytes[need..];
                } else {
                    let n = (need - partial.len()).min(bytes.len());
                    partial.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if partial.len() < need {
                        continue;
                    }
                    take(&partial, chunk, out)?;
                    partial.clear();
                }
                chunk += 1;
            }
            Ok(())
        })
    }

    /// Reads the chunked value `r` whole: the value and its chunk table as one span
    /// (one group of reads in flight together), the table checked against `r.crc` and
    /// every chunk against the table before `out` holds the value.
    fn read_whole_chunked(&self, r: &ValueRef, out: &mut Vec<u8>) -> Result<()> {
        let len = r.len as usize;
        let table_bytes = 4 * table_chunks(r.len);
        out.reserve(len + table_bytes as usize);
        self.read_span(r.offset, len as u64 + table_bytes, |bytes| {
            out.extend_from_slice(bytes);
            Ok(())
        })?;
        self.check_extent(r, out)?;
        out.truncate(len);
        Ok(())
    }

    /// Checks `bytes`, value `r` followed by at least its chunk table: a one-chunk
    /// value against `r.crc`, a longer one's table against `r.crc` and every chunk
    /// against the table.
    fn check_extent(&self, r: &ValueRef, bytes: &[u8]) -> Result<()> {
        let len = r.len as usize;
        let table_bytes = 4 * table_chunks(r.len) as usize;
        let (value, table) = (&bytes[..len], &bytes[len..len + table_bytes]);
        if table_bytes == 0 {
            return match crc32c::crc32c(value) == r.crc {
                true => Ok(()),
                false => Err(self.corrupt(r, r.offset, "the value fails its checksum")),
            };
        }
        if crc32c::crc32c(table) != r.crc {
            let at = r.offset + len as u64;
            return Err(self.corrupt(r, at, "the chunk table fails its checksum"));
        }
        let chunks = value
            .chunks(CHUNK_BYTES as usize)
            .zip(table.chunks_exact(4));
        for (i, (chunk, want)) in chunks.enumerate() {
            let want = u32::from_le_bytes(want.try_into().expect("chunks of 4 bytes"));
            if crc32c::crc32c(chunk) != want {
                let at = r.offset + i as u64 * CHUNK_BYTES;
                return Err(self.corrupt(r, at, &format!("chunk {i} fails its checksum")));
            }
        }
        Ok(())
    }

    /// The chunk table of `r`, checked against `r.crc`.
    fn read_table(&self, r: &ValueRef) -> Result<Vec<u32>> {
        let bytes_len = 4 * table_chunks(r.len);
        let at = r.offset + u64::from(r.len);
        let mut bytes = Vec::with_capacity(bytes_len as usize);
        self.read_span(at, bytes_len, |b| {
            bytes.extend_from_slice(b);
            Ok(())
        })?;
        if crc32c::crc32c(&bytes) != r.crc {
            return Err(self.corrupt(r, at, "the chunk table fails its checksum"));
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("chunks of 4 bytes")))
            .collect())
    }

    /// Reads the `len` bytes at `address` through aligned pieces in groups in flight
    /// together, handing `sink` the asked bytes of each group in order.
    fn read_span(
        &self,
        address: u64,
        len: u64,
        mut sink: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        // A value still on its way to the device is read from its staged image.
        #[cfg(not(feature = "shuttle"))]
        if let Some(stager) = &self.stager
            && let Some((at, image)) = stager.find(address, len)
        {
            let from = (address - at) as usize;
            return sink(&AlignedBuf::as_ref(&image)[from..from + len as usize]);
        }
        let align = self.device.read_align();
        let stop = address + len;
        let (first, last) = (address - address % align, stop.next_multiple_of(align));
        let mut buf = io_buffer((last - first).min(IN_FLIGHT_BYTES) as usize);
        let mut at = first;
        while at < last {
            let group = self.group(at, last - at);
            let bytes = &mut buf.as_mut()[..group.bytes as usize];
            self.read_group(&group, bytes)?;
            let (from, to) = (address.max(at), stop.min(at + group.bytes));
            sink(&bytes[(from - at) as usize..(to - at) as usize])?;
            at += group.bytes;
        }
        Ok(())
    }

    /// The bytes of the next device access at `address`, of at most `remaining`: no
    /// more than [`IO_PIECE_BYTES`], and not past the segment's end.
    fn piece_bytes(&self, address: u64, remaining: u64) -> u64 {
        self.device
            .segment_piece(address, remaining.min(IO_PIECE_BYTES))
    }

    /// The file holding `address`, for errors.
    fn file_of(&self, address: u64) -> PathBuf {
        self.device
            .file_of(address)
            .unwrap_or_else(|| PathBuf::from(NO_FILE))
    }

    /// An IO error at `address`, naming its file.
    fn io_error(&self, address: u64, e: io::Error) -> Error {
        Error::from(name_path(self.device.file_of(address).as_deref(), e))
    }

    /// Damaged bytes of the extent of `r` at `address`.
    fn corrupt(&self, r: &ValueRef, address: u64, what: &str) -> Error {
        let file_offset = self.segment_bytes.map_or(address, |s| address % s);
        Error::CorruptFile {
            path: self.file_of(address),
            reason: format!(
                "value extent at address {} ({} bytes): {what} (bytes at address {address}, \
                 file offset {file_offset})",
                r.offset, r.len
            ),
        }
    }

    /// Checks every invariant of the allocation state (module docs), for tests.
    #[cfg(test)]
    fn check(&self) {
        self.state.lock().check();
    }
}

thread_local! {
    /// The thread's buffer for IO groups of 64 KiB or more (`io_buffer`): a buffer that
    /// large is a mapping of its own, which a fresh allocation per read maps, faults in,
    /// zeroes and unmaps (17% of the CPU of 1 MiB reads; at 64 KiB values, 18% of YCSB
    /// C's, most of it the unmap's TLB shootdowns, profiled). It grows to the largest
    /// group the thread moved (in steps of 64 KiB to a mebibyte, then of a mebibyte),
    /// at most [`IN_FLIGHT_BYTES`].
    static IO_BUFFER: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// An aligned buffer of at least `len` bytes (at most [`IN_FLIGHT_BYTES`]) for one
/// group of reads or writes: the thread's buffer when the group needs 64 KiB or more
/// (given back when dropped), else a fresh small one from the heap.
fn io_buffer(len: usize) -> PieceBuf {
    if len < super::OWN_MAPPING_BYTES {
        return PieceBuf(Some(AlignedBuf::new(len)), false);
    }
    let cached = IO_BUFFER
        .with(std::cell::Cell::take)
        .filter(|buf| buf.as_ref().len() >= len);
    let step = match len < IO_PIECE_BYTES as usize {
        true => super::OWN_MAPPING_BYTES,
        false => IO_PIECE_BYTES as usize,
    };
    let fresh = || AlignedBuf::new(len.next_multiple_of(step));
    PieceBuf(Some(cached.unwrap_or_else(fresh)), true)
}

/// A group of device accesses (`ValueStore::group`): `bytes` from `address`, as
/// `pieces` of (address, bytes), none crossing a segment's end.
struct Group {
    address: u64,
    bytes: u64,
    pieces: Vec<(u64, u64)>,
}

/// A buffer from [`io_buffer`]; the thread's mebibyte buffer goes back when dropped.
struct PieceBuf(Option<AlignedBuf>, bool);

impl PieceBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.0.as_mut().expect("held until dropped").as_mut()
    }
}

impl Drop for PieceBuf {
    fn drop(&mut self) {
        if self.1 {
            let buf = self.0.take();
            IO_BUFFER.with(|cell| cell.set(buf));
        }
    }
}

/// The chunk table of `value`: one crc32c per chunk, little-endian; empty for a value
/// of one chunk or less.
fn chunk_table(value: &[u8]) -> Vec<u8> {
    if table_chunks(value.len() as u32) == 0 {
        return Vec::new();
    }
    value
        .chunks(CHUNK_BYTES as usize)
        .flat_map(|chunk| crc32c::crc32c(chunk).to_le_bytes())
        .collect()
}

/// Fills `piece`, the extent's bytes from `at`, with the value, then its table, then
/// zeros.
fn fill_piece(piece: &mut [u8], at: u64, value: &[u8], table: &[u8]) {
    let stop = at + piece.len() as u64;
    let table_at = value.len() as u64;
    for (bytes, base) in [(value, 0), (table, table_at)] {
        let (from, to) = (at.max(base), stop.min(base + bytes.len() as u64));
        if from < to {
            piece[(from - at) as usize..(to - at) as usize]
                .copy_from_slice(&bytes[(from - base) as usize..(to - base) as usize]);
        }
    }
    let used = table_at + table.len() as u64;
    if stop > used {
        piece[(used.max(at) - at) as usize..].fill(0);
    }
}

/// `value` with its last 4 bytes set so that its crc32c is `crc`: a value of another's
/// length and checksum (hence of its reference, written to its extent) but other
/// bytes, for the tests of the cache's invalidation. A crc32c is an affine function of
/// the message bits, and the last 32 bits reach all of it (their map is invertible):
/// the bits are solved for over GF(2).
#[cfg(test)]
pub(crate) fn with_crc(mut value: Vec<u8>, crc: u32) -> Vec<u8> {
    let at = value.len().checked_sub(4).expect("at least 4 bytes");
    let mut crc_with = |tail: u32| {
        value[at..].copy_from_slice(&tail.to_le_bytes());
        crc32c::crc32c(&value)
    };
    let base = crc_with(0);
    // A reduced basis of the tail bits' effects, by highest bit: (effect, tail bits).
    let mut basis = [(0u32, 0u32); 32];
    for i in 0..32 {
        let (mut effect, mut bits) = (crc_with(1 << i) ^ base, 1u32 << i);
        for bit in (0..32).rev() {
            if effect >> bit & 1 == 0 {
                continue;
            }
            if basis[bit].0 == 0 {
                basis[bit] = (effect, bits);
                break;
            }
            effect ^= basis[bit].0;
            bits ^= basis[bit].1;
        }
    }
    let (mut want, mut tail) = (crc ^ base, 0);
    for bit in (0..32).rev() {
        if want >> bit & 1 == 1 {
            assert!(basis[bit].0 != 0, "the tail reaches every bit of a crc32c");
            want ^= basis[bit].0;
            tail ^= basis[bit].1;
        }
    }
    assert_eq!(crc_with(tail), crc);
    value
}

#[cfg(test)]
impl State {
    /// Asserts the invariants of the module docs.
    fn check(&self) {
        let mut totals = Totals::default();
        let mut deferred = BTreeSet::new();
        let mut pieces: Vec<(u64, u64, bool)> = Vec::new();
        for (&at, e) in &self.extents {
            assert_eq!(at, e.r.offset);
            assert!(at.is_multiple_of(IO_ALIGN_BYTES));
            totals.count(&e.r, e.state, true);
            if let Extent::Deferred { free_gen } = e.state {
                deferred.insert((free_gen, at));
            }
            pieces.push((at, e.r.extent_bytes(), true));
        }
        assert_eq!(totals, self.totals, "totals");
        assert_eq!(deferred, self.deferred, "deferred index");
        let mut free_bytes = 0;
        for (&start, &len) in &self.free.by_start {
            assert!(len > 0 && start.is_multiple_of(IO_ALIGN_BYTES));
            assert!(len.is_multiple_of(IO_ALIGN_BYTES));
            assert!(self.free.by_len.contains(&(len, start)));
            free_bytes += len;
            pieces.push((start, len, false));
        }
        assert_eq!(self.free.by_len.len(), self.free.by_start.len());
        assert_eq!(free_bytes, self.free.bytes);
        pieces.sort_unstable();
        let mut at = 0;
        let mut previous_free = false;
        for (start, len, extent) in pieces {
            assert_eq!(start, at, "a gap or an overlap at {at}");
            assert!(extent || !previous_free, "two free ranges touch at {start}");
            previous_free = !extent;
            at = start + len;
        }
        assert_eq!(at, self.end, "the pieces end at the end");
        assert!(!previous_free, "a free range touches the end");
        // Holes lie inside free ranges, apart from one another.
        let mut hole_bytes = 0;
        let mut previous_stop = None;
        for (&start, &len) in &self.holes.by_start {
            assert!(len > 0 && start.is_multiple_of(IO_ALIGN_BYTES));
            assert!(len.is_multiple_of(IO_ALIGN_BYTES));
            assert!(
                previous_stop.is_none_or(|stop| stop < start),
                "holes touch at {start}"
            );
            previous_stop = Some(start + len);
            let (s, l) = self.free.holding(start).expect("a hole in a free range");
            assert!(
                start + len <= s + l,
                "a hole past its free range at {start}"
            );
            hole_bytes += len;
        }
        assert_eq!(hole_bytes, self.holes.bytes);
    }
}
