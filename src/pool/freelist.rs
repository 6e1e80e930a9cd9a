//! Size-class free lists, intrusive and exact.
//!
//! Each class has one doubly linked list threaded through the payloads of its `Free`
//! blocks (payload word 0 = next, word 1 = prev, both logical addresses), guarded by a
//! short per-class mutex. Because the links live in memory the pool already accounts
//! for, the lists cost no memory outside the region.
//!
//! Invariant (held under the class mutex): a block is linked into its class's list if
//! and only if its header state is `Free`. Every transition into or out of `Free` is made
//! under that mutex, by a CAS on the exact header word (size, state, lap). So the lists
//! never hold a stale entry: the evictor unlinks a `Free` block before reclaiming it,
//! and a pop can therefore never hand out memory that was reclaimed or reused by a later
//! lap. A pop unlinks a block *before* its header leaves `Free`: a block it skips
//! becomes `Dead`, which its evictor reclaims (zeroing the links) without the mutex.

use super::header::{HEADER_SIZE_BYTES, Header, State};
use super::region::Region;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicUsize, Ordering};

/// The "no block" link value.
const NONE: u64 = u64::MAX;

/// The head of one class's list.
#[derive(Debug)]
struct List {
    /// Logical address of the most recently freed block, or `NONE`.
    first: u64,
}

/// One free list per size class.
pub(crate) struct FreeLists {
    lists: Box<[Mutex<List>]>,
    /// Entries per class, updated under the class mutex, read without it as a hint so
    /// an empty class costs no lock on the allocation path.
    lens: Box<[AtomicUsize]>,
    /// Runs in `pop` with a block's address just after its header left `Free`: the
    /// instant an evictor may act on the block without this list's mutex. Tests widen
    /// that window with it. It runs under the class mutex, so it must not take a block
    /// of that class (an eviction of `Dead` blocks needs no list mutex).
    #[cfg(test)]
    pub(crate) after_leave_free_hook: Mutex<Option<LeaveFreeHook>>,
}

/// The type of [`FreeLists::after_leave_free_hook`]: called with the block's address.
#[cfg(test)]
pub(crate) type LeaveFreeHook = Box<dyn Fn(u64) + Send + Sync>;

impl FreeLists {
    /// Empty lists for `classes` size classes.
    pub(crate) fn new(classes: usize) -> FreeLists {
        FreeLists {
            lists: (0..classes)
                .map(|_| Mutex::new(List { first: NONE }))
                .collect(),
            lens: (0..classes).map(|_| AtomicUsize::new(0)).collect(),
            #[cfg(test)]
            after_leave_free_hook: Mutex::new(None),
        }
    }

    /// Entries currently listed in `class` (a snapshot).
    pub(crate) fn len(&self, class: usize) -> usize {
        self.lens[class].load(Ordering::Relaxed)
    }

