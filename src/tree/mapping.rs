//! The mapping table: `PageId` → one 64-bit word holding a 48-bit location and a 16-bit
//! reader-writer lock (Bf-Tree §3.3).
//!
//! The last level of inner nodes stores `PageId`s, never addresses, so a mini-page can
//! move in the circular buffer (growth, copy-on-access) or be evicted back to its leaf page
//! without touching any inner node: only this word changes. Because the lock shares the
//! word with the location, locking a `PageId` locks its mini-page and its leaf page together,
//! and there is no lock stored anywhere else.
//!
//! Word layout:
//!
//! ```text
//!  63     62      61      60..48    47          46..0
//! ┌──────┬───────┬───────┬─────────┬───────────┬──────────────────────────────┐
//! │writer│waiters│pending│ readers │ mini flag │ pool offset, or leaf page + 1│
//! └──────┴───────┴───────┴─────────┴───────────┴──────────────────────────────┘
//!  ◄──────────── 16-bit lock ─────────────────►◄──────── 48-bit location ─────────►
//! ```
//!
//! A location of 0 means the id is unused. A mini-page location is a physical offset in the
//! pool (below 2^47); a leaf location stores its page number plus one, so page 0 is
//! representable.
//!
//! Invariants this module owns:
//! - The location of an id changes only under that id's write lock.
//! - A reader holding the read lock sees a location that stays valid until it unlocks.
//! - Waiting threads spin briefly and then park on the word's address; every unlock that
//!   finds the waiters bit set clears it and wakes all parked threads, which re-check.

use std::ptr::NonNull;

use crate::sync::atomic::{AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering};
use crate::sync::{Mutex, spin_wait};

const LOCATION_BITS: u32 = 48;
const LOCATION_MASK: u64 = (1 << LOCATION_BITS) - 1;
const MINI_FLAG: u64 = 1 << 47;
const ONE_READER: u64 = 1 << LOCATION_BITS;
const READER_MASK: u64 = 0x1FFF << LOCATION_BITS;
/// A blocked writer is waiting: new readers hold back so readers cannot starve it.
const WRITER_PENDING: u64 = 1 << 61;
const WAITERS: u64 = 1 << 62;
const WRITER: u64 = 1 << 63;

/// Entries per lazily allocated chunk of the table.
const CHUNK_ENTRIES: usize = 1 << 16;
/// Chunks in the top-level array: 2^30 page ids in all (4 TiB of 4 KiB leaf pages).
const MAX_CHUNKS: usize = 1 << 14;
/// Page ids a table can hand out.
pub(crate) const MAX_PAGE_IDS: usize = CHUNK_ENTRIES * MAX_CHUNKS;
/// The largest leaf page number a location can hold (it stores the number plus one,
/// below the mini flag).
pub(crate) const MAX_LEAF_PAGE_NO: u64 = MINI_FLAG - 2;
const _: () = assert!(MAX_LEAF_PAGE_NO + 1 < MINI_FLAG);

/// The logical id of a leaf page and its mini-page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PageId(pub(crate) u64);

/// Where the data of a `PageId` currently lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// The id is not in use.
    Empty,
    /// A mini-page at this physical offset of the circular buffer; the mini-page itself
    /// records its leaf page.
    Mini(u64),
    /// Only the leaf page, at this page number of the page store.
    Leaf(u64),
}

impl Location {
    fn encode(self) -> u64 {
        match self {
            Location::Empty => 0,
            Location::Mini(offset) => {
                assert!(offset < MINI_FLAG, "pool offset {offset} exceeds 47 bits");
                MINI_FLAG | offset
            }
            Location::Leaf(page) => {
                assert!(page + 1 < MINI_FLAG, "leaf page {page} exceeds 47 bits");
                page + 1
            }
        }
    }

    fn decode(word: u64) -> Location {
        let bits = word & LOCATION_MASK;
        if bits == 0 {
            Location::Empty
        } else if bits & MINI_FLAG != 0 {
            Location::Mini(bits & !MINI_FLAG)
        } else {
            Location::Leaf(bits - 1)
        }
    }
}

type Chunk<T> = [T; CHUNK_ENTRIES];

/// Bytes per unit of a fill hint: a 4,080-byte leaf payload fits in 255 units.
pub(crate) const FILL_UNIT_BYTES: usize = 16;

