//! Epoch protection with trigger actions (FASTER, SIGMOD 2018, sections 2.3 and 2.4).
//!
//! The [`Epoch`] keeps a shared counter, the *current epoch* `E`, and a table with one
//! cache-line sized slot per registered thread holding that thread's *local epoch* `E_T`
//! (0 while the thread is not protected). An epoch `c` is *safe* once every protected
//! thread has a local epoch greater than `c`. A thread that bumps the epoch from `c` to
//! `c + 1` may attach a *trigger action*; the action runs exactly once, on whichever
//! thread first finds `c` safe while draining the *drain list* (a refresh, an unprotect,
//! a bump or an explicit [`Epoch::drain`]).
//!
//! # The operations, and how a thread uses them
//!
//! - [`Epoch::register`] reserves a slot and returns an [`EpochHandle`] (FASTER's
//!   *Acquire* of an entry). Dropping the handle releases the slot for another thread, so
//!   any number of threads may come and go; the table grows by whole segments when every
//!   slot is taken and never shrinks.
//! - [`EpochHandle::protect`] sets the local epoch to the current one and returns an
//!   [`EpochGuard`]. Everything the hash tier lets a thread reach through shared memory
//!   (index tables, later log pages) is reached through a guard and lives at least as
//!   long as the borrow of it.
//! - [`EpochGuard::refresh`] moves the local epoch to the current one and drains ready
//!   actions. It takes `&mut self`, so a thread cannot refresh while it still holds a
//!   reference obtained under the old epoch: the borrow checker enforces FASTER's rule
//!   that a thread refreshes only between operations.
//! - [`EpochGuard::bump_with_action`] / [`Epoch::bump_with_action`] increment the current
//!   epoch from `c` to `c + 1` and register the action at `c`.
//! - Dropping the guard unprotects (FASTER's *Release* of protection); dropping the
//!   handle releases the slot.
//!
//! # Invariants this module owns
//!
//! - An action registered at epoch `c` runs at most once, and only when every protected
//!   thread has a local epoch above `c`: every thread that was protected at or below `c`
//!   has refreshed or unprotected. A thread that protects after the bump sees every
//!   write made before the bump (the fences below), so it cannot observe what the action
//!   retires.
//! - Every registered action runs exactly once if threads keep refreshing; actions still
//!   pending when the [`Epoch`] is dropped run in its `Drop` (no thread can be protected
//!   then: guards borrow the epoch).
//! - `safe_to_reclaim` only grows.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;

use super::pending::ReadBatch;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

/// The local epoch of a slot whose thread is not protected.
const UNPROTECTED: u64 = 0;

/// Slots per table segment. The table starts with one segment and links another when
/// every slot is taken.
const SEGMENT_SLOTS: usize = 32;

thread_local! {
    /// The slot of a table's first segment this thread last registered in (a hint only:
    /// the slot is claimed by compare-and-swap like any other).
    static SLOT_HINT: Cell<usize> = const { Cell::new(0) };
}

/// Claims `slot` for a new handle if no live handle owns it.
fn claim(slot: &Slot) -> bool {
    !slot.in_use.load(Ordering::Relaxed)
        && slot
            .in_use
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
}

/// A trigger action: run once, on some thread, when its epoch is safe.
pub(crate) type Action = Box<dyn FnOnce() + Send + 'static>;

/// One thread's entry in the epoch table, alone on its cache line so that threads
/// refreshing their own epochs do not invalidate each other's lines.
#[repr(C, align(64))]
struct Slot {
    /// The epoch this thread is protected at, or [`UNPROTECTED`].
    local_epoch: AtomicU64,
    /// Whether a live [`EpochHandle`] owns this slot.
    in_use: AtomicBool,
}

#[cfg(not(feature = "shuttle"))]
const _: () = assert!(size_of::<Slot>() == 64);

impl Slot {
    fn new() -> Self {
        Slot {
            local_epoch: AtomicU64::new(UNPROTECTED),
            in_use: AtomicBool::new(false),
        }
    }
}

