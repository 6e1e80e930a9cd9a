//! The circular-buffer pool that holds mini-pages (Bf-Tree, section 4).
//!
//! One fixed memory region of `capacity_bytes` holds every block; nothing the pool hands
//! out lives anywhere else, so the pool never uses more memory than configured. The pool
//! knows nothing of what a block holds: the tree stores mini-pages in it and supplies the
//! eviction callback ([`Evictor`]).
//!
//! ## Addresses
//!
//! Blocks are placed at monotonically increasing *logical* addresses (`u64`, never
//! reused); the physical offset is `logical % capacity`. Four addresses split the
//! logical space, and always satisfy
//! `head <= second_chance <= tail`, `head <= evict_cursor <= tail`, `tail - head <= capacity`
//! (and, once allocations that began under a higher limit have ended, `tail - head <=
//! limit`: see [`Pool::set_limit_bytes`]):
//!
//! - `tail`: the next free logical address. Allocation bumps it with a CAS loop.
//! - `head`: the oldest block not yet reclaimed. Only blocks below it may be reused.
//! - `evict_cursor`: the next block to be claimed for eviction.
//! - `second_chance`: `max(head, tail - in-place bytes)`. Blocks below it are in the
//!   copy-on-access region ([`Pool::in_copy_on_access_region`]); the tree copies a
//!   mini-page found there to the tail when it touches it.
//!
//! ## Blocks
//!
//! Each block is an 8-byte header followed directly by its payload, 8-byte aligned,
//! with no gaps; a `Pad` block fills the end of a lap so no block wraps around the
//! region's physical end. Payload sizes are size classes from 64 bytes to
//! [`PoolConfig::max_block_size_bytes`], [`CLASSES_PER_DOUBLING`] to each doubling (64, 80,
//! 96, 112, 128, 160, ...), so a block is at most 25% larger than what was asked for. The header packs (payload size, state, lap);
//! every transition of it is a CAS on the whole word, which makes it ABA-safe across
//! laps. The full protocol and its correctness argument are in `docs/design.md` (the pool section).
//!
//! ## Invariants this module owns
//!
//! - Memory below `head` (physically: not between `head` and `tail`) is all zero bytes.
//! - A block is in a free list iff its state is `Free` (see the `freelist` module).
//! - Every claimed, unreclaimed block is either being processed by exactly one evicting
//!   thread or is on the retry list, exactly once; only that thread reclaims it.
//! - `head` moves only under the head lock, and only past `Reclaimed` blocks.

mod evict;
mod freelist;
mod header;
mod region;

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::Ordering as RegionOrdering;

use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU64, Ordering};

use evict::EvictState;
use freelist::FreeLists;
use header::{HEADER_SIZE_BYTES, Header, State};
use region::Region;

pub use evict::{DrainReport, EVICT_BATCH_BLOCKS, EvictResult};
pub use region::Backing;

/// The smallest payload size class, one cache line.
pub const MIN_BLOCK_SIZE_BYTES: u32 = 64;

/// Size classes between one power of two and the next (64, 80, 96, 112, then 128, 160,
/// ...): each class is at most 25% larger than the one below it. Powers of two alone
/// would leave a block up to half empty, and mini-pages of cached records are most of
/// what the pool holds, so the rounding is memory the cache loses.
pub const CLASSES_PER_DOUBLING: usize = 4;

/// The largest `max_block_size_bytes` the 24-bit header size field allows (a power of
/// two).
pub const MAX_MAX_BLOCK_SIZE_BYTES: u32 = 1 << 23;

/// The largest capacity: physical offsets must fit the mapping table's 48 bits.
pub const MAX_CAPACITY_BYTES: u64 = 1 << 48;

/// At most this many free-list entries near the head are dropped per pop.
const FREE_LIST_MAX_SKIPS: usize = 4;

