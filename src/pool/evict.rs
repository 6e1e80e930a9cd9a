//! Eviction from the head of the circular buffer.
//!
//! Three steps, each with its own owner:
//!
//! 1. **Claim** (under the `evict_state` mutex, a few loads and one store): read the
//!    header at `evict_cursor` and move the cursor past that block. Claims are serial,
//!    so each block is claimed exactly once, but they are short; the expensive part
//!    runs outside the lock.
//! 2. **Process** (no pool lock held): by state. `Live` → `Evicting`, then the callback;
//!    `Free`/`Dead`/`Pad` → reclaim directly; `Reserved` or a `Busy` answer → the retry
//!    list. Many threads process claimed blocks at once.
//! 3. **Advance the head** (under the head mutex): past every `Reclaimed` block at the
//!    head, in address order, so the head moves only past finished evictions.
//!
//! Every reclaimer runs step 3 after marking its block `Reclaimed`, with a blocking lock,
//! so no reclaimed block is left behind the head unnoticed.
//!
//! `evict_many` (used by `alloc` and `evict_until`) claims up to `EVICT_BATCH_BLOCKS`
//! blocks in a row and hands the live ones to one `Evictor::evict_batch` call, so the
//! tree can merge them with one batched read and one batched write. Step 2 is split in
//! `begin` (by state; `Live` → `Evicting`) and `finish` (the callback's answer), and
//! every block of a batch goes through both exactly as a single block would: claims stay
//! serial and single, and the head still passes a block only once it is `Reclaimed`.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering as RegionOrdering;

use super::header::{HEADER_SIZE_BYTES, Header, State};
use super::{AllocError, Block, Counters, EvictDecision, Evictor, Pool, cas as cas_state};
use crate::sync::atomic::Ordering;
use crate::sync::spin_wait;

/// At most this many busy blocks wait on the retry list; past it no new block is
/// claimed until one of them is dealt with (bounded bookkeeping outside the region).
const RETRY_LIST_MAX: usize = 256;

/// Consecutive attempts without reclaiming anything before `alloc` gives up with
/// `WouldBlock`.
const MAX_STALLED_ATTEMPTS: u32 = 64;

/// Attempts in total (reclaiming or not) before `alloc` gives up with `WouldBlock`; a
/// backstop against starvation by other allocating threads.
const MAX_ALLOC_ATTEMPTS: u32 = 4096;

/// Blocks claimed per step by `alloc` and [`Pool::evict_until`], whose live ones go to
/// [`Evictor::evict_batch`] together (so the tree can merge them with batched IO).
pub const EVICT_BATCH_BLOCKS: usize = 8;

/// The unit in which memory behind the head is given back while the limit is below
/// the capacity: a huge page, so an explicit or transparent huge page goes back whole.
pub(super) const RELEASE_CHUNK_BYTES: u64 = 2 << 20;

/// What one eviction step achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictResult {
    /// A block was reclaimed: a `Live` block the callback evicted, or a freed or pad
    /// block. Its bytes return to the tail once the head passes it.
    Reclaimed {
        /// The reclaimed block's footprint, header included.
        block_bytes: u64,
        /// True if it was a `Live` block the callback evicted.
        evicted: bool,
    },
    /// The block tried was busy (or the eviction window is exhausted behind busy
    /// blocks); it is on the retry list.
    Busy,
    /// The next block is being allocated right now; try again shortly.
    InFlight,
    /// Nothing is left to claim and nothing waits for a retry.
    Empty,
}

/// Result of [`Pool::drain`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Blocks reclaimed.
    pub reclaimed_blocks: u64,
    /// Of those, `Live` blocks the callback evicted.
    pub evicted_blocks: u64,
    /// Blocks still busy (left on the retry list).
    pub busy_blocks: usize,
}

/// State guarded by the claim mutex.
#[derive(Debug, Default)]
pub(crate) struct EvictState {
    /// Claimed blocks whose eviction could not proceed yet, by address: the oldest is
    /// the one holding the head back, so it is retried first.
    retry: BTreeSet<u64>,
}

