//! A simulated, fault-injecting page store for tests: seeded and deterministic.
//!
//! It keeps two images of every page: the *live* bytes (what reads see) and the *durable*
//! bytes (what survived the last `sync`), and the same two copies of the allocation state.
//! Faults are armed by the test:
//!
//! - [`SimStore::arm`] (and [`SimBlocks::arm`], [`SimLog::arm`](super::SimLog::arm)):
//!   the operation of one kind ([`SimOp`]: read, write, sync) after the next `n` of that
//!   kind fails, as [`SimFault`] says: `Transient` (`EIO` on that one call, later ones
//!   succeed), `Permanent` (`EIO` on it and every later one until
//!   [`SimStore::clear_faults`]: a failing medium), or `Full` (`StorageFull`, ENOSPC, on
//!   it and every later one: a full device). [`SimStore::fail_reads_after`],
//!   [`SimStore::fail_writes_after`] and [`SimStore::fail_syncs_after`] arm a permanent
//!   one. A failed write or sync poisons the store whatever the fault, as a real file
//!   store does (`FileStore`, `DirLog`: Linux may have dropped the dirty pages of a
//!   failed writeback, and a write refused for space may have reached part of its
//!   range): later writes are refused. A failed read changes nothing.
//! - [`SimStore::flip_bit`]: corrupts a page in both images, as media rot would.
//! - [`SimStore::crash`]: returns the store a restarted process would find. Every write
//!   since the last sync is, by the seeded coin, lost, kept, or *torn* — a random number
//!   of its 512-byte sectors new, the rest old — as a power cut during writeback leaves it.
//!
//! Page numbers start at 0, like [`MemoryStore`](super::MemoryStore). Pages are stamped and
//! verified exactly like the other stores, so a torn or flipped page reads as
//! `CorruptPage`.

use std::collections::{BTreeSet, HashMap};
use std::io;

use super::{
    PAGE_SIZE, Page, PageKind, PageNo, PageStore, SECTOR_BYTES, StoreStats, not_allocated,
};
use crate::sync::Mutex;

/// Allocation state: the next never-used page and the free slots.
#[derive(Clone, Debug, Default)]
struct Allocation {
    next: u64,
    free: BTreeSet<u64>,
}

impl Allocation {
    fn is_allocated(&self, no: u64) -> bool {
        no < self.next && !self.free.contains(&no)
    }
}

/// The kind of operation a fault of a simulated device is armed on.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimOp {
    /// Reads (page reads, block reads, log segment reads).
    Read,
    /// Writes (page writes, block writes, log segment writes).
    Write,
    /// Syncs (`fdatasync`).
    Sync,
}

/// What an armed fault of a simulated device does when it fires.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// `EIO` on that call only; later calls of its kind succeed (a glitch: a bus reset,
    /// a command the device retried).
    Transient,
    /// `EIO` on that call and every later one of its kind until the faults are cleared
    /// (a failing medium).
    Permanent,
    /// `StorageFull` (ENOSPC) on that call and every later one of its kind until the
    /// faults are cleared (a full device). On reads it is `Permanent`: a full device
    /// reads.
    Full,
}

/// One armed fault: fire after `remaining` more operations of its kind.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Countdown {
    remaining: Option<u64>,
    fault: SimFault,
}

impl Default for Countdown {
    fn default() -> Countdown {
        Countdown {
            remaining: None,
            fault: SimFault::Permanent,
        }
    }
}

impl Countdown {
    /// A fault firing after `n` more operations.
    pub(crate) fn after(n: u64, fault: SimFault) -> Countdown {
        Countdown {
            remaining: Some(n),
            fault,
        }
    }

    /// Counts one operation; the error it fails with if it must fail. A transient
    /// fault disarms itself as it fires.
    pub(crate) fn tick(&mut self, op: SimOp, what: impl FnOnce() -> String) -> Option<io::Error> {
        match &mut self.remaining {
            None => None,
            Some(0) => {
                let full = self.fault == SimFault::Full && op != SimOp::Read;
                if self.fault == SimFault::Transient {
                    self.remaining = None;
                }
                let what = what();
                Some(if full {
                    io::Error::new(
                        io::ErrorKind::StorageFull,
                        format!("simulated ENOSPC (no space left on device) on {what}"),
                    )
                } else {
                    eio(&what)
                })
            }
            Some(n) => {
                *n -= 1;
                None
            }
        }
    }
}

