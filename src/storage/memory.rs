//! A page store that keeps its pages in memory.
//!
//! It stamps and verifies page headers exactly like the file store, so tests can
//! corrupt bytes through [`MemoryStore::corrupt_for_test`] and watch the checksum catch
//! it, and so the in-memory mode of the engine sees the same errors as the file mode.
//!
//! # Concurrency
//!
//! Each slot has its own lock, and the 4 KiB copy of a read or write happens under that
//! lock only. The table of slots sits behind a reader-writer lock that is held just long
//! enough to clone the slot's `Arc`; allocation takes the table's write lock only to
//! append a slot, and a mutex over the free list.
//!
//! Page numbers start at 0: the memory store has no superblock.

use std::io;

use super::{Page, PageKind, PageNo, PageStore, Poison, StoreStats, not_allocated};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex, RwLock};

/// The state of one slot.
#[derive(Debug)]
enum Slot {
    /// Free: on the free list, reads and writes refused.
    Free,
    /// Allocated to the client; `None` until its first write.
    Allocated(Option<Box<Page>>),
}

/// An in-memory [`PageStore`]; nothing survives the value.
///
/// `sync` only reports poisoning: memory has nothing to make durable.
#[derive(Debug)]
pub struct MemoryStore {
    /// One entry per slot ever handed out, indexed by page number.
    slots: RwLock<Vec<Arc<Mutex<Slot>>>>,
    /// Free slots, reused lowest first.
    free: Mutex<std::collections::BTreeSet<u64>>,
    /// Number of slots that hold page bytes, for `size_bytes`.
    held_pages: AtomicU64,
    /// Set by the test hook to make the next write fail.
    fail_next_write: AtomicBool,
    poison: Poison,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore {
            slots: RwLock::new(Vec::new()),
            free: Mutex::new(std::collections::BTreeSet::new()),
            held_pages: AtomicU64::new(0),
            fail_next_write: AtomicBool::new(false),
            poison: Poison::default(),
        }
    }

    /// The slot for `no`, if the store ever handed it out.
    fn slot(&self, no: PageNo) -> Option<Arc<Mutex<Slot>>> {
        let slots = self.slots.read();
        let index = usize::try_from(no.0).ok()?;
        slots.get(index).cloned()
    }

    /// Flips bit 0 of byte `byte_index` of the stored page `no`, header included, so
    /// that tests can check that reads detect corruption. Returns false if the page is
    /// not allocated, has never been written, or the index is out of range.
    #[doc(hidden)]
    pub fn corrupt_for_test(&self, no: PageNo, byte_index: usize) -> bool {
        let Some(slot) = self.slot(no) else {
            return false;
        };
        let mut slot = slot.lock();
        match &mut *slot {
            Slot::Allocated(Some(page)) if byte_index < page.as_bytes().len() => {
                page.as_bytes_mut()[byte_index] ^= 1;
                true
            }
            _ => false,
        }
    }

    /// Makes the next `write_page` fail with an IO error, which poisons the store, so
    /// tests can exercise the poisoning contract without a failing device.
    #[doc(hidden)]
    pub fn fail_next_write_for_test(&self) {
        self.fail_next_write.store(true, Ordering::Release);
    }
}