/// Configuration of a [`Pool`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Size of the one memory region, in bytes: the pool's whole memory budget. A
    /// multiple of 8, at least twice the largest block plus its header.
    pub capacity_bytes: u64,
    /// Share of the capacity, nearest the head, that forms the copy-on-access region
    /// (0..=100; the paper's 10%).
    pub copy_on_access_percent: u8,
    /// Try explicit huge pages (`MAP_HUGETLB`) when the capacity is a multiple of 2 MiB,
    /// and otherwise (or if that fails) advise transparent huge pages. Falls back
    /// silently to normal pages.
    pub huge_pages: bool,
    /// The largest payload size class, a power of two from 64 to
    /// [`MAX_MAX_BLOCK_SIZE_BYTES`]. Default 4096: a mini-page grown to a full leaf page.
    pub max_block_size_bytes: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            capacity_bytes: 64 << 20,
            copy_on_access_percent: 10,
            huge_pages: true,
            max_block_size_bytes: 4096,
        }
    }
}

impl PoolConfig {
    /// A default configuration with the given capacity.
    pub fn with_capacity(capacity_bytes: u64) -> PoolConfig {
        PoolConfig {
            capacity_bytes,
            ..PoolConfig::default()
        }
    }

    /// Checks every field, returning [`PoolError::InvalidConfig`] for nonsense.
    pub fn validate(&self) -> Result<(), PoolError> {
        let bad = |what: String| Err(PoolError::InvalidConfig(what));
        let max = self.max_block_size_bytes;
        if !max.is_power_of_two()
            || !(MIN_BLOCK_SIZE_BYTES..=MAX_MAX_BLOCK_SIZE_BYTES).contains(&max)
        {
            return bad(format!(
                "pool max_block_size_bytes {max} must be a power of two in \
                 {MIN_BLOCK_SIZE_BYTES}..={MAX_MAX_BLOCK_SIZE_BYTES}"
            ));
        }
        if self.copy_on_access_percent > 100 {
            return bad(format!(
                "pool copy_on_access_percent {} exceeds 100",
                self.copy_on_access_percent
            ));
        }
        let cap = self.capacity_bytes;
        // Twice the largest block guarantees that an empty buffer can take any block even
        // when the tail sits just before the physical end and a pad is needed first.
        let min = 2 * (HEADER_SIZE_BYTES + u64::from(max));
        if !cap.is_multiple_of(8)
            || cap < min
            || cap > MAX_CAPACITY_BYTES
            || usize::try_from(cap).is_err()
        {
            return bad(format!(
                "pool capacity_bytes {cap} must be a multiple of 8 in {min}..={MAX_CAPACITY_BYTES} \
                 (at least twice the largest block with its header)"
            ));
        }
        Ok(())
    }
}

/// A block handed out by the pool: a small copyable handle to a payload in the region.
///
/// The handle does not keep the pool alive and does not own the memory: the client's
/// own locking (the tree's page lock) decides who may touch the payload, and the pool's
/// protocol decides when the memory is reused (never while the block is `Reserved` or
/// `Live`, except through the client's [`Pool::free`] or the eviction callback).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Block {
    addr: u64,
    offset: u64,
    payload: NonNull<u8>,
    size_bytes: u32,
}

// SAFETY: a `Block` is an address and a raw pointer; it grants no access by itself
// (every dereference goes through an `unsafe fn` whose contract the caller upholds), so
// moving or sharing the handle between threads is sound.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    /// The block's logical address (its header's), unique for the pool's lifetime.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The physical offset of the block's header in the region, below 2^48: what the
    /// mapping table stores. [`Pool::block_at`] turns it back into a handle.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The payload's size in bytes: the size class the request was rounded up to.
    pub fn size_bytes(&self) -> usize {
        self.size_bytes as usize
    }

    /// A raw pointer to the payload (8-byte aligned). Obtaining it is safe; using it is
    /// governed by [`Block::payload`] and [`Block::payload_mut`]'s contracts.
    pub fn payload_ptr(&self) -> *mut u8 {
        self.payload.as_ptr()
    }

    /// The payload as a shared slice.
    ///
    /// # Safety
    ///
    /// The pool must still be alive, the block must not have been freed or evicted, and
    /// the caller's own locking must guarantee that nobody writes the payload while the
    /// slice is alive.
    pub unsafe fn payload(&self) -> &[u8] {
        // SAFETY: the payload is `size_bytes` bytes inside the live mapping, and the
        // caller guarantees the block is allocated and not written concurrently.
        unsafe { std::slice::from_raw_parts(self.payload.as_ptr(), self.size_bytes()) }
    }

    /// The payload as an exclusive slice.
    ///
    /// # Safety
    ///
    /// The pool must still be alive, the block must not have been freed or evicted, and
    /// the caller's own locking must guarantee exclusive access to the payload while the
    /// slice is alive (no other slice or pointer use of it).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn payload_mut(&self) -> &mut [u8] {
        // SAFETY: as for `payload`, plus exclusivity, which the caller guarantees.
        unsafe { std::slice::from_raw_parts_mut(self.payload.as_ptr(), self.size_bytes()) }
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("addr", &self.addr)
            .field("offset", &self.offset)
            .field("size_bytes", &self.size_bytes)
            .finish()
    }
}

