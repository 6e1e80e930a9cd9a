//! The hot index (FASTER, SIGMOD 2018, section 3 and appendix B): a latch-free hash table
//! from (bucket, tag) to the address of the newest record of that hash chain, which
//! doubles without stopping operations.
//!
//! The index knows nothing of records. An operation hands it a [`KeyHash`] and gets an
//! [`EntrySlot`], the one live entry for that key's (bucket, tag), whose address it may
//! change with a compare-and-swap. To split chains when the table doubles, the index asks
//! a [`RecordHashes`] for the key hash and previous address of the records it walks.
//!
//! # Invariants this module owns
//!
//! - **One live entry per (bucket, tag).** At any moment a bucket chain holds at most one
//!   non-tentative entry of a tag. The two-phase insert in [`HashIndex::find_or_create`]
//!   keeps it (the argument is at that function and in `docs/design.md`).
//! - **No entry is lost by a grow.** Operations pin the chunk of the old table they work
//!   in; a chunk is migrated only while no operation is pinned in it, and operations
//!   reach a migrated chunk only through the new table.
//! - **Tables outlive their readers.** A table (and a grow's state) is freed only by an
//!   epoch trigger action registered after it was unlinked, so a thread that reached it
//!   under an [`EpochGuard`] can use it until it refreshes.
//! - A thread holds at most one [`EntrySlot`] at a time. (A slot may hold a chunk pin;
//!   two threads each holding one pin and waiting for the other's chunk would deadlock.)
//!   Nor does it wait for other threads (for an epoch to become safe, say) while holding
//!   one: a grow waits for pins to be released. Debug builds assert the first rule.

use std::marker::PhantomData;
use std::ptr;

use super::bucket::{Bucket, Entry, INVALID_ADDRESS, KeyHash, Table};
use super::epoch::{Epoch, EpochGuard};
use crate::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex, spin_wait};

/// Keys per home bucket that [`IndexOptions::for_keys`] sizes for: about 57% of the
/// seven entries, so few buckets overflow when keys spread evenly.
pub(crate) const KEYS_PER_BUCKET: u64 = 4;

/// Home buckets per chunk: the unit a grow migrates and an operation pins.
pub(crate) const GROW_CHUNK_BUCKETS: usize = 1024;

/// How a [`HashIndex`] is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexOptions {
    /// Home buckets at creation (a power of two).
    pub(crate) buckets: usize,
    /// Home buckets per grow chunk (at least 1).
    pub(crate) grow_chunk_buckets: usize,
}

impl IndexOptions {
    /// Enough buckets for `expected_keys` at [`KEYS_PER_BUCKET`], rounded up to a power
    /// of two.
    pub(crate) fn for_keys(expected_keys: u64) -> Self {
        let buckets = expected_keys.div_ceil(KEYS_PER_BUCKET).max(1);
        let buckets = usize::try_from(buckets.next_power_of_two()).unwrap_or(1 << 48);
        IndexOptions {
            buckets,
            grow_chunk_buckets: GROW_CHUNK_BUCKETS,
        }
    }
}

/// What the record allocator knows about the record at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainLink {
    /// The record is readable in memory: its key's hash and the address of the previous
    /// record of its chain ([`INVALID_ADDRESS`] at the end).
    Record { key_hash: KeyHash, previous: u64 },
    /// The record cannot be read cheaply (it is on disk). A grow then lets both halves
    /// of a split chain point at it, as FASTER does for records below the head address.
    NotInMemory,
    /// The record is gone (below the log's begin address): the chain ends before it, and
    /// a half whose walk reaches it gets no entry, as FASTER drops entries below begin.
    Truncated,
}

/// The record allocator's side of a grow: FASTER reads the record at an address to
/// rehash its key; bfdb's index asks through this trait.
pub(crate) trait RecordHashes: Send + Sync {
    /// The record at `address` (never [`INVALID_ADDRESS`]).
    fn link(&self, address: u64) -> ChainLink;
}