    /// Turns the block at `addr` from `expected` (its current `Reserved` or `Live`
    /// header) into `Free` and links it. Returns false, changing nothing, if the header
    /// is no longer `expected`.
    ///
    /// # Safety
    ///
    /// `addr` must be a block of this pool's region that has not been reclaimed, whose
    /// payload belongs to `class`, and whose payload nobody accesses once it is `Free`.
    pub(crate) unsafe fn push(
        &self,
        region: &Region,
        class: usize,
        addr: u64,
        expected: Header,
    ) -> bool {
        let mut list = self.lists[class].lock();
        let offset = region.offset_of(addr);
        // SAFETY: the block is not reclaimed (caller), so this word is its header.
        let word = unsafe { region.header(offset) };
        if word
            .compare_exchange(
                expected.0,
                expected.with_state(State::Free).0,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            )
            .is_err()
        {
            return false;
        }
        // SAFETY: the block is now `Free` and we hold the class mutex, so the pool owns
        // its payload and no one else reads or writes list links concurrently.
        unsafe {
            link_front(region, &mut list, addr);
        }
        self.lens[class].fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Takes a block from `class` for allocation, turning it `Free → Reserved`.
    ///
    /// Entries below `reusable_from` (the copy-on-access region or already claimed by
    /// the evictor) are not handed out: they are turned `Dead` and dropped from the list,
    /// at most `max_skips` of them per call, because a block that close to the head would
    /// be evicted again almost at once. Returns the block's address and new header.
    ///
    /// # Safety
    ///
    /// `region` must be the region this list's blocks live in.
    pub(crate) unsafe fn pop(
        &self,
        region: &Region,
        class: usize,
        reusable_from: u64,
        max_skips: usize,
    ) -> Option<(u64, Header)> {
        if self.len(class) == 0 {
            return None;
        }
        let mut list = self.lists[class].lock();
        let mut skips = 0;
        while list.first != NONE {
            let addr = list.first;
            // SAFETY: every listed block is `Free`, and a `Free` block is reclaimed only
            // after being unlinked under this mutex, so this word is its header.
            let word = unsafe { region.header(region.offset_of(addr)) };
            let current = Header(word.load(std::sync::atomic::Ordering::Acquire));
            assert_eq!(
                current.state(),
                Some(State::Free),
                "free list holds a block at {addr} that is not Free: {current:?}"
            );
            let target = if addr < reusable_from && skips < max_skips {
                skips += 1;
                State::Dead
            } else if addr < reusable_from {
                return None;
            } else {
                State::Reserved
            };
            // Unlink first, while the block is still `Free`: the links live in its
            // payload, and once its header says `Dead` the block's evictor may reclaim it
            // at once, without this mutex, zeroing the payload under our reads. (Storing
            // first was the `tree_concurrent` CI flake: a pop preempted between the store
            // and the unlink read zeroed links, so it left the reclaimed block at the
            // front of the list and, taking a zero link for the address 0, wrote links
            // into the payload of the block at physical offset 0.)
            // SAFETY: we hold the class mutex, and the block is still `Free`, so its
            // payload holds its links and nobody else reads or writes them.
            unsafe { unlink(region, &mut list, addr) };
            self.lens[class].fetch_sub(1, Ordering::Relaxed);
            let next = current.with_state(target);
            // Only this mutex's holder changes a Free header, so the store cannot lose a
            // concurrent transition. Release: our reads of the links happen-before an
            // evictor that sees `Dead` zeroes them.
            word.store(next.0, std::sync::atomic::Ordering::Release);
            #[cfg(test)]
            if let Some(hook) = &*self.after_leave_free_hook.lock() {
                hook(addr);
            }
            if target == State::Reserved {
                return Some((addr, next));
            }
        }
        None
    }

    /// Turns the `Free` block at `addr` into `to` (the evictor's `Evicting`) and unlinks
    /// it, if its header still equals `expected`. Returns false otherwise.
    ///
    /// # Safety
    ///
    /// `addr` must be a block of this region that has not been reclaimed.
    pub(crate) unsafe fn take(
        &self,
        region: &Region,
        class: usize,
        addr: u64,
        expected: Header,
        to: State,
    ) -> bool {
        debug_assert_eq!(expected.state(), Some(State::Free));
        let mut list = self.lists[class].lock();
        // SAFETY: not reclaimed (caller), so this word is its header.
        let word = unsafe { region.header(region.offset_of(addr)) };
        if word
            .compare_exchange(
                expected.0,
                expected.with_state(to).0,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            )
            .is_err()
        {
            return false;
        }
        // Unlinking after the CAS is safe here, unlike in `pop`: the CAS hands the block
        // to our caller, its one processor, which reclaims it only after we return.
        // SAFETY: the block was Free, hence linked; we hold the class mutex.
        unsafe { unlink(region, &mut list, addr) };
        self.lens[class].fetch_sub(1, Ordering::Relaxed);
        true
    }
}

/// Payload offsets of a block's `next` and `prev` link words.
fn link_offsets(region: &Region, addr: u64) -> (u64, u64) {
    let payload = region.offset_of(addr) + HEADER_SIZE_BYTES;
    (payload, payload + 8)
}

/// Links `addr` at the front of `list`.
///
/// # Safety
///
/// The caller holds the list's mutex and `addr` is a `Free` block of this class.
unsafe fn link_front(region: &Region, list: &mut List, addr: u64) {
    let (next_at, prev_at) = link_offsets(region, addr);
    // SAFETY: every linked payload is owned by the list under its mutex (caller).
    unsafe {
        region.write_word(next_at, list.first);
        region.write_word(prev_at, NONE);
        if list.first != NONE {
            let (_, old_prev_at) = link_offsets(region, list.first);
            region.write_word(old_prev_at, addr);
        }
    }
    list.first = addr;
}

/// Unlinks `addr` from `list`.
///
/// # Safety
///
/// The caller holds the list's mutex and `addr` is linked in `list`.
unsafe fn unlink(region: &Region, list: &mut List, addr: u64) {
    let (next_at, prev_at) = link_offsets(region, addr);
    // SAFETY: every linked payload is owned by the list under its mutex (caller), and
    // the neighbours named by the links are linked blocks too.
    unsafe {
        let next = region.read_word(next_at);
        let prev = region.read_word(prev_at);
        if prev == NONE {
            debug_assert_eq!(list.first, addr);
            list.first = next;
        } else {
            region.write_word(link_offsets(region, prev).0, next);
        }
        if next != NONE {
            region.write_word(link_offsets(region, next).1, prev);
        }
    }
}