/// What the eviction callback decided about a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictDecision {
    /// The block's contents were dealt with (merged to its leaf page, mapping table
    /// pointed back at the leaf) and nobody will touch the block again: reclaim it.
    Evicted,
    /// The owner could not be locked right now (a try-lock failed). The block stays
    /// `Live` and is retried later.
    Busy,
}

/// The eviction callback, supplied by the pool's user (the tree).
///
/// It runs with the block in state `Evicting`: nobody can free it into a free list or be
/// handed it meanwhile. It must never block on a lock (the calling thread may already
/// hold page locks); it try-locks the owner and answers [`EvictDecision::Busy`] if that
/// fails. It may call [`Pool::free`] and [`Pool::try_alloc`], but should not call the
/// evicting entry points recursively. It must not panic; if it does, the block is put
/// back to `Live` and retried.
pub trait Evictor {
    /// Deals with `block`'s contents, or answers `Busy`.
    fn evict(&self, block: &Block) -> EvictDecision;

    /// Deals with several blocks at once (all `Evicting`, claimed in address order by
    /// one thread), answering for each in order. The pool calls it from
    /// [`Pool::evict_many`], so an evictor can batch the IO of several evictions. The
    /// same rules as for [`Evictor::evict`] apply. The default evicts them one by one.
    fn evict_batch(&self, blocks: &[Block]) -> Vec<EvictDecision> {
        blocks.iter().map(|b| self.evict(b)).collect()
    }
}

impl<F: Fn(&Block) -> EvictDecision> Evictor for F {
    fn evict(&self, block: &Block) -> EvictDecision {
        self(block)
    }
}

/// Why an allocation did not return a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// The request exceeds the largest size class.
    TooLarge {
        /// The requested payload size.
        size_bytes: usize,
        /// The largest payload size the pool hands out.
        max_bytes: usize,
    },
    /// The buffer is full and the caller asked not to evict ([`Pool::try_alloc`]).
    Full,
    /// Room could not be made because the blocks at the head are busy (their owners are
    /// locked, possibly by the caller). Drop your page locks and restart the operation.
    WouldBlock,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::TooLarge {
                size_bytes,
                max_bytes,
            } => write!(
                f,
                "block of {size_bytes} bytes exceeds the largest class of {max_bytes} bytes"
            ),
            AllocError::Full => write!(f, "the circular buffer is full"),
            AllocError::WouldBlock => write!(f, "eviction is blocked by busy blocks; restart"),
        }
    }
}

impl std::error::Error for AllocError {}

/// Why [`Pool::new`] could not make a pool.
///
/// The pool's own error type, so that the pool depends on nothing of the crate but its
/// `sync` shim; `bfdb::Error` converts from it (`InvalidConfig` to `InvalidConfig`, `Map`
/// to `Io` of the same [`io::ErrorKind`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum PoolError {
    /// A field of the [`PoolConfig`] is out of range; the message names the field and
    /// the range it must lie in.
    InvalidConfig(String),
    /// The operating system refused to map the region.
    Map {
        /// The size of the region that was asked for.
        capacity_bytes: u64,
        /// What `mmap` reported.
        source: io::Error,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::InvalidConfig(what) => write!(f, "invalid configuration: {what}"),
            PoolError::Map {
                capacity_bytes,
                source,
            } => write!(
                f,
                "cannot map the pool's memory region of {capacity_bytes} bytes: {source}"
            ),
        }
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::InvalidConfig(_) => None,
            PoolError::Map { source, .. } => Some(source),
        }
    }
}

