//! The checkpoint protocol (`Shared::checkpoint`, argued in `docs/design.md`, "The
//! checkpoint protocol"): a generation, the quiesce that reads the log position, the
//! flush of every keyspace, the capture of the trees' leaves, the commit (page files
//! synced, the log durable, the checkpoint file, the manifest naming it), and the
//! retirement of the checkpoint that falls out of the two kept; the checkpoints kept
//! and what they pin; and the background checkpointer with its triggers and backoff.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::hash::checkpoint::{self as hash_checkpoint, F2Extents};
use crate::storage::values::Backpressure;
use crate::storage::{LOG_BLOCK_BYTES, PageNo, PinSet, ShadowStore};
use crate::sync::atomic::Ordering;
use crate::ticker::Ticker;
use crate::tree::Tree;
use crate::wal::LogPosition;

use super::catalog::Keyspace;
use super::checkpoint::{Checkpoint, KeyspaceLeaves, Leaves};
use super::dir::{checkpoint_path, named};
use super::manifest::{CheckpointRef, KEPT_CHECKPOINTS};
use super::{DbStats, Shared};

/// A committed checkpoint the database keeps, with the slots it pinned per tree
/// keyspace and the log extents it holds per hash keyspace.
pub(super) struct Kept {
    pub(super) generation: u64,
    pub(super) position: LogPosition,
    pub(super) pins: HashMap<u32, PinSet>,
    pub(super) hash: HashMap<u32, F2Extents>,
}

/// Which dirty pages a checkpoint merges into their leaf pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Merge {
    /// Every one: recovery replays only what follows the checkpoint's quiesce (the
    /// checkpoint on close, after recovery, and `Db::checkpoint`).
    All,
    /// Those with a write older than the previous checkpoint's quiesce, or unlogged:
    /// the background checkpoints (docs/design.md, "Checkpoints that leave recent
    /// pages dirty").
    Older,
}

/// The checkpoints kept, newest first, and what the next one needs.
pub(super) struct Checkpoints {
    pub(super) kept: Vec<Kept>,
    pub(super) next_generation: u64,
    /// The checkpoint epoch and log position of the last quiesce (of the open, before
    /// any): the replay start of a checkpoint that leaves pages dirty since then.
    pub(super) quiesced: (u64, LogPosition),
    /// The log block of the last committed checkpoint's quiesce: the log-size trigger
    /// counts from here (its replay start may lie further back).
    pub(super) trigger_from: u64,
    pub(super) stats: DbStats,
    pub(super) last_at: Instant,
}

/// A point in the checkpoint protocol at which a test makes it fail, as a crash there
/// would stop it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CheckpointCrashPoint {
    /// No failure.
    None = 0,
    /// After the trees' dirty records were written to their pages.
    AfterFlush = 1,
    /// After the leaves were captured and pinned.
    AfterCapture = 2,
    /// After the page files were synced.
    AfterPageSync = 3,
    /// After the log was made durable through the checkpoint's records.
    AfterLogFlush = 4,
    /// After the checkpoint file was written, before the manifest names it.
    AfterCheckpointFile = 5,
    /// After the manifest committed the checkpoint, before the retired one is released.
    AfterCommit = 6,
    /// A panic where `AfterFlush` fails: what a bug in a checkpoint does to the thread
    /// running it (the background checkpointer's panic must reach the database).
    PanicAfterFlush = 7,
}

/// Whether `options` start the background checkpointer.
pub(super) fn runs(options: &super::DbOptions) -> bool {
    options.checkpoint_log_bytes > 0 || options.checkpoint_interval.is_some()
}

/// The longest a failing background checkpoint waits before it is tried again.
const MAX_CHECKPOINT_BACKOFF: Duration = Duration::from_secs(5);