/// A page's *dirty stamp* ([`WriteGuard::note_dirty`]): when the oldest write its
/// mini-page may still hold unmerged was made, as a checkpoint epoch
/// (`docs/design.md`, "Checkpoints that leave recent pages dirty"). Kept per page id
/// beside the mapping word, and read and written only under the page's write lock.
///
/// The stamp is never *newer* than the oldest unmerged write: a write lowers it to its
/// own stamp, and only a page with no mini-page (its location set to a leaf page) or a
/// checkpoint that finds it clean or merges it resets it. A dirty mini-page whose stamp
/// is [`DirtyStamp::NONE`] (no write noted it, which no write path leaves) is treated
/// as unknown, that is, as old.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DirtyStamp(u32);

impl DirtyStamp {
    /// No write noted since the last reset.
    pub(crate) const NONE: DirtyStamp = DirtyStamp(0);
    /// A write no log record covers: only merging the page makes it durable, so the
    /// next checkpoint must merge it, whatever its age.
    pub(crate) const UNLOGGED: DirtyStamp = DirtyStamp(1);

    /// A logged write made in checkpoint epoch `epoch`.
    pub(crate) fn logged(epoch: u64) -> DirtyStamp {
        DirtyStamp(u32::try_from(epoch.saturating_add(2)).unwrap_or(u32::MAX))
    }

    /// The epoch of a logged write's stamp; `None` for [`Self::NONE`] and
    /// [`Self::UNLOGGED`].
    pub(crate) fn epoch(self) -> Option<u64> {
        self.0.checked_sub(2).map(u64::from)
    }
}

/// The indirection array from `PageId` to location-and-lock words.
///
/// Chunks are allocated on first use and never move or shrink while the table lives, so a
/// `&AtomicU64` into a chunk stays valid for the table's lifetime.
pub(crate) struct MappingTable {
    chunks: Box<[AtomicPtr<Chunk<AtomicU64>>]>,
    /// Each id's leaf fill hint ([`MappingTable::fill_hint`]), chunked like `chunks`.
    fills: Box<[AtomicPtr<Chunk<AtomicU8>>]>,
    /// Each id's [`DirtyStamp`], chunked like `chunks`.
    dirty: Box<[AtomicPtr<Chunk<AtomicU32>>]>,
    /// Next never-used id, and ids given back for reuse.
    ids: Mutex<IdAllocator>,
}

#[derive(Debug, Default)]
struct IdAllocator {
    next: u64,
    free: Vec<u64>,
}

impl std::fmt::Debug for MappingTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappingTable")
            .field("ids", &*self.ids.lock())
            .finish_non_exhaustive()
    }
}

impl MappingTable {
    /// An empty table.
    pub(crate) fn new() -> Self {
        MappingTable {
            chunks: (0..MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            fills: (0..MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            dirty: (0..MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            ids: Mutex::new(IdAllocator::default()),
        }
    }

    /// Takes an unused id and sets its location. Returns `None` when all 2^30 ids are used.
    pub(crate) fn allocate(&self, location: Location) -> Option<PageId> {
        let id = {
            let mut ids = self.ids.lock();
            match ids.free.pop() {
                Some(id) => id,
                None if (ids.next as usize) < MAX_PAGE_IDS => {
                    ids.next += 1;
                    ids.next - 1
                }
                None => return None,
            }
        };
        let word = self.word(PageId(id));
        debug_assert_eq!(word.load(Ordering::Relaxed), 0, "a free id must be unused");
        word.store(location.encode(), Ordering::Release);
        Some(PageId(id))
    }

    /// Gives an id back. The caller holds its write lock, which this consumes.
    pub(crate) fn release(&self, guard: WriteGuard<'_>) {
        let id = guard.id;
        guard.set_location(Location::Empty);
        drop(guard);
        self.ids.lock().free.push(id.0);
    }

    /// Number of ids ever handed out (the high-water mark).
    pub(crate) fn high_water(&self) -> u64 {
        self.ids.lock().next
    }

    #[cfg(all(test, not(feature = "shuttle")))]
    /// The location of `id` without taking its lock: only a hint, which may be stale by the
    /// time it is used (eviction uses it to decide whether a try-lock is worth it).
    pub(crate) fn peek(&self, id: PageId) -> Location {
        Location::decode(self.word(id).load(Ordering::Acquire))
    }

    /// Takes `id`'s shared lock, waiting for a writer to finish.
    pub(crate) fn read(&self, id: PageId) -> ReadGuard<'_> {
        let word = self.word(id);
        lock_with(word, try_read_word, 0);
        ReadGuard { word, id }
    }

    /// Takes `id`'s shared lock if no writer holds or awaits it right now. Scans use it
    /// to look at the pages after the one they hold locked, without ever waiting.
    pub(crate) fn try_read(&self, id: PageId) -> Option<ReadGuard<'_>> {
        let word = self.word(id);
        try_lock_once(word, try_read_word).then(|| ReadGuard { word, id })
    }

    /// Takes `id`'s exclusive lock, waiting for readers and writers to finish.
    pub(crate) fn write(&self, id: PageId) -> WriteGuard<'_> {
        let word = self.word(id);
        lock_with(word, try_write_word, WRITER_PENDING);
        WriteGuard {
            word,
            id,
            table: self,
        }
    }

