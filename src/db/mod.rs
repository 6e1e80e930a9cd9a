//! The database directory: [`Db`], its named keyspaces, its write-ahead log, and
//! recovery on open.
//!
//! # Directory layout
//!
//! ```text
//! <dir>/LOCK                  flock'ed while a Db has the directory open
//! <dir>/MANIFEST              the keyspace catalog (manifest.rs), replaced atomically
//! <dir>/wal-<16 hex>.log      write-ahead log segments (crate::wal)
//! <dir>/ks-<8 hex>.pages      one page file per tree keyspace
//! ```
//!
//! # Recovery in this release
//!
//! Opening a directory replays the whole log into fresh trees: every logged write
//! acknowledged before a crash is back, and nothing else. The page files are scratch
//! space for the trees' leaf pages until checkpoints make them durable (they are
//! recreated on open), so the log is never truncated yet and recovery time grows with
//! it. Checkpoints — which bound both — are the next step.
//!
//! Uses: `tree`, `journal`, `wal`, `storage`, `config`, `error`.

mod batch;
mod manifest;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::journal::{Durability, Journal};
use crate::storage::{DirLog, LogDevice};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::tree::{Attached, Tree};
use crate::wal::{self, LogOp, LogOpRef, LogOptions};

pub use batch::WriteBatch;
use manifest::{KeyspaceEntry, KeyspaceKind, MANIFEST, MANIFEST_TMP, MAX_NAME_BYTES, Manifest};

/// The lock file's name in the database directory.
const LOCK: &str = "LOCK";

/// How to open a [`Db`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DbOptions {
    /// The configuration of every tree keyspace: memory budget, key and value limits,
    /// backend. In this release each keyspace has a pool of its own of
    /// `config.memory_budget_bytes`.
    pub config: Config,
    /// The durability of [`Tree::insert`] and [`Tree::delete`] on the database's
    /// keyspaces; [`Tree::insert_with`] and [`Db::write_with`] choose per write. Default
    /// [`Durability::Logged`].
    pub durability: Durability,
    /// How often the background flusher makes [`Durability::Logged`] writes durable:
    /// the most acknowledged time a crash can lose at that level. Default 5 ms.
    pub flush_interval: Duration,
    /// Create the directory and an empty database if there is none. Default `true`.
    pub create: bool,
    /// Size of one log segment file. Default 16 MiB.
    pub log_segment_bytes: u64,
}

impl Default for DbOptions {
    fn default() -> Self {
        DbOptions {
            config: Config::default(),
            durability: Durability::Logged,
            flush_interval: Duration::from_millis(5),
            create: true,
            log_segment_bytes: 16 << 20,
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
        Ok(())
    }
}

/// What recovery did when the database was opened ([`Db::recovery`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryStats {
    /// Log records (single writes and batches) replayed.
    pub records_replayed: u64,
    /// Writes replayed into keyspaces.
    pub writes_replayed: u64,
    /// Logged writes of keyspaces dropped since: not replayed.
    pub writes_skipped: u64,
    /// Bytes of the log's torn tail: what a crash left half-written, never acknowledged
    /// as synced, and discarded.
    pub discarded_bytes: u64,
    /// Complete records found in the torn tail's blocks and discarded with it (records
    /// that a crash separated from the log before them).
    pub discarded_records: u64,
    /// Wall time from the start of `Db::open` to the database being ready.
    pub duration: Duration,
}

/// Where the keyspaces' leaf pages live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pages {
    /// A page file per keyspace in the directory.
    Files,
    /// In memory (`Db::open_simulated`).
    Memory,
}

/// The keyspaces, by name and by id.
struct Catalog {
    manifest: Manifest,
    trees: HashMap<u32, Arc<Tree>>,
}

