//! The background evictor: a thread per pool (shared by the trees of a `Db`) that keeps
//! a sliver of the pool free and merges the pages its trees queued.
//!
//! The paper evicts in the thread whose allocation found the pool full, which then waits
//! for the eviction's merges: a batched leaf read and one or two batched writes. With
//! few threads (the driver loads with two on a two-core machine) both often wait at
//! once, and a 4M-record load kept the cores busy about half of its time. The background
//! evictor starts evicting, in larger batches, when the room at the pool's tail falls
//! below a low-water mark, and stops once it is back above a high-water mark, so that a
//! writer's allocation rarely has to evict itself. Writers still evict when they find no
//! room, as before: the thread only works ahead of them, and nothing waits for it.
//!
//! It also merges, in batches, the mini-pages that writers found full at the merge
//! threshold: with the evictor running, such a writer grows its mini-page on (up to the
//! largest block) and queues the page here instead of merging it itself, one leaf read
//! and write while it holds the page's lock.
//!
//! The cost is that the pool runs slightly below full: at most the high-water mark
//! (1/32 of the budget) is kept empty instead of caching records.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::sync::atomic::Ordering;
use crate::sync::spin_wait;

use super::flush::FLUSH_BATCH_PAGES;
use super::leaf::MINI_HEADER_BYTES;
use super::leaf::MiniHeader;
use super::members::TreePool;
use super::mini::clean_after_merge;
use super::signal::{high_water_bytes, low_water_bytes};
use super::stats::{bump, bump_by};
use super::{Core, mapping};

/// Blocks the background evictor claims per step (a writer that evicts claims
/// [`crate::pool::EVICT_BATCH_BLOCKS`]): more leaf pages per batched read and write,
/// since no operation waits for this batch.
const BATCH_BLOCKS: usize = 32;

/// Steps in a row that reclaim nothing (every block busy, or the tree failing) before
/// the evictor backs off and sleeps.
const MAX_STALLED_STEPS: u32 = 64;

/// The longest the evictor sleeps between looks at the pool when nobody wakes it.
const IDLE_SLEEP: Duration = Duration::from_millis(100);

impl Core {
    /// Merges the mini-pages queued by `queue_merge` that are still dirty and at the
    /// threshold, `FLUSH_BATCH_PAGES` per batched read and write. Only try-locks: a page
    /// someone holds is left to its writers (who merge it at full size) and to eviction.
    /// Returns how many pages were queued.
    pub(super) fn merge_queued(&self) -> usize {
        let mut pids = std::mem::take(&mut *self.background.merges.lock());
        let queued = pids.len();
        pids.sort_unstable_by_key(|p| p.0);
        pids.dedup();
        for chunk in pids.chunks(FLUSH_BATCH_PAGES) {
            let mut locked = Vec::new();
            for &pid in chunk {
                let Some(page) = self.mapping.try_write(pid) else {
                    continue;
                };
                let Some(job) = self.dirty_mini(&page) else {
                    continue;
                };
                let node_size = job.mini.block().size_bytes() - MINI_HEADER_BYTES;
                if job.header.mirror || node_size < self.config.merge_threshold_bytes {
                    continue;
                }
                locked.push(page);
            }
            let (headers, results) = self.merge_locked(&locked);
            for ((mut page, header), result) in locked.into_iter().zip(headers).zip(results) {
                // A failed merge leaves the records dirty, for the writer or eviction;
                // a failed write has poisoned the tree, which writers then report.
                if let Ok(split) = result {
                    self.after_background_merge(&mut page, header, split);
                }
            }
        }
        queued
    }

    /// After the evictor merged a queued mini-page: if the leaf split, the mini-page is
    /// dropped (its records may belong to other pages now); otherwise it keeps the
    /// records read or written since the last pass, as clean copies with their reference
    /// bits cleared, which the next write that needs room drops (`drop_cold_clean`).
    fn after_background_merge(
        &self,
        page: &mut mapping::WriteGuard<'_>,
        header: MiniHeader,
        split: bool,
    ) {
        bump(&self.counters.background_merges);
        let mini = self
            .mini_page(page)
            .expect("a merged page keeps its mini-page");
        if split {
            let block = mini.block();
            page.set_location(super::Location::Leaf(header.leaf.0));
            self.retire(block);
            return;
        }
        let bytes = clean_after_merge(&mini.node(), false, None);
        self.mini_page_mut(page)
            .expect("a merged page keeps its mini-page")
            .overwrite(&bytes);
    }
}

