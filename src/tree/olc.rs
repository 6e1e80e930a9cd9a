//! The 8-byte version lock of optimistic latch coupling (Bf-Tree §3.4, after Leis et al.).
//!
//! Readers take no lock: they read the version with [`VersionLock::read_begin`], copy out
//! what they need, and check with [`VersionLock::validate`] that the version did not move;
//! if it did, the read restarts. Writers take the lock exclusively with
//! [`VersionLock::write_lock`] and release it with a version bump, which invalidates every
//! optimistic reader that overlapped the write.
//!
//! Word layout (one `u64`):
//!
//! ```text
//!  63                                   2    1        0
//! ┌──────────────────────────────────────┬────────┬──────────┐
//! │ version counter (incremented by 4)    │ locked │ obsolete │
//! └──────────────────────────────────────┴────────┴──────────┘
//! ```
//!
//! Invariants this module owns:
//! - A version observed unlocked and unchanged across a read means no writer held the lock
//!   at any moment in between (every unlock adds 4 or more, so the counter never repeats
//!   within 2^62 writes).
//! - An obsolete node is never unlocked again: readers that find it restart from the parent.

use crate::sync::atomic::{AtomicU64, Ordering, fence};
use crate::sync::spin_wait;

const LOCKED: u64 = 0b10;
const OBSOLETE: u64 = 0b01;

/// An optimistic read or lock attempt saw a concurrent writer; the operation restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Restart;

/// The 8-byte version lock that guards one inner node.
#[derive(Debug, Default)]
pub(crate) struct VersionLock {
    word: AtomicU64,
}

impl VersionLock {
    /// A fresh, unlocked, live version lock.
    pub(crate) fn new() -> Self {
        VersionLock {
            word: AtomicU64::new(0),
        }
    }

    /// Starts an optimistic read: waits while a writer holds the lock and returns the
    /// version to validate against. An obsolete node gives `Err(Restart)`.
    pub(crate) fn read_begin(&self) -> Result<u64, Restart> {
        let mut spins = 0;
        loop {
            let v = self.word.load(Ordering::Acquire);
            if v & OBSOLETE != 0 {
                return Err(Restart);
            }
            if v & LOCKED == 0 {
                return Ok(v);
            }
            spin_wait(spins);
            spins = spins.saturating_add(1);
        }
    }

    /// Ends (or checkpoints) an optimistic read: `Ok` if no writer touched the node since
    /// `read_begin` returned `version`.
    ///
    /// The acquire fence orders every load the reader made before this call ahead of the
    /// version load, so a value read from a node is only trusted if the node was not
    /// changed while it was read.
    pub(crate) fn validate(&self, version: u64) -> Result<(), Restart> {
        fence(Ordering::Acquire);
        if self.word.load(Ordering::Relaxed) == version {
            Ok(())
        } else {
            Err(Restart)
        }
    }

    /// Upgrades an optimistic read to the exclusive lock, failing if anyone wrote since.
    pub(crate) fn upgrade(&self, version: u64) -> Result<WriteGuard<'_>, Restart> {
        self.word
            .compare_exchange(
                version,
                version | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .map(|_| WriteGuard { lock: self })
            .map_err(|_| Restart)
    }

    #[cfg(all(test, not(feature = "shuttle")))]
    /// Takes the exclusive lock, waiting for other writers. An obsolete node gives
    /// `Err(Restart)`.
    pub(crate) fn write_lock(&self) -> Result<WriteGuard<'_>, Restart> {
        loop {
            let v = self.read_begin()?;
            if let Ok(guard) = self.upgrade(v) {
                return Ok(guard);
            }
        }
    }

    #[cfg(all(test, not(feature = "shuttle")))]
    /// Whether the node has been replaced and must not be used any more.
    pub(crate) fn is_obsolete(&self) -> bool {
        self.word.load(Ordering::Acquire) & OBSOLETE != 0
    }
}

/// The exclusive lock on a [`VersionLock`]; dropping it publishes a new version.
#[derive(Debug)]
pub(crate) struct WriteGuard<'a> {
    lock: &'a VersionLock,
}

impl WriteGuard<'_> {
    #[cfg(all(test, not(feature = "shuttle")))]
    /// Releases the lock and marks the node obsolete: readers that still reach it restart.
    pub(crate) fn unlock_obsolete(self) {
        // Clearing LOCKED (+2 carries it into the counter) and setting OBSOLETE in one add.
        self.lock
            .word
            .fetch_add(LOCKED + OBSOLETE, Ordering::Release);
        std::mem::forget(self);
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        // LOCKED is set, so adding it once more clears it and carries one into the
        // counter: the version seen by the next reader differs from every earlier one.
        self.lock.word.fetch_add(LOCKED, Ordering::Release);
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn write_invalidates_readers() {
        let lock = VersionLock::new();
        let v = lock.read_begin().unwrap();
        assert_eq!(lock.validate(v), Ok(()));
        drop(lock.write_lock().unwrap());
        assert_eq!(lock.validate(v), Err(Restart));
        let v2 = lock.read_begin().unwrap();
        assert_ne!(v, v2);
        assert_eq!(lock.validate(v2), Ok(()));
    }

    #[test]
    fn upgrade_fails_after_a_write() {
        let lock = VersionLock::new();
        let v = lock.read_begin().unwrap();
        drop(lock.upgrade(v).unwrap());
        assert!(lock.upgrade(v).is_err());
    }

    #[test]
    fn held_lock_blocks_upgrade_and_fails_validation() {
        let lock = VersionLock::new();
        let v = lock.read_begin().unwrap();
        let guard = lock.write_lock().unwrap();
        assert_eq!(lock.validate(v), Err(Restart));
        assert!(lock.upgrade(v).is_err());
        drop(guard);
    }

    #[test]
    fn obsolete_nodes_restart_everyone() {
        let lock = VersionLock::new();
        let v = lock.read_begin().unwrap();
        lock.write_lock().unwrap().unlock_obsolete();
        assert!(lock.is_obsolete());
        assert_eq!(lock.read_begin(), Err(Restart));
        assert!(lock.write_lock().is_err());
        assert_eq!(lock.validate(v), Err(Restart));
    }

    #[test]
    fn concurrent_writers_are_exclusive() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        // A plain counter protected only by the version lock: a lost update would show.
        let lock = Arc::new(VersionLock::new());
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let lock = Arc::clone(&lock);
                let inside = Arc::clone(&inside);
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let g = lock.write_lock().unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(g);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // 16_000 unlocks, each adding 4 to the version.
        assert_eq!(lock.read_begin().unwrap(), 16_000 * 4);
    }
}
