//! The background evictor: a thread per tree that keeps a sliver of the pool free.
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
//! The cost is that the pool runs slightly below full: at most the high-water mark
//! (1/32 of the budget) is kept empty instead of caching records.

use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::spin_wait;

use super::Core;

/// Blocks the background evictor claims per step (a writer that evicts claims
/// [`crate::pool::EVICT_BATCH_BLOCKS`]): more leaf pages per batched read and write,
/// since no operation waits for this batch.
const BATCH_BLOCKS: usize = 32;

/// Steps in a row that reclaim nothing (every block busy, or the tree failing) before
/// the evictor backs off and sleeps.
const MAX_STALLED_STEPS: u32 = 64;

/// The longest the evictor sleeps between looks at the pool when nobody wakes it.
const IDLE_SLEEP: Duration = Duration::from_millis(100);

/// How the tree's writers and its background evictor signal each other (part of `Core`).
#[derive(Default)]
pub(super) struct Signal {
    /// Set while the evictor works or has been woken; a writer that finds the pool low
    /// wakes it only when this was clear, so allocations rarely touch the thread.
    busy: AtomicBool,
    stop: AtomicBool,
    thread: OnceLock<Thread>,
}

/// Room at the pool's tail below which writers wake the evictor.
fn low_water_bytes(capacity: u64) -> u64 {
    capacity / 64
}

/// Room at the pool's tail at which the evictor stops.
fn high_water_bytes(capacity: u64) -> u64 {
    capacity / 32
}

impl Core {
    /// Called after a writer's allocation: wakes the background evictor if the pool's
    /// tail is short of room and the evictor is not already on it.
    pub(super) fn after_alloc(&self) {
        let Some(thread) = self.background.thread.get() else {
            return;
        };
        if self.pool.tail_room_bytes() < low_water_bytes(self.pool.capacity_bytes())
            && !self.background.busy.swap(true, Ordering::AcqRel)
        {
            thread.unpark();
        }
    }
}

/// The running evictor of one tree; dropping it stops the thread and waits for it.
pub(super) struct Background {
    core: Arc<Core>,
    handle: Option<JoinHandle<()>>,
}

impl Background {
    /// Starts the evictor of `core`; `None` if the thread cannot be spawned (writers
    /// then evict for themselves, as they always can).
    pub(super) fn start(core: &Arc<Core>) -> Option<Background> {
        let worker = Arc::clone(core);
        let handle = std::thread::Builder::new()
            .name("bfdb-evictor".into())
            .spawn(move || run(&worker))
            .ok()?;
        // Only now may writers wake it: `after_alloc` is a no-op until the handle is set.
        let _ = core.background.thread.set(handle.thread().clone());
        Some(Background {
            core: Arc::clone(core),
            handle: Some(handle),
        })
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.core.background.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            handle.thread().unpark();
            // A panic in the evictor has already been reported by the panic hook; the
            // tree itself stays usable (writers evict for themselves).
            let _ = handle.join();
        }
    }
}

/// The evictor's loop: evict until the high-water mark, sleep until woken (or a while).
fn run(core: &Core) {
    let pool = &core.pool;
    let signal = &core.background;
    let (low, high) = (
        low_water_bytes(pool.capacity_bytes()),
        high_water_bytes(pool.capacity_bytes()),
    );
    let mut backoff = Duration::from_millis(1);
    while !signal.stop.load(Ordering::Acquire) {
        let mut stalled = 0;
        while pool.tail_room_bytes() < high && !signal.stop.load(Ordering::Acquire) {
            let reclaimed = pool.evict_many(BATCH_BLOCKS, core);
            if reclaimed > 0 {
                core.counters
                    .background_reclaimed_blocks
                    .fetch_add(reclaimed as u64, Ordering::Relaxed);
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
            // Every block busy, or the tree failing: look again later, while `busy` stays
            // set so writers do not keep waking the thread meanwhile.
            std::thread::park_timeout(backoff);
            backoff = (backoff * 2).min(IDLE_SLEEP);
            continue;
        }
        signal.busy.store(false, Ordering::SeqCst);
        // A writer that found the pool low after the loop's last look but before `busy`
        // cleared did not wake us: look once more before sleeping.
        if pool.tail_room_bytes() < low && !signal.busy.swap(true, Ordering::AcqRel) {
            continue;
        }
        std::thread::park_timeout(IDLE_SLEEP);
        signal.busy.store(true, Ordering::Release);
    }
}
