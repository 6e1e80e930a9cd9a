//! The database directory: [`Db`], its named keyspaces, its write-ahead log, its
//! checkpoints, and recovery on open.
//!
//! # Directory layout
//!
//! ```text
//! <dir>/LOCK                  flock'ed while the database or a handle to its trees lives
//! <dir>/MANIFEST              keyspace catalog and the committed checkpoints (manifest.rs)
//! <dir>/ckpt-<16 hex>         a checkpoint: each tree's leaves in key order (checkpoint.rs)
//! <dir>/wal-<16 hex>.log      write-ahead log segments (crate::wal)
//! <dir>/ks-<8 hex>.pages      one page file per tree keyspace, shadow-paged
//! <dir>/values-<8 hex>.vlog   the value store: values too long for their records
//! ```
//!
//! # Checkpoints and recovery
//!
//! A checkpoint (`checkpoint.rs` holds the file format; `Shared::checkpoint` in
//! `checkpointer.rs` the protocol, argued in `docs/design.md`) records where every
//! tree's leaves are and from which log position to replay, and commits by replacing
//! the manifest. The page slots it records are never overwritten while it is one of the
//! two checkpoints the manifest keeps ([`ShadowStore`](crate::storage::ShadowStore)).
//! Opening a database loads the newest checkpoint (or, if its file does not validate,
//! the one before), rebuilds each tree from its leaf list, and replays the log from the
//! checkpoint's position through the normal write path.
//!
//! # Which file owns what
//!
//! - `mod.rs`: the public [`Db`] and `Shared` (what the `Db` and its background
//!   checkpointer share); the batch write path; the fuzz target's decoder.
//! - `options.rs`: [`DbOptions`] and their validation.
//! - `stats.rs`: [`RecoveryStats`], [`LostLog`], [`DbStats`].
//! - `dir.rs`: every file name of the directory, the lock, a new directory's manifest,
//!   replacing the manifest and writing a checkpoint file durably, removing stale files.
//! - `catalog.rs`: the keyspaces of both kinds: creation, lookup, drop, opening their
//!   files; the hash stores' memory grants.
//! - `recovery.rs`: the open, in reading order: checkpoints loaded, the log checked to
//!   reach what they need, the manifest rewritten first, keyspaces restored, the log
//!   replayed.
//! - `checkpointer.rs`: the checkpoint protocol (generation, flush, capture, commit,
//!   retire), the checkpoints kept, the background checkpointer and its triggers.
//! - `manifest.rs`, `checkpoint.rs`: the formats of the `MANIFEST` and of a checkpoint
//!   file.
//! - `batch.rs`: [`WriteBatch`].
//! - `values.rs`: the value store as a tree keyspace sees it (the tree's `ValueHost`).
//!
//! Uses: `tree`, `hash`, `journal`, `wal`, `storage`, `config`, `error`.

mod batch;
mod catalog;
mod checkpoint;
mod checkpointer;
mod dir;
mod manifest;
mod memory;
mod options;
mod recovery;
mod stats;
mod values;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::hash::store::{HashStore, HashStoreOptions};
use crate::journal::{Durability, Journal};
use crate::storage::{DirLog, LogDevice, SimPages, ValueStore};
use crate::sync::atomic::{AtomicU8, Ordering};
use crate::ticker::Ticker;
use crate::tree::{Stored, Tree, TreeMemory};
use crate::wal::LogOpRef;

pub use batch::WriteBatch;
use catalog::{Catalog, Keyspace, hash_memory_bytes};
use checkpoint::Checkpoint;
pub use checkpointer::CheckpointCrashPoint;
use checkpointer::{Checkpoints, Merge};
use dir::{Pages, named, no_database};
use manifest::Manifest;
pub use options::DbOptions;
pub use stats::{DbStats, LostLog, RecoveryStats};