/// Outcome of a claim.
enum Claim {
    Block(u64),
    InFlight,
    Empty,
    WindowFull,
}

impl Pool {
    /// Runs one eviction step: retries the oldest busy block, and if that does not
    /// reclaim anything, claims the next block at the evict cursor.
    ///
    /// The cursor runs at most a quarter of the capacity (and `RETRY_LIST_MAX` busy
    /// blocks) ahead of the head, so a busy block at the head does not cause the whole
    /// buffer to be evicted behind it.
    pub fn evict_one(&self, evictor: &dyn Evictor) -> EvictResult {
        let oldest = self.evict_state.lock().retry.pop_first();
        let mut retried_busy = false;
        if let Some(addr) = oldest {
            match self.process(addr, evictor) {
                r @ EvictResult::Reclaimed { .. } => return r,
                _ => retried_busy = true,
            }
        }
        match self.claim_next(true) {
            Claim::Block(addr) => self.process(addr, evictor),
            Claim::InFlight => EvictResult::InFlight,
            Claim::Empty if !retried_busy && self.evict_state.lock().retry.is_empty() => {
                EvictResult::Empty
            }
            Claim::Empty | Claim::WindowFull => EvictResult::Busy,
        }
    }

    /// Runs one batched eviction step: retries the oldest busy block (alone), then
    /// claims up to `max_blocks` blocks at the evict cursor and hands the live ones to
    /// [`Evictor::evict_batch`] in one call. Returns the number of blocks reclaimed; 0
    /// means no progress right now (busy blocks, an allocation in flight, or nothing to
    /// evict).
    ///
    /// The pool's invariants are those of [`Pool::evict_one`]: each block is claimed
    /// once and processed by this thread only, and is reclaimed (letting the head pass)
    /// only after the callback answered for it.
    pub fn evict_many(&self, max_blocks: usize, evictor: &dyn Evictor) -> usize {
        let mut reclaimed = 0;
        let oldest = self.evict_state.lock().retry.pop_first();
        if let Some(addr) = oldest
            && matches!(self.process(addr, evictor), EvictResult::Reclaimed { .. })
        {
            reclaimed += 1;
        }
        let mut live: Vec<(u64, Header)> = Vec::with_capacity(max_blocks);
        for _ in 0..max_blocks {
            let Claim::Block(addr) = self.claim_next(true) else {
                break;
            };
            match self.begin(addr) {
                Begun::Done(EvictResult::Reclaimed { .. }) => reclaimed += 1,
                Begun::Done(_) => {}
                Begun::Callback(current) => live.push((addr, current)),
            }
        }
        if live.is_empty() {
            return reclaimed;
        }
        let blocks: Vec<Block> = live
            .iter()
            .map(|&(addr, h)| self.handle(addr, h.payload_size_bytes()))
            .collect();
        let addrs: Vec<u64> = live.iter().map(|&(addr, _)| addr).collect();
        let decisions = {
            let guard = RestoreOnUnwind {
                pool: self,
                addrs: &addrs,
            };
            let d = evictor.evict_batch(&blocks);
            std::mem::forget(guard);
            d
        };
        assert_eq!(
            decisions.len(),
            blocks.len(),
            "evict_batch must answer for every block"
        );
        for (&(addr, current), decision) in live.iter().zip(decisions) {
            if matches!(
                self.finish(addr, current, decision),
                EvictResult::Reclaimed { .. }
            ) {
                reclaimed += 1;
            }
        }
        reclaimed
    }