/// A snapshot of the pool's counters. Each field is read separately, so fields may be
/// from slightly different instants under concurrency.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks handed out from a free list.
    pub allocs_from_free_list: u64,
    /// Blocks handed out from the tail.
    pub allocs_from_tail: u64,
    /// Blocks freed by clients.
    pub frees: u64,
    /// `Live` blocks reclaimed after the callback answered `Evicted`.
    pub evictions: u64,
    /// Blocks of any kind (evicted, free, dead, pad) reclaimed by evictors.
    pub reclaimed_blocks: u64,
    /// Times a claimed block was busy (callback `Busy`, or still `Reserved`).
    pub busy_retries: u64,
    /// Allocations that returned [`AllocError::WouldBlock`].
    pub would_blocks: u64,
    /// Bytes (headers included) of blocks currently handed out: `Reserved` or `Live`.
    pub bytes_in_use: u64,
    /// How far the tail has moved since the pool was made: every block and pad ever
    /// handed out from the tail. Below the capacity, the pool is on its first lap.
    pub tail_bytes: u64,
    /// Bytes of the region given back to the operating system behind the head while
    /// the limit was below the capacity ([`Pool::set_limit_bytes`]).
    pub released_bytes: u64,
}

/// The pool's addresses at one moment (loaded head first, so the inequalities hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addresses {
    /// The oldest block not yet reclaimed.
    pub head: u64,
    /// Below this address blocks are in the copy-on-access region.
    pub second_chance: u64,
    /// The next block to be claimed for eviction.
    pub evict_cursor: u64,
    /// The next free logical address.
    pub tail: u64,
}

#[derive(Default)]
struct Counters {
    allocs_from_free_list: AtomicU64,
    allocs_from_tail: AtomicU64,
    frees: AtomicU64,
    evictions: AtomicU64,
    reclaimed_blocks: AtomicU64,
    busy_retries: AtomicU64,
    would_blocks: AtomicU64,
    bytes_in_use: AtomicU64,
    released_bytes: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The circular buffer. `Send + Sync`; share it by reference or `Arc`.
pub struct Pool {
    region: Region,
    capacity_bytes: u64,
    /// Bytes the blocks may span, `tail - head` (at most the capacity; see
    /// [`Pool::set_limit_bytes`]). Written under the head lock only.
    limit_bytes: AtomicU64,
    /// Share of the limit, nearest the head, in the copy-on-access region
    /// (`in_place_bytes` derives the rest from the limit).
    copy_on_access_percent: u8,
    max_block_size_bytes: u32,
    tail: AtomicU64,
    head: AtomicU64,
    evict_cursor: AtomicU64,
    /// Serialises claims (writes of `evict_cursor`) and guards the retry list.
    evict_state: Mutex<EvictState>,
    /// Serialises head movement and changes of the limit.
    head_lock: Mutex<()>,
    free_lists: FreeLists,
    counters: Counters,
}

impl Pool {
    /// Maps the region and creates an empty pool.
    pub fn new(config: PoolConfig) -> Result<Pool, PoolError> {
        config.validate()?;
        let capacity_bytes = config.capacity_bytes;
        // `validate` checked the capacity fits a usize.
        let region = Region::map(capacity_bytes as usize, config.huge_pages).map_err(|source| {
            PoolError::Map {
                capacity_bytes,
                source,
            }
        })?;
        let classes = class_of(config.max_block_size_bytes as usize) + 1;
        Ok(Pool {
            region,
            capacity_bytes,
            limit_bytes: AtomicU64::new(capacity_bytes),
            copy_on_access_percent: config.copy_on_access_percent,
            max_block_size_bytes: config.max_block_size_bytes,
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            evict_cursor: AtomicU64::new(0),
            evict_state: Mutex::new(EvictState::default()),
            head_lock: Mutex::new(()),
            free_lists: FreeLists::new(classes),
            counters: Counters::default(),
        })
    }

    /// The region's size in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Bytes the pool's blocks may span now (`tail - head`): the capacity unless
    /// [`Pool::set_limit_bytes`] lowered it.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes.load(Ordering::Acquire)
    }

    /// The smallest limit: twice the largest block with its header, so an empty pool
    /// can always take any block (a pad may come first at the region's end).
    pub fn min_limit_bytes(&self) -> u64 {
        2 * (HEADER_SIZE_BYTES + u64::from(self.max_block_size_bytes))
    }