/// The running evictor of one pool; dropping it stops the thread and waits for it.
pub(super) struct Background {
    pool: Arc<TreePool>,
    handle: Option<JoinHandle<()>>,
}

impl Background {
    /// Starts the evictor of `pool`; `None` if the thread cannot be spawned (writers
    /// then evict for themselves, as they always can).
    pub(super) fn start(pool: &Arc<TreePool>) -> Option<Background> {
        let worker = Arc::clone(pool);
        let handle = std::thread::Builder::new()
            .name("bfdb-evictor".into())
            .spawn(move || {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&worker)));
                if let Err(panic) = ran {
                    // The evictor's death must reach the trees' owners: each member
                    // fails, which puts a database's keyspaces in its failure state.
                    let why = crate::error::Error::Poisoned {
                        cause: format!(
                            "the background evictor panicked: {}",
                            crate::ticker::panic_message(&*panic)
                        ),
                    };
                    for core in worker.members() {
                        core.record_failure(&why);
                    }
                }
            })
            .ok()?;
        // Only now may writers wake it: `after_alloc` is a no-op until the handle is set.
        let _ = pool.wake.thread.set(handle.thread().clone());
        Some(Background {
            pool: Arc::clone(pool),
            handle: Some(handle),
        })
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.pool.wake.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            handle.thread().unpark();
            // A panic in the evictor has already been reported by the panic hook; the
            // trees themselves stay usable (writers evict for themselves).
            let _ = handle.join();
        }
    }
}

/// Merges the pages every member queued; returns how many were queued.
fn merge_queued(pool: &TreePool) -> usize {
    pool.members().iter().map(|core| core.merge_queued()).sum()
}

/// Whether some member has pages queued for merging.
fn merges_waiting(pool: &TreePool) -> bool {
    pool.members()
        .iter()
        .any(|core| !core.background.merges.lock().is_empty())
}

/// The evictor's loop: evict until the high-water mark, sleep until woken (or a while).
fn run(pool: &TreePool) {
    let signal = &pool.wake;
    // The marks follow the pool's limit, which a database may change at any time.
    let low = || low_water_bytes(pool.limit_bytes());
    let high = || high_water_bytes(pool.limit_bytes());
    let mut backoff = Duration::from_millis(1);
    while !signal.stop.load(Ordering::Acquire) {
        let mut stalled = 0;
        loop {
            if signal.stop.load(Ordering::Acquire) {
                break;
            }
            let queued = merge_queued(pool);
            if pool.tail_room_bytes() >= high() {
                if queued == 0 {
                    break;
                }
                continue;
            }
            let reclaimed = pool.evict_many(BATCH_BLOCKS, pool);
            if reclaimed > 0 {
                bump_by(&pool.background_reclaimed, reclaimed);
                stalled = 0;
                backoff = Duration::from_millis(1);
            } else {
                stalled += 1;
                if stalled > MAX_STALLED_STEPS {
                    break;
                }
                spin_wait(stalled);
            }
        }
        if stalled > MAX_STALLED_STEPS {
            // Every block busy, or the trees failing: look again later, while `busy`
            // stays set so writers do not keep waking the thread meanwhile.
            std::thread::park_timeout(backoff);
            backoff = (backoff * 2).min(IDLE_SLEEP);
            continue;
        }
        signal.busy.store(false, Ordering::SeqCst);
        // A writer that found the pool low (or queued a merge) after the loop's last look
        // but before `busy` cleared did not wake us: look once more before sleeping.
        let work = pool.tail_room_bytes() < low() || merges_waiting(pool);
        if work && !signal.busy.swap(true, Ordering::AcqRel) {
            continue;
        }
        std::thread::park_timeout(IDLE_SLEEP);
        signal.busy.store(true, Ordering::Release);
    }
}