/// A fixed block of slots; segments form an append-only list that lives as long as the
/// [`Epoch`], so a slot's address never changes and handles can borrow it.
struct Segment {
    slots: [Slot; SEGMENT_SLOTS],
    // `OnceLock` rather than an atomic pointer keeps this module free of unsafe code. Its
    // initializer only allocates, so no thread can be descheduled by shuttle (or wait
    // long on a real machine) inside it.
    next: OnceLock<Box<Segment>>,
}

impl Segment {
    fn new() -> Self {
        Segment {
            slots: std::array::from_fn(|_| Slot::new()),
            next: OnceLock::new(),
        }
    }
}

/// An action waiting in the drain list for `epoch` to become safe.
struct Trigger {
    epoch: u64,
    action: Action,
}

/// The epoch framework: the current epoch, the safe-to-reclaim epoch, the table of
/// per-thread slots and the drain list. See the module docs.
pub(crate) struct Epoch {
    /// `E`, starting at 1 (0 means "not protected" in a slot).
    current: AtomicU64,
    /// `E_s`: the largest epoch known to be safe. Only grows.
    safe_to_reclaim: AtomicU64,
    /// The first segment of the thread table.
    table: Segment,
    /// Actions waiting for their epoch to become safe. A mutex rather than FASTER's fixed
    /// array of CAS-claimed slots: bumps with actions are rare (page flushes, phase
    /// changes), a drainer holds the lock only to move ready actions out (never while
    /// running one), and the list never fills up.
    drain_list: Mutex<Vec<Trigger>>,
    /// The length of `drain_list`, read without the lock so that a refresh with nothing
    /// to drain costs one load.
    pending: AtomicUsize,
}

impl Default for Epoch {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("current", &self.current.load(Ordering::Relaxed))
            .field(
                "safe_to_reclaim",
                &self.safe_to_reclaim.load(Ordering::Relaxed),
            )
            .field("pending", &self.pending.load(Ordering::Relaxed))
            .finish()
    }
}

impl Epoch {
    /// An epoch framework with no registered threads, at epoch 1.
    pub(crate) fn new() -> Self {
        Epoch {
            current: AtomicU64::new(1),
            safe_to_reclaim: AtomicU64::new(0),
            table: Segment::new(),
            drain_list: Mutex::new(Vec::new()),
            pending: AtomicUsize::new(0),
        }
    }

