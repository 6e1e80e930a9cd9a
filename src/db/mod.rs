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
//! ```
//!
//! # Checkpoints and recovery
//!
//! A checkpoint (`checkpoint.rs` holds the file format; `Shared::checkpoint` the
//! protocol, argued in `docs/design.md`) records where every tree's leaves are and from
//! which log position to replay, and commits by replacing the manifest. The page slots
//! it records are never overwritten while it is one of the two checkpoints the manifest
//! keeps ([`ShadowStore`]). Opening a database loads the newest checkpoint (or, if its
//! file does not validate, the one before), rebuilds each tree from its leaf list, and
//! replays the log from the checkpoint's position through the normal write path.
//!
//! Uses: `tree`, `journal`, `wal`, `storage`, `config`, `error`.

mod batch;
mod checkpoint;
mod manifest;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::config::{Config, MIN_MEMORY_BUDGET_BYTES};
use crate::error::{Error, Result};
use crate::hash::f2::F2Extents;
use crate::hash::store::{
    self as hash_store, HashAttached, HashFiles, HashLayout, HashStore, HashStoreOptions,
};
use crate::journal::{Durability, Journal};
use crate::storage::{
    ActiveBackend, DirLog, LOG_BLOCK_BYTES, LogDevice, PageNo, PinSet, ShadowStore, SimPages,
    SlotStore,
};
use crate::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crate::ticker::Ticker;
use crate::tree::{Attached, Tree, TreeMemory, open_file_store};
use crate::wal::{self, LogOp, LogOpRef, LogOptions, LogPosition};

pub use batch::WriteBatch;
use checkpoint::{Checkpoint, KeyspaceLeaves, Leaves};
use manifest::{
    CheckpointRef, KEPT_CHECKPOINTS, KeyspaceEntry, KeyspaceKind, MANIFEST, MANIFEST_TMP,
    MAX_NAME_BYTES, Manifest,
};

/// The memory each of the hash stores recorded at `recorded` gets out of `budget`:
/// what it recorded, or, if together they would leave the trees less than
/// [`MIN_MEMORY_BUDGET_BYTES`], a share of what the trees leave in proportion to it.
fn hash_grants(budget: u64, recorded: &[u64]) -> Vec<u64> {
    let room = budget.saturating_sub(MIN_MEMORY_BUDGET_BYTES);
    let total = recorded.iter().fold(0u64, |sum, &r| sum.saturating_add(r));
    if total <= room {
        return recorded.to_vec();
    }
    recorded
        .iter()
        .map(|&r| (u128::from(r) * u128::from(room) / u128::from(total)) as u64)
        .collect()
}

/// The memory the open hash stores of `catalog` were given.
fn hash_memory_bytes(catalog: &Catalog) -> u64 {
    catalog
        .keyspaces
        .values()
        .map(|ks| match ks {
            Keyspace::Hash(store) => store.memory_budget_bytes(),
            Keyspace::Tree { .. } => 0,
        })
        .sum()
}

/// The lock file's name in the database directory.
const LOCK: &str = "LOCK";

/// How to open a [`Db`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DbOptions {
    /// The configuration of every keyspace: key and value limits, backend, and the
    /// memory budget, `config.memory_budget_bytes`, which is the whole database's. Each
    /// hash store takes its [`HashStoreOptions::memory_bytes`] out of it; every tree
    /// keyspace keeps its mini-pages in one pool of what is left (at least
    /// [`MIN_MEMORY_BUDGET_BYTES`]), so memory goes to the keyspaces in use and the
    /// budget does not grow with the number of keyspaces. The pool is mapped at the
    /// whole budget and gives back what hash stores take as it turns over (see
    /// [`DbStats::tree_memory_bytes`]). (What lies outside the budget does grow: each
    /// open tree has its own mapping table and inner nodes, a few bytes per leaf page
    /// plus some hundreds of KiB; each hash store its threads.)
    pub config: Config,
    /// The durability of [`Tree::insert`] and [`Tree::delete`] on the database's
    /// keyspaces; [`Tree::insert_with`] and [`Db::write_with`] choose per write. Default
    /// [`Durability::Logged`].
    pub durability: Durability,
    /// How often the background flusher makes [`Durability::Logged`] writes durable. A
    /// crash loses at most about twice this of acknowledged logged writes: a record
    /// waits up to one interval for the flusher's next group, and then that group's
    /// write; a logged write that finds an older record waiting longer than twice the
    /// interval waits for the disk itself, so the bound holds when the flusher is
    /// starved of CPU. Default 5 ms.
    pub flush_interval: Duration,
    /// A checkpoint is taken in the background once the log has grown by this many
    /// bytes since the last one began; 0 turns the trigger off. A background
    /// checkpoint leaves pages written since the previous one began in memory, their
    /// writes in the log, so recovery replays at most about twice this much log (three
    /// times if it must fall back to the older checkpoint); after [`Db::checkpoint`]
    /// or a clean close, only what follows it. Default 64 MiB.
    pub checkpoint_log_bytes: u64,
    /// A checkpoint is taken in the background this long after the last one, if
    /// anything was written since (logged or not: so an unlogged write is captured,
    /// and survives a crash, within about this long); `None` turns the trigger off.
    /// Default 60 s.
    ///
    /// While either trigger is on, a hash store whose kept checkpoints hold more of one
    /// of its logs on disk (below what compaction freed) than that log's disk budget
    /// also brings a background checkpoint, so that unlogged writes, which grow no log,
    /// do not keep freed log segments on disk indefinitely.
    pub checkpoint_interval: Option<Duration>,
    /// Take a checkpoint when the `Db` is dropped, so that the next open replays no log.
    /// Default `true`.
    pub checkpoint_on_close: bool,
    /// Create the directory and an empty database if there is none. Default `true`.
    pub create: bool,
    /// Size of one log segment file. Default 16 MiB.
    pub log_segment_bytes: u64,
    /// Open a database whose log does not reach as far as its checkpoints say it must
    /// (log segments deleted or lost), as the older state the files still hold, instead
    /// of failing the open. Default `false`: such an open is an error naming the missing
    /// range of the log, and nothing is written. When it is `true`,
    /// [`RecoveryStats::rolled_back`] says what was missing.
    pub accept_rollback: bool,
}

impl Default for DbOptions {
    fn default() -> Self {
        DbOptions {
            config: Config::default(),
            durability: Durability::Logged,
            flush_interval: Duration::from_millis(5),
            checkpoint_log_bytes: 64 << 20,
            checkpoint_interval: Some(Duration::from_secs(60)),
            checkpoint_on_close: true,
            create: true,
            log_segment_bytes: 16 << 20,
            accept_rollback: false,
        }
    }
}

impl DbOptions {
    /// Sets [`DbOptions::config`].
    pub fn config(mut self, config: Config) -> DbOptions {
        self.config = config;
        self
    }

    /// Sets [`DbOptions::durability`].
    pub fn durability(mut self, durability: Durability) -> DbOptions {
        self.durability = durability;
        self
    }

    /// Sets [`DbOptions::flush_interval`].
    pub fn flush_interval(mut self, interval: Duration) -> DbOptions {
        self.flush_interval = interval;
        self
    }

    /// Sets [`DbOptions::checkpoint_log_bytes`].
    pub fn checkpoint_log_bytes(mut self, bytes: u64) -> DbOptions {
        self.checkpoint_log_bytes = bytes;
        self
    }

