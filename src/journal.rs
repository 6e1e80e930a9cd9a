//! The journal: how a keyspace's write reaches the write-ahead log, in the same order as
//! it reaches the index, at the [`Durability`] the caller asked for.
//!
//! # The order rule
//!
//! Recovery replays the log in sequence-number order, so for every key the order of its
//! log records must be the order in which its writes reached the index; otherwise a
//! replay could end with a value the index never held last. Two writers of one key are
//! therefore serialized from the log append through the index write, by one of two
//! locks:
//!
//! - A tree's single write appends while it holds the write lock of the key's page,
//!   after the lock and before the record is placed ([`Journal::commit_ordered_by_index`]),
//!   so the page lock, which every write of the key takes, orders the appends. It holds
//!   the key's *stripe* (one of [`STRIPES`] reader-writer locks, chosen by a hash of the
//!   keyspace and key) shared, which orders it against batches and checkpoints.
//! - Every other logged write (a batch, a hash store's write) holds its keys' stripes
//!   exclusively across both.
//!
//! Writers of different stripes or pages never wait for each other; the log's own lock
//! orders their appends. (An earlier version held the stripe exclusively for a tree's
//! single write too. Under a skewed workload a hot stripe then queued its writers behind
//! a holder that was itself waiting for a page lock or preempted: at 16 threads on 2
//! cores most of the logged writers' task switches were waits for a stripe.)
//!
//! # Batches
//!
//! A batch is one log record, so recovery replays all of it or none of it (a torn record
//! fails its checksum, and the reader stops before it). Its writer takes the stripe locks
//! of every key of the batch, exclusively and in ascending stripe order (so two batches
//! cannot deadlock), appends the record, writes every key, and only then releases the
//! stripes. A reader that must not see half of a batch takes the stripe locks of the keys
//! it reads, shared and in the same order ([`Journal::read_locked`]): it runs wholly
//! before or wholly after any batch that shares a stripe with it.
//!
//! Uses: `wal`, `sync`, `error`.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use crate::wal::{Flusher, Log, LogOpRef, Preparer};

/// Stripe locks of a journal: writers of keys in different stripes never wait for each
/// other. A power of two.
pub(crate) const STRIPES: usize = 1024;

/// How durable a write is when the call that made it returns, and so what of it a crash
/// leaves.
///
/// | level | the call returns | after a crash of the process or machine |
/// |---|---|---|
/// | [`Unlogged`](Durability::Unlogged) | after the index write | there if a checkpoint captured it, else gone: it is not in the log |
/// | [`Logged`](Durability::Logged) | after the log append, before any disk write (unless older records wait past twice the flush interval: then after its own record's sync) | there if a group write covered it first: at most about twice [`DbOptions::flush_interval`](crate::DbOptions::flush_interval) of acknowledged writes can be lost, under load too |
/// | [`Synced`](Durability::Synced) | after the `fdatasync` that covers its log record | there |
///
/// Whatever the level, a write is all or nothing after a crash, and so is a batch; the
/// writes that survive are a prefix, in log order, of the logged writes; and
/// [`Db::persist`](crate::Db::persist) makes every logged write acknowledged so far
/// durable. A clean close (dropping the [`Db`](crate::Db)) does the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Not logged: the fastest level. A crash keeps it only if a checkpoint captured it
    /// (a clean close takes one, and the background checkpoint interval,
    /// [`DbOptions::checkpoint_interval`](crate::DbOptions::checkpoint_interval), takes
    /// one within about that long of an unlogged write). A
    /// [`WriteBatch`](crate::WriteBatch) is logged even at this level, as at
    /// [`Durability::Logged`].
    Unlogged,
    /// Logged, and made durable by the background flusher within the flush interval;
    /// the caller does not wait for the disk, unless the flusher is late (a busy
    /// machine): a write that finds a record older than twice the interval not yet
    /// durable waits for its own record's sync, so the bound holds under load. The
    /// default.
    #[default]
    Logged,
    /// Logged and synced: the call returns once its record is on stable storage. Writers
    /// that arrive together share one `fdatasync` (group commit).
    Synced,
}

/// A stripe lock, alone on its cache line.
#[repr(align(64))]
struct Stripe(RwLock<()>);