// Chunk pin values: `>= 0` is the number of operations pinned in the chunk (only while
// the grow prepares); the negative values are the chunk's migration state.
const MIGRATING: i64 = -1;
const MIGRATED: i64 = -2;

// Grow phases.
/// Threads may still use the old table unpinned; new operations pin their chunk.
const PREPARE: u32 = 0;
/// Every thread pins; chunks are migrated as soon as they are unpinned.
const RESIZING: u32 = 1;
/// The new table is the active one.
const DONE: u32 = 2;

/// One doubling in progress.
struct GrowState {
    /// The table being split; owned by `HashIndex::active` until the grow is done, then
    /// by the trigger action that frees it.
    old: *const Table,
    /// Twice the size; owned here until the grow is done (`published`), then by
    /// `HashIndex::active`.
    new: *mut Table,
    published: std::sync::atomic::AtomicBool,
    phase: AtomicU32,
    chunk_buckets: usize,
    pins: Box<[AtomicI64]>,
    /// The next chunk a helper takes.
    cursor: AtomicUsize,
    /// Chunks migrated; the thread that counts the last one finishes the grow.
    migrated: AtomicUsize,
    /// A doubling's record hashes, which split the chains; `None` for a rebuild at the
    /// same size, which copies them.
    records: Option<Arc<dyn RecordHashes>>,
}

// SAFETY: the raw pointers name `Table`s, which are `Send + Sync` (atomics and immutable
// boxes); a `GrowState` dereferences them only under the epoch protection that keeps
// them alive (see `HashIndex::grow_tables`), and frees only `new`, only in `Drop`, only
// if ownership never passed to the index.
unsafe impl Send for GrowState {}
// SAFETY: as above; every field shared between threads is atomic or immutable.
unsafe impl Sync for GrowState {}

impl GrowState {
    fn chunks(&self) -> usize {
        self.pins.len()
    }

    /// Pins `chunk` if its migration has not begun.
    fn try_pin(&self, chunk: usize) -> Option<Pin<'_>> {
        let pin = &self.pins[chunk];
        let mut pins = pin.load(Ordering::SeqCst);
        while pins >= 0 {
            match pin.compare_exchange_weak(pins, pins + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(Pin(pin)),
                Err(now) => pins = now,
            }
        }
        None
    }
}

impl Drop for GrowState {
    fn drop(&mut self) {
        if !self.published.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: `new` came from `Box::into_raw` in `HashIndex::grow` and was never
            // handed to the index (not published); this is the last reference.
            drop(unsafe { Box::from_raw(self.new) });
        }
    }
}

/// The old table and the grow state, freed together once every thread that could have
/// reached them has refreshed.
struct Retired {
    table: *mut Table,
    grow: *const GrowState,
}

// SAFETY: `Retired` only frees what it owns (a boxed `Table`, one strong count of an
// `Arc<GrowState>`), both `Send`, on whichever thread runs the trigger action.
unsafe impl Send for Retired {}

impl Drop for Retired {
    fn drop(&mut self) {
        // SAFETY: `table` was the active table, unlinked by `finish_grow`; the epoch runs
        // this action only after every thread protected at the unlinking has refreshed,
        // and no thread protected later can reach it. It came from `Box::into_raw`.
        drop(unsafe { Box::from_raw(self.table) });
        // SAFETY: `grow` is the strong count `HashIndex::grow` held, from `Arc::into_raw`.
        drop(unsafe { Arc::from_raw(self.grow) });
    }
}

/// A chunk pin, released on drop.
#[derive(Debug)]
struct Pin<'g>(&'g AtomicI64);

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The one live entry for a key's (bucket, tag), borrowed for the length of one
/// operation: read its address, then compare-and-swap a new one in.
///
/// Not `Send`: it belongs to the operation of the thread that found it.
#[derive(Debug)]
pub(crate) struct EntrySlot<'g> {
    slot: &'g AtomicU64,
    /// The entry as this operation last saw it.
    entry: Entry,
    tag: u16,
    _pin: Option<Pin<'g>>,
    _not_send: PhantomData<*const ()>,
}