    /// Sets [`DbOptions::checkpoint_interval`].
    pub fn checkpoint_interval(mut self, interval: Option<Duration>) -> DbOptions {
        self.checkpoint_interval = interval;
        self
    }

    /// Sets [`DbOptions::checkpoint_on_close`].
    pub fn checkpoint_on_close(mut self, on: bool) -> DbOptions {
        self.checkpoint_on_close = on;
        self
    }

    /// Sets [`DbOptions::create`].
    pub fn create(mut self, create: bool) -> DbOptions {
        self.create = create;
        self
    }

    /// Sets [`DbOptions::log_segment_bytes`].
    pub fn log_segment_bytes(mut self, bytes: u64) -> DbOptions {
        self.log_segment_bytes = bytes;
        self
    }

    /// Sets [`DbOptions::accept_rollback`].
    pub fn accept_rollback(mut self, accept: bool) -> DbOptions {
        self.accept_rollback = accept;
        self
    }

    fn validate(&self) -> Result<()> {
        self.config.validate()?;
        if self.flush_interval.is_zero() || self.flush_interval > Duration::from_secs(60) {
            return Err(Error::InvalidConfig(format!(
                "flush_interval {:?} must be above zero and at most 60 s",
                self.flush_interval
            )));
        }
        if self.log_segment_bytes < 64 << 10 || self.log_segment_bytes > 1 << 30 {
            return Err(Error::InvalidConfig(format!(
                "log_segment_bytes {} must be between 64 KiB and 1 GiB",
                self.log_segment_bytes
            )));
        }
        if self.checkpoint_interval.is_some_and(|i| i.is_zero()) {
            return Err(Error::InvalidConfig(
                "checkpoint_interval must be above zero (None turns it off)".into(),
            ));
        }
        Ok(())
    }
}

/// One write of the log as recovery replays it (`Shared::replay`).
struct ReplayWrite<'a> {
    keyspace: u32,
    /// The keyspace `keyspace` names.
    target: &'a Keyspace,
    key: &'a [u8],
    /// Its place among the replayed writes, in log order.
    order: usize,
    /// `None` for a delete.
    value: Option<&'a [u8]>,
}

/// What recovery did when the database was opened ([`Db::recovery`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryStats {
    /// The generation of the checkpoint the database was loaded from; 0 if none.
    pub checkpoint: u64,
    /// Checkpoints named by the manifest whose files did not validate, so that recovery
    /// fell back to an older one (and a longer replay). Each is also logged as a
    /// warning, with its file and what is wrong.
    ///
    /// Recovery falls back only on proven damage (a file that is missing, fails its
    /// checksum, or does not decode), and only if the log still holds every record the
    /// older checkpoint needs; an IO error reading a checkpoint fails the open instead,
    /// since the same read may succeed later and the newest checkpoint may hold
    /// unlogged writes nothing else has.
    pub checkpoint_fallbacks: u64,
    /// Why each checkpoint counted in [`RecoveryStats::checkpoint_fallbacks`] (and any
    /// older one that did not validate either) was not used: its file and what is
    /// wrong with it.
    pub damaged_checkpoints: Vec<String>,
    /// Set only when [`DbOptions::accept_rollback`] let a database open whose log did
    /// not hold everything its checkpoints needed: the database is then older than
    /// what was acknowledged, and this says which log records were missing.
    pub rolled_back: Option<LostLog>,
    /// Leaf pages the checkpoint recorded, over all keyspaces.
    pub leaf_pages: u64,
    /// Log records (single writes and batches) replayed.
    pub records_replayed: u64,
    /// Writes of live keyspaces read from the log.
    pub writes_replayed: u64,
    /// Of those, writes followed by a later write of the same key in the replayed log:
    /// recovery applies each key's last write only.
    pub writes_superseded: u64,
    /// Logged writes of keyspaces dropped since: not replayed.
    pub writes_skipped: u64,
    /// Bytes of log read from the checkpoint's position to the end.
    pub log_bytes: u64,
    /// Bytes of the log's torn tail: what a crash left half-written, never acknowledged
    /// as synced, and discarded.
    pub discarded_bytes: u64,
    /// Complete records found in the torn tail's blocks and discarded with it (records
    /// that a crash separated from the log before them).
    pub discarded_records: u64,
    /// Wall time from the start of `Db::open` to the database being ready.
    pub duration: Duration,
}

/// The part of the log a recovery needed and did not find
/// ([`RecoveryStats::rolled_back`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostLog {
    /// The checkpoint recovery loaded.
    pub checkpoint: u64,
    /// The first sequence number of the log records it needed.
    pub first_seq: u64,
    /// One past the last sequence number it needed: every record below was durable
    /// when the newest checkpoint committed.
    pub end_seq: u64,
    /// One past the last sequence number the log still held from `first_seq` on
    /// (`first_seq` if it held none of them).
    pub found_end_seq: u64,
}

/// What a database has done since it was opened ([`Db::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DbStats {
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// The generation of the newest committed checkpoint; 0 if none.
    pub checkpoint_generation: u64,
    /// Wall time of the last checkpoint.
    pub last_checkpoint_duration: Duration,
    /// Leaf pages the last checkpoint recorded.
    pub last_checkpoint_leaf_pages: u64,
    /// Dirty mini-pages the committed checkpoints merged into their leaf pages.
    pub checkpoint_pages_merged: u64,
    /// Dirty mini-pages the committed checkpoints left dirty, because every write they
    /// held was logged since the previous checkpoint began (background checkpoints;
    /// see [`DbOptions::checkpoint_log_bytes`]).
    pub checkpoint_pages_left_dirty: u64,
    /// Log bytes from the newest checkpoint's replay start to the log's end: what a
    /// recovery now would read.
    pub log_bytes_since_checkpoint: u64,
    /// The database's memory budget (`config.memory_budget_bytes`, rounded down to a
    /// multiple of 8): the hash stores' memory and the trees' pool together.
    pub memory_budget_bytes: u64,
    /// The part of the budget the hash stores were given
    /// ([`HashStoreStats::memory_budget_bytes`](crate::HashStoreStats::memory_budget_bytes)
    /// summed).
    pub hash_memory_bytes: u64,
    /// The rest: bytes the tree keyspaces' mini-pages may take in their one pool.
    pub tree_memory_bytes: u64,
    /// Bytes of that pool in use now, by every tree keyspace together.
    pub memory_in_use_bytes: u64,
    /// Bytes of the pool's memory given back to the operating system since the
    /// database opened, because hash stores took part of the budget (the pool gives
    /// back what it no longer spans as it turns over).
    pub tree_memory_released_bytes: u64,
}

/// Where the keyspaces' page files live.
#[derive(Clone, Debug)]
enum Pages {
    /// A page file per keyspace in the directory.
    Files,
    /// Simulated page files (`Db::open_simulated`).
    Sim(Arc<SimPages>),
}

/// One open keyspace.
#[derive(Clone)]
enum Keyspace {
    /// A tree and the shadow store under it.
    Tree {
        tree: Arc<Tree>,
        shadow: Arc<ShadowStore>,
    },
    /// A hash store.
    Hash(Arc<HashStore>),
}

