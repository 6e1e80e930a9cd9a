//! The pool of mini-pages as trees share it: one circular buffer, one memory budget, for
//! every tree keyspace of a [`Db`](crate::Db) (a tree on its own has a pool to itself).
//!
//! Each mini-page block names its tree in its header (`MiniHeader::owner`, a slot in
//! [`TreePool`]'s member table), so eviction at the head, which meets blocks of every
//! tree in the order they were allocated, hands each block to the tree that owns it.
//! A tree's writers thereby evict other trees' cold mini-pages, and memory flows to the
//! keyspace that is being used, as the Bf-Tree paper's one buffer does for the pages of
//! one tree.
//!
//! ## Member slots
//!
//! A tree takes a free slot when it is built and gives it back at the end of its
//! `Core`'s `Drop`, after it has freed every block it still maps. (Its blocks go back
//! earlier, as its `Tree` drops: an evictor may hold the `Core` a while longer, the
//! background evictor for a pass over every member's merge queue, or a writer of
//! another tree for one eviction batch, and the last `Arc` then drops on that thread.) A slot is therefore reused only
//! once no block of its old tree is allocated, except a block an evictor claimed before
//! the free (`Evicting`, which the free turns `Dead`): that evictor may find the slot's
//! new tree, which then sees that its page does not map the block (no live mini-page can
//! sit at the offset of a block not yet reclaimed) and answers `Busy`, after which the
//! pool reclaims the dead block. A member that is being dropped cannot be upgraded, and
//! its blocks are answered `Busy` until its `Drop` frees them.

use std::ops::Deref;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pool::{AllocError, Block, EvictDecision, Evictor, Pool};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Mutex, RwLock};

use super::admission::Doorkeeper;
use super::leaf::MiniHeader;
use super::mapping::{Location, PageId};
use super::{Core, background, setup};

/// The most trees one pool serves at once: the owner field of a mini-page header has
/// 15 bits.
pub(crate) const MAX_MEMBERS: usize = 1 << 15;

/// The pool and the trees that keep mini-pages in it.
pub(crate) struct TreePool {
    pool: Pool,
    /// Slot `i` is `Some` while a tree owns it (a `Weak` that upgrades once the tree is
    /// built), `None` when free.
    members: RwLock<Vec<Option<Weak<Core>>>>,
    /// How the writers of every member and the pool's background evictor signal each
    /// other.
    pub(super) wake: Wake,
    /// Pool blocks the background evictor reclaimed.
    pub(super) background_reclaimed: AtomicU64,
    /// The second-miss filter of point reads (`admission.rs`), sized by the pool: one
    /// for every member, so that it does not grow with the number of trees.
    pub(super) doorkeeper: Doorkeeper,
    /// Evictions of dirty mini-pages that failed with an operating error (a leaf page
    /// that could not be read or written), and the last one's message. Pool-wide: a
    /// writer evicts every member's blocks, and must learn of a failure in whichever
    /// tree owned the block that held the head, or it would retry for room forever.
    evict_failures: AtomicU64,
    evict_error: Mutex<Option<String>>,
}

/// The writers' side of the background evictor (see `background.rs`).
#[derive(Default)]
pub(super) struct Wake {
    /// Set while the evictor works or has been woken; a writer that finds the pool low
    /// wakes it only when this was clear, so allocations rarely touch the thread.
    pub(super) busy: AtomicBool,
    pub(super) stop: AtomicBool,
    pub(super) thread: OnceLock<Thread>,
}

impl Deref for TreePool {
    type Target = Pool;

    fn deref(&self) -> &Pool {
        &self.pool
    }
}

impl TreePool {
    fn new(config: &Config) -> Result<TreePool> {
        Ok(TreePool {
            pool: Pool::new(setup::pool_config(config))?,
            members: RwLock::new(Vec::new()),
            wake: Wake::default(),
            background_reclaimed: AtomicU64::new(0),
            doorkeeper: Doorkeeper::new(config.memory_budget_bytes),
            evict_failures: AtomicU64::new(0),
            evict_error: Mutex::new(None),
        })
    }