    /// Takes `id`'s exclusive lock if it is free right now. Eviction uses only this: it
    /// must never wait for a page lock while its caller may hold another. `None` also
    /// for an id whose chunk was never allocated (or beyond the table), which no
    /// allocation handed out: eviction can meet such an id in a block of a dropped tree
    /// whose member slot a new tree took (`members.rs`), and must not grow the new
    /// tree's table for it.
    pub(crate) fn try_write(&self, id: PageId) -> Option<WriteGuard<'_>> {
        let word = self.existing_word(id)?;
        try_lock_once(word, try_write_word).then(|| WriteGuard {
            word,
            id,
            table: self,
        })
    }

    /// How full `id`'s leaf page was when last written, in bytes (rounded up to
    /// [`FILL_UNIT_BYTES`]); 0 for a page never written. A hint, not a fact: it is set
    /// after the write it describes and read without the page's lock, so it may be
    /// stale, and a caller that acts on it checks the page itself.
    pub(crate) fn fill_hint(&self, id: PageId) -> usize {
        usize::from(entry(&self.fills, id, || AtomicU8::new(0)).load(Ordering::Relaxed))
            * FILL_UNIT_BYTES
    }

    /// Records that `id`'s leaf page now uses `used_bytes` ([`Self::fill_hint`]).
    pub(crate) fn set_fill_hint(&self, id: PageId, used_bytes: usize) {
        let units = used_bytes
            .div_ceil(FILL_UNIT_BYTES)
            .min(usize::from(u8::MAX));
        let units = u8::try_from(units).expect("clamped to a u8");
        entry(&self.fills, id, || AtomicU8::new(0)).store(units, Ordering::Relaxed);
    }

    fn word(&self, id: PageId) -> &AtomicU64 {
        entry(&self.chunks, id, || AtomicU64::new(0))
    }

    fn dirty_stamp(&self, id: PageId) -> &AtomicU32 {
        entry(&self.dirty, id, || AtomicU32::new(0))
    }

    /// `id`'s word if its chunk exists; never allocates.
    fn existing_word(&self, id: PageId) -> Option<&AtomicU64> {
        let index = usize::try_from(id.0).ok()?;
        let ptr = self
            .chunks
            .get(index / CHUNK_ENTRIES)?
            .load(Ordering::Acquire);
        // SAFETY: a non-null slot holds a chunk leaked from a Box by `new_chunk`, freed
        // only in `Drop for MappingTable` (`&mut self`), as in `entry`.
        (!ptr.is_null()).then(|| unsafe { &(*ptr)[index % CHUNK_ENTRIES] })
    }
}