/// Starts the background checkpointer if a trigger is on; dropping it stops the thread.
/// A checkpoint that fails is tried again after a wait that doubles with each failure
/// (up to [`MAX_CHECKPOINT_BACKOFF`]); once the database is in its failure state it is
/// not tried at all. A panic puts the database in its failure state.
pub(super) fn start(shared: &Arc<Shared>) -> Option<Ticker> {
    let o = &shared.options;
    if !runs(o) {
        return None;
    }
    let tick = o
        .checkpoint_interval
        .map_or(Duration::from_millis(50), |i| {
            (i / 4).min(Duration::from_millis(50))
        });
    let weak = Arc::downgrade(shared);
    let on_panic = {
        let weak = Arc::downgrade(shared);
        move |why: String| {
            if let Some(shared) = weak.upgrade() {
                shared.journal.fail(
                    &format!("the background checkpointer panicked: {why}"),
                    false,
                );
            }
        }
    };
    let mut backoff = Duration::ZERO;
    let mut retry_at = Instant::now();
    Ticker::start("bfdb-checkpointer", tick, on_panic, move |stopping| {
        let Some(shared) = weak.upgrade() else {
            return false;
        };
        if Instant::now() < retry_at || shared.journal.failure().is_some() {
            return true;
        }
        shared.rebalance_memory();
        // Freed values become reusable only two checkpoints after their free: while
        // they are due, the checkpoints follow one another without waiting for a tick.
        let mut due = shared.checkpoint_due();
        while due {
            match shared.checkpoint(Merge::Older) {
                Ok(()) => backoff = Duration::ZERO,
                Err(e) => {
                    backoff = (backoff * 2).clamp(tick, MAX_CHECKPOINT_BACKOFF);
                    retry_at = Instant::now() + backoff;
                    log::warn!(
                        "bfdb: a background checkpoint failed, tried again in {backoff:?}: {e}"
                    );
                    break;
                }
            }
            due = !stopping() && shared.values_due();
        }
        true
    })
}

impl Shared {
    /// Moves the budget between the trees' pool and the value cache by where the
    /// stored bytes lie (`db/memory.rs`): the value store's live bytes against the
    /// trees' leaf pages. Nothing while the store never held a value.
    pub(super) fn rebalance_memory(&self) {
        if !self.values.holds_values() {
            return;
        }
        let leaf_bytes: u64 = self
            .catalog
            .read()
            .keyspaces
            .values()
            .map(|ks| match ks {
                Keyspace::Tree { shadow, .. } => {
                    crate::storage::PageStore::stats(&**shadow).live_pages
                        * crate::storage::PAGE_SIZE as u64
                }
                Keyspace::Hash(_) => 0,
            })
            .sum();
        let value_bytes = self.values.stats().live_bytes;
        self.budget.set_stored(value_bytes, leaf_bytes);
    }

    /// Takes a checkpoint (the protocol is argued in `docs/design.md`, "Checkpoints").
    pub(super) fn checkpoint(&self, merge: Merge) -> Result<()> {
        let out = self.checkpoint_once(merge);
        self.rebalance_memory();
        if let Err(Error::Poisoned { cause }) = &out {
            // A keyspace that cannot write its pages or logs never reaches a
            // checkpoint again: nothing unlogged can become durable.
            self.journal.fail(cause, false);
        }
        out
    }