// Debug builds check the one-slot-per-thread rule (the module docs say why). Not under
// shuttle, whose threads share OS threads and so thread-locals.
#[cfg(all(debug_assertions, not(feature = "shuttle")))]
thread_local! {
    static SLOT_HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl<'g> EntrySlot<'g> {
    fn new(slot: &'g AtomicU64, entry: Entry, tag: u16, pin: Option<Pin<'g>>) -> Self {
        #[cfg(all(debug_assertions, not(feature = "shuttle")))]
        SLOT_HELD.with(|held| {
            assert!(
                !held.replace(true),
                "a thread holds at most one EntrySlot at a time"
            );
        });
        EntrySlot {
            slot,
            entry,
            tag,
            _pin: pin,
            _not_send: PhantomData,
        }
    }
}

impl Drop for EntrySlot<'_> {
    fn drop(&mut self) {
        #[cfg(all(debug_assertions, not(feature = "shuttle")))]
        SLOT_HELD.with(|held| held.set(false));
    }
}

impl EntrySlot<'_> {
    /// The entry as last seen.
    pub(crate) fn entry(&self) -> Entry {
        self.entry
    }

    /// The address as last seen: the newest record of the chain, or [`INVALID_ADDRESS`].
    pub(crate) fn address(&self) -> u64 {
        self.entry.address()
    }

    /// Swaps `address` in if the entry is still what this slot last saw. On failure the
    /// slot holds the entry now there and returns it: the caller re-links its record
    /// behind the new address and retries, or, if the entry is no longer a live entry of
    /// this tag (it was removed), starts the operation again.
    pub(crate) fn try_update(&mut self, address: u64) -> Result<(), Entry> {
        if !self.entry.is_final_for(self.tag) {
            return Err(self.entry);
        }
        let desired = Entry::new(address, self.tag, false);
        match self.slot.compare_exchange(
            self.entry.0,
            desired.0,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => {
                self.entry = desired;
                Ok(())
            }
            Err(now) => {
                self.entry = Entry(now);
                Err(self.entry)
            }
        }
    }

    /// Where the entry lives (tests compare slots).
    #[cfg(test)]
    pub(crate) fn slot_address(&self) -> usize {
        std::ptr::from_ref(self.slot) as usize
    }

    /// Removes the entry if it is still what this slot last saw (FASTER's delete of an
    /// index entry, for a chain whose records are all gone).
    pub(crate) fn try_remove(self) -> Result<(), Entry> {
        if !self.entry.is_final_for(self.tag) {
            return Err(self.entry);
        }
        self.slot
            .compare_exchange(self.entry.0, 0, Ordering::SeqCst, Ordering::SeqCst)
            .map(|_| ())
            .map_err(Entry)
    }
}

/// The hot index. See the module docs.
pub(crate) struct HashIndex {
    epoch: Arc<Epoch>,
    /// The table operations use when no grow is under way; from `Box::into_raw`.
    active: AtomicPtr<Table>,
    /// The grow under way, or null; from `Arc::into_raw` (one strong count).
    grow: AtomicPtr<GrowState>,
    /// Held by the thread driving a grow, so grows never overlap.
    grow_lock: Mutex<()>,
    chunk_buckets: usize,
}

// SAFETY: the raw pointers are owned boxes / arcs of `Send + Sync` types, shared only
// under the epoch protocol described at each dereference.
unsafe impl Send for HashIndex {}
// SAFETY: as above.
unsafe impl Sync for HashIndex {}

impl std::fmt::Debug for HashIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashIndex")
            .field("growing", &!self.grow.load(Ordering::Relaxed).is_null())
            .finish_non_exhaustive()
    }
}

impl HashIndex {
    /// An empty index protected by `epoch`.
    pub(crate) fn new(epoch: Arc<Epoch>, options: IndexOptions) -> Self {
        assert!(options.grow_chunk_buckets >= 1);
        let table = Box::into_raw(Box::new(Table::new(options.buckets)));
        HashIndex {
            epoch,
            active: AtomicPtr::new(table),
            grow: AtomicPtr::new(ptr::null_mut()),
            grow_lock: Mutex::new(()),
            chunk_buckets: options.grow_chunk_buckets,
        }
    }

