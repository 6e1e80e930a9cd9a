//! Shadow paging for checkpoints: [`ShadowStore`], a page store whose clients address
//! *logical* pages, each mapped to a *physical* slot of a [`SlotStore`], so that a slot a
//! checkpoint refers to is never overwritten while that checkpoint may be needed.
//!
//! # The rule
//!
//! A checkpoint *pins* the physical slot of every page it records ([`ShadowStore::pin`],
//! one bit per checkpoint generation in a per-slot mask). A write of a logical page whose
//! slot is pinned goes to a fresh slot instead, and the logical page is remapped to it;
//! the old slot keeps the bytes the checkpoint recorded and becomes an *orphan*. When a
//! checkpoint is no longer needed its pins are dropped ([`ShadowStore::unpin`]), and
//! orphans pinned by nothing are freed. A write of an unpinned slot (one written since
//! the last checkpoint that recorded the page) goes in place. So every checkpoint that
//! is kept finds its pages exactly as it recorded them, whatever was written since —
//! including the splits that rewrite a recorded page with half its records.
//!
//! # Concurrency
//!
//! The logical-to-physical map and the pin masks are arrays of atomics in chunks that
//! never move. A writer of a logical page and a checkpoint pinning it must not race;
//! the caller orders them (the tree writes and pins a page only under that page's lock).
//! A read that loads a mapping just before a write remaps it reads the old slot, which
//! is pinned and therefore unchanged and not freed; its caller finds out that a newer
//! write exists as it would without shadowing.
//!
//! Uses: `sync`.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::sync::Arc;

use super::{Page, PageNo, PageStore, SlotStore, StoreStats};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, Ordering};

/// Entries per chunk of the map and the pin masks.
const CHUNK: usize = 1 << 16;
/// Chunks at most: 2^30 logical pages and physical slots.
const MAX_CHUNKS: usize = 1 << 14;

/// A lazily allocated array of atomics that never moves.
struct Chunks<T> {
    chunks: Box<[AtomicPtr<T>]>,
}

impl<T: Default> Chunks<T> {
    fn new() -> Chunks<T> {
        Chunks {
            chunks: (0..MAX_CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    /// Entry `i`, its chunk allocated on first use; `None` past the largest index.
    fn get(&self, i: u64) -> Option<&T> {
        let (chunk, at) = ((i / CHUNK as u64) as usize, (i % CHUNK as u64) as usize);
        let slot = self.chunks.get(chunk)?;
        let mut ptr = slot.load(Ordering::Acquire);
        if ptr.is_null() {
            let fresh: Box<[T]> = (0..CHUNK).map(|_| T::default()).collect();
            let fresh = Box::into_raw(fresh).cast::<T>();
            match slot.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => ptr = fresh,
                Err(theirs) => {
                    // SAFETY: `fresh` came from `Box::into_raw` of a `CHUNK`-long slice
                    // just above and was never shared.
                    drop(unsafe {
                        Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, CHUNK))
                    });
                    ptr = theirs;
                }
            }
        }
        // SAFETY: a non-null chunk pointer points at a `CHUNK`-long slice that lives
        // until `self` drops, and `at < CHUNK`.
        Some(unsafe { &*ptr.add(at) })
    }
}

impl<T> Drop for Chunks<T> {
    fn drop(&mut self) {
        for slot in self.chunks.iter() {
            let ptr = slot.load(Ordering::Acquire);
            if !ptr.is_null() {
                // SAFETY: every non-null pointer came from `Box::into_raw` of a
                // `CHUNK`-long slice, and `&mut self` means no reference to it remains.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, CHUNK)) });
            }
        }
    }
}

/// The bit of checkpoint generation `generation` in a pin mask. Three generations are
/// pinned at most at once (the two kept and the one being taken); the caller picks a new
/// generation whose bit no kept one has ([`PinSet::share_bit`]), since an unpin clears
/// the bit from every slot of its set, whoever else pinned it with that bit.
fn pin_bit(generation: u64) -> u8 {
    1 << (generation % 8)
}

/// The physical slots a checkpoint pinned, to unpin when it is no longer needed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PinSet {
    /// The checkpoint's generation.
    pub generation: u64,
    /// Its slots.
    pub slots: Vec<u64>,
}