    /// Sets how many bytes the blocks may span, clamped to
    /// `min_limit_bytes()..=capacity`; returns the limit set. A database lowers it when a
    /// hash keyspace takes its memory out of the budget the pool was sized for, and
    /// raises it again when the keyspace goes.
    ///
    /// A lower limit takes effect at once for new allocations (they evict until `tail -
    /// head` is within it); allocations that had already passed the old limit's check
    /// may still end above it. Memory the pool no longer spans is given back to the
    /// operating system as the head passes it (`madvise(MADV_DONTNEED)` of whole 2 MiB
    /// chunks behind the head), so within one turn of the buffer the region's resident
    /// memory follows the limit. At the full capacity nothing is given back and a turn
    /// of the buffer costs no page faults.
    pub fn set_limit_bytes(&self, bytes: u64) -> u64 {
        let limit = bytes.clamp(self.min_limit_bytes(), self.capacity_bytes);
        let _serial = self.head_lock.lock();
        self.limit_bytes.store(limit, Ordering::Release);
        limit
    }

    /// The largest payload the pool hands out.
    pub fn max_block_size_bytes(&self) -> usize {
        self.max_block_size_bytes as usize
    }

    /// How the region's memory was obtained.
    pub fn backing(&self) -> Backing {
        self.region.backing()
    }

    /// The payload size class a request of `size_bytes` is rounded up to.
    pub fn class_size_bytes(&self, size_bytes: usize) -> Result<usize, AllocError> {
        self.class_of(size_bytes)
            .map(|class| class_size_bytes(class) as usize)
    }

    /// Allocates a block of at least `size_bytes`, evicting from the head through
    /// `evictor` when the buffer is full.
    ///
    /// The block comes back `Reserved`: initialise its payload, then [`Pool::publish`]
    /// it once it is reachable (or [`Pool::free`] it). Its payload bytes are
    /// unspecified. Returns [`AllocError::WouldBlock`] after a bounded number of
    /// attempts when every block that could make room is busy; the caller then drops its
    /// page locks and restarts.
    pub fn alloc(&self, size_bytes: usize, evictor: &dyn Evictor) -> Result<Block, AllocError> {
        let class = self.class_of(size_bytes)?;
        evict::alloc_evicting(self, class, evictor)
    }

    /// Allocates without evicting: [`AllocError::Full`] if neither a free list nor the
    /// tail has room.
    pub fn try_alloc(&self, size_bytes: usize) -> Result<Block, AllocError> {
        let class = self.class_of(size_bytes)?;
        self.alloc_in_class(class).ok_or(AllocError::Full)
    }

    /// Marks a `Reserved` block `Live`: its payload is initialised and it is reachable,
    /// so it may now be evicted through the callback.
    ///
    /// # Safety
    ///
    /// `block` must have been returned by this pool's `alloc`/`try_alloc` and not yet
    /// published or freed. (A violation is detected by an assertion as long as the
    /// block has not been reclaimed; after that the header word may be another block's
    /// payload, which is why this is not a safe function.)
    pub unsafe fn publish(&self, block: &Block) {
        self.check_handle(block);
        let reserved = Header::new(block.size_bytes, State::Reserved, self.lap(block.addr));
        // SAFETY: the block is allocated and unreclaimed (caller), so its header word is
        // only accessed atomically.
        let word = unsafe { self.region.header(block.offset) };
        let result = word.compare_exchange(
            reserved.0,
            reserved.with_state(State::Live).0,
            RegionOrdering::AcqRel,
            RegionOrdering::Acquire,
        );
        assert!(
            result.is_ok(),
            "publish of {block:?} whose header is {:?}, not Reserved",
            Header(result.unwrap_or_else(|w| w))
        );
    }