/// `id`'s entry in a chunked array of `slots`, allocating its chunk (every entry `zero()`)
/// on first use.
fn entry<T>(slots: &[AtomicPtr<Chunk<T>>], id: PageId, zero: fn() -> T) -> &T {
    let index = id.0 as usize;
    let chunk_index = index / CHUNK_ENTRIES;
    assert!(chunk_index < MAX_CHUNKS, "page id {} out of range", id.0);
    let slot = &slots[chunk_index];
    let mut ptr = slot.load(Ordering::Acquire);
    if ptr.is_null() {
        let fresh = new_chunk(zero);
        match slot.compare_exchange(
            std::ptr::null_mut(),
            fresh.as_ptr(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => ptr = fresh.as_ptr(),
            Err(existing) => {
                // SAFETY: `fresh` came from `new_chunk` (a leaked Box) and lost the race,
                // so no one else has seen it; turning it back into a Box frees it once.
                drop(unsafe { Box::from_raw(fresh.as_ptr()) });
                ptr = existing;
            }
        }
    }
    // SAFETY: a non-null slot holds a chunk leaked from a Box by `new_chunk`; chunks are
    // freed only in `Drop for MappingTable`, which takes `&mut self`, so the reference
    // cannot outlive the chunk.
    unsafe { &(*ptr)[index % CHUNK_ENTRIES] }
}

fn new_chunk<T>(zero: fn() -> T) -> NonNull<Chunk<T>> {
    // Built on the heap directly: a 512 KiB array would not fit comfortably on the stack.
    let boxed: Box<[T]> = (0..CHUNK_ENTRIES).map(|_| zero()).collect();
    let boxed: Box<Chunk<T>> = boxed
        .try_into()
        .unwrap_or_else(|_| unreachable!("the slice has CHUNK_ENTRIES elements"));
    NonNull::from(Box::leak(boxed))
}

impl Drop for MappingTable {
    fn drop(&mut self) {
        free_chunks(&self.chunks);
        free_chunks(&self.fills);
        free_chunks(&self.dirty);
    }
}

/// Frees the chunks of `slots`. The caller is the table's `Drop`: with `&mut` access no
/// guard or reference into a chunk remains.
fn free_chunks<T>(slots: &[AtomicPtr<Chunk<T>>]) {
    for slot in slots {
        let ptr = slot.load(Ordering::Acquire);
        if !ptr.is_null() {
            // SAFETY: non-null slots hold chunks leaked by `new_chunk`, each stored in
            // exactly one slot, and the caller guarantees no reference into them remains.
            drop(unsafe { Box::from_raw(ptr) });
        }
    }
}

/// One attempt to take a lock: the new word, or `None` if it is held incompatibly.
fn try_read_word(word: u64) -> Option<u64> {
    let readers_full = word & READER_MASK == READER_MASK;
    (word & (WRITER | WRITER_PENDING) == 0 && !readers_full).then_some(word + ONE_READER)
}

fn try_write_word(word: u64) -> Option<u64> {
    (word & (WRITER | READER_MASK) == 0).then_some((word | WRITER) & !WRITER_PENDING)
}

fn try_lock_once(word: &AtomicU64, attempt: fn(u64) -> Option<u64>) -> bool {
    let current = word.load(Ordering::Relaxed);
    match attempt(current) {
        Some(new) => word
            .compare_exchange(current, new, Ordering::Acquire, Ordering::Relaxed)
            .is_ok(),
        None => false,
    }
}

/// Spins, then parks on the word's address until `attempt` succeeds. A waiting writer
/// (`announce` = `WRITER_PENDING`) first sets its bit, which holds back new readers, so a
/// stream of readers cannot starve it; it clears the bit when it gets the lock.
fn lock_with(word: &AtomicU64, attempt: fn(u64) -> Option<u64>, announce: u64) {
    let mut spins = 0u32;
    loop {
        let current = word.load(Ordering::Relaxed);
        if let Some(new) = attempt(current) {
            if word
                .compare_exchange_weak(current, new, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
            continue;
        }
        if current & announce != announce {
            let _ = word.compare_exchange_weak(
                current,
                current | announce,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            continue;
        }
        if spins < 64 || cfg!(feature = "shuttle") {
            spin_wait(spins);
            spins += 1;
            continue;
        }
        park(word, current, attempt);
    }
}

#[cfg(not(feature = "shuttle"))]
fn park(word: &AtomicU64, seen: u64, attempt: fn(u64) -> Option<u64>) {
    // Announce the waiter first, so the holder's unlock knows to wake us.
    if seen & WAITERS == 0
        && word
            .compare_exchange(seen, seen | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let key = word as *const AtomicU64 as usize;
    // SAFETY: `park` is sound for any key; the validate closure runs under the bucket
    // lock and only re-reads the word, so an unlock (which clears WAITERS *then* calls
    // `unpark_all` under the same bucket lock) cannot slip between the check and sleep.
    // We sleep only while the lock is still unavailable to us: a writer must not sleep
    // on its own pending bit, nor a reader on a free lock.
    unsafe {
        parking_lot_core::park(
            key,
            || {
                let w = word.load(Ordering::Relaxed);
                w & WAITERS != 0 && attempt(w).is_none()
            },
            || {},
            |_, _| {},
            parking_lot_core::DEFAULT_PARK_TOKEN,
            None,
        );
    }
}

#[cfg(feature = "shuttle")]
fn park(_word: &AtomicU64, _seen: u64, _attempt: fn(u64) -> Option<u64>) {
    spin_wait(0);
}

fn wake(word: &AtomicU64) {
    #[cfg(not(feature = "shuttle"))]
    {
        let key = word as *const AtomicU64 as usize;
        // SAFETY: `unpark_all` is sound for any key; parked threads re-check the word.
        unsafe {
            parking_lot_core::unpark_all(key, parking_lot_core::DEFAULT_UNPARK_TOKEN);
        }
    }
    #[cfg(feature = "shuttle")]
    let _ = word;
}

/// Releases one hold (`release` maps the old word to the new one before WAITERS is
/// considered) and wakes parked threads if the lock became free with waiters announced.
fn unlock(word: &AtomicU64, release: impl Fn(u64) -> u64) {
    let mut current = word.load(Ordering::Relaxed);
    loop {
        let mut new = release(current);
        let free = new & (WRITER | READER_MASK) == 0;
        let wake_up = free && new & WAITERS != 0;
        if wake_up {
            new &= !WAITERS;
        }
        match word.compare_exchange_weak(current, new, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => {
                if wake_up {
                    wake(word);
                }
                return;
            }
            Err(seen) => current = seen,
        }
    }
}

/// A shared lock on one `PageId`: its location cannot change while this lives.
#[derive(Debug)]
pub(crate) struct ReadGuard<'a> {
    word: &'a AtomicU64,
    id: PageId,
}

impl ReadGuard<'_> {
    /// The id this guard locks.
    pub(crate) fn id(&self) -> PageId {
        self.id
    }

    /// Where the page lives while this guard is held.
    pub(crate) fn location(&self) -> Location {
        Location::decode(self.word.load(Ordering::Acquire))
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        unlock(self.word, |w| w - ONE_READER);
    }
}

/// The exclusive lock on one `PageId`: the only way to change its location.
#[derive(Debug)]
pub(crate) struct WriteGuard<'a> {
    word: &'a AtomicU64,
    id: PageId,
    table: &'a MappingTable,
}

impl WriteGuard<'_> {
    /// The id this guard locks.
    pub(crate) fn id(&self) -> PageId {
        self.id
    }

    /// Where the page lives now.
    pub(crate) fn location(&self) -> Location {
        Location::decode(self.word.load(Ordering::Acquire))
    }

    /// Points the id at a new location. Waiters may set their bit concurrently, so only
    /// the location bits are replaced. A page pointed at its leaf page (or at nothing)
    /// has no mini-page, so no unmerged write: its dirty stamp is reset.
    pub(crate) fn set_location(&self, location: Location) {
        if matches!(location, Location::Leaf(_) | Location::Empty) {
            self.clear_dirty();
        }
        let bits = location.encode();
        let _ = self
            .word
            .fetch_update(Ordering::Release, Ordering::Relaxed, |w| {
                Some((w & !LOCATION_MASK) | bits)
            });
    }
}