impl PinSet {
    /// Whether checkpoint generations `a` and `b` pin with the same bit: two such must
    /// never be pinned at once, or unpinning one releases the other's slots.
    pub fn share_bit(a: u64, b: u64) -> bool {
        pin_bit(a) == pin_bit(b)
    }
}

/// A page store of logical pages over the physical slots of a [`SlotStore`], with
/// copy-on-write of the slots checkpoints pin (module docs).
pub struct ShadowStore {
    inner: Arc<dyn SlotStore>,
    /// Logical page → physical slot + 1; 0 is no mapping.
    map: Chunks<AtomicU64>,
    /// Physical slot → the pin bits of the checkpoints that record it.
    pins: Chunks<AtomicU8>,
    next_logical: AtomicU64,
    /// Freed logical runs: (first page, pages). A run is handed out again only whole,
    /// to a request of its length (a tree asks for runs of one length only).
    free_logical: Mutex<Vec<(u64, usize)>>,
    /// Slots remapped away from while pinned: freed once nothing pins them.
    orphans: Mutex<Vec<u64>>,
}

impl fmt::Debug for ShadowStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShadowStore")
            .field("inner", &self.inner)
            .field("logical_pages", &self.next_logical.load(Ordering::Relaxed))
            .field("orphans", &self.orphans.lock().len())
            .finish()
    }
}

fn unmapped(no: PageNo) -> io::Error {
    super::not_allocated(no, "use")
}

impl ShadowStore {
    /// A store of no pages over `inner`, whose slots it takes over: every slot `inner`
    /// had is freed.
    pub fn new(inner: Arc<dyn SlotStore>) -> io::Result<ShadowStore> {
        inner.set_allocated(&BTreeSet::new())?;
        Ok(ShadowStore::over(inner))
    }

    fn over(inner: Arc<dyn SlotStore>) -> ShadowStore {
        ShadowStore {
            inner,
            map: Chunks::new(),
            pins: Chunks::new(),
            next_logical: AtomicU64::new(0),
            free_logical: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::new()),
        }
    }

    /// The store a recovery from a checkpoint starts with: logical page `i` maps to
    /// `pages[i]` (the checkpoint's pages, in its order), every slot of `pinned` is
    /// pinned by its generation (the checkpoint's own set, and any other kept one), and
    /// every other slot of `inner` is free. Returns the logical page of each of `pages`.
    pub fn recover(
        inner: Arc<dyn SlotStore>,
        pages: &[u64],
        pinned: &[PinSet],
    ) -> io::Result<(ShadowStore, Vec<PageNo>)> {
        let mut live: BTreeSet<u64> = pages.iter().copied().collect();
        if live.len() != pages.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a checkpoint records one page slot twice",
            ));
        }
        for set in pinned {
            live.extend(set.slots.iter().copied());
        }
        // Slots from a file: out of range is an error before the inner store grows.
        if live
            .last()
            .is_some_and(|&slot| slot >= (CHUNK * MAX_CHUNKS) as u64)
        {
            return Err(too_many());
        }
        inner.set_allocated(&live)?;
        let store = ShadowStore::over(inner);
        let mut logical = Vec::with_capacity(pages.len());
        for (i, &slot) in pages.iter().enumerate() {
            let entry = store.map.get(i as u64).ok_or_else(too_many)?;
            entry.store(slot + 1, Ordering::Relaxed);
            logical.push(PageNo(i as u64));
        }
        store
            .next_logical
            .store(pages.len() as u64, Ordering::Relaxed);
        let mapped: BTreeSet<u64> = pages.iter().copied().collect();
        for set in pinned {
            let bit = pin_bit(set.generation);
            for &slot in &set.slots {
                store
                    .pins
                    .get(slot)
                    .ok_or_else(too_many)?
                    .fetch_or(bit, Ordering::Relaxed);
            }
        }
        // Pinned slots no page maps to: an older checkpoint's, freed with its pins.
        let orphans: BTreeSet<u64> = pinned
            .iter()
            .flat_map(|s| s.slots.iter().copied())
            .filter(|slot| !mapped.contains(slot))
            .collect();
        store.orphans.lock().extend(orphans);
        Ok((store, logical))
    }

    /// The physical slot of logical page `no`.
    fn slot_of(&self, no: PageNo) -> io::Result<u64> {
        match self.map.get(no.0).map(|e| e.load(Ordering::Acquire)) {
            Some(0) | None => Err(unmapped(no)),
            Some(slot_plus_one) => Ok(slot_plus_one - 1),
        }
    }

    fn is_pinned(&self, slot: u64) -> bool {
        self.pins
            .get(slot)
            .is_some_and(|p| p.load(Ordering::Acquire) != 0)
    }

    /// Pins logical page `no`'s slot for checkpoint `generation` and returns the slot:
    /// until [`ShadowStore::unpin`], that slot is never written or freed. The caller
    /// keeps writes of `no` out while it pins (module docs).
    pub fn pin(&self, no: PageNo, generation: u64) -> io::Result<u64> {
        let slot = self.slot_of(no)?;
        self.pins
            .get(slot)
            .ok_or_else(too_many)?
            .fetch_or(pin_bit(generation), Ordering::AcqRel);
        Ok(slot)
    }

    /// Drops the pins of `set`, and frees every orphaned slot nothing pins any more.
    pub fn unpin(&self, set: &PinSet) -> io::Result<()> {
        let bit = pin_bit(set.generation);
        for &slot in &set.slots {
            if let Some(p) = self.pins.get(slot) {
                p.fetch_and(!bit, Ordering::AcqRel);
            }
        }
        let mut orphans = self.orphans.lock();
        let mut kept = Vec::with_capacity(orphans.len());
        for &slot in orphans.iter() {
            if self.is_pinned(slot) {
                kept.push(slot);
            } else {
                self.inner.free(PageNo(slot))?;
            }
        }
        *orphans = kept;
        Ok(())
    }

    /// The slot a write of logical page `no` goes to: its own, or a fresh one if its own
    /// is pinned (then also the slot it leaves).
    fn write_target(&self, no: PageNo) -> io::Result<(u64, Option<u64>)> {
        let slot = self.slot_of(no)?;
        if self.is_pinned(slot) {
            Ok((self.inner.allocate()?.0, Some(slot)))
        } else {
            Ok((slot, None))
        }
    }

    /// Points logical page `no` at `fresh`, written, and orphans the pinned slot `old`.
    fn remap(&self, no: PageNo, fresh: u64, old: u64) {
        if let Some(e) = self.map.get(no.0) {
            e.store(fresh + 1, Ordering::Release);
        }
        self.orphans.lock().push(old);
    }

    /// Slots orphaned and not yet freed, for tests and stats.
    pub fn orphaned_slots(&self) -> usize {
        self.orphans.lock().len()
    }
}