    /// Evicts until the tail has at least `free_bytes` of room (`limit - (tail -
    /// head)`), or until eviction stalls on busy blocks. Returns whether the room was
    /// reached.
    pub fn evict_until(&self, free_bytes: u64, evictor: &dyn Evictor) -> bool {
        let mut stalled = 0;
        loop {
            // The snapshot loads the head before the tail, so under concurrent
            // eviction and allocation `tail - head` can exceed the limit: no room.
            let a = self.addresses();
            if self.limit_bytes().saturating_sub(a.tail - a.head) >= free_bytes {
                return true;
            }
            if self.evict_many(EVICT_BATCH_BLOCKS, evictor) > 0 {
                stalled = 0;
            } else {
                stalled += 1;
                if stalled > MAX_STALLED_ATTEMPTS {
                    return false;
                }
                spin_wait(stalled);
            }
        }
    }

    /// Evicts everything evictable: claims every block up to the tail (ignoring the
    /// eviction window) and retries busy blocks until a whole round reclaims nothing.
    /// For tests and shutdown.
    pub fn drain(&self, evictor: &dyn Evictor) -> DrainReport {
        let mut report = DrainReport::default();
        let note = |r: EvictResult, report: &mut DrainReport| {
            if let EvictResult::Reclaimed { evicted, .. } = r {
                report.reclaimed_blocks += 1;
                report.evicted_blocks += u64::from(evicted);
                true
            } else {
                false
            }
        };
        loop {
            let mut progressed = false;
            let mut in_flight_spins = 0;
            loop {
                match self.claim_next(false) {
                    Claim::Block(addr) => {
                        in_flight_spins = 0;
                        progressed |= note(self.process(addr, evictor), &mut report);
                    }
                    Claim::InFlight if in_flight_spins < MAX_STALLED_ATTEMPTS => {
                        in_flight_spins += 1;
                        spin_wait(in_flight_spins);
                    }
                    Claim::InFlight | Claim::Empty | Claim::WindowFull => break,
                }
            }
            let busy = std::mem::take(&mut self.evict_state.lock().retry);
            for addr in busy {
                progressed |= note(self.process(addr, evictor), &mut report);
            }
            if !progressed {
                break;
            }
        }
        report.busy_blocks = self.evict_state.lock().retry.len();
        report
    }

    /// Claims the block at the evict cursor.
    fn claim_next(&self, bounded: bool) -> Claim {
        let state = self.evict_state.lock();
        // Only claimers, under this mutex, write the cursor.
        let cursor = self.evict_cursor.load(Ordering::Relaxed);
        if bounded
            && (state.retry.len() >= RETRY_LIST_MAX
                || cursor - self.head.load(Ordering::Acquire) >= self.evict_window_bytes())
        {
            return Claim::WindowFull;
        }
        let tail = self.tail.load(Ordering::Acquire);
        if cursor == tail {
            return Claim::Empty;
        }
        let offset = self.region.offset_of(cursor);
        // SAFETY: `cursor < tail`, and the tail CAS that passed `cursor` was made by an
        // allocator whose Acquire load of the head ordered every earlier non-atomic
        // access to this memory (payloads and zeroing of the previous lap) before it; our
        // Acquire load of the tail orders it before this read. The word is a block start
        // (the cursor moves by whole blocks), so in this lap only atomics touch it.
        let header = unsafe { self.region.load_header(offset) };
        if header.is_unpublished() {
            return Claim::InFlight;
        }
        assert_eq!(
            header.lap(),
            self.lap(cursor),
            "header {header:?} at the evict cursor {cursor} is from another lap"
        );
        assert!(
            matches!(
                header.state(),
                Some(State::Reserved | State::Live | State::Free | State::Dead | State::Pad)
            ),
            "unclaimed block at {cursor} in state {header:?}"
        );
        let end = cursor + header.block_size_bytes();
        assert!(end <= tail && offset + header.block_size_bytes() <= self.capacity_bytes);
        self.evict_cursor.store(end, Ordering::Release);
        Claim::Block(cursor)
    }

    /// Deals with a claimed block. This thread is its only processor.
    fn process(&self, addr: u64, evictor: &dyn Evictor) -> EvictResult {
        match self.begin(addr) {
            Begun::Done(result) => result,
            Begun::Callback(current) => {
                let block = self.handle(addr, current.payload_size_bytes());
                let decision = {
                    let guard = RestoreOnUnwind {
                        pool: self,
                        addrs: &[addr],
                    };
                    let d = evictor.evict(&block);
                    std::mem::forget(guard);
                    d
                };
                self.finish(addr, current, decision)
            }
        }
    }