    /// Reserves a slot in the epoch table for the calling thread. The slot is released
    /// when the handle is dropped.
    ///
    /// The thread first tries the slot of the first segment it last got (a hint kept per
    /// thread): a thread that registers for each operation takes the same slot again,
    /// its cache line already its own, instead of reading other threads' slots on its
    /// way to a free one.
    pub(crate) fn register(&self) -> EpochHandle<'_> {
        let hint = SLOT_HINT.try_with(Cell::get).unwrap_or(0);
        if let Some(slot) = self.table.slots.get(hint)
            && claim(slot)
        {
            return self.handle(slot);
        }
        let mut segment = &self.table;
        let mut first = true;
        loop {
            for (i, slot) in segment.slots.iter().enumerate() {
                if claim(slot) {
                    if first {
                        let _ = SLOT_HINT.try_with(|h| h.set(i));
                    }
                    return self.handle(slot);
                }
            }
            segment = segment.next.get_or_init(|| Box::new(Segment::new()));
            first = false;
        }
    }

    fn handle<'a>(&'a self, slot: &'a Slot) -> EpochHandle<'a> {
        debug_assert_eq!(slot.local_epoch.load(Ordering::Relaxed), UNPROTECTED);
        EpochHandle {
            epoch: self,
            slot,
            _not_sync: PhantomData,
        }
    }

    /// The current epoch `E`.
    pub(crate) fn current(&self) -> u64 {
        self.current.load(Ordering::SeqCst)
    }

    /// The largest epoch known to be safe (`E_s`), as last computed. It may lag: an
    /// epoch can be safe before this says so.
    pub(crate) fn safe_to_reclaim(&self) -> u64 {
        self.safe_to_reclaim.load(Ordering::SeqCst)
    }

    /// Whether `epoch` is known to be safe.
    pub(crate) fn is_safe(&self, epoch: u64) -> bool {
        epoch <= self.safe_to_reclaim()
    }

    /// How many trigger actions are waiting.
    pub(crate) fn pending_actions(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Increments the current epoch and drains ready actions. Returns the new epoch.
    pub(crate) fn bump(&self) -> u64 {
        // Everything this thread wrote before the bump must be visible to any thread that
        // protects at the new epoch; see `protect_slot` for the other half.
        fence(Ordering::SeqCst);
        let new = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        if self.pending.load(Ordering::SeqCst) > 0 {
            self.drain();
        }
        new
    }

    /// Increments the current epoch from `c` to `c + 1` and registers `action` to run
    /// once `c` is safe, that is once every thread protected now has refreshed or
    /// unprotected. Returns `c`.
    ///
    /// Called from a protected thread, the action cannot run before that thread
    /// refreshes: [`EpochGuard::bump_with_action`] does both.
    pub(crate) fn bump_with_action(&self, action: impl FnOnce() + Send + 'static) -> u64 {
        fence(Ordering::SeqCst);
        let prior = self.current.fetch_add(1, Ordering::SeqCst);
        {
            let mut list = self.drain_list.lock();
            list.push(Trigger {
                epoch: prior,
                action: Box::new(action),
            });
            self.pending.fetch_add(1, Ordering::SeqCst);
        }
        self.drain();
        prior
    }

    /// Recomputes the safe-to-reclaim epoch and runs every action whose epoch is safe.
    /// Actions run on the calling thread, outside any lock, so an action may itself bump
    /// the epoch with another action. If another thread is draining at this moment, this
    /// call returns without waiting; that thread or a later drain runs what is ready.
    pub(crate) fn drain(&self) {
        let current = self.current.load(Ordering::SeqCst);
        let safe = self.compute_safe_to_reclaim(current);
        let ready: Vec<Trigger> = {
            let Some(mut list) = self.drain_list.try_lock() else {
                return;
            };
            // An action in the list with epoch <= safe was registered after its bump,
            // which happened before `current` was read (current > safe >= its epoch), so
            // the scan that produced `safe` came after the bump: every thread protected
            // at or before the action's epoch had moved on by then.
            let ready: Vec<Trigger> = list.extract_if(.., |t| t.epoch <= safe).collect();
            self.pending.fetch_sub(ready.len(), Ordering::SeqCst);
            ready
        };
        for trigger in ready {
            (trigger.action)();
        }
    }

    /// Scans the table: the safe epoch is one below the oldest local epoch of a protected
    /// thread, or one below `current` if no thread is protected. Publishes it to
    /// `safe_to_reclaim` (which only grows) and returns the published value.
    pub(crate) fn compute_safe_to_reclaim(&self, current: u64) -> u64 {
        fence(Ordering::SeqCst);
        let mut oldest = current;
        let mut segment = Some(&self.table);
        while let Some(s) = segment {
            for slot in &s.slots {
                let local = slot.local_epoch.load(Ordering::SeqCst);
                if local != UNPROTECTED && local < oldest {
                    oldest = local;
                }
            }
            segment = s.next.get().map(|b| &**b);
        }
        let safe = oldest - 1;
        let before = self.safe_to_reclaim.fetch_max(safe, Ordering::SeqCst);
        before.max(safe)
    }

    /// Sets `slot`'s local epoch to the current one and drains if actions wait.
    fn protect_slot(&self, slot: &Slot) -> u64 {
        let mut epoch = self.current.load(Ordering::SeqCst);
        loop {
            slot.local_epoch.store(epoch, Ordering::SeqCst);
            // Pairs with the fences in `bump` and `compute_safe_to_reclaim`: either a
            // scan sees this slot's epoch, or this thread's later reads see every write
            // made before that scan's bump.
            fence(Ordering::SeqCst);
            // If the epoch moved between the load and the store, a scan may have missed
            // this slot and let an action at the old epoch run: store the new epoch. On
            // return the slot is above every epoch bumped before its store, so while the
            // thread stays protected no action at or above its epoch can run, and
            // `safe_to_reclaim < local epoch <= current` holds (the paper's invariant).
            let now = self.current.load(Ordering::SeqCst);
            if now == epoch {
                break;
            }
            epoch = now;
        }
        if self.pending.load(Ordering::SeqCst) > 0 {
            self.drain();
        }
        epoch
    }

    /// Counts slots held by live handles (tests and statistics).
    pub(crate) fn registered_threads(&self) -> usize {
        let mut count = 0;
        let mut segment = Some(&self.table);
        while let Some(s) = segment {
            count += s
                .slots
                .iter()
                .filter(|slot| slot.in_use.load(Ordering::SeqCst))
                .count();
            segment = s.next.get().map(|b| &**b);
        }
        count
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        // No guard can be alive (guards borrow the epoch), so every epoch is safe.
        let pending = std::mem::take(&mut *self.drain_list.lock());
        for trigger in pending {
            (trigger.action)();
        }
    }
}