fn too_many() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "page number past the 2^30 a shadow store maps",
    )
}

impl PageStore for ShadowStore {
    fn read_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        self.inner.read_page(PageNo(self.slot_of(no)?), page)
    }

    fn write_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        let (slot, old) = self.write_target(no)?;
        self.inner.write_page(PageNo(slot), page)?;
        if let Some(old) = old {
            self.remap(no, slot, old);
        }
        Ok(())
    }

    fn read_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        let mut physical = Vec::with_capacity(reqs.len());
        for (no, page) in reqs.iter_mut() {
            physical.push((PageNo(self.slot_of(*no)?), &mut **page));
        }
        self.inner.read_pages(&mut physical)
    }

    fn write_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        let mut targets = Vec::with_capacity(reqs.len());
        for (no, _) in reqs.iter() {
            targets.push(self.write_target(*no)?);
        }
        let mut physical: Vec<(PageNo, &mut Page)> = reqs
            .iter_mut()
            .zip(&targets)
            .map(|((_, page), &(slot, _))| (PageNo(slot), &mut **page))
            .collect();
        self.inner.write_pages(&mut physical)?;
        for ((no, _), &(slot, old)) in reqs.iter().zip(&targets) {
            if let Some(old) = old {
                self.remap(*no, slot, old);
            }
        }
        Ok(())
    }

    #[cfg(unix)]
    fn raw_page_location(&self, no: PageNo) -> Option<(std::os::fd::RawFd, u64)> {
        self.inner.raw_page_location(PageNo(self.slot_of(no).ok()?))
    }

    fn allocate(&self) -> io::Result<PageNo> {
        self.allocate_run(1)
    }

    fn free(&self, no: PageNo) -> io::Result<()> {
        self.free_run(no, 1)
    }

    /// `n` consecutive logical pages, each mapped to a slot of its own (the slots need
    /// not be consecutive: the map is per page).
    fn allocate_run(&self, n: usize) -> io::Result<PageNo> {
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            match self.inner.allocate() {
                Ok(slot) => slots.push(slot),
                Err(e) => {
                    for slot in slots {
                        let _ = self.inner.free(slot);
                    }
                    return Err(e);
                }
            }
        }
        let reused = {
            let mut free = self.free_logical.lock();
            let at = free.iter().rposition(|&(_, len)| len == n);
            at.map(|at| free.swap_remove(at).0)
        };
        let first =
            reused.unwrap_or_else(|| self.next_logical.fetch_add(n as u64, Ordering::Relaxed));
        for (i, slot) in slots.iter().enumerate() {
            match self.map.get(first + i as u64) {
                Some(e) => e.store(slot.0 + 1, Ordering::Release),
                None => {
                    for (j, slot) in slots.iter().enumerate() {
                        if let Some(e) = self.map.get(first + j as u64) {
                            e.store(0, Ordering::Release);
                        }
                        let _ = self.inner.free(*slot);
                    }
                    return Err(too_many());
                }
            }
        }
        Ok(PageNo(first))
    }

    fn free_run(&self, first: PageNo, n: usize) -> io::Result<()> {
        let mut slots = Vec::with_capacity(n);
        for i in 0..n as u64 {
            slots.push(self.slot_of(PageNo(first.0 + i))?);
        }
        for i in 0..n as u64 {
            if let Some(e) = self.map.get(first.0 + i) {
                e.store(0, Ordering::Release);
            }
        }
        self.free_logical.lock().push((first.0, n));
        let mut result = Ok(());
        for slot in slots {
            if self.is_pinned(slot) {
                self.orphans.lock().push(slot);
            } else if let Err(e) = self.inner.free(PageNo(slot)) {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// Makes every page write durable ([`SlotStore::sync_data`]); the allocation state
    /// is the checkpoints' to record.
    fn sync(&self) -> io::Result<()> {
        self.inner.sync_data()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn stats(&self) -> StoreStats {
        let inner = self.inner.stats();
        let orphans = self.orphans.lock().len() as u64;
        StoreStats {
            live_pages: inner.live_pages.saturating_sub(orphans),
            ..inner
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SimStore;

    fn page_of(byte: u8) -> Box<Page> {
        let mut p = Page::boxed();
        p.payload_mut().fill(byte);
        p
    }

    fn read(store: &dyn PageStore, no: PageNo) -> u8 {
        let mut p = Page::boxed();
        store.read_page(no, &mut p).unwrap();
        p.payload()[0]
    }

    #[test]
    fn a_pinned_slot_keeps_its_bytes_until_unpinned_and_is_then_freed() {
        let sim = Arc::new(SimStore::new(1));
        let store = ShadowStore::new(sim.clone()).unwrap();
        let a = store.allocate().unwrap();
        store.write_page(a, &mut page_of(1)).unwrap();
        let slot = store.pin(a, 7).unwrap();
        store.write_page(a, &mut page_of(2)).unwrap();
        store.write_page(a, &mut page_of(3)).unwrap();
        assert_eq!(read(&store, a), 3);
        // The pinned slot still holds what the checkpoint recorded.
        assert_eq!(read(&*sim, PageNo(slot)), 1);
        assert_eq!(store.orphaned_slots(), 1);
        // A second checkpoint pins the new slot; the first lets go of the old one.
        let slot2 = store.pin(a, 8).unwrap();
        assert_ne!(slot, slot2);
        store
            .unpin(&PinSet {
                generation: 7,
                slots: vec![slot],
            })
            .unwrap();
        assert_eq!(store.orphaned_slots(), 0);
        assert!(
            sim.read_page(PageNo(slot), &mut Page::boxed()).is_err(),
            "freed"
        );
        assert_eq!(read(&*sim, PageNo(slot2)), 3);
    }

    #[test]
    fn runs_are_consecutive_logical_pages_that_pin_free_and_recover_page_by_page() {
        let sim = Arc::new(SimStore::new(3));
        let store = ShadowStore::new(sim.clone()).unwrap();
        let a = store.allocate_run(4).unwrap();
        let b = store.allocate_run(4).unwrap();
        assert_eq!(b.0, a.0 + 4, "runs take consecutive logical numbers");
        for i in 0..4u64 {
            store
                .write_page(PageNo(a.0 + i), &mut page_of(i as u8))
                .unwrap();
            store
                .write_page(PageNo(b.0 + i), &mut page_of(10 + i as u8))
                .unwrap();
        }
        // A checkpoint pins every page of run `a`; a rewrite of its pages goes elsewhere.
        let pinned: Vec<u64> = (0..4)
            .map(|i| store.pin(PageNo(a.0 + i), 1).unwrap())
            .collect();
        store.write_page(PageNo(a.0 + 2), &mut page_of(99)).unwrap();
        assert_eq!(read(&*sim, PageNo(pinned[2])), 2);
        // Freeing the run orphans its pinned slots and gives the logical run back whole.
        store.free_run(a, 4).unwrap();
        assert_eq!(store.orphaned_slots(), 4);
        assert!(
            store
                .read_page(PageNo(a.0 + 1), &mut Page::boxed())
                .is_err()
        );
        assert_eq!(store.allocate_run(4).unwrap(), a);
        // A recovery from the checkpoint's slots maps them in order.
        let (recovered, logical) = ShadowStore::recover(
            sim.clone(),
            &pinned,
            &[PinSet {
                generation: 1,
                slots: pinned.clone(),
            }],
        )
        .unwrap();
        assert_eq!(logical, (0..4).map(PageNo).collect::<Vec<_>>());
        for i in 0..4u64 {
            assert_eq!(read(&recovered, PageNo(i)), i as u8);
        }
        assert_eq!(recovered.allocate_run(4).unwrap(), PageNo(4));
    }

    #[test]
    fn batched_writes_copy_pinned_pages_and_write_others_in_place() {
        let sim = Arc::new(SimStore::new(2));
        let store = ShadowStore::new(sim.clone()).unwrap();
        let pages: Vec<PageNo> = (0..4).map(|_| store.allocate().unwrap()).collect();
        for &no in &pages {
            store.write_page(no, &mut page_of(10)).unwrap();
        }
        let pinned = [
            store.pin(pages[1], 1).unwrap(),
            store.pin(pages[3], 1).unwrap(),
        ];
        let mut bufs: Vec<Box<Page>> = (0..4).map(|i| page_of(20 + i)).collect();
        let mut reqs: Vec<(PageNo, &mut Page)> = pages
            .iter()
            .copied()
            .zip(bufs.iter_mut().map(|b| &mut **b))
            .collect();
        store.write_pages(&mut reqs).unwrap();
        for (i, &no) in pages.iter().enumerate() {
            assert_eq!(read(&store, no), 20 + i as u8);
        }
        for slot in pinned {
            assert_eq!(read(&*sim, PageNo(slot)), 10);
        }
        assert_eq!(store.orphaned_slots(), 2);
    }

    #[test]
    fn recovery_maps_the_checkpoint_and_frees_everything_else() {
        let sim = Arc::new(SimStore::new(3));
        let store = ShadowStore::new(sim.clone()).unwrap();
        let pages: Vec<PageNo> = (0..6).map(|_| store.allocate().unwrap()).collect();
        for (i, &no) in pages.iter().enumerate() {
            store.write_page(no, &mut page_of(i as u8)).unwrap();
        }
        let slots: Vec<u64> = pages[..3]
            .iter()
            .map(|&no| store.pin(no, 4).unwrap())
            .collect();
        store.sync().unwrap();
        drop(store);
        let set = PinSet {
            generation: 4,
            slots: slots.clone(),
        };
        let (store, logical) = ShadowStore::recover(sim.clone(), &slots, &[set]).unwrap();
        for (i, &no) in logical.iter().enumerate() {
            assert_eq!(read(&store, no), i as u8);
        }
        assert_eq!(
            store.stats().live_pages,
            3,
            "the three unrecorded pages are free"
        );
        // A write of a recovered page goes elsewhere: the checkpoint's slot is pinned.
        store.write_page(logical[0], &mut page_of(99)).unwrap();
        assert_eq!(read(&*sim, PageNo(slots[0])), 0);
        assert_eq!(read(&store, logical[0]), 99);
        // Recording one slot twice is refused.
        assert!(ShadowStore::recover(sim, &[slots[0], slots[0]], &[]).is_err());
    }
}