/// The faults armed on a simulated device, one per kind of operation.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    reads: Countdown,
    writes: Countdown,
    syncs: Countdown,
}

impl Faults {
    /// Arms `fault` on `op` after the next `n` (replacing what was armed on `op`).
    pub(crate) fn arm(&mut self, op: SimOp, n: u64, fault: SimFault) {
        *self.of(op) = Countdown::after(n, fault);
    }

    /// The countdown of `op`.
    pub(crate) fn of(&mut self, op: SimOp) -> &mut Countdown {
        match op {
            SimOp::Read => &mut self.reads,
            SimOp::Write => &mut self.writes,
            SimOp::Sync => &mut self.syncs,
        }
    }

    /// Counts one `op`; the error it fails with if an armed fault fires.
    pub(crate) fn tick(&mut self, op: SimOp, what: impl FnOnce() -> String) -> Option<io::Error> {
        self.of(op).tick(op, what)
    }
}

#[derive(Debug)]
struct State {
    rng: u64,
    live: HashMap<u64, Box<Page>>,
    durable: HashMap<u64, Box<Page>>,
    live_alloc: Allocation,
    durable_alloc: Allocation,
    /// Pages written since the last sync, in order.
    unsynced: Vec<u64>,
    faults: Faults,
    poisoned: Option<String>,
    counts: SimCounts,
    /// The file's name in its [`SimPages`], for error messages.
    name: String,
}

/// What a [`SimStore`] has been asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimCounts {
    /// Successful page reads.
    pub reads: u64,
    /// Successful page writes.
    pub writes: u64,
    /// Successful syncs.
    pub syncs: u64,
    /// Operations failed by an armed fault.
    pub injected_failures: u64,
}

/// A seeded, deterministic, fault-injecting [`PageStore`] for tests.
///
/// ```
/// use bfdb::storage::{Page, PageStore, SimStore};
///
/// let store = SimStore::new(42);
/// let no = store.allocate()?;
/// let mut page = Page::zeroed();
/// store.write_page(no, &mut page)?;
/// store.fail_reads_after(0);
/// assert!(store.read_page(no, &mut page).is_err());
/// store.clear_faults();
/// store.read_page(no, &mut page)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct SimStore {
    state: Mutex<State>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO (input/output error) on {what}"))
}

impl SimStore {
    /// An empty store whose random choices follow `seed`.
    pub fn new(seed: u64) -> SimStore {
        SimStore {
            state: Mutex::new(State {
                rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                live: HashMap::new(),
                durable: HashMap::new(),
                live_alloc: Allocation::default(),
                durable_alloc: Allocation::default(),
                unsynced: Vec::new(),
                faults: Faults::default(),
                poisoned: None,
                counts: SimCounts::default(),
                name: "a simulated page store".into(),
            }),
        }
    }

    /// `SimStore::new`, its errors naming file `name`.
    fn named(seed: u64, name: &str) -> SimStore {
        let store = SimStore::new(seed);
        store.state.lock().name = name.to_string();
        store
    }

    /// Arms `fault` on the `op` after the next `n` (replacing what was armed on `op`).
    #[doc(hidden)]
    pub fn arm(&self, op: SimOp, n: u64, fault: SimFault) {
        self.state.lock().faults.arm(op, n, fault);
    }

    /// The read after the next `n` reads fails with `EIO`, and so does every later one
    /// until [`SimStore::clear_faults`].
    pub fn fail_reads_after(&self, n: u64) {
        self.arm(SimOp::Read, n, SimFault::Permanent);
    }

    /// The write after the next `n` writes fails with `EIO` (and poisons the store).
    pub fn fail_writes_after(&self, n: u64) {
        self.arm(SimOp::Write, n, SimFault::Permanent);
    }

    /// The sync after the next `n` syncs fails with `EIO` (and poisons the store).
    pub fn fail_syncs_after(&self, n: u64) {
        self.arm(SimOp::Sync, n, SimFault::Permanent);
    }

    /// Disarms every fault. Does not lift poisoning: a real store must be reopened.
    pub fn clear_faults(&self) {
        self.state.lock().faults = Faults::default();
    }