    /// Notes an eviction that failed with `e`: its dirty records stay in memory.
    pub(super) fn note_evict_failure(&self, e: &Error) {
        *self.evict_error.lock() = Some(e.to_string());
        self.evict_failures.fetch_add(1, Ordering::Release);
    }

    /// How many evictions have failed so far ([`TreePool::evict_failure_since`]).
    pub(super) fn evict_failures(&self) -> u64 {
        self.evict_failures.load(Ordering::Acquire)
    }

    /// The last failure's message if an eviction failed after `evict_failures` read
    /// `seen`: the reason a writer that found no room cannot get any.
    pub(super) fn evict_failure_since(&self, seen: u64) -> Option<String> {
        (self.evict_failures() != seen).then(|| self.evict_error.lock().clone().unwrap_or_default())
    }

    /// Reserves a member slot, for a tree about to be built.
    pub(super) fn reserve_slot(&self) -> Result<u16> {
        let mut members = self.members.write();
        let slot = match members.iter().position(Option::is_none) {
            Some(free) => free,
            None if members.len() < MAX_MEMBERS => {
                members.push(None);
                members.len() - 1
            }
            None => {
                return Err(Error::Unsupported(format!(
                    "a memory pool serves at most {MAX_MEMBERS} trees at once"
                )));
            }
        };
        members[slot] = Some(Weak::new());
        Ok(u16::try_from(slot).expect("below MAX_MEMBERS"))
    }

    /// Points a reserved slot at its tree.
    pub(super) fn fill_slot(&self, slot: u16, core: Weak<Core>) {
        self.members.write()[usize::from(slot)] = Some(core);
    }

    /// Frees a slot: its tree has freed every block it mapped.
    pub(super) fn release_slot(&self, slot: u16) {
        self.members.write()[usize::from(slot)] = None;
    }

    /// The trees alive in the pool.
    pub(super) fn members(&self) -> Vec<Arc<Core>> {
        self.members
            .read()
            .iter()
            .filter_map(|m| m.as_ref()?.upgrade())
            .collect()
    }

    /// Allocates a block, evicting from the head (any member's blocks) if needed.
    pub(super) fn alloc(&self, size_bytes: usize) -> Result<Block, AllocError> {
        self.pool.alloc(size_bytes, self)
    }

    /// Evicts from the head until `free_bytes` are free at the tail; false if the
    /// blocks there are busy.
    pub(super) fn evict_until(&self, free_bytes: u64) -> bool {
        self.pool.evict_until(free_bytes, self)
    }

    /// The members owning `blocks` (by their headers' owner slots), `None` for a slot
    /// whose tree is gone or being dropped.
    fn owners(&self, blocks: &[Block]) -> Vec<Option<Arc<Core>>> {
        let members = self.members.read();
        blocks
            .iter()
            .map(|block| {
                // SAFETY: the pool hands the evictor only `Evicting` blocks, which are
                // published and whose memory is not reused before the callback returns.
                let owner = unsafe { MiniHeader::of(block) }.owner;
                members.get(usize::from(owner))?.as_ref()?.upgrade()
            })
            .collect()
    }
}

impl Evictor for TreePool {
    fn evict(&self, block: &Block) -> EvictDecision {
        match self.owners(std::slice::from_ref(block)).pop().flatten() {
            Some(core) => core.evict(block),
            None => EvictDecision::Busy,
        }
    }

    /// Hands each member its blocks in one `evict_batch` call (so its merges batch
    /// their IO), in address order within each member.
    fn evict_batch(&self, blocks: &[Block]) -> Vec<EvictDecision> {
        let owners = self.owners(blocks);
        let mut decisions = vec![EvictDecision::Busy; blocks.len()];
        let mut done = vec![false; blocks.len()];
        for i in 0..blocks.len() {
            let Some(core) = owners[i].as_ref().filter(|_| !done[i]) else {
                continue;
            };
            let mine: Vec<usize> = (i..blocks.len())
                .filter(|&j| !done[j] && owners[j].as_ref().is_some_and(|c| Arc::ptr_eq(c, core)))
                .collect();
            let batch: Vec<Block> = mine.iter().map(|&j| blocks[j]).collect();
            for (&j, decision) in mine.iter().zip(core.evict_batch(&batch)) {
                decisions[j] = decision;
                done[j] = true;
            }
        }
        decisions
    }
}