    /// The first half of processing a claimed block: reclaims or defers it by state,
    /// or, for a `Live` block, makes it `Evicting` and asks for the callback. This thread
    /// is the block's only processor.
    fn begin(&self, addr: u64) -> Begun {
        let offset = self.region.offset_of(addr);
        // SAFETY: the block is claimed and not reclaimed (only its processor, this
        // thread, reclaims it), so the head is at or below it and the word is its header,
        // only accessed atomically.
        let word = unsafe { self.region.header(offset) };
        loop {
            let current = Header(word.load(RegionOrdering::Acquire));
            debug_assert_eq!(current.lap(), self.lap(addr));
            match current.state() {
                Some(State::Pad | State::Dead) => return Begun::Done(self.reclaim(addr, false)),
                Some(State::Free) => {
                    let class = self
                        .class_of(current.payload_size_bytes() as usize)
                        .expect("a free block has a class");
                    // SAFETY: claimed and unreclaimed, as above.
                    let taken = unsafe {
                        self.free_lists
                            .take(&self.region, class, addr, current, State::Evicting)
                    };
                    if taken {
                        return Begun::Done(self.reclaim(addr, false));
                    }
                    // A pop or a skip changed it first; look again.
                }
                // Its client is still initialising it (perhaps this very thread):
                // never wait for it.
                Some(State::Reserved) => return Begun::Done(self.retry_later(addr)),
                Some(State::Live) => {
                    let evicting = current.with_state(State::Evicting);
                    if word
                        .compare_exchange(
                            current.0,
                            evicting.0,
                            RegionOrdering::AcqRel,
                            RegionOrdering::Acquire,
                        )
                        .is_ok()
                    {
                        return Begun::Callback(current);
                    }
                }
                other => panic!("claimed block at {addr} in state {other:?}"),
            }
        }
    }

    /// The second half: acts on the callback's answer for a block `begin` made
    /// `Evicting` (from the `Live` header `current`).
    fn finish(&self, addr: u64, current: Header, decision: EvictDecision) -> EvictResult {
        match decision {
            EvictDecision::Evicted => self.reclaim(addr, true),
            EvictDecision::Busy => {
                let offset = self.region.offset_of(addr);
                // SAFETY: claimed and unreclaimed (we are its processor), so the word is
                // its header, accessed atomically only.
                let word = unsafe { self.region.header(offset) };
                let evicting = current.with_state(State::Evicting);
                if word
                    .compare_exchange(
                        evicting.0,
                        current.0,
                        RegionOrdering::AcqRel,
                        RegionOrdering::Acquire,
                    )
                    .is_ok()
                {
                    self.retry_later(addr)
                } else {
                    // Its client freed it meanwhile (now `Dead`): reclaim.
                    self.reclaim(addr, false)
                }
            }
        }
    }

    /// Puts a claimed block on the retry list.
    fn retry_later(&self, addr: u64) -> EvictResult {
        Counters::bump(&self.counters.busy_retries);
        let fresh = self.evict_state.lock().retry.insert(addr);
        debug_assert!(fresh, "block {addr} was on the retry list twice");
        EvictResult::Busy
    }