/// Everything the `Db` and its background checkpointer share.
struct Shared {
    dir: PathBuf,
    options: DbOptions,
    /// The pool every tree keyspace keeps its mini-pages in: the memory budget, less
    /// what `budget` gives the hash stores and the value cache.
    memory: TreeMemory,
    /// The split of the memory budget between the hash stores, the value cache and
    /// the trees' pool.
    budget: Arc<memory::Budget>,
    pages: Pages,
    journal: Arc<Journal>,
    catalog: RwLock<Catalog>,
    /// Serializes checkpoints and holds what they keep.
    checkpoints: Mutex<Checkpoints>,
    recovery: RecoveryStats,
    crash_point: AtomicU8,
    /// The value store: values too long for their keyspace's records.
    values: Arc<ValueStore>,
}

/// An embedded database: a directory of named keyspaces that survives crashes.
///
/// Each keyspace is an ordered [`Tree`], opened (and created on first use) with
/// [`Db::tree`]. Writes go through one write-ahead log at the [`Durability`] asked for;
/// [`WriteBatch`]es span keys and keyspaces atomically. Checkpoints, taken in the
/// background as the log grows and on close, bound the log a recovery replays. Opening
/// a database recovers it, with no separate call; [`Db::recovery`] tells what that took.
///
/// While a `Db` or a handle to one of its trees is alive, the directory's `LOCK` file
/// is locked: a second `Db` on the same directory, in this process or another, gets
/// [`Error::Locked`]. Dropping the `Db` takes a checkpoint (unless
/// [`DbOptions::checkpoint_on_close`] is off) and makes every logged write durable.
///
/// ```
/// use bfdb::{Db, DbOptions};
/// # let dir = tempfile::tempdir()?;
/// let db = Db::open(dir.path(), DbOptions::default())?;
/// let fruit = db.tree("fruit")?;
/// fruit.insert(b"apple", b"red")?;
/// fruit.insert(b"cherry", b"dark red")?;
/// db.persist()?; // every write so far is on stable storage
/// drop((fruit, db));
///
/// // A later process (or the same one) finds it all again.
/// let db = Db::open(dir.path(), DbOptions::default())?;
/// assert_eq!(db.keyspaces(), ["fruit"]);
/// assert_eq!(db.tree("fruit")?.get(b"apple")?.as_deref(), Some(&b"red"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Db {
    shared: Arc<Shared>,
    checkpointer: Option<Ticker>,
    /// [`Db::close`] ran: the drop has nothing left to do.
    closed: bool,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("dir", &self.shared.dir)
            .field("keyspaces", &self.keyspaces())
            .finish_non_exhaustive()
    }
}

// Every method takes `&self`: a `Db` is shared between threads as it is.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Db>();
};