    /// Flips bit `bit` (0..32768) of page `no` in both images. Returns whether the page
    /// held bytes.
    pub fn flip_bit(&self, no: PageNo, bit: usize) -> bool {
        let mut s = self.state.lock();
        let (byte, mask) = ((bit / 8) % PAGE_SIZE, 1u8 << (bit % 8));
        let mut hit = false;
        if let Some(p) = s.live.get_mut(&no.0) {
            p.as_bytes_mut()[byte] ^= mask;
            hit = true;
        }
        if let Some(p) = s.durable.get_mut(&no.0) {
            p.as_bytes_mut()[byte] ^= mask;
            hit = true;
        }
        hit
    }

    /// What a process restarted after a power cut would find: the synced state, plus each
    /// write since the last sync lost, kept or torn by the seeded coin. Faults are not
    /// carried over; the returned store is not poisoned.
    pub fn crash(&self) -> SimStore {
        let mut s = self.state.lock();
        let mut pages = s.durable.clone();
        let unsynced = std::mem::take(&mut s.unsynced);
        for no in unsynced {
            let Some(new) = s.live.get(&no).cloned() else {
                continue;
            };
            match next_random(&mut s.rng) % 3 {
                0 => {}
                1 => {
                    pages.insert(no, new);
                }
                _ => {
                    let sectors = PAGE_SIZE / SECTOR_BYTES;
                    let kept = 1 + (next_random(&mut s.rng) as usize % (sectors - 1));
                    let mut torn = pages.get(&no).cloned().unwrap_or_else(Page::boxed);
                    torn.as_bytes_mut()[..kept * SECTOR_BYTES]
                        .copy_from_slice(&new.as_bytes()[..kept * SECTOR_BYTES]);
                    pages.insert(no, torn);
                }
            }
        }
        let alloc = s.durable_alloc.clone();
        let seed = next_random(&mut s.rng);
        let crashed = SimStore::named(seed, &s.name);
        {
            let mut c = crashed.state.lock();
            c.live = pages.clone();
            c.durable = pages;
            c.live_alloc = alloc.clone();
            c.durable_alloc = alloc;
        }
        crashed
    }

    /// Counts of what the store did so far.
    pub fn counts(&self) -> SimCounts {
        self.state.lock().counts
    }
}

impl super::SlotStore for SimStore {
    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn set_allocated(&self, live: &BTreeSet<u64>) -> io::Result<()> {
        let mut s = self.state.lock();
        s.check_poison()?;
        let next = s.live_alloc.next.max(live.last().map_or(0, |&no| no + 1));
        let free = (0..next).filter(|no| !live.contains(no)).collect();
        s.live_alloc = Allocation { next, free };
        Ok(())
    }
}

/// The bytes of one block of a [`SimBlocks`].
type Block = Box<[u8; BLOCK_BYTES]>;

/// Bytes of a [`SimBlocks`] block: the unit of its writes and reads.
pub const BLOCK_BYTES: usize = 4096;

#[derive(Debug)]
struct BlocksState {
    rng: u64,
    live: HashMap<u64, Block>,
    durable: HashMap<u64, Block>,
    /// Blocks written since the last sync, in order.
    unsynced: Vec<u64>,
    /// Blocks below this were given up.
    discarded_below: u64,
    faults: Faults,
    poisoned: Option<String>,
    /// The file's name in its [`SimPages`], for error messages.
    name: String,
    /// Operations failed by an armed fault.
    injected: u64,
}

/// A simulated file of raw, unchecksummed 4 KiB blocks (a hash log's segment files),
/// with the crash semantics of [`SimStore`]: a live and a durable image, and
/// [`SimBlocks::crash`] losing, keeping or tearing (at 512-byte sectors) each block
/// written since the last sync.
#[derive(Debug)]
pub struct SimBlocks {
    state: Mutex<BlocksState>,
}

impl SimBlocks {
    /// An empty file whose crashes follow `seed`.
    pub fn new(seed: u64) -> SimBlocks {
        SimBlocks {
            state: Mutex::new(BlocksState {
                rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                live: HashMap::new(),
                durable: HashMap::new(),
                unsynced: Vec::new(),
                discarded_below: 0,
                faults: Faults::default(),
                poisoned: None,
                name: "a simulated block file".into(),
                injected: 0,
            }),
        }
    }