/// A registered thread's slot in the epoch table. Dropping it releases the slot.
///
/// The handle is `Send` (a thread may hand its session to another) but not `Sync`: one
/// slot holds one local epoch, so two threads must never use it at once.
pub(crate) struct EpochHandle<'e> {
    epoch: &'e Epoch,
    slot: &'e Slot,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for EpochHandle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochHandle")
            .field(
                "local_epoch",
                &self.slot.local_epoch.load(Ordering::Relaxed),
            )
            .finish()
    }
}

impl<'e> EpochHandle<'e> {
    /// Protects the thread at the current epoch (draining ready actions) until the
    /// returned guard is dropped.
    pub(crate) fn protect(&mut self) -> EpochGuard<'_, 'e> {
        self.epoch.protect_slot(self.slot);
        EpochGuard {
            handle: self,
            reads: None,
            nested: false,
        }
    }

    /// [`EpochHandle::protect`] for an operation of a batch: a record the guard's
    /// holder needs from a log's device is taken from `reads` if an earlier round read
    /// it, and otherwise asked of `reads` and the operation stopped as pending (see
    /// [`super::pending`]), instead of read on the spot.
    pub(crate) fn protect_batched<'h>(&'h mut self, reads: &'h ReadBatch) -> EpochGuard<'h, 'e> {
        self.epoch.protect_slot(self.slot);
        EpochGuard {
            handle: self,
            reads: Some(reads),
            nested: false,
        }
    }
}

impl Drop for EpochHandle<'_> {
    fn drop(&mut self) {
        debug_assert_eq!(
            self.slot.local_epoch.load(Ordering::Relaxed),
            UNPROTECTED,
            "a guard borrows its handle, so it is gone"
        );
        self.slot.in_use.store(false, Ordering::Release);
    }
}

/// Proof that the thread is protected: shared memory reached through the hash tier may
/// be read while this is borrowed. Dropping it unprotects.
///
/// The guard is also the operation's context for device reads (as FASTER's execution
/// context holds a session's pending IOs): made by [`EpochHandle::protect_batched`], it
/// carries the batch that collects them.
pub(crate) struct EpochGuard<'h, 'e> {
    handle: &'h mut EpochHandle<'e>,
    reads: Option<&'h ReadBatch>,
    /// Made by [`EpochGuard::batched`] from a guard that stays: dropping it leaves the
    /// thread protected.
    nested: bool,
}

impl std::fmt::Debug for EpochGuard<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochGuard")
            .field("local_epoch", &self.local_epoch())
            .finish()
    }
}