impl Core {
    /// Gives the pool back every mini-page block the tree maps, each page pointed at its
    /// leaf page first; dirty records not yet merged are dropped with their block. For
    /// a tree no handle reaches any more: its `Tree` as it drops (after its flush), and
    /// `Drop for Core`. An evictor that still holds the `Core` then finds no mini-page
    /// to evict (a block it had claimed is `Dead`, which the pool reclaims), and none
    /// of its eviction steps makes a new one: only `keep_in_memory` allocates, for a
    /// page that maps a mini-page.
    pub(super) fn give_back_blocks(&self) {
        for id in 0..self.mapping.high_water() {
            let page = self.mapping.write(PageId(id));
            if let Some(mini) = self.mini_page(&page) {
                let (block, leaf) = (mini.block(), mini.header().leaf);
                page.set_location(Location::Leaf(leaf.0));
                self.retire(block);
            }
        }
    }
}

/// A tree's share of memory: the pool it allocates mini-pages in, and the background
/// evictor that keeps that pool's tail free. The trees of one [`Db`](crate::Db) hold
/// clones of one `TreeMemory`; the evictor stops when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct TreeMemory {
    pub(super) pool: Arc<TreePool>,
    pub(super) background: Option<Arc<background::Background>>,
}

impl TreeMemory {
    /// A pool of `config.memory_budget_bytes` (which [`Config::validate`] accepted),
    /// with its background evictor running if `config.background_eviction` is on.
    pub(crate) fn new(config: &Config) -> Result<TreeMemory> {
        let pool = Arc::new(TreePool::new(config)?);
        // Under shuttle every thread must be the scheduler's: no evictor thread there.
        let background = (config.background_eviction && !cfg!(feature = "shuttle"))
            .then(|| background::Background::start(&pool))
            .flatten()
            .map(Arc::new);
        Ok(TreeMemory { pool, background })
    }

    /// Bytes of the pool's region: the memory budget it was made for.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.pool.capacity_bytes()
    }

    /// Bytes the trees' mini-pages may take now: the capacity less what the database
    /// gave its hash keyspaces.
    pub(crate) fn limit_bytes(&self) -> u64 {
        self.pool.limit_bytes()
    }

    /// Sets the trees' share (see [`Pool::set_limit_bytes`](crate::pool::Pool::set_limit_bytes))
    /// and wakes the background evictor to make room under a lower one. Returns the
    /// share set.
    pub(crate) fn set_limit_bytes(&self, bytes: u64) -> u64 {
        let limit = self.pool.set_limit_bytes(bytes);
        if let Some(thread) = self.pool.wake.thread.get()
            && !self.pool.wake.busy.swap(true, Ordering::AcqRel)
        {
            thread.unpark();
        }
        limit
    }

    /// Bytes of the region given back to the operating system behind the head.
    pub(crate) fn released_bytes(&self) -> u64 {
        self.pool.stats().released_bytes
    }

    /// Bytes of the pool's blocks in use (headers included).
    pub(crate) fn bytes_in_use(&self) -> u64 {
        self.pool.bytes_in_use()
    }
}