    /// The epoch framework whose guards this index takes.
    pub(crate) fn epoch(&self) -> &Arc<Epoch> {
        &self.epoch
    }

    fn check_guard(&self, guard: &EpochGuard<'_, '_>) {
        // Soundness, not only tidiness: tables are kept alive by *this* epoch.
        assert!(
            ptr::eq(guard.epoch(), &*self.epoch),
            "a guard of another epoch framework"
        );
    }

    /// The active table.
    fn active<'g>(&'g self, guard: &'g EpochGuard<'_, '_>) -> &'g Table {
        self.check_guard(guard);
        // SAFETY: the active table is freed only by a `Retired` action registered after
        // it stopped being active; this thread is protected (`guard`) and cannot refresh
        // while `'g` lasts, so if it loaded the pointer before the swap the action waits
        // for it, and a load after the swap returns the new table.
        unsafe { &*self.active.load(Ordering::SeqCst) }
    }

    /// The grow under way, if any.
    fn current_grow<'g>(&'g self, guard: &'g EpochGuard<'_, '_>) -> Option<&'g GrowState> {
        self.check_guard(guard);
        let grow = self.grow.load(Ordering::SeqCst);
        // SAFETY: a grow state is freed when its last strong count goes; the index's
        // count goes only with a `Retired` action registered after `grow` was set to
        // null, so (as for `active`) it outlives this protected thread's use of it.
        (!grow.is_null()).then(|| unsafe { &*grow })
    }