impl<'e> EpochGuard<'_, 'e> {
    /// The batch this guard's operation collects its device reads in, if any.
    pub(crate) fn read_batch(&self) -> Option<&ReadBatch> {
        self.reads
    }

    /// This guard's protection for a while with `reads` as its batch (as
    /// [`EpochHandle::protect_batched`] makes): a thread that already holds a guard (a
    /// compaction, a throttled writer) collects device reads in a batch. The thread stays
    /// protected when the returned guard is dropped, and anything borrowed from it is
    /// gone by then.
    pub(crate) fn batched<'a>(&'a mut self, reads: &'a ReadBatch) -> EpochGuard<'a, 'e> {
        EpochGuard {
            handle: &mut *self.handle,
            reads: Some(reads),
            nested: true,
        }
    }

    /// Runs `f` with this thread unprotected (as if the guard were dropped and taken
    /// again): for a wait on the disk that must not hold back epoch actions (page
    /// flushes and closes wait for every protected thread). Nothing borrowed from the
    /// guard is held across it.
    pub(crate) fn unprotected<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.unprotect();
        let out = f();
        self.refresh();
        out
    }

    /// Marks this thread unprotected, and runs the actions that waited only for it.
    fn unprotect(&self) {
        self.handle
            .slot
            .local_epoch
            .store(UNPROTECTED, Ordering::SeqCst);
        if self.handle.epoch.pending.load(Ordering::SeqCst) > 0 {
            self.handle.epoch.drain();
        }
    }

    /// Moves this thread to the current epoch and runs ready actions. Returns the new
    /// local epoch. Nothing borrowed from the guard may be held across it.
    pub(crate) fn refresh(&mut self) -> u64 {
        self.handle.epoch.protect_slot(self.handle.slot)
    }

    /// Bumps the epoch with `action` (see [`Epoch::bump_with_action`]) and refreshes this
    /// thread past it, so that only the other threads hold the action back. Returns the
    /// epoch the action waits for.
    pub(crate) fn bump_with_action(&mut self, action: impl FnOnce() + Send + 'static) -> u64 {
        let prior = self.handle.epoch.bump_with_action(action);
        self.refresh();
        prior
    }

    /// The epoch this thread is protected at.
    pub(crate) fn local_epoch(&self) -> u64 {
        self.handle.slot.local_epoch.load(Ordering::Relaxed)
    }

    /// The epoch framework this guard protects against.
    pub(crate) fn epoch(&self) -> &'e Epoch {
        self.handle.epoch
    }
}