impl std::fmt::Debug for TreeMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeMemory")
            .field("capacity_bytes", &self.pool.capacity_bytes())
            .field("limit_bytes", &self.pool.limit_bytes())
            .field(
                "background_reclaimed",
                &self.pool.background_reclaimed.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// Shuttle explores the interleavings of trees sharing one pool (run with `cargo test
/// --features shuttle --lib members`): a writer of one tree evicts the blocks of another
/// while that tree is dropped and a new tree takes its member slot.
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests {
    use shuttle::sync::Arc;
    use shuttle::thread;

    use crate::config::Config;
    use crate::storage::{ActiveBackend, MemoryStore};
    use crate::tree::Tree;

    use super::TreeMemory;

    fn config() -> Config {
        Config {
            memory_budget_bytes: 64 << 10,
            // Mini-pages grow to full size before merging, so they fill the pool.
            merge_threshold_bytes: 4096,
            max_key_bytes: 16,
            max_value_bytes: 200,
            huge_pages: false,
            ..Config::default()
        }
    }

    fn tree_in(memory: &TreeMemory) -> Tree {
        Tree::with_store_in(
            config(),
            Box::new(MemoryStore::new()),
            ActiveBackend::memory(),
            memory.clone(),
        )
        .unwrap()
    }

    fn key(i: u32) -> Vec<u8> {
        format!("k{:05}", i.wrapping_mul(7919) % 10_000).into_bytes()
    }

    fn value(i: u32, tree: u8) -> Vec<u8> {
        let mut v = vec![tree; 200];
        v[..4].copy_from_slice(&i.to_le_bytes());
        v
    }

    /// Records tree `a` is written: several times the pool at 200 bytes each.
    const A_RECORDS: u32 = 150;
    /// Records tree `b` holds before it is dropped.
    const B_RECORDS: u32 = 250;

    /// Tree `a` is written (its allocations evict `b`'s blocks and, later, `c`'s) while
    /// `b` is dropped and `c` is built in `b`'s slot and written. Every record of `a`
    /// and `c` reads back, and the pool ends holding only their blocks.
    fn a_tree_dropped_and_replaced_under_eviction() {
        let memory = TreeMemory::new(&config()).unwrap();
        let a = Arc::new(tree_in(&memory));
        let b = tree_in(&memory);
        // Mini-pages over most of the pool, for `a`'s allocations to evict.
        for i in 0..B_RECORDS {
            b.insert(&key(i), &value(i, 2)).unwrap();
        }
        let writer = {
            let a = a.clone();
            thread::spawn(move || {
                for i in 0..A_RECORDS {
                    a.insert(&key(i), &value(i, 1)).unwrap();
                }
            })
        };
        let replacer = {
            let memory = memory.clone();
            thread::spawn(move || {
                drop(b);
                // Usually in `b`'s slot; in another while `a`'s eviction batch still
                // holds `b`'s `Core`, whose drop frees the slot.
                let c = tree_in(&memory);
                for i in 0..20 {
                    c.insert(&key(i), &value(i, 3)).unwrap();
                }
                c
            })
        };
        writer.join().unwrap();
        let c = replacer.join().unwrap();
        for i in 0..A_RECORDS {
            assert_eq!(a.get(&key(i)).unwrap(), Some(value(i, 1)), "a: key {i}");
        }
        for i in 0..20 {
            assert_eq!(c.get(&key(i)).unwrap(), Some(value(i, 3)), "c: key {i}");
        }
        assert_eq!(
            c.get(&key(B_RECORDS - 1)).unwrap(),
            None,
            "c holds none of b's records"
        );
        let pool = &memory.pool;
        assert!(
            pool.stats().reclaimed_blocks > 0,
            "the schedule must evict from the shared head"
        );
        drop(c);
        drop(a);
        pool.drain(&**pool);
        assert_eq!(
            pool.bytes_in_use(),
            0,
            "every block of the dropped trees came back"
        );
    }

    fn iterations() -> usize {
        std::env::var("BFDB_SHUTTLE_ITERATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40)
    }

    #[test]
    fn a_tree_dropped_and_replaced_under_eviction_random() {
        shuttle::check_random(a_tree_dropped_and_replaced_under_eviction, iterations());
    }

    #[test]
    fn a_tree_dropped_and_replaced_under_eviction_pct() {
        shuttle::check_pct(a_tree_dropped_and_replaced_under_eviction, iterations(), 3);
    }
}