    /// `SimBlocks::new`, its errors naming file `name`.
    fn named(seed: u64, name: &str) -> SimBlocks {
        let blocks = SimBlocks::new(seed);
        blocks.state.lock().name = name.to_string();
        blocks
    }

    /// Arms `fault` on the `op` after the next `n` (replacing what was armed on `op`).
    /// A failed write or sync poisons the file, as a hash log's failed device write
    /// fails the log.
    #[doc(hidden)]
    pub fn arm(&self, op: SimOp, n: u64, fault: SimFault) {
        self.state.lock().faults.arm(op, n, fault);
    }

    /// Operations failed by an armed fault so far.
    pub fn injected_failures(&self) -> u64 {
        self.state.lock().injected
    }

    /// Disarms every fault. Does not lift poisoning.
    pub fn clear_faults(&self) {
        self.state.lock().faults = Faults::default();
    }

    fn check_aligned(offset: u64, len: usize) -> io::Result<()> {
        if offset.is_multiple_of(BLOCK_BYTES as u64) && len.is_multiple_of(BLOCK_BYTES) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unaligned block IO at {offset} of {len} bytes"),
            ))
        }
    }

    /// Writes whole blocks at `offset`.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        Self::check_aligned(offset, bytes.len())?;
        let mut s = self.state.lock();
        if let Some(cause) = &s.poisoned {
            return Err(super::store_poisoned(cause.clone()));
        }
        let st = &mut *s;
        if let Some(e) = st.faults.tick(SimOp::Write, || {
            format!("a write at {offset} of {}", st.name)
        }) {
            s.injected += 1;
            s.poisoned = Some(e.to_string());
            return Err(e);
        }
        for (i, chunk) in bytes.chunks_exact(BLOCK_BYTES).enumerate() {
            let at = offset / BLOCK_BYTES as u64 + i as u64;
            let mut block: Block = Box::new([0; BLOCK_BYTES]);
            block.copy_from_slice(chunk);
            s.live.insert(at, block);
            s.unsynced.push(at);
        }
        Ok(())
    }

    /// Reads whole blocks at `offset`; blocks never written read as zeros.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        Self::check_aligned(offset, buf.len())?;
        let mut s = self.state.lock();
        let st = &mut *s;
        if let Some(e) = st
            .faults
            .tick(SimOp::Read, || format!("a read at {offset} of {}", st.name))
        {
            s.injected += 1;
            return Err(e);
        }
        if offset < s.discarded_below {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read at {offset}, below the discarded part"),
            ));
        }
        for (i, chunk) in buf.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            match s.live.get(&(offset / BLOCK_BYTES as u64 + i as u64)) {
                Some(block) => chunk.copy_from_slice(&block[..]),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }

    /// Makes every write so far durable.
    pub fn sync(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        if let Some(cause) = &s.poisoned {
            return Err(super::store_poisoned(cause.clone()));
        }
        let st = &mut *s;
        if let Some(e) = st
            .faults
            .tick(SimOp::Sync, || format!("a sync of {}", st.name))
        {
            s.injected += 1;
            s.poisoned = Some(e.to_string());
            return Err(e);
        }
        for at in std::mem::take(&mut s.unsynced) {
            if let Some(block) = s.live.get(&at).cloned() {
                s.durable.insert(at, block);
            }
        }
        Ok(())
    }

    /// Gives up every block below `offset` (durably at once, as deleting a file whose
    /// directory is synced later would, near enough for the tests).
    pub fn discard_below(&self, offset: u64) {
        let mut s = self.state.lock();
        let below = offset / BLOCK_BYTES as u64;
        s.live.retain(|&at, _| at >= below);
        s.durable.retain(|&at, _| at >= below);
        s.discarded_below = s.discarded_below.max(below * BLOCK_BYTES as u64);
    }

    /// Gives up the blocks of the `len` bytes at `offset` (a hole punched in a file), in
    /// both images at once: their bytes are no longer needed, so whether a crash finds
    /// them gone or back does not matter to the client, and gone is the simpler image.
    /// A block written again later is a new write, with the usual crash semantics.
    pub fn discard(&self, offset: u64, len: u64) {
        let (from, to) = (
            offset / BLOCK_BYTES as u64,
            (offset + len).div_ceil(BLOCK_BYTES as u64),
        );
        let mut s = self.state.lock();
        s.live.retain(|&at, _| at < from || at >= to);
        s.durable.retain(|&at, _| at < from || at >= to);
    }

    /// Gives up every block from `offset` up (the file cut short), in both images at
    /// once, as [`SimBlocks::discard`].
    pub fn discard_from(&self, offset: u64) {
        let from = offset.div_ceil(BLOCK_BYTES as u64);
        let mut s = self.state.lock();
        s.live.retain(|&at, _| at < from);
        s.durable.retain(|&at, _| at < from);
    }

    /// The sync after the next `n` syncs fails with `EIO` (and poisons the file).
    pub fn fail_syncs_after(&self, n: u64) {
        self.arm(SimOp::Sync, n, SimFault::Permanent);
    }

    /// The write after the next `n` writes fails with `EIO` (and poisons the file).
    pub fn fail_writes_after(&self, n: u64) {
        self.arm(SimOp::Write, n, SimFault::Permanent);
    }

    /// What a restarted process would find: the durable image, plus each block written
    /// since the last sync lost, kept or torn by the seeded coin.
    pub fn crash(&self) -> SimBlocks {
        let mut s = self.state.lock();
        let mut blocks = s.durable.clone();
        // The list stays: this file lives on, and its next sync makes them durable.
        for at in s.unsynced.clone() {
            let Some(new) = s.live.get(&at).cloned() else {
                continue;
            };
            match next_random(&mut s.rng) % 3 {
                0 => {}
                1 => {
                    blocks.insert(at, new);
                }
                _ => {
                    let sectors = BLOCK_BYTES / SECTOR_BYTES;
                    let kept = 1 + (next_random(&mut s.rng) as usize % (sectors - 1));
                    let mut torn = blocks
                        .get(&at)
                        .cloned()
                        .unwrap_or_else(|| Box::new([0; BLOCK_BYTES]));
                    torn[..kept * SECTOR_BYTES].copy_from_slice(&new[..kept * SECTOR_BYTES]);
                    blocks.insert(at, torn);
                }
            }
        }
        let crashed = SimBlocks::named(next_random(&mut s.rng), &s.name);
        {
            let mut c = crashed.state.lock();
            c.live = blocks.clone();
            c.durable = blocks;
            c.discarded_below = s.discarded_below;
        }
        crashed
    }
}