impl WriteGuard<'_> {
    /// Notes a write placed in the page's mini-page with `stamp`: the page's stamp
    /// becomes the older of the two.
    pub(crate) fn note_dirty(&self, stamp: DirtyStamp) {
        let cell = self.table.dirty_stamp(self.id);
        let old = cell.load(Ordering::Relaxed);
        if old == DirtyStamp::NONE.0 || stamp.0 < old {
            cell.store(stamp.0, Ordering::Relaxed);
        }
    }

    /// The page's dirty stamp.
    pub(crate) fn dirty_stamp(&self) -> DirtyStamp {
        DirtyStamp(self.table.dirty_stamp(self.id).load(Ordering::Relaxed))
    }

    /// Resets the page's dirty stamp: its mini-page holds no unmerged write.
    pub(crate) fn clear_dirty(&self) {
        self.table
            .dirty_stamp(self.id)
            .store(DirtyStamp::NONE.0, Ordering::Relaxed);
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        unlock(self.word, |w| w & !WRITER);
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn locations_round_trip() {
        for loc in [
            Location::Empty,
            Location::Mini(0),
            Location::Mini(MINI_FLAG - 8),
            Location::Leaf(0),
            Location::Leaf(12345),
        ] {
            assert_eq!(Location::decode(loc.encode()), loc);
            assert_eq!(loc.encode() & !LOCATION_MASK, 0);
        }
    }

    #[test]
    fn allocate_set_and_release() {
        let table = MappingTable::new();
        let a = table.allocate(Location::Leaf(7)).unwrap();
        let b = table.allocate(Location::Mini(64)).unwrap();
        assert_ne!(a, b);
        assert_eq!(table.read(a).location(), Location::Leaf(7));
        {
            let g = table.write(b);
            g.set_location(Location::Leaf(9));
        }
        assert_eq!(table.peek(b), Location::Leaf(9));
        table.release(table.write(a));
        assert_eq!(table.peek(a), Location::Empty);
        // The released id is handed out again.
        assert_eq!(table.allocate(Location::Leaf(1)), Some(a));
        assert_eq!(table.high_water(), 2);
    }

    #[test]
    fn readers_share_writers_exclude() {
        let table = MappingTable::new();
        let id = table.allocate(Location::Leaf(1)).unwrap();
        let r1 = table.read(id);
        let r2 = table.try_read(id).expect("readers share");
        assert!(table.try_write(id).is_none());
        drop(r1);
        assert!(table.try_write(id).is_none());
        drop(r2);
        let w = table.try_write(id).expect("free after readers leave");
        assert!(table.try_read(id).is_none());
        assert!(table.try_write(id).is_none());
        drop(w);
        assert!(table.try_read(id).is_some());
    }

    /// Eviction may try-lock the page id named by a block of a dropped tree whose
    /// member slot a new tree took (`members.rs`); that id may lie beyond anything the
    /// new tree's table ever handed out, and must neither grow the table by a chunk nor
    /// panic.
    #[test]
    fn try_write_of_an_id_never_handed_out_allocates_nothing() {
        let table = MappingTable::new();
        table.allocate(Location::Leaf(1)).unwrap();
        let far = PageId(CHUNK_ENTRIES as u64 * 5 + 3);
        assert!(table.try_write(far).is_none());
        assert!(table.chunks[5].load(Ordering::Acquire).is_null());
        assert!(table.try_write(PageId(MAX_PAGE_IDS as u64)).is_none());
        assert!(table.try_write(PageId(u64::MAX)).is_none());
        assert!(table.try_write(PageId(0)).is_some());
    }

    #[test]
    fn ids_across_chunks() {
        let table = MappingTable::new();
        let mut last = None;
        for i in 0..(CHUNK_ENTRIES as u64 + 10) {
            last = table.allocate(Location::Leaf(i));
        }
        let last = last.unwrap();
        assert_eq!(last.0, CHUNK_ENTRIES as u64 + 9);
        assert_eq!(table.read(last).location(), Location::Leaf(last.0));
        assert_eq!(table.peek(PageId(3)), Location::Leaf(3));
    }

    /// A blocked writer holds back new readers, so a stream of readers cannot starve it.
    #[test]
    fn waiting_writer_holds_back_new_readers() {
        let table = Arc::new(MappingTable::new());
        let id = table.allocate(Location::Leaf(1)).unwrap();
        let reader = table.read(id);
        let writer = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                let g = table.write(id);
                g.set_location(Location::Leaf(2));
            })
        };
        while table.word(id).load(Ordering::SeqCst) & WRITER_PENDING == 0 {
            std::thread::yield_now();
        }
        assert!(
            table.try_read(id).is_none(),
            "a new reader must wait for the writer"
        );
        drop(reader);
        writer.join().unwrap();
        assert_eq!(table.read(id).location(), Location::Leaf(2));
        assert_eq!(table.word(id).load(Ordering::SeqCst) & !LOCATION_MASK, 0);
    }

    /// Writers increment a counter kept in the location bits while readers check that
    /// the location never changes under a read lock; parked waiters must all wake up.
    #[test]
    fn concurrent_lock_stress() {
        let table = Arc::new(MappingTable::new());
        let id = table.allocate(Location::Leaf(0)).unwrap();
        let in_write = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..12)
            .map(|t| {
                let table = Arc::clone(&table);
                let in_write = Arc::clone(&in_write);
                std::thread::spawn(move || {
                    for _ in 0..3000 {
                        if t % 3 == 0 {
                            let g = table.write(id);
                            assert_eq!(in_write.fetch_add(1, Ordering::SeqCst), 0);
                            let Location::Leaf(n) = g.location() else {
                                panic!("location changed kind")
                            };
                            g.set_location(Location::Leaf(n + 1));
                            in_write.fetch_sub(1, Ordering::SeqCst);
                        } else {
                            let g = table.read(id);
                            assert_eq!(in_write.load(Ordering::SeqCst), 0);
                            let before = g.location();
                            std::hint::spin_loop();
                            assert_eq!(g.location(), before);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(table.peek(id), Location::Leaf(4 * 3000));
        // Every lock bit is clear at the end: no hold or waiter flag leaked.
        assert_eq!(table.word(id).load(Ordering::SeqCst) & !LOCATION_MASK, 0);
    }
}