impl Drop for EpochGuard<'_, '_> {
    fn drop(&mut self) {
        if !self.nested {
            self.unprotect();
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64 as StdU64;

    fn counter() -> Arc<StdU64> {
        Arc::new(StdU64::new(0))
    }

    fn bump_counter(c: &Arc<StdU64>) -> impl FnOnce() + Send + 'static {
        let c = c.clone();
        move || {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn action_runs_at_once_when_no_thread_is_protected() {
        let epoch = Epoch::new();
        let ran = counter();
        let at = epoch.bump_with_action(bump_counter(&ran));
        assert_eq!(at, 1);
        assert_eq!(epoch.current(), 2);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(epoch.pending_actions(), 0);
        assert!(epoch.is_safe(1));
    }

    #[test]
    fn action_waits_for_a_protected_thread_to_refresh() {
        let epoch = Epoch::new();
        let mut a = epoch.register();
        let mut b = epoch.register();
        let mut guard_a = a.protect();
        let ran = counter();
        {
            let mut guard_b = b.protect();
            guard_b.bump_with_action(bump_counter(&ran));
            // b refreshed past the bump; a still holds epoch 1.
            assert_eq!(ran.load(Ordering::SeqCst), 0);
            assert_eq!(epoch.pending_actions(), 1);
            assert!(!epoch.is_safe(1));
            guard_b.refresh();
            assert_eq!(ran.load(Ordering::SeqCst), 0);
        }
        assert_eq!(guard_a.local_epoch(), 1);
        assert!(std::ptr::eq(guard_a.epoch(), &epoch));
        guard_a.refresh();
        assert_eq!(guard_a.local_epoch(), 2);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(epoch.is_safe(1));
        guard_a.refresh();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "an action runs once");
    }

    #[test]
    fn unprotecting_the_last_holder_runs_the_action() {
        let epoch = Epoch::new();
        let mut a = epoch.register();
        let guard = a.protect();
        let ran = counter();
        epoch.bump_with_action(bump_counter(&ran));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        drop(guard);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn safe_epoch_is_one_below_the_oldest_protected() {
        let epoch = Epoch::new();
        let mut a = epoch.register();
        let mut b = epoch.register();
        let _ga = a.protect(); // at 1
        epoch.bump();
        epoch.bump(); // current 3
        let _gb = b.protect(); // at 3
        assert_eq!(epoch.compute_safe_to_reclaim(epoch.current()), 0);
        drop(_ga);
        assert_eq!(epoch.compute_safe_to_reclaim(epoch.current()), 2);
        drop(_gb);
        assert_eq!(epoch.compute_safe_to_reclaim(epoch.current()), 2);
    }

    #[test]
    fn actions_run_in_epoch_order_as_epochs_become_safe() {
        let epoch = Epoch::new();
        let mut a = epoch.register();
        let mut b = epoch.register();
        let mut ga = a.protect(); // at 1
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let push = |n: u32| {
            let order = order.clone();
            move || order.lock().unwrap().push(n)
        };
        epoch.bump_with_action(push(1)); // waits for 1 to be safe
        let mut gb = b.protect(); // at 2
        epoch.bump_with_action(push(2)); // waits for 2 to be safe
        ga.refresh(); // a at 3; b still at 2
        assert_eq!(*order.lock().unwrap(), [1]);
        gb.refresh();
        assert_eq!(*order.lock().unwrap(), [1, 2]);
    }

    #[test]
    fn an_action_may_bump_with_another_action() {
        let epoch = Arc::new(Epoch::new());
        let ran = counter();
        let inner = bump_counter(&ran);
        let e = epoch.clone();
        epoch.bump_with_action(move || {
            e.bump_with_action(inner);
        });
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(epoch.current(), 3);
        // The Arc cycle is broken: the closure holding `e` has run and been dropped.
        assert_eq!(Arc::strong_count(&epoch), 1);
    }

    #[test]
    fn a_thread_registers_in_the_slot_it_had_last_and_live_handles_never_share_one() {
        let epoch = Epoch::new();
        let (took, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            let other = s.spawn(|| {
                let handle = epoch.register();
                took.wait();
                release.wait();
                drop(handle);
            });
            took.wait();
            // Two live handles of one thread: two slots, neither the other thread's.
            let twice = (epoch.register(), epoch.register());
            assert!(!std::ptr::eq(twice.0.slot, twice.1.slot));
            drop(twice);
            let mine: *const Slot = epoch.register().slot;
            release.wait();
            other.join().unwrap();
            // With a lower slot free again, the thread still takes the one it had.
            assert!(std::ptr::eq(epoch.register().slot, mine));
            assert_eq!(epoch.registered_threads(), 0);
        });
    }

    #[test]
    fn slots_are_reused_and_the_table_grows_past_one_segment() {
        let epoch = Epoch::new();
        let handles: Vec<_> = (0..SEGMENT_SLOTS * 2 + 3)
            .map(|_| epoch.register())
            .collect();
        assert_eq!(epoch.registered_threads(), SEGMENT_SLOTS * 2 + 3);
        drop(handles);
        assert_eq!(epoch.registered_threads(), 0);
        // A thread of the third segment still holds back an action.
        let mut many: Vec<_> = (0..SEGMENT_SLOTS * 2 + 1)
            .map(|_| epoch.register())
            .collect();
        let last = many.last_mut().unwrap();
        let guard = last.protect();
        let ran = counter();
        epoch.bump_with_action(bump_counter(&ran));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        drop(guard);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        // Thousands of short-lived threads over time use a bounded table.
        for _ in 0..1000 {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut h = epoch.register();
                    let mut g = h.protect();
                    g.refresh();
                });
            });
        }
        drop(many);
        assert_eq!(epoch.registered_threads(), 0);
    }

    #[test]
    fn dropping_the_epoch_runs_pending_actions() {
        let ran = counter();
        {
            let epoch = Epoch::new();
            let mut a = epoch.register();
            let mut g = a.protect();
            g.bump_with_action(bump_counter(&ran));
            // A second thread's protection never ends before the drop below.
            let mut b = epoch.register();
            let gb = b.protect();
            epoch.bump_with_action(bump_counter(&ran));
            assert_eq!(ran.load(Ordering::SeqCst), 1);
            drop(gb);
            drop(g);
            drop((b, a));
            // gb's drop drained the second action already.
            assert_eq!(ran.load(Ordering::SeqCst), 2);
            let mut c = epoch.register();
            let gc = c.protect();
            epoch.bump_with_action(bump_counter(&ran));
            std::mem::forget(gc); // never unprotects: only the epoch's drop runs it
            // The slot stays protected; drop the handle's borrow by forgetting it too.
            std::mem::forget(c);
            assert_eq!(ran.load(Ordering::SeqCst), 2);
        }
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    }

    /// A version of shared state that readers check is never retired under them.
    struct Version {
        retired: StdU64,
        readers: StdU64,
    }

    /// Threads read the current version under protection while others swap in a new one
    /// and retire the old through a trigger action. The action asserts that no reader is
    /// inside the old version and that every thread holding a guard is past the action's
    /// epoch; readers assert the version is not retired; every action runs exactly once.
    #[test]
    fn stress_each_action_runs_once_and_never_early() {
        const THREADS: usize = 6;
        const OPS: usize = 20_000;
        /// A thread's published local epoch while it changes it (or 0 while unknown).
        const MOVING: u64 = u64::MAX;
        let epoch = Epoch::new();
        let versions: Vec<Arc<Version>> = (0..THREADS * OPS / 64 + 2)
            .map(|_| {
                Arc::new(Version {
                    retired: StdU64::new(0),
                    readers: StdU64::new(0),
                })
            })
            .collect();
        // Each thread's local epoch as it last saw it after protecting or refreshing.
        let published: Arc<Vec<StdU64>> = Arc::new((0..THREADS).map(|_| StdU64::new(0)).collect());
        let current = std::sync::atomic::AtomicUsize::new(0);
        let next = std::sync::atomic::AtomicUsize::new(1);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (epoch, versions, current, next) = (&epoch, &versions, &current, &next);
                let published = published.clone();
                s.spawn(move || {
                    let mine = &published[t];
                    let mut handle = epoch.register();
                    let mut guard = handle.protect();
                    mine.store(guard.local_epoch(), Ordering::SeqCst);
                    for i in 0..OPS {
                        let v = &versions[current.load(Ordering::SeqCst)];
                        v.readers.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(
                            v.retired.load(Ordering::SeqCst),
                            0,
                            "read a retired version"
                        );
                        v.readers.fetch_sub(1, Ordering::SeqCst);
                        if (i + t) % 64 == 0 {
                            let n = next.fetch_add(1, Ordering::SeqCst);
                            if n < versions.len() {
                                let old = current.swap(n, Ordering::SeqCst);
                                let old = versions[old].clone();
                                let published = published.clone();
                                // The action's epoch is at least this.
                                let at_least = epoch.current();
                                mine.store(MOVING, Ordering::SeqCst);
                                guard.bump_with_action(move || {
                                    assert_eq!(
                                        old.readers.load(Ordering::SeqCst),
                                        0,
                                        "retired while a reader was inside"
                                    );
                                    for p in published.iter() {
                                        let p = p.load(Ordering::SeqCst);
                                        assert!(
                                            p == 0 || p == MOVING || p > at_least,
                                            "ran while a thread was protected at {p}"
                                        );
                                    }
                                    old.retired.fetch_add(1, Ordering::SeqCst);
                                });
                                mine.store(guard.local_epoch(), Ordering::SeqCst);
                            }
                        }
                        if i % 7 == 0 {
                            mine.store(MOVING, Ordering::SeqCst);
                            guard.refresh();
                            mine.store(guard.local_epoch(), Ordering::SeqCst);
                        }
                        if i % 1000 == 999 {
                            // Leave and come back, as a thread between batches does.
                            mine.store(0, Ordering::SeqCst);
                            drop(guard);
                            guard = handle.protect();
                            mine.store(guard.local_epoch(), Ordering::SeqCst);
                        }
                    }
                    mine.store(0, Ordering::SeqCst);
                });
            }
        });
        epoch.drain();
        assert_eq!(epoch.pending_actions(), 0);
        let live = current.load(Ordering::SeqCst);
        let used = next.load(Ordering::SeqCst).min(versions.len());
        for (i, v) in versions.iter().enumerate().take(used) {
            let expect = u64::from(i != live);
            assert_eq!(v.retired.load(Ordering::SeqCst), expect, "version {i}");
        }
    }
}