impl Db {
    /// Opens the database in `dir`, creating it if [`DbOptions::create`] allows, and
    /// recovers it: the newest checkpoint, then every write whose log record was durable.
    ///
    /// Fails with [`Error::Locked`] if another `Db` has the directory open; with
    /// [`Error::Incompatible`] if the directory holds files but no bfdb manifest, or a
    /// manifest, checkpoint or log of another format version; with
    /// [`Error::CorruptFile`] if the manifest does not validate, if no checkpoint it
    /// names does, if the log is damaged anywhere but in its torn tail, or if the log
    /// lacks records a checkpoint needs (see [`DbOptions::accept_rollback`]); with
    /// [`Error::Io`] if a file cannot be read (a read that may succeed later: the
    /// open falls back to an older checkpoint only on proven damage). Nothing is
    /// written to a directory that does not validate.
    pub fn open(dir: impl AsRef<Path>, options: DbOptions) -> Result<Db> {
        let dir = dir.as_ref();
        if options.create {
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(named(dir, e)))?;
        } else if !dir.is_dir() {
            return Err(no_database(dir));
        }
        let log = DirLog::open(dir).map_err(Error::Io)?;
        Db::open_on(dir, options, Arc::new(log), Pages::Files)
    }

    /// Opens the database in `dir` with its log on `log` and its page files on `pages`
    /// (a fault-injecting [`SimLog`](crate::storage::SimLog) and [`SimPages`], say):
    /// for crash tests, which crash both devices and open the database again on what
    /// they kept. The manifest and checkpoint files are real files in `dir`.
    #[doc(hidden)]
    pub fn open_simulated(
        dir: impl AsRef<Path>,
        options: DbOptions,
        log: Arc<dyn LogDevice>,
        pages: Arc<SimPages>,
    ) -> Result<Db> {
        let dir = dir.as_ref();
        if options.create {
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(named(dir, e)))?;
        }
        Db::open_on(dir, options, log, Pages::Sim(pages))
    }

    /// The ordered keyspace `name`, created (durably, in the manifest) if it does not
    /// exist. Every call for one name returns a handle to the same tree.
    ///
    /// Names are 1 to 255 bytes of UTF-8.
    pub fn tree(&self, name: &str) -> Result<Arc<Tree>> {
        self.shared.tree(name)
    }

    /// The names of the keyspaces, in order.
    pub fn keyspaces(&self) -> Vec<String> {
        self.shared
            .catalog
            .read()
            .manifest
            .keyspaces
            .keys()
            .cloned()
            .collect()
    }

    /// Drops tree keyspace `name` and everything in it; `false` if there was none.
    /// Handles to it still read what it held, and refuse writes with
    /// [`Error::KeyspaceDropped`]. The drop is durable when the call returns. Its values
    /// kept out of line are freed once the last handle to it is gone (or, after a crash
    /// or a close, by the next open), their space reused or given back two checkpoints
    /// later. A hash store is dropped with [`Db::drop_hash_store`].
    pub fn drop_tree(&self, name: &str) -> Result<bool> {
        self.shared.drop_keyspace(name, false)
    }

    /// The hash keyspace `name` ([`HashStore`]), created (durably, in the manifest)
    /// with [`HashStoreOptions::default`] if it does not exist.
    pub fn hash_store(&self, name: &str) -> Result<Arc<HashStore>> {
        self.hash_store_with(name, HashStoreOptions::default())
    }

    /// The hash keyspace `name`, created with `options` if it does not exist (an
    /// existing one keeps the options it was created with). A name that holds a tree
    /// is refused with [`Error::InvalidConfig`], as [`Db::tree`] refuses a hash store's.
    ///
    /// ```
    /// use bfdb::{Db, DbOptions, HashStoreOptions};
    /// # let dir = tempfile::tempdir()?;
    /// let db = Db::open(dir.path(), DbOptions::default())?;
    /// let sessions = db.hash_store_with(
    ///     "sessions",
    ///     HashStoreOptions::default().memory_bytes(16 << 20).expected_keys(100_000),
    /// )?;
    /// sessions.insert(b"user-17", b"token")?;
    /// assert!(db.tree("sessions").is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hash_store_with(&self, name: &str, options: HashStoreOptions) -> Result<Arc<HashStore>> {
        self.shared.hash_store(name, options)
    }

    /// Drops hash keyspace `name` and everything in it; `false` if there was none.
    /// Handles to it refuse writes with [`Error::KeyspaceDropped`]; their reads may fail
    /// once they need a log file the drop removed. The drop is durable when the call
    /// returns. Its values kept out of line are freed as a tree's are
    /// ([`Db::drop_tree`]).
    pub fn drop_hash_store(&self, name: &str) -> Result<bool> {
        self.shared.drop_keyspace(name, true)
    }

    /// Applies `batch` atomically at the database's default durability
    /// ([`DbOptions::durability`]); see [`Db::write_with`].
    pub fn write(&self, batch: WriteBatch) -> Result<()> {
        self.write_with(batch, self.shared.options.durability)
    }

    /// Applies `batch` atomically at `durability`: one log record, so after a crash
    /// either every write of the batch is there or none is; and a concurrent
    /// [`Tree::get_many`] sees all of its keys' writes or none. (A scan is not a
    /// snapshot: it sees each record as it is when it reaches it.) Every key and value
    /// is checked before anything is written.
    ///
    /// A batch is logged even at [`Durability::Unlogged`], which then means only that
    /// the call does not wait for the disk, as at [`Durability::Logged`].
    pub fn write_with(&self, batch: WriteBatch, durability: Durability) -> Result<()> {
        self.shared.write(batch, durability)
    }

    /// Waits until every logged write acknowledged so far is durable.
    pub fn persist(&self) -> Result<()> {
        self.shared.journal.persist()
    }

    /// Takes a checkpoint now: every keyspace's records written to its pages, the
    /// trees' leaves recorded, the log truncated to what the two kept checkpoints need.
    /// A recovery after it replays only the log written since it began.
    /// Readers and writers go on meanwhile (they wait only for a moment at its start).
    /// The one on close does the same; background checkpoints
    /// ([`DbOptions::checkpoint_log_bytes`], [`DbOptions::checkpoint_interval`]) leave
    /// the pages written since the previous checkpoint began to the log.
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.checkpoint(Merge::All)
    }

    /// Takes a checkpoint as the background triggers do: one that leaves the pages
    /// written since the last checkpoint began dirty, their writes in the log (for the
    /// crash tests, which take both kinds at chosen moments).
    #[doc(hidden)]
    pub fn checkpoint_incremental(&self) -> Result<()> {
        self.shared.checkpoint(Merge::Older)
    }

    /// What recovery did when this database was opened.
    pub fn recovery(&self) -> &RecoveryStats {
        &self.shared.recovery
    }

    /// What the database has done since it was opened.
    pub fn stats(&self) -> DbStats {
        // Read before the checkpoint lock: a stats call holds one lock at a time.
        let hash_memory = hash_memory_bytes(&self.shared.catalog.read());
        let c = self.shared.checkpoints.lock();
        let mut stats = c.stats.clone();
        stats.log_bytes_since_checkpoint = self
            .shared
            .log_bytes_since(c.kept.first().map_or(0, |k| k.position.block));
        stats.memory_budget_bytes = self.shared.memory.capacity_bytes();
        stats.tree_memory_bytes = self.shared.memory.limit_bytes();
        stats.hash_memory_bytes = hash_memory;
        stats.memory_in_use_bytes = self.shared.memory.bytes_in_use();
        stats.tree_memory_released_bytes = self.shared.memory.released_bytes();
        let cache = self.shared.values.cache().stats();
        stats.value_cache_capacity_bytes = cache.capacity_bytes;
        stats.value_cache_bytes = cache.bytes;
        stats.value_cache_values = cache.entries;
        stats.value_cache_hits = cache.hits;
        stats.value_cache_misses = cache.misses;
        let values = self.shared.values.stats();
        stats.value_store_live_bytes = values.live_bytes;
        stats.value_store_live_values = values.live_values;
        stats.value_store_allocated_bytes = values.allocated_bytes;
        stats.value_store_deferred_bytes = values.deferred_bytes;
        stats.value_store_file_bytes = values.end_bytes;
        stats
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.shared.dir
    }

    /// The sequence number of the last logged write, and of the last durable one.
    #[doc(hidden)]
    pub fn log_position(&self) -> (u64, u64) {
        let log = self.shared.journal.log();
        (log.next_seq() - 1, log.durable_seq())
    }

    /// Runs `f` while no checkpoint runs: for crash tests that copy the directory's
    /// files and crash its simulated devices at one consistent moment.
    #[doc(hidden)]
    pub fn with_checkpoints_paused<T>(&self, f: impl FnOnce() -> T) -> T {
        let _paused = self.shared.checkpoints.lock();
        f()
    }

    /// Makes every read of a value kept out of line (in every database of the process)
    /// wait `delay` between finding the value's reference and reading it: for the test
    /// that races reads against overwrites and checkpoints.
    #[doc(hidden)]
    pub fn delay_value_reads_for_test(delay: Duration) {
        crate::storage::READ_DELAY_MICROS.store(
            u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Makes the next checkpoints fail at `point`, as a crash there would stop them.
    #[doc(hidden)]
    pub fn fail_checkpoints_at(&self, point: CheckpointCrashPoint) {
        self.shared
            .crash_point
            .store(point as u8, Ordering::Relaxed);
    }
}

impl Db {
    /// Closes the database and says whether everything acknowledged is durable: the
    /// background checkpointer stops, the checkpoint on close is taken (if
    /// [`DbOptions::checkpoint_on_close`]), and every logged write is made durable.
    ///
    /// `Ok` means the next open finds every write acknowledged through this database
    /// at any durability level, with no log to replay if the checkpoint was taken. An
    /// `Err` says what failed: a database in its failure state (a failed log, a
    /// keyspace that could not write its pages, a batch left half applied, a
    /// background thread that died) answers the error that put it there, and then
    /// the next open recovers what the log and the last checkpoint hold — every
    /// `Logged` and `Synced` write acknowledged, and the `Unlogged` writes a committed
    /// checkpoint captured. Dropping a `Db` does the same as `close` and logs a failure
    /// as a warning.
    ///
    /// Handles to its keyspaces may outlive it and keep writing through the log; the
    /// last of them to go makes their logged writes durable.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// let db = bfdb::Db::open(dir.path(), bfdb::DbOptions::default())?;
    /// db.tree("t")?.insert(b"k", b"v")?;
    /// db.close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<()> {
        // Stop the background checkpointer first, so the one below is the last.
        self.checkpointer = None;
        let checkpointed = if self.shared.options.checkpoint_on_close {
            self.shared.checkpoint(Merge::All)
        } else {
            Ok(())
        };
        // The log keeps every logged write whatever the checkpoint did.
        let persisted = self.shared.journal.persist();
        match self.shared.journal.failure() {
            Some(e) => Err(e),
            None => checkpointed.and(persisted),
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if self.closed || std::thread::panicking() {
            self.checkpointer = None;
            if !self.closed {
                let _ = self.shared.journal.persist();
            }
            return;
        }
        if let Err(e) = self.shut_down() {
            log::warn!("bfdb: closing {} failed: {e}", self.shared.dir.display());
        }
    }
}

impl Shared {
    fn write(&self, batch: WriteBatch, durability: Durability) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let me = Arc::as_ptr(&self.journal) as usize;
        let targets = {
            let catalog = self.catalog.read();
            batch
                .ops
                .iter()
                .map(|op| {
                    if op.db != me {
                        return Err(Error::Unsupported(
                            "a batch may only hold writes to keyspaces of the database \
                             that writes it"
                                .into(),
                        ));
                    }
                    let ks = catalog
                        .keyspaces
                        .get(&op.keyspace)
                        .cloned()
                        .ok_or_else(|| Error::KeyspaceDropped {
                            name: catalog
                                .dropped
                                .get(&op.keyspace)
                                .cloned()
                                .unwrap_or_else(|| format!("#{}", op.keyspace)),
                        })?;
                    ks.check_record(&op.key, op.value.as_deref())?;
                    Ok(ks)
                })
                .collect::<Result<Vec<_>>>()?
        };
        // Long values go to the value store before the batch's record is appended.
        let references = batch
            .ops
            .iter()
            .zip(&targets)
            .map(|(op, ks)| match op.value.as_deref() {
                Some(v) => ks.store_value(&op.key, v),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let stored: Vec<Option<Stored<'_>>> = batch
            .ops
            .iter()
            .zip(&references)
            .map(|(op, r)| match r {
                Some(r) => Some(Stored::External(r)),
                None => op.value.as_deref().map(Stored::Inline),
            })
            .collect();
        let ops: Vec<LogOpRef<'_>> = batch
            .ops
            .iter()
            .zip(&stored)
            .map(|(op, s)| match s {
                Some(Stored::External(reference)) => LogOpRef::PutExternal {
                    keyspace: op.keyspace,
                    key: &op.key,
                    reference,
                },
                _ => LogOpRef::write(op.keyspace, &op.key, op.value.as_deref()),
            })
            .collect();
        // A batch is logged whatever the level, a batch of one write too (the journal
        // logs no single write at `Unlogged`).
        let durability = match durability {
            Durability::Unlogged => Durability::Logged,
            level => level,
        };
        self.journal.commit(&ops, durability, || {
            for (i, ((op, ks), value)) in batch.ops.iter().zip(&targets).zip(&stored).enumerate() {
                if let Err(e) = write_retrying(ks, &op.key, *value) {
                    // Earlier writes applied; and a write that poisoned its keyspace
                    // may have applied before it failed (a tree's merge that wrote
                    // part of a split, say): either way the index may hold part of
                    // the batch. Only a first write that failed cleanly left nothing.
                    if i > 0 || matches!(e, Error::Poisoned { .. }) {
                        self.half_applied(&e);
                    }
                    return Err(e);
                }
            }
            Ok(())
        })
    }

    /// A batch failed after some of its writes reached their keyspaces: the index now
    /// holds half of it. Readers must not see that, and no checkpoint may commit it
    /// (its record would then lie below the replay start, the half batch permanent).
    /// So the database fails, unreadable, and its record is made durable if the log
    /// still can: the next open replays it whole. (A batch's writes cannot be undone
    /// in place: they overwrote the keys' earlier values.)
    fn half_applied(&self, e: &Error) {
        self.journal.fail(
            &format!("a batch failed after part of it was applied ({e})"),
            true,
        );
        if let Err(e) = self.journal.persist() {
            log::warn!("bfdb: the half-applied batch's record could not be made durable: {e}");
        }
    }
}

/// How many times a batch's write is tried before the batch gives up on an error that
/// poisoned nothing (a read that failed once may succeed the next time).
const BATCH_WRITE_TRIES: usize = 3;

/// Writes one of a batch's keys, trying again after an error that poisoned nothing: a
/// write that fails changes nothing, and giving up on a batch halfway costs the
/// database (`Shared::half_applied`).
fn write_retrying(ks: &Keyspace, key: &[u8], value: Option<Stored<'_>>) -> Result<()> {
    let mut tries = 1;
    loop {
        match ks.write_unlogged(key, value) {
            Err(e) if tries < BATCH_WRITE_TRIES && !matches!(e, Error::Poisoned { .. }) => {
                log::warn!("bfdb: a batch's write failed and is tried again: {e}");
                tries += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            other => return other,
        }
    }
}

/// Decodes `bytes` as a manifest and as a checkpoint file, for the fuzz target
/// `db_files`: each must answer `Ok` or `Err`, never panic; a decoded file of the
/// current version must encode back to exactly `bytes` (but for a hash store of kind 2,
/// which is written back as kind 3), and what a manifest encodes to must decode to it.
#[doc(hidden)]
pub fn fuzz_decode_files(bytes: &[u8]) {
    let path = Path::new("fuzz");
    let current_manifest = bytes.get(8..12) == Some(&manifest::MANIFEST_VERSION.to_le_bytes()[..]);
    if let Ok(m) = Manifest::decode(path, bytes) {
        let encoded = m.encode();
        assert_eq!(
            Manifest::decode(path, &encoded).ok().as_ref(),
            Some(&m),
            "a manifest decodes from what it encodes to"
        );
        // A hash store of an earlier build (record format 1: kind 2 or 3) is written
        // back as kind 3, so a kind-2 entry does not come back as it was.
        let upgraded = m.keyspaces.values().any(|e| {
            matches!(&e.kind, manifest::KeyspaceKind::Hash(layout) if layout.record_format == 1)
        });
        if current_manifest && !upgraded {
            assert_eq!(
                encoded, bytes,
                "a manifest that decodes encodes back as it was"
            );
        }
    }
    // A checkpoint of the older version decodes too, and encodes as the current one.
    let current = bytes.get(8..12) == Some(&checkpoint::CHECKPOINT_VERSION.to_le_bytes()[..]);
    if let Ok(c) = Checkpoint::decode(path, bytes)
        && current
    {
        assert_eq!(
            c.encode(),
            bytes,
            "a checkpoint that decodes encodes back as it was"
        );
    }
}