impl Keyspace {
    /// Checks a write against the keyspace's limits.
    fn check_record(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        match self {
            Keyspace::Tree { tree, .. } => tree.check_record(key, value),
            Keyspace::Hash(store) => store.check_record(key, value),
        }
    }

    /// Writes with no log record (recovery's replay, and batches, logged as a whole).
    fn write_unlogged(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        match self {
            Keyspace::Tree { tree, .. } => tree.write_unlogged(key, value),
            Keyspace::Hash(store) => store.write_unlogged(key, value),
        }
    }

    /// Marks the keyspace dropped: its handles refuse writes from now on.
    fn mark_dropped(&self) {
        let dropped = match self {
            Keyspace::Tree { tree, .. } => tree.attached().map(|a| &a.dropped),
            Keyspace::Hash(store) => Some(&store.attached().dropped),
        };
        if let Some(d) = dropped {
            d.store(true, Ordering::Release);
        }
    }
}

/// The keyspaces, by name and by id.
struct Catalog {
    manifest: Manifest,
    keyspaces: HashMap<u32, Keyspace>,
    /// The names of keyspaces dropped since the open, by id: what an error about a
    /// handle to one calls it.
    dropped: HashMap<u32, String>,
}

/// A committed checkpoint the database keeps, with the slots it pinned per tree
/// keyspace and the log extents it holds per hash keyspace.
struct Kept {
    generation: u64,
    position: LogPosition,
    pins: HashMap<u32, PinSet>,
    hash: HashMap<u32, F2Extents>,
}

/// Which dirty pages a checkpoint merges into their leaf pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Merge {
    /// Every one: recovery replays only what follows the checkpoint's quiesce (the
    /// checkpoint on close, after recovery, and `Db::checkpoint`).
    All,
    /// Those with a write older than the previous checkpoint's quiesce, or unlogged:
    /// the background checkpoints (docs/design.md, "Checkpoints that leave recent
    /// pages dirty").
    Older,
}