    /// Returns a block to the pool.
    ///
    /// A block in the in-place region goes on its size class's free list; one in the
    /// copy-on-access region (or already claimed by an evictor) is marked `Dead` and left
    /// for the evictor, since it is about to be reclaimed anyway. Never waits.
    ///
    /// # Safety
    ///
    /// `block` must have been returned by this pool's `alloc`/`try_alloc`, must not have
    /// been freed already or evicted (callback answered `Evicted`), and nobody may
    /// access its payload after this call.
    pub unsafe fn free(&self, block: Block) {
        self.check_handle(&block);
        let class = self
            .class_of(block.size_bytes())
            .expect("a handed-out block has a class");
        // SAFETY: allocated and unreclaimed (caller): its header is accessed atomically only.
        let word = unsafe { self.region.header(block.offset) };
        // Account first: once the header changes below, the bytes may be reused, and
        // `bytes_in_use` must never count them twice.
        self.counters.bytes_in_use.fetch_sub(
            HEADER_SIZE_BYTES + u64::from(block.size_bytes),
            Ordering::Relaxed,
        );
        Counters::bump(&self.counters.frees);
        loop {
            let current = Header(word.load(RegionOrdering::Acquire));
            assert!(
                current.lap() == self.lap(block.addr)
                    && current.payload_size_bytes() == block.size_bytes,
                "free of {block:?} whose header {current:?} belongs to another block"
            );
            let freed = match current.state() {
                Some(State::Reserved | State::Live) => {
                    if block.addr >= self.reusable_from() {
                        // SAFETY: unreclaimed (caller); nobody touches the payload after
                        // this call (caller), so the list may keep its links there.
                        unsafe {
                            self.free_lists
                                .push(&self.region, class, block.addr, current)
                        }
                    } else {
                        cas(word, current, State::Dead)
                    }
                }
                // An evictor holds the block: leave it to that evictor, never to a list
                // (its callback may still be reading the payload). Winning this CAS also
                // tells the evictor the bytes were already accounted for here.
                Some(State::Evicting) => cas(word, current, State::Dead),
                other => panic!("free of {block:?} in state {other:?} (double free?)"),
            };
            if freed {
                return;
            }
        }
    }

    /// Turns a physical header offset (from [`Block::offset`]) back into a handle,
    /// validated against the header: `None` if no allocated (`Reserved`, `Live` or
    /// `Evicting`) block of this pool's current window starts there.
    ///
    /// # Safety
    ///
    /// `offset` must have been taken from a block of this pool that has not been freed
    /// or evicted since (for example read from the mapping table under the page lock).
    /// Otherwise the word at `offset` may be a concurrently written payload.
    pub unsafe fn block_at(&self, offset: u64) -> Option<Block> {
        let cap = self.capacity_bytes;
        if !offset.is_multiple_of(8)
            || offset + HEADER_SIZE_BYTES + u64::from(MIN_BLOCK_SIZE_BYTES) > cap
        {
            return None;
        }
        // An unreclaimed block lies in [head, head + capacity), where exactly one logical
        // address has this physical offset.
        let head = self.head.load(Ordering::Acquire);
        let lap_start = head - head % cap;
        let addr = if offset >= head % cap {
            lap_start + offset
        } else {
            lap_start + cap + offset
        };
        // SAFETY: the caller guarantees the word is the header of an allocated block.
        let header = unsafe { self.region.load_header(offset) };
        let allocated = matches!(
            header.state(),
            Some(State::Reserved | State::Live | State::Evicting)
        );
        let size = header.payload_size_bytes();
        let valid = allocated
            && header.lap() == self.lap(addr)
            && (MIN_BLOCK_SIZE_BYTES..=self.max_block_size_bytes).contains(&size)
            && class_size_bytes(class_of(size as usize)) == size
            && offset + header.block_size_bytes() <= cap
            && addr < self.tail.load(Ordering::Acquire);
        valid.then(|| self.handle(addr, size))
    }

    /// True if `block` lies in the copy-on-access region (below the second-chance
    /// address) or has already been claimed by an evictor. The tree copies such a
    /// mini-page to the tail when it accesses it, so hot mini-pages never reach the head.
    pub fn in_copy_on_access_region(&self, block: &Block) -> bool {
        block.addr < self.reusable_from()
    }

    /// The current addresses (loaded head, cursor, tail in that order, so that
    /// `head <= second_chance <= tail` and `head <= evict_cursor <= tail` hold).
    pub fn addresses(&self) -> Addresses {
        let head = self.head.load(Ordering::Acquire);
        let evict_cursor = self.evict_cursor.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        Addresses {
            head,
            second_chance: head.max(tail.saturating_sub(self.in_place_bytes())),
            evict_cursor,
            tail,
        }
    }