/// The page files of a simulated database directory: a [`SimStore`] per name, and a
/// [`SimBlocks`] per name for files of raw blocks, shared with the test, which crashes
/// them all at once with [`SimPages::crash`].
#[derive(Debug)]
pub struct SimPages {
    stores: Mutex<std::collections::BTreeMap<String, std::sync::Arc<SimStore>>>,
    blocks: Mutex<std::collections::BTreeMap<String, std::sync::Arc<SimBlocks>>>,
    seed: Mutex<u64>,
}

impl SimPages {
    /// No page files yet; their crashes follow `seed`.
    pub fn new(seed: u64) -> SimPages {
        SimPages {
            stores: Mutex::new(std::collections::BTreeMap::new()),
            blocks: Mutex::new(std::collections::BTreeMap::new()),
            seed: Mutex::new(seed),
        }
    }

    /// The block file `name`, created empty if there is none.
    pub fn blocks(&self, name: &str) -> std::sync::Arc<SimBlocks> {
        let mut blocks = self.blocks.lock();
        let mut seed = self.seed.lock();
        let file = blocks.entry(name.to_string()).or_insert_with(|| {
            *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            std::sync::Arc::new(SimBlocks::named(*seed, name))
        });
        std::sync::Arc::clone(file)
    }

    /// The names of the block files.
    pub fn block_names(&self) -> Vec<String> {
        self.blocks.lock().keys().cloned().collect()
    }

    /// Removes block file `name`.
    pub fn remove_blocks(&self, name: &str) {
        self.blocks.lock().remove(name);
    }

    /// The store of page file `name`, created empty if there is none.
    pub fn store(&self, name: &str) -> std::sync::Arc<SimStore> {
        let mut stores = self.stores.lock();
        let mut seed = self.seed.lock();
        let store = stores.entry(name.to_string()).or_insert_with(|| {
            *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            std::sync::Arc::new(SimStore::named(*seed, name))
        });
        std::sync::Arc::clone(store)
    }