    /// The old and new tables of `grow`.
    fn grow_tables<'g>(
        &'g self,
        guard: &'g EpochGuard<'_, '_>,
        grow: &'g GrowState,
    ) -> (&'g Table, &'g Table) {
        self.check_guard(guard);
        // SAFETY: `old` is freed with the grow's `Retired` action, `new` only by a later
        // grow's (after it became active): both wait for this protected thread, which
        // reached `grow` while it was still set or holds a strong count taken then.
        unsafe { (&*grow.old, &*grow.new) }
    }

    /// The table an operation on `hash` uses, with the pin that keeps its chunk from
    /// being migrated while the operation runs (only while a grow prepares).
    fn locate<'g>(
        &'g self,
        guard: &'g EpochGuard<'_, '_>,
        hash: KeyHash,
    ) -> (&'g Table, Option<Pin<'g>>) {
        let Some(grow) = self.current_grow(guard) else {
            return (self.active(guard), None);
        };
        let (old, new) = self.grow_tables(guard, grow);
        let chunk = hash.bucket(old.len()) / grow.chunk_buckets;
        // If the pin fails, the chunk's migration has begun, so the grow is resizing.
        if grow.phase.load(Ordering::SeqCst) == PREPARE
            && let Some(pin) = grow.try_pin(chunk)
        {
            return (old, Some(pin));
        }
        self.ensure_migrated(guard, grow, chunk);
        (new, None)
    }

    /// The live entry for `hash`, if the index has one.
    pub(crate) fn find<'g>(
        &'g self,
        guard: &'g EpochGuard<'_, '_>,
        hash: KeyHash,
    ) -> Option<EntrySlot<'g>> {
        let (table, pin) = self.locate(guard, hash);
        let tag = hash.tag();
        let mut bucket = Some(table.bucket(hash.bucket(table.len())));
        while let Some(b) = bucket {
            for slot in &b.entries {
                let entry = Entry(slot.load(Ordering::SeqCst));
                if entry.is_final_for(tag) {
                    return Some(EntrySlot::new(slot, entry, tag, pin));
                }
            }
            bucket = table.next(b);
        }
        None
    }

    /// The live entry for `hash`, created (with [`INVALID_ADDRESS`]) if there is none.
    ///
    /// The two-phase insert: find a free slot and claim it with a *tentative* entry
    /// (invisible to finders), then rescan the whole chain for another entry of the same
    /// tag. If there is one, back off (clear ours) and start again; if not, clear the
    /// tentative bit. Why no two threads can both finish: each writes its tentative entry
    /// and then reads every slot of the chain, all `SeqCst`. Of two such threads, the one
    /// whose write comes second in that order reads after the other's write, so it sees
    /// the other's entry (tentative or final) and backs off. An entry that was final
    /// stays in place (until removed), so a later insert finds it in its first pass.
    pub(crate) fn find_or_create<'g>(
        &'g self,
        guard: &'g EpochGuard<'_, '_>,
        hash: KeyHash,
    ) -> EntrySlot<'g> {
        let (table, pin) = self.locate(guard, hash);
        let tag = hash.tag();
        let home = table.bucket(hash.bucket(table.len()));
        let mut attempt = 0;
        loop {
            // Pass one: the live entry, or the first free slot.
            let mut free: Option<&AtomicU64> = None;
            let mut last = home;
            let mut bucket = Some(home);
            while let Some(b) = bucket {
                for slot in &b.entries {
                    let entry = Entry(slot.load(Ordering::SeqCst));
                    if entry.is_empty() {
                        free = free.or(Some(slot));
                    } else if entry.is_final_for(tag) {
                        return EntrySlot::new(slot, entry, tag, pin);
                    }
                }
                last = b;
                bucket = table.next(b);
            }
            let slot = match free {
                Some(slot) => slot,
                None => match table.try_append(last) {
                    Some(fresh) => &fresh.entries[0],
                    // Another thread linked a bucket first; scan again.
                    None => continue,
                },
            };
            // Phase one: claim the slot tentatively.
            let tentative = Entry::new(INVALID_ADDRESS, tag, true);
            if slot
                .compare_exchange(0, tentative.0, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            // Phase two: another entry of this tag anywhere in the chain?
            if has_other_entry(table, home, tag, slot) {
                slot.store(0, Ordering::SeqCst);
                spin_wait(attempt);
                attempt += 1;
                continue;
            }
            let entry = Entry::new(INVALID_ADDRESS, tag, false);
            slot.store(entry.0, Ordering::SeqCst);
            return EntrySlot::new(slot, entry, tag, pin);
        }
    }

    /// Doubles the table while other threads keep operating, and returns once the new
    /// table is active (the old one is freed later, once every thread has refreshed).
    /// Returns `false` at once if another thread is already growing the index.
    ///
    /// The caller's guard is refreshed while it waits for the other threads to enter
    /// the grow; those threads must keep refreshing too, or the grow waits for them.
    pub(crate) fn grow(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        records: Arc<dyn RecordHashes>,
    ) -> bool {
        self.resize(guard, Some(records))
    }

    /// Rebuilds the table at its size, as [`HashIndex::grow`] doubles it (operations go
    /// on; `false` if a grow or rebuild already runs): each chain's live entries are
    /// copied into a new table, packed into as few buckets as they need, and the old
    /// table goes with every overflow bucket it allocated. Overflow buckets are never
    /// unlinked while a table is active (a bucket some chain briefly needed stays that
    /// chain's), so an index whose keys churn gathers them; this gives them back.
    pub(crate) fn rebuild(&self, guard: &mut EpochGuard<'_, '_>) -> bool {
        self.resize(guard, None)
    }

    /// A doubling (with the record hashes that split its chains) or, for `None`, a
    /// rebuild at the same size.
    fn resize(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        records: Option<Arc<dyn RecordHashes>>,
    ) -> bool {
        self.check_guard(guard);
        let Some(_growing) = self.grow_lock.try_lock() else {
            return false;
        };
        debug_assert!(self.grow.load(Ordering::SeqCst).is_null());
        let old = self.active.load(Ordering::SeqCst);
        // SAFETY: only a grow changes `active`, and this thread holds the grow lock.
        let old_len = unsafe { &*old }.len();
        let new_len = if records.is_some() {
            old_len * 2
        } else {
            old_len
        };
        let new = Box::into_raw(Box::new(Table::new(new_len)));
        let chunks = old_len.div_ceil(self.chunk_buckets);
        let state = Arc::new(GrowState {
            old,
            new,
            published: std::sync::atomic::AtomicBool::new(false),
            phase: AtomicU32::new(PREPARE),
            chunk_buckets: self.chunk_buckets,
            pins: (0..chunks).map(|_| AtomicI64::new(0)).collect(),
            cursor: AtomicUsize::new(0),
            migrated: AtomicUsize::new(0),
            records,
        });
        self.grow
            .store(Arc::into_raw(state.clone()).cast_mut(), Ordering::SeqCst);

        // Threads that read no grow may still be working in the old table unpinned; once
        // all of them have refreshed, every operation pins or migrates.
        let resizing = state.clone();
        guard.bump_with_action(move || resizing.phase.store(RESIZING, Ordering::SeqCst));
        let mut spins = 0;
        while state.phase.load(Ordering::SeqCst) == PREPARE {
            spin_wait(spins);
            spins += 1;
            guard.refresh();
        }

        // Take unclaimed chunks, then wait for (or migrate) any left behind pins.
        while self.help_migrate(guard, &state) {}
        for chunk in 0..state.chunks() {
            self.ensure_migrated(guard, &state, chunk);
        }
        // The thread that migrated the last chunk may still be switching tables.
        let mut spins = 0;
        while state.phase.load(Ordering::SeqCst) != DONE {
            spin_wait(spins);
            spins += 1;
        }
        true
    }

    /// Returns once `chunk` of `grow` is migrated, migrating it here if no operation is
    /// pinned in it and no other thread migrates it; while waiting, migrates other
    /// chunks.
    fn ensure_migrated(&self, guard: &EpochGuard<'_, '_>, grow: &GrowState, chunk: usize) {
        let pin = &grow.pins[chunk];
        let mut spins = 0;
        loop {
            match pin.load(Ordering::SeqCst) {
                MIGRATED => return,
                0 if pin
                    .compare_exchange(0, MIGRATING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok() =>
                {
                    self.migrate(guard, grow, chunk);
                    return;
                }
                _ => {
                    if !self.help_migrate(guard, grow) {
                        spin_wait(spins);
                        spins += 1;
                    }
                }
            }
        }
    }

    /// Takes the next chunk from the grow's cursor and migrates it if it is unpinned.
    /// Returns `false` when the cursor has passed the last chunk.
    fn help_migrate(&self, guard: &EpochGuard<'_, '_>, grow: &GrowState) -> bool {
        let chunk = grow.cursor.fetch_add(1, Ordering::SeqCst);
        if chunk >= grow.chunks() {
            return false;
        }
        if grow.pins[chunk]
            .compare_exchange(0, MIGRATING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.migrate(guard, grow, chunk);
        }
        true
    }

    /// Splits every bucket chain of `chunk` (claimed: its pin is `MIGRATING`) into the
    /// new table, then marks it migrated; the last chunk finishes the grow.
    fn migrate(&self, guard: &EpochGuard<'_, '_>, grow: &GrowState, chunk: usize) {
        debug_assert_eq!(grow.phase.load(Ordering::SeqCst), RESIZING);
        let (old, new) = self.grow_tables(guard, grow);
        let first = chunk * grow.chunk_buckets;
        let end = (first + grow.chunk_buckets).min(old.len());
        for index in first..end {
            match &grow.records {
                Some(records) => split_chain(old, new, index, &**records),
                None => copy_chain(old, new, index),
            }
        }
        grow.pins[chunk].store(MIGRATED, Ordering::SeqCst);
        if grow.migrated.fetch_add(1, Ordering::SeqCst) + 1 == grow.chunks() {
            self.finish_grow(grow);
        }
    }

    /// Makes the new table active and retires the old one with the grow state.
    fn finish_grow(&self, grow: &GrowState) {
        grow.published
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let old = self.active.swap(grow.new, Ordering::SeqCst);
        debug_assert!(ptr::eq(old, grow.old));
        grow.phase.store(DONE, Ordering::SeqCst);
        let state = self.grow.swap(ptr::null_mut(), Ordering::SeqCst);
        debug_assert!(ptr::eq(state, grow));
        let retired = Retired {
            table: old,
            grow: state,
        };
        // This thread is protected at an older epoch and still uses `grow`: the action
        // waits for it too.
        self.epoch.bump_with_action(move || drop(retired));
    }

    /// Home buckets of the active table.
    pub(crate) fn buckets(&self, guard: &EpochGuard<'_, '_>) -> usize {
        self.active(guard).len()
    }

    /// Overflow buckets of the active table.
    pub(crate) fn overflow_buckets(&self, guard: &EpochGuard<'_, '_>) -> usize {
        self.active(guard).overflow_buckets()
    }

    /// Memory of the active table.
    pub(crate) fn size_bytes(&self, guard: &EpochGuard<'_, '_>) -> usize {
        self.active(guard).size_bytes()
    }

    /// Whether a grow is under way.
    pub(crate) fn is_growing(&self) -> bool {
        !self.grow.load(Ordering::SeqCst).is_null()
    }

    /// Removes every entry whose chain head is below `address` (the log's new BEGIN: its
    /// whole chain is gone), as F2 does after a truncation; returns how many it removed.
    /// Skipped (0) while a grow runs: the next truncation sweeps again. An operation
    /// holding the slot of a removed entry fails its compare-and-swap and starts again,
    /// creating a fresh entry.
    pub(crate) fn remove_entries_below(&self, guard: &EpochGuard<'_, '_>, address: u64) -> usize {
        let Some(_no_grow) = self.grow_lock.try_lock() else {
            return 0;
        };
        if self.is_growing() {
            return 0;
        }
        let table = self.active(guard);
        let mut removed = 0;
        for index in 0..table.len() {
            table.for_each_in_chain(index, |b| {
                for slot in &b.entries {
                    let entry = Entry(slot.load(Ordering::SeqCst));
                    // An entry naming a copy in the read cache (bit 47, above every
                    // hot-log address) stays: the copy's eviction unlinks it.
                    let gone = !entry.is_empty()
                        && !entry.is_tentative()
                        && entry.address() != INVALID_ADDRESS
                        && !super::read_cache::is_cached(entry.address())
                        && entry.address() < address;
                    if gone
                        && slot
                            .compare_exchange(entry.0, 0, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                    {
                        removed += 1;
                    }
                }
            });
        }
        removed
    }

    /// Every non-empty entry of the active table with its home bucket (tests).
    #[cfg(test)]
    pub(crate) fn entries(&self, guard: &EpochGuard<'_, '_>) -> Vec<(usize, Entry)> {
        let table = self.active(guard);
        let mut all = Vec::new();
        for index in 0..table.len() {
            table.for_each_in_chain(index, |b| {
                for slot in &b.entries {
                    let entry = Entry(slot.load(Ordering::SeqCst));
                    if !entry.is_empty() {
                        all.push((index, entry));
                    }
                }
            });
        }
        all
    }
}

impl Drop for HashIndex {
    fn drop(&mut self) {
        // No operation is running (they borrow the index). Pending `Retired` actions own
        // what they free; what remains is the active table and an unfinished grow.
        let grow = self.grow.load(Ordering::SeqCst);
        if !grow.is_null() {
            // SAFETY: the index's strong count, from `Arc::into_raw`; the grow state
            // frees its unpublished new table when its last count goes (perhaps in a
            // pending action that holds another).
            drop(unsafe { Arc::from_raw(grow.cast_const()) });
        }
        // SAFETY: the active table came from `Box::into_raw` and nothing else owns it.
        drop(unsafe { Box::from_raw(self.active.load(Ordering::SeqCst)) });
    }
}

/// Whether the chain from `home` holds an entry of `tag` (tentative or not) other than
/// the one in `ours`.
fn has_other_entry(table: &Table, home: &Bucket, tag: u16, ours: &AtomicU64) -> bool {
    let mut bucket = Some(home);
    while let Some(b) = bucket {
        for slot in &b.entries {
            let entry = Entry(slot.load(Ordering::SeqCst));
            if !entry.is_empty() && entry.tag() == tag && !ptr::eq(slot, ours) {
                return true;
            }
        }
        bucket = table.next(b);
    }
    false
}

/// Appends entries to a bucket chain of the new table that only this thread writes.
struct Appender<'t> {
    table: &'t Table,
    bucket: &'t Bucket,
    next: usize,
}