    /// Room at the tail, `limit - (tail - head)`: what allocations past the free
    /// lists can take before someone must evict. A snapshot (the head is loaded first,
    /// so under concurrent eviction it can only understate the room).
    pub fn tail_room_bytes(&self) -> u64 {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        self.limit_bytes().saturating_sub(tail.saturating_sub(head))
    }

    /// Bytes of blocks handed out and not yet freed or evicted, headers included (the
    /// `bytes_in_use` of [`Pool::stats`], alone: one load).
    pub fn bytes_in_use(&self) -> u64 {
        self.counters.bytes_in_use.load(Ordering::Relaxed)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PoolStats {
            allocs_from_free_list: get(&c.allocs_from_free_list),
            allocs_from_tail: get(&c.allocs_from_tail),
            frees: get(&c.frees),
            evictions: get(&c.evictions),
            reclaimed_blocks: get(&c.reclaimed_blocks),
            busy_retries: get(&c.busy_retries),
            would_blocks: get(&c.would_blocks),
            bytes_in_use: get(&c.bytes_in_use),
            tail_bytes: self.tail.load(Ordering::Acquire),
            released_bytes: get(&c.released_bytes),
        }
    }

    // ---- internals -------------------------------------------------------------

    /// The size class index of a request.
    fn class_of(&self, size_bytes: usize) -> Result<usize, AllocError> {
        if size_bytes > self.max_block_size_bytes as usize {
            return Err(AllocError::TooLarge {
                size_bytes,
                max_bytes: self.max_block_size_bytes as usize,
            });
        }
        Ok(class_of(size_bytes))
    }

    /// How far below the tail the in-place region reaches: the limit less its
    /// copy-on-access share.
    fn in_place_bytes(&self) -> u64 {
        let limit = self.limit_bytes();
        // At most 2^48 * 100, far from overflowing.
        limit - limit * u64::from(self.copy_on_access_percent) / 100
    }

    /// Bytes the evict cursor may run ahead of the head (bounds eviction behind a stuck
    /// head): a quarter of the limit.
    pub(super) fn evict_window_bytes(&self) -> u64 {
        self.limit_bytes() / 4
    }

    /// The lap of a logical address, truncated to the header's 32 bits on purpose.
    fn lap(&self, addr: u64) -> u32 {
        (addr / self.capacity_bytes) as u32
    }

    /// Blocks below this address are not worth reusing from a free list: they are in
    /// the copy-on-access region or already claimed by an evictor.
    fn reusable_from(&self) -> u64 {
        let a = self.addresses();
        a.second_chance.max(a.evict_cursor)
    }

    /// A handle for the block at logical `addr` with payload `size_bytes`.
    fn handle(&self, addr: u64, size_bytes: u32) -> Block {
        let offset = self.region.offset_of(addr);
        Block {
            addr,
            offset,
            payload: self.region.ptr_at(offset + HEADER_SIZE_BYTES),
            size_bytes,
        }
    }

    /// Asserts that a handle's fields are consistent with this pool.
    fn check_handle(&self, block: &Block) {
        assert!(
            block.offset == self.region.offset_of(block.addr)
                && block.payload == self.region.ptr_at(block.offset + HEADER_SIZE_BYTES)
                && block.offset + HEADER_SIZE_BYTES + u64::from(block.size_bytes)
                    <= self.capacity_bytes,
            "{block:?} does not belong to this pool"
        );
    }

    /// Free list of `class` first, else the tail. `None` if both are out of room.
    fn alloc_in_class(&self, class: usize) -> Option<Block> {
        let payload_bytes = class_size_bytes(class);
        // SAFETY: the lists hold blocks of this pool's region only.
        let popped = unsafe {
            self.free_lists.pop(
                &self.region,
                class,
                self.reusable_from(),
                FREE_LIST_MAX_SKIPS,
            )
        };
        let block = if let Some((addr, header)) = popped {
            debug_assert_eq!(header.payload_size_bytes(), payload_bytes);
            Counters::bump(&self.counters.allocs_from_free_list);
            self.handle(addr, payload_bytes)
        } else {
            let block = self.alloc_from_tail(payload_bytes)?;
            Counters::bump(&self.counters.allocs_from_tail);
            block
        };
        self.counters.bytes_in_use.fetch_add(
            HEADER_SIZE_BYTES + u64::from(payload_bytes),
            Ordering::Relaxed,
        );
        Some(block)
    }