    /// Removes page file `name`.
    pub fn remove(&self, name: &str) {
        self.stores.lock().remove(name);
    }

    /// The names of the page files.
    pub fn names(&self) -> Vec<String> {
        self.stores.lock().keys().cloned().collect()
    }

    /// What a restarted process would find: every store crashed ([`SimStore::crash`]).
    pub fn crash(&self) -> SimPages {
        let stores = self.stores.lock();
        let crashed = stores
            .iter()
            .map(|(name, s)| (name.clone(), std::sync::Arc::new(s.crash())))
            .collect();
        let blocks = self
            .blocks
            .lock()
            .iter()
            .map(|(name, b)| (name.clone(), std::sync::Arc::new(b.crash())))
            .collect();
        SimPages {
            stores: Mutex::new(crashed),
            blocks: Mutex::new(blocks),
            seed: Mutex::new(self.seed.lock().wrapping_add(1)),
        }
    }

    /// Arms [`SimStore::fail_writes_after`] (and [`SimBlocks::fail_writes_after`]) on
    /// every store and block file that exists now.
    pub fn fail_writes_after(&self, n: u64) {
        for s in self.stores.lock().values() {
            s.fail_writes_after(n);
        }
        for b in self.blocks.lock().values() {
            b.fail_writes_after(n);
        }
    }

    /// Arms `fault` ([`SimStore::arm`], [`SimBlocks::arm`]) on every store and block file
    /// that exists now; each counts its own operations.
    #[doc(hidden)]
    pub fn arm(&self, op: SimOp, n: u64, fault: SimFault) {
        for s in self.stores.lock().values() {
            s.arm(op, n, fault);
        }
        for b in self.blocks.lock().values() {
            b.arm(op, n, fault);
        }
    }

    /// Disarms the faults of every store and block file (poisoning stays).
    pub fn clear_faults(&self) {
        for s in self.stores.lock().values() {
            s.clear_faults();
        }
        for b in self.blocks.lock().values() {
            b.clear_faults();
        }
    }

    /// Arms [`SimStore::fail_syncs_after`] (and [`SimBlocks::fail_syncs_after`]) on every
    /// store and block file that exists now.
    pub fn fail_syncs_after(&self, n: u64) {
        for s in self.stores.lock().values() {
            s.fail_syncs_after(n);
        }
        for b in self.blocks.lock().values() {
            b.fail_syncs_after(n);
        }
    }
}