    /// Reclaims a block this thread processes (state `Evicting`, `Dead` or `Pad`): makes
    /// it `Dead` if it is not already, zeroes its payload, marks it `Reclaimed`, and
    /// advances the head. `was_live`: the callback answered `Evicted` for it.
    fn reclaim(&self, addr: u64, was_live: bool) -> EvictResult {
        let offset = self.region.offset_of(addr);
        // SAFETY: claimed and unreclaimed (we are its processor), so the word is its
        // header, accessed atomically only.
        let word = unsafe { self.region.header(offset) };
        // `Evicting → Dead` is the one point where a block leaves its client: whoever
        // wins it (the client's late `free`, or this thread) accounts for its bytes, and
        // does so before the bytes can be reused, so `bytes_in_use` never over-counts.
        let (header, evicted) = loop {
            let now = Header(word.load(RegionOrdering::Acquire));
            match now.state() {
                Some(State::Evicting) => {
                    if cas_state(word, now, State::Dead) {
                        break (now, was_live);
                    }
                }
                Some(State::Dead | State::Pad) => break (now, false),
                _ => panic!("reclaiming block at {addr} in state {now:?}"),
            }
        };
        let block_bytes = header.block_size_bytes();
        if evicted {
            Counters::bump(&self.counters.evictions);
            self.counters
                .bytes_in_use
                .fetch_sub(block_bytes, Ordering::Relaxed);
        }
        // SAFETY: the payload lies in the region (checked at claim), and nobody else
        // touches it: it is `Dead` or `Pad`, which only its processor (this thread)
        // changes, and its client gave it up. Zeroing keeps stale bytes from ever looking
        // like a header of a later lap.
        unsafe {
            self.region.zero(
                offset + HEADER_SIZE_BYTES,
                u64::from(header.payload_size_bytes()),
            )
        };
        // Release: the zeroing happens-before whoever sees `Reclaimed` (the head advancer,
        // and through the head every later allocator of this memory).
        word.store(
            header.with_state(State::Reclaimed).0,
            RegionOrdering::Release,
        );
        Counters::bump(&self.counters.reclaimed_blocks);
        self.advance_head();
        EvictResult::Reclaimed {
            block_bytes,
            evicted,
        }
    }

    /// Moves the head past every `Reclaimed` block at it, giving back the memory it
    /// passed when the limit is below the capacity (`release_behind`).
    fn advance_head(&self) {
        let _serial = self.head_lock.lock();
        // Only this mutex's holders write the head.
        let start = self.head.load(Ordering::Relaxed);
        let mut head = start;
        loop {
            if head >= self.evict_cursor.load(Ordering::Acquire) {
                break;
            }
            let offset = self.region.offset_of(head);
            // SAFETY: `head < evict_cursor`: the block at the head is claimed, so its
            // header was published; it is not reused because the tail stays within
            // `head + capacity` and only we move the head.
            let word = unsafe { self.region.header(offset) };
            let header = Header(word.load(RegionOrdering::Acquire));
            if header.state() != Some(State::Reclaimed) {
                break;
            }
            debug_assert_eq!(header.lap(), self.lap(head));
            // Zero the header too, so the whole block is zero again before the head
            // (Release) lets the tail reuse it.
            word.store(0, RegionOrdering::Relaxed);
            head += header.block_size_bytes();
            if self.limit_bytes.load(Ordering::Relaxed) == self.capacity_bytes {
                // Nothing is given back at the full capacity: let allocators in block by
                // block.
                self.head.store(head, Ordering::Release);
            }
        }
        if head != start && self.limit_bytes.load(Ordering::Relaxed) != self.capacity_bytes {
            self.release_behind(start, head);
            self.head.store(head, Ordering::Release);
        }
    }