/// The write-ahead log and the stripe locks of one database (see the module docs).
pub(crate) struct Journal {
    log: Arc<Log>,
    stripes: Box<[Stripe]>,
    /// Set by an unlogged write, cleared when a checkpoint takes its position
    /// ([`Journal::quiesce`]): what the checkpoint interval's "written since the last
    /// checkpoint" sees of the writes the log does not.
    unlogged_since_quiesce: AtomicBool,
    /// The checkpoint epoch: bumped by every [`Journal::quiesce`], read by logged tree
    /// writes under their stripe (so it cannot change between a write's append and its
    /// placement), which stamp their page with it.
    epoch: AtomicU64,
    /// The database's failure state (see [`Journal::fail`]): set once, never cleared.
    failed: AtomicBool,
    /// Why it failed (the first cause).
    failure: parking_lot::Mutex<Option<Failure>>,
    /// A batch was left half applied in memory: readers are refused too, so that none
    /// sees it (recovery completes or removes it from the log). Read without the mutex.
    unreadable: AtomicBool,
    /// How old a `Logged` write's unflushed predecessors may be before the next
    /// `Logged` write waits for the disk (see [`Journal::bound_lag`]).
    flush_interval: Duration,
    /// Makes `Logged` writes durable within the flush interval. Dropped before the log's
    /// last user, which stops its thread.
    _flusher: Flusher,
    /// Zero-fills the log's next segment ahead of need, off the writers' path.
    _preparer: Preparer,
    /// The database directory's locked `LOCK` file: held while any handle to the
    /// database's keyspaces lives, since each can still write through this journal.
    /// Declared last, so dropped last: the flusher's last group write and the
    /// preparer's last spare are done before another process can take the directory.
    _lock: std::fs::File,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

/// Why a database can no longer make writes durable.
#[derive(Clone, Debug)]
struct Failure {
    cause: String,
}

/// The stripe of `key` in `keyspace`.
fn stripe_of(keyspace: u32, key: &[u8]) -> usize {
    let h = crc32c::crc32c_append(keyspace, key);
    // Mix the bits so that keys differing only in their high bytes spread too.
    (h.wrapping_mul(0x9e37_79b9) >> 16) as usize % STRIPES
}

/// The distinct stripes of `keys`, ascending: the order every multi-stripe holder
/// takes them in.
fn stripes_of<'a>(keys: impl Iterator<Item = (u32, &'a [u8])>) -> Vec<usize> {
    let mut stripes: Vec<usize> = keys.map(|(ks, key)| stripe_of(ks, key)).collect();
    stripes.sort_unstable();
    stripes.dedup();
    stripes
}

/// The keyspace and key an op changes.
fn target<'a>(op: &LogOpRef<'a>) -> (u32, &'a [u8]) {
    op.target()
}

impl Journal {
    /// A journal over `log`, whose flusher runs every `flush_interval`, and whose
    /// preparer makes the log's spare segments.
    pub(crate) fn new(
        lock: std::fs::File,
        log: Arc<Log>,
        flush_interval: std::time::Duration,
    ) -> Journal {
        let flusher = Flusher::start(Arc::clone(&log), flush_interval);
        let preparer = Preparer::start(Arc::clone(&log));
        Journal {
            _lock: lock,
            log,
            stripes: (0..STRIPES).map(|_| Stripe(RwLock::new(()))).collect(),
            unlogged_since_quiesce: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failure: parking_lot::Mutex::new(None),
            unreadable: AtomicBool::new(false),
            flush_interval,
            _flusher: flusher,
            _preparer: preparer,
        }
    }