fn next_random(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

impl State {
    fn check_poison(&self) -> io::Result<()> {
        match &self.poisoned {
            Some(cause) => Err(super::store_poisoned(cause.clone())),
            None => Ok(()),
        }
    }

    fn poison(&mut self, err: io::Error) -> io::Error {
        self.poisoned.get_or_insert_with(|| err.to_string());
        err
    }
}

impl PageStore for SimStore {
    fn read_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        let mut s = self.state.lock();
        if !s.live_alloc.is_allocated(no.0) {
            return Err(not_allocated(no, "read"));
        }
        let st = &mut *s;
        if let Some(e) = st.faults.tick(SimOp::Read, || {
            format!("a read of page {no} of {}", st.name)
        }) {
            s.counts.injected_failures += 1;
            return Err(e);
        }
        let Some(bytes) = s.live.get(&no.0) else {
            return Err(not_allocated(no, "read (never written)"));
        };
        page.as_bytes_mut().copy_from_slice(bytes.as_bytes());
        s.counts.reads += 1;
        drop(s);
        page.verify(no, PageKind::Data)
    }

    fn write_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        let mut s = self.state.lock();
        s.check_poison()?;
        if !s.live_alloc.is_allocated(no.0) {
            return Err(not_allocated(no, "write"));
        }
        let st = &mut *s;
        if let Some(e) = st.faults.tick(SimOp::Write, || {
            format!("a write of page {no} of {}", st.name)
        }) {
            s.counts.injected_failures += 1;
            return Err(s.poison(e));
        }
        page.stamp(PageKind::Data);
        s.live.insert(no.0, Box::new(page.clone()));
        s.unsynced.push(no.0);
        s.counts.writes += 1;
        Ok(())
    }

    fn allocate(&self) -> io::Result<PageNo> {
        let mut s = self.state.lock();
        s.check_poison()?;
        let no = match s.live_alloc.free.pop_first() {
            Some(no) => no,
            None => {
                s.live_alloc.next += 1;
                s.live_alloc.next - 1
            }
        };
        Ok(PageNo(no))
    }

    fn free(&self, no: PageNo) -> io::Result<()> {
        let mut s = self.state.lock();
        s.check_poison()?;
        if !s.live_alloc.is_allocated(no.0) {
            return Err(not_allocated(no, "free"));
        }
        s.live_alloc.free.insert(no.0);
        s.live.remove(&no.0);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        s.check_poison()?;
        let st = &mut *s;
        if let Some(e) = st
            .faults
            .tick(SimOp::Sync, || format!("a sync of {}", st.name))
        {
            s.counts.injected_failures += 1;
            return Err(s.poison(e));
        }
        s.durable = s.live.clone();
        s.durable_alloc = s.live_alloc.clone();
        s.unsynced.clear();
        s.counts.syncs += 1;
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.state.lock().live_alloc.next * PAGE_SIZE as u64
    }

    fn stats(&self) -> StoreStats {
        let s = self.state.lock();
        StoreStats {
            live_pages: s.live_alloc.next - s.live_alloc.free.len() as u64,
            free_pages: s.live_alloc.free.len() as u64,
            free_list_pages: 0,
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    fn page_with(byte: u8) -> Page {
        let mut p = Page::zeroed();
        p.payload_mut().fill(byte);
        p
    }

    #[test]
    fn unsynced_writes_can_be_lost_or_torn_but_synced_ones_survive() {
        let mut outcomes = [0usize; 3];
        for seed in 0..64 {
            let store = SimStore::new(seed);
            let no = store.allocate().unwrap();
            store.write_page(no, &mut page_with(1)).unwrap();
            store.sync().unwrap();
            store.write_page(no, &mut page_with(2)).unwrap();
            let after = store.crash();
            let mut p = Page::zeroed();
            match after.read_page(no, &mut p) {
                Ok(()) if p.payload()[0] == 1 => outcomes[0] += 1,
                Ok(()) if p.payload()[0] == 2 => outcomes[1] += 1,
                Ok(()) => panic!("a page that verifies holds one of the written versions"),
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "torn = corrupt: {e}");
                    outcomes[2] += 1;
                }
            }
        }
        assert!(
            outcomes.iter().all(|&n| n > 0),
            "lost, kept and torn all seen: {outcomes:?}"
        );
    }

    #[test]
    fn crash_forgets_unsynced_allocations() {
        let store = SimStore::new(7);
        let a = store.allocate().unwrap();
        store.write_page(a, &mut page_with(1)).unwrap();
        store.sync().unwrap();
        let b = store.allocate().unwrap();
        let after = store.crash();
        assert_eq!(after.stats().live_pages, 1);
        assert!(after.read_page(b, &mut Page::zeroed()).is_err());
    }

    #[test]
    fn faults_fire_after_the_countdown_and_poison_writes() {
        let store = SimStore::new(1);
        let no = store.allocate().unwrap();
        store.fail_writes_after(1);
        store.write_page(no, &mut page_with(1)).unwrap();
        let err = store.write_page(no, &mut page_with(2)).unwrap_err();
        assert!(err.to_string().contains("EIO"));
        store.clear_faults();
        // Poisoned: still refused, but reads work.
        assert!(store.write_page(no, &mut page_with(3)).is_err());
        let mut p = Page::zeroed();
        store.read_page(no, &mut p).unwrap();
        assert_eq!(p.payload()[0], 1);
        store.fail_reads_after(0);
        assert!(store.read_page(no, &mut p).is_err());
        assert_eq!(store.counts().injected_failures, 2);
    }

    #[test]
    fn flipped_bits_are_corruption() {
        let store = SimStore::new(3);
        let no = store.allocate().unwrap();
        store.write_page(no, &mut page_with(9)).unwrap();
        assert!(store.flip_bit(no, 8 * 1000 + 3));
        let err = store.read_page(no, &mut Page::zeroed()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let corrupt = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<super::super::CorruptPage>());
        assert!(
            corrupt.is_some_and(|c| c.page == no.0),
            "expected CorruptPage for page {no}, got {err:?}"
        );
    }
}