impl PageStore for MemoryStore {
    fn read_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        let slot = self.slot(no).ok_or_else(|| not_allocated(no, "read"))?;
        let slot = slot.lock();
        match &*slot {
            Slot::Free => Err(not_allocated(no, "read")),
            Slot::Allocated(None) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot read page {no}: it was allocated but never written"),
            )),
            Slot::Allocated(Some(stored)) => {
                page.as_bytes_mut().copy_from_slice(stored.as_bytes());
                drop(slot);
                page.verify(no, PageKind::Data)
            }
        }
    }

    fn write_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        self.poison.check()?;
        let slot = self.slot(no).ok_or_else(|| not_allocated(no, "write"))?;
        page.stamp(PageKind::Data);
        let mut slot = slot.lock();
        if matches!(*slot, Slot::Free) {
            return Err(not_allocated(no, "write"));
        }
        if self.fail_next_write.swap(false, Ordering::AcqRel) {
            return Err(self.poison.poison(io::Error::other(format!(
                "injected write failure at page {no}"
            ))));
        }
        match &mut *slot {
            Slot::Allocated(Some(stored)) => stored.as_bytes_mut().copy_from_slice(page.as_bytes()),
            Slot::Allocated(stored @ None) => {
                let mut fresh = Page::boxed();
                fresh.as_bytes_mut().copy_from_slice(page.as_bytes());
                *stored = Some(fresh);
                self.held_pages.fetch_add(1, Ordering::Relaxed);
            }
            Slot::Free => unreachable!("checked above under the same lock"),
        }
        Ok(())
    }

    fn allocate(&self) -> io::Result<PageNo> {
        self.poison.check()?;
        let mut free = self.free.lock();
        if let Some(no) = free.pop_first() {
            let slot = self
                .slot(PageNo(no))
                .expect("free slots exist in the table");
            let mut slot = slot.lock();
            assert!(
                matches!(*slot, Slot::Free),
                "slot {no} on the free list is in use"
            );
            *slot = Slot::Allocated(None);
            return Ok(PageNo(no));
        }
        // Appending under the free-list mutex keeps allocations serialized, so the new
        // index cannot race with another allocation.
        let mut slots = self.slots.write();
        let no = slots.len() as u64;
        slots.push(Arc::new(Mutex::new(Slot::Allocated(None))));
        Ok(PageNo(no))
    }

    /// The first run of `n` free slots, else `n` new slots at the end.
    fn allocate_run(&self, n: usize) -> io::Result<PageNo> {
        if n <= 1 {
            return self.allocate();
        }
        self.poison.check()?;
        let mut free = self.free.lock();
        let n64 = n as u64;
        let found = free
            .iter()
            .copied()
            .find(|&f| (f..f + n64).all(|no| free.contains(&no)));
        let first = match found {
            Some(first) => {
                for no in first..first + n64 {
                    free.remove(&no);
                }
                first
            }
            None => {
                let mut slots = self.slots.write();
                let len = slots.len();
                slots.resize_with(len + n, || Arc::new(Mutex::new(Slot::Free)));
                len as u64
            }
        };
        for no in first..first + n64 {
            let slot = self.slot(PageNo(no)).expect("slots of the run exist");
            let mut slot = slot.lock();
            assert!(
                matches!(*slot, Slot::Free),
                "slot {no} of a free run is in use"
            );
            *slot = Slot::Allocated(None);
        }
        Ok(PageNo(first))
    }

    fn free_run(&self, first: PageNo, n: usize) -> io::Result<()> {
        for no in first.0..first.0 + n as u64 {
            self.free(PageNo(no))?;
        }
        Ok(())
    }

    fn free(&self, no: PageNo) -> io::Result<()> {
        self.poison.check()?;
        let mut free = self.free.lock();
        let slot = self.slot(no).ok_or_else(|| not_allocated(no, "free"))?;
        let mut slot = slot.lock();
        match std::mem::replace(&mut *slot, Slot::Free) {
            Slot::Free => return Err(not_allocated(no, "free")),
            Slot::Allocated(Some(_)) => {
                self.held_pages.fetch_sub(1, Ordering::Relaxed);
            }
            Slot::Allocated(None) => {}
        }
        let inserted = free.insert(no.0);
        assert!(
            inserted,
            "slot {no} was allocated and on the free list at once"
        );
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.poison.check()
    }

    fn size_bytes(&self) -> u64 {
        self.held_pages.load(Ordering::Relaxed) * super::PAGE_SIZE as u64
    }

    fn stats(&self) -> StoreStats {
        let free = self.free.lock();
        let total = self.slots.read().len() as u64;
        StoreStats {
            live_pages: total - free.len() as u64,
            free_pages: free.len() as u64,
            free_list_pages: 0,
        }
    }
}

impl MemoryStore {
    /// Whether an earlier failed write poisoned the store.
    pub fn is_poisoned(&self) -> bool {
        self.poison.is_poisoned()
    }
}

#[cfg(test)]
mod tests {
    use super::super::CorruptPage;
    use super::*;

    #[test]
    fn runs_are_consecutive_and_reuse_freed_runs() {
        let store = MemoryStore::new();
        let single = store.allocate().unwrap();
        let run = store.allocate_run(4).unwrap();
        assert_eq!(run.0, single.0 + 1);
        for i in 0..4 {
            store
                .write_page(PageNo(run.0 + i), &mut Page::boxed())
                .unwrap();
        }
        store.free_run(run, 4).unwrap();
        store.free(single).unwrap();
        // Five free slots in a row: the run comes from their start.
        assert_eq!(store.allocate_run(4).unwrap(), single);
        assert_eq!(store.allocate().unwrap(), PageNo(run.0 + 3));
        assert!(store.free_run(PageNo(100), 2).is_err());
    }

    #[test]
    fn write_read_free_reuse() {
        let store = MemoryStore::new();
        let a = store.allocate().unwrap();
        let b = store.allocate().unwrap();
        assert_ne!(a, b);
        let mut page = Page::zeroed();
        page.payload_mut()[0] = 42;
        page.set_lsn(5);
        store.write_page(a, &mut page).unwrap();
        let mut back = Page::zeroed();
        store.read_page(a, &mut back).unwrap();
        assert_eq!(back.payload()[0], 42);
        assert_eq!(back.lsn(), 5);
        assert_eq!(store.size_bytes(), 4096);

        store.free(a).unwrap();
        assert_eq!(store.size_bytes(), 0);
        assert_eq!(
            store.read_page(a, &mut back).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            store.free(a).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(store.allocate().unwrap(), a);
        // The reused slot does not show the previous incarnation's bytes.
        assert_eq!(
            store.read_page(a, &mut back).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            store.stats(),
            StoreStats {
                live_pages: 2,
                free_pages: 0,
                free_list_pages: 0
            }
        );
    }

    #[test]
    fn corruption_is_detected() {
        let store = MemoryStore::new();
        let a = store.allocate().unwrap();
        let mut page = Page::zeroed();
        store.write_page(a, &mut page).unwrap();
        assert!(store.corrupt_for_test(a, 100));
        let err = store.read_page(a, &mut page).unwrap_err();
        let c = err
            .get_ref()
            .unwrap()
            .downcast_ref::<CorruptPage>()
            .unwrap();
        assert_eq!(c.page, a.0);
    }

    #[test]
    fn never_handed_out_pages_are_invalid_input() {
        let store = MemoryStore::new();
        let mut page = Page::zeroed();
        for no in [0, 1, u64::MAX] {
            assert_eq!(
                store.read_page(PageNo(no), &mut page).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
            assert_eq!(
                store.write_page(PageNo(no), &mut page).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
    }
}