    /// Logs `ops` as one record (unless `durability` is `Unlogged`) and runs `apply`,
    /// which writes them to their indexes, while the stripes of every key of `ops` are
    /// locked; then waits as `durability` says.
    ///
    /// An `apply` that fails leaves the record in the log: the write is refused to the
    /// caller, and recovery may still replay it (the index that failed is poisoned and
    /// must be reopened anyway).
    pub(crate) fn commit<T>(
        &self,
        ops: &[LogOpRef<'_>],
        durability: Durability,
        apply: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.check_writable()?;
        if durability == Durability::Unlogged && ops.len() == 1 {
            // Nothing to order against the log, and one key is all or nothing anyway.
            return self.noting_unlogged(apply);
        }
        // A batch is logged whatever the level: a checkpoint taken while it applies
        // could capture part of it, and only its record can complete it after a crash.
        let durability = match durability {
            Durability::Unlogged => Durability::Logged,
            level => level,
        };
        // One key (every single write) takes its one stripe without building lists.
        let (one, many);
        if let [op] = ops {
            let (keyspace, key) = target(op);
            one = Some(self.stripes[stripe_of(keyspace, key)].0.write());
            many = Vec::new();
        } else {
            one = None;
            many = stripes_of(ops.iter().map(target))
                .into_iter()
                .map(|s| self.stripes[s].0.write())
                .collect::<Vec<RwLockWriteGuard<'_, ()>>>();
        }
        let seq = match durability {
            Durability::Unlogged => None,
            Durability::Logged | Durability::Synced => Some(
                self.log
                    .append_refs(ops.iter().copied())
                    .map_err(log_error)?,
            ),
        };
        let applied = self.noted(apply());
        drop((one, many));
        let out = applied?;
        self.wait_as(durability, seq)?;
        Ok(out)
    }

    /// Waits as `durability` says for record `seq` (if one was logged): `Synced` for
    /// its sync; `Logged` only if the log lags (see [`Journal::bound_lag`]).
    fn wait_as(&self, durability: Durability, seq: Option<u64>) -> Result<()> {
        match (durability, seq) {
            (Durability::Synced, Some(seq)) => self.log.wait_durable(seq).map_err(log_error),
            (Durability::Logged, Some(seq)) => self.bound_lag(seq),
            _ => Ok(()),
        }
    }

    /// Keeps the `Logged` promise under load: a logged write is acknowledged at once
    /// only while the log's oldest record not yet durable is younger than twice the
    /// flush interval. In the flusher's own rhythm a record waits up to one interval
    /// for the next group and then that group's write and sync; past twice the
    /// interval the flusher is late (starved of CPU on a busy machine, or behind a
    /// slow disk), and the write waits until its own record is durable, leading or
    /// joining a group write itself. So a crash loses only writes acknowledged within
    /// about twice the flush interval before it. (Waiting from one interval on made
    /// writers wait in every cycle, for each group's write: 0.63× the throughput of
    /// logged updates at 2 threads.)
    fn bound_lag(&self, seq: u64) -> Result<()> {
        self.log
            .wait_if_late(seq, self.flush_interval * 2)
            .map_err(log_error)
    }

    /// A single write of `op`'s key by an index that orders its writers of one key
    /// itself (the tree, by the lock of the key's page): `apply` writes the key and
    /// calls the appender it is given while it holds that lock and before the write
    /// becomes visible, once per attempt. The appender logs `op` (unless `durability`
    /// is `Unlogged`) and answers the checkpoint epoch the record was appended in
    /// (`None` if it logged nothing); then this waits as `durability` says.
    ///
    /// The stripe is held shared from before the first append to after the write, so
    /// the write runs wholly before or after a batch of the key and outside
    /// [`Journal::quiesce`]; two single writers of one key do not wait for each other
    /// here but on the index's lock, across which each appends. An attempt that
    /// restarts appends again: the log may hold a record twice, and replaying the
    /// earlier copy is harmless, since the later one, or a later write of the key,
    /// follows it.
    pub(crate) fn commit_ordered_by_index<T>(
        &self,
        op: LogOpRef<'_>,
        durability: Durability,
        apply: impl FnOnce(&mut dyn FnMut() -> Result<Option<u64>>) -> Result<T>,
    ) -> Result<T> {
        self.check_writable()?;
        if durability == Durability::Unlogged {
            return self.noting_unlogged(|| apply(&mut || Ok(None)));
        }
        let (keyspace, key) = target(&op);
        let shared = self.stripes[stripe_of(keyspace, key)].0.read();
        let mut seq = None;
        let applied = apply(&mut || {
            seq = Some(
                self.log
                    .append_refs(std::iter::once(op))
                    .map_err(log_error)?,
            );
            // The stripe held shared keeps a quiesce, and so the epoch's next value,
            // out until the write is placed.
            Ok(Some(self.epoch()))
        });
        let applied = self.noted(applied);
        drop(shared);
        let out = applied?;
        debug_assert!(seq.is_some(), "a write returned Ok without logging");
        self.wait_as(durability, seq)?;
        Ok(out)
    }

    /// Runs `apply`, an unlogged write of `key` in `keyspace`, while the key's stripe is
    /// locked shared: it does not run inside a logged read-modify-write of the key
    /// ([`Journal::commit_computed`]), which holds the stripe exclusively from its read
    /// to its write, nor inside a logged write or batch of the key.
    pub(crate) fn unlogged<T>(
        &self,
        keyspace: u32,
        key: &[u8],
        apply: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.check_writable()?;
        let _shared = self.stripes[stripe_of(keyspace, key)].0.read();
        self.noting_unlogged(apply)
    }

    /// Runs `f`, an unlogged read-modify-write of `key` in `keyspace`, while the key's
    /// stripe is locked exclusively: no other write of the key runs meanwhile.
    pub(crate) fn exclusive<T>(
        &self,
        keyspace: u32,
        key: &[u8],
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.check_writable()?;
        let _held = self.stripes[stripe_of(keyspace, key)].0.write();
        self.noting_unlogged(f)
    }

    /// A read-modify-write of `key` in `keyspace` at `durability` (not `Unlogged`):
    /// with the key's stripe locked exclusively, `compute` reads the key and gives its
    /// new value (`None` deletes), which is logged and then written by `apply`; then
    /// waits as `durability` says. Every other write of the key holds its stripe too
    /// (exclusively, or shared for an unlogged one), so none comes between the read and
    /// the write, and the log orders the key's writes as they reached the index. A
    /// value computed with `true` is the reference of a value already in the value
    /// store (logged as `PutExternal`).
    #[allow(clippy::type_complexity)]
    pub(crate) fn commit_computed<T>(
        &self,
        keyspace: u32,
        key: &[u8],
        durability: Durability,
        compute: impl FnOnce() -> Result<(Option<(Vec<u8>, bool)>, T)>,
        apply: impl FnOnce(Option<(&[u8], bool)>) -> Result<()>,
    ) -> Result<T> {
        self.check_writable()?;
        let stripe = self.stripes[stripe_of(keyspace, key)].0.write();
        let (value, out) = compute()?;
        let value = value.as_ref().map(|(v, external)| (&v[..], *external));
        let op = match value {
            Some((reference, true)) => LogOpRef::PutExternal {
                keyspace,
                key,
                reference,
            },
            other => LogOpRef::write(keyspace, key, other.map(|(v, _)| v)),
        };
        let seq = self
            .log
            .append_refs(std::iter::once(op))
            .map_err(log_error)?;
        let applied = self.noted(apply(value));
        drop(stripe);
        applied?;
        self.wait_as(durability, Some(seq))?;
        Ok(out)
    }

    /// Runs `read` while the stripes of `keys` are locked shared: it sees any batch that
    /// writes one of `keys` wholly or not at all.
    pub(crate) fn read_locked<'a, T>(
        &self,
        keys: impl Iterator<Item = (u32, &'a [u8])>,
        read: impl FnOnce() -> T,
    ) -> T {
        let stripes = stripes_of(keys);
        let held: Vec<RwLockReadGuard<'_, ()>> =
            stripes.iter().map(|&s| self.stripes[s].0.read()).collect();
        let out = read();
        drop(held);
        out
    }

    /// Runs `f` while every stripe is locked exclusively: no logged write is between
    /// its log append and its index write meanwhile, so every record below the log's
    /// position read in `f` is in its index. Begins a new checkpoint epoch, and answers
    /// with `f`'s result whether an unlogged write ran since the last quiesce (clearing
    /// that flag; see [`Journal::noting_unlogged`] for which writes it sees).
    pub(crate) fn quiesce<T>(&self, f: impl FnOnce() -> T) -> (T, bool) {
        let held: Vec<RwLockWriteGuard<'_, ()>> =
            self.stripes.iter().map(|s| s.0.write()).collect();
        let unlogged = self.unlogged_since_quiesce.swap(false, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let out = f();
        drop(held);
        (out, unlogged)
    }

    /// The checkpoint epoch: how many times [`Journal::quiesce`] ran since the database
    /// opened. Stable while the caller holds a stripe.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether an unlogged write returned since the last [`Journal::quiesce`] (a
    /// trigger, not a promise: a write racing the quiesce may be counted on either
    /// side of it, and one that is counted after it brings one checkpoint more).
    pub(crate) fn unlogged_since_quiesce(&self) -> bool {
        self.unlogged_since_quiesce.load(Ordering::SeqCst)
    }

    /// Runs `apply`, an unlogged write, noting it for [`Journal::quiesce`] before it
    /// runs and, if it succeeded, after. A checkpoint that replays from the previous
    /// quiesce must know of every unlogged write since then (`docs/design.md`): one
    /// that returned before this quiesce was noted after it ran, and one still running
    /// then was noted before, so the only writes it misses began before the previous
    /// quiesce and returned after this one. The flag is loaded first, so that once it
    /// is set writers only read its cache line until the next checkpoint clears it.
    fn noting_unlogged<T>(&self, apply: impl FnOnce() -> Result<T>) -> Result<T> {
        self.note_unlogged();
        let out = self.noted(apply());
        if out.is_ok() {
            self.note_unlogged();
        }
        out
    }

    /// Passes on a keyspace write's result; a keyspace that reports itself poisoned
    /// (it could not write its pages or logs, so it can never reach a checkpoint) puts
    /// the database in its failure state.
    fn noted<T>(&self, out: Result<T>) -> Result<T> {
        if let Err(Error::Poisoned { cause }) = &out {
            self.fail(cause, false);
        }
        out
    }

    fn note_unlogged(&self) {
        if !self.unlogged_since_quiesce.load(Ordering::SeqCst) {
            self.unlogged_since_quiesce.store(true, Ordering::SeqCst);
        }
    }

    /// Makes every record appended so far durable.
    pub(crate) fn persist(&self) -> Result<()> {
        self.log.flush().map_err(log_error)
    }

    /// Puts the database in its failure state: it can no longer make writes durable
    /// (the log failed, a keyspace could not write its pages, a background thread
    /// died, a batch was left half applied). From then on every write at every level
    /// is refused with [`Error::Poisoned`] naming `cause`, and checkpoints are refused,
    /// so nothing is acknowledged that a later open will not have and nothing is
    /// committed over what the log still holds. With `unreadable`, reads are refused
    /// too. The first cause is kept; a later call can only make it unreadable.
    pub(crate) fn fail(&self, cause: &str, unreadable: bool) {
        let mut f = self.failure.lock();
        if f.is_none() {
            log::error!(
                "bfdb: the database can no longer make writes durable and refuses them: {cause}"
            );
            *f = Some(Failure {
                cause: cause.to_string(),
            });
        }
        drop(f);
        if unreadable {
            self.unreadable.store(true, Ordering::Release);
        }
        self.failed.store(true, Ordering::Release);
    }

    /// The failure state's error, if the database is in it (a failed log puts it
    /// there as soon as it is seen).
    pub(crate) fn failure(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            if let Some(cause) = self.log.failure() {
                self.fail(&cause, false);
            } else {
                return None;
            }
        }
        let f = self.failure.lock();
        let cause = f.as_ref().map_or_else(String::new, |f| f.cause.clone());
        Some(Error::Poisoned {
            cause: format!(
                "the database can no longer make writes durable ({cause}); drop it and \
                 every handle and open it again: recovery restores every acknowledged \
                 write"
            ),
        })
    }

    /// Refuses a write once the database is in its failure state.
    pub(crate) fn check_writable(&self) -> Result<()> {
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Refuses a read once a half-applied batch made the database unreadable.
    pub(crate) fn check_readable(&self) -> Result<()> {
        if !self.unreadable.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(self.failure().unwrap_or(Error::Poisoned {
            cause: String::new(),
        }))
    }

    /// The log, for recovery statistics.
    pub(crate) fn log(&self) -> &Log {
        &self.log
    }
}

impl Drop for Journal {
    /// The last handle of the database is gone: every logged write acknowledged through
    /// any of them becomes durable now, as `Db`'s own close makes them, rather than
    /// waiting for a flusher that is about to stop.
    fn drop(&mut self) {
        if let Err(e) = self.log.flush() {
            log::warn!("bfdb: the log's last flush failed: {e}");
        }
    }
}

/// A log failure as the crate's error. The log poisons itself on a failed write or
/// sync, so every later logged write fails the same way.
fn log_error(e: std::io::Error) -> Error {
    Error::from(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_spread_and_are_ascending() {
        let keys: Vec<Vec<u8>> = (0u32..4096).map(|i| i.to_be_bytes().to_vec()).collect();
        let stripes = stripes_of(keys.iter().map(|k| (1, &k[..])));
        assert!(stripes.windows(2).all(|w| w[0] < w[1]));
        // 4096 keys over 1024 stripes leave few stripes empty.
        assert!(
            stripes.len() > STRIPES * 9 / 10,
            "{} stripes used",
            stripes.len()
        );
        // The keyspace takes part: one key in two keyspaces usually differs.
        let differ = (0u32..256)
            .filter(|i| stripe_of(1, &i.to_be_bytes()) != stripe_of(2, &i.to_be_bytes()))
            .count();
        assert!(differ > 200, "{differ}");
    }
}
