//! Synchronization primitives, swappable for shuttle's.
//!
//! Every module that synchronizes threads takes its atomics, locks and thread helpers
//! from here rather than from `std` or `parking_lot` directly. Normally these are the
//! `std` atomics and `parking_lot` locks. With the `shuttle` cargo feature they are
//! shuttle's, so shuttle's schedulers can explore the interleavings of the real code.
//!
//! Both builds expose the same API: `Mutex::lock()` returns the guard directly and
//! `try_lock()` returns an `Option`, as `parking_lot` does.
//!
//! Atomics that live *inside* raw memory regions (for example the block headers of the
//! circular buffer, which are overlaid on bytes) cannot be shuttle's types; they use
//! `std::sync::atomic` directly and are invisible to shuttle's scheduler.

#[cfg(not(feature = "shuttle"))]
mod imp {
    pub use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
    pub use std::sync::Arc;
    pub use std::sync::atomic;
    pub use std::thread;

    /// Called inside a spin-wait loop.
    ///
    /// Spins briefly on the CPU and, every so often, yields the thread so that a
    /// preempted lock holder can run (this machine class has 2 cores and many threads).
    #[inline]
    pub fn spin_wait(iteration: u32) {
        if iteration < 16 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }

    /// Called in a loop that waits for IO or for another thread's long work (a page
    /// write, a compaction pass): spins briefly, then yields, then sleeps 50 µs at a
    /// time, so that a waiter does not take a core from the thread it waits for.
    #[inline]
    pub fn backoff_wait(iteration: u32) {
        if iteration < 16 {
            std::hint::spin_loop();
        } else if iteration < 48 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

#[cfg(feature = "shuttle")]
mod imp {
    pub use shuttle::sync::Arc;
    pub use shuttle::sync::atomic;
    pub use shuttle::thread;

    /// A mutex with `parking_lot`'s API over shuttle's mutex.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(shuttle::sync::Mutex<T>);
    /// The guard of [`Mutex`].
    pub type MutexGuard<'a, T> = shuttle::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// Creates a mutex holding `value`.
        pub fn new(value: T) -> Self {
            Mutex(shuttle::sync::Mutex::new(value))
        }
        /// Locks, blocking until the lock is free. Poisoning is ignored.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
        /// Locks if the lock is free right now.
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
        /// Consumes the mutex and returns its value.
        pub fn into_inner(self) -> T {
            self.0.into_inner().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// A reader-writer lock with `parking_lot`'s API over shuttle's.
    #[derive(Debug, Default)]
    pub struct RwLock<T>(shuttle::sync::RwLock<T>);
    /// The shared guard of [`RwLock`].
    pub type RwLockReadGuard<'a, T> = shuttle::sync::RwLockReadGuard<'a, T>;
    /// The exclusive guard of [`RwLock`].
    pub type RwLockWriteGuard<'a, T> = shuttle::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        /// Creates a lock holding `value`.
        pub fn new(value: T) -> Self {
            RwLock(shuttle::sync::RwLock::new(value))
        }
        /// Takes a shared lock.
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }
        /// Takes the exclusive lock.
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
        /// Takes a shared lock if one is available right now.
        pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            self.0.try_read().ok()
        }
        /// Takes the exclusive lock if it is free right now.
        pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
            self.0.try_write().ok()
        }
    }

    /// Called inside a spin-wait loop: under shuttle every iteration is a yield, so the
    /// scheduler can run the thread being waited for.
    #[inline]
    pub fn spin_wait(_iteration: u32) {
        shuttle::thread::yield_now();
    }

    /// As [`spin_wait`] under shuttle.
    #[inline]
    pub fn backoff_wait(_iteration: u32) {
        shuttle::thread::yield_now();
    }
}

pub use imp::*;