impl<'t> Appender<'t> {
    fn new(table: &'t Table, index: usize) -> Self {
        Appender {
            table,
            bucket: table.bucket(index),
            next: 0,
        }
    }

    fn push(&mut self, entry: Entry) {
        if self.next == self.bucket.entries.len() {
            self.bucket = self.table.append_unshared(self.bucket);
            self.next = 0;
        }
        let before = self.bucket.entries[self.next].swap(entry.0, Ordering::SeqCst);
        debug_assert_eq!(before, 0, "a new table's chain is written by one migration");
        self.next += 1;
    }
}

/// Copies the chain of home bucket `index` of `old` to the same bucket of `new`, a table
/// of the same length (a rebuild): its live entries, in order, in as few buckets as
/// they fill.
fn copy_chain(old: &Table, new: &Table, index: usize) {
    let mut to = Appender::new(new, index);
    old.for_each_in_chain(index, |bucket| {
        for slot in &bucket.entries {
            let entry = Entry(slot.load(Ordering::SeqCst));
            // As in `split_chain`: no operation runs in a chunk being migrated.
            if !entry.is_empty() && !entry.is_tentative() {
                to.push(entry);
            }
        }
    });
}

/// Splits the chain of home bucket `index` of `old` into buckets `index` and
/// `index + old.len()` of `new`.
///
/// Each live entry's records are walked from the newest: the first record whose key
/// lands in the low bucket becomes the low entry's address, the first landing in the
/// high bucket the high entry's; older records of either side stay reachable through the
/// previous-address links (a chain may pass through records of the other side; readers
/// compare keys anyway). A record not in memory ends the walk and both unfound sides
/// point at it; a truncated record ends the chain. A side with no record in the chain
/// gets no entry.
fn split_chain(old: &Table, new: &Table, index: usize, records: &dyn RecordHashes) {
    let old_len = old.len();
    let (low_index, high_index) = (index, index + old_len);
    let mut low = Appender::new(new, low_index);
    let mut high = Appender::new(new, high_index);
    old.for_each_in_chain(index, |bucket| {
        for slot in &bucket.entries {
            let entry = Entry(slot.load(Ordering::SeqCst));
            // A tentative entry belongs to an insert that never finished: no operation
            // can be running in a chunk being migrated.
            if entry.is_empty() || entry.is_tentative() {
                continue;
            }
            let (mut low_address, mut high_address) = (None, None);
            let mut address = entry.address();
            while address != INVALID_ADDRESS && (low_address.is_none() || high_address.is_none()) {
                match records.link(address) {
                    ChainLink::Record { key_hash, previous } => {
                        debug_assert_eq!(key_hash.tag(), entry.tag(), "a chain shares one tag");
                        let side = key_hash.bucket(old_len * 2);
                        if side == low_index {
                            low_address.get_or_insert(address);
                        } else if side == high_index {
                            high_address.get_or_insert(address);
                        }
                        // Otherwise a record of another bucket that an earlier split left
                        // on this chain: pass through it.
                        address = previous;
                    }
                    ChainLink::NotInMemory => {
                        low_address.get_or_insert(address);
                        high_address.get_or_insert(address);
                        break;
                    }
                    ChainLink::Truncated => break,
                }
            }
            if let Some(address) = low_address {
                low.push(Entry::new(address, entry.tag(), false));
            }
            if let Some(address) = high_address {
                high.push(Entry::new(address, entry.tag(), false));
            }
        }
    });
}
