//! How writers and the background evictor signal each other: the writers' side of
//! `background.rs`, below every layer that allocates or merges. A writer's allocation
//! wakes the evictor when the pool's tail runs short ([`Core::after_alloc`]), and a
//! writer that finds its mini-page full at the merge threshold may hand the page to the
//! evictor's merge queue instead of merging it itself ([`Core::queue_merge`]). The
//! evictor and its wake-up flags belong to the pool (`members::Wake`), which trees may
//! share; each tree keeps its own merge queue.

use crate::sync::Mutex;
use crate::sync::atomic::Ordering;

use super::Core;
use super::mapping::PageId;

/// Most pages waiting for a background merge; past it writers merge for themselves.
const MERGE_QUEUE_MAX: usize = 1024;

/// A tree's queue of pages for the background evictor to merge (part of `Core`).
#[derive(Default)]
pub(super) struct Signal {
    /// Pages whose mini-pages reached the merge threshold, for the evictor to merge.
    pub(super) merges: Mutex<Vec<PageId>>,
}

/// Room at the pool's tail below which writers wake the evictor.
pub(super) fn low_water_bytes(capacity: u64) -> u64 {
    capacity / 64
}

/// Room at the pool's tail at which the evictor stops.
pub(super) fn high_water_bytes(capacity: u64) -> u64 {
    capacity / 32
}

impl Core {
    /// Called after a writer's allocation: wakes the background evictor if the pool's
    /// tail is short of room and the evictor is not already on it.
    pub(super) fn after_alloc(&self) {
        let wake = &self.pool.wake;
        let Some(thread) = wake.thread.get() else {
            return;
        };
        if self.pool.tail_room_bytes() < low_water_bytes(self.pool.limit_bytes())
            && !wake.busy.swap(true, Ordering::AcqRel)
        {
            thread.unpark();
        }
    }

    /// Hands page `pid`, whose mini-page is full at the merge threshold, to the
    /// background evictor; false if there is none or its queue is full (the writer then
    /// merges for itself).
    pub(super) fn queue_merge(&self, pid: PageId) -> bool {
        let wake = &self.pool.wake;
        let Some(thread) = wake.thread.get() else {
            return false;
        };
        {
            let mut queue = self.background.merges.lock();
            if queue.len() >= MERGE_QUEUE_MAX {
                return false;
            }
            queue.push(pid);
        }
        if !wake.busy.swap(true, Ordering::AcqRel) {
            thread.unpark();
        }
        true
    }
}