    fn checkpoint_once(&self, merge: Merge) -> Result<()> {
        // A database in its failure state commits nothing: a checkpoint could capture
        // a half-applied batch, or writes the log no longer holds.
        self.journal.check_writable()?;
        let started = Instant::now();
        let mut c = self.checkpoints.lock();
        // A generation whose pin bit no kept checkpoint has: failed checkpoints use up
        // generations, and the ninth after a kept one would share its bit (unpinning it
        // on failure, or retiring that kept one, would then release the other's pages).
        let mut generation = c.next_generation;
        while c
            .kept
            .iter()
            .any(|k| PinSet::share_bit(k.generation, generation))
        {
            generation += 1;
        }
        c.next_generation = generation + 1;
        // The value store's window opens before the quiesce: what records it hears of
        // being placed or replaced from now until its snapshot may or may not be in
        // what this checkpoint captures, and recovery settles those by key.
        self.values.open_window(generation);
        // 1. The log position: every record below it is in its tree. The quiesce begins
        //    a new epoch: logged writes from now on stamp their pages with it.
        let (position, unlogged) = self.journal.quiesce(|| self.journal.log().position());
        let epoch = self.journal.epoch();
        let previous = std::mem::replace(&mut c.quiesced, (epoch, position));
        // The keyspaces after the position: one created before it (and so possibly
        // written below it) is in the catalog by now; one created later has no record
        // below it, and recovery starts it empty and replays all of it.
        let (mut keyspaces, mut hashes) = (Vec::new(), Vec::new());
        for (id, ks) in &self.catalog.read().keyspaces {
            match ks {
                Keyspace::Tree { tree, shadow } => {
                    keyspaces.push((*id, Arc::clone(tree), Arc::clone(shadow)));
                }
                Keyspace::Hash(store) => hashes.push((*id, Arc::clone(store))),
            }
        }
        // 2. Every record in a tree's memory reaches its pages (copy-on-write of pinned
        //    slots keeps the kept checkpoints' pages as they were); every hash store's
        //    logs are flushed and synced, and their extents recorded (segments a kept
        //    checkpoint needs are never deleted).
        //    A checkpoint that merges only the older pages leaves those whose writes
        //    all came after the previous quiesce (epoch `previous.0` or this one): the
        //    log from the previous quiesce's position on holds every write they have not
        //    merged, so that is where its recovery replays from. Not when an unlogged
        //    write ran since the previous quiesce: it is captured, and replaying an
        //    older logged write of its key from before this quiesce would undo it.
        let mut replay_from = position;
        let keep_from = match merge {
            Merge::Older if !unlogged && previous.0 + 1 == epoch => Some(previous.0),
            // The epochs do not follow on (no quiesce but a checkpoint's bumps them):
            // merge everything rather than trust a position.
            _ => None,
        };
        let mut flushed = (0, 0);
        for (_, tree, _) in &keyspaces {
            let f = tree.flush_for_checkpoint(keep_from)?;
            flushed = (flushed.0 + f.merged, flushed.1 + f.left);
            if f.oldest_left.is_some_and(|oldest| oldest < epoch) {
                replay_from = previous.1;
            }
        }
        let hash: Vec<(u32, F2Extents)> = hashes
            .iter()
            .map(|(id, store)| Ok((*id, store.checkpoint()?)))
            .collect::<Result<_>>()?;
        self.crash_point(CheckpointCrashPoint::AfterFlush)?;
        // 3. Record every tree's leaves in key order, pinning each one's slot.
        let mut pins: HashMap<u32, PinSet> = HashMap::new();
        let mut ckpt = Checkpoint {
            generation,
            position: replay_from,
            keyspaces: Vec::new(),
            hash,
            values: Vec::new(),
        };
        let captured = keyspaces.iter().try_for_each(|(id, tree, shadow)| {
            let pages = tree.leaf_pages();
            let mut leaves = Leaves::new(pages);
            let set = pins.entry(*id).or_insert_with(|| PinSet {
                generation,
                slots: Vec::new(),
            });
            let result = tree.capture_leaves(|low, no| {
                if low.is_empty() {
                    // The walk starts (or, after a redistribution moved a boundary it
                    // relied on, starts over). Slots pinned by an abandoned walk stay in
                    // the pin set, to be unpinned with it.
                    leaves.clear();
                }
                // Every page of the leaf, the first with its key.
                let slot = shadow.pin(no, generation)?;
                set.slots.push(slot);
                leaves.push(low, slot);
                for i in 1..pages as u64 {
                    let slot = shadow.pin(PageNo(no.0 + i), generation)?;
                    set.slots.push(slot);
                    leaves.push_slot(slot);
                }
                Ok(())
            });
            ckpt.keyspaces.push(KeyspaceLeaves { id: *id, leaves });
            result
        });
        // The value store as the captured indexes reference it (every extent placed or
        // freed before the window opened, and the uncertain ones since).
        ckpt.values = self.values.snapshot();
        let committed = captured
            .and_then(|()| self.crash_point(CheckpointCrashPoint::AfterCapture))
            .map_err(Uncommitted::Before)
            .and_then(|()| self.commit_checkpoint(&keyspaces, &ckpt));
        match committed {
            Ok(()) => {}
            Err(Uncommitted::Before(e)) => {
                // Not committed: its pins protect nothing.
                for (id, _, shadow) in &keyspaces {
                    if let Some(set) = pins.get(id) {
                        let _ = shadow.unpin(set);
                    }
                }
                return Err(e);
            }
            // The manifest's replacement failed, perhaps after its rename (a failed
            // directory sync): the manifest on disk may name this checkpoint. Its pins
            // stay (its slots are held until the next open, which knows).
            Err(Uncommitted::Maybe(e)) => return Err(e),
        }
        self.crash_point(CheckpointCrashPoint::AfterCommit)?;
        // 4. Keep the newest two; release the one that falls out, and the log only it
        //    needed.
        c.trigger_from = position.block;
        c.kept.insert(
            0,
            Kept {
                generation,
                position: replay_from,
                pins,
                hash: ckpt.hash.iter().copied().collect(),
            },
        );
        let keep = KEPT_CHECKPOINTS.min(c.kept.len());
        let retired: Vec<Kept> = c.kept.drain(keep..).collect();
        for old in &retired {
            // Two kept checkpoints of an older build can share a pin bit: unpinning the
            // retired one would release the other's slots. Its orphans then stay until
            // the next open, which pins only what the manifest names.
            let shared = c
                .kept
                .iter()
                .any(|k| PinSet::share_bit(k.generation, old.generation));
            for (id, _, shadow) in keyspaces.iter().filter(|_| !shared) {
                if let Some(set) = old.pins.get(id) {
                    shadow.unpin(set)?;
                }
            }
            let path = checkpoint_path(&self.dir, old.generation);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                return Err(Error::Io(named(&path, e)));
            }
        }
        // The hash stores' log segments below what the kept checkpoints need go.
        for (id, store) in &hashes {
            store.retain_from(kept_floors(&c.kept, *id))?;
        }
        // Values freed before the oldest kept checkpoint began are in no state a
        // recovery can reach: their extents may be reused once their readers are gone.
        if let Some(oldest) = c.kept.last() {
            self.values.release(oldest.generation)?;
        }
        if let Some(oldest) = c.kept.last() {
            self.journal
                .log()
                .remove_segments_before(oldest.position.block)
                .map_err(Error::Io)?;
        }
        c.last_at = Instant::now();
        release_freed_memory();
        c.stats.checkpoints += 1;
        c.stats.checkpoint_generation = generation;
        c.stats.last_checkpoint_duration = started.elapsed();
        c.stats.last_checkpoint_leaf_pages =
            ckpt.keyspaces.iter().map(|k| k.leaves.len() as u64).sum();
        c.stats.checkpoint_pages_merged += flushed.0;
        c.stats.checkpoint_pages_left_dirty += flushed.1;
        Ok(())
    }

    /// Makes the captured checkpoint durable and commits it: page files synced, the log
    /// durable through every record a captured page may reflect (the WAL rule), the
    /// checkpoint file written, and the manifest naming it.
    fn commit_checkpoint(
        &self,
        keyspaces: &[(u32, Arc<Tree>, Arc<ShadowStore>)],
        ckpt: &Checkpoint,
    ) -> std::result::Result<(), Uncommitted> {
        let before = || -> std::result::Result<u64, Uncommitted> {
            for (_, _, shadow) in keyspaces {
                use crate::storage::PageStore;
                shadow.sync().map_err(Error::from)?;
            }
            // The values the captured pages reference, durable before the checkpoint
            // that names them (values of logged writes are, by the log's group write).
            self.values.sync()?;
            self.crash_point(CheckpointCrashPoint::AfterPageSync)?;
            self.journal.persist()?;
            // Every record below this was durable at the commit: recovery from this
            // checkpoint or the one before must find them all.
            let log_end_seq = self.journal.log().durable_seq() + 1;
            self.crash_point(CheckpointCrashPoint::AfterLogFlush)?;
            ckpt.store(&self.dir)?;
            self.crash_point(CheckpointCrashPoint::AfterCheckpointFile)?;
            Ok(log_end_seq)
        };
        let log_end_seq = before()?;
        // A batch that failed halfway after the quiesce appended its record first, so
        // if the capture saw part of it, the persist above made the record durable and
        // recovery completes it; one that failed before this check stops the commit.
        self.journal.check_writable()?;
        let mut catalog = self.catalog.write();
        let mut manifest = catalog.manifest.clone();
        manifest.checkpoints.insert(
            0,
            CheckpointRef {
                generation: ckpt.generation,
                position: ckpt.position,
                log_end_seq: log_end_seq.max(ckpt.position.seq),
            },
        );
        manifest.checkpoints.truncate(KEPT_CHECKPOINTS);
        manifest.store(&self.dir).map_err(Uncommitted::Maybe)?;
        catalog.manifest = manifest;
        Ok(())
    }

    /// Fails the checkpoint here if a test asked for it.
    fn crash_point(&self, point: CheckpointCrashPoint) -> Result<()> {
        let armed = self.crash_point.load(Ordering::Relaxed);
        if point == CheckpointCrashPoint::AfterFlush
            && armed == CheckpointCrashPoint::PanicAfterFlush as u8
        {
            panic!("simulated panic of a checkpoint after its flush");
        }
        if armed == point as u8 {
            return Err(Error::Io(io::Error::other(format!(
                "simulated crash of the checkpoint at {point:?}"
            ))));
        }
        Ok(())
    }

    /// Whether a background checkpoint is due.
    fn checkpoint_due(&self) -> bool {
        let c = self.checkpoints.lock();
        let grown = self.log_bytes_since(c.trigger_from);
        let o = &self.options;
        (o.checkpoint_log_bytes > 0 && grown >= o.checkpoint_log_bytes)
            || ((grown > 0 || self.journal.unlogged_since_quiesce())
                && o.checkpoint_interval
                    .is_some_and(|i| c.last_at.elapsed() >= i))
            || self.catalog.read().keyspaces.values().any(|ks| match ks {
                Keyspace::Hash(store) => store.holds_past_budget(),
                Keyspace::Tree { .. } => false,
            })
            || self.values_due()
    }

    /// Whether the value store holds enough freed values to take a checkpoint for:
    /// their extents become reusable only as checkpoints pass, and large values grow
    /// the log by a reference each, so the log-size trigger alone would let the value
    /// file grow far past the live values. A sixteenth of the live bytes (at least
    /// [`MIN_VALUE_TRIGGER_BYTES`]) waiting keeps the file near the live data: a free
    /// waits for two or three checkpoints.
    fn values_due(&self) -> bool {
        let values = self.values.stats();
        values.deferred_bytes >= (values.live_bytes / 16).max(MIN_VALUE_TRIGGER_BYTES)
    }

    /// Log bytes from log block `from` to the log's end.
    pub(super) fn log_bytes_since(&self, from: u64) -> u64 {
        self.journal.log().position().block.saturating_sub(from) * LOG_BLOCK_BYTES as u64
    }
}