    /// Bumps the tail by one block (after a pad if the block would cross the region's
    /// physical end). `None` if that would take `tail - head` above the limit.
    fn alloc_from_tail(&self, payload_bytes: u32) -> Option<Block> {
        let cap = self.capacity_bytes;
        let block_bytes = HEADER_SIZE_BYTES + u64::from(payload_bytes);
        let (start, pad_bytes) = loop {
            // Head first: `head <= tail` then holds between the two loads (each is
            // monotonic and the head never passes a tail value it did not observe).
            let head = self.head.load(Ordering::Acquire);
            let tail = self.tail.load(Ordering::Acquire);
            let offset = tail % cap;
            let pad_bytes = if offset + block_bytes > cap {
                cap - offset
            } else {
                0
            };
            let new_tail = tail + pad_bytes + block_bytes;
            debug_assert!(head <= tail);
            if new_tail - head > self.limit_bytes() {
                return None;
            }
            if self
                .tail
                .compare_exchange_weak(tail, new_tail, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break (tail, pad_bytes);
            }
        };
        // [start, start + pad + block) maps onto memory of the previous lap below the head
        // we loaded, which the reclaimers zeroed before the head moved past it (their
        // writes happen-before our Acquire load of the head). So each header word below is
        // still zero, which evictors read as "allocation in flight", until these stores.
        if pad_bytes > 0 {
            let pad = Header::new(
                (pad_bytes - HEADER_SIZE_BYTES) as u32,
                State::Pad,
                self.lap(start),
            );
            // SAFETY: in bounds and 8-aligned; the word is a fresh header position whose
            // earlier non-atomic accesses happen-before the head load above.
            unsafe { self.region.header(self.region.offset_of(start)) }
                .store(pad.0, RegionOrdering::Release);
        }
        let addr = start + pad_bytes;
        let header = Header::new(payload_bytes, State::Reserved, self.lap(addr));
        // SAFETY: as for the pad header.
        unsafe { self.region.header(self.region.offset_of(addr)) }
            .store(header.0, RegionOrdering::Release);
        Some(self.handle(addr, payload_bytes))
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("capacity_bytes", &self.capacity_bytes)
            .field("backing", &self.backing())
            .field("addresses", &self.addresses())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The payload size of size class `class`: class `CLASSES_PER_DOUBLING * d + r` is
/// `64 << d` plus `r` quarters of it.
fn class_size_bytes(class: usize) -> u32 {
    let doublings = class / CLASSES_PER_DOUBLING;
    let steps = (class % CLASSES_PER_DOUBLING) as u32;
    let base = MIN_BLOCK_SIZE_BYTES << doublings;
    base + steps * (base / CLASSES_PER_DOUBLING as u32)
}

/// The smallest size class whose payload holds `size_bytes` (no upper bound check).
fn class_of(size_bytes: usize) -> usize {
    let size = size_bytes.max(MIN_BLOCK_SIZE_BYTES as usize);
    // The power of two at or below `size`, as doublings of the smallest class.
    let doublings = (size.ilog2() - MIN_BLOCK_SIZE_BYTES.ilog2()) as usize;
    let base = (MIN_BLOCK_SIZE_BYTES as usize) << doublings;
    let step = base / CLASSES_PER_DOUBLING;
    // Steps above the base, rounded up; a full doubling's worth lands on the next base.
    let steps = (size - base).div_ceil(step);
    CLASSES_PER_DOUBLING * doublings + steps
}

/// CAS of a header word from `current` to the same block in state `to`.
fn cas(word: &std::sync::atomic::AtomicU64, current: Header, to: State) -> bool {
    word.compare_exchange(
        current.0,
        current.with_state(to).0,
        RegionOrdering::AcqRel,
        RegionOrdering::Acquire,
    )
    .is_ok()
}

// The unit tests use the pool outside a shuttle scheduler, so they run without the
// `shuttle` feature only; `tests/pool.rs` has the shuttle test.
#[cfg(all(test, not(feature = "shuttle")))]
mod tests;