    /// Gives back to the operating system the whole `RELEASE_CHUNK_BYTES` chunks of the
    /// region that lie in `[old_head, new_head)` now and did not before, where the tail
    /// cannot reach them again before the head has moved on. Called under the head lock
    /// before the head is stored as `new_head`.
    ///
    /// The bytes are zero already (reclaimers zeroed payloads, `advance_head` the
    /// headers), and `MADV_DONTNEED` on this private anonymous mapping keeps them zero,
    /// so the invariant "memory below the head is zero" holds either way and a failed
    /// call costs only memory. Nobody else touches them: they are below every claimed
    /// block, no free list holds them (free lists hold blocks at or above the evict
    /// cursor's start of reuse), and the tail reaches the same physical bytes only at
    /// logical address `chunk + capacity`. While we hold the lock the head stays at
    /// `old_head` and the limit stays put, so every tail an allocator can make is below
    /// `max(tail now, old_head + limit)`; a chunk is given back only if that bound is at
    /// or below `chunk + capacity`.
    fn release_behind(&self, old_head: u64, new_head: u64) {
        let cap = self.capacity_bytes;
        let limit = self.limit_bytes.load(Ordering::Relaxed);
        let reach = self.tail.load(Ordering::Acquire).max(old_head + limit);
        // Chunks are physical: `[k * CHUNK, (k + 1) * CHUNK)` below the capacity. One
        // that straddles `old_head` was not wholly behind the old head, so none of these
        // was given back before.
        let mut from = old_head - old_head % cap % RELEASE_CHUNK_BYTES;
        while from < new_head {
            let lap_end = from - from % cap + cap;
            let physical = from % cap;
            let end = new_head.min(lap_end);
            // Whole chunks within [from, end) in this lap.
            let chunks = (end - from) / RELEASE_CHUNK_BYTES;
            let mut first = from;
            // The earliest chunks are the ones the tail may have come round to.
            while first < from + chunks * RELEASE_CHUNK_BYTES && reach > first + cap {
                first += RELEASE_CHUNK_BYTES;
            }
            let bytes = from + chunks * RELEASE_CHUNK_BYTES - first;
            if bytes > 0 {
                // SAFETY: the range lies in the region (whole chunks below the
                // capacity) and is owned by nobody, as argued above.
                unsafe { self.region.release(physical + (first - from), bytes) };
                self.counters
                    .released_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
            }
            if end == lap_end {
                from = lap_end;
            } else {
                break;
            }
        }
    }
}

/// How `begin` left a claimed block.
enum Begun {
    /// Dealt with without the callback (reclaimed, or deferred to the retry list).
    Done(EvictResult),
    /// Now `Evicting` (from this `Live` header): the callback must answer for it.
    Callback(Header),
}

/// Puts blocks back to `Live` and on the retry list if the callback panics, so the
/// head is not stuck behind a block left `Evicting` forever.
struct RestoreOnUnwind<'a> {
    pool: &'a Pool,
    addrs: &'a [u64],
}

impl Drop for RestoreOnUnwind<'_> {
    fn drop(&mut self) {
        let pool = self.pool;
        for &addr in self.addrs {
            let offset = pool.region.offset_of(addr);
            // SAFETY: the block is ours (being processed), not reclaimed.
            let word = unsafe { pool.region.header(offset) };
            let now = Header(word.load(RegionOrdering::Acquire));
            // If the client freed it during the callback it is `Dead` instead; either
            // way the retry list picks it up again (a `Dead` block is reclaimed there).
            if now.state() == Some(State::Evicting) {
                let _ = word.compare_exchange(
                    now.0,
                    now.with_state(State::Live).0,
                    RegionOrdering::AcqRel,
                    RegionOrdering::Acquire,
                );
            }
            pool.evict_state.lock().retry.insert(addr);
        }
    }
}

/// `alloc`: free list or tail, evicting and retrying while full.
pub(super) fn alloc_evicting(
    pool: &Pool,
    class: usize,
    evictor: &dyn Evictor,
) -> Result<Block, AllocError> {
    let mut stalled = 0;
    for _ in 0..MAX_ALLOC_ATTEMPTS {
        if let Some(block) = pool.alloc_in_class(class) {
            return Ok(block);
        }
        // Reclaiming behind a busy head does not free tail room, but the eviction
        // window bounds how long that can go on before the steps stall.
        if pool.evict_many(EVICT_BATCH_BLOCKS, evictor) > 0 {
            stalled = 0;
        } else {
            stalled += 1;
            if stalled > MAX_STALLED_ATTEMPTS {
                break;
            }
            spin_wait(stalled);
        }
    }
    Counters::bump(&pool.counters.would_blocks);
    Err(AllocError::WouldBlock)
}