/// The least freed value bytes that make a background checkpoint due
/// (`Shared::values_due`).
const MIN_VALUE_TRIGGER_BYTES: u64 = 8 << 20;

/// When writers of long values wait for the checkpoints to make freed values reusable
/// (`ValueStore::make_room`): past twice the trigger, an eighth of the live bytes (at
/// least 16 MiB) freed and not yet reusable.
pub(super) const VALUE_BACKPRESSURE: Backpressure = Backpressure {
    live_divisor: 8,
    floor_bytes: 2 * MIN_VALUE_TRIGGER_BYTES,
    max_wait: Duration::from_secs(1),
};

/// Why a checkpoint did not commit.
enum Uncommitted {
    /// It failed before the manifest was touched: nothing names it.
    Before(Error),
    /// Replacing the manifest failed, possibly after the manifest on disk came to name
    /// it.
    Maybe(Error),
}

impl From<Error> for Uncommitted {
    fn from(e: Error) -> Uncommitted {
        Uncommitted::Before(e)
    }
}

/// The lowest BEGIN of each of hash keyspace `id`'s logs that a kept checkpoint needs
/// (0 for a log none records: keep everything).
pub(super) fn kept_floors(kept: &[Kept], id: u32) -> [u64; 3] {
    // A kept checkpoint from before the keyspace existed needs none of it (recovery
    // from it starts the keyspace empty); one that records it needs what it records.
    let recorded: Vec<&F2Extents> = kept.iter().filter_map(|k| k.hash.get(&id)).collect();
    hash_checkpoint::floors(&recorded)
}

/// Hands the memory the allocator keeps of freed blocks back to the operating system
/// (glibc's `malloc_trim`; elsewhere nothing). A checkpoint frees its leaf lists and its
/// merges' buffers at once, on whichever threads ran them, and glibc's per-thread
/// arenas would otherwise keep those pages resident until the same threads reuse them.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory of the allocator's own heaps to the
    // kernel; it takes the allocator's locks and touches no live block.
    unsafe {
        libc::malloc_trim(0);
    }
}