/// An embedded database: a directory of named keyspaces that survives crashes.
///
/// Each keyspace is an ordered [`Tree`], opened (and created on first use) with
/// [`Db::tree`]. Writes go through one write-ahead log at the [`Durability`] asked for;
/// [`WriteBatch`]es span keys and keyspaces atomically. Opening a database recovers it
/// from its log, with no separate call; [`Db::recovery`] tells what that took.
///
/// While a `Db` is open its directory's `LOCK` file is locked: a second `Db` on the same
/// directory, in this process or another, gets [`Error::Locked`]. Dropping the `Db`
/// makes every logged write durable and releases the directory once the last handle
/// to one of its trees is gone too.
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
    dir: PathBuf,
    options: DbOptions,
    pages: Pages,
    journal: Arc<Journal>,
    catalog: RwLock<Catalog>,
    recovery: RecoveryStats,
    /// The locked `LOCK` file, released when the `Db` drops.
    _lock: File,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("dir", &self.dir)
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
    /// recovers it: every write whose log record was durable is back.
    ///
    /// Fails with [`Error::Locked`] if another `Db` has the directory open; with
    /// [`Error::Incompatible`] if the directory holds files but no bfdb manifest, or a
    /// manifest or log of another format version; with [`Error::CorruptFile`] if the
    /// manifest does not validate; with [`Error::Io`] of kind `InvalidData` if the log is
    /// damaged anywhere but in its torn tail. Nothing is written to a directory that
    /// does not validate.
    pub fn open(dir: impl AsRef<Path>, options: DbOptions) -> Result<Db> {
        let dir = dir.as_ref();
        if options.create {
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(manifest::named(dir, e)))?;
        }
        let log = DirLog::open(dir).map_err(Error::Io)?;
        Db::open_on(dir, options, Arc::new(log), Pages::Files)
    }

    /// Opens the database in `dir` with its log on `log` (a fault-injecting
    /// [`SimLog`](crate::storage::SimLog), say) and its leaf pages in memory: for crash
    /// tests, which crash the log device and open the database again on what it kept.
    #[doc(hidden)]
    pub fn open_simulated(
        dir: impl AsRef<Path>,
        options: DbOptions,
        log: Arc<dyn LogDevice>,
    ) -> Result<Db> {
        let dir = dir.as_ref();
        if options.create {
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(manifest::named(dir, e)))?;
        }
        Db::open_on(dir, options, log, Pages::Memory)
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
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no such database directory", dir.display()),
            )));
        }
        let lock = lock_dir(dir)?;
        let manifest = match Manifest::load(dir)? {
            Some(m) => m,
            None => create_manifest(dir, &options, &*device)?,
        };
        let log_options = LogOptions {
            segment_blocks: options.log_segment_bytes / crate::storage::LOG_BLOCK_BYTES as u64,
        };
        let (log, recovered) = wal::open(device, log_options).map_err(Error::from)?;
        let journal = Arc::new(Journal::new(Arc::new(log), options.flush_interval));
        if pages == Pages::Files {
            remove_scratch_pages(dir)?;
        }
        let mut db = Db {
            dir: dir.to_path_buf(),
            options,
            pages,
            journal,
            catalog: RwLock::new(Catalog {
                manifest: manifest.clone(),
                trees: HashMap::new(),
            }),
            recovery: RecoveryStats {
                discarded_bytes: recovered.discarded_bytes,
                discarded_records: recovered.discarded_records,
                ..RecoveryStats::default()
            },
            _lock: lock,
        };
        {
            let mut catalog = db.catalog.write();
            for (name, entry) in &manifest.keyspaces {
                let tree = db.open_keyspace(name, entry)?;
                catalog.trees.insert(entry.id, Arc::new(tree));
            }
        }
        db.replay(&recovered.records)?;
        db.recovery.duration = started.elapsed();
        log::info!(
            "bfdb: opened {} in {:?}: {} log records replayed, {} torn-tail bytes discarded",
            db.dir.display(),
            db.recovery.duration,
            db.recovery.records_replayed,
            db.recovery.discarded_bytes
        );
        Ok(db)
    }

    /// Replays the recovered log records into the keyspaces, in log order.
    fn replay(&mut self, records: &[wal::LogRecord]) -> Result<()> {
        let catalog = self.catalog.read();
        let (mut replayed, mut skipped) = (0, 0);
        for record in records {
            for op in &record.ops {
                let (keyspace, key, value) = match op {
                    LogOp::Put {
                        keyspace,
                        key,
                        value,
                    } => (*keyspace, key, Some(&value[..])),
                    LogOp::Delete { keyspace, key } => (*keyspace, key, None),
                };
                let Some(tree) = catalog.trees.get(&keyspace) else {
                    skipped += 1;
                    continue;
                };
                tree.check_record(key, value).map_err(|e| {
                    Error::InvalidConfig(format!(
                        "the log holds a write that these options refuse ({e}); open the \
                         database with limits at least those it was written with"
                    ))
                })?;
                tree.write_unlogged(key, value)?;
                replayed += 1;
            }
        }
        drop(catalog);
        self.recovery.records_replayed = records.len() as u64;
        self.recovery.writes_replayed = replayed;
        self.recovery.writes_skipped = skipped;
        Ok(())
    }

    /// A new tree for keyspace `entry`, attached to the journal.
    fn open_keyspace(&self, name: &str, entry: &KeyspaceEntry) -> Result<Tree> {
        let KeyspaceKind::Tree = entry.kind;
        let config = self.options.config.clone();
        let tree = match self.pages {
            Pages::Files => Tree::open(self.dir.join(page_file(entry.id)), config)?,
            Pages::Memory => Tree::in_memory(config)?,
        };
        Ok(tree.attach(Attached {
            journal: Arc::clone(&self.journal),
            keyspace: entry.id,
            name: name.to_string(),
            durability: self.options.durability,
            dropped: AtomicBool::new(false),
        }))
    }

    /// The ordered keyspace `name`, created (durably, in the manifest) if it does not
    /// exist. Every call for one name returns a handle to the same tree.
    ///
    /// Names are 1 to 255 bytes of UTF-8.
    pub fn tree(&self, name: &str) -> Result<Arc<Tree>> {
        if let Some(tree) = self.lookup(name) {
            return Ok(tree);
        }
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(Error::InvalidConfig(format!(
                "keyspace names are 1 to {MAX_NAME_BYTES} bytes; {name:?} has {}",
                name.len()
            )));
        }
        let mut catalog = self.catalog.write();
        if let Some(entry) = catalog.manifest.keyspaces.get(name) {
            return Ok(Arc::clone(&catalog.trees[&entry.id]));
        }
        let entry = KeyspaceEntry {
            id: catalog.manifest.next_id,
            kind: KeyspaceKind::Tree,
        };
        let next_id = entry.id.checked_add(1).ok_or_else(|| {
            Error::Unsupported("the database has used all 2^32 keyspace ids".into())
        })?;
        let tree = Arc::new(self.open_keyspace(name, &entry)?);
        let mut manifest = catalog.manifest.clone();
        manifest.next_id = next_id;
        manifest.keyspaces.insert(name.to_string(), entry.clone());
        // Durable before the first write to it can be logged.
        manifest.store(&self.dir)?;
        catalog.manifest = manifest;
        catalog.trees.insert(entry.id, Arc::clone(&tree));
        Ok(tree)
    }

    fn lookup(&self, name: &str) -> Option<Arc<Tree>> {
        let catalog = self.catalog.read();
        let entry = catalog.manifest.keyspaces.get(name)?;
        catalog.trees.get(&entry.id).cloned()
    }

    /// The names of the keyspaces, in order.
    pub fn keyspaces(&self) -> Vec<String> {
        self.catalog
            .read()
            .manifest
            .keyspaces
            .keys()
            .cloned()
            .collect()
    }

    /// Drops keyspace `name` and everything in it; `false` if there was none. Handles
    /// to it still read what it held, and refuse writes with
    /// [`Error::KeyspaceDropped`]. The drop is durable when the call returns.
    pub fn drop_tree(&self, name: &str) -> Result<bool> {
        let mut catalog = self.catalog.write();
        let Some(entry) = catalog.manifest.keyspaces.get(name).cloned() else {
            return Ok(false);
        };
        let mut manifest = catalog.manifest.clone();
        manifest.keyspaces.remove(name);
        manifest.store(&self.dir)?;
        catalog.manifest = manifest;
        if let Some(tree) = catalog.trees.remove(&entry.id)
            && let Some(a) = tree.attached()
        {
            a.dropped.store(true, Ordering::Release);
        }
        if self.pages == Pages::Files {
            let path = self.dir.join(page_file(entry.id));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::Io(manifest::named(&path, e))),
            }
        }
        Ok(true)
    }

    /// Applies `batch` atomically at the database's default durability
    /// ([`DbOptions::durability`]); see [`Db::write_with`].
    pub fn write(&self, batch: WriteBatch) -> Result<()> {
        self.write_with(batch, self.options.durability)
    }

    /// Applies `batch` atomically at `durability`: one log record, so after a crash
    /// either every write of the batch is there or none is; and a concurrent
    /// [`Tree::get_many`] sees all of its keys' writes or none. (A scan is not a
    /// snapshot: it sees each record as it is when it reaches it.) Every key and value
    /// is checked before anything is written.
    ///
    /// A batch written [`Durability::Unlogged`] is atomic for readers and lost on a
    /// crash, as a whole.
    pub fn write_with(&self, batch: WriteBatch, durability: Durability) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let me = Arc::as_ptr(&self.journal) as usize;
        let trees = {
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
                    let tree = catalog.trees.get(&op.keyspace).cloned().ok_or_else(|| {
                        Error::KeyspaceDropped {
                            name: format!("#{}", op.keyspace),
                        }
                    })?;
                    tree.check_record(&op.key, op.value.as_deref())?;
                    Ok(tree)
                })
                .collect::<Result<Vec<_>>>()?
        };
        let ops: Vec<LogOpRef<'_>> = batch
            .ops
            .iter()
            .map(|op| match &op.value {
                Some(value) => LogOpRef::Put {
                    keyspace: op.keyspace,
                    key: &op.key,
                    value,
                },
                None => LogOpRef::Delete {
                    keyspace: op.keyspace,
                    key: &op.key,
                },
            })
            .collect();
        self.journal.commit(&ops, durability, || {
            for (op, tree) in batch.ops.iter().zip(&trees) {
                tree.write_unlogged(&op.key, op.value.as_deref())?;
            }
            Ok(())
        })
    }

    /// Waits until every logged write acknowledged so far is durable.
    pub fn persist(&self) -> Result<()> {
        self.journal.persist()
    }

    /// What recovery did when this database was opened.
    pub fn recovery(&self) -> &RecoveryStats {
        &self.recovery
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The sequence number of the last logged write, and of the last durable one.
    #[doc(hidden)]
    pub fn log_position(&self) -> (u64, u64) {
        let log = self.journal.log();
        (log.next_seq() - 1, log.durable_seq())
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        // Best effort: a clean close makes every logged write durable. A failure has
        // nowhere to go; the log reports it to the next writer, and recovery keeps what
        // reached the disk.
        let _ = self.journal.persist();
    }
}

/// The page file of keyspace `id`.
fn page_file(id: u32) -> String {
    format!("ks-{id:08x}.pages")
}

/// Removes the keyspaces' page files: scratch space until checkpoints make them
/// durable, recreated as the keyspaces open.
fn remove_scratch_pages(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Io(manifest::named(dir, e)))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::Io(manifest::named(dir, e)))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("ks-") && name.ends_with(".pages") {
            std::fs::remove_file(entry.path())
                .map_err(|e| Error::Io(manifest::named(&entry.path(), e)))?;
        }
    }
    Ok(())
}

/// Opens and `flock`s the directory's lock file.
fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK);
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
    Ok(file)
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