/// The checkpoints kept, newest first, and what the next one needs.
struct Checkpoints {
    kept: Vec<Kept>,
    next_generation: u64,
    /// The checkpoint epoch and log position of the last quiesce (of the open, before
    /// any): the replay start of a checkpoint that leaves pages dirty since then.
    quiesced: (u64, LogPosition),
    /// The log block of the last committed checkpoint's quiesce: the log-size trigger
    /// counts from here (its replay start may lie further back).
    trigger_from: u64,
    stats: DbStats,
    last_at: Instant,
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

/// Everything the `Db` and its background checkpointer share.
struct Shared {
    dir: PathBuf,
    options: DbOptions,
    /// The pool every tree keyspace keeps its mini-pages in: the memory budget.
    memory: TreeMemory,
    pages: Pages,
    journal: Arc<Journal>,
    catalog: RwLock<Catalog>,
    /// Serializes checkpoints and holds what they keep.
    checkpoints: Mutex<Checkpoints>,
    recovery: RecoveryStats,
    crash_point: AtomicU8,
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
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(manifest::named(dir, e)))?;
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
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(manifest::named(dir, e)))?;
        }
        Db::open_on(dir, options, log, Pages::Sim(pages))
    }

    fn open_on(
        dir: &Path,
        options: DbOptions,
        device: Arc<dyn LogDevice>,
        pages: Pages,
    ) -> Result<Db> {
        let started = Instant::now();
        options.validate()?;
        if !dir.is_dir() {
            return Err(no_database(dir));
        }
        let (lock, lock_created) = lock_dir(dir)?;
        let manifest = match Manifest::load(dir)? {
            Some(m) => m,
            None => match create_manifest(dir, &options, &*device) {
                Ok(m) => m,
                Err(e) => {
                    // Refused: the directory is left as it was found.
                    if lock_created {
                        let _ = std::fs::remove_file(dir.join(LOCK));
                    }
                    return Err(e);
                }
            },
        };
        let (manifest, raised) = check_limits(dir, manifest, &options.config)?;
        let newest_named = manifest.checkpoints.first().map_or(0, |c| c.generation);
        let mut recovery = RecoveryStats::default();
        let loaded = load_checkpoints(dir, &manifest, &mut recovery)?;
        let position = loaded
            .first()
            .map_or(LogPosition::default(), |c| c.position);
        let log_options = LogOptions {
            segment_blocks: options.log_segment_bytes / LOG_BLOCK_BYTES as u64,
            ..LogOptions::default()
        };
        let (log, recovered) =
            wal::open_at(device, log_options, position).map_err(|e| log_damage(dir, e))?;
        check_log_reaches(
            dir,
            &manifest,
            loaded.first(),
            &recovered.records,
            options.accept_rollback,
            &mut recovery,
        )?;
        // Manifest first: a checkpoint recovery skipped is not pinned, so replay,
        // eviction and every later write may reuse its page slots (and its hash logs'
        // addresses). Before anything can, the manifest stops naming it, durably: a
        // crash or a failure of this open then leaves a manifest whose checkpoints are
        // intact, and no later open loads pages that were overwritten.
        // A rollback the options accepted is recorded the same way: the checkpoints'
        // durable ends come down to what the log holds, so that the next open does not
        // ask again for records that are gone (the log continues from where it ends).
        let mut manifest = manifest;
        if loaded.len() < manifest.checkpoints.len() || recovery.rolled_back.is_some() {
            // A kept checkpoint's recovery still needs the log through the skipped
            // one's durable end: that is what its durable end becomes.
            let needed_end = manifest.checkpoints.first().map_or(0, |r| r.log_end_seq);
            manifest.checkpoints = manifest
                .checkpoints
                .iter()
                .filter(|r| loaded.iter().any(|c| c.generation == r.generation))
                .map(|r| CheckpointRef {
                    log_end_seq: match recovery.rolled_back {
                        None => r.log_end_seq.max(needed_end),
                        Some(lost) => r.log_end_seq.min(lost.found_end_seq),
                    }
                    .max(r.position.seq),
                    ..*r
                })
                .collect();
            manifest.store(dir)?;
        }
        recovery.log_bytes =
            recovered.next_block.saturating_sub(position.block) * LOG_BLOCK_BYTES as u64;
        recovery.discarded_bytes = recovered.discarded_bytes;
        recovery.discarded_records = recovered.discarded_records;
        let journal = Arc::new(Journal::new(lock, Arc::new(log), options.flush_interval));
        // Past every generation the manifest named at the open, a damaged one skipped
        // too: its file is left in place, never overwritten by a new checkpoint.
        let next_generation = newest_named + 1;
        let memory = TreeMemory::new(&options.config)?;
        let mut shared = Shared {
            dir: dir.to_path_buf(),
            options,
            memory,
            pages,
            journal,
            catalog: RwLock::new(Catalog {
                manifest: manifest.clone(),
                keyspaces: HashMap::new(),
                dropped: HashMap::new(),
            }),
            checkpoints: Mutex::new(Checkpoints {
                kept: Vec::new(),
                next_generation,
                quiesced: (0, LogPosition::default()),
                trigger_from: loaded.first().map_or(0, |c| c.position.block),
                stats: DbStats {
                    checkpoint_generation: loaded.first().map_or(0, |c| c.generation),
                    ..DbStats::default()
                },
                last_at: Instant::now(),
            }),
            recovery: RecoveryStats::default(),
            crash_point: AtomicU8::new(CheckpointCrashPoint::None as u8),
        };
        shared.restore(&manifest, &loaded, &mut recovery)?;
        shared.replay(&recovered.records, &mut recovery)?;
        // Epoch 0's writes come after the replay: every record they append is at or
        // past the log's position now. (Replayed writes are stamped unlogged, so the
        // first checkpoint merges them.)
        shared.checkpoints.get_mut().quiesced =
            (shared.journal.epoch(), shared.journal.log().position());
        // The newest checkpoint any manifest committed: files above it never were.
        let committed = newest_named;
        if raised {
            // Larger limits are recorded (durably, before a write can use them) only
            // once the database has validated.
            manifest.store(dir)?;
            shared.catalog.get_mut().manifest = manifest.clone();
        }
        shared.remove_stale_files(&manifest, committed)?;
        recovery.duration = started.elapsed();
        log::info!(
            "bfdb: opened {} in {:?}: checkpoint {}, {} log records replayed ({} bytes), {} \
             torn-tail bytes discarded",
            shared.dir.display(),
            recovery.duration,
            recovery.checkpoint,
            recovery.records_replayed,
            recovery.log_bytes,
            recovery.discarded_bytes
        );
        let replayed = recovery.records_replayed > 0 || recovery.discarded_bytes > 0;
        shared.recovery = recovery;
        // What was replayed (and a torn tail) goes behind a checkpoint at once: a crash
        // soon after does not replay it again, and the torn tail is never counted twice.
        if replayed && let Err(e) = shared.checkpoint(Merge::All) {
            log::warn!(
                "bfdb: the checkpoint after recovery failed (the log still holds everything): {e}"
            );
        }
        for ks in shared.catalog.get_mut().keyspaces.values() {
            if let Keyspace::Tree { tree, .. } = ks {
                tree.set_flush_on_drop(true);
            }
        }
        let shared = Arc::new(shared);
        let checkpointer = checkpointer(&shared);
        Ok(Db {
            shared,
            checkpointer,
            closed: false,
        })
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
    /// [`Error::KeyspaceDropped`]. The drop is durable when the call returns. A hash
    /// store is dropped with [`Db::drop_hash_store`].
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
    /// returns.
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

/// The longest a failing background checkpoint waits before it is tried again.
const MAX_CHECKPOINT_BACKOFF: Duration = Duration::from_secs(5);

/// Starts the background checkpointer if a trigger is on; dropping it stops the thread.
/// A checkpoint that fails is tried again after a wait that doubles with each failure
/// (up to [`MAX_CHECKPOINT_BACKOFF`]); once the database is in its failure state it is
/// not tried at all. A panic puts the database in its failure state.
fn checkpointer(shared: &Arc<Shared>) -> Option<Ticker> {
    let o = &shared.options;
    if o.checkpoint_log_bytes == 0 && o.checkpoint_interval.is_none() {
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
    Ticker::start("bfdb-checkpointer", tick, on_panic, move |_| {
        let Some(shared) = weak.upgrade() else {
            return false;
        };
        if Instant::now() < retry_at || shared.journal.failure().is_some() {
            return true;
        }
        if shared.checkpoint_due() {
            match shared.checkpoint(Merge::Older) {
                Ok(()) => backoff = Duration::ZERO,
                Err(e) => {
                    backoff = (backoff * 2).clamp(tick, MAX_CHECKPOINT_BACKOFF);
                    retry_at = Instant::now() + backoff;
                    log::warn!(
                        "bfdb: a background checkpoint failed, tried again in {backoff:?}: {e}"
                    );
                }
            }
        }
        true
    })
}

impl Shared {
    /// Builds every keyspace of `manifest`: from the newest loaded checkpoint that
    /// records it, or empty.
    fn restore(
        &mut self,
        manifest: &Manifest,
        loaded: &[Checkpoint],
        recovery: &mut RecoveryStats,
    ) -> Result<()> {
        let mut kept: Vec<Kept> = loaded
            .iter()
            .map(|c| Kept {
                generation: c.generation,
                position: c.position,
                pins: HashMap::new(),
                hash: c.hash.iter().copied().collect(),
            })
            .collect();
        // The hash stores' memory comes out of the budget first.
        let recorded: Vec<u64> = manifest
            .keyspaces
            .values()
            .filter_map(|entry| match &entry.kind {
                KeyspaceKind::Hash(layout) => Some(layout.memory_bytes()),
                KeyspaceKind::Tree => None,
            })
            .collect();
        let mut grants = hash_grants(self.memory.capacity_bytes(), &recorded).into_iter();
        let mut hash_memory = 0;
        // Every kept checkpoint's slots of a keyspace stay pinned.
        let mut keyspaces = HashMap::new();
        for (name, entry) in &manifest.keyspaces {
            if let KeyspaceKind::Hash(layout) = &entry.kind {
                let floors = kept_floors(&kept, entry.id);
                let extents = loaded
                    .first()
                    .and_then(|c| c.hash.iter().find(|(id, _)| *id == entry.id))
                    .map(|(_, e)| (e, floors));
                let memory = grants.next().expect("a grant per hash store");
                hash_memory += memory;
                self.memory
                    .set_limit_bytes(self.memory.capacity_bytes() - hash_memory);
                let store = self.open_hash_store(name, entry.id, layout, memory, extents)?;
                keyspaces.insert(entry.id, Keyspace::Hash(store));
                continue;
            }
            let pinned: Vec<PinSet> = loaded
                .iter()
                .filter_map(|c| {
                    let ks = c.keyspaces.iter().find(|k| k.id == entry.id)?;
                    Some(PinSet {
                        generation: c.generation,
                        slots: ks.leaves.slots().to_vec(),
                    })
                })
                .collect();
            let leaves = loaded
                .first()
                .and_then(|c| c.keyspaces.iter().find(|k| k.id == entry.id));
            let keyspace = self.open_keyspace(name, entry, leaves, &pinned)?;
            if let Keyspace::Tree { tree, .. } = &keyspace {
                // Until the open succeeds: a failed one writes no page on its way out.
                tree.set_flush_on_drop(false);
            }
            recovery.leaf_pages += leaves.map_or(0, |l| l.leaves.len() as u64);
            for (k, set) in kept.iter_mut().zip(loaded) {
                if let Some(p) = pinned.iter().find(|p| p.generation == set.generation) {
                    k.pins.insert(entry.id, p.clone());
                }
            }
            keyspaces.insert(entry.id, keyspace);
        }
        recovery.checkpoint = loaded.first().map_or(0, |c| c.generation);
        self.catalog.get_mut().keyspaces = keyspaces;
        self.checkpoints.get_mut().kept = kept;
        Ok(())
    }

    /// Opens keyspace `entry`'s page file and builds its tree: from `leaves` (a
    /// checkpoint's record of it) with the slots of `pinned` kept, or empty.
    fn open_keyspace(
        &self,
        name: &str,
        entry: &KeyspaceEntry,
        leaves: Option<&KeyspaceLeaves>,
        pinned: &[PinSet],
    ) -> Result<Keyspace> {
        let config = self.options.config.clone();
        if let (Pages::Files, Some(ks)) = (&self.pages, leaves) {
            // A checkpoint's pages must be there: a missing or cut page file is an
            // error, never a keyspace read as empty.
            let path = self.dir.join(page_file(entry.id));
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            let need = ks
                .leaves
                .slots()
                .iter()
                .map(|slot| slot.saturating_add(1))
                .max()
                .unwrap_or(0)
                .saturating_mul(4096);
            if len < need {
                return Err(Error::CorruptFile {
                    path,
                    reason: format!(
                        "{len} bytes, but the checkpoint records pages up to byte {need} \
                         (missing or truncated)"
                    ),
                });
            }
        }
        let (slots, backend): (Arc<dyn SlotStore>, ActiveBackend) = match &self.pages {
            Pages::Files => {
                let (store, backend) = open_page_file(&self.dir.join(page_file(entry.id)), &config)
                    .map_err(|e| self.page_file_error(name, entry.id, e))?;
                (Arc::new(store), backend)
            }
            Pages::Sim(sim) => (sim.store(&page_file(entry.id)), ActiveBackend::custom()),
        };
        let (shadow, tree) = match leaves {
            Some(ks) => {
                let (shadow, logical) = ShadowStore::recover(slots, ks.leaves.slots(), pinned)
                    .map_err(|e| Error::CorruptFile {
                        path: self.dir.join(page_file(entry.id)),
                        reason: format!("its checkpoint's page slots: {e}"),
                    })?;
                let shadow = Arc::new(shadow);
                let list: Vec<(Vec<u8>, PageNo)> = ks
                    .leaves
                    .iter()
                    .map(|(low, _)| low.to_vec())
                    .zip(logical)
                    .collect();
                let tree = Tree::from_leaves(
                    config,
                    Box::new(Arc::clone(&shadow)),
                    backend,
                    list,
                    Some(self.memory.clone()),
                )?;
                (shadow, tree)
            }
            None => {
                let shadow = Arc::new(ShadowStore::new(slots)?);
                let tree = Tree::with_store_in(
                    config,
                    Box::new(Arc::clone(&shadow)),
                    backend,
                    self.memory.clone(),
                )?;
                (shadow, tree)
            }
        };
        let tree = tree.attach(Attached {
            journal: Arc::clone(&self.journal),
            keyspace: entry.id,
            name: name.to_string(),
            pages: self.dir.join(page_file(entry.id)),
            durability: self.options.durability,
            dropped: AtomicBool::new(false),
        });
        Ok(Keyspace::Tree {
            tree: Arc::new(tree),
            shadow,
        })
    }

    /// An error opening keyspace `name`'s page file, naming the file and the keyspace.
    /// The manifest says the file is this database's, so one without a bfdb
    /// superblock is damaged ([`Error::CorruptFile`], as any damaged file of the
    /// directory), not foreign; one of another format version stays
    /// [`Error::Incompatible`].
    fn page_file_error(&self, name: &str, id: u32, e: Error) -> Error {
        let path = self.dir.join(page_file(id));
        let whose = format!("the page file of keyspace {name:?}");
        match e {
            Error::Corrupted { page, reason } => Error::CorruptFile {
                path,
                reason: format!("{whose}, page {page}: {reason}"),
            },
            Error::Incompatible { reason } if reason.starts_with("not a bfdb file") => {
                Error::CorruptFile {
                    path,
                    reason: format!("{whose}: {reason}"),
                }
            }
            Error::Incompatible { reason } => Error::Incompatible {
                reason: format!("{} ({whose}): {reason}", path.display()),
            },
            Error::Io(io) => Error::Io(manifest::named(&path, io)),
            other => other,
        }
    }

    /// Opens hash keyspace `id`: as a checkpoint's `extents` recorded it (with the
    /// floors its kept checkpoints need), or empty — in which case any log files it has
    /// (a crash before a checkpoint recorded it left them) are removed first.
    fn open_hash_store(
        &self,
        name: &str,
        id: u32,
        layout: &HashLayout,
        memory: u64,
        extents: Option<(&F2Extents, [u64; 3])>,
    ) -> Result<Arc<HashStore>> {
        // Before anything touches its files: a store of an earlier format is refused.
        layout.check_record_format(&self.dir.join(hash_store::file_prefix(id, "*")), name)?;
        if extents.is_none() {
            self.remove_hash_files(id)?;
        }
        let files = match &self.pages {
            Pages::Files => HashFiles::Dir {
                dir: &self.dir,
                direct: !matches!(self.options.config.backend, crate::config::Backend::Std),
            },
            Pages::Sim(sim) => HashFiles::Sim(sim),
        };
        let attached = HashAttached {
            journal: Arc::clone(&self.journal),
            keyspace: id,
            name: name.to_string(),
            durability: self.options.durability,
            dropped: AtomicBool::new(false),
            max_key_bytes: self.options.config.max_key_bytes,
            max_value_bytes: self.options.config.max_value_bytes,
        };
        let store =
            HashStore::open(layout, memory, files, extents, attached).map_err(|e| match e {
                Error::Corrupted { reason, .. } => Error::CorruptFile {
                    path: self.dir.join(hash_store::file_prefix(id, "*")),
                    reason,
                },
                Error::InvalidConfig(why) => {
                    Error::InvalidConfig(format!("hash store {name:?}: {why}"))
                }
                other => other,
            })?;
        Ok(Arc::new(store))
    }

    /// Removes every log file of hash keyspace `id`.
    fn remove_hash_files(&self, id: u32) -> Result<()> {
        match &self.pages {
            Pages::Files => {
                let entries = std::fs::read_dir(&self.dir)
                    .map_err(|e| Error::Io(manifest::named(&self.dir, e)))?;
                for entry in entries {
                    let entry = entry.map_err(|e| Error::Io(manifest::named(&self.dir, e)))?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if hash_store::is_file_of(&name, id) {
                        std::fs::remove_file(entry.path())
                            .map_err(|e| Error::Io(manifest::named(&entry.path(), e)))?;
                    }
                }
            }
            Pages::Sim(sim) => {
                for name in sim.block_names() {
                    if hash_store::is_file_of(&name, id) {
                        sim.remove_blocks(&name);
                    }
                }
            }
        }
        Ok(())
    }

    /// Replays the recovered log records into the keyspaces: each key's last write in
    /// log order, applied in key order (see docs/design.md, "Recovery on open").
    ///
    /// Nothing reads the keyspaces until the open returns, so only each key's final
    /// state must be right, and that is its last write in the log: the earlier ones are
    /// counted as superseded and not applied. Applying in key order visits each leaf
    /// page once for its run of keys instead of once per write (a log replayed in its
    /// own order reads and merges a page per write once the tree outgrows memory).
    fn replay(&self, records: &[wal::LogRecord], recovery: &mut RecoveryStats) -> Result<()> {
        let catalog = self.catalog.read();
        let mut writes: Vec<ReplayWrite<'_>> = Vec::new();
        let mut skipped = 0;
        for op in records.iter().flat_map(|r| &r.ops) {
            let (keyspace, key, value) = match op {
                LogOp::Put {
                    keyspace,
                    key,
                    value,
                } => (*keyspace, &key[..], Some(&value[..])),
                LogOp::Delete { keyspace, key } => (*keyspace, &key[..], None),
            };
            let Some(ks) = catalog.keyspaces.get(&keyspace) else {
                skipped += 1;
                continue;
            };
            ks.check_record(key, value).map_err(|e| {
                Error::InvalidConfig(format!(
                    "the log holds a write that these options refuse ({e}); open the \
                     database with limits at least those it was written with"
                ))
            })?;
            writes.push(ReplayWrite {
                keyspace,
                target: ks,
                key,
                order: writes.len(),
                value,
            });
        }
        let replayed = writes.len() as u64;
        // A key's writes sort together, in log order.
        writes.sort_unstable_by(|a, b| {
            (a.keyspace, a.key, a.order).cmp(&(b.keyspace, b.key, b.order))
        });
        let mut applied = 0;
        for (i, w) in writes.iter().enumerate() {
            let last = writes
                .get(i + 1)
                .is_none_or(|next| (next.keyspace, next.key) != (w.keyspace, w.key));
            if last {
                w.target.write_unlogged(w.key, w.value)?;
                applied += 1;
            }
        }
        recovery.records_replayed = records.len() as u64;
        recovery.writes_replayed = replayed;
        recovery.writes_superseded = replayed - applied;
        recovery.writes_skipped = skipped;
        Ok(())
    }

    /// Removes what a crash or a drop left behind: temporary files, checkpoint files
    /// above `newest` (the newest checkpoint the manifest named at the open: those were
    /// never committed) or below the oldest one `manifest` keeps (superseded: a crash
    /// came between a commit and the retirement of the checkpoint it pushed out), and
    /// page files of keyspaces `manifest` does not list. A
    /// damaged checkpoint file recovery skipped is left for its owner to look at (until
    /// an open finds it above the newest the manifest names).
    fn remove_stale_files(&self, manifest: &Manifest, newest: u64) -> Result<()> {
        let live_pages: Vec<String> = manifest
            .keyspaces
            .values()
            .filter(|e| e.kind == KeyspaceKind::Tree)
            .map(|e| page_file(e.id))
            .collect();
        let live_hash: Vec<u32> = manifest
            .keyspaces
            .values()
            .filter(|e| matches!(e.kind, KeyspaceKind::Hash(_)))
            .map(|e| e.id)
            .collect();
        let stale_hash =
            |name: &str| hash_store::file_owner(name).is_some_and(|id| !live_hash.contains(&id));
        let entries =
            std::fs::read_dir(&self.dir).map_err(|e| Error::Io(manifest::named(&self.dir, e)))?;
        // Checkpoints older than the oldest one kept were superseded: a crash between a
        // checkpoint's commit and the retirement of the third-oldest leaves its file.
        let oldest_kept = manifest.checkpoints.iter().map(|c| c.generation).min();
        for entry in entries {
            let entry = entry.map_err(|e| Error::Io(manifest::named(&self.dir, e)))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let generation = name
                .strip_prefix("ckpt-")
                .and_then(|g| u64::from_str_radix(g, 16).ok());
            let uncommitted = generation.is_some_and(|g| g > newest);
            let superseded = generation.is_some_and(|g| oldest_kept.is_some_and(|o| g < o));
            let stale_pages = matches!(self.pages, Pages::Files)
                && name.starts_with("ks-")
                && name.ends_with(".pages")
                && !live_pages.contains(&name);
            let stale_log = matches!(self.pages, Pages::Files) && stale_hash(&name);
            if name.ends_with(".tmp") || uncommitted || superseded || stale_pages || stale_log {
                std::fs::remove_file(entry.path())
                    .map_err(|e| Error::Io(manifest::named(&entry.path(), e)))?;
            }
        }
        if let Pages::Sim(sim) = &self.pages {
            for name in sim.names() {
                if !live_pages.contains(&name) {
                    sim.remove(&name);
                }
            }
            for name in sim.block_names() {
                if stale_hash(&name) {
                    sim.remove_blocks(&name);
                }
            }
        }
        Ok(())
    }

    fn tree(&self, name: &str) -> Result<Arc<Tree>> {
        match self.keyspace(name, None)? {
            Keyspace::Tree { tree, .. } => Ok(tree),
            Keyspace::Hash(_) => Err(wrong_kind(name, "a hash store", "Db::hash_store")),
        }
    }

    fn hash_store(&self, name: &str, options: HashStoreOptions) -> Result<Arc<HashStore>> {
        match self.keyspace(name, Some(options))? {
            Keyspace::Hash(store) => Ok(store),
            Keyspace::Tree { .. } => Err(wrong_kind(name, "a tree", "Db::tree")),
        }
    }

    /// Keyspace `name`, created if there is none: a hash store with `hash` options if
    /// they are given, else a tree.
    fn keyspace(&self, name: &str, hash: Option<HashStoreOptions>) -> Result<Keyspace> {
        if let Some(ks) = self.lookup(name) {
            return Ok(ks);
        }
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(Error::InvalidConfig(format!(
                "keyspace names are 1 to {MAX_NAME_BYTES} bytes; {name:?} has {}",
                name.len()
            )));
        }
        let mut catalog = self.catalog.write();
        if let Some(entry) = catalog.manifest.keyspaces.get(name) {
            return Ok(catalog.keyspaces[&entry.id].clone());
        }
        let budget = self.memory.capacity_bytes();
        let hash_memory = hash_memory_bytes(&catalog);
        let (kind, memory) = match hash {
            Some(options) => {
                let memory = self.hash_memory_for(name, &options, budget, hash_memory)?;
                let c = &self.options.config;
                // The largest record: a header, the longest key and the longest value.
                let record = 16 + c.max_key_bytes as u64 + c.max_value_bytes as u64;
                let layout = HashLayout::new(options.memory_bytes(memory), record)?;
                (KeyspaceKind::Hash(layout), memory)
            }
            None => (KeyspaceKind::Tree, 0),
        };
        let entry = KeyspaceEntry {
            id: catalog.manifest.next_id,
            kind,
        };
        let next_id = entry.id.checked_add(1).ok_or_else(|| {
            Error::Unsupported("the database has used all 2^32 keyspace ids".into())
        })?;
        let keyspace = match &entry.kind {
            KeyspaceKind::Tree => self.open_keyspace(name, &entry, None, &[])?,
            KeyspaceKind::Hash(layout) => {
                let store = self.open_hash_store(name, entry.id, layout, memory, None)?;
                // The trees give up the store's memory (the pool evicts down to it).
                self.memory.set_limit_bytes(budget - hash_memory - memory);
                Keyspace::Hash(store)
            }
        };
        let mut manifest = catalog.manifest.clone();
        manifest.next_id = next_id;
        manifest.keyspaces.insert(name.to_string(), entry.clone());
        // Durable before the first write to it can be logged.
        manifest.store(&self.dir)?;
        catalog.manifest = manifest;
        catalog.keyspaces.insert(entry.id, keyspace.clone());
        Ok(keyspace)
    }

    /// The memory a new hash store `name` with `options` gets out of `budget`, of
    /// which the open hash stores have `hash_memory`: what it asks for, or half of what
    /// is left; an error if that leaves the trees less than they need.
    fn hash_memory_for(
        &self,
        name: &str,
        options: &HashStoreOptions,
        budget: u64,
        hash_memory: u64,
    ) -> Result<u64> {
        let left = budget.saturating_sub(hash_memory + MIN_MEMORY_BUDGET_BYTES);
        let memory = options.memory_bytes.unwrap_or(left / 2);
        if memory > left || memory < hash_store::MIN_MEMORY_BYTES {
            return Err(Error::InvalidConfig(format!(
                "hash store {name:?} needs {memory} bytes of memory (at least {}), but the \
                 database's memory budget of {budget} bytes has {left} left: its hash \
                 stores take {hash_memory} and its trees keep at least \
                 {MIN_MEMORY_BUDGET_BYTES}. Open the database with a larger \
                 config.memory_budget_bytes, or give the store less memory_bytes",
                hash_store::MIN_MEMORY_BYTES
            )));
        }
        Ok(memory)
    }

    fn lookup(&self, name: &str) -> Option<Keyspace> {
        let catalog = self.catalog.read();
        let entry = catalog.manifest.keyspaces.get(name)?;
        catalog.keyspaces.get(&entry.id).cloned()
    }

    /// Drops keyspace `name` if it is of the kind `hash` says; `false` if there is none.
    fn drop_keyspace(&self, name: &str, hash: bool) -> Result<bool> {
        let mut catalog = self.catalog.write();
        let Some(entry) = catalog.manifest.keyspaces.get(name).cloned() else {
            return Ok(false);
        };
        match (&entry.kind, hash) {
            (KeyspaceKind::Tree, true) => {
                return Err(wrong_kind(name, "a tree", "Db::drop_tree"));
            }
            (KeyspaceKind::Hash(_), false) => {
                return Err(wrong_kind(name, "a hash store", "Db::drop_hash_store"));
            }
            _ => {}
        }
        let mut manifest = catalog.manifest.clone();
        manifest.keyspaces.remove(name);
        manifest.store(&self.dir)?;
        catalog.manifest = manifest;
        if let Some(ks) = catalog.keyspaces.remove(&entry.id) {
            ks.mark_dropped();
        }
        catalog.dropped.insert(entry.id, name.to_string());
        if hash {
            // Its memory goes back to the trees (once the last handle to it is gone,
            // the store's own memory is freed).
            let hash_memory = hash_memory_bytes(&catalog);
            self.memory
                .set_limit_bytes(self.memory.capacity_bytes() - hash_memory);
            // Handles to it still read: only the files' names go; an open file lives on.
            return self.remove_hash_files(entry.id).map(|()| true);
        }
        match &self.pages {
            Pages::Files => {
                let path = self.dir.join(page_file(entry.id));
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::Io(manifest::named(&path, e))),
                }
            }
            Pages::Sim(sim) => sim.remove(&page_file(entry.id)),
        }
        Ok(true)
    }

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
        let ops: Vec<LogOpRef<'_>> = batch
            .ops
            .iter()
            .map(|op| LogOpRef::write(op.keyspace, &op.key, op.value.as_deref()))
            .collect();
        // A batch is logged whatever the level, a batch of one write too (the journal
        // logs no single write at `Unlogged`).
        let durability = match durability {
            Durability::Unlogged => Durability::Logged,
            level => level,
        };
        self.journal.commit(&ops, durability, || {
            for (i, (op, ks)) in batch.ops.iter().zip(&targets).enumerate() {
                if let Err(e) = write_retrying(ks, &op.key, op.value.as_deref()) {
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

    /// Log bytes from log block `from` to the log's end.
    fn log_bytes_since(&self, from: u64) -> u64 {
        self.journal.log().position().block.saturating_sub(from) * LOG_BLOCK_BYTES as u64
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

    /// Takes a checkpoint (the protocol is argued in `docs/design.md`, "Checkpoints").
    fn checkpoint(&self, merge: Merge) -> Result<()> {
        let out = self.checkpoint_once(merge);
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
        };
        let captured = keyspaces.iter().try_for_each(|(id, tree, shadow)| {
            let mut leaves = Leaves::default();
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
                let slot = shadow.pin(no, generation)?;
                set.slots.push(slot);
                leaves.push(low, slot);
                Ok(())
            });
            ckpt.keyspaces.push(KeyspaceLeaves { id: *id, leaves });
            result
        });
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
            let path = checkpoint::path(&self.dir, old.generation);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                return Err(Error::Io(manifest::named(&path, e)));
            }
        }
        // The hash stores' log segments below what the kept checkpoints need go.
        for (id, store) in &hashes {
            store.retain_from(kept_floors(&c.kept, *id))?;
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
}

/// How many times a batch's write is tried before the batch gives up on an error that
/// poisoned nothing (a read that failed once may succeed the next time).
const BATCH_WRITE_TRIES: usize = 3;

/// Writes one of a batch's keys, trying again after an error that poisoned nothing: a
/// write that fails changes nothing, and giving up on a batch halfway costs the
/// database (`Shared::half_applied`).
fn write_retrying(ks: &Keyspace, key: &[u8], value: Option<&[u8]>) -> Result<()> {
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

/// Refuses options whose key or value limit is below what the database may hold; with
/// larger ones, returns the manifest recording them and `true` (the caller stores it).
fn check_limits(dir: &Path, mut manifest: Manifest, config: &Config) -> Result<(Manifest, bool)> {
    let (key, value) = (config.max_key_bytes as u64, config.max_value_bytes as u64);
    if key < u64::from(manifest.max_key_bytes) || value < u64::from(manifest.max_value_bytes) {
        return Err(Error::InvalidConfig(format!(
            "{} holds keys of up to {} bytes and values of up to {} bytes; these options \
             allow {key} and {value}: open it with limits at least those",
            dir.display(),
            manifest.max_key_bytes,
            manifest.max_value_bytes
        )));
    }
    let raised =
        key > u64::from(manifest.max_key_bytes) || value > u64::from(manifest.max_value_bytes);
    if raised {
        manifest.max_key_bytes = u32::try_from(key).unwrap_or(u32::MAX);
        manifest.max_value_bytes = u32::try_from(value).unwrap_or(u32::MAX);
    }
    Ok((manifest, raised))
}

/// The checkpoints the manifest names that validate, newest first: the first is the
/// one recovery loads.
///
/// A checkpoint whose file is proven damaged — missing, failing its checksum or its
/// decoding, or disagreeing with the manifest — is skipped with a warning and
/// counted; if none validates although some are named, that is an error. Any other
/// failure to read one (an IO error: a read that may succeed later) fails the open,
/// so that a transient fault never makes recovery give a checkpoint up.
fn load_checkpoints(
    dir: &Path,
    manifest: &Manifest,
    recovery: &mut RecoveryStats,
) -> Result<Vec<Checkpoint>> {
    let mut loaded = Vec::new();
    let mut first_error = None;
    for r in &manifest.checkpoints {
        let checked = Checkpoint::load(dir, r.generation).and_then(|c| {
            if c.position == r.position {
                Ok(c)
            } else {
                Err(Error::CorruptFile {
                    path: checkpoint::path(dir, r.generation),
                    reason: format!(
                        "its log position {:?} is not the manifest's {:?}",
                        c.position, r.position
                    ),
                })
            }
        });
        match checked {
            Ok(c) => loaded.push(c),
            Err(e) if is_damage(&e) => {
                log::warn!(
                    "bfdb: checkpoint {} is damaged, falling back: {e}",
                    r.generation
                );
                if loaded.is_empty() {
                    recovery.checkpoint_fallbacks += 1;
                }
                recovery.damaged_checkpoints.push(e.to_string());
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if loaded.is_empty()
        && let Some(e) = first_error
    {
        return Err(e);
    }
    Ok(loaded)
}

/// Whether `e`, from loading a checkpoint file, proves the file damaged for good (so
/// that recovery may fall back past it) rather than reporting a fault of the moment.
fn is_damage(e: &Error) -> bool {
    match e {
        Error::CorruptFile { .. } => true,
        Error::Io(io) => io.kind() == io::ErrorKind::NotFound,
        _ => false,
    }
}

/// Checks that the log recovery read reaches as far as the checkpoints need: from the
/// loaded checkpoint's position to the durable end the newest checkpoint the manifest
/// names recorded when it committed (every record in between was durable then, so a
/// log without them lost them). A log that falls short is an error naming the missing
/// records, unless `accept` (then `recovery` records the loss).
fn check_log_reaches(
    dir: &Path,
    manifest: &Manifest,
    loaded: Option<&Checkpoint>,
    records: &[wal::LogRecord],
    accept: bool,
    recovery: &mut RecoveryStats,
) -> Result<()> {
    let (Some(newest), Some(from)) = (manifest.checkpoints.first(), loaded) else {
        return Ok(());
    };
    let (first_seq, end_seq) = (from.position.seq, newest.log_end_seq);
    if end_seq <= first_seq {
        return Ok(());
    }
    // The records read are contiguous (the reader stops at the first gap), so the log
    // holds the needed range if it starts at its first record and reaches its end.
    let found_end_seq = match records.first() {
        Some(r) if r.seq == first_seq => records.last().map_or(first_seq, |r| r.seq + 1),
        _ => first_seq,
    };
    if found_end_seq >= end_seq {
        return Ok(());
    }
    let lost = LostLog {
        checkpoint: from.generation,
        first_seq,
        end_seq,
        found_end_seq,
    };
    let what = format!(
        "checkpoint {} needs the write-ahead log's records {first_seq} to {} (every one was \
         durable when checkpoint {} committed), but the log holds {}",
        from.generation,
        end_seq - 1,
        newest.generation,
        if found_end_seq == first_seq {
            "none of them".to_string()
        } else {
            format!("only those to {}", found_end_seq - 1)
        }
    );
    if !accept {
        return Err(Error::CorruptFile {
            path: dir.join("wal-*.log"),
            reason: format!(
                "{what}: log segments are missing. Open it with \
                 DbOptions::accept_rollback(true) to accept the older state the files hold"
            ),
        });
    }
    log::warn!(
        "bfdb: {}: {what}; opening the older state as asked",
        dir.display()
    );
    recovery.rolled_back = Some(lost);
    Ok(())
}

/// How long opening a page file waits for the IO of a process that died holding it.
const PAGE_FILE_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Opens a keyspace's page file. The directory's lock is held, so no live database has
/// the file open; if its own lock is still held, a process that held it died with IO in
/// flight (io_uring requests outlive their process until the kernel tears its ring
/// down, and the lock goes with the last of them). Those writes must land before this
/// process reuses the slots they target, so the open waits for the lock, a bounded time.
fn open_page_file(
    path: &Path,
    config: &Config,
) -> Result<(crate::storage::FileStore, ActiveBackend)> {
    let started = Instant::now();
    loop {
        match open_file_store(path, config) {
            Err(Error::Io(e))
                if e.kind() == io::ErrorKind::WouldBlock
                    && started.elapsed() < PAGE_FILE_RELEASE_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// Decodes `bytes` as a manifest and as a checkpoint file, for the fuzz target
/// `db_files`: each must answer `Ok` or `Err`, never panic; a decoded file must encode
/// back to exactly `bytes`.
#[doc(hidden)]
pub fn fuzz_decode_files(bytes: &[u8]) {
    let path = Path::new("fuzz");
    let current_manifest = bytes.get(8..12) == Some(&manifest::MANIFEST_VERSION.to_le_bytes()[..]);
    if let Ok(m) = Manifest::decode(path, bytes)
        && current_manifest
    {
        assert_eq!(
            m.encode(),
            bytes,
            "a manifest that decodes encodes back as it was"
        );
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

/// The error for keyspace `name` asked for as the wrong kind.
fn wrong_kind(name: &str, is: &str, use_instead: &str) -> Error {
    Error::InvalidConfig(format!(
        "keyspace {name:?} is {is}: open it with {use_instead}"
    ))
}

/// The lowest BEGIN of each of hash keyspace `id`'s logs that a kept checkpoint needs
/// (0 for a log none records: keep everything).
fn kept_floors(kept: &[Kept], id: u32) -> [u64; 3] {
    // A kept checkpoint from before the keyspace existed needs none of it (recovery
    // from it starts the keyspace empty); one that records it needs what it records.
    let recorded: Vec<&F2Extents> = kept.iter().filter_map(|k| k.hash.get(&id)).collect();
    if recorded.is_empty() {
        return [0; 3];
    }
    let low = |f: fn(&F2Extents) -> u64| recorded.iter().map(|e| f(e)).min().unwrap_or(0);
    [
        low(|e| e.hot.begin),
        low(|e| e.cold.begin),
        low(|e| e.chunks.begin),
    ]
}

/// The page file of keyspace `id`.
fn page_file(id: u32) -> String {
    format!("ks-{id:08x}.pages")
}

/// An error reading the log back: damage (`InvalidData`) is reported as every damaged
/// file of the directory is, as [`Error::CorruptFile`]; other errors as they are.
fn log_damage(dir: &Path, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::InvalidData {
        Error::CorruptFile {
            path: dir.to_path_buf(),
            reason: format!("its write-ahead log (wal-*.log) does not validate: {e}"),
        }
    } else {
        Error::from(e)
    }
}

/// The error for a database directory that is not there.
fn no_database(dir: &Path) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{}: no such database directory (DbOptions::create makes one)",
            dir.display()
        ),
    ))
}

/// Opens and `flock`s the directory's lock file; `true` if this call created it.
fn lock_dir(dir: &Path) -> Result<(File, bool)> {
    let path = dir.join(LOCK);
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::Io(manifest::named(&path, e)))?;
    // SAFETY: `flock` on a file descriptor this function owns; it reads no memory.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(if e.kind() == io::ErrorKind::WouldBlock {
            Error::Locked { path }
        } else {
            Error::Io(manifest::named(&path, e))
        });
    }
    Ok((file, !existed))
}

/// Writes the manifest of a new, empty database in `dir` — if `dir` holds nothing else
/// and creating is allowed; otherwise the directory is not a bfdb database, and it is
/// left as it is.
fn create_manifest(dir: &Path, options: &DbOptions, log: &dyn LogDevice) -> Result<Manifest> {
    let foreign: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| Error::Io(manifest::named(dir, e)))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != LOCK && name != MANIFEST_TMP)
        .collect();
    let has_log = !log.list().map_err(Error::Io)?.is_empty();
    if !foreign.is_empty() || has_log {
        let mut what = foreign;
        what.sort();
        what.truncate(3);
        return Err(Error::Incompatible {
            reason: format!(
                "{} is not a bfdb database: it has no {MANIFEST} but holds {}",
                dir.display(),
                if what.is_empty() {
                    "log segments".to_string()
                } else {
                    what.join(", ")
                }
            ),
        });
    }
    if !options.create {
        return Err(Error::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{}: no database here, and DbOptions::create is off",
                dir.display()
            ),
        )));
    }
    let manifest = Manifest::default();
    manifest.store(dir)?;
    Ok(manifest)
}
